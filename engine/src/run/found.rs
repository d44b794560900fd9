//! Finding a run by its id, and holding it: every command that changes a run finds the table
//! holding its journal, takes the run's lease, and reconciles the journal with the Delta log
//! before it decides anything.

use deltalake::DeltaTable;
use deltalake::logstore::object_store::ObjectStoreExt as _;

use crate::run::reconcile::reconcile;
use lakefill_log::journal::Journal;
use lakefill_log::journal::RunState;
use lakefill_log::journal::lease::RunLease;
use lakefill_log::registry::record_published_model;
use lakefill_table::config::Project;
use lakefill_table::config::TableConfig;
use lakefill_table::error::Error;
use lakefill_table::error::Result;
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::run_id::RunId;
use lakefill_table::storage::open_table;

/// Finds the table holding the journal of `run_id`.
pub(crate) async fn find_run(
    project: &Project,
    run_id: &RunId,
) -> Result<(TableConfig, DeltaTable)> {
    let mut searched = Vec::new();
    for config in project.tables() {
        let Ok(table) = open_table(config, None).await else {
            continue;
        };
        searched.push(config.name().to_string());
        if table
            .object_store()
            .head(&run_id.journal_path())
            .await
            .is_ok()
        {
            return Ok((config.clone(), table));
        }
    }
    Err(Error::UnknownRun {
        run_id: run_id.to_string(),
        searched,
    })
}

/// Runs `work` on the run's journal while holding its lease; the journal is read (and
/// reconciled with the log) after the lease is taken.
pub(crate) async fn with_run<T>(
    project: &Project,
    run_id: &str,
    command: &str,
    work: impl AsyncFnOnce(&TableConfig, &DeltaTable, &mut Journal, &RunLease) -> Result<T>,
) -> Result<T> {
    let run_id = &RunId::parse(run_id)?;
    let (config, found) = find_run(project, run_id).await?;
    failpoint::reach(CrashPoint::RunFound).await?;
    let store = found.object_store();
    let lease = RunLease::acquire(&store, config.name(), run_id, command).await?;
    let result = async {
        // The log as it is now that nobody else works on the run: whoever held it before may
        // have published it since it was found.
        let latest = lakefill_table::storage::latest(&found).await?;
        let mut journal =
            Journal::load(&store, run_id)
                .await?
                .ok_or_else(|| Error::UnknownRun {
                    run_id: run_id.to_string(),
                    searched: vec![config.name().to_string()],
                })?;
        if reconcile(&latest, &mut journal).await? {
            journal.save(&store, &lease).await?;
            if journal.progress.state == RunState::Published {
                record_published_model(&store, &journal.model_record()).await;
            }
        }
        work(&config, &latest, &mut journal, &lease).await
    }
    .await;
    lease.release().await;
    result
}
