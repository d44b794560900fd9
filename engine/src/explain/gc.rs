//! `lakefill gc`: delete staged files nobody will publish, never a file a version references.
//!
//! Staged files live in `<partition dir>/lakefill-<run_id>/`. gc walks only those directories:
//! partition directories of the table's own partition columns, never through a symbolic link,
//! never into a directory that holds a `_delta_log` of its own (a nested table), never into
//! `_delta_log` or `_lakefill`. A file there is garbage when no retained version of any table of
//! the project references it, it lies in its run's range, and its run will not publish it: the
//! run failed, was discarded, was up to date, published without it (an orphan of a crashed
//! batch), has no journal and nobody holds it, or was abandoned (not finished, nobody holds it,
//! and its journal is older than `--older-than`). Runs are reconciled with the Delta log first,
//! and a run is touched only under its lease. Retention of replaced files is left to Delta's own
//! VACUUM.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::{ObjectStore, Path};
use serde::Serialize;
use url::Url;

use crate::run::reconcile::reconcile;
use lakefill_log::journal::lease::{RunLease, holder};
use lakefill_log::journal::{Journal, RunState};
use lakefill_log::references::ReferencedFiles;
use lakefill_table::config::Project;
use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::partition::PartitionValues;
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{holds_a_table, is_local_symlink, list, open_table, partition_dirs};
use lakefill_table::time::now;

/// What `gc` deleted, or would delete with `--dry-run`.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    /// The table.
    pub table: String,
    /// Whether files were only listed.
    pub dry_run: bool,
    /// Files deleted (or to delete).
    pub files: Vec<GcFile>,
    /// Their total size.
    pub bytes: u64,
    /// Staged files kept because their run may still publish them.
    pub kept: u64,
    /// Runs marked discarded because their staged files were deleted.
    pub runs_discarded: Vec<RunId>,
}

/// One garbage file.
#[derive(Debug, Clone, Serialize)]
pub struct GcFile {
    /// Path relative to the table root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// The run that staged it.
    pub run_id: RunId,
    /// Why it is garbage.
    pub reason: String,
}

/// The longest age `--older-than` accepts: a hundred years.
const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Parses durations like `30m`, `24h`, `7d`, `90s` or `1h 30m` (at most a hundred years).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let invalid = |message: &str| Error::InvalidOption {
        option: "--older-than".into(),
        value: text.to_string(),
        message: message.to_string(),
    };
    let too_long = "at most a hundred years (`36500d`)";
    let duration = humantime::parse_duration(text).map_err(|error| match error {
        humantime::DurationError::NumberOverflow => invalid(too_long),
        _ => invalid("expected a number and a unit: s, m, h or d (e.g. `24h`)"),
    })?;
    if duration > MAX_AGE {
        return Err(invalid(too_long));
    }
    Ok(duration)
}

/// A file in a run's staging directory.
struct Staged {
    path: Path,
    size: u64,
    run_id: RunId,
    /// The partition values of the directories above it, decoded; `None` for a change data
    /// file (its run's directory under `_change_data/` holds only the run's).
    partition: Option<PartitionValues>,
}

/// Deletes (or with `dry_run` lists) the garbage staged files of `table`.
pub async fn gc(
    project: &Project,
    table: &str,
    dry_run: bool,
    older_than: Duration,
) -> Result<GcReport> {
    let config = project.table(table, "the command line")?;
    let opened = open_table(config, None).await?;
    let store = opened.object_store();
    let root = opened.table_url().clone();
    let partition_columns = opened
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{table}`"))?
        .metadata()
        .partition_columns()
        .to_vec();

    let mut journals: BTreeMap<RunId, Journal> = BTreeMap::new();
    for mut journal in Journal::list(&store).await? {
        reconcile(&opened, &mut journal).await?;
        journals.insert(journal.run_id.clone(), journal);
    }
    let cutoff = chrono::Utc::now()
        - chrono::Duration::from_std(older_than).unwrap_or_else(|_| chrono::Duration::zero());

    let staged = staged_files(&store, &root, &partition_columns).await?;
    let referenced = if staged.is_empty() {
        ReferencedFiles::default()
    } else {
        ReferencedFiles::of_project(project, &opened).await?
    };
    let mut garbage: BTreeMap<RunId, Vec<GcFile>> = BTreeMap::new();
    let mut kept = 0u64;
    let mut abandoned = BTreeSet::new();
    let mut busy: BTreeMap<RunId, bool> = BTreeMap::new();
    for file in staged {
        if referenced.contains(&root, file.path.as_ref()) {
            // Data of a version: not staged garbage at all.
            continue;
        }
        let run_id = file.run_id.clone();
        let held = match busy.get(&run_id) {
            Some(held) => *held,
            None => {
                let held = holder(&store, &run_id).await?.is_some();
                busy.insert(run_id.clone(), held);
                held
            }
        };
        let reason = if held {
            None
        } else {
            why_garbage(journals.get(&run_id), &file, cutoff, older_than)
        };
        if reason.is_some()
            && journals
                .get(&run_id)
                .is_some_and(|j| j.progress.state.is_in_progress())
        {
            abandoned.insert(run_id.clone());
        }
        match reason {
            Some(reason) => garbage.entry(run_id.clone()).or_default().push(GcFile {
                path: file.path.to_string(),
                size: file.size,
                run_id,
                reason,
            }),
            None => kept += 1,
        }
    }

    failpoint::reach(CrashPoint::GcListed).await?;
    let mut files = Vec::new();
    let mut runs_discarded = Vec::new();
    for (run_id, run_files) in garbage {
        if dry_run {
            files.extend(run_files);
            continue;
        }
        // Touch a run only while holding it; one that someone just took is kept.
        let lease = match RunLease::acquire(&store, table, &run_id, "gc").await {
            Ok(lease) => lease,
            Err(Error::RunBusy { .. }) => {
                kept += run_files.len() as u64;
                continue;
            }
            Err(error) => return Err(error),
        };
        let listed = journals
            .get(&run_id)
            .map(|j| j.progress.updated_at.as_str());
        let result = collect_run(&store, &lease, &run_id, &run_files, &abandoned, listed).await;
        lease.release().await;
        match result? {
            Collected::Moved => {
                kept += run_files.len() as u64;
                continue;
            }
            Collected::Discarded => runs_discarded.push(run_id),
            Collected::Deleted => {}
        }
        files.extend(run_files);
    }
    Ok(GcReport {
        table: table.to_string(),
        dry_run,
        bytes: files.iter().map(|f| f.size).sum(),
        files,
        kept,
        runs_discarded,
    })
}

/// Why a staged file no version references is garbage, given the journal of its run (none, a
/// finished run, or one abandoned before `cutoff`); `None` keeps it. gc deletes only inside a
/// run's own range.
fn why_garbage(
    journal: Option<&Journal>,
    file: &Staged,
    cutoff: chrono::DateTime<chrono::Utc>,
    older_than: Duration,
) -> Option<String> {
    let Some(journal) = journal else {
        return Some("no journal".to_string());
    };
    if let Some(partition) = &file.partition {
        journal
            .inputs
            .layout
            .label_in(&journal.inputs.range, partition)?;
    }
    match journal.progress.state {
        RunState::Failed => Some("run failed".into()),
        RunState::Discarded => Some("run discarded".into()),
        RunState::UpToDate => Some("run was up to date".into()),
        RunState::Published => Some("not part of the published run".into()),
        _ => {
            let updated = chrono::DateTime::parse_from_rfc3339(&journal.progress.updated_at)
                .map(|t| t.with_timezone(&chrono::Utc))
                .unwrap_or(cutoff);
            (updated < cutoff || older_than.is_zero()).then(|| {
                format!(
                    "run {} since {}",
                    journal.progress.state, journal.progress.updated_at
                )
            })
        }
    }
}

/// What [`collect_run`] did with one run's garbage.
enum Collected {
    /// Its files are deleted.
    Deleted,
    /// Its files are deleted, and the abandoned run marked discarded.
    Discarded,
    /// Nothing: the run moved since it was listed (resumed, published), so what made its files
    /// garbage may no longer hold.
    Moved,
}

/// Deletes one run's garbage under its lease, unless its journal changed since the listing
/// (`listed`: its `updated_at` then, `None` for a run that had no journal); marks an abandoned
/// run discarded.
async fn collect_run(
    store: &Arc<dyn ObjectStore>,
    lease: &RunLease,
    run_id: &RunId,
    files: &[GcFile],
    abandoned: &BTreeSet<RunId>,
    listed: Option<&str>,
) -> Result<Collected> {
    // Read again under the lease: a failed run resumed and published since the listing now
    // has these files in the log, which the listing's references did not know.
    let journal = Journal::load(store, run_id).await?;
    if journal.as_ref().map(|j| j.progress.updated_at.as_str()) != listed {
        return Ok(Collected::Moved);
    }
    if let (Some(journal), true) = (&journal, abandoned.contains(run_id))
        && !journal.progress.state.is_in_progress()
    {
        return Ok(Collected::Moved);
    }
    for file in files {
        match store
            .delete(&lakefill_table::storage::object_path(&file.path))
            .await
        {
            Ok(()) | Err(deltalake::ObjectStoreError::NotFound { .. }) => {}
            Err(source) => {
                return Err(Error::Storage {
                    path: file.path.clone(),
                    source,
                });
            }
        }
    }
    match journal {
        Some(mut journal) if abandoned.contains(run_id) => {
            journal.outcome.error = Some(format!(
                "staged files deleted by `lakefill gc` at {}",
                now()
            ));
            journal.transition(RunState::Discarded)?;
            journal.save(store, lease).await?;
            Ok(Collected::Discarded)
        }
        _ => Ok(Collected::Deleted),
    }
}

/// Every file directly inside a `lakefill-<run_id>/` directory of a partition directory.
async fn staged_files(
    store: &Arc<dyn ObjectStore>,
    root: &Url,
    partition_columns: &[String],
) -> Result<Vec<Staged>> {
    let mut out = Vec::new();
    for (prefix, partition) in partition_dirs(store, root, partition_columns).await? {
        let listing = list(store, &prefix).await?;
        if !prefix.as_ref().is_empty() && holds_a_table(&listing) {
            continue;
        }
        for dir in listing.common_prefixes {
            let Some(run_id) = dir.filename().and_then(RunId::from_staging_dir) else {
                continue;
            };
            if is_local_symlink(root, dir.as_ref()) {
                continue;
            }
            let inside = list(store, &dir).await?;
            if holds_a_table(&inside) {
                // A Delta table of its own that happens to be named like a staging directory
                // (#33): not lakefill's to delete.
                continue;
            }
            for object in inside.objects {
                if is_local_symlink(root, object.location.as_ref()) {
                    continue;
                }
                out.push(Staged {
                    path: object.location,
                    size: object.size,
                    run_id: run_id.clone(),
                    partition: Some(partition.clone()),
                });
            }
        }
    }
    // Runs' change data files: `_change_data/lakefill-<run_id>/…`.
    let feeds = list(store, &Path::from(lakefill_table::run_id::CHANGE_DATA_DIR)).await?;
    for dir in feeds.common_prefixes {
        let Some(run_id) = dir.filename().and_then(RunId::from_staging_dir) else {
            continue;
        };
        if is_local_symlink(root, dir.as_ref()) {
            continue;
        }
        for object in lakefill_table::storage::list_objects(store, &dir).await? {
            if is_local_symlink(root, object.location.as_ref()) {
                continue;
            }
            out.push(Staged {
                path: object.location,
                size: object.size,
                run_id: run_id.clone(),
                partition: None,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_within_bounds() {
        assert_eq!(
            parse_duration("90s").expect("valid"),
            Duration::from_secs(90)
        );
        assert_eq!(
            parse_duration("24h").expect("valid"),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            parse_duration("7d").expect("valid"),
            Duration::from_secs(604_800)
        );
        assert_eq!(
            parse_duration("1h 30m").expect("valid"),
            Duration::from_secs(5_400)
        );
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("24").is_err());
        for huge in ["18446744073709551615d", "99999999999999s", "36501d"] {
            let err = parse_duration(huge).expect_err(huge);
            assert_eq!(err.exit_code(), 2);
        }
        assert!(parse_duration("36500d").is_ok());
    }
}
