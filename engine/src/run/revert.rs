//! Reverting a published run (DESIGN §3 `revert`): one new commit that removes exactly the files
//! the run added and puts back the files it removed, as the log recorded them at the version
//! before the run's commit (paths, partition values, sizes, statistics, deletion vectors). Only
//! the run's range changes; later commits elsewhere survive.
//!
//! Safe by default, it refuses (nothing committed) when a later commit changed the run's range
//! (exit 4, naming the versions: reverting by files would undo them too), when a file it would
//! put back is gone from storage (vacuumed; naming the files and the table's retention), or when
//! the run is not published.
//!
//! A revert is a run of its own: its id is derived from the reverted run and the version of its
//! commit, it has a journal (`revert_of`), it commits under its own application transaction (so
//! a retried or repeated revert is found in the log and changes nothing), and its commit carries
//! the usual metadata with `revert_of`, which `history` and `blame` show. Reverting a revert puts
//! the run's output back. It stages nothing, so a crash before its commit leaves nothing to clean
//! up, and one after it is reconciled from the log by the next command.
//!
//! When later commits block a revert by files, [`logical_revert_plan`] recomputes the range as
//! it was instead (`--logical`, see [`lakefill_recompute::plan::restore`]): a staged, validated run under the
//! same revert id, so either way a run is reverted at most once.

use std::collections::{BTreeMap, BTreeSet};

use deltalake::DeltaTable;
use deltalake::kernel::{Action, LogicalFileView};
use deltalake::logstore::object_store::ObjectStoreExt as _;
use sha2::{Digest, Sha256};

use crate::run::found::{find_run, with_run};
use crate::run::publish::publish_journal;
use crate::run::reconcile::reconcile;
use crate::run::report::{Outcome, RunReport, Timings};
use lakefill_log::journal::lease::RunLease;
use lakefill_log::journal::{
    Journal, PartitionChange, RunInputs, RunKind, RunOutcome, RunProgress, RunState,
};
use lakefill_log::{Commit, commits_in_range, published_sequence, read_commit};
use lakefill_recompute::plan::BackfillPlan;
use lakefill_recompute::plan::restore::{Restore, restore_plan};
use lakefill_table::config::{Project, TableConfig};
use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::model::Model;
use lakefill_table::resources::Resources;
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{decode, live_rows, loaded_version, open_table};
use lakefill_validate::compare::compare;
use lakefill_validate::rows::register_range;
use lakefill_validate::spec::{CompareSpec, PartitionKey};
use lakefill_validate::{CheckResult, ValidationReport, ValidationRules};

/// The label per-partition counts of a by-rows revert are kept under.
const RANGE_LABEL: &str = "(range)";

/// Reverts the published run `run_id` by files: see the module docs. With `stage_only`, every
/// check runs and the revert is recorded `validated`, for `lakefill publish REVERT_ID` to commit.
pub async fn revert_run(
    project: &Project,
    run_id: &str,
    reason: Option<String>,
    stage_only: bool,
) -> Result<RunReport> {
    check_reason(reason.as_deref())?;
    with_run(
        project,
        run_id,
        "revert",
        async |config, latest, journal, _lease| {
            let version = reverted_version(run_id, journal)?;
            if journal.inputs.publish_as == lakefill_table::adjustments::PublishMode::Adjustments {
                return Err(Error::RunState {
                    run_id: run_id.to_string(),
                    state: journal.progress.state.to_string(),
                    action: "reverted by removing its files".into(),
                    next: format!(
                        "it appended adjustments: `lakefill revert {run_id} --logical` appends their negation"
                    ),
                });
            }
            let revert_id = revert_id(journal, version);
            let store = latest.object_store();
            let lease = RunLease::acquire(&store, config.name(), &revert_id, "revert").await?;
            let result = revert_held(
                project, config, latest, journal, version, &revert_id, reason, stage_only, &lease,
            )
            .await;
            lease.release().await;
            let mut report = result?;
            report.notes.extend(children_left(project, journal).await);
            Ok(report)
        },
    )
    .await
}

/// When `run` is a node of a cascade whose later nodes (computed from it) are still published:
/// what they keep, and the command that reverts them too.
async fn children_left(project: &Project, run: &Journal) -> Option<String> {
    let cascade = run.inputs.kind.cascade()?;
    let (_, record) = lakefill_log::journal::cascade::load_record(project, cascade)
        .await
        .ok()?;
    let position = record
        .nodes
        .iter()
        .position(|n| n.run_id == run.run_id.as_str())?;
    let children: Vec<String> = record.nodes[position + 1..]
        .iter()
        .filter(|n| n.state == RunState::Published.to_string())
        .map(|n| format!("`{}`", n.table))
        .collect();
    if children.is_empty() {
        return None;
    }
    Some(format!(
        "run `{}` is the `{}` node of cascade `{cascade}`; {} still hold{} what the cascade computed from the rows this revert took out: `lakefill revert {cascade}` reverts them too (children first)",
        run.run_id,
        run.inputs.target,
        children.join(", "),
        if children.len() == 1 { "s" } else { "" }
    ))
}

/// Plans the logical revert of the published run `run_id` (`lakefill revert RUN_ID --logical`):
/// a backfill of its range that reads the table as it was just before the run's commit (see
/// `plan::restore`). Run it with [`crate::BackfillBuilder`] like any plan: it is staged,
/// validated (old = the range now, new = the range restored), journaled and published with the
/// usual conflict check, as the revert of `run_id`; a second revert of the same run publishes
/// nothing. Unlike a revert by files, later commits in the range do not block it (they are
/// named in the plan's notes: their changes in the range are replaced too).
pub async fn logical_revert_plan(
    project: &Project,
    run_id: &str,
    reason: Option<String>,
    batch_partitions: Option<usize>,
) -> Result<BackfillPlan> {
    check_reason(reason.as_deref())?;
    let batch_partitions = lakefill_table::settings::batch_partitions(project, batch_partitions)?;
    with_run(
        project,
        run_id,
        "revert",
        async |config, latest, journal, _lease| {
            let version = reverted_version(run_id, journal)?;
            let revert_id = revert_id(journal, version);
            let latest_version = loaded_version(latest)?;
            let commit = run_commit(latest, journal, version).await?;
            // The rows to restore are in the files the run replaced: they must still exist.
            restorable_files(config, latest, journal, version, &commit).await?;
            let later = commits_in_range(
                latest,
                version,
                &journal.inputs.layout,
                &journal.inputs.range,
                latest_version,
            )
            .await?;
            restore_plan(Restore {
                project,
                config,
                latest,
                run: journal,
                version,
                revert_id,
                reason: reason.clone(),
                batch_partitions,
                later,
            })
            .await
        },
    )
    .await
}

/// Whether the published run `run_id` is reverted by recomputing its range (it appended
/// adjustments: its revert appends their negation, and never removes a file).
pub async fn reverts_logically(project: &Project, run_id: &str) -> Result<bool> {
    let run_id = RunId::parse(run_id)?;
    let (_, latest) = find_run(project, &run_id).await?;
    Ok(Journal::load(&latest.object_store(), &run_id)
        .await?
        .is_some_and(|j| {
            j.inputs.publish_as == lakefill_table::adjustments::PublishMode::Adjustments
        }))
}

/// The revert by files of `run_id` staged with `--stage-only`, if that is what it is: the run it
/// reverts and its reason.
pub(crate) async fn staged_file_revert(
    project: &Project,
    run_id: &str,
) -> Result<Option<(RunId, Option<String>)>> {
    let Ok(run_id) = RunId::parse(run_id) else {
        return Ok(None);
    };
    let Ok((_, latest)) = find_run(project, &run_id).await else {
        return Ok(None);
    };
    Ok(Journal::load(&latest.object_store(), &run_id)
        .await?
        .filter(|j| j.progress.state == RunState::Validated)
        .and_then(|j| match &j.inputs.kind {
            RunKind::Revert { of } => Some((of.clone(), j.inputs.reason.clone())),
            _ => None,
        }))
}

/// A reason is recorded with the revert: it must say something.
fn check_reason(reason: Option<&str>) -> Result<()> {
    if reason.is_some_and(|r| r.trim().is_empty()) {
        return Err(Error::InvalidOption {
            option: "--reason".into(),
            value: String::new(),
            message: "the reason is recorded with the revert; it must not be empty".into(),
        });
    }
    Ok(())
}

/// The version the published run `journal` committed; any other state is refused.
fn reverted_version(run_id: &str, journal: &Journal) -> Result<u64> {
    if journal.progress.state != RunState::Published {
        return Err(Error::RunState {
            run_id: run_id.to_string(),
            state: journal.progress.state.to_string(),
            action: "reverted".into(),
            next: format!(
                "only a published run changed the table; `lakefill discard {run_id}` deletes what it staged"
            ),
        });
    }
    journal.outcome.published_version.ok_or_else(|| {
        Error::Internal(format!(
            "run `{run_id}` is published but its version is unknown"
        ))
    })
}

/// The commit of the run, from the log.
async fn run_commit(latest: &DeltaTable, run: &Journal, version: u64) -> Result<Commit> {
    read_commit(latest, version).await?.ok_or_else(|| Error::RunState {
        run_id: run.run_id.to_string(),
        state: run.progress.state.to_string(),
        action: "reverted".into(),
        next: format!(
            "its commit (version {version}) is no longer in the Delta log (log retention): recompute {}..={} with a backfill instead",
            run.inputs.range.from, run.inputs.range.to
        ),
    })
}

/// The files the run's commit removed, as the version before it had them; refused, naming them
/// and the table's retention, when any is gone from storage (vacuumed).
async fn restorable_files(
    config: &TableConfig,
    latest: &DeltaTable,
    run: &Journal,
    version: u64,
    commit: &Commit,
) -> Result<Vec<LogicalFileView>> {
    let removed: BTreeSet<String> = commit.removed_paths.iter().map(|p| decode(p)).collect();
    let before = open_table(config, Some(version - 1)).await?;
    let before_snapshot = before.snapshot().delta_context(|| {
        format!(
            "cannot read version {} of `{}`",
            version - 1,
            run.inputs.target
        )
    })?;
    let restored: Vec<LogicalFileView> = before_snapshot
        .log_data()
        .iter()
        .filter(|file| removed.contains(file.path().as_ref()))
        .collect();
    if restored.len() != removed.len() {
        return Err(Error::Internal(format!(
            "version {version} of `{}` removed {} files, but version {} holds only {} of them",
            run.inputs.target,
            removed.len(),
            version - 1,
            restored.len()
        )));
    }
    let store = latest.object_store();
    let mut missing = Vec::new();
    for file in &restored {
        if store.head(&file.object_store_path()).await.is_err() {
            missing.push(file.path().to_string());
        }
    }
    if !missing.is_empty() {
        let snapshot = latest
            .snapshot()
            .delta_context(|| format!("cannot read the snapshot of `{}`", run.inputs.target))?;
        let retention = snapshot
            .metadata()
            .configuration()
            .get("delta.deletedFileRetentionDuration")
            .cloned()
            .unwrap_or_else(|| "interval 1 week, the default".into());
        return Err(Error::RevertFilesGone {
            run_id: run.run_id.to_string(),
            table: run.inputs.target.clone(),
            missing,
            retention,
        });
    }
    Ok(restored)
}

/// The id of the revert of `journal`'s commit at `version`: the same for every attempt, another
/// for a later publish of the same run.
fn revert_id(journal: &Journal, version: u64) -> RunId {
    let digest = hex::encode(Sha256::digest(format!(
        "revert\n{}\n{version}",
        journal.run_id
    )));
    RunId::derive(&journal.inputs.model, "revert", &digest)
}

/// The revert, holding the leases of the run and of its revert.
#[expect(
    clippy::too_many_arguments,
    reason = "the run, its commit and the revert's options, each used once"
)]
async fn revert_held(
    project: &Project,
    config: &TableConfig,
    latest: &DeltaTable,
    run: &Journal,
    version: u64,
    revert_id: &RunId,
    reason: Option<String>,
    stage_only: bool,
    lease: &RunLease,
) -> Result<RunReport> {
    let started = std::time::Instant::now();
    let store = latest.object_store();
    let latest_version = loaded_version(latest)?;
    let mut revert = match Journal::load(&store, revert_id).await? {
        Some(existing) if existing.inputs.kind.revert_of() == Some(&run.run_id) => existing,
        _ => revert_journal(run, revert_id, latest_version, reason.clone()),
    };
    // The log is the truth: a revert already committed (by an earlier attempt whose journal
    // never heard of it, or by a racing process) is reported, not made again.
    if published_sequence(latest, revert_id).await?.is_some() {
        if reconcile(latest, &mut revert).await? {
            revert.save(&store, lease).await?;
        }
        return Ok(RunReport::from_journal(
            &revert,
            Outcome::AlreadyReverted,
            Timings::default(),
        ));
    }
    if revert.inputs.kind.is_logical_revert()
        && !matches!(
            revert.progress.state,
            RunState::Discarded | RunState::UpToDate
        )
    {
        // Its staged files would be forgotten: it is finished or discarded first.
        return Err(Error::RunState {
            run_id: revert_id.to_string(),
            state: revert.progress.state.to_string(),
            action: "replaced by a revert by files".into(),
            next: format!(
                "a logical revert of {} is under way: finish it with `lakefill revert {} --logical` (or `lakefill publish {revert_id}`), or `lakefill discard {revert_id}` first",
                run.run_id, run.run_id
            ),
        });
    }
    revert = revert_journal(run, revert_id, latest_version, reason);

    let commit = run_commit(latest, run, version).await?;
    let current = live_files(latest, run, version, latest_version, &commit).await?;
    // What it removed, as the version before its commit had it.
    let restored = restorable_files(config, latest, run, version, &commit).await?;

    let mapping = lakefill_table::mapping::ColumnMapping::of_table(latest)?;
    revert.progress.partitions = partition_changes(run, &mapping, &current, &restored);
    let (validation, sides, key) = compare_versions(project, latest, run, version).await?;
    let passed = validation.passed;
    revert.progress.validation = Some(validation);
    if !passed || stage_only {
        // Rows it would put back that break the table's rules now: nothing is committed.
        let outcome = if passed {
            Outcome::Staged
        } else {
            revert.progress.state = RunState::FailedValidation;
            Outcome::ValidationFailed
        };
        revert.save(&store, lease).await?;
        let timings = Timings {
            total_ms: started.elapsed().as_millis() as u64,
            ..Timings::default()
        };
        return Ok(RunReport::from_journal(&revert, outcome, timings));
    }
    crate::notify::prepare(config, latest).await;
    let mut actions = swap(&current, &restored);
    if crate::run::feed::table_records_feed(latest)? {
        // The feed of the revert: the rows it takes out and puts back, from the same sides.
        crate::run::cleanup::delete_unjournaled_feed(latest, &revert).await?;
        lakefill_table::rowhash::register_hash_functions(&sides);
        let feed = crate::run::feed::write_feed_between(
            &sides,
            ("previous", "output"),
            (&key, None, None),
            &revert,
            &mapping,
            std::sync::Arc::clone(&store),
        )
        .await?;
        revert.progress.change_feed = Some(feed);
        actions = crate::publish::with_change_feed(actions, &revert, &mapping);
    }
    tracing::info!(
        run_id = %run.run_id,
        revert = %revert_id,
        removes = current.len(),
        adds = restored.len(),
        "reverting"
    );
    publish_journal(latest, &mut revert, &store, lease, Some(actions)).await?;
    let publish_ms = started.elapsed().as_millis() as u64;
    let mut report = RunReport::from_journal(
        &revert,
        Outcome::Reverted,
        Timings {
            publish_ms,
            total_ms: publish_ms,
            ..Timings::default()
        },
    );
    report.notifications =
        crate::notify::after_commit(config, latest, revert.outcome.published_version).await;
    Ok(report)
}

/// The files `run` added (its commit is `commit`, at `version`), as `latest` has them now;
/// refused, naming the commits, when a later commit changed the run's range or one of those
/// files is gone.
async fn live_files(
    latest: &DeltaTable,
    run: &Journal,
    version: u64,
    latest_version: u64,
    commit: &Commit,
) -> Result<Vec<LogicalFileView>> {
    let blocked = |versions: Vec<u64>| Error::RevertBlocked {
        run_id: run.run_id.to_string(),
        table: run.inputs.target.clone(),
        versions,
        range: run.inputs.range.span(),
    };
    let later = commits_in_range(
        latest,
        version,
        &run.inputs.layout,
        &run.inputs.range,
        latest_version,
    )
    .await?;
    if !later.is_empty() {
        return Err(blocked(later));
    }
    // What the run added must still be live, exactly.
    let added: BTreeSet<String> = commit.added_paths.iter().map(|p| decode(p)).collect();
    let snapshot = latest
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", run.inputs.target))?;
    let current: Vec<LogicalFileView> = snapshot
        .log_data()
        .iter()
        .filter(|file| added.contains(file.path().as_ref()))
        .collect();
    if current.len() != added.len() {
        // Some file the run added is gone, yet no later commit touched the range as the log
        // tells it: refuse, naming every later commit.
        return Err(blocked((version + 1..=latest_version).collect()));
    }
    Ok(current)
}

/// The actions of a revert by files: remove what the run added, re-add what it removed.
fn swap(current: &[LogicalFileView], restored: &[LogicalFileView]) -> Vec<Action> {
    let mut actions: Vec<Action> = current
        .iter()
        .map(|file| Action::Remove(lakefill_log::writer::remove(file)))
        .collect();
    actions.extend(restored.iter().map(|file| {
        #[expect(
            deprecated,
            reason = "a revert re-adds the log's own add entries, as delta-rs's RESTORE does"
        )]
        let mut add = file.add_action();
        add.data_change = true;
        Action::Add(add)
    }));
    actions
}

/// The journal of a revert of `run`, read at `read_version`: validated (it stages nothing and
/// puts back files the log already had), ready to publish.
fn revert_journal(
    run: &Journal,
    revert_id: &RunId,
    read_version: u64,
    reason: Option<String>,
) -> Journal {
    let now = lakefill_table::time::now();
    Journal {
        format: lakefill_log::journal::JOURNAL_FORMAT,
        run_id: revert_id.clone(),
        inputs: RunInputs {
            model: run.inputs.model.clone(),
            model_version: run.inputs.model_version.clone(),
            fingerprint: run.inputs.fingerprint.clone(),
            target: run.inputs.target.clone(),
            layout: run.inputs.layout.clone(),
            partition_column: None,
            read_version,
            range: run.inputs.range.clone(),
            sources: run.inputs.sources.clone(),
            self_sources: run.inputs.self_sources.clone(),
            allow_spill: None,
            reason: reason.or_else(|| Some(format!("revert of {}", run.run_id))),
            added_columns: Vec::new(),
            affected_files: Vec::new(),
            planned_batches: Vec::new(),
            resume: None,
            publish_as: lakefill_table::adjustments::PublishMode::Rewrite,
            adjusts: None,
            kind: RunKind::Revert {
                of: run.run_id.clone(),
            },
            created_at: now.clone(),
        },
        progress: RunProgress::starting(RunState::Validated, now),
        outcome: RunOutcome {
            forced: None,
            published_version: None,
            sequence: 1,
            error: None,
        },
    }
}

/// Per partition of the range: the rows and files now (the run's output) and after the revert
/// (what the run replaced), from the log's statistics.
fn partition_changes(
    run: &Journal,
    mapping: &lakefill_table::mapping::ColumnMapping,
    current: &[LogicalFileView],
    restored: &[LogicalFileView],
) -> Vec<PartitionChange> {
    #[derive(Default)]
    struct Side {
        rows: Option<u64>,
        files: u64,
    }
    let label = |file: &LogicalFileView| {
        run.inputs
            .layout
            .label_in(
                &run.inputs.range,
                &mapping.logical_values(file.partition_values_map()),
            )
            .unwrap_or_else(|| RANGE_LABEL.to_string())
    };
    let mut sides: BTreeMap<String, (Side, Side)> = BTreeMap::new();
    for (files, now) in [(current, true), (restored, false)] {
        for file in files {
            let entry = sides.entry(label(file)).or_default();
            let side = if now { &mut entry.0 } else { &mut entry.1 };
            side.files += 1;
            side.rows = match (side.files, side.rows, live_rows(file)) {
                (1, _, rows) => rows,
                (_, Some(sum), Some(rows)) => Some(sum + rows),
                _ => None,
            };
        }
    }
    sides
        .into_iter()
        .map(|(value, (now, after))| PartitionChange {
            value,
            old_rows: now.rows,
            new_rows: after.rows.unwrap_or(0),
            old_files: now.files,
            new_files: after.files,
        })
        .collect()
}

/// The range now (old) against the range as the version before the run's commit held it (new):
/// rows and the model's measures per partition, and keys added, removed and changed, for the
/// revert's report. It decides nothing: the files put back are the log's own. Also returns the
/// session with both sides registered (`previous`, `output`) and the key they were compared by.
async fn compare_versions(
    project: &Project,
    latest: &DeltaTable,
    run: &Journal,
    version: u64,
) -> Result<(
    ValidationReport,
    deltalake::datafusion::prelude::SessionContext,
    Vec<String>,
)> {
    let started = std::time::Instant::now();
    let config = project.table(&run.inputs.target, "the run")?;
    let before = open_table(config, Some(version - 1)).await?;
    let schema = latest
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", run.inputs.target))?
        .snapshot()
        .arrow_schema();
    let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    // The key and measures the run was validated with, when its model file is still there.
    let rules = match Model::load(project, &run.inputs.model, Some(&run.inputs.model_version)) {
        Ok(model) => {
            ValidationRules::from_spec(model.header().validate.as_ref(), &columns, model.path())?
        }
        Err(error) => {
            tracing::warn!(%error, "the run's model is gone: the revert compares row counts only");
            ValidationRules::default()
        }
    };
    let resources = Resources::new(lakefill_table::settings::memory_limit(project, None)?);
    let ctx = resources.session();
    register_range(
        &ctx,
        "previous",
        latest,
        &run.inputs.layout,
        &run.inputs.range,
    )
    .await?;
    register_range(
        &ctx,
        "output",
        &before,
        &run.inputs.layout,
        &run.inputs.range,
    )
    .await?;
    let spec = CompareSpec {
        partitions: PartitionKey::Time(run.inputs.layout.clone()),
        key: rules.key.clone(),
        measures: rules.summed_measures(),
        sample: crate::run::DEFAULT_SAMPLE,
        checksum_columns: None,
        edges: None,
        changes: None,
    };
    let comparison = compare(&ctx, &spec, None, None).await?;
    // The rows put back must keep the table's rules as they are now (a constraint may have been
    // added since the run, #33): Delta's writers would refuse to append them.
    let protocol =
        lakefill_table::protocol::TableProtocol::read(latest, &run.inputs.target, false)?;
    let mut checks = vec![CheckResult::new(
        "files as the log had them",
        Vec::new(),
        Vec::new(),
    )];
    checks.extend(
        lakefill_validate::checks::protocol_checks(
            &ctx,
            &PartitionKey::Time(run.inputs.layout.clone()),
            &protocol.rules,
            crate::run::DEFAULT_SAMPLE,
            "output",
        )
        .await?,
    );
    let report = ValidationReport {
        passed: checks.iter().all(|c| c.passed),
        checks,
        comparison,
        elapsed_ms: started.elapsed().as_millis() as u64,
        edges_ms: 0,
        notes: Vec::new(),
    };
    Ok((report, ctx, rules.key))
}
