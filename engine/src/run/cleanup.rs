//! Deleting what a run staged: only in its own staging directories, never a file a retained
//! version of any table references.

use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::ObjectStore;
use deltalake::logstore::object_store::ObjectStoreExt as _;

use lakefill_log::journal::Journal;
use lakefill_log::references::ReferencedFiles;
use lakefill_table::config::Project;
use lakefill_table::error::Error;
use lakefill_table::error::Result;

/// Deletes every file in the run's own staging directories of its in-range partitions (what
/// its journal lists, and what unfinished batches left there), except files any retained version
/// of any table of the project references. Returns how many were deleted.
pub(crate) async fn delete_run_files(
    project: &Project,
    latest: &DeltaTable,
    journal: &Journal,
) -> Result<u64> {
    delete_staging(latest, journal, false, Some(project)).await
}

/// Deletes every file the run staged (journaled or not), except files a retained version of the
/// target references.
pub(crate) async fn delete_unreferenced(latest: &DeltaTable, journal: &Journal) -> Result<u64> {
    delete_staging(latest, journal, false, None).await
}

/// Deletes the files in the run's staging directories that its journal does not list (batches
/// that never finished), except files a retained version of the target references.
pub(crate) async fn delete_unjournaled(table: &DeltaTable, journal: &Journal) -> Result<u64> {
    delete_staging(table, journal, true, None).await
}

/// Deletes the run's change data files that its journal does not list (what an interrupted
/// attempt at writing its feed left), except files a retained version of the target references.
pub(crate) async fn delete_unjournaled_feed(table: &DeltaTable, journal: &Journal) -> Result<u64> {
    let store = table.object_store();
    let listed: std::collections::BTreeSet<&str> = journal
        .progress
        .change_feed
        .iter()
        .flat_map(|f| &f.files)
        .map(|f| f.path.as_str())
        .collect();
    let prefix = deltalake::Path::from(journal.run_id.change_data_dir());
    let candidates: Vec<deltalake::Path> = lakefill_table::storage::list_objects(&store, &prefix)
        .await?
        .into_iter()
        .map(|o| o.location)
        .filter(|p| !listed.contains(p.as_ref()))
        .collect();
    // A run published again (its range moved since) finds its earlier publishes' feeds here:
    // versions reference them, and they are kept without a word.
    delete_unless_referenced(table, candidates, None, false).await
}

pub(crate) async fn delete_staging(
    table: &DeltaTable,
    journal: &Journal,
    keep_journaled: bool,
    project: Option<&Project>,
) -> Result<u64> {
    let store = table.object_store();
    let root = table.table_url().clone();
    let journaled: std::collections::BTreeSet<String> =
        journal.staged_files().map(|a| a.path.clone()).collect();
    let mut candidates: Vec<deltalake::Path> = if keep_journaled {
        Vec::new()
    } else {
        journaled
            .iter()
            .map(|p| lakefill_table::storage::object_path(p))
            .chain(
                journal
                    .vectors()
                    .flat_map(|v| &v.vector_files)
                    .map(|p| deltalake::Path::from(p.as_str())),
            )
            .collect()
    };
    // The run's change data files, all under one directory of its own.
    let feed = deltalake::Path::from(journal.run_id.change_data_dir());
    let feed_files = lakefill_table::storage::list_objects(&store, &feed).await?;
    candidates.extend(feed_files.into_iter().map(|o| o.location).filter(|p| {
        !(keep_journaled
            && journal
                .progress
                .change_feed
                .iter()
                .flat_map(|f| &f.files)
                .any(|f| f.path == p.as_ref()))
    }));
    for prefix in staging_dirs(&store, &root, journal).await? {
        let listing = store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|source| Error::Storage {
                path: prefix.to_string(),
                source,
            })?;
        if lakefill_table::storage::holds_a_table(&listing) {
            // A Delta table of its own named like the run's staging directory (#33): not ours.
            continue;
        }
        let listed = listing.objects;
        candidates.extend(
            listed
                .into_iter()
                .map(|o| o.location)
                .filter(|p| !(keep_journaled && journaled.contains(p.as_ref()))),
        );
    }
    delete_unless_referenced(table, candidates, project, true).await
}

/// Deletes `candidates` (paths under the table's root), except files any retained version of the
/// table (with `project`, of any of its tables) references and paths through symbolic links.
async fn delete_unless_referenced(
    table: &DeltaTable,
    mut candidates: Vec<deltalake::Path>,
    project: Option<&Project>,
    warn_kept: bool,
) -> Result<u64> {
    let store = table.object_store();
    let root = table.table_url().clone();
    candidates.sort();
    candidates.dedup();
    if candidates.is_empty() {
        return Ok(0);
    }
    let referenced = match project {
        Some(project) => ReferencedFiles::of_project(project, table).await?,
        None => ReferencedFiles::of_table(table).await?,
    };
    let mut deleted = 0;
    for path in candidates {
        if lakefill_table::storage::is_local_symlink(&root, path.as_ref()) {
            tracing::warn!(path = %path, "kept a staged path that passes through a symbolic link");
            continue;
        }
        if referenced.contains(&root, path.as_ref()) {
            if warn_kept {
                tracing::warn!(path = %path, "kept a staged file that a table version references");
            }
            continue;
        }
        match store.delete(&path).await {
            Ok(()) => deleted += 1,
            Err(deltalake::ObjectStoreError::NotFound { .. }) => {}
            Err(source) => {
                return Err(Error::Storage {
                    path: path.to_string(),
                    source,
                });
            }
        }
    }
    Ok(deleted)
}

/// The run's staging directories of the in-range partitions that exist (never through a
/// symbolic link, never inside a nested table).
pub(crate) async fn staging_dirs(
    store: &Arc<dyn ObjectStore>,
    root: &url::Url,
    journal: &Journal,
) -> Result<Vec<deltalake::Path>> {
    let layout = &journal.inputs.layout;
    let mut dirs = Vec::new();
    for (dir, values) in
        lakefill_table::storage::partition_dirs(store, root, &layout.partition_columns).await?
    {
        if layout.label_in(&journal.inputs.range, &values).is_none() {
            continue;
        }
        let dir = dir.join(journal.run_id.staging_dir().as_str());
        if !lakefill_table::storage::is_local_symlink(root, dir.as_ref()) {
            dirs.push(dir);
        }
    }
    Ok(dirs)
}
