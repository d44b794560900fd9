//! The run journal: `_lakefill/runs/<run_id>.json` under the target's root (DESIGN §4.2).
//!
//! The journal lives in the table's own object store, so a run can be inspected, published or
//! resumed from any machine that can reach the table. It records the run's inputs, its state,
//! and each finished batch with the files it staged. Deciding what to do with a journal is left
//! to the callers.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::ObjectStore;
use deltalake::Path;
use deltalake::kernel::Add;
use deltalake::logstore::object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::partition::PartitionRange;

/// Journal format written by this version of lakefill.
pub(crate) const JOURNAL_FORMAT: u32 = 1;

/// Directory of run journals under a table's root.
pub(crate) const RUNS_DIR: &str = "_lakefill/runs";

/// The life cycle of a run (DESIGN §3, `lakefill runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    /// Planned, nothing staged yet.
    Planned,
    /// Staging batches.
    Staging,
    /// Every batch staged; not published.
    Staged,
    /// Validation failed; nothing published.
    FailedValidation,
    /// Committed to the target.
    Published,
    /// Staged files deleted on request.
    Discarded,
    /// Stopped by an error; nothing published.
    Failed,
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            RunState::Planned => "planned",
            RunState::Staging => "staging",
            RunState::Staged => "staged",
            RunState::FailedValidation => "failed-validation",
            RunState::Published => "published",
            RunState::Discarded => "discarded",
            RunState::Failed => "failed",
        };
        f.write_str(text)
    }
}

/// Everything a run has recorded about itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Journal {
    /// Format of this document.
    pub format: u32,
    /// The run id.
    pub run_id: String,
    /// Current state.
    pub state: RunState,
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// Model fingerprint.
    pub fingerprint: String,
    /// Target table name.
    pub target: String,
    /// The target's partition column.
    pub partition_column: String,
    /// Version of the target the run read.
    pub read_version: u64,
    /// The range.
    pub range: PartitionRange,
    /// Pinned source versions.
    pub sources: BTreeMap<String, u64>,
    /// Reason given for the run.
    pub reason: Option<String>,
    /// Finished batches.
    pub batches: Vec<BatchRecord>,
    /// Per partition: old and new row counts, once staged.
    #[serde(default)]
    pub partitions: Vec<crate::backfill::PartitionChange>,
    /// Rows for partitions outside the range that were dropped on purpose.
    #[serde(default)]
    pub spill_dropped: u64,
    /// The validation report, once validated.
    #[serde(default)]
    pub validation: Option<serde_json::Value>,
    /// The reason given to publish despite failed validation.
    #[serde(default)]
    pub forced: Option<String>,
    /// The version the run's commit created.
    pub published_version: Option<u64>,
    /// Which publish of this run id this is: 1, or more when the run is re-applied after later
    /// commits changed its range. It is the version of the commit's application transaction.
    #[serde(default = "first_sequence")]
    pub sequence: u64,
    /// The error that stopped the run, if any.
    pub error: Option<String>,
    /// When the run was created (RFC 3339).
    pub created_at: String,
    /// When the journal was last written (RFC 3339).
    pub updated_at: String,
}

/// One finished batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchRecord {
    /// Position in the run.
    pub index: usize,
    /// First partition.
    pub start: String,
    /// Last partition.
    pub end: String,
    /// Files staged, as the `add` actions that will publish them.
    pub files: Vec<Add>,
    /// Rows staged per partition.
    pub rows: BTreeMap<String, u64>,
    /// Rows produced for partitions outside the range, per partition.
    pub spill: BTreeMap<String, u64>,
    /// Sums of the model's measures per partition, computed while writing.
    #[serde(default)]
    pub sums: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Journal {
    fn path(run_id: &str) -> Path {
        Path::from(format!("{RUNS_DIR}/{run_id}.json"))
    }

    /// Writes the journal into the table's store, replacing the previous copy.
    pub(crate) async fn save(&mut self, store: &Arc<dyn ObjectStore>) -> Result<()> {
        self.updated_at = now();
        let path = Self::path(&self.run_id);
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::Journal {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|source| Error::Storage {
                path: path.to_string(),
                source,
            })?;
        Ok(())
    }

    /// Reads the journal of `run_id`, if there is one.
    pub(crate) async fn load(store: &Arc<dyn ObjectStore>, run_id: &str) -> Result<Option<Self>> {
        let path = Self::path(run_id);
        let bytes = match store.get(&path).await {
            Ok(result) => result.bytes().await.map_err(|source| Error::Storage {
                path: path.to_string(),
                source,
            })?,
            Err(deltalake::ObjectStoreError::NotFound { .. }) => return Ok(None),
            Err(source) => {
                return Err(Error::Storage {
                    path: path.to_string(),
                    source,
                });
            }
        };
        let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| Error::Journal {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        if journal.format > JOURNAL_FORMAT {
            return Err(Error::Journal {
                path: path.to_string(),
                message: format!(
                    "written by a newer lakefill (format {}, this one reads {JOURNAL_FORMAT})",
                    journal.format
                ),
            });
        }
        Ok(Some(journal))
    }

    /// Returns whether validation ran and passed.
    pub fn validation_passed(&self) -> Option<bool> {
        self.validation.as_ref().and_then(|v| v["passed"].as_bool())
    }

    /// Lists the journals under a table's root, newest first.
    pub(crate) async fn list(store: &Arc<dyn ObjectStore>) -> Result<Vec<Self>> {
        use futures::TryStreamExt;
        let prefix = Path::from(RUNS_DIR);
        let objects: Vec<_> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|source| Error::Storage {
                path: prefix.to_string(),
                source,
            })?;
        let mut journals = Vec::new();
        for object in objects {
            let Some(name) = object.location.filename() else {
                continue;
            };
            let Some(run_id) = name.strip_suffix(".json") else {
                continue;
            };
            if let Some(journal) = Self::load(store, run_id).await? {
                journals.push(journal);
            }
        }
        journals.sort_by(|a, b| b.created_at.cmp(&a.created_at));
        Ok(journals)
    }

    /// Returns every staged file of the run.
    pub(crate) fn staged_files(&self) -> impl Iterator<Item = &Add> {
        self.batches.iter().flat_map(|b| b.files.iter())
    }
}

fn first_sequence() -> u64 {
    1
}

/// The current time in RFC 3339, UTC.
pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
