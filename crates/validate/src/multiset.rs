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
/// Memory holds one entry per old row (its hash, file, position and a link: 24 bytes), never the
/// rows. As in [`difference`], two rows with one hash are taken for the same row (about 2⁻⁶⁴ per
/// pair): the caller proves the result with another hash.
#[derive(Debug, Default)]
pub struct Located {
    /// The first not yet used-up entry of each hash.
    heads: HashMap<u64, u32, BuildHasherDefault<Prehashed>>,
    /// (file, position, next entry of the same hash or `u32::MAX`).
    entries: Vec<(u32, u64, u32)>,
    used: u64,
}

impl Located {
    /// Room for `rows` old rows, so that adding them does not grow the table as it goes (a
    /// partition's live rows are known from the log's statistics before its files are read).
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            heads: HashMap::with_capacity_and_hasher(rows, BuildHasherDefault::default()),
            entries: Vec::with_capacity(rows),
            used: 0,
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
        for (offset, hash) in hashes.iter().enumerate() {
            let position = first + offset as u64;
            if deleted(position) {
                continue;
            }
            let index = u32::try_from(self.entries.len()).map_err(|_| {
                DataFusionError::ResourcesExhausted(
                    "more than 2^32 old rows in one batch of deletion vectors".into(),
                )
            })?;
            let next = self.heads.insert(*hash, index).unwrap_or(u32::MAX);
            self.entries.push((file, position, next));
        }
        Ok(())
    }

    /// Old rows not yet used up.
    pub fn left(&self) -> u64 {
        self.entries.len() as u64 - self.used
    }

    /// Uses up an old row of each hash that has one left; whether each new row did (is kept).
    pub fn take(&mut self, hashes: &[u64]) -> Vec<bool> {
        hashes
            .iter()
            .map(|hash| match self.heads.get_mut(hash) {
                Some(head) if *head != u32::MAX => {
                    *head = self.entries[*head as usize].2;
                    self.used += 1;
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// The (file, position) of every old row no new row used up.
    pub fn unused(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.unused_hashed()
            .map(|(_, file, position)| (file, position))
    }

    /// The hash, file and position of every old row no new row used up.
    pub fn unused_hashed(&self) -> impl Iterator<Item = (u64, u32, u64)> + '_ {
        self.heads.iter().flat_map(move |(hash, head)| {
            std::iter::successors((*head != u32::MAX).then_some(*head), move |index| {
                let next = self.entries[*index as usize].2;
                (next != u32::MAX).then_some(next)
            })
            .map(move |index| {
                let (file, position, _) = self.entries[index as usize];
                (*hash, file, position)
            })
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
