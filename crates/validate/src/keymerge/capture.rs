//! A side of the key merge, hashed while staging writes it (the new rows) or reads it (the old
//! rows of an adjustments run, which the difference reads whole: [`Capture::old_side`]).
//!
//! Staging holds every new row in memory once, in the target's types: hashing its key and its
//! compared columns there costs a fraction of reading the staged files back to hash them. A
//! [`Capture`] is shared by a run's writers. Each write of a batch is an attempt whose rows count
//! only once it finished: a failed attempt's rows stay in the buckets under labels of their own
//! and are dropped when read. Validation uses a capture only when its finished attempts are
//! exactly the journal's batches, with the same files ([`Capture::covers`]); a resumed run, whose
//! earlier batches another process staged, reads its new side as before.
//!
//! Rows are kept in memory until there are more than [`MEMORY_ROWS`], then go to
//! [`CAPTURE_BUCKETS`] spill files by the top bits of their key hash, so that a merge with fewer
//! buckets (a power of two) pairs a run of consecutive files as one bucket.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use deltalake::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, new_null_array};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Float64Type, Schema};
use deltalake::datafusion::common::ScalarValue;
use deltalake::datafusion::execution::disk_manager::DiskManager;
use deltalake::datafusion::execution::spill_file::SpillWriter;

use super::{
    Entry, LabelTable, LabelTotals, Pending, RECORD, ReadTally, Scratch, Side, SideLabels,
    SpillFileRef, encode,
};
use crate::rowdiff::{ADDED, REMOVED, SampledKey};
use crate::spec::CompareSpec;
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::rowhash::{
    combine_rows, key_hashable, key_hashes, key_type_class, value_hashes,
};

/// Rows kept in memory before the capture goes to spill files.
const MEMORY_ROWS: usize = 1 << 20;

/// Spill files of a capture (by the top 8 bits of the key hash): a merge of at most this many
/// buckets can use it.
pub(super) const CAPTURE_BUCKETS: usize = 256;

/// Rows a writer gathers before it hands them to the shared buckets.
const FLUSH_ROWS: usize = 64 * 1024;

/// The new rows of a run as the key merge reads them, hashed by the run's writers (or the old
/// rows, hashed as staging read them, with their totals: [`Capture::old_side`]).
pub struct Capture {
    key: Vec<String>,
    /// The columns a row's hash covers (the target's, but the key, in its order), with the
    /// type each had (as [`key_type_class`] tells them apart).
    compared: Vec<(String, DataType)>,
    key_types: Vec<DataType>,
    /// The compared partition columns whose values label a row.
    parts: Vec<String>,
    sample: usize,
    /// Rows kept in memory before the capture goes to spill files.
    memory_rows: usize,
    disk: Arc<DiskManager>,
    /// For the old side: what it also sums per partition.
    old: Option<OldSide>,
    state: Mutex<State>,
    files: std::sync::OnceLock<Files>,
}

/// What a capture of the old side also takes of its rows: the totals per partition that the
/// whole-old merge aggregates as it reads them ([`LabelTotals`]).
struct OldSide {
    /// The columns of the row checksum, in order, with their type classes.
    checksum: Vec<(String, DataType)>,
    /// The measures summed (as doubles), in the comparison's order.
    measures: Vec<String>,
    /// Columns the rows seen lack, whose values are all NULL on the side captured (an
    /// adjustments run's lineage columns, NULL in net rows): hashed as NULLs.
    absent_null: Vec<String>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("key", &self.key)
            .field("parts", &self.parts)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// The rows, until they go to files.
    memory: Vec<Entry>,
    /// Per capture label: the attempt that wrote it and the partition values.
    labels: Vec<(usize, Vec<ScalarValue>)>,
    attempts: Vec<Attempt>,
    /// Rows with a NULL key (they match nothing), per capture label.
    nulls: BTreeMap<u32, NullRows>,
    /// For the old side: the totals per capture label of finished attempts.
    totals: BTreeMap<u32, LabelTotals>,
    /// Why the capture cannot be used (a spill file failed, a column could not be hashed).
    broken: Option<String>,
    /// On an old side: whether rows were held back and only some given back, the others left
    /// out as the twins of new rows ([`CaptureWriter::hold_batch`]).
    elided: bool,
    /// Whether its rows were taken out for a merge.
    sealed: bool,
}

/// The spill files of a capture, one per bucket, each written under its own lock.
struct Files {
    /// Handed to the merge when the capture is sealed, which removes each once it paired it.
    files: Mutex<Vec<SpillFileRef>>,
    writers: Vec<Mutex<Option<Box<dyn SpillWriter>>>>,
}

/// Bytes of records a writer gathers per bucket before it writes them.
const CHUNK: usize = 16 * 1024 / RECORD * RECORD;

#[derive(Default)]
struct Attempt {
    /// The batch, once the attempt finished.
    batch: Option<usize>,
    files: BTreeSet<String>,
    /// For an old side: the files whose rows it hashed ([`CaptureWriter::read_whole`]).
    read: BTreeSet<String>,
}

#[derive(Default)]
struct NullRows {
    rows: u64,
    samples: Vec<Entry>,
}

/// A capture's rows, once every writer finished: in memory, or in its spill files.
pub(super) enum Sealed {
    Memory(Vec<Entry>),
    Files(Vec<SpillFileRef>),
}

/// What a capture's rows become when read: each capture label's merge label (none for rows of
/// an attempt that did not finish), and whether that label's rows are diffed.
pub(super) struct Relabel {
    labels: Vec<Option<(u32, bool)>>,
    /// Whether its rows keep their twin flags ([`Relabel::with_twins`]).
    twins: bool,
}

/// An old row's record held back by an old side's writer ([`CaptureWriter::hold_batch`]) until
/// it is known whether a new row is its twin.
#[derive(Debug, Clone, Copy)]
pub struct Held(Entry);

impl Sealed {
    /// The rows by bucket of a merge of `buckets` (a power of two, at most
    /// [`CAPTURE_BUCKETS`]): all of them in memory for one, else each bucket's spill files.
    pub(super) fn into_buckets(
        self,
        buckets: usize,
        disk: &Arc<DiskManager>,
    ) -> Result<std::result::Result<Vec<Entry>, Vec<Vec<SpillFileRef>>>> {
        match self {
            Sealed::Memory(rows) if buckets == 1 => Ok(Ok(rows)),
            Sealed::Memory(rows) => {
                let mut side = Side::new(buckets, disk, "new")?;
                side.push_all(&rows)?;
                side.finish_writing()?;
                Ok(Side::gather(vec![side], buckets))
            }
            Sealed::Files(files) if buckets == 1 => {
                let mut scratch = Scratch::default();
                scratch.read(&files, 0, true)?;
                Ok(Ok(scratch.new))
            }
            Sealed::Files(files) => {
                let per = CAPTURE_BUCKETS / buckets;
                Ok(Err(files.chunks(per).map(<[_]>::to_vec).collect()))
            }
        }
    }
}

impl Relabel {
    /// Gives each row its merge label and flag; drops the rows of unfinished attempts.
    pub(super) fn apply(&self, rows: &mut Vec<Entry>) {
        rows.retain_mut(
            |e| match self.labels.get(e.label() as usize).copied().flatten() {
                Some((label, diffed)) => {
                    e.relabel(label, diffed);
                    if !self.twins {
                        *e = e.with_twin(false);
                    }
                    true
                }
                None => false,
            },
        );
    }

    /// Whether the new rows it relabels keep their twin flags: only when the old side they are
    /// paired with is the capture that left their twins out ([`Capture::elides`]). Otherwise
    /// the old side holds every old row, and a twin is an ordinary new row.
    pub(super) fn with_twins(mut self, twins: bool) -> Self {
        self.twins = twins;
        self
    }
}

impl Capture {
    /// A capture of the rows of a target with `schema`, compared by `key`, labelled by the
    /// partition columns `parts`; `None` when the key merge could not use one (no key, or a key
    /// that hashing cannot compare).
    pub fn new(
        disk: Arc<DiskManager>,
        schema: &Schema,
        key: &[String],
        parts: &[String],
        sample: usize,
    ) -> Option<Self> {
        let key_types = key
            .iter()
            .map(|k| {
                let field = schema.field_with_name(k).ok()?;
                key_hashable(field.data_type()).then(|| key_type_class(field.data_type()))
            })
            .collect::<Option<Vec<_>>>()?;
        if key.is_empty() || parts.iter().any(|p| schema.index_of(p).is_err()) {
            return None;
        }
        let compared = schema
            .fields()
            .iter()
            .filter(|f| !key.contains(f.name()))
            .map(|f| (f.name().clone(), key_type_class(f.data_type())))
            .collect();
        Some(Self {
            key: key.to_vec(),
            compared,
            key_types,
            parts: parts.to_vec(),
            sample,
            memory_rows: MEMORY_ROWS,
            disk,
            old: None,
            state: Mutex::new(State::default()),
            files: std::sync::OnceLock::new(),
        })
    }

    /// A capture of the old rows of a comparison, hashed as something else reads them whole
    /// (an adjustments run's difference): as [`Self::new`] (`schema`: the compared columns with
    /// the types of the rows seen), and per partition their rows, the exact sum of their
    /// checksums over `checksum` (columns of `schema`, in order) and the sums of `measures` as
    /// doubles. The rows seen may lack the columns `absent_null`, which are then NULL on the
    /// side captured. Its rows are written by [`CaptureWriter::add_batch`].
    #[allow(clippy::too_many_arguments)]
    pub fn old_side(
        disk: Arc<DiskManager>,
        schema: &Schema,
        key: &[String],
        parts: &[String],
        sample: usize,
        checksum: &[String],
        measures: &[String],
        absent_null: &[String],
    ) -> Option<Self> {
        let checksum = checksum
            .iter()
            .map(|c| {
                let field = schema.field_with_name(c).ok()?;
                Some((c.clone(), key_type_class(field.data_type())))
            })
            .collect::<Option<Vec<_>>>()?;
        if measures.iter().any(|m| schema.index_of(m).is_err()) {
            return None;
        }
        let mut capture = Self::new(disk, schema, key, parts, sample)?;
        capture.old = Some(OldSide {
            checksum,
            measures: measures.to_vec(),
            absent_null: absent_null.to_vec(),
        });
        Some(capture)
    }

    /// Keeps at most `rows` rows in memory (for tests of the spill files).
    #[cfg(test)]
    pub fn with_memory_rows(mut self, rows: usize) -> Self {
        self.memory_rows = rows;
        self
    }

    /// Whether a merge took its rows.
    #[cfg(test)]
    pub fn sealed(&self) -> bool {
        self.with_state(|state| state.sealed)
    }

    /// A writer for one attempt at writing a batch.
    pub fn writer(self: &Arc<Self>) -> CaptureWriter {
        let attempt = self.with_state(|state| {
            state.attempts.push(Attempt::default());
            state.attempts.len() - 1
        });
        CaptureWriter {
            capture: Arc::clone(self),
            attempt,
            labels: HashMap::new(),
            pending: Vec::new(),
            chunks: Vec::new(),
            nulls: BTreeMap::new(),
            totals: HashMap::new(),
            partitions: SideLabels::default(),
            read: BTreeSet::new(),
        }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// Whether the finished attempts are exactly `batches` (each its index and the paths of its
    /// staged files; each once, with the same files).
    pub fn covers(&self, batches: &[(usize, BTreeSet<String>)]) -> bool {
        self.with_state(|state| {
            if state.broken.is_some() {
                return false;
            }
            let finished: Vec<&Attempt> = state
                .attempts
                .iter()
                .filter(|a| a.batch.is_some())
                .collect();
            finished.len() == batches.len()
                && batches.iter().all(|(index, files)| {
                    finished
                        .iter()
                        .filter(|a| a.batch == Some(*index))
                        .map(|a| &a.files)
                        .eq(std::iter::once(files))
                })
        })
    }

    /// The files whose every row the finished attempts of an old side hashed
    /// ([`CaptureWriter::read_whole`]): what it holds, for a caller that knows which files the
    /// old side is; `None` once it cannot be used.
    pub fn read_whole(&self) -> Option<BTreeSet<String>> {
        self.with_state(|state| {
            state.broken.is_none().then(|| {
                state
                    .attempts
                    .iter()
                    .filter(|a| a.batch.is_some())
                    .flat_map(|a| a.read.iter().cloned())
                    .collect()
            })
        })
    }

    /// Whether the rows it hashed are what the merge would compute on a side with `schema`:
    /// the same compared columns (`compared`, in order) and key, with the same types.
    pub(super) fn fits(&self, spec: &CompareSpec, compared: &[String], schema: &Schema) -> bool {
        let same = |name: &str, class: &DataType| {
            schema
                .field_with_name(name)
                .is_ok_and(|f| key_type_class(f.data_type()) == *class)
        };
        spec.key == self.key
            && spec.partitions.columns() == self.parts
            && compared.len() == self.compared.len()
            && compared
                .iter()
                .zip(&self.compared)
                .all(|(c, (name, class))| c == name && same(name, class))
            && self
                .key
                .iter()
                .zip(&self.key_types)
                .all(|(k, t)| same(k, t))
    }

    /// Whether, as the old side of a whole-old merge, its totals are the merge's: a checksum of
    /// `checksum` (with the types `schema` has) and sums of the spec's measures.
    pub(super) fn fits_totals(
        &self,
        spec: &CompareSpec,
        checksum: &[String],
        schema: &Schema,
    ) -> bool {
        self.old.as_ref().is_some_and(|old| {
            old.measures == spec.measures
                && old.checksum.len() == checksum.len()
                && old.checksum.iter().zip(checksum).all(|((name, class), c)| {
                    name == c
                        && schema
                            .field_with_name(name)
                            .is_ok_and(|f| key_type_class(f.data_type()) == *class)
                })
        })
    }

    /// Whether it captured an old side.
    pub(super) fn is_old_side(&self) -> bool {
        self.old.is_some()
    }

    /// Whether, as an old side, it left out rows that the new side's twins stand for
    /// ([`CaptureWriter::hold_batch`]): then it is the old side only beside the new rows
    /// captured by the same run's writers, with their twin flags.
    pub(super) fn elides(&self) -> bool {
        self.with_state(|state| state.elided)
    }

    /// Whether a merge of `buckets` buckets can pair these rows.
    pub(super) fn fits_buckets(&self, buckets: usize) -> bool {
        buckets.is_power_of_two() && buckets <= CAPTURE_BUCKETS
    }

    /// Takes the rows out (the capture is spent), with the labels they get in `table` (diffed
    /// when `differing` holds their text, or without it), and the rows with a NULL key as a
    /// reading task's tally.
    pub(super) fn seal(
        &self,
        spec: &CompareSpec,
        table: &mut LabelTable,
        differing: Option<&BTreeSet<String>>,
    ) -> Result<(Sealed, Relabel, ReadTally)> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(why) = &state.broken {
            return Err(Error::Internal(format!(
                "the new rows hashed while staging cannot be used: {why}"
            )));
        }
        state.sealed = true;
        let mut labels = Vec::with_capacity(state.labels.len());
        for (attempt, values) in &state.labels {
            let finished = state
                .attempts
                .get(*attempt)
                .is_some_and(|a| a.batch.is_some());
            labels.push(match finished {
                true => {
                    let label = table.intern(spec, values.clone())?;
                    let text = &table.labels[label as usize].text;
                    Some((label, differing.is_none_or(|d| d.contains(text))))
                }
                false => None,
            });
        }
        let relabel = Relabel {
            labels,
            twins: false,
        };
        let mut tally = ReadTally::default();
        let old_side = self.old.is_some();
        // A NULL key matches nothing: a new row with one is added (and counted among the key
        // facts), an old one removed.
        let kind = if old_side { REMOVED } else { ADDED };
        for (label, nulls) in std::mem::take(&mut state.nulls) {
            let Some((label, diffed)) = relabel.labels.get(label as usize).copied().flatten()
            else {
                continue;
            };
            if !old_side {
                tally.null_rows += nulls.rows;
            }
            if !diffed {
                continue;
            }
            tally.counts.entry(label).or_default()[kind] += nulls.rows;
            for mut entry in nulls.samples {
                entry.relabel(label, true);
                if tally.samples[kind].len() < spec.sample {
                    let (new, old) = match old_side {
                        true => (None, Some(entry)),
                        false => (Some(entry), None),
                    };
                    tally.samples[kind].push(Pending {
                        label,
                        coalesce_with: None,
                        key: SampledKey::Null,
                        new,
                        old,
                    });
                }
            }
        }
        for (label, totals) in std::mem::take(&mut state.totals) {
            let Some((label, _)) = relabel.labels.get(label as usize).copied().flatten() else {
                continue;
            };
            let total = tally
                .totals
                .entry(label)
                .or_insert_with(|| LabelTotals::zero(totals.sums.len()));
            total.add(&totals);
        }
        let sealed = match self.files.get() {
            None => Sealed::Memory(std::mem::take(&mut state.memory)),
            Some(files) => {
                for writer in &files.writers {
                    let writer = writer
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take();
                    if let Some(mut writer) = writer {
                        writer
                            .finish()
                            .query_context(|| "cannot finish a spill file".into())?;
                    }
                }
                let taken = std::mem::take(
                    &mut *files
                        .files
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                );
                Sealed::Files(taken)
            }
        };
        Ok((sealed, relabel, tally))
    }

    /// Adds `rows` (of finished or unfinished attempts alike) to the rows in memory while they
    /// fit; else starts the spill files (with the rows so far) and returns `false`: the writer
    /// then writes its rows to the files itself.
    fn keep_in_memory(&self, rows: &mut Vec<Entry>) -> bool {
        if self.files.get().is_some() {
            return false;
        }
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.broken.is_some() {
            rows.clear();
            return true;
        }
        if self.files.get().is_some() {
            return false;
        }
        if state.memory.len() + rows.len() <= self.memory_rows {
            state.memory.append(rows);
            return true;
        }
        let memory = std::mem::take(&mut state.memory);
        let started = self
            .start_files()
            .and_then(|files| write_chunks(files, &mut Vec::new(), &memory, true));
        if let Err(e) = started {
            state.broken = Some(e.to_string());
            rows.clear();
            return true;
        }
        false
    }

    /// Creates the spill files (once; the caller holds the state's lock).
    fn start_files(&self) -> Result<&Files> {
        if let Some(files) = self.files.get() {
            return Ok(files);
        }
        let mut files = Vec::with_capacity(CAPTURE_BUCKETS);
        let mut writers = Vec::with_capacity(CAPTURE_BUCKETS);
        for _ in 0..CAPTURE_BUCKETS {
            let file = self
                .disk
                .create_tmp_file("hashing the new rows by key while staging")
                .query_context(|| "cannot create a spill file to hash the new rows".into())?;
            let writer = file
                .open_writer()
                .query_context(|| "cannot write a spill file to hash the new rows".into())?;
            writers.push(Mutex::new(Some(writer)));
            files.push(file);
        }
        let _ = self.files.set(Files {
            files: Mutex::new(files),
            writers,
        });
        self.files
            .get()
            .ok_or_else(|| Error::Internal("the spill files are not there".into()))
    }

    fn label(&self, attempt: usize, values: Vec<ScalarValue>) -> Result<u32> {
        self.with_state(|state| {
            let label = u32::try_from(state.labels.len())
                .ok()
                .filter(|l| *l < super::MAX_LABELS)
                .ok_or_else(|| Error::Internal("too many partitions to hash".into()))?;
            state.labels.push((attempt, values));
            Ok(label)
        })
    }

    fn break_with(&self, why: String) {
        self.with_state(|state| {
            state.broken.get_or_insert(why);
            state.memory = Vec::new();
        });
    }
}

/// Puts `rows` into their buckets' `chunks` and writes each chunk that is full (every one,
/// with `all`) to its bucket's file.
fn write_chunks(files: &Files, chunks: &mut Vec<Vec<u8>>, rows: &[Entry], all: bool) -> Result<()> {
    chunks.resize_with(CAPTURE_BUCKETS, Vec::new);
    let shift = 64 - CAPTURE_BUCKETS.trailing_zeros();
    let mut record = [0u8; RECORD];
    for entry in rows {
        encode(entry, &mut record);
        chunks[(entry.k1 >> shift) as usize].extend_from_slice(&record);
    }
    for (chunk, writer) in chunks.iter_mut().zip(&files.writers) {
        if chunk.is_empty() || (!all && chunk.len() < CHUNK) {
            continue;
        }
        let mut writer = writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let writer = writer
            .as_mut()
            .ok_or_else(|| Error::Internal("a spill file was finished early".into()))?;
        writer.write_all(chunk).map_err(super::spill_error)?;
        chunk.clear();
    }
    Ok(())
}

/// One attempt at writing a batch: hashes the rows it is given and hands them to the capture.
pub struct CaptureWriter {
    capture: Arc<Capture>,
    attempt: usize,
    labels: HashMap<Vec<ScalarValue>, u32>,
    pending: Vec<Entry>,
    /// Records per bucket not yet written, once the capture is in files.
    chunks: Vec<Vec<u8>>,
    nulls: BTreeMap<u32, NullRows>,
    /// The old side's totals per capture label ([`Capture::old_side`]).
    totals: HashMap<u32, LabelTotals>,
    /// The old side's partition values and their labels ([`Self::add_batch`]).
    partitions: SideLabels,
    /// The old files whose every row it hashed ([`Self::read_whole`]).
    read: BTreeSet<String>,
}

impl CaptureWriter {
    /// Hashes `rows` rows of one partition (whose label columns hold `values`), each column
    /// found by name by `column`, or its [`value_hashes`] by `cached`. `twins`: per row, whether
    /// it is identical to an old row of its partition that the old side's capture leaves out
    /// ([`Self::hold_batch`]), for the merge to pair it with. A failure spoils the capture
    /// (validation then reads the staged files), never the write.
    pub fn add<'a>(
        &mut self,
        column: impl Fn(&str) -> Option<ArrayRef>,
        cached: impl Fn(&str) -> Option<&'a [u64]>,
        (rows, twins): (usize, Option<&[bool]>),
        values: impl FnOnce(&[String]) -> Option<Vec<ScalarValue>>,
    ) {
        if let Err(why) = self.try_add(column, cached, (rows, twins), values) {
            self.capture.break_with(why.to_string());
        }
    }

    /// Hashes the rows of `batch`, of any partitions, for a capture of the old side
    /// ([`Capture::old_side`]): each column found by name (or NULL, for the columns it may
    /// lack), its [`value_hashes`] by `cached` when they were taken, with its partition's
    /// totals. A failure spoils the capture, never the read.
    pub fn add_batch<'a>(
        &mut self,
        batch: &RecordBatch,
        cached: impl Fn(&str) -> Option<&'a [u64]>,
    ) {
        if let Err(why) = self.try_add_batch(batch, cached, None) {
            self.capture.break_with(why.to_string());
        }
    }

    /// As [`Self::add_batch`], but the records of the rows with a key are held back, one per row
    /// of `batch` in order (`None` for a row with a NULL key, settled at once: it matches
    /// nothing). The caller gives back ([`Self::release`]) those of the rows no new row is the
    /// twin of; the others are left out, and the new side's twins stand for them. Their totals
    /// count at once. A failure spoils the capture and holds nothing.
    pub fn hold_batch<'a>(
        &mut self,
        batch: &RecordBatch,
        cached: impl Fn(&str) -> Option<&'a [u64]>,
    ) -> Vec<Option<Held>> {
        let mut held = Vec::with_capacity(batch.num_rows());
        self.capture.with_state(|state| state.elided = true);
        if let Err(why) = self.try_add_batch(batch, cached, Some(&mut held)) {
            self.capture.break_with(why.to_string());
            held.clear();
        }
        held
    }

    /// Gives back records held ([`Self::hold_batch`]): rows no new row is the twin of.
    pub fn release(&mut self, held: impl IntoIterator<Item = Held>) {
        for Held(entry) in held {
            self.pending.push(entry);
            if self.pending.len() >= FLUSH_ROWS {
                self.flush(false);
            }
        }
    }

    fn try_add_batch<'a>(
        &mut self,
        batch: &RecordBatch,
        cached: impl Fn(&str) -> Option<&'a [u64]>,
        mut hold: Option<&mut Vec<Option<Held>>>,
    ) -> Result<()> {
        let capture = Arc::clone(&self.capture);
        let old = capture
            .old
            .as_ref()
            .ok_or_else(|| Error::Internal("rows of any partition for a new side".into()))?;
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let column = |name: &str| -> Result<ArrayRef> {
            match batch.column_by_name(name) {
                Some(column) => Ok(Arc::clone(column)),
                None if old.absent_null.iter().any(|n| n == name) => {
                    Ok(new_null_array(&DataType::Utf8, rows))
                }
                None => Err(Error::Internal(format!("column `{name}` is not read"))),
            }
        };
        let labels = self.batch_labels(batch, rows)?;
        let keys = capture
            .key
            .iter()
            .map(|k| column(k))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let (k1, k2) = (key_hashes(0, &keys, rows)?, key_hashes(1, &keys, rows)?);
        // Each column hashed once (unless it was already), for the row hash and the checksum.
        let mut values: HashMap<&str, Cow<'_, [u64]>> = HashMap::new();
        for name in capture
            .compared
            .iter()
            .map(|(n, _)| n)
            .chain(old.checksum.iter().map(|(n, _)| n))
        {
            if !values.contains_key(name.as_str()) {
                let hashed = match cached(name) {
                    Some(hashes) if hashes.len() == rows => Cow::Borrowed(hashes),
                    _ => Cow::Owned(value_hashes(&column(name)?)?),
                };
                values.insert(name.as_str(), hashed);
            }
        }
        let combined = |names: &mut dyn Iterator<Item = &String>| {
            let columns: Vec<&[u64]> = names.map(|n| values[n.as_str()].as_ref()).collect();
            combine_rows(&columns, rows)
        };
        let hashes = combined(&mut capture.compared.iter().map(|(n, _)| n));
        let checksums = combined(&mut old.checksum.iter().map(|(n, _)| n));
        let measures = old
            .measures
            .iter()
            .map(|m| {
                let doubles = cast(&column(m)?, &DataType::Float64)
                    .map_err(|e| Error::Internal(format!("cannot sum measure `{m}`: {e}")))?;
                doubles
                    .as_primitive_opt::<Float64Type>()
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("measure `{m}` is not a double")))
            })
            .collect::<Result<Vec<_>>>()?;
        let measures: Vec<&deltalake::arrow::array::Float64Array> = measures.iter().collect();
        super::add_runs(&mut self.totals, &labels, &checksums, &measures);
        self.pending.reserve(rows);
        for (row, label) in labels.into_iter().enumerate() {
            let entry = Entry::new(k1.value(row), k2.value(row), hashes[row], label, true);
            let keyed = k1.is_valid(row);
            match hold.as_deref_mut() {
                Some(held) if keyed => held.push(Some(Held(entry))),
                Some(held) => {
                    held.push(None);
                    self.push(entry, false);
                }
                None => self.push(entry, keyed),
            }
        }
        if self.pending.len() >= FLUSH_ROWS {
            self.flush(false);
        }
        Ok(())
    }

    /// Gathers a row: to its bucket when its key has no NULL (`keyed`), else with the rows that
    /// match nothing (a few kept as samples).
    fn push(&mut self, entry: Entry, keyed: bool) {
        if keyed {
            self.pending.push(entry);
            return;
        }
        let nulls = self.nulls.entry(entry.label()).or_default();
        nulls.rows += 1;
        if nulls.samples.len() < self.capture.sample {
            // (A NULL key matches nothing: its twin, if it has one, was settled as removed.)
            nulls.samples.push(entry.with_twin(false));
        }
    }

    /// The capture label of each row of `batch`, by its partition values.
    fn batch_labels(&mut self, batch: &RecordBatch, rows: usize) -> Result<Vec<u32>> {
        let parts =
            self.capture
                .parts
                .iter()
                .map(|p| {
                    batch.column_by_name(p).cloned().ok_or_else(|| {
                        Error::Internal(format!("partition column `{p}` is not read"))
                    })
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
        let mut partitions = std::mem::take(&mut self.partitions);
        let labels = partitions.labels(&parts, rows, &mut |values| self.label_of(values));
        self.partitions = partitions;
        labels
    }

    /// This attempt's capture label of the partition values `values`.
    fn label_of(&mut self, values: Vec<ScalarValue>) -> Result<u32> {
        if let Some(label) = self.labels.get(&values) {
            return Ok(*label);
        }
        let label = self.capture.label(self.attempt, values.clone())?;
        self.labels.insert(values, label);
        Ok(label)
    }

    fn try_add<'a>(
        &mut self,
        column: impl Fn(&str) -> Option<ArrayRef>,
        cached: impl Fn(&str) -> Option<&'a [u64]>,
        (rows, twins): (usize, Option<&[bool]>),
        values: impl FnOnce(&[String]) -> Option<Vec<ScalarValue>>,
    ) -> Result<()> {
        let capture = Arc::clone(&self.capture);
        let values = values(&capture.parts)
            .ok_or_else(|| Error::Internal("a partition value cannot be read".into()))?;
        let label = self.label_of(values)?;
        let column = |name: &str| {
            column(name).ok_or_else(|| Error::Internal(format!("column `{name}` is not staged")))
        };
        let keys = capture
            .key
            .iter()
            .map(|k| column(k))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let (k1, k2) = (key_hashes(0, &keys, rows)?, key_hashes(1, &keys, rows)?);
        let compared = capture
            .compared
            .iter()
            .map(|(name, _)| match cached(name) {
                Some(values) => Ok(Cow::Borrowed(values)),
                None => Ok(Cow::Owned(value_hashes(&column(name)?)?)),
            })
            .collect::<Result<Vec<Cow<'_, [u64]>>>>()?;
        let compared: Vec<&[u64]> = compared.iter().map(AsRef::as_ref).collect();
        let hashes = combine_rows(&compared, rows);
        self.pending.reserve(rows);
        if twins.is_some_and(|t| t.len() != rows) {
            return Err(Error::Internal("twin flags not of every row".into()));
        }
        for (row, hash) in hashes.into_iter().enumerate() {
            let twin = twins.is_some_and(|t| t[row]);
            let entry = Entry::new(k1.value(row), k2.value(row), hash, label, true).with_twin(twin);
            self.push(entry, k1.is_valid(row));
        }
        if self.pending.len() >= FLUSH_ROWS {
            self.flush(false);
        }
        Ok(())
    }

    /// Hands the rows gathered to the capture; `all`: every one, not only full chunks.
    fn flush(&mut self, all: bool) {
        if self.capture.keep_in_memory(&mut self.pending) && self.chunks.is_empty() {
            return;
        }
        let written = match self.capture.files.get() {
            Some(files) => write_chunks(files, &mut self.chunks, &self.pending, all),
            None => Err(Error::Internal("the spill files are not there".into())),
        };
        self.pending.clear();
        if let Err(e) = written {
            self.capture.break_with(e.to_string());
        }
    }

    /// The rows of the old file `path` it was given ([`Self::add_batch`]) were every row the
    /// file holds: the file is on the old side this attempt captured ([`Capture::read_whole`]).
    pub fn read_whole(&mut self, path: &str) {
        self.read.insert(path.to_string());
    }

    /// The capture cannot be used: `why` (an old side's rows it was not given).
    pub fn spoil(&mut self, why: &str) {
        self.capture.break_with(why.to_string());
    }

    /// The attempt wrote batch `batch` as `files`: its rows count.
    pub fn finish(mut self, batch: usize, files: impl Iterator<Item = String>) {
        self.flush(true);
        let nulls = std::mem::take(&mut self.nulls);
        let totals = std::mem::take(&mut self.totals);
        let read = std::mem::take(&mut self.read);
        let attempt = self.attempt;
        self.capture.with_state(|state| {
            for (label, rows) in nulls {
                let total = state.nulls.entry(label).or_default();
                total.rows += rows.rows;
                total.samples.extend(rows.samples);
            }
            // (Each capture label is one attempt's: its totals arrive once.)
            state.totals.extend(totals);
            if let Some(a) = state.attempts.get_mut(attempt) {
                a.batch = Some(batch);
                a.files = files.collect();
                a.read = read;
            }
        });
    }
}
