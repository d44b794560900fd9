//! `lakefill diff TABLE --cdf VERSION`: the change data feed of one version, as a feed reader
//! reads it. delta-rs's change feed reader does the reading (the version's `cdc` files, or
//! without them its adds and removes as inserts and deletes), so what is shown is what any
//! reader of the feed gets, not what lakefill meant to write.

use deltalake::datafusion::prelude::SessionContext;
use serde::Serialize;
use serde_json::Value;

use lakefill_table::config::Project;
use lakefill_table::error::{DeltaContext, Error, QueryContext, Result};
use lakefill_table::sqltext::ident;
use lakefill_table::storage::{loaded_version, open_table};
use lakefill_validate::feed::{CHANGE_TYPE, FeedCounts};

/// The change data feed of one version of a table.
#[derive(Debug, Clone, Serialize)]
pub struct FeedReport {
    /// The table.
    pub table: String,
    /// The version.
    pub version: u64,
    /// Whether the version's commit has change data files (else a reader derives its feed from
    /// the adds and removes that change data).
    pub recorded: bool,
    /// Rows of each change type.
    pub counts: FeedCounts,
    /// Rows of each change type per partition (the table's partition columns, as text).
    pub partitions: Vec<FeedPartition>,
    /// Up to the sample size of rows of each change type.
    pub rows: Vec<Value>,
}

/// One partition's rows in a feed.
#[derive(Debug, Clone, Serialize)]
pub struct FeedPartition {
    /// The partition: `column=value` of each partition column, `/`-separated (empty for an
    /// unpartitioned table).
    pub partition: String,
    /// Rows of each change type.
    pub counts: FeedCounts,
}

/// Reads the change data feed of `table` at `version`, with `sample` rows of each change type.
pub async fn change_feed(
    project: &Project,
    table: &str,
    version: u64,
    sample: usize,
) -> Result<FeedReport> {
    let config = project.table(table, "the command line")?;
    let at = open_table(config, Some(version)).await?;
    if loaded_version(&at)? != version {
        return Err(Error::InvalidOption {
            option: "--cdf".into(),
            value: version.to_string(),
            message: format!("`{table}` has no version {version}"),
        });
    }
    let snapshot = at
        .snapshot()
        .delta_context(|| format!("cannot read `{table}`"))?;
    if !snapshot
        .metadata()
        .configuration()
        .get("delta.enableChangeDataFeed")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Err(Error::InvalidOption {
            option: "--cdf".into(),
            value: version.to_string(),
            message: format!(
                "`{table}` does not record a change data feed at version {version} (`delta.enableChangeDataFeed` is not true); compare versions with `lakefill diff {table} --from-version A --to-version B` instead"
            ),
        });
    }
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    let columns = snapshot.snapshot().arrow_schema().fields().len();
    let recorded = lakefill_log::read_commit(&at, version)
        .await?
        .is_some_and(|c| c.paths.iter().any(|p| p.starts_with("_change_data/")));
    let builder = at
        .clone()
        .scan_cdf()
        .with_starting_version(version)
        .with_ending_version(version);
    let provider = deltalake::delta_datafusion::DeltaCdfTableProvider::try_new(builder)
        .delta_context(|| format!("cannot read the change feed of `{table}`"))?;
    let ctx = SessionContext::new();
    ctx.register_table("feed", std::sync::Arc::new(provider))
        .query_context(|| "cannot register the change feed".into())?;
    let partition = if partition_columns.is_empty() {
        "''".to_string()
    } else {
        partition_columns
            .iter()
            .map(|c| {
                format!(
                    "'{}=' || COALESCE(CAST({} AS VARCHAR), 'NULL')",
                    c.replace('\'', "''"),
                    ident(c)
                )
            })
            .collect::<Vec<_>>()
            .join(" || '/' || ")
    };
    let grouped = ctx
        .sql(&format!(
            "SELECT {partition} AS p, CAST({ct} AS VARCHAR) AS t, COUNT(*) AS n FROM feed GROUP BY 1, 2 ORDER BY 1, 2",
            ct = ident(CHANGE_TYPE)
        ))
        .await
        .query_context(|| "cannot count the change feed".into())?
        .collect()
        .await
        .query_context(|| "cannot count the change feed".into())?;
    let mut counts = FeedCounts::default();
    let mut partitions: Vec<FeedPartition> = Vec::new();
    for batch in &grouped {
        use deltalake::arrow::array::AsArray;
        let cast = |i: usize| {
            deltalake::arrow::compute::cast(
                batch.column(i),
                &deltalake::arrow::datatypes::DataType::Utf8,
            )
            .map_err(|e| Error::Internal(format!("the change feed's counts: {e}")))
        };
        let (names, types) = (cast(0)?, cast(1)?);
        let rows = deltalake::arrow::compute::cast(
            batch.column(2),
            &deltalake::arrow::datatypes::DataType::UInt64,
        )
        .map_err(|e| Error::Internal(format!("the change feed's counts: {e}")))?;
        let rows = rows.as_primitive::<deltalake::arrow::datatypes::UInt64Type>();
        for row in 0..batch.num_rows() {
            let name = names.as_string::<i32>().value(row).to_string();
            let kind = types.as_string::<i32>().value(row);
            counts.count(kind, rows.value(row));
            if partitions.last().is_none_or(|p| p.partition != name) {
                partitions.push(FeedPartition {
                    partition: name,
                    counts: FeedCounts::default(),
                });
            }
            if let Some(last) = partitions.last_mut() {
                last.counts.count(kind, rows.value(row));
            }
        }
    }
    // Ordered by the table's columns, so that the pre- and post-images of the same keys show.
    let order = (1..=columns)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut rows = Vec::new();
    for kind in ["delete", "update_preimage", "update_postimage", "insert"] {
        let batches = ctx
            .sql(&format!(
                "SELECT * EXCLUDE (_commit_version, _commit_timestamp) FROM feed WHERE {} = '{kind}' ORDER BY {order} LIMIT {sample}",
                ident(CHANGE_TYPE)
            ))
            .await
            .query_context(|| "cannot read the change feed".into())?
            .collect()
            .await
            .query_context(|| "cannot read the change feed".into())?;
        for batch in &batches {
            rows.extend(lakefill_validate::rows::batch_to_json(batch, sample)?);
        }
    }
    Ok(FeedReport {
        table: table.to_string(),
        version,
        recorded,
        counts,
        partitions,
        rows,
    })
}
