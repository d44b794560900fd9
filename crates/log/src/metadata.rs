//! What a lakefill commit records about its run (DESIGN §4.4): typed, so it is written and read
//! back by field, never by key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use lakefill_validate::summary::{CheckSummary, EdgeMoves, ValidationSummary};

/// The `lakefill` object of a commit's `commitInfo` (also written as `userMetadata` text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitMetadata {
    /// The run.
    pub run_id: String,
    /// The model.
    pub model: String,
    /// The model's version.
    pub model_version: String,
    /// SHA-256 of the model file.
    pub fingerprint: String,
    /// The version each source was read at.
    pub sources: BTreeMap<String, u64>,
    /// The range, first and last partition.
    pub range: (String, String),
    /// The version of the target the run read.
    #[serde(default)]
    pub read_version: u64,
    /// Why the run was made.
    #[serde(default)]
    pub reason: Option<String>,
    /// Old and new rows per partition.
    #[serde(default)]
    pub partitions: Vec<CommittedPartition>,
    /// Rows dropped on purpose for partitions outside the range.
    #[serde(default)]
    pub spill_dropped: u64,
    /// The validation verdict, in short.
    #[serde(default)]
    pub validation: Option<ValidationSummary>,
    /// The run this commit reverts, when it is a revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_of: Option<String>,
    /// The cascade the run is a node of, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade: Option<String>,
    /// When the run appended adjustment rows instead of rewriting the range: how many of each
    /// kind (the rows carry `_lakefill_run_id`, `_lakefill_kind`, `_lakefill_reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustments: Option<lakefill_table::adjustments::AdjustmentCounts>,
    /// When keys crossed the range's edges and the run was allowed to publish anyway
    /// (`--allow-edge-moves`): how many, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_moves: Option<EdgeMoves>,
    /// The rows of the range the run replaced, when not all (`--where`); every other row of the
    /// files it rewrote was carried over unchanged.
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub rows: Option<String>,
    /// With the table's change data feed on: the rows of each change type the commit's change
    /// data files hold (adds and removes of partitions without changes are `dataChange` false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_feed: Option<lakefill_validate::feed::FeedCounts>,
    /// With deletion vectors on the table: the partitions the commit cut by vectors (their old
    /// rows deleted in place, the new ones added), and those it rewrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_vectors: Option<crate::journal::VectorSummary>,
}

/// One partition of a commit's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommittedPartition {
    /// The partition's label.
    pub value: String,
    /// Rows before, when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
}
