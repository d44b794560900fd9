//! The target's Delta protocol: which table features lakefill honours, and the rules they put on
//! the rows it writes (DESIGN §2, §5 "every commit is one Delta's own writers would accept").
//!
//! [`TableProtocol::read`] looks at the protocol and table properties of the target when a plan
//! is made, before anything is staged. Every reader and writer feature the table has is either
//! supported (and what it asks of a writer is done) or refused by name. The row rules it yields
//! (NOT NULL columns, column invariants, CHECK constraints, generated columns) are enforced on the
//! staged rows by validation (`lakefill::validate`); a violation fails validation and cannot be forced, since
//! Delta's own writers would refuse the same rows.

use std::collections::BTreeMap;

use deltalake::DeltaTable;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{DeltaContext, Error, Result};
use crate::mapping::ColumnMapping;
use crate::sqltext::ident;

/// What lakefill knows about a table's protocol.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct TableProtocol {
    /// Minimum reader version.
    pub min_reader_version: i32,
    /// Minimum writer version.
    pub min_writer_version: i32,
    /// Every feature the table has (named, or implied by the legacy protocol versions that are in
    /// use), each with what lakefill does about it.
    pub features: Vec<FeatureSupport>,
    /// The rules staged rows must satisfy.
    pub rules: Vec<RowRule>,
    /// The names and ids the table's files use for its columns.
    #[serde(default, skip_serializing_if = "ColumnMapping::is_none")]
    pub mapping: ColumnMapping,
    /// The table's identity columns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identity: Vec<IdentityColumn>,
}

/// An identity column (the protocol's "Identity Columns"): Delta assigns its values, `start`
/// then every `step`, each beyond the high-water mark.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdentityColumn {
    /// The column.
    pub name: String,
    /// The first value (`delta.identity.start`).
    pub start: i64,
    /// The distance between values (`delta.identity.step`, never 0).
    pub step: i64,
    /// The highest value assigned so far, the lowest when `step` is negative
    /// (`delta.identity.highWaterMark`; `None` before the first).
    pub high_water_mark: Option<i64>,
    /// `GENERATED ALWAYS`: no writer may put its own values in (`delta.identity.allowExplicitInsert`
    /// false).
    pub always: bool,
}

impl IdentityColumn {
    /// The identity columns of a table's schema fields (Delta JSON).
    pub fn of_fields(fields: &[Value]) -> std::result::Result<Vec<Self>, String> {
        let number = |value: &Value| match value {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        let mut out = Vec::new();
        for field in fields {
            let metadata = &field["metadata"];
            let Some(start) = metadata.get("delta.identity.start") else {
                continue;
            };
            let name = field["name"].as_str().unwrap_or_default().to_string();
            let bad = |what: &str| format!("identity column `{name}` has {what}");
            let start = number(start).ok_or_else(|| bad("a start that is not a number"))?;
            let step = metadata
                .get("delta.identity.step")
                .and_then(number)
                .filter(|s| *s != 0)
                .ok_or_else(|| bad("no step, or a step of 0"))?;
            if field["type"] != "long" {
                return Err(bad(&format!("the type {}, not long", field["type"])));
            }
            out.push(Self {
                name,
                start,
                step,
                high_water_mark: metadata
                    .get("delta.identity.highWaterMark")
                    .and_then(number),
                always: !match metadata.get("delta.identity.allowExplicitInsert") {
                    Some(Value::Bool(explicit)) => *explicit,
                    Some(Value::String(explicit)) => explicit == "true",
                    _ => false,
                },
            });
        }
        Ok(out)
    }

    /// The `k`-th value after the high-water mark (`k` from 1); `None` on overflow.
    pub fn value(&self, k: i64) -> Option<i64> {
        let base = match self.high_water_mark {
            Some(mark) => mark,
            None => self.start.checked_sub(self.step)?,
        };
        base.checked_add(self.step.checked_mul(k)?)
    }

    /// The high-water mark after `values` (the lowest and highest written) are in the column.
    pub fn advanced(&self, lowest: i64, highest: i64) -> Option<i64> {
        let reached = if self.step > 0 { highest } else { lowest };
        match self.high_water_mark {
            Some(mark)
                if (self.step > 0 && reached <= mark) || (self.step < 0 && reached >= mark) =>
            {
                None
            }
            _ => Some(reached),
        }
    }
}

/// One table feature and how lakefill handles it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FeatureSupport {
    /// The feature's protocol name, e.g. `checkConstraints`.
    pub name: String,
    /// What lakefill does about it.
    pub handling: String,
}

/// A rule on staged rows that comes from the table's protocol.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RowRule {
    /// Name shown in reports, e.g. `constraint amount_positive`.
    pub name: String,
    /// A SQL condition over `output` that is true for every row that breaks the rule.
    pub violation: String,
}

/// Reader features delta-rs 1.1 (which lakefill reads tables with) refuses to scan, with why.
const UNREADABLE: &[(&str, &str)] = &[(
    "vacuumProtocolCheck",
    "delta-rs 1.1, which lakefill reads tables with, refuses to scan a table that lists this reader feature (it asks nothing of a reader: only that VACUUM check the protocol)",
)];

/// Refuses, by name, a table (named `name`) whose protocol lists a reader feature lakefill
/// cannot read; what it reads otherwise fails deep in a scan with delta-rs' words (#32).
pub fn check_readable(table: &DeltaTable, name: &str) -> Result<()> {
    let snapshot = table
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{name}`"))?;
    let features: Vec<String> = snapshot
        .protocol()
        .reader_features()
        .into_iter()
        .flatten()
        .map(|f| f.to_string())
        .collect();
    for (feature, why) in UNREADABLE {
        if features.iter().any(|f| f == feature) {
            return Err(Error::UnsupportedFeature {
                table: name.to_string(),
                feature: (*feature).to_string(),
                why: (*why).to_string(),
                hint: format!(
                    "read a version of `{name}` from before the feature was added (`--source-version {name}=N`, `\"{name}@N\"`; `lakefill history {name}` lists them), or backfill a copy of the table without it"
                ),
            });
        }
    }
    Ok(())
}

/// Features lakefill supports, with what it does for each.
fn supported(name: &str) -> Option<&'static str> {
    Some(match name {
        "appendOnly" => {
            "honoured: a rewrite is refused when `delta.appendOnly` is true; adjustments append"
        }
        "invariants" => "enforced on staged rows",
        "checkConstraints" => "enforced on staged rows",
        "generatedColumns" => "verified on staged rows",
        "changeDataFeed" => {
            "supported: each run's commit carries change data files of exactly the rows that changed"
        }
        "deletionVectors" => {
            "supported: deleted rows are never read; with delta.enableDeletionVectors, a partition a fix changes little of is published by vectors (old rows deleted in place, only new ones written), else rewritten"
        }
        "timestampNtz" | "timestampWithoutTimezone" => "supported",
        "v2Checkpoint" => {
            "supported: lakefill writes no checkpoints, it leaves them to the table's other writers"
        }
        "checkpointProtection" => {
            "supported: lakefill never rewrites checkpoints or cleans the log"
        }
        "domainMetadata" => {
            "supported: domains are kept as they are; lakefill writes only row tracking's high-water mark"
        }
        "clustering" => {
            "supported: the clustering domain is kept; a clustered table has no partitions, so it is backfilled by rows (`range_column`), and staged files are written unclustered for the table's OPTIMIZE to cluster"
        }
        "rowTracking" => {
            "supported: new files get fresh row ids above the high-water mark, which advances in the same commit; rows a backfill rewrites get fresh ids, as in an overwrite; files a revert puts back keep theirs"
        }
        "identityColumns" => {
            "supported: a model passes an identity column through (its values are kept; a GENERATED ALWAYS column takes no other) or leaves it out (new values follow start and step beyond the high-water mark, which advances in the commit)"
        }
        "inCommitTimestamp" => {
            "supported: `commitInfo` comes first, with a timestamp after the previous commit's; time travel by timestamp uses it"
        }
        "allowColumnDefaults" => "supported: the model writes every column, so no default applies",
        "columnMapping" => {
            "supported (modes name and id): staged files use the physical names and field ids, the log's partition values and statistics the physical names"
        }
        _ => return None,
    })
}

impl TableProtocol {
    /// Reads the protocol of `table` (named `name` in the project) and refuses any feature
    /// lakefill cannot honour.
    /// `appends`: the run publishes by appending only (adjustments), which an append-only table
    /// accepts.
    pub fn read(table: &DeltaTable, name: &str, appends: bool) -> Result<Self> {
        check_readable(table, name)?;
        let snapshot = table
            .snapshot()
            .delta_context(|| format!("cannot read the snapshot of `{name}`"))?;
        let protocol = snapshot.protocol();
        let metadata = snapshot.metadata();
        let config = metadata.configuration();
        let schema: Value = serde_json::from_str(metadata.schema_string())
            .map_err(|e| Error::Internal(format!("the schema of `{name}` is not JSON: {e}")))?;
        let fields = schema["fields"].as_array().cloned().unwrap_or_default();
        let writer = protocol.min_writer_version();
        let reader = protocol.min_reader_version();
        let names = feature_names(protocol, config, &fields);
        let features = checked_features(&names, config, &fields, appends, name)?;
        let rules = row_rules(&fields, config);
        let mapping = ColumnMapping::of_metadata(metadata.schema_string(), config, metadata.id())?;
        let identity = IdentityColumn::of_fields(&fields).map_err(|why| Error::UnsupportedFeature {
            table: name.to_string(),
            feature: "identityColumns".into(),
            why,
            hint: "an identity column is a long with a start and a non-zero step in its metadata, as Delta writers make it".into(),
        })?;
        Ok(Self {
            min_reader_version: reader,
            min_writer_version: writer,
            features,
            rules,
            mapping,
            identity,
        })
    }
}

/// The table's features: named ones (writer version 7, reader version 3), plus those the legacy
/// versions imply where the table uses them.
fn feature_names(
    protocol: &deltalake::kernel::Protocol,
    config: &std::collections::HashMap<String, String>,
    fields: &[Value],
) -> Vec<String> {
    let has_field_metadata = |key: &str| {
        fields
            .iter()
            .any(|f| f["metadata"].get(key).is_some_and(|v| !v.is_null()))
    };
    let mut names: Vec<String> = protocol
        .reader_features()
        .into_iter()
        .flatten()
        .chain(protocol.writer_features().into_iter().flatten())
        .map(|f| f.to_string())
        .collect();
    let writer = protocol.min_writer_version();
    let reader = protocol.min_reader_version();
    if writer < 7 {
        let legacy: [(i32, &str, bool); 7] = [
            (2, "appendOnly", true),
            (2, "invariants", has_field_metadata("delta.invariants")),
            (
                3,
                "checkConstraints",
                config.keys().any(|k| k.starts_with("delta.constraints.")),
            ),
            (
                4,
                "changeDataFeed",
                config
                    .get("delta.enableChangeDataFeed")
                    .is_some_and(|v| v == "true"),
            ),
            (
                4,
                "generatedColumns",
                has_field_metadata("delta.generationExpression"),
            ),
            (5, "columnMapping", true),
            (
                6,
                "identityColumns",
                has_field_metadata("delta.identity.start"),
            ),
        ];
        for (version, feature, used) in legacy {
            if writer >= version && used {
                names.push(feature.to_string());
            }
        }
    }
    if reader == 2 {
        names.push("columnMapping".into());
    }
    names.sort();
    names.dedup();

    names
}

/// How lakefill honours each of `names`; a feature it cannot honour is refused by name.
fn checked_features(
    names: &[String],
    config: &std::collections::HashMap<String, String>,
    fields: &[Value],
    appends: bool,
    name: &str,
) -> Result<Vec<FeatureSupport>> {
    let refuse = |feature: &str, why: &str, hint: &str| Error::UnsupportedFeature {
        table: name.to_string(),
        feature: feature.to_string(),
        why: why.to_string(),
        hint: hint.to_string(),
    };
    let mut features = Vec::new();
    for feature in names {
        match feature.as_str() {
            "appendOnly"
                if !appends && config.get("delta.appendOnly").is_some_and(|v| v == "true") =>
            {
                return Err(refuse(
                    "appendOnly",
                    "`delta.appendOnly` is true: the table may only be appended to, and a backfill removes the files it replaces",
                    "publish the correction as adjustment rows appended to the table: `publish = \"adjustments\"` in the model header, or `--publish-as adjustments`",
                ));
            }
            "typeWidening" | "typeWidening-preview" => {
                return Err(refuse(
                    feature,
                    "column types of the table may have been widened (an INT column now a LONG), and neither delta-rs 1.1, which lakefill reads tables with, nor DataFusion reads the files written before the change as the wider type",
                    "backfill a copy of the table rewritten with the current types (Spark: `REORG TABLE … APPLY (UPGRADE UNIFORM…)` or `CREATE TABLE … AS SELECT`); lakefill can take such tables once delta-rs reads type-widened files",
                ));
            }
            "collations" | "collations-preview" => {
                return Err(refuse(
                    feature,
                    "string columns of the table compare by a collation (say, case-insensitively), and DataFusion compares bytes: the model, its range and validation would compare strings otherwise than the table's readers do",
                    "backfill a copy of the table without collations; lakefill can take such tables once DataFusion applies collations",
                ));
            }
            "variantType" | "variantType-preview" if uses_variant(fields) => {
                return Err(refuse(
                    feature,
                    "a column of the table is a VARIANT, which neither DataFusion nor delta-rs 1.1 reads or writes as Spark encodes it",
                    "backfill a copy of the table with the VARIANT columns cast to STRING (`to_json`); lakefill can take such tables once DataFusion has a variant type",
                ));
            }
            "variantType" | "variantType-preview" => features.push(FeatureSupport {
                name: feature.clone(),
                handling: "listed, but no column is a VARIANT: it asks nothing of the rows written"
                    .into(),
            }),
            other => match supported(other) {
                Some(handling) => features.push(FeatureSupport {
                    name: other.to_string(),
                    handling: handling.to_string(),
                }),
                None => {
                    return Err(refuse(
                        other,
                        "lakefill does not know what this feature asks of a writer, so it cannot promise a commit the table's other writers would accept",
                        "docs/reference.md (\"The target's Delta protocol\") lists the table features lakefill supports",
                    ));
                }
            },
        }
    }

    Ok(features)
}

/// Whether a column of `fields` (a Delta schema's), or a field nested in one, is a VARIANT.
fn uses_variant(fields: &[Value]) -> bool {
    fn is_variant(data_type: &Value) -> bool {
        match data_type {
            Value::String(name) => name == "variant",
            Value::Object(object) => match object.get("type").and_then(Value::as_str) {
                Some("struct") => object
                    .get("fields")
                    .and_then(Value::as_array)
                    .is_some_and(|fields| uses_variant(fields)),
                Some("array") => object.get("elementType").is_some_and(is_variant),
                Some("map") => {
                    object.get("keyType").is_some_and(is_variant)
                        || object.get("valueType").is_some_and(is_variant)
                }
                Some("variant") => true,
                _ => false,
            },
            _ => false,
        }
    }
    fields.iter().any(|field| is_variant(&field["type"]))
}

/// The rules the table puts on every row: NOT NULL columns, invariants, generated columns and
/// CHECK constraints.
fn row_rules(fields: &[Value], config: &std::collections::HashMap<String, String>) -> Vec<RowRule> {
    let mut rules = Vec::new();
    for field in fields {
        let Some(column) = field["name"].as_str() else {
            continue;
        };
        if field["nullable"] == Value::Bool(false) {
            rules.push(RowRule {
                name: format!("not null {column}"),
                violation: format!("{} IS NULL", ident(column)),
            });
        }
        if let Some(invariant) = invariant_expression(&field["metadata"]) {
            rules.push(RowRule {
                name: format!("invariant {column}"),
                violation: format!("NOT COALESCE(({invariant}), FALSE)"),
            });
        }
        if let Some(expression) = field["metadata"]["delta.generationExpression"].as_str() {
            rules.push(RowRule {
                name: format!("generated column {column}"),
                violation: format!(
                    "NOT ({} IS NOT DISTINCT FROM ({expression}))",
                    ident(column)
                ),
            });
        }
    }
    let constraints: BTreeMap<&String, &String> = config
        .iter()
        .filter(|(k, _)| k.starts_with("delta.constraints."))
        .collect();
    for (key, expression) in constraints {
        let constraint = key.trim_start_matches("delta.constraints.");
        rules.push(RowRule {
            name: format!("constraint {constraint}"),
            violation: format!("NOT COALESCE(({expression}), FALSE)"),
        });
    }
    rules
}

/// The Delta type of a column a model adds, for the table's schema; refused when the table's
/// protocol does not allow it (a `TIMESTAMP_NTZ` without the `timestampNtz` feature).
pub fn delta_type(
    data_type: &deltalake::arrow::datatypes::DataType,
    protocol: &TableProtocol,
) -> std::result::Result<String, String> {
    use deltalake::arrow::datatypes::{DataType, TimeUnit};
    Ok(match data_type {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 => "byte".into(),
        DataType::Int16 => "short".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "long".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Utf8 => "string".into(),
        DataType::Binary => "binary".into(),
        DataType::Date32 => "date".into(),
        DataType::Decimal128(precision, scale) if *scale >= 0 => {
            format!("decimal({precision},{scale})")
        }
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => "timestamp".into(),
        DataType::Timestamp(TimeUnit::Microsecond, None) => {
            if !protocol
                .features
                .iter()
                .any(|f| f.name == "timestampNtz" || f.name == "timestampWithoutTimezone")
            {
                return Err("a TIMESTAMP without time zone needs the table feature `timestampNtz`, which the table does not have; CAST it to a TIMESTAMP".into());
            }
            "timestamp_ntz".into()
        }
        other => {
            return Err(format!(
                "lakefill cannot add a column of type {other}; CAST it to a boolean, integer, floating point, decimal, string, binary, date or timestamp"
            ));
        }
    })
}

/// The SQL of a column invariant: `{"expression": {"expression": "x > 3"}}` in the field's
/// `delta.invariants` metadata (a JSON string).
fn invariant_expression(metadata: &Value) -> Option<String> {
    let raw = metadata.get("delta.invariants")?;
    let parsed: Value = match raw {
        Value::String(text) => serde_json::from_str(text).ok()?,
        other => other.clone(),
    };
    parsed["expression"]["expression"]
        .as_str()
        .map(str::to_string)
}
/// A column a model adds to its target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedColumn {
    /// The column's name.
    pub name: String,
    /// Its Delta type, e.g. `long`.
    pub delta_type: String,
}
