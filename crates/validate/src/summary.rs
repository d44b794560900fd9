//! What a commit records of a run's validation: the summary of its report, and the keys it was
//! allowed to move across its range's edges. The commit metadata (`lakefill-log`) carries these.

use serde::{Deserialize, Serialize};

/// Keys that crossed a run's range edges, published on purpose (`--allow-edge-moves`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeMoves {
    /// Keys written into the range that the table still holds outside it.
    pub duplicated: u64,
    /// Keys removed from the range that the model writes outside it.
    pub moved: u64,
    /// Why they were allowed.
    pub reason: String,
}

/// The validation of a run, as its commit records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ValidationSummary {
    /// Whether every check passed.
    pub passed: bool,
    /// Each check: name, verdict and how many failures.
    #[serde(default)]
    pub checks: Vec<CheckSummary>,
    /// Totals of the comparison.
    #[serde(default)]
    pub totals: serde_json::Value,
    /// Whether the staged rows equalled the old ones.
    #[serde(default)]
    pub identical: Option<bool>,
    /// Whether a failed validation was overridden.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    /// Why it was overridden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_reason: Option<String>,
}

/// One check in a commit's validation summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckSummary {
    /// The check.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// How many failures it found.
    pub failures: usize,
}
