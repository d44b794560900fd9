//! The target's Delta protocol (issue #11): tables made by another writer (python `deltalake`)
//! with constraints, invariants, NOT NULL and generated columns get only rows those rules allow;
//! features lakefill cannot honour are refused before anything is staged; deletion vectors are
//! counted. After every command the table reads the same in python `deltalake` as in lakefill.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};

use crate::support::{PARTIAL_FIX, TestLake, files_under, json_ok, run_in, stderr};

fn helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cli/delta_tables.py")
}

/// Runs the python helper; returns its stdout.
pub(crate) fn python(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(helper())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 delta_tables.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A project with one table `t`, made by python `deltalake` with the feature `kind`.
struct FeatureProject {
    dir: tempfile::TempDir,
}

impl FeatureProject {
    fn new(kind: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // `KIND@flat`: unpartitioned, so that models replace the range by rows.
        python(&["create", kind, dir.path().join("t").to_str().unwrap()]);
        if kind.ends_with("@flat") {
            std::fs::write(dir.path().join("flat"), "").unwrap();
        }
        std::fs::write(
            dir.path().join("lakefill.toml"),
            "[tables.t]\nuri = \"t\"\n",
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes model `name`: a fix in place of `t` that selects `columns`.
    fn model(&self, name: &str, columns: &str) {
        let dir = self.path().join("sql").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let layout = if self.path().join("flat").exists() {
            "range_column"
        } else {
            "partition_by"
        };
        std::fs::write(
            dir.join("v1.sql"),
            format!(
                "/*\ntarget = \"t\"\n{layout} = \"event_date\"\n[sources.t]\nwindow = \"event_date\"\n*/\n\
                 SELECT {columns} FROM t WHERE event_date BETWEEN $start AND $end\n"
            ),
        )
        .unwrap();
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        run_in(self.path(), args)
    }

    fn backfill(&self, model: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec![
            "backfill",
            model,
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ];
        args.extend(extra);
        self.run(&args)
    }

    /// Every file of the table, with its bytes.
    fn files(&self) -> BTreeMap<String, Vec<u8>> {
        files_under(&self.path().join("t"))
            .into_iter()
            .filter(|p| !p.contains("/_lakefill/"))
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect()
    }

    /// The rows python `deltalake` reads, sorted by event_id.
    fn python_rows(&self) -> Vec<Value> {
        let text = python(&["rows", self.path().join("t").to_str().unwrap()]);
        serde_json::from_str::<Value>(&text)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// The rows lakefill's `sql` reads, in the same shape.
    fn lakefill_rows(&self, columns: &[&str]) -> Vec<Value> {
        let query = format!(
            "SELECT {} FROM t ORDER BY event_id",
            columns
                .iter()
                .map(|c| format!("CAST({c} AS VARCHAR) AS {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let out = json_ok(&self.run(&["sql", &query, "--output-format", "json"]));
        out["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let mut object = serde_json::Map::new();
                for (column, value) in columns.iter().zip(row.as_array().unwrap()) {
                    let value = match value.as_str() {
                        Some(text) if *column == "event_date" => json!(text),
                        Some(text) => json!(text.parse::<i64>().unwrap()),
                        None => Value::Null,
                    };
                    object.insert(column.to_string(), value);
                }
                Value::Object(object)
            })
            .collect()
    }
}

/// Each rule a table's protocol puts on rows, broken by a model: validation fails (exit 3) naming
/// the rule, the partition and rows, `--force-publish` cannot override it, and the table stays
/// byte-identical. The correct model then publishes, and python reads what lakefill reads.
#[test]
fn rows_breaking_the_tables_rules_fail_validation_and_cannot_be_forced() {
    let fixed = "event_id, amount_cents + 1 AS amount_cents, event_date";
    let cases = [
        (
            "constraints",
            "event_id, amount_cents - 1001 AS amount_cents, event_date",
            fixed,
            "constraint amount_positive",
        ),
        (
            "invariants",
            "event_id, amount_cents * 10000 AS amount_cents, event_date",
            fixed,
            "invariant amount_cents",
        ),
        (
            "not_null",
            "CASE WHEN event_id % 2 = 0 THEN NULL ELSE event_id END AS event_id, amount_cents, event_date",
            fixed,
            "not null event_id",
        ),
        (
            "generated",
            "event_id, amount_cents + 1 AS amount_cents, event_date, double_amount",
            "event_id, amount_cents + 1 AS amount_cents, event_date, (amount_cents + 1) * 2 AS double_amount",
            "generated column double_amount",
        ),
    ];
    // Each rule over both ways a rewrite commits: whole partitions, and by rows (the range's
    // rows of an unpartitioned table, the rows around them carried).
    let cases = cases.iter().flat_map(|&(kind, broken, correct, rule)| {
        [kind.to_string(), format!("{kind}@flat")].map(|kind| (kind, broken, correct, rule))
    });
    for (kind, broken, correct, rule) in cases {
        let kind = kind.as_str();
        let project = FeatureProject::new(kind);
        project.model("broken", broken);
        project.model("fixed", correct);
        let files = project.files();
        let rows = project.python_rows();

        let out = project.backfill("broken", &["--output-format", "json"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{kind}: {err}");
        assert!(err.contains(rule), "{kind}: {err}");
        assert!(err.contains("cannot override"), "{kind}: {err}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let check = report["validation"]["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == rule)
            .unwrap_or_else(|| panic!("{kind}: no check {rule}: {report}"));
        assert_eq!(check["passed"], false, "{kind}");
        assert_eq!(check["protocol"], true, "{kind}");
        assert!(
            check["failures"][0]["partition"]
                .as_str()
                .unwrap()
                .starts_with("2026-01-0"),
            "{kind}: {check}"
        );
        assert!(
            !check["sample"].as_array().unwrap().is_empty(),
            "{kind}: {check}"
        );

        let forced = project.backfill("broken", &["--force-publish", "--reason", "try anyway"]);
        assert_eq!(forced.status.code(), Some(3), "{kind}: {}", stderr(&forced));
        let run_id = report["run_id"].as_str().unwrap();
        let out = project.run(&[
            "publish",
            run_id,
            "--force-publish",
            "--reason",
            "try anyway",
        ]);
        assert_eq!(out.status.code(), Some(3), "{kind}: {}", stderr(&out));
        // Every file is as it was; the only new ones are the run's staged files, which no
        // version of the table references.
        let now = project.files();
        for (path, bytes) in &files {
            assert!(now.get(path) == Some(bytes), "{kind}: {path} changed");
        }
        for path in now.keys().filter(|p| !files.contains_key(*p)) {
            assert!(
                path.contains(&format!("/lakefill-{run_id}/")),
                "{kind}: new file {path}"
            );
        }
        assert_eq!(project.python_rows(), rows, "{kind}");

        let out = project.backfill("fixed", &[]);
        assert_eq!(out.status.code(), Some(0), "{kind}: {}", stderr(&out));
        // Independently: +1 cent in the range, unchanged outside it.
        let expected: Vec<Value> = rows
            .iter()
            .map(|row| {
                let mut row = row.clone();
                let day = row["event_date"].as_str().unwrap().to_string();
                if day.as_str() <= "2026-01-02" {
                    let amount = row["amount_cents"].as_i64().unwrap() + 1;
                    row["amount_cents"] = json!(amount);
                    if row.get("double_amount").is_some() {
                        row["double_amount"] = json!(2 * amount);
                    }
                }
                row
            })
            .collect();
        let read = project.python_rows();
        assert_eq!(read, expected, "{kind}: python reads the fix");
        let columns: Vec<&str> = read[0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut lakefill = project.lakefill_rows(&columns);
        for row in &mut lakefill {
            // Same key order as python's.
            let ordered: serde_json::Map<String, Value> = columns
                .iter()
                .map(|c| (c.to_string(), row[*c].clone()))
                .collect();
            *row = Value::Object(ordered);
        }
        assert_eq!(lakefill, read, "{kind}: lakefill reads what python reads");
    }
}

/// Features lakefill cannot honour are refused by `plan` and `backfill`, by name, before anything
/// is staged; the table stays byte-identical.
#[test]
fn unsupported_features_are_refused_before_anything_is_staged() {
    let cases: Vec<(FeatureProject, &str)> = vec![
        (FeatureProject::new("append_only"), "appendOnly"),
        (with_writer_feature("collations"), "collations"),
        (with_variant_column(), "variantType"),
        (with_reader_writer_feature("typeWidening"), "typeWidening"),
        (
            with_writer_feature("someFutureFeature"),
            "someFutureFeature",
        ),
    ];
    for (project, feature) in cases {
        project.model(
            "fix",
            "event_id, amount_cents + 1 AS amount_cents, event_date",
        );
        let files = project.files();
        for command in ["plan", "backfill"] {
            let out = project.run(&[command, "fix", "--from", "2026-01-01", "--to", "2026-01-02"]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{feature} {command}: {err}");
            assert!(
                err.contains(&format!("the Delta table feature `{feature}`")),
                "{feature}: {err}"
            );
            assert!(err.contains("\nhint: "), "{feature}: {err}");
        }
        assert!(
            project.files() == files,
            "{feature}: the table is byte-identical"
        );
        assert!(
            !files_under(&project.path().join("t"))
                .iter()
                .any(|p| p.contains("lakefill-")),
            "{feature}: nothing staged"
        );
    }
}

/// A plain python table whose protocol names `feature` as a reader and writer feature.
fn with_reader_writer_feature(feature: &str) -> FeatureProject {
    let project = FeatureProject::new("plain");
    let log = project.path().join("t/_delta_log");
    let next = next_version(&log);
    let commit = [
        json!({"commitInfo": {"timestamp": 1_767_225_600_000_i64, "operation": "UPGRADE PROTOCOL", "operationParameters": {}}}),
        json!({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [feature], "writerFeatures": [feature]}}),
    ];
    write_commit(&log, next, &commit);
    project
}

/// A plain python table with the `variantType` feature and a VARIANT column added.
fn with_variant_column() -> FeatureProject {
    let project = with_reader_writer_feature("variantType");
    let log = project.path().join("t/_delta_log");
    let mut metadata = std::fs::read_to_string(log.join(format!("{:020}.json", 0)))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find_map(|a| a.get("metaData").cloned())
        .unwrap();
    let mut schema: Value =
        serde_json::from_str(metadata["schemaString"].as_str().unwrap()).unwrap();
    schema["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "payload", "type": "variant", "nullable": true, "metadata": {}}));
    metadata["schemaString"] = json!(schema.to_string());
    let next = next_version(&log);
    write_commit(
        &log,
        next,
        &[
            json!({"commitInfo": {"timestamp": 1_767_225_600_000_i64, "operation": "ADD COLUMNS", "operationParameters": {}}}),
            json!({"metaData": metadata}),
        ],
    );
    project
}

/// A plain python table whose protocol was upgraded to writer version 7 with `feature` named.
fn with_writer_feature(feature: &str) -> FeatureProject {
    let project = FeatureProject::new("plain");
    let log = project.path().join("t/_delta_log");
    let next = next_version(&log);
    let commit = [
        json!({"commitInfo": {"timestamp": 1_767_225_600_000_i64, "operation": "UPGRADE PROTOCOL", "operationParameters": {}}}),
        json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": [feature]}}),
    ];
    write_commit(&log, next, &commit);
    project
}

fn next_version(log: &Path) -> u64 {
    std::fs::read_dir(log)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".json")
                .and_then(|n| n.parse::<u64>().ok())
        })
        .max()
        .unwrap()
        + 1
}

fn write_commit(log: &Path, version: u64, actions: &[Value]) {
    let mut file = std::fs::File::create_new(log.join(format!("{version:020}.json"))).unwrap();
    for action in actions {
        writeln!(file, "{action}").unwrap();
    }
}

/// The change feed of a CDF table shows a publish as the removed rows and the added ones.
#[test]
fn change_data_feed_tables_publish_and_read_back() {
    let project = FeatureProject::new("change_data_feed");
    project.model(
        "fix",
        "event_id, amount_cents + 1 AS amount_cents, event_date",
    );
    let out = project.backfill("fix", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows = project.python_rows();
    assert_eq!(rows.len(), 12);
    assert_eq!(
        rows.iter()
            .filter(|r| r["event_date"].as_str().unwrap() <= "2026-01-02")
            .map(|r| r["amount_cents"].as_i64().unwrap() - r["event_id"].as_i64().unwrap() % 100)
            .collect::<std::collections::BTreeSet<_>>(),
        [1001, 1011].into_iter().collect(),
        "every row of the range gained a cent"
    );
}

/// A deletion vector of `positions` on the one file of `day` in `events`, committed as another
/// writer's DELETE would: the file's `add` again, with its tags, and the vector. Returns the
/// file's `add` before, its live rows, the inline vector and the commit's version.
fn delete_by_vector(lake: &TestLake, day: &str, positions: &[u64]) -> (Value, u64, String, u64) {
    let table = lake.table_path("events");
    let files = lake.files("events");
    let (path, size) = files[day]
        .iter()
        .next()
        .map(|(p, s)| (p.clone(), *s))
        .unwrap();
    assert_eq!(files[day].len(), 1, "one file in the partition");
    // The file's rows, read with plain parquet.
    let rows: u64 = {
        let file = std::fs::File::open(table.join(&path)).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        reader.map(|batch| batch.unwrap().num_rows() as u64).sum()
    };
    let live = rows - positions.len() as u64;

    // An inline deletion vector: magic, then the portable RoaringTreemap, z85-encoded.
    let mut bitmap = roaring::RoaringTreemap::new();
    for position in positions {
        bitmap.insert(*position);
    }
    let mut bytes = 1_681_511_377u32.to_le_bytes().to_vec();
    bitmap.serialize_into(&mut bytes).unwrap();
    let encoded = z85::encode(&bytes);
    let log = table.join("_delta_log");
    let add = previous_add(&log, &path);
    let mut with_dv = add.clone();
    with_dv["deletionVector"] = json!({
        "storageType": "i",
        "pathOrInlineDv": encoded,
        "sizeInBytes": bytes.len(),
        "cardinality": positions.len(),
    });
    with_dv["dataChange"] = json!(true);
    let version = next_version(&log);
    write_commit(
        &log,
        version,
        &[
            json!({"commitInfo": {"timestamp": 1_767_225_600_000_i64, "operation": "DELETE", "operationParameters": {}}}),
            json!({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}}),
            json!({"remove": {"path": add["path"], "deletionTimestamp": 1_767_225_600_000_i64, "dataChange": true, "extendedFileMetadata": true, "partitionValues": add["partitionValues"], "size": size}}),
            json!({"add": with_dv}),
        ],
    );
    (add, live, encoded, version)
}

/// Deleted rows of a deletion vector are not rows: `plan` and validation count the live rows, and
/// the publish removes the file with its vector.
#[test]
fn deletion_vectors_are_counted_and_removed_with_their_file() {
    let lake = TestLake::new();
    let day = lake.day(3);
    let log = lake.table_path("events").join("_delta_log");
    let (add, live, encoded, version) = delete_by_vector(&lake, &day, &[0, 5]);

    let plan = json_ok(&lake.run(&[
        "plan",
        "events",
        "--from",
        &day,
        "--to",
        &day,
        "--output-format",
        "json",
    ]));
    assert_eq!(plan["partitions"][0]["rows"], live, "plan counts live rows");
    assert!(
        plan["protocol"]["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "deletionVectors"),
        "{}",
        plan["protocol"]
    );
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &day,
        "--to",
        &day,
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report["state"], "published", "{report}");
    let partition = &report["validation"]["comparison"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["value"] == day.as_str())
        .unwrap()
        .clone();
    assert_eq!(partition["old_rows"], live, "validation counts live rows");
    assert_eq!(report["partitions"][0]["old_rows"], live, "the report too");
    // The commit removes the file together with its vector.
    let published = report["published_version"].as_u64().unwrap();
    let text = std::fs::read_to_string(log.join(format!("{published:020}.json"))).unwrap();
    let remove = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|a| a["remove"]["path"] == add["path"])
        .expect("the file is removed");
    assert_eq!(
        remove["remove"]["deletionVector"]["pathOrInlineDv"],
        json!(encoded)
    );
    // The old version still reads without the deleted rows.
    let before = lake.query(
        &[("events", lake.open_version("events", version))],
        &format!("SELECT COUNT(*) FROM events WHERE event_date = DATE '{day}'"),
    );
    assert_eq!(before[0][0], live.to_string());
}

/// A file whose rows a deletion vector cut keeps the row checksum lakefill logged for it (the
/// vector's writer copied its `add`): that checksum is of rows that are no longer all there, so
/// the partition is read. Staging the file's rows again restores the deleted ones: two added.
#[test]
fn a_logged_checksum_of_a_file_with_a_deletion_vector_is_not_trusted() {
    let lake = TestLake::new();
    let day = lake.day(6);
    let (add, live, _, _) = delete_by_vector(&lake, &day, &[1, 2]);
    assert!(
        add["tags"]["lakefill.rowChecksum"].is_string(),
        "v1 logged the file's checksum: {add}"
    );
    // v1's rows again, compared by key.
    let v1 = std::fs::read_to_string(lake.path().join("sql/events/v1.sql")).unwrap();
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        v1.replacen("*/", "[validate]\nkey = [\"event_id\"]\n*/", 1),
    )
    .unwrap();
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &day,
        "--to",
        &day,
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report["state"], "published", "{report}");
    let comparison = &report["validation"]["comparison"];
    assert_eq!(comparison["old_unread"], Value::Null, "{comparison}");
    let partition = &comparison["partitions"][0];
    assert_eq!(partition["old_rows"], live, "{partition}");
    assert_eq!(partition["new_rows"], live + 2, "{partition}");
    assert_eq!(partition["added"], 2, "{partition}");
    assert_eq!(partition["changed"], 0, "{partition}");
}

/// The raw `add` action of `path` in the log.
fn previous_add(log: &Path, path: &str) -> Value {
    let mut found = None;
    let mut entries: Vec<_> = std::fs::read_dir(log)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for entry in entries
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
    {
        for line in std::fs::read_to_string(entry).unwrap().lines() {
            let action: Value = serde_json::from_str(line).unwrap();
            if action["add"]["path"]
                .as_str()
                .is_some_and(|p| crate::support::decoded(p) == path || p == path)
            {
                found = Some(action["add"].clone());
            }
        }
    }
    found.expect("the file's add action")
}

/// A commit that lands but whose response is lost is reported truthfully: the log is read again,
/// the run is published, once.
#[test]
fn a_commit_whose_response_is_lost_is_reported_as_published() {
    let lake = TestLake::new();
    let before = lake.version("events");
    let out = crate::support::lakefill_command(lake.path())
        .args([
            "backfill",
            "events",
            "--from",
            &lake.day(1),
            "--to",
            &lake.day(3),
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ])
        .env("LAKEFILL_FAILPOINTS", "lost-commit-response=error")
        .output()
        .unwrap();
    let report = json_ok(&out);
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(report["published_version"], before + 1);
    assert!(
        stderr(&out).contains("reported an error but is in the log"),
        "{}",
        stderr(&out)
    );
    assert_eq!(lake.version("events"), before + 1, "one commit");
    let runs = json_ok(&lake.run(&["runs", "events", "--output-format", "json"]));
    assert_eq!(runs[0]["state"], "published");
    assert_eq!(runs[0]["published_version"], before + 1);
}

/// `schema = "add-columns"` lets a fix add a nullable column: one metadata action in the same
/// commit, python reads it (NULL outside the range), earlier versions keep the old schema, and a
/// strict model with the same extra column is refused before anything is staged.
#[test]
fn a_fix_may_add_nullable_columns_when_it_says_so() {
    let project = FeatureProject::new("plain");
    let header = "/*\ntarget = \"t\"\npartition_by = \"event_date\"\n{mode}[sources.t]\nwindow = \"event_date\"\n*/\n";
    let sql = "SELECT event_id, amount_cents, event_date, amount_cents / 10 AS tip_cents FROM t WHERE event_date BETWEEN $start AND $end\n";
    for (name, mode) in [("strict", ""), ("adds", "schema = \"add-columns\"\n")] {
        let dir = project.path().join("sql").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("v1.sql"), header.replace("{mode}", mode) + sql).unwrap();
    }
    let files = project.files();
    let out = project.backfill("strict", &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("extra column `tip_cents`") && err.contains("add-columns"),
        "{err}"
    );
    assert!(project.files() == files, "nothing staged");

    let report: Value = serde_json::from_slice(
        &project
            .backfill("adds", &["--output-format", "json"])
            .stdout,
    )
    .unwrap();
    assert_eq!(report["state"], "published", "{report}");
    let schema_check = &report["validation"]["checks"][0];
    assert_eq!(
        schema_check["sample"][0]["added_column"], "tip_cents",
        "{schema_check}"
    );
    let rows = project.python_rows();
    for row in &rows {
        let in_range = row["event_date"].as_str().unwrap() <= "2026-01-02";
        let expected = if in_range {
            json!(row["amount_cents"].as_i64().unwrap() / 10)
        } else {
            Value::Null
        };
        assert_eq!(row["tip_cents"], expected, "{row}");
    }
    // The version before the backfill still has the old schema.
    let published = report["published_version"].as_u64().unwrap();
    let script = format!(
        "from deltalake import DeltaTable\nimport os, sys\nprint([f.name for f in DeltaTable('{}', version={}).schema().fields])\nsys.stdout.flush(); os._exit(0)\n",
        project.path().join("t").display(),
        published - 1
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "['event_id', 'amount_cents', 'event_date']"
    );
}
