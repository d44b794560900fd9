//! `history` and `blame`: what the commits of a table say about who changed which partitions,
//! and why.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use deltalake::DeltaTable;
use serde::Serialize;

use lakefill_log::{Commit, CommitMetadata, read_commit};
use lakefill_table::config::Project;
use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::model::{Model, list_models};
use lakefill_table::partition::{Layout, NULL_LABEL, PartitionRange, PartitionValues, label_of};
use lakefill_table::storage::{loaded_version, open_table};

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
    /// The `--where` predicate the run was scoped by (null when it replaced every row of its
    /// range, or is not lakefill's).
    #[serde(rename = "where")]
    pub rows: Option<String>,
    /// Partition values the commit added or removed files in.
    pub partitions: Vec<String>,
    /// Files added.
    pub files_added: u64,
    /// Files removed.
    pub files_removed: u64,
    /// The run this commit reverted, when it is a revert.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revert_of: Option<String>,
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
        // A revert puts back what was there before the run; the model did not write it.
        model: lakefill.as_ref().map(|m| match &m.revert_of {
            Some(reverted) => format!("revert of {reverted}"),
            None => format!("{}@{}", m.model, m.model_version),
        }),
        revert_of: lakefill.as_ref().and_then(|m| m.revert_of.clone()),
        reason: lakefill.as_ref().and_then(|m| m.reason.clone()),
        range: lakefill.as_ref().map(|m| m.range.clone()),
        rows: lakefill.as_ref().and_then(|m| m.rows.clone()),
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
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot)?;
    for file in snapshot.log_data().iter() {
        if matches(&mapping.logical_values(file.partition_values_map())) {
            files += 1;
            rows = rows
                .zip(lakefill_table::storage::live_rows(&file))
                .map(|(a, b)| a + b);
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
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot).ok()?;
    for file in snapshot.log_data().iter() {
        for (column, value) in mapping.logical_values(file.partition_values_map()) {
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
        && !layout.is_timeless()
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
    // A table whose partition columns hold no time is reported by their values.
    .filter(|layout| !layout.is_timeless())
}
