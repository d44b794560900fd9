//! # lakefill
//!
//! Safe backfills on Delta Lake tables. A backfill recomputes historical partitions of a table
//! with a versioned SQL model and replaces them so that no reader ever sees partial history:
//!
//! ```text
//!  scope ──► stage ──► validate ──► publish
//!  (plan)    (DataFusion over     (old vs new)   (one atomic
//!            pinned source                        Delta commit)
//!            versions, batches)
//! ```
//!
//! [`Project`] loads `lakefill.toml`; [`PlanBuilder`] scopes a backfill from the Delta log
//! without writing; [`BackfillBuilder`] stages the model's output as Parquet files that are not
//! yet in the log and publishes them as one commit.
//!
//! ## How the crate is laid out
//!
//! The layers below the runner are crates of their own, so Cargo keeps them from reaching up:
//! [`lakefill_table`] (what a table is), [`lakefill_validate`] (old rows against new),
//! [`lakefill_log`] (the Delta log read, the journal), `lakefill_recompute` (plan and staging)
//! and, with the `distributed` feature, `lakefill_ballista`. Inside this crate each module only
//! uses the ones below it (no import runs up this diagram, and none goes round in a circle):
//!
//! ```text
//!  act          what an id names (a run or a cascade); publish, discard, revert, report by id
//!  cascade/     a fix of one table through every table computed from it: plan, run, parents, manage
//!  explain/     history, blame, sql, diff, gc          report/   the report for people
//!  run/         the runner: sequences the phases; staging (here or on Ballista), validation,
//!               edges, publish step, reconcile, cleanup, found (find and hold a run), manage,
//!               revert, report                        cluster   `lakefill cluster up`
//!  adjust       staging and proving adjustments
//!  publish      the one Delta commit of a run         notify/   events, delivery, the outbox
//!  ═══════════════════════════════════════════════════════════════════════════════════════
//!  lakefill-ballista   staging on a Ballista cluster (feature `distributed`)
//!  lakefill-recompute  plan/ (scope, batches, run id, the model as a query), stage/
//!  lakefill-log        the Delta log read, commit metadata, registry; journal/ (lease, lifecycle)
//!  lakefill-validate   spec, compare, row diff, key merge, checks, net rows, report, summary
//!  lakefill-table      config sink model settings adjustments partition protocol storage staged
//!                      rowhash resources types fastcast error run_id secrets time sqltext spill
//!                      failpoint
//! ```
//!
//! A run moves through `plan → stage → validate → publish`; the runner only sequences those
//! steps and keeps the journal current; after a commit, [`notify`] tells the table's sinks.
//! Composing runs (cascade) is a module above `run/` that plans and runs several.
//!
//! ```no_run
//! # async fn demo() -> lakefill::Result<()> {
//! let project = lakefill::Project::discover(std::path::Path::new("."))?;
//! let plan = lakefill::PlanBuilder::new(&project, "events", "2026-01-01", "2026-01-31").await?;
//! println!("{} partitions", plan.report().partitions.len());
//! let report = lakefill::BackfillBuilder::new(plan).await?;
//! assert!(report.published_version.is_some());
//! # Ok(()) }
//! ```

// The ground floor's modules, for this crate's public re-exports below.
use lakefill_log::{journal, metadata};
use lakefill_recompute::plan;
pub use lakefill_table::spill;
use lakefill_table::{
    config, error, model, partition, protocol, resources, rowhash, run_id, secrets, settings,
    storage, time,
};
use lakefill_validate as validate;

mod act;
mod adjust;
mod cascade;
mod cluster;
mod explain;
mod init;
mod notify;
mod publish;
mod report;
mod run;

pub use act::{Acted, Revert, RevertRequest, RunHooks, discard, publish, rendered_report};
pub use cascade::manage::{discard_cascade, is_cascade_id, publish_cascade, revert_cascade};
pub use cascade::run::{CascadeRunReport, CascadeRunner};
pub use cascade::{
    CascadeBuilder, CascadeEdge, CascadeNode, CascadePlan, CascadeReport, DEFAULT_MAX_EXPANSION,
};
pub use cluster::{Scheduler, run_executor, start_scheduler};
pub use config::{Defaults, EngineConfig, PROJECT_FILE, Project, TableConfig, is_secret_option};
pub use error::{Error, Result};
pub use explain::gc::{GcFile, GcReport, gc, parse_duration};
pub use explain::sql::sql_in_release;
pub use explain::{
    BlameReport, DiffReport, DiffTarget, FeedPartition, FeedReport, HistoryEntry, OutdatedRange,
    PartitionSpan, QueryResult, SourceChange, StaleRange, StaleReport, blame, change_feed, diff,
    history, sql, stale,
};
pub use init::{InitReport, init};
pub use journal::lifecycle::RunState;
pub use journal::{
    BatchBounds, BatchRecord, BatchVectors, Journal, PartitionChange, RunInputs, RunKind,
    RunOutcome, RunProgress, VectorCounts, VectorSummary,
};
pub use lakefill_table::adjustments::{
    AdjustmentCounts, CORRECTION, KIND_COLUMN, LINEAGE_COLUMNS, PublishMode, REASON_COLUMN,
    REVERSAL, RUN_ID_COLUMN,
};
pub use lakefill_table::failpoint::{CrashPhase, CrashPoint};
pub use lakefill_table::store::Store;
pub use lakefill_validate::feed::FeedCounts;
pub use metadata::{
    CheckSummary, CommitMetadata, CommittedPartition, EdgeMoves, ValidationSummary,
};
pub use model::{CheckSpec, Model, ModelHeader, SourceSpec, ValidateSpec};
pub use notify::{Delivery, EVENT_SCHEMA, EVENT_TYPES, Event, Sink, Window, notify};
pub use partition::{Layout, PartitionRange, TimeColumn, TimeEncoding};
pub use plan::{
    BackfillPlan, BatchPlan, DEFAULT_BATCH_PARTITIONS, DEFAULT_MAX_PARTITIONS, DownstreamModel,
    EdgePlan, PartitionState, PartitionTotals, PlanBuilder, PlanReport, SourcePlan,
};
pub use protocol::{AddedColumn, FeatureSupport, RowRule, TableProtocol};
pub use report::{
    CASCADE_REPORT_SCHEMA, CascadeDocument, NodeLine, REPORT_SCHEMA, Report, ReportFormat,
    cascade_report, render as render_report, render_cascade, report,
};
pub use resources::{ProgressEvent, ProgressSink, parse_size};
pub use rowhash::RowChecksum;
pub use run::manage::{RunSummary, discard_run, list_runs, publish_run};
pub use run::revert::{logical_revert_plan, revert_run, reverts_logically};
pub use run::{BackfillBuilder, DEFAULT_SAMPLE, Outcome, RunReport, Timings};
pub use run_id::RunId;
pub use secrets::{MASK, mask as mask_secrets};
pub use settings::{RunSettings, SettingFlags, default_memory_limit, parse_rate};
pub use storage::StorageOption;
pub use time::{Grain, NULL_LABEL, Period, WHOLE_LABEL};
pub use validate::{
    CheckResult, Comparison, ComparisonTotals, MeasureChange, PartitionComparison, Samples,
    ValidationReport,
};
