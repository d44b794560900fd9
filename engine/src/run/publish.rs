//! The publish step of a run: commit, then make the journal say what the log says.

use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::ObjectStore;
use deltalake::kernel::Action;
use deltalake::logstore::object_store::ObjectStoreExt as _;

use crate::publish::{commit, commit_actions};
use lakefill_log::find_run_commit;
use lakefill_log::journal::Journal;
use lakefill_log::journal::RunState;
use lakefill_log::journal::lease::RunLease;
use lakefill_log::published_sequence;
use lakefill_log::registry::record_published_model;
use lakefill_table::error::Error;
use lakefill_table::error::Result;
use lakefill_table::failpoint::{self, CrashPoint};

/// Each staged file of `journal` as the store describes it now: its ETag (a content hash on S3;
/// the inode, time and size on local disk), by path.
pub(crate) async fn stamps(
    store: &Arc<dyn ObjectStore>,
    journal: &Journal,
) -> Result<std::collections::BTreeMap<String, Option<String>>> {
    use futures::{StreamExt as _, TryStreamExt as _};
    // Owned: borrowed items in the stream would trip the future's `Send` bound.
    let paths: Vec<String> = journal
        .staged_files()
        .map(|a| a.path.clone())
        .chain(
            journal
                .vectors()
                .flat_map(|v| v.vector_files.iter().cloned()),
        )
        .collect();
    futures::stream::iter(paths)
        .map(|path| {
            let store = Arc::clone(store);
            async move {
                let meta = store
                    .head(&lakefill_table::storage::object_path(&path))
                    .await
                    .map_err(|source| Error::Storage {
                        path: path.clone(),
                        source,
                    })?;
                Ok::<_, Error>((path, meta.e_tag))
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await
}

/// Refuses to publish `journal` when a staged file is gone, or is not the file validation saw:
/// another size than its `add` action says, or another ETag than when validation ended (#33:
/// a staged file replaced on disk after `--stage-only` was published and broke every read).
pub(crate) async fn verify_staged(store: &Arc<dyn ObjectStore>, journal: &Journal) -> Result<()> {
    use futures::StreamExt as _;
    let stamp = |path: &str| {
        journal
            .progress
            .validated_stamps
            .get(path)
            .cloned()
            .flatten()
    };
    // Staged files with their sizes; deletion vector files (whose size no action gives) too.
    let files: Vec<(String, Option<i64>, Option<String>)> = journal
        .staged_files()
        .map(|add| (add.path.clone(), Some(add.size), stamp(&add.path)))
        .chain(
            journal
                .vectors()
                .flat_map(|v| &v.vector_files)
                .map(|path| (path.clone(), None, stamp(path))),
        )
        .collect();
    let checked: Vec<(String, Option<bool>)> = futures::stream::iter(files)
        .map(|(path, size, stamp)| {
            let store = Arc::clone(store);
            async move {
                let same = match store
                    .head(&lakefill_table::storage::object_path(&path))
                    .await
                {
                    Err(_) => None,
                    Ok(meta) => Some(
                        size.is_none_or(|size| i64::try_from(meta.size).ok() == Some(size))
                            && (stamp.is_none() || stamp == meta.e_tag),
                    ),
                };
                (path, same)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let missing = checked.iter().filter(|(_, same)| same.is_none()).count();
    if missing > 0 {
        return Err(Error::StagedFilesMissing {
            run_id: journal.run_id.to_string(),
            missing,
        });
    }
    let mut changed: Vec<String> = checked
        .into_iter()
        .filter(|(_, same)| *same == Some(false))
        .map(|(path, _)| path)
        .collect();
    if !changed.is_empty() {
        changed.sort();
        return Err(Error::StagedFileChanged {
            run_id: journal.run_id.to_string(),
            paths: changed,
        });
    }
    Ok(())
}

/// Commits a validated run and records the outcome in its journal. After any error from the
/// commit path the log is read again: if the commit landed after all, the run is published;
/// otherwise it is back where it was (or `failed`, when the target moved under it).
///
/// The commit publishes the run's staged files in place of its range, or, for a revert,
/// `actions` (see [`crate::run::revert`]).
pub(crate) async fn publish_journal(
    target_at_read_version: &DeltaTable,
    journal: &mut Journal,
    store: &Arc<dyn ObjectStore>,
    lease: &RunLease,
    actions: Option<Vec<Action>>,
) -> Result<()> {
    let before = journal.progress.state;
    journal.transition(RunState::Publishing)?;
    journal.save(store, lease).await?;
    failpoint::reach(CrashPoint::BeforeCommit).await?;
    lease.check()?;
    let committed = match actions {
        Some(actions) => commit_actions(target_at_read_version, journal, actions).await,
        None => commit(target_at_read_version, journal).await,
    };
    let error = match committed {
        Ok(version) => {
            failpoint::reach(CrashPoint::AfterCommit).await?;
            return published(journal, store, lease, Some(version)).await;
        }
        Err(error) => error,
    };
    // Did a version get written anyway (a lost response, a racing retry)?
    if let Ok(latest) = lakefill_table::storage::latest(target_at_read_version).await
        && published_sequence(&latest, &journal.run_id)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s >= journal.outcome.sequence)
    {
        let version = find_run_commit(&latest, &journal.run_id)
            .await
            .ok()
            .flatten();
        tracing::warn!(run_id = %journal.run_id, %error, "the commit reported an error but is in the log");
        return published(journal, store, lease, version).await;
    }
    journal.outcome.error = Some(error.to_string());
    journal.progress.state = match error {
        // The read version is stale for the range: validating again needs a new attempt.
        Error::Conflict { .. } => RunState::Failed,
        // A revert is decided afresh by the next `lakefill revert`, never published from here.
        _ if journal.inputs.kind.reverts_files() => RunState::Failed,
        _ => before,
    };
    if let Err(e) = journal.save(store, lease).await {
        tracing::warn!(run_id = %journal.run_id, error = %e, "cannot record the failed publish");
    }
    Err(error)
}

pub(crate) async fn published(
    journal: &mut Journal,
    store: &Arc<dyn ObjectStore>,
    lease: &RunLease,
    version: Option<u64>,
) -> Result<()> {
    journal.transition(RunState::Published)?;
    journal.outcome.published_version = version;
    journal.outcome.error = None;
    if journal.inputs.publish_as == lakefill_table::adjustments::PublishMode::Adjustments {
        // The new rows served validation; the table got the adjustment rows. What cannot be
        // deleted now is left to `gc` (no version references it).
        for add in journal.new_row_files() {
            if let Err(error) = deltalake::logstore::object_store::ObjectStoreExt::delete(
                store.as_ref(),
                &lakefill_table::storage::object_path(&add.path),
            )
            .await
            {
                tracing::debug!(path = %add.path, %error, "cannot delete a staged new-rows file");
            }
        }
    }
    if journal.inputs.kind.revert_of().is_none() {
        record_published_model(store, &journal.model_record()).await;
    }
    // The commit is in the log, which is the truth; a journal that cannot be written now is
    // repaired by the next command that reads the run.
    if let Err(error) = journal.save(store, lease).await {
        tracing::warn!(run_id = %journal.run_id, %error, "published, but cannot update the run journal");
    }
    Ok(())
}

pub(crate) fn empty_reason() -> Error {
    Error::InvalidOption {
        option: "--reason".into(),
        value: String::new(),
        message:
            "a forced publish records why validation is overridden; the reason must not be empty"
                .into(),
    }
}
