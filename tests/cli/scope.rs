//! Scope by entities (#36): `--where` fixes the rows of one country out of five and keeps every
//! other row as it was, value for value. Lakes and expectations come from `scope.py` (python
//! `deltalake`, and DuckDB over the Parquet files the log lists), never from lakefill.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::support::{json_ok, run_in, stderr};

fn python(args: &[&str]) -> Value {
    crate::support::python_json("scope.py", args)
}

fn dir_arg(dir: &Path) -> &str {
    dir.to_str().unwrap()
}

/// A lake of `layout`; returns it with the range that holds every partition.
fn lake(layout: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let range = python(&["make", dir_arg(dir.path()), layout]);
    let (from, to) = (
        range["from"].as_str().unwrap().to_string(),
        range["to"].as_str().unwrap().to_string(),
    );
    (dir, from, to)
}

fn files(dir: &Path) -> BTreeSet<String> {
    python(&["files", dir_arg(dir)])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn one_country_is_fixed_and_every_other_row_is_kept() {
    for layout in ["date", "date_country"] {
        let (dir, from, to) = lake(layout);
        let path = dir.path();
        let before_rows = python(&["rows", dir_arg(path)]);
        let before_files = files(path);
        let scope = [
            "--from",
            from.as_str(),
            "--to",
            to.as_str(),
            "--where",
            "country = 'DE'",
        ];
        let plan = json_ok(&run_in(
            path,
            &[
                &["plan", "events"][..],
                &scope,
                &["--output-format", "json"],
            ]
            .concat(),
        ));
        assert_eq!(plan["where"], "country = 'DE'", "{layout}");
        assert_eq!(plan["range"]["where"]["sql"], "country = 'DE'", "{layout}");
        assert_eq!(
            plan["sources"][0]["where_reached"], true,
            "{layout}: the predicate reaches `raw`'s scan"
        );
        let partitions = plan["partitions"].as_array().unwrap().len() as u64;
        let rewritten = plan["affected_files"].as_array().unwrap().len() as u64;
        let ruled_out = plan["files_ruled_out"].as_u64().unwrap();
        if layout == "date_country" {
            // Each day holds one file per country: only DE's are rewritten.
            assert_eq!(rewritten, partitions, "{layout}: {plan}");
            assert_eq!(ruled_out, 4 * partitions, "{layout}: {plan}");
        } else {
            // One file a day, each holding every country: all rewritten, their rows carried.
            assert_eq!(rewritten, partitions, "{layout}: {plan}");
            assert_eq!(ruled_out, 0, "{layout}: {plan}");
        }

        let out = run_in(
            path,
            &[
                &["backfill", "events"][..],
                &scope,
                &["--output-format", "json"],
            ]
            .concat(),
        );
        let report = json_ok(&out);
        assert_eq!(report["state"], "published", "{layout}: {}", stderr(&out));
        assert_eq!(report["where"], "country = 'DE'", "{layout}");
        // By date, each day's file holds every country: the other four are carried over. By
        // date and country, DE's files hold DE's rows only.
        let carried = if layout == "date" { 4 * 120 } else { 0 };
        assert_eq!(report["rows_carried"], carried, "{layout}");
        assert_eq!(
            python(&["rows", dir_arg(path)]),
            python(&["expect", dir_arg(path), "DE"]),
            "{layout}: DE's rows are dated by ts, every other row is as it was"
        );
        // `diff --where` compares only the rows that match: DE's moved dates, none of FR's.
        let moved = before_rows
            .as_array()
            .unwrap()
            .iter()
            .zip(python(&["expect", dir_arg(path), "DE"]).as_array().unwrap())
            .filter(|(old, new)| old != new)
            .count();
        for (country, changed) in [("DE", moved), ("FR", 0)] {
            let predicate = format!("country = '{country}'");
            let diff = json_ok(&run_in(
                path,
                &[
                    "diff",
                    "events",
                    "--from-version",
                    "0",
                    "--where",
                    &predicate,
                    "--output-format",
                    "json",
                ],
            ));
            assert_eq!(diff["where"], predicate.as_str(), "{layout}");
            let totals = &diff["comparison"]["totals"];
            assert_eq!(totals["changed"], changed, "{layout} {country}: {totals}");
            assert_eq!(totals["old_rows"], totals["new_rows"], "{layout} {country}");
            assert_eq!(totals["old_rows"], 120, "{layout} {country}: {totals}");
        }
        let after_files = files(path);
        let kept = before_files.intersection(&after_files).count() as u64;
        assert_eq!(
            kept,
            before_files.len() as u64 - rewritten,
            "{layout}: the files the predicate ruled out are the same files"
        );
        // The commit records the scope, and history shows it.
        let history = json_ok(&run_in(
            path,
            &["history", "events", "--output-format", "json"],
        ));
        assert_eq!(history[0]["where"], "country = 'DE'", "{history}");
        assert_eq!(
            history[0]["lakefill"]["where"], "country = 'DE'",
            "{history}"
        );

        // The same scope written otherwise is the same run: nothing to do.
        let again = run_in(
            path,
            &[
                "backfill",
                "events",
                "--from",
                &from,
                "--to",
                &to,
                "--where",
                "country='DE'",
                "--output-format",
                "json",
            ],
        );
        assert_eq!(json_ok(&again)["run_id"], report["run_id"], "{layout}");
        assert_eq!(json_ok(&again)["state"], "published", "{layout}");
        assert_eq!(
            history.as_array().unwrap().len(),
            json_ok(&run_in(
                path,
                &["history", "events", "--output-format", "json"]
            ))
            .as_array()
            .unwrap()
            .len(),
            "{layout}: an up-to-date re-run commits nothing"
        );

        // Revert puts back exactly what the run replaced.
        let run_id = report["run_id"].as_str().unwrap();
        let reverted = run_in(path, &["revert", run_id, "--reason", "undo the DE fix"]);
        assert!(reverted.status.success(), "{}", stderr(&reverted));
        assert_eq!(python(&["rows", dir_arg(path)]), before_rows, "{layout}");
    }
}

#[test]
fn a_predicate_the_target_cannot_answer_is_refused_and_nothing_changes() {
    let (dir, from, to) = lake("date");
    let path = dir.path();
    let before = python(&["rows", dir_arg(path)]);
    for (predicate, message) in [
        ("nation = 'DE'", "does not have"),
        ("country IN (SELECT country FROM raw)", "subquery"),
        ("random() < 0.5", "not deterministic"),
        ("amount + 1", "not a condition"),
        ("country = ", "not a SQL condition"),
        ("", "empty"),
    ] {
        for command in ["plan", "backfill"] {
            let out = run_in(
                path,
                &[
                    command, "events", "--from", &from, "--to", &to, "--where", predicate,
                ],
            );
            assert_eq!(out.status.code(), Some(2), "{predicate}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("--where"), "{predicate}: {err}");
            assert!(err.contains(message), "{predicate}: {err}");
            assert!(err.contains("hint:"), "{predicate}: {err}");
        }
    }
    assert_eq!(python(&["rows", dir_arg(path)]), before);
    let history = json_ok(&run_in(
        path,
        &["history", "events", "--output-format", "json"],
    ));
    assert_eq!(history.as_array().unwrap().len(), 1, "{history}");
}

/// A fix that moves keys across the predicate: out of it (their old rows replaced, their new ones
/// outside the scope) or into it (their old rows outside the scope, kept). Both fail validation
/// and publish nothing, unless `--allow-edge-moves` says they are meant to cross.
#[test]
fn keys_that_cross_the_predicate_fail_unless_allowed() {
    let (dir, from, to) = lake("date");
    let path = dir.path();
    let before = python(&["rows", dir_arg(path)]);
    let crossing = python(&["crossing", dir_arg(path)]);
    let count = |side: &str| crossing[side].as_array().unwrap().len() as u64;
    let scope = [
        "backfill",
        "events",
        "--from",
        from.as_str(),
        "--to",
        to.as_str(),
        "--where",
        "country = 'DE'",
        "--output-format",
        "json",
    ];
    let out = run_in(path, &scope);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "where_edges")
        .unwrap_or_else(|| panic!("no where_edges check: {report}"));
    assert_eq!(check["passed"], false, "{check}");
    let failures = check["failures"].as_array().unwrap();
    let reported = |field: &str| failures.iter().find_map(|f| f[field].as_u64()).unwrap_or(0);
    assert_eq!(reported("moved_out"), count("out"), "{check}");
    assert_eq!(reported("moved_in"), count("in"), "{check}");
    let named = |field: &str, side: &str| {
        let keys = &failures.iter().find(|f| f.get(field).is_some()).unwrap()["keys"];
        for key in keys.as_array().unwrap() {
            let id: i64 = key.as_str().unwrap().parse().unwrap();
            assert!(
                crossing[side].as_array().unwrap().contains(&id.into()),
                "{field}: {id} is not a key that crosses"
            );
        }
    };
    named("moved_out", "out");
    named("moved_in", "in");
    assert_eq!(
        python(&["rows", dir_arg(path)]),
        before,
        "nothing was published"
    );

    // Allowed, the run publishes and the commit counts what crossed.
    let allowed = run_in(
        path,
        &[
            &scope[..],
            &[
                "--allow-edge-moves",
                "--reason",
                "country codes corrected on purpose",
            ],
        ]
        .concat(),
    );
    assert_eq!(
        json_ok(&allowed)["state"],
        "published",
        "{}",
        stderr(&allowed)
    );
    let history = json_ok(&run_in(
        path,
        &["history", "events", "--output-format", "json"],
    ));
    let moves = &history[0]["lakefill"]["edge_moves"];
    assert_eq!(moves["moved"], count("out"), "{history}");
    assert_eq!(moves["duplicated"], count("in"), "{history}");
}

/// A predicate on a data column: the files whose statistics rule it out are not touched, the
/// others are rewritten with their other rows carried.
#[test]
fn statistics_rule_out_the_files_a_data_predicate_cannot_match() {
    let (dir, from, to) = lake("date");
    let path = dir.path();
    let before_files = files(path);
    // Ids of day n start at 100000 n: ids below 1000 are events of the first day, which the
    // slip spread over the first two partitions.
    let scope = [
        "--from",
        from.as_str(),
        "--to",
        to.as_str(),
        "--where",
        "event_id < 1000",
        "--output-format",
        "json",
    ];
    let plan = json_ok(&run_in(path, &[&["plan", "events"][..], &scope].concat()));
    let rewritten: BTreeSet<String> = plan["affected_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    assert_eq!(rewritten.len(), 2, "{plan}");
    assert_eq!(
        plan["files_ruled_out"].as_u64(),
        Some(before_files.len() as u64 - 2),
        "{plan}"
    );
    let out = run_in(path, &[&["backfill", "events"][..], &scope].concat());
    assert_eq!(json_ok(&out)["state"], "published", "{}", stderr(&out));
    assert_eq!(
        python(&["rows", dir_arg(path)]),
        python(&["below", dir_arg(path), "1000"])
    );
    let after = files(path);
    for file in before_files.difference(&rewritten) {
        assert!(
            after.contains(file),
            "{file} was ruled out and must be kept"
        );
    }
}

/// A scoped run stopped at any point is finished by the same command: the rows are the
/// expected ones (each key once), and exactly one commit landed.
#[test]
fn a_stopped_scoped_run_converges_to_one_commit() {
    for point in lakefill::CrashPoint::ALL
        .into_iter()
        .filter(|p| p.on_local_backfill(false))
    {
        let point = crate::support::armed(point);
        let (dir, from, to) = lake("date");
        let path = dir.path();
        let args = [
            "backfill",
            "events",
            "--from",
            from.as_str(),
            "--to",
            to.as_str(),
            "--where",
            "country = 'DE'",
        ];
        let stopped = crate::support::lakefill_command(path)
            .args(args)
            .env("LAKEFILL_FAILPOINTS", &point)
            .output()
            .unwrap();
        let again = run_in(path, &args);
        assert!(
            again.status.success(),
            "{point}: {} / {}",
            stderr(&stopped),
            stderr(&again)
        );
        assert_eq!(
            python(&["rows", dir_arg(path)]),
            python(&["expect", dir_arg(path), "DE"]),
            "{point}"
        );
        let history = json_ok(&run_in(
            path,
            &["history", "events", "--output-format", "json"],
        ));
        assert_eq!(history.as_array().unwrap().len(), 2, "{point}: {history}");
        let runs = json_ok(&run_in(path, &["runs", "--output-format", "json"]));
        assert_eq!(runs[0]["state"], "published", "{point}: {runs}");
        assert_eq!(runs[0]["where"], "country = 'DE'", "{point}: {runs}");
    }
}

/// The rows of `accounts` now (or at `version`), by DuckDB over the files the log lists.
fn account_rows(dir: &Path, version: Option<&str>) -> Value {
    let mut args = vec!["trows", dir_arg(dir)];
    args.extend(version);
    python(&args)
}

fn account_files(dir: &Path) -> BTreeSet<String> {
    python(&["tfiles", dir_arg(dir)])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn tables_without_a_time_column_are_scoped_by_where_alone() {
    // (layout, predicate, what it fixes, files rewritten, files ruled out)
    for (layout, predicate, fixed, rewritten, ruled_out) in [
        ("int", "part IN (1, 2)", "parts12", 2, 2),
        ("flat", "country = 'DE'", "DE", 1, 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        python(&["timeless", dir_arg(path), layout]);
        let before_files = account_files(path);
        let before_rows = account_rows(path, None);

        // A range means nothing without a time column: refused, naming why.
        let ranged = run_in(
            path,
            &[
                "plan",
                "accounts",
                "--from",
                "2024-01-01",
                "--to",
                "2024-01-31",
            ],
        );
        assert_eq!(
            ranged.status.code(),
            Some(2),
            "{layout}: {}",
            stderr(&ranged)
        );
        assert!(
            stderr(&ranged).contains("has no time column"),
            "{layout}: {}",
            stderr(&ranged)
        );

        let scope = ["--where", predicate];
        let plan = json_ok(&run_in(
            path,
            &[
                &["plan", "accounts"][..],
                &scope,
                &["--output-format", "json"],
            ]
            .concat(),
        ));
        assert_eq!(plan["range"]["grain"], "whole", "{layout}: {plan}");
        assert_eq!(
            plan["layout"]["time"]["encoding"]["kind"], "none",
            "{layout}"
        );
        assert_eq!(
            plan["affected_files"].as_array().unwrap().len(),
            rewritten,
            "{layout}: {plan}"
        );
        assert_eq!(plan["files_ruled_out"], ruled_out, "{layout}: {plan}");

        let out = run_in(
            path,
            &[
                &["backfill", "accounts"][..],
                &scope,
                &["--output-format", "json"],
            ]
            .concat(),
        );
        let report = json_ok(&out);
        assert_eq!(report["state"], "published", "{layout}: {}", stderr(&out));
        assert_eq!(
            account_rows(path, None),
            python(&["texpect", dir_arg(path), fixed]),
            "{layout}: the matching rows are corrected, every other row is as it was"
        );
        let after_files = account_files(path);
        assert_eq!(
            before_files.intersection(&after_files).count(),
            before_files.len() - rewritten,
            "{layout}: the files the predicate rules out are not touched"
        );

        if layout == "int" {
            // `diff` compares such a table partition value by value, and `--where` narrows it.
            let diff = json_ok(&run_in(
                path,
                &[
                    "diff",
                    "accounts",
                    "--from-version",
                    "0",
                    "--where",
                    "country = 'DE'",
                    "--output-format",
                    "json",
                ],
            ));
            let values: Vec<&str> = diff["comparison"]["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["value"].as_str().unwrap())
                .collect();
            assert_eq!(values, ["1", "2"], "{diff}");
            assert_eq!(diff["comparison"]["totals"]["changed"], 20, "{diff}");
        }
        // Again: the same run, already published, nothing written.
        let again = json_ok(&run_in(
            path,
            &[
                &["backfill", "accounts"][..],
                &scope,
                &["--output-format", "json"],
            ]
            .concat(),
        ));
        assert_eq!(again["run_id"], report["run_id"], "{layout}");
        assert_eq!(account_files(path), after_files, "{layout}");

        let history = json_ok(&run_in(
            path,
            &["history", "accounts", "--output-format", "json"],
        ));
        assert_eq!(history[0]["where"], predicate, "{layout}: {history}");

        // Revert puts back exactly what the run replaced.
        let run_id = report["run_id"].as_str().unwrap();
        let reverted = run_in(path, &["revert", run_id]);
        assert!(reverted.status.success(), "{layout}: {}", stderr(&reverted));
        assert_eq!(account_rows(path, None), before_rows, "{layout}");
        assert_eq!(account_files(path), before_files, "{layout}");

        // Without `--where`, the whole table is replaced.
        let whole = run_in(path, &["backfill", "accounts", "--output-format", "json"]);
        assert_eq!(
            json_ok(&whole)["state"],
            "published",
            "{layout}: {}",
            stderr(&whole)
        );
        assert_eq!(
            account_rows(path, None),
            python(&["texpect", dir_arg(path), "all"]),
            "{layout}"
        );
    }
}

#[test]
fn where_without_a_range_covers_the_whole_table() {
    let (dir, from, to) = lake("date");
    let path = dir.path();
    let unscoped = run_in(path, &["plan", "events"]);
    assert_eq!(unscoped.status.code(), Some(2), "{}", stderr(&unscoped));
    assert!(stderr(&unscoped).contains("give `--from` and `--to`, or `--where`"));

    let plan = json_ok(&run_in(
        path,
        &[
            "plan",
            "events",
            "--where",
            "country = 'DE'",
            "--output-format",
            "json",
        ],
    ));
    assert_eq!(plan["range"]["from"], from.as_str(), "{plan}");
    assert_eq!(plan["range"]["to"], to.as_str(), "{plan}");
    let out = run_in(
        path,
        &[
            "backfill",
            "events",
            "--where",
            "country = 'DE'",
            "--output-format",
            "json",
        ],
    );
    assert_eq!(json_ok(&out)["state"], "published", "{}", stderr(&out));
    assert_eq!(
        python(&["rows", dir_arg(path)]),
        python(&["expect", dir_arg(path), "DE"]),
        "DE's rows are dated by ts over the whole table, every other row is as it was"
    );
}

#[test]
fn a_scoped_cascade_passes_the_predicate_where_the_columns_are() {
    let (dir, from, to) = lake("date");
    let path = dir.path();
    python(&["downstream", dir_arg(path)]);
    let scope = [
        "--from",
        from.as_str(),
        "--to",
        to.as_str(),
        "--where",
        "country = 'DE'",
        "--cascade",
    ];
    let plan = json_ok(&run_in(
        path,
        &[
            &["plan", "events"][..],
            &scope,
            &["--output-format", "json"],
        ]
        .concat(),
    ));
    let node = |model: &str| {
        plan["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["model"] == model)
            .cloned()
            .unwrap_or_else(|| panic!("{model}: {plan}"))
    };
    let edge = |child: &str| {
        plan["edges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["child"] == child)
            .cloned()
            .unwrap_or_else(|| panic!("{child}: {plan}"))
    };
    assert_eq!(node("events")["range"]["where"]["sql"], "country = 'DE'");
    // `daily` has `country`: scoped like the root. `totals` has not: its whole window range.
    assert_eq!(edge("daily")["where_passed"], true, "{plan}");
    assert_eq!(node("daily")["range"]["where"]["sql"], "country = 'DE'");
    assert_eq!(edge("totals")["where_passed"], false, "{plan}");
    assert!(node("totals")["range"]["where"].is_null(), "{plan}");
    let text = crate::support::stdout(&run_in(path, &[&["plan", "events"][..], &scope].concat()));
    assert!(text.contains("`--where` passes"), "{text}");
    assert!(text.contains("`--where` does not pass"), "{text}");

    let out = run_in(
        path,
        &[
            &["backfill", "events"][..],
            &scope,
            &["--output-format", "json"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        python(&["rows", dir_arg(path)]),
        python(&["expect", dir_arg(path), "DE"]),
        "events: DE's rows fixed, every other row as it was"
    );
    // `daily`'s DE rows are recomputed from the fixed events, its other rows kept; `totals` is
    // recomputed from every row of events as published (the carried rows counted once).
    assert_eq!(
        python(&["drows", dir_arg(path)]),
        python(&["dexpect", dir_arg(path), "DE"]),
    );
}

#[test]
fn a_scoped_fix_over_more_partitions_than_open_writers_carries_every_other_row() {
    // 80 days: the batch that carries the other countries' rows writes 80 partitions, more than
    // a batch keeps writers open for, so some are closed before it ends.
    let lake = crate::support::TestLake::with(
        crate::support::Store::Local,
        lakefill_fixtures::DemoLake {
            days: 80,
            events_per_day: 40,
            ..lakefill_fixtures::DemoLake::default()
        },
    );
    let path = lake.path();
    let others = || python(&["others", dir_arg(path), "events", "DE"]);
    let before = others();
    assert!(before.as_array().unwrap().len() > 2_000);
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        "2026-01-01",
        "--to",
        "2026-03-21",
        "--where",
        "country = 'DE'",
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(
        others(),
        before,
        "every row of another country is kept, value for value"
    );
}
