//! The event of one published version (DESIGN §4.5): what changed, where, by how much, and how
//! to look and undo. Its JSON form is a contract, described by `schemas/event-v1.schema.json`
//! (checked against this type by a test) and versioned by [`EVENT_SCHEMA`].
//!
//! An event is derived from the commit alone (its `lakefill` metadata and timestamp) plus, when
//! the run's journal still describes that commit, the journal's comparison (measure sums and key
//! differences per partition). Deriving it again gives the same document, so it can be rebuilt
//! after a crash and deduplicated by its id.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use lakefill_log::CommitMetadata;
use lakefill_log::journal::Journal;
use lakefill_validate::ValidationReport;

/// The schema (and version) of the event document.
pub const EVENT_SCHEMA: &str = "lakefill.event/v1";

/// One published version, as consumers are told of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Always [`EVENT_SCHEMA`].
    pub schema: String,
    /// Stable id of the event: the same for every delivery of it (deduplicate by it).
    pub event_id: String,
    /// `backfill.published`, `backfill.reverted`, or `cascade.published` for a node of a
    /// cascade.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the commit was made (RFC 3339, from the commit).
    pub occurred_at: Option<String>,
    /// The table.
    pub table: EventTable,
    /// The version before the commit.
    pub version_before: u64,
    /// The version the commit created.
    pub version_after: u64,
    /// The run that made it.
    pub run_id: String,
    /// The model and version the run executed.
    pub model: EventModel,
    /// Why.
    pub reason: Option<String>,
    /// The range, first and last partition.
    pub range: EventRange,
    /// The `--where` predicate the run was scoped by (null when it replaced every row of the
    /// range).
    #[serde(default, rename = "where")]
    pub rows: Option<String>,
    /// The version each source was read at.
    pub sources: BTreeMap<String, u64>,
    /// The run this commit reverts, for `backfill.reverted`.
    pub revert_of: Option<String>,
    /// The cascade, for `cascade.published` (every node of it announces its own version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade: Option<String>,
    /// When the change was appended as adjustment rows (an append-only table): how many
    /// reversals and corrections; the rows and sums above are the table's net rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustments: Option<lakefill_table::adjustments::AdjustmentCounts>,
    /// With the table's change data feed on: the rows of each change type its commit's change
    /// data files hold (what a feed reader of the version reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_feed: Option<lakefill_validate::feed::FeedCounts>,
    /// Per partition: rows and measure sums before and after.
    pub partitions: Vec<EventPartition>,
    /// Rows before and after, and the difference, over the range.
    pub totals: EventTotals,
    /// Keys added, removed and changed over the range, when the run compared rows by key.
    pub key_diff: Option<KeyDiff>,
    /// The validation verdict, when the run was validated.
    pub validation: Option<EventValidation>,
    /// How to look at the change and how to undo it.
    pub commands: EventCommands,
}

/// The table of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventTable {
    /// Its name in the project.
    pub name: String,
    /// Its location, without credentials.
    pub uri: String,
}

/// The model of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventModel {
    /// The model.
    pub name: String,
    /// Its version.
    pub version: String,
    /// SHA-256 of the model file.
    pub fingerprint: String,
}

/// The range of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRange {
    /// First partition.
    pub from: String,
    /// Last partition.
    pub to: String,
}

/// One partition of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventPartition {
    /// The partition.
    pub partition: String,
    /// Rows before, when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// `new_rows - old_rows`, when both are known.
    pub row_delta: Option<i64>,
    /// Each measure's sum before and after, when the run computed them.
    pub measures: BTreeMap<String, MeasureSums>,
    /// Keys added, removed and changed in the partition, when compared by key.
    pub key_diff: Option<KeyDiff>,
}

/// A measure's sums.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasureSums {
    /// Before.
    pub old: f64,
    /// After.
    pub new: f64,
    /// `new - old`.
    pub delta: f64,
}

/// Totals over the range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventTotals {
    /// Rows before, when every partition's count is known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// The difference, when known.
    pub row_delta: Option<i64>,
    /// Rows that changed: keys added + removed + changed when compared by key, else the sum of
    /// the absolute row differences per partition.
    pub changed_rows: u64,
}

/// Key differences.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyDiff {
    /// Keys only in the new rows.
    pub added: u64,
    /// Keys only in the old rows.
    pub removed: u64,
    /// Keys in both with different values.
    pub changed: u64,
}

/// The validation of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventValidation {
    /// Whether every check passed.
    pub passed: bool,
    /// Whether a failed validation was overridden (`--force-publish`).
    pub forced: bool,
    /// Why it was overridden.
    pub force_reason: Option<String>,
    /// Each check.
    pub checks: Vec<EventCheck>,
}

/// One check of an event's validation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventCheck {
    /// The check.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// How many failures it found.
    pub failures: u64,
}

/// Commands a person runs to look at the change and to undo it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventCommands {
    /// Compares the versions before and after.
    pub diff: String,
    /// Undoes the change.
    pub revert: String,
}

impl Event {
    /// The event of the commit at `version` of table `name` (configured as `uri`, resolved to
    /// `url`), made by a lakefill run with `metadata`; `journal` adds the run's comparison when
    /// it describes this very commit.
    pub(crate) fn of_commit(
        name: &str,
        uri: &str,
        url: &str,
        version: u64,
        timestamp: Option<String>,
        metadata: &CommitMetadata,
        journal: Option<&Journal>,
    ) -> Self {
        let validation_report: Option<&ValidationReport> = journal
            .filter(|j| {
                j.outcome.published_version == Some(version) && j.run_id.as_str() == metadata.run_id
            })
            .and_then(|j| j.progress.validation.as_ref());
        let comparison = validation_report.map(|v| &v.comparison);
        let by_key = comparison.filter(|c| !c.key.is_empty());
        let partitions: Vec<EventPartition> = metadata
            .partitions
            .iter()
            .map(|p| {
                let compared =
                    comparison.and_then(|c| c.partitions.iter().find(|cp| cp.value == p.value));
                EventPartition {
                    partition: p.value.clone(),
                    old_rows: p.old_rows,
                    new_rows: p.new_rows,
                    row_delta: p.old_rows.map(|old| delta(old, p.new_rows)),
                    measures: compared
                        .map(|cp| {
                            cp.measures
                                .iter()
                                .map(|(m, c)| {
                                    (
                                        m.clone(),
                                        MeasureSums {
                                            old: c.old,
                                            new: c.new,
                                            delta: c.new - c.old,
                                        },
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    key_diff: by_key.and(compared).map(|cp| KeyDiff {
                        added: cp.added,
                        removed: cp.removed,
                        changed: cp.changed,
                    }),
                }
            })
            .collect();
        let old_rows = partitions.iter().map(|p| p.old_rows).sum::<Option<u64>>();
        let new_rows = partitions.iter().map(|p| p.new_rows).sum();
        let key_diff = by_key.map(|c| KeyDiff {
            added: c.totals.added,
            removed: c.totals.removed,
            changed: c.totals.changed,
        });
        let changed_rows = match &key_diff {
            Some(k) => k.added + k.removed + k.changed,
            None => partitions
                .iter()
                .map(|p| p.row_delta.unwrap_or(0).unsigned_abs())
                .sum(),
        };
        let version_before = version.saturating_sub(1);
        Self {
            schema: EVENT_SCHEMA.to_string(),
            event_id: event_id(url, version, &metadata.run_id),
            kind: if metadata.revert_of.is_some() {
                "backfill.reverted"
            } else if metadata.cascade.is_some() {
                "cascade.published"
            } else {
                "backfill.published"
            }
            .to_string(),
            occurred_at: timestamp,
            table: EventTable {
                name: name.to_string(),
                uri: lakefill_table::secrets::mask(uri),
            },
            version_before,
            version_after: version,
            run_id: metadata.run_id.clone(),
            model: EventModel {
                name: metadata.model.clone(),
                version: metadata.model_version.clone(),
                fingerprint: metadata.fingerprint.clone(),
            },
            reason: metadata.reason.clone(),
            range: EventRange {
                from: metadata.range.0.clone(),
                to: metadata.range.1.clone(),
            },
            rows: metadata.rows.clone(),
            sources: metadata.sources.clone(),
            revert_of: metadata.revert_of.clone(),
            cascade: metadata
                .revert_of
                .is_none()
                .then(|| metadata.cascade.clone())
                .flatten(),
            adjustments: metadata.adjustments,
            change_feed: metadata.change_feed,
            totals: EventTotals {
                old_rows,
                new_rows,
                row_delta: old_rows.map(|old| delta(old, new_rows)),
                changed_rows,
            },
            partitions,
            key_diff,
            validation: metadata.validation.as_ref().map(|v| EventValidation {
                passed: v.passed,
                forced: v.forced,
                force_reason: v.force_reason.clone(),
                checks: v
                    .checks
                    .iter()
                    .map(|c| EventCheck {
                        name: c.name.clone(),
                        passed: c.passed,
                        failures: c.failures as u64,
                    })
                    .collect(),
            }),
            commands: EventCommands {
                diff: format!(
                    "lakefill diff {name} --from-version {version_before} --to-version {version}"
                ),
                revert: format!("lakefill revert {}", metadata.run_id),
            },
        }
    }

    /// The rows the event says changed (changed plus added plus removed rows).
    pub fn changed_rows(&self) -> u64 {
        self.totals.changed_rows
    }
}

fn delta(old: u64, new: u64) -> i64 {
    i64::try_from(new).unwrap_or(i64::MAX) - i64::try_from(old).unwrap_or(i64::MAX)
}

/// The id of the event of `run_id`'s commit at `version` of the table at `url`.
fn event_id(url: &str, version: u64, run_id: &str) -> String {
    let digest = hex::encode(Sha256::digest(format!("{url}\n{version}\n{run_id}")));
    digest[..32].to_string()
}
