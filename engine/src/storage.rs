//! Opening the project's Delta tables with their storage options, at a version.
//!
//! Storage options carry secrets: they go to delta-rs and nowhere else. Nothing here formats a
//! `DeltaTable`'s log-store configuration.

use std::collections::HashMap;

use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};

use crate::config::TableConfig;
use crate::error::{Error, Result};

/// Opens `table` at `version`, or at its latest version when `None`.
pub(crate) async fn open_table(table: &TableConfig, version: Option<u64>) -> Result<DeltaTable> {
    open_table_at(
        table,
        version.map_or(TableVersion::Latest, TableVersion::Version),
    )
    .await
}

/// Which snapshot of a table to open.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TableVersion {
    /// The newest version.
    Latest,
    /// A version number.
    Version(u64),
    /// The version current at a time (by commit file time, as delta-rs resolves it).
    Timestamp(chrono::DateTime<chrono::Utc>),
}

/// Opens `table` at the given snapshot.
pub(crate) async fn open_table_at(table: &TableConfig, at: TableVersion) -> Result<DeltaTable> {
    let version = match at {
        TableVersion::Version(v) => Some(v),
        _ => None,
    };
    let options: HashMap<String, String> = table
        .storage_options()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let not_a_table = |source: DeltaTableError| Error::NotADeltaTable {
        table: table.name().to_string(),
        uri: table.uri().to_string(),
        source: Box::new(source),
    };
    let mut builder = DeltaTableBuilder::from_url(table.url().clone())
        .map_err(not_a_table)?
        .with_storage_options(options);
    match at {
        TableVersion::Latest => {}
        TableVersion::Version(version) => builder = builder.with_version(version),
        TableVersion::Timestamp(time) => builder = builder.with_timestamp(time),
    }
    builder.load().await.map_err(|source| match source {
        DeltaTableError::NotATable(_) | DeltaTableError::InvalidTableLocation(_) => {
            not_a_table(source)
        }
        DeltaTableError::KernelError(_)
            if source.to_string().contains("Invalid table location")
                || source.to_string().contains("No files in log segment") =>
        {
            not_a_table(source)
        }
        DeltaTableError::InvalidVersion(_) => Error::InvalidOption {
            option: "version".into(),
            value: version.map(|v| v.to_string()).unwrap_or_default(),
            message: format!("table `{}` has no such version", table.name()),
        },
        source => Error::Delta {
            context: format!("cannot open table `{}` at `{}`", table.name(), table.uri()),
            source: Box::new(source),
        },
    })
}

/// Returns the loaded version of `table`, which every opened table has.
pub(crate) fn loaded_version(table: &DeltaTable) -> Result<u64> {
    table.version().ok_or_else(|| {
        Error::Internal(format!(
            "table `{}` has no loaded version",
            table.table_url()
        ))
    })
}
