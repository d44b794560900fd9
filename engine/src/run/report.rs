//! What a backfill, publish or discard did (DESIGN §3 JSON contract).

use serde::Deserialize;
use serde::Serialize;

use lakefill_log::journal::Journal;
use lakefill_log::journal::PartitionChange;
use lakefill_log::journal::RunState;
use lakefill_recompute::plan::BackfillPlan;
use lakefill_table::error::Error;
use lakefill_table::partition::PartitionRange;
use lakefill_validate::ValidationReport;

/// What a backfill or publish did (DESIGN §3 JSON contract). It reads back from its own JSON
/// document, so a caller (or a test) can hold it typed.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// The `--where` predicate the run is scoped by (null when it replaces every row of the
    /// range).
    #[serde(default, rename = "where")]
    pub rows: Option<String>,
    /// Per partition: old and new row counts.
    pub partitions: Vec<PartitionChange>,
    /// Rows staged (new rows and carried rows).
    pub rows_written: u64,
    /// Of those, the rows of the rewritten files outside the run's scope, carried over
    /// unchanged (by rows, or with `--where`).
    #[serde(default)]
    pub rows_carried: u64,
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
    /// The run this one reverts, when it is a revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_of: Option<String>,
    /// With adjustments (`publish = "adjustments"`): how many reversal and correction rows it
    /// appends (`files_written`/`bytes_written` count them, `rows_written` the new rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustments: Option<lakefill_table::adjustments::AdjustmentCounts>,
    /// With the target's change data feed on: the rows of each change type written to its
    /// change data files (what a feed reader of the published version reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_feed: Option<lakefill_validate::feed::FeedCounts>,
    /// With deletion vectors on the table: the partitions published by vectors and those
    /// rewritten (see the commit metadata's `deletion_vectors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_vectors: Option<lakefill_log::journal::VectorSummary>,
    /// What each notification sink of the table was told (absent without sinks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<crate::notify::Delivery>,
    /// What the caller should know beyond the numbers (e.g. the tables a revert leaves as they
    /// are, computed from the rows it took out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
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
    /// A revert was committed: the run's range is as it was before the run.
    Reverted,
    /// The run had been reverted before; nothing changed.
    AlreadyReverted,
}

/// Wall time per phase, in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Timings {
    /// Running the model and writing staged files.
    pub stage_ms: u64,
    /// Comparing old and new and running the checks.
    pub validate_ms: u64,
    /// The commit.
    pub publish_ms: u64,
    /// The whole run.
    pub total_ms: u64,
    /// The edge check: reading the keys around the range and, when some cross, widening it
    /// (part of `validate_ms`).
    #[serde(default)]
    pub edges_ms: u64,
    /// Computing and writing the change data feed (part of `publish_ms`).
    #[serde(default)]
    pub feed_ms: u64,
}

impl RunReport {
    /// Builds the report of a run from its journal.
    pub(crate) fn from_journal(journal: &Journal, outcome: Outcome, timings: Timings) -> Self {
        let files = || journal.published_files();
        Self {
            run_id: journal.run_id.to_string(),
            state: journal.progress.state,
            outcome,
            table: journal.inputs.target.clone(),
            model: journal.inputs.model.clone(),
            model_version: journal.inputs.model_version.clone(),
            fingerprint: journal.inputs.fingerprint.clone(),
            read_version: journal.inputs.read_version,
            published_version: journal.outcome.published_version,
            range: journal.inputs.range.clone(),
            rows: journal.inputs.range.rows.as_ref().map(|r| r.sql.clone()),
            partitions: journal.progress.partitions.clone(),
            rows_written: journal
                .progress
                .batches
                .iter()
                .flat_map(|b| b.rows.values())
                .sum(),
            rows_carried: journal
                .progress
                .batches
                .iter()
                .filter_map(|b| b.rows.get(lakefill_table::time::CARRIED_LABEL))
                .sum(),
            files_written: files().count() as u64,
            bytes_written: files().map(|a| u64::try_from(a.size).unwrap_or(0)).sum(),
            spill_dropped: journal.progress.spill_dropped,
            resumed_batches: 0,
            validation: journal.progress.validation.clone(),
            forced: journal.outcome.forced.clone(),
            timings,
            revert_of: journal.inputs.kind.revert_of().map(ToString::to_string),
            adjustments: journal.progress.adjustment_counts,
            change_feed: journal.progress.change_feed.as_ref().map(|f| f.counts),
            deletion_vectors: journal.vector_summary(),
            notifications: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub(crate) fn already_published(plan: &BackfillPlan, journal: Option<&Journal>) -> Self {
        if let Some(journal) = journal {
            return Self::from_journal(journal, Outcome::AlreadyPublished, Timings::default());
        }
        let report = &plan.report;
        Self {
            run_id: report.run_id.to_string(),
            state: RunState::Published,
            outcome: Outcome::AlreadyPublished,
            table: report.target.clone(),
            model: report.model.clone(),
            model_version: report.model_version.clone(),
            fingerprint: report.fingerprint.clone(),
            read_version: report.read_version,
            published_version: None,
            range: report.range.clone(),
            rows: report.rows.clone(),
            partitions: Vec::new(),
            rows_written: 0,
            rows_carried: 0,
            files_written: 0,
            bytes_written: 0,
            spill_dropped: 0,
            resumed_batches: 0,
            validation: None,
            forced: None,
            timings: Timings::default(),
            revert_of: plan.kind.revert_of().map(ToString::to_string),
            adjustments: None,
            change_feed: None,
            deletion_vectors: None,
            notifications: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Returns the names of failed validation checks.
    pub fn failed_checks(&self) -> Vec<String> {
        self.validation
            .as_ref()
            .map(ValidationReport::failed)
            .unwrap_or_default()
    }

    /// The error a run that failed validation ends with (exit code 3), the same whether the
    /// backfill or a later publish found it; `None` for any other outcome.
    pub fn validation_error(&self) -> Option<Error> {
        (self.outcome == Outcome::ValidationFailed).then(|| Error::ValidationFailed {
            run_id: self.run_id.clone(),
            forceable: self
                .validation
                .as_ref()
                .is_none_or(|v| v.protocol_violations().is_empty()),
            failed: self.failed_checks(),
            clean_range: self
                .validation
                .as_ref()
                .and_then(ValidationReport::clean_range)
                .map(|(from, to)| {
                    format!("lakefill backfill {} --from {from} --to {to}", self.model)
                }),
        })
    }
}
