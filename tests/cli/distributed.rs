//! Staging on an Apache Ballista cluster (`backfill --engine df://…`): a real cluster started by
//! the binary itself (`lakefill cluster up`: a scheduler, and executors as processes of their
//! own), on loopback. Checked on data: against the independent expectation, and against the
//! same backfill run locally on an identical lake.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{
    PARTIAL_FIX, Store, TestLake, assert_refused, json_ok, lakefill_command, run_in, stderr,
};

/// A cluster started with `lakefill cluster up`; stopped (with its executors) when dropped.
struct Cluster {
    child: Child,
    engine: String,
    /// The standard error of the scheduler and its executors.
    log: PathBuf,
}

impl Cluster {
    /// Two executors of two task slots for `lake` (on S3, with the server's credentials in their
    /// environment); `failpoints` armed in the executors.
    fn start(lake: &TestLake, failpoints: Option<&str>) -> Self {
        Self::with_slots(lake, failpoints, 2)
    }

    /// As [`Self::start`], with `slots` task slots per executor.
    fn with_slots(lake: &TestLake, failpoints: Option<&str>, slots: usize) -> Self {
        Self::on_port(lake, failpoints, slots, 0)
    }

    /// As [`Self::with_slots`], the scheduler on `port` (0: one the system picks).
    fn on_port(lake: &TestLake, failpoints: Option<&str>, slots: usize, port: u16) -> Self {
        let dir: &Path = lake.path();
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let log = dir.join(format!(
            "cluster-{}.log",
            STARTED.fetch_add(1, Ordering::SeqCst)
        ));
        let mut command = lakefill_command(dir);
        command.envs(lake.store.project_storage());
        command
            .args([
                "cluster",
                "up",
                "--port",
                &port.to_string(),
                "--executors",
                "2",
                "--vcores",
                &slots.to_string(),
                // Each executor's tasks spill beyond a bounded pool, as a local run's queries do.
                "--memory-limit",
                "256MiB",
            ])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("cluster log"));
        if let Some(points) = failpoints {
            command.env("LAKEFILL_FAILPOINTS", points);
        }
        // Lakefill's warnings, and the executors' (a task aborted by a cancel says so).
        command.env("RUST_LOG", "off,lakefill=warn,ballista_executor=warn");
        let mut child = command.spawn().expect("start the cluster");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the cluster's address");
        let engine = regex_lite::Regex::new(r"df://[0-9.]+:[0-9]+")
            .expect("regex")
            .find(&line)
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .as_str()
            .to_string();
        Self { child, engine, log }
    }

    /// The scheduler's port.
    fn port(&self) -> u16 {
        self.engine
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    }

    /// Waits (at most a minute) until `writers` writer tasks sleep at their failpoint, while
    /// `client` (logging to `client_log`) still runs.
    fn wait_for_sleeping_writers(&self, writers: usize, client: &mut Child, client_log: &Path) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.log().matches("failpoint hit: sleeping").count() < writers {
            assert!(
                client.try_wait().expect("wait").is_none(),
                "the backfill ended before its writer tasks started:\n{}",
                std::fs::read_to_string(client_log).unwrap_or_default()
            );
            assert!(
                Instant::now() < deadline,
                "no writer task started:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the scheduler and the executors logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The executors' standard input is a pipe from this process: they stop with it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (event_id, event_date, amount_cents) of every row of `events`, as text.
fn all_events(lake: &TestLake) -> BTreeSet<(String, String, String)> {
    lake.query(
        &[("events", lake.open("events"))],
        "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), CAST(amount_cents AS VARCHAR) FROM events",
    )
    .into_iter()
    .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
    .collect()
}

/// The UTC date of each raw event in `from..=to`, computed here without engine code.
fn expected_range(lake: &TestLake, from: &str, to: &str) -> BTreeSet<(String, String, String)> {
    lake.query(
        &[("raw_events", lake.open("raw_events"))],
        "SELECT CAST(event_id AS VARCHAR), CAST(event_ts AS VARCHAR), CAST(amount_cents AS VARCHAR) FROM raw_events",
    )
    .into_iter()
    .map(|r| (r[0].clone(), r[1][..10].to_string(), r[2].clone()))
    .filter(|(_, date, _)| from <= date.as_str() && date.as_str() <= to)
    .collect()
}

/// The rows of `rows` whose date is in `from..=to`.
fn within(
    rows: &BTreeSet<(String, String, String)>,
    from: &str,
    to: &str,
) -> BTreeSet<(String, String, String)> {
    rows.iter()
        .filter(|(_, d, _)| from <= d.as_str() && d.as_str() <= to)
        .cloned()
        .collect()
}

/// The objects under the run's staging directories, relative to the table.
fn staged_on_disk(lake: &TestLake, run_id: &str) -> BTreeSet<String> {
    lake.objects("events")
        .into_iter()
        .filter(|p| p.contains(&format!("/lakefill-{run_id}/")))
        .collect()
}

/// The files the current version has from the run.
fn committed_from(lake: &TestLake, run_id: &str) -> BTreeSet<String> {
    lake.files("events")
        .values()
        .flat_map(|files| files.keys().cloned())
        .filter(|p| p.contains(&format!("/lakefill-{run_id}/")))
        .collect()
}

// On Azure too: the executors build the store from their own `AZURE_*` environment.
every_store!(a_backfill_staged_on_two_executors_publishes_exactly_the_rows_of_a_local_run);
both_stores!(a_writer_task_that_fails_leaves_no_commit_and_a_run_that_resumes);

fn a_backfill_staged_on_two_executors_publishes_exactly_the_rows_of_a_local_run(store: Store) {
    let lake = TestLake::on(store);
    let twin = TestLake::on(store);
    let cluster = Cluster::start(&lake, None);
    let (from, to) = (lake.day(2), lake.day(8));
    let before = lake.version("events");
    let old_rows = all_events(&lake);

    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "3",
        "--engine",
        &cluster.engine,
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report["state"], "published", "{report}");
    assert_eq!(report["published_version"], before + 1);
    // One commit.
    assert_eq!(lake.version("events"), before + 1);

    let local = json_ok(&twin.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "3",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(local["state"], "published");

    // The same rows as the local run, in the whole table; in the range, the independent
    // expectation; outside it, the rows as they were.
    let distributed_rows = all_events(&lake);
    assert_eq!(distributed_rows, all_events(&twin));
    let expected = expected_range(&lake, &from, &to);
    assert!(!expected.is_empty());
    assert_eq!(within(&distributed_rows, &from, &to), expected);
    let outside = |rows: &BTreeSet<(String, String, String)>| -> BTreeSet<_> {
        rows.iter()
            .filter(|(_, d, _)| d.as_str() < from.as_str() || to.as_str() < d.as_str())
            .cloned()
            .collect()
    };
    assert_eq!(outside(&distributed_rows), outside(&old_rows));
    // Validation ran on the client over the files the cluster staged, with the same verdict.
    assert_eq!(report["partitions"], local["partitions"]);

    // Both executors ran writer tasks (the journal names each batch's writer processes; which
    // of them got the tasks with rows is the scheduler's timing), and nothing staged was left
    // behind: the run's files on disk are exactly the committed ones.
    let run_id = report["run_id"].as_str().expect("run id");
    let journal: serde_json::Value = serde_json::from_slice(
        &lake.object_bytes("events", &format!("_lakefill/runs/{run_id}.json")),
    )
    .expect("journal");
    let writers: BTreeSet<String> = journal["batches"]
        .as_array()
        .expect("batches")
        .iter()
        .flat_map(|b| {
            b["writers"]
                .as_object()
                .map(|w| w.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(writers.len(), 2, "{journal}");
    let committed = committed_from(&lake, run_id);
    assert!(!committed.is_empty());
    // The files the writers counted are the committed ones.
    let counted: u64 = journal["batches"]
        .as_array()
        .expect("batches")
        .iter()
        .filter_map(|b| b["writers"].as_object())
        .flat_map(|w| w.values().filter_map(serde_json::Value::as_u64))
        .sum();
    assert_eq!(counted, committed.len() as u64, "{journal}");
    assert_eq!(staged_on_disk(&lake, run_id), committed);
}

fn a_writer_task_that_fails_leaves_no_commit_and_a_run_that_resumes(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(1), lake.day(6));
    let before = lake.version("events");
    let args = [
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "3",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ];
    let run_id = {
        // The writer task of one partition fails after writing its files, every time.
        let point = format!("stage-writer-{}", lake.day(3));
        let failing = Cluster::start(&lake, Some(&format!("{point}=error")));
        let mut with_engine = args.to_vec();
        with_engine.extend(["--engine", failing.engine.as_str()]);
        let output = lake.run(&with_engine);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("injected failure at `{point}`")),
            "{}",
            stderr(&output)
        );
        assert_eq!(lake.version("events"), before, "nothing is committed");
        let runs = json_ok(&lake.run(&["runs", "events", "--output-format", "json"]));
        let run = &runs.as_array().expect("runs")[0];
        assert_eq!(run["state"], "failed", "{runs}");
        run["run_id"].as_str().expect("run id").to_string()
    };
    // A healthy cluster resumes the same run and publishes it; the failed attempts' files are
    // gone.
    let healthy = Cluster::start(&lake, None);
    let mut with_engine = args.to_vec();
    with_engine.extend([
        "--engine",
        healthy.engine.as_str(),
        "--output-format",
        "json",
    ]);
    let report = json_ok(&lake.run(&with_engine));
    assert_eq!(report["state"], "published", "{report}");
    assert_eq!(report["run_id"], run_id.as_str());
    assert_eq!(lake.version("events"), before + 1);
    let in_range = within(&all_events(&lake), &from, &to);
    assert_eq!(in_range, expected_range(&lake, &from, &to));
    assert_eq!(
        staged_on_disk(&lake, &run_id),
        committed_from(&lake, &run_id)
    );
}

#[test]
fn what_a_cluster_cannot_do_is_refused_by_name() {
    let lake = TestLake::new();
    let (from, to) = (lake.day(2), lake.day(3));
    let base = [
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ];
    // The runs of the lake's history (written by lakefill).
    let runs = || json_ok(&lake.run(&["runs", "events", "--output-format", "json"]));
    let history = runs();
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(extra);
        lake.run(&args)
    };
    assert_refused(
        &with(&["--engine", "http://127.0.0.1:50050"]),
        2,
        "--engine",
    );
    assert_refused(
        &with(&["--cascade", "--engine", "df://127.0.0.1:1"]),
        2,
        "a cascade cannot be staged on a cluster yet",
    );
    assert_refused(
        &with(&["--engine", "df://127.0.0.1:1", "--throttle", "1MiB/s"]),
        2,
        "--throttle",
    );
    // Refused before a run exists: nothing to resume or discard.
    assert_eq!(runs(), history);
    assert_refused(
        &lake.run(&["cluster", "up", "--port", "0", "--memory-limit", "lots"]),
        2,
        "--memory-limit",
    );
    // The project's `[engine] scheduler` is checked where it is written.
    let toml = lake.path().join("lakefill.toml");
    let text = std::fs::read_to_string(&toml).expect("project");
    std::fs::write(
        &toml,
        format!("{text}\n[engine]\nscheduler = \"nowhere\"\n"),
    )
    .expect("write");
    assert_refused(&run_in(lake.path(), &base), 2, "[engine]");
    // `--engine local` overrides it.
    let local = lake.run(&["plan", "events", "--from", &from, "--to", &to]);
    assert_eq!(local.status.code(), Some(0), "{}", stderr(&local));
    let version = lake.version("events");
    let staged = with(&["--engine", "local", "--stage-only"]);
    assert_eq!(staged.status.code(), Some(0), "{}", stderr(&staged));
    assert_eq!(lake.version("events"), version);
}

/// A writer task that fails after writing its files, as a lost store connection would, is run
/// again by Ballista: the run publishes the rows once, and the failed attempts' files are gone.
#[test]
fn a_retried_writer_task_counts_once_and_leaves_no_stray_files() {
    let lake = TestLake::new();
    let (from, to) = (lake.day(2), lake.day(6));
    let point = format!("stage-writer-{}", lake.day(4));
    let cluster = Cluster::start(&lake, Some(&format!("{point}=once")));
    let output = lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--engine",
        &cluster.engine,
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    let report = json_ok(&output);
    assert_eq!(report["state"], "published", "{report}");
    // The failed attempt's files were there, and were deleted.
    assert!(
        stderr(&output).contains("staged but the batch does not keep"),
        "{}",
        stderr(&output)
    );
    let in_range = within(&all_events(&lake), &from, &to);
    assert_eq!(in_range, expected_range(&lake, &from, &to));
    let day = lake.day(4);
    let published = report["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["value"] == day.as_str())
        .expect("the retried partition");
    assert_eq!(
        published["new_rows"],
        in_range.iter().filter(|(_, d, _)| *d == day).count() as u64
    );
    let run_id = report["run_id"].as_str().expect("run id");
    assert_eq!(staged_on_disk(&lake, run_id), committed_from(&lake, run_id));
}

/// A run staged on the cluster is an ordinary staged run: `publish` takes it, or `discard` drops
/// every file the executors wrote; either way from the client, with the cluster gone.
#[test]
fn a_run_staged_on_the_cluster_is_published_or_discarded_without_it() {
    let lake = TestLake::new();
    let before = lake.version("events");
    let stage = |from: u64, to: u64| {
        let cluster = Cluster::start(&lake, None);
        let report = json_ok(&lake.run(&[
            "backfill",
            "events",
            "--from",
            &lake.day(from),
            "--to",
            &lake.day(to),
            "--stage-only",
            "--engine",
            &cluster.engine,
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]));
        assert_eq!(report["state"], "validated", "{report}");
        report["run_id"].as_str().expect("run id").to_string()
        // The cluster stops here.
    };
    let dropped = stage(1, 3);
    assert!(!staged_on_disk(&lake, &dropped).is_empty());
    let discard = lake.run(&["discard", &dropped]);
    assert_eq!(discard.status.code(), Some(0), "{}", stderr(&discard));
    assert!(
        staged_on_disk(&lake, &dropped).is_empty(),
        "every staged file is gone"
    );
    assert_eq!(lake.version("events"), before);

    let kept = stage(5, 7);
    let publish = json_ok(&lake.run(&["publish", &kept, "--output-format", "json"]));
    assert_eq!(publish["state"], "published", "{publish}");
    assert_eq!(lake.version("events"), before + 1);
    let (from, to) = (lake.day(5), lake.day(7));
    assert_eq!(
        within(&all_events(&lake), &from, &to),
        expected_range(&lake, &from, &to)
    );
    assert_eq!(staged_on_disk(&lake, &kept), committed_from(&lake, &kept));
}

/// A source a plain Parquet scan would read wrongly (column mapping: the files' column names are
/// not the table's) is refused before a run exists, naming the source and `--engine local`.
#[test]
fn a_source_a_cluster_cannot_read_is_refused_before_a_run_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    crate::protocol::python(&["create", "column_mapping", &path("mapped")]);
    crate::protocol::python(&["create", "plain", &path("t")]);
    std::fs::write(
        dir.path().join("lakefill.toml"),
        "[tables.mapped]\nuri = \"mapped\"\n\n[tables.t]\nuri = \"t\"\n",
    )
    .expect("project");
    let model = dir.path().join("sql/fix");
    std::fs::create_dir_all(&model).expect("sql dir");
    std::fs::write(
        model.join("v1.sql"),
        "/*\ntarget = \"t\"\npartition_by = \"event_date\"\n[sources.mapped]\nwindow = \"event_date\"\n*/\n\
         SELECT event_id, amount_cents + 1 AS amount_cents, event_date FROM mapped \
         WHERE event_date BETWEEN $start AND $end\n",
    )
    .expect("model");
    let log = |table: &str| crate::support::files_under(&dir.path().join(table).join("_delta_log"));
    let before = log("t");
    let output = run_in(
        dir.path(),
        &[
            "backfill",
            "fix",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--engine",
            "df://127.0.0.1:1",
        ],
    );
    assert_refused(&output, 2, "source `mapped` uses column mapping");
    assert!(
        stderr(&output).contains("--engine local"),
        "{}",
        stderr(&output)
    );
    assert_eq!(log("t"), before, "the target is untouched");
    let runs = json_ok(&run_in(
        dir.path(),
        &["runs", "t", "--output-format", "json"],
    ));
    assert_eq!(runs, serde_json::json!([]), "{runs}");
}

/// A client interrupted (Ctrl-C) while its job runs on the cluster cancels the job (the
/// executors abort its tasks) and releases the run, so that a writer the cancel did not reach
/// stops and deletes what it wrote: nothing stays staged, nothing is committed, and the same
/// command resumes the run.
#[test]
fn an_interrupted_client_cancels_its_job_on_the_cluster() {
    let lake = TestLake::new();
    let (from, to) = (lake.day(2), lake.day(4));
    let before = lake.version("events");
    // Every writer task waits 3 s before it writes: a job left running stages its files then.
    const SLEEP: Duration = Duration::from_secs(3);
    // Slots for all of a batch's writer tasks at once: a task the scheduler launches while it
    // cancels the job can miss the cancel (its files are then a stray attempt's, which the
    // resume, `discard` or `gc` delete), so none is left to launch when the client stops.
    let cluster = Cluster::with_slots(
        &lake,
        Some(&format!("stage-writer-start=sleep-{}", SLEEP.as_millis())),
        4,
    );
    let args = [
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--engine",
        &cluster.engine,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ];
    let client_log = lake.path().join("client.log");
    let mut client = lakefill_command(lake.path())
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&client_log).expect("client log"))
        .spawn()
        .expect("start the backfill");
    // All the writer tasks of the batch (one per output partition of the cluster's plan) wait.
    cluster.wait_for_sleeping_writers(8, &mut client, &client_log);
    let started = Instant::now();
    let signalled = Command::new("kill")
        .args(["-INT", &client.id().to_string()])
        .status()
        .expect("kill");
    assert!(signalled.success());
    let status = client.wait().expect("wait");
    let text = std::fs::read_to_string(&client_log).unwrap_or_default();
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("interrupted"), "{text}");
    // Well past the writers' wait: a job still running would have staged its files by now.
    std::thread::sleep((SLEEP + Duration::from_secs(3)).saturating_sub(started.elapsed()));
    assert!(
        cluster.log().contains("Task has been aborted"),
        "the cancel reached the executors:\n{}",
        cluster.log()
    );
    let runs = json_ok(&lake.run(&["runs", "events", "--output-format", "json"]));
    let run = &runs.as_array().expect("runs")[0];
    let run_id = run["run_id"].as_str().expect("run id").to_string();
    assert_eq!(
        staged_on_disk(&lake, &run_id),
        BTreeSet::new(),
        "{}\n{text}",
        cluster.log()
    );
    assert_eq!(lake.version("events"), before, "nothing is committed");

    // The cluster still works, and the same command resumes the run and publishes it.
    let mut resumed = args.to_vec();
    resumed.extend(["--output-format", "json"]);
    let report = json_ok(&lake.run(&resumed));
    assert_eq!(report["state"], "published", "{report}");
    assert_eq!(report["run_id"], run_id.as_str());
    assert_eq!(lake.version("events"), before + 1);
    assert_eq!(
        within(&all_events(&lake), &from, &to),
        expected_range(&lake, &from, &to)
    );
    assert_eq!(
        staged_on_disk(&lake, &run_id),
        committed_from(&lake, &run_id)
    );
}

/// How a cluster's scheduler goes away while a client waits for its job.
#[derive(Clone, Copy, Debug)]
enum SchedulerLoss {
    /// Down for longer than the client waits between two questions (so it meets refused
    /// connections), then back on the same port, without the job.
    Restarted,
    /// Down for good: the client stops asking after its bound.
    Gone,
}

/// A backfill on a cluster whose scheduler goes away while the job's writer tasks run: the
/// client fails by name within its bound and commits nothing, and the same command resumes the
/// run on a cluster back on the same port and publishes the right rows.
fn a_client_that_lost_its_scheduler(loss: SchedulerLoss) {
    let lake = TestLake::new();
    let (from, to) = (lake.day(2), lake.day(4));
    let before = lake.version("events");
    // The writer tasks wait, so the job is still running when the scheduler goes.
    let cluster = Cluster::with_slots(&lake, Some("stage-writer-start=sleep-3000"), 4);
    let args = |engine: &str| {
        [
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--engine",
            engine,
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]
        .map(String::from)
        .to_vec()
    };
    let client_log = lake.path().join("client.log");
    // The client waits 4 s after each status that says the job runs.
    let mut client = lakefill_command(lake.path())
        .args(args(&cluster.engine))
        .env("LAKEFILL_FAILPOINTS", "cluster-job-status=sleep-4000")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&client_log).expect("client log"))
        .spawn()
        .expect("start the backfill");
    cluster.wait_for_sleeping_writers(1, &mut client, &client_log);
    let port = cluster.port();
    let engine = cluster.engine.clone();
    drop(cluster);
    let client_text = || std::fs::read_to_string(&client_log).unwrap_or_default();
    let (restarted, expected) = match loss {
        SchedulerLoss::Restarted => {
            // Longer than the client's 4 s between questions: it asks a scheduler that is down.
            std::thread::sleep(Duration::from_secs(6));
            assert!(
                client.try_wait().expect("wait").is_none(),
                "the client gave up at the first refused connection:\n{}",
                client_text()
            );
            (
                Some(Cluster::on_port(&lake, None, 2, port)),
                "no longer knows job",
            )
        }
        SchedulerLoss::Gone => (None, "lost the cluster's scheduler: no answer about job"),
    };

    // Without the bounds the client asked forever; it fails within them, by name.
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = client.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = client.kill();
            panic!("the client still waits for a lost job:\n{}", client_text());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = client_text();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains(expected), "{loss:?}: {text}");
    assert!(
        text.contains(&format!("scheduler http://{}", &engine["df://".len()..])),
        "{text}"
    );
    assert!(text.contains("rerun the same command"), "{text}");
    assert!(
        text.contains("check that the cluster's scheduler and executors are up"),
        "{text}"
    );
    assert!(!text.contains("a bug in lakefill"), "{text}");
    assert_eq!(lake.version("events"), before, "nothing is committed");

    // The same command resumes the run on the cluster back on the port, and publishes the rows.
    let restarted = restarted.unwrap_or_else(|| Cluster::on_port(&lake, None, 2, port));
    let mut resumed = args(&restarted.engine);
    resumed.extend(["--output-format", "json"].map(String::from));
    let resumed: Vec<&str> = resumed.iter().map(String::as_str).collect();
    let report = json_ok(&lake.run(&resumed));
    assert_eq!(report["state"], "published", "{report}");
    assert_eq!(lake.version("events"), before + 1);
    assert_eq!(
        within(&all_events(&lake), &from, &to),
        expected_range(&lake, &from, &to)
    );
    let run_id = report["run_id"].as_str().expect("run id");
    assert_eq!(staged_on_disk(&lake, run_id), committed_from(&lake, run_id));
}

#[test]
fn a_client_whose_scheduler_restarted_and_forgot_the_job_fails_and_the_run_resumes() {
    a_client_that_lost_its_scheduler(SchedulerLoss::Restarted);
}

#[test]
fn a_client_whose_scheduler_is_gone_fails_within_its_bound_and_the_run_resumes() {
    a_client_that_lost_its_scheduler(SchedulerLoss::Gone);
}
