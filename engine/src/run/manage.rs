//! Runs after staging: list them, publish a staged run, discard one (write-audit-publish).
//!
//! Everything a run needs is in its journal under the target's root, so these operations work
//! from any machine that can reach the table and need no state besides the project file. The
//! Delta log is the truth and the journal a cache of it: every command reconciles a run with the
//! target's application transactions ([`reconcile`]) before it decides anything, and every
//! command that changes a run holds its lease ([`lakefill_log::journal::lease`]).

use std::sync::Arc;

use deltalake::ObjectStore;
use serde::Serialize;

use crate::run::cleanup::delete_run_files;
use crate::run::found::with_run;
use crate::run::publish::empty_reason;
use crate::run::publish::publish_journal;
use crate::run::reconcile::reconcile;
use crate::run::report::Outcome;
use crate::run::report::RunReport;
use crate::run::report::Timings;
use lakefill_log::journal::Journal;
use lakefill_log::journal::lease::RunLease;
use lakefill_log::journal::lease::holder;
use lakefill_log::journal::lifecycle::Publishable;
use lakefill_log::journal::{RunKind, RunState};
use lakefill_log::registry::record_published_model;
use lakefill_table::config::Project;
use lakefill_table::config::TableConfig;
use lakefill_table::error::Error;
use lakefill_table::error::Result;
use lakefill_table::partition::PartitionRange;
use lakefill_table::storage::open_table;

/// One line of `lakefill runs`; it reads back from its JSON document.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RunSummary {
    /// The run id.
    pub run_id: String,
    /// Target table.
    pub table: String,
    /// State, as the Delta log and the journal together say.
    pub state: RunState,
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// The range.
    pub range: PartitionRange,
    /// The `--where` predicate the run is scoped by (null when it replaces every row of its
    /// range).
    #[serde(default, rename = "where")]
    pub rows: Option<String>,
    /// Version the run read.
    pub read_version: u64,
    /// Version it published, if it did.
    pub published_version: Option<u64>,
    /// Whether validation passed, once it ran.
    pub validation_passed: Option<bool>,
    /// Batches finished of those planned.
    pub batches: (usize, usize),
    /// The process working on the run now, if any.
    pub worked_on_by: Option<String>,
    /// The error that stopped it, if any.
    pub error: Option<String>,
    /// When it was created.
    pub created_at: String,
    /// When its journal was last written.
    pub updated_at: String,
    /// The run this one reverts, when it is a revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_of: Option<String>,
    /// The cascade the run is a node of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade: Option<String>,
}

impl From<&Journal> for RunSummary {
    fn from(journal: &Journal) -> Self {
        Self {
            run_id: journal.run_id.to_string(),
            table: journal.inputs.target.clone(),
            state: journal.progress.state,
            model: journal.inputs.model.clone(),
            model_version: journal.inputs.model_version.clone(),
            range: journal.inputs.range.clone(),
            rows: journal.inputs.range.rows.as_ref().map(|r| r.sql.clone()),
            read_version: journal.inputs.read_version,
            published_version: journal.outcome.published_version,
            validation_passed: journal.validation_passed(),
            batches: (
                journal.progress.batches.len(),
                journal.inputs.planned_batches.len(),
            ),
            worked_on_by: None,
            error: journal.outcome.error.clone(),
            created_at: journal.inputs.created_at.clone(),
            updated_at: journal.progress.updated_at.clone(),
            revert_of: journal.inputs.kind.revert_of().map(ToString::to_string),
            cascade: journal.inputs.kind.cascade().map(str::to_string),
        }
    }
}

/// Lists the runs of `table`, or of every table of the project, newest first, each reconciled
/// with its table's Delta log (and its journal repaired when nobody is working on it).
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
        let store = opened.object_store();
        for mut journal in Journal::list(&store).await? {
            let busy = holder(&store, &journal.run_id).await?;
            if reconcile(&opened, &mut journal).await? && busy.is_none() {
                repair(&store, &journal).await;
            }
            let mut summary = RunSummary::from(&journal);
            summary.worked_on_by = busy.map(|h| format!("{} since {}", h.description, h.since));
            runs.push(summary);
        }
    }
    runs.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    Ok(runs)
}

/// Saves a reconciled journal if the run's lease is free. Best effort: the log stays the truth.
async fn repair(store: &Arc<dyn ObjectStore>, journal: &Journal) {
    let Ok(lease) = RunLease::acquire(store, &journal.inputs.target, &journal.run_id, "runs").await
    else {
        return;
    };
    // Read again under the lease: someone may have moved the run meanwhile.
    if let Ok(Some(mut current)) = Journal::load(store, &journal.run_id).await
        && current.progress.updated_at == journal.progress.updated_at
    {
        current.progress.state = journal.progress.state;
        current.outcome.published_version = journal.outcome.published_version;
        current.outcome.error = journal.outcome.error.clone();
        if let Err(error) = current.save(store, &lease).await {
            tracing::debug!(run_id = %journal.run_id, %error, "cannot repair the journal");
        }
        if current.progress.state == RunState::Published {
            record_published_model(store, &current.model_record()).await;
        }
    }
    lease.release().await;
}

/// Publishes a staged, validated run: one commit, conflict-checked against the run's read
/// version.
///
/// A run that failed validation is published only with `force_reason`, which the commit records.
/// A run whose staging or validation did not finish is refused with the command that resumes it.
pub async fn publish_run(
    project: &Project,
    run_id: &str,
    force_reason: Option<String>,
) -> Result<RunReport> {
    if force_reason.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err(empty_reason());
    }
    // A revert by files staged with `--stage-only` is committed by the revert itself.
    if let Some((reverted, reason)) =
        crate::run::revert::staged_file_revert(project, run_id).await?
    {
        return crate::run::revert::revert_run(project, reverted.as_str(), reason, false).await;
    }
    with_run(project, run_id, "publish", async |config, latest, journal, lease| {
        let store = latest.object_store();
        if let RunKind::Revert { of: reverted } = &journal.inputs.kind
            && journal.progress.state != RunState::Published
        {
            // A revert by files stages nothing: its commit is decided by `lakefill revert`.
            return Err(Error::RunState {
                run_id: run_id.to_string(),
                state: journal.progress.state.to_string(),
                action: "published".into(),
                next: format!("it is a revert that did not finish: run `lakefill revert {reverted}` again"),
            });
        }
        let (failed, violations) = journal
            .progress.validation
            .as_ref()
            .map(|v| (v.failed(), v.protocol_violations()))
            .unwrap_or_default();
        match journal.progress.state.publishable(
            run_id,
            force_reason.as_deref(),
            &journal.resume_command(),
            failed,
            violations,
        )? {
            Publishable::AlreadyPublished => {
                let mut report =
                    RunReport::from_journal(journal, Outcome::AlreadyPublished, Timings::default());
                // A crash right after the commit left its event unsent: the re-run sends it.
                report.notifications = crate::notify::after_commit(config, latest, None).await;
                return Ok(report);
            }
            Publishable::UpToDate => {
                return Ok(RunReport::from_journal(
                    journal,
                    Outcome::UpToDate,
                    Timings::default(),
                ));
            }
            Publishable::Commit => {}
        }
        let refuse = |next: String| Error::RunState {
            run_id: run_id.to_string(),
            state: journal.progress.state.to_string(),
            action: "published".into(),
            next,
        };
        if !journal.complete() {
            return Err(refuse(format!(
                "only {} of its {} batches are staged: run `{}` to finish it",
                journal.progress.batches.len(),
                journal.inputs.planned_batches.len(),
                journal.resume_command()
            )));
        }
        if journal.progress.validated_files.as_deref() != Some(journal.staged_digest().as_str()) {
            return Err(refuse(format!(
                "its staged files are not the ones validation saw: run `{}` to validate it again",
                journal.resume_command()
            )));
        }
        crate::run::publish::verify_staged(&store, journal).await?;
        if journal.progress.state == RunState::FailedValidation {
            journal.outcome.forced = force_reason.clone();
        }
        if let Some((adjusted, _)) = &journal.inputs.adjusts {
            let table = open_table(project.table(adjusted, "the run's journal")?, None).await?;
            crate::adjust::check_adjusted_unchanged(&table, journal).await?;
        }
        crate::notify::prepare(config, latest).await;
        let started = std::time::Instant::now();
        let at_read_version = open_table(config, Some(journal.inputs.read_version)).await?;
        publish_journal(&at_read_version, journal, &store, lease, None).await?;
        let publish_ms = started.elapsed().as_millis() as u64;
        let mut report = RunReport::from_journal(
            journal,
            Outcome::Published,
            Timings {
                publish_ms,
                total_ms: publish_ms,
                ..Timings::default()
            },
        );
        report.notifications =
            crate::notify::after_commit(config, latest, journal.outcome.published_version).await;
        Ok(report)
    })
    .await
}

/// Deletes a run's staged files and marks it discarded. A published run cannot be discarded:
/// its files are the table's data.
pub async fn discard_run(project: &Project, run_id: &str) -> Result<RunReport> {
    with_run(project, run_id, "discard", async |_config, latest, journal, lease| {
        if journal.progress.state == RunState::Published {
            return Err(Error::RunState {
                run_id: run_id.to_string(),
                state: journal.progress.state.to_string(),
                action: "discarded".into(),
                next: format!(
                    "its files are the table's data since version {}; to undo its change, run `lakefill revert {run_id}`",
                    journal
                        .outcome.published_version
                        .map_or_else(|| "?".into(), |v| v.to_string()),
                ),
            });
        }
        let store = latest.object_store();
        let deleted = delete_run_files(project, latest, journal).await?;
        tracing::info!(run_id, deleted, "discarded staged files");
        if journal.progress.state != RunState::Discarded {
            journal.transition(RunState::Discarded)?;
        }
        journal.save(&store, lease).await?;
        Ok(RunReport::from_journal(
            journal,
            Outcome::Discarded,
            Timings::default(),
        ))
    })
    .await
}
