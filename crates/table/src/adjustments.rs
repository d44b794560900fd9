//! The vocabulary of publishing by adjustments (`publish = "adjustments"` in a model header):
//! how a run publishes ([`PublishMode`]), the lineage columns adjustment rows carry, and how
//! many rows of each kind a run appends. Computing, validating and appending adjustments is the
//! runner's (`lakefill::adjust`).

use serde::{Deserialize, Serialize};

/// The run that wrote an adjustment row.
pub const RUN_ID_COLUMN: &str = "_lakefill_run_id";
/// `reversal` or `correction`.
pub const KIND_COLUMN: &str = "_lakefill_kind";
/// Why the run corrected history.
pub const REASON_COLUMN: &str = "_lakefill_reason";
/// The lineage columns of adjustment rows, in the order they are added to a table.
pub const LINEAGE_COLUMNS: [&str; 3] = [RUN_ID_COLUMN, KIND_COLUMN, REASON_COLUMN];
/// The kind of a row that takes an old row back (its measures negated).
pub const REVERSAL: &str = "reversal";
/// The kind of a row that adds a new row.
pub const CORRECTION: &str = "correction";

/// How a run publishes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishMode {
    /// The range's files are replaced by the new rows (one overwrite commit).
    #[default]
    Rewrite,
    /// Adjustment rows are appended (one append commit; nothing is removed).
    Adjustments,
}

impl PublishMode {
    /// Parses `rewrite` or `adjustments`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "rewrite" => Some(Self::Rewrite),
            "adjustments" => Some(Self::Adjustments),
            _ => None,
        }
    }

    /// Whether this is the default (for `skip_serializing_if`).
    pub fn is_rewrite(&self) -> bool {
        *self == Self::Rewrite
    }
}

impl std::fmt::Display for PublishMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rewrite => "rewrite",
            Self::Adjustments => "adjustments",
        })
    }
}

/// How many adjustment rows a run appends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdjustmentCounts {
    /// Old rows taken back.
    pub reversals: u64,
    /// New rows added.
    pub corrections: u64,
}

/// Whether `name` is one of the lineage columns.
pub fn is_lineage(name: &str) -> bool {
    LINEAGE_COLUMNS.contains(&name)
}
