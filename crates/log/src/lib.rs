//! # lakefill-log
//!
//! What is written down about runs: the Delta log, read (a table's commits, the application
//! transactions of lakefill runs, the metadata each lakefill commit carries, the model registry),
//! and each run's own record, the [`journal`] (its lease, its life cycle, a cascade's record).
//!
//! This is the bottom of the pipeline's knowledge of the log: planning asks whether a run was
//! published, the runner and run management reconcile journals with it, `history` and `blame`
//! explain it, and every delete first asks [`references`] what the log still needs. The runner
//! (`lakefill`'s `publish`) makes commits; for tables whose features delta-rs's commit refuses,
//! it has the [`writer`] write them (with [`domains`], the system domains it reads).

pub mod domains;
pub mod journal;
pub mod metadata;
pub mod references;
pub mod registry;
pub mod writer;

use deltalake::DeltaTable;

use lakefill_table::error::{DeltaContext, Result};
use lakefill_table::partition::{Layout, PartitionRange, PartitionValues};
use lakefill_table::run_id::RunId;
use lakefill_table::storage::loaded_version;

pub use metadata::CommitMetadata;

/// Returns the highest publish sequence of `run_id` recorded in `table` (at whatever version it
/// is loaded), if the run was ever published.
pub async fn published_sequence(table: &DeltaTable, run_id: &RunId) -> Result<Option<u64>> {
    let snapshot = table
        .snapshot()
        .delta_context(|| "cannot read the table's snapshot".into())?;
    Ok(snapshot
        .transaction_version(table.log_store().as_ref(), &run_id.app_id())
        .await
        .delta_context(|| "cannot read the table's application transactions".into())?
        .map(|v| u64::try_from(v).unwrap_or(0)))
}

/// One commit of a table, as the log holds it.
///
/// Read leniently, as JSON rather than as delta-rs's typed actions: a commit written by another
/// writer (or a newer protocol) may carry fields or actions delta-rs 1.1 does not know, and a
/// file path missed here would be a live file [`references`] failed to protect.
pub struct Commit {
    /// The commit's `commitInfo`, as written.
    pub info: serde_json::Value,
    /// The partition values of each file added or removed.
    pub partitions: Vec<PartitionValues>,
    /// Paths of the files added or removed, and of change-data files, as written in the log.
    pub paths: Vec<String>,
    /// Files added.
    pub added: u64,
    /// Files removed.
    pub removed: u64,
    /// Paths of the files added, as written in the log.
    pub added_paths: Vec<String>,
    /// Paths of the files removed, as written in the log.
    pub removed_paths: Vec<String>,
    /// The commit changed the table's metadata (schema, properties) or protocol.
    pub changes_table: bool,
    /// The statistics of each file added (as `added_paths`), keyed by logical column names.
    pub added_stats: Vec<Option<String>>,
    /// The partition values of each file added (as `added_paths`), keyed by logical names.
    pub added_values: Vec<PartitionValues>,
    /// Files added or removed with `dataChange` (not a compaction's rewrite of the same rows).
    pub data_changes: u64,
    /// The partition values of each file added or removed with `dataChange`.
    pub changed_values: Vec<PartitionValues>,
    /// The statistics of each file added or removed with `dataChange` (as `changed_values`;
    /// `None` when the log has none), keyed by logical names.
    pub changed_stats: Vec<Option<String>>,
    /// Rows of the files added with `dataChange`, by their statistics (files without are not
    /// counted).
    pub rows_added: u64,
    /// Rows of the files removed with `dataChange`, by their statistics where the remove action
    /// carries them.
    pub rows_removed: u64,
}

impl Commit {
    /// The run that made the commit, if lakefill did (read without the rest of the metadata, so
    /// a commit of an older lakefill is still recognised).
    pub fn run_id(&self) -> Option<&str> {
        self.info["lakefill"]["run_id"].as_str()
    }

    /// The metadata of the lakefill run that made the commit, if one did and it can be read.
    pub fn lakefill(&self) -> Option<CommitMetadata> {
        self.info
            .get("lakefill")
            .filter(|value| value.is_object())
            .and_then(|value| serde_json::from_value(value.clone()).ok())
    }
}

/// Reads the commit file of `version`; `None` when it is gone (log cleanup). Lines that are not
/// JSON are skipped.
pub async fn read_commit(table: &DeltaTable, version: u64) -> Result<Option<Commit>> {
    let Some(bytes) = table
        .log_store()
        .read_commit_entry(version)
        .await
        .delta_context(|| format!("cannot read commit {version}"))?
    else {
        return Ok(None);
    };
    let mut commit = Commit {
        info: serde_json::Value::Null,
        partitions: Vec::new(),
        paths: Vec::new(),
        added: 0,
        removed: 0,
        added_paths: Vec::new(),
        removed_paths: Vec::new(),
        changes_table: false,
        added_stats: Vec::new(),
        added_values: Vec::new(),
        data_changes: 0,
        changed_values: Vec::new(),
        changed_stats: Vec::new(),
        rows_added: 0,
        rows_removed: 0,
    };
    // A column-mapped table keys partition values by physical name; a commit's are read keyed
    // by the logical names the table has now (a rename keeps the physical name).
    let mapping = lakefill_table::mapping::ColumnMapping::of_table(table).unwrap_or_default();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(action) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(info) = action.get("commitInfo") {
            commit.info = info.clone();
        }
        if action.get("metaData").is_some() || action.get("protocol").is_some() {
            commit.changes_table = true;
        }
        if let Some(path) = action["cdc"]["path"].as_str() {
            commit.paths.push(path.to_string());
        }
        for (kind, counter, paths) in [
            ("add", &mut commit.added, &mut commit.added_paths),
            ("remove", &mut commit.removed, &mut commit.removed_paths),
        ] {
            let Some(file) = action.get(kind) else {
                continue;
            };
            *counter += 1;
            if let Some(path) = file["path"].as_str() {
                commit.paths.push(path.to_string());
                paths.push(path.to_string());
                if kind == "add" {
                    let stats = file["stats"]
                        .as_str()
                        .map(|s| mapping.logical_stats(s.into()));
                    commit.added_stats.push(stats);
                }
            }
            let values = file["partitionValues"].as_object().map(|values| {
                mapping.logical_values(
                    values
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().map(str::to_string)))
                        .collect(),
                )
            });
            if kind == "add" && file["path"].is_string() {
                commit.added_values.push(values.clone().unwrap_or_default());
            }
            // The protocol requires `dataChange`; a writer that leaves it out changed data.
            if file["dataChange"].as_bool() != Some(false) {
                let stats = file["stats"]
                    .as_str()
                    .map(|s| mapping.logical_stats(s.into()));
                let rows = stats
                    .as_deref()
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
                    .and_then(|s| s["numRecords"].as_u64())
                    .unwrap_or(0);
                if kind == "add" {
                    commit.rows_added += rows;
                } else {
                    commit.rows_removed += rows;
                }
                commit.data_changes += 1;
                commit
                    .changed_values
                    .push(values.clone().unwrap_or_default());
                commit.changed_stats.push(stats);
            }
            if let Some(values) = values {
                commit.partitions.push(values);
            }
        }
    }
    Ok(Some(commit))
}

/// Finds the newest version whose commit was made by `run_id`.
pub async fn find_run_commit(table: &DeltaTable, run_id: &str) -> Result<Option<u64>> {
    let latest = loaded_version(table)?;
    for version in (0..=latest).rev() {
        match read_commit(table, version).await? {
            Some(commit) if commit.run_id() == Some(run_id) => {
                return Ok(Some(version));
            }
            Some(_) => {}
            None => break,
        }
    }
    Ok(None)
}

/// The versions after `after` (up to `until`) whose commit added or removed files in `range`,
/// or whose commit file is gone (log cleanup: it may have); by rows, as [`Commit::touches`]
/// decides.
pub async fn commits_in_range(
    table: &DeltaTable,
    after: u64,
    layout: &Layout,
    range: &PartitionRange,
    until: u64,
) -> Result<Vec<u64>> {
    let mut versions = Vec::new();
    for version in after + 1..=until {
        if touches(read_commit(table, version).await?.as_ref(), layout, range) {
            versions.push(version);
        }
    }
    Ok(versions)
}

/// Returns whether a commit after `after` (up to `until`) added or removed files in `range`
/// (as [`commits_in_range`] tells).
pub async fn range_touched_after(
    table: &DeltaTable,
    after: u64,
    layout: &Layout,
    range: &PartitionRange,
    until: u64,
) -> Result<bool> {
    for version in after + 1..=until {
        if touches(read_commit(table, version).await?.as_ref(), layout, range) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `commit` added or removed files in `range`; a commit that is gone (log cleanup) may
/// have.
fn touches(commit: Option<&Commit>, layout: &Layout, range: &PartitionRange) -> bool {
    commit.is_none_or(|commit| commit.touches(layout, range))
}

impl Commit {
    /// Whether the commit added or removed files in `range`. By rows (`range_column`), files are
    /// not confined to the range's partitions: any file removed counts (a `remove` need not
    /// carry statistics), and any file added that its statistics do not place outside.
    pub fn touches(&self, layout: &Layout, range: &PartitionRange) -> bool {
        if layout.by_rows {
            self.removed > 0
                || self.added_paths.len() < usize::try_from(self.added).unwrap_or(usize::MAX)
                || self
                    .added_stats
                    .iter()
                    .any(|stats| layout.time.file_may_hold(range, stats.as_deref()))
        } else {
            self.partitions
                .iter()
                .any(|values| layout.label_in(range, values).is_some())
        }
    }
}

/// When version `version` of `table` was committed, as `history` shows it: its in-commit
/// timestamp, else its `commitInfo.timestamp`; `None` when its commit is no longer in the log.
pub async fn commit_time(
    table: &DeltaTable,
    version: u64,
) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
    let Some(commit) = read_commit(table, version).await? else {
        return Ok(None);
    };
    let millis = commit.info["inCommitTimestamp"]
        .as_i64()
        .or_else(|| commit.info["timestamp"].as_i64());
    Ok(millis.and_then(chrono::DateTime::from_timestamp_millis))
}

/// The newest version of `table` (loaded at its latest) committed at or before `time`, by the
/// commit times `history` prints (delta-rs' own time travel goes by the log files' modification
/// times, which a copied or rewritten log does not keep: a time `history` printed could be
/// refused, #32). `Err((earliest, its time))` when `time` is before every commit the log keeps.
/// Commit times only grow, so the search reads a few commits, not the whole log.
pub async fn version_at(
    table: &DeltaTable,
    time: chrono::DateTime<chrono::Utc>,
) -> Result<std::result::Result<u64, (u64, Option<chrono::DateTime<chrono::Utc>>)>> {
    let latest = loaded_version(table)?;
    // Back from the latest by growing steps to a commit at or before `time` (or past the first
    // one the log keeps), then bisect between.
    let (mut low, mut high) = (None, latest);
    let mut step = 1u64;
    let mut probe = latest;
    loop {
        match commit_time(table, probe).await? {
            Some(at) if at <= time => {
                low = Some(probe);
                break;
            }
            Some(_) => high = probe,
            None => break,
        }
        if probe == 0 {
            break;
        }
        let next = probe.saturating_sub(step);
        step = step.saturating_mul(2);
        if next == probe {
            break;
        }
        probe = next;
    }
    let Some(mut low) = low else {
        // Nothing at or before `time` among the commits kept: the earliest kept is `high` or
        // lies between the missing probe and `high`.
        let mut earliest = high;
        let mut missing = probe;
        while missing + 1 < earliest {
            let middle = missing + (earliest - missing) / 2;
            if commit_time(table, middle).await?.is_some() {
                earliest = middle;
            } else {
                missing = middle;
            }
        }
        let first = commit_time(table, earliest).await?;
        if first.is_some_and(|t| t <= time) {
            return Ok(Ok(earliest));
        }
        return Ok(Err((earliest, first)));
    };
    // `low` is at or before `time`, `high` after it (or the latest): bisect.
    let mut high = if high > low { high } else { return Ok(Ok(low)) };
    if commit_time(table, high).await?.is_some_and(|t| t <= time) {
        return Ok(Ok(high));
    }
    while low + 1 < high {
        let middle = low + (high - low) / 2;
        match commit_time(table, middle).await? {
            Some(at) if at <= time => low = middle,
            _ => high = middle,
        }
    }
    Ok(Ok(low))
}
