//! `lakefill gc`: garbage goes, every retained version still reads.

use std::process::Command;

use crate::support::{PARTIAL_FIX, TestLake, files_under, json_ok, stderr};

#[test]
fn gc_deletes_only_what_no_version_or_live_run_needs() {
    let lake = TestLake::new();
    let table = lake.table_path("events");
    let root = format!("{}/", table.display());
    let relative = |p: &str| p.strip_prefix(&root).unwrap().to_string();

    // A published run replaces v1's files: those stay referenced by version 1.
    json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(4),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    // A run that failed validation keeps its staged files.
    let v2 = std::fs::read_to_string(lake.path().join("sql/events/v2.sql")).unwrap();
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        v2.replace("[validate]", "[validate]\nmax_row_change = \"0%\"")
            .replace(
                "WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end",
                "WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end AND event_id % 7 <> 0",
            ),
    )
    .unwrap();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(5),
        "--to",
        &lake.day(6),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // A run that crashed while staging, just now: it may still be running, so it is kept.
    std::fs::write(
        lake.path().join("sql/events/v4.sql"),
        v2.clone() + "-- v4\n",
    )
    .unwrap();
    let crashed = Command::new(assert_cmd::cargo::cargo_bin("lakefill"))
        .current_dir(lake.path())
        .args([
            "backfill",
            "events",
            "--from",
            &lake.day(7),
            "--to",
            &lake.day(9),
            "--batch-partitions",
            "1",
            "--max-parallel",
            "1",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ])
        .env("LAKEFILL_FAILPOINTS", "mid-stage")
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    // A stray file in a staging directory with no journal at all.
    let stray = table.join(format!(
        "event_date={}/lakefill-nobody/part-0.parquet",
        lake.day(1)
    ));
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"stray").unwrap();

    let versions = lake.version("events");
    let read_all = |lake: &TestLake| -> Vec<Vec<Vec<String>>> {
        (0..=versions)
            .map(|v| {
                lake.query(
                    &[("events", lake.open_version("events", v))],
                    "SELECT COUNT(*), SUM(amount_cents) FROM events",
                )
            })
            .collect()
    };
    let before = read_all(&lake);
    let staged_before: Vec<String> = files_under(&table)
        .into_iter()
        .filter(|p| p.contains("/lakefill-"))
        .map(|p| relative(&p))
        .collect();

    let dry = json_ok(&lake.run(&["gc", "events", "--dry-run", "--output-format", "json"]));
    let listed: Vec<String> = dry["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert!(
        listed.iter().any(|p| p.contains("lakefill-nobody")),
        "{listed:?}"
    );
    assert!(
        !listed.iter().any(|p| p.contains("lakefill-events-v3-")),
        "a recent run that failed validation may still be force-published: {listed:?}"
    );
    assert!(
        !listed.iter().any(|p| p.contains("lakefill-events-v4-")),
        "a recent staging run is kept: {listed:?}"
    );
    assert!(
        !listed
            .iter()
            .any(|p| p.contains("lakefill-events-v1-") || p.contains("lakefill-events-v2-")),
        "published files are referenced: {listed:?}"
    );
    assert_eq!(
        files_under(&table)
            .into_iter()
            .filter(|p| p.contains("/lakefill-"))
            .map(|p| relative(&p))
            .collect::<Vec<_>>(),
        staged_before,
        "a dry run deletes nothing"
    );

    let report = json_ok(&lake.run(&["gc", "events", "--output-format", "json"]));
    assert_eq!(report["files"], dry["files"]);
    for path in &listed {
        assert!(!table.join(path).exists(), "{path} deleted");
    }
    assert_eq!(
        read_all(&lake),
        before,
        "every retained version reads the same"
    );

    // With a zero age, the crashed run and the failed validation count as abandoned: their
    // files go and they are discarded.
    let report = json_ok(&lake.run(&[
        "gc",
        "events",
        "--older-than",
        "0s",
        "--output-format",
        "json",
    ]));
    assert!(report["files"].as_array().unwrap().iter().all(|f| {
        let path = f["path"].as_str().unwrap();
        path.contains("lakefill-events-v4-") || path.contains("lakefill-events-v3-")
    }));
    assert_eq!(report["runs_discarded"].as_array().unwrap().len(), 2);
    assert!(
        files_under(&table)
            .iter()
            .all(|p| !p.contains("lakefill-events-v4-") || p.contains("_lakefill"))
    );
    assert_eq!(read_all(&lake), before);
    let runs = json_ok(&lake.run(&["runs", "events", "--output-format", "json"]));
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .any(|r| r["model_version"] == "v4" && r["state"] == "discarded")
    );
}

/// A Delta table of its own whose root is named like a staging directory (`lakefill-*` inside a
/// partition directory) is not lakefill's: gc leaves every file of it (#33), and python reads it
/// back whole.
#[test]
fn issue_33_gc_never_deletes_a_table_named_like_a_staging_directory() {
    let lake = TestLake::new();
    let nested = lake.table_path("events").join(format!(
        "event_date={}/lakefill-someones-table",
        lake.day(1)
    ));
    let script = format!(
        "import os, sys, pyarrow as pa\nfrom deltalake import DeltaTable, write_deltalake\n\
         write_deltalake({path:?}, pa.table({{'x': pa.array([1, 2, 3], pa.int64())}}))\n\
         print(DeltaTable({path:?}).to_pyarrow_table().num_rows)\nsys.stdout.flush(); os._exit(0)\n",
        path = nested.display().to_string()
    );
    let made = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let before = files_under(&nested);
    assert!(before.iter().any(|f| f.ends_with(".parquet")), "{before:?}");
    for args in [
        vec![
            "gc",
            "events",
            "--older-than",
            "0s",
            "--dry-run",
            "--output-format",
            "json",
        ],
        vec![
            "gc",
            "events",
            "--older-than",
            "0s",
            "--output-format",
            "json",
        ],
    ] {
        let report = json_ok(&lake.run(&args));
        assert!(
            !report["files"]
                .to_string()
                .contains("lakefill-someones-table"),
            "{report}"
        );
    }
    assert_eq!(files_under(&nested), before, "every file of the table kept");
    let read = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import os, sys\nfrom deltalake import DeltaTable\n\
                 print(DeltaTable({:?}).to_pyarrow_table().num_rows)\nsys.stdout.flush(); os._exit(0)\n",
                nested.display().to_string()
            ),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim(), "3");
}
