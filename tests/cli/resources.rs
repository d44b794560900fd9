//! Resource limits and progress: bounded memory, parallel batches, JSON progress events.

use lakefill_fixtures::DemoLake;

use crate::support::{PARTIAL_FIX, Store, TestLake, json_ok, stderr};

const ROWS: &str = "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), country, \
                    CAST(amount_cents AS VARCHAR), CAST(event_ts AS VARCHAR) FROM events ORDER BY 1, 2";

fn bigger_lake() -> TestLake {
    TestLake::with(
        Store::Local,
        DemoLake {
            days: 40,
            events_per_day: 10_000,
            days_per_commit: 10,
            ..DemoLake::default()
        },
    )
}

#[test]
fn a_small_memory_limit_gives_the_same_table() {
    let (limited, unlimited) = (bigger_lake(), bigger_lake());
    let (from, to) = (limited.day(0), limited.day(39));
    // 400k rows (about 36 MB in Arrow, more in the sorts and the join) through a 16 MiB pool:
    // sorts, aggregations and the key join of validation must spill rather than hold the data.
    let report = json_ok(&limited.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--memory-limit",
        "16MiB",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report["validation"]["passed"], true, "{report}");
    // Without a flag a run is bounded too, and `plan` says by how much.
    let plan = json_ok(&unlimited.run(&[
        "plan",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--output-format",
        "json",
    ]));
    let pool = plan["memory_limit"]
        .as_u64()
        .expect("a bounded pool by default");
    assert!((128 << 20..=1 << 30).contains(&pool), "{plan}");
    json_ok(&unlimited.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--memory-limit",
        "unlimited",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let (a, b) = (
        limited.query(&[("events", limited.open("events"))], ROWS),
        unlimited.query(&[("events", unlimited.open("events"))], ROWS),
    );
    assert_eq!(a.len(), 400_000);
    assert!(a == b, "same rows with and without the limit");
    let out = limited.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--memory-limit",
        "lots",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn parallel_and_sequential_batches_publish_the_same_table() {
    let (parallel, sequential) = (TestLake::new(), TestLake::new());
    let run = |lake: &TestLake, n: &str| {
        json_ok(&lake.run(&[
            "backfill",
            "events",
            "--from",
            &lake.day(0),
            "--to",
            &lake.day(9),
            "--batch-partitions",
            "1",
            "--max-parallel",
            n,
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]))
    };
    let (p, s) = (run(&parallel, "4"), run(&sequential, "1"));
    assert_eq!(p["partitions"], s["partitions"]);
    assert_eq!(
        p["validation"]["comparison"]["totals"],
        s["validation"]["comparison"]["totals"]
    );
    let rows = |lake: &TestLake| lake.query(&[("events", lake.open("events"))], ROWS);
    assert!(rows(&parallel) == rows(&sequential));
}

#[test]
fn json_progress_events_end_with_the_report_counts() {
    let lake = TestLake::new();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(9),
        "--batch-partitions",
        "3",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    let report = json_ok(&out);
    let events: Vec<serde_json::Value> = stderr(&out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("each progress line is JSON"))
        .collect();
    assert_eq!(events.first().unwrap()["event"], "started");
    assert_eq!(events.first().unwrap()["batches_total"], 4);
    let batches: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "batch_finished")
        .collect();
    assert_eq!(batches.len(), 4);
    assert_eq!(batches.last().unwrap()["batches_done"], 4);
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "phase" && e["phase"] == "validating")
    );
    let last = events.last().unwrap();
    assert_eq!(last["event"], "finished");
    assert_eq!(last["state"], "published");
    for field in ["rows_written", "files_written", "bytes_written"] {
        assert_eq!(last[field], report[field], "{field}");
    }
    assert_eq!(last["rows_written"], batches.last().unwrap()["rows_total"]);
    // -q silences progress.
    let quiet = lake.run(&[
        "plan",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(1),
        "-q",
    ]);
    assert!(stderr(&quiet).is_empty(), "{}", stderr(&quiet));
}

#[test]
fn throttling_bounds_the_write_rate() {
    let lake = TestLake::new();
    let rate = 20 * 1024;
    let started = std::time::Instant::now();
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(9),
        "--throttle",
        "20KiB/s",
        "--max-parallel",
        "1",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let elapsed = started.elapsed().as_secs_f64();
    let written = report["bytes_written"].as_f64().unwrap();
    // The bucket starts with one second of bytes; everything beyond it waits at the rate.
    let floor = (written - rate as f64) / rate as f64;
    assert!(floor > 1.0, "enough data to measure: {written} bytes");
    assert!(
        elapsed >= floor,
        "{written} bytes at {rate} B/s took {elapsed:.2}s, less than {floor:.2}s"
    );
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(1),
        "--throttle",
        "fast",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// The spill directories under `root`: (the pid of the process that made each, whether its
/// lock file is there too); and any other entry, which must not be.
fn spill_dirs(root: &std::path::Path) -> std::collections::BTreeMap<u32, bool> {
    let mut dirs = std::collections::BTreeMap::new();
    let mut locks = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(root).expect("the spill root") {
        let entry = entry.expect("an entry");
        let name = entry.file_name().to_string_lossy().to_string();
        let pid = |n: &str| n.split('-').next().and_then(|p| p.parse::<u32>().ok());
        match name.strip_suffix(".lock") {
            Some(stem) => {
                locks.insert(stem.to_string());
            }
            None => {
                assert!(entry.path().is_dir(), "unexpected {name} in {root:?}");
                dirs.insert(name.clone(), pid(&name).expect("a pid"));
            }
        }
    }
    dirs.into_iter()
        .map(|(name, pid)| (pid, locks.contains(&name)))
        .collect()
}

/// A process killed mid-run (`kill -9`, the OOM killer) cannot remove its spill files; the next
/// lakefill process removes them, and never those of a process that is still running.
#[test]
fn a_killed_process_spill_files_are_removed_by_the_next_process_and_a_live_ones_are_kept() {
    use std::process::{Child, Stdio};
    use std::time::{Duration, Instant};
    let lake = TestLake::new();
    let tmp = tempfile::tempdir().expect("a temp dir");
    let root = tmp.path().join("lakefill-spill");
    // A backfill (of days `from..=to`) paused while staging, its spill directory made and
    // locked.
    let paused = |name: &str, from: u64, to: u64| -> Child {
        let (from, to) = (lake.day(from), lake.day(to));
        let log = lake.path().join(format!("{name}.log"));
        let mut child = crate::support::lakefill_command(lake.path())
            .args([
                "backfill",
                "events",
                "--from",
                &from,
                "--to",
                &to,
                "--allow-edge-moves",
                "--reason",
                PARTIAL_FIX,
            ])
            .env("TMPDIR", tmp.path())
            .env("LAKEFILL_FAILPOINTS", "stage-batch-0=pause")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start a backfill");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("failpoint hit: pausing")
        {
            assert!(
                child.try_wait().expect("wait").is_none(),
                "{name} ended: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            assert!(Instant::now() < deadline, "{name} never paused");
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    };
    let kill = |child: &mut Child| {
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
    };
    // Another command, run to its end.
    let query = || {
        let out = crate::support::lakefill_command(lake.path())
            .args(["sql", "SELECT COUNT(*) AS n FROM events"])
            .env("TMPDIR", tmp.path())
            .output()
            .expect("run sql");
        assert!(out.status.success(), "{}", stderr(&out));
    };

    let mut first = paused("first", 1, 2);
    let first_pid = first.id();
    // What a killed validation leaves: spill files in its directory.
    let first_dir = std::fs::read_dir(&root)
        .expect("the spill root")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("the first process's spill directory");
    std::fs::write(first_dir.join("spill.bin"), vec![7u8; 1 << 20]).expect("a spill file");
    let mut second = paused("second", 5, 6);
    let second_pid = second.id();
    // The second process looked, and left the first's alone: it runs.
    assert_eq!(
        spill_dirs(&root),
        [(first_pid, true), (second_pid, true)].into()
    );
    kill(&mut first);
    assert_eq!(
        spill_dirs(&root),
        [(first_pid, true), (second_pid, true)].into(),
        "nobody looked yet"
    );
    // The next process removes the killed one's files, keeps the live one's, and removes its
    // own as it ends.
    query();
    assert!(
        !first_dir.exists(),
        "the killed process's spill files are gone"
    );
    assert_eq!(spill_dirs(&root), [(second_pid, true)].into());
    kill(&mut second);
    query();
    assert_eq!(spill_dirs(&root), Default::default());
}

/// A spill root that is a symbolic link, or that another user owns, is refused: never followed,
/// never swept, and the command still runs (spilling where DataFusion puts its own files).
#[cfg(unix)]
#[test]
fn issue_33_a_foreign_or_linked_spill_root_is_never_swept() {
    let lake = TestLake::new();
    let tmp = tempfile::tempdir().expect("a temp dir");
    // What a dead lakefill process would leave: a directory and its unlocked lock.
    let foreign = tmp.path().join("elsewhere");
    let dead = |root: &std::path::Path| {
        std::fs::create_dir_all(root.join("4242-1")).unwrap();
        std::fs::write(root.join("4242-1/keep.bin"), b"not lakefill's").unwrap();
        std::fs::write(root.join("4242-1.lock"), b"").unwrap();
    };
    dead(&foreign);
    let linked = tmp.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&foreign, linked.join("lakefill-spill")).unwrap();
    // A root of another user (only root can make one; otherwise that half is skipped).
    let owned = tmp.path().join("owned");
    dead(&owned.join("lakefill-spill"));
    let chowned = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(owned.join("lakefill-spill"))
        .status()
        .is_ok_and(|s| s.success());
    let mut cases = vec![(linked, foreign.clone(), "symbolic link")];
    if chowned {
        cases.push((owned.clone(), owned.join("lakefill-spill"), "another user"));
    }
    for (tmpdir, root, why) in cases {
        let out = crate::support::lakefill_command(lake.path())
            .args(["sql", "SELECT COUNT(*) AS n FROM events"])
            .env("TMPDIR", &tmpdir)
            .output()
            .expect("run sql");
        assert!(out.status.success(), "{why}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(why) && stderr(&out).contains("lakefill-spill"),
            "{why}: {}",
            stderr(&out)
        );
        assert_eq!(
            std::fs::read(root.join("4242-1/keep.bin")).unwrap(),
            b"not lakefill's",
            "{why}"
        );
        assert!(root.join("4242-1.lock").exists(), "{why}");
        let entries: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            entries.len(),
            2,
            "{why}: nothing of lakefill's left in it: {entries:?}"
        );
    }
}
