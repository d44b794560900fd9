//! Runs after staging: list them, publish a staged run, discard one (write-audit-publish).
//!
//! Everything a run needs is in its journal under the target's root, so these operations work
//! from any machine that can reach the table and need no state besides the project file. The
//! Delta log is the truth and the journal a cache of it: every command reconciles a run with the
//! target's application transactions ([`reconcile`]) before it decides anything, and every
//! command that changes a run holds its lease ([`crate::lease`]).

use std::sync::Arc;

use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::{DeltaTable, ObjectStore};
use serde::Serialize;

use crate::backfill::{Outcome, RunReport, Timings, publish_journal};
use crate::config::{Project, TableConfig};
use crate::error::{DeltaContext, Error, Result};
use crate::journal::{Journal, RunState};
use crate::lease::{RunLease, holder};
use crate::lifecycle::Publishable;
use crate::log::find_run_commit;
use crate::log::published_sequence;
use crate::log::references::ReferencedFiles;
use crate::log::registry::record_published_model;
use crate::partition::PartitionRange;
use crate::storage::open_table;

/// One line of `lakefill runs`.
#[derive(Debug, Clone, Serialize)]
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
            batches: (journal.batches.len(), journal.planned_batches.len()),
            worked_on_by: None,
            error: journal.error.clone(),
            created_at: journal.created_at.clone(),
            updated_at: journal.updated_at.clone(),
        }
    }
}

/// Makes `journal` agree with the target's Delta log (`latest`, loaded at its newest version):
/// a run whose application transaction is in the log is published, whatever its journal says; a
/// publish whose commit is not in the log did not happen. Returns whether the journal changed.
///
/// This is the one place that moves a run into `published` from outside a commit.
pub(crate) async fn reconcile(latest: &DeltaTable, journal: &mut Journal) -> Result<bool> {
    let logged = published_sequence(latest, &journal.run_id).await?;
    if logged.is_some_and(|sequence| sequence >= journal.sequence) {
        if journal.state == RunState::Published && journal.published_version.is_some() {
            return Ok(false);
        }
        journal.state = RunState::Published;
        journal.published_version = find_run_commit(latest, &journal.run_id)
            .await?
            .or(journal.published_version);
        journal.error = None;
        tracing::info!(run_id = %journal.run_id, version = ?journal.published_version, "the Delta log has the run's commit: repaired its journal");
        return Ok(true);
    }
    match journal.state {
        RunState::Published => {
            // Application transactions can expire; the commit itself is the proof.
            if find_run_commit(latest, &journal.run_id).await?.is_some() {
                return Ok(false);
            }
            journal.state = RunState::Failed;
            journal.error = Some(
                "the journal said published, but the Delta log has no commit of this run".into(),
            );
            Ok(true)
        }
        RunState::Publishing => {
            // The commit never landed: the run is as it was before the publish.
            journal.state = match journal.validation_passed() {
                Some(true) => RunState::Validated,
                Some(false) => RunState::FailedValidation,
                None => RunState::Failed,
            };
            Ok(true)
        }
        _ => Ok(false),
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
    let Ok(lease) = RunLease::acquire(store, &journal.target, &journal.run_id, "runs").await else {
        return;
    };
    // Read again under the lease: someone may have moved the run meanwhile.
    if let Ok(Some(mut current)) = Journal::load(store, &journal.run_id).await
        && current.updated_at == journal.updated_at
    {
        current.state = journal.state;
        current.published_version = journal.published_version;
        current.error = journal.error.clone();
        if let Err(error) = current.save(store, &lease).await {
            tracing::debug!(run_id = %journal.run_id, %error, "cannot repair the journal");
        }
        if current.state == RunState::Published {
            record_published_model(store, &current).await;
        }
    }
    lease.release().await;
}

/// Finds the table holding the journal of `run_id`.
async fn find_run(project: &Project, run_id: &str) -> Result<(TableConfig, DeltaTable)> {
    if !crate::journal::is_run_id(run_id) {
        return Err(Error::InvalidOption {
            option: "RUN_ID".into(),
            value: run_id.to_string(),
            message: "a run id holds only letters, digits, `-`, `_` and `.`".into(),
        });
    }
    let mut searched = Vec::new();
    for config in project.tables() {
        let Ok(table) = open_table(config, None).await else {
            continue;
        };
        searched.push(config.name().to_string());
        if table
            .object_store()
            .head(&Journal::path(run_id))
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
async fn with_run<T>(
    project: &Project,
    run_id: &str,
    command: &str,
    work: impl AsyncFnOnce(&TableConfig, &DeltaTable, &mut Journal, &RunLease) -> Result<T>,
) -> Result<T> {
    let (config, latest) = find_run(project, run_id).await?;
    let store = latest.object_store();
    let lease = RunLease::acquire(&store, config.name(), run_id, command).await?;
    let result = async {
        let mut journal =
            Journal::load(&store, run_id)
                .await?
                .ok_or_else(|| Error::UnknownRun {
                    run_id: run_id.to_string(),
                    searched: vec![config.name().to_string()],
                })?;
        if reconcile(&latest, &mut journal).await? {
            journal.save(&store, &lease).await?;
            if journal.state == RunState::Published {
                record_published_model(&store, &journal).await;
            }
        }
        work(&config, &latest, &mut journal, &lease).await
    }
    .await;
    lease.release().await;
    result
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
    with_run(project, run_id, "publish", async |config, latest, journal, lease| {
        let store = latest.object_store();
        let (failed, violations) = journal
            .validation
            .as_ref()
            .map(|v| (v.failed(), v.protocol_violations()))
            .unwrap_or_default();
        match journal.state.publishable(
            run_id,
            force_reason.as_deref(),
            &journal.resume_command(),
            failed,
            violations,
        )? {
            Publishable::AlreadyPublished => {
                return Ok(RunReport::from_journal(
                    journal,
                    Outcome::AlreadyPublished,
                    Timings::default(),
                ));
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
            state: journal.state.to_string(),
            action: "published".into(),
            next,
        };
        if !journal.complete() {
            return Err(refuse(format!(
                "only {} of its {} batches are staged: run `{}` to finish it",
                journal.batches.len(),
                journal.planned_batches.len(),
                journal.resume_command()
            )));
        }
        if journal.validated_files.as_deref() != Some(journal.staged_digest().as_str()) {
            return Err(refuse(format!(
                "its staged files are not the ones validation saw: run `{}` to validate it again",
                journal.resume_command()
            )));
        }
        let mut missing = 0;
        for add in journal.staged_files() {
            if store
                .head(&crate::storage::object_path(&add.path))
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
        if journal.state == RunState::FailedValidation {
            journal.forced = force_reason.clone();
        }
        let started = std::time::Instant::now();
        let at_read_version = open_table(config, Some(journal.read_version)).await?;
        publish_journal(&at_read_version, journal, &store, lease).await?;
        let publish_ms = started.elapsed().as_millis() as u64;
        Ok(RunReport::from_journal(
            journal,
            Outcome::Published,
            Timings {
                publish_ms,
                total_ms: publish_ms,
                ..Timings::default()
            },
        ))
    })
    .await
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

/// Deletes a run's staged files and marks it discarded. A published run cannot be discarded:
/// its files are the table's data.
pub async fn discard_run(project: &Project, run_id: &str) -> Result<RunReport> {
    with_run(project, run_id, "discard", async |_config, latest, journal, lease| {
        if journal.state == RunState::Published {
            return Err(Error::RunState {
                run_id: run_id.to_string(),
                state: journal.state.to_string(),
                action: "discarded".into(),
                next: format!(
                    "its files are the table's data since version {}; to undo its change, run a new backfill over {}..={} (e.g. with an older `--model-version`)",
                    journal
                        .published_version
                        .map_or_else(|| "?".into(), |v| v.to_string()),
                    journal.range.from,
                    journal.range.to
                ),
            });
        }
        let store = latest.object_store();
        let deleted = delete_run_files(project, latest, journal).await?;
        tracing::info!(run_id, deleted, "discarded staged files");
        if journal.state != RunState::Discarded {
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

async fn delete_staging(
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
            .map(|p| crate::storage::object_path(p))
            .collect()
    };
    for prefix in staging_dirs(&store, &root, journal).await? {
        let listed = store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|source| Error::Storage {
                path: prefix.to_string(),
                source,
            })?
            .objects;
        candidates.extend(
            listed
                .into_iter()
                .map(|o| o.location)
                .filter(|p| !(keep_journaled && journaled.contains(p.as_ref()))),
        );
    }
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
        if crate::storage::is_local_symlink(&root, path.as_ref()) {
            tracing::warn!(path = %path, "kept a staged path that passes through a symbolic link");
            continue;
        }
        if referenced.contains(&root, path.as_ref()) {
            tracing::warn!(path = %path, "kept a staged file that a table version references");
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
    let layout = &journal.layout;
    let mut dirs = Vec::new();
    for (dir, values) in crate::gc::partition_dirs(store, root, &layout.partition_columns).await? {
        if layout.label_in(&journal.range, &values).is_none() {
            continue;
        }
        let dir = dir.join(format!("lakefill-{}", journal.run_id).as_str());
        if !crate::storage::is_local_symlink(root, dir.as_ref()) {
            dirs.push(dir);
        }
    }
    Ok(dirs)
}

/// Reloads `table` at its newest version.
pub(crate) async fn latest(table: &DeltaTable) -> Result<DeltaTable> {
    let mut latest = table.clone();
    latest
        .update_incremental(None)
        .await
        .delta_context(|| format!("cannot read the log of `{}`", table.table_url()))?;
    Ok(latest)
}
