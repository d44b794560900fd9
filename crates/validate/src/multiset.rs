//! The multiset difference of two sets of whole rows, streamed: the old rows that are not among
//! the new rows (removed) and the new rows that are not among the old (added), each row counted
//! as often as it occurs. Adjustments are built on it (a reversal per removed row, a correction
//! per added one).
//!
//! Rows are matched by a 64-bit hash of every column ([`lakefill_table::rowhash::hash_rows`],
//! which hashes a value alike in every Arrow flavour of it). Three passes, with no join and no
//! sort:
//!
//! 1. the new rows are counted by hash (from the hashes their writers took while staging them,
//!    when they did: [`StagedHashes`]);
//! 2. the old rows stream through: one whose hash has a count left uses one up (it is among the
//!    new rows), the others are removed;
//! 3. the new rows stream again: one whose hash still has a count left uses one up and is added.
//!
//! Memory holds one entry per distinct new row (a hash and a count), never the rows. Two
//! different rows with one hash would be taken for the same row, a chance of about 2⁻⁶⁴ per
//! pair; callers prove what they build on the difference independently (adjustments: the
//! conservation check of validation, with other hashes).
//!
//! Written by hand because DataFusion's `EXCEPT ALL` is an anti join: an old row that occurs
//! twice, and once among the new rows, is matched by it both times (so it is not removed once),
//! and every column of every row is hashed and compared in the join's table.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use deltalake::arrow::array::{BooleanArray, RecordBatch};
use deltalake::arrow::compute::filter_record_batch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::error::{DataFusionError, Result as DfResult};
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::datafusion::execution::disk_manager::DiskManager;
use deltalake::datafusion::execution::spill_file::{SpillFile, SpillWriter};
use deltalake::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use deltalake::datafusion::prelude::DataFrame;
use futures::{StreamExt, TryStreamExt};

use lakefill_table::rowhash::{combine_rows, hash_rows, value_hashes};

/// Which side a row of the difference comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An old row that is not among the new rows.
    Removed,
    /// A new row that is not among the old rows.
    Added,
}

/// Turns the rows of a [`Change`] (in the sides' columns) into the output's rows.
pub type Shape = Arc<dyn Fn(Change, RecordBatch) -> DfResult<RecordBatch> + Send + Sync>;

/// Sees every row of a side as the difference reads it whole (the old rows in their pass, the
/// new rows in the pass that counts them): for sums or hashes wanted of the same rows, without
/// reading them again. With each batch come its columns' [`value_hashes`], in order, which the
/// difference's row hash combines.
pub type Watch = Box<dyn FnMut(&RecordBatch, &[Vec<u64>]) -> DfResult<()> + Send>;

/// What watches each side's rows ([`Watch`]); none by default.
#[derive(Default)]
pub struct Watchers {
    /// Every old row.
    pub old: Option<Watch>,
    /// Every new row.
    pub new: Option<Watch>,
}

/// The removed rows of `old`, then the added rows of `new`, each batch passed through `shape`
/// into a stream of `schema`. `old` and `new` have the same columns in the same order (their
/// Arrow flavours may differ). `watchers` see every row of each side once. `staged`: the
/// hashes of the new rows as their writers took them ([`StagedHashes::take`]), counted instead
/// of reading `new` for them (it is then read once, not twice); the stream fails if the rows
/// read are not the rows hashed.
pub fn difference(
    old: DataFrame,
    new: DataFrame,
    schema: SchemaRef,
    shape: Shape,
    watchers: Watchers,
    staged: Option<Vec<u64>>,
) -> SendableRecordBatchStream {
    let Watchers {
        old: watch_old,
        new: watch_new,
    } = watchers;
    let rows = futures::stream::once(async move {
        let (counts, expected) = match staged {
            Some(hashes) => {
                let expected = Tally::of(&hashes);
                (count_hashes(hashes), Some(expected))
            }
            None => (count(new.clone()).await?, None),
        };
        let counts = Arc::new(Mutex::new(counts));
        let removed = {
            let (counts, shape) = (Arc::clone(&counts), Arc::clone(&shape));
            pass(old, watch_old, move |hashes| {
                let mut counts = counts.lock().expect("the counts are never poisoned");
                // Among the new rows: it uses one of them up.
                hashes
                    .iter()
                    .map(|hash| !take(&mut counts, *hash))
                    .collect()
            })
            .and_then(move |batch| {
                let shape = Arc::clone(&shape);
                async move { shape(Change::Removed, batch) }
            })
        };
        let read = Arc::new(Mutex::new(Tally::default()));
        let seen = Arc::clone(&read);
        let added = pass(new, watch_new, move |hashes| {
            seen.lock().expect("the tally is never poisoned").add(hashes);
            let mut counts = counts.lock().expect("the counts are never poisoned");
            hashes.iter().map(|hash| take(&mut counts, *hash)).collect()
        })
        .and_then(move |batch| {
            let shape = Arc::clone(&shape);
            async move { shape(Change::Added, batch) }
        });
        // Once every new row was read: they were the rows the writers hashed.
        let checked = futures::stream::once(async move {
            let read = *read.lock().expect("the tally is never poisoned");
            match expected {
                Some(expected) if expected != read => Err(DataFusionError::Internal(format!(
                    "the staged new rows read back ({} rows) are not the {} rows their writers hashed: run the backfill again; if it fails the same way, report it",
                    read.rows, expected.rows
                ))),
                _ => Ok(None),
            }
        })
        .try_filter_map(|none: Option<RecordBatch>| futures::future::ready(Ok(none)));
        Ok::<_, DataFusionError>(removed.chain(added).chain(checked))
    })
    .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}

/// The number of rows and the sum of their hashes: which rows a side had, as far as a check of
/// what was read against what was hashed needs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    rows: u64,
    sum: u64,
}

impl Tally {
    fn of(hashes: &[u64]) -> Self {
        let mut tally = Self::default();
        tally.add(hashes);
        tally
    }

    fn add(&mut self, hashes: &[u64]) {
        self.rows += hashes.len() as u64;
        self.sum = hashes.iter().fold(self.sum, |sum, h| sum.wrapping_add(*h));
    }
}

/// The rows of each hash's new rows not yet used up.
type Counts = HashMap<u64, u32, BuildHasherDefault<Prehashed>>;

/// Uses up one row of `hash`; whether there was one.
fn take(counts: &mut Counts, hash: u64) -> bool {
    match counts.get_mut(&hash) {
        Some(left) if *left > 0 => {
            *left -= 1;
            true
        }
        _ => false,
    }
}

/// The rows of `rows` counted by hash.
async fn count(rows: DataFrame) -> DfResult<Counts> {
    let mut counts = Counts::default();
    let mut stream = rows.execute_stream().await?;
    while let Some(batch) = stream.next().await {
        for hash in hashes(&batch?)? {
            *counts.entry(hash).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// `hashes` counted.
fn count_hashes(hashes: Vec<u64>) -> Counts {
    let mut counts = Counts::with_capacity_and_hasher(hashes.len(), Default::default());
    for hash in hashes {
        *counts.entry(hash).or_insert(0) += 1;
    }
    counts
}

/// The rows of `rows` that `keep` (called with a batch's row hashes, in order) keeps; empty
/// batches left out; every batch shown to `watch` first. The rows are read when the stream is
/// first polled.
fn pass(
    rows: DataFrame,
    mut watch: Option<Watch>,
    mut keep: impl FnMut(&[u64]) -> Vec<bool> + Send + 'static,
) -> impl futures::Stream<Item = DfResult<RecordBatch>> + Send {
    futures::stream::once(async move { rows.execute_stream().await })
        .try_flatten()
        .and_then(move |batch| {
            let kept = column_hashes(&batch).and_then(|values| {
                if let Some(watch) = &mut watch {
                    watch(&batch, &values)?;
                }
                let values: Vec<&[u64]> = values.iter().map(Vec::as_slice).collect();
                let hashes = combine_rows(&values, batch.num_rows());
                Ok(BooleanArray::from(keep(&hashes)))
            });
            async move { Ok(filter_record_batch(&batch, &kept?)?) }
        })
        .try_filter(|batch| futures::future::ready(batch.num_rows() > 0))
}

/// The [`value_hashes`] of each column of `batch`: combined, its rows' [`hash_rows`].
fn column_hashes(batch: &RecordBatch) -> DfResult<Vec<Vec<u64>>> {
    batch
        .columns()
        .iter()
        .map(value_hashes)
        .collect::<lakefill_table::error::Result<Vec<_>>>()
        .map_err(|e| DataFusionError::External(e.into()))
}

fn hashes(batch: &RecordBatch) -> DfResult<Vec<u64>> {
    hash_rows(batch.columns(), batch.num_rows()).map_err(|e| DataFusionError::External(e.into()))
}

/// The old rows of a partition by row hash, each with where it is (a file and a row position in
/// it), matched against new rows one by one: the rows a file can keep when the partition's fix
/// is published by deletion vectors. A new row matching an old one uses it up (the old row stays
/// in its file, the new one need not be written); what no new row used up is deleted.
///
/// A fix's new rows mostly come in the order of the old rows they equal (the same model over
/// the same source, in runs of a batch of rows each): a new row is first compared with the old
/// row after the last one used up, and only when that is not its equal looked up by hash. The
/// lookup is an index of the old rows by the top bits of their hash, built in two sequential
/// passes (a counting sort) once the old rows are all in. Written by hand because a general
/// hash map, which this replaced, takes a random access into a table of every old row to insert
/// each one and another to match each new row: 15% of the CPU of a fix of 1% of the rows by
/// vectors, profiled. New rows in any other order are matched the same, each by a lookup.
///
/// Memory holds at most 37 bytes per old row (its hash and position, whether it is used up, and
/// in the index its hash again, its number and at most two group starts), never the rows. As in
/// [`difference`], two rows with one hash are taken for the same row (about 2⁻⁶⁴ per pair): the
/// caller proves the result with another hash.
#[derive(Debug, Default)]
pub struct Located {
    /// Each old row's hash, in the order added.
    hashes: Vec<u64>,
    /// Each old row's position in its file.
    positions: Vec<u64>,
    /// The file of the old rows from each start on (the rows of a file are added together).
    files: Vec<(usize, u32)>,
    /// Whether each old row was used up.
    used: Vec<bool>,
    used_count: u64,
    /// The old row the next new row is compared with first.
    next: usize,
    /// The old rows by hash, once a new row is matched; dropped when more old rows are added.
    index: Option<HashIndex>,
}

/// The old rows grouped by the top bits of their hashes: each group's hashes side by side (a
/// lookup that finds none reads one stretch of them), and the rows they are.
#[derive(Debug)]
struct HashIndex {
    /// How far a hash is shifted right to give its group.
    shift: u32,
    /// Where each group starts in `hashes` and `rows` (and, last, where they end).
    starts: Vec<u32>,
    hashes: Vec<u64>,
    rows: Vec<u32>,
}

impl HashIndex {
    /// The index of `hashes`: about one group per row, in two passes over them.
    fn of(hashes: &[u64]) -> Self {
        let bits = hashes
            .len()
            .max(2)
            .next_power_of_two()
            .trailing_zeros()
            .clamp(1, 32);
        let shift = 64 - bits;
        let mut starts = vec![0u32; (1usize << bits) + 1];
        for hash in hashes {
            starts[(hash >> shift) as usize + 1] += 1;
        }
        for group in 1..starts.len() {
            starts[group] += starts[group - 1];
        }
        let mut filled = starts.clone();
        let mut grouped = vec![0u64; hashes.len()];
        let mut rows = vec![0u32; hashes.len()];
        for (row, hash) in hashes.iter().enumerate() {
            let at = &mut filled[(hash >> shift) as usize];
            grouped[*at as usize] = *hash;
            // At most 2^32 rows: checked as they are added.
            rows[*at as usize] = row as u32;
            *at += 1;
        }
        Self {
            shift,
            starts,
            hashes: grouped,
            rows,
        }
    }

    /// The rows whose hash is `hash`.
    fn rows(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let group = (hash >> self.shift) as usize;
        let (start, end) = (self.starts[group] as usize, self.starts[group + 1] as usize);
        self.hashes[start..end]
            .iter()
            .zip(&self.rows[start..end])
            .filter(move |(h, _)| **h == hash)
            .map(|(_, row)| *row as usize)
    }
}

impl Located {
    /// Room for `rows` old rows, so that adding them does not grow the table as it goes (a
    /// partition's live rows are known from the log's statistics before its files are read).
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            hashes: Vec::with_capacity(rows),
            positions: Vec::with_capacity(rows),
            used: Vec::with_capacity(rows),
            ..Self::default()
        }
    }

    /// Adds the old rows of `file` whose hashes are `hashes`, at positions `first..`, skipping
    /// those `deleted` says the file no longer holds.
    pub fn add(
        &mut self,
        file: u32,
        first: u64,
        hashes: &[u64],
        deleted: impl Fn(u64) -> bool,
    ) -> DfResult<()> {
        if self.hashes.len() + hashes.len() > u32::MAX as usize {
            return Err(DataFusionError::ResourcesExhausted(
                "more than 2^32 old rows in one batch of deletion vectors".into(),
            ));
        }
        self.index = None;
        if self.files.last().is_none_or(|(_, last)| *last != file) {
            self.files.push((self.hashes.len(), file));
        }
        for (offset, hash) in hashes.iter().enumerate() {
            let position = first + offset as u64;
            if deleted(position) {
                continue;
            }
            self.hashes.push(*hash);
            self.positions.push(position);
            self.used.push(false);
        }
        Ok(())
    }

    /// Old rows not yet used up.
    pub fn left(&self) -> u64 {
        self.hashes.len() as u64 - self.used_count
    }

    /// Uses up an old row of each hash that has one left; whether each new row did (is kept).
    pub fn take(&mut self, hashes: &[u64]) -> Vec<bool> {
        if self.index.is_none() {
            self.index = Some(HashIndex::of(&self.hashes));
        }
        hashes.iter().map(|hash| self.take_one(*hash)).collect()
    }

    fn take_one(&mut self, hash: u64) -> bool {
        let next = self.next;
        let row = if next < self.hashes.len() && self.hashes[next] == hash && !self.used[next] {
            next
        } else {
            let Some(index) = &self.index else {
                return false;
            };
            match index.rows(hash).find(|row| !self.used[*row]) {
                Some(row) => row,
                None => return false,
            }
        };
        self.used[row] = true;
        self.used_count += 1;
        self.next = row + 1;
        true
    }

    /// The (file, position) of every old row no new row used up.
    pub fn unused(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.unused_hashed()
            .map(|(_, file, position)| (file, position))
    }

    /// The hash, file and position of every old row no new row used up, in the order added.
    pub fn unused_hashed(&self) -> impl Iterator<Item = (u64, u32, u64)> + '_ {
        self.used
            .iter()
            .enumerate()
            .filter(|(_, used)| !**used)
            .map(move |(row, _)| {
                let run = self.files.partition_point(|(start, _)| *start <= row);
                let file = self.files[run.saturating_sub(1)].1;
                (self.hashes[row], file, self.positions[row])
            })
    }
}

/// The hashes ([`hash_rows`] of the given columns, in order) of a run's new rows, taken by the
/// writers that staged them, per batch: the difference counts them without reading the staged
/// files back for it ([`difference`]'s `staged`).
///
/// Each write of a batch is an attempt with a [`StagedHashWriter`]; its hashes count once it
/// finished, for the files it wrote, and [`StagedHashes::take`] gives them only for the same
/// files (a batch another process staged, or a failed attempt's, has none: the difference then
/// counts the rows it reads). The hashes go to a file of the disk manager (8 bytes a row), not
/// to memory; a writer that cannot write its file leaves its batch without hashes.
pub struct StagedHashes {
    columns: Vec<String>,
    disk: Arc<DiskManager>,
    finished: Mutex<HashMap<usize, FinishedHashes>>,
}

struct FinishedHashes {
    files: BTreeSet<String>,
    file: Arc<dyn SpillFile>,
    rows: u64,
}

impl std::fmt::Debug for StagedHashes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedHashes")
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl StagedHashes {
    /// Hashes of rows by `columns` (in this order), kept in files of `disk`.
    pub fn new(disk: Arc<DiskManager>, columns: Vec<String>) -> Self {
        Self {
            columns,
            disk,
            finished: Mutex::new(HashMap::new()),
        }
    }

    /// The columns a row's hash covers, in order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// A writer for one attempt at staging a batch.
    pub fn writer(self: &Arc<Self>) -> StagedHashWriter {
        let file = self
            .disk
            .create_tmp_file("keeping the hashes of staged rows")
            .and_then(|file| {
                let out = file.open_writer()?;
                Ok((file, std::io::BufWriter::new(out)))
            });
        if let Err(e) = &file {
            tracing::debug!(error = %e, "no file for the hashes of staged rows: the difference will read them");
        }
        StagedHashWriter {
            owner: Arc::clone(self),
            file: file.ok(),
            rows: 0,
        }
    }

    /// The hashes of batch `index`, in the order they were written, when its finished attempt
    /// staged exactly `files`; `None` otherwise (or when they cannot be read). Given once.
    pub async fn take(&self, index: usize, files: &BTreeSet<String>) -> Option<Vec<u64>> {
        let finished = self
            .finished
            .lock()
            .expect("the finished hashes are never poisoned")
            .remove(&index)?;
        if &finished.files != files {
            return None;
        }
        let mut bytes = Vec::with_capacity(usize::try_from(finished.rows).ok()? * 8);
        let mut stream = finished.file.read_stream().ok()?;
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk.ok()?);
        }
        if bytes.len() as u64 != finished.rows * 8 {
            return None;
        }
        Some(
            bytes
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("eight bytes")))
                .collect(),
        )
    }
}

/// A file of hashes, and what writes it.
type HashFile = (Arc<dyn SpillFile>, std::io::BufWriter<Box<dyn SpillWriter>>);

/// The hashes of one attempt at staging a batch ([`StagedHashes::writer`]).
pub struct StagedHashWriter {
    owner: Arc<StagedHashes>,
    /// `None` once it could not be written.
    file: Option<HashFile>,
    rows: u64,
}

impl StagedHashWriter {
    /// The columns a row's hash covers, in order.
    pub fn columns(&self) -> &[String] {
        &self.owner.columns
    }

    /// Adds the hashes of some of the batch's rows.
    pub fn add(&mut self, hashes: &[u64]) {
        use std::io::Write as _;
        let Some((_, out)) = &mut self.file else {
            return;
        };
        let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        if out.write_all(&bytes).is_err() {
            self.file = None;
        }
        self.rows += hashes.len() as u64;
    }

    /// The attempt staged batch `batch` as `files`: its hashes count.
    pub fn finish(self, batch: usize, files: impl Iterator<Item = String>) {
        let Some((file, out)) = self.file else {
            return;
        };
        let Ok(mut out) = out.into_inner() else {
            return;
        };
        if out.finish().is_err() {
            return;
        }
        self.owner
            .finished
            .lock()
            .expect("the finished hashes are never poisoned")
            .insert(
                batch,
                FinishedHashes {
                    files: files.collect(),
                    file,
                    rows: self.rows,
                },
            );
    }
}

/// The hasher of keys that are hashes already: the key is its own hash.
#[derive(Default)]
pub(crate) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed (`write_u64`); any other use folds its bytes in.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Array, AsArray, Int64Array, StringArray, StringViewArray};
    use deltalake::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use deltalake::datafusion::datasource::MemTable;
    use deltalake::datafusion::prelude::SessionContext;

    fn frame(ctx: &SessionContext, rows: &[(Option<i64>, &str)], view: bool) -> DataFrame {
        let text = if view {
            DataType::Utf8View
        } else {
            DataType::Utf8
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", text, true),
        ]));
        let values: Vec<&str> = rows.iter().map(|r| r.1).collect();
        let strings: deltalake::arrow::array::ArrayRef = if view {
            Arc::new(StringViewArray::from(values))
        } else {
            Arc::new(StringArray::from(values))
        };
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                strings,
            ],
        )
        .expect("batch");
        // Two partitions: the passes read more than one stream of batches.
        let half = batch.num_rows() / 2;
        let parts = vec![
            vec![batch.slice(0, half)],
            vec![batch.slice(half, batch.num_rows() - half)],
        ];
        let provider = MemTable::try_new(schema, parts).expect("table");
        ctx.read_table(Arc::new(provider)).expect("frame")
    }

    /// The new rows' hashes as a writer would take them: of plain strings (the difference reads
    /// string views), in order.
    fn staged_hashes(new: &[(Option<i64>, &str)]) -> Vec<u64> {
        let ids: deltalake::arrow::array::ArrayRef = Arc::new(Int64Array::from(
            new.iter().map(|r| r.0).collect::<Vec<_>>(),
        ));
        let values: deltalake::arrow::array::ArrayRef = Arc::new(StringArray::from(
            new.iter().map(|r| r.1).collect::<Vec<_>>(),
        ));
        hash_rows(&[ids, values], new.len()).expect("hashes")
    }

    /// The difference, with the new rows counted as it reads them and from their staged hashes:
    /// the same rows both ways.
    async fn diff(
        old: &[(Option<i64>, &str)],
        new: &[(Option<i64>, &str)],
    ) -> Vec<(String, Option<i64>, String)> {
        let read = diff_counted(old, new, None).await.expect("difference");
        let staged = diff_counted(old, new, Some(staged_hashes(new)))
            .await
            .expect("difference of staged hashes");
        assert_eq!(read, staged, "counted as read and as staged");
        read
    }

    async fn diff_counted(
        old: &[(Option<i64>, &str)],
        new: &[(Option<i64>, &str)],
        staged: Option<Vec<u64>>,
    ) -> DfResult<Vec<(String, Option<i64>, String)>> {
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![
            Field::new("change", DataType::Utf8, false),
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]));
        let out = Arc::clone(&schema);
        let shape: Shape = Arc::new(move |change, batch: RecordBatch| {
            let label = format!("{change:?}");
            let v = deltalake::arrow::compute::cast(batch.column(1), &DataType::Utf8)?;
            Ok(RecordBatch::try_new(
                Arc::clone(&out),
                vec![
                    Arc::new(StringArray::from(vec![label; batch.num_rows()])),
                    Arc::clone(batch.column(0)),
                    v,
                ],
            )?)
        });
        // The watchers see every row of each side once.
        let seen = Arc::new([
            std::sync::atomic::AtomicUsize::new(0),
            std::sync::atomic::AtomicUsize::new(0),
        ]);
        let watch = |side: usize| -> Option<Watch> {
            let seen = Arc::clone(&seen);
            Some(Box::new(move |batch: &RecordBatch, _: &[Vec<u64>]| {
                seen[side].fetch_add(batch.num_rows(), std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }))
        };
        let watchers = Watchers {
            old: watch(0),
            new: watch(1),
        };
        let batches: Vec<RecordBatch> = difference(
            frame(&ctx, old, false),
            frame(&ctx, new, true),
            schema,
            shape,
            watchers,
            staged,
        )
        .try_collect()
        .await?;
        let seen = [0, 1].map(|side| seen[side].load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(seen, [old.len(), new.len()], "rows the watchers saw");
        let mut rows = Vec::new();
        for batch in &batches {
            let ids = batch.column(1).as_primitive::<Int64Type>();
            for row in 0..batch.num_rows() {
                rows.push((
                    batch.column(0).as_string::<i32>().value(row).to_string(),
                    ids.is_valid(row).then(|| ids.value(row)),
                    batch.column(2).as_string::<i32>().value(row).to_string(),
                ));
            }
        }
        rows.sort();
        Ok(rows)
    }

    #[tokio::test]
    async fn staged_hashes_that_are_not_the_rows_read_fail_the_difference() {
        let old = [(Some(1), "a"), (Some(2), "b")];
        let new = [(Some(1), "a"), (Some(2), "B")];
        // A row hashed otherwise than it was read, a row more and a row less.
        let mut other = staged_hashes(&new);
        other[1] ^= 1;
        let mut more = staged_hashes(&new);
        more.push(7);
        let less = staged_hashes(&new[..1]);
        for staged in [other, more, less] {
            let error = diff_counted(&old, &new, Some(staged))
                .await
                .expect_err("hashes of other rows");
            assert!(
                error.to_string().contains("not the")
                    && error.to_string().contains("rows their writers hashed"),
                "{error}"
            );
        }
    }

    #[tokio::test]
    async fn staged_hashes_count_only_for_a_finished_attempt_with_the_same_files() {
        let disk = Arc::new(
            deltalake::datafusion::execution::disk_manager::DiskManagerBuilder::default()
                .build()
                .expect("disk"),
        );
        let hashes = Arc::new(StagedHashes::new(disk, vec!["id".into(), "v".into()]));
        let files =
            |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
        // Batch 0: a failed attempt (never finished), then one that wrote two files.
        let mut failed = hashes.writer();
        failed.add(&[1, 2, 3]);
        drop(failed);
        let mut done = hashes.writer();
        done.add(&[4, 5]);
        done.add(&[6]);
        done.finish(0, ["a", "b"].into_iter().map(String::from));
        // Batch 1: finished, but the journal has other files for it (another process staged it).
        let mut other = hashes.writer();
        other.add(&[9]);
        other.finish(1, ["c"].into_iter().map(String::from));
        assert_eq!(hashes.take(1, &files(&["d"])).await, None);
        assert_eq!(hashes.take(2, &files(&["e"])).await, None, "never staged");
        assert_eq!(
            hashes.take(0, &files(&["a", "b"])).await,
            Some(vec![4, 5, 6])
        );
        assert_eq!(
            hashes.take(0, &files(&["a", "b"])).await,
            None,
            "given once"
        );
        // A batch with no rows has its (empty) hashes.
        hashes.writer().finish(3, std::iter::empty());
        assert_eq!(hashes.take(3, &BTreeSet::new()).await, Some(Vec::new()));
    }

    #[test]
    fn located_rows_are_used_up_once_each() {
        let mut old = Located::default();
        // File 0: hashes 7, 8, 7, 9 at positions 10..14, position 13 already deleted.
        old.add(0, 10, &[7, 8, 7, 9], |p| p == 13).expect("add");
        // File 1: hash 8 at position 0.
        old.add(1, 0, &[8], |_| false).expect("add");
        assert_eq!(old.left(), 4);
        // New rows: 7 twice (both old 7s kept), 9 (deleted before: new), 5 (new), 8 once.
        assert_eq!(
            old.take(&[7, 9, 7, 5, 8]),
            vec![true, false, true, false, true]
        );
        assert_eq!(old.take(&[7]), vec![false], "no third 7");
        assert_eq!(old.left(), 1);
        // One of the two 8s is left to delete.
        let unused: Vec<(u32, u64)> = old.unused().collect();
        assert_eq!(unused.len(), 1);
        assert!(unused == [(0, 11)] || unused == [(1, 0)], "{unused:?}");
        let hashed: Vec<(u64, u32, u64)> = old.unused_hashed().collect();
        assert_eq!(hashed, [(8, unused[0].0, unused[0].1)]);
    }

    /// Old rows matched against new rows in every order that matters to [`Located`] (the old
    /// rows' order, runs of them swapped, reversed, shuffled), with repeated hashes, rows
    /// deleted before, changed and added rows, and new rows given in batches of every size: each
    /// new row uses up an old row exactly when one of its hash is left (as a count of each
    /// hash's rows says), and the rows left are the old rows' multiset less those used up, each
    /// at its own file and position.
    #[test]
    fn located_rows_match_as_counted_in_any_order() {
        // A small generator, seeded: the same cases each run.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..120u64 {
            let rows = [0usize, 1, 2, 7, 100, 1000][(case % 6) as usize];
            // Few distinct hashes in some cases: repeated rows; hashes at both ends of the
            // range in others (the index groups by the top bits).
            let distinct = [3u64, 50, u64::MAX][(case / 6 % 3) as usize];
            let hash = |n: u64| match distinct {
                u64::MAX => n,
                d => [0, u64::MAX, 1 << 63][(n % 3) as usize] ^ (n % d),
            };
            // Old rows in two or three files, a few deleted before.
            let old: Vec<u64> = (0..rows).map(|_| hash(next())).collect();
            let deleted: Vec<bool> = (0..rows).map(|_| next() % 10 == 0).collect();
            let files = 1 + (case % 3) as usize;
            let per_file = rows.div_ceil(files).max(1);
            let mut located = Located::with_capacity(rows);
            let mut places = std::collections::BTreeMap::new();
            for (file, chunk) in old.chunks(per_file).enumerate() {
                let first = (file * per_file) as u64 + 5;
                let mut at = 0;
                // Added in pieces, as a file's batches come.
                while at < chunk.len() {
                    let end = (at + 1 + (next() % 300) as usize).min(chunk.len());
                    let base = file * per_file;
                    located
                        .add(file as u32, first + at as u64, &chunk[at..end], |p| {
                            deleted[base + (p - first) as usize]
                        })
                        .expect("add");
                    at = end;
                }
                for (offset, h) in chunk.iter().enumerate() {
                    if !deleted[file * per_file + offset] {
                        places.insert((file as u32, first + offset as u64), *h);
                    }
                }
            }
            // New rows: the live old rows in some order, some changed, some added twice.
            let mut new: Vec<u64> = old
                .iter()
                .zip(&deleted)
                .filter(|(_, d)| !**d)
                .map(|(h, _)| *h)
                .collect();
            match case % 4 {
                0 => {}
                1 => new.reverse(),
                2 => {
                    let mut runs: Vec<Vec<u64>> = new.chunks(64).map(<[u64]>::to_vec).collect();
                    runs.reverse();
                    new = runs.concat();
                }
                _ => {
                    for i in (1..new.len()).rev() {
                        new.swap(i, (next() % (i as u64 + 1)) as usize);
                    }
                }
            }
            for h in &mut new {
                if next() % 20 == 0 {
                    *h = hash(next());
                }
            }
            if let Some(first) = new.first().copied() {
                new.push(first);
            }
            // The count of each hash's old rows left, as the difference keeps it.
            let mut counts: HashMap<u64, u64> = HashMap::new();
            for h in places.values() {
                *counts.entry(*h).or_default() += 1;
            }
            let expected: Vec<bool> = new
                .iter()
                .map(|h| match counts.get_mut(h) {
                    Some(left) if *left > 0 => {
                        *left -= 1;
                        true
                    }
                    _ => false,
                })
                .collect();
            let mut taken = Vec::new();
            let mut at = 0;
            while at < new.len() {
                let end = (at + 1 + (next() % 200) as usize).min(new.len());
                taken.extend(located.take(&new[at..end]));
                at = end;
            }
            assert_eq!(taken, expected, "case {case}");
            let left: u64 = counts.values().sum();
            assert_eq!(located.left(), left, "case {case}");
            let unused: Vec<(u64, u32, u64)> = located.unused_hashed().collect();
            let mut by_hash: HashMap<u64, u64> = HashMap::new();
            for (h, file, position) in &unused {
                assert_eq!(places.get(&(*file, *position)), Some(h), "case {case}");
                *by_hash.entry(*h).or_default() += 1;
            }
            counts.retain(|_, left| *left > 0);
            assert_eq!(by_hash, counts, "case {case}");
            let distinct_places: BTreeSet<(u32, u64)> = located.unused().collect();
            assert_eq!(distinct_places.len(), unused.len(), "case {case}");
        }
    }

    fn row(change: &str, id: Option<i64>, v: &str) -> (String, Option<i64>, String) {
        (change.to_string(), id, v.to_string())
    }

    #[tokio::test]
    async fn rows_are_counted_as_often_as_they_occur() {
        // The same rows in another order (and another string flavour): no difference.
        let rows = [(Some(1), "a"), (Some(2), "b"), (None, "c"), (Some(2), "b")];
        let reordered = [(Some(2), "b"), (None, "c"), (Some(2), "b"), (Some(1), "a")];
        assert!(diff(&rows, &reordered).await.is_empty());
        // A row twice on the old side and once on the new one is removed once; EXCEPT ALL as
        // DataFusion plans it (an anti join) would remove it never.
        assert_eq!(
            diff(
                &[(Some(1), "a"), (Some(1), "a"), (Some(2), "b")],
                &[(Some(1), "a"), (Some(2), "b")]
            )
            .await,
            vec![row("Removed", Some(1), "a")]
        );
        // And the other way round: added once.
        assert_eq!(
            diff(&[(Some(1), "a")], &[(Some(1), "a"), (Some(1), "a")]).await,
            vec![row("Added", Some(1), "a")]
        );
        // A changed value, a NULL key, a row only on each side.
        assert_eq!(
            diff(
                &[
                    (Some(1), "a"),
                    (None, "x"),
                    (Some(3), "gone"),
                    (Some(4), "same")
                ],
                &[
                    (Some(1), "A"),
                    (None, "y"),
                    (Some(5), "new"),
                    (Some(4), "same")
                ],
            )
            .await,
            vec![
                row("Added", None, "y"),
                row("Added", Some(1), "A"),
                row("Added", Some(5), "new"),
                row("Removed", None, "x"),
                row("Removed", Some(1), "a"),
                row("Removed", Some(3), "gone"),
            ]
        );
        // One side empty.
        assert_eq!(
            diff(&[], &[(Some(1), "a"), (Some(1), "a")]).await,
            vec![row("Added", Some(1), "a"), row("Added", Some(1), "a")]
        );
        assert_eq!(
            diff(&[(Some(7), "z")], &[]).await,
            vec![row("Removed", Some(7), "z")]
        );
    }
}
