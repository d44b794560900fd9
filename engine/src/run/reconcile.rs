//! The Delta log is the truth about a run; its journal is a cache of it.

use deltalake::DeltaTable;

use lakefill_log::find_run_commit;
use lakefill_log::journal::Journal;
use lakefill_log::journal::RunState;
use lakefill_log::published_sequence;
use lakefill_table::error::Result;

/// Makes `journal` agree with the target's Delta log (`latest`, loaded at its newest version):
/// a run whose application transaction is in the log is published, whatever its journal says; a
/// publish whose commit is not in the log did not happen. Returns whether the journal changed.
///
/// This is the one place that moves a run into `published` from outside a commit.
pub(crate) async fn reconcile(latest: &DeltaTable, journal: &mut Journal) -> Result<bool> {
    if let Some(changed) = published_in(latest, journal).await? {
        return Ok(changed);
    }
    if !matches!(
        journal.progress.state,
        RunState::Published | RunState::Publishing
    ) {
        return Ok(false);
    }
    // The journal may have been written after `latest` was read (a publish that finished since):
    // read the log again before deciding that its commit is not there.
    let latest = lakefill_table::storage::latest(latest).await?;
    if let Some(changed) = published_in(&latest, journal).await? {
        return Ok(changed);
    }
    match journal.progress.state {
        RunState::Published => {
            // Application transactions can expire; the commit itself is the proof.
            if find_run_commit(&latest, &journal.run_id).await?.is_some() {
                return Ok(false);
            }
            journal.progress.state = RunState::Failed;
            journal.outcome.error = Some(
                "the journal said published, but the Delta log has no commit of this run".into(),
            );
            Ok(true)
        }
        RunState::Publishing => {
            // The commit never landed: the run is as it was before the publish.
            journal.progress.state = match journal.validation_passed() {
                Some(true) => RunState::Validated,
                Some(false) => RunState::FailedValidation,
                None => RunState::Failed,
            };
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// When the log `latest` has the run's commit: the journal made `published` (whether it
/// changed); `None` when it has not.
async fn published_in(latest: &DeltaTable, journal: &mut Journal) -> Result<Option<bool>> {
    let logged = published_sequence(latest, &journal.run_id).await?;
    if logged.is_none_or(|sequence| sequence < journal.outcome.sequence) {
        return Ok(None);
    }
    // A version the log has not reached is no version of this run's (a damaged or hand-edited
    // journal): the log says which one is.
    let reached = lakefill_table::storage::loaded_version(latest)?;
    if journal.progress.state == RunState::Published
        && journal
            .outcome
            .published_version
            .is_some_and(|v| v <= reached)
    {
        return Ok(Some(false));
    }
    journal.progress.state = RunState::Published;
    journal.outcome.published_version = find_run_commit(latest, &journal.run_id)
        .await?
        .or(journal.outcome.published_version.filter(|v| *v <= reached));
    journal.outcome.error = None;
    tracing::info!(run_id = %journal.run_id, version = ?journal.outcome.published_version, "the Delta log has the run's commit: repaired its journal");
    Ok(Some(true))
}
