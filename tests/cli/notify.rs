//! Notifications: each published version reaches every sink at least once (a file once, by event
//! id), signed as Standard Webhooks says, retried, never failing the publish, caught up after a
//! crash; the event is valid against `schemas/event-v1.schema.json` and its numbers equal an
//! independent count of the table's versions.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::support::{PARTIAL_FIX, Store, TestLake, json_ok, lakefill_command, stderr};

/// A secret in the Standard Webhooks form (`whsec_` + base64 of the key).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    body: String,
    answered: u16,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    }
}

/// A webhook receiver on loopback that answers 500 to its first `fail_first` requests.
struct Receiver {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start(fail_first: usize) -> Self {
        Self::answering(fail_first, 200)
    }

    /// A receiver that answers `status` (after `fail_first` 500s); a 3xx points elsewhere, where
    /// a GET is answered 200.
    fn answering(fail_first: usize, status: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let mut headers = Vec::new();
                loop {
                    let mut header = String::new();
                    reader.read_line(&mut header).unwrap();
                    let header = header.trim_end();
                    if header.is_empty() {
                        break;
                    }
                    let (k, v) = header.split_once(':').unwrap();
                    headers.push((k.trim().to_string(), v.trim().to_string()));
                }
                let length: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |(_, v)| v.parse().unwrap());
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let mut log = log.lock().unwrap();
                // A client that follows a redirect comes back with a GET, which succeeds.
                let answered = if line.starts_with("GET") {
                    200
                } else if log.len() < fail_first {
                    500
                } else {
                    status
                };
                log.push(Received {
                    headers,
                    body: String::from_utf8(body).unwrap(),
                    answered,
                });
                drop(log);
                let location = if (300..400).contains(&answered) {
                    "Location: /elsewhere\r\n"
                } else {
                    ""
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {answered} X\r\n{location}Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        Self { url, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// Adds `sinks` (TOML array items) to `[tables.events]`.
fn add_sinks(lake: &TestLake, sinks: &str) {
    let path = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    let start = toml.find("[tables.events]\n").unwrap();
    let line_end = start + toml[start..].find("uri = ").unwrap();
    let line_end = line_end + toml[line_end..].find('\n').unwrap() + 1;
    let toml = format!(
        "{}notify = [{sinks}]\n{}",
        &toml[..line_end],
        &toml[line_end..]
    );
    std::fs::write(path, toml).unwrap();
}

/// The signature python's standard library computes for a delivery (independent of lakefill).
fn python_signature(id: &str, timestamp: &str, body: &str) -> String {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import base64, hashlib, hmac, sys\n\
             key = base64.b64decode(sys.argv[1][len('whsec_'):])\n\
             msg = (sys.argv[2] + '.' + sys.argv[3] + '.').encode() + sys.stdin.buffer.read()\n\
             print('v1,' + base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode())",
            SECRET,
            id,
            timestamp,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Validates `event` against the committed JSON Schema with python's `jsonschema`.
pub(crate) fn assert_valid_event(event: &str) {
    let schema = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schemas/event-v1.schema.json"
    );
    python_accepts(
        &[
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             jsonschema.Draft202012Validator(schema).validate(json.load(sys.stdin))",
            schema,
        ],
        event,
        "the event does not match the schema",
    );
}

/// Checks `event` with the official OpenLineage client's model (generated from the spec's JSON
/// Schema): see `openlineage_check.py`.
fn assert_openlineage(event: &str) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/cli/openlineage_check.py"
    );
    python_accepts(&[script], event, "not an OpenLineage RunEvent");
}

/// Runs `python3 args` with `input` on stdin; fails with `what` and python's stderr unless it
/// succeeds.
fn python_accepts(args: &[&str], input: &str, what: &str) {
    let mut child = Command::new("python3")
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rows per day of `events` at `version`, counted with DataFusion.
fn rows_per_day(lake: &TestLake, version: u64) -> Vec<(String, u64)> {
    lake.query(
        &[("events", lake.open_version("events", version))],
        "SELECT CAST(event_date AS VARCHAR), COUNT(*) FROM events GROUP BY 1 ORDER BY 1",
    )
    .into_iter()
    .map(|r| (r[0].clone(), r[1].parse().unwrap()))
    .collect()
}

fn file_lines(lake: &TestLake) -> Vec<serde_json::Value> {
    std::fs::read_to_string(lake.path().join("notifications.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_sink_hears_of_a_publish_signed_retried_and_filtered() {
    let lake = TestLake::new();
    // The receiver fails the first three posts: all the backfill's attempts.
    let receiver = Receiver::start(3);
    add_sinks(
        &lake,
        &format!(
            "\"file:notifications.jsonl\", {{ url = \"{}\", secret = \"{SECRET}\" }}, \
             {{ url = \"file:big-changes.jsonl\", min_changed_rows = 1000000000 }}",
            receiver.url
        ),
    );
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(5),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let (read, version) = (
        report["read_version"].as_u64().unwrap(),
        report["published_version"].as_u64().unwrap(),
    );
    let sinks = report["notifications"].as_array().unwrap();
    assert_eq!(sinks.len(), 3, "{report}");
    assert_eq!(
        sinks[0]["delivered"],
        serde_json::json!([version]),
        "{report}"
    );
    assert_eq!(
        sinks[1]["failed"],
        serde_json::json!([version]),
        "a failing sink: {report}"
    );
    assert_eq!(
        sinks[2]["skipped"],
        serde_json::json!([version]),
        "filtered: {report}"
    );
    assert_eq!(receiver.received().len(), 3, "three attempts");

    // The file holds the event, valid against the schema, with the numbers of the table.
    let lines = file_lines(&lake);
    assert_eq!(lines.len(), 1);
    let event = &lines[0];
    assert_valid_event(&event.to_string());
    assert_eq!(event["type"], "backfill.published");
    assert_eq!(event["version_before"], version - 1);
    assert_eq!(event["version_after"], version);
    let before = rows_per_day(&lake, read);
    let after = rows_per_day(&lake, version);
    let days: Vec<String> = (2..=5).map(|d| lake.day(d)).collect();
    let partitions = event["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), days.len(), "{event}");
    for (day, p) in days.iter().zip(partitions) {
        let count = |rows: &[(String, u64)]| rows.iter().find(|(d, _)| d == day).map_or(0, |r| r.1);
        assert_eq!(p["partition"], day.as_str());
        assert_eq!(p["old_rows"], count(&before), "{day}: {p}");
        assert_eq!(p["new_rows"], count(&after), "{day}: {p}");
        assert!(p["measures"]["amount_cents"].is_object(), "{p}");
    }
    assert!(
        event["key_diff"]["changed"].as_u64().unwrap() > 0,
        "{event}"
    );
    assert_eq!(event["validation"]["passed"], true);
    assert!(
        !lake.path().join("big-changes.jsonl").exists(),
        "filtered out"
    );

    // The next `notify` delivers the pending event: a fourth post, the same event, signed.
    let out = lake.run(&["notify", "events", "--output-format", "json"]);
    let deliveries = json_ok(&out);
    assert_eq!(
        deliveries[1]["delivered"],
        serde_json::json!([version]),
        "{deliveries}"
    );
    let posts = receiver.received();
    assert_eq!(posts.len(), 4);
    assert_eq!(posts[3].answered, 200);
    for post in &posts {
        assert_eq!(
            post.header("webhook-id"),
            event["event_id"].as_str().unwrap()
        );
        assert_eq!(
            post.header("webhook-signature"),
            python_signature(
                post.header("webhook-id"),
                post.header("webhook-timestamp"),
                &post.body
            ),
            "the signature verifies"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&post.body).unwrap(),
            *event
        );
    }
    // Nothing is pending any more; a replay delivers again, and the file keeps one line.
    let again = json_ok(&lake.run(&["notify", "events", "--output-format", "json"]));
    assert!(
        again
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["delivered"].as_array().unwrap().is_empty()),
        "{again}"
    );
    json_ok(&lake.run(&[
        "notify",
        "events",
        "--since",
        &version.to_string(),
        "--replay",
        "--output-format",
        "json",
    ]));
    assert_eq!(receiver.received().len(), 5, "replayed");
    assert_eq!(file_lines(&lake).len(), 1, "the file has each event once");
}

/// A crash after the commit and before delivery is caught up by the next command, once.
fn a_crash_before_delivery_is_caught_up_once(store: Store) {
    let lake = TestLake::on(store);
    add_sinks(&lake, "\"file:notifications.jsonl\"");
    let before = lake.version("events");
    let out = lakefill_command(lake.path())
        .args([
            "backfill",
            "events",
            "--from",
            &lake.day(2),
            "--to",
            &lake.day(3),
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ])
        .env("LAKEFILL_FAILPOINTS", "mid-notify")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", stderr(&out));
    let published = lake.version("events");
    assert_eq!(published, before + 1, "the commit landed");
    assert!(file_lines(&lake).is_empty(), "not delivered yet");
    // The next backfill of the table (another range) delivers both versions, each once.
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(6),
        "--to",
        &lake.day(6),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let second = report["published_version"].as_u64().unwrap();
    assert_eq!(
        report["notifications"][0]["delivered"],
        serde_json::json!([published, second]),
        "{report}"
    );
    let lines = file_lines(&lake);
    let versions: Vec<u64> = lines
        .iter()
        .map(|e| e["version_after"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![published, second]);
    let ids: std::collections::BTreeSet<&str> = lines
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    json_ok(&lake.run(&["notify", "events", "--output-format", "json"]));
    assert_eq!(file_lines(&lake).len(), 2, "nothing twice");
}

both_stores!(a_crash_before_delivery_is_caught_up_once);

#[test]
fn a_revert_is_announced_and_bad_sinks_are_refused() {
    let lake = TestLake::new();
    let path = lake.path().join("lakefill.toml");
    let pristine = std::fs::read_to_string(&path).unwrap();
    add_sinks(
        &lake,
        "{ url = \"file:reverts.jsonl\", events = [\"backfill.reverted\"] }",
    );
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(
        report["notifications"][0]["skipped"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let run_id = report["run_id"].as_str().unwrap();
    let revert = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    let text = std::fs::read_to_string(lake.path().join("reverts.jsonl")).unwrap();
    let event: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_valid_event(text.trim());
    assert_eq!(event["type"], "backfill.reverted");
    assert_eq!(event["revert_of"], run_id);
    assert_eq!(event["run_id"], revert["run_id"]);

    // Sinks that cannot work are configuration errors, named by where they are.
    for (sink, says) in [
        ("\"ftp://example.com/x\"", "is not a sink"),
        (
            "{ url = \"file:x\", events = [\"backfill.exploded\"] }",
            "unknown event type",
        ),
        (
            "{ url = \"file:x\", secret = \"s\" }",
            "a `file:` sink has none",
        ),
        (
            "{ url = \"file:x\", colour = \"red\" }",
            "unknown key `colour`",
        ),
        ("42", "tables.events.notify[0]"),
    ] {
        std::fs::write(&path, &pristine).unwrap();
        add_sinks(&lake, sink);
        let out = lake.run(&["notify", "events"]);
        assert_eq!(out.status.code(), Some(2), "{sink}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{sink}: {}", stderr(&out));
    }
}

#[test]
fn an_openlineage_sink_gets_a_complete_run_event_with_the_versions() {
    let lake = TestLake::new();
    let receiver = Receiver::start(0);
    add_sinks(&lake, &format!("\"openlineage+{}\"", receiver.url));
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let version = report["published_version"].as_u64().unwrap();
    let received = receiver.received();
    assert_eq!(received.len(), 1, "{report}");
    assert_openlineage(&received[0].body);
    let event: serde_json::Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(event["eventType"], "COMPLETE", "{event:#}");
    assert!(
        event["schemaURL"]
            .as_str()
            .unwrap()
            .starts_with("https://openlineage.io/spec/"),
        "{event:#}"
    );
    let run_id = event["run"]["runId"].as_str().unwrap();
    assert_eq!(run_id.len(), 36, "a UUID: {run_id}");
    assert_eq!(run_id.matches('-').count(), 4, "a UUID: {run_id}");
    assert_eq!(event["job"]["name"], "events", "{event:#}");
    let output = &event["outputs"][0];
    assert_eq!(output["name"], "events", "{event:#}");
    assert_eq!(
        output["facets"]["version"]["datasetVersion"],
        version.to_string(),
        "{event:#}"
    );
    // The inputs are the sources at the versions the run read.
    let inputs = event["inputs"].as_array().unwrap();
    assert_eq!(inputs[0]["name"], "raw_events", "{event:#}");
    // The run read raw_events at its latest version (nothing wrote it since).
    let read = lake.version("raw_events");
    assert_eq!(
        inputs[0]["facets"]["version"]["datasetVersion"],
        read.to_string(),
        "{event:#}"
    );
    // The change per partition rides along, with rows that add up to the table's.
    let change = &output["outputFacets"]["lakefill_change"];
    let partitions = change["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 2, "{change:#}");
    let after = rows_per_day(&lake, version);
    for p in partitions {
        let day = p["partition"].as_str().unwrap();
        let rows = after.iter().find(|(d, _)| d == day).map_or(0, |(_, n)| *n);
        assert_eq!(p["new_rows"], rows, "{p}");
    }
}

/// A webhook's URL is its credential (#33): a token in its query, from `${ENV}` or written
/// inline, and a Slack-style secret path never reach the output (text or JSON, at the default
/// log level or `-v`) nor the table's outbox; and a redirect is a failed delivery, not a
/// delivered one.
#[test]
fn issue_33_sink_urls_stay_secret_and_redirects_fail() {
    let lake = TestLake::new();
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let redirecting = Receiver::answering(0, 301);
    let secrets = [
        "tok-SECRET-1234",
        "T0SECRETXY",
        "XXXXSECRETPATH",
        "KEYSECRET9999",
    ];
    add_sinks(
        &lake,
        &format!(
            "\"${{HOOK_URL}}\", \"http://127.0.0.1:{closed}/services/T0SECRETXY/B1/XXXXSECRETPATH?api_key=KEYSECRET9999\", \"{}\"",
            redirecting.url
        ),
    );
    let run = |extra: &[&str]| {
        let mut args = vec![
            "backfill",
            "events",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-03",
            "--allow-edge-moves",
            "--reason",
            crate::support::PARTIAL_FIX,
        ];
        args.extend(extra);
        lakefill_command(lake.path())
            .args(&args)
            .env(
                "HOOK_URL",
                format!("http://127.0.0.1:{closed}/hook?token=tok-SECRET-1234"),
            )
            .output()
            .unwrap()
    };
    let json = run(&["--output-format", "json", "--stage-only"]);
    let text = run(&["-v"]);
    for out in [&json, &text] {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(out));
        for secret in secrets {
            assert!(!all.contains(secret), "{secret} printed: {all}");
        }
    }
    let report = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(report.contains("FAILED"), "{report}");
    assert!(
        report.contains("answered 301"),
        "the redirect is a failure: {report}"
    );
    assert!(redirecting.received().iter().all(|r| r.answered == 301));
    // The outbox (and everything else under the table) holds no secret either.
    for file in crate::support::files_under(&lake.table_path("events")) {
        if file.ends_with(".parquet") {
            continue;
        }
        let bytes = std::fs::read(&file).unwrap();
        let content = String::from_utf8_lossy(&bytes);
        for secret in secrets {
            assert!(!content.contains(secret), "{secret} in {file}");
        }
    }
}

/// `publish RUN` re-run after a crash right after its commit answers "already published", and
/// still sends the event the crash left unsent (once).
#[test]
fn issue_33_publish_run_again_catches_up_the_outbox() {
    let lake = TestLake::new();
    add_sinks(&lake, "\"file:notifications.jsonl\"");
    let run_id = lake.stage_events(2, 3);
    let before = lake.version("events");
    let crashed = lakefill_command(lake.path())
        .args(["publish", &run_id])
        .env("LAKEFILL_FAILPOINTS", "after-commit")
        .output()
        .unwrap();
    assert!(!crashed.status.success(), "{}", stderr(&crashed));
    assert_eq!(lake.version("events"), before + 1, "the commit landed");
    assert!(file_lines(&lake).is_empty(), "not delivered yet");
    let again = json_ok(&lake.run(&["publish", &run_id, "--output-format", "json"]));
    assert_eq!(again["outcome"], "already_published", "{again}");
    assert_eq!(
        again["notifications"][0]["delivered"],
        serde_json::json!([before + 1]),
        "{again}"
    );
    let lines = file_lines(&lake);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["version_after"], before + 1);
    assert_eq!(lines[0]["run_id"], run_id.as_str());
    let third = json_ok(&lake.run(&["publish", &run_id, "--output-format", "json"]));
    assert_eq!(
        third["notifications"][0]["delivered"],
        serde_json::json!([])
    );
    assert_eq!(file_lines(&lake).len(), 1, "nothing twice");
}

/// Sinks that accept a connection and never answer cost one command a bounded time, all
/// together: the file sink beside them is told at once, the versions they were not told stay
/// pending (never marked delivered), and a later command with a working sink delivers them.
#[test]
fn issue_33_hanging_sinks_cost_a_bounded_time() {
    let lake = TestLake::new();
    // Two receivers that read nothing and answer nothing (connections are kept open).
    let hanging: Vec<(TcpListener, String)> = (0..2)
        .map(|_| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/hook", listener.local_addr().unwrap());
            (listener, url)
        })
        .collect();
    let held = Arc::new(Mutex::new(Vec::new()));
    for (listener, _) in &hanging {
        let listener = listener.try_clone().unwrap();
        let held = Arc::clone(&held);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                held.lock().unwrap().push(stream);
            }
        });
    }
    add_sinks(
        &lake,
        &format!(
            "\"{}\", \"{}\", \"file:notifications.jsonl\"",
            hanging[0].1, hanging[1].1
        ),
    );
    let started = std::time::Instant::now();
    let mut published = Vec::new();
    for day in [2, 5] {
        let report = json_ok(&lake.run(&[
            "backfill",
            "events",
            "--from",
            &lake.day(day),
            "--to",
            &lake.day(day),
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
            "--output-format",
            "json",
        ]));
        let version = report["published_version"].as_u64().unwrap();
        published.push(version);
        let notifications = report["notifications"].as_array().unwrap();
        assert_eq!(notifications.len(), 3, "{report}");
        for hung in &notifications[..2] {
            let failed = hung["failed"].as_array().unwrap();
            let pending = hung
                .get("pending")
                .and_then(|p| p.as_array())
                .cloned()
                .unwrap_or_default();
            assert!(hung["delivered"].as_array().unwrap().is_empty(), "{hung}");
            // Every version since the sink started is either failed or not tried.
            assert_eq!(failed.len() + pending.len(), published.len(), "{hung}");
        }
        assert_eq!(
            notifications[2]["delivered"],
            serde_json::json!([version]),
            "the file sink is not held up: {report}"
        );
    }
    // Two commands, two hanging sinks, two versions: a bound of the budget per command (plus
    // the runs themselves); unbounded retries took 31 s per sink and version (over 2 minutes).
    let elapsed = started.elapsed();
    assert!(elapsed < std::time::Duration::from_secs(75), "{elapsed:?}");
    // The file sink holds each version once.
    let lines = file_lines(&lake);
    let versions: Vec<u64> = lines
        .iter()
        .map(|e| e["version_after"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, published);
}
