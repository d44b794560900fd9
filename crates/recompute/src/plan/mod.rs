//! Scope of a backfill: what it reads, what it replaces, and how it is split (DESIGN §4.1).
//!
//! Planning opens the target at its latest version (the read version) and each source at its
//! pinned version, lists the affected partitions with their files and rows from the Delta log (no
//! data scan), finds downstream models, splits the range into batches and derives the run id.
//! It writes nothing. Running the plan is left to [`crate::stage`] and the runner's `publish`.

pub mod adjust;
mod edges;
pub mod query;
mod recursive;
pub mod restore;

pub use edges::EdgePlan;

use std::collections::BTreeMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;

use deltalake::DeltaTable;
use serde::Serialize;
use sha2::{Digest, Sha256};

use deltalake::arrow::datatypes::DataType;
use lakefill_log::journal::Journal;
use lakefill_log::journal::RunKind;
use lakefill_log::published_sequence;
use lakefill_log::range_touched_after;
use lakefill_log::registry::published_fingerprint;
use lakefill_table::adjustments::PublishMode;
use lakefill_table::config::{Project, TableConfig};
use lakefill_table::error::{Error, Result};
use lakefill_table::mapping::ColumnMapping;
use lakefill_table::model::{Model, SourceSpec, list_models};
use lakefill_table::partition::{
    CARRIED_LABEL, ColumnFacts, Layout, NULL_LABEL, PartitionRange, PartitionValues, TimeColumn,
    parts_time, time_column,
};
use lakefill_table::protocol::{AddedColumn, TableProtocol};
use lakefill_table::run_id::RunId;
use lakefill_table::scope::{FileFacts, RowPredicate};
use lakefill_table::settings::RunSettings;
use lakefill_table::storage::{StorageOption, describe_options, loaded_version, open_table};
use lakefill_table::time::Period;
use lakefill_validate::ValidationRules;

/// The most partitions a range may have unless raised with
/// [`PlanBuilder::with_max_partitions`].
pub const DEFAULT_MAX_PARTITIONS: u64 = 10_000;

pub use lakefill_table::settings::DEFAULT_BATCH_PARTITIONS;

/// Plans a backfill without writing anything.
#[must_use = "a PlanBuilder does nothing until it is awaited"]
pub struct PlanBuilder {
    project: Project,
    model: String,
    /// `--from` and `--to`; `None` for the whole table.
    range: Option<(String, String)>,
    model_version: Option<String>,
    settings: RunSettings,
    source_versions: BTreeMap<String, u64>,
    allow_spill_drop: bool,
    include_null: bool,
    max_partitions: Option<u64>,
    reason: Option<String>,
    publish_as: Option<String>,
    create_companion: bool,
    allow_edge_moves: Option<String>,
    rows: Option<String>,
}

impl PlanBuilder {
    /// Plans model `model` of `project` over the partitions `from..=to`.
    pub fn new(
        project: &Project,
        model: impl Into<String>,
        from: impl Into<String>,
        to: impl Into<String>,
    ) -> Self {
        Self::scoped(project, model, Some((from.into(), to.into())))
    }

    /// Plans model `model` of `project` over the whole table: a table with no time column, or
    /// (with [`PlanBuilder::with_where`]) the rows of every period that match the predicate.
    pub fn whole_table(project: &Project, model: impl Into<String>) -> Self {
        Self::scoped(project, model, None)
    }

    /// Plans model `model` over `range` (`--from`, `--to`), or the whole table when `None`.
    pub fn scoped(
        project: &Project,
        model: impl Into<String>,
        range: Option<(String, String)>,
    ) -> Self {
        Self {
            project: project.clone(),
            model: model.into(),
            range,
            model_version: None,
            settings: RunSettings::built_in(),
            source_versions: BTreeMap::new(),
            allow_spill_drop: false,
            include_null: false,
            max_partitions: None,
            reason: None,
            publish_as: None,
            create_companion: false,
            allow_edge_moves: None,
            rows: None,
        }
    }

    /// Scopes the run to the rows of the range that match `predicate` (`--where`), a boolean SQL
    /// expression over the target's columns: those are replaced by the model's rows that match
    /// it; every other row of the files the run rewrites is carried over unchanged.
    ///
    /// By default, every row of the range is replaced.
    pub fn with_where(mut self, predicate: Option<String>) -> Self {
        self.rows = predicate;
        self
    }

    /// Publishes even when keys cross the range's edges (a key the fix writes into the range that
    /// the target still holds outside it, or one it removes that the model writes outside it),
    /// recording `reason` in the commit. An empty reason is refused.
    ///
    /// By default, keys that cross the range's edges fail validation (see [`EdgePlan`]).
    pub fn with_allow_edge_moves(mut self, reason: Option<String>) -> Self {
        self.allow_edge_moves = reason;
        self
    }

    /// Allows ranges of up to `max` partitions.
    ///
    /// By default, [`DEFAULT_MAX_PARTITIONS`]: a larger range (a typo such as `--from 0001-01-01`
    /// would otherwise grind for hours) needs this raised on purpose.
    pub fn with_max_partitions(mut self, max: Option<u64>) -> Self {
        self.max_partitions = max;
        self
    }

    /// Replaces the partition whose time is NULL too: it is computed by one more batch over
    /// the whole range, which keeps only the model's rows with a NULL time.
    ///
    /// By default, the NULL partition is left untouched and rows the model produces for it fail
    /// the run like any row outside the range.
    pub fn with_include_null(mut self, include: bool) -> Self {
        self.include_null = include;
        self
    }

    /// Pins the model version.
    ///
    /// By default, the newest version (natural sort) runs.
    pub fn with_model_version(mut self, version: Option<String>) -> Self {
        self.model_version = version;
        self
    }

    /// Sets the number of partitions per batch.
    ///
    /// By default, [`RunSettings::built_in`] (7 partitions per batch); the caller resolves the
    /// flags and `[defaults]` once, with [`RunSettings::resolve`] or
    /// [`RunSettings::for_planning`].
    pub fn with_settings(mut self, settings: RunSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Pins sources at explicit versions instead of their latest.
    ///
    /// By default, every source is read at the version current when the plan is made.
    pub fn with_source_versions(
        mut self,
        versions: impl IntoIterator<Item = (String, u64)>,
    ) -> Self {
        self.source_versions = versions.into_iter().collect();
        self
    }

    /// Drops rows for partitions outside the range instead of failing.
    ///
    /// By default, such rows fail the run.
    pub fn with_allow_spill_drop(mut self, allow: bool) -> Self {
        self.allow_spill_drop = allow;
        self
    }

    /// Sets the reason recorded with the run.
    ///
    /// By default, the model header's `reason`.
    pub fn with_reason(mut self, reason: Option<String>) -> Self {
        self.reason = reason;
        self
    }

    /// Publishes as `rewrite` or `adjustments`.
    ///
    /// By default, the model header's `publish`, else `rewrite`.
    pub fn with_publish_as(mut self, mode: Option<String>) -> Self {
        self.publish_as = mode;
        self
    }

    /// Creates the companion table adjustments go to (`adjustments = "…"` of the target in
    /// `lakefill.toml`) when it does not exist yet.
    ///
    /// By default, nothing is created: a plan whose companion is missing is made against the
    /// target and says that the first backfill creates it.
    pub fn with_create_companion(mut self, create: bool) -> Self {
        self.create_companion = create;
        self
    }

    /// The publication mode: the flag, else the header (checked when the model was loaded),
    /// else `rewrite`.
    fn publish_mode(&self, model: &Model) -> Result<PublishMode> {
        let Some(flag) = &self.publish_as else {
            return Ok(model.publish().unwrap_or_default());
        };
        PublishMode::parse(flag).ok_or_else(|| Error::InvalidOption {
            option: "--publish-as".into(),
            value: flag.clone(),
            message: format!("`{flag}` is not a way to publish: use `rewrite` or `adjustments`"),
        })
    }

    async fn run(self) -> Result<BackfillPlan> {
        let project = &self.project;
        let model = Model::load(project, &self.model, self.model_version.as_deref())?;
        let header = model.header().clone();
        let batch_partitions = self.check_options(&model)?;
        let target_config = project
            .table(&header.target, &format!("model `{}`", model.name()))?
            .clone();
        let target = open_table(&target_config, None).await?;
        let read_version = loaded_version(&target)?;
        check_model_unedited(&target, &model).await?;
        let publish = self.publish_mode(&model)?;
        // Before anything else: a feature lakefill cannot honour is refused by name.
        let protocol = TableProtocol::read(
            &target,
            target_config.name(),
            publish == PublishMode::Adjustments,
        )?;
        let snapshot = target.snapshot().map_err(|source| Error::Delta {
            context: format!("cannot read the snapshot of `{}`", target_config.name()),
            source: Box::new(source),
        })?;
        let schema = snapshot.snapshot().arrow_schema();
        let files = log_files(snapshot)?;
        let layout = detect_layout(
            &model,
            target_config.name(),
            snapshot.metadata().partition_columns(),
            &schema,
            &files,
        )?;
        let (mut range, mut range_notes) = self.range(target_config.name(), &layout, &files)?;
        range.rows = self
            .rows
            .as_deref()
            .map(|text| RowPredicate::parse(text, &schema, target_config.name()))
            .transpose()?;
        if range
            .rows
            .as_ref()
            .is_some_and(RowPredicate::selects_every_row)
        {
            // Every row of the range: its partitions are replaced whole, as with no `--where`
            // (the same rows, without carrying any over; adjustments take it too).
            range.rows = None;
            range_notes.push(
                "`--where TRUE` selects every row: the range is replaced whole, as without `--where`"
                    .into(),
            );
        }
        if range.rows.is_some() && publish == PublishMode::Adjustments {
            return Err(Error::InvalidOption {
                option: "--where".into(),
                value: self.rows.clone().unwrap_or_default(),
                message: "a run scoped by `--where` publishes as `rewrite`; adjustments cannot be scoped by a predicate yet".into(),
            });
        }
        let max_partitions = self.max_partitions.unwrap_or(DEFAULT_MAX_PARTITIONS);
        check_partition_count(&range, &layout, max_partitions)?;

        let mut affected = affected(target_config.name(), &layout, &range, &files, &schema)?;
        if publish == PublishMode::Adjustments {
            // Nothing is removed, so no rows are carried over.
            affected.files.clear();
        }
        let (sources, source_plans) = self.plan_sources(&model, &target, read_version).await?;
        if layout.is_timeless() {
            check_timeless(&model, target_config.name(), &sources, publish)?;
        }
        let own_past = recursive::reads_own_past(
            &model,
            &source_plans,
            &layout,
            &range,
            &files,
            &mut range_notes,
        )?;
        // Reading its own past, a partition needs the one before it staged first.
        let batch_partitions = if own_past { 1 } else { batch_partitions };
        let batches = batches(&range, &layout, batch_partitions, &affected.files);
        let run_id = run_id(
            &model,
            &source_plans,
            &range,
            self.allow_spill_drop,
            publish,
        );
        let (already_published, publish_sequence) =
            publish_state(&target, &run_id, &layout, &range, read_version).await?;
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let mut rules =
            ValidationRules::from_spec(header.validate.as_ref(), &columns, model.path())?;
        rules.protocol = protocol.rules.clone();
        let edges = edges::plan(
            &rules.key,
            &layout,
            &range,
            &source_plans,
            self.allow_edge_moves.clone(),
            &mut range_notes,
        )?;
        // Adjustments may go to a companion table: then it is the table the run writes.
        let companion = match (publish, target_config.adjustments()) {
            (PublishMode::Adjustments, Some(name)) => {
                self.companion(name, &target_config, &target, &layout, &mut range_notes)
                    .await?
            }
            _ => None,
        };
        if publish == PublishMode::Adjustments {
            check_adjustments(&model, &target_config, &schema, &rules, &layout, &range)?;
        }

        let where_text = range.rows.as_ref().map(|r| r.sql.clone());
        let files_ruled_out = range.rows.is_some().then_some(affected.ruled_out);
        let report = PlanReport {
            run_id,
            model: model.name().to_string(),
            model_version: model.version().to_string(),
            fingerprint: model.fingerprint().to_string(),
            model_file: model.path().display().to_string(),
            target: target_config.name().to_string(),
            target_uri: target_config.uri().to_string(),
            resolved_location: resolved_location(&target_config),
            partition_column: layout.time.encoding.columns().join(", "),
            read_version,
            range,
            range_notes,
            batch_partitions,
            partitions: affected.partitions,
            totals: affected.totals,
            sources: source_plans,
            batches,
            downstream: find_downstream(project, model.name(), &header.target),
            reason: self.reason.clone().or_else(|| header.reason.clone()),
            allow_spill: self.allow_spill_drop.then(|| "drop".to_string()),
            storage: storage_descriptions(project, &target_config, &header)?,
            already_published,
            publish_sequence,
            max_partitions,
            memory_limit: lakefill_table::settings::memory_limit(&self.project, None)?,
            protocol,
            affected_files: affected.files,
            rows: where_text,
            files_ruled_out,
            added_columns: Vec::new(),
            layout,
            publish,
            edges,
            reads_own_past: own_past,
            by_vectors: None,
        };
        let mut plan = BackfillPlan {
            target_config,
            report,
            model,
            rules,
            target,
            sources,
            write_schema: None,
            resume: None,
            kind: RunKind::Backfill,
            cascade_staged: Vec::new(),
            adjusted: None,
            vectors: None,
        };
        if let Some((config, table)) = companion {
            plan.write_to_companion(config, table).await?;
        }
        self.checked(plan).await
    }

    /// What `plan` accepts, `backfill` runs: the plan's rules, its model and its checks are
    /// planned against the sources now, and the schema its files are written with is fixed.
    async fn checked(&self, mut plan: BackfillPlan) -> Result<BackfillPlan> {
        if plan.report.publish == PublishMode::Adjustments {
            // The rules of the table the adjustments go to, over the measures they negate.
            crate::plan::adjust::check_rules(&plan.rules, &plan.report.target, plan.model.path())?;
        }
        let (write_schema, added_columns, identity_kept) = query::check_model(&plan).await?;
        if plan.report.range.rows.is_some()
            && let Some(first) = plan.report.batches.first().cloned()
        {
            let reached = query::where_reached(&plan, &first).await?;
            for (source, reached) in plan.report.sources.iter_mut().zip(reached) {
                source.where_reached = Some(reached);
            }
        }
        plan.rules.identity_kept = identity_kept;
        query::check_checks(&plan, &self.project, &write_schema).await?;
        plan.write_schema = Some(write_schema);
        plan.report.added_columns = added_columns;
        crate::stage::vectors::VectorPlan::set(&mut plan)?;
        Ok(plan)
    }

    /// The companion table `name` that the adjustments of `target_config` go to, opened; created
    /// when the builder may (a backfill), else noted as missing (a plan creates nothing).
    async fn companion(
        &self,
        name: &str,
        target_config: &TableConfig,
        target: &DeltaTable,
        layout: &Layout,
        range_notes: &mut Vec<String>,
    ) -> Result<Option<(TableConfig, DeltaTable)>> {
        let config = self
            .project
            .table(
                name,
                &format!("`tables.{}.adjustments`", target_config.name()),
            )?
            .clone();
        let table = match open_table(&config, None).await {
            Ok(table) => Some(table),
            Err(Error::NotADeltaTable { .. }) if self.create_companion => Some(
                crate::plan::adjust::create_companion(
                    &config,
                    target,
                    &layout.partition_columns,
                    target_config.name(),
                )
                .await?,
            ),
            Err(Error::NotADeltaTable { .. }) => {
                range_notes.push(format!(
                    "adjustments go to `{name}`, which does not exist yet: the first backfill creates it (the columns of `{}`, the lineage columns, `delta.appendOnly`)",
                    target_config.name()
                ));
                None
            }
            Err(error) => return Err(error),
        };
        Ok(table.map(|table| (config, table)))
    }

    /// The range the run replaces: `--from`/`--to` rounded to whole periods, or, without them,
    /// the whole table (its one period when it has no time column; from its first to its last
    /// period when `--where` scopes the rows); with a note for what was rounded or chosen.
    fn range(
        &self,
        target: &str,
        layout: &Layout,
        files: &[LogFile],
    ) -> Result<(PartitionRange, Vec<String>)> {
        match &self.range {
            Some((from, _)) if layout.is_timeless() => Err(Error::InvalidOption {
                option: "--from".into(),
                value: from.clone(),
                message: format!(
                    "`{target}` has no time column, so a range selects nothing ({}): drop `--from`/`--to`",
                    layout.time.grain_reason
                ),
            }),
            Some((from, to)) => PartitionRange::parse(from, to, &layout.time, self.include_null),
            None if layout.is_timeless() => Ok((
                PartitionRange::whole(),
                vec![format!(
                    "`{target}` has no time column: the run's scope is the whole table{}",
                    if self.rows.is_some() {
                        ", narrowed by `--where`"
                    } else {
                        ""
                    }
                )],
            )),
            None if self.rows.is_none() => Err(Error::InvalidRange {
                message: format!(
                    "no range: give `--from` and `--to`, or `--where` to replace the matching rows of the whole of `{target}`"
                ),
            }),
            None => {
                let facts: Vec<FileFacts<'_>> = files
                    .iter()
                    .map(|f| FileFacts {
                        values: &f.values,
                        stats: f.stats.as_deref(),
                    })
                    .collect();
                let spanning = PartitionRange::spanning(layout, &facts).map_err(|message| {
                    Error::Partitioning {
                        message: format!("cannot scope the whole of `{target}`: {message}"),
                        hint: "give `--from` and `--to`".into(),
                    }
                })?;
                let Some(mut range) = spanning else {
                    return Err(Error::InvalidRange {
                        message: format!(
                            "`{target}` holds no rows with a time, so there is no whole table to scope: give `--from` and `--to`"
                        ),
                    });
                };
                range.include_null |= self.include_null;
                let note = format!(
                    "no `--from`/`--to`: the whole of `{target}`, {}..={}{}",
                    range.from,
                    range.to,
                    if range.include_null {
                        " and the partition whose time is NULL"
                    } else {
                        ""
                    }
                );
                Ok((range, vec![note]))
            }
        }
    }

    /// Checks the options against the model; returns the batch size (see [`lakefill_table::settings`]).
    fn check_options(&self, model: &Model) -> Result<usize> {
        let batch_partitions = self.settings.batch_partitions;
        if batch_partitions == 0 {
            return Err(Error::InvalidOption {
                option: "batch_partitions".into(),
                value: "0".into(),
                message: "a batch holds at least one partition".into(),
            });
        }
        for table in self.source_versions.keys() {
            if !model.header().sources.contains_key(table) {
                return Err(Error::InvalidOption {
                    option: "--source-version".into(),
                    value: table.clone(),
                    message: format!("`{table}` is not a source of model `{}`", model.name()),
                });
            }
        }
        Ok(batch_partitions)
    }

    /// Opens every source at its pinned version (the target itself at the read version) and
    /// works out how each one's window selects times.
    async fn plan_sources(
        &self,
        model: &Model,
        target: &DeltaTable,
        read_version: u64,
    ) -> Result<(Vec<PlannedSource>, Vec<SourcePlan>)> {
        let header = model.header();
        let mut sources = Vec::new();
        let mut source_plans = Vec::new();
        for (name, spec) in &header.sources {
            let config = self
                .project
                .table(name, &format!("model `{}`", model.name()))?
                .clone();
            let reads_target = name == &header.target;
            let table = if reads_target {
                if let Some(version) = self.source_versions.get(name)
                    && *version != read_version
                {
                    return Err(Error::InvalidOption {
                        option: "--source-version".into(),
                        value: format!("{name}={version}"),
                        message: format!(
                            "`{name}` is the target: it is always read at the read version {read_version}"
                        ),
                    });
                }
                target.clone()
            } else {
                open_table(&config, self.source_versions.get(name).copied()).await?
            };
            let version = loaded_version(&table)?;
            lakefill_table::protocol::check_readable(&table, name)?;
            let window_time = source_window(model, name, spec, &table)?;
            source_plans.push(SourcePlan {
                table: name.clone(),
                version,
                window: spec.window.as_ref().map(|w| w.join(", ")),
                window_time: window_time.as_ref().map(|w| w.time.clone()),
                lookback: spec.lookback,
                lookahead: spec.lookahead,
                reads_target,
                where_reached: None,
            });
            sources.push(PlannedSource {
                name: name.clone(),
                spec: spec.clone(),
                table,
                window: window_time,
                overlay: None,
            });
        }
        Ok((sources, source_plans))
    }
}

/// What a model of a table with no time column cannot do: read a source by a window (there is
/// no batch time for it to follow), or publish as adjustments (whose ledger is per period).
fn check_timeless(
    model: &Model,
    target: &str,
    sources: &[PlannedSource],
    publish: PublishMode,
) -> Result<()> {
    if let Some(source) = sources.iter().find(|s| s.window.is_some()) {
        return Err(Error::Model {
            path: model.path().to_path_buf(),
            message: format!(
                "source `{}` has a `window`, but `{target}` has no time column for it to follow",
                source.name
            ),
            hint: format!(
                "remove `window` (and `lookback`/`lookahead`) under `[sources.{}]`: the whole source is read, and `--where` narrows it where its columns line up",
                source.name
            ),
        });
    }
    if publish == PublishMode::Adjustments {
        return Err(Error::InvalidOption {
            option: "--publish-as".into(),
            value: "adjustments".into(),
            message: format!(
                "`{target}` has no time column; adjustments are kept per period, so it publishes as `rewrite`"
            ),
        });
    }
    Ok(())
}

/// A released model file is never edited: its published fingerprint is on record.
async fn check_model_unedited(target: &DeltaTable, model: &Model) -> Result<()> {
    if let Some(published) =
        published_fingerprint(&target.object_store(), model.name(), model.version()).await?
        && published != model.fingerprint()
    {
        return Err(Error::ModelEdited {
            model: model.name().to_string(),
            version: model.version().to_string(),
            path: model.path().to_path_buf(),
            published,
            current: model.fingerprint().to_string(),
        });
    }
    Ok(())
}

/// Every file of the target from the log (no data scan): its partition values, size and live
/// rows.
/// Column-mapped tables key both by physical name; these are keyed by logical name.
fn log_files(snapshot: &deltalake::table::state::DeltaTableState) -> Result<Vec<LogFile>> {
    let mapping = ColumnMapping::of_snapshot(snapshot)?;
    Ok(snapshot
        .log_data()
        .iter()
        .map(|file| {
            LogFile {
                path: file.path().to_string(),
                stats: file.stats().map(|stats| mapping.logical_stats(stats)),
                values: mapping.logical_values(file.partition_values_map()),
                bytes: u64::try_from(file.size()).unwrap_or(0),
                // Rows a deletion vector removed are not rows of the table.
                rows: lakefill_table::storage::live_rows(&file),
            }
        })
        .collect())
}

/// How the target is partitioned and where its time is, as the model header declares it or
/// the log shows it.
fn detect_layout(
    model: &Model,
    target: &str,
    partition_columns: &[String],
    schema: &deltalake::arrow::datatypes::Schema,
    files: &[LogFile],
) -> Result<Layout> {
    let header = model.header();
    match &header.range_column {
        Some(range_column) => Layout::detect_rows(
            target,
            partition_columns,
            schema,
            &header.partition_by,
            range_column,
            model.grain(),
            header.format.as_deref(),
        ),
        None => Layout::detect(
            target,
            partition_columns,
            schema,
            &distinct_values(files.iter().map(|f| &f.values)),
            &header.partition_by,
            model.grain(),
            header.format.as_deref(),
        ),
    }
    .map_err(|message| Error::Partitioning {
        message,
        hint: format!(
            "set `partition_by` (and `grain` or `format` if needed) in `{}` to match the table: its partition columns are [{}]",
            model.path().display(),
            partition_columns.join(", ")
        ),
    })
}

/// Refuses a range of more periods than `max` before anything is listed per period.
fn check_partition_count(range: &PartitionRange, layout: &Layout, max: u64) -> Result<()> {
    let count = range.periods().len() as u64;
    if count > max {
        return Err(Error::TooManyPartitions {
            range: range.span(),
            count,
            max,
            grain: layout.time.grain,
        });
    }
    Ok(())
}

/// What a run replaces: the state of each affected partition, their totals, and (by rows) the
/// files it rewrites.
struct Affected {
    partitions: Vec<PartitionState>,
    totals: PartitionTotals,
    files: Vec<String>,
    /// Files of the range that `--where` rules out by their values or statistics.
    ruled_out: u64,
}

/// The affected partitions from the log only. A partition value that is not a time of the
/// grain is refused: it could belong to the range or not. By rows, the affected files are those
/// whose statistics say they may hold rows of the range (all of them when statistics are
/// missing); they are rewritten and their other rows carried over.
fn affected(
    target: &str,
    layout: &Layout,
    range: &PartitionRange,
    files: &[LogFile],
    schema: &deltalake::arrow::datatypes::Schema,
) -> Result<Affected> {
    let sum = |acc: PartitionTotals, files: u64, rows: Option<u64>, bytes: u64| PartitionTotals {
        files: acc.files + files,
        rows: acc.rows.zip(rows).map(|(a, b)| a + b),
        bytes: acc.bytes + bytes,
    };
    let empty = PartitionTotals {
        files: 0,
        rows: Some(0),
        bytes: 0,
    };
    let mut current: BTreeMap<String, PartitionState> = BTreeMap::new();
    let mut affected_files = Vec::new();
    let mut by_rows = empty.clone();
    let facts: Vec<FileFacts<'_>> = files
        .iter()
        .map(|f| FileFacts {
            values: &f.values,
            stats: f.stats.as_deref(),
        })
        .collect();
    // Files rewritten with their other rows carried over: by rows, or scoped by `--where`.
    let in_scope = layout
        .rewrites_files(range)
        .then(|| layout.files_in_scope(range, &facts, schema))
        .transpose()?;
    // Without the predicate, which files the range would rewrite: those it rules out.
    let whole = PartitionRange {
        rows: None,
        ..range.clone()
    };
    let in_range = range
        .rows
        .is_some()
        .then(|| layout.files_in_scope(&whole, &facts, schema))
        .transpose()?;
    let mut ruled_out = 0;
    for (index, file) in files.iter().enumerate() {
        let rewritten = in_scope.as_ref().is_some_and(|keep| keep[index]);
        if rewritten {
            affected_files.push(file.path.clone());
            by_rows = sum(by_rows, 1, file.rows, file.bytes);
        } else if in_range.as_ref().is_some_and(|keep| keep[index]) {
            ruled_out += 1;
        }
        if layout.by_rows {
            continue;
        }
        let label = match layout.time.period_of(&file.values) {
            Ok(Some(period)) if range.contains(&period) => period.label(),
            Ok(None) if range.include_null => NULL_LABEL.to_string(),
            Ok(_) => continue,
            Err(message) => {
                return Err(Error::Partitioning {
                    message: format!(
                        "`{target}` holds a partition that is not a {} of {}: {message}",
                        layout.time.grain,
                        layout.time.encoding.describe()
                    ),
                    hint: "declare the right `grain` (or `format`) in the model header, or repair the partition".into(),
                });
            }
        };
        let entry = current
            .entry(label.clone())
            .or_insert_with(|| PartitionState::empty(&label));
        entry.files += 1;
        entry.bytes += file.bytes;
        entry.rows = entry.rows.zip(file.rows).map(|(a, b)| a + b);
    }
    let mut labels: Vec<String> = range.periods().iter().map(|p| p.label()).collect();
    if range.include_null {
        labels.push(NULL_LABEL.to_string());
    }
    let mut partitions: Vec<PartitionState> = labels
        .iter()
        .map(|label| {
            current
                .remove(label)
                .unwrap_or_else(|| PartitionState::empty(label))
        })
        .collect();
    let totals = if layout.rewrites_files(range) {
        // What the log can tell of the range: the files it may touch, not rows per period.
        for partition in &mut partitions {
            partition.rows = None;
        }
        by_rows
    } else {
        partitions
            .iter()
            .fold(empty, |acc, p| sum(acc, p.files, p.rows, p.bytes))
    };
    Ok(Affected {
        partitions,
        totals,
        files: affected_files,
        ruled_out,
    })
}

/// The range split into batches of `batch_partitions` periods, plus the batch of NULL-time
/// rows when the range takes them and, by rows, the batch that carries the rewritten files'
/// rows outside the range.
fn batches(
    range: &PartitionRange,
    layout: &Layout,
    batch_partitions: usize,
    affected_files: &[String],
) -> Vec<BatchPlan> {
    let periods = range.periods();
    let mut batches: Vec<BatchPlan> = periods
        .chunks(batch_partitions)
        .enumerate()
        .map(|(index, chunk)| BatchPlan {
            index,
            start: chunk.first().map(|p| p.label()).unwrap_or_default(),
            end: chunk.last().map(|p| p.label()).unwrap_or_default(),
            partitions: chunk.iter().map(|p| p.label()).collect(),
            null: false,
            carry: false,
        })
        .collect();
    let whole_range = |index: usize, label: &str, null: bool, carry: bool| BatchPlan {
        index,
        start: range.from.clone(),
        end: range.to.clone(),
        partitions: vec![label.to_string()],
        null,
        carry,
    };
    if range.include_null {
        // One more batch over the whole range keeps only the rows whose time is NULL.
        batches.push(whole_range(batches.len(), NULL_LABEL, true, false));
    }
    if layout.rewrites_files(range) && !affected_files.is_empty() {
        // One more batch copies the rows of the rewritten files that lie outside the range
        // (or its predicate).
        batches.push(whole_range(batches.len(), CARRIED_LABEL, false, true));
    }
    batches
}

/// How a source's `window` selects times: its column(s), their encoding and grain.
pub fn source_window(
    model: &Model,
    name: &str,
    spec: &SourceSpec,
    table: &DeltaTable,
) -> Result<Option<SourceWindow>> {
    let mut window_time = None;
    if let Some(columns) = &spec.window {
        let source_snapshot = table.snapshot().map_err(|source| Error::Delta {
            context: format!("cannot read the snapshot of `{name}`"),
            source: Box::new(source),
        })?;
        let source_schema = source_snapshot.snapshot().arrow_schema();
        let known = || {
            source_schema
                .fields()
                .iter()
                .map(|f| format!("`{}` ({})", f.name(), f.data_type()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let window_error = |message: String| Error::Model {
            path: model.path().to_path_buf(),
            message: format!("the window of source `{name}` cannot select times: {message}"),
            hint: format!(
                "a window is a column holding times, e.g. `window = \"event_date\"` (a DATE), a TIMESTAMP, a string of dates (with `format = \"%Y%m%d\"` if it is not a partition column), or integer parts `window = [\"year\", \"month\"]`; columns of `{name}`: {}",
                known()
            ),
        };
        for column in columns {
            if source_schema.field_with_name(column).is_err() {
                return Err(Error::Model {
                    path: model.path().to_path_buf(),
                    message: format!("source `{name}` has no column `{column}` (its `window`)"),
                    hint: format!(
                        "set `window` under `[sources.{name}]` to one of: {}",
                        known()
                    ),
                });
            }
        }
        let is_integer = |c: &String| {
            source_schema
                .field_with_name(c)
                .is_ok_and(|f| f.data_type().is_integer())
        };
        let (time, is_partition, data_type) = if columns.len() > 1 || columns.iter().all(is_integer)
        {
            let time = parts_time(columns, &source_schema).map_err(window_error)?;
            (time, true, DataType::Int64)
        } else {
            let window = &columns[0];
            let field = source_schema
                .field_with_name(window)
                .map_err(|_| Error::Internal(format!("`{window}` vanished")))?;
            let is_partition = source_snapshot
                .metadata()
                .partition_columns()
                .contains(window);
            let mapping = ColumnMapping::of_snapshot(source_snapshot)?;
            let values = is_partition.then(|| {
                let values: Vec<PartitionValues> = source_snapshot
                    .log_data()
                    .iter()
                    .map(|f| mapping.logical_values(f.partition_values_map()))
                    .collect();
                distinct_values(values.iter())
                    .remove(window)
                    .unwrap_or_default()
            });
            let facts = ColumnFacts {
                column: window,
                data_type: field.data_type(),
                values,
                grain: spec
                    .grain
                    .as_deref()
                    .and_then(lakefill_table::time::Grain::parse),
                format: spec.format.as_deref(),
            };
            let time = time_column(&facts).map_err(window_error)?;
            (time, is_partition, field.data_type().clone())
        };
        window_time = Some(SourceWindow {
            time,
            partition_column: is_partition,
            data_type,
        });
    }
    Ok(window_time)
}

/// Whether the run was published already and the publish sequence this application gets: a
/// run published before is a new application (the next sequence) only if a later commit
/// touched its range; otherwise there is nothing to do.
pub async fn publish_state(
    target: &DeltaTable,
    run_id: &RunId,
    layout: &Layout,
    range: &PartitionRange,
    read_version: u64,
) -> Result<(bool, u64)> {
    let Some(sequence) = published_sequence(target, run_id).await? else {
        return Ok((false, 1));
    };
    let journaled = Journal::load(&target.object_store(), run_id)
        .await?
        .and_then(|j| j.outcome.published_version);
    // An attempt to publish the run again (its range moved since) starts a fresh journal: when
    // it was interrupted, the log says where the run last committed.
    let published_at = match journaled {
        Some(version) => Some(version),
        None => lakefill_log::find_run_commit(target, run_id.as_str()).await?,
    };
    let touched = match published_at {
        Some(version) => range_touched_after(target, version, layout, range, read_version).await?,
        // The log has the run's transaction but no longer its commit: publishing again is safe
        // (an output equal to the table is up to date), claiming it published may not be.
        None => true,
    };
    Ok(if touched {
        (false, sequence + 1)
    } else {
        (true, sequence)
    })
}

/// The storage options of the target and each source, secrets masked (DESIGN §4.1).
fn storage_descriptions(
    project: &Project,
    target: &lakefill_table::config::TableConfig,
    header: &lakefill_table::model::ModelHeader,
) -> Result<BTreeMap<String, Vec<StorageOption>>> {
    let mut storage = BTreeMap::new();
    storage.insert(
        target.name().to_string(),
        describe_options(target, project.storage_keys()),
    );
    for source in header.sources.keys() {
        let config = project.table(source, "the model header")?;
        storage.insert(
            source.clone(),
            describe_options(config, project.storage_keys()),
        );
    }
    Ok(storage)
}

impl IntoFuture for PlanBuilder {
    type Output = Result<BackfillPlan>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// A plan ready to run: the printable report plus the opened tables.
#[derive(Debug, Clone)]
pub struct BackfillPlan {
    /// What `plan` prints: scope, partitions, batches, run id.
    pub report: PlanReport,
    /// The model the run executes.
    pub model: Model,
    /// The model's `[validate]` rules, checked against the target.
    pub rules: ValidationRules,
    /// The target at its read version (a companion table, when adjustments go there).
    pub target: DeltaTable,
    /// The target as the project configures it (its sinks, for notifications).
    pub target_config: lakefill_table::config::TableConfig,
    /// Each source, opened at its pinned version.
    pub sources: Vec<PlannedSource>,
    /// The schema staged files are written with (the target's, plus added columns).
    pub write_schema: Option<deltalake::arrow::datatypes::SchemaRef>,
    /// The command that resumes the run when it is not its own backfill command (a cascade).
    pub resume: Option<String>,
    /// What kind of run the plan is for: a backfill, a node of a cascade, or a logical revert
    /// (see [`restore`]).
    pub kind: RunKind,
    /// In a cascade, every node staged before this one, by table: its next version, for the
    /// checks' `staged.<table>`.
    pub cascade_staged: Vec<(String, DeltaTable, Overlay)>,
    /// The old files the run may publish its fix into by deletion vectors, when the target
    /// takes them ([`crate::stage::vectors`]).
    pub vectors: Option<Arc<crate::stage::vectors::VectorPlan>>,
    /// When adjustments go to a companion table (then [`Self::target`]): the table they correct.
    pub adjusted: Option<Adjusted>,
}

/// How a plan's output reaches its table: one view over the publish mode and the companion, to
/// match on instead of testing both.
#[derive(Debug, Clone, Copy)]
pub enum Publish<'a> {
    /// The range's files are replaced by the staged ones.
    Rewrite,
    /// Reversal and correction rows are appended to the table itself.
    Adjustments,
    /// Reversal and correction rows are appended to a companion table (the plan's target);
    /// the table they correct is never written.
    AdjustmentsToCompanion(&'a Adjusted),
}

impl BackfillPlan {
    /// How the run's output reaches its table.
    pub fn publish(&self) -> Publish<'_> {
        match (self.report.publish, &self.adjusted) {
            (_, Some(adjusted)) => Publish::AdjustmentsToCompanion(adjusted),
            (PublishMode::Adjustments, None) => Publish::Adjustments,
            (PublishMode::Rewrite, None) => Publish::Rewrite,
        }
    }

    /// Whether the batches staged here publish by deletion vectors: the target takes them
    /// ([`Self::vectors`]) and the run recomputes rows (a backfill, of its own or a cascade's
    /// node, or a logical revert; a revert by files puts files back).
    pub fn publishes_by_vectors(&self) -> bool {
        self.vectors.is_some() && !self.kind.reverts_files()
    }
}

/// The table a companion's adjustments correct, and the companion version whose rows count as
/// part of it (the read version for a fix; the version before the run for its revert).
#[derive(Debug, Clone)]
pub struct Adjusted {
    /// The table's name in the project.
    pub name: String,
    /// The table at its read version.
    pub table: DeltaTable,
    /// The companion at the version whose rows count as part of the table.
    pub companion_rows: DeltaTable,
}

impl BackfillPlan {
    /// Makes the plan write `companion` (adjustments of its target go there): the run's table,
    /// journal, staging, application transaction and commit are the companion's; its target is
    /// read as the rows the adjustments correct.
    pub async fn write_to_companion(
        &mut self,
        config: lakefill_table::config::TableConfig,
        companion: DeltaTable,
    ) -> Result<()> {
        let version = loaded_version(&companion)?;
        let (already, sequence) = publish_state(
            &companion,
            &self.report.run_id,
            &self.report.layout,
            &self.report.range,
            version,
        )
        .await?;
        let adjusted = Adjusted {
            name: self.target_config.name().to_string(),
            table: std::mem::replace(&mut self.target, companion.clone()),
            companion_rows: companion,
        };
        self.report.range_notes.push(format!(
            "adjustments of `{}` (read at version {}) go to `{}`",
            adjusted.name,
            loaded_version(&adjusted.table)?,
            config.name()
        ));
        self.report.target = config.name().to_string();
        self.report.target_uri = config.uri().to_string();
        self.report.resolved_location = resolved_location(&config);
        self.report.read_version = version;
        self.report.already_published = already;
        self.report.publish_sequence = sequence;
        self.report.protocol = TableProtocol::read(&self.target, config.name(), true)?;
        self.rules.protocol = self.report.protocol.rules.clone();
        self.target_config = config;
        self.adjusted = Some(adjusted);
        Ok(())
    }

    /// The plan of `batch` of a model that reads its own past: its target, as a source, reads as
    /// this run will publish it so far, with the partitions of the range before the batch
    /// replaced by what `staged` (their staged files) holds.
    pub fn reading_staged(
        &self,
        batch: &BatchPlan,
        staged: &[deltalake::kernel::Add],
    ) -> Result<Self> {
        let grain = self.report.range.grain;
        let previous = Period::from_label(grain, &batch.start)
            .and_then(|p| p.offset(-1))
            .filter(|p| self.report.range.first().is_some_and(|first| first <= *p));
        let Some(previous) = previous else {
            // The first partition reads the one before the range as the table holds it.
            return Ok(self.clone());
        };
        let mut plan = self.clone();
        let layout = self.report.layout.clone();
        let partition_columns = layout.partition_columns.clone();
        let adds = staged.to_vec();
        let key = format!("own-{}-{}", self.report.run_id, batch.index);
        let overlay = Overlay {
            layout,
            range: PartitionRange {
                from: self.report.range.from.clone(),
                to: previous.label(),
                grain,
                include_null: false,
                rows: None,
            },
            staged: Arc::new(move |ctx, table, schema| {
                let staged = lakefill_table::staged::StagedTable::register_store(
                    ctx,
                    table,
                    schema,
                    &partition_columns,
                    &adds,
                    &key,
                )?;
                Ok(staged)
            }),
        };
        for source in &mut plan.sources {
            if source.name == self.model.header().target {
                source.overlay = Some(overlay.clone());
            }
        }
        Ok(plan)
    }

    /// Returns the printable, serializable view of the plan.
    pub fn report(&self) -> &PlanReport {
        &self.report
    }

    /// Returns the run id the plan derives from its inputs.
    pub fn run_id(&self) -> &RunId {
        &self.report.run_id
    }
}

#[derive(Debug, Clone)]
/// A source of the model, opened at its pinned version.
pub struct PlannedSource {
    /// The name the model reads it by.
    pub name: String,
    /// How the model header declares it.
    pub spec: SourceSpec,
    /// The table at its pinned version.
    pub table: DeltaTable,
    /// How it is filtered to a batch's window, when it is.
    pub window: Option<SourceWindow>,
    /// In a cascade, a parent's staged output read in place of its range (see
    /// `cascade`).
    pub overlay: Option<Overlay>,
}

/// Builds a provider over staged files for a session: `(session, table, table schema)`.
pub type StagedProvider = Arc<
    dyn Fn(
            &deltalake::datafusion::prelude::SessionContext,
            &DeltaTable,
            &deltalake::arrow::datatypes::Schema,
        ) -> Result<Arc<dyn deltalake::datafusion::catalog::TableProvider>>
        + Send
        + Sync,
>;

/// A source as its next version would be: its rows in `range` (of `layout`) replaced by the
/// staged rows `staged` provides.
#[derive(Clone)]
pub struct Overlay {
    /// The source's layout.
    pub layout: Layout,
    /// The range the staged rows replace.
    pub range: PartitionRange,
    /// Reads the staged rows.
    pub staged: StagedProvider,
}

impl std::fmt::Debug for Overlay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlay")
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// How a source's window column holds time.
#[derive(Debug, Clone)]
pub struct SourceWindow {
    /// The column and how it holds time.
    pub time: TimeColumn,
    /// Whether it is a partition column of the source (so it holds only period values).
    pub partition_column: bool,
    /// Its Arrow type in the source.
    pub data_type: deltalake::arrow::datatypes::DataType,
}

/// Refuses a plan that cannot publish adjustments: the target's schema, key, measures and
/// partitions must allow reversal and correction rows.
fn check_adjustments(
    model: &Model,
    target_config: &TableConfig,
    schema: &deltalake::arrow::datatypes::Schema,
    rules: &ValidationRules,
    layout: &Layout,
    range: &PartitionRange,
) -> Result<()> {
    crate::plan::adjust::check_plan(
        schema,
        &rules.key,
        &rules.summed_measures(),
        &layout.partition_columns,
        range.include_null,
        // A companion carries the lineage columns, not the target.
        model.adds_columns() || target_config.adjustments().is_some(),
    )
    .map_err(|message| Error::Model {
        path: model.path().to_path_buf(),
        message,
        hint: "adjustments are described in docs/guide.md (\"Append-only tables\")".into(),
    })?;
    Ok(())
}

/// One file of the target as the log describes it.
struct LogFile {
    path: String,
    stats: Option<String>,
    values: PartitionValues,
    bytes: u64,
    rows: Option<u64>,
}

/// The distinct non-NULL values of each partition column.
fn distinct_values<'a>(
    files: impl Iterator<Item = &'a PartitionValues>,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for values in files {
        for (column, value) in values {
            if let Some(value) = value {
                out.entry(column.clone()).or_default().insert(value.clone());
            }
        }
    }
    out.into_iter()
        .map(|(c, v)| (c, v.into_iter().collect()))
        .collect()
}

/// What a backfill will read and replace.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// Run id derived from the inputs (DESIGN §4.1).
    pub run_id: RunId,
    /// Model name.
    pub model: String,
    /// Model version (file stem).
    pub model_version: String,
    /// SHA-256 of the model file.
    pub fingerprint: String,
    /// Path of the model file.
    pub model_file: String,
    /// Target table name.
    pub target: String,
    /// Target location as configured.
    pub target_uri: String,
    /// For a target named through a catalog (`glue://database/table`), the location the catalog
    /// gave for this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_location: Option<String>,
    /// The target's time partition column(s), comma separated.
    pub partition_column: String,
    /// How the target is partitioned: every partition column, and the time column's grain.
    pub layout: Layout,
    /// Version of the target the run reads and replaces.
    pub read_version: u64,
    /// The range, inclusive, in periods of the time column's grain.
    pub range: PartitionRange,
    /// How `--from`/`--to` were rounded to whole periods, if they were.
    pub range_notes: Vec<String>,
    /// Partitions per batch.
    pub batch_partitions: usize,
    /// Affected partitions with their current state.
    pub partitions: Vec<PartitionState>,
    /// Sums over the affected partitions.
    pub totals: PartitionTotals,
    /// Sources and the versions they are pinned at.
    pub sources: Vec<SourcePlan>,
    /// Batches in execution order.
    pub batches: Vec<BatchPlan>,
    /// Models that read the target.
    pub downstream: Vec<DownstreamModel>,
    /// Reason recorded with the run.
    pub reason: Option<String>,
    /// `"drop"` when rows outside the range are dropped on purpose.
    pub allow_spill: Option<String>,
    /// Storage options per table (target and sources), secrets masked, with where each came from.
    pub storage: BTreeMap<String, Vec<StorageOption>>,
    /// Whether the target already holds this run's commit, with no later change to the range.
    pub already_published: bool,
    /// Which publish of this run id a backfill would make (1 unless it re-applies the run).
    pub publish_sequence: u64,
    /// The most partitions a range may have (`--max-partitions`).
    pub max_partitions: u64,
    /// The memory pool a backfill of this plan gets unless `--memory-limit` says otherwise
    /// (`[defaults] memory_limit`, else the built-in share of the machine); `null` is unlimited.
    pub memory_limit: Option<u64>,
    /// The target's protocol: its features and the rules staged rows must satisfy.
    pub protocol: TableProtocol,
    /// By rows (`range_column`): the files the backfill rewrites, chosen by their statistics.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub affected_files: Vec<String>,
    /// The `--where` predicate the run is scoped by (null when it replaces every row of the
    /// range).
    #[serde(rename = "where")]
    pub rows: Option<String>,
    /// With `--where`, the files of the range whose partition values or statistics prove that
    /// no row matches: they are not touched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_ruled_out: Option<u64>,
    /// Nullable columns the model adds to the table (`schema = "add-columns"`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub added_columns: Vec<AddedColumn>,
    /// How the run publishes: `rewrite`, or `adjustments` appended (with the lineage columns
    /// the publish adds to the table, if any).
    #[serde(skip_serializing_if = "PublishMode::is_rewrite")]
    pub publish: PublishMode,
    /// The partitions around the range whose keys the backfill checks for rows that would cross
    /// its edges; `null` when no key can cross (no key, or one holding the time).
    pub edges: Option<EdgePlan>,
    /// Whether the model reads its own target's past: its partitions are staged one at a time,
    /// in order, each reading the rows staged before it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reads_own_past: bool,
    /// When the run publishes by deletion vectors ([`crate::stage::vectors`]: the target takes
    /// them and the run may), the share of a partition's rows a fix may change and still be cut
    /// (above it, the partition is rewritten). By rows, a run whose old files turn out too large
    /// to match or of another type rewrites them instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_vectors: Option<f64>,
}

/// Current state of one affected partition, from the Delta log.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionState {
    /// Partition value.
    pub value: String,
    /// Data files.
    pub files: u64,
    /// Rows, when every file has stats.
    pub rows: Option<u64>,
    /// Bytes of the data files.
    pub bytes: u64,
}

impl PartitionState {
    fn empty(value: &str) -> Self {
        Self {
            value: value.to_string(),
            files: 0,
            rows: Some(0),
            bytes: 0,
        }
    }
}

/// Sums over the affected partitions (by rows: over the files the backfill rewrites).
#[derive(Debug, Clone, Serialize)]
pub struct PartitionTotals {
    /// Data files.
    pub files: u64,
    /// Rows, when every file has stats.
    pub rows: Option<u64>,
    /// Bytes.
    pub bytes: u64,
}

/// A source as the plan reads it.
#[derive(Debug, Clone, Serialize)]
pub struct SourcePlan {
    /// Table name.
    pub table: String,
    /// Pinned version.
    pub version: u64,
    /// Window column, if reads are restricted to the batch window.
    pub window: Option<String>,
    /// How the window column holds time.
    pub window_time: Option<TimeColumn>,
    /// Extra partitions of the window column's grain read before the window.
    pub lookback: u32,
    /// Extra partitions of the window column's grain read after the window.
    pub lookahead: u32,
    /// Whether the source is the target itself (read at the read version).
    pub reads_target: bool,
    /// With `--where`, whether DataFusion pushed the predicate into this source's scan (the
    /// model then reads only the source's matching rows); `None` without `--where`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub where_reached: Option<bool>,
}

/// One batch of partitions computed by one query.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BatchPlan {
    /// Position in the run.
    pub index: usize,
    /// First partition value (`$start`).
    pub start: String,
    /// Last partition value (`$end`).
    pub end: String,
    /// Partitions of the batch.
    pub partitions: Vec<String>,
    /// Whether this is the batch that computes the partition whose time is NULL.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub null: bool,
    /// Whether this batch copies, unchanged, the rows outside the range of the files a by-rows
    /// backfill rewrites.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carry: bool,
}

impl BatchPlan {
    /// The journal's record of this batch before anything is staged.
    pub fn empty_record(&self) -> lakefill_log::journal::BatchRecord {
        lakefill_log::journal::BatchRecord {
            index: self.index,
            start: self.start.clone(),
            end: self.end.clone(),
            files: Vec::new(),
            rows: Default::default(),
            spill: Default::default(),
            sums: Default::default(),
            checksums: Default::default(),
            writers: Default::default(),
            vectors: None,
        }
    }
}

/// A model that reads the target.
#[derive(Debug, Clone, Serialize)]
pub struct DownstreamModel {
    /// Model name.
    pub model: String,
    /// Its newest version.
    pub version: String,
    /// The table it writes.
    pub target: String,
}

/// Derives the run id from everything that determines the output (DESIGN §4.1).
pub fn run_id(
    model: &Model,
    sources: &[SourcePlan],
    range: &PartitionRange,
    allow_spill_drop: bool,
    publish: PublishMode,
) -> RunId {
    let mut hasher = Sha256::new();
    hasher.update(b"lakefill-run-v1\n");
    hasher.update(model.name().as_bytes());
    hasher.update(b"\n");
    hasher.update(model.fingerprint().as_bytes());
    for source in sources.iter().filter(|s| !s.reads_target) {
        hasher.update(format!("\nsource {}={}", source.table, source.version).as_bytes());
    }
    hasher.update(format!("\nrange {}..{}", range.from, range.to).as_bytes());
    if let Some(rows) = &range.rows {
        hasher.update(format!("\nwhere {}", rows.canonical).as_bytes());
    }
    if range.include_null {
        hasher.update(b"\ninclude_null");
    }
    hasher.update(format!("\nallow_spill_drop {allow_spill_drop}").as_bytes());
    if publish == PublishMode::Adjustments {
        // Other rows are published: another run.
        hasher.update(b"\npublish adjustments");
    }
    RunId::derive(
        model.name(),
        model.version(),
        &hex::encode(hasher.finalize()),
    )
}

/// Finds models whose newest version reads `target`. Unreadable models are skipped: they are
/// reported when someone runs them.
pub fn find_downstream(project: &Project, model_name: &str, target: &str) -> Vec<DownstreamModel> {
    list_models(&project.sql_dir())
        .into_iter()
        .filter(|name| name != model_name)
        .filter_map(|name| Model::load(project, &name, None).ok())
        .filter(|m| m.header().sources.contains_key(target) && m.header().target != target)
        .map(|m| DownstreamModel {
            model: m.name().to_string(),
            version: m.version().to_string(),
            target: m.header().target.clone(),
        })
        .collect()
}

/// The location a catalog gave for a table named through one; `None` for a table named by its
/// location.
pub(crate) fn resolved_location(config: &TableConfig) -> Option<String> {
    config.catalog().map(|_| config.url().to_string())
}
