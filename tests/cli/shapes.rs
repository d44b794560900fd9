//! Real table shapes (issue #10): monthly, hourly, string-dated, several columns, integer parts,
//! escaped and NULL partitions. Each table is written by python `deltalake`, backfilled by a fix
//! (amounts doubled in the range), read back by python, and compared with an expectation the test
//! computes itself: rows in the range doubled, every other row identical, and every file outside
//! the range untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{PythonLake as Lake, Store, json_ok, stderr};

/// One shape: how its table is partitioned, the fix model, a range, and which rows the range
/// holds (computed here, from the row's own values).
struct Shape {
    name: &'static str,
    partition_by: &'static str,
    window: &'static str,
    columns: &'static str,
    from: &'static str,
    to: &'static str,
    in_range: fn(&BTreeMap<String, Value>) -> bool,
}

fn text(row: &BTreeMap<String, Value>, column: &str) -> String {
    match &row[column] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn between(row: &BTreeMap<String, Value>, column: &str, low: &str, high: &str) -> bool {
    let value = text(row, column);
    !value.is_empty() && low <= value.as_str() && value.as_str() <= high
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "month",
            partition_by: "\"event_month\"",
            window: "\"event_month\"",
            columns: "event_month",
            from: "2025-08-12",
            to: "2025-10",
            in_range: |r| between(r, "event_month", "2025-08-01", "2025-10-01"),
        },
        Shape {
            name: "hour",
            partition_by: "\"event_hour\"",
            window: "\"event_hour\"",
            columns: "event_hour",
            from: "2026-01-01T05",
            to: "2026-01-01 09:00",
            in_range: |r| {
                between(
                    r,
                    "event_hour",
                    "2026-01-01T05:00:00",
                    "2026-01-01T09:00:00",
                )
            },
        },
        Shape {
            name: "ds",
            partition_by: "\"ds\"",
            window: "\"ds\"",
            columns: "ds",
            // Written loosely: days compare as times, so the 10th is not in 1..3.
            from: "2026-01-1",
            to: "2026-01-3",
            in_range: |r| between(r, "ds", "2026-01-01", "2026-01-03"),
        },
        Shape {
            name: "ds_compact",
            partition_by: "\"ds\"",
            window: "\"ds\"",
            columns: "ds",
            from: "20260103",
            to: "2026-01-05",
            in_range: |r| between(r, "ds", "20260103", "20260105"),
        },
        Shape {
            name: "ds_hour",
            partition_by: "\"ds\"",
            window: "\"ds\"",
            columns: "ds",
            from: "2026-01-01-03",
            to: "2026-01-01T05",
            in_range: |r| between(r, "ds", "2026-01-01-03", "2026-01-01-05"),
        },
        Shape {
            name: "two",
            partition_by: "[\"event_date\", \"country\"]",
            window: "\"event_date\"",
            columns: "event_date, country",
            from: "2026-01-02",
            to: "2026-01-03",
            in_range: |r| between(r, "event_date", "2026-01-02", "2026-01-03"),
        },
        Shape {
            name: "two_reversed",
            partition_by: "[\"country\", \"event_date\"]",
            window: "\"event_date\"",
            columns: "country, event_date",
            from: "2026-01-02",
            to: "2026-01-03",
            in_range: |r| between(r, "event_date", "2026-01-02", "2026-01-03"),
        },
        Shape {
            name: "escaped",
            partition_by: "[\"event_date\", \"tag\"]",
            window: "\"event_date\"",
            columns: "event_date, tag",
            from: "2026-01-02",
            to: "2026-01-03",
            in_range: |r| between(r, "event_date", "2026-01-02", "2026-01-03"),
        },
        Shape {
            name: "parts",
            partition_by: "[\"year\", \"month\"]",
            window: "[\"year\", \"month\"]",
            columns: "year, month",
            from: "2025-11",
            to: "2026-01",
            in_range: |r| {
                let key = (r["year"].as_i64().unwrap(), r["month"].as_i64().unwrap());
                ((2025, 11)..=(2026, 1)).contains(&key)
            },
        },
        Shape {
            name: "nulls",
            partition_by: "\"event_date\"",
            window: "\"event_date\"",
            columns: "event_date",
            from: "2026-01-02",
            to: "2026-01-03",
            in_range: |r| between(r, "event_date", "2026-01-02", "2026-01-03"),
        },
    ]
}

/// Backfills `shape` with a fix that doubles amounts, in batches of two partitions, and checks
/// the result against the expectation and the files outside the range.
fn backfill_shape(lake: &mut Lake, shape: &Shape, extra: &[&str]) -> Vec<Value> {
    let name = shape.name;
    if !lake.tables.iter().any(|t| t == name) {
        lake.table(name, name);
    }
    lake.model(
        &format!("fix_{name}"),
        &format!(
            "target = \"{name}\"\npartition_by = {}\n[sources.{name}]\nwindow = {}",
            shape.partition_by, shape.window
        ),
        &format!(
            "SELECT id, amount * 2 AS amount, {} FROM {name}",
            shape.columns
        ),
    );
    let before = lake.rows(name);
    let files_before = lake.files(name);
    let model = format!("fix_{name}");
    let mut args = vec![
        "backfill",
        model.as_str(),
        "--from",
        shape.from,
        "--to",
        shape.to,
        "--batch-partitions",
        "2",
        "--output-format",
        "json",
    ];
    args.extend(extra);
    let report = json_ok(&lake.run(&args));
    assert_eq!(report["state"], "published", "{name}: {report}");

    let after = lake.rows(name);
    let doubled = |row: &Value| {
        let mut row = row.clone();
        let amount = row["amount"].as_i64().unwrap();
        row["amount"] = json!(amount * 2);
        row
    };
    let as_map = |row: &Value| -> BTreeMap<String, Value> {
        row.as_object().unwrap().clone().into_iter().collect()
    };
    let mut expected: Vec<Value> = before
        .iter()
        .map(|row| {
            if (shape.in_range)(&as_map(row)) {
                doubled(row)
            } else {
                row.clone()
            }
        })
        .collect();
    let key = |row: &Value| serde_json::to_string(row).unwrap();
    expected.sort_by_key(key);
    let mut sorted_after = after.clone();
    sorted_after.sort_by_key(key);
    assert_eq!(
        sorted_after, expected,
        "{name}: python reads the fix, and only the fix"
    );
    assert!(
        before.iter().any(|r| !(shape.in_range)(&as_map(r))),
        "{name}: the test has rows outside the range"
    );

    // Files outside the range are untouched: same paths, same sizes.
    let files_after = lake.files(name);
    let outside = |values: &BTreeMap<String, Option<String>>| {
        // A file is outside the range when no row of its partition is in it; decided on the
        // rows python read before.
        !before.iter().any(|row| {
            let row = as_map(row);
            values.iter().all(|(column, value)| {
                let cell = text(&row, column);
                match value {
                    None => row[column].is_null(),
                    Some(v) => same_value(&cell, v),
                }
            }) && (shape.in_range)(&row)
        })
    };
    let mut untouched = 0;
    for (path, (size, values)) in &files_before {
        if outside(values) {
            assert_eq!(
                files_after.get(path).map(|f| f.0),
                Some(*size),
                "{name}: {path} outside the range is untouched"
            );
            untouched += 1;
        }
    }
    assert!(untouched > 0, "{name}: some files lie outside the range");
    after
}

/// A partition value as the log writes it and as python reads it may differ in spelling
/// (timestamps): compare their digits.
fn same_value(cell: &str, value: &str) -> bool {
    let digits = |s: &str| s.chars().filter(char::is_ascii_digit).collect::<String>();
    if cell == value {
        return true;
    }
    let (a, b) = (digits(cell), digits(value));
    !a.is_empty() && (b.starts_with(&a) || a.starts_with(&b)) && cell.len() >= 10
}

#[test]
fn every_shape_backfills_exactly_its_range() {
    let mut lake = Lake::new(Store::Local);
    for shape in shapes() {
        backfill_shape(&mut lake, &shape, &[]);
    }
}

fn the_common_shapes_on_s3(store: Store) {
    let mut lake = Lake::new(store);
    for shape in shapes()
        .into_iter()
        .filter(|s| matches!(s.name, "month" | "ds" | "two"))
    {
        backfill_shape(&mut lake, &shape, &[]);
    }
}

both_stores!(the_common_shapes_on_s3);

/// The NULL partition is untouched by default; `--include-null` replaces it too, and a row the
/// model writes with a NULL time fails the run by default with a hint that names the flag.
#[test]
fn null_partitions_are_addressed_only_on_purpose() {
    let mut lake = Lake::new(Store::Local);
    let shape = shapes().into_iter().find(|s| s.name == "nulls").unwrap();
    let after = backfill_shape(&mut lake, &shape, &[]);
    let nulls: Vec<i64> = after
        .iter()
        .filter(|r| r["event_date"].is_null())
        .map(|r| r["amount"].as_i64().unwrap())
        .collect();
    assert_eq!(
        nulls,
        vec![50, 51, 52, 53],
        "the NULL partition is untouched"
    );

    let with_null = Shape {
        in_range: |r| {
            r["event_date"].is_null() || between(r, "event_date", "2026-01-04", "2026-01-04")
        },
        from: "2026-01-04",
        to: "2026-01-04",
        ..shape
    };
    let after = backfill_shape(&mut lake, &with_null, &["--include-null"]);
    let nulls: BTreeSet<i64> = after
        .iter()
        .filter(|r| r["event_date"].is_null())
        .map(|r| r["amount"].as_i64().unwrap())
        .collect();
    assert_eq!(nulls, [100, 102, 104, 106].into_iter().collect());

    // A model that writes NULL times without the flag: refused, with the flag in the hint.
    lake.model(
        "nulls_out",
        "target = \"nulls\"\npartition_by = \"event_date\"\n[sources.nulls]\nwindow = \"event_date\"",
        "SELECT id, amount, CASE WHEN id % 2 = 0 THEN NULL ELSE event_date END AS event_date FROM nulls",
    );
    let out = lake.run(&[
        "backfill",
        "nulls_out",
        "--from",
        "2026-01-05",
        "--to",
        "2026-01-05",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("(null)") && err.contains("--include-null"),
        "{err}"
    );
    assert!(
        !err.contains("--to null") && !err.contains("--to (null)"),
        "{err}"
    );
}

/// A window on a column that holds no times is refused at plan time, naming the column's type
/// and showing what a window looks like; what `plan` accepts, `backfill` runs.
#[test]
fn windows_must_hold_times() {
    let mut lake = Lake::new(Store::Local);
    lake.table("two", "two");
    lake.model(
        "by_country",
        "target = \"two\"\npartition_by = [\"event_date\", \"country\"]\n[sources.two]\nwindow = \"country\"",
        "SELECT id, amount, event_date, country FROM two",
    );
    let files = lake.files("two");
    for command in ["plan", "backfill"] {
        let out = lake.run(&[
            command,
            "by_country",
            "--from",
            "2026-01-02",
            "--to",
            "2026-01-03",
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        assert!(err.contains("`country` holds no dates"), "{err}");
        assert!(err.contains("window = \"event_date\""), "{err}");
    }
    // A model whose SQL does not fit the table is refused by `plan` too, before any staging.
    lake.model(
        "missing_column",
        "target = \"two\"\npartition_by = [\"event_date\", \"country\"]\n[sources.two]\nwindow = \"event_date\"",
        "SELECT id, event_date, country FROM two",
    );
    let out = lake.run(&[
        "plan",
        "missing_column",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-03",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("missing column `amount`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(lake.files("two"), files);
}

/// A month-partitioned table is replaced month by month: a day range is rounded to its months
/// (and `plan` says so), and a model that writes mid-month values is refused, not published
/// into partitions that are not months.
#[test]
fn monthly_tables_are_replaced_by_whole_months() {
    let mut lake = Lake::new(Store::Local);
    lake.table("month", "month");
    lake.model(
        "fix_month",
        "target = \"month\"\npartition_by = \"event_month\"\n[sources.month]\nwindow = \"event_month\"",
        "SELECT id, amount, event_month FROM month",
    );
    let plan = json_ok(&lake.run(&[
        "plan",
        "fix_month",
        "--from",
        "2025-12-01",
        "--to",
        "2025-12-31",
        "--output-format",
        "json",
    ]));
    assert_eq!(plan["layout"]["time"]["grain"], "month");
    assert_eq!(
        plan["partitions"].as_array().unwrap().len(),
        1,
        "{}",
        plan["partitions"]
    );
    assert_eq!(plan["partitions"][0]["value"], "2025-12");
    assert_eq!(plan["partitions"][0]["rows"], 9, "every row of December");
    assert_eq!(
        plan["range_notes"].as_array().unwrap().len(),
        1,
        "the end was rounded"
    );
    lake.model(
        "mid_month",
        "target = \"month\"\npartition_by = \"event_month\"\n[sources.month]\nwindow = \"event_month\"",
        "SELECT id, amount, event_month + INTERVAL '14 days' AS event_month FROM month",
    );
    let files = lake.files("month");
    let out = lake.run(&[
        "backfill",
        "mid_month",
        "--from",
        "2025-12",
        "--to",
        "2025-12",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not months") && err.contains("2025-12-15"),
        "{err}"
    );
    assert_eq!(lake.files("month"), files, "nothing published");
}

/// A moving average over the previous partitions, split over several batches, equals a one-shot
/// recompute and the arithmetic, for daily and monthly tables.
#[test]
fn lookback_models_split_over_batches_equal_a_one_shot_recompute() {
    for (grain, shape, column, from, to) in [
        ("day", "totals_day", "day", "2026-01-05", "2026-01-16"),
        ("month", "totals_month", "month", "2025-05", "2025-12"),
    ] {
        let mut lake = Lake::new(Store::Local);
        lake.table("totals", shape);
        lake.table("ma_split", &format!("ma_{grain}"));
        lake.table("ma_once", &format!("ma_{grain}"));
        for target in ["ma_split", "ma_once"] {
            lake.model(
                target,
                &format!(
                    "target = \"{target}\"\npartition_by = \"{column}\"\ngrain = \"{grain}\"\n\
                     [sources.totals]\nwindow = \"{column}\"\nlookback = 2"
                ),
                &format!(
                    "SELECT {column}, ma FROM (SELECT {column}, AVG(CAST(total AS DOUBLE)) OVER \
                     (ORDER BY {column} ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS ma FROM totals) w \
                     WHERE {column} BETWEEN $start AND $end"
                ),
            );
        }
        for (target, batch) in [("ma_split", "2"), ("ma_once", "1000")] {
            let out = lake.run(&[
                "backfill",
                target,
                "--from",
                from,
                "--to",
                to,
                "--batch-partitions",
                batch,
            ]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{grain} {target}: {}",
                stderr(&out)
            );
        }
        let split = lake.rows("ma_split");
        assert_eq!(
            split,
            lake.rows("ma_once"),
            "{grain}: split equals one-shot"
        );
        // The arithmetic: totals are written by the helper as (i * 37) % 11 + i for the i-th
        // period; the average of the last three.
        let totals: Vec<(String, f64)> = lake
            .rows("totals")
            .iter()
            .map(|r| {
                (
                    text(
                        &r.as_object().unwrap().clone().into_iter().collect(),
                        column,
                    ),
                    r["total"].as_f64().unwrap(),
                )
            })
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect();
        for row in &split {
            let key = row[column].as_str().unwrap();
            let position = totals.iter().position(|(k, _)| k == key).unwrap();
            if key < from || (grain == "month" && key[..7] > *to) || (grain == "day" && key > to) {
                assert_eq!(
                    row["ma"],
                    json!(0.0),
                    "{grain}: {key} outside the range is untouched"
                );
                continue;
            }
            let window = &totals[position.saturating_sub(2)..=position];
            let expected = window.iter().map(|(_, t)| t).sum::<f64>() / window.len() as f64;
            assert!(
                (row["ma"].as_f64().unwrap() - expected).abs() < 1e-9,
                "{grain}: {key}: {} != {expected}",
                row["ma"]
            );
        }
    }
}

/// Unpartitioned tables and tables partitioned coarser than the range (monthly files, a daily
/// range) are replaced by rows (`range_column`): only files whose statistics overlap the range
/// are rewritten, their other rows carried over exactly; every other file is untouched.
fn tables_replaced_by_rows(store: Store) {
    type InRange = fn(&BTreeMap<String, Value>) -> bool;
    /// Table, `partition_by` line, columns, range column, from, to, files rewritten, in range.
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        usize,
        InRange,
    );
    let cases: [Case; 4] = [
        (
            "flat",
            "",
            "event_date",
            "event_date",
            "2026-01-05",
            "2026-01-09",
            1,
            |r| between(r, "event_date", "2026-01-05", "2026-01-09"),
        ),
        (
            "coarse",
            "partition_by = \"event_month\"\n",
            "event_date, event_month",
            "event_date",
            "2026-01-05",
            "2026-01-09",
            1,
            |r| between(r, "event_date", "2026-01-05", "2026-01-09"),
        ),
        (
            "flat_ts",
            "",
            "event_ts",
            "event_ts",
            "2026-01-01T10",
            "2026-01-01T14",
            2,
            |r| between(r, "event_ts", "2026-01-01T10:00:00", "2026-01-01T14:59:59"),
        ),
        // Partitioned by a TIMESTAMP day, whose escaped directory names the carried rows' scan
        // once decoded twice (#32).
        (
            "coarse_ts",
            "partition_by = \"event_day\"\n",
            "event_ts, event_day",
            "event_ts",
            "2026-01-01T10",
            "2026-01-01T14",
            2,
            |r| between(r, "event_ts", "2026-01-01T10:00:00", "2026-01-01T14:59:59"),
        ),
    ];
    for (table, partition_by, columns, column, from, to, rewritten, in_range) in cases {
        let mut lake = Lake::new(store);
        lake.table(table, table);
        lake.model(
            "fix",
            &format!(
                "target = \"{table}\"\n{partition_by}range_column = \"{column}\"\n\
                 [sources.{table}]\nwindow = \"{column}\"\n[validate]\nkey = [\"id\"]"
            ),
            &format!("SELECT id, amount * 2 AS amount, {columns} FROM {table}"),
        );
        let before = lake.rows(table);
        let files_before = lake.files(table);
        let report = json_ok(&lake.run(&[
            "backfill",
            "fix",
            "--from",
            from,
            "--to",
            to,
            "--batch-partitions",
            "2",
            "--output-format",
            "json",
        ]));
        assert_eq!(report["state"], "published", "{table}: {report}");
        let carried = report["validation"]["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "carried rows unchanged")
            .unwrap_or_else(|| panic!("{table}: {report}"))
            .clone();
        assert_eq!(carried["passed"], true, "{table}");
        let key = |row: &Value| serde_json::to_string(row).unwrap();
        let mut expected: Vec<Value> = before
            .iter()
            .map(|row| {
                let map: BTreeMap<String, Value> =
                    row.as_object().unwrap().clone().into_iter().collect();
                let mut row = row.clone();
                if in_range(&map) {
                    row["amount"] = json!(row["amount"].as_i64().unwrap() * 2);
                }
                row
            })
            .collect();
        expected.sort_by_key(key);
        let mut after = lake.rows(table);
        after.sort_by_key(key);
        assert_eq!(
            after, expected,
            "{table}: the range's rows are fixed, every other row kept"
        );
        assert!(before.iter().any(|r| {
            let map: BTreeMap<String, Value> = r.as_object().unwrap().clone().into_iter().collect();
            in_range(&map)
        }));
        // Only the files whose statistics overlap the range were rewritten.
        let files_after = lake.files(table);
        let kept = files_before
            .iter()
            .filter(|(path, (size, _))| files_after.get(*path).map(|f| f.0) == Some(*size))
            .count();
        assert_eq!(
            files_before.len() - kept,
            rewritten,
            "{table}: files rewritten"
        );
        // The same range again recomputes the same rows: nothing to publish.
        let again = json_ok(&lake.run(&[
            "backfill",
            "fix",
            "--from",
            from,
            "--to",
            to,
            "--output-format",
            "json",
        ]));
        assert_eq!(again["outcome"], "already_published", "{table}: {again}");
        let files_now = lake.files(table);
        assert_eq!(files_now.len(), files_after.len(), "{table}");
        // A logical revert recomputes the range's rows as they were, by rows too.
        let run_id = report["run_id"].as_str().unwrap();
        let reverted =
            json_ok(&lake.run(&["revert", run_id, "--logical", "--output-format", "json"]));
        assert_eq!(reverted["outcome"], "reverted", "{table}: {reverted}");
        let mut restored = lake.rows(table);
        restored.sort_by_key(key);
        let mut original = before.clone();
        original.sort_by_key(key);
        assert!(restored == original, "{table}: every row as before the fix");
    }
}

both_stores!(tables_replaced_by_rows);

/// By rows, a concurrent append of a row inside the range between staging and publishing makes
/// the publish fail (exit 4) and keeps the appended row.
#[test]
fn a_concurrent_append_into_a_row_range_is_not_lost() {
    let mut lake = Lake::new(Store::Local);
    lake.table("flat", "flat");
    lake.model(
        "fix",
        "target = \"flat\"\nrange_column = \"event_date\"\n[sources.flat]\nwindow = \"event_date\"",
        "SELECT id, amount * 2 AS amount, event_date FROM flat",
    );
    let staged = json_ok(&lake.run(&[
        "backfill",
        "fix",
        "--from",
        "2026-01-05",
        "--to",
        "2026-01-09",
        "--stage-only",
        "--output-format",
        "json",
    ]));
    let run_id = staged["run_id"].as_str().unwrap().to_string();
    // Another writer appends a row dated inside the range.
    let script = format!(
        "import datetime, pyarrow as pa\nfrom deltalake import write_deltalake\n\
         t = pa.table({{'id': [424242], 'amount': [7], 'event_date': [datetime.date(2026, 1, 6)]}}, \
         schema=pa.schema([('id', pa.int64()), ('amount', pa.int64()), ('event_date', pa.date32())]))\n\
         write_deltalake('{}', t, mode='append')\nimport os, sys; sys.stdout.flush(); os._exit(0)\n",
        lake.uri("flat")
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lake.run(&["publish", &run_id]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let rows = lake.rows("flat");
    assert!(
        rows.iter().any(|r| r["id"] == 424242),
        "the appended row survives"
    );
}

/// Whether a row (as python reads it) lies in a test's range.
type RowInRange = fn(&BTreeMap<String, Value>) -> bool;

/// The net rows of `rows` (python's reading of a table corrected by adjustments): rows that
/// are the same but for `amount` and the lineage columns, `amount` summed, kept while they
/// outnumber their reversals; sorted, without the lineage columns.
fn net_rows(rows: &[Value]) -> Vec<Value> {
    let mut groups: BTreeMap<String, (Value, i64, i64)> = BTreeMap::new();
    for row in rows {
        let mut rest = row.as_object().unwrap().clone();
        let kind = rest.remove("_lakefill_kind").unwrap_or(Value::Null);
        rest.remove("_lakefill_run_id");
        rest.remove("_lakefill_reason");
        let amount = rest.remove("amount").unwrap().as_i64().unwrap();
        let weight = if kind == "reversal" { -1 } else { 1 };
        let entry = groups
            .entry(serde_json::to_string(&rest).unwrap())
            .or_insert_with(|| (Value::Object(rest), 0, 0));
        entry.1 += weight;
        entry.2 += amount;
    }
    let mut out: Vec<Value> = groups
        .into_values()
        .filter(|(_, weight, _)| *weight > 0)
        .map(|(mut row, _, amount)| {
            row["amount"] = json!(amount);
            row
        })
        .collect();
    out.sort_by_key(|r| serde_json::to_string(r).unwrap());
    out
}

/// Every shape, partitioned or replaced by rows, takes a fix published as adjustments (by
/// choice: the tables are not append-only): python's rows, netted here, are the old rows with the
/// range's amounts doubled; nothing is removed; a second run of the same fix reads the table as
/// its net rows (the model reads its own target), so it doubles them again.
#[test]
fn every_shape_takes_a_fix_as_adjustments() {
    let mut cases: Vec<(String, String, String, String, String, String)> = shapes()
        .into_iter()
        .map(|s| {
            (
                s.name.to_string(),
                format!("partition_by = {}", s.partition_by),
                s.window.to_string(),
                s.columns.to_string(),
                s.from.to_string(),
                s.to.to_string(),
            )
        })
        .collect();
    for (name, column, from, to) in [
        ("flat", "event_date", "2026-01-05", "2026-01-09"),
        ("flat_ts", "event_ts", "2026-01-01T10", "2026-01-01T14"),
    ] {
        cases.push((
            name.into(),
            format!("range_column = \"{column}\""),
            format!("\"{column}\""),
            column.into(),
            from.into(),
            to.into(),
        ));
    }
    let in_range: BTreeMap<String, RowInRange> = shapes()
        .into_iter()
        .map(|s| (s.name.to_string(), s.in_range))
        .chain([
            (
                "flat".to_string(),
                (|r: &BTreeMap<String, Value>| between(r, "event_date", "2026-01-05", "2026-01-09"))
                    as RowInRange,
            ),
            ("flat_ts".to_string(), |r: &BTreeMap<String, Value>| {
                between(r, "event_ts", "2026-01-01T10:00:00", "2026-01-01T14:59:59")
            }),
        ])
        .collect();
    let mut lake = Lake::new(Store::Local);
    for (name, layout, window, columns, from, to) in cases {
        lake.table(&name, &name);
        lake.model(
            &format!("adjust_{name}"),
            &format!(
                "target = \"{name}\"\n{layout}\nschema = \"add-columns\"\npublish = \"adjustments\"\n\
                 [sources.{name}]\nwindow = {window}\n[validate]\nkey = [\"id\"]\nmeasures = [\"amount\"]"
            ),
            &format!("SELECT id, amount * 2 AS amount, {columns} FROM {name}"),
        );
        let before = lake.rows(&name);
        let files_before = lake.files(&name);
        let model = format!("adjust_{name}");
        let run = |lake: &Lake| {
            json_ok(&lake.run(&[
                "backfill",
                &model,
                "--from",
                &from,
                "--to",
                &to,
                "--batch-partitions",
                "2",
                "--output-format",
                "json",
            ]))
        };
        let expected = |factor: i64| {
            let mut rows: Vec<Value> = before
                .iter()
                .map(|row| {
                    let map: BTreeMap<String, Value> =
                        row.as_object().unwrap().clone().into_iter().collect();
                    let mut row = row.clone();
                    if in_range[&name](&map) {
                        row["amount"] = json!(row["amount"].as_i64().unwrap() * factor);
                    }
                    row
                })
                .collect();
            rows.sort_by_key(|r| serde_json::to_string(r).unwrap());
            rows
        };
        for factor in [2, 4] {
            let report = run(&lake);
            assert_eq!(report["outcome"], "published", "{name} x{factor}: {report}");
            assert!(
                report["adjustments"]["corrections"].as_u64().unwrap() > 0,
                "{name}: {report}"
            );
            assert_eq!(
                net_rows(&lake.rows(&name)),
                expected(factor),
                "{name} x{factor}: old rows plus adjustments"
            );
            // Nothing removed: every file that was there is still there.
            let files_now = lake.files(&name);
            assert!(
                files_before.keys().all(|f| files_now.contains_key(f)),
                "{name}: no file removed"
            );
            // The second run is another version of the fix.
            lake.model_version(
                &model,
                "v2",
                &format!(
                    "target = \"{name}\"\n{layout}\nschema = \"add-columns\"\npublish = \"adjustments\"\n\
                     reason = \"again\"\n[sources.{name}]\nwindow = {window}\n[validate]\nkey = [\"id\"]\nmeasures = [\"amount\"]"
                ),
                &format!("SELECT id, amount * 2 AS amount, {columns} FROM {name}"),
            );
        }
    }
}
