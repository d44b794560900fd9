//! Object store specifics, against moto (S3) and Azurite (Azure) on loopback: racing writers,
//! stores that cannot do conditional writes, unreachable endpoints, missing buckets, dropped
//! connections, and secrets. Azure's own failures and forms are in `azure`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deltalake::arrow::array::RecordBatch;
use deltalake::protocol::SaveMode;
use futures::TryStreamExt;

use crate::support::{
    PARTIAL_FIX, S3_SECRET, Store, TestLake, assert_refused, json_ok, runtime, s3_server, stderr,
    stdout,
};

/// Rewrites `lakefill.toml`, replacing `from` with `to`.
fn edit_project(lake: &TestLake, from: &str, to: &str) {
    let path = lake.path().join("lakefill.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from} not in lakefill.toml");
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

object_stores!(
    racing_writers_never_lose_a_commit,
    a_secret_key_appears_in_no_output_journal_or_commit
);

fn racing_writers_never_lose_a_commit(store: Store) {
    let lake = TestLake::on(store);
    // Two lakefill publishes on disjoint ranges at once: both land, in two versions.
    let first = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(3),
        "--stage-only",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let second = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(5),
        "--to",
        &lake.day(8),
        "--stage-only",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let events_before = lake.version("events");
    let publishes: Vec<_> = [first, second]
        .into_iter()
        .map(|run| {
            let dir = lake.path().to_path_buf();
            let id = run["run_id"].as_str().unwrap().to_string();
            std::thread::spawn(move || {
                crate::support::run_in(&dir, &["publish", &id, "--output-format", "json"])
            })
        })
        .collect();
    let mut published: Vec<u64> = publishes
        .into_iter()
        .map(|p| {
            json_ok(&p.join().unwrap())["published_version"]
                .as_u64()
                .unwrap()
        })
        .collect();
    published.sort();
    assert_eq!(published, vec![events_before + 1, events_before + 2]);

    let before = lake.version("raw_events");
    let template: RecordBatch = {
        let table = lake.open("raw_events");
        runtime().block_on(async {
            let ctx = deltalake::datafusion::prelude::SessionContext::new();
            ctx.register_table("raw_events", table.table_provider().await.unwrap())
                .unwrap();
            ctx.sql("SELECT * FROM raw_events LIMIT 1")
                .await
                .unwrap()
                .collect()
                .await
                .unwrap()
                .remove(0)
        })
    };
    // Four writers open the same version and append at once; each must land in its own version.
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let table = lake.open("raw_events");
            let batch = template.clone();
            std::thread::spawn(move || {
                runtime().block_on(async move {
                    table
                        .write(vec![batch])
                        .with_save_mode(SaveMode::Append)
                        .await
                        .map(|t| t.version())
                })
            })
        })
        .collect();
    let versions: Vec<u64> = writers
        .into_iter()
        .map(|w| w.join().unwrap().expect("append").unwrap())
        .collect();
    let mut sorted = versions.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (before + 1..=before + 4).collect::<Vec<_>>(),
        "one commit per version: {versions:?}"
    );
    let table = lake.open("raw_events");
    assert_eq!(table.version(), Some(before + 4));
    for version in before + 1..=before + 4 {
        let commit = runtime()
            .block_on(table.log_store().read_commit_entry(version))
            .unwrap()
            .expect("commit file");
        let adds = commit
            .split(|b| *b == b'\n')
            .filter(|l| l.starts_with(b"{\"add\""))
            .count();
        assert_eq!(adds, 1, "version {version} holds exactly one writer's file");
    }
}

#[test]
fn a_store_without_conditional_writes_is_refused() {
    let lake = TestLake::on(Store::S3);
    let before = lake.version("events");
    edit_project(
        &lake,
        "[tables.events]\n",
        "[tables.events]\nstorage = { AWS_CONDITIONAL_PUT = \"disabled\" }\n",
    );
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(2),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_refused(
        &out,
        2,
        "refusing to commit to `events`: conditional writes are disabled",
    );
    assert_eq!(lake.version("events"), before);
}

#[test]
fn plan_shows_storage_options_with_secrets_masked() {
    let lake = TestLake::on(Store::S3);
    let out = lake.run(&[
        "plan",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(2),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        text.contains("AWS_SECRET_ACCESS_KEY = ****  (project)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "AWS_ENDPOINT_URL = {}  (project)",
            s3_server().endpoint
        )),
        "{text}"
    );
    assert!(text.contains("max_retries = 3  (default)"), "{text}");
    assert!(!text.contains(S3_SECRET));
    // A table's own option wins over [storage].
    edit_project(
        &lake,
        "[tables.events]\n",
        "[tables.events]\nstorage = { AWS_REGION = \"eu-west-1\" }\n",
    );
    let text = stdout(&lake.run(&[
        "plan",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(2),
    ]));
    assert!(
        text.contains("events           AWS_REGION = eu-west-1  (table)"),
        "{text}"
    );
    assert!(
        text.contains("raw_events       AWS_REGION = us-east-1  (project)"),
        "{text}"
    );
}

#[test]
fn unreachable_endpoints_and_missing_buckets_fail_fast_and_clearly() {
    let lake = TestLake::on(Store::S3);
    let original = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (name, from, to, message) in [
        (
            "unreachable endpoint",
            s3_server().endpoint.clone(),
            format!("http://127.0.0.1:{closed}"),
            "cannot open table `events`",
        ),
        (
            "missing bucket",
            "s3://".to_string(),
            "s3://no-such-bucket-".to_string(),
            "cannot open table `events`",
        ),
    ] {
        std::fs::write(
            lake.path().join("lakefill.toml"),
            original.replace(&from, &to),
        )
        .unwrap();
        let started = Instant::now();
        let out = lake.run(&[
            "backfill",
            "events",
            "--from",
            &lake.day(1),
            "--to",
            &lake.day(2),
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains("hint: "), "{name}: {}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name}: bounded retries, not a hang"
        );
    }
    std::fs::write(lake.path().join("lakefill.toml"), &original).unwrap();
    assert_eq!(
        lake.run(&[
            "plan",
            "events",
            "--from",
            &lake.day(1),
            "--to",
            &lake.day(2)
        ])
        .status
        .code(),
        Some(0)
    );
}

/// A loopback proxy to moto that cuts every connection uploading a staged file.
fn start_dropping_proxy(target: String) -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dropping = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&dropping);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let (mut client_read, mut server_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut server_read, mut client_write) = (server, client);
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || {
                let mut buffer = [0u8; 16 * 1024];
                while let Ok(n) = client_read.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    let chunk = &buffer[..n];
                    let staged_upload = chunk.starts_with(b"PUT ")
                        && chunk.windows(17).any(|w| w == b"/lakefill-events-");
                    if staged_upload && flag.load(Ordering::SeqCst) {
                        let _ = server_write.write_all(&chunk[..n / 2]);
                        let _ = client_read.shutdown(Shutdown::Both);
                        let _ = server_write.shutdown(Shutdown::Both);
                        break;
                    }
                    if server_write.write_all(chunk).is_err() {
                        break;
                    }
                }
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut server_read, &mut client_write);
                let _ = client_write.shutdown(Shutdown::Both);
            });
        }
    });
    (port, dropping)
}

#[test]
fn a_connection_dropped_mid_upload_fails_cleanly_and_a_rerun_publishes() {
    let lake = TestLake::on(Store::S3);
    let endpoint = s3_server().endpoint.clone();
    let (port, dropping) = start_dropping_proxy(endpoint.trim_start_matches("http://").to_string());
    edit_project(&lake, &endpoint, &format!("http://127.0.0.1:{port}"));
    let before = lake.version("events");
    let started = Instant::now();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(4),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_refused(&out, 1, "cannot write staged files for partition");
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "bounded retries"
    );
    assert_eq!(lake.version("events"), before, "nothing published");
    // The connection heals: the same command finishes the run.
    dropping.store(false, Ordering::SeqCst);
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(4),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report["published_version"], before + 1);
}

fn a_secret_key_appears_in_no_output_journal_or_commit(store: Store) {
    let lake = TestLake::on(store);
    let secret = store.secret().unwrap();
    let (from, to) = (lake.day(1), lake.day(3));
    let mut outputs = String::new();
    for args in [
        vec!["plan", "events", "--from", &from, "--to", &to, "-vv"],
        vec![
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--stage-only",
            "-vv",
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ],
        vec![
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "-vv",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ],
        vec!["runs", "-vv"],
        vec!["history", "events", "-vv"],
        vec!["sql", "SELECT COUNT(*) FROM events", "-vv"],
        vec![
            "backfill",
            "events",
            "--from",
            "2026-13-01",
            "--to",
            &to,
            "-vv",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ],
    ] {
        let out = lake.run(&args);
        outputs.push_str(&stdout(&out));
        outputs.push_str(&stderr(&out));
    }
    assert!(
        outputs.contains("published"),
        "the commands ran:\n{outputs}"
    );
    assert!(!outputs.contains(secret), "leaked into output");
    for table in ["raw_events", "events", "daily_revenue"] {
        let opened = lake.open(table);
        let leaked: Vec<String> = runtime().block_on(async {
            let store = opened.object_store();
            let paths: Vec<_> = store
                .list(None)
                .map_ok(|o| o.location)
                .try_collect()
                .await
                .unwrap();
            let mut leaked = Vec::new();
            for path in paths {
                use deltalake::logstore::object_store::ObjectStoreExt as _;
                let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
                if bytes.windows(secret.len()).any(|w| w == secret.as_bytes()) {
                    leaked.push(path.to_string());
                }
            }
            leaked
        });
        assert!(leaked.is_empty(), "leaked into {table}: {leaked:?}");
    }
}

#[test]
fn the_demo_runs_on_s3() {
    let server = s3_server();
    let bucket = server.new_bucket();
    let dir = tempfile::tempdir().unwrap();
    let mut command = crate::support::lakefill_command(dir.path());
    for (key, value) in server.storage() {
        command.env(key, value);
    }
    let out = command
        .args([
            "demo",
            "--dir",
            "demo",
            "--days",
            "5",
            "--events-per-day",
            "200",
            "--s3",
            &format!("s3://{bucket}/demo"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("history of events"),
        "{}",
        stdout(&out)
    );
    let toml = std::fs::read_to_string(dir.path().join("demo/lakefill.toml")).unwrap();
    assert!(
        toml.contains(&format!("uri = \"s3://{bucket}/demo/events\"")),
        "{toml}"
    );
    assert!(
        toml.contains("AWS_SECRET_ACCESS_KEY = \"${AWS_SECRET_ACCESS_KEY}\""),
        "{toml}"
    );
    assert!(!toml.contains(S3_SECRET), "no secret in the project file");
    // The tables are on S3: the project works from another directory with the same environment.
    let mut command = crate::support::lakefill_command(&dir.path().join("demo"));
    for (key, value) in server.storage() {
        command.env(key, value);
    }
    let history = command
        .args(["history", "events", "--output-format", "json"])
        .output()
        .unwrap();
    let entries: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 3, "create, v1, v2");
}
