//! Running a plan: stage, validate, publish, and the report of what happened (DESIGN §4).
//!
//! This module sequences the phases and keeps the journal current; the phases themselves live in
//! [`crate::execute`], [`crate::validate`] and [`crate::publish`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use deltalake::datafusion::prelude::SessionContext;
use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::{DeltaTable, ObjectStore};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{Error, QueryContext, Result};
use crate::execute::{StageOptions, stage};
use crate::failpoint;
use crate::journal::{BatchBounds, BatchRecord, JOURNAL_FORMAT, Journal, RunState, now};
use crate::lease::RunLease;
use crate::log::find_run_commit;
use crate::log::published_sequence;
use crate::log::registry::record_published_model;
use crate::partition::{
    CARRIED_LABEL, Layout, NULL_LABEL, PartitionRange, PartitionValues, label_of,
};
use crate::plan::BackfillPlan;
use crate::publish::commit;
use crate::resources::{ProgressEvent, ProgressSink, Resources};
use crate::rowhash::RowChecksum;
use crate::runs::reconcile;
use crate::staged::StagedTable;
use crate::throttle::Throttle;
use crate::validate::{
    CheckResult, KnownSide, PartitionKey, ValidationReport, ValidationRules, counts_from, validate,
};

/// Default number of sample rows per kind of difference.
pub const DEFAULT_SAMPLE: usize = 5;

/// Runs a [`BackfillPlan`]: stage, validate, publish.
#[must_use = "a BackfillBuilder does nothing until it is awaited"]
pub struct BackfillBuilder {
    plan: BackfillPlan,
    max_parallel: Option<usize>,
    memory_limit: Option<u64>,
    throttle: Option<u64>,
    progress: Option<Arc<dyn ProgressSink>>,
    stage_only: bool,
    force_reason: Option<String>,
    sample: usize,
    validate: bool,
    interrupt: Option<tokio::sync::watch::Receiver<bool>>,
}

impl BackfillBuilder {
    /// Prepares to run `plan`.
    pub fn new(plan: BackfillPlan) -> Self {
        Self {
            plan,
            max_parallel: None,
            memory_limit: None,
            throttle: None,
            progress: None,
            stage_only: false,
            force_reason: None,
            sample: DEFAULT_SAMPLE,
            validate: true,
            interrupt: None,
        }
    }

    /// Stops the run cleanly when `interrupt` turns `true` (e.g. on Ctrl-C): finished batches
    /// stay journaled, the run is marked `failed` and its lease released, so running the same
    /// command resumes it. The commit itself is never interrupted.
    ///
    /// By default, the run is not interruptible.
    pub fn with_interrupt(mut self, interrupt: Option<tokio::sync::watch::Receiver<bool>>) -> Self {
        self.interrupt = interrupt;
        self
    }

    /// Sets the number of batches in flight.
    ///
    /// By default, the number of cores.
    pub fn with_max_parallel(mut self, max_parallel: Option<usize>) -> Self {
        self.max_parallel = max_parallel;
        self
    }

    /// Bounds the memory of the run's queries; sorts and aggregations spill to disk beyond it.
    ///
    /// By default, memory is not limited.
    pub fn with_memory_limit(mut self, bytes: Option<u64>) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Bounds the bytes the run writes per second (reads follow, since the query is pulled only
    /// as fast as its output is written).
    ///
    /// By default, the run is not throttled.
    pub fn with_throttle(mut self, bytes_per_second: Option<u64>) -> Self {
        self.throttle = bytes_per_second;
        self
    }

    /// Sends progress events to `sink`.
    ///
    /// By default, progress is not reported.
    pub fn with_progress(mut self, sink: Option<Arc<dyn ProgressSink>>) -> Self {
        self.progress = sink;
        self
    }

    fn emit(&self, event: ProgressEvent) {
        if let Some(sink) = &self.progress {
            sink.event(&event);
        }
    }

    /// Stops after validation, leaving the run staged for `publish` (write-audit-publish).
    ///
    /// By default, a run that passes validation is published.
    pub fn with_stage_only(mut self, stage_only: bool) -> Self {
        self.stage_only = stage_only;
        self
    }

    /// Publishes even if validation fails, recording `reason` in the commit. An empty reason
    /// is refused when the run starts.
    ///
    /// By default, a failed validation publishes nothing.
    pub fn with_force_publish(mut self, reason: Option<String>) -> Self {
        self.force_reason = reason;
        self
    }

    /// Turns the old-versus-new comparison and the model's checks off; only the schema and spill
    /// checks run. For measuring what validation costs; the journal records that it was skipped.
    ///
    /// By default, validation runs.
    pub fn with_validation(mut self, validate: bool) -> Self {
        self.validate = validate;
        self
    }

    /// Sets the number of sample rows per kind of difference in the report.
    ///
    /// By default, 5.
    pub fn with_sample(mut self, sample: usize) -> Self {
        self.sample = sample;
        self
    }

    #[tracing::instrument(skip_all, fields(table = %self.plan.report.target, model = %self.plan.report.model, version = %self.plan.report.model_version))]
    async fn run(self) -> Result<RunReport> {
        let report = &self.plan.report;
        let store = self.plan.target.object_store();
        if self
            .force_reason
            .as_deref()
            .is_some_and(|r| r.trim().is_empty())
        {
            return Err(crate::runs::empty_reason());
        }
        failpoint::reach("after-plan").await?;
        let lease =
            match RunLease::acquire(&store, &report.target, &report.run_id, "backfill").await {
                Ok(lease) => lease,
                // The log says it is done: no need to hold the run to say so.
                Err(Error::RunBusy { .. }) if report.already_published => {
                    return Ok(RunReport::already_published(&self.plan, None));
                }
                Err(error) => return Err(error),
            };
        let result = self.run_held(&lease).await;
        lease.release().await;
        result
    }

    /// The run, while this process holds its lease.
    async fn run_held(&self, lease: &RunLease) -> Result<RunReport> {
        let plan = &self.plan;
        let report = &plan.report;
        let store = plan.target.object_store();
        let started = Instant::now();

        // The log is the truth: another process may have published this run since the plan.
        let latest = crate::runs::latest(&plan.target).await?;
        let previous = Journal::load(&store, &report.run_id).await?;
        let logged = published_sequence(&latest, &report.run_id).await?;
        if report.already_published || logged.is_some_and(|s| s >= report.publish_sequence) {
            let journal = match previous {
                Some(mut journal) => {
                    if reconcile(&latest, &mut journal).await? {
                        journal.save(&store, lease).await?;
                    }
                    record_published_model(&store, &journal).await;
                    Some(journal)
                }
                None => None,
            };
            tracing::info!(run_id = %report.run_id, "run already published");
            return Ok(RunReport::already_published(plan, journal.as_ref()));
        }

        // A previous attempt of this run that did not publish: resume from its finished batches.
        let resumed = match previous {
            Some(mut previous) if previous.sequence == report.publish_sequence => {
                reconcile(&latest, &mut previous).await?;
                reusable_batches(plan, &store, previous).await?
            }
            _ => Vec::new(),
        };
        if !resumed.is_empty() {
            tracing::info!(run_id = %report.run_id, batches = resumed.len(), "resuming after finished batches");
        }
        let mut journal = new_journal(plan);
        let skip: BTreeSet<usize> = resumed.iter().map(|b| b.index).collect();
        let resumed_batches = resumed.len();
        journal.batches = resumed;
        journal.save(&store, lease).await?;

        // Stage.
        let max_parallel = self
            .max_parallel
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1);
        let resources = Resources::new(self.memory_limit);
        let options = StageOptions {
            max_parallel,
            resources: resources.clone(),
            throttle: self.throttle.map(|rate| Arc::new(Throttle::new(rate))),
        };
        let batches_total = report.batches.len();
        self.emit(ProgressEvent::Started {
            run_id: report.run_id.clone(),
            table: report.target.clone(),
            batches_total,
            batches_resumed: resumed_batches,
        });
        let staged = self
            .interruptible(self.stage_and_journal(&mut journal, &options, &skip, lease, started))
            .await;
        if let Err(error) = staged {
            return Err(self
                .stop(&mut journal, lease, "staging", error, false)
                .await);
        }
        let stage_ms = started.elapsed().as_millis() as u64;

        let spill = journal.batches.iter().flat_map(|b| b.spill.clone()).fold(
            BTreeMap::<String, u64>::new(),
            |mut acc, (partition, rows)| {
                *acc.entry(partition).or_default() += rows;
                acc
            },
        );
        let spilled: u64 = spill.values().sum();
        if spilled > 0 && report.allow_spill.is_none() {
            // Labels of one grain sort like time; the NULL partition is no bound.
            let timed = || spill.keys().filter(|p| p.as_str() != NULL_LABEL);
            let first = timed().next().cloned().unwrap_or_default();
            let last = timed().next_back().cloned().unwrap_or_default();
            let error = Error::Spill {
                model: report.model.clone(),
                range: format!("{}..={}", report.range.from, report.range.to),
                partitions: spill.clone().into_iter().collect(),
                total: spilled,
                suggested: Box::new((
                    if first.is_empty() {
                        report.range.from.clone()
                    } else {
                        first.min(report.range.from.clone())
                    },
                    last.max(report.range.to.clone()),
                )),
            };
            // Spilled output is wrong for this range: it is not worth resuming.
            return Err(self.stop(&mut journal, lease, "staging", error, true).await);
        }
        if !journal.complete() {
            let error = Error::Internal(format!(
                "staging finished with {} of {} batches",
                journal.batches.len(),
                journal.planned_batches.len()
            ));
            return Err(self
                .stop(&mut journal, lease, "staging", error, false)
                .await);
        }
        journal.spill_dropped = spilled;
        journal.partitions = partition_changes(plan, &journal.batches);
        journal.transition(RunState::Staged)?;
        journal.save(&store, lease).await?;
        failpoint::reach("after-stage").await?;

        // Validate: old rows at the read version against the staged rows.
        self.emit(ProgressEvent::Phase {
            run_id: report.run_id.clone(),
            phase: "validating".into(),
        });
        journal.transition(RunState::Validating)?;
        journal.save(&store, lease).await?;
        let validate_started = Instant::now();
        let mut spill_check = CheckResult::new("spill", Vec::new(), Vec::new());
        if spilled > 0 {
            // Dropped on purpose (`--allow-spill drop`): reported, not failed.
            spill_check.failures =
                vec![json!({"rows_outside_range": spilled, "dropped": true, "partitions": spill})];
        }
        // Columns the model adds are reported with the schema check (they pass it on purpose).
        let added: Vec<serde_json::Value> = report
            .added_columns
            .iter()
            .map(|c| json!({"added_column": c.name, "type": c.delta_type}))
            .collect();
        let extra_checks = vec![CheckResult::new("schema", Vec::new(), added), spill_check];
        let validation = self
            .interruptible(run_validation(
                plan,
                &journal,
                &plan.rules,
                self.sample,
                extra_checks,
                &resources,
                self.validate,
            ))
            .await;
        let validation = match validation {
            Ok(validation) => validation,
            Err(error) => {
                return Err(self
                    .stop(&mut journal, lease, "validating", error, false)
                    .await);
            }
        };
        let validate_ms = validate_started.elapsed().as_millis() as u64;
        if report.layout.by_rows {
            // The log cannot count a range's rows in shared files; validation did.
            for change in &mut journal.partitions {
                change.old_rows = Some(
                    validation
                        .comparison
                        .partitions
                        .iter()
                        .find(|p| p.value == change.value)
                        .map_or(0, |p| p.old_rows),
                );
            }
        }
        let passed = validation.passed;
        let identical = validation.comparison.identical == Some(true);
        journal.validation = Some(validation);
        journal.validated_files = Some(journal.staged_digest());

        let outcome = if identical && passed {
            // Publishing would change nothing: say so, and keep nothing staged.
            journal.transition(RunState::UpToDate)?;
            crate::runs::delete_unreferenced(&latest, &journal).await?;
            journal.save(&store, lease).await?;
            Outcome::UpToDate
        } else if !passed
            && (self.force_reason.is_none() || !journal_violations(&journal).is_empty())
        {
            journal.transition(RunState::FailedValidation)?;
            journal.save(&store, lease).await?;
            Outcome::ValidationFailed
        } else {
            if passed {
                journal.transition(RunState::Validated)?;
            } else {
                journal.transition(RunState::FailedValidation)?;
                journal.forced = self.force_reason.clone();
            }
            journal.save(&store, lease).await?;
            if self.stage_only {
                Outcome::Staged
            } else {
                self.emit(ProgressEvent::Phase {
                    run_id: report.run_id.clone(),
                    phase: "publishing".into(),
                });
                publish_journal(&plan.target, &mut journal, &store, lease)
                    .await
                    .map_err(|error| stopped(&journal, "publishing", error))?;
                tracing::info!(run_id = %report.run_id, version = ?journal.published_version, "published");
                Outcome::Published
            }
        };
        let total_ms = started.elapsed().as_millis() as u64;
        let mut run = RunReport::from_journal(
            &journal,
            outcome,
            Timings {
                stage_ms,
                validate_ms,
                publish_ms: total_ms.saturating_sub(stage_ms + validate_ms),
                total_ms,
            },
        );
        run.resumed_batches = resumed_batches;
        self.emit(ProgressEvent::Finished {
            run_id: run.run_id.clone(),
            state: run.state.to_string(),
            batches_done: journal.batches.len(),
            rows_written: run.rows_written,
            files_written: run.files_written,
            bytes_written: run.bytes_written,
            elapsed_ms: total_ms,
        });
        Ok(run)
    }

    /// Stages every batch not in `skip`, journaling each as it finishes.
    async fn stage_and_journal(
        &self,
        journal: &mut Journal,
        options: &StageOptions,
        skip: &BTreeSet<usize>,
        lease: &RunLease,
        started: Instant,
    ) -> Result<()> {
        let plan = &self.plan;
        let report = &plan.report;
        let store = plan.target.object_store();
        let batches_total = report.batches.len();
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<BatchRecord>(1);
        let staging = stage(plan, options, skip, sender);
        let journaling = async {
            while let Some(record) = receiver.recv().await {
                let (index, rows) = (record.index, record.rows.values().sum::<u64>());
                journal.batches.push(record);
                journal.batches.sort_by_key(|b| b.index);
                journal.save(&store, lease).await?;
                failpoint::reach("mid-stage").await?;
                self.emit(ProgressEvent::BatchFinished {
                    run_id: report.run_id.clone(),
                    index,
                    batches_done: journal.batches.len(),
                    batches_total,
                    rows,
                    rows_total: journal.batches.iter().flat_map(|b| b.rows.values()).sum(),
                    bytes_total: journal
                        .staged_files()
                        .map(|a| u64::try_from(a.size).unwrap_or(0))
                        .sum(),
                    elapsed_ms: started.elapsed().as_millis() as u64,
                });
            }
            Ok::<(), Error>(())
        };
        let (staged, journaled) = tokio::join!(staging, journaling);
        staged.and(journaled)
    }

    /// Runs `work` unless the run is interrupted first (then it is dropped where it stands).
    async fn interruptible<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        let Some(interrupt) = &self.interrupt else {
            return work.await;
        };
        let mut interrupt = interrupt.clone();
        tokio::select! {
            result = work => result,
            _ = interrupt.wait_for(|interrupted| *interrupted) => Err(Error::Interrupted),
        }
    }

    /// Records that the run stopped while `phase` (its finished batches stay, for a resume,
    /// unless `drop_staged`) and returns the error to report.
    async fn stop(
        &self,
        journal: &mut Journal,
        lease: &RunLease,
        phase: &str,
        error: Error,
        drop_staged: bool,
    ) -> Error {
        let store = self.plan.target.object_store();
        journal.error = Some(error.to_string());
        if let Err(e) = journal.transition(RunState::Failed) {
            tracing::warn!(run_id = %journal.run_id, error = %e, "cannot mark the run failed");
        }
        if drop_staged {
            match crate::runs::latest(&self.plan.target).await {
                Ok(latest) => {
                    if let Err(e) = crate::runs::delete_unreferenced(&latest, journal).await {
                        tracing::warn!(run_id = %journal.run_id, error = %e, "cannot delete the staged files");
                    }
                }
                Err(e) => {
                    tracing::warn!(run_id = %journal.run_id, error = %e, "cannot delete the staged files")
                }
            }
            journal.batches.clear();
        }
        if let Err(e) = journal.save(&store, lease).await {
            tracing::warn!(run_id = %journal.run_id, error = %e, "cannot record the failure in the run journal");
        }
        stopped(journal, phase, error)
    }
}

/// The failed checks of the run's validation that come from the table's protocol.
fn journal_violations(journal: &Journal) -> Vec<String> {
    journal
        .validation
        .as_ref()
        .map(ValidationReport::protocol_violations)
        .unwrap_or_default()
}

/// Wraps the error that stopped a run with the run's id and state.
fn stopped(journal: &Journal, phase: &str, error: Error) -> Error {
    match error {
        // Already about the run.
        Error::RunBusy { .. } | Error::LeaseLost { .. } | Error::RunStopped { .. } => error,
        error => Error::RunStopped {
            run_id: journal.run_id.clone(),
            state: journal.state.to_string(),
            phase: phase.to_string(),
            resume: journal.resume_command(),
            source: Box::new(error),
        },
    }
}

/// A fresh journal for the plan, in `staging`.
fn new_journal(plan: &BackfillPlan) -> Journal {
    let report = &plan.report;
    Journal {
        format: JOURNAL_FORMAT,
        run_id: report.run_id.clone(),
        state: RunState::Staging,
        model: report.model.clone(),
        model_version: report.model_version.clone(),
        fingerprint: report.fingerprint.clone(),
        target: report.target.clone(),
        layout: report.layout.clone(),
        partition_column: None,
        read_version: report.read_version,
        range: report.range.clone(),
        sources: report
            .sources
            .iter()
            .map(|s| (s.table.clone(), s.version))
            .collect(),
        self_sources: report
            .sources
            .iter()
            .filter(|s| s.reads_target)
            .map(|s| s.table.clone())
            .collect(),
        allow_spill: report.allow_spill.clone(),
        reason: report.reason.clone(),
        affected_files: report.affected_files.clone(),
        added_columns: report.added_columns.clone(),
        planned_batches: report
            .batches
            .iter()
            .map(|b| BatchBounds {
                index: b.index,
                start: b.start.clone(),
                end: b.end.clone(),
            })
            .collect(),
        batches: Vec::new(),
        partitions: Vec::new(),
        spill_dropped: 0,
        validation: None,
        validated_files: None,
        forced: None,
        published_version: None,
        sequence: report.publish_sequence,
        error: None,
        created_at: now(),
        updated_at: now(),
    }
}

/// The finished batches of an earlier attempt of this run that can be kept. Everything else the
/// attempt staged is deleted (never a file a table version references): batches whose files are
/// gone, and files of unfinished batches.
async fn reusable_batches(
    plan: &BackfillPlan,
    store: &Arc<dyn ObjectStore>,
    previous: Journal,
) -> Result<Vec<BatchRecord>> {
    let report = &plan.report;
    let reads_target = report.sources.iter().any(|s| s.reads_target);
    // Output depends on the pinned sources (part of the run id) and, for a model reading its own
    // target, on the read version.
    let compatible = !matches!(
        previous.state,
        RunState::Discarded | RunState::UpToDate | RunState::Published
    ) && previous.sequence == report.publish_sequence
        && (!reads_target || previous.read_version == report.read_version);
    let mut kept = Vec::new();
    for batch in &previous.batches {
        let same_batch = report
            .batches
            .iter()
            .any(|b| b.index == batch.index && b.start == batch.start && b.end == batch.end);
        let mut complete = compatible && same_batch;
        if complete {
            for add in &batch.files {
                if store
                    .head(&crate::storage::object_path(&add.path))
                    .await
                    .is_err()
                {
                    complete = false;
                    break;
                }
            }
        }
        if complete {
            kept.push(batch.clone());
        }
    }
    // Everything else in the run's staging directories goes: files of dropped batches, and of
    // batches that never finished (not in the journal).
    let mut leftover = previous;
    leftover.batches = kept.clone();
    crate::runs::delete_unjournaled(&plan.target, &leftover).await?;
    Ok(kept)
}

impl IntoFuture for BackfillBuilder {
    type Output = Result<RunReport>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Commits a validated run and records the outcome in its journal. After any error from the
/// commit path the log is read again: if the commit landed after all, the run is published;
/// otherwise it is back where it was (or `failed`, when the target moved under it).
pub(crate) async fn publish_journal(
    target_at_read_version: &DeltaTable,
    journal: &mut Journal,
    store: &Arc<dyn ObjectStore>,
    lease: &RunLease,
) -> Result<()> {
    let before = journal.state;
    journal.transition(RunState::Publishing)?;
    journal.save(store, lease).await?;
    failpoint::reach("before-commit").await?;
    lease.check()?;
    let committed = commit(target_at_read_version, journal).await;
    let error = match committed {
        Ok(version) => {
            failpoint::reach("after-commit").await?;
            return published(journal, store, lease, Some(version)).await;
        }
        Err(error) => error,
    };
    // Did a version get written anyway (a lost response, a racing retry)?
    if let Ok(latest) = crate::runs::latest(target_at_read_version).await
        && published_sequence(&latest, &journal.run_id)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s >= journal.sequence)
    {
        let version = find_run_commit(&latest, &journal.run_id)
            .await
            .ok()
            .flatten();
        tracing::warn!(run_id = %journal.run_id, %error, "the commit reported an error but is in the log");
        return published(journal, store, lease, version).await;
    }
    journal.error = Some(error.to_string());
    journal.state = match error {
        // The read version is stale for the range: validating again needs a new attempt.
        Error::Conflict { .. } => RunState::Failed,
        _ => before,
    };
    if let Err(e) = journal.save(store, lease).await {
        tracing::warn!(run_id = %journal.run_id, error = %e, "cannot record the failed publish");
    }
    Err(error)
}

async fn published(
    journal: &mut Journal,
    store: &Arc<dyn ObjectStore>,
    lease: &RunLease,
    version: Option<u64>,
) -> Result<()> {
    journal.transition(RunState::Published)?;
    journal.published_version = version;
    journal.error = None;
    record_published_model(store, journal).await;
    // The commit is in the log, which is the truth; a journal that cannot be written now is
    // repaired by the next command that reads the run.
    if let Err(error) = journal.save(store, lease).await {
        tracing::warn!(run_id = %journal.run_id, %error, "published, but cannot update the run journal");
    }
    Ok(())
}

/// Registers `previous` (the target at the read version, affected partitions only) and `output`
/// (the staged files) in a new session and validates them.
async fn run_validation(
    plan: &BackfillPlan,
    journal: &Journal,
    rules: &ValidationRules,
    sample: usize,
    extra_checks: Vec<CheckResult>,
    resources: &Resources,
    compare_rows: bool,
) -> Result<ValidationReport> {
    if !compare_rows {
        return Ok(ValidationReport {
            passed: extra_checks.iter().all(|c| c.passed),
            checks: extra_checks,
            ..ValidationReport::default()
        });
    }
    let layout = &journal.layout;
    let ctx = comparison_session(resources.session(), &plan.target, layout, &journal.range).await?;
    let adds: Vec<_> = journal.staged_files().cloned().collect();
    let write_schema = match &plan.write_schema {
        Some(schema) => Arc::clone(schema),
        None => plan
            .target
            .snapshot()
            .map_err(|source| Error::Delta {
                context: "cannot read the target's snapshot".into(),
                source: Box::new(source),
            })?
            .snapshot()
            .arrow_schema(),
    };
    let staged = StagedTable::register_store(
        &ctx,
        &plan.target,
        &write_schema,
        &layout.partition_columns,
        &adds,
        &journal.run_id,
    )?;
    let target_schema = plan
        .target
        .snapshot()
        .map_err(|source| Error::Delta {
            context: "cannot read the target's snapshot".into(),
            source: Box::new(source),
        })?
        .snapshot()
        .arrow_schema();
    if layout.by_rows {
        // Staged files hold the range's new rows and the rows carried over: `output` is the
        // range's.
        ctx.register_table("staged", Arc::new(staged))
            .query_context(|| "cannot register the staged files".into())?;
        let in_range = layout.range_predicate(&journal.range, &target_schema)?;
        let output = ctx
            .table("staged")
            .await
            .and_then(|df| df.filter(in_range))
            .query_context(|| "cannot restrict the staged rows to the range".into())?;
        ctx.register_table("output", output.into_view())
            .query_context(|| "cannot register the staged rows".into())?;
    } else {
        ctx.register_table("output", Arc::new(staged))
            .query_context(|| "cannot register the staged files".into())?;
    }
    let mut checksums: BTreeMap<String, RowChecksum> = BTreeMap::new();
    for batch in &journal.batches {
        for (partition, checksum) in &batch.checksums {
            checksums
                .entry(partition.clone())
                .or_default()
                .merge(checksum);
        }
    }
    let carried = checksums.remove(CARRIED_LABEL);
    let mut new_side = KnownSide {
        rows: counts_from(
            journal
                .batches
                .iter()
                .flat_map(|b| b.rows.iter().map(|(p, n)| (p, *n)))
                .filter(|(p, _)| p.as_str() != CARRIED_LABEL),
        ),
        sums: Some(BTreeMap::new()),
        checksums: Some(checksums),
    };
    for batch in &journal.batches {
        for (partition, measures) in batch
            .sums
            .iter()
            .filter(|(p, _)| p.as_str() != CARRIED_LABEL)
        {
            let entry = new_side
                .sums
                .get_or_insert_with(BTreeMap::new)
                .entry(partition.clone())
                .or_default();
            for (measure, sum) in measures {
                *entry.entry(measure.clone()).or_default() += sum;
            }
        }
    }
    // Sums are computed while staging only for measures that are file columns.
    if rules
        .summed_measures()
        .iter()
        .any(|m| layout.partition_columns.contains(m))
    {
        new_side.sums = None;
    }
    // Every column but the partition columns, in the table's order: what makes a row.
    let checksum_columns: Vec<String> = target_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !layout.partition_columns.contains(name))
        .collect();
    let mut extra_checks = extra_checks;
    if layout.by_rows && !journal.affected_files.is_empty() {
        extra_checks.push(
            carried_check(
                plan,
                journal,
                &ctx,
                &checksum_columns,
                carried.unwrap_or_default(),
            )
            .await?,
        );
    }
    validate(
        &ctx,
        &PartitionKey::Time(layout.clone()),
        rules,
        sample,
        Some(new_side),
        checksum_columns,
        extra_checks,
    )
    .await
}

/// By rows: the rows of the rewritten files outside the range must be staged again exactly as
/// they were. Compares the checksum of what staging carried with the old rows, read again.
async fn carried_check(
    plan: &BackfillPlan,
    journal: &Journal,
    ctx: &SessionContext,
    columns: &[String],
    carried: RowChecksum,
) -> Result<CheckResult> {
    let provider = plan
        .target
        .table_provider()
        .with_file_paths(journal.affected_files.iter().cloned())
        .await
        .query_context(|| "cannot scan the files the backfill rewrites".into())?;
    let schema = plan
        .target
        .snapshot()
        .map_err(|source| Error::Delta {
            context: "cannot read the target's snapshot".into(),
            source: Box::new(source),
        })?
        .snapshot()
        .arrow_schema();
    let outside = journal
        .layout
        .range_predicate(&journal.range, &schema)?
        .is_not_true();
    let old = ctx
        .read_table(provider)
        .and_then(|df| df.filter(outside))
        .query_context(|| "cannot select the rows outside the range".into())?;
    ctx.register_table("__lf_carried_old", old.into_view())
        .query_context(|| "cannot register the rows outside the range".into())?;
    let expected = crate::validate::checksum_of(ctx, "__lf_carried_old", columns).await?;
    let mut check = CheckResult::new(
        "carried rows unchanged",
        if expected == carried {
            Vec::new()
        } else {
            vec![json!({
                "old_rows": expected.rows,
                "carried_rows": carried.rows,
                "message": "the rows outside the range of the rewritten files were not carried over exactly",
            })]
        },
        Vec::new(),
    );
    // A rewrite that changes rows outside the range is never published, forced or not.
    check.protocol = true;
    Ok(check)
}

/// A session with `previous` registered: `table` restricted to the partitions of `range`.
pub(crate) async fn comparison_session(
    ctx: SessionContext,
    table: &DeltaTable,
    layout: &Layout,
    range: &PartitionRange,
) -> Result<SessionContext> {
    let schema = table
        .snapshot()
        .map_err(|source| Error::Delta {
            context: "cannot read the target's snapshot".into(),
            source: Box::new(source),
        })?
        .snapshot()
        .arrow_schema();
    let predicate = layout.range_predicate(range, &schema)?;
    let provider = table
        .table_provider()
        .await
        .query_context(|| "cannot scan the target".into())?;
    let df = ctx
        .read_table(provider)
        .and_then(|df| df.filter(predicate))
        .query_context(|| "cannot restrict the target to the range".into())?;
    ctx.register_table("previous", df.into_view())
        .query_context(|| "cannot register the old rows".into())?;
    Ok(ctx)
}

/// Old and new row counts per partition: the plan's partitions plus any the model created.
fn partition_changes(plan: &BackfillPlan, batches: &[BatchRecord]) -> Vec<PartitionChange> {
    let layout = &plan.report.layout;
    let mut new_rows: BTreeMap<String, u64> = BTreeMap::new();
    let mut new_files: BTreeMap<String, u64> = BTreeMap::new();
    for record in batches {
        for (partition, rows) in record
            .rows
            .iter()
            .filter(|(p, _)| p.as_str() != CARRIED_LABEL)
        {
            *new_rows.entry(partition.clone()).or_default() += rows;
        }
        for add in record.files.iter().filter(|_| !layout.by_rows) {
            let values: PartitionValues = add
                .partition_values
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            *new_files.entry(label_of(layout, &values)).or_default() += 1;
        }
    }
    let mut partitions: Vec<PartitionChange> = plan
        .report
        .partitions
        .iter()
        .map(|p| PartitionChange {
            value: p.value.clone(),
            old_rows: p.rows,
            new_rows: new_rows.get(&p.value).copied().unwrap_or(0),
            old_files: p.files,
            new_files: new_files.get(&p.value).copied().unwrap_or(0),
        })
        .collect();
    for (value, rows) in &new_rows {
        if !partitions.iter().any(|p| &p.value == value) {
            partitions.push(PartitionChange {
                value: value.clone(),
                old_rows: Some(0),
                new_rows: *rows,
                old_files: 0,
                new_files: new_files.get(value).copied().unwrap_or(0),
            });
        }
    }
    partitions.sort_by(|a, b| a.value.cmp(&b.value));
    partitions
}

/// What a backfill or publish did (DESIGN §3 JSON contract).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The run id.
    pub run_id: String,
    /// State of the run at the end.
    pub state: RunState,
    /// What this invocation did.
    pub outcome: Outcome,
    /// Target table.
    pub table: String,
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// Model fingerprint.
    pub fingerprint: String,
    /// Version the run read.
    pub read_version: u64,
    /// Version the run's commit created; `null` when nothing was published.
    pub published_version: Option<u64>,
    /// The range.
    pub range: PartitionRange,
    /// Per partition: old and new row counts.
    pub partitions: Vec<PartitionChange>,
    /// Rows staged.
    pub rows_written: u64,
    /// Files staged.
    pub files_written: u64,
    /// Bytes staged.
    pub bytes_written: u64,
    /// Rows for partitions outside the range that were dropped (`--allow-spill drop`).
    pub spill_dropped: u64,
    /// Batches taken over from an earlier, interrupted attempt of the same run.
    pub resumed_batches: usize,
    /// The validation report (`passed`, each check with its numbers, the comparison).
    pub validation: Option<ValidationReport>,
    /// The reason validation was overridden, if it was.
    pub forced: Option<String>,
    /// Wall time per phase.
    pub timings: Timings,
}

/// What one invocation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A new version was committed.
    Published,
    /// The run had been published before; nothing changed.
    AlreadyPublished,
    /// Staged and validated; waiting for `publish`.
    Staged,
    /// Validation failed; nothing was published.
    ValidationFailed,
    /// The staged rows equal the current rows: nothing was published, nothing stays staged.
    UpToDate,
    /// The run's staged files were deleted.
    Discarded,
}

/// Per-partition change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionChange {
    /// Partition value.
    pub value: String,
    /// Rows before (from the log), when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// Files before.
    pub old_files: u64,
    /// Files after.
    pub new_files: u64,
}

/// Wall time per phase, in milliseconds.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Timings {
    /// Running the model and writing staged files.
    pub stage_ms: u64,
    /// Comparing old and new and running the checks.
    pub validate_ms: u64,
    /// The commit.
    pub publish_ms: u64,
    /// The whole run.
    pub total_ms: u64,
}

impl RunReport {
    /// Builds the report of a run from its journal.
    pub(crate) fn from_journal(journal: &Journal, outcome: Outcome, timings: Timings) -> Self {
        let files = || journal.staged_files();
        Self {
            run_id: journal.run_id.clone(),
            state: journal.state,
            outcome,
            table: journal.target.clone(),
            model: journal.model.clone(),
            model_version: journal.model_version.clone(),
            fingerprint: journal.fingerprint.clone(),
            read_version: journal.read_version,
            published_version: journal.published_version,
            range: journal.range.clone(),
            partitions: journal.partitions.clone(),
            rows_written: journal.batches.iter().flat_map(|b| b.rows.values()).sum(),
            files_written: files().count() as u64,
            bytes_written: files().map(|a| u64::try_from(a.size).unwrap_or(0)).sum(),
            spill_dropped: journal.spill_dropped,
            resumed_batches: 0,
            validation: journal.validation.clone(),
            forced: journal.forced.clone(),
            timings,
        }
    }

    fn already_published(plan: &BackfillPlan, journal: Option<&Journal>) -> Self {
        if let Some(journal) = journal {
            return Self::from_journal(journal, Outcome::AlreadyPublished, Timings::default());
        }
        let report = &plan.report;
        Self {
            run_id: report.run_id.clone(),
            state: RunState::Published,
            outcome: Outcome::AlreadyPublished,
            table: report.target.clone(),
            model: report.model.clone(),
            model_version: report.model_version.clone(),
            fingerprint: report.fingerprint.clone(),
            read_version: report.read_version,
            published_version: None,
            range: report.range.clone(),
            partitions: Vec::new(),
            rows_written: 0,
            files_written: 0,
            bytes_written: 0,
            spill_dropped: 0,
            resumed_batches: 0,
            validation: None,
            forced: None,
            timings: Timings::default(),
        }
    }

    /// Returns the names of failed validation checks.
    pub fn failed_checks(&self) -> Vec<String> {
        self.validation
            .as_ref()
            .map(ValidationReport::failed)
            .unwrap_or_default()
    }
}
