//! `diff`: two versions of a table, or a version and a staged run, compared partition by
//! partition with the validation engine, scanning only the partitions whose files differ.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::logical_expr::{Expr, lit};
use deltalake::datafusion::prelude::SessionContext;
use serde::Serialize;

use super::history::table_layout;
use lakefill_log::journal::Journal;
use lakefill_table::config::Project;
use lakefill_table::error::{DeltaContext, Error, QueryContext, Result};
use lakefill_table::model::{Model, list_models};
use lakefill_table::partition::{NULL_LABEL, label_of};
use lakefill_table::run_id::RunId;
use lakefill_table::staged::StagedTable;
use lakefill_table::storage::{loaded_version, open_table};
use lakefill_table::time::Period;
use lakefill_validate::{CompareSpec, Comparison, KnownSide, PartitionKey, compare};

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
    /// The rows compared, when not all (`--where`).
    #[serde(rename = "where")]
    pub rows: Option<String>,
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
/// With `rows` (`--where`), only the rows that match it are compared.
pub async fn diff(
    project: &Project,
    table: &str,
    from_version: u64,
    target: DiffTarget,
    key: Option<Vec<String>>,
    sample: usize,
    rows: Option<&str>,
) -> Result<DiffReport> {
    let config = project.table(table, "the command line")?;
    let old = open_table(config, Some(from_version)).await?;
    let old_snapshot = old
        .snapshot()
        .delta_context(|| format!("cannot read `{table}`"))?;
    let first_column = old_snapshot.metadata().partition_columns().first().cloned();
    // A table whose partition columns hold no time compares partition value by value.
    let partitions = match (table_layout(project, table, &old), first_column) {
        (Some(layout), Some(_)) => PartitionKey::Time(layout),
        (None, Some(column)) => PartitionKey::Column(column),
        (_, None) => {
            return Err(Error::Partitioning {
                message: format!("table `{table}` is not partitioned"),
                hint: "diff compares partitioned tables partition by partition".into(),
            });
        }
    };
    let schema = old_snapshot.snapshot().arrow_schema();
    let rows = rows
        .map(|text| lakefill_table::scope::RowPredicate::parse(text, &schema, table))
        .transpose()?;
    let filter = rows.as_ref().map(|r| r.expr(&schema)).transpose()?;
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
    // The same bound as a run's: `[defaults] memory_limit`, else the built-in share.
    let ctx = lakefill_table::resources::Resources::new(lakefill_table::settings::memory_limit(
        project, None,
    )?)
    .session();
    let NewSide {
        to_version,
        run_id,
        counts: new_counts,
        changed,
    } = match &target {
        DiffTarget::Version(version) => {
            let new = open_table(config, *version).await?;
            version_side(&ctx, &new, &partitions, &old_files, filter.as_ref()).await?
        }
        DiffTarget::Run(run_id) => {
            run_side(&ctx, config, table, run_id, &old_files, filter.as_ref()).await?
        }
    };
    register_filtered(
        &ctx,
        "previous",
        &old,
        &partitions,
        &changed,
        filter.as_ref(),
    )
    .await?;
    // A table corrected by adjustments compares as its net rows (reversals cancel what they
    // reversed), so a fix shows as the change it is, not as appended rows.
    let latest = open_table(config, None).await?;
    let has_kind = |table: &DeltaTable| {
        table.snapshot().is_ok_and(|s| {
            s.snapshot()
                .arrow_schema()
                .field_with_name(lakefill_table::adjustments::KIND_COLUMN)
                .is_ok()
        })
    };
    let netted = (has_kind(&old) || has_kind(&latest)) && !measures.is_empty();
    if netted {
        let sides: &[&str] = match &target {
            DiffTarget::Version(_) => &["previous", "output"],
            // A run's staged new rows are net rows already.
            DiffTarget::Run(_) => &["previous"],
        };
        register_net_sides(&ctx, sides, &measures, &key).await?;
    }
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
        edges: None,
        changes: None,
    };
    // The log counts stored rows; net rows, and the rows a predicate selects, are counted by
    // the scan.
    let known = |counts: BTreeMap<String, u64>| {
        (!netted && rows.is_none()).then(|| KnownSide::rows(counts))
    };
    let comparison = compare(&ctx, &spec, known(old_counts), known(new_counts)).await?;
    let all: BTreeSet<&String> = old_files.keys().collect();
    Ok(DiffReport {
        table: table.to_string(),
        from_version,
        to_version,
        run_id,
        partition_column: partitions.columns().join(", "),
        rows: rows.map(|r| r.sql),
        changed_partitions: changed.len(),
        unchanged_partitions: all.iter().filter(|p| !changed.contains(p)).count(),
        measures,
        comparison,
    })
}

/// The new side of a diff, registered as `output`: which version or run it is, its rows per
/// partition, and the partitions whose files differ from the old side's.
struct NewSide {
    to_version: Option<u64>,
    run_id: Option<String>,
    counts: BTreeMap<String, u64>,
    changed: Vec<String>,
}

/// The table at another version as the new side: the partitions whose files differ are changed.
async fn version_side(
    ctx: &SessionContext,
    new: &DeltaTable,
    partitions: &PartitionKey,
    old_files: &BTreeMap<String, (BTreeSet<String>, u64)>,
    filter: Option<&Expr>,
) -> Result<NewSide> {
    let new_files = files_by_partition(new, partitions)?;
    let changed: Vec<String> = old_files
        .keys()
        .chain(new_files.keys())
        .filter(|p| old_files.get(*p).map(|f| &f.0) != new_files.get(*p).map(|f| &f.0))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let counts = new_files.iter().map(|(p, f)| (p.clone(), f.1)).collect();
    register_filtered(ctx, "output", new, partitions, &changed, filter).await?;
    Ok(NewSide {
        to_version: Some(loaded_version(new)?),
        run_id: None,
        counts,
        changed,
    })
}

/// A staged run's files as the new side: the partitions of its range and those it staged rows
/// for are changed.
async fn run_side(
    ctx: &SessionContext,
    config: &lakefill_table::config::TableConfig,
    table: &str,
    run_id: &str,
    old_files: &BTreeMap<String, (BTreeSet<String>, u64)>,
    filter: Option<&Expr>,
) -> Result<NewSide> {
    let latest = open_table(config, None).await?;
    let journal = Journal::load(&latest.object_store(), &RunId::parse(run_id)?)
        .await?
        .ok_or_else(|| Error::UnknownRun {
            run_id: run_id.to_string(),
            searched: vec![table.to_string()],
        })?;
    if journal.inputs.layout.is_timeless() {
        return Err(Error::InvalidOption {
            option: "--run".into(),
            value: run_id.to_string(),
            message: format!(
                "`{table}` has no time column; a staged run on it cannot be diffed yet: `lakefill report {run_id}` shows its validation, and `diff --from-version` compares it once published"
            ),
        });
    }
    let adds: Vec<_> = journal.new_row_files().cloned().collect();
    let latest_schema = latest
        .snapshot()
        .delta_context(|| "cannot read the snapshot".into())?
        .snapshot()
        .arrow_schema();
    let staged = StagedTable::register_store(
        ctx,
        &latest,
        &latest_schema,
        &journal.inputs.layout.partition_columns,
        &adds,
        run_id,
    )?;
    let mut staged = ctx
        .read_table(staged)
        .query_context(|| "cannot read the staged files".into())?;
    if let Some(filter) = filter {
        staged = staged
            .filter(filter.clone())
            .query_context(|| "cannot select the staged rows `--where` names".into())?;
    }
    ctx.register_table("output", staged.into_view())
        .query_context(|| "cannot register the staged files".into())?;
    let mut counts = BTreeMap::new();
    for batch in &journal.progress.batches {
        for (p, n) in &batch.rows {
            *counts.entry(p.clone()).or_default() += n;
        }
    }
    let in_range = |label: &str| {
        journal.inputs.range.contains_label(label)
            || (journal.inputs.range.include_null && label == NULL_LABEL)
    };
    let changed: Vec<String> = old_files
        .keys()
        .filter(|p| in_range(p))
        .chain(counts.keys())
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(NewSide {
        to_version: None,
        run_id: Some(run_id.to_string()),
        counts,
        changed,
    })
}

/// Replaces each of `sides` by its net rows (reversals cancel what they reversed), so a table
/// corrected by adjustments compares as the change it is.
async fn register_net_sides(
    ctx: &SessionContext,
    sides: &[&str],
    measures: &[String],
    key: &[String],
) -> Result<()> {
    for side in sides {
        let rows = ctx
            .deregister_table(*side)
            .query_context(|| format!("cannot take `{side}` back"))?
            .ok_or_else(|| Error::Internal(format!("`{side}` is not registered")))?;
        let raw = format!("__lf_raw_{side}");
        let raw_schema = ctx
            .read_table(Arc::clone(&rows))
            .query_context(|| format!("cannot read `{side}`"))?
            .schema()
            .as_arrow()
            .clone();
        ctx.register_table(raw.as_str(), rows)
            .query_context(|| format!("cannot register `{side}`"))?;
        lakefill_validate::net::register_net(ctx, side, &raw, &raw_schema, measures, key).await?;
    }
    Ok(())
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
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot)?;
    for file in snapshot.log_data().iter() {
        let values = mapping.logical_values(file.partition_values_map());
        let label = match partitions {
            PartitionKey::Time(layout) => label_of(layout, &values),
            PartitionKey::Column(column) => values
                .get(column)
                .cloned()
                .flatten()
                .unwrap_or_else(|| NULL_LABEL.to_string()),
        };
        let entry = out.entry(label).or_default();
        entry.0.insert(file.path().to_string());
        entry.1 += lakefill_table::storage::live_rows(&file).unwrap_or(0);
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
    filter: Option<&Expr>,
) -> Result<()> {
    let provider = table
        .table_provider()
        .await
        .query_context(|| format!("cannot scan `{name}`"))?;
    let predicate = match partitions {
        PartitionKey::Time(layout) if layout.is_timeless() => lit(!labels.is_empty()),
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
    let predicate = match filter {
        Some(filter) => predicate.and(filter.clone()),
        None => predicate,
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
