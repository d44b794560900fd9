//! Real data types of other writers' tables pass through a backfill unchanged (#32): Spark's
//! INT96 timestamps at the ends of the calendar. Tables are written the way Spark writes them
//! (`spark_tables.py`), and every value is checked by pyarrow on the raw Parquet files.

use serde_json::Value;

use crate::support::{json_ok, run_in, stdout};

/// The fix of the Spark tables' model `scd` over their three days, reported as JSON.
const SCD_FIX: [&str; 8] = [
    "backfill",
    "scd",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-03",
    "--output-format",
    "json",
];

/// A project with Spark's INT96 table `scd` (`options`: `vectors`, deletion vectors on), the
/// table's path, and its rows as pyarrow reads them from the raw files.
fn int96_lake(options: &[&str]) -> (tempfile::TempDir, String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["int96", dir.path().to_str().unwrap()];
    args.extend_from_slice(options);
    spark(&args);
    let table = dir.path().join("lake/scd").to_str().unwrap().to_string();
    let before: Value = serde_json::from_str(&spark(&["timestamps", &table])).unwrap();
    (dir, table, before)
}

fn spark(args: &[&str]) -> String {
    crate::support::python_script("spark_tables.py", args)
}

/// A slowly changing dimension as Spark writes it: INT96 `valid_from`/`valid_to` holding
/// `0001-01-01` and `9999-12-31 23:59:59.999999` (read as nanoseconds, the latter overflows to
/// 1816). A fix of another column rewrites them exactly, and `sql` reads them right.
#[test]
fn issue_32_spark_int96_timestamps_keep_their_values() {
    let (dir, table, before) = int96_lake(&[]);
    let table = table.as_str();
    assert!(
        before
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["physical"] == "INT96")
    );

    let read = run_in(
        dir.path(),
        &[
            "sql",
            "SELECT CAST(MIN(valid_from) AS VARCHAR), CAST(MAX(valid_to) AS VARCHAR) FROM scd",
        ],
    );
    let text = stdout(&read);
    assert!(
        text.contains("0001-01-01T00:00:00") && text.contains("9999-12-31T23:59:59.999999"),
        "{text}"
    );

    let report = json_ok(&run_in(dir.path(), &SCD_FIX));
    assert_eq!(report["state"], "published", "{report}");
    // Every row changed its name, and nothing else.
    assert_eq!(
        report["validation"]["comparison"]["totals"]["changed"], 12,
        "{report}"
    );
    let after = uppercased(&before, table);
    for new in &after {
        // lakefill writes microseconds as INT64, as Delta's own writers do.
        assert_eq!(new["physical"], "INT64");
    }
    assert!(
        after
            .iter()
            .any(|r| r["valid_to"] == "9999-12-31T23:59:59.999999")
    );
    assert!(
        after
            .iter()
            .any(|r| r["valid_from"] == "0001-01-01T00:00:00.000000")
    );
}

/// On a table that takes deletion vectors, a partition whose old files Spark wrote with INT96
/// timestamps is never cut: a row is matched by its values in the table's types, and a reader
/// would read a kept row by its file's. Scoped by `--where` (whose rows outside the predicate stay
/// in their files, so no batch carries them), the fix stops with a clear error, exit 2, and the
/// table is as it was; unscoped, each partition is rewritten whole, its timestamps exact.
#[test]
fn int96_partitions_are_rewritten_not_cut_and_a_where_fix_of_them_is_refused() {
    let (dir, table, before) = int96_lake(&["vectors"]);
    let table = table.as_str();
    let log = || crate::support::files_under(&dir.path().join("lake/scd/_delta_log"));
    let log_before = log();
    let backfill = |extra: &[&str]| {
        let mut args = SCD_FIX.to_vec();
        args.extend_from_slice(extra);
        run_in(dir.path(), &args)
    };

    let refused = backfill(&["--where", "id % 100 = 1"]);
    crate::support::assert_refused(&refused, 2, "cannot be cut");
    let message = crate::support::stderr(&refused);
    assert!(message.contains("without `--where`"), "{message}");
    assert_eq!(log(), log_before, "nothing committed");
    let unchanged: Value = serde_json::from_str(&spark(&["timestamps", table])).unwrap();
    assert_eq!(unchanged, before);

    let report = json_ok(&backfill(&[]));
    assert_eq!(report["state"], "published", "{report}");
    // No partition is cut, nor counted (the threshold did not decide it): each is named as
    // rewritten because it cannot be cut.
    let vectors = &report["deletion_vectors"];
    assert!(
        vectors["partitions"]
            .as_object()
            .unwrap_or_else(|| panic!("{report:#}"))
            .is_empty(),
        "{vectors}"
    );
    assert_eq!(
        vectors["uncut"],
        serde_json::json!(["2026-01-01", "2026-01-02", "2026-01-03"]),
        "{vectors}"
    );
    assert!(
        vectors["too_large"].is_null(),
        "not for their size: {vectors}"
    );
    assert_eq!(vectors["files_cut"], 0, "{vectors}");
    let commit = std::fs::read_to_string(
        dir.path()
            .join("lake/scd/_delta_log/00000000000000000001.json"),
    )
    .unwrap();
    let info = commit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find_map(|a| a.get("commitInfo").cloned())
        .unwrap();
    assert_eq!(
        info["lakefill"]["deletion_vectors"]["uncut"], vectors["uncut"],
        "the commit metadata says so too: {info}"
    );
    uppercased(&before, table);
}

/// The rows of the Spark table `table` now (pyarrow on its live files): each row of `before`
/// once, in order, with its name uppercased and its timestamps exact.
fn uppercased(before: &Value, table: &str) -> Vec<Value> {
    let after: Value = serde_json::from_str(&spark(&["timestamps", table])).unwrap();
    let after = after.as_array().unwrap().clone();
    assert_eq!(
        after.len(),
        12,
        "every row once, no old file kept: {after:?}"
    );
    for (old, new) in before.as_array().unwrap().iter().zip(&after) {
        assert_eq!(new["id"], old["id"]);
        assert_eq!(new["valid_from"], old["valid_from"], "{new}");
        assert_eq!(new["valid_to"], old["valid_to"], "{new}");
        assert_eq!(
            new["name"],
            old["name"].as_str().unwrap().to_uppercase(),
            "{new}"
        );
    }
    after
}

fn nested(args: &[&str]) -> Value {
    crate::support::python_json("nested.py", args)
}

/// Structs, lists, maps, lists of structs and binaries (strings inside each, NULLs, empty lists)
/// pass through a model unchanged, partitioned and by rows: a fix of another column publishes
/// them as they were (python reads them back), and a model that changes nothing is up to date.
#[test]
fn issue_32_nested_columns_pass_through_unchanged() {
    for layout in ["partitioned", "by_rows"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        nested(&["make", path, layout]);
        let before = nested(&["rows", path]);
        let backfill = |version: &str| {
            json_ok(&run_in(
                dir.path(),
                &[
                    "backfill",
                    "nested",
                    "--from",
                    "2026-01-02",
                    "--to",
                    "2026-01-03",
                    "--model-version",
                    version,
                    "--output-format",
                    "json",
                ],
            ))
        };
        let report = backfill("v1");
        assert_eq!(report["state"], "published", "{layout}: {report}");
        // Each of the range's 10 rows changes, and only its amount.
        assert_eq!(
            report["validation"]["comparison"]["totals"]["changed"], 10,
            "{layout}: {report}"
        );
        let after = nested(&["rows", path]);
        for (old, new) in before
            .as_array()
            .unwrap()
            .iter()
            .zip(after.as_array().unwrap())
        {
            let inside = ["2026-01-02", "2026-01-03"].contains(&old["day"].as_str().unwrap());
            let mut expected = old.clone();
            if inside {
                expected["amount"] = (old["amount"].as_f64().unwrap() * 2.0).into();
            }
            assert_eq!(new, &expected, "{layout}");
        }
        // Passing every column through changes nothing: up to date, nothing published.
        let again = backfill("v2");
        assert_eq!(again["outcome"], "up_to_date", "{layout}: {again}");
        assert_eq!(nested(&["rows", path]), after, "{layout}");
    }
}

fn floats(args: &[&str]) -> Value {
    crate::support::python_json("floats.py", args)
}

/// A model that computes the same doubles in another order: compared bit for bit (the default)
/// the rows whose bits differ are "changed" and the report says it looks like float noise; with
/// `[validate] decimals = 9` the run is up to date and publishes nothing.
#[test]
fn issue_32_float_noise_is_named_and_decimals_compare_to_places() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    floats(&["make", path]);
    let (from, to) = ("2026-01-02", "2026-01-03");
    let expected = floats(&["differing", path, from, to]);
    assert!(expected["changed"].as_u64().unwrap() > 0, "{expected}");
    let before = floats(&["rows", path]);
    let backfill = |version: &str| {
        json_ok(&run_in(
            dir.path(),
            &[
                "backfill",
                "scores",
                "--from",
                from,
                "--to",
                to,
                "--model-version",
                version,
                "--stage-only",
                "--output-format",
                "json",
            ],
        ))
    };
    let exact = backfill("v1");
    assert_eq!(
        exact["validation"]["comparison"]["totals"]["changed"], expected["changed"],
        "{exact}"
    );
    let notes = exact["validation"]["notes"].to_string();
    assert!(
        notes.contains("decimals = N") && notes.contains("total"),
        "{exact}"
    );
    let rounded = backfill("v2");
    assert_eq!(rounded["outcome"], "up_to_date", "{rounded}");
    assert_eq!(rounded["validation"]["comparison"]["totals"]["changed"], 0);
    assert_eq!(floats(&["rows", path]), before, "nothing published");
}

/// By rows (`range_column`) on a table that takes deletion vectors, old files Spark wrote with
/// INT96 timestamps cannot be cut either, and since a fix by rows by vectors carries no rows
/// over, it is published by rewriting those files instead (their footers are read before
/// staging): the rows of the range fixed, the files' other rows carried over with their
/// timestamps exact, nothing refused.
#[test]
fn int96_files_of_a_fix_by_rows_are_rewritten_not_refused() {
    let (dir, table, before) = int96_lake(&["vectors"]);
    let table = table.as_str();
    // The rows that became valid on 2021-01-01 (one a day), by rows of `valid_from`.
    std::fs::write(
        dir.path().join("sql/scd/v2.sql"),
        "/*\ntarget = \"scd\"\npartition_by = \"day\"\nrange_column = \"valid_from\"\ngrain = \"day\"\n\
         [sources.scd]\n[validate]\nkey = [\"id\"]\n*/\n\
         SELECT id, upper(name) AS name, valid_from, valid_to, day FROM scd\n\
         WHERE valid_from >= TIMESTAMP '2021-01-01' AND valid_from < TIMESTAMP '2021-01-02'\n",
    )
    .unwrap();
    let report = json_ok(&run_in(
        dir.path(),
        &[
            "backfill",
            "scd",
            "--model-version",
            "v2",
            "--from",
            "2021-01-01",
            "--to",
            "2021-01-01",
            "--output-format",
            "json",
        ],
    ));
    assert_eq!(report["state"], "published", "{report}");
    assert!(report["deletion_vectors"].is_null(), "rewritten: {report}");
    assert_eq!(
        report["validation"]["comparison"]["totals"]["changed"], 3,
        "{report}"
    );
    let after: Value = serde_json::from_str(&spark(&["timestamps", table])).unwrap();
    let after = after.as_array().unwrap();
    assert_eq!(after.len(), 12, "every row once: {after:?}");
    for (old, new) in before.as_array().unwrap().iter().zip(after) {
        let mut expected = old.clone();
        if old["id"].as_i64().unwrap() % 100 == 1 {
            expected["name"] = old["name"].as_str().unwrap().to_uppercase().into();
        }
        for column in ["id", "name", "valid_from", "valid_to"] {
            assert_eq!(new[column], expected[column], "{new}");
        }
    }
}
