//! The Delta features of the tables teams have (issue #35): tables written the way Spark and
//! Databricks write them (tests/cli/features.py), backfilled, reverted and backfilled again, and
//! every result read back by python `deltalake`'s own engine and, independently, from the raw
//! Parquet files and the log by pyarrow; never by lakefill.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{json_ok, run_in, sorted_rows, stderr};

/// `backfill MODEL` over the first two of the table's three days, then `extra`.
fn backfill_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "backfill",
        model,
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-02",
    ];
    args.extend_from_slice(extra);
    args
}

fn helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cli/features.py")
}

/// Runs the helper; returns its stdout as JSON.
fn features(args: &[&str]) -> Value {
    let out = Command::new("python3")
        .arg(helper())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 features.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A project with table `t` (at `lake/t`) of one kind.
pub(crate) struct FeatureTable {
    dir: tempfile::TempDir,
}

impl FeatureTable {
    pub(crate) fn make(kind: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        features(&["make", kind, dir.path().to_str().unwrap()]);
        Self { dir }
    }

    fn table(&self) -> String {
        self.dir.path().join("lake/t").to_str().unwrap().to_string()
    }

    fn flat(&self) -> bool {
        features(&["meta", &self.table()])["partitionColumns"]
            .as_array()
            .unwrap()
            .is_empty()
    }

    /// Rows by python `deltalake`, at `version` or the latest.
    pub(crate) fn rows(&self, version: Option<u64>) -> Value {
        let table = self.table();
        match version {
            Some(version) => features(&["rows", &table, &version.to_string()]),
            None => features(&["rows", &table]),
        }
    }

    /// Rows read from the raw files.
    pub(crate) fn raw(&self) -> Value {
        features(&["raw", &self.table()])
    }

    pub(crate) fn meta(&self) -> Value {
        features(&["meta", &self.table()])
    }

    fn files(&self) -> Value {
        features(&["files", &self.table()])
    }

    /// Writes model `name` replacing `t`'s range with `columns` of its rows.
    pub(crate) fn model(&self, name: &str, columns: &str, extra_header: &str) {
        let layout = if self.flat() {
            "range_column"
        } else {
            "partition_by"
        };
        let dir = self.dir.path().join("sql").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("v1.sql"),
            format!(
                "/*\ntarget = \"t\"\n{layout} = \"event_date\"\n{extra_header}[sources.t]\nwindow = \"event_date\"\n[validate]\nkey = [\"event_id\"]\n*/\n\
                 SELECT {columns} FROM t WHERE event_date BETWEEN $start AND $end\n"
            ),
        )
        .unwrap();
    }

    pub(crate) fn run(&self, args: &[&str]) -> std::process::Output {
        run_in(self.dir.path(), args)
    }

    /// Backfills 2026-01-01 ..= 2026-01-02 with `model`; the report.
    pub(crate) fn backfill(&self, model: &str) -> Value {
        let report = json_ok(&self.run(&backfill_args(model, &["--output-format", "json"])));
        assert_eq!(report["state"], "published", "{report}");
        report
    }
}

/// `rows` with `amount_cents` raised by one on the days of the range.
fn fixed(rows: &Value) -> Value {
    Value::Array(
        rows.as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let mut row = row.clone();
                if row["event_date"].as_str().unwrap() <= "2026-01-02" {
                    row["amount_cents"] = json!(row["amount_cents"].as_i64().unwrap() + 1);
                }
                row
            })
            .collect(),
    )
}

/// Every field of the table's schema (nested too) with its physical name and id.
fn mapped_fields(fields: &Value, out: &mut Vec<(String, i64)>) {
    for field in fields.as_array().unwrap() {
        let metadata = &field["metadata"];
        out.push((
            metadata["delta.columnMapping.physicalName"]
                .as_str()
                .unwrap()
                .to_string(),
            metadata["delta.columnMapping.id"].as_i64().unwrap(),
        ));
        if field["type"]["type"] == "struct" {
            mapped_fields(&field["type"]["fields"], out);
        }
    }
}

/// Every column of a file (nested too) with its field id.
fn file_columns(columns: &Value, out: &mut Vec<(String, i64)>) {
    for column in columns.as_array().unwrap() {
        out.push((
            column["name"].as_str().unwrap().to_string(),
            column["id"].as_i64().unwrap_or(-1),
        ));
        if let Some(fields) = column.get("fields") {
            file_columns(fields, out);
        }
    }
}

/// The actions of commit `version` of `table`, in order.
fn commit_actions(table: &FeatureTable, version: u64) -> Vec<Value> {
    let log = table
        .dir
        .path()
        .join(format!("lake/t/_delta_log/{version:020}.json"));
    std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect()
}

/// Backfills the table of `kind`, checks what every reader sees and what the log holds, reverts
/// the run and backfills again.
fn round_trip(kind: &str) {
    let table = FeatureTable::make(kind);
    let before = table.rows(None);
    let meta = table.meta();
    let mapped = meta["configuration"]
        .get("delta.columnMapping.mode")
        .is_some();
    let writer_features: Vec<&str> = meta["protocol"]["writerFeatures"]
        .as_array()
        .map(|f| f.iter().map(|v| v.as_str().unwrap()).collect())
        .unwrap_or_default();
    // The versions whose commits the log still has (a checkpoint may stand for the older ones).
    let retained: Vec<u64> = commit_versions(&table)
        .into_iter()
        .filter(|v| *v > 0)
        .collect();
    let history: Vec<Value> = retained.iter().map(|v| table.rows(Some(*v))).collect();
    table.model("fix", &fix_columns(&meta), "");
    let report = table.backfill("fix");
    let published = report["published_version"].as_u64().unwrap();
    let expected = fixed(&before);
    assert_eq!(table.rows(None), expected, "{kind}: python deltalake");
    assert_eq!(table.raw(), expected, "{kind}: the raw files");
    // polars 2.1 reads tables whose reader features are among these (not column mapping, not
    // v2 checkpoints).
    let polars_reads = meta["protocol"]["readerFeatures"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|f| ["deletionVectors", "timestampNtz"].contains(&f.as_str().unwrap()));
    if polars_reads && !mapped {
        assert_eq!(
            features(&["polars", &table.table()]),
            expected,
            "{kind}: polars"
        );
    }
    let after = table.meta();
    for part in ["protocol", "configuration", "schema", "partitionColumns"] {
        assert_eq!(after[part], meta[part], "{kind}: {part}");
    }
    assert_eq!(
        after["domains"]["delta.clustering"], meta["domains"]["delta.clustering"],
        "{kind}: the clustering columns are kept"
    );
    let actions = commit_actions(&table, published);
    let adds: Vec<&Value> = actions.iter().filter_map(|a| a.get("add")).collect();
    let removes: Vec<&Value> = actions.iter().filter_map(|a| a.get("remove")).collect();
    assert!(
        !adds.is_empty() && !removes.is_empty(),
        "{kind}: {actions:?}"
    );

    if mapped {
        check_mapped_files(kind, &table, &meta, &adds);
    }
    if writer_features.contains(&"rowTracking") {
        check_row_ids(kind, &meta, &after, published, &adds, &removes);
    }
    if writer_features.contains(&"inCommitTimestamp") {
        check_in_commit_timestamp(kind, &table, published, &actions);
    }
    // History reads as it did.
    for (v, rows) in retained.iter().zip(&history) {
        assert_eq!(&table.rows(Some(*v)), rows, "{kind}: version {v}");
    }

    let run_id = report["run_id"].as_str().unwrap().to_string();
    let revert = json_ok(&table.run(&["revert", &run_id, "--output-format", "json"]));
    assert_eq!(revert["state"], "published", "{kind}: {revert}");
    assert_eq!(table.rows(None), before, "{kind}: reverted");
    assert_eq!(table.raw(), before, "{kind}: reverted, raw");
    if writer_features.contains(&"rowTracking") {
        // The files put back keep their row ids; the ones removed repeat theirs.
        let reverted = revert["published_version"].as_u64().unwrap();
        for action in commit_actions(&table, reverted) {
            for kind_of in ["add", "remove"] {
                if let Some(file) = action.get(kind_of) {
                    assert!(file["baseRowId"].is_i64(), "{kind}: {file}");
                    assert!(file["defaultRowCommitVersion"].is_i64(), "{kind}: {file}");
                }
            }
        }
    }
    let again = table.backfill("fix");
    assert_eq!(table.rows(None), expected, "{kind}: again");
    assert_eq!(table.raw(), expected, "{kind}: again, raw");
    assert_eq!(table.meta()["schema"], meta["schema"], "{kind}");
    if writer_features.contains(&"rowTracking") {
        // Fresh ids again: above the mark the first backfill left.
        let first_mark = mark(&after);
        let again = commit_actions(&table, again["published_version"].as_u64().unwrap());
        for add in again.iter().filter_map(|a| a.get("add")) {
            assert!(
                add["baseRowId"].as_i64().unwrap() > first_mark,
                "{kind}: {add}"
            );
        }
    }
}

/// The versions whose commit files the log of `table` has.
fn commit_versions(table: &FeatureTable) -> Vec<u64> {
    let mut versions: Vec<u64> = std::fs::read_dir(table.dir.path().join("lake/t/_delta_log"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_suffix(".json")
                .and_then(|v| v.parse::<u64>().ok())
        })
        .collect();
    versions.sort_unstable();
    versions
}

/// The columns of a fix of `meta`'s table: every column, `amount_cents` raised by one.
fn fix_columns(meta: &Value) -> String {
    meta["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| match f["name"].as_str().unwrap() {
            "amount_cents" => "amount_cents + 1 AS amount_cents".to_string(),
            name => name.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Row tracking's high-water mark in `meta` (-1 when none).
fn mark(meta: &Value) -> i64 {
    meta["domains"]["delta.rowTracking"]["rowIdHighWaterMark"]
        .as_i64()
        .unwrap_or(-1)
}

/// Every live file names its columns as the schema maps them (the files the backfill wrote: all
/// of them, nested too); the log keys statistics and partition values by physical name.
fn check_mapped_files(kind: &str, table: &FeatureTable, meta: &Value, adds: &[&Value]) {
    let mut schema = Vec::new();
    mapped_fields(&meta["schema"]["fields"], &mut schema);
    let partition: Vec<(String, i64)> = meta["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            meta["partitionColumns"]
                .as_array()
                .unwrap()
                .contains(&f["name"])
        })
        .map(|f| {
            (
                f["metadata"]["delta.columnMapping.physicalName"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                f["metadata"]["delta.columnMapping.id"].as_i64().unwrap(),
            )
        })
        .collect();
    for (path, columns) in table.files().as_object().unwrap() {
        let mut found = Vec::new();
        file_columns(columns, &mut found);
        if adds.iter().any(|a| a["path"] == *path) {
            let expected: Vec<_> = schema
                .iter()
                .filter(|c| !partition.contains(c))
                .cloned()
                .collect();
            assert_eq!(found, expected, "{kind}: {path}");
        }
    }
    for add in adds {
        let stats: Value = serde_json::from_str(add["stats"].as_str().unwrap()).unwrap();
        for key in stats["minValues"].as_object().unwrap().keys() {
            assert!(
                schema.iter().any(|(physical, _)| physical == key),
                "{kind}: statistics keyed by `{key}`"
            );
        }
        for key in add["partitionValues"].as_object().unwrap().keys() {
            assert!(
                partition.iter().any(|(physical, _)| physical == key),
                "{kind}: partition value keyed by `{key}`"
            );
        }
    }
}

/// Row tracking: every file added has fresh row ids above the old high-water mark, none shared,
/// and the commit's version; the mark advances to the last of them in the same commit; every
/// file removed repeats the ids of its `add`.
fn check_row_ids(
    kind: &str,
    before: &Value,
    after: &Value,
    published: u64,
    adds: &[&Value],
    removes: &[&Value],
) {
    let old_mark = mark(before);
    let mut ranges: Vec<(i64, i64)> = adds
        .iter()
        .map(|add| {
            let stats: Value = serde_json::from_str(add["stats"].as_str().unwrap()).unwrap();
            let base = add["baseRowId"].as_i64().unwrap();
            assert!(base > old_mark, "{kind}: {add}");
            assert_eq!(
                add["defaultRowCommitVersion"],
                json!(published),
                "{kind}: {add}"
            );
            (base, base + stats["numRecords"].as_i64().unwrap() - 1)
        })
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "{kind}: overlapping row ids {ranges:?}"
        );
    }
    assert_eq!(
        mark(after),
        ranges.last().unwrap().1,
        "{kind}: the high-water mark"
    );
    // The `add` each removed file had at the read version.
    let earlier = before["adds"].as_object().unwrap();
    for remove in removes {
        let add = &earlier[remove["path"].as_str().unwrap()];
        assert_eq!(remove["baseRowId"], add["baseRowId"], "{kind}: {remove}");
        assert_eq!(
            remove["defaultRowCommitVersion"], add["defaultRowCommitVersion"],
            "{kind}: {remove}"
        );
        assert_eq!(
            remove["deletionVector"], add["deletionVector"],
            "{kind}: {remove}"
        );
    }
}

/// In-commit timestamps: `commitInfo` comes first with a timestamp after the previous commit's;
/// `history` shows the commits' in-commit timestamps, and reading by time finds versions by them.
fn check_in_commit_timestamp(kind: &str, table: &FeatureTable, published: u64, actions: &[Value]) {
    let stamp = actions[0]["commitInfo"]["inCommitTimestamp"]
        .as_i64()
        .unwrap_or_else(|| panic!("{kind}: commitInfo is not first: {actions:?}"));
    let previous = commit_actions(table, published - 1)[0]["commitInfo"]["inCommitTimestamp"]
        .as_i64()
        .unwrap();
    assert!(stamp > previous, "{kind}: {stamp} after {previous}");
    let history = json_ok(&table.run(&["history", "t", "--output-format", "json"]));
    let times: Vec<(u64, String)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["version"].as_u64().unwrap(),
                e["timestamp"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // The table's own commits carry 2026-01-01T00:0N:00 (version N), far from their files' times.
    assert!(
        times.contains(&(2, "2026-01-01T00:02:00Z".to_string()))
            || times.contains(&(2, "2026-01-01T00:02:00.000Z".to_string())),
        "{kind}: {times:?}"
    );
    if !commit_versions(table).contains(&1) {
        return;
    }
    let at = json_ok(&table.run(&[
        "sql",
        "SELECT CAST(count(*) AS VARCHAR) AS n FROM \"t@2026-01-01T00:01:30Z\"",
        "--output-format",
        "json",
    ]));
    assert_eq!(at["rows"][0][0], "12", "{kind}: {at}");
}

/// Column mapping, modes `name` and `id`, partitioned and by rows, on a table whose history
/// renamed one column and dropped another: the backfill's files name every column (nested ones
/// too) by its physical name and id, the log keys partition values and statistics by physical
/// name, readers see the fix, the table's protocol, configuration and schema are unchanged, and
/// older versions (before the rename) read as they did. A revert restores the rows; a second
/// backfill fixes them again.
#[test]
fn column_mapped_tables_are_backfilled_in_their_physical_names() {
    for kind in ["name", "id", "name+flat", "id+flat"] {
        round_trip(kind);
    }
}

/// Tables as a Databricks workspace creates them: deletion vectors, row tracking, in-commit
/// timestamps, liquid clustering and column mapping together; and the same without column
/// mapping (which polars also reads), partitioned and by rows. A file a deletion vector cut,
/// straddling the range, has its live rows carried over.
#[test]
fn databricks_tables_are_backfilled_as_their_protocol_asks() {
    for kind in [
        "name+dv+rt+ict+cluster",
        "none+dv+rt+ict",
        "none+dv+rt+ict+flat",
        "none+rt",
        "none+ict+flat",
    ] {
        round_trip(kind);
    }
}

/// The other features a written table may list: `timestampNtz` (a TIMESTAMP_NTZ column),
/// `allowColumnDefaults` (a column with a default), `checkpointProtection`, and `v2Checkpoint`
/// with the older commits cleaned up after a checkpoint, which then holds row tracking's
/// high-water mark (and, with column mapping and a deletion vector, the files' row ids).
#[test]
fn other_writer_features_take_a_backfill() {
    for kind in [
        "none+ntz+defaults+cpp",
        "none+rt+ict+v2cp",
        "name+rt+checkpoint+dv",
    ] {
        round_trip(kind);
    }
}

/// A column a fix adds to a column-mapped table gets the next id, a physical name of its own and
/// the advanced `delta.columnMapping.maxColumnId`, in its schema and in the files.
#[test]
fn a_column_added_to_a_column_mapped_table_is_mapped() {
    for kind in ["name", "id+flat"] {
        let table = FeatureTable::make(kind);
        let before = table.rows(None);
        let meta = table.meta();
        let max: i64 = meta["configuration"]["delta.columnMapping.maxColumnId"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        table.model(
            "tip",
            "event_id, amount_cents, point, event_date, amount_cents / 10 AS tip_cents",
            "schema = \"add-columns\"\n",
        );
        table.backfill("tip");
        let after = table.meta();
        assert_eq!(
            after["configuration"]["delta.columnMapping.maxColumnId"],
            json!((max + 1).to_string()),
            "{kind}: {after}"
        );
        let fields = after["schema"]["fields"].as_array().unwrap();
        let tip = fields.last().unwrap();
        assert_eq!(tip["name"], "tip_cents", "{kind}");
        assert_eq!(tip["metadata"]["delta.columnMapping.id"], json!(max + 1));
        let physical = tip["metadata"]["delta.columnMapping.physicalName"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(physical.starts_with("col-"), "{kind}: {physical}");
        let expected: Vec<Value> = before
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let mut row = row.clone();
                row["tip_cents"] = if row["event_date"].as_str().unwrap() <= "2026-01-02" {
                    json!(row["amount_cents"].as_i64().unwrap() / 10)
                } else {
                    Value::Null
                };
                row
            })
            .collect();
        assert_eq!(table.rows(None), json!(expected), "{kind}");
        assert_eq!(table.raw(), json!(expected), "{kind}: raw");
        let files = table.files();
        let with_tip = files
            .as_object()
            .unwrap()
            .values()
            .filter(|columns| {
                columns
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["name"] == physical.as_str() && c["id"] == json!(max + 1))
            })
            .count();
        assert!(with_tip > 0, "{kind}: {files}");
    }
}

/// The rows of table `t` (at `dir/t`, made by python `deltalake`) before a fix of its first two
/// days, which this runs with a project and model of its own; and the table's path.
fn backfill_python_made(dir: &Path) -> (String, Value) {
    std::fs::write(dir.join("lakefill.toml"), "[tables.t]\nuri = \"t\"\n").unwrap();
    let model = dir.join("sql/fix");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("v1.sql"),
        "/*\ntarget = \"t\"\npartition_by = \"event_date\"\n[sources.t]\nwindow = \"event_date\"\n*/\n\
         SELECT event_id, amount_cents + 1 AS amount_cents, event_date FROM t WHERE event_date BETWEEN $start AND $end\n",
    )
    .unwrap();
    let path = dir.join("t").to_str().unwrap().to_string();
    let before = features(&["rows", &path]);
    let out = run_in(dir, &backfill_args("fix", &[]));
    assert!(out.status.success(), "{}", stderr(&out));
    (path, before)
}

/// A table python `deltalake` made with column mapping (its own physical names and random file
/// prefixes) takes a fix like any other.
#[test]
fn a_column_mapped_table_python_deltalake_made_is_backfilled() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    crate::protocol::python(&["create", "column_mapping", table.to_str().unwrap()]);
    let (path, before) = backfill_python_made(dir.path());
    let path = path.as_str();
    assert_eq!(features(&["rows", path]), fixed(&before));
    assert_eq!(features(&["raw", path]), fixed(&before));
}

/// Another writer commits between staging and publishing a run on a table lakefill commits to
/// itself (row tracking, in-commit timestamps): outside the range, the run publishes after it, its
/// row ids above the other writer's and its timestamp after the other commit's; inside the range,
/// the publish is a conflict (exit 4) and the table is unchanged. By rows (a clustered table),
/// "outside" is what the added file's statistics prove, as delta-rs's conflict checker decides.
#[test]
fn concurrent_writers_of_a_table_lakefill_commits_itself() {
    for kind in ["none+rt+ict", "name+rt+ict+cluster"] {
        let staged = |table: &FeatureTable| -> String {
            let report = json_ok(&table.run(&backfill_args(
                "fix",
                &["--stage-only", "--output-format", "json"],
            )));
            assert_eq!(report["state"], "validated", "{kind}: {report}");
            report["run_id"].as_str().unwrap().to_string()
        };
        let inside = FeatureTable::make(kind);
        inside.model(
            "fix",
            "event_id, amount_cents + 1 AS amount_cents, point, event_date",
            "",
        );
        let run_id = staged(&inside);
        features(&["append", &inside.table(), "2026-01-02"]);
        let rows = inside.rows(None);
        let versions = std::fs::read_dir(inside.dir.path().join("lake/t/_delta_log"))
            .unwrap()
            .count();
        let out = inside.run(&["publish", &run_id]);
        assert_eq!(out.status.code(), Some(4), "{kind}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("conflict") || stderr(&out).contains("another writer"),
            "{kind}: {}",
            stderr(&out)
        );
        assert_eq!(inside.rows(None), rows, "{kind}: unchanged");
        assert_eq!(
            std::fs::read_dir(inside.dir.path().join("lake/t/_delta_log"))
                .unwrap()
                .count(),
            versions,
            "{kind}: no commit"
        );
        let outside = FeatureTable::make(kind);
        let before = outside.rows(None);
        outside.model(
            "fix",
            "event_id, amount_cents + 1 AS amount_cents, point, event_date",
            "",
        );
        let run_id = staged(&outside);
        features(&["append", &outside.table(), "2026-01-03"]);
        let appended = outside.meta();
        let report = json_ok(&outside.run(&["publish", &run_id, "--output-format", "json"]));
        assert_eq!(report["state"], "published", "{kind}: {report}");
        let published = report["published_version"].as_u64().unwrap();
        let mut expected = fixed(&before).as_array().unwrap().clone();
        expected.push(json!({"event_id": 900, "amount_cents": 9000, "point": {"x": 1800, "tag": "p900"}, "event_date": "2026-01-03"}));
        assert_eq!(outside.rows(None), json!(expected), "{kind}");
        assert_eq!(outside.raw(), json!(expected), "{kind}: raw");
        let actions = commit_actions(&outside, published);
        let other = commit_actions(&outside, published - 1);
        assert!(
            actions[0]["commitInfo"]["inCommitTimestamp"].as_i64()
                > other[0]["commitInfo"]["inCommitTimestamp"].as_i64(),
            "{kind}: {actions:?}"
        );
        for add in actions.iter().filter_map(|a| a.get("add")) {
            assert!(
                add["baseRowId"].as_i64().unwrap() > mark(&appended),
                "{kind}: {add}"
            );
            assert_eq!(add["defaultRowCommitVersion"], json!(published), "{kind}");
        }
        // Another writer appends outside the range again; a revert of the run puts back what
        // it replaced and keeps both appends.
        features(&["append", &outside.table(), "2026-01-03"]);
        let revert = json_ok(&outside.run(&["revert", &run_id, "--output-format", "json"]));
        assert_eq!(revert["state"], "published", "{kind}: {revert}");
        let mut reverted = before.as_array().unwrap().clone();
        for _ in 0..2 {
            reverted.push(json!({"event_id": 900, "amount_cents": 9000, "point": {"x": 1800, "tag": "p900"}, "event_date": "2026-01-03"}));
        }
        assert_eq!(outside.rows(None), json!(reverted), "{kind}: reverted");
    }
}

/// The identity column `row_id` of `table`'s schema, from the log.
fn identity_field(table: &FeatureTable) -> Value {
    table.meta()["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "row_id")
        .cloned()
        .unwrap()
}

/// Identity columns: a model that passes `row_id` through keeps every value, and the mark stays;
/// one that leaves it out gets new values beyond the mark, one step apart within a batch and
/// never shared, and the mark advances to the highest; one that writes its own values into a
/// GENERATED ALWAYS column fails validation by the column's name, cannot be forced, and
/// publishes nothing; a GENERATED BY DEFAULT column takes them, and the mark follows.
#[test]
fn identity_columns_keep_their_values_or_get_new_ones_beyond_the_mark() {
    for kind in ["none+identity", "name+identity+flat"] {
        let table = FeatureTable::make(kind);
        let before = table.rows(None);
        table.model(
            "keep",
            "row_id, event_id, amount_cents + 1 AS amount_cents, point, event_date",
            "",
        );
        table.backfill("keep");
        assert_eq!(table.rows(None), fixed(&before), "{kind}: values kept");
        assert_eq!(table.raw(), fixed(&before), "{kind}: raw");
        assert_eq!(
            identity_field(&table)["metadata"]["delta.identity.highWaterMark"],
            json!(12),
            "{kind}"
        );

        table.model("fresh", "event_id, amount_cents, point, event_date", "");
        let rows_before = table.rows(None);
        table.backfill("fresh");
        let rows = table.rows(None);
        assert_eq!(table.raw(), rows, "{kind}: raw");
        let mut fresh = Vec::new();
        for (row, old) in rows
            .as_array()
            .unwrap()
            .iter()
            .zip(rows_before.as_array().unwrap())
        {
            let id = row["row_id"].as_i64().unwrap();
            if row["event_date"].as_str().unwrap() <= "2026-01-02" {
                assert!(id > 12, "{kind}: {row}");
                fresh.push(id);
            } else {
                assert_eq!(row["row_id"], old["row_id"], "{kind}: outside the range");
            }
        }
        let distinct: std::collections::BTreeSet<i64> = fresh.iter().copied().collect();
        assert_eq!(distinct.len(), fresh.len(), "{kind}: {fresh:?}");
        assert_eq!(
            identity_field(&table)["metadata"]["delta.identity.highWaterMark"],
            json!(distinct.last().copied().unwrap()),
            "{kind}: the mark is the highest value"
        );

        table.model(
            "own",
            "event_id + 1000 AS row_id, event_id, amount_cents, point, event_date",
            "",
        );
        let rows = table.rows(None);
        let out = table.run(&backfill_args(
            "own",
            &["--force-publish", "--reason", "try"],
        ));
        let err = stderr(&out);
        assert_ne!(out.status.code(), Some(0), "{kind}: {err}");
        assert!(err.contains("identity column row_id"), "{kind}: {err}");
        assert_eq!(table.rows(None), rows, "{kind}: unchanged");
    }

    let table = FeatureTable::make("none+identity_default");
    table.model(
        "own",
        "event_id + 1000 AS row_id, event_id, amount_cents, point, event_date",
        "",
    );
    table.backfill("own");
    for row in table.rows(None).as_array().unwrap() {
        if row["event_date"].as_str().unwrap() <= "2026-01-02" {
            assert_eq!(
                row["row_id"].as_i64(),
                row["event_id"].as_i64().map(|e| e + 1000),
                "{row}"
            );
        }
    }
    assert_eq!(
        identity_field(&table)["metadata"]["delta.identity.highWaterMark"],
        json!(1203),
        "BY DEFAULT: the mark follows the values written"
    );
}

/// python `deltalake` lists `variantType` (and `deletionVectors`) on a table it creates with
/// deletion vectors, though no column is a VARIANT: such a table takes a backfill.
#[test]
fn a_table_listing_variant_type_without_a_variant_column_is_backfilled() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let script = format!(
        "import datetime, os, sys\nimport pyarrow as pa\nfrom deltalake import write_deltalake\n\
         days = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(3)]\n\
         t = pa.table({{'event_id': pa.array([100 * (d + 1) + i for d in range(3) for i in range(4)], pa.int64()),\n\
         'amount_cents': pa.array([1000 + 10 * d + i for d in range(3) for i in range(4)], pa.int64()),\n\
         'event_date': pa.array([days[d] for d in range(3) for i in range(4)], pa.date32())}})\n\
         write_deltalake('{}', t, partition_by=['event_date'], configuration={{'delta.enableDeletionVectors': 'true'}})\n\
         sys.stdout.flush(); os._exit(0)\n",
        table.display()
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
    let protocol =
        std::fs::read_to_string(table.join("_delta_log/00000000000000000000.json")).unwrap();
    assert!(protocol.contains("\"variantType\""), "{protocol}");
    let (path, before) = backfill_python_made(dir.path());
    let path = path.as_str();
    assert_eq!(features(&["rows", path]), fixed(&before));
    assert_eq!(features(&["polars", path]), fixed(&before));
}

/// A commit lakefill writes itself whose response is lost is found in the log by its
/// transaction: the run is published once, and says so.
#[test]
fn a_lost_response_of_lakefills_own_commit_is_reported_as_published() {
    let table = FeatureTable::make("name+rt+ict");
    let before = table.rows(None);
    let versions = commit_versions(&table);
    table.model("fix", &fix_columns(&table.meta()), "");
    let out = crate::support::lakefill_command(table.dir.path())
        .args(backfill_args("fix", &["--output-format", "json"]))
        .env("LAKEFILL_FAILPOINTS", "lost-commit-response=error")
        .output()
        .unwrap();
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(
        commit_versions(&table).len(),
        versions.len() + 1,
        "one commit"
    );
    assert_eq!(table.rows(None), fixed(&before));
}

/// `diff --run` of a staged run on a column-mapped table reads the staged files by their
/// logical names: the changed rows by key, nested column included.
#[test]
fn diff_of_a_staged_run_on_a_column_mapped_table() {
    let table = FeatureTable::make("id");
    table.model("fix", &fix_columns(&table.meta()), "");
    let staged = json_ok(&table.run(&backfill_args(
        "fix",
        &["--stage-only", "--output-format", "json"],
    )));
    let run_id = staged["run_id"].as_str().unwrap();
    let latest = *commit_versions(&table).last().unwrap();
    let diff = json_ok(&table.run(&[
        "diff",
        "t",
        "--from-version",
        &latest.to_string(),
        "--run",
        run_id,
        "--key",
        "event_id",
        "--output-format",
        "json",
    ]));
    let text = diff.to_string();
    assert!(
        text.contains("\"changed\":8") || text.contains("\"changed\": 8"),
        "{diff}"
    );
}

/// Adjustments on a column-mapped table with a nested column: the lineage columns join the
/// schema with the next ids and physical names, and every key's rows net to the fix.
#[test]
fn adjustments_on_a_column_mapped_table_net_to_the_fix() {
    let table = FeatureTable::make("name");
    let before = table.rows(None);
    let meta = table.meta();
    table.model(
        "fix",
        &fix_columns(&meta),
        "schema = \"add-columns\"\npublish = \"adjustments\"\n",
    );
    // Adjustments negate measures: `amount_cents` joins `model`'s `[validate]`.
    let path = table.dir.path().join("sql/fix/v1.sql");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "key = [\"event_id\"]",
        "key = [\"event_id\"]\nmeasures = [\"amount_cents\"]",
    );
    std::fs::write(&path, text).unwrap();
    table.backfill("fix");
    let rows = table.rows(None);
    assert_eq!(
        sorted_rows(table.raw()),
        sorted_rows(rows.clone()),
        "raw and python agree"
    );
    let mut net: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
    for row in rows.as_array().unwrap() {
        *net.entry(row["event_id"].as_i64().unwrap()).or_default() +=
            row["amount_cents"].as_i64().unwrap();
    }
    for row in fixed(&before).as_array().unwrap() {
        assert_eq!(
            net[&row["event_id"].as_i64().unwrap()],
            row["amount_cents"].as_i64().unwrap(),
            "{row}"
        );
    }
    let after = table.meta();
    let max: i64 = meta["configuration"]["delta.columnMapping.maxColumnId"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        after["configuration"]["delta.columnMapping.maxColumnId"],
        json!((max + 3).to_string())
    );
    let ids: Vec<i64> = after["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"].as_str().unwrap().starts_with("_lakefill_"))
        .map(|f| f["metadata"]["delta.columnMapping.id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![max + 1, max + 2, max + 3]);
}

/// Backfills with lakefill's own commit held at `own-commit-write` (complete for its version,
/// not yet written) while another writer appends on `day` and takes that version; returns the
/// backfill's exit code and its report (when it printed one).
fn race_own_commit(table: &FeatureTable, day: &str) -> (Option<i32>, Value) {
    use std::io::BufRead as _;
    let mut child = crate::support::lakefill_command(table.dir.path())
        .args(backfill_args("fix", &["--output-format", "json"]))
        .env("LAKEFILL_FAILPOINTS", "own-commit-write=sleep-3000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    let mut appended = false;
    for line in stderr.lines() {
        let line = line.unwrap();
        if !appended && line.contains("failpoint hit: sleeping") {
            features(&["append", &table.table(), day]);
            appended = true;
        }
        seen.push(line);
    }
    let out = child.wait_with_output().unwrap();
    assert!(appended, "the commit never reached the point: {seen:?}");
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), report)
}

/// Another writer takes the very version lakefill's own commit was about to write: lakefill
/// reads it, and commits on the next version with row ids and a timestamp after the other
/// writer's when it appended outside the range; inside the range, the publish is a conflict
/// (exit 4) and nothing of the run is written.
#[test]
fn a_writer_that_wins_the_race_for_the_version_is_read_before_lakefill_commits() {
    for kind in ["none+rt+ict", "name+rt+ict+cluster"] {
        let outside = FeatureTable::make(kind);
        let before = outside.rows(None);
        let read = *commit_versions(&outside).last().unwrap();
        outside.model("fix", &fix_columns(&outside.meta()), "");
        let (code, report) = race_own_commit(&outside, "2026-01-03");
        assert_eq!(code, Some(0), "{kind}: {report}");
        assert_eq!(
            report["published_version"],
            json!(read + 2),
            "{kind}: {report}"
        );
        let mut expected = fixed(&before).as_array().unwrap().clone();
        expected.push(json!({"event_id": 900, "amount_cents": 9000, "point": {"x": 1800, "tag": "p900"}, "event_date": "2026-01-03"}));
        assert_eq!(outside.rows(None), json!(expected), "{kind}");
        let ours = commit_actions(&outside, read + 2);
        let theirs = commit_actions(&outside, read + 1);
        assert!(
            ours[0]["commitInfo"]["inCommitTimestamp"].as_i64()
                > theirs[0]["commitInfo"]["inCommitTimestamp"].as_i64(),
            "{kind}"
        );
        let their_mark = theirs
            .iter()
            .find_map(|a| a.get("add"))
            .and_then(|a| a["baseRowId"].as_i64())
            .unwrap();
        for add in ours.iter().filter_map(|a| a.get("add")) {
            assert!(
                add["baseRowId"].as_i64().unwrap() > their_mark,
                "{kind}: {add}"
            );
            assert_eq!(add["defaultRowCommitVersion"], json!(read + 2), "{kind}");
        }

        let inside = FeatureTable::make(kind);
        inside.model("fix", &fix_columns(&inside.meta()), "");
        let (code, report) = race_own_commit(&inside, "2026-01-02");
        assert_eq!(code, Some(4), "{kind}: {report}");
        assert_eq!(
            commit_versions(&inside).last(),
            Some(&(read + 1)),
            "{kind}: only the other writer's commit"
        );
    }
}

/// A column-mapped table (mode name, then mode id) that takes deletion vectors (as Databricks
/// makes them) takes a small fix by vectors: its old files, whose columns have physical names
/// (and field ids; one renamed and one dropped since they were written, a struct's fields too),
/// are read by those names, the rows the fix changes are deleted in place, and python
/// `deltalake` reads the fix. The commit keys the cut files' partition values and statistics by
/// physical name; a revert gives back the rows before.
#[test]
fn column_mapped_tables_take_a_small_fix_by_deletion_vectors() {
    for kind in ["name+dv", "id+dv"] {
        small_fix_by_vectors(kind);
    }
}

/// Tables whose commits lakefill writes itself (row tracking, in-commit timestamps; with column
/// mapping by field id too) take a small fix by deletion vectors as the tables delta-rs commits
/// to do: the files cut keep their row ids and commit version (the rows that stay keep their
/// stable ids, as row tracking asks), the rows written get fresh ids above the high-water mark,
/// python `deltalake` and the raw files with their vectors read the fix, and `revert` puts the
/// files back as they were.
#[test]
fn tables_lakefill_commits_itself_take_a_small_fix_by_deletion_vectors() {
    for kind in ["none+dv+rt+ict", "id+dv+rt"] {
        small_fix_by_vectors(kind);
    }
}

fn small_fix_by_vectors(kind: &str) {
    let table = FeatureTable::make(kind);
    let before = table.rows(None);
    let meta = table.meta();
    // One row of each day's four changes: a quarter of the partition's rows, cut.
    let columns = fix_columns(&meta).replace(
        "amount_cents + 1 AS amount_cents",
        "CASE WHEN event_id % 4 = 1 THEN amount_cents + 1 ELSE amount_cents END AS amount_cents",
    );
    table.model("fix", &columns, "");
    let report = table.backfill("fix");
    let vectors = &report["deletion_vectors"];
    let cut: Vec<&String> = vectors["partitions"]
        .as_object()
        .unwrap_or_else(|| panic!("{kind} not by vectors: {report:#}"))
        .keys()
        .collect();
    assert_eq!(cut, ["2026-01-01", "2026-01-02"], "{kind}: {vectors}");
    let expected = Value::Array(
        before
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let mut row = row.clone();
                if row["event_date"].as_str().unwrap() <= "2026-01-02"
                    && row["event_id"].as_i64().unwrap() % 4 == 1
                {
                    row["amount_cents"] = json!(row["amount_cents"].as_i64().unwrap() + 1);
                }
                row
            })
            .collect(),
    );
    assert_ne!(expected, before);
    assert_eq!(table.rows(None), expected, "{kind}: python deltalake");
    assert_eq!(table.raw(), expected, "{kind}: the raw files and vectors");
    let published = report["published_version"].as_u64().unwrap();
    let actions = commit_actions(&table, published);
    let (cut, written): (Vec<&Value>, Vec<&Value>) = actions
        .iter()
        .filter_map(|a| a.get("add"))
        .partition(|a| a["deletionVector"].is_object());
    assert_eq!((cut.len(), written.len()), (2, 2), "{kind}: {actions:?}");
    if !kind.starts_with("none") {
        check_mapped_files(kind, &table, &meta, &written);
    }
    let earlier = meta["adds"].as_object().unwrap();
    if kind.contains("rt") {
        // The cut files' rows keep their ids and commit version; the two rows written, one a
        // day, get fresh ones, and the mark moves past them.
        for add in &cut {
            let old = &earlier[add["path"].as_str().unwrap()];
            for field in ["baseRowId", "defaultRowCommitVersion"] {
                assert_eq!(add[field], old[field], "{kind}: {add}");
            }
        }
        for add in &written {
            assert!(
                add["baseRowId"].as_i64().unwrap() > mark(&meta),
                "{kind}: {add}"
            );
            assert_eq!(add["defaultRowCommitVersion"], json!(published), "{kind}");
        }
        assert_eq!(mark(&table.meta()), mark(&meta) + 2, "{kind}");
    }
    if kind.contains("ict") {
        check_in_commit_timestamp(kind, &table, published, &actions);
    }
    // A cut file keeps its partition values as the log had them (by physical name).
    for add in cut {
        let remove = actions
            .iter()
            .filter_map(|a| a.get("remove"))
            .find(|r| r["path"] == add["path"])
            .unwrap_or_else(|| panic!("the cut file's remove: {actions:?}"));
        assert_eq!(add["partitionValues"], remove["partitionValues"], "{add}");
    }
    let after = table.meta();
    for part in ["protocol", "configuration", "schema", "partitionColumns"] {
        assert_eq!(after[part], meta[part], "{kind}: {part}");
    }

    let run_id = report["run_id"].as_str().unwrap();
    let revert = json_ok(&table.run(&["revert", run_id, "--output-format", "json"]));
    assert_eq!(revert["state"], "published", "{revert}");
    assert_eq!(table.rows(None), before, "{kind}: reverted");
    assert_eq!(table.raw(), before, "{kind}: reverted, raw");
    // The files as they were: their row ids and vectors too.
    let reverted = table.meta();
    let reverted = reverted["adds"].as_object().unwrap();
    assert_eq!(reverted.len(), earlier.len(), "{kind}: {reverted:?}");
    for (path, old) in earlier {
        for field in ["baseRowId", "defaultRowCommitVersion", "deletionVector"] {
            assert_eq!(reverted[path][field], old[field], "{kind}: {path} {field}");
        }
    }
}
