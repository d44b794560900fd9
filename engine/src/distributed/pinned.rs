//! A source table at its pinned version as a plain Parquet scan of exactly the files of that
//! version: what a Ballista scheduler can cut into tasks and ship to executors (delta-rs's own
//! scan node cannot be serialized).
//!
//! The files come from the log (path, size, partition values as per-file constants); nothing is
//! listed, so an executor never sees an uncommitted or removed file. A filter on partition
//! columns (the batch window) prunes the files on the client and stays in the plan above the
//! scan for the rows (see [`StagedTable`]).

use deltalake::DeltaTable;

use crate::error::{DeltaContext, Error, Result};
use crate::stage::staged::StagedTable;

/// Refuses a source a plain Parquet scan would read wrongly: deleted rows (deletion vectors) and
/// column mapping (the files' column names are not the table's). `name` is the source's name;
/// `engine` the cluster (both for errors).
pub(crate) fn check_source(name: &str, table: &DeltaTable, engine: &str) -> Result<()> {
    let snapshot = table
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of source `{name}`"))?;
    let refuse = |what: String| Error::InvalidOption {
        option: "--engine".into(),
        value: engine.into(),
        message: format!(
            "source `{name}` {what}, which a distributed run cannot read yet; run it with `--engine local`"
        ),
    };
    let mode = snapshot
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode")
        .cloned()
        .unwrap_or_else(|| "none".into());
    if mode != "none" {
        return Err(refuse(format!("uses column mapping (mode `{mode}`)")));
    }
    if snapshot
        .log_data()
        .iter()
        .any(|file| file.deletion_vector_descriptor().is_some())
    {
        return Err(refuse("has deleted rows (deletion vectors)".into()));
    }
    Ok(())
}

/// The files of `table` at the version it is loaded at, as a table the cluster can scan (a
/// source [`check_source`] accepted; `name` is its name, for errors).
pub(crate) fn pinned_source(name: &str, table: &DeltaTable) -> Result<StagedTable> {
    let snapshot = table
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of source `{name}`"))?;
    let (store_url, root) = super::store_location(table.table_url())?;
    let files = snapshot
        .log_data()
        .iter()
        .map(|file| {
            let path: deltalake::Path = root
                .parts()
                .chain(file.object_store_path().parts())
                .collect();
            (
                path,
                u64::try_from(file.size()).unwrap_or(0),
                file.partition_values_map(),
            )
        })
        .collect();
    StagedTable::over_files(
        snapshot.snapshot().arrow_schema(),
        snapshot.metadata().partition_columns(),
        store_url,
        files,
    )
}
