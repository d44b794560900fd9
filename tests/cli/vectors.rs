//! Publishing a fix by deletion vectors, on a table python `deltalake` made with
//! `delta.enableDeletionVectors`: the old rows the fix removes are deleted in place, only the rows
//! it adds are written, and two independent readers that apply deletion vectors (python
//! `deltalake`'s own engine, polars) read exactly the fix, computed by python from the old rows.
//! A partition the fix changes too much of is rewritten; revert, discard and resume work as for a
//! rewrite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{PythonLake, Store, json_ok, sorted_rows, stderr};

fn helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cli/vectors.py")
}

/// The fix `tests/cli/vectors.py expected` applies: on 2026-01-01 and -02 about 1% of the rows
/// change (every 100th gets a cent more, every 1,000th goes, a copy of every 1,000th is added,
/// a row loaded twice is kept once); on 2026-01-03 every row changes.
const FIX: &str = "SELECT DISTINCT event_id,\n\
  CASE WHEN event_id % 100 = 7 OR event_date = DATE '2026-01-03' THEN amount_cents + 1 ELSE amount_cents END AS amount_cents,\n\
  country, event_date\n\
FROM t WHERE event_date BETWEEN $start AND $end AND event_id % 1000 <> 3\n\
UNION ALL\n\
SELECT event_id + 5000000, amount_cents, country, event_date FROM t WHERE event_date BETWEEN $start AND $end AND event_id % 1000 = 11";

/// The header of the tests' models (`KEYED`: with `event_id` as the key validation compares by).
const HEADER: &str =
    "target = \"t\"\npartition_by = \"event_date\"\n[sources.t]\nwindow = \"event_date\"";
const KEYED: &str = "target = \"t\"\npartition_by = \"event_date\"\n[sources.t]\nwindow = \"event_date\"\n[validate]\nkey = [\"event_id\"]";

/// A second fix (`tests/cli/vectors.py second`): every row ending in 08 a cent more.
const SECOND_FIX: &str = "SELECT event_id, CASE WHEN event_id % 100 = 8 THEN amount_cents + 1 ELSE amount_cents END AS amount_cents, country, event_date\n\
FROM t WHERE event_date BETWEEN $start AND $end";

fn lake(store: Store) -> PythonLake {
    let mut lake = PythonLake::new(store);
    lake.script(&helper(), &["make", &lake.uri("t")]);
    lake.declare("t");
    lake.model("fix", KEYED, FIX);
    lake
}

fn read(lake: &PythonLake, what: &[&str]) -> Value {
    let uri = lake.uri("t");
    let mut args = vec![what[0], uri.as_str()];
    args.extend_from_slice(&what[1..]);
    serde_json::from_str(&lake.script(&helper(), &args)).unwrap()
}

const BACKFILL: [&str; 8] = [
    "backfill",
    "fix",
    "--from",
    "2026-01-01",
    "--to",
    "2026-01-03",
    "--output-format",
    "json",
];

/// Each live file of `t`: its size and, if it has a deletion vector, its cardinality.
fn live_files(lake: &PythonLake) -> BTreeMap<String, (i64, Option<i64>)> {
    let table = lake.open("t");
    let snapshot = table.snapshot().unwrap();
    snapshot
        .log_data()
        .iter()
        .map(|f| {
            (
                f.path().to_string(),
                (
                    f.size(),
                    f.deletion_vector_descriptor().map(|d| d.cardinality),
                ),
            )
        })
        .collect()
}

/// Runs `args` (a `--stage-only` backfill), after a first attempt stopped at `failpoint` if
/// given, then discards the run: its report and log.
fn staged_then_discarded(
    lake: &PythonLake,
    args: &[&str],
    failpoint: Option<&str>,
) -> (Value, String) {
    if let Some(failpoint) = failpoint {
        let out = crate::support::lakefill_command(lake.path())
            .args(args)
            .env("LAKEFILL_FAILPOINTS", failpoint)
            .output()
            .unwrap();
        assert!(!out.status.success(), "stopped at {failpoint}");
    }
    let out = crate::support::lakefill_command(lake.path())
        .args(args)
        .env_remove("LAKEFILL_FAILPOINTS")
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    assert!(report["run_id"].is_string(), "{report}\n{}", stderr(&out));
    let discarded = lake.run(&["discard", report["run_id"].as_str().unwrap()]);
    assert!(discarded.status.success(), "{}", stderr(&discarded));
    (report, stderr(&out))
}

fn a_small_fix_is_published_by_deletion_vectors(store: Store) {
    let lake = lake(store);
    let before = live_files(&lake);
    assert_eq!(before.len(), 8, "4 days in 2 files each: {before:?}");
    let report = json_ok(&lake.run(&BACKFILL));
    assert_eq!(report["outcome"], "published", "{report}");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{vectors}");
    let rewritten: Vec<&String> = vectors["rewritten"].as_object().unwrap().keys().collect();
    assert_eq!(rewritten, ["2026-01-03"], "every row changed: {vectors}");
    assert_eq!(vectors["files_cut"], 4, "{vectors}");
    // 2026-01-01: 2 rows go (ending in 003), 1 of a row loaded twice, 20 change; 2 are added.
    assert_eq!(
        vectors["partitions"]["2026-01-01"],
        serde_json::json!({"deleted": 23, "added": 22, "rows": 1999}),
        "{vectors}"
    );
    let published = report["published_version"].as_u64().unwrap();

    // What two readers that apply deletion vectors read is the fix, as python computes it.
    let expected = read(&lake, &["expected", &(published - 1).to_string()]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    if store == Store::Local {
        assert_eq!(read(&lake, &["polars"]), expected, "polars");
    }

    // The old files of the cut days stay, with vectors; those of the rewritten day and of the
    // day outside the range are gone and untouched; the rows written are few.
    let after = live_files(&lake);
    let old_cut_bytes: i64 = before
        .iter()
        .filter(|(p, _)| p.contains("2026-01-01") || p.contains("2026-01-02"))
        .map(|(p, (size, _))| {
            assert_eq!(after[p].0, *size, "{p} stays");
            assert!(after[p].1.is_some(), "{p} has a vector");
            *size
        })
        .sum();
    let deleted: i64 = after.values().filter_map(|(_, dv)| *dv).sum();
    assert_eq!(deleted, 23 + 22, "{after:?}");
    for (path, _) in before.iter().filter(|(p, _)| p.contains("2026-01-03")) {
        assert!(!after.contains_key(path), "{path} rewritten");
    }
    for (path, entry) in before.iter().filter(|(p, _)| p.contains("2026-01-04")) {
        assert_eq!(after.get(path), Some(entry), "{path} outside the range");
    }
    let written_cut_bytes: i64 = after
        .iter()
        .filter(|(p, _)| {
            p.contains("lakefill-") && (p.contains("2026-01-01") || p.contains("2026-01-02"))
        })
        .map(|(_, (size, _))| *size)
        .sum();
    assert!(
        written_cut_bytes * 10 < old_cut_bytes,
        "{written_cut_bytes} bytes written for {old_cut_bytes} bytes of old files"
    );

    // Reverted, the old files are whole again.
    let run_id = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(live_files(&lake), before);
    let original = read(&lake, &["rows", &(published - 1).to_string()]);
    assert_eq!(read(&lake, &["rows"]), original, "python deltalake");
    if store == Store::Local {
        assert_eq!(read(&lake, &["polars"]), original, "polars");
    }
}

every_store!(a_small_fix_is_published_by_deletion_vectors);

/// Staged only, a fix by vectors leaves the table as it was and its vector file is discarded with
/// its staged files; stopped after staging, the same command publishes it.
#[test]
fn a_fix_by_vectors_is_discarded_whole_or_resumed() {
    let lake = lake(Store::Local);
    let root = lake.path().join("lake/t");
    let vector_files = || -> Vec<String> {
        std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|name| name.starts_with("deletion_vector_"))
            .collect()
    };
    let original = read(&lake, &["rows"]);
    let mut staged_args = BACKFILL.to_vec();
    staged_args.push("--stage-only");
    let staged = json_ok(&lake.run(&staged_args));
    assert_eq!(staged["outcome"], "staged", "{staged}");
    assert_eq!(vector_files().len(), 1);
    assert_eq!(read(&lake, &["rows"]), original, "nothing published");
    let out = lake.run(&["discard", staged["run_id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(vector_files().is_empty(), "the vector file is discarded");
    assert!(
        crate::support::files_under(&root)
            .iter()
            .all(|f| !f.contains("lakefill-")),
        "staged files discarded"
    );

    let version = lake.open("t").version().unwrap();
    let out = crate::support::lakefill_command(lake.path())
        .args(BACKFILL)
        .env("LAKEFILL_FAILPOINTS", "after-stage")
        .output()
        .unwrap();
    assert!(!out.status.success(), "stopped after staging");
    let report = json_ok(&lake.run(&BACKFILL));
    assert_eq!(report["outcome"], "published", "{report}");
    assert!(report["resumed_batches"].as_u64() >= Some(1), "{report}");
    let expected = read(&lake, &["expected", &version.to_string()]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");
    assert_eq!(vector_files().len(), 1, "the resumed run's vector file");
}

/// Validation takes the old rows as staging read them to match the new rows against them (it
/// does not read them again), and compares exactly as when it reads them: checked against a
/// resumed run (whose first attempt's reads are gone), which reads them. A partition of the
/// range the model leaves without rows is not read by staging: validation reads the old side
/// then, and reports its rows removed. Rows that earlier vectors deleted are not old rows.
#[test]
fn validation_takes_the_old_rows_staging_matched() {
    let lake = lake(Store::Local);
    let version = lake.open("t").version().unwrap();
    // The fix, but that it makes no rows of 2026-01-04.
    lake.model_version(
        "fix",
        "v2",
        KEYED,
        &FIX.replace("$end", "LEAST($end, DATE '2026-01-03')"),
    );
    // A second fix, of every day, for files that vectors of the first cut.
    lake.model_version("fix", "v3", KEYED, SECOND_FIX);
    let run = |model: &str, to: &str, failpoint: Option<&str>| -> (Value, String) {
        let mut args = BACKFILL.to_vec();
        args[5] = to;
        args.extend(["--stage-only", "--batch-partitions", "1", "-v"]);
        args.extend(["--model-version", model]);
        staged_then_discarded(&lake, &args, failpoint)
    };
    let comparison = |report: &Value| {
        let mut comparison = report["validation"]["comparison"].clone();
        comparison.as_object_mut().unwrap().remove("samples");
        comparison
    };
    // Taken from staging, and read again by a resumed run: the same comparison.
    let both = |model: &str| {
        let (taken, log) = run(model, "2026-01-03", None);
        assert_eq!(taken["outcome"], "staged", "{taken}");
        assert!(log.contains("old_captured=true"), "{model}: {log}");
        let (read_again, log) = run(model, "2026-01-03", Some("mid-stage"));
        assert_eq!(read_again["resumed_batches"], 1, "{read_again}");
        assert!(log.contains("old_captured=false"), "{model}: {log}");
        assert_eq!(comparison(&taken), comparison(&read_again), "{model}");
        taken
    };
    let taken = both("v2");
    // Independently: the old rows of the range, and the fix's.
    let count = |rows: &Value, to: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .filter(|r| r[3].as_str().is_some_and(|d| d <= to))
            .count() as u64
    };
    let old = read(&lake, &["rows", &version.to_string()]);
    let new = read(&lake, &["expected", &version.to_string()]);
    let totals = &taken["validation"]["comparison"]["totals"];
    assert_eq!(totals["old_rows"], count(&old, "2026-01-03"), "{totals}");
    assert_eq!(totals["new_rows"], count(&new, "2026-01-03"), "{totals}");
    assert!(totals["changed"].as_u64() > Some(0), "{totals}");

    // The range takes in 2026-01-04, where the model makes no rows.
    let (dropped, log) = run("v2", "2026-01-04", None);
    assert!(log.contains("old_captured=false"), "{log}");
    let day = dropped["validation"]["comparison"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["value"] == "2026-01-04")
        .cloned();
    let old_day = count(&old, "2026-01-04") - count(&old, "2026-01-03");
    assert_eq!(
        day.as_ref()
            .map(|p| (p["old_rows"].clone(), p["removed"].clone())),
        Some((Value::from(old_day), Value::from(old_day))),
        "{day:?}"
    );

    // Published, the first fix leaves vectors in the old files: the rows they delete are not
    // old rows of the second.
    let mut args = BACKFILL.to_vec();
    args.extend(["--model-version", "v1"]);
    let first = json_ok(&lake.run(&args));
    assert!(
        first["deletion_vectors"]["files_cut"].as_u64() > Some(0),
        "{first}"
    );
    let taken = both("v3");
    let fixed = read(&lake, &["rows"]);
    let totals = &taken["validation"]["comparison"]["totals"];
    assert_eq!(totals["old_rows"], count(&fixed, "2026-01-03"), "{totals}");
    let changed = fixed
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[0].as_i64().unwrap() % 100 == 8 && r[3].as_str() <= Some("2026-01-03"))
        .count();
    assert_eq!(totals["changed"], changed, "{totals}");
}

/// A second fix cuts files a first one cut: their new vectors hold the rows the first deleted too,
/// and the rows read are the second fix's.
#[test]
fn a_second_fix_cuts_files_the_first_one_cut() {
    let lake = lake(Store::Local);
    let first = json_ok(&lake.run(&BACKFILL));
    assert_eq!(first["outcome"], "published", "{first}");
    let cut_before = live_files(&lake);
    lake.model_version("fix", "v2", HEADER, SECOND_FIX);
    let mut args = BACKFILL.to_vec();
    args.extend(["--model-version", "v2"]);
    let second = json_ok(&lake.run(&args));
    assert_eq!(second["outcome"], "published", "{second}");
    let version = second["published_version"].as_u64().unwrap();
    // Each old file of 2026-01-01 and -02 had a vector; it now deletes 10 rows more.
    let after = live_files(&lake);
    for (path, (_, vector)) in cut_before.iter().filter(|(p, _)| {
        !p.contains("lakefill-") && !p.contains("2026-01-03") && !p.contains("2026-01-04")
    }) {
        assert_eq!(
            after[path].1,
            Some(vector.unwrap() + 10),
            "{path}: {vector:?} then {:?}",
            after[path].1
        );
    }
    let expected = read(&lake, &["second", &(version - 1).to_string()]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");
}

/// The model of the unpartitioned table: the tests' fix (`FIX`) of 2026-01-01 ..= 2026-01-03, the
/// other rows as they are (the run's scope is the whole table).
const FLAT_FIX: &str = "SELECT DISTINCT event_id,\n\
  CASE WHEN event_date <= DATE '2026-01-03' AND (event_id % 100 = 7 OR event_date = DATE '2026-01-03') THEN amount_cents + 1 ELSE amount_cents END AS amount_cents,\n\
  country, event_date\n\
FROM t WHERE event_date > DATE '2026-01-03' OR event_id % 1000 <> 3\n\
UNION ALL\n\
SELECT event_id + 5000000, amount_cents, country, event_date FROM t WHERE event_date <= DATE '2026-01-03' AND event_id % 1000 = 11";

/// An unpartitioned table without a time column (the whole table is the run's one partition)
/// takes a small fix by vectors too: both of its files are cut, nothing else is written but the
/// rows the fix adds, python `deltalake` and polars read the fix, `revert` puts the files back,
/// and a `--where` fix keeps the rows it does not select where they are.
#[test]
fn an_unpartitioned_table_takes_a_fix_by_deletion_vectors() {
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "flat"]);
    lake.declare("t");
    lake.model(
        "fix",
        "target = \"t\"\n[sources.t]\n[validate]\nkey = [\"event_id\"]",
        FLAT_FIX,
    );
    let before = live_files(&lake);
    assert_eq!(before.len(), 2, "two writes of 4,000 rows: {before:?}");
    let original = read(&lake, &["rows"]);
    let backfill = ["backfill", "fix", "--output-format", "json"];
    let report = json_ok(&lake.run(&backfill));
    assert_eq!(report["outcome"], "published", "{report}");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["(all)"], "{vectors}");
    assert_eq!(vectors["files_cut"], 2, "{vectors}");
    assert!(
        vectors["rewritten"]
            .as_object()
            .is_none_or(|r| r.is_empty()),
        "{vectors}"
    );
    // 2,044 rows written of 7,999 (a quarter of them changes), in one file.
    assert_eq!(report["files_written"], 1, "{report}");
    let after = live_files(&lake);
    for path in before.keys() {
        assert!(after[path].1.is_some(), "{path} is cut: {after:?}");
    }
    let expected = read(&lake, &["expected", "1"]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");

    let run_id = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(live_files(&lake), before);
    assert_eq!(read(&lake, &["rows"]), original);

    where_de_cuts_both_files(&lake, &backfill, "1");
}

/// `args` (a fix of the unpartitioned table) with `--where country = 'DE'`: published by
/// vectors, both files cut, no row written again, and the table reads as the fix of the DE rows
/// of version `version`, the others as they were.
fn where_de_cuts_both_files(lake: &PythonLake, args: &[&str], version: &str) {
    let mut scoped = args.to_vec();
    scoped.extend(["--where", "country = 'DE'"]);
    let report = json_ok(&lake.run(&scoped));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(report["deletion_vectors"]["files_cut"], 2, "{report}");
    assert_eq!(report["rows_carried"], 0, "{report}");
    let expected = read(lake, &["expected", version, "DE"]);
    assert_eq!(read(lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(lake, &["polars"]), expected, "polars");
}

/// A partition with more live rows than matching may hold in memory (a quarter of the run's
/// memory limit, at 96 bytes a row) is not cut: it is rewritten, streaming, and the report names
/// it `uncut`; with `--where`, which cannot rewrite it, the run stops before publishing anything
/// and says why. The whole unpartitioned table of 160,000 rows is one such partition under
/// `--memory-limit 16MiB` (43,690 rows), and is cut without it.
#[test]
fn a_partition_too_large_to_match_in_memory_is_rewritten_not_cut() {
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "flatbig"]);
    lake.declare("t");
    lake.model(
        "fix",
        "target = \"t\"\n[sources.t]\n[validate]\nkey = [\"event_id\"]",
        FLAT_FIX,
    );
    let log = lake.path().join("lake/t/_delta_log");
    let versions = || std::fs::read_dir(&log).unwrap().count();
    let before = versions();
    let limited = [
        "backfill",
        "fix",
        "--memory-limit",
        "16MiB",
        "--output-format",
        "json",
    ];
    let mut scoped = limited.to_vec();
    scoped.extend(["--where", "country = 'DE'"]);
    let out = lake.run(&scoped);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    for said in [
        "160000 live rows",
        "43690 rows",
        "cannot be cut",
        "--memory-limit",
    ] {
        assert!(stderr(&out).contains(said), "{said}: {}", stderr(&out));
    }
    assert_eq!(versions(), before, "nothing published");

    // In text: the report says why the partition was rewritten and what would cut it; the
    // commit metadata names it.
    let out = lake.run(&limited[..limited.len() - 2]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(versions(), before + 1, "published in one commit");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "1 partitions rewritten whole: more live rows than matching may hold in memory"
        ) && text.contains("raise it to cut them ((all))")
            && !text.contains("not of the table's type"),
        "{text}"
    );
    let info = crate::support::last_commit_info(&log);
    let vectors = &info["lakefill"]["deletion_vectors"];
    assert_eq!(vectors["uncut"], serde_json::json!(["(all)"]), "{info}");
    assert_eq!(vectors["too_large"], serde_json::json!(["(all)"]), "{info}");
    assert_eq!(vectors["files_cut"], 0, "{info}");
    let expected = read(&lake, &["expected", "1"]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");
    assert!(
        live_files(&lake)
            .values()
            .all(|(_, vector)| vector.is_none()),
        "rewritten: no file has a vector"
    );

    // By rows (the second fix), whose fix by vectors carries no rows over either, the run is not
    // refused: its batch's files are too large to match, so it rewrites them as before vectors,
    // carrying their rows of 2026-01-04 over.
    let version = lake.open("t").version().unwrap().to_string();
    by_rows_model(&lake, None, "v2", SECOND_FIX);
    let mut by_rows = BACKFILL.to_vec();
    by_rows.extend(["--memory-limit", "16MiB", "--model-version", "v2"]);
    let report = json_ok(&lake.run(&by_rows));
    assert_eq!(report["outcome"], "published", "{report}");
    assert!(report["deletion_vectors"].is_null(), "{report}");
    assert_eq!(report["rows_carried"], 40000, "{report}");
    let expected = read(&lake, &["second", &version]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
}

/// A logical revert (`revert --logical`, when a later commit blocks putting files back) of a fix
/// published by vectors is published by vectors too: the rows the fix added are deleted in place,
/// the rows it deleted written again, and the range reads as it was before the fix (the later
/// fix's changes in it replaced too), to python `deltalake` and polars.
#[test]
fn a_logical_revert_is_published_by_deletion_vectors() {
    // Without a key: the rows put back repeat one (a row loaded twice), as they did before.
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t")]);
    lake.declare("t");
    lake.model("fix", HEADER, FIX);
    let original = read(&lake, &["rows"]);
    let first = json_ok(&lake.run(&BACKFILL));
    assert_eq!(first["outcome"], "published", "{first}");
    lake.model_version("fix", "v2", HEADER, SECOND_FIX);
    let mut args = BACKFILL.to_vec();
    args.extend(["--model-version", "v2"]);
    let second = json_ok(&lake.run(&args));
    assert_eq!(second["outcome"], "published", "{second}");
    let run_id = first["run_id"].as_str().unwrap();
    let by_files = lake.run(&["revert", run_id]);
    assert_eq!(by_files.status.code(), Some(4), "{}", stderr(&by_files));
    let cut_before = live_files(&lake);

    let reverted = json_ok(&lake.run(&["revert", run_id, "--logical", "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    let vectors = &reverted["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{vectors}");
    // 2026-01-03, where every row changed, is rewritten (as the fix rewrote it).
    let rewritten: Vec<&String> = vectors["rewritten"].as_object().unwrap().keys().collect();
    assert_eq!(rewritten, ["2026-01-03"], "{vectors}");
    // On the cut days, every row the table's own files still hold is a row of before the
    // fixes: they keep their vectors. The files the fixes wrote hold none: they are removed
    // whole (not kept behind a vector that deletes every row).
    let after = live_files(&lake);
    let cut_days = |p: &String| p.contains("2026-01-01") || p.contains("2026-01-02");
    for (path, file) in cut_before.iter().filter(|(p, _)| cut_days(p)) {
        match path.contains("lakefill-") {
            true => assert!(!after.contains_key(path), "{path} is still live"),
            false => assert_eq!(after.get(path), Some(file), "{path}"),
        }
    }
    assert_eq!(read(&lake, &["rows"]), original, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), original, "polars");
}

/// A file the fix cuts by a vector carries the checksum of the rows it keeps, and the file of the
/// rows it adds its own: the next fix compares a partition it does not change by those checksums,
/// without reading it, and one it changes by its rows. (A file another writer cut, or wrote,
/// carries none: see `protocol.rs`.)
#[test]
fn files_cut_by_vectors_keep_checksums_of_the_rows_they_keep() {
    let lake = lake(Store::Local);
    let first = json_ok(&lake.run(&BACKFILL));
    assert_eq!(first["outcome"], "published", "{first}");
    let version = first["published_version"].as_u64().unwrap();
    lake.model_version(
        "fix",
        "v2",
        KEYED,
        "SELECT event_id, CASE WHEN event_date = DATE '2026-01-01' AND event_id % 1000 = 5 THEN amount_cents + 1 ELSE amount_cents END AS amount_cents, country, event_date\n\
         FROM t WHERE event_date BETWEEN $start AND $end",
    );
    let mut args = BACKFILL.to_vec();
    args.extend(["--model-version", "v2"]);
    let second = json_ok(&lake.run(&args));
    assert_eq!(second["outcome"], "published", "{second}");
    let comparison = &second["validation"]["comparison"];
    // 2026-01-02's files were all cut or written by the first fix; 2026-01-03 was rewritten
    // (its files hold more than the rows its writer hashed) and 2026-01-01 changes: read.
    assert_eq!(comparison["old_unread"], 1, "{comparison}");
    for partition in comparison["partitions"].as_array().unwrap() {
        let changed = if partition["value"] == "2026-01-01" {
            2
        } else {
            0
        };
        assert_eq!(partition["changed"], changed, "{partition}");
        assert_eq!(partition["added"], 0, "{partition}");
        assert_eq!(partition["removed"], 0, "{partition}");
    }
    // Independently: the first fix's rows, the two of 2026-01-01 ending in 5 a cent more.
    let mut expected = read(&lake, &["rows", &version.to_string()]);
    for row in expected.as_array_mut().unwrap() {
        if row[3] == "2026-01-01" && row[0].as_i64().unwrap() % 1000 == 5 {
            row[1] = Value::from(row[1].as_i64().unwrap() + 1);
        }
    }
    assert_eq!(
        sorted_rows(read(&lake, &["rows"])),
        sorted_rows(expected.clone()),
        "python deltalake"
    );
    assert_eq!(
        sorted_rows(read(&lake, &["polars"])),
        sorted_rows(expected),
        "polars"
    );
}

/// A fix that only adds a row to a partition whose file another writer cut by an inline vector:
/// the file stays as it is (its vector read to count its live rows), the row is appended.
#[test]
fn a_file_with_an_inline_vector_of_another_writer_is_kept() {
    let table = crate::features::FeatureTable::make("none+dv");
    let before = table.rows(None);
    table.model(
        "grow",
        "event_id, amount_cents, point, event_date FROM t WHERE event_date BETWEEN $start AND $end\n\
         UNION ALL SELECT 9999, 1, named_struct('x', CAST(1 AS BIGINT), 'tag', 'new'), DATE '2026-01-03'\n\
         -- ",
        "",
    );
    let report = json_ok(&table.run(&[
        "backfill",
        "grow",
        "--from",
        "2026-01-03",
        "--to",
        "2026-01-03",
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(
        report["deletion_vectors"]["partitions"]["2026-01-03"],
        serde_json::json!({"deleted": 0, "added": 1, "rows": 3}),
        "{report}"
    );
    assert_eq!(report["partitions"][0]["old_rows"], 2, "{report}");
    let mut expected = before.as_array().unwrap().clone();
    expected.push(serde_json::json!({"event_id": 9999, "amount_cents": 1, "point": {"x": 1, "tag": "new"}, "event_date": "2026-01-03"}));
    let rows = table.rows(None);
    assert_eq!(rows.as_array().unwrap().len(), expected.len(), "{rows}");
    assert!(
        rows.as_array()
            .unwrap()
            .contains(&expected[expected.len() - 1]),
        "{rows}"
    );
    for row in before.as_array().unwrap() {
        assert!(rows.as_array().unwrap().contains(row), "{row} kept");
    }
}

/// The checks of a report by name, with whether each passed.
fn checks(report: &Value) -> BTreeMap<String, bool> {
    report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["passed"] == true))
        .collect()
}

/// `--where` by deletion vectors: only the old rows the predicate selects are the fix's to
/// delete; the others stay in their files (no batch copies them), and readers read exactly the
/// fix of the selected rows. A partition the fix changes too much of is rewritten with the rows
/// it does not select. Validation takes the old side from staging, as a resumed run that reads
/// it again compares it; the rows kept outside the predicate are checked against an independent
/// scan. Revert gives the old files back.
#[test]
fn a_fix_scoped_by_where_keeps_the_rows_it_does_not_select_in_place() {
    let lake = lake(Store::Local);
    let version = lake.open("t").version().unwrap();
    let before = live_files(&lake);
    let original = read(&lake, &["rows"]);
    let scoped = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = BACKFILL.to_vec();
        args.extend(["--where", "country = 'DE'", "-v"]);
        args.extend(extra);
        args
    };
    let comparison = |report: &Value| {
        let mut comparison = report["validation"]["comparison"].clone();
        comparison.as_object_mut().unwrap().remove("samples");
        comparison
    };
    // Staged and discarded, then staged again after a first attempt stopped mid-stage (its
    // first batch is resumed: validation reads the old side itself).
    let staged = |failpoint: Option<&str>| -> (Value, String) {
        let args = scoped(&["--stage-only", "--batch-partitions", "1"]);
        let (report, log) = staged_then_discarded(&lake, &args, failpoint);
        assert_eq!(report["outcome"], "staged", "{report}\n{log}");
        (report, log)
    };
    let (taken, log) = staged(None);
    assert!(log.contains("old_captured=true"), "{log}");
    let (read_again, log) = staged(Some("mid-stage"));
    assert!(log.contains("old_captured=false"), "{log}");
    assert_eq!(comparison(&taken), comparison(&read_again));
    assert_eq!(live_files(&lake), before, "nothing published");

    let out = lake.run(&scoped(&[]));
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(
        checks(&report).get("carried rows unchanged"),
        Some(&true),
        "{report}"
    );
    assert_eq!(comparison(&report), comparison(&taken));
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{vectors}");
    let rewritten: Vec<&String> = vectors["rewritten"].as_object().unwrap().keys().collect();
    assert_eq!(
        rewritten,
        ["2026-01-03"],
        "every DE row changes, a third of its rows: {vectors}"
    );

    // Independently: the fix of the DE rows, the others as they were.
    let expected = read(&lake, &["expected", &version.to_string(), "DE"]);
    assert_ne!(expected, original);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");

    // The cut days' old files stay, with vectors deleting DE rows only; the rewritten day's
    // are gone; the day outside the range is untouched.
    let after = live_files(&lake);
    let deleted: u64 = ["2026-01-01", "2026-01-02"]
        .iter()
        .map(|day| vectors["partitions"][day]["deleted"].as_u64().unwrap())
        .sum();
    let mut cut_rows = 0;
    for (path, (size, _)) in &before {
        if path.contains("2026-01-03") {
            assert!(!after.contains_key(path), "{path} rewritten");
        } else if path.contains("2026-01-04") {
            assert_eq!(
                after.get(path),
                before.get(path),
                "{path} outside the range"
            );
        } else {
            assert_eq!(after[path].0, *size, "{path} stays");
            cut_rows += after[path].1.unwrap_or(0) as u64;
        }
    }
    assert_eq!(cut_rows, deleted, "{after:?}");

    let run_id = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(live_files(&lake), before);
    assert_eq!(read(&lake, &["rows"]), original, "python deltalake");
}

/// `--where` by deletion vectors where the model makes no rows the predicate selects: the
/// partitions it leaves empty are still read, and only their selected rows deleted (a rewrite
/// would carry the others over; here they stay in their files).
#[test]
fn a_where_fix_that_makes_no_rows_deletes_only_the_rows_it_selects() {
    let lake = lake(Store::Local);
    let version = lake.open("t").version().unwrap();
    let before = live_files(&lake);
    let mut args = BACKFILL.to_vec();
    args.extend(["--where", "country = 'DE' AND event_id % 1000 = 3", "-v"]);
    let out = lake.run(&args);
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    // The old rows read when each batch ended are validation's old side.
    assert!(
        stderr(&out).contains("old_captured=true"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        checks(&report).get("carried rows unchanged"),
        Some(&true),
        "{report}"
    );
    let mut expected = read(&lake, &["rows", &version.to_string()]);
    let gone = |r: &Value| {
        r[2] == "DE" && r[0].as_i64().unwrap() % 1000 == 3 && r[3].as_str() <= Some("2026-01-03")
    };
    let removed = expected
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| gone(r))
        .count();
    assert!(removed > 0);
    expected.as_array_mut().unwrap().retain(|r| !gone(r));
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");
    assert_eq!(
        report["validation"]["comparison"]["totals"]["removed"], removed,
        "{report}"
    );
    // Every old file stays; the vectors delete exactly the rows gone; nothing is written.
    let after = live_files(&lake);
    assert_eq!(after.len(), before.len(), "{after:?}");
    let deleted: i64 = after.values().filter_map(|(_, dv)| *dv).sum();
    assert_eq!(deleted as usize, removed, "{after:?}");
}

/// The change feed of each of `lake`'s table's `version` as python `deltalake`'s `load_cdf`
/// reads it, and as an independent diff by key of the versions' rows computes it.
fn feed_and_expected(lake: &PythonLake, version: u64) -> (Value, Value) {
    let version = version.to_string();
    (
        read(lake, &["feed", &version]),
        read(lake, &["feedof", &version]),
    )
}

/// How many rows of each change type `feed` (rows, the change type last) holds, as a report
/// gives them.
fn feed_counts(feed: &Value) -> Value {
    let mut counts =
        serde_json::json!({"insert": 0, "delete": 0, "update_preimage": 0, "update_postimage": 0});
    for row in feed.as_array().unwrap() {
        let kind = row.as_array().unwrap().last().unwrap().as_str().unwrap();
        counts[kind] = (counts[kind].as_u64().unwrap() + 1).into();
    }
    counts
}

/// On a table with the change data feed on too, a fix is still published by deletion vectors,
/// and its commit's feed holds exactly the rows it changes, by key (python `deltalake`'s
/// `load_cdf` against a diff of the versions' rows by DuckDB): the rows its vectors delete and
/// the rows it writes, and every other row of their keys (a row loaded twice), comparing only the
/// rows of the keys staging found it changes. So do its revert's and a resumed `--where` fix's
/// (whose rows outside the predicate stay in their files), which compare every key.
#[test]
fn a_fix_by_vectors_feeds_exactly_the_rows_it_changes() {
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "feed"]);
    lake.declare("t");
    lake.model("fix", KEYED, FIX);
    let before = live_files(&lake);
    let original = read(&lake, &["rows"]);

    let mut args = BACKFILL.to_vec();
    args.push("-v");
    let out = lake.run(&args);
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{vectors}");
    assert_eq!(vectors["files_cut"], 4, "{vectors}");
    let published = report["published_version"].as_u64().unwrap();
    let (feed, expected) = feed_and_expected(&lake, published);
    assert_eq!(feed, expected, "python deltalake's load_cdf");
    // Only the rows of the keys validation found changed were read: exactly the keys of the
    // independent feed, none more.
    let changed: std::collections::BTreeSet<i64> = expected
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[0].as_i64().unwrap())
        .collect();
    let said = format!(
        "the feed takes the changed keys validation found keys={}",
        changed.len()
    );
    assert!(stderr(&out).contains(&said), "{said}\n{}", stderr(&out));
    assert_eq!(report["change_feed"], feed_counts(&feed), "{report}");
    // Event 100005, loaded twice and kept once, is an update of its key: both old rows before,
    // the one new row after.
    let of_100005: Vec<&str> = feed
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row[0] == 100005)
        .map(|row| row[4].as_str().unwrap())
        .collect();
    assert_eq!(
        of_100005,
        ["update_postimage", "update_preimage", "update_preimage"]
    );
    let expected_rows = read(&lake, &["expected", &(published - 1).to_string()]);
    assert_eq!(read(&lake, &["rows"]), expected_rows, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected_rows, "polars");

    let run_id = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(live_files(&lake), before);
    assert_eq!(read(&lake, &["rows"]), original);
    let version = reverted["published_version"].as_u64().unwrap();
    let (feed, expected) = feed_and_expected(&lake, version);
    assert_eq!(feed, expected, "the revert's feed");
    assert!(!feed.as_array().unwrap().is_empty());

    // Resumed after staging, the run's staging is another process's, its validation this
    // one's: the feed takes the keys validation found.
    let mut scoped = BACKFILL.to_vec();
    scoped.extend(["--where", "country = 'DE'", "-v"]);
    let out = crate::support::lakefill_command(lake.path())
        .args(&scoped)
        .env("LAKEFILL_FAILPOINTS", "after-stage")
        .output()
        .unwrap();
    assert!(!out.status.success(), "stopped after staging");
    let out = lake.run(&scoped);
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    assert!(
        stderr(&out).contains("the feed takes the changed keys validation found"),
        "{}",
        stderr(&out)
    );
    assert_eq!(report["deletion_vectors"]["files_cut"], 4, "{report}");
    let published = report["published_version"].as_u64().unwrap();
    let (feed, expected) = feed_and_expected(&lake, published);
    assert_eq!(feed, expected, "the `--where` fix's feed");
    assert!(
        feed.as_array().unwrap().iter().all(|row| row[2] == "DE"),
        "only DE rows change"
    );
    assert_eq!(
        read(&lake, &["rows"]),
        read(&lake, &["expected", &(published - 1).to_string(), "DE"])
    );
}

/// A fix by vectors of a table whose keys are unique: its feed reads, of the partitions it cuts,
/// only the rows its vectors delete (by a row selection of the cut files, their vectors from the
/// first fix subtracted) and the rows it writes, and of the partition it rewrites, every row. The
/// fix changes a cent of some rows (among them rows the first fix changed, whose first versions
/// the old vectors delete), moves some to the next day, deletes some, inserts some, and changes
/// every row of 2026-01-03 (rewritten). The feed is exactly the independent diff by key
/// (python `deltalake`'s `load_cdf` against DuckDB). The first fix, whose table held a row loaded
/// twice (a key with a row that stays), reads both sides whole.
#[test]
fn a_fix_by_vectors_of_unique_keys_feeds_from_the_rows_it_deletes_and_writes_only() {
    const NARROWED: &str = "the feed of a run by vectors reads the rows it deletes and writes";
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "feed"]);
    lake.declare("t");
    lake.model("fix", KEYED, FIX);
    let mut args = BACKFILL.to_vec();
    args.push("-v");
    let out = lake.run(&args);
    let first = json_ok(&out);
    assert_eq!(first["outcome"], "published", "{first}");
    assert!(!stderr(&out).contains(NARROWED), "{}", stderr(&out));
    let (feed, expected) = feed_and_expected(&lake, first["published_version"].as_u64().unwrap());
    assert_eq!(feed, expected, "the first fix's feed");

    lake.model_version(
        "fix",
        "v2",
        KEYED,
        "SELECT event_id,\n\
           CASE WHEN event_id % 100 IN (7, 8) OR event_date = DATE '2026-01-03' THEN amount_cents + 1 ELSE amount_cents END AS amount_cents,\n\
           country,\n\
           CASE WHEN event_id % 1000 = 21 AND event_date = DATE '2026-01-01' THEN DATE '2026-01-02' ELSE event_date END AS event_date\n\
         FROM t WHERE event_date BETWEEN $start AND $end AND event_id % 1000 <> 99\n\
         UNION ALL\n\
         SELECT event_id + 7000000, amount_cents, country, event_date FROM t\n\
         WHERE event_date BETWEEN $start AND $end AND event_id % 1000 = 42",
    );
    args.extend(["--model-version", "v2"]);
    let out = lake.run(&args);
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{vectors}");
    let rewritten: Vec<&String> = vectors["rewritten"].as_object().unwrap().keys().collect();
    assert_eq!(rewritten, ["2026-01-03"], "{vectors}");
    assert!(stderr(&out).contains(NARROWED), "{}", stderr(&out));
    let published = report["published_version"].as_u64().unwrap();
    let (feed, expected) = feed_and_expected(&lake, published);
    assert_eq!(feed, expected, "python deltalake's load_cdf");
    assert_eq!(report["change_feed"], feed_counts(&feed), "{report}");
    let counts = feed_counts(&feed);
    for kind in ["insert", "delete", "update_preimage", "update_postimage"] {
        assert!(counts[kind].as_u64().unwrap() > 0, "{kind}: {counts}");
    }
    // The rows moved to the next day are updates: the old day's row before, the new day's after.
    let moved: Vec<(&str, &str)> = feed
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row[0] == 100021)
        .map(|row| (row[3].as_str().unwrap(), row[4].as_str().unwrap()))
        .collect();
    assert_eq!(
        moved,
        [
            ("2026-01-01", "update_preimage"),
            ("2026-01-02", "update_postimage")
        ]
    );
}

/// A `--where` fix that changes every row it selects, a sixth of each partition: the rows it does
/// not select count in the share that decides a partition's publish (as a rewrite would carry
/// them), so the partitions are cut by vectors, not rewritten, and python `deltalake` reads the
/// fix of exactly the selected rows.
#[test]
fn a_where_fix_of_every_selected_row_cuts_partitions_it_changes_a_sixth_of() {
    let lake = lake(Store::Local);
    lake.model_version(
        "fix",
        "v2",
        KEYED,
        "SELECT event_id, amount_cents + 1 AS amount_cents, country, event_date FROM t \
         WHERE event_date BETWEEN $start AND $end",
    );
    let original = read(&lake, &["rows"]);
    let report = json_ok(&lake.run(&[
        "backfill",
        "fix",
        "--model-version",
        "v2",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
        "--where",
        "country = 'DE' AND event_id % 2 = 0",
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{vectors}");
    assert!(
        vectors["rewritten"]
            .as_object()
            .is_none_or(|r| r.is_empty()),
        "{vectors}"
    );
    let expected: Vec<Value> = original
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let (event, day) = (row[0].as_i64().unwrap(), row[3].as_str().unwrap());
            let mut row = row.clone();
            if day <= "2026-01-02" && row[2] == "DE" && event % 2 == 0 {
                row[1] = (row[1].as_i64().unwrap() + 1).into();
            }
            row
        })
        .collect();
    let mut expected = expected;
    expected.sort_by_key(|r| r.to_string());
    let mut got: Vec<Value> = read(&lake, &["rows"]).as_array().unwrap().clone();
    got.sort_by_key(|r| r.to_string());
    assert_eq!(got, expected, "python deltalake");
}

/// The tests' fix by rows (`range_column = "event_date"`) on a table partitioned by
/// `partition_by` (none: unpartitioned), keyed by `event_id`, as version `version` of `sql`.
fn by_rows_model(lake: &PythonLake, partition_by: Option<&str>, version: &str, sql: &str) {
    let partition_by = partition_by.map_or(String::new(), |c| format!("partition_by = \"{c}\"\n"));
    lake.model_version(
        "fix",
        version,
        &format!(
            "target = \"t\"\n{partition_by}range_column = \"event_date\"\n[sources.t]\n\
             window = \"event_date\"\n[validate]\nkey = [\"event_id\"]"
        ),
        sql,
    );
}

/// Each live file's first and last `event_date`, read from the file.
fn spans(lake: &PythonLake) -> BTreeMap<String, (String, String)> {
    let spans = read(lake, &["spans"]);
    spans
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, days)| {
            let day = |i: usize| days[i].as_str().unwrap().to_string();
            (path.clone(), (day(0), day(1)))
        })
        .collect()
}

/// A fix by rows (`range_column`) on an unpartitioned table whose two files each hold every day
/// is published by deletion vectors: each file has one vector, so the batches its rows reach are
/// joined into one (`--batch-partitions 1` plans one batch of the three days); the rows of
/// 2026-01-04 stay in the files cut, neither deleted nor written again (`rows_carried` 0, and
/// the `carried rows unchanged` check compares them with a scan of the files); python
/// `deltalake` and polars read exactly the fix. `--where` narrows it the same way, and revert
/// puts the files back with the rows they had.
#[test]
fn a_fix_by_rows_cuts_the_files_it_reads_and_keeps_their_rows_outside_the_range() {
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "flat"]);
    lake.declare("t");
    by_rows_model(&lake, None, "v1", FIX);
    let before = live_files(&lake);
    assert_eq!(before.len(), 2, "{before:?}");
    let original = read(&lake, &["rows"]);
    let mut args = BACKFILL.to_vec();
    args.extend(["--batch-partitions", "1"]);
    let mut plan = args.clone();
    plan[0] = "plan";
    let planned = json_ok(&lake.run(&plan));
    assert_eq!(planned["by_vectors"], 0.3, "{planned}");
    let batches: Vec<(&str, &str, bool)> = planned["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["start"].as_str().unwrap(),
                b["end"].as_str().unwrap(),
                b["carry"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        batches,
        [
            ("2026-01-01", "2026-01-03", false),
            ("2026-01-01", "2026-01-03", true)
        ],
        "{planned}"
    );

    let report = json_ok(&lake.run(&args));
    assert_eq!(report["outcome"], "published", "{report}");
    let vectors = &report["deletion_vectors"];
    assert_eq!(vectors["files_cut"], 2, "{vectors}");
    let counts = &vectors["partitions"]["2026-01-01..2026-01-03"];
    // 2,000 rows of 2026-01-03 and 1% of the others change; the rows of 2026-01-04 count in
    // the share (as a rewrite would carry them), so the files are cut, not rewritten.
    assert_eq!(
        counts,
        &serde_json::json!({"deleted": 2045, "added": 2044, "rows": 5999}),
        "{vectors}"
    );
    assert_eq!(report["rows_carried"], 0, "{report}");
    assert_eq!(report["files_written"], 1, "{report}");
    assert_eq!(
        checks(&report).get("carried rows unchanged"),
        Some(&true),
        "{report}"
    );
    let after = live_files(&lake);
    for (path, (size, _)) in &before {
        assert_eq!(after[path].0, *size, "{path} stays");
    }
    // Each file keeps its 1,000 rows of 2026-01-04 and loses the range's that changed.
    let cut: i64 = before.keys().map(|p| after[p].1.unwrap()).sum();
    assert_eq!(cut, 2045, "{after:?}");
    let expected = read(&lake, &["expected", "1"]);
    assert_ne!(expected, original);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");

    let run_id = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(live_files(&lake), before);
    assert_eq!(read(&lake, &["rows"]), original);

    let version = lake.open("t").version().unwrap().to_string();
    where_de_cuts_both_files(&lake, &args, &version);
}

/// A fix by rows of a table partitioned by `country` whose files each hold a day, but for one
/// write's files of 2026-01-02 and -03, which hold both: only those two days' batches are
/// joined. The first day's files are cut (1% changes), the joined batch's files rewritten
/// (every row of 2026-01-03 changes: over the threshold), the files of 2026-01-04 are not in
/// the commit at all. A first attempt stopped before its commit leaves the table as it was, and
/// the run resumes; its change data feed is exactly the rows it changes (python `deltalake`'s
/// `load_cdf` against DuckDB's diff by key), and revert puts every file back.
#[test]
fn a_fix_by_rows_joins_only_the_batches_a_file_reaches() {
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "daily,feed"]);
    lake.declare("t");
    by_rows_model(&lake, Some("country"), "v1", FIX);
    let before = live_files(&lake);
    let spans = spans(&lake);
    assert_eq!(before.len(), 21, "{before:?}");
    let original = read(&lake, &["rows"]);
    let version = lake.open("t").version().unwrap();
    let mut args = BACKFILL.to_vec();
    args.extend(["--batch-partitions", "1"]);
    let mut plan = args.clone();
    plan[0] = "plan";
    let planned = json_ok(&lake.run(&plan));
    let batches: Vec<(&str, &str)> = planned["batches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["carry"].as_bool() != Some(true))
        .map(|b| (b["start"].as_str().unwrap(), b["end"].as_str().unwrap()))
        .collect();
    assert_eq!(
        batches,
        [("2026-01-01", "2026-01-01"), ("2026-01-02", "2026-01-03")],
        "{planned}"
    );

    let out = crate::support::lakefill_command(lake.path())
        .args(&args)
        .env("LAKEFILL_FAILPOINTS", "before-commit")
        .output()
        .unwrap();
    assert!(!out.status.success(), "stopped before the commit");
    assert_eq!(live_files(&lake), before, "nothing published");
    assert_eq!(read(&lake, &["rows"]), original);

    let report = json_ok(&lake.run(&args));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(report["resumed_batches"], 3, "{report}");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"].as_object().unwrap().keys().collect();
    assert_eq!(cut, ["2026-01-01"], "{vectors}");
    let rewritten: Vec<&String> = vectors["rewritten"].as_object().unwrap().keys().collect();
    assert_eq!(rewritten, ["2026-01-02..2026-01-03"], "{vectors}");
    assert_eq!(
        vectors["files_cut"], 6,
        "two writes' files of 2026-01-01: {vectors}"
    );
    let after = live_files(&lake);
    for (path, (first, last)) in &spans {
        let (kept, cut) = (after.get(path), after.get(path).and_then(|f| f.1));
        match (first.as_str(), last.as_str()) {
            ("2026-01-04", _) => assert_eq!(kept, before.get(path), "{path}: outside the range"),
            ("2026-01-01", "2026-01-01") => assert!(cut.is_some(), "{path} cut: {after:?}"),
            _ => assert!(kept.is_none(), "{path} rewritten: {after:?}"),
        }
    }
    let published = report["published_version"].as_u64().unwrap();
    let expected = read(&lake, &["expected", &version.to_string()]);
    assert_eq!(read(&lake, &["rows"]), expected, "python deltalake");
    assert_eq!(read(&lake, &["polars"]), expected, "polars");
    let (feed, of_versions) = feed_and_expected(&lake, published);
    assert_eq!(feed, of_versions, "python deltalake's load_cdf");
    assert_eq!(report["change_feed"], feed_counts(&feed), "{report}");

    let run_id = report["run_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(reverted["outcome"], "reverted", "{reverted}");
    assert_eq!(live_files(&lake), before);
    assert_eq!(read(&lake, &["rows"]), original);
}

/// A cascade whose root is fixed by rows by deletion vectors: its child (the sums of the root by
/// day and country, partitioned by day) reads the root as the root's commit will leave it (the
/// cut files through their new vectors, and the files written), so each level read by python
/// `deltalake` is right: the root the fix, the child DuckDB's sums of the root. Reverting the
/// cascade puts both back.
#[test]
fn a_cascade_reads_a_root_fixed_by_rows_through_its_vectors() {
    let mut lake = PythonLake::new(Store::Local);
    lake.script(&helper(), &["make", &lake.uri("t"), "daily"]);
    lake.script(&helper(), &["sums", &lake.uri("t"), &lake.uri("s")]);
    lake.declare("t");
    lake.declare("s");
    by_rows_model(&lake, Some("country"), "v1", FIX);
    lake.model(
        "sums",
        "target = \"s\"\npartition_by = \"event_date\"\n[sources.t]\nwindow = \"event_date\"\n\
         [validate]\nkey = [\"event_date\", \"country\"]",
        "SELECT event_date, country, CAST(SUM(amount_cents) AS BIGINT) AS cents, \
         CAST(COUNT(*) AS BIGINT) AS n\n\
         FROM t WHERE event_date BETWEEN $start AND $end GROUP BY event_date, country",
    );
    let version = lake.open("t").version().unwrap().to_string();
    let sums = |what: &str| -> Value {
        let uri = if what == "sumsrows" {
            lake.uri("s")
        } else {
            lake.uri("t")
        };
        serde_json::from_str(&lake.script(&helper(), &[what, &uri])).unwrap()
    };
    let (old_rows, old_sums) = (read(&lake, &["rows"]), sums("sumsrows"));
    assert_eq!(old_sums, sums("sumsof"));

    let mut args = BACKFILL.to_vec();
    args.extend(["--batch-partitions", "1", "--cascade"]);
    let report = json_ok(&lake.run(&args));
    assert_eq!(report["outcome"], "published", "{report:#}");
    let root = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["table"] == "t")
        .unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(root["deletion_vectors"]["files_cut"], 6, "{root:#}");
    let expected = read(&lake, &["expected", &version]);
    assert_eq!(read(&lake, &["rows"]), expected, "the root");
    let new_sums = sums("sumsrows");
    assert_ne!(new_sums, old_sums);
    assert_eq!(new_sums, sums("sumsof"), "the child: the sums of the root");

    let id = report["cascade_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", id, "--output-format", "json"]));
    for node in reverted["nodes"].as_array().unwrap() {
        assert_eq!(node["outcome"], "reverted", "{reverted:#}");
    }
    assert_eq!(read(&lake, &["rows"]), old_rows);
    assert_eq!(sums("sumsrows"), old_sums);
}
