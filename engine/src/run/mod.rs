//! Running a plan: stage, validate, publish, and the report of what happened (DESIGN §4).
//!
//! The runner ([`BackfillBuilder`]) only sequences the phases and keeps the journal current; the
//! phases live in `lakefill-recompute`'s `stage`, `lakefill-validate` and [`crate::publish`]. Beside it:
//! [`validation`] prepares and runs the validation phase, [`publish`] commits a validated run and
//! records the outcome, [`reconcile`] makes a journal agree with the Delta log, [`cleanup`]
//! deletes what a run staged (never a referenced file), [`manage`] lists, publishes and discards
//! runs after the fact, and [`report`] is what every command reports.

pub(crate) mod cleanup;
pub(crate) mod edges;
pub(crate) mod feed;
pub(crate) mod found;
pub(crate) mod manage;
pub(crate) mod publish;
pub(crate) mod reconcile;
pub(crate) mod report;
pub(crate) mod revert;
pub(crate) mod scope_edges;
pub(crate) mod staging;
pub(crate) mod validation;

pub use report::{Outcome, RunReport, Timings};

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::future::Future;
use std::future::IntoFuture;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::{DeltaTable, ObjectStore};
use serde_json::json;

use crate::run::publish::publish_journal;
use crate::run::reconcile::reconcile;
use crate::run::staging::stage;
use crate::run::validation::partition_changes;
use crate::run::validation::run_validation;
use lakefill_log::journal::BatchBounds;
use lakefill_log::journal::BatchRecord;
use lakefill_log::journal::JOURNAL_FORMAT;
use lakefill_log::journal::RunState;
use lakefill_log::journal::lease::RunLease;
use lakefill_log::journal::{Journal, RunInputs, RunOutcome, RunProgress};
use lakefill_log::published_sequence;
use lakefill_log::registry::record_published_model;
use lakefill_recompute::plan::{BackfillPlan, Publish};
use lakefill_recompute::stage::StageOptions;
use lakefill_recompute::stage::throttle::Throttle;
use lakefill_table::error::Error;
use lakefill_table::error::Result;
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::partition::NULL_LABEL;
use lakefill_table::resources::ProgressEvent;
use lakefill_table::resources::ProgressSink;
use lakefill_table::resources::Resources;
use lakefill_table::settings::RunSettings;
use lakefill_table::time::now;
use lakefill_validate::CheckResult;
use lakefill_validate::ValidationReport;

/// The most memory validation's record of the changed keys may take for the change data feed
/// ([`lakefill_validate::keymerge::KeyChanges`]): 16 million keys.
const MAX_KEY_CHANGES_BYTES: usize = 256 << 20;

/// Default number of sample rows per kind of difference.
pub const DEFAULT_SAMPLE: usize = 5;

/// Runs a [`BackfillPlan`]: stage, validate, publish.
#[must_use = "a BackfillBuilder does nothing until it is awaited"]
pub struct BackfillBuilder {
    plan: BackfillPlan,
    settings: RunSettings,
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
            settings: RunSettings::built_in(),
            progress: None,
            stage_only: false,
            force_reason: None,
            sample: DEFAULT_SAMPLE,
            validate: true,
            interrupt: None,
        }
    }

    /// Runs with `settings`, resolved once (see [`RunSettings::resolve`]): the batches in flight,
    /// the memory pool of its queries (they spill to disk beyond it; `None` lifts the bound),
    /// the bytes written per second (reads follow, since the query is pulled only as fast as its
    /// output is written), and where batches are staged (`engine`: the Apache Ballista scheduler
    /// at `df://HOST:PORT`, with the `distributed` feature; validation and the commit stay in
    /// this process either way). The plan's batches were cut when it was made, so
    /// `batch_partitions` is the plan builder's to use.
    ///
    /// By default, [`RunSettings::built_in`].
    pub fn with_settings(mut self, settings: RunSettings) -> Self {
        self.settings = settings;
        self
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
    async fn run(mut self) -> Result<RunReport> {
        // Partitions are matched by deletion vectors within the run's memory limit.
        self.plan.vectors =
            lakefill_recompute::stage::vectors_for_run(&self.plan, self.settings.memory_limit)
                .await?;
        let report = &self.plan.report;
        let store = self.plan.target.object_store();
        if self
            .force_reason
            .as_deref()
            .is_some_and(|r| r.trim().is_empty())
        {
            return Err(crate::run::publish::empty_reason());
        }
        if let Some(engine) = &self.settings.engine {
            // Before the run exists: a run that cannot be staged there never starts.
            crate::run::staging::check_engine(
                &self.plan,
                engine,
                self.settings.throttle.is_some(),
            )?;
        }
        if let Some(companion) = self.plan.target_config.adjustments()
            && matches!(self.plan.publish(), Publish::Adjustments)
        {
            // Planned without its companion: the adjustments would go into the table itself.
            return Err(Error::InvalidOption {
                option: "adjustments".into(),
                value: companion.to_string(),
                message: format!(
                    "the companion table `{companion}` of `{}` does not exist yet; plan the run with the companion created (`PlanBuilder::with_create_companion(true)`, as `lakefill backfill` does)",
                    self.plan.report.target
                ),
            });
        }
        failpoint::reach(CrashPoint::AfterPlan).await?;
        let lease =
            match RunLease::acquire(&store, &report.target, &report.run_id, "backfill").await {
                Ok(lease) => lease,
                // The log says it is done: no need to hold the run to say so.
                Err(Error::RunBusy { .. }) if report.already_published => {
                    return Ok(RunReport::already_published(&self.plan, None));
                }
                Err(error) => return Err(error),
            };
        crate::notify::prepare(&self.plan.target_config, &self.plan.target).await;
        let result = self.run_held(&lease).await;
        lease.release().await;
        let mut report = result?;
        // Consumers learn of the commit (and of any earlier one they missed).
        let committed = (report.outcome == Outcome::Published)
            .then_some(report.published_version)
            .flatten();
        report.notifications =
            crate::notify::after_commit(&self.plan.target_config, &self.plan.target, committed)
                .await;
        if self.plan.kind.is_logical_revert() {
            // A logical revert says what a revert by files says.
            report.outcome = match report.outcome {
                Outcome::Published => Outcome::Reverted,
                Outcome::AlreadyPublished => Outcome::AlreadyReverted,
                other => other,
            };
        }
        Ok(report)
    }

    /// The run, while this process holds its lease: each step below, in order. A step that
    /// fails has already recorded the failure in the journal (see [`Self::stop`]).
    async fn run_held(&self, lease: &RunLease) -> Result<RunReport> {
        let started = Instant::now();
        // The log is the truth: another process may have published this run since the plan.
        let latest = lakefill_table::storage::latest(&self.plan.target).await?;
        let previous =
            Journal::load(&self.plan.target.object_store(), &self.plan.report.run_id).await?;
        let previous = match self.published_already(&latest, previous, lease).await? {
            Ok(report) => return Ok(report),
            Err(previous) => previous,
        };
        let (mut journal, skip) = self.begin(&latest, previous, lease).await?;
        let resumed_batches = skip.len();
        let resources = Resources::new(self.settings.memory_limit);
        let hashing = lakefill_recompute::stage::Hashing {
            capture: self.capture(&resources),
            rows: self.staged_hashes(&resources),
            old: self.old_capture(&resources, false),
            changed: self.changed_keys()?,
        };

        let spill = self
            .stage_step(&mut journal, &resources, &skip, lease, started, &hashing)
            .await?;
        let kept_net = self
            .adjust_step(&mut journal, &resources, lease, hashing.rows.as_deref())
            .await?;
        let changes = self.key_changes(&journal, &resources)?;
        let from_staging = crate::run::validation::FromStaging {
            capture: hashing.capture,
            kept_net,
            old_rows: hashing.old,
            changes: changes.clone(),
        };
        let stage_ms = elapsed_ms(started);
        let validate_started = Instant::now();
        self.validate_step(&mut journal, &resources, &spill, lease, from_staging)
            .await?;
        let validate_ms = elapsed_ms(validate_started);
        let outcome = self
            .conclude(
                &mut journal,
                &latest,
                lease,
                &resources,
                (hashing.changed.as_deref(), changes.as_deref()),
            )
            .await?;

        let total_ms = elapsed_ms(started);
        let timings = Timings {
            stage_ms,
            validate_ms,
            publish_ms: total_ms.saturating_sub(stage_ms + validate_ms),
            total_ms,
            edges_ms: journal
                .progress
                .validation
                .as_ref()
                .map_or(0, |v| v.edges_ms),
            feed_ms: journal
                .progress
                .change_feed
                .as_ref()
                .map_or(0, |f| f.elapsed_ms),
        };
        Ok(self.finish(&journal, outcome, timings, resumed_batches))
    }

    /// Where this process's writers hash the new rows for the key merge: when the run compares
    /// rows by a key of its target, stages here and writes whole partitions (by rows, the new
    /// side is a part of the files). With adjustments the new side is the model's staged rows
    /// too (the old side is the net rows, which the merge reads).
    fn capture(&self, resources: &Resources) -> Option<Arc<lakefill_validate::keymerge::Capture>> {
        let (schema, parts) = self.compared_columns(false)?;
        lakefill_validate::keymerge::Capture::new(
            resources.disk_manager(),
            &schema,
            &self.plan.rules.key,
            &parts,
            self.sample,
        )
        .map(Arc::new)
    }

    /// Where staging notes the keys a fix published by deletion vectors changes, for the change
    /// data feed to compare only their rows: when the run publishes by vectors, compares by a
    /// key, and its target records a feed.
    fn changed_keys(&self) -> Result<Option<Arc<lakefill_recompute::stage::vectors::ChangedKeys>>> {
        let tracked = self.plan.publishes_by_vectors()
            && !self.plan.rules.key.is_empty()
            && crate::run::feed::table_records_feed(&self.plan.target)?;
        Ok(tracked.then(Default::default))
    }

    /// Where validation's key merge records how each changed key changed, for the change data
    /// feed: when the run writes one and compares by a key. It may hold 16 bytes a changed key,
    /// up to 256 MiB and an eighth of the memory limit, reserved from the run's memory.
    fn key_changes(
        &self,
        journal: &Journal,
        resources: &Resources,
    ) -> Result<Option<Arc<lakefill_validate::keymerge::KeyChanges>>> {
        use deltalake::datafusion::execution::memory_pool::MemoryLimit;
        if self.plan.rules.key.is_empty() || !crate::run::feed::records_feed(&self.plan, journal)? {
            return Ok(None);
        }
        let pool = resources.memory_pool();
        let max_bytes = match pool.memory_limit() {
            MemoryLimit::Finite(limit) => (limit / 8).min(MAX_KEY_CHANGES_BYTES),
            _ => MAX_KEY_CHANGES_BYTES,
        };
        Ok(Some(lakefill_validate::keymerge::KeyChanges::new(
            &pool, max_bytes,
        )))
    }

    /// Where the old rows that staging reads whole are hashed for the key merge, with their
    /// totals, so that validation does not read them again: as [`Self::capture`]. With
    /// `adjustments`, the old net rows the adjustments' difference reads, when the run publishes
    /// by adjustments (the lineage columns, which the difference does not read, are NULL in net
    /// rows); without, the old files that a run publishing by deletion vectors matches its new
    /// rows against. The checksum covers the table's columns but the partition columns.
    fn old_capture(
        &self,
        resources: &Resources,
        adjustments: bool,
    ) -> Option<Arc<lakefill_validate::keymerge::Capture>> {
        let report = &self.plan.report;
        // (A plan by deletion vectors never publishes by adjustments.)
        let reads_old_whole = if adjustments {
            report.publish == lakefill_table::adjustments::PublishMode::Adjustments
        } else {
            self.plan.vectors.is_some()
        };
        if !reads_old_whole {
            return None;
        }
        let (schema, parts) = self.compared_columns(adjustments)?;
        let table = crate::run::validation::table_schema(&self.plan).ok()?;
        let checksum: Vec<String> = table
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|name| !report.layout.partition_columns.contains(name))
            .collect();
        let absent: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|name| lakefill_table::adjustments::is_lineage(name))
            .collect();
        lakefill_validate::keymerge::Capture::old_side(
            resources.disk_manager(),
            &schema,
            &self.plan.rules.key,
            &parts,
            self.sample,
            &checksum,
            &self.plan.rules.summed_measures(),
            &absent,
        )
        .map(Arc::new)
    }

    /// The columns the key merge compares, when a capture can take them as staging goes (the
    /// run validates, stages here and writes whole partitions), and the partition columns that
    /// label its rows. They are those both sides have: the staged ones the table had before the
    /// run (a model that adds columns adds them on the new side only), in the table's order, in
    /// the staged types (with `lineage_as_table`, the lineage columns in the table's: they are
    /// NULL on the side captured).
    fn compared_columns(
        &self,
        lineage_as_table: bool,
    ) -> Option<(deltalake::arrow::datatypes::Schema, Vec<String>)> {
        let report = &self.plan.report;
        // (`--where` by deletion vectors stages only the model's rows: no batch carries any.)
        if !self.validate
            || self.settings.engine.is_some()
            || (report.layout.rewrites_files(&report.range) && !self.plan.publishes_by_vectors())
        {
            return None;
        }
        let staged = lakefill_recompute::plan::query::target_schema(&self.plan).ok()?;
        let table = crate::run::validation::table_schema(&self.plan).ok()?;
        let schema = deltalake::arrow::datatypes::Schema::new(
            table
                .fields()
                .iter()
                .filter_map(|f| {
                    let as_staged = staged.field_with_name(f.name()).ok()?;
                    let lineage = lakefill_table::adjustments::is_lineage(f.name());
                    Some(
                        if lineage_as_table && lineage {
                            f
                        } else {
                            as_staged
                        }
                        .clone(),
                    )
                })
                .collect::<Vec<_>>(),
        );
        let parts = report
            .layout
            .time
            .encoding
            .columns()
            .into_iter()
            .map(str::to_string)
            .collect();
        Some((schema, parts))
    }

    /// Where this process's writers hash the whole new rows for the adjustments' difference
    /// (which then reads the staged files once, not twice): when the run publishes by
    /// adjustments, stages here and writes whole partitions (the staged files hold only the new
    /// rows). The columns are the staged ones but the lineage, in order, as the difference reads
    /// them.
    fn staged_hashes(
        &self,
        resources: &Resources,
    ) -> Option<Arc<lakefill_validate::multiset::StagedHashes>> {
        let report = &self.plan.report;
        if report.publish != lakefill_table::adjustments::PublishMode::Adjustments
            || self.settings.engine.is_some()
            || report.layout.rewrites_files(&report.range)
        {
            return None;
        }
        let staged = lakefill_recompute::plan::query::target_schema(&self.plan).ok()?;
        let columns = staged
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|name| !lakefill_table::adjustments::is_lineage(name))
            .collect();
        Some(Arc::new(lakefill_validate::multiset::StagedHashes::new(
            resources.disk_manager(),
            columns,
        )))
    }

    /// When the log already holds this run (published by this or another process), the report
    /// that says so, with the journal reconciled; otherwise the previous journal, untouched.
    async fn published_already(
        &self,
        latest: &DeltaTable,
        previous: Option<Journal>,
        lease: &RunLease,
    ) -> Result<std::result::Result<RunReport, Option<Journal>>> {
        let report = &self.plan.report;
        let logged = published_sequence(latest, &report.run_id).await?;
        if !report.already_published && logged.is_none_or(|s| s < report.publish_sequence) {
            return Ok(Err(previous));
        }
        let store = self.plan.target.object_store();
        let journal = match previous {
            Some(mut journal) => {
                if reconcile(latest, &mut journal).await? {
                    journal.save(&store, lease).await?;
                }
                record_published_model(&store, &journal.model_record()).await;
                Some(journal)
            }
            None => None,
        };
        tracing::info!(run_id = %report.run_id, "run already published");
        Ok(Ok(RunReport::already_published(
            &self.plan,
            journal.as_ref(),
        )))
    }

    /// A fresh journal in `staging`, carrying the finished batches of a previous attempt of
    /// this run that did not publish; returns it and the indexes of the batches to skip.
    async fn begin(
        &self,
        latest: &DeltaTable,
        previous: Option<Journal>,
        lease: &RunLease,
    ) -> Result<(Journal, BTreeSet<usize>)> {
        let plan = &self.plan;
        let store = plan.target.object_store();
        let resumed = match previous {
            Some(mut previous) if previous.outcome.sequence == plan.report.publish_sequence => {
                reconcile(latest, &mut previous).await?;
                reusable_batches(plan, &store, previous).await?
            }
            _ => Vec::new(),
        };
        if !resumed.is_empty() {
            tracing::info!(run_id = %plan.report.run_id, batches = resumed.len(), "resuming after finished batches");
        }
        let mut journal = new_journal(plan);
        let skip: BTreeSet<usize> = resumed.iter().map(|b| b.index).collect();
        journal.progress.batches = resumed;
        journal.save(&store, lease).await?;
        Ok((journal, skip))
    }

    /// Stages the batches not in `skip`, then refuses output outside the range (unless the
    /// plan drops it on purpose) and an incomplete staging; leaves the run `staged`. Returns the
    /// rows dropped per partition outside the range.
    async fn stage_step(
        &self,
        journal: &mut Journal,
        resources: &Resources,
        skip: &BTreeSet<usize>,
        lease: &RunLease,
        started: Instant,
        hashing: &lakefill_recompute::stage::Hashing,
    ) -> Result<BTreeMap<String, u64>> {
        let report = &self.plan.report;
        let max_parallel = self.settings.max_parallel;
        let options = StageOptions {
            max_parallel,
            resources: resources.clone(),
            throttle: self
                .settings
                .throttle
                .map(|rate| Arc::new(Throttle::new(rate))),
            engine: self.settings.engine.clone(),
            lease: Some(lease.generation()),
            hashing: hashing.clone(),
        };
        self.emit(ProgressEvent::Started {
            run_id: report.run_id.to_string(),
            table: report.target.clone(),
            batches_total: report.batches.len(),
            batches_resumed: skip.len(),
        });
        let staged = self
            .interruptible(self.stage_and_journal(journal, &options, skip, lease, started))
            .await;
        if let Err(error) = staged {
            return Err(self.stop(journal, lease, "staging", error, false).await);
        }
        let spill = journal
            .progress
            .batches
            .iter()
            .flat_map(|b| b.spill.clone())
            .fold(
                BTreeMap::<String, u64>::new(),
                |mut acc, (partition, rows)| {
                    *acc.entry(partition).or_default() += rows;
                    acc
                },
            );
        let spilled: u64 = spill.values().sum();
        if spilled > 0 && report.allow_spill.is_none() {
            // Spilled output is wrong for this range: it is not worth resuming.
            let error = spill_error(report, &spill, spilled);
            return Err(self.stop(journal, lease, "staging", error, true).await);
        }
        if !journal.complete() {
            let error = Error::Internal(format!(
                "staging finished with {} of {} batches",
                journal.progress.batches.len(),
                journal.inputs.planned_batches.len()
            ));
            return Err(self.stop(journal, lease, "staging", error, false).await);
        }
        journal.progress.spill_dropped = spilled;
        journal.progress.partitions = partition_changes(&self.plan, &journal.progress.batches);
        journal.transition(RunState::Staged)?;
        journal
            .save(&self.plan.target.object_store(), lease)
            .await?;
        failpoint::reach(CrashPoint::AfterStage).await?;
        Ok(spill)
    }

    /// With adjustments: stages the reversal and correction rows of every batch (see
    /// [`crate::adjust`]) and journals them; the run stays `staged`. `hashed`: the new rows'
    /// hashes this process's writers took, if they did.
    async fn adjust_step(
        &self,
        journal: &mut Journal,
        resources: &Resources,
        lease: &RunLease,
        hashed: Option<&lakefill_validate::multiset::StagedHashes>,
    ) -> Result<Option<crate::adjust::Kept>> {
        if journal.adjusted() {
            return Ok(None);
        }
        let plan = &self.plan;
        self.emit(ProgressEvent::Phase {
            run_id: plan.report.run_id.to_string(),
            phase: "adjusting".into(),
        });
        let store = plan.target.object_store();
        let staged = self
            .interruptible(crate::adjust::stage(
                plan,
                &journal.progress.batches,
                resources,
                Arc::clone(&store),
                self.settings.max_parallel,
                (hashed, self.old_capture(resources, true)),
            ))
            .await;
        match staged {
            Ok((records, counts, kept)) => {
                journal.progress.adjustments = records;
                journal.progress.adjustment_counts = Some(counts);
                journal.save(&store, lease).await?;
                failpoint::reach(CrashPoint::AfterAdjust).await?;
                Ok(Some(kept))
            }
            Err(error) => Err(self.stop(journal, lease, "adjusting", error, false).await),
        }
    }

    /// Validates the staged rows against the old rows at the read version and records the
    /// report in the journal (still `validating`: [`Self::conclude`] decides).
    async fn validate_step(
        &self,
        journal: &mut Journal,
        resources: &Resources,
        spill: &BTreeMap<String, u64>,
        lease: &RunLease,
        from_staging: crate::run::validation::FromStaging,
    ) -> Result<()> {
        let plan = &self.plan;
        let report = &plan.report;
        self.emit(ProgressEvent::Phase {
            run_id: report.run_id.to_string(),
            phase: "validating".into(),
        });
        journal.transition(RunState::Validating)?;
        // A feed written before is of the rows validated before.
        journal.progress.change_feed = None;
        journal.save(&plan.target.object_store(), lease).await?;
        let mut spill_check = CheckResult::new("spill", Vec::new(), Vec::new());
        let spilled: u64 = spill.values().sum();
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
                journal,
                self.sample,
                extra_checks,
                resources,
                self.validate,
                from_staging,
            ))
            .await;
        let validation = match validation {
            Ok(validation) => validation,
            Err(error) => return Err(self.stop(journal, lease, "validating", error, false).await),
        };
        if report.layout.rewrites_files(&report.range)
            || report.publish == lakefill_table::adjustments::PublishMode::Adjustments
        {
            // The log cannot count a range's rows in shared files, nor a ledger's net rows;
            // validation did.
            for change in &mut journal.progress.partitions {
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
        journal.progress.validation = Some(validation);
        journal.progress.validated_files = Some(journal.staged_digest());
        journal.progress.validated_stamps =
            crate::run::publish::stamps(&plan.target.object_store(), journal).await?;
        Ok(())
    }

    /// Decides what the validated run becomes: up to date (nothing to publish, nothing kept),
    /// failed validation, staged for review, or published.
    async fn conclude(
        &self,
        journal: &mut Journal,
        latest: &DeltaTable,
        lease: &RunLease,
        resources: &Resources,
        (changed, changes): (
            Option<&lakefill_recompute::stage::vectors::ChangedKeys>,
            Option<&lakefill_validate::keymerge::KeyChanges>,
        ),
    ) -> Result<Outcome> {
        let plan = &self.plan;
        let store = plan.target.object_store();
        let (passed, identical) = journal
            .progress
            .validation
            .as_ref()
            .map_or((false, false), |v| {
                (v.passed, v.comparison.identical == Some(true))
            });
        if identical && passed {
            // Publishing would change nothing: say so, and keep nothing staged.
            journal.transition(RunState::UpToDate)?;
            crate::run::cleanup::delete_unreferenced(latest, journal).await?;
            journal.save(&store, lease).await?;
            return Ok(Outcome::UpToDate);
        }
        if !passed && (self.force_reason.is_none() || !journal_violations(journal).is_empty()) {
            journal.transition(RunState::FailedValidation)?;
            journal.save(&store, lease).await?;
            return Ok(Outcome::ValidationFailed);
        }
        if journal.progress.change_feed.is_none() && crate::run::feed::records_feed(plan, journal)?
        {
            self.emit(ProgressEvent::Phase {
                run_id: plan.report.run_id.to_string(),
                phase: "writing the change feed".into(),
            });
            let feed = self
                .interruptible(crate::run::feed::write_change_feed(
                    plan,
                    journal,
                    resources,
                    (changed, changes.and_then(|c| c.found())),
                ))
                .await;
            match feed {
                Ok(feed) => journal.progress.change_feed = Some(feed),
                Err(error) => {
                    return Err(self.stop(journal, lease, "validating", error, false).await);
                }
            }
        }
        if passed {
            journal.transition(RunState::Validated)?;
        } else {
            journal.transition(RunState::FailedValidation)?;
            journal.outcome.forced = self.force_reason.clone();
        }
        journal.save(&store, lease).await?;
        if self.stage_only {
            return Ok(Outcome::Staged);
        }
        self.emit(ProgressEvent::Phase {
            run_id: plan.report.run_id.to_string(),
            phase: "publishing".into(),
        });
        if let Publish::AdjustmentsToCompanion(adjusted) = plan.publish() {
            crate::adjust::check_adjusted_unchanged(&adjusted.table, journal)
                .await
                .map_err(|error| stopped(journal, "publishing", error))?;
        }
        publish_journal(&plan.target, journal, &store, lease, None)
            .await
            .map_err(|error| stopped(journal, "publishing", error))?;
        tracing::info!(run_id = %plan.report.run_id, version = ?journal.outcome.published_version, "published");
        Ok(Outcome::Published)
    }

    /// The report of the run, announced to the progress sink.
    fn finish(
        &self,
        journal: &Journal,
        outcome: Outcome,
        timings: Timings,
        resumed_batches: usize,
    ) -> RunReport {
        let total_ms = timings.total_ms;
        let mut run = RunReport::from_journal(journal, outcome, timings);
        run.resumed_batches = resumed_batches;
        self.emit(ProgressEvent::Finished {
            run_id: run.run_id.clone(),
            state: run.state.to_string(),
            batches_done: journal.progress.batches.len(),
            rows_written: run.rows_written,
            files_written: run.files_written,
            bytes_written: run.bytes_written,
            elapsed_ms: total_ms,
        });
        run
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
        let done = journal.progress.batches.clone();
        let staging = stage(plan, options, skip, &done, sender);
        let journaling = async {
            while let Some(record) = receiver.recv().await {
                let (index, rows) = (record.index, record.rows.values().sum::<u64>());
                journal.progress.batches.push(record);
                journal.progress.batches.sort_by_key(|b| b.index);
                journal.save(&store, lease).await?;
                failpoint::reach(CrashPoint::MidStage).await?;
                self.emit(ProgressEvent::BatchFinished {
                    run_id: report.run_id.to_string(),
                    index,
                    batches_done: journal.progress.batches.len(),
                    batches_total,
                    rows,
                    rows_total: journal
                        .progress
                        .batches
                        .iter()
                        .flat_map(|b| b.rows.values())
                        .sum(),
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
        journal.outcome.error = Some(error.to_string());
        if let Err(e) = journal.transition(RunState::Failed) {
            tracing::warn!(run_id = %journal.run_id, error = %e, "cannot mark the run failed");
        }
        if drop_staged {
            match lakefill_table::storage::latest(&self.plan.target).await {
                Ok(latest) => {
                    if let Err(e) = crate::run::cleanup::delete_unreferenced(&latest, journal).await
                    {
                        tracing::warn!(run_id = %journal.run_id, error = %e, "cannot delete the staged files");
                    }
                }
                Err(e) => {
                    tracing::warn!(run_id = %journal.run_id, error = %e, "cannot delete the staged files")
                }
            }
            journal.progress.batches.clear();
        }
        if let Err(e) = journal.save(&store, lease).await {
            tracing::warn!(run_id = %journal.run_id, error = %e, "cannot record the failure in the run journal");
        }
        stopped(journal, phase, error)
    }
}

/// Milliseconds since `since`.
fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The error of a run whose output fell outside its range, with the range that would hold it.
fn spill_error(
    report: &lakefill_recompute::plan::PlanReport,
    spill: &BTreeMap<String, u64>,
    total: u64,
) -> Error {
    // Labels of one grain sort like time; the NULL partition is no bound.
    let timed = || spill.keys().filter(|p| p.as_str() != NULL_LABEL);
    let first = timed().next().cloned().unwrap_or_default();
    let last = timed().next_back().cloned().unwrap_or_default();
    Error::Spill {
        model: report.model.clone(),
        range: report.range.span(),
        partitions: spill.clone().into_iter().collect(),
        total,
        suggested: Box::new((
            if first.is_empty() {
                report.range.from.clone()
            } else {
                first.min(report.range.from.clone())
            },
            last.max(report.range.to.clone()),
        )),
    }
}

/// The failed checks of the run's validation that come from the table's protocol.
fn journal_violations(journal: &Journal) -> Vec<String> {
    journal
        .progress
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
            run_id: journal.run_id.to_string(),
            state: journal.progress.state.to_string(),
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
        inputs: RunInputs {
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
            added_columns: report.added_columns.clone(),
            affected_files: report.affected_files.clone(),
            planned_batches: report
                .batches
                .iter()
                .map(|b| BatchBounds {
                    index: b.index,
                    start: b.start.clone(),
                    end: b.end.clone(),
                })
                .collect(),
            resume: plan.resume.clone(),
            publish_as: report.publish,
            adjusts: plan.adjusted.as_ref().and_then(|a| {
                lakefill_table::storage::loaded_version(&a.table)
                    .ok()
                    .map(|version| (a.name.clone(), version))
            }),
            kind: plan.kind.clone(),
            created_at: now(),
        },
        progress: RunProgress::starting(RunState::Staging, now()),
        outcome: RunOutcome {
            forced: None,
            published_version: None,
            sequence: report.publish_sequence,
            error: None,
        },
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
        previous.progress.state,
        RunState::Discarded | RunState::UpToDate | RunState::Published
    ) && previous.outcome.sequence == report.publish_sequence
        && (!reads_target || previous.inputs.read_version == report.read_version)
        // With a companion, the version of the corrected table read is an input too.
        && previous.inputs.adjusts == new_journal(plan).inputs.adjusts;
    let mut kept = Vec::new();
    for batch in &previous.progress.batches {
        let same_batch = report
            .batches
            .iter()
            .any(|b| b.index == batch.index && b.start == batch.start && b.end == batch.end);
        // Deletion vectors are of the files at the read version.
        let mut complete = compatible
            && same_batch
            && (batch.vectors.is_none() || previous.inputs.read_version == report.read_version);
        let vector_files = batch
            .vectors
            .iter()
            .flat_map(|v| &v.vector_files)
            .map(|p| deltalake::Path::from(p.as_str()));
        if complete {
            for path in batch
                .files
                .iter()
                .map(|add| lakefill_table::storage::object_path(&add.path))
                .chain(vector_files)
            {
                if store.head(&path).await.is_err() {
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
    leftover.progress.batches = kept.clone();
    // Adjustments are derived again from the batches kept.
    leftover.progress.adjustments.clear();
    crate::run::cleanup::delete_unjournaled(&plan.target, &leftover).await?;
    Ok(kept)
}

impl IntoFuture for BackfillBuilder {
    type Output = Result<RunReport>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}
