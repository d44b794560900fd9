//! Running a plan: stage, validate, publish, and the report of what happened (DESIGN §4).
//!
//! This module sequences the phases and keeps the journal current; the phases themselves live in
//! [`crate::execute`], [`crate::validate`] and [`crate::publish`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use deltalake::datafusion::common::Column;
use deltalake::datafusion::logical_expr::{Expr, lit};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::{DeltaTable, ObjectStore};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{Error, QueryContext, Result};
use crate::execute::{StageOptions, stage};
use crate::failpoint;
use crate::inspect::find_run_commit;
use crate::journal::{BatchRecord, JOURNAL_FORMAT, Journal, RunState, now};
use crate::partition::{PartitionRange, PartitionType, partition_literal};
use crate::plan::BackfillPlan;
use crate::publish::commit;
use crate::resources::{ProgressEvent, ProgressSink, Resources};
use crate::staged::StagedTable;
use crate::throttle::Throttle;
use crate::validate::{CheckResult, KnownSide, ValidationRules, counts_from, validate};

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
        }
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

    /// Publishes even if validation fails, recording `reason` in the commit.
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
        let plan = &self.plan;
        let report = &plan.report;
        let store = plan.target.object_store();
        let started = Instant::now();

        if report.already_published {
            let mut journal = Journal::load(&store, &report.run_id).await?;
            // A crash between the commit and the journal update left the journal behind.
            if let Some(journal) = journal.as_mut()
                && journal.state != RunState::Published
            {
                journal.state = RunState::Published;
                journal.published_version = find_run_commit(&plan.target, &report.run_id).await?;
                journal.error = None;
                journal.save(&store).await?;
            }
            tracing::info!(run_id = %report.run_id, "run already published");
            return Ok(RunReport::already_published(plan, journal.as_ref()));
        }
        failpoint::hit("after-plan");
        // A previous attempt of this run that did not publish: resume from its finished batches.
        let resumed = match Journal::load(&store, &report.run_id).await? {
            Some(previous) if previous.state != RunState::Published => {
                reusable_batches(plan, &store, previous).await?
            }
            _ => Vec::new(),
        };
        if !resumed.is_empty() {
            tracing::info!(run_id = %report.run_id, batches = resumed.len(), "resuming after finished batches");
        }

        let mut journal = Journal {
            format: JOURNAL_FORMAT,
            run_id: report.run_id.clone(),
            state: RunState::Staging,
            model: report.model.clone(),
            model_version: report.model_version.clone(),
            fingerprint: report.fingerprint.clone(),
            target: report.target.clone(),
            partition_column: report.partition_column.clone(),
            read_version: report.read_version,
            range: report.range.clone(),
            sources: report
                .sources
                .iter()
                .map(|s| (s.table.clone(), s.version))
                .collect(),
            reason: report.reason.clone(),
            batches: Vec::new(),
            partitions: Vec::new(),
            spill_dropped: 0,
            validation: None,
            forced: None,
            published_version: None,
            sequence: report.publish_sequence,
            error: None,
            created_at: now(),
            updated_at: now(),
        };
        journal.save(&store).await?;

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
        let skip: BTreeSet<usize> = resumed.iter().map(|b| b.index).collect();
        let resumed_batches = resumed.len();
        journal.batches = resumed;
        journal.save(&store).await?;
        let batches_total = report.batches.len();
        self.emit(ProgressEvent::Started {
            run_id: report.run_id.clone(),
            table: report.target.clone(),
            batches_total,
            batches_resumed: resumed_batches,
        });
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<BatchRecord>(1);
        let staging = stage(plan, &options, &skip, sender);
        let journaling = async {
            while let Some(record) = receiver.recv().await {
                let (index, rows) = (record.index, record.rows.values().sum::<u64>());
                journal.batches.push(record);
                journal.batches.sort_by_key(|b| b.index);
                journal.save(&store).await?;
                failpoint::hit("mid-stage");
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
        if let Err(error) = staged.and(journaled) {
            // Finished batches stay staged and journaled: running the same command resumes.
            fail(&mut journal, &store, &error, false).await;
            return Err(error);
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
            let first = spill.keys().next().cloned().unwrap_or_default();
            let last = spill.keys().last().cloned().unwrap_or_default();
            let error = Error::Spill {
                model: report.model.clone(),
                range: format!("{}..={}", report.range.from, report.range.to),
                partitions: spill.clone().into_iter().collect(),
                total: spilled,
                suggested: Box::new((
                    first.min(report.range.from.clone()),
                    last.max(report.range.to.clone()),
                )),
            };
            fail(&mut journal, &store, &error, true).await;
            return Err(error);
        }
        journal.spill_dropped = spilled;
        journal.partitions = partition_changes(plan, &journal.batches);
        journal.state = RunState::Staged;
        journal.save(&store).await?;
        failpoint::hit("after-stage");

        // Validate: old rows at the read version against the staged rows.
        self.emit(ProgressEvent::Phase {
            run_id: report.run_id.clone(),
            phase: "validating".into(),
        });
        let validate_started = Instant::now();
        let extra_checks = vec![
            CheckResult {
                name: "schema".into(),
                passed: true,
                failures: Vec::new(),
                sample: Vec::new(),
            },
            CheckResult {
                name: "spill".into(),
                passed: true,
                failures: if spilled > 0 {
                    vec![
                        json!({"rows_outside_range": spilled, "dropped": true, "partitions": spill}),
                    ]
                } else {
                    Vec::new()
                },
                sample: Vec::new(),
            },
        ];
        let validation = match run_validation(
            plan,
            &journal,
            &plan.rules,
            self.sample,
            extra_checks,
            &resources,
            self.validate,
        )
        .await
        {
            Ok(validation) => validation,
            Err(error) => {
                fail(&mut journal, &store, &error, false).await;
                return Err(error);
            }
        };
        let validate_ms = validate_started.elapsed().as_millis() as u64;
        let passed = validation["passed"].as_bool().unwrap_or(false);
        journal.validation = Some(validation);

        let outcome = if !passed && self.force_reason.is_none() {
            journal.state = RunState::FailedValidation;
            journal.save(&store).await?;
            Outcome::ValidationFailed
        } else {
            if !passed {
                journal.forced = self.force_reason.clone();
            }
            if self.stage_only {
                journal.save(&store).await?;
                Outcome::Staged
            } else {
                self.emit(ProgressEvent::Phase {
                    run_id: report.run_id.clone(),
                    phase: "publishing".into(),
                });
                publish_journal(&plan.target, &mut journal, &store).await?;
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
}

/// The finished batches of an earlier attempt of this run that can be kept. Everything else the
/// attempt staged is deleted: batches whose files are gone, and files of unfinished batches.
async fn reusable_batches(
    plan: &BackfillPlan,
    store: &Arc<dyn ObjectStore>,
    previous: Journal,
) -> Result<Vec<BatchRecord>> {
    let report = &plan.report;
    let reads_target = report.sources.iter().any(|s| s.reads_target);
    // Output depends on the pinned sources (part of the run id) and, for a model reading its own
    // target, on the read version.
    let compatible = previous.state != RunState::Discarded
        && previous.sequence == report.publish_sequence
        && (!reads_target || previous.read_version == report.read_version);
    let mut kept = Vec::new();
    let mut dropped = previous.clone();
    dropped.batches.clear();
    for batch in previous.batches {
        let same_batch = report
            .batches
            .iter()
            .any(|b| b.index == batch.index && b.start == batch.start && b.end == batch.end);
        let mut complete = compatible && same_batch;
        if complete {
            for add in &batch.files {
                if store
                    .head(&deltalake::Path::from(add.path.as_str()))
                    .await
                    .is_err()
                {
                    complete = false;
                    break;
                }
            }
        }
        if complete {
            kept.push(batch);
        } else {
            dropped.batches.push(batch);
        }
    }
    delete_staged(store, &dropped).await;
    // Files of batches that never finished are in the run's staging directories but not in the
    // journal.
    let known: BTreeSet<String> = kept
        .iter()
        .flat_map(|b| b.files.iter().map(|a| a.path.clone()))
        .collect();
    for partition in &report.partitions {
        let prefix = deltalake::Path::from(format!(
            "{}/lakefill-{}",
            crate::partition::hive_directory(&report.partition_column, &partition.value),
            report.run_id
        ));
        let listed: Vec<_> = futures::TryStreamExt::try_collect(store.list(Some(&prefix)))
            .await
            .unwrap_or_default();
        for object in listed {
            if !known.contains(object.location.as_ref()) {
                let _ = store.delete(&object.location).await;
            }
        }
    }
    Ok(kept)
}

impl IntoFuture for BackfillBuilder {
    type Output = Result<RunReport>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Commits a staged run and records the outcome in its journal. On a conflict the run stays
/// staged (it can be re-validated or discarded); on other errors too, since nothing changed.
pub(crate) async fn publish_journal(
    target_at_read_version: &DeltaTable,
    journal: &mut Journal,
    store: &Arc<dyn ObjectStore>,
) -> Result<()> {
    failpoint::hit("before-commit");
    match commit(target_at_read_version, journal).await {
        Ok(version) => {
            failpoint::hit("after-commit");
            journal.state = RunState::Published;
            journal.published_version = Some(version);
            journal.error = None;
            journal.save(store).await
        }
        Err(error) => {
            fail(journal, store, &error, false).await;
            Err(error)
        }
    }
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
) -> Result<Value> {
    if !compare_rows {
        let passed = extra_checks.iter().all(|c| c.passed);
        return Ok(json!({"passed": passed, "skipped": true, "checks": extra_checks}));
    }
    let ctx = comparison_session(
        resources.session(),
        &plan.target,
        plan.report.partition_type,
        &journal.partition_column,
        &journal.range,
    )
    .await?;
    let adds: Vec<_> = journal.staged_files().cloned().collect();
    let staged = StagedTable::register_store(
        &ctx,
        &plan.target,
        &journal.partition_column,
        &adds,
        &journal.run_id,
    )?;
    ctx.register_table("output", Arc::new(staged))
        .query_context(|| "cannot register the staged files".into())?;
    let old_counts = plan
        .report
        .partitions
        .iter()
        .map(|p| p.rows.map(|rows| (p.value.clone(), rows)))
        .collect::<Option<BTreeMap<_, _>>>()
        .map(|counts| KnownSide::rows(counts.into_iter().filter(|(_, n)| *n > 0).collect()));
    let mut new_side = KnownSide {
        rows: counts_from(
            journal
                .batches
                .iter()
                .flat_map(|b| b.rows.iter().map(|(p, n)| (p, *n))),
        ),
        sums: Some(BTreeMap::new()),
    };
    for batch in &journal.batches {
        for (partition, measures) in &batch.sums {
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
        .any(|m| m == &journal.partition_column)
    {
        new_side.sums = None;
    }
    let report = validate(
        &ctx,
        &journal.partition_column,
        rules,
        sample,
        old_counts,
        Some(new_side),
        extra_checks,
    )
    .await?;
    serde_json::to_value(&report).map_err(|e| Error::Internal(format!("validation report: {e}")))
}

/// A session with `previous` registered: `table` restricted to the partitions of `range`.
pub(crate) async fn comparison_session(
    ctx: SessionContext,
    table: &DeltaTable,
    kind: PartitionType,
    partition_column: &str,
    range: &PartitionRange,
) -> Result<SessionContext> {
    let provider = table
        .table_provider()
        .await
        .query_context(|| "cannot scan the target".into())?;
    let column = Expr::Column(Column::new_unqualified(partition_column));
    let df = ctx
        .read_table(provider)
        .and_then(|df| {
            df.filter(
                column.between(
                    lit(partition_literal(kind, &range.from)
                        .unwrap_or_else(|_| range.from.clone().into())),
                    lit(partition_literal(kind, &range.to)
                        .unwrap_or_else(|_| range.to.clone().into())),
                ),
            )
        })
        .query_context(|| "cannot restrict the target to the range".into())?;
    ctx.register_table("previous", df.into_view())
        .query_context(|| "cannot register the old rows".into())?;
    Ok(ctx)
}

/// Old and new row counts per partition: the plan's partitions plus any the model created.
fn partition_changes(plan: &BackfillPlan, batches: &[BatchRecord]) -> Vec<PartitionChange> {
    let column = &plan.report.partition_column;
    let mut new_rows: BTreeMap<String, u64> = BTreeMap::new();
    let mut new_files: BTreeMap<String, u64> = BTreeMap::new();
    for record in batches {
        for (partition, rows) in &record.rows {
            *new_rows.entry(partition.clone()).or_default() += rows;
        }
        for add in &record.files {
            let partition = add
                .partition_values
                .get(column)
                .cloned()
                .flatten()
                .unwrap_or_default();
            *new_files.entry(partition).or_default() += 1;
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

/// Deletes the staged files of a run. Best effort: a file left behind is garbage for `gc`, never
/// visible to readers.
pub(crate) async fn delete_staged(store: &Arc<dyn ObjectStore>, journal: &Journal) -> u64 {
    let mut deleted = 0;
    for add in journal.staged_files() {
        let path = deltalake::Path::from(add.path.as_str());
        match store.delete(&path).await {
            Ok(()) => deleted += 1,
            Err(deltalake::ObjectStoreError::NotFound { .. }) => {}
            Err(e) => tracing::warn!(path = %path, error = %e, "cannot delete a staged file"),
        }
    }
    deleted
}

/// Records a failure in the journal and, when `delete_staged_files`, removes the run's staged
/// files. Best effort: the original error is what the caller reports.
async fn fail(
    journal: &mut Journal,
    store: &Arc<dyn ObjectStore>,
    error: &Error,
    delete_staged_files: bool,
) {
    journal.error = Some(error.to_string());
    if delete_staged_files {
        journal.state = RunState::Failed;
        delete_staged(store, journal).await;
    } else if journal.state != RunState::FailedValidation {
        journal.state = RunState::Staged;
    }
    if let Err(e) = journal.save(store).await {
        tracing::warn!(run_id = %journal.run_id, error = %e, "cannot record the failure in the run journal");
    }
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
    pub validation: Option<Value>,
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
        crate::validate::failed_checks(self.validation.as_ref())
    }
}
