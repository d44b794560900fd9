//! The run journal: `_lakefill/runs/<run_id>.json` under the target's root (DESIGN §4.2).
//!
//! The journal lives in the table's own object store, so a run can be inspected, published or
//! resumed from any machine that can reach the table. It records the run's inputs, its state,
//! the batches it planned and each finished batch with the files it staged. It is a cache: the
//! Delta log is the truth about whether a run was published (see `run::manage`).
//!
//! A journal is checked when it is loaded: its format, its run id, and every staged path, which
//! must lie in the run's own staging directory of an in-range partition. A journal that fails
//! is an error naming it; nothing is published or deleted on its word. Only the holder of the
//! run's lease writes it ([`crate::journal::lease`]).

pub mod cascade;
pub mod lease;
pub mod lifecycle;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deltalake::ObjectStore;
use deltalake::Path;
use deltalake::kernel::Add;
use deltalake::logstore::object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::journal::lease::RunLease;
pub use crate::journal::lifecycle::RunState;
use lakefill_table::adjustments::{AdjustmentCounts, PublishMode};
use lakefill_table::error::{Error, Result};
use lakefill_table::partition::{Layout, PartitionRange, PartitionValues};
use lakefill_table::rowhash::RowChecksum;
use lakefill_table::run_id::{RUNS_DIR, RunId};
use lakefill_validate::ValidationReport;

/// Writes one journal, after every earlier write of it in this process has finished, and to its
/// end even if the caller stops waiting.
///
/// A run that is interrupted drops its staging future, and with it a journal write that may
/// already be on its way to the store; the write recording where the run stopped follows at
/// once. Were the first not finished, the store could apply it last (seen on Azurite under load:
/// an interrupted run listed as still staging). So each write runs in a task of its own that
/// holds the journal's turn until the store has answered.
async fn put_in_order(store: &Arc<dyn ObjectStore>, path: Path, bytes: Vec<u8>) -> Result<()> {
    type Turns = std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>;
    static TURNS: std::sync::LazyLock<std::sync::Mutex<Turns>> =
        std::sync::LazyLock::new(Default::default);
    let turn = Arc::clone(
        TURNS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(path.to_string())
            .or_default(),
    );
    let held = turn.lock_owned().await;
    let store = Arc::clone(store);
    let target = path.clone();
    let write = tokio::spawn(async move {
        let _held = held;
        store.put(&target, PutPayload::from(bytes)).await
    });
    match write.await {
        Ok(written) => written.map(|_| ()).map_err(|source| Error::Storage {
            path: path.to_string(),
            source,
        }),
        Err(e) => Err(Error::Internal(format!(
            "the write of journal `{path}` did not finish: {e}"
        ))),
    }
}

/// Journal format written by this version of lakefill.
pub const JOURNAL_FORMAT: u32 = 2;

/// Everything a run has recorded about itself: what it was asked ([`RunInputs`]), how far it
/// got ([`RunProgress`]) and how it ended ([`RunOutcome`]). On disk the three are one flat
/// JSON object, as they always were.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Journal {
    /// Format of this document.
    pub format: u32,
    /// The run id.
    pub run_id: RunId,
    /// What the run was asked: model, target, range, sources, kind, how it publishes.
    #[serde(flatten)]
    pub inputs: RunInputs,
    /// How far it got: its state, the batches staged, validation.
    #[serde(flatten)]
    pub progress: RunProgress,
    /// How it ended: the version it published, or the error that stopped it.
    #[serde(flatten)]
    pub outcome: RunOutcome,
}

/// What a run was asked, fixed when it starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInputs {
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// Model fingerprint.
    pub fingerprint: String,
    /// Target table name.
    pub target: String,
    /// How the target is partitioned (its partition columns and time column).
    #[serde(default = "Layout::unknown")]
    pub layout: Layout,
    /// The partition column, as format 1 recorded it (read only to upgrade).
    #[serde(default, skip_serializing)]
    pub partition_column: Option<String>,
    /// Version of the target the run read.
    pub read_version: u64,
    /// The range.
    pub range: PartitionRange,
    /// Pinned source versions.
    pub sources: BTreeMap<String, u64>,
    /// Sources that are the target itself (read at the read version, not pinned).
    #[serde(default)]
    pub self_sources: Vec<String>,
    /// `drop` when rows outside the range are dropped on purpose.
    #[serde(default)]
    pub allow_spill: Option<String>,
    /// Reason given for the run.
    pub reason: Option<String>,
    /// Nullable columns the publish adds to the table's schema.
    #[serde(default)]
    pub added_columns: Vec<lakefill_table::protocol::AddedColumn>,
    /// By rows (`range_column`): the files the publish removes (their other rows are carried
    /// into the staged files).
    #[serde(default)]
    pub affected_files: Vec<String>,
    /// Every batch of the plan; the run is complete when each has a finished record.
    #[serde(default)]
    pub planned_batches: Vec<BatchBounds>,
    /// The command that resumes the run when it is not its own backfill command (a node of a
    /// cascade is resumed by the cascade's command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
    /// How the run publishes (`adjustments`: the files of [`RunProgress::adjustments`] are
    /// appended, and the staged new rows serve validation only).
    #[serde(default, skip_serializing_if = "PublishMode::is_rewrite")]
    pub publish_as: PublishMode,
    /// When the adjustments go to a companion (the run's table): the table they correct and
    /// the version of it the run read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjusts: Option<(String, u64)>,
    /// What kind of run it is: a backfill, a node of a cascade, or a revert.
    #[serde(flatten)]
    pub kind: RunKind,
    /// When the run was created (RFC 3339).
    pub created_at: String,
}

/// How far a run got.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunProgress {
    /// Current state.
    pub state: RunState,
    /// Finished batches.
    pub batches: Vec<BatchRecord>,
    /// Per partition: old and new row counts, once staged.
    #[serde(default)]
    pub partitions: Vec<PartitionChange>,
    /// Rows for partitions outside the range that were dropped on purpose.
    #[serde(default)]
    pub spill_dropped: u64,
    /// The validation report, once validated.
    #[serde(default)]
    pub validation: Option<ValidationReport>,
    /// Digest of the staged files validation ran on; publish refuses any other set.
    #[serde(default)]
    pub validated_files: Option<String>,
    /// Each staged file as the store described it when validation ended (its ETag: a content
    /// hash on S3, the inode, time and size on local disk): publish refuses a file that changed
    /// since (#33).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub validated_stamps: BTreeMap<String, Option<String>>,
    /// With adjustments: the reversal and correction rows, staged per batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adjustments: Vec<BatchRecord>,
    /// With adjustments: how many of each kind, once staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustment_counts: Option<AdjustmentCounts>,
    /// With the target's change data feed on: the feed's files and counts, once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_feed: Option<ChangeFeed>,
    /// When the journal was last written (RFC 3339).
    pub updated_at: String,
}

impl RunProgress {
    /// The progress of a run that starts in `state` at `now`: nothing staged or validated.
    pub fn starting(state: RunState, now: String) -> Self {
        Self {
            state,
            batches: Vec::new(),
            partitions: Vec::new(),
            spill_dropped: 0,
            validation: None,
            validated_files: None,
            validated_stamps: BTreeMap::new(),
            adjustments: Vec::new(),
            adjustment_counts: None,
            change_feed: None,
            updated_at: now,
        }
    }
}

/// A run's change data feed: the rows that differ between the old and new sides, in change data
/// files of the run's own directory under `_change_data/`, which its commit adds as `cdc` actions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChangeFeed {
    /// The files, with partition values keyed by logical name.
    pub files: Vec<deltalake::kernel::AddCDCFile>,
    /// Rows of each change type.
    pub counts: lakefill_validate::feed::FeedCounts,
    /// How long computing and writing it took.
    #[serde(default)]
    pub elapsed_ms: u64,
}

/// How a run ended (or, while it runs, what it will publish as).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunOutcome {
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
}

/// What kind of run a journal records. On disk it is the fields `revert_of`, `revert_logical`
/// and `cascade`, as journals have always had them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "KindFields", into = "KindFields")]
pub enum RunKind {
    /// A backfill of its own.
    #[default]
    Backfill,
    /// A node of a cascade.
    CascadeNode {
        /// The cascade.
        cascade: String,
    },
    /// A revert that puts back the files a run replaced (`lakefill revert`).
    Revert {
        /// The run it reverts.
        of: RunId,
    },
    /// A revert that recomputes the range as it was (`revert --logical`): it stages files and
    /// is published like any run.
    LogicalRevert {
        /// The run it reverts.
        of: RunId,
    },
}

impl RunKind {
    /// The run this one reverts, when it is a revert.
    pub fn revert_of(&self) -> Option<&RunId> {
        match self {
            RunKind::Revert { of } | RunKind::LogicalRevert { of } => Some(of),
            RunKind::Backfill | RunKind::CascadeNode { .. } => None,
        }
    }

    /// The cascade the run is a node of.
    pub fn cascade(&self) -> Option<&str> {
        match self {
            RunKind::CascadeNode { cascade } => Some(cascade),
            _ => None,
        }
    }

    /// Whether the run is a revert by files: published by `lakefill revert` alone, never staged.
    pub fn reverts_files(&self) -> bool {
        matches!(self, RunKind::Revert { .. })
    }

    /// Whether the run is a logical revert.
    pub fn is_logical_revert(&self) -> bool {
        matches!(self, RunKind::LogicalRevert { .. })
    }
}

/// [`RunKind`] as journals keep it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct KindFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revert_of: Option<RunId>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    revert_logical: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cascade: Option<String>,
}

impl From<KindFields> for RunKind {
    fn from(fields: KindFields) -> Self {
        match (fields.revert_of, fields.revert_logical, fields.cascade) {
            (Some(of), true, _) => RunKind::LogicalRevert { of },
            (Some(of), false, _) => RunKind::Revert { of },
            (None, _, Some(cascade)) => RunKind::CascadeNode { cascade },
            (None, _, None) => RunKind::Backfill,
        }
    }
}

impl From<RunKind> for KindFields {
    fn from(kind: RunKind) -> Self {
        match kind {
            RunKind::Backfill => KindFields::default(),
            RunKind::CascadeNode { cascade } => KindFields {
                cascade: Some(cascade),
                ..KindFields::default()
            },
            RunKind::Revert { of } => KindFields {
                revert_of: Some(of),
                ..KindFields::default()
            },
            RunKind::LogicalRevert { of } => KindFields {
                revert_of: Some(of),
                revert_logical: true,
                ..KindFields::default()
            },
        }
    }
}

/// The bounds of one planned batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchBounds {
    /// Position in the run.
    pub index: usize,
    /// First partition.
    pub start: String,
    /// Last partition.
    pub end: String,
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
    /// Checksums of the staged rows per partition, computed while writing.
    #[serde(default)]
    pub checksums: BTreeMap<String, RowChecksum>,
    /// Staged on a cluster: each process that ran a writer task (`pid N@HOST`), with the files
    /// it wrote (0 where its tasks' hash partitions held no rows).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub writers: BTreeMap<String, u64>,
    /// The batch's partitions whose fix is published by deletion vectors, if the target takes
    /// them: their `files` hold only the rows the old files lack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vectors: Option<BatchVectors>,
}

/// How a batch publishes its fix by deletion vectors: the old rows the fix removes are marked
/// deleted in their files, the rows it adds are staged as new files, the rest stay where they
/// are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchVectors {
    /// Every file of the partitions published by vectors, as the table keeps it once published
    /// (partition values by logical name): with its new deletion vector when the fix deletes
    /// rows of it (its path is in `cut`), else as the log has it.
    pub kept: Vec<Add>,
    /// The paths of the kept files the fix deletes rows of.
    pub cut: BTreeSet<String>,
    /// The deletion vector files written, relative to the table's root.
    pub vector_files: Vec<String>,
    /// Per partition published by vectors: its rows deleted and added.
    pub partitions: BTreeMap<String, VectorCounts>,
    /// Per partition the target would take by vectors but whose fix changes too many of its
    /// rows: rewritten, with the counts that decided it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rewritten: BTreeMap<String, VectorCounts>,
    /// The partitions the target would take by vectors whose old files cannot be cut (a column
    /// of an old file is not of the table's type, as Spark's INT96 timestamps, or more live rows
    /// than matching may hold in memory): rewritten whole.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub uncut: BTreeSet<String>,
    /// Those of `uncut` not read because their live rows are more than matching may hold in
    /// memory (the others have a column of another type).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub too_large: BTreeSet<String>,
}

/// How a run published by deletion vectors, as its report and commit metadata say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VectorSummary {
    /// The partitions published by vectors: rows deleted in their old files, rows added.
    pub partitions: BTreeMap<String, VectorCounts>,
    /// The partitions rewritten because the fix changes too much of them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rewritten: BTreeMap<String, VectorCounts>,
    /// The partitions rewritten because their old files cannot be cut (see
    /// [`BatchVectors::uncut`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub uncut: BTreeSet<String>,
    /// Those of `uncut` too large to match in memory ([`BatchVectors::too_large`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub too_large: BTreeSet<String>,
    /// Old files given a deletion vector (not rewritten).
    pub files_cut: usize,
}

/// What a fix changes in one partition, as deletion vectors count it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorCounts {
    /// Old rows deleted (not among the new rows).
    pub deleted: u64,
    /// New rows added (not among the old rows).
    pub added: u64,
    /// New rows in all.
    pub rows: u64,
}

impl Journal {
    /// The record of the model version this run published.
    pub fn model_record(&self) -> crate::registry::ModelRecord {
        crate::registry::ModelRecord {
            model: self.inputs.model.clone(),
            version: self.inputs.model_version.clone(),
            fingerprint: self.inputs.fingerprint.clone(),
            run_id: self.run_id.to_string(),
            published_version: self.outcome.published_version,
        }
    }

    /// Writes the journal into the table's store, replacing the previous copy. Only the holder
    /// of the run's lease may.
    pub async fn save(&mut self, store: &Arc<dyn ObjectStore>, lease: &RunLease) -> Result<()> {
        if lease.run_id() != &self.run_id {
            return Err(Error::Internal(format!(
                "the lease of `{}` cannot write the journal of `{}`",
                lease.run_id(),
                self.run_id
            )));
        }
        lease.check()?;
        self.progress.updated_at = lakefill_table::time::now();
        let path = self.run_id.journal_path();
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Journal {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        // Error messages may quote a location with credentials: never store a secret.
        let bytes = lakefill_table::secrets::mask(&text).into_bytes();
        put_in_order(store, path, bytes).await
    }

    /// Moves the run to `next`, if the life cycle allows it (see [`crate::journal::lifecycle`]).
    pub fn transition(&mut self, next: RunState) -> Result<()> {
        self.progress.state.check_transition(next, &self.run_id)?;
        self.progress.state = next;
        Ok(())
    }

    /// Reads and checks the journal of `run_id`, if there is one.
    pub async fn load(store: &Arc<dyn ObjectStore>, run_id: &RunId) -> Result<Option<Self>> {
        let path = run_id.journal_path();
        let Some(bytes) = lakefill_table::storage::read_object(store, &path).await? else {
            return Ok(None);
        };
        let damaged = |message: String| Error::Journal {
            path: path.to_string(),
            message,
        };
        // The format first, so a newer journal is reported as such and not as damaged.
        let format = serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| damaged(e.to_string()))?
            .get("format")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| damaged("it has no `format`".into()))?;
        if format > u64::from(JOURNAL_FORMAT) {
            return Err(damaged(format!(
                "written by a newer lakefill (format {format}, this one reads {JOURNAL_FORMAT})"
            )));
        }
        let mut journal: Journal =
            serde_json::from_slice(&bytes).map_err(|e| damaged(e.to_string()))?;
        if journal.format < JOURNAL_FORMAT {
            journal.upgrade();
        }
        journal.check(run_id).map_err(damaged)?;
        Ok(Some(journal))
    }

    /// Refuses a journal that does not describe `run_id` or names files outside the run's own
    /// staging directories of in-range partitions.
    fn check(&self, run_id: &RunId) -> std::result::Result<(), String> {
        if &self.run_id != run_id {
            return Err(format!(
                "it describes run `{}`, not `{run_id}`",
                self.run_id
            ));
        }
        if self.inputs.range.from > self.inputs.range.to {
            return Err("its range is reversed".into());
        }
        if self.inputs.layout.is_unknown() {
            return Err("it does not say how the table is partitioned".into());
        }
        for add in self.staged_files() {
            check_staged_path(add, &self.inputs.layout, &self.inputs.range, run_id)?;
        }
        let feed_dir = format!("{}/", run_id.change_data_dir());
        for file in self.progress.change_feed.iter().flat_map(|f| &f.files) {
            let path = file.path.as_str();
            if !path.starts_with(&feed_dir)
                || path.contains("://")
                || path
                    .split('/')
                    .any(|s| s.is_empty() || s == "." || s == "..")
                || !path.ends_with(".parquet")
            {
                return Err(format!(
                    "change data file `{path}` is not a Parquet file of the run's `{feed_dir}`"
                ));
            }
        }
        Ok(())
    }

    /// Brings a journal of an older format to this one. Format 1 had no record of the planned
    /// batches or of the files validation saw: such a run must be validated again before it can
    /// be published.
    fn upgrade(&mut self) {
        self.format = JOURNAL_FORMAT;
        if self.inputs.layout.is_unknown()
            && let Some(column) = &self.inputs.partition_column
        {
            self.inputs.layout = Layout::legacy(column, false);
        }
        if matches!(
            self.progress.state,
            RunState::Staged | RunState::Validated | RunState::FailedValidation
        ) {
            self.progress.state = RunState::Staged;
            self.progress.validation = None;
            self.progress.validated_files = None;
        }
    }

    /// Lists the journals under a table's root, newest first. A damaged journal is an error.
    pub async fn list(store: &Arc<dyn ObjectStore>) -> Result<Vec<Self>> {
        let objects = lakefill_table::storage::list_objects(store, &Path::from(RUNS_DIR)).await?;
        let mut journals = Vec::new();
        for object in objects {
            let Some(name) = object.location.filename() else {
                continue;
            };
            let Some(run_id) = RunId::from_journal_name(name) else {
                continue;
            };
            if let Some(journal) = Self::load(store, &run_id).await? {
                journals.push(journal);
            }
        }
        journals.sort_by(|a, b| b.inputs.created_at.cmp(&a.inputs.created_at));
        Ok(journals)
    }

    /// Returns every staged file of the run (with adjustments, the new rows and the adjustment
    /// rows).
    pub fn staged_files(&self) -> impl Iterator<Item = &Add> {
        self.progress
            .batches
            .iter()
            .chain(&self.progress.adjustments)
            .flat_map(|b| b.files.iter())
    }

    /// Returns the files of the run's new rows (what validation compares with the old): the
    /// staged files, and the old files kept in partitions published by deletion vectors (with
    /// their new vectors).
    pub fn new_row_files(&self) -> impl Iterator<Item = &Add> {
        self.progress.batches.iter().flat_map(|b| {
            b.files
                .iter()
                .chain(b.vectors.iter().flat_map(|v| v.kept.iter()))
        })
    }

    /// How the run publishes by deletion vectors, if its target takes them.
    pub fn vector_summary(&self) -> Option<VectorSummary> {
        let mut summary: Option<VectorSummary> = None;
        for vectors in self.vectors() {
            let summary = summary.get_or_insert_with(VectorSummary::default);
            summary.partitions.extend(vectors.partitions.clone());
            summary.rewritten.extend(vectors.rewritten.clone());
            summary.uncut.extend(vectors.uncut.iter().cloned());
            summary.too_large.extend(vectors.too_large.iter().cloned());
            summary.files_cut += vectors.cut.len();
        }
        summary
    }

    /// The deletion vectors of the run's batches, of those published by them.
    pub fn vectors(&self) -> impl Iterator<Item = &BatchVectors> {
        self.progress
            .batches
            .iter()
            .filter_map(|b| b.vectors.as_ref())
    }

    /// Returns the files the publish commits: the new rows, or with adjustments the adjustment
    /// rows.
    pub fn published_files(&self) -> impl Iterator<Item = &Add> {
        let records = match self.inputs.publish_as {
            PublishMode::Rewrite => &self.progress.batches,
            PublishMode::Adjustments => &self.progress.adjustments,
        };
        records.iter().flat_map(|b| b.files.iter())
    }

    /// With adjustments, whether every batch has its adjustment rows staged.
    pub fn adjusted(&self) -> bool {
        self.inputs.publish_as == PublishMode::Rewrite
            || (self.progress.adjustment_counts.is_some()
                && self
                    .progress
                    .batches
                    .iter()
                    .all(|b| self.progress.adjustments.iter().any(|a| a.index == b.index)))
    }

    /// Returns whether every planned batch has finished.
    pub fn complete(&self) -> bool {
        !self.inputs.planned_batches.is_empty()
            && self.inputs.planned_batches.iter().all(|planned| {
                self.progress.batches.iter().any(|b| {
                    b.index == planned.index && b.start == planned.start && b.end == planned.end
                })
            })
            && self.progress.batches.len() == self.inputs.planned_batches.len()
    }

    /// A digest of the staged files (paths and sizes): what validation saw, and publish commits.
    pub fn staged_digest(&self) -> String {
        let mut files: Vec<(&str, i64)> = self
            .staged_files()
            .map(|a| (a.path.as_str(), a.size))
            .collect();
        files.sort();
        let mut hasher = Sha256::new();
        for (path, size) in files {
            hasher.update(format!("{path}\t{size}\n").as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    /// Returns whether validation ran and passed.
    pub fn validation_passed(&self) -> Option<bool> {
        self.progress.validation.as_ref().map(|v| v.passed)
    }

    /// The `lakefill backfill` command that resumes this run (the same run id: same model file,
    /// range, pinned sources and spill policy).
    pub fn resume_command(&self) -> String {
        match &self.inputs.kind {
            RunKind::Revert { of } => return format!("lakefill revert {of}"),
            RunKind::LogicalRevert { of } => return format!("lakefill revert {of} --logical"),
            RunKind::Backfill | RunKind::CascadeNode { .. } => {}
        }
        if let Some(command) = &self.inputs.resume {
            return command.clone();
        }
        let range = &self.inputs.range;
        let mut command = format!("lakefill backfill {}", self.inputs.model);
        if range.grain != lakefill_table::time::Grain::Whole {
            command.push_str(&format!(" --from {} --to {}", range.from, range.to));
        }
        if let Some(rows) = &range.rows {
            command.push_str(&lakefill_table::scope::where_option(&rows.sql));
        }
        command.push_str(&format!(" --model-version {}", self.inputs.model_version));
        for (table, version) in &self.inputs.sources {
            if !self.inputs.self_sources.contains(table) {
                command.push_str(&format!(" --source-version {table}={version}"));
            }
        }
        if let Some(policy) = &self.inputs.allow_spill {
            command.push_str(&format!(" --allow-spill {policy}"));
        }
        if self.inputs.range.include_null {
            command.push_str(" --include-null");
        }
        command
    }
}

/// A staged file must be `<partition dir>/lakefill-<run_id>/<file>.parquet` of an in-range
/// partition, where the partition directory is the one its partition values name.
fn check_staged_path(
    add: &Add,
    layout: &Layout,
    range: &PartitionRange,
    run_id: &RunId,
) -> std::result::Result<(), String> {
    let path = add.path.as_str();
    let bad = |why: &str| format!("staged file `{path}` {why}");
    if path.is_empty()
        || path.starts_with('/')
        || path.contains("://")
        || path.contains('\\')
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(bad("is not a plain relative path"));
    }
    if path.starts_with("_delta_log/") || path.starts_with("_lakefill/") {
        return Err(bad("is inside a metadata directory"));
    }
    if add.partition_values.len() != layout.partition_columns.len()
        || !layout
            .partition_columns
            .iter()
            .all(|c| add.partition_values.contains_key(c))
    {
        return Err(bad("does not have the table's partition values"));
    }
    let values: PartitionValues = add
        .partition_values
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match layout.time.period_of(&values) {
        // By rows, staged files go to the partitions of the files they replace: any.
        _ if layout.by_rows => {}
        Ok(Some(period)) if range.contains(&period) => {}
        Ok(None) if range.include_null => {}
        Ok(_) => return Err(bad("belongs to a partition outside the run's range")),
        Err(message) => {
            return Err(bad(&format!(
                "has a partition value off the grain: {message}"
            )));
        }
    }
    let prefix = layout.staging_prefix(&values, run_id);
    let Some(file) = path.strip_prefix(&format!("{prefix}/")) else {
        return Err(bad("is not in the run's staging directory"));
    };
    if file.contains('/') || !file.ends_with(".parquet") {
        return Err(bad("is not a Parquet file of the run's staging directory"));
    }
    Ok(())
}

fn first_sequence() -> u64 {
    1
}

/// Per-partition change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionChange {
    /// Partition value.
    pub value: String,
    /// Rows before (from the log), when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// Files before.
    pub old_files: u64,
    /// Files after.
    pub new_files: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(path: &str, value: &str) -> Add {
        Add {
            path: path.into(),
            partition_values: [("d".to_string(), Some(value.to_string()))].into(),
            size: 1,
            ..Default::default()
        }
    }

    #[test]
    fn staged_paths_must_be_the_runs_own_in_range_files() {
        let r1 = RunId::parse("r1").expect("run id");
        let layout = Layout::legacy("d", false);
        let (range, _) =
            PartitionRange::parse("2026-01-01", "2026-01-03", &layout.time, false).expect("range");
        let ok = add("d=2026-01-02/lakefill-r1/part-0.parquet", "2026-01-02");
        check_staged_path(&ok, &layout, &range, &r1).expect("own file");
        for (path, value) in [
            ("d=2026-01-02/lakefill-r2/part-0.parquet", "2026-01-02"),
            ("d=2026-01-09/lakefill-r1/part-0.parquet", "2026-01-09"),
            ("d=2026-01-02/part-0.parquet", "2026-01-02"),
            ("_delta_log/00000000000000000000.json", "2026-01-02"),
            (
                "d=2026-01-02/lakefill-r1/../../_delta_log/0.json",
                "2026-01-02",
            ),
            ("/etc/passwd", "2026-01-02"),
            (
                "s3://other/d=2026-01-02/lakefill-r1/part-0.parquet",
                "2026-01-02",
            ),
            ("d=2026-01-03/lakefill-r1/part-0.parquet", "2026-01-02"),
            ("d=2026-01-02/lakefill-r1/sub/part-0.parquet", "2026-01-02"),
        ] {
            let err = check_staged_path(&add(path, value), &layout, &range, &r1).expect_err(path);
            assert!(err.contains(path), "{err}");
        }
    }

    /// A journal written before the split into inputs, progress and outcome (one flat object)
    /// reads back as it was, and writes back with the same keys and values; each run kind
    /// keeps its `revert_of`, `revert_logical` and `cascade` fields.
    #[test]
    fn a_flat_journal_reads_and_writes_as_it_always_did() {
        let flat = serde_json::json!({
            "format": 2,
            "run_id": "events-v2-0123456789ab",
            "state": "validated",
            "model": "events",
            "model_version": "v2",
            "fingerprint": "abc",
            "target": "events",
            "layout": Layout::legacy("d", false),
            "read_version": 3,
            "range": {"from": "2026-01-01", "to": "2026-01-02", "grain": "day", "include_null": false},
            "sources": {"raw": 7},
            "self_sources": [],
            "allow_spill": null,
            "reason": "fix",
            "added_columns": [],
            "affected_files": [],
            "planned_batches": [],
            "batches": [],
            "partitions": [],
            "spill_dropped": 0,
            "validation": null,
            "validated_files": null,
            "forced": null,
            "published_version": null,
            "sequence": 1,
            "error": null,
            "created_at": "2026-01-03T00:00:00Z",
            "updated_at": "2026-01-03T00:00:01Z"
        });
        let kinds = [
            (serde_json::json!({}), RunKind::Backfill),
            (
                serde_json::json!({"cascade": "cascade-0123456789ab"}),
                RunKind::CascadeNode {
                    cascade: "cascade-0123456789ab".into(),
                },
            ),
            (
                serde_json::json!({"revert_of": "events-v1-0123456789ab"}),
                RunKind::Revert {
                    of: RunId::parse("events-v1-0123456789ab").expect("run id"),
                },
            ),
            (
                serde_json::json!({"revert_of": "events-v1-0123456789ab", "revert_logical": true}),
                RunKind::LogicalRevert {
                    of: RunId::parse("events-v1-0123456789ab").expect("run id"),
                },
            ),
        ];
        for (fields, kind) in kinds {
            let mut document = flat.clone();
            for (key, value) in fields.as_object().expect("object") {
                document[key] = value.clone();
            }
            let journal: Journal = serde_json::from_value(document.clone()).expect("reads");
            assert_eq!(journal.inputs.kind, kind);
            assert_eq!(journal.inputs.read_version, 3);
            assert_eq!(journal.progress.state, RunState::Validated);
            assert_eq!(journal.outcome.sequence, 1);
            let written = serde_json::to_value(&journal).expect("writes");
            assert_eq!(written, document, "{kind:?}");
        }
    }

    /// The journal of a run, kept on an in-memory object store: only the holder of the run's
    /// lease writes it, it reads back whole, a newer format is refused as such, and listing
    /// the table's runs finds it.
    #[tokio::test]
    async fn a_journal_on_an_in_memory_store_is_written_by_its_lease_holder_only() {
        use deltalake::logstore::object_store::memory::InMemory;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let document = serde_json::json!({
            "format": 2,
            "run_id": "events-v2-0123456789ab",
            "state": "staging",
            "model": "events",
            "model_version": "v2",
            "fingerprint": "abc",
            "target": "events",
            "layout": Layout::legacy("d", false),
            "read_version": 3,
            "range": {"from": "2026-01-01", "to": "2026-01-02", "grain": "day", "include_null": false},
            "sources": {},
            "reason": null,
            "batches": [],
            "published_version": null,
            "error": null,
            "created_at": "2026-01-03T00:00:00Z",
            "updated_at": "2026-01-03T00:00:00Z"
        });
        let mut journal: Journal = serde_json::from_value(document).expect("journal");
        let run_id = journal.run_id.clone();
        let other = RunId::parse("events-v2-ba9876543210").expect("run id");

        let foreign = RunLease::acquire(&store, "events", &other, "backfill")
            .await
            .expect("lease");
        let refused = journal
            .save(&store, &foreign)
            .await
            .expect_err("not its lease");
        assert!(
            refused.to_string().contains("cannot write the journal"),
            "{refused}"
        );
        foreign.release().await;
        assert!(
            Journal::load(&store, &run_id)
                .await
                .expect("load")
                .is_none()
        );

        let lease = RunLease::acquire(&store, "events", &run_id, "backfill")
            .await
            .expect("lease");
        journal
            .transition(RunState::Staged)
            .expect("staging -> staged");
        journal.save(&store, &lease).await.expect("save");
        let loaded = Journal::load(&store, &run_id)
            .await
            .expect("load")
            .expect("saved");
        assert_eq!(loaded.progress.state, RunState::Staged);
        assert_eq!(loaded.inputs.kind, RunKind::Backfill);
        assert_eq!(loaded.inputs.read_version, 3);
        let listed = Journal::list(&store).await.expect("list");
        assert_eq!(
            listed.iter().map(|j| j.run_id.clone()).collect::<Vec<_>>(),
            vec![run_id.clone()]
        );
        lease.release().await;

        // A journal of a newer lakefill is named as such, not as damaged.
        let mut newer = serde_json::to_value(&loaded).expect("json");
        newer["format"] = serde_json::json!(JOURNAL_FORMAT + 1);
        store
            .put(
                &run_id.journal_path(),
                PutPayload::from(serde_json::to_vec(&newer).expect("bytes")),
            )
            .await
            .expect("put");
        let err = Journal::load(&store, &run_id).await.expect_err("newer");
        assert!(err.to_string().contains("newer lakefill"), "{err}");
    }
}
