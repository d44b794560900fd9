//! The outcome of validation, typed: kept in the journal, summarised into the commit.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::spec::Comparison;

/// The outcome of validation, saved with the run and summarised into the commit.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ValidationReport {
    /// Whether every check passed.
    pub passed: bool,
    /// Each check with its outcome.
    pub checks: Vec<CheckResult>,
    /// The old-versus-new comparison the checks ran on.
    pub comparison: Comparison,
    /// Wall time of validation.
    pub elapsed_ms: u64,
    /// Wall time of the edge check (reading around the range, and widening it), part of
    /// validation's.
    #[serde(default)]
    pub edges_ms: u64,
    /// What a reader of the report should know beyond the checks (e.g. floating-point noise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One check and its outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckResult {
    /// Name of the check.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// What failed, with the partition and the numbers.
    pub failures: Vec<Value>,
    /// Example offending rows.
    pub sample: Vec<Value>,
    /// Whether the check comes from the table's protocol: its failure cannot be forced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub protocol: bool,
}

impl CheckResult {
    /// A check named `name` with its failures and a sample of them.
    pub fn new(name: impl Into<String>, failures: Vec<Value>, sample: Vec<Value>) -> Self {
        Self {
            name: name.into(),
            passed: failures.is_empty(),
            failures,
            sample,
            protocol: false,
        }
    }
}

impl ValidationReport {
    /// Returns the compact form written into commit metadata.
    pub fn summary(&self) -> crate::summary::ValidationSummary {
        crate::summary::ValidationSummary {
            passed: self.passed,
            checks: self
                .checks
                .iter()
                .map(|c| crate::summary::CheckSummary {
                    name: c.name.clone(),
                    passed: c.passed,
                    failures: c.failures.len(),
                })
                .collect(),
            totals: json!({
                "old_rows": self.comparison.totals.old_rows,
                "new_rows": self.comparison.totals.new_rows,
                "added": self.comparison.totals.added,
                "removed": self.comparison.totals.removed,
                "changed": self.comparison.totals.changed,
                "measures": self.comparison.totals.measures,
            }),
            identical: self.comparison.identical,
            forced: false,
            force_reason: None,
        }
    }

    /// Returns the names of the failed checks that come from the table's protocol.
    pub fn protocol_violations(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.passed && c.protocol)
            .map(|c| c.name.clone())
            .collect()
    }

    /// Returns the range no key crosses (first and last partition), when the edge check failed
    /// and found one (the edge check).
    pub fn clean_range(&self) -> Option<(String, String)> {
        let check = self
            .checks
            .iter()
            .find(|c| !c.passed && c.name == super::edges::EDGE_CHECK)?;
        let found = check
            .failures
            .iter()
            .find(|f| f["complete"].as_bool() == Some(true))?;
        Some((
            found["suggested_from"].as_str()?.to_string(),
            found["suggested_to"].as_str()?.to_string(),
        ))
    }

    /// Returns the keys that crossed the range's edges (and those of its `--where` predicate)
    /// when the run was allowed to publish them (`--allow-edge-moves`), with the reason.
    pub fn allowed_edge_moves(&self) -> Option<crate::summary::EdgeMoves> {
        let failures: Vec<&serde_json::Value> = self
            .checks
            .iter()
            .filter(|c| {
                c.name == super::edges::EDGE_CHECK || c.name == super::edges::SCOPE_EDGE_CHECK
            })
            .flat_map(|c| &c.failures)
            .collect();
        let reason = failures
            .iter()
            .find(|f| f["allowed"].as_bool() == Some(true))?["reason"]
            .as_str()?
            .to_string();
        let sum = |fields: [&str; 2]| {
            failures
                .iter()
                .flat_map(|f| fields.map(|field| f[field].as_u64().unwrap_or(0)))
                .sum::<u64>()
        };
        Some(crate::summary::EdgeMoves {
            duplicated: sum(["duplicated", "moved_in"]),
            moved: sum(["moved", "moved_out"]),
            reason,
        })
    }

    /// Returns the names of the failed checks.
    pub fn failed(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.clone())
            .collect()
    }
}
