//! The run life cycle (issue #9): however a run stops and whatever command follows, the table
//! never loses a row or shows a partial range, only a complete validated run publishes, re-running
//! converges with exactly one commit, and `runs` tells the truth.

use std::collections::BTreeMap;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lakefill::{CrashPhase, CrashPoint, RunState, RunSummary};

use crate::support::{PARTIAL_FIX, Store, TestLake, json_ok, lakefill_command, run_list, stderr};

const ROWS: &str = "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), country, \
                    CAST(amount_cents AS VARCHAR) FROM events ORDER BY 1, 2";

fn rows(lake: &TestLake) -> Vec<Vec<String>> {
    lake.query(&[("events", lake.open("events"))], ROWS)
}

/// Days 1..=8 in four batches of two, one at a time: every stop point is reached.
fn backfill_args(lake: &TestLake) -> Vec<String> {
    [
        "backfill",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(8),
        "--batch-partitions",
        "2",
        "--max-parallel",
        "1",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn command(lake: &TestLake, args: &[String], failpoint: Option<&str>) -> Command {
    let mut command = lakefill_command(lake.path());
    command.args(args);
    if let Some(point) = failpoint {
        command.env("LAKEFILL_FAILPOINTS", point);
    }
    command
}

fn run(lake: &TestLake, args: &[&str]) -> Output {
    lake.run(args)
}

/// How a run is stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// The process aborts at the point (a power cut, `kill -9`).
    Abort(CrashPoint<'static>),
    /// The point returns an error (a failing store, query or check).
    Error(CrashPoint<'static>),
    /// The process pauses at the point and gets SIGKILL.
    Kill(CrashPoint<'static>),
    /// The process pauses at the point and gets SIGINT (Ctrl-C).
    Interrupt(CrashPoint<'static>),
}

/// An abort at every point a local backfill passes (from the engine's own list), then errors,
/// a SIGKILL and interrupts while staging and validating.
fn stops() -> Vec<Stop> {
    let mut stops: Vec<Stop> = CrashPoint::ALL
        .into_iter()
        .filter(|p| p.on_local_backfill(false) && !p.error_only())
        .map(Stop::Abort)
        .collect();
    stops.extend([
        Stop::Error(CrashPoint::StageBatch(2)),
        Stop::Error(CrashPoint::MidValidate),
        Stop::Kill(CrashPoint::StageBatch(2)),
        Stop::Interrupt(CrashPoint::StageBatch(2)),
        Stop::Interrupt(CrashPoint::MidValidate),
    ]);
    stops
}

/// What is run after the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FollowUp {
    Publish,
    Discard,
    Gc,
    Rerun,
}

/// The lake before and after the uninterrupted run, computed once per store.
struct Reference {
    old_rows: Vec<Vec<String>>,
    new_rows: Vec<Vec<String>>,
}

fn reference(store: Store) -> Reference {
    let lake = TestLake::on(store);
    let old_rows = rows(&lake);
    let out = command(&lake, &backfill_args(&lake), None)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let new_rows = rows(&lake);
    assert_ne!(old_rows, new_rows, "the fix changes the table");
    Reference { old_rows, new_rows }
}

/// Waits until the journal of a v2 run shows `marker` in the process's stderr stream, i.e. the
/// failpoint was reached and the process is paused there.
fn wait_paused(child: &mut Child, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("failpoint hit: pausing") {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before pausing:\n{text}"
        );
        assert!(Instant::now() < deadline, "the run never paused:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops a backfill of `lake` as `stop` says; returns its exit code (None: killed by a signal).
fn stop_a_run(lake: &TestLake, stop: Stop) -> Option<i32> {
    let args = backfill_args(lake);
    match stop {
        Stop::Abort(point) => {
            let out = command(lake, &args, Some(&point.to_string()))
                .output()
                .unwrap();
            assert!(!out.status.success(), "{stop:?}: the process must die");
            out.status.code()
        }
        Stop::Error(point) => {
            let out = command(lake, &args, Some(&format!("{point}=error")))
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{stop:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("injected failure"), "{stop:?}: {err}");
            assert!(err.contains("nothing was published"), "{stop:?}: {err}");
            assert!(err.contains("resumes the run"), "{stop:?}: {err}");
            out.status.code()
        }
        Stop::Kill(point) | Stop::Interrupt(point) => {
            let log = lake.path().join("stopped.log");
            let mut child = command(lake, &args, Some(&format!("{point}=pause")))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            wait_paused(&mut child, &log);
            let signal = if matches!(stop, Stop::Kill(_)) {
                "KILL"
            } else {
                "INT"
            };
            let status = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            let status = child.wait().unwrap();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if matches!(stop, Stop::Interrupt(_)) {
                assert_eq!(status.code(), Some(130), "{stop:?}:\n{text}");
                assert!(text.contains("interrupted"), "{stop:?}:\n{text}");
            } else {
                assert_eq!(status.code(), None, "{stop:?}: killed");
            }
            status.code()
        }
    }
}

/// The v2 run of the matrix, as `runs` reports it.
fn the_run(lake: &TestLake) -> Option<RunSummary> {
    run_list(&run(lake, &["runs", "events", "--output-format", "json"]))
        .into_iter()
        .find(|r| r.model_version == "v2")
}

/// Readers see the old table or the new one, whole, at one of two versions.
fn assert_old_or_new(lake: &TestLake, reference: &Reference, before: u64, what: &str) -> bool {
    let seen = rows(lake);
    let version = lake.version("events");
    if version == before {
        assert!(
            seen == reference.old_rows,
            "{what}: the old version is whole"
        );
        false
    } else {
        assert_eq!(version, before + 1, "{what}: at most one commit");
        assert!(
            seen == reference.new_rows,
            "{what}: the new version is whole"
        );
        true
    }
}

/// The stops a follow-up is tried after on `store`: every stop on local disk; on an object store
/// every fourth, a different quarter for each follow-up, so that each stop meets each store once
/// (the stops exercise the run's life cycle, which is the same code on every store; what the store
/// changes, listing, deleting and committing, every quarter reaches).
fn stops_for(store: Store, follow_up: FollowUp) -> Vec<Stop> {
    let quarter = match follow_up {
        FollowUp::Publish => 0,
        FollowUp::Discard => 1,
        FollowUp::Gc => 2,
        FollowUp::Rerun => 3,
    };
    stops()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| store == Store::Local || i % 4 == quarter)
        .map(|(_, stop)| stop)
        .collect()
}

fn every_stop_then(store: Store, follow_up: FollowUp) {
    let reference = reference(store);
    for stop in stops_for(store, follow_up) {
        let what = format!("{stop:?} then {follow_up:?}");
        let lake = TestLake::on(store);
        let before = lake.version("events");
        stop_a_run(&lake, stop);
        let published = assert_old_or_new(&lake, &reference, before, &what);
        assert_eq!(
            published,
            matches!(stop, Stop::Abort(point) if point.phase() == CrashPhase::Committed),
            "{what}: only a commit that landed publishes"
        );

        // `runs` tells the truth: published exactly when the log has the commit, and otherwise
        // where the run stopped.
        let listed = the_run(&lake);
        assert_eq!(
            listed.as_ref().map(|r| r.state),
            expected_state(stop),
            "{what}: {listed:?}"
        );
        let run_id = listed.as_ref().map(|r| r.run_id.clone());

        match (follow_up, run_id) {
            (FollowUp::Publish, Some(run_id)) => {
                let out = run(&lake, &["publish", &run_id, "--output-format", "json"]);
                let state = listed.as_ref().unwrap().state.to_string();
                let document: serde_json::Value =
                    serde_json::from_slice(&out.stdout).expect("one JSON document");
                if published {
                    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
                    assert_eq!(document["outcome"], "already_published", "{what}");
                } else if state == "validated" {
                    // Validated and complete; the commit never landed: publishing it is right.
                    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
                    assert_eq!(document["outcome"], "published", "{what}");
                } else {
                    // Incomplete or never validated: refused, with the way forward.
                    let code = out.status.code();
                    assert!(
                        matches!(code, Some(2 | 3)),
                        "{what}: {code:?} {}",
                        stderr(&out)
                    );
                    assert_eq!(document["exit_code"], code.unwrap(), "{what}: {document}");
                    assert!(
                        document["hint"]
                            .as_str()
                            .unwrap()
                            .contains("lakefill backfill events"),
                        "{what}: {document}"
                    );
                    assert_eq!(document["state"], state.as_str(), "{what}: {document}");
                }
                assert_old_or_new(&lake, &reference, before, &what);
            }
            (FollowUp::Discard, Some(run_id)) => {
                let out = run(&lake, &["discard", &run_id]);
                if published {
                    assert_eq!(out.status.code(), Some(2), "{what}: {}", stderr(&out));
                    assert!(stderr(&out).contains("cannot be discarded"), "{what}");
                    assert!(assert_old_or_new(&lake, &reference, before, &what));
                } else {
                    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
                    assert!(!assert_old_or_new(&lake, &reference, before, &what));
                    assert_eq!(the_run(&lake).unwrap().state, RunState::Discarded, "{what}");
                }
            }
            (FollowUp::Gc, _) => {
                let versions: Vec<Vec<Vec<String>>> = (0..=lake.version("events"))
                    .map(|v| lake.query(&[("events", lake.open_version("events", v))], ROWS))
                    .collect();
                let out = run(&lake, &["gc", "events", "--older-than", "0s"]);
                assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
                let after: Vec<Vec<Vec<String>>> = (0..versions.len() as u64)
                    .map(|v| lake.query(&[("events", lake.open_version("events", v))], ROWS))
                    .collect();
                assert!(
                    after == versions,
                    "{what}: every version reads the same after gc"
                );
            }
            _ => {}
        }

        // Running the same command again finishes the job: one commit in all, the same table as
        // an uninterrupted run, and the run says so.
        let mut args = backfill_args(&lake);
        args.extend(["--output-format".into(), "json".into()]);
        let out = command(&lake, &args, None).output().unwrap();
        let report = json_ok(&out);
        assert_eq!(
            lake.version("events"),
            before + 1,
            "{what}: one commit in all"
        );
        assert!(rows(&lake) == reference.new_rows, "{what}: converges");
        assert!(
            matches!(
                report["outcome"].as_str(),
                Some("published" | "already_published")
            ),
            "{what}: {}",
            report["outcome"]
        );
        let run = the_run(&lake).unwrap();
        assert_eq!(run.state, RunState::Published, "{what}");
        assert_eq!(run.published_version, Some(before + 1), "{what}");
        // Nothing staged is left that no version references.
        let referenced: std::collections::BTreeSet<String> = lake
            .files("events")
            .values()
            .flat_map(|f| f.keys().cloned())
            .collect();
        let run_dir = format!("lakefill-{}", run.run_id);
        for staged in lake
            .objects("events")
            .into_iter()
            .filter(|p| p.contains(&run_dir) && !p.starts_with("_lakefill"))
        {
            assert!(referenced.contains(&staged), "{what}: orphan {staged}");
        }
    }
}

/// Where a run stopped this way stands (`None`: it never started, so it has no journal).
fn expected_state(stop: Stop) -> Option<RunState> {
    Some(match stop {
        Stop::Abort(point) | Stop::Kill(point) => match point.phase() {
            CrashPhase::Plan => return None,
            CrashPhase::Stage => RunState::Staging,
            CrashPhase::Staged => RunState::Staged,
            CrashPhase::Validate => RunState::Validating,
            // The commit never landed: the log says so, and the run is validated again.
            CrashPhase::Commit => RunState::Validated,
            CrashPhase::Committed => RunState::Published,
            CrashPhase::Other => panic!("{point} is not on a backfill's path"),
        },
        Stop::Error(_) | Stop::Interrupt(_) => RunState::Failed,
    })
}

fn every_stop_then_publish(store: Store) {
    every_stop_then(store, FollowUp::Publish);
}

fn every_stop_then_discard(store: Store) {
    every_stop_then(store, FollowUp::Discard);
}

fn every_stop_then_gc(store: Store) {
    every_stop_then(store, FollowUp::Gc);
}

fn every_stop_then_rerun(store: Store) {
    every_stop_then(store, FollowUp::Rerun);
}

/// Starts the same command `n` times at once and waits for all.
fn race(lake: &TestLake, args: &[&str], n: usize) -> Vec<Output> {
    let children: Vec<Child> = (0..n)
        .map(|_| {
            lakefill_command(lake.path())
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// Every process either did the work, found it done, or was told clearly someone else is on it.
fn assert_one_winner(outputs: &[Output], what: &str) {
    let mut published = 0;
    for out in outputs {
        match out.status.code() {
            Some(0) => {
                let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                match report["outcome"].as_str() {
                    Some("published") => published += 1,
                    Some("already_published") => {}
                    other => panic!("{what}: unexpected outcome {other:?}"),
                }
            }
            Some(4) => {
                let err = stderr(out);
                assert!(
                    err.contains("is being worked on by another process"),
                    "{what}: {err}"
                );
                assert!(err.contains("\nhint: "), "{what}: {err}");
            }
            other => panic!("{what}: exit {other:?}: {}", stderr(out)),
        }
    }
    assert_eq!(published, 1, "{what}: exactly one process published");
}

fn identical_backfills_started_together_commit_once(store: Store) {
    let reference = reference(store);
    let lake = TestLake::on(store);
    let before = lake.version("events");
    let mut args = backfill_args(&lake);
    args.extend(["--output-format".into(), "json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outputs = race(&lake, &args, 4);
    assert_one_winner(&outputs, "4 backfills");
    assert_eq!(lake.version("events"), before + 1, "exactly one commit");
    assert!(rows(&lake) == reference.new_rows, "the table reads fully");
    let run = the_run(&lake).unwrap();
    assert_eq!(run.state, RunState::Published);
    let out = run_discard(&lake, &run.run_id);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(rows(&lake) == reference.new_rows, "discard changed nothing");
}

fn run_discard(lake: &TestLake, run_id: &str) -> Output {
    run(lake, &["discard", run_id])
}

fn identical_publishes_started_together_commit_once(store: Store) {
    let lake = TestLake::on(store);
    let run_id = lake.stage_events(1, 8);
    let before = lake.version("events");
    let outputs = race(&lake, &["publish", &run_id, "--output-format", "json"], 4);
    assert_one_winner(&outputs, "4 publishes");
    assert_eq!(lake.version("events"), before + 1, "exactly one commit");
    let run = the_run(&lake).unwrap();
    assert_eq!(run.state, RunState::Published);
    assert_eq!(run.published_version, Some(before + 1));
}

/// A range inside a published one recomputes to the same rows: nothing is published and
/// nothing stays staged.
fn a_rerun_inside_a_published_range_is_up_to_date(store: Store) {
    let lake = TestLake::on(store);
    let out = command(&lake, &backfill_args(&lake), None)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = lake.version("events");
    let files = lake.files("events");
    let report = json_ok(&run(
        &lake,
        &[
            "backfill",
            "events",
            "--from",
            &lake.day(3),
            "--to",
            &lake.day(5),
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ],
    ));
    assert_eq!(report["outcome"], "up_to_date", "{report}");
    assert_eq!(report["state"], "up-to-date");
    assert_eq!(report["published_version"], serde_json::Value::Null);
    assert_eq!(report["validation"]["comparison"]["identical"], true);
    assert_eq!(lake.version("events"), before, "no commit");
    assert_eq!(lake.files("events"), files, "the same files");
    let run_dir = format!("lakefill-{}/", report["run_id"].as_str().unwrap());
    let left: Vec<String> = lake
        .objects("events")
        .into_iter()
        .filter(|p| p.contains(&run_dir))
        .collect();
    assert!(left.is_empty(), "nothing stays staged: {left:?}");
    // A changed model is not up to date: the same range with a different fix publishes.
    let v2 = std::fs::read_to_string(lake.path().join("sql/events/v2.sql")).unwrap();
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        v2.replace("amount_cents,\n", "amount_cents + 1 AS amount_cents,\n"),
    )
    .unwrap();
    let report = json_ok(&run(
        &lake,
        &[
            "backfill",
            "events",
            "--from",
            &lake.day(3),
            "--to",
            &lake.day(5),
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ],
    ));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(report["validation"]["comparison"]["identical"], false);
    let sums = lake.query(
        &[
            ("events", lake.open("events")),
            ("old", lake.open_version("events", before)),
        ],
        &format!(
            "SELECT (SELECT SUM(amount_cents) FROM events WHERE event_date BETWEEN DATE '{0}' AND DATE '{1}') \
                  - (SELECT SUM(amount_cents) FROM old WHERE event_date BETWEEN DATE '{0}' AND DATE '{1}'), \
                    (SELECT COUNT(*) FROM old WHERE event_date BETWEEN DATE '{0}' AND DATE '{1}')",
            lake.day(3),
            lake.day(5)
        ),
    );
    assert_eq!(sums[0][0], sums[0][1], "each row gained one cent");
}

every_store!(
    every_stop_then_publish,
    every_stop_then_discard,
    every_stop_then_gc,
    every_stop_then_rerun,
    identical_backfills_started_together_commit_once,
    identical_publishes_started_together_commit_once,
    a_rerun_inside_a_published_range_is_up_to_date,
);

/// Every file of a local table: relative path -> bytes.
fn snapshot_files(dir: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    crate::support::files_under(dir)
        .into_iter()
        .filter(|p| !p.contains("/_lakefill/"))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// gc and discard never reach into another table: not through a nested table's directory, not
/// through a symbolic link, not on a tampered journal's word.
#[test]
fn gc_and_discard_never_touch_another_tables_files() {
    let lake = TestLake::new();
    let events = lake.table_path("events");
    let revenue = lake.table_path("daily_revenue");
    // A copy of daily_revenue (its files sit in `lakefill-<run>` directories) nested inside
    // events, once beside the partitions and once at partition depth.
    let nested = [
        events.join("archive"),
        events.join(format!("event_date={}", "2099-01-01")),
    ];
    for dir in &nested {
        lakefill_fixtures::copy_dir(&revenue, dir).unwrap();
    }
    // Links from events into daily_revenue: a partition directory and a staging directory.
    let revenue_partition = std::fs::read_dir(&revenue)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("event_date=")
        })
        .unwrap();
    std::os::unix::fs::symlink(&revenue_partition, events.join("event_date=2099-01-02")).unwrap();
    let revenue_run_dir = std::fs::read_dir(&revenue_partition)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("lakefill-")
        })
        .unwrap();
    let linked_run = format!(
        "lakefill-{}",
        revenue_run_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("lakefill-")
    );
    std::os::unix::fs::symlink(
        &revenue_run_dir,
        events
            .join(format!("event_date={}", lake.day(1)))
            .join(&linked_run),
    )
    .unwrap();

    // A staged run of events whose journal is then tampered with.
    let run_id = lake.stage_events(2, 4);
    let journal_path = events.join("_lakefill/runs").join(format!("{run_id}.json"));
    let journal: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&journal_path).unwrap()).unwrap();

    let revenue_before = snapshot_files(&revenue);
    let nested_before: Vec<_> = nested.iter().map(|d| snapshot_files(d)).collect();
    let log_before = snapshot_files(&events.join("_delta_log"));
    let revenue_rows = |lake: &TestLake| {
        lake.query(
            &[("r", lake.open("daily_revenue"))],
            "SELECT COUNT(*), SUM(revenue_cents) FROM r",
        )
    };
    let revenue_read = revenue_rows(&lake);

    let first_staged = journal["batches"][0]["files"][0]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let tampered_paths = [
        "_delta_log/00000000000000000000.json".to_string(),
        format!(
            "../daily_revenue/{}",
            revenue_run_dir
                .strip_prefix(&revenue)
                .unwrap()
                .join("x.parquet")
                .display()
        ),
        first_staged.replace(&lake.day(2), &lake.day(9)),
        first_staged.replace(&run_id, "events-v1-000000000000"),
    ];
    for tampered in &tampered_paths {
        let mut bad = journal.clone();
        bad["batches"][0]["files"][0]["path"] = tampered.as_str().into();
        std::fs::write(&journal_path, serde_json::to_vec(&bad).unwrap()).unwrap();
        for args in [
            vec!["discard", run_id.as_str()],
            vec!["publish", run_id.as_str()],
            vec!["gc", "events", "--older-than", "0s"],
            vec!["runs", "events"],
        ] {
            let out = run(&lake, &args);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{tampered} {args:?}: {}",
                stderr(&out)
            );
            let err = stderr(&out);
            assert!(
                err.contains(&format!("{run_id}.json")),
                "names the journal: {err}"
            );
            assert!(err.contains("\nhint: "), "{err}");
        }
        assert_eq!(
            snapshot_files(&events.join("_delta_log")),
            log_before,
            "{tampered}"
        );
    }
    std::fs::write(&journal_path, serde_json::to_vec(&journal).unwrap()).unwrap();

    // With the journal intact, gc (everything counts as abandoned) and discard run.
    for args in [
        vec!["gc", "events", "--older-than", "0s"],
        vec!["discard", run_id.as_str()],
        vec!["gc", "daily_revenue", "--older-than", "0s"],
    ] {
        let out = run(&lake, &args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(
        snapshot_files(&revenue),
        revenue_before,
        "daily_revenue untouched"
    );
    for (dir, before) in nested.iter().zip(&nested_before) {
        assert_eq!(&snapshot_files(dir), before, "{} untouched", dir.display());
    }
    assert_eq!(
        revenue_rows(&lake),
        revenue_read,
        "daily_revenue reads the same"
    );
    assert_eq!(snapshot_files(&events.join("_delta_log")), log_before);
    assert!(
        !crate::support::files_under(&events)
            .iter()
            .any(|p| p.contains(&format!("lakefill-{run_id}/"))),
        "the discarded run's own files are gone"
    );
}

/// Two tables may not share or nest locations: the project is refused, naming both.
#[test]
fn tables_with_nested_locations_are_refused() {
    let lake = TestLake::new();
    let toml = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    std::fs::write(
        lake.path().join("lakefill.toml"),
        format!("{toml}\n[tables.events_archive]\nuri = \"lake/events/archive\"\n"),
    )
    .unwrap();
    let files = crate::support::files_under(&lake.table_path("events"));
    for args in [
        vec!["gc", "events"],
        vec!["runs"],
        vec![
            "plan",
            "events",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    ] {
        let out = run(&lake, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("`events_archive`") && err.contains("`events`"),
            "{err}"
        );
        assert!(err.contains("is inside"), "{err}");
    }
    assert_eq!(
        crate::support::files_under(&lake.table_path("events")),
        files
    );
}

/// Usage mistakes are refused up front with exit 2, and change nothing.
#[test]
fn careless_inputs_are_usage_errors() {
    let lake = TestLake::new();
    let (from, to) = (lake.day(1), lake.day(2));
    let huge = lake.path().join("sql/events/v3.sql");
    let v2 = std::fs::read_to_string(lake.path().join("sql/events/v2.sql")).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            strings(&[
                "backfill",
                "events",
                "--from",
                &from,
                "--to",
                &to,
                "--max-parallel",
                "0",
            ]),
            "must be at least 1",
        ),
        (
            strings(&[
                "plan",
                "events",
                "--from",
                &from,
                "--to",
                &to,
                "--batch-partitions",
                "0",
            ]),
            "must be at least 1",
        ),
        (
            strings(&["gc", "events", "--older-than", "18446744073709551615d"]),
            "hundred years",
        ),
        (
            strings(&["plan", "../events", "--from", &from, "--to", &to]),
            "plain identifier",
        ),
        (
            strings(&[
                "backfill",
                "events",
                "--from",
                &from,
                "--to",
                &to,
                "--force-publish",
                "--reason",
                " ",
                "--allow-edge-moves",
            ]),
            "must not be empty",
        ),
        (
            strings(&[
                "publish",
                "events-v2-000000000000",
                "--force-publish",
                "--reason",
                "",
            ]),
            "must not be empty",
        ),
        (strings(&["publish", "../x"]), "a run id holds only"),
    ];
    let before = lake.version("events");
    let files = lake.files("events");
    for (args, message) in cases {
        let out = lake.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(message),
            "{args:?}: expected `{message}` in {err}"
        );
    }
    // A lookback past any calendar is refused by the model check, never a panic.
    std::fs::write(&huge, v2.replace("lookahead = 1", "lookahead = 4294967295")).unwrap();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("lookahead"), "{}", stderr(&out));
    std::fs::remove_file(&huge).unwrap();
    assert_eq!(lake.version("events"), before);
    assert_eq!(lake.files("events"), files);
}

/// A failure with `--output-format json` is one JSON document on stdout, too.
#[test]
fn json_failures_are_one_document() {
    let lake = TestLake::new();
    let out = lake.run(&[
        "plan",
        "events",
        "--from",
        "2026-02-30",
        "--to",
        &lake.day(2),
        "--output-format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(document["exit_code"], 2);
    assert!(
        document["error"]
            .as_str()
            .unwrap()
            .contains("is not a date")
    );
    assert!(document["hint"].is_string());
    assert!(document["state"].is_null());
}

/// A released model file is never edited: once `events@v2` is published, an edited `v2.sql` is
/// refused loudly by `plan` and `backfill`, and a new version file works.
#[test]
fn an_edited_published_model_is_refused() {
    let lake = TestLake::new();
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
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = lake.path().join("sql/events/v2.sql");
    let v2 = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        v2.replace("amount_cents,\n", "amount_cents * 2 AS amount_cents,\n"),
    )
    .unwrap();
    let before = lake.version("events");
    for command in ["plan", "backfill"] {
        let out = lake.run(&[
            command,
            "events",
            "--from",
            &lake.day(3),
            "--to",
            &lake.day(4),
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        assert!(
            err.contains("was edited after `events@v2` was published"),
            "{err}"
        );
        assert!(err.contains("new version file"), "{err}");
    }
    assert_eq!(lake.version("events"), before);
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        std::fs::read(&path).unwrap(),
    )
    .unwrap();
    std::fs::write(&path, v2).unwrap();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(3),
        "--to",
        &lake.day(4),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Starts `args` with `failpoint` armed as `sleep-MS`, and returns once the process sleeps there
/// (it says so on stderr), with its stderr so far.
fn start_sleeping(lake: &TestLake, args: &[&str], failpoint: &str, millis: u64) -> Child {
    use std::io::{BufRead, BufReader};
    let mut child = lakefill_command(lake.path())
        .args(args)
        .env("LAKEFILL_FAILPOINTS", format!("{failpoint}=sleep-{millis}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "{args:?} ended before {failpoint}"
        );
        if line.contains("failpoint hit: sleeping") {
            break;
        }
    }
    // The rest of its stderr is drained, so it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    child
}

/// A publish that found the run before another process published it (and so read the log as
/// it was then) says the run is published, and leaves it so: it reads the log again once it
/// holds the run, instead of taking the journal's `published` for a commit that never landed.
#[test]
fn a_publish_overtaken_by_another_finds_the_run_published() {
    let lake = TestLake::new();
    let run_id = lake.stage_events(1, 8);
    let before = lake.version("events");
    let late = start_sleeping(
        &lake,
        &["publish", &run_id, "--output-format", "json"],
        "run-found",
        3_000,
    );
    let first = json_ok(&run(
        &lake,
        &["publish", &run_id, "--output-format", "json"],
    ));
    assert_eq!(first["outcome"], "published", "{first}");
    let late = late.wait_with_output().unwrap();
    assert_eq!(late.status.code(), Some(0), "{}", stderr(&late));
    let report: serde_json::Value = serde_json::from_slice(&late.stdout).unwrap();
    assert_eq!(report["outcome"], "already_published", "{report}");
    assert_eq!(lake.version("events"), before + 1);
    let published = the_run(&lake).unwrap();
    assert_eq!(published.state, RunState::Published, "{published:?}");
}

/// `gc` lists a failed run's staged files as garbage; before it deletes them the run is resumed
/// and published, its first batch's files with it. `gc` sees the run moved and deletes none:
/// every file of the new version is there and reads.
#[test]
fn gc_leaves_the_files_of_a_run_published_since_it_listed_them() {
    let lake = TestLake::new();
    let args = backfill_args(&lake);
    let failed = command(&lake, &args, Some("stage-batch-1=error"))
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    let failed_run = the_run(&lake).unwrap();
    assert_eq!(failed_run.state, RunState::Failed, "{failed_run:?}");
    let dry = json_ok(&run(
        &lake,
        &["gc", "events", "--dry-run", "--output-format", "json"],
    ));
    assert!(
        !dry["files"].as_array().unwrap().is_empty(),
        "the failed run's first batch is garbage now: {dry}"
    );

    let gc = start_sleeping(
        &lake,
        &["gc", "events", "--output-format", "json"],
        "gc-listed",
        4_000,
    );
    let resumed = command(&lake, &args, None).output().unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let gc = gc.wait_with_output().unwrap();
    assert_eq!(gc.status.code(), Some(0), "{}", stderr(&gc));
    let report: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(report["files"], serde_json::json!([]), "{report}");

    assert_eq!(the_run(&lake).unwrap().state, RunState::Published);
    let table = lake.table_path("events");
    for files in lake.files("events").values() {
        for path in files.keys() {
            assert!(
                table.join(crate::support::decoded(path)).exists(),
                "{path} of the latest version"
            );
        }
    }
    assert!(
        rows(&lake) == reference(Store::Local).new_rows,
        "the fix, whole"
    );
}

/// Publish verifies each staged file is the one validation saw (#33): one replaced on disk after
/// `--stage-only` (by another staged file of the same run, bytes and all) is named and nothing
/// is published; the table still reads.
#[test]
fn issue_33_a_staged_file_changed_after_validation_is_not_published() {
    let lake = TestLake::new();
    let run_id = lake.stage_events(2, 4);
    let version = lake.version("events");
    let mut staged: Vec<String> = crate::support::files_under(&lake.table_path("events"))
        .into_iter()
        .filter(|f| f.contains(&format!("lakefill-{run_id}")) && f.ends_with(".parquet"))
        .collect();
    staged.sort();
    assert!(staged.len() >= 2, "{staged:?}");
    std::fs::copy(&staged[1], &staged[0]).unwrap();
    let out = lake.run(&["publish", &run_id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let name = std::path::Path::new(&staged[0])
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert!(
        stderr(&out).contains("changed after validation") && stderr(&out).contains(&name),
        "{}",
        stderr(&out)
    );
    assert_eq!(lake.version("events"), version, "nothing published");
    let rows = lake.query(
        &[("events", lake.open("events"))],
        "SELECT COUNT(*) FROM events",
    );
    assert!(!rows.is_empty());
}

/// A run held by a process in another PID namespace of this machine (a container: the same
/// boot id, its own pids, pid 1 being the holder) is not taken over: its pid means another
/// process here, so only the lease's time-to-live can say it died. Needs `unshare` (root); the
/// lease's unit test covers the rule where it is missing.
#[test]
fn issue_33_a_holder_in_another_pid_namespace_keeps_its_run() {
    let usable = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !usable {
        eprintln!("skipped: `unshare --pid` is not available here");
        return;
    }
    let lake = TestLake::new();
    let before = lake.version("events");
    let args = backfill_args(&lake);
    let log = lake.path().join("contained.log");
    let mut contained = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(assert_cmd::cargo::cargo_bin("lakefill"))
        .args(&args)
        .current_dir(lake.path())
        .env_remove("AWS_ENDPOINT_URL")
        .env("LAKEFILL_FAILPOINTS", "after-stage=pause")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_paused(&mut contained, &log);
    let second = command(&lake, &args, None).output().unwrap();
    let err = stderr(&second);
    assert_eq!(second.status.code(), Some(4), "{err}");
    assert!(
        err.contains("is being worked on by another process") && err.contains("pid 1 "),
        "{err}"
    );
    assert_eq!(
        lake.version("events"),
        before,
        "nothing published by the second"
    );
    contained.kill().unwrap();
    contained.wait().unwrap();
}

/// A journal that claims a version the log has not reached (damaged, edited by hand) is not
/// believed: `runs`, `report` and `publish` show the version the log says the run made.
#[test]
fn issue_33_a_journal_claiming_a_missing_version_is_corrected_from_the_log() {
    let lake = TestLake::new();
    let report = json_ok(&run(
        &lake,
        &[
            "backfill",
            "events",
            "--from",
            &lake.day(2),
            "--to",
            &lake.day(3),
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
            "--output-format",
            "json",
        ],
    ));
    let run_id = report["run_id"].as_str().unwrap().to_string();
    let published = report["published_version"].as_u64().unwrap();
    let path = lake
        .table_path("events")
        .join(format!("_lakefill/runs/{run_id}.json"));
    let mut journal: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    journal["published_version"] = serde_json::json!(999);
    std::fs::write(&path, serde_json::to_string(&journal).unwrap()).unwrap();
    let runs = json_ok(&run(&lake, &["runs", "events", "--output-format", "json"]));
    let listed = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(listed["published_version"], published, "{listed}");
    let again = json_ok(&run(
        &lake,
        &["publish", &run_id, "--output-format", "json"],
    ));
    assert_eq!(again["outcome"], "already_published", "{again}");
    assert_eq!(again["published_version"], published, "{again}");
}
