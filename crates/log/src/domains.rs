//! The configuration of a system domain (`delta.rowTracking`, `delta.clustering`) at a version
//! of a table, read from the log itself.
//!
//! delta-rs 1.1 (through delta-kernel) refuses to give `delta.*` domains to its users, and
//! lakefill needs row tracking's high-water mark to number the rows it adds. The protocol's
//! reconciliation is simple: the newest `domainMetadata` action of a domain wins (a `removed`
//! one deletes it). So the JSON commits are read newest first; when none of the retained ones
//! set the domain, the newest checkpoint's own `domainMetadata` entries decide (classic,
//! multi-part and V2 checkpoints, Parquet or JSON; a checkpoint is read whole, which only happens
//! then).

use deltalake::DeltaTable;
use deltalake::arrow::array::{Array, AsArray};
use deltalake::logstore::object_store::{ObjectStore, ObjectStoreExt as _};
use futures::TryStreamExt as _;
use serde_json::Value;

use lakefill_table::error::{DeltaContext, Error, Result};

/// The configuration of `domain` at the version `table` is loaded at; `None` when the domain is
/// not set (or was removed).
pub async fn configuration(table: &DeltaTable, domain: &str) -> Result<Option<String>> {
    let latest = table
        .version()
        .ok_or_else(|| Error::Internal("the table is not loaded at a version".into()))?;
    // Newest first: a writer that assigns row ids sets the mark in the commit, so it is nearly
    // always in the latest commits, and the log need not be listed.
    let mut missing = None;
    for version in (0..=latest).rev() {
        let Some(bytes) = table
            .log_store()
            .read_commit_entry(version)
            .await
            .delta_context(|| format!("cannot read commit {version}"))?
        else {
            missing = Some(version);
            break;
        };
        if let Some(found) = in_json(&bytes, domain) {
            return Ok(found);
        }
    }
    let Some(missing) = missing else {
        return Ok(None);
    };
    // The commits from `missing` down are cleaned up: the newest checkpoint holds their state.
    let store = table.log_store().object_store(None);
    let files = match newest_checkpoint(store.as_ref(), latest).await? {
        Some((version, files)) if version >= missing => files,
        _ => {
            return Err(Error::Internal(format!(
                "commit {missing} of the table is missing, and no checkpoint after it holds the table's state"
            )));
        }
    };
    let mut found = None;
    for path in files {
        let bytes = match store.get(&path).await {
            Ok(got) => got.bytes().await,
            Err(e) => Err(e),
        }
        .map_err(|e| Error::Internal(format!("cannot read the checkpoint `{path}`: {e}")))?;
        let in_file = if path.as_ref().ends_with(".json") {
            in_json(&bytes, domain)
        } else {
            in_parquet(bytes, domain)?
        };
        if in_file.is_some() {
            found = in_file;
        }
    }
    Ok(found.flatten())
}

/// The newest checkpoint at or before `latest`: its version and files.
async fn newest_checkpoint(
    store: &dyn ObjectStore,
    latest: u64,
) -> Result<Option<(u64, Vec<deltalake::Path>)>> {
    let prefix = deltalake::Path::from("_delta_log");
    let listed: Vec<_> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| Error::Internal(format!("cannot list the log: {e}")))?;
    let mut best: Option<(u64, Vec<deltalake::Path>)> = None;
    for meta in listed {
        let Some(name) = meta.location.filename() else {
            continue;
        };
        let Some((version, rest)) = name.split_once('.') else {
            continue;
        };
        if !rest.starts_with("checkpoint")
            || !(rest.ends_with(".parquet") || rest.ends_with(".json"))
        {
            continue;
        }
        let Ok(version) = version.parse::<u64>() else {
            continue;
        };
        if version > latest {
            continue;
        }
        match &mut best {
            Some((v, files)) if *v == version => files.push(meta.location),
            Some((v, _)) if *v > version => {}
            _ => best = Some((version, vec![meta.location])),
        }
    }
    Ok(best)
}

/// The newest setting of `domain` among newline-delimited JSON actions: `Some(None)` when it
/// was removed, `None` when they do not set it.
fn in_json(bytes: &[u8], domain: &str) -> Option<Option<String>> {
    let mut found = None;
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(action) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let entry = &action["domainMetadata"];
        if entry["domain"].as_str() == Some(domain) {
            found = Some(if entry["removed"].as_bool() == Some(true) {
                None
            } else {
                entry["configuration"].as_str().map(str::to_string)
            });
        }
    }
    found
}

/// The setting of `domain` in a Parquet checkpoint file.
fn in_parquet(bytes: bytes::Bytes, domain: &str) -> Result<Option<Option<String>>> {
    use deltalake::parquet::arrow::ProjectionMask;
    use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let unreadable = |e: &dyn std::fmt::Display| {
        Error::Internal(format!("cannot read the checkpoint's domain metadata: {e}"))
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| unreadable(&e))?;
    let Some(index) = builder
        .parquet_schema()
        .root_schema()
        .get_fields()
        .iter()
        .position(|f| f.name() == "domainMetadata")
    else {
        return Ok(None);
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| unreadable(&e))?;
    let mut found = None;
    for batch in reader {
        let batch = batch.map_err(|e| unreadable(&e))?;
        let entries = batch.column(0).as_struct();
        let (Some(domains), Some(configurations)) = (
            entries.column_by_name("domain"),
            entries.column_by_name("configuration"),
        ) else {
            continue;
        };
        let removed = entries.column_by_name("removed");
        let domains = domains.as_string::<i32>();
        let configurations = configurations.as_string::<i32>();
        for row in 0..entries.len() {
            if entries.is_null(row) || domains.is_null(row) || domains.value(row) != domain {
                continue;
            }
            let gone = removed
                .map(|r| r.as_boolean())
                .is_some_and(|r| r.is_valid(row) && r.value(row));
            found = Some((!gone).then(|| configurations.value(row).to_string()));
        }
    }
    Ok(found)
}
