//! The rows a run is scoped to beyond its range: `--where PREDICATE`, a boolean SQL expression
//! over the target's columns (`country = 'DE'`, `customer_id IN (17, 42)`).
//!
//! DataFusion parses and types the predicate, and its pruning predicate decides which files may
//! hold matching rows. Written here, because no crate does it: the checks that keep a scope
//! reproducible (no subquery, aggregate or non-deterministic function), and the files' Delta log
//! statistics and partition values as the Arrow arrays pruning reads.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use deltalake::arrow::array::{ArrayRef, BooleanArray, UInt64Array};
use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::datafusion::common::pruning::PruningStatistics;
use deltalake::datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use deltalake::datafusion::common::{Column, DFSchema, ScalarValue};
use deltalake::datafusion::logical_expr::{ExprSchemable, Volatility};
use deltalake::datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use deltalake::datafusion::prelude::{Expr, SessionContext};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::partition::PartitionValues;

/// Delta truncates string statistics to this many characters: a maximum this long may be a
/// prefix of the true one.
const STRING_STATS_PREFIX: usize = 32;

/// `--where <predicate>` as a POSIX shell reads it back, for the commands lakefill prints
/// (resume a run, re-run a cascade): the predicate single-quoted, its own quotes escaped.
pub fn where_option(predicate: &str) -> String {
    format!(" --where '{}'", predicate.replace('\'', "'\\''"))
}

/// A checked `--where` predicate: the text as given, and its canonical form (what the run id
/// hashes, so spacing and quoting do not make another run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowPredicate {
    /// The predicate as the user wrote it.
    pub sql: String,
    /// The predicate as DataFusion writes it back.
    pub canonical: String,
}

impl std::fmt::Display for RowPredicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sql)
    }
}

/// What the log says of one file, for pruning: its partition values, its statistics (Delta's
/// JSON `stats`, keyed by logical names) and its live rows.
pub struct FileFacts<'a> {
    /// Partition values by column.
    pub values: &'a PartitionValues,
    /// The `stats` JSON, if the log has it.
    pub stats: Option<&'a str>,
}

impl RowPredicate {
    /// Parses `text` against `schema` (the target's, logical names): it must be a boolean
    /// expression over its columns, with no subquery, aggregate, window or non-deterministic
    /// function (the same predicate must select the same rows on a re-run).
    pub fn parse(text: &str, schema: &Schema, table: &str) -> Result<Self> {
        let text = text.trim();
        let refuse = |message: String| Error::InvalidOption {
            option: "--where".into(),
            value: text.to_string(),
            message,
        };
        if text.is_empty() {
            return Err(refuse(
                "the predicate is empty: give a condition on the target's columns".into(),
            ));
        }
        let columns = || {
            schema
                .fields()
                .iter()
                .map(|f| format!("`{}`", f.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let df_schema = DFSchema::try_from(schema.clone())
            .map_err(|e| Error::Internal(format!("cannot describe the target's schema: {e}")))?;
        let expr = SessionContext::new()
            .parse_sql_expr(text, &df_schema)
            .map_err(|e| {
                let message = e.strip_backtrace();
                if message.contains("table '") && message.contains("not found") {
                    refuse("it holds a subquery: a scope is a condition on the target's own columns, e.g. `customer_id IN (17, 42)`".into())
                } else if message.contains("No field named") || message.contains("not found") {
                    refuse(format!(
                        "it names a column `{table}` does not have ({message}); its columns are {}",
                        columns()
                    ))
                } else {
                    refuse(format!("it is not a SQL condition: {message}"))
                }
            })?;
        let mut problem = None;
        expr.apply(|e| {
            problem = match e {
                Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_) => {
                    Some("it holds a subquery: a scope is a condition on the target's own columns, e.g. `customer_id IN (17, 42)`".to_string())
                }
                Expr::AggregateFunction(_) | Expr::WindowFunction(_) => Some(
                    "it holds an aggregate or window function: a scope selects rows one by one"
                        .to_string(),
                ),
                Expr::Placeholder(p) => Some(format!(
                    "it holds the parameter `{}`: write the value itself",
                    p.id
                )),
                Expr::ScalarFunction(f) if f.func.signature().volatility != Volatility::Immutable => {
                    Some(format!(
                        "`{}()` is not deterministic: a re-run or a revert must select the same rows; write the value itself",
                        f.name()
                    ))
                }
                _ => None,
            };
            Ok(if problem.is_some() {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })
        .map_err(|e| Error::Internal(format!("cannot inspect the predicate: {e}")))?;
        if let Some(message) = problem {
            return Err(refuse(message));
        }
        match expr.get_type(&df_schema) {
            Ok(DataType::Boolean | DataType::Null) => {}
            Ok(other) => {
                return Err(refuse(format!(
                    "it is a {other}, not a condition: compare a column with a value, e.g. `country = 'DE'`"
                )));
            }
            Err(e) => {
                return Err(refuse(format!(
                    "its types do not fit the columns of `{table}`: {}",
                    e.strip_backtrace()
                )));
            }
        }
        // Typed as a filter would be: a comparison of a column with a value of another type
        // fails here, not after staging.
        SessionContext::new()
            .create_physical_expr(expr.clone(), &df_schema)
            .map_err(|e| {
                refuse(format!(
                    "its types do not fit the columns of `{table}`: {}",
                    e.strip_backtrace()
                ))
            })?;
        let canonical = deltalake::datafusion::sql::unparser::expr_to_sql(&expr)
            .map(|sql| sql.to_string())
            .unwrap_or_else(|_| text.to_string());
        Ok(Self {
            sql: text.to_string(),
            canonical,
        })
    }

    /// Whether the predicate is `TRUE` itself, which selects every row whatever they hold.
    pub fn selects_every_row(&self) -> bool {
        self.canonical.trim().eq_ignore_ascii_case("true")
    }

    /// The predicate as an expression over `schema` (a table with the target's columns).
    pub fn expr(&self, schema: &Schema) -> Result<Expr> {
        let df_schema = DFSchema::try_from(schema.clone())
            .map_err(|e| Error::Internal(format!("cannot describe a schema: {e}")))?;
        SessionContext::new()
            .parse_sql_expr(&self.sql, &df_schema)
            .map_err(|e| Error::InvalidOption {
                option: "--where".into(),
                value: self.sql.clone(),
                message: format!(
                    "it does not fit this table's columns: {}",
                    e.strip_backtrace()
                ),
            })
    }

    /// The columns the predicate reads.
    pub fn columns(&self, schema: &Schema) -> Result<BTreeSet<String>> {
        Ok(self
            .expr(schema)?
            .column_refs()
            .into_iter()
            .map(|c| c.name.clone())
            .collect())
    }

    /// The predicate evaluated row by row on batches with `schema` (the target's columns, those
    /// it reads at least): which rows it selects, as a `WHERE` does (NULL selects none).
    pub fn selector(&self, schema: &Schema) -> Result<RowSelector> {
        Ok(RowSelector {
            physical: self.physical(schema)?,
            sql: format!("--where {}", self.sql),
        })
    }

    /// The predicate planned over `schema`, as DataFusion evaluates it.
    fn physical(
        &self,
        schema: &Schema,
    ) -> Result<Arc<dyn deltalake::datafusion::physical_plan::PhysicalExpr>> {
        let expr = self.expr(schema)?;
        let df_schema = DFSchema::try_from(schema.clone())
            .map_err(|e| Error::Internal(format!("cannot describe a schema: {e}")))?;
        SessionContext::new()
            .create_physical_expr(expr, &df_schema)
            .map_err(|e| Error::Internal(format!("cannot plan the predicate: {e}")))
    }

    /// For each file, whether it may hold rows that match: `false` only when its partition
    /// values or statistics prove that none does. `schema` is the table's.
    pub fn may_match(&self, schema: &Schema, files: &[FileFacts<'_>]) -> Result<Vec<bool>> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let physical = self.physical(schema)?;
        let schema: SchemaRef = Arc::new(schema.clone());
        let pruning = PruningPredicateBuilder::new()
            .with_file_schema(Arc::clone(&schema))
            .try_build(physical)
            .map_err(|e| Error::Internal(format!("cannot prune by the predicate: {e}")))?;
        let statistics = FileStatistics::of(&schema, &self.columns(&schema)?, files);
        pruning
            .prune(&statistics)
            .map_err(|e| Error::Internal(format!("cannot prune by the predicate: {e}")))
    }
}

/// A `--where` predicate planned for a schema ([`RowPredicate::selector`]).
#[derive(Debug, Clone)]
pub struct RowSelector {
    physical: Arc<dyn deltalake::datafusion::physical_plan::PhysicalExpr>,
    sql: String,
}

impl RowSelector {
    /// `predicate` (over `schema`) evaluated row by row, as [`RowPredicate::selector`] does a
    /// `--where`; `sql` names it in errors.
    pub fn of_expr(predicate: Expr, schema: &Schema, sql: String) -> Result<Self> {
        let df_schema = DFSchema::try_from(schema.clone())
            .map_err(|e| Error::Internal(format!("cannot describe a schema: {e}")))?;
        let physical = SessionContext::new()
            .create_physical_expr(predicate, &df_schema)
            .map_err(|e| Error::Internal(format!("cannot plan the predicate `{sql}`: {e}")))?;
        Ok(Self { physical, sql })
    }

    /// Whether the predicate selects each row of `batch` (of the selector's schema): `true`
    /// where it is TRUE, `false` where it is FALSE or NULL.
    pub fn select(&self, batch: &deltalake::arrow::array::RecordBatch) -> Result<Vec<bool>> {
        use deltalake::arrow::array::{Array, AsArray};
        let fail = |e: &dyn std::fmt::Display| {
            Error::Internal(format!("cannot evaluate `{}` on rows: {e}", self.sql))
        };
        let value = self
            .physical
            .evaluate(batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(|e| fail(&e))?;
        if value.data_type() != &DataType::Boolean {
            return Err(fail(&format!(
                "it gives {}, not booleans",
                value.data_type()
            )));
        }
        let value = value.as_boolean();
        Ok((0..batch.num_rows())
            .map(|row| value.is_valid(row) && value.value(row))
            .collect())
    }
}

/// The minimum, maximum and NULL count of each column the predicate reads, one entry per file.
struct FileStatistics {
    columns: HashMap<String, ColumnStatistics>,
    containers: usize,
}

struct ColumnStatistics {
    min: ArrayRef,
    max: ArrayRef,
    nulls: ArrayRef,
}

impl FileStatistics {
    fn of(schema: &Schema, columns: &BTreeSet<String>, files: &[FileFacts<'_>]) -> Self {
        let parsed: Vec<Option<serde_json::Value>> = files
            .iter()
            .map(|f| f.stats.and_then(|s| serde_json::from_str(s).ok()))
            .collect();
        let mut out = HashMap::new();
        for column in columns {
            let Ok(field) = schema.field_with_name(column) else {
                continue;
            };
            let data_type = field.data_type();
            let mut min = Vec::with_capacity(files.len());
            let mut max = Vec::with_capacity(files.len());
            let mut nulls = Vec::with_capacity(files.len());
            for (file, stats) in files.iter().zip(&parsed) {
                let (low, high, null_count) = match file.values.get(column) {
                    // A partition column: one value for the whole file.
                    Some(value) => {
                        let rows = stats.as_ref().and_then(|s| s["numRecords"].as_u64());
                        match value {
                            Some(text) => {
                                let scalar = typed(text, data_type);
                                (scalar.clone(), scalar, Some(0))
                            }
                            None => (None, None, rows),
                        }
                    }
                    None => match stats {
                        Some(stats) => (
                            json_scalar(&stats["minValues"][column], data_type, false),
                            json_scalar(&stats["maxValues"][column], data_type, true),
                            stats["nullCount"][column].as_u64(),
                        ),
                        None => (None, None, None),
                    },
                };
                min.push(low);
                max.push(high);
                nulls.push(null_count);
            }
            let array = |values: Vec<Option<ScalarValue>>| -> Option<ArrayRef> {
                let null = ScalarValue::try_from(data_type).ok()?;
                ScalarValue::iter_to_array(values.into_iter().map(|v| v.unwrap_or(null.clone())))
                    .ok()
            };
            if let (Some(min), Some(max)) = (array(min), array(max)) {
                out.insert(
                    column.clone(),
                    ColumnStatistics {
                        min,
                        max,
                        nulls: Arc::new(UInt64Array::from(nulls)),
                    },
                );
            }
        }
        Self {
            columns: out,
            containers: files.len(),
        }
    }
}

/// A value of the log (a partition value, or a statistic written as text) as a scalar of the
/// column's type; `None` when it does not read as one (pruning then keeps the file).
fn typed(text: &str, data_type: &DataType) -> Option<ScalarValue> {
    ScalarValue::try_from_string(text.to_string(), data_type).ok()
}

/// A statistic of the log as a scalar of the column's type. A maximum is widened where the log
/// cuts it: timestamps are kept to the millisecond, strings to a prefix.
fn json_scalar(
    value: &serde_json::Value,
    data_type: &DataType,
    is_max: bool,
) -> Option<ScalarValue> {
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        _ => return None,
    };
    if is_max
        && matches!(
            data_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
        && text.chars().count() >= STRING_STATS_PREFIX
    {
        return None;
    }
    let scalar = typed(&text, data_type)?;
    if !is_max {
        return Some(scalar);
    }
    Some(match scalar {
        ScalarValue::TimestampMicrosecond(Some(v), tz) => {
            ScalarValue::TimestampMicrosecond(Some(v.saturating_add(999)), tz)
        }
        ScalarValue::TimestampNanosecond(Some(v), tz) => {
            ScalarValue::TimestampNanosecond(Some(v.saturating_add(999_999)), tz)
        }
        other => other,
    })
}

impl PruningStatistics for FileStatistics {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.columns.get(&column.name).map(|c| Arc::clone(&c.min))
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.columns.get(&column.name).map(|c| Arc::clone(&c.max))
    }

    fn num_containers(&self) -> usize {
        self.containers
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        self.columns.get(&column.name).map(|c| Arc::clone(&c.nulls))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        None
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::datatypes::{Field, TimeUnit};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("event_date", DataType::Date32, true),
            Field::new("country", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ])
    }

    fn refused(text: &str) -> String {
        match RowPredicate::parse(text, &schema(), "events") {
            Err(Error::InvalidOption { message, .. }) => message,
            other => panic!("`{text}` was not refused: {other:?}"),
        }
    }

    #[test]
    fn bad_predicates_are_refused_by_name() {
        assert!(
            refused("nation = 'DE'").contains("does not have"),
            "{}",
            refused("nation = 'DE'")
        );
        assert!(refused("amount IN (SELECT 1)").contains("subquery"));
        assert!(refused("random() < 0.5").contains("not deterministic"));
        assert!(refused("now() > ts").contains("not deterministic"));
        assert!(refused("amount + 1").contains("not a condition"));
        assert!(refused("").contains("empty"));
        assert!(refused("country = ").contains("not a SQL condition"));
    }

    #[test]
    fn spacing_does_not_change_the_canonical_form() {
        let a = RowPredicate::parse("country='DE'", &schema(), "events").unwrap();
        let b = RowPredicate::parse("  country  =  'DE' ", &schema(), "events").unwrap();
        assert_eq!(a.canonical, b.canonical);
        assert_eq!(b.sql, "country  =  'DE'");
    }

    #[test]
    fn only_true_itself_selects_every_row() {
        for text in ["TRUE", "true", " True "] {
            let predicate = RowPredicate::parse(text, &schema(), "events").unwrap();
            assert!(predicate.selects_every_row(), "{text}: {predicate:?}");
        }
        for text in [
            "1 = 1",
            "country = 'DE'",
            "country IS NULL OR TRUE",
            "NOT FALSE",
        ] {
            let predicate = RowPredicate::parse(text, &schema(), "events").unwrap();
            assert!(!predicate.selects_every_row(), "{text}: {predicate:?}");
        }
    }

    #[test]
    fn files_are_kept_unless_their_values_or_statistics_rule_them_out() {
        let predicate =
            RowPredicate::parse("country = 'DE' AND amount > 10", &schema(), "events").unwrap();
        let de: PartitionValues = [("country".to_string(), Some("DE".to_string()))].into();
        let fr: PartitionValues = [("country".to_string(), Some("FR".to_string()))].into();
        let none = PartitionValues::new();
        let small = r#"{"numRecords":3,"minValues":{"amount":1},"maxValues":{"amount":10},"nullCount":{"amount":0}}"#;
        let big = r#"{"numRecords":3,"minValues":{"amount":5},"maxValues":{"amount":50},"nullCount":{"amount":0}}"#;
        let files = [
            FileFacts {
                values: &de,
                stats: Some(big),
            },
            FileFacts {
                values: &fr,
                stats: Some(big),
            },
            FileFacts {
                values: &de,
                stats: Some(small),
            },
            FileFacts {
                values: &de,
                stats: None,
            },
            FileFacts {
                values: &none,
                stats: Some(big),
            },
        ];
        let schema = schema();
        assert_eq!(
            predicate.may_match(&schema, &files).unwrap(),
            vec![true, false, false, true, true]
        );
    }
}
