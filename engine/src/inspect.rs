//! Explaining history: `history`, `blame`, `sql` with time travel, and `diff` (DESIGN §3, §5).
//!
//! `history` and `blame` read commit files of the Delta log (the run metadata lakefill writes into
//! each commit), never data. `sql` runs read-only queries over the project's tables at any
//! version. `diff` compares two versions, or a version and a staged run, with the engine of
//! [`crate::validate`], scanning only the partitions whose files differ.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use deltalake::DeltaTable;
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::logical_expr::{Expr, lit};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::datafusion::sql::parser::DFParser;
use deltalake::datafusion::sql::resolve::resolve_table_references;
use deltalake::datafusion::sql::sqlparser::dialect::GenericDialect;
use futures::StreamExt;
use serde::Serialize;

use crate::config::Project;
use crate::error::{DeltaContext, Error, QueryContext, Result};
use crate::journal::Journal;
use crate::log::{Commit, CommitMetadata, read_commit};
use crate::model::{Model, check_read_only, list_models};
use crate::partition::{Layout, NULL_LABEL, PartitionRange, PartitionValues, label_of};
use crate::staged::StagedTable;
use crate::storage::{TableVersion, loaded_version, open_table, open_table_at};
use crate::time::Period;
use crate::validate::{CompareSpec, Comparison, KnownSide, PartitionKey, compare};

/// One version of a table, as `lakefill history` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    /// The version.
    pub version: u64,
    /// Commit time (RFC 3339), from `commitInfo.timestamp`.
    pub timestamp: Option<String>,
    /// The operation (`WRITE`, `CREATE TABLE`, ...).
    pub operation: Option<String>,
    /// The lakefill run that made the commit, if any.
    pub run_id: Option<String>,
    /// `model@version` of that run.
    pub model: Option<String>,
    /// The reason recorded with the run.
    pub reason: Option<String>,
    /// The range of the run.
    pub range: Option<(String, String)>,
    /// Partition values the commit added or removed files in.
    pub partitions: Vec<String>,
    /// Files added.
    pub files_added: u64,
    /// Files removed.
    pub files_removed: u64,
    /// The run's metadata, as committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lakefill: Option<CommitMetadata>,
}

/// The labels of the partitions a commit touched: periods when the layout is known, else the
/// raw values.
fn labels(layout: Option<&Layout>, commit: &Commit) -> BTreeSet<String> {
    commit
        .partitions
        .iter()
        .map(|values| match layout {
            Some(layout) => label_of(layout, values),
            None => {
                let mut pairs: Vec<_> = values.iter().collect();
                pairs.sort();
                pairs
                    .iter()
                    .map(|(_, v)| (*v).clone().unwrap_or_else(|| NULL_LABEL.to_string()))
                    .collect::<Vec<_>>()
                    .join("/")
            }
        })
        .collect()
}

fn entry(version: u64, commit: Commit, layout: Option<&Layout>) -> HistoryEntry {
    let partitions = labels(layout, &commit);
    let info = &commit.info;
    let lakefill = commit.lakefill();
    HistoryEntry {
        version,
        timestamp: info["timestamp"]
            .as_i64()
            .and_then(DateTime::<Utc>::from_timestamp_millis)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        operation: info["operation"].as_str().map(str::to_string),
        run_id: commit.run_id().map(str::to_string),
        model: lakefill
            .as_ref()
            .map(|m| format!("{}@{}", m.model, m.model_version)),
        reason: lakefill.as_ref().and_then(|m| m.reason.clone()),
        range: lakefill.as_ref().map(|m| m.range.clone()),
        partitions: partitions.into_iter().collect(),
        files_added: commit.added,
        files_removed: commit.removed,
        lakefill,
    }
}

/// Lists the newest `limit` versions of `table`, newest first.
pub async fn history(project: &Project, table: &str, limit: usize) -> Result<Vec<HistoryEntry>> {
    let config = project.table(table, "the command line")?;
    let opened = open_table(config, None).await?;
    let layout = table_layout(project, table, &opened);
    let latest = loaded_version(&opened)?;
    let mut entries = Vec::new();
    for version in (0..=latest).rev().take(limit) {
        match read_commit(&opened, version).await? {
            Some(commit) => entries.push(entry(version, commit, layout.as_ref())),
            None => break,
        }
    }
    Ok(entries)
}

/// What last wrote a partition, as `lakefill blame` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BlameReport {
    /// The table.
    pub table: String,
    /// The partition value.
    pub partition: String,
    /// Current files of the partition.
    pub files: u64,
    /// Current rows, when every file has stats.
    pub rows: Option<u64>,
    /// The commit that last added or removed files in the partition; `None` when no retained
    /// commit did.
    pub last_write: Option<HistoryEntry>,
}

/// Finds the commit that last wrote `partition` of `table`, and the run behind it.
///
/// `partition` is a period (`2026-01-05`, `2026-01`, `2026-01-05T13`, or the table's own
/// spelling of one), or `null` for the partition whose time is NULL; every sub-partition under
/// it counts.
pub async fn blame(project: &Project, table: &str, partition: &str) -> Result<BlameReport> {
    let config = project.table(table, "the command line")?;
    let opened = open_table(config, None).await?;
    let snapshot = opened
        .snapshot()
        .delta_context(|| format!("cannot read `{table}`"))?;
    if snapshot.metadata().partition_columns().is_empty() {
        return Err(Error::Partitioning {
            message: format!("table `{table}` is not partitioned"),
            hint: "blame works on partitioned tables; use `lakefill history` instead".into(),
        });
    }
    let layout = table_layout(project, table, &opened);
    // What the user wrote, as the label reports use.
    let wanted = match &layout {
        Some(layout) if partition.eq_ignore_ascii_case("null") => NULL_LABEL.to_string(),
        Some(layout) => PartitionRange::parse(partition, partition, &layout.time, false)
            .map(|(range, _)| range.from)
            .unwrap_or_else(|_| partition.to_string()),
        None => partition.to_string(),
    };
    let matches = |values: &PartitionValues| match &layout {
        Some(layout) => label_of(layout, values) == wanted,
        None => values.values().any(|v| v.as_deref() == Some(partition)),
    };
    let (mut files, mut rows) = (0u64, Some(0u64));
    for file in snapshot.log_data().iter() {
        if matches(&file.partition_values_map()) {
            files += 1;
            let deleted = file
                .deletion_vector_descriptor()
                .map_or(0, |dv| u64::try_from(dv.cardinality).unwrap_or(0));
            rows = rows
                .zip(file.num_records())
                .map(|(a, b)| a + (b as u64).saturating_sub(deleted));
        }
    }
    let latest = loaded_version(&opened)?;
    let mut last_write = None;
    for version in (0..=latest).rev() {
        let Some(commit) = read_commit(&opened, version).await? else {
            break;
        };
        if commit.partitions.iter().any(&matches) {
            last_write = Some(entry(version, commit, layout.as_ref()));
            break;
        }
    }
    Ok(BlameReport {
        table: table.to_string(),
        partition: wanted,
        files,
        rows,
        last_write,
    })
}

/// How `table` is partitioned, as the newest model writing it declares it, or as its log shows
/// it; `None` when its time cannot be told.
pub(crate) fn table_layout(project: &Project, name: &str, table: &DeltaTable) -> Option<Layout> {
    let snapshot = table.snapshot().ok()?;
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    if partition_columns.is_empty() {
        return None;
    }
    let mut values: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in snapshot.log_data().iter() {
        for (column, value) in file.partition_values_map() {
            if let Some(value) = value {
                values.entry(column).or_default().insert(value);
            }
        }
    }
    let values: BTreeMap<String, Vec<String>> = values
        .into_iter()
        .map(|(c, v)| (c, v.into_iter().collect()))
        .collect();
    let schema = snapshot.snapshot().arrow_schema();
    let model = list_models(&project.sql_dir())
        .into_iter()
        .filter_map(|m| Model::load(project, &m, None).ok())
        .find(|m| m.header().target == name);
    if let Some(model) = &model
        && let Ok(layout) = Layout::detect(
            name,
            &partition_columns,
            &schema,
            &values,
            &model.header().partition_by,
            model.grain(),
            model.header().format.as_deref(),
        )
    {
        return Some(layout);
    }
    Layout::detect(
        name,
        &partition_columns,
        &schema,
        &values,
        &partition_columns,
        None,
        None,
    )
    .ok()
}

/// The result of `lakefill sql`.
#[derive(Debug, Clone, Serialize)]
pub struct QueryResult {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows as text values (`null` for NULL), at most `max_rows`.
    pub rows: Vec<Vec<Option<String>>>,
    /// Whether more rows existed than were kept.
    pub truncated: bool,
    /// Tables read, with the version each was read at.
    pub tables: BTreeMap<String, u64>,
    /// The batches, for rendering (not serialized).
    #[serde(skip)]
    pub batches: Vec<RecordBatch>,
}

impl QueryResult {
    /// Formats the kept rows as a text table.
    pub fn to_table(&self) -> Result<String> {
        deltalake::arrow::util::pretty::pretty_format_batches(&self.batches)
            .map(|t| t.to_string())
            .map_err(|e| Error::Internal(format!("cannot format the result: {e}")))
    }
}

/// Runs a read-only query over the project's tables. `name@VERSION` and `name@TIMESTAMP`
/// (RFC 3339) read a table by time travel; quote them: `"events@12"`.
pub async fn sql(project: &Project, query: &str, max_rows: usize) -> Result<QueryResult> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!(
                "the query is {} bytes long; `lakefill sql` takes at most {MAX_QUERY_BYTES}",
                query.len()
            ),
        });
    }
    let statements = DFParser::parse_sql_with_dialect(query, &GenericDialect {}).map_err(|e| {
        Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!("the SQL does not parse: {e}"),
        }
    })?;
    if statements.len() != 1 {
        return Err(Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: "give exactly one SELECT statement".into(),
        });
    }
    let statement = &statements[0];
    check_read_only(statement).map_err(|kind| Error::InvalidOption {
        option: "QUERY".into(),
        value: shortened(query),
        message: format!("{kind} statements are not allowed; `lakefill sql` only reads"),
    })?;
    let (references, _) =
        resolve_table_references(statement, false).map_err(|e| Error::InvalidOption {
            option: "QUERY".into(),
            value: shortened(query),
            message: format!("cannot list the tables it reads: {e}"),
        })?;

    let ctx = deltalake::delta_datafusion::create_session().into_inner();
    let mut tables = BTreeMap::new();
    for reference in references {
        let name = reference.table().to_string();
        let (base, at) = parse_table_at(&name)?;
        let config = project.table(base, "the query")?;
        let opened = open_table_at(config, at).await?;
        tables.insert(name.clone(), loaded_version(&opened)?);
        let provider = opened
            .table_provider()
            .await
            .query_context(|| format!("cannot read `{name}`"))?;
        ctx.register_table(name.as_str(), provider)
            .query_context(|| format!("cannot register `{name}`"))?;
    }
    let options = crate::sqltext::read_only();
    let df = ctx
        .sql_with_options(query, options)
        .await
        .map_err(|source| Error::Sql {
            source: Box::new(source),
        })?;
    let columns: Vec<String> = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut stream = df.execute_stream().await.map_err(|source| Error::Sql {
        source: Box::new(source),
    })?;
    let mut kept = 0usize;
    let mut truncated = false;
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|source| Error::Sql {
            source: Box::new(source),
        })?;
        if kept >= max_rows {
            truncated |= batch.num_rows() > 0;
            // Stop reading: nothing more will be shown.
            break;
        }
        let take = batch.num_rows().min(max_rows - kept);
        truncated |= take < batch.num_rows();
        kept += take;
        batches.push(batch.slice(0, take));
    }
    let mut rows = Vec::with_capacity(kept);
    for batch in &batches {
        for row in crate::validate::batch_to_json(batch, batch.num_rows())? {
            rows.push(
                columns
                    .iter()
                    .map(|c| row.get(c).and_then(|v| v.as_str().map(str::to_string)))
                    .collect(),
            );
        }
    }
    Ok(QueryResult {
        columns,
        rows,
        truncated,
        tables,
        batches,
    })
}

/// The longest query `lakefill sql` runs.
const MAX_QUERY_BYTES: usize = 1024 * 1024;

/// A query as error messages quote it: at most its first 120 characters.
fn shortened(query: &str) -> String {
    let mut chars = query.chars();
    let head: String = chars.by_ref().take(120).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// Splits `events@12` or `events@2026-01-31T00:00:00Z` into the table and its version.
fn parse_table_at(name: &str) -> Result<(&str, TableVersion)> {
    let Some((base, at)) = name.split_once('@') else {
        return Ok((name, TableVersion::Latest));
    };
    if let Ok(version) = at.parse::<u64>() {
        return Ok((base, TableVersion::Version(version)));
    }
    let time = DateTime::parse_from_rfc3339(at)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDate::parse_from_str(at, "%Y-%m-%d").map(|d| {
                d.and_hms_opt(0, 0, 0)
                    .expect("midnight exists")
                    .and_utc()
            })
        })
        .map_err(|_| Error::InvalidOption {
            option: "QUERY".into(),
            value: name.to_string(),
            message: "after `@` give a version number or an RFC 3339 time, e.g. `events@12` or `events@2026-01-31T00:00:00Z`".into(),
        })?;
    Ok((base, TableVersion::Timestamp(time)))
}

/// What `lakefill diff` compares the old version with.
#[derive(Debug, Clone)]
pub enum DiffTarget {
    /// Another version of the table (`None`: the latest).
    Version(Option<u64>),
    /// A staged run's files.
    Run(String),
}

/// The result of `lakefill diff`.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// The table.
    pub table: String,
    /// The old version.
    pub from_version: u64,
    /// The new version, when comparing versions.
    pub to_version: Option<u64>,
    /// The staged run, when comparing with one.
    pub run_id: Option<String>,
    /// The partition column.
    pub partition_column: String,
    /// Partitions whose files differ (only these were scanned).
    pub changed_partitions: usize,
    /// Partitions whose files are identical in both.
    pub unchanged_partitions: usize,
    /// The measures summed per partition.
    pub measures: Vec<String>,
    /// The comparison of the changed partitions.
    pub comparison: Comparison,
}

/// Compares `table` at `from_version` with another version or a staged run.
///
/// `key` and `measures` default to the `[validate]` section of the newest model writing `table`.
pub async fn diff(
    project: &Project,
    table: &str,
    from_version: u64,
    target: DiffTarget,
    key: Option<Vec<String>>,
    sample: usize,
) -> Result<DiffReport> {
    let config = project.table(table, "the command line")?;
    let old = open_table(config, Some(from_version)).await?;
    let old_snapshot = old
        .snapshot()
        .delta_context(|| format!("cannot read `{table}`"))?;
    let Some(first_column) = old_snapshot.metadata().partition_columns().first().cloned() else {
        return Err(Error::Partitioning {
            message: format!("table `{table}` is not partitioned"),
            hint: "diff compares partitioned tables partition by partition".into(),
        });
    };
    let partitions = match table_layout(project, table, &old) {
        Some(layout) => PartitionKey::Time(layout),
        None => PartitionKey::Column(first_column),
    };
    let schema = old_snapshot.snapshot().arrow_schema();
    let (model_key, measures) = model_defaults(project, table);
    let key = key.unwrap_or(model_key);
    for k in &key {
        if schema.field_with_name(k).is_err() {
            return Err(Error::InvalidOption {
                option: "--key".into(),
                value: k.clone(),
                message: format!("`{table}` has no column `{k}`"),
            });
        }
    }
    let measures: Vec<String> = measures
        .into_iter()
        .filter(|m| schema.field_with_name(m).is_ok())
        .collect();

    let old_files = files_by_partition(&old, &partitions)?;
    let ctx = deltalake::delta_datafusion::create_session().into_inner();
    let (to_version, run_id, new_counts, changed): (
        Option<u64>,
        Option<String>,
        BTreeMap<String, u64>,
        Vec<String>,
    ) = match &target {
        DiffTarget::Version(version) => {
            let new = open_table(config, *version).await?;
            let new_files = files_by_partition(&new, &partitions)?;
            let changed: Vec<String> = old_files
                .keys()
                .chain(new_files.keys())
                .filter(|p| old_files.get(*p).map(|f| &f.0) != new_files.get(*p).map(|f| &f.0))
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let counts = new_files.iter().map(|(p, f)| (p.clone(), f.1)).collect();
            register_filtered(&ctx, "output", &new, &partitions, &changed).await?;
            (Some(loaded_version(&new)?), None, counts, changed)
        }
        DiffTarget::Run(run_id) => {
            let latest = open_table(config, None).await?;
            let journal = Journal::load(&latest.object_store(), run_id)
                .await?
                .ok_or_else(|| Error::UnknownRun {
                    run_id: run_id.clone(),
                    searched: vec![table.to_string()],
                })?;
            let adds: Vec<_> = journal.staged_files().cloned().collect();
            let latest_schema = latest
                .snapshot()
                .delta_context(|| "cannot read the snapshot".into())?
                .snapshot()
                .arrow_schema();
            let staged = StagedTable::register_store(
                &ctx,
                &latest,
                &latest_schema,
                &journal.layout.partition_columns,
                &adds,
                run_id,
            )?;
            ctx.register_table("output", Arc::new(staged))
                .query_context(|| "cannot register the staged files".into())?;
            let mut counts = BTreeMap::new();
            for batch in &journal.batches {
                for (p, n) in &batch.rows {
                    *counts.entry(p.clone()).or_default() += n;
                }
            }
            let in_range = |label: &str| {
                journal.range.contains_label(label)
                    || (journal.range.include_null && label == NULL_LABEL)
            };
            let changed: Vec<String> = old_files
                .keys()
                .filter(|p| in_range(p))
                .chain(counts.keys())
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            (None, Some(run_id.clone()), counts, changed)
        }
    };
    register_filtered(&ctx, "previous", &old, &partitions, &changed).await?;
    let old_counts: BTreeMap<String, u64> = old_files
        .iter()
        .filter(|(p, _)| changed.contains(p))
        .map(|(p, f)| (p.clone(), f.1))
        .collect();
    let new_counts: BTreeMap<String, u64> = new_counts
        .into_iter()
        .filter(|(p, _)| changed.contains(p))
        .collect();
    let spec = CompareSpec {
        partitions: partitions.clone(),
        key,
        measures: measures.clone(),
        sample,
        checksum_columns: None,
    };
    let comparison = compare(
        &ctx,
        &spec,
        Some(KnownSide::rows(old_counts)),
        Some(KnownSide::rows(new_counts)),
    )
    .await?;
    let all: BTreeSet<&String> = old_files.keys().collect();
    Ok(DiffReport {
        table: table.to_string(),
        from_version,
        to_version,
        run_id,
        partition_column: partitions.columns().join(", "),
        changed_partitions: changed.len(),
        unchanged_partitions: all.iter().filter(|p| !changed.contains(p)).count(),
        measures,
        comparison,
    })
}

/// Per partition label: the set of file paths and the live row count (from the log).
fn files_by_partition(
    table: &DeltaTable,
    partitions: &PartitionKey,
) -> Result<BTreeMap<String, (BTreeSet<String>, u64)>> {
    let snapshot = table
        .snapshot()
        .delta_context(|| "cannot read the snapshot".into())?;
    let mut out: BTreeMap<String, (BTreeSet<String>, u64)> = BTreeMap::new();
    for file in snapshot.log_data().iter() {
        let values = file.partition_values_map();
        let label = match partitions {
            PartitionKey::Time(layout) => label_of(layout, &values),
            PartitionKey::Column(column) => values
                .get(column)
                .cloned()
                .flatten()
                .unwrap_or_else(|| NULL_LABEL.to_string()),
        };
        let deleted = file
            .deletion_vector_descriptor()
            .map_or(0, |dv| u64::try_from(dv.cardinality).unwrap_or(0));
        let entry = out.entry(label).or_default();
        entry.0.insert(file.path().to_string());
        entry.1 += (file.num_records().unwrap_or(0) as u64).saturating_sub(deleted);
    }
    Ok(out)
}

/// Registers `table` as `name`, restricted to the partitions labelled `labels`.
async fn register_filtered(
    ctx: &SessionContext,
    name: &str,
    table: &DeltaTable,
    partitions: &PartitionKey,
    labels: &[String],
) -> Result<()> {
    let provider = table
        .table_provider()
        .await
        .query_context(|| format!("cannot scan `{name}`"))?;
    let predicate = match partitions {
        PartitionKey::Time(layout) => {
            let schema = table
                .snapshot()
                .delta_context(|| "cannot read the snapshot".into())?
                .snapshot()
                .arrow_schema();
            let time_column = layout.time.encoding.columns()[0].to_string();
            let data_type = schema
                .field_with_name(&time_column)
                .map(|f| f.data_type().clone())
                .map_err(|_| Error::Internal(format!("`{time_column}` is not in the schema")))?;
            let mut periods: Vec<Period> = labels
                .iter()
                .filter_map(|l| Period::from_label(layout.time.grain, l))
                .collect();
            periods.sort();
            // Consecutive periods become one range comparison.
            let mut runs: Vec<(Period, Period)> = Vec::new();
            for period in periods {
                match runs.last_mut() {
                    Some((_, last)) if last.next() == Some(period) => *last = period,
                    _ => runs.push((period, period)),
                }
            }
            let mut predicate = lit(false);
            for (from, to) in runs {
                predicate = predicate.or(layout.time.predicate(from, to, true, &data_type)?);
            }
            if labels.iter().any(|l| l == NULL_LABEL) {
                for column in layout.time.encoding.columns() {
                    predicate =
                        predicate.or(Expr::Column(Column::new_unqualified(column)).is_null());
                }
            }
            predicate
        }
        PartitionKey::Column(column) => {
            let column = Expr::Column(Column::new_unqualified(column));
            let values = labels
                .iter()
                .filter(|l| l.as_str() != NULL_LABEL)
                .map(|l| lit(l.clone()))
                .collect::<Vec<_>>();
            let mut predicate = column.clone().in_list(values, false);
            if labels.iter().any(|l| l == NULL_LABEL) {
                predicate = predicate.or(column.is_null());
            }
            predicate
        }
    };
    let df = ctx
        .read_table(provider)
        .and_then(|df| df.filter(predicate))
        .query_context(|| format!("cannot restrict `{name}` to the changed partitions"))?;
    ctx.register_table(name, df.into_view())
        .query_context(|| format!("cannot register `{name}`"))?;
    Ok(())
}

/// `[validate] key` and `measures` of the newest model that writes `table`.
fn model_defaults(project: &Project, table: &str) -> (Vec<String>, Vec<String>) {
    list_models(&project.sql_dir())
        .into_iter()
        .filter_map(|name| Model::load(project, &name, None).ok())
        .find(|m| m.header().target == table)
        .and_then(|m| m.header().validate.clone())
        .map(|v| (v.key, v.measures))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_references_with_versions_and_times() {
        assert!(matches!(
            parse_table_at("events"),
            Ok(("events", TableVersion::Latest))
        ));
        assert!(matches!(
            parse_table_at("events@12"),
            Ok(("events", TableVersion::Version(12)))
        ));
        assert!(matches!(
            parse_table_at("events@2026-01-31T00:00:00Z"),
            Ok(("events", TableVersion::Timestamp(_)))
        ));
        assert!(parse_table_at("events@yesterday").is_err());
    }
}
