//! Resource limits and progress: bounded memory, parallel batches, JSON progress events.

use lakefill_fixtures::DemoLake;

use crate::support::{Store, TestLake, json_ok, stderr};

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
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
