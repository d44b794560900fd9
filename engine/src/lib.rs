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
//! ```no_run
//! # async fn demo() -> lakefill::Result<()> {
//! let project = lakefill::Project::discover(std::path::Path::new("."))?;
//! let plan = lakefill::PlanBuilder::new(&project, "events", "2026-01-01", "2026-01-31").await?;
//! println!("{} partitions", plan.report().partitions.len());
//! let report = lakefill::BackfillBuilder::new(plan).await?;
//! assert!(report.published_version.is_some());
//! # Ok(()) }
//! ```

mod backfill;
mod config;
mod error;
mod execute;
mod failpoint;
mod gc;
mod init;
mod inspect;
mod journal;
mod lease;
mod lifecycle;
mod log;
mod model;
mod partition;
mod plan;
mod protocol;
mod publish;
mod resources;
mod rowhash;
mod runs;
mod secrets;
mod sqltext;
mod staged;
mod storage;
mod throttle;
mod time;
mod validate;

pub use backfill::{BackfillBuilder, DEFAULT_SAMPLE, Outcome, PartitionChange, RunReport, Timings};
pub use config::{Defaults, PROJECT_FILE, Project, TableConfig, is_secret_option};
pub use error::{Error, Result};
pub use gc::{GcFile, GcReport, gc, parse_duration};
pub use init::{InitReport, init};
pub use inspect::{
    BlameReport, DiffReport, DiffTarget, HistoryEntry, QueryResult, blame, diff, history, sql,
};
pub use journal::{BatchBounds, BatchRecord, Journal};
pub use lifecycle::RunState;
pub use log::metadata::{CheckSummary, CommitMetadata, CommittedPartition, ValidationSummary};
pub use model::{CheckSpec, Model, ModelHeader, SourceSpec, ValidateSpec};
pub use partition::{Layout, PartitionRange, TimeColumn, TimeEncoding};
pub use plan::{
    BackfillPlan, BatchPlan, DEFAULT_BATCH_PARTITIONS, DEFAULT_MAX_PARTITIONS, DownstreamModel,
    PartitionState, PartitionTotals, PlanBuilder, PlanReport, SourcePlan,
};
pub use protocol::{FeatureSupport, RowRule, TableProtocol};
pub use resources::{ProgressEvent, ProgressSink, parse_size};
pub use rowhash::RowChecksum;
pub use runs::{RunSummary, discard_run, list_runs, publish_run};
pub use secrets::{MASK, mask as mask_secrets};
pub use storage::StorageOption;
pub use throttle::parse_rate;
pub use time::{Grain, NULL_LABEL, Period};
pub use validate::{
    CheckResult, Comparison, ComparisonTotals, MeasureChange, PartitionComparison, Samples,
    ValidationReport,
};
