//! Runs after staging: list them, publish a staged run, discard one (write-audit-publish).
//!
//! Everything a run needs is in its journal under the target's root, so these operations work
//! from any machine that can reach the table and need no state besides the project file.

use deltalake::DeltaTable;
use deltalake::logstore::object_store::ObjectStoreExt as _;
use serde::Serialize;

use crate::backfill::{Outcome, RunReport, Timings, delete_staged, publish_journal};
use crate::config::{Project, TableConfig};
use crate::error::{Error, Result};
use crate::journal::{Journal, RunState};
use crate::partition::PartitionRange;
use crate::publish::published_sequence;
use crate::storage::open_table;

/// One line of `lakefill runs`.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// The run id.
    pub run_id: String,
    /// Target table.
    pub table: String,
    /// State.
    pub state: RunState,
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// The range.
    pub range: PartitionRange,
    /// Version the run read.
    pub read_version: u64,
    /// Version it published, if it did.
    pub published_version: Option<u64>,
    /// Whether validation passed, once it ran.
    pub validation_passed: Option<bool>,
    /// The error that stopped it, if any.
    pub error: Option<String>,
    /// When it was created.
    pub created_at: String,
    /// When its journal was last written.
    pub updated_at: String,
}

impl From<&Journal> for RunSummary {
    fn from(journal: &Journal) -> Self {
        Self {
            run_id: journal.run_id.clone(),
            table: journal.target.clone(),
            state: journal.state,
            model: journal.model.clone(),
            model_version: journal.model_version.clone(),
            range: journal.range.clone(),
            read_version: journal.read_version,
            published_version: journal.published_version,
            validation_passed: journal.validation_passed(),
            error: journal.error.clone(),
            created_at: journal.created_at.clone(),
            updated_at: journal.updated_at.clone(),
        }
    }
}

/// Lists the runs of `table`, or of every table of the project, newest first.
pub async fn list_runs(project: &Project, table: Option<&str>) -> Result<Vec<RunSummary>> {
    let tables: Vec<&TableConfig> = match table {
        Some(name) => vec![project.table(name, "the command line")?],
        None => project.tables().collect(),
    };
    let mut runs = Vec::new();
    for config in tables {
        let opened = match open_table(config, None).await {
            Ok(opened) => opened,
            // Listing every table: one that is not (yet) a Delta table simply has no runs.
            Err(Error::NotADeltaTable { .. }) if table.is_none() => continue,
            Err(error) => return Err(error),
        };
        for journal in Journal::list(&opened.object_store()).await? {
            runs.push(RunSummary::from(&journal));
        }
    }
    runs.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    Ok(runs)
}

/// Finds the table holding the journal of `run_id`.
async fn find_run(project: &Project, run_id: &str) -> Result<(TableConfig, DeltaTable, Journal)> {
    let mut searched = Vec::new();
    for config in project.tables() {
        let Ok(table) = open_table(config, None).await else {
            continue;
        };
        searched.push(config.name().to_string());
        if let Some(journal) = Journal::load(&table.object_store(), run_id).await? {
            return Ok((config.clone(), table, journal));
        }
    }
    Err(Error::UnknownRun {
        run_id: run_id.to_string(),
        searched,
    })
}

/// Publishes a staged run: one commit, conflict-checked against the run's read version.
///
/// A run that failed validation is published only with `force_reason`, which the commit records.
pub async fn publish_run(
    project: &Project,
    run_id: &str,
    force_reason: Option<String>,
) -> Result<RunReport> {
    let (config, latest, mut journal) = find_run(project, run_id).await?;
    let store = latest.object_store();
    match journal.state {
        RunState::Published => {
            return Ok(RunReport::from_journal(
                &journal,
                Outcome::AlreadyPublished,
                Timings::default(),
            ));
        }
        RunState::Staged => {
            if journal.validation_passed() == Some(false) && force_reason.is_none() {
                return Err(Error::ValidationFailed {
                    run_id: run_id.to_string(),
                    failed: crate::validate::failed_checks(journal.validation.as_ref()),
                });
            }
        }
        RunState::FailedValidation => {
            if force_reason.is_none() {
                return Err(Error::ValidationFailed {
                    run_id: run_id.to_string(),
                    failed: crate::validate::failed_checks(journal.validation.as_ref()),
                });
            }
        }
        state
        @ (RunState::Planned | RunState::Staging | RunState::Discarded | RunState::Failed) => {
            return Err(Error::RunState {
                run_id: run_id.to_string(),
                state: state.to_string(),
                action: "published".into(),
            });
        }
    }
    if journal.validation_passed() != Some(true) {
        journal.forced = force_reason;
    }
    // A publish retried after an ambiguous failure: the commit is already there.
    if published_sequence(&latest, run_id)
        .await?
        .is_some_and(|s| s >= journal.sequence)
    {
        journal.state = RunState::Published;
        journal.save(&store).await?;
        return Ok(RunReport::from_journal(
            &journal,
            Outcome::AlreadyPublished,
            Timings::default(),
        ));
    }
    let mut missing = 0;
    for add in journal.staged_files() {
        if store
            .head(&deltalake::Path::from(add.path.as_str()))
            .await
            .is_err()
        {
            missing += 1;
        }
    }
    if missing > 0 {
        return Err(Error::StagedFilesMissing {
            run_id: run_id.to_string(),
            missing,
        });
    }
    let started = std::time::Instant::now();
    let at_read_version = open_table(&config, Some(journal.read_version)).await?;
    publish_journal(&at_read_version, &mut journal, &store).await?;
    let publish_ms = started.elapsed().as_millis() as u64;
    Ok(RunReport::from_journal(
        &journal,
        Outcome::Published,
        Timings {
            publish_ms,
            total_ms: publish_ms,
            ..Timings::default()
        },
    ))
}

/// Deletes a run's staged files and marks it discarded. A published run cannot be discarded.
pub async fn discard_run(project: &Project, run_id: &str) -> Result<RunReport> {
    let (_config, latest, mut journal) = find_run(project, run_id).await?;
    if journal.state == RunState::Published {
        return Err(Error::RunState {
            run_id: run_id.to_string(),
            state: journal.state.to_string(),
            action: "discarded".into(),
        });
    }
    let store = latest.object_store();
    let deleted = delete_staged(&store, &journal).await;
    tracing::info!(run_id, deleted, "discarded staged files");
    journal.state = RunState::Discarded;
    journal.save(&store).await?;
    Ok(RunReport::from_journal(
        &journal,
        Outcome::Discarded,
        Timings::default(),
    ))
}
