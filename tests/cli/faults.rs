//! Crashes at every phase, a SIGKILL mid-staging, and concurrent lakefill runs: readers see the
//! old or the new version, never a mix, and running the same command again converges.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lakefill::{CrashPhase, CrashPoint, Outcome, RunState};
use lakefill_fixtures::DemoLake;

use crate::support::{PARTIAL_FIX, Store, TestLake, run_list, run_report, stderr};

const ROWS: &str = "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), country, CAST(amount_cents AS VARCHAR) \
                    FROM events ORDER BY 1, 2";

fn rows(lake: &TestLake) -> Vec<Vec<String>> {
    lake.query(&[("events", lake.open("events"))], ROWS)
}

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

fn lakefill(lake: &TestLake, args: &[String], failpoint: Option<&str>) -> std::process::Output {
    let mut command = crate::support::lakefill_command(lake.path());
    command.args(args);
    match failpoint {
        Some(point) => command.env("LAKEFILL_FAILPOINTS", point),
        None => command.env_remove("LAKEFILL_FAILPOINTS"),
    };
    command.output().expect("run lakefill")
}

fn a_crash_at_any_phase_leaves_old_or_new_and_a_rerun_converges(store: Store) {
    // The uninterrupted result, on an identical lake.
    let reference = TestLake::on(store);
    let old_rows = rows(&reference);
    let out = lakefill(&reference, &backfill_args(&reference), None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let new_rows = rows(&reference);
    assert_ne!(old_rows, new_rows);

    // Every point a local backfill passes, generated from the engine's own list. On an object
    // store, the points around the commit, where the store's conditional write decides: the
    // others are the same code on every store, and `lifecycle::every_stop_then_*` stops at each of
    // them on each store too.
    let points = CrashPoint::ALL
        .into_iter()
        .filter(|p| p.on_local_backfill(false) && !p.error_only())
        .filter(|p| {
            store == Store::Local || matches!(p.phase(), CrashPhase::Commit | CrashPhase::Committed)
        });
    for point in points {
        let committed = point.phase() == CrashPhase::Committed;
        let point = point.to_string();
        let point = point.as_str();
        let lake = TestLake::on(store);
        let before = lake.version("events");
        let crashed = lakefill(&lake, &backfill_args(&lake), Some(point));
        assert!(!crashed.status.success(), "{point}: the process must die");
        assert!(
            stderr(&crashed).contains(point),
            "{point}: {}",
            stderr(&crashed)
        );

        // Readers see one version or the other, whole.
        let seen = rows(&lake);
        if committed {
            assert_eq!(lake.version("events"), before + 1, "{point}");
            assert!(seen == new_rows, "{point}: the new version is complete");
        } else {
            assert_eq!(lake.version("events"), before, "{point}");
            assert!(seen == old_rows, "{point}: the old version is untouched");
        }

        // The same command again finishes the job, exactly once.
        let mut args = backfill_args(&lake);
        args.extend(["--output-format".into(), "json".into()]);
        let report = run_report(&lakefill(&lake, &args, None));
        assert_eq!(
            lake.version("events"),
            before + 1,
            "{point}: one commit in all"
        );
        assert!(
            rows(&lake) == new_rows,
            "{point}: converges to the uninterrupted result"
        );
        let expected = if committed {
            Outcome::AlreadyPublished
        } else {
            Outcome::Published
        };
        assert_eq!(report.outcome, expected, "{point}");
        if point == CrashPoint::MidStage.to_string() {
            assert_eq!(
                report.resumed_batches, 1,
                "{point}: the journaled batch is kept"
            );
        }
        let runs = run_list(&lakefill(
            &lake,
            &[
                "runs".into(),
                "events".into(),
                "--output-format".into(),
                "json".into(),
            ],
            None,
        ));
        let run = runs.iter().find(|r| r.run_id == report.run_id).unwrap();
        assert_eq!(run.state, RunState::Published, "{point}");
        assert_eq!(run.published_version, Some(before + 1), "{point}");
        // No staged file is left behind that no version references.
        let referenced: std::collections::BTreeSet<String> = lake
            .files("events")
            .values()
            .flat_map(|f| f.keys().cloned())
            .collect();
        let run_dir = format!("lakefill-{}", report.run_id);
        for staged in lake
            .objects("events")
            .into_iter()
            .filter(|p| p.contains(&run_dir))
        {
            assert!(referenced.contains(&staged), "{point}: orphan {staged}");
        }
    }
}

#[test]
fn sigkill_during_staging_then_resume() {
    let lake_of = || {
        let lake = DemoLake {
            days: 40,
            events_per_day: 2_000,
            days_per_commit: 10,
            ..DemoLake::default()
        };
        TestLake::with(Store::Local, lake)
    };
    let lake = lake_of();
    let reference = lake_of();
    let args: Vec<String> = [
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(39),
        "--batch-partitions",
        "1",
        "--max-parallel",
        "1",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = lakefill(&reference, &args, None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = lake.version("events");

    let mut child = Command::new(assert_cmd::cargo::cargo_bin("lakefill"))
        .current_dir(lake.path())
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the journal holds a few finished batches, then kill without warning.
    let runs = lake.table_path("events").join("_lakefill/runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut journaled = 0;
    while Instant::now() < deadline {
        journaled = std::fs::read_dir(&runs)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("events-v2-"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .map(|j| j["batches"].as_array().map_or(0, Vec::len))
            .max()
            .unwrap_or(0);
        if journaled >= 3 || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "killed before it finished (journaled {journaled} batches)"
    );
    assert!(
        journaled >= 3,
        "the journal recorded batches before the kill"
    );
    assert_eq!(lake.version("events"), before, "nothing published");

    let mut resume = args.clone();
    resume.extend(["--output-format".into(), "json".into()]);
    let resumed = run_report(&lakefill(&lake, &resume, None)).resumed_batches;
    assert!(
        resumed >= 3,
        "resumed after the finished batches: {resumed}"
    );
    assert!(resumed < 40);
    assert_eq!(lake.version("events"), before + 1);
    assert!(
        rows(&lake) == rows(&reference),
        "same table as an uninterrupted run"
    );
}

fn overlapping_runs_one_publishes_the_other_conflicts(store: Store) {
    let lake = TestLake::on(store);
    let v2 = std::fs::read_to_string(lake.path().join("sql/events/v2.sql")).unwrap();
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        v2 + "-- v3: same logic, another version\n",
    )
    .unwrap();
    let stage = |version: &str, from: u64, to: u64| {
        run_report(&lake.run(&[
            "backfill",
            "events",
            "--from",
            &lake.day(from),
            "--to",
            &lake.day(to),
            "--model-version",
            version,
            "--stage-only",
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]))
        .run_id
    };
    let first = stage("v2", 2, 5);
    let second = stage("v3", 4, 7);
    let before = lake.version("events");
    let out = lake.run(&["publish", &first]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = lake.run(&["publish", &second]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        lake.version("events"),
        before + 1,
        "only the first run published"
    );
    // Once its input moved, the second run stages again from the new version and publishes.
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(4),
        "--to",
        &lake.day(7),
        "--model-version",
        "v3",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(lake.version("events"), before + 2);
}

every_store!(
    a_crash_at_any_phase_leaves_old_or_new_and_a_rerun_converges,
    overlapping_runs_one_publishes_the_other_conflicts,
);

/// A write the disk refuses (a full disk; here a file-size limit, `ulimit -f`, with SIGXFSZ
/// ignored so the write fails with EFBIG as ENOSPC would) stops the run with its cause and the
/// command to resume: no panic, no backtrace, nothing published, and the resumed run finishes.
#[test]
fn issue_33_a_full_disk_stops_the_run_cleanly() {
    let lake = TestLake::new();
    let before = rows(&lake);
    let version = lake.version("events");
    let args = backfill_args(&lake);
    let out = Command::new("bash")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"")
        .arg(assert_cmd::cargo::cargo_bin("lakefill"))
        .args(&args)
        .current_dir(lake.path())
        .env("RUST_BACKTRACE", "1")
        .env_remove("LAKEFILL_FAILPOINTS")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for unwanted in ["panicked", "stack backtrace", "Already shut down"] {
        assert!(!err.contains(unwanted), "{unwanted}: {err}");
    }
    assert!(
        err.contains("File too large") && err.contains("resumes the run"),
        "{err}"
    );
    assert_eq!(lake.version("events"), version, "nothing published");
    assert_eq!(rows(&lake), before);
    let out = crate::support::lakefill_command(lake.path())
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(lake.version("events"), version + 1);
}

/// A run published, its range then moved by another run, and its command run again (a second
/// publish of the same run id) but stopped before the commit: the next run of the command
/// publishes it, never "already published" over the other run's rows (#37 review).
#[test]
fn an_interrupted_second_publish_of_a_run_is_finished_by_the_next() {
    let lake = TestLake::on(Store::Local);
    let fix = backfill_args(&lake);
    let out = lakefill(&lake, &fix, None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let fixed = rows(&lake);
    // The bug again over the same range: the fix's range moved.
    let mut bug = fix.clone();
    bug.extend(["--model-version".into(), "v1".into()]);
    let out = lakefill(&lake, &bug, None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(rows(&lake) != fixed);
    let before = lake.version("events");
    for point in [
        CrashPoint::MidStage,
        CrashPoint::MidValidate,
        CrashPoint::BeforeCommit,
    ] {
        let crashed = lakefill(&lake, &fix, Some(&point.to_string()));
        assert!(!crashed.status.success(), "{point}: the process must die");
        assert_eq!(lake.version("events"), before, "{point}");
    }
    let mut args = fix.clone();
    args.extend(["--output-format".into(), "json".into()]);
    let report = run_report(&lakefill(&lake, &args, None));
    assert_eq!(report.outcome, Outcome::Published, "not already published");
    assert_eq!(lake.version("events"), before + 1);
    assert!(
        rows(&lake) == fixed,
        "the fix's rows, as when first published"
    );
    let runs = run_list(&lakefill(
        &lake,
        &[
            "runs".into(),
            "events".into(),
            "--output-format".into(),
            "json".into(),
        ],
        None,
    ));
    let run = runs.iter().find(|r| r.run_id == report.run_id).unwrap();
    assert_eq!(run.state, RunState::Published);
}
