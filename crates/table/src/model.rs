//! Versioned model files `sql/<model>/<version>.sql` (DESIGN §2).
//!
//! A model file starts with a block comment holding a TOML header, followed by one read-only
//! `SELECT`. This module finds versions (natural sort), fingerprints the bytes, parses the header
//! and checks the SQL statically: one query, no DDL/DML/COPY, every table it reads declared.
//! Running the SQL is left to the runner (`lakefill::stage`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use deltalake::datafusion::sql::parser::{DFParser, Statement};
use deltalake::datafusion::sql::resolve::resolve_table_references;
use deltalake::datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use deltalake::datafusion::sql::sqlparser::dialect::GenericDialect;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Project;
use crate::error::{Error, Result};

/// One version of a model: its header, SQL and fingerprint.
#[derive(Debug, Clone)]
pub struct Model {
    name: String,
    version: String,
    path: PathBuf,
    fingerprint: String,
    header: ModelHeader,
    sql: String,
}

/// The TOML header of a model file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelHeader {
    /// The table the model writes, from `lakefill.toml`.
    pub target: String,
    /// The target's partition columns: one name, or a list (`["event_date", "country"]`,
    /// `["year", "month"]`); `[]` (or absent) for an unpartitioned table: with `range_column`
    /// the range selects its rows, without it the table has no time and runs are scoped by
    /// `--where` alone.
    #[serde(default, deserialize_with = "one_or_many")]
    pub partition_by: Vec<String>,
    /// The grain of the time partition column (`hour`, `day`, `month`, `year`); inferred from
    /// the Delta log when absent.
    #[serde(default)]
    pub grain: Option<String>,
    /// The format of a string time partition column (chrono syntax, e.g. `%Y%m%d`); inferred
    /// from the values when absent.
    #[serde(default)]
    pub format: Option<String>,
    /// `strict` (the default): the model writes exactly the table's columns; `add-columns`: it
    /// may add nullable columns, which the publish adds to the table's schema.
    #[serde(default)]
    pub schema: Option<String>,
    /// For an unpartitioned table, or one partitioned coarser than the range: the time column
    /// whose rows the range replaces (files overlapping the range are rewritten, their other
    /// rows carried over).
    #[serde(default)]
    pub range_column: Option<String>,
    /// How the run publishes: `rewrite` (the default: the range's files are replaced) or
    /// `adjustments` (reversal and correction rows are appended; see `lakefill::adjust`).
    #[serde(default)]
    pub publish: Option<String>,
    /// Default reason recorded with each backfill.
    #[serde(default)]
    pub reason: Option<String>,
    /// Each table the SELECT reads.
    #[serde(default)]
    pub sources: BTreeMap<String, SourceSpec>,
    /// Validation settings (see the validation module once it lands).
    #[serde(default)]
    pub validate: Option<ValidateSpec>,
}

/// How a model reads one source.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Column restricting reads to the batch window (or integer parts: `["year", "month"]`);
    /// without it the whole source is read.
    #[serde(default, deserialize_with = "optional_one_or_many")]
    pub window: Option<Vec<String>>,
    /// Extra partitions (days) read before the window.
    #[serde(default)]
    pub lookback: u32,
    /// Extra partitions (days) read after the window.
    #[serde(default)]
    pub lookahead: u32,
    /// The grain of the window column (inferred from the source's log when it is a partition
    /// column, else a day for DATE and an hour for TIMESTAMP columns).
    #[serde(default)]
    pub grain: Option<String>,
    /// The format of a string window column.
    #[serde(default)]
    pub format: Option<String>,
}

/// Accepts no value, `"a"` or `["a", "b"]`.
fn optional_one_or_many<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<Vec<String>>, D::Error> {
    one_or_many(deserializer).map(Some)
}

/// Accepts `"a"` or `["a", "b"]`.
fn one_or_many<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

/// The `[validate]` section of a model header.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ValidateSpec {
    /// Row identity for the row-level diff and uniqueness.
    #[serde(default)]
    pub key: Vec<String>,
    /// Columns summed and compared per partition.
    #[serde(default)]
    pub measures: Vec<String>,
    /// Largest accepted row-count change per partition.
    #[serde(default)]
    pub max_row_change: Option<String>,
    /// Largest accepted measure change per partition.
    #[serde(default)]
    pub max_measure_change: Option<String>,
    /// Measures whose totals over the range must not change.
    #[serde(default)]
    pub conserve: Vec<String>,
    /// User checks: queries that must return no rows.
    #[serde(default)]
    pub checks: Vec<CheckSpec>,
    /// Measures whose total over the range must equal another table's column over the same
    /// range: `{ revenue_cents = "events.amount_cents" }` (in a cascade, the other node as staged;
    /// else a source of the model at its pinned version).
    #[serde(default)]
    pub conserve_with: std::collections::BTreeMap<String, String>,
    /// Float and double columns that agree to this many decimal places are equal (in the row
    /// diff, in "up to date"); without it they are compared bit for bit.
    #[serde(default)]
    pub decimals: Option<u32>,
}

/// A user check of the `[validate]` section.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// Name shown in reports.
    pub name: String,
    /// Query over `output` and `previous` that must return no rows.
    pub sql: String,
}

impl Model {
    /// Loads model `name` of `project`: the newest version, or `version` when given.
    pub fn load(project: &Project, name: &str, version: Option<&str>) -> Result<Self> {
        if !is_model_name(name) {
            return Err(Error::InvalidOption {
                option: "MODEL".into(),
                value: name.to_string(),
                message: "a model name is a plain identifier (letters, digits, `_` and `-`): the name of a directory under `sql/`".into(),
            });
        }
        let sql_dir = project.sql_dir();
        let dir = sql_dir.join(name);
        let versions = list_versions(&dir);
        if versions.is_empty() {
            return Err(Error::UnknownModel {
                model: name.to_string(),
                dir,
                known: list_models(&sql_dir),
            });
        }
        let chosen = match version {
            Some(wanted) => versions
                .iter()
                .find(|v| v.as_str() == wanted)
                .cloned()
                .ok_or_else(|| Error::UnknownModelVersion {
                    model: name.to_string(),
                    version: wanted.to_string(),
                    known: versions.clone(),
                })?,
            None => versions
                .last()
                .cloned()
                .ok_or_else(|| Error::Internal("version list is empty".into()))?,
        };
        let path = dir.join(format!("{chosen}.sql"));
        let bytes = std::fs::read(&path).map_err(|source| Error::ReadFile {
            path: path.clone(),
            source,
        })?;
        Self::parse(project, name, &chosen, &path, &bytes)
    }

    fn parse(
        project: &Project,
        name: &str,
        version: &str,
        path: &Path,
        bytes: &[u8],
    ) -> Result<Self> {
        let model_error = |message: String, hint: &str| Error::Model {
            path: path.to_path_buf(),
            message,
            hint: hint.to_string(),
        };
        let fingerprint = hex::encode(Sha256::digest(bytes));
        let text = std::str::from_utf8(bytes)
            .map_err(|e| model_error(format!("not UTF-8 ({e})"), "save the file as UTF-8"))?;
        let trimmed = text.trim_start();
        let header_hint = "start the file with a `/* ... */` block holding the TOML header (target, partition_by, [sources.<table>])";
        let Some(after_open) = trimmed.strip_prefix("/*") else {
            return Err(model_error(
                "the file does not start with a `/*` header block".into(),
                header_hint,
            ));
        };
        let Some(close) = after_open.find("*/") else {
            return Err(model_error(
                "the header block is not closed with `*/`".into(),
                header_hint,
            ));
        };
        let header_text = &after_open[..close];
        let sql = after_open[close + 2..].trim().to_string();
        let header: ModelHeader = toml::from_str(header_text).map_err(|e| {
            model_error(
                format!("the header is not valid: {}", e.to_string().trim_end()),
                "fix the TOML in the header block; fields are target, partition_by, reason, [sources.<table>], [validate]",
            )
        })?;
        let used_by = format!("the header of `{}`", path.display());
        project.table(&header.target, &used_by)?;
        if header.partition_by.iter().any(|c| c.trim().is_empty()) {
            return Err(model_error(
                "`partition_by` names an empty column".into(),
                "set `partition_by` to the target table's partition column, or a list of them",
            ));
        }
        if let Some(mode) = &header.schema
            && !matches!(mode.as_str(), "strict" | "add-columns")
        {
            return Err(model_error(
                format!("`schema = \"{mode}\"` is not a schema mode"),
                "write `schema = \"strict\"` (the default) or `schema = \"add-columns\"`",
            ));
        }
        if let Some(mode) = &header.publish
            && crate::adjustments::PublishMode::parse(mode).is_none()
        {
            return Err(model_error(
                format!("`{mode}` is not a way to publish: use `rewrite` or `adjustments`"),
                "set `publish = \"rewrite\"` or `publish = \"adjustments\"` in the header",
            ));
        }
        let grain_hint = "write `grain = \"hour\"`, `\"day\"`, `\"month\"` or `\"year\"`";
        if let Some(grain) = &header.grain
            && crate::time::Grain::parse(grain).is_none()
        {
            return Err(model_error(
                format!("`grain = \"{grain}\"` is not a grain"),
                grain_hint,
            ));
        }
        for (source, spec) in &header.sources {
            if let Some(grain) = &spec.grain
                && crate::time::Grain::parse(grain).is_none()
            {
                return Err(model_error(
                    format!("`sources.{source}.grain = \"{grain}\"` is not a grain"),
                    grain_hint,
                ));
            }
        }
        for (source, spec) in &header.sources {
            project.table(source, &used_by)?;
            for (field, value) in [("lookback", spec.lookback), ("lookahead", spec.lookahead)] {
                if value > MAX_WINDOW_PARTITIONS {
                    return Err(model_error(
                        format!(
                            "`sources.{source}.{field}` is {value}, more than the {MAX_WINDOW_PARTITIONS} partitions lakefill reads around a batch"
                        ),
                        "lookback and lookahead count partitions of the source (days of a daily table): use the context the model needs, e.g. `lookback = 6` for a 7-day window",
                    ));
                }
            }
        }
        check_sql(path, &sql, &header)?;
        Ok(Self {
            name: name.to_string(),
            version: version.to_string(),
            path: path.to_path_buf(),
            fingerprint,
            header,
            sql,
        })
    }

    /// Returns the model's name (its directory under `sql/`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the version (the file stem).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Returns the model file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Returns the SHA-256 of the file bytes, in hex.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Returns the parsed header.
    pub fn header(&self) -> &ModelHeader {
        &self.header
    }

    /// Returns the SELECT statement.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// This model (its name, version, fingerprint and validation) reading `sources` with `sql`
    /// in place of its file's: what a logical revert runs to recompute a range as it was.
    pub fn restoring(&self, sql: String, sources: BTreeMap<String, SourceSpec>) -> Self {
        let mut header = self.header.clone();
        header.sources = sources;
        Self {
            header,
            sql,
            ..self.clone()
        }
    }

    /// Returns whether the model may add columns to the target.
    pub fn adds_columns(&self) -> bool {
        self.header.schema.as_deref() == Some("add-columns")
    }

    /// How the header says the model publishes, if it says (checked when the model is loaded).
    pub fn publish(&self) -> Option<crate::adjustments::PublishMode> {
        self.header
            .publish
            .as_deref()
            .and_then(crate::adjustments::PublishMode::parse)
    }

    /// Returns the declared grain of the target's time partitions, if any.
    pub fn grain(&self) -> Option<crate::time::Grain> {
        self.header
            .grain
            .as_deref()
            .and_then(crate::time::Grain::parse)
    }
}

/// The most partitions a source's `lookback` or `lookahead` may add around a batch.
pub const MAX_WINDOW_PARTITIONS: u32 = 100_000;

/// Whether `name` can be a model: a directory name with no path in it.
pub fn is_model_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.len() <= 128
}

/// Parses `sql` and refuses anything but one query reading declared sources.
fn check_sql(path: &Path, sql: &str, header: &ModelHeader) -> Result<()> {
    let model_error = |message: String, hint: &str| Error::Model {
        path: path.to_path_buf(),
        message,
        hint: hint.to_string(),
    };
    let statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {}).map_err(|e| {
        model_error(
            format!("the SQL does not parse: {e}"),
            "fix the SELECT after the header; `$start` and `$end` are the batch bounds",
        )
    })?;
    let mut statements = statements.into_iter();
    let (Some(statement), None) = (statements.next(), statements.next()) else {
        return Err(model_error(
            "a model holds exactly one SELECT statement".into(),
            "keep one SELECT (CTEs are fine) after the header",
        ));
    };
    check_read_only(&statement).map_err(|kind| {
        model_error(
            format!("{kind} statements are not allowed; a model is one read-only SELECT"),
            "models only read: write the query as a SELECT; lakefill writes the result",
        )
    })?;
    let (tables, _ctes) = resolve_table_references(&statement, false).map_err(|e| {
        model_error(
            format!("cannot list the tables the SQL reads: {e}"),
            "simplify the FROM clauses",
        )
    })?;
    for table in tables {
        let name = table.table();
        if table.schema().is_some() || !header.sources.contains_key(name) {
            return Err(model_error(
                format!("the SQL reads `{table}`, which the header does not declare as a source"),
                &format!(
                    "add `[sources.{name}]` to the header (with `window = \"<column>\"` to read only the batch window)"
                ),
            ));
        }
    }
    Ok(())
}

/// Accepts a plain query; returns the kind of any other statement.
pub fn check_read_only(statement: &Statement) -> std::result::Result<(), String> {
    match statement {
        Statement::Statement(inner) => match inner.as_ref() {
            SqlStatement::Query(_) => Ok(()),
            other => Err(statement_kind(other)),
        },
        Statement::CreateExternalTable(_) => Err("CREATE EXTERNAL TABLE".into()),
        Statement::CopyTo(_) => Err("COPY".into()),
        Statement::Explain(_) => Err("EXPLAIN".into()),
        Statement::Reset(_) => Err("RESET".into()),
    }
}

fn statement_kind(statement: &SqlStatement) -> String {
    // The first two words of the statement name its kind well enough (`INSERT INTO`, `DROP TABLE`).
    let text = statement.to_string();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .to_uppercase()
}

/// Lists the versions in a model directory, oldest first (natural sort: v2 < v10).
pub fn list_versions(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut versions: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql") && path.is_file())
        .filter_map(|path| {
            path.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .collect();
    versions.sort_by(|a, b| natural_cmp(a, b));
    versions
}

/// Lists the models of a project: directories of `sql/` holding `.sql` files.
pub fn list_models(sql_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(sql_dir) else {
        return Vec::new();
    };
    let mut models: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| !list_versions(&entry.path()).is_empty())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    models.sort();
    models
}

/// Compares strings so that runs of digits compare as numbers.
fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for ((digit_a, x), (digit_b, y)) in ca.iter().zip(cb.iter()) {
        let ordering = if *digit_a && *digit_b {
            let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
            x.len().cmp(&y.len()).then_with(|| x.cmp(y))
        } else {
            x.cmp(y)
        };
        if ordering.is_ne() {
            return ordering;
        }
    }
    ca.len().cmp(&cb.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_sort_orders_numbers_by_value() {
        let mut versions = vec!["v10", "v2", "v1", "v2b", "v09"];
        versions.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(versions, ["v1", "v2", "v2b", "v09", "v10"]);
    }

    fn header() -> ModelHeader {
        toml::from_str("target = \"t\"\npartition_by = \"d\"\n[sources.events]\nwindow = \"d\"\n")
            .expect("valid header")
    }

    #[test]
    fn rejects_dml_ddl_and_copy() {
        for sql in [
            "INSERT INTO events VALUES (1)",
            "DROP TABLE events",
            "COPY events TO '/tmp/x.parquet'",
            "CREATE EXTERNAL TABLE x STORED AS PARQUET LOCATION '/tmp'",
            "SET datafusion.execution.batch_size = 1",
        ] {
            let err = check_sql(Path::new("m.sql"), sql, &header()).expect_err(sql);
            assert!(err.to_string().contains("not allowed"), "{sql}: {err}");
        }
    }

    #[test]
    fn rejects_undeclared_sources_but_not_ctes() {
        check_sql(
            Path::new("m.sql"),
            "WITH x AS (SELECT * FROM events) SELECT * FROM x",
            &header(),
        )
        .expect("cte over a declared source");
        let err = check_sql(
            Path::new("m.sql"),
            "SELECT * FROM events JOIN users USING (id)",
            &header(),
        )
        .expect_err("users is not declared");
        assert!(err.to_string().contains("`users`"), "{err}");
    }
}
