//! The row-level diff by key as a merge of two sorted streams of hashes, with the key checks in
//! the same pass.
//!
//! Each side is reduced to rows of four narrow values: the partition columns, a hash of the key
//! (two independent 64-bit halves, NULL when a key column is NULL, of which the merge keeps 96
//! bits) and the 64-bit hash of every other column both sides have ([`lakefill_table::rowhash`]), 24
//! bytes a row with the partition as a label number. The rows go to buckets by the top bits of the key hash (in memory for small
//! sides, else spill files of the session's disk manager, sized so that one bucket of both sides
//! is at most 64 MiB, less under a small memory pool), and each bucket is sorted and merged on
//! its own, a bucket per core at a time: rows whose key hashes agree
//! are paired, and a pair whose row hashes differ is a changed row. Memory stays at one bucket
//! whatever the size of the sides; no join, no sort of whole rows. The new side is read whole, so the same pass counts repeated keys and NULL keys
//! of every new row ([`KeyFacts`]); rows of partitions whose checksums already agree are only
//! counted there, not diffed.
//!
//! It gives what the full outer join of whole rows on the key gives (the tests hold it to that
//! reference): a NULL key matches nothing, a repeated key pairs every old row with every new one,
//! a changed row counts under its new partition. Keys that hashing cannot compare as SQL's `=`
//! does (floats, nested types, or types that differ between the sides) are left to the join of
//! [`super::rowdiff`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use deltalake::datafusion::execution::disk_manager::DiskManager;

use deltalake::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array};
use deltalake::arrow::datatypes::{Schema, UInt64Type};
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::datafusion::common::ScalarValue;
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;

mod capture;
mod changes;

pub use capture::{Capture, CaptureWriter, Held};
pub use changes::{FirstOf, FoundChanges, KeyChange, KeyChanges, PartitionRows, SideRows};

use super::edges::{EdgeProbe, Hit};
use super::rowdiff::{
    ADDED, CHANGED, REMOVED, RowDiff, Sampled, SampledKey, compared_columns, partition_label,
    read_back,
};
use super::spec::{CompareSpec, LoggedChecksums};
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::rowhash::{key_hash_sql, key_hashable, key_type_class, row_hash_sql};
use lakefill_table::sqltext::ident;

/// What the pass saw of the new rows' keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyFacts {
    /// Keys that more than one new row has.
    pub duplicate_keys: u64,
    /// New rows with a NULL in a key column.
    pub null_rows: u64,
}

/// Compares `old` (the rows of the differing partitions) with `new` (every new row; those for
/// which `differing` does not hold only count towards [`KeyFacts`]) by `spec.key`. `None` when
/// the key cannot be compared by its hashes: then use [`super::rowdiff::row_diff`].
/// `expected_rows` (both sides) sizes the buckets. `captured`: the new side as the run's writers
/// hashed it, with the labels of the partitions `differing` selects (all without them), used
/// when it fits.
pub async fn merge_diff(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old: &str,
    new: &str,
    differing: Option<Expr>,
    expected_rows: u64,
    captured: Option<(&Capture, Option<&BTreeSet<String>>)>,
) -> Result<Option<(RowDiff, KeyFacts)>> {
    let Some(columns) = Columns::of(ctx, spec, old, new).await? else {
        return Ok(None);
    };
    columns.may_record_changes(spec);
    let buckets = bucket_count(expected_rows, bucket_bytes(ctx));
    let captured = captured.filter(|(c, _)| columns.fit(spec, c, buckets));
    let Columns {
        common,
        parts,
        hash,
        ..
    } = columns;
    let narrow =
        |table: &str, hash: &str, flag: &str| narrow_sql(spec, &parts, table, hash, flag, &[]);
    // The old side: only the differing partitions. The new side: every row, those of the other
    // partitions only for their keys (no row hash: a scan of the key columns alone).
    let mut views = Vec::new();
    let mut register = |name: &str, rows: deltalake::datafusion::dataframe::DataFrame| {
        views.push(name.to_string());
        ctx.register_table(name, rows.into_view())
            .query_context(|| "cannot register the differing partitions".into())
    };
    let select = |table: &str, predicate: Expr| {
        let table = table.to_string();
        async move {
            ctx.table(table.as_str())
                .await
                .and_then(|df| df.filter(predicate))
                .query_context(|| "cannot select the differing partitions".into())
        }
    };
    let old_sql = match &differing {
        Some(predicate) => {
            register("__lf_merge_previous", select(old, predicate.clone()).await?)?;
            narrow("__lf_merge_previous", &hash, "TRUE")
        }
        None => narrow(old, &hash, "TRUE"),
    };
    let new_side = match (captured, &differing) {
        (Some((capture, labels)), _) => NewSide::Captured { capture, labels },
        (None, Some(predicate)) => {
            let rest = std::ops::Not::not(predicate.clone().is_true());
            register("__lf_merge_output", select(new, predicate.clone()).await?)?;
            register("__lf_merge_output_rest", select(new, rest).await?)?;
            NewSide::Queries(vec![
                narrow("__lf_merge_output", &hash, "TRUE"),
                narrow("__lf_merge_output_rest", "arrow_cast(0, 'UInt64')", "FALSE"),
            ])
        }
        (None, None) => NewSide::Queries(vec![narrow(new, &hash, "TRUE")]),
    };
    let result = async {
        let mut merge = Merge::new(spec, parts.len());
        merge.run(ctx, &old_sql, new_side, buckets).await?;
        let (counts, sampled, facts) = merge.finish();
        if let Some(changes) = &spec.changes {
            changes.finish();
        }
        let samples = read_back(ctx, spec, &common, &hash, old, new, &parts, sampled).await?;
        Ok::<_, Error>((RowDiff { counts, samples }, facts))
    }
    .await;
    for view in views {
        let _ = ctx.deregister_table(view.as_str());
    }
    result.map(Some)
}

/// What a comparison makes of the old side's totals: nothing to diff (the sides are identical),
/// or a diff of the partitions the predicate selects (with their labels), or of all of them.
pub enum Decision {
    /// The two sides are identical: nothing to diff.
    Identical,
    /// Diff the partitions the predicate selects (with their labels), or all of them (`None`).
    Diff(Option<(Expr, BTreeSet<String>)>),
}

/// [`merge_diff`] when most partitions are expected to differ: the old side is read whole once,
/// its rows, row checksums (of `checksum_columns`) and measure sums per partition label
/// aggregated in the same pass (instead of a scan of their own before the merge). `decide` then
/// says from those totals which partitions to diff; the old rows of the others are dropped
/// before pairing, so the result is [`merge_diff`]'s with the same predicate. `None` when the
/// key cannot be compared by its hashes. `captured`: the new side as the run's writers hashed
/// it, used when it fits. `logged`: the old partitions' checksums as the log has them; when it
/// has every one, the old rows are not checksummed here (the checksum hashes every column
/// again), and if the read finds a partition the log does not account for (or with other row
/// counts), the result is `None` too, for the caller to read the old side its other way.
/// `old_captured`: the old side as something that read it whole hashed it, with its totals
/// ([`Capture::old_side`]), used instead of reading `old` when it fits.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub async fn merge_diff_whole_old(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old: &str,
    new: &str,
    checksum_columns: &[String],
    logged: Option<&LoggedChecksums>,
    expected_rows: u64,
    (captured, old_captured): (Option<&Capture>, Option<&Capture>),
    decide: impl FnOnce(&BTreeMap<String, LabelTotals>) -> Result<Decision>,
) -> Result<Option<(BTreeMap<String, LabelTotals>, Option<(RowDiff, KeyFacts)>)>> {
    let Some(columns) = Columns::of(ctx, spec, old, new).await? else {
        return Ok(None);
    };
    let record_changes = columns.records_changes();
    let buckets = bucket_count(expected_rows, bucket_bytes(ctx));
    let captured = captured.filter(|c| columns.fit(spec, c, buckets));
    // An old side that left out the twins of new rows is the old side only beside those new rows.
    let old_captured = old_captured.filter(|c| {
        columns.fit_old(spec, c, buckets, checksum_columns) && (captured.is_some() || !c.elides())
    });
    let Columns {
        common,
        parts,
        hash,
        ..
    } = columns;
    let narrow = |table: &str, hash: &str, flag: &str, extra: &[String]| {
        narrow_sql(spec, &parts, table, hash, flag, extra)
    };
    let logged = logged.filter(|l| !l.is_empty() && l.values().all(Option::is_some));
    let checksum = match logged {
        Some(_) => "arrow_cast(0, 'UInt64')".to_string(),
        None => row_hash_sql(checksum_columns),
    };
    let mut totals_columns = vec![format!("{checksum} AS __lf_c")];
    totals_columns.extend(
        spec.measures
            .iter()
            .enumerate()
            .map(|(i, m)| format!("CAST({} AS DOUBLE) AS __lf_m{i}", ident(m))),
    );
    let mut merge = Merge::new(spec, parts.len());
    let started = std::time::Instant::now();
    let old_rows = match old_captured {
        Some(capture) => {
            let (sealed, relabel, mut tally) = capture.seal(spec, &mut merge.labels, None)?;
            merge.counts.resize(merge.labels.labels.len(), [0; 3]);
            merge.add_totals(&mut tally);
            merge.deferred.push(tally);
            let disk = Arc::clone(&ctx.runtime_env().disk_manager);
            OldRows {
                rows: sealed.into_buckets(buckets, &disk)?,
                relabel: Some(Arc::new(relabel)),
                elides: capture.elides(),
            }
        }
        None => {
            let old_sql = narrow(old, &hash, "TRUE", &totals_columns);
            let sides = merge
                .read(ctx, &old_sql, buckets, false, Some(spec.measures.len()))
                .await?;
            OldRows {
                rows: Side::gather(sides, buckets),
                relabel: None,
                elides: false,
            }
        }
    };
    let old_ms = started.elapsed().as_millis() as u64;
    let mut by_text: BTreeMap<String, LabelTotals> = BTreeMap::new();
    for (label, totals) in &merge.totals {
        let text = merge.labels.labels[*label as usize].text.clone();
        by_text
            .entry(text)
            .or_insert_with(|| LabelTotals::zero(totals.sums.len()))
            .add(totals);
    }
    if let Some(logged) = logged {
        for (text, totals) in by_text.iter_mut() {
            match logged.get(text).copied().flatten() {
                Some(checksum) if checksum.rows == totals.rows => totals.checksum = checksum.sum,
                _ => {
                    tracing::debug!(
                        partition = text.as_str(),
                        "the log has no checksum of this old partition's rows: reading again"
                    );
                    return Ok(None);
                }
            }
        }
    }
    let differing = match decide(&by_text)? {
        Decision::Identical => return Ok(Some((by_text, None))),
        Decision::Diff(differing) => differing,
    };
    if let Some(changes) = &spec.changes {
        match record_changes {
            true => changes.start(differing.as_ref().map(|(_, labels)| labels.clone())),
            false => changes.give_up(),
        }
    }
    let keep: Option<Arc<Vec<bool>>> = differing.as_ref().map(|(_, labels)| {
        Arc::new(
            merge
                .labels
                .labels
                .iter()
                .map(|l| labels.contains(&l.text))
                .collect(),
        )
    });
    for tally in std::mem::take(&mut merge.deferred) {
        merge.absorb_read(tally, keep.as_deref().map(Vec::as_slice));
    }
    let mut views = Vec::new();
    let new_side = match (&differing, captured) {
        (_, Some(capture)) => NewSide::Captured {
            capture,
            labels: differing.as_ref().map(|(_, labels)| labels),
        },
        (Some((predicate, _)), None) => {
            let rest = std::ops::Not::not(predicate.clone().is_true());
            for (name, predicate) in [
                ("__lf_merge_output", predicate.clone()),
                ("__lf_merge_output_rest", rest),
            ] {
                let rows = ctx
                    .table(new)
                    .await
                    .and_then(|df| df.filter(predicate))
                    .query_context(|| "cannot select the differing partitions".into())?;
                views.push(name);
                ctx.register_table(name, rows.into_view())
                    .query_context(|| "cannot register the differing partitions".into())?;
            }
            NewSide::Queries(vec![
                narrow("__lf_merge_output", &hash, "TRUE", &[]),
                narrow(
                    "__lf_merge_output_rest",
                    "arrow_cast(0, 'UInt64')",
                    "FALSE",
                    &[],
                ),
            ])
        }
        (None, None) => NewSide::Queries(vec![narrow(new, &hash, "TRUE", &[])]),
    };
    let result = async {
        merge
            .run_new(ctx, old_rows, new_side, buckets, keep, started, old_ms)
            .await?;
        let (counts, sampled, facts) = merge.finish();
        if let Some(changes) = &spec.changes {
            changes.finish();
        }
        let samples = read_back(ctx, spec, &common, &hash, old, new, &parts, sampled).await?;
        Ok::<_, Error>((RowDiff { counts, samples }, facts))
    }
    .await;
    for view in views {
        let _ = ctx.deregister_table(view);
    }
    Ok(Some((by_text, Some(result?))))
}

/// The query reducing `table`'s rows to what the merge reads: the partition columns, both key
/// hash halves, the row hash `hash`, the differing-partition `flag`, then `extra` columns.
fn narrow_sql(
    spec: &CompareSpec,
    parts: &[String],
    table: &str,
    hash: &str,
    flag: &str,
    extra: &[String],
) -> String {
    let mut select: Vec<String> = parts.iter().map(|c| ident(c)).collect();
    select.push(format!("{} AS __lf_k1", key_hash_sql(0, &spec.key)));
    select.push(format!("{} AS __lf_k2", key_hash_sql(1, &spec.key)));
    select.push(format!("{hash} AS __lf_h"));
    select.push(format!("{flag} AS __lf_d"));
    select.extend(extra.iter().cloned());
    format!("SELECT {} FROM {table}", select.join(", "))
}

/// What both sides' rows are reduced to: the columns both have, the partition columns, and
/// the row hash over the compared ones.
struct Columns {
    common: Vec<String>,
    parts: Vec<String>,
    hash: String,
    /// The columns the row hash covers, in order.
    compared: Vec<String>,
    old_schema: Schema,
    new_schema: Schema,
}

impl Columns {
    /// `None` when the key cannot be compared by its hashes.
    async fn of(
        ctx: &SessionContext,
        spec: &CompareSpec,
        old: &str,
        new: &str,
    ) -> Result<Option<Self>> {
        let schema = |table: &str| {
            let table = table.to_string();
            async move {
                ctx.table(table.as_str())
                    .await
                    .query_context(|| format!("table `{table}` is not registered"))
                    .map(|df| df.schema().as_arrow().clone())
            }
        };
        let (old_schema, new_schema) = (schema(old).await?, schema(new).await?);
        if !hashable_keys(spec, &old_schema, &new_schema) {
            return Ok(None);
        }
        lakefill_table::rowhash::register_hash_functions(ctx);
        let (common, compared) = compared_columns(ctx, spec, old, new).await?;
        Ok(Some(Self {
            common,
            parts: spec.partitions.columns(),
            hash: row_hash_sql(&compared),
            compared,
            old_schema,
            new_schema,
        }))
    }

    /// Whether the merge tells each changed key as the change data feed does: the row hash
    /// covers every column of the new side (but the key), each of the old side's type (in
    /// another Arrow flavour, `Utf8View` or a dictionary, which hash alike).
    fn records_changes(&self) -> bool {
        let differing = self.new_schema.fields().iter().find(|field| {
            !self
                .old_schema
                .field_with_name(field.name())
                .is_ok_and(|old| {
                    key_type_class(old.data_type()) == key_type_class(field.data_type())
                })
        });
        if let Some(field) = differing {
            tracing::debug!(
                column = field.name().as_str(),
                "the sides differ in a column: the merge does not record the changed keys"
            );
        }
        differing.is_none()
    }

    /// Gives up the changes `spec` records (started by the caller) if the merge cannot tell
    /// them ([`Self::records_changes`]).
    fn may_record_changes(&self, spec: &CompareSpec) {
        if let Some(changes) = &spec.changes
            && !self.records_changes()
        {
            changes.give_up();
        }
    }

    /// Whether `capture` hashed the new side as a merge of `buckets` buckets would.
    fn fit(&self, spec: &CompareSpec, capture: &Capture, buckets: usize) -> bool {
        let fits = !capture.is_old_side()
            && capture.fits(spec, &self.compared, &self.new_schema)
            && capture.fits_buckets(buckets);
        if !fits {
            tracing::debug!("the new rows hashed while staging do not fit the comparison");
        }
        fits
    }

    /// Whether `capture` hashed the old side, and took its totals over `checksum`, as a
    /// whole-old merge of `buckets` buckets would.
    fn fit_old(
        &self,
        spec: &CompareSpec,
        capture: &Capture,
        buckets: usize,
        checksum: &[String],
    ) -> bool {
        let fits = capture.fits(spec, &self.compared, &self.old_schema)
            && capture.fits_totals(spec, checksum, &self.old_schema)
            && capture.fits_buckets(buckets);
        if !fits {
            tracing::debug!("the old rows hashed while staging do not fit the comparison");
        }
        fits
    }
}

/// Where the merge gets the new side's rows.
enum NewSide<'a> {
    /// From these queries, in order.
    Queries(Vec<String>),
    /// From what the run's writers hashed, diffing the partitions `labels` (all without them).
    Captured {
        capture: &'a Capture,
        labels: Option<&'a BTreeSet<String>>,
    },
}

/// The old side's rows by bucket (in memory for one, else each bucket's spill files), and what
/// they become when read, when they were captured ([`Relabel`]).
struct OldRows {
    rows: std::result::Result<Vec<Entry>, Vec<Vec<SpillFileRef>>>,
    relabel: Option<Arc<capture::Relabel>>,
    /// Whether it left out the old rows the new side's twins stand for ([`Capture::elides`]).
    elides: bool,
}

/// Whether every key column exists on both sides with one type class that hashing compares as
/// SQL's `=` does.
fn hashable_keys(spec: &CompareSpec, old: &Schema, new: &Schema) -> bool {
    !spec.key.is_empty()
        && spec
            .key
            .iter()
            .all(|k| match (old.field_with_name(k), new.field_with_name(k)) {
                (Ok(o), Ok(n)) => {
                    key_hashable(o.data_type())
                        && key_hashable(n.data_type())
                        && key_type_class(o.data_type()) == key_type_class(n.data_type())
                }
                _ => false,
            })
}

/// One row of a side, as the merge keeps it while pairing a key: 24 bytes, as in a spill file.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The first half of the key hash.
    k1: u64,
    /// The row hash.
    hash: u64,
    /// The low 32 bits of the second half of the key hash: the key is known by 96 bits (for a
    /// billion distinct keys, the odds that two share them are 6 in 10^12).
    k2: u32,
    /// The label (an index into [`Merge::labels`], below [`MAX_LABELS`]) above the
    /// differing-partition flag, under the twin flag (the top bit, [`Self::twin`]).
    tag: u32,
}

/// Labels a merge tells apart: the top two bits of an [`Entry`]'s tag are flags.
const MAX_LABELS: u32 = 1 << 30;

/// The twin flag of an [`Entry`]'s tag.
const TWIN: u32 = 1 << 31;

impl Entry {
    fn new(k1: u64, k2: u64, hash: u64, label: u32, diffed: bool) -> Self {
        Self {
            k1,
            hash,
            k2: k2 as u32,
            tag: (label << 1) | u32::from(diffed),
        }
    }

    fn label(&self) -> u32 {
        (self.tag & !TWIN) >> 1
    }

    /// Whether it is in a differing partition (always, on the old side).
    fn diffed(&self) -> bool {
        self.tag & 1 == 1
    }

    /// Whether it is a new row that stands for an identical old row of its partition too, which
    /// the old side then left out (a row of a fix by deletion vectors that an old row matched:
    /// see [`capture`]).
    fn twin(&self) -> bool {
        self.tag & TWIN != 0
    }

    /// It, flagged as the twin of an old row (`twin`), or not.
    fn with_twin(mut self, twin: bool) -> Self {
        self.tag = (self.tag & !TWIN) | if twin { TWIN } else { 0 };
        self
    }

    /// The old row a twin stands for (a diffed twin: the old side kept only the rows of the
    /// differing partitions).
    fn old_twin(&self) -> Option<Self> {
        (self.twin() && self.diffed()).then(|| self.with_twin(false))
    }

    fn relabel(&mut self, label: u32, diffed: bool) {
        self.tag = (self.tag & TWIN) | (label << 1) | u32::from(diffed);
    }

    /// The key hash, as samples name it.
    fn key(&self) -> (u64, u64) {
        (self.k1, u64::from(self.k2))
    }
}

/// A partition value seen, with its label.
struct Label {
    values: Vec<ScalarValue>,
    text: String,
}

/// The partition labels of one side's rows, each distinct partition value worked out once.
#[derive(Default)]
struct SideLabels {
    converter: Option<RowConverter>,
    /// Partition values (in the row format) to label indexes.
    known: deltalake::datafusion::common::HashMap<Box<[u8]>, u32>,
}

/// The size of a row in a bucket: the first half of the key hash, the row hash, 32 bits of the
/// second half, and the label with the differing-partition flag in its lowest bit.
const RECORD: usize = 24;

/// Bytes of rows a bucket of both sides is meant to hold (what pairing one bucket keeps in
/// memory), at most.
const BUCKET_BYTES: u64 = 64 * 1024 * 1024;

/// The bytes a bucket may hold under the session's memory pool: an eighth of the pool a worker
/// (every core pairs a bucket at a time), between 1 and 64 MiB.
fn bucket_bytes(ctx: &SessionContext) -> u64 {
    use deltalake::datafusion::execution::memory_pool::MemoryLimit;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    match ctx.runtime_env().memory_pool.memory_limit() {
        MemoryLimit::Finite(pool) => (pool as u64 / 8 / workers).clamp(1 << 20, BUCKET_BYTES),
        _ => BUCKET_BYTES,
    }
}

/// How many buckets the rows go to: one (in memory) when both sides fit in one, else enough
/// that a bucket of both sides holds about `bytes`, and at least 64.
fn bucket_count(expected_rows: u64, bytes: u64) -> usize {
    // Rows take a little more room in memory than on disk (padding).
    let in_memory = expected_rows * std::mem::size_of::<Entry>() as u64;
    if in_memory <= bytes {
        return 1;
    }
    let needed = in_memory.div_ceil(bytes);
    usize::try_from(needed.next_power_of_two().clamp(64, 1 << 14)).unwrap_or(1 << 14)
}

/// One side's rows, by bucket: in memory when there is one bucket, else in spill files of the
/// session's disk manager (removed when dropped).
struct Side {
    shift: u32,
    store: Store,
}

enum Store {
    Memory(Vec<Entry>),
    Files {
        /// Reused by [`Side::push_all`]: a batch's records by bucket, and where each starts.
        grouped: Vec<u8>,
        starts: Vec<usize>,
        files: Vec<Arc<dyn deltalake::datafusion::execution::spill_file::SpillFile>>,
        writers: Vec<
            Option<
                std::io::BufWriter<
                    Box<dyn deltalake::datafusion::execution::spill_file::SpillWriter>,
                >,
            >,
        >,
    },
}

impl Side {
    fn new(buckets: usize, disk: &Arc<DiskManager>, what: &str) -> Result<Self> {
        let store = if buckets == 1 {
            Store::Memory(Vec::new())
        } else {
            let mut files = Vec::with_capacity(buckets);
            let mut writers = Vec::with_capacity(buckets);
            for _ in 0..buckets {
                let file = disk
                    .create_tmp_file(&format!("comparing the {what} rows by key"))
                    .query_context(|| "cannot create a spill file to compare rows by key".into())?;
                let writer = file
                    .open_writer()
                    .query_context(|| "cannot write a spill file to compare rows by key".into())?;
                writers.push(Some(std::io::BufWriter::with_capacity(32 * 1024, writer)));
                files.push(file);
            }
            Store::Files {
                grouped: Vec::new(),
                starts: Vec::new(),
                files,
                writers,
            }
        };
        Ok(Self {
            shift: 64 - buckets.trailing_zeros(),
            store,
        })
    }

    /// Pushes `entries` (a record batch's rows): grouped by bucket first, so each bucket's
    /// writer gets one run of records instead of a record at a time.
    fn push_all(&mut self, entries: &[Entry]) -> Result<()> {
        let shift = self.shift;
        match &mut self.store {
            Store::Memory(rows) => rows.extend_from_slice(entries),
            Store::Files {
                writers,
                grouped,
                starts,
                ..
            } => {
                starts.clear();
                starts.resize(writers.len() + 1, 0);
                for entry in entries {
                    starts[(entry.k1 >> shift) as usize + 1] += RECORD;
                }
                for i in 1..starts.len() {
                    starts[i] += starts[i - 1];
                }
                grouped.resize(entries.len() * RECORD, 0);
                let mut next = starts.clone();
                for entry in entries {
                    let at = &mut next[(entry.k1 >> shift) as usize];
                    let record: &mut [u8; RECORD] = (&mut grouped[*at..*at + RECORD])
                        .try_into()
                        .map_err(|_| Error::Internal("a spill record is misplaced".into()))?;
                    encode(entry, record);
                    *at += RECORD;
                }
                for (bucket, writer) in writers.iter_mut().enumerate() {
                    let run = &grouped[starts[bucket]..starts[bucket + 1]];
                    if let (false, Some(writer)) = (run.is_empty(), writer.as_mut()) {
                        std::io::Write::write_all(writer, run).map_err(spill_error)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn finish_writing(&mut self) -> Result<()> {
        if let Store::Files { writers, .. } = &mut self.store {
            for writer in writers.iter_mut() {
                if let Some(mut w) = writer.take() {
                    std::io::Write::flush(&mut w).map_err(spill_error)?;
                    let mut inner = w.into_inner().map_err(|e| spill_error(e.into_error()))?;
                    inner
                        .finish()
                        .query_context(|| "cannot finish a spill file".into())?;
                }
            }
        }
        Ok(())
    }

    /// Every row of `sides`, when they are kept in memory; else the spill files of each bucket.
    fn gather(
        sides: Vec<Side>,
        buckets: usize,
    ) -> std::result::Result<Vec<Entry>, Vec<Vec<SpillFileRef>>> {
        if buckets == 1 {
            let mut rows = Vec::new();
            for side in sides {
                if let Store::Memory(more) = side.store {
                    rows.extend(more);
                }
            }
            return Ok(rows);
        }
        let mut files: Vec<Vec<SpillFileRef>> = vec![Vec::new(); buckets];
        for side in sides {
            if let Store::Files { files: mine, .. } = side.store {
                for (bucket, file) in mine.into_iter().enumerate() {
                    files[bucket].push(file);
                }
            }
        }
        Err(files)
    }
}

/// A spill file of one bucket of one side.
type SpillFileRef = Arc<dyn deltalake::datafusion::execution::spill_file::SpillFile>;

/// Buffers one pairing worker reuses from bucket to bucket (fresh ones cost a page fault every
/// 4 KiB, as much as the sorting).
#[derive(Default)]
struct Scratch {
    bytes: Vec<u8>,
    groups: Vec<usize>,
    old: Vec<Entry>,
    new: Vec<Entry>,
}

impl Scratch {
    /// Reads one side of a bucket from its spill files (one per reading task) into `old` or
    /// `new`, sorted by key hash. `fixed` is the number of top bits every key hash of the bucket
    /// shares.
    fn read(&mut self, files: &[SpillFileRef], fixed: u32, new: bool) -> Result<()> {
        self.bytes.clear();
        for file in files {
            let Some(path) = file.path() else {
                return Err(Error::Internal("a spill file has no local path".into()));
            };
            let mut file = std::fs::File::open(path).map_err(spill_error)?;
            std::io::Read::read_to_end(&mut file, &mut self.bytes).map_err(spill_error)?;
        }
        let out = if new { &mut self.new } else { &mut self.old };
        radix_sort(&self.bytes, fixed, &mut self.groups, out);
        Ok(())
    }
}

/// The spill record of a row.
fn encode(entry: &Entry, record: &mut [u8; RECORD]) {
    record[0..8].copy_from_slice(&entry.k1.to_le_bytes());
    record[8..16].copy_from_slice(&entry.hash.to_le_bytes());
    record[16..20].copy_from_slice(&entry.k2.to_le_bytes());
    record[20..24].copy_from_slice(&entry.tag.to_le_bytes());
}

/// The row a spill record holds.
fn record_entry(record: &[u8]) -> Entry {
    let word = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap_or_default());
    let half = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().unwrap_or_default());
    Entry {
        k1: word(0),
        hash: word(8),
        k2: half(16),
        tag: half(20),
    }
}

/// Puts the rows of `records` into `out` sorted by the first half of their key hash: a counting
/// pass on the bits below the `fixed` top bits every row shares spreads them into groups of
/// about four (the hashes are uniform), then each group is sorted by insertion (a comparison
/// sort of the whole bucket took twice as long; a large group, from a repeated key, is sorted
/// the ordinary way).
fn radix_sort(records: &[u8], fixed: u32, groups: &mut Vec<usize>, out: &mut Vec<Entry>) {
    let rows = records.len() / RECORD;
    let bits = (usize::BITS - (rows / 4).leading_zeros())
        .clamp(1, 24)
        .min(64 - fixed);
    let group = |k1: u64| ((k1 << fixed) >> (64 - bits)) as usize;
    groups.clear();
    groups.resize((1 << bits) + 1, 0);
    for record in records.chunks_exact(RECORD) {
        let k1 = u64::from_le_bytes(record[0..8].try_into().unwrap_or_default());
        groups[group(k1) + 1] += 1;
    }
    for i in 1..groups.len() {
        groups[i] += groups[i - 1];
    }
    let empty = Entry::new(0, 0, 0, 0, false);
    // Every slot is written below (the groups are a permutation of the rows): what the buffer
    // held for the bucket before is overwritten, not cleared first.
    out.truncate(rows);
    out.resize(rows, empty);
    // Each group's next free slot, in place of its start; shifted back afterwards.
    for record in records.chunks_exact(RECORD) {
        let entry = record_entry(record);
        let slot = &mut groups[group(entry.k1)];
        out[*slot] = entry;
        *slot += 1;
    }
    let mut start = 0;
    for end in groups.iter().take(1 << bits).copied() {
        let rows = &mut out[start..end];
        if rows.len() > 32 {
            rows.sort_unstable_by_key(|e| e.k1);
        } else {
            for i in 1..rows.len() {
                let mut j = i;
                while j > 0 && rows[j - 1].k1 > rows[j].k1 {
                    rows.swap(j - 1, j);
                    j -= 1;
                }
            }
        }
        start = end;
    }
}

/// Pairs both sides' rows of a bucket, each sorted by key hash; `record`: also tell how each
/// changed key changed ([`KeyChanges`]).
fn pair_bucket(
    old: &[Entry],
    new: &[Entry],
    nullable: &[bool],
    (sample, record): (usize, bool),
    edges: Option<&Arc<EdgeProbe>>,
) -> Tally {
    let mut tally = Tally::new(nullable.len(), sample);
    tally.edges = edges.cloned();
    tally.changes = record.then(Vec::new);
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        let key = match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) => o.k1.min(n.k1),
            (Some(o), None) => o.k1,
            (None, Some(n)) => n.k1,
            (None, None) => break,
        };
        let (from_i, from_j) = (i, j);
        while old.get(i).is_some_and(|e| e.k1 == key) {
            i += 1;
        }
        while new.get(j).is_some_and(|e| e.k1 == key) {
            j += 1;
        }
        tally.pair(key, &old[from_i..i], &new[from_j..j], nullable);
    }
    tally
}

/// What pairing one bucket found, to be added up in bucket order.
struct Tally {
    /// Per label index (as read).
    counts: Vec<[u64; 3]>,
    /// Changed rows whose new partition has a NULL value, by new and old label (their label is
    /// worked out when the tallies are added up).
    coalesced: BTreeMap<(u32, u32), u64>,
    /// The first differences of each kind.
    samples: [Vec<Pending>; 3],
    sample: usize,
    duplicate_keys: u64,
    /// The keys around the range, looked up for every added and removed key.
    edges: Option<Arc<EdgeProbe>>,
    /// Added (`true`) and removed keys the probe holds, with their labels.
    edge_hits: Vec<(bool, u32, (u64, u32))>,
    /// When recorded: how each changed key changed, in order.
    changes: Option<Vec<(u64, u32, KeyChange)>>,
    /// When recorded: the rows of each label index, by side and change.
    change_rows: Vec<PartitionRows>,
}

/// A sampled difference, before its label is known for sure.
struct Pending {
    label: u32,
    /// The old row's label, when the label is the new one's with NULLs taken from it.
    coalesce_with: Option<u32>,
    key: SampledKey,
    new: Option<Entry>,
    old: Option<Entry>,
}

impl Tally {
    fn new(labels: usize, sample: usize) -> Self {
        Self {
            counts: vec![[0; 3]; labels],
            coalesced: BTreeMap::new(),
            samples: [Vec::new(), Vec::new(), Vec::new()],
            sample,
            duplicate_keys: 0,
            edges: None,
            edge_hits: Vec::new(),
            changes: None,
            change_rows: Vec::new(),
        }
    }

    fn count(
        &mut self,
        kind: usize,
        label: u32,
        key: (u64, u64),
        new: Option<Entry>,
        old: Option<Entry>,
        nullable: &[bool],
    ) {
        // A changed row counts under its new partition, each NULL value taken from the old.
        let coalesce_with = match (kind, old) {
            (CHANGED, Some(o)) if nullable[label as usize] => Some(o.label()),
            _ => None,
        };
        match coalesce_with {
            Some(o) => *self.coalesced.entry((label, o)).or_default() += 1,
            None => self.counts[label as usize][kind] += 1,
        }
        if kind != CHANGED
            && let Some(edges) = &self.edges
            && edges.contains(key.0, key.1 as u32)
        {
            self.edge_hits
                .push((kind == ADDED, label, (key.0, key.1 as u32)));
        }
        if self.samples[kind].len() < self.sample {
            self.samples[kind].push(Pending {
                label,
                coalesce_with,
                key: SampledKey::Hashes(key.0, key.1),
                new,
                old,
            });
        }
    }

    /// Pairs the rows of one first half of a key hash (almost always one row a side); rows whose
    /// second halves differ have different keys.
    fn pair(&mut self, k1: u64, old: &[Entry], new: &[Entry], nullable: &[bool]) {
        // A twin stands for an old row too: alone, it is an old row and the same new row.
        if let ([], [n]) = (old, new)
            && n.old_twin().is_some()
        {
            return;
        }
        let with_twins: Vec<Entry>;
        let old = match new.iter().any(|n| n.old_twin().is_some()) {
            true => {
                with_twins = old
                    .iter()
                    .copied()
                    .chain(new.iter().filter_map(Entry::old_twin))
                    .collect();
                with_twins.as_slice()
            }
            false => old,
        };
        if let Some(changes) = &mut self.changes {
            record_changes(k1, old, new, (changes, &mut self.change_rows));
        }
        // The common cases, without sorting anything out: one row a side, or one side alone.
        match (old, new) {
            ([o], [n]) if o.k2 == n.k2 => {
                if n.diffed() && o.hash != n.hash {
                    self.count(CHANGED, n.label(), o.key(), Some(*n), Some(*o), nullable);
                } else if !n.diffed() {
                    self.count(REMOVED, o.label(), o.key(), None, Some(*o), nullable);
                }
                return;
            }
            ([o], []) => {
                self.count(REMOVED, o.label(), o.key(), None, Some(*o), nullable);
                return;
            }
            ([], [n]) => {
                if n.diffed() {
                    self.count(ADDED, n.label(), n.key(), Some(*n), None, nullable);
                }
                return;
            }
            _ => {}
        }
        for k2 in second_halves(old, new) {
            if new.iter().filter(|e| e.k2 == k2).count() > 1 {
                self.duplicate_keys += 1;
            }
            let news: Vec<&Entry> = new.iter().filter(|e| e.k2 == k2 && e.diffed()).collect();
            let key = (k1, u64::from(k2));
            let mut any_old = false;
            for o in old.iter().filter(|e| e.k2 == k2) {
                any_old = true;
                if news.is_empty() {
                    self.count(REMOVED, o.label(), key, None, Some(*o), nullable);
                }
                for n in &news {
                    if o.hash != n.hash {
                        self.count(CHANGED, n.label(), key, Some(**n), Some(*o), nullable);
                    }
                }
            }
            if !any_old {
                for n in news {
                    self.count(ADDED, n.label(), key, Some(*n), None, nullable);
                }
            }
        }
    }
}

/// The distinct second halves (of key hashes with one first half) of the rows of both sides: the
/// keys they are.
fn second_halves(old: &[Entry], new: &[Entry]) -> Vec<u32> {
    let mut k2s: Vec<u32> = old.iter().chain(new).map(|e| e.k2).collect();
    k2s.sort_unstable();
    k2s.dedup();
    k2s
}

/// How the keys of one first half of a key hash changed, as the change data feed tells them:
/// the rows of a key in the differing partitions (every old row; the new rows flagged) are
/// compared as multisets of row hashes. A key the partitions not compared also hold is told by
/// its rows in the compared ones (the others hold the same rows on both sides). `rows`: every
/// row counted under its label and side, by its key's change.
fn record_changes(
    k1: u64,
    old: &[Entry],
    new: &[Entry],
    (out, rows): (&mut Vec<(u64, u32, KeyChange)>, &mut Vec<PartitionRows>),
) {
    let mut count = |entry: &Entry, side: usize, change: Option<KeyChange>| {
        let label = entry.label() as usize;
        if rows.len() <= label {
            rows.resize(label + 1, PartitionRows::default());
        }
        rows[label][side].add(change, 1);
    };
    // The common cases, as in `Tally::pair`.
    match (old, new) {
        ([o], [n]) if o.k2 == n.k2 => {
            let change = match (n.diffed(), o.hash == n.hash) {
                (true, true) => None,
                (true, false) => Some(KeyChange::Update),
                (false, _) => Some(KeyChange::Delete),
            };
            count(o, 0, change);
            if n.diffed() {
                count(n, 1, change);
            }
            if let Some(change) = change {
                out.push((k1, o.k2, change));
            }
            return;
        }
        ([o], []) => {
            count(o, 0, Some(KeyChange::Delete));
            out.push((k1, o.k2, KeyChange::Delete));
            return;
        }
        ([], [n]) => {
            if n.diffed() {
                count(n, 1, Some(KeyChange::Insert));
                out.push((k1, n.k2, KeyChange::Insert));
            }
            return;
        }
        _ => {}
    }
    for k2 in second_halves(old, new) {
        let olds: Vec<&Entry> = old.iter().filter(|e| e.k2 == k2).collect();
        let news: Vec<&Entry> = new.iter().filter(|e| e.k2 == k2 && e.diffed()).collect();
        let change = match (olds.is_empty(), news.is_empty()) {
            (true, true) => None,
            (true, false) => Some(KeyChange::Insert),
            (false, true) => Some(KeyChange::Delete),
            (false, false) => {
                let mut old_hashes: Vec<u64> = olds.iter().map(|e| e.hash).collect();
                let mut new_hashes: Vec<u64> = news.iter().map(|e| e.hash).collect();
                old_hashes.sort_unstable();
                new_hashes.sort_unstable();
                (old_hashes != new_hashes).then_some(KeyChange::Update)
            }
        };
        for o in &olds {
            count(o, 0, change);
        }
        for n in &news {
            count(n, 1, change);
        }
        if let Some(change) = change {
            out.push((k1, k2, change));
        }
    }
}

fn spill_error(error: std::io::Error) -> Error {
    Error::Internal(format!(
        "cannot use a spill file to compare rows by key: {error}"
    ))
}

/// A batch with its columns picked out.
struct Loaded {
    k1: UInt64Array,
    k2: UInt64Array,
    hash: UInt64Array,
    flag: BooleanArray,
    labels: Vec<u32>,
    rows: usize,
}

/// The merge: labels, counts and samples so far, and the key facts.
struct Merge<'a> {
    spec: &'a CompareSpec,
    width: usize,
    labels: LabelTable,
    coalesced: HashMap<(u32, u32), u32>,
    counts: Vec<[u64; 3]>,
    sampled: Vec<Sampled>,
    taken: [usize; 3],
    facts: KeyFacts,
    /// The old side's totals per label, when it was read whole and aggregated.
    totals: HashMap<u32, LabelTotals>,
    /// What the reading tasks of a side read whole settled, until it is known which labels count.
    deferred: Vec<ReadTally>,
}

impl<'a> Merge<'a> {
    fn new(spec: &'a CompareSpec, width: usize) -> Self {
        Self {
            spec,
            width,
            labels: LabelTable::default(),
            coalesced: HashMap::new(),
            counts: Vec::new(),
            sampled: Vec::new(),
            taken: [0; 3],
            facts: KeyFacts::default(),
            totals: HashMap::new(),
            deferred: Vec::new(),
        }
    }

    /// Reads both sides into buckets by key hash, then pairs the rows of each bucket.
    async fn run(
        &mut self,
        ctx: &SessionContext,
        old_sql: &str,
        new: NewSide<'_>,
        buckets: usize,
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let sides = self.read(ctx, old_sql, buckets, false, None).await?;
        let old_ms = started.elapsed().as_millis() as u64;
        let old = OldRows {
            rows: Side::gather(sides, buckets),
            relabel: None,
            elides: false,
        };
        self.run_new(ctx, old, new, buckets, None, started, old_ms)
            .await
    }

    /// Reads the new side into buckets, then pairs the rows of each bucket with the old side's
    /// (only those whose label `keep` holds, when given).
    #[allow(clippy::too_many_arguments)]
    async fn run_new(
        &mut self,
        ctx: &SessionContext,
        old: OldRows,
        new: NewSide<'_>,
        buckets: usize,
        keep: Option<Arc<Vec<bool>>>,
        started: std::time::Instant,
        old_ms: u64,
    ) -> Result<()> {
        let captured = matches!(new, NewSide::Captured { .. });
        let old_captured = old.relabel.is_some();
        let OldRows {
            rows: old_gathered,
            relabel: old_relabel,
            elides,
        } = old;
        let (new_rows, relabel) = match new {
            NewSide::Queries(_) if elides => {
                return Err(Error::Internal(
                    "an old side without the twins of new rows beside new rows read again".into(),
                ));
            }
            NewSide::Queries(sqls) => {
                let mut new_sides = Vec::new();
                for new_sql in &sqls {
                    new_sides.extend(self.read(ctx, new_sql, buckets, true, None).await?);
                }
                (Side::gather(new_sides, buckets), None)
            }
            NewSide::Captured { capture, labels } => {
                let (sealed, relabel, tally) = capture.seal(self.spec, &mut self.labels, labels)?;
                self.counts.resize(self.labels.labels.len(), [0; 3]);
                self.absorb_read(tally, None);
                let disk = Arc::clone(&ctx.runtime_env().disk_manager);
                (
                    sealed.into_buckets(buckets, &disk)?,
                    Some(Arc::new(relabel.with_twins(elides))),
                )
            }
        };
        let new_ms = started.elapsed().as_millis() as u64 - old_ms;
        let labels = self.labels.labels.len();
        self.counts.resize(labels, [0; 3]);
        let nullable: Arc<Vec<bool>> = Arc::new(
            self.labels
                .labels
                .iter()
                .map(|l| l.values.iter().any(ScalarValue::is_null))
                .collect(),
        );
        let sample = self.spec.sample;
        let record = self.spec.changes.as_ref().is_some_and(|c| c.recording());
        let edges = self.spec.edges.clone();
        if let Some(edges) = &edges {
            edges.consulted();
        }
        match (old_gathered, new_rows) {
            (Ok(mut old_rows), Ok(mut new_rows)) => {
                if let Some(relabel) = &old_relabel {
                    relabel.apply(&mut old_rows);
                }
                if let Some(keep) = &keep {
                    old_rows.retain(|e| keep.get(e.label() as usize).copied().unwrap_or(true));
                }
                if let Some(relabel) = &relabel {
                    relabel.apply(&mut new_rows);
                }
                old_rows.sort_unstable_by_key(|e| e.k1);
                new_rows.sort_unstable_by_key(|e| e.k1);
                let tally = pair_bucket(
                    &old_rows,
                    &new_rows,
                    &nullable,
                    (sample, record),
                    edges.as_ref(),
                );
                self.absorb(tally)?;
            }
            (Err(mut old_files), Err(mut new_files)) => {
                // The buckets are independent: pair them on every core, add them up in order.
                // Each bucket's files go to the worker that pairs it, which removes them once
                // paired (gigabytes of them would otherwise be freed by one thread at the end).
                let fixed = buckets.trailing_zeros();
                let workers = std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .clamp(1, 8);
                let mut tasks = Vec::new();
                for worker in 0..workers {
                    let files: Vec<(usize, Vec<SpillFileRef>, Vec<SpillFileRef>)> = (worker
                        ..buckets)
                        .step_by(workers)
                        .map(|b| {
                            (
                                b,
                                std::mem::take(&mut old_files[b]),
                                std::mem::take(&mut new_files[b]),
                            )
                        })
                        .collect();
                    let nullable = Arc::clone(&nullable);
                    let edges = edges.clone();
                    let keep = keep.clone();
                    let relabel = relabel.clone();
                    let old_relabel = old_relabel.clone();
                    tasks.push(tokio::task::spawn_blocking(move || {
                        let mut scratch = Scratch::default();
                        files
                            .into_iter()
                            .map(|(bucket, old, new)| {
                                scratch.read(&old, fixed, false)?;
                                if let Some(relabel) = &old_relabel {
                                    relabel.apply(&mut scratch.old);
                                }
                                if let Some(keep) = &keep {
                                    scratch.old.retain(|e| {
                                        keep.get(e.label() as usize).copied().unwrap_or(true)
                                    });
                                }
                                scratch.read(&new, fixed, true)?;
                                if let Some(relabel) = &relabel {
                                    relabel.apply(&mut scratch.new);
                                }
                                let tally = pair_bucket(
                                    &scratch.old,
                                    &scratch.new,
                                    &nullable,
                                    (sample, record),
                                    edges.as_ref(),
                                );
                                drop((old, new));
                                Ok((bucket, tally))
                            })
                            .collect::<Result<Vec<_>>>()
                    }));
                }
                let mut tallies = Vec::with_capacity(buckets);
                for task in tasks {
                    let done = task.await.map_err(|e| {
                        Error::Internal(format!("pairing rows by key failed: {e}"))
                    })??;
                    tallies.extend(done);
                }
                tallies.sort_by_key(|(bucket, _)| *bucket);
                for (_, tally) in tallies {
                    self.absorb(tally)?;
                }
            }
            _ => return Err(Error::Internal("the sides were bucketed apart".into())),
        }
        tracing::debug!(
            buckets,
            captured,
            old_captured,
            old_ms,
            new_ms,
            pair_ms = started.elapsed().as_millis() as u64 - old_ms - new_ms,
            "merged rows by key hash"
        );
        Ok(())
    }

    /// Reads one side, a task per partition of the query: rows with a NULL key are settled at
    /// once (they match nothing), the others go to their bucket.
    async fn read(
        &mut self,
        ctx: &SessionContext,
        sql: &str,
        buckets: usize,
        is_new: bool,
        aggregate: Option<usize>,
    ) -> Result<Vec<Side>> {
        let what = if is_new { "new" } else { "old" };
        let streams = ctx
            .sql_with_options(sql, lakefill_table::sqltext::read_only())
            .await
            .query_context(|| format!("cannot plan the query to hash the {what} rows by key"))?
            .execute_stream_partitioned()
            .await
            .query_context(|| format!("cannot run the query to hash the {what} rows by key"))?;
        let table = Arc::new(Mutex::new(std::mem::take(&mut self.labels)));
        let disk = Arc::clone(&ctx.runtime_env().disk_manager);
        let spec = Arc::new(self.spec.clone());
        let mut tasks = Vec::new();
        for stream in streams {
            let side = Side::new(buckets, &disk, what)?;
            let reader = Reader {
                side,
                labels: SideLabels::default(),
                table: Arc::clone(&table),
                spec: Arc::clone(&spec),
                width: self.width,
                is_new,
                nulls: ReadTally::default(),
                aggregate,
            };
            tasks.push(tokio::spawn(reader.read(stream)));
        }
        let mut sides = Vec::new();
        let mut failure = None;
        let mut tallies: Vec<ReadTally> = Vec::new();
        for task in tasks {
            match task.await {
                Ok(Ok((side, tally))) => {
                    sides.push(side);
                    tallies.push(tally);
                }
                Ok(Err(e)) => failure = failure.or(Some(e)),
                Err(e) => {
                    failure = failure.or(Some(Error::Internal(format!(
                        "reading the {what} rows by key failed: {e}"
                    ))))
                }
            }
        }
        self.labels = Arc::try_unwrap(table)
            .map_err(|_| Error::Internal("the partition labels are still shared".into()))?
            .into_inner()
            .map_err(|_| Error::Internal("the partition labels were poisoned".into()))?;
        if let Some(e) = failure {
            return Err(e);
        }
        self.counts.resize(self.labels.labels.len(), [0; 3]);
        if aggregate.is_some() {
            // Which rows count is known only once the totals are compared: kept until then.
            for tally in &mut tallies {
                self.add_totals(tally);
            }
            self.deferred.extend(tallies);
            return Ok(sides);
        }
        for tally in tallies {
            self.absorb_read(tally, None);
        }
        Ok(sides)
    }

    /// Takes the totals of a side read whole out of `tally`, into [`Self::totals`].
    fn add_totals(&mut self, tally: &mut ReadTally) {
        for (label, totals) in tally.totals.drain() {
            self.totals
                .entry(label)
                .or_insert_with(|| LabelTotals::zero(totals.sums.len()))
                .add(&totals);
        }
    }

    /// Adds what a reading task settled itself, only for labels `keep` holds (all without it).
    fn absorb_read(&mut self, tally: ReadTally, keep: Option<&[bool]>) {
        let kept = |label: u32| keep.is_none_or(|k| k.get(label as usize).copied().unwrap_or(true));
        self.facts.null_rows += tally.null_rows;
        for (label, counts) in tally.counts {
            if !kept(label) {
                continue;
            }
            // (What a reading task settles itself are the rows with a NULL key.)
            if let Some(changes) = &self.spec.changes
                && counts.iter().any(|c| *c > 0)
            {
                changes.null_keys();
            }
            for (t, c) in self.counts[label as usize].iter_mut().zip(counts) {
                *t += c;
            }
        }
        for (kind, pending) in tally.samples.into_iter().enumerate() {
            for p in pending.into_iter().filter(|p| kept(p.label)) {
                if self.taken[kind] < self.candidates() {
                    self.taken[kind] += 1;
                    self.sample(kind, p.label, p.key, p.new, p.old);
                }
            }
        }
    }

    /// Adds a bucket's tally: counts, changed rows under their coalesced labels, samples while
    /// there is room.
    fn absorb(&mut self, tally: Tally) -> Result<()> {
        for (total, counts) in self.counts.iter_mut().zip(&tally.counts) {
            for (t, c) in total.iter_mut().zip(counts) {
                *t += c;
            }
        }
        for ((new, old), n) in tally.coalesced {
            let label = self.coalesce(new, old)?;
            self.counts[label as usize][CHANGED] += n;
        }
        self.facts.duplicate_keys += tally.duplicate_keys;
        if let (Some(changes), Some(found)) = (&self.spec.changes, tally.changes) {
            changes.add(found);
            let labels = &self.labels.labels;
            changes.add_rows(
                tally
                    .change_rows
                    .into_iter()
                    .enumerate()
                    .filter(|(_, [old, new])| old.rows > 0 || new.rows > 0)
                    .filter_map(|(label, rows)| Some((labels.get(label)?.text.clone(), rows))),
            );
        }
        if let Some(edges) = &self.spec.edges
            && !tally.edge_hits.is_empty()
        {
            edges.record(tally.edge_hits.into_iter().map(|(added, label, key)| Hit {
                key,
                added,
                label: self.labels.labels[label as usize].text.clone(),
            }));
        }
        for (kind, pending) in tally.samples.into_iter().enumerate() {
            for p in pending {
                if self.taken[kind] >= self.candidates() {
                    break;
                }
                self.taken[kind] += 1;
                let label = match p.coalesce_with {
                    Some(old) => self.coalesce(p.label, old)?,
                    None => p.label,
                };
                self.sample(kind, label, p.key, p.new, p.old);
            }
        }
        Ok(())
    }

    fn sample(
        &mut self,
        kind: usize,
        label: u32,
        key: SampledKey,
        new: Option<Entry>,
        old: Option<Entry>,
    ) {
        let side = |entry: Option<Entry>| {
            entry.map(|e| {
                (
                    self.labels.labels[e.label() as usize].values.clone(),
                    e.hash,
                )
            })
        };
        self.sampled.push(Sampled {
            kind,
            partition: self.labels.labels[label as usize].text.clone(),
            key_text: key.identity(),
            key,
            old: side(old),
            new: side(new),
        });
    }

    /// The label a changed row counts under: the new row's partition values, each NULL one
    /// taken from the old row (as `COALESCE(new, old)` per column).
    fn coalesce(&mut self, new: u32, old: u32) -> Result<u32> {
        let labels = &self.labels.labels;
        if !labels[new as usize].values.iter().any(ScalarValue::is_null) {
            return Ok(new);
        }
        if let Some(label) = self.coalesced.get(&(new, old)) {
            return Ok(*label);
        }
        let values: Vec<ScalarValue> = labels[new as usize]
            .values
            .iter()
            .zip(&labels[old as usize].values)
            .map(|(n, o)| if n.is_null() { o.clone() } else { n.clone() })
            .collect();
        let label = self.labels.intern(self.spec, values)?;
        self.counts.resize(self.labels.labels.len(), [0; 3]);
        self.coalesced.insert((new, old), label);
        Ok(label)
    }

    fn finish(self) -> (BTreeMap<String, [u64; 3]>, Vec<Sampled>, KeyFacts) {
        let mut counts: BTreeMap<String, [u64; 3]> = BTreeMap::new();
        for (label, c) in self.labels.labels.iter().zip(&self.counts) {
            if c.iter().any(|n| *n > 0) {
                let entry = counts.entry(label.text.clone()).or_default();
                for (e, n) in entry.iter_mut().zip(c) {
                    *e += n;
                }
            }
        }
        let sampled = fewest_partitions(self.sampled, self.spec.sample);
        (counts, sampled, self.facts)
    }

    /// How many differences of each kind are kept as candidates for the samples.
    fn candidates(&self) -> usize {
        self.spec.sample.saturating_mul(CANDIDATES_PER_SAMPLE)
    }
}

/// Differences of each kind kept per sample shown: the samples are then chosen among them from as
/// few partitions as can be, since [`read_back`] reads each sampled partition back whole on both
/// sides (the key orders no file, so its statistics select nothing). A fix that changes 1% of
/// the rows of 30 days took 0.19 s of a 1.55 s run to read back five samples from five days.
const CANDIDATES_PER_SAMPLE: usize = 16;

/// Up to `per_kind` of each kind among `candidates`, from the partitions with the most candidates
/// first (ties by label, then in the order the candidates came, so that the choice is the same on
/// every run).
fn fewest_partitions(candidates: Vec<Sampled>, per_kind: usize) -> Vec<Sampled> {
    let mut weight: HashMap<String, usize> = HashMap::new();
    for candidate in &candidates {
        *weight.entry(candidate.partition.clone()).or_default() += 1;
    }
    let mut ranked: Vec<(usize, Sampled)> = candidates.into_iter().enumerate().collect();
    ranked.sort_by(|(i, a), (j, b)| {
        weight[&b.partition]
            .cmp(&weight[&a.partition])
            .then_with(|| a.partition.cmp(&b.partition))
            .then(i.cmp(j))
    });
    let mut taken = [0usize; 3];
    ranked
        .into_iter()
        .filter_map(|(_, candidate)| {
            let room = taken[candidate.kind] < per_kind;
            room.then(|| {
                taken[candidate.kind] += 1;
                candidate
            })
        })
        .collect()
}

/// Every partition value seen, with its label, shared by the reading tasks.
#[derive(Default)]
struct LabelTable {
    labels: Vec<Label>,
    by_values: HashMap<Vec<ScalarValue>, u32>,
}

impl LabelTable {
    /// The label index of a partition value.
    fn intern(&mut self, spec: &CompareSpec, values: Vec<ScalarValue>) -> Result<u32> {
        if let Some(label) = self.by_values.get(&values) {
            return Ok(*label);
        }
        let text = partition_label(spec, &values)?;
        let label = u32::try_from(self.labels.len())
            .ok()
            .filter(|l| *l < MAX_LABELS)
            .ok_or_else(|| Error::Internal("too many partition values".into()))?;
        self.labels.push(Label {
            values: values.clone(),
            text,
        });
        self.by_values.insert(values, label);
        Ok(label)
    }
}

/// What a reading task settled itself: the rows with a NULL key; and, when it aggregates its
/// side, rows, checksum and measure sums per label.
#[derive(Default)]
struct ReadTally {
    counts: BTreeMap<u32, [u64; 3]>,
    samples: [Vec<Pending>; 3],
    null_rows: u64,
    totals: HashMap<u32, LabelTotals>,
}

/// One partition value's rows, the exact sum of their row checksums' hashes, and their measure
/// sums, as the per-partition aggregation of [`super::compare`](mod@super::compare) computes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelTotals {
    /// Rows.
    pub rows: u64,
    /// The exact sum of the rows' checksum hashes.
    pub checksum: u128,
    /// Measure sums, in the order of the comparison's measures.
    pub sums: Vec<f64>,
}

impl LabelTotals {
    /// No rows, with `measures` sums.
    fn zero(measures: usize) -> Self {
        Self {
            sums: vec![0.0; measures],
            ..Self::default()
        }
    }

    /// Adds the totals of other rows of the same partition value.
    fn add(&mut self, other: &LabelTotals) {
        self.rows += other.rows;
        self.checksum += other.checksum;
        for (t, s) in self.sums.iter_mut().zip(&other.sums) {
            *t += s;
        }
    }
}

impl ReadTally {
    /// Adds the rows of `batch` to their labels' totals: the checksum hash at column `at`, the
    /// measures (as doubles) after it.
    fn add_totals(
        &mut self,
        batch: &RecordBatch,
        at: usize,
        measures: usize,
        labels: &[u32],
    ) -> Result<()> {
        use deltalake::arrow::datatypes::Float64Type;
        let hashes = batch
            .column(at)
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| Error::Internal("a row checksum is not a UInt64".into()))?;
        let sums = (0..measures)
            .map(|i| {
                batch
                    .column(at + 1 + i)
                    .as_primitive_opt::<Float64Type>()
                    .ok_or_else(|| Error::Internal("a measure is not a double".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let sums: Vec<&deltalake::arrow::array::Float64Array> = sums.into_iter().collect();
        add_runs(&mut self.totals, labels, hashes.values(), &sums);
        Ok(())
    }
}

/// Adds rows to their labels' `totals`: each row's label, checksum hash and measures (as
/// doubles), in runs of one label (a file's rows come together).
fn add_runs(
    totals: &mut HashMap<u32, LabelTotals>,
    labels: &[u32],
    checksums: &[u64],
    measures: &[&deltalake::arrow::array::Float64Array],
) {
    let mut start = 0;
    while start < labels.len() {
        let label = labels[start];
        let end = labels[start..]
            .iter()
            .position(|l| *l != label)
            .map_or(labels.len(), |n| start + n);
        let totals = totals
            .entry(label)
            .or_insert_with(|| LabelTotals::zero(measures.len()));
        totals.rows += (end - start) as u64;
        totals.checksum += checksums[start..end]
            .iter()
            .map(|h| u128::from(*h))
            .sum::<u128>();
        for (total, column) in totals.sums.iter_mut().zip(measures) {
            for row in start..end {
                if column.is_valid(row) {
                    *total += column.value(row);
                }
            }
        }
        start = end;
    }
}

/// One task reading one partition of a side's query into its own buckets.
struct Reader {
    side: Side,
    labels: SideLabels,
    table: Arc<Mutex<LabelTable>>,
    spec: Arc<CompareSpec>,
    width: usize,
    is_new: bool,
    nulls: ReadTally,
    /// With the number of measures: aggregate the side as it is read.
    aggregate: Option<usize>,
}

impl Reader {
    async fn read(mut self, mut stream: SendableRecordBatchStream) -> Result<(Side, ReadTally)> {
        // A batch's rows with a key, pushed together.
        let mut keyed: Vec<Entry> = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch.query_context(|| "cannot hash rows by key".into())?;
            let loaded = self
                .labels
                .load(&batch, self.width, &self.table, &self.spec)?;
            if let Some(measures) = self.aggregate {
                self.nulls
                    .add_totals(&batch, self.width + 4, measures, &loaded.labels)?;
            }
            keyed.clear();
            for row in 0..loaded.rows {
                let entry = Entry::new(
                    loaded.k1.value(row),
                    loaded.k2.value(row),
                    loaded.hash.value(row),
                    loaded.labels[row],
                    loaded.flag.is_valid(row) && loaded.flag.value(row),
                );
                if loaded.k1.is_valid(row) {
                    keyed.push(entry);
                    continue;
                }
                let (kind, new, old) = if self.is_new {
                    self.nulls.null_rows += 1;
                    if !entry.diffed() {
                        continue;
                    }
                    (ADDED, Some(entry), None)
                } else {
                    (REMOVED, None, Some(entry))
                };
                self.nulls.counts.entry(entry.label()).or_default()[kind] += 1;
                if self.nulls.samples[kind].len() < self.spec.sample {
                    self.nulls.samples[kind].push(Pending {
                        label: entry.label(),
                        coalesce_with: None,
                        key: SampledKey::Null,
                        new,
                        old,
                    });
                }
            }
            self.side.push_all(&keyed)?;
        }
        self.side.finish_writing()?;
        Ok((self.side, self.nulls))
    }
}

impl SideLabels {
    fn load(
        &mut self,
        batch: &RecordBatch,
        width: usize,
        table: &Mutex<LabelTable>,
        spec: &CompareSpec,
    ) -> Result<Loaded> {
        let column = |i: usize| -> Result<UInt64Array> {
            batch
                .column(width + i)
                .as_primitive_opt::<UInt64Type>()
                .cloned()
                .ok_or_else(|| Error::Internal("a key or row hash is not a UInt64".into()))
        };
        let flag = batch
            .column(width + 3)
            .as_boolean_opt()
            .cloned()
            .ok_or_else(|| Error::Internal("the partition flag is not a boolean".into()))?;
        let parts: Vec<ArrayRef> = (0..width).map(|i| Arc::clone(batch.column(i))).collect();
        let labels = self.labels(&parts, batch.num_rows(), &mut |values| {
            table
                .lock()
                .map_err(|_| Error::Internal("the partition labels were poisoned".into()))?
                .intern(spec, values)
        })?;
        Ok(Loaded {
            k1: column(0)?,
            k2: column(1)?,
            hash: column(2)?,
            flag,
            labels,
            rows: batch.num_rows(),
        })
    }

    /// The label of every row of the partition columns `parts`, each distinct partition value
    /// labelled by `intern` once.
    fn labels(
        &mut self,
        parts: &[ArrayRef],
        rows: usize,
        intern: &mut dyn FnMut(Vec<ScalarValue>) -> Result<u32>,
    ) -> Result<Vec<u32>> {
        if parts.is_empty() {
            let label = intern(Vec::new())?;
            return Ok(vec![label; rows]);
        }
        let converter = match &mut self.converter {
            Some(c) => c,
            None => {
                let fields = parts
                    .iter()
                    .map(|p| SortField::new(p.data_type().clone()))
                    .collect();
                self.converter.insert(
                    RowConverter::new(fields).map_err(|e| {
                        Error::Internal(format!("cannot read partition values: {e}"))
                    })?,
                )
            }
        };
        let converted = converter
            .convert_columns(parts)
            .map_err(|e| Error::Internal(format!("cannot read partition values: {e}")))?;
        let mut out: Vec<u32> = Vec::with_capacity(rows);
        for row in 0..rows {
            let bytes = converted.row(row);
            // Rows come in runs of one partition (a file holds one).
            if row > 0 && converted.row(row - 1) == bytes {
                out.push(out[row - 1]);
                continue;
            }
            if let Some(label) = self.known.get(bytes.as_ref()) {
                out.push(*label);
                continue;
            }
            let values = parts
                .iter()
                .map(|p| {
                    ScalarValue::try_from_array(p, row)
                        .query_context(|| "cannot read a partition value".into())
                })
                .collect::<Result<Vec<_>>>()?;
            let label = intern(values)?;
            self.known.insert(bytes.as_ref().into(), label);
            out.push(label);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn samples_come_from_the_partitions_with_the_most_candidates_and_each_kind_is_capped() {
        let candidate = |kind: usize, partition: &str, id: i64| Sampled {
            kind,
            partition: partition.into(),
            key_text: id.to_string(),
            key: SampledKey::Values(vec![ScalarValue::Int64(Some(id))]),
            old: None,
            new: None,
        };
        // In the order the buckets gave them: days 1, 2, 3 interleaved; day 2 has the most.
        let candidates = vec![
            candidate(CHANGED, "day1", 1),
            candidate(CHANGED, "day2", 2),
            candidate(ADDED, "day3", 3),
            candidate(CHANGED, "day2", 4),
            candidate(CHANGED, "day3", 5),
            candidate(ADDED, "day2", 6),
            candidate(CHANGED, "day1", 7),
            candidate(CHANGED, "day2", 8),
        ];
        let chosen = fewest_partitions(candidates, 2);
        let shown: Vec<(usize, &str, &str)> = chosen
            .iter()
            .map(|s| (s.kind, s.partition.as_str(), s.key_text.as_str()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (CHANGED, "day2", "2"),
                (CHANGED, "day2", "4"),
                (ADDED, "day2", "6"),
                (ADDED, "day3", "3")
            ]
        );
        // Fewer candidates than the samples wanted: all of them.
        assert_eq!(
            fewest_partitions(vec![candidate(ADDED, "day1", 1)], 5).len(),
            1
        );
        assert!(fewest_partitions(Vec::new(), 5).is_empty());
    }

    use super::*;

    /// SplitMix64, for reproducible key hashes.
    fn hashes(seed: u64, n: usize) -> Vec<u64> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            })
            .collect()
    }

    #[test]
    fn the_radix_sort_orders_every_row_by_key_hash_keeping_each_row_whole() {
        let cases = [
            (0, 0),
            (1, 0),
            (5, 7),
            (1000, 0),
            (70_000, 6),
            (300_000, 14),
        ];
        for (rows, fixed) in cases {
            let entries: Vec<Entry> = hashes(rows as u64 + 1, rows)
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    // The bucket's top bits are shared; some key hashes repeat, one many times.
                    let k1 = match fixed {
                        0 => h,
                        _ => (h >> fixed) | (5 << (64 - fixed)),
                    } & !(i as u64 % 3);
                    let repeated = match fixed {
                        0 => 42,
                        _ => (5 << (64 - fixed)) | 42,
                    };
                    Entry::new(
                        if i % 10 == 0 { repeated } else { k1 },
                        h.rotate_left(17),
                        i as u64,
                        (i % 7) as u32,
                        i % 2 == 0,
                    )
                })
                .collect();
            let mut records = Vec::new();
            for e in &entries {
                records.extend_from_slice(&e.k1.to_le_bytes());
                records.extend_from_slice(&e.hash.to_le_bytes());
                records.extend_from_slice(&e.k2.to_le_bytes());
                records.extend_from_slice(&e.tag.to_le_bytes());
            }
            // Reused buffers: whatever they held goes.
            let mut groups = vec![7; 3];
            let mut sorted: Vec<Entry> = entries.iter().take(3).copied().collect();
            radix_sort(&records, fixed, &mut groups, &mut sorted);
            assert!(
                sorted.windows(2).all(|w| w[0].k1 <= w[1].k1),
                "{rows} rows, {fixed} bits"
            );
            let whole = |rows: &[Entry]| {
                let mut v: Vec<_> = rows
                    .iter()
                    .map(|e| (e.k1, e.k2, e.hash, e.label(), e.diffed()))
                    .collect();
                v.sort_unstable();
                v
            };
            assert_eq!(whole(&sorted), whole(&entries));
        }
    }
}
