//! Comparing old and new rows, and the checks that block a publish (DESIGN §2 `[validate]`, §4.3).
//!
//! [`compare`] is the engine shared by backfill validation and `lakefill diff`: per partition row
//! counts and measure sums, and a row-level diff by key (added, removed, changed rows, with a
//! sample). It works on two tables registered in a DataFusion session as `previous` (old rows)
//! and `output` (new rows) and streams every query, so memory stays bounded by the number of
//! partitions and the sample size, not by the rows. [`validate`] adds the checks of a model's
//! `[validate]` section on top of a comparison and decides whether the run may be published.

use std::collections::BTreeMap;

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::datatypes::{DataType, Int64Type, UInt64Type};
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{Error, QueryContext, Result};
use crate::model::{CheckSpec, ValidateSpec, check_read_only};
use crate::partition::{Layout, NULL_LABEL, PartitionValues, TimeEncoding, label_of};
use crate::protocol::RowRule;
use crate::rowhash::{
    EMPTY_ROW_HASH, PartitionChecksums, ROW_HASH_FUNCTION, RowChecksum, RowHashUdf,
};
use crate::sqltext::ident;

/// How rows are grouped into the partitions reports name.
#[derive(Debug, Clone)]
pub(crate) enum PartitionKey {
    /// By the period of the layout's time column (its label, or `(null)`).
    Time(Layout),
    /// By the raw values of one column, for tables whose time lakefill cannot tell.
    Column(String),
}

impl PartitionKey {
    /// The columns the key reads.
    pub(crate) fn columns(&self) -> Vec<String> {
        match self {
            PartitionKey::Time(layout) => layout
                .time
                .encoding
                .columns()
                .into_iter()
                .map(str::to_string)
                .collect(),
            PartitionKey::Column(column) => vec![column.clone()],
        }
    }

    /// `CAST(<column> AS VARCHAR) AS __lf_t<i>` for each key column, reading `qualify(column)`.
    /// By rows, a date or timestamp is cut to its period first, so rows group by period.
    fn select(&self, qualify: impl Fn(&str) -> String) -> Vec<String> {
        let truncate = match self {
            PartitionKey::Time(layout) if layout.by_rows => match &layout.time.encoding {
                TimeEncoding::Date { .. } | TimeEncoding::Timestamp { .. } => {
                    Some(layout.time.grain.name())
                }
                _ => None,
            },
            _ => None,
        };
        self.columns()
            .iter()
            .enumerate()
            .map(|(i, c)| match truncate {
                Some(grain) => format!(
                    "CAST(date_trunc('{grain}', {}) AS VARCHAR) AS __lf_t{i}",
                    qualify(c)
                ),
                None => format!("CAST({} AS VARCHAR) AS __lf_t{i}", qualify(c)),
            })
            .collect()
    }

    /// The partition label of a row, from the text values of the key columns.
    fn label(&self, texts: &[Option<String>]) -> String {
        match self {
            PartitionKey::Time(layout) => {
                let values: PartitionValues = self
                    .columns()
                    .into_iter()
                    .zip(texts.iter().cloned())
                    .collect();
                label_of(layout, &values)
            }
            PartitionKey::Column(_) => texts
                .first()
                .cloned()
                .flatten()
                .unwrap_or_else(|| NULL_LABEL.to_string()),
        }
    }

    /// The labels of every row of `batch`, whose key columns start at `first`.
    fn labels(&self, batch: &RecordBatch, first: usize) -> Vec<String> {
        let columns: Vec<Vec<Option<String>>> = (0..self.columns().len())
            .map(|i| text_column(batch, first + i))
            .collect();
        (0..batch.num_rows())
            .map(|row| {
                let texts: Vec<Option<String>> = columns.iter().map(|c| c[row].clone()).collect();
                self.label(&texts)
            })
            .collect()
    }
}

/// What to compare: the partitions, the row identity and the summed measures.
#[derive(Debug, Clone)]
pub(crate) struct CompareSpec {
    pub(crate) partitions: PartitionKey,
    pub(crate) key: Vec<String>,
    pub(crate) measures: Vec<String>,
    pub(crate) sample: usize,
    /// The columns whose values make a row (every column but the partition columns, in the
    /// table's order): when set, both sides are checksummed to tell whether they are identical.
    pub(crate) checksum_columns: Option<Vec<String>>,
}

/// Old versus new, per partition and in total.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Comparison {
    /// Columns identifying a row; empty when the row-level diff was skipped.
    pub key: Vec<String>,
    /// Per partition, in order.
    pub partitions: Vec<PartitionComparison>,
    /// Sums over all partitions.
    pub totals: ComparisonTotals,
    /// Partitions that have rows only in the new data.
    pub appeared: Vec<String>,
    /// Partitions that have rows only in the old data.
    pub disappeared: Vec<String>,
    /// Example rows of each kind of difference.
    pub samples: Samples,
    /// Whether both sides hold the same rows, row for row (by checksums of every row); `None`
    /// when not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identical: Option<bool>,
}

/// One partition, old versus new.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PartitionComparison {
    /// Partition value.
    pub value: String,
    /// Rows before.
    pub old_rows: u64,
    /// Rows after.
    pub new_rows: u64,
    /// Sum of each measure, before and after.
    pub measures: BTreeMap<String, MeasureChange>,
    /// Keys only in the new rows.
    pub added: u64,
    /// Keys only in the old rows.
    pub removed: u64,
    /// Keys in both with different values.
    pub changed: u64,
}

/// A measure's sum before and after.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct MeasureChange {
    /// Sum before.
    pub old: f64,
    /// Sum after.
    pub new: f64,
}

/// Sums over all partitions.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ComparisonTotals {
    /// Rows before.
    pub old_rows: u64,
    /// Rows after.
    pub new_rows: u64,
    /// Sum of each measure, before and after.
    pub measures: BTreeMap<String, MeasureChange>,
    /// Keys only in the new rows.
    pub added: u64,
    /// Keys only in the old rows.
    pub removed: u64,
    /// Keys in both with different values.
    pub changed: u64,
}

/// Example rows of each kind of difference.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Samples {
    /// New rows whose key did not exist.
    pub added: Vec<Value>,
    /// Old rows whose key is gone.
    pub removed: Vec<Value>,
    /// Rows whose values changed: key, then old and new values of the changed columns.
    pub changed: Vec<Value>,
}

/// What is known of one side without a scan: rows per partition (from the log or staging) and,
/// when staging computed them, measure sums per partition.
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownSide {
    pub(crate) rows: BTreeMap<String, u64>,
    pub(crate) sums: Option<BTreeMap<String, BTreeMap<String, f64>>>,
    pub(crate) checksums: Option<PartitionChecksums>,
}

impl KnownSide {
    /// Row counts only; measures and checksums, if wanted, need a scan.
    pub(crate) fn rows(rows: BTreeMap<String, u64>) -> Self {
        Self {
            rows,
            sums: None,
            checksums: None,
        }
    }
}

/// One side's known aggregates, if any.
pub(crate) type KnownCounts = Option<KnownSide>;

/// Compares `previous` with `output` in `ctx`.
pub(crate) async fn compare(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old_counts: KnownCounts,
    new_counts: KnownCounts,
) -> Result<Comparison> {
    let started = std::time::Instant::now();
    if spec.checksum_columns.is_some() {
        ctx.register_udf(RowHashUdf::udf());
    }
    let old = side_aggregates(ctx, "previous", spec, old_counts).await?;
    let new = side_aggregates(ctx, "output", spec, new_counts).await?;
    tracing::debug!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "aggregated old and new rows"
    );
    let identical = spec.checksum_columns.as_ref().map(|_| {
        let checksum = |side: &SideAggregates, p: &String| {
            side.get(p)
                .and_then(|totals| totals.checksum)
                .unwrap_or_default()
        };
        old.keys()
            .chain(new.keys())
            .all(|p| checksum(&old, p) == checksum(&new, p))
    });
    let mut partitions: BTreeMap<String, PartitionComparison> = BTreeMap::new();
    for (value, totals) in &old {
        let entry = partitions
            .entry(value.clone())
            .or_insert_with(|| PartitionComparison {
                value: value.clone(),
                ..Default::default()
            });
        entry.old_rows = totals.rows;
        for (measure, sum) in &totals.sums {
            entry.measures.entry(measure.clone()).or_default().old = *sum;
        }
    }
    for (value, totals) in &new {
        let entry = partitions
            .entry(value.clone())
            .or_insert_with(|| PartitionComparison {
                value: value.clone(),
                ..Default::default()
            });
        entry.new_rows = totals.rows;
        for (measure, sum) in &totals.sums {
            entry.measures.entry(measure.clone()).or_default().new = *sum;
        }
    }

    let mut samples = Samples::default();
    // Identical sides have no row differences: the join would only confirm it.
    if !spec.key.is_empty() && identical != Some(true) {
        let started = std::time::Instant::now();
        let diff = row_diff(ctx, spec).await?;
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compared rows by key"
        );
        for (value, counts) in diff.counts {
            let entry = partitions
                .entry(value.clone())
                .or_insert_with(|| PartitionComparison {
                    value,
                    ..Default::default()
                });
            entry.added = counts[0];
            entry.removed = counts[1];
            entry.changed = counts[2];
        }
        samples = diff.samples;
    }

    let partitions: Vec<PartitionComparison> = partitions.into_values().collect();
    let mut totals = ComparisonTotals::default();
    for p in &partitions {
        totals.old_rows += p.old_rows;
        totals.new_rows += p.new_rows;
        totals.added += p.added;
        totals.removed += p.removed;
        totals.changed += p.changed;
        for (measure, change) in &p.measures {
            let total = totals.measures.entry(measure.clone()).or_default();
            total.old += change.old;
            total.new += change.new;
        }
    }
    let appeared = partitions
        .iter()
        .filter(|p| p.old_rows == 0 && p.new_rows > 0)
        .map(|p| p.value.clone())
        .collect();
    let disappeared = partitions
        .iter()
        .filter(|p| p.old_rows > 0 && p.new_rows == 0)
        .map(|p| p.value.clone())
        .collect();
    Ok(Comparison {
        key: spec.key.clone(),
        partitions,
        totals,
        appeared,
        disappeared,
        samples,
        identical,
    })
}

/// What one side holds in one partition.
#[derive(Debug, Clone, Default)]
struct SideTotals {
    rows: u64,
    sums: BTreeMap<String, f64>,
    checksum: Option<RowChecksum>,
}

type SideAggregates = BTreeMap<String, SideTotals>;

/// Row counts, measure sums and (when the spec asks) row checksums per partition of one side.
/// Skips the scan when what is known already answers.
async fn side_aggregates(
    ctx: &SessionContext,
    table: &str,
    spec: &CompareSpec,
    known: KnownCounts,
) -> Result<SideAggregates> {
    if let Some(known) = known
        && (spec.measures.is_empty() || known.sums.is_some())
        && (spec.checksum_columns.is_none() || known.checksums.is_some())
    {
        let sums = known.sums.unwrap_or_default();
        let checksums = known.checksums;
        return Ok(known
            .rows
            .into_iter()
            .map(|(p, rows)| {
                let measures = spec
                    .measures
                    .iter()
                    .map(|m| {
                        (
                            m.clone(),
                            sums.get(&p).and_then(|s| s.get(m)).copied().unwrap_or(0.0),
                        )
                    })
                    .collect();
                let checksum = checksums
                    .as_ref()
                    .map(|c| c.get(&p).copied().unwrap_or_default());
                (
                    p,
                    SideTotals {
                        rows,
                        sums: measures,
                        checksum,
                    },
                )
            })
            .collect());
    }
    let keys = spec.partitions.columns().len();
    let mut select = spec.partitions.select(ident);
    select.push("COUNT(*) AS __lf_rows".to_string());
    for (i, measure) in spec.measures.iter().enumerate() {
        select.push(format!(
            "CAST(SUM({}) AS DOUBLE) AS __lf_m{i}",
            ident(measure)
        ));
    }
    if let Some(columns) = &spec.checksum_columns {
        // The exact sum of 64-bit hashes: DECIMAL(38, 0) holds 2^64 x 2^60 rows.
        let hash = if columns.is_empty() {
            EMPTY_ROW_HASH.to_string()
        } else {
            format!(
                "{ROW_HASH_FUNCTION}({})",
                columns
                    .iter()
                    .map(|c| ident(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        select.push(format!("SUM(CAST({hash} AS DECIMAL(38, 0))) AS __lf_hash"));
    }
    let group_by = (1..=keys)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {} FROM {table} GROUP BY {group_by}",
        select.join(", ")
    );
    let mut out = SideAggregates::new();
    let mut stream = run(ctx, &sql, "aggregate rows per partition").await?;
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("cannot aggregate `{table}`"))?;
        let labels = spec.partitions.labels(&batch, 0);
        let rows = batch.column(keys).as_primitive::<Int64Type>();
        let hashes = spec.checksum_columns.as_ref().map(|_| {
            batch
                .column(keys + 1 + spec.measures.len())
                .as_primitive::<deltalake::arrow::datatypes::Decimal128Type>()
        });
        for (row, label) in labels.into_iter().enumerate() {
            // Several groups may name one partition (its sub-partitions): add them up.
            let totals = out.entry(label).or_default();
            for (i, measure) in spec.measures.iter().enumerate() {
                let column = batch
                    .column(keys + 1 + i)
                    .as_primitive::<deltalake::arrow::datatypes::Float64Type>();
                if !column.is_null(row) {
                    *totals.sums.entry(measure.clone()).or_default() += column.value(row);
                } else {
                    totals.sums.entry(measure.clone()).or_default();
                }
            }
            let group_rows = u64::try_from(rows.value(row)).unwrap_or(0);
            totals.rows += group_rows;
            if let Some(column) = hashes {
                totals
                    .checksum
                    .get_or_insert_with(RowChecksum::default)
                    .merge(&RowChecksum {
                        rows: group_rows,
                        sum: u128::try_from(column.value(row)).unwrap_or(0),
                    });
            }
        }
    }
    Ok(out)
}

struct RowDiff {
    /// Per partition: added, removed, changed.
    counts: BTreeMap<String, [u64; 3]>,
    samples: Samples,
}

/// Full outer join of old and new rows on the key; streams only the rows that differ.
async fn row_diff(ctx: &SessionContext, spec: &CompareSpec) -> Result<RowDiff> {
    let old_columns = column_names(ctx, "previous").await?;
    let new_columns = column_names(ctx, "output").await?;
    let common: Vec<String> = old_columns
        .iter()
        .filter(|c| new_columns.contains(c))
        .cloned()
        .collect();
    let compared: Vec<&String> = common.iter().filter(|c| !spec.key.contains(c)).collect();
    let join = spec
        .key
        .iter()
        .map(|k| format!("o.{0} = n.{0}", ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let differs = if compared.is_empty() {
        "FALSE".to_string()
    } else {
        compared
            .iter()
            .map(|c| format!("(o.{0} IS DISTINCT FROM n.{0})", ident(c)))
            .collect::<Vec<_>>()
            .join(" OR ")
    };
    let keys = spec.partitions.columns().len();
    let mut select = spec
        .partitions
        .select(|c| format!("COALESCE(n.{0}, o.{0})", ident(c)));
    select.push(
        "CASE WHEN o.__lf_o IS NULL THEN 0 WHEN n.__lf_n IS NULL THEN 1 ELSE 2 END AS __lf_kind"
            .to_string(),
    );
    for c in &common {
        select.push(format!(
            "o.{} AS {}",
            ident(c),
            ident(&format!("__lf_old_{c}"))
        ));
    }
    for c in &common {
        select.push(format!(
            "n.{} AS {}",
            ident(c),
            ident(&format!("__lf_new_{c}"))
        ));
    }
    let sql = format!(
        "SELECT {} FROM (SELECT *, TRUE AS __lf_o FROM previous) o \
         FULL OUTER JOIN (SELECT *, TRUE AS __lf_n FROM output) n ON {join} \
         WHERE o.__lf_o IS NULL OR n.__lf_n IS NULL OR ({differs})",
        select.join(", ")
    );
    let mut counts: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    let mut samples = Samples::default();
    let mut stream = run(ctx, &sql, "compare rows by key").await?;
    let width = common.len();
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "cannot compare rows by key".into())?;
        let parts = spec.partitions.labels(&batch, 0);
        let kinds = batch.column(keys).as_primitive::<Int64Type>();
        let mut formatters: Option<Vec<ArrayFormatter>> = None;
        for (row, part) in parts.into_iter().enumerate() {
            let kind = usize::try_from(kinds.value(row)).unwrap_or(2).min(2);
            counts.entry(part.clone()).or_default()[kind] += 1;
            let bucket = match kind {
                0 => &mut samples.added,
                1 => &mut samples.removed,
                _ => &mut samples.changed,
            };
            if bucket.len() >= spec.sample {
                continue;
            }
            let formatters = match &mut formatters {
                Some(f) => f,
                None => formatters.insert(formatters_for(&batch)?),
            };
            let cell = |column: usize| -> Value {
                if batch.column(column).is_null(row) {
                    Value::Null
                } else {
                    Value::String(formatters[column].value(row).to_string())
                }
            };
            let sample = match kind {
                0 | 1 => {
                    let offset = if kind == 0 {
                        keys + 1 + width
                    } else {
                        keys + 1
                    };
                    let mut values = Map::new();
                    for (i, c) in common.iter().enumerate() {
                        values.insert(c.clone(), cell(offset + i));
                    }
                    json!({"partition": part, "row": values})
                }
                _ => {
                    let mut key = Map::new();
                    let mut old = Map::new();
                    let mut new = Map::new();
                    for (i, c) in common.iter().enumerate() {
                        let (o, n) = (cell(keys + 1 + i), cell(keys + 1 + width + i));
                        if spec.key.contains(c) {
                            key.insert(c.clone(), n);
                        } else if o != n {
                            old.insert(c.clone(), o);
                            new.insert(c.clone(), n);
                        }
                    }
                    json!({"partition": part, "key": key, "old": old, "new": new})
                }
            };
            bucket.push(sample);
        }
    }
    Ok(RowDiff { counts, samples })
}

/// The rules of a model's `[validate]` section, parsed and checked against the target.
#[derive(Debug, Clone, Default)]
pub(crate) struct ValidationRules {
    pub(crate) key: Vec<String>,
    pub(crate) measures: Vec<String>,
    pub(crate) max_row_change: Option<Threshold>,
    pub(crate) max_measure_change: Option<Threshold>,
    pub(crate) conserve: Vec<String>,
    pub(crate) checks: Vec<CheckSpec>,
    /// Rules of the target's protocol (constraints, NOT NULL, invariants, generated columns).
    pub(crate) protocol: Vec<RowRule>,
}

/// A limit on a change: a percentage of the old value, or an absolute amount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Threshold {
    Percent(f64),
    Absolute(f64),
}

impl Threshold {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        match text.strip_suffix('%') {
            Some(number) => number
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| *n >= 0.0)
                .map(Threshold::Percent),
            None => text
                .parse::<f64>()
                .ok()
                .filter(|n| *n >= 0.0)
                .map(Threshold::Absolute),
        }
    }

    fn exceeded(&self, old: f64, new: f64) -> bool {
        let change = (new - old).abs();
        match self {
            Threshold::Absolute(limit) => change > *limit,
            Threshold::Percent(limit) => {
                if old == 0.0 {
                    change > 0.0
                } else {
                    change / old.abs() * 100.0 > *limit
                }
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Threshold::Percent(p) => format!("{p}%"),
            Threshold::Absolute(a) => format!("{a}"),
        }
    }
}

impl ValidationRules {
    /// Parses `spec`; `columns` are the target's columns. Errors name the model file's field.
    pub(crate) fn from_spec(
        spec: Option<&ValidateSpec>,
        columns: &[String],
        path: &std::path::Path,
    ) -> Result<Self> {
        let Some(spec) = spec else {
            return Ok(Self::default());
        };
        let model_error = |message: String, hint: String| Error::Model {
            path: path.to_path_buf(),
            message,
            hint,
        };
        let known = || {
            columns
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (field, names) in [
            ("key", &spec.key),
            ("measures", &spec.measures),
            ("conserve", &spec.conserve),
        ] {
            for name in names.iter() {
                if !columns.contains(name) {
                    return Err(model_error(
                        format!(
                            "`validate.{field}` names `{name}`, which the target does not have"
                        ),
                        format!("use columns of the target: {}", known()),
                    ));
                }
            }
        }
        let threshold = |field: &str, value: &Option<String>| -> Result<Option<Threshold>> {
            value
                .as_deref()
                .map(|text| {
                    Threshold::parse(text).ok_or_else(|| {
                        model_error(
                            format!("`validate.{field}` is `{text}`, which is neither a percentage nor a number"),
                            format!("write `{field} = \"5%\"` (relative to the old value) or `{field} = \"100\"` (absolute)"),
                        )
                    })
                })
                .transpose()
        };
        for check in &spec.checks {
            let statements = deltalake::datafusion::sql::parser::DFParser::parse_sql_with_dialect(
                &check.sql,
                &deltalake::datafusion::sql::sqlparser::dialect::GenericDialect {},
            )
            .map_err(|e| {
                model_error(
                    format!("check `{}` does not parse: {e}", check.name),
                    "write the check as a SELECT over `output` and `previous` that returns the offending rows".into(),
                )
            })?;
            if statements.len() != 1 || statements.iter().any(|s| check_read_only(s).is_err()) {
                return Err(model_error(
                    format!("check `{}` must be one read-only SELECT", check.name),
                    "write the check as a SELECT over `output` and `previous` that returns the offending rows".into(),
                ));
            }
        }
        Ok(Self {
            key: spec.key.clone(),
            measures: spec.measures.clone(),
            max_row_change: threshold("max_row_change", &spec.max_row_change)?,
            max_measure_change: threshold("max_measure_change", &spec.max_measure_change)?,
            conserve: spec.conserve.clone(),
            checks: spec.checks.clone(),
            protocol: Vec::new(),
        })
    }

    /// Measures to sum: the declared ones plus the conserved ones.
    pub(crate) fn summed_measures(&self) -> Vec<String> {
        let mut measures = self.measures.clone();
        for m in &self.conserve {
            if !measures.contains(m) {
                measures.push(m.clone());
            }
        }
        measures
    }
}

/// The outcome of validation, saved with the run and summarised into the commit.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ValidationReport {
    /// Whether every check passed.
    pub passed: bool,
    /// Each check with its outcome.
    pub checks: Vec<CheckResult>,
    /// The old-versus-new comparison the checks ran on.
    pub comparison: Comparison,
    /// Wall time of validation.
    pub elapsed_ms: u64,
}

/// One check and its outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckResult {
    /// Name of the check.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// What failed, with the partition and the numbers.
    pub failures: Vec<Value>,
    /// Example offending rows.
    pub sample: Vec<Value>,
    /// Whether the check comes from the table's protocol: its failure cannot be forced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub protocol: bool,
}

impl CheckResult {
    pub(crate) fn new(name: impl Into<String>, failures: Vec<Value>, sample: Vec<Value>) -> Self {
        Self {
            name: name.into(),
            passed: failures.is_empty(),
            failures,
            sample,
            protocol: false,
        }
    }
}

impl ValidationReport {
    /// Returns the compact form written into commit metadata.
    pub fn summary(&self) -> crate::log::metadata::ValidationSummary {
        crate::log::metadata::ValidationSummary {
            passed: self.passed,
            checks: self
                .checks
                .iter()
                .map(|c| crate::log::metadata::CheckSummary {
                    name: c.name.clone(),
                    passed: c.passed,
                    failures: c.failures.len(),
                })
                .collect(),
            totals: json!({
                "old_rows": self.comparison.totals.old_rows,
                "new_rows": self.comparison.totals.new_rows,
                "added": self.comparison.totals.added,
                "removed": self.comparison.totals.removed,
                "changed": self.comparison.totals.changed,
                "measures": self.comparison.totals.measures,
            }),
            identical: self.comparison.identical,
            forced: false,
            force_reason: None,
        }
    }

    /// Returns the names of the failed checks that come from the table's protocol.
    pub fn protocol_violations(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.passed && c.protocol)
            .map(|c| c.name.clone())
            .collect()
    }

    /// Returns the names of the failed checks.
    pub fn failed(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.clone())
            .collect()
    }
}

/// Runs every check of `rules` over `previous` and `output` in `ctx`.
pub(crate) async fn validate(
    ctx: &SessionContext,
    partitions: &PartitionKey,
    rules: &ValidationRules,
    sample: usize,
    new_counts: KnownCounts,
    checksum_columns: Vec<String>,
    extra_checks: Vec<CheckResult>,
) -> Result<ValidationReport> {
    let started = std::time::Instant::now();
    let spec = CompareSpec {
        partitions: partitions.clone(),
        key: rules.key.clone(),
        measures: rules.summed_measures(),
        sample,
        checksum_columns: Some(checksum_columns),
    };
    // The old side is always scanned: its counts then honour deletion vectors, which the log's
    // statistics do not.
    let comparison = compare(ctx, &spec, None, new_counts).await?;
    crate::failpoint::reach("mid-validate").await?;
    let mut checks = extra_checks;

    if !rules.key.is_empty() {
        let started = std::time::Instant::now();
        let (unique, not_null) = key_checks(ctx, &rules.key, sample).await?;
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checked keys"
        );
        checks.push(unique);
        checks.push(not_null);
    }
    if let Some(limit) = rules.max_row_change {
        let failures = comparison
            .partitions
            .iter()
            .filter(|p| limit.exceeded(p.old_rows as f64, p.new_rows as f64))
            .map(|p| {
                json!({
                    "partition": p.value, "old_rows": p.old_rows, "new_rows": p.new_rows,
                    "change": p.new_rows as i64 - p.old_rows as i64, "limit": limit.describe(),
                })
            })
            .collect();
        checks.push(CheckResult::new("max_row_change", failures, Vec::new()));
    }
    if let Some(limit) = rules.max_measure_change {
        let mut failures = Vec::new();
        for p in &comparison.partitions {
            for measure in &rules.measures {
                let change = p.measures.get(measure).cloned().unwrap_or_default();
                if limit.exceeded(change.old, change.new) {
                    failures.push(json!({
                        "partition": p.value, "measure": measure, "old": change.old, "new": change.new,
                        "change": change.new - change.old, "limit": limit.describe(),
                    }));
                }
            }
        }
        checks.push(CheckResult::new("max_measure_change", failures, Vec::new()));
    }
    for measure in &rules.conserve {
        let total = comparison
            .totals
            .measures
            .get(measure)
            .cloned()
            .unwrap_or_default();
        let tolerance = 1e-9 * total.old.abs().max(1.0);
        let failures = if (total.new - total.old).abs() > tolerance {
            vec![
                json!({"measure": measure, "old_total": total.old, "new_total": total.new, "change": total.new - total.old}),
            ]
        } else {
            Vec::new()
        };
        checks.push(CheckResult::new(
            format!("conserve({measure})"),
            failures,
            Vec::new(),
        ));
    }
    for check in &rules.checks {
        let (rows, sample_rows) =
            count_and_sample(ctx, &check.sql, sample, &format!("check `{}`", check.name))
                .await
                .map_err(|error| match error {
                    Error::Query { source, .. } => Error::Check {
                        name: check.name.clone(),
                        source,
                    },
                    other => other,
                })?;
        let failures = if rows > 0 {
            vec![
                json!({"rows": rows, "message": format!("the check returned {rows} rows; it must return none")}),
            ]
        } else {
            Vec::new()
        };
        checks.push(CheckResult::new(
            format!("check: {}", check.name),
            failures,
            sample_rows,
        ));
    }
    checks.extend(protocol_checks(ctx, partitions, &rules.protocol, sample).await?);
    let passed = checks.iter().all(|c| c.passed);
    Ok(ValidationReport {
        passed,
        checks,
        comparison,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// The table's protocol rules over the new rows: one scan counts every rule's violations per
/// partition, then a few rows of each broken rule are fetched as a sample.
async fn protocol_checks(
    ctx: &SessionContext,
    partitions: &PartitionKey,
    rules: &[RowRule],
    sample: usize,
) -> Result<Vec<CheckResult>> {
    if rules.is_empty() {
        return Ok(Vec::new());
    }
    let counts = rules
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            format!(
                "SUM(CASE WHEN {} THEN 1 ELSE 0 END) AS __lf_r{i}",
                rule.violation
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let keys = partitions.columns().len();
    let group_by = (1..=keys)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {}, {counts} FROM output GROUP BY {group_by}",
        partitions.select(ident).join(", ")
    );
    let mut violations: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); rules.len()];
    let mut stream = run(ctx, &sql, "check the table's constraints").await?;
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "cannot check the table's constraints".into())?;
        let parts = partitions.labels(&batch, 0);
        for (i, found) in violations.iter_mut().enumerate() {
            let column = batch.column(keys + i).as_primitive::<Int64Type>();
            for (row, part) in parts.iter().enumerate() {
                let n = if column.is_null(row) {
                    0
                } else {
                    column.value(row)
                };
                if n > 0 {
                    *found.entry(part.clone()).or_default() += u64::try_from(n).unwrap_or(0);
                }
            }
        }
    }
    let mut checks = Vec::new();
    for (rule, found) in rules.iter().zip(violations) {
        let failures: Vec<Value> = found
            .iter()
            .map(|(partition, rows)| {
                json!({"partition": partition, "rows": rows, "message": format!("{rows} staged rows break `{}`", rule.name)})
            })
            .collect();
        let rows = if failures.is_empty() || sample == 0 {
            Vec::new()
        } else {
            count_and_sample(
                ctx,
                &format!(
                    "SELECT * FROM output WHERE {} LIMIT {sample}",
                    rule.violation
                ),
                sample,
                &format!("sample the rows that break `{}`", rule.name),
            )
            .await?
            .1
        };
        let mut check = CheckResult::new(rule.name.clone(), failures, rows);
        check.protocol = true;
        checks.push(check);
    }
    Ok(checks)
}

/// The row count and checksum of every row of `table` (columns `columns`, in order).
pub(crate) async fn checksum_of(
    ctx: &SessionContext,
    table: &str,
    columns: &[String],
) -> Result<RowChecksum> {
    ctx.register_udf(RowHashUdf::udf());
    let hash = if columns.is_empty() {
        EMPTY_ROW_HASH.to_string()
    } else {
        format!(
            "{ROW_HASH_FUNCTION}({})",
            columns
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let sql = format!("SELECT COUNT(*), SUM(CAST({hash} AS DECIMAL(38, 0))) FROM {table}");
    let mut stream = run(ctx, &sql, &format!("checksum `{table}`")).await?;
    let mut checksum = RowChecksum::default();
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("cannot checksum `{table}`"))?;
        for row in 0..batch.num_rows() {
            let rows = batch.column(0).as_primitive::<Int64Type>().value(row);
            let sums = batch
                .column(1)
                .as_primitive::<deltalake::arrow::datatypes::Decimal128Type>();
            checksum.merge(&RowChecksum {
                rows: u64::try_from(rows).unwrap_or(0),
                sum: if sums.is_null(row) {
                    0
                } else {
                    u128::try_from(sums.value(row)).unwrap_or(0)
                },
            });
        }
    }
    Ok(checksum)
}

/// Key uniqueness and NOT NULL keys of the new rows, in one aggregation.
async fn key_checks(
    ctx: &SessionContext,
    key: &[String],
    sample: usize,
) -> Result<(CheckResult, CheckResult)> {
    let columns = key.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", ");
    let any_null = key
        .iter()
        .map(|k| format!("{} IS NULL", ident(k)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let sql = format!(
        "SELECT {columns}, COUNT(*) AS copies, ({any_null}) AS __lf_null FROM output \
         GROUP BY {columns} HAVING COUNT(*) > 1 OR ({any_null})"
    );
    let mut stream = run(ctx, &sql, "check keys").await?;
    let (mut duplicate_keys, mut null_rows) = (0u64, 0u64);
    let (mut duplicate_sample, mut null_sample) = (Vec::new(), Vec::new());
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "key checks failed".into())?;
        let copies = batch.column(key.len()).as_primitive::<Int64Type>();
        let nulls = batch.column(key.len() + 1).as_boolean();
        let shown = batch
            .project(&(0..=key.len()).collect::<Vec<_>>())
            .map_err(|e| Error::Internal(e.to_string()))?;
        let rows = batch_to_json(&shown, batch.num_rows())?;
        for (row, value) in rows.into_iter().enumerate() {
            if nulls.value(row) {
                null_rows += u64::try_from(copies.value(row)).unwrap_or(0);
                if null_sample.len() < sample {
                    null_sample.push(value);
                }
            } else {
                duplicate_keys += 1;
                if duplicate_sample.len() < sample {
                    duplicate_sample.push(value);
                }
            }
        }
    }
    let unique = if duplicate_keys > 0 {
        vec![
            json!({"duplicate_keys": duplicate_keys, "message": format!("{duplicate_keys} keys occur more than once in the new rows")}),
        ]
    } else {
        Vec::new()
    };
    let not_null = if null_rows > 0 {
        vec![
            json!({"rows": null_rows, "message": format!("{null_rows} new rows have a NULL key column")}),
        ]
    } else {
        Vec::new()
    };
    Ok((
        CheckResult::new("key_unique", unique, duplicate_sample),
        CheckResult::new("key_not_null", not_null, null_sample),
    ))
}

/// Streams `sql`, counting its rows and keeping the first `sample` as JSON objects.
pub(crate) async fn count_and_sample(
    ctx: &SessionContext,
    sql: &str,
    sample: usize,
    what: &str,
) -> Result<(u64, Vec<Value>)> {
    let mut stream = run(ctx, sql, what).await?;
    let mut rows = 0u64;
    let mut sampled = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("{what} failed"))?;
        if sampled.len() < sample && batch.num_rows() > 0 {
            sampled.extend(batch_to_json(&batch, sample - sampled.len())?);
        }
        rows += batch.num_rows() as u64;
    }
    Ok((rows, sampled))
}

/// Formats up to `limit` rows of `batch` as JSON objects of text values.
pub(crate) fn batch_to_json(batch: &RecordBatch, limit: usize) -> Result<Vec<Value>> {
    let formatters = formatters_for(batch)?;
    let schema = batch.schema();
    Ok((0..batch.num_rows().min(limit))
        .map(|row| {
            let mut object = Map::new();
            for (i, field) in schema.fields().iter().enumerate() {
                let value = if batch.column(i).is_null(row) {
                    Value::Null
                } else {
                    Value::String(formatters[i].value(row).to_string())
                };
                object.insert(field.name().clone(), value);
            }
            Value::Object(object)
        })
        .collect())
}

fn formatters_for(batch: &RecordBatch) -> Result<Vec<ArrayFormatter<'_>>> {
    let options = FormatOptions::default();
    batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Internal(format!("cannot format values: {e}")))
}

async fn run(
    ctx: &SessionContext,
    sql: &str,
    what: &str,
) -> Result<deltalake::datafusion::execution::SendableRecordBatchStream> {
    let options = crate::sqltext::read_only();
    let df = ctx
        .sql_with_options(sql, options)
        .await
        .query_context(|| format!("cannot plan the query to {what}"))?;
    df.execute_stream()
        .await
        .query_context(|| format!("cannot run the query to {what}"))
}

async fn column_names(ctx: &SessionContext, table: &str) -> Result<Vec<String>> {
    let provider = ctx
        .table_provider(table)
        .await
        .query_context(|| format!("table `{table}` is not registered"))?;
    Ok(provider
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// Text values of a column (any string type, or cast through the formatter).
fn text_column(batch: &RecordBatch, index: usize) -> Vec<Option<String>> {
    let column = batch.column(index);
    match column.data_type() {
        DataType::Utf8 => column
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        DataType::LargeUtf8 => column
            .as_string::<i64>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        DataType::Utf8View => column
            .as_string_view()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        DataType::UInt64 => column
            .as_primitive::<UInt64Type>()
            .iter()
            .map(|v| v.map(|n| n.to_string()))
            .collect(),
        _ => {
            let options = FormatOptions::default();
            match ArrayFormatter::try_new(column.as_ref(), &options) {
                Ok(f) => (0..column.len())
                    .map(|i| (!column.is_null(i)).then(|| f.value(i).to_string()))
                    .collect(),
                Err(_) => vec![None; column.len()],
            }
        }
    }
}

/// Makes the known-count maps from `(partition, rows)` pairs.
pub(crate) fn counts_from<'a>(
    pairs: impl IntoIterator<Item = (&'a String, u64)>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (p, n) in pairs {
        *out.entry(p.clone()).or_default() += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_and_compare() {
        assert_eq!(Threshold::parse("5%"), Some(Threshold::Percent(5.0)));
        assert_eq!(Threshold::parse(" 100 "), Some(Threshold::Absolute(100.0)));
        assert_eq!(Threshold::parse("five"), None);
        assert_eq!(Threshold::parse("-1"), None);
        assert!(Threshold::Percent(5.0).exceeded(100.0, 106.0));
        assert!(!Threshold::Percent(5.0).exceeded(100.0, 95.0));
        assert!(Threshold::Percent(5.0).exceeded(0.0, 1.0));
        assert!(!Threshold::Absolute(10.0).exceeded(100.0, 110.0));
        assert!(Threshold::Absolute(10.0).exceeded(100.0, 89.0));
    }
}
