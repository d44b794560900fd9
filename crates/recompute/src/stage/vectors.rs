//! Publishing a fix by deletion vectors: a partition's old rows that are among its new rows stay
//! in their files, the old rows the fix removes are marked deleted there (a deletion vector), and
//! only the new rows the old files lack are written. This is how Delta's own MERGE and UPDATE
//! change a table with `delta.enableDeletionVectors`: a fix that changes 1% of the rows encodes
//! and writes 1% of them.
//!
//! A partition's old files are read when its first new rows arrive: each row's hash, with its
//! file and position ([`Located`]). Each new row then uses up an old row of its hash, if one is
//! left (it is not written), or is written. When the batch ends, the old rows no new row used up
//! are what the fix deletes. A partition whose share of changed rows is above the plan's
//! threshold is rewritten instead: its old rows that stay are written after its new ones, and
//! its old files are removed whole, as in any rewrite.
//!
//! With `--where`, only the old rows the predicate selects are matched (and may be deleted): the
//! others stay in their files, or are written again with a partition rewritten. No batch carries
//! them over; their checksum goes into the batch's record as the rows carried, which validation
//! checks against an independent scan of the files.
//!
//! What the table then holds is what a rewrite gives, as a multiset of rows: validation reads it
//! so (the kept files with their new vectors, and the staged files), and compares it with the old
//! rows and with what staging counted of the model's output.
//!
//! A partition is rewritten, never cut, when an old file's column is not of the table's type (a
//! row is matched by its values as the table's types hold them, and a reader reads the kept rows
//! by the file's types).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use deltalake::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, new_null_array};
use deltalake::arrow::compute::{cast, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::common::ScalarValue;
use deltalake::kernel::Add;
use deltalake::parquet::arrow::async_reader::{
    ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder,
};
use futures::{Stream, StreamExt, TryStreamExt};
use roaring::RoaringTreemap;

use lakefill_log::journal::VectorCounts;
use lakefill_table::error::{Error, Result};
use lakefill_table::rowhash::RowChecksum;
use lakefill_table::scope::{RowPredicate, RowSelector};
use lakefill_validate::keymerge::{CaptureWriter, Held};
use lakefill_validate::multiset::Located;

/// The share of a partition's rows a fix may change (deleted plus added, over old plus new) and
/// still be published by deletion vectors; above it the partition is rewritten.
pub const DEFAULT_THRESHOLD: f64 = 0.3;

/// The old files a run may publish its fix into by deletion vectors.
#[derive(Debug, Clone)]
pub struct VectorPlan {
    /// See [`DEFAULT_THRESHOLD`].
    pub threshold: f64,
    /// The table's root (where its vectors' files are named from).
    pub root: url::Url,
    /// Every file of each partition of the range at the read version (with `--where`, those
    /// that may hold rows it selects), partition values by logical name as the journal keeps
    /// them, by partition label.
    pub files: BTreeMap<String, Vec<Add>>,
    /// With `--where`, or by rows: only the old rows it selects are the fix's to delete; the
    /// others stay where they are (no batch carries them over).
    pub scope: Option<Scope>,
    /// The most live old rows of one partition that staging matches in memory
    /// ([`Self::with_memory_limit`]); a partition with more cannot be cut, and is rewritten.
    pub max_rows: u64,
}

/// Which old rows of the files read are the fix's to match, and delete: the others stay in
/// their files (no batch carries them over), their checksum counted as the rows carried.
#[derive(Debug, Clone)]
pub enum Scope {
    /// `--where`: the rows it selects.
    Rows(RowPredicate),
    /// By rows (`range_column`): the rows of the range (and of `--where`, if given). The files
    /// of each batch hold rows of its periods only ([`VectorPlan::set`]).
    Range {
        /// The target's layout (by rows).
        layout: Box<lakefill_table::partition::Layout>,
        /// The run's range.
        range: Box<lakefill_table::partition::PartitionRange>,
    },
}

impl Scope {
    /// The scope evaluated row by row on batches of `schema` (the table's columns).
    pub(crate) fn selector(&self, schema: &Schema) -> Result<RowSelector> {
        match self {
            Self::Rows(rows) => rows.selector(schema),
            Self::Range { layout, range } => RowSelector::of_expr(
                layout.range_predicate(range, schema)?,
                schema,
                self.to_string(),
            ),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Rows(rows) => write!(f, "--where {rows}"),
            Self::Range { layout, range } => {
                let column = layout.time.encoding.columns().join(", ");
                write!(f, "the range {}..={} of `{column}`", range.from, range.to)?;
                match &range.rows {
                    Some(rows) => write!(f, " and --where {rows}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// What matching holds in memory per old row of a partition, at most: its hash, position and
/// place in the index by hash (at most 37 bytes, [`Located`]), its check hash and key hash (8
/// each), and the record validation's capture holds back until the partition is settled (32).
pub const BYTES_PER_MATCHED_ROW: u64 = 96;

/// The memory a run's matching assumes when the run's queries have no limit: the built-in
/// share's order of magnitude.
const UNLIMITED_MATCH_MEMORY: u64 = 1 << 30;

/// The live rows of `files` by their statistics (each record count less the rows its deletion
/// vector removes); a file without statistics counts none.
pub fn live_rows(files: &[Add]) -> u64 {
    files
        .iter()
        .map(|file| {
            let records = file
                .get_stats()
                .ok()
                .flatten()
                .and_then(|stats| u64::try_from(stats.num_records).ok())
                .unwrap_or(0);
            let deleted = file
                .deletion_vector
                .as_ref()
                .map_or(0, |dv| u64::try_from(dv.cardinality).unwrap_or(0));
            records.saturating_sub(deleted)
        })
        .sum()
}

/// Why a partition whose old files hold a column in another type than the table's cannot be cut.
pub(crate) const OTHER_TYPE: &str = "has an old file with a column in another type than the table's (its rows cannot be matched \
     by value)";

/// Why the partition of `files` cannot be cut under `plan`, if it holds more live old rows than
/// its matching may hold in memory ([`VectorPlan::max_rows`]).
pub(crate) fn too_large(plan: &VectorPlan, files: &[Add]) -> Option<String> {
    let live = live_rows(files);
    (live > plan.max_rows).then(|| {
        tracing::debug!(
            live,
            max_rows = plan.max_rows,
            "too many old rows to match in memory: the partition is not cut"
        );
        format!(
            "holds {live} live rows, more than matching them in memory may take under the run's \
             memory limit ({} rows: a quarter of it, at {BYTES_PER_MATCHED_ROW} bytes a row; \
             a larger `--memory-limit` would let it be cut)",
            plan.max_rows
        )
    })
}

impl VectorPlan {
    /// The plan for a run whose queries may use `memory_limit` bytes (`None`: unbounded): a
    /// partition is matched in memory when its live old rows take at most a quarter of it
    /// ([`BYTES_PER_MATCHED_ROW`]); a larger one is rewritten, as before vectors, streaming.
    /// By rows, where a partition that cannot be cut stops the run (no batch carries the rows
    /// outside the range), `None` when a batch's old files are that large: the run rewrites, as
    /// before vectors.
    #[must_use]
    pub fn with_memory_limit(&self, memory_limit: Option<u64>) -> Option<Self> {
        let memory = memory_limit.unwrap_or(UNLIMITED_MATCH_MEMORY);
        let bounded = Self {
            max_rows: memory / 4 / BYTES_PER_MATCHED_ROW,
            ..self.clone()
        };
        // (Staging decides by the files of a batch, as here.)
        if matches!(self.scope, Some(Scope::Range { .. }))
            && bounded
                .files
                .values()
                .any(|files| too_large(&bounded, files).is_some())
        {
            tracing::info!(
                "a batch's old files hold more rows than matching may hold in memory: the fix by \
                 rows is published by rewriting them"
            );
            return None;
        }
        Some(bounded)
    }

    /// Sets `plan`'s plan by vectors, if its target takes deletion vectors
    /// (`delta.enableDeletionVectors`) and the run may publish by them: a backfill (on its own or
    /// a cascade's node) or a logical revert (not a revert by files, nor adjustments, which
    /// only append), not a model reading its own past; by rows (`range_column`), one whose range
    /// takes no NULL times. Tables whose commits lakefill writes itself (row
    /// tracking, in-commit timestamps, identity columns) take vectors too: a file cut keeps its
    /// `add`'s row ids and commit version (its rows that stay keep their stable ids, as the
    /// protocol's row tracking asks), and the files written get fresh ones
    /// ([`lakefill_log::writer::complete`]); with column mapping, old files are read by their
    /// physical names or field ids (`OldColumns`). A cascade's child
    /// reads such a node's new rows as validation does: its kept files through their new
    /// vectors, and its staged files ([`lakefill_log::journal::Journal::new_row_files`]).
    /// Otherwise it rewrites, as it always has. (A change data feed is computed from the sides as
    /// validation reads them, whichever way the run publishes.)
    ///
    /// By rows, an old file may hold rows of several batches, and a file has one vector: the
    /// batches an old file holds rows of (by its statistics of the time) are joined into one
    /// (`joined_batches`), so that each old file is matched, and cut, in one batch. Files that
    /// each hold a day's rows leave daily batches as they were; files of a month make batches
    /// of months; a file without statistics of the time makes the range one batch.
    pub fn set(plan: &mut crate::plan::BackfillPlan) -> Result<()> {
        plan.vectors = None;
        plan.report.by_vectors = None;
        let report = &plan.report;
        let (layout, range) = (&report.layout, &report.range);
        let snapshot = match plan.target.snapshot() {
            Ok(snapshot) => snapshot,
            Err(_) => return Ok(()),
        };
        let configuration = snapshot.metadata().configuration();
        let on = |key: &str| {
            configuration
                .get(key)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        };
        let eligible = on("delta.enableDeletionVectors")
            && snapshot
                .protocol()
                .writer_features()
                .is_some_and(|features| features.iter().any(|f| f.as_ref() == "deletionVectors"))
            && report.publish == lakefill_table::adjustments::PublishMode::Rewrite
            && plan.adjusted.is_none()
            && !plan.kind.reverts_files()
            && (!layout.partition_columns.is_empty() || layout.is_timeless() || layout.by_rows)
            && !(layout.by_rows && range.include_null)
            && !report.reads_own_past;
        if !eligible {
            return Ok(());
        }
        // By rows or with `--where`, the files that may hold rows of the scope (the others keep
        // all theirs).
        let affected: Option<std::collections::BTreeSet<&str>> = layout
            .rewrites_files(range)
            .then(|| report.affected_files.iter().map(String::as_str).collect());
        let mapping = &report.protocol.mapping;
        let mut files: BTreeMap<String, Vec<Add>> = BTreeMap::new();
        let mut by_rows: Vec<(Add, Option<Span>)> = Vec::new();
        for file in snapshot.log_data().iter() {
            if affected
                .as_ref()
                .is_some_and(|a| !a.contains(file.path().as_ref() as &str))
            {
                continue;
            }
            let values = mapping.logical_values(file.partition_values_map());
            let label = layout.label_in(range, &values);
            if label.is_none() && !layout.by_rows {
                continue;
            }
            #[expect(
                deprecated,
                reason = "a kept file is published with the log's own add entry"
            )]
            let mut add = file.add_action();
            // Its partition values by logical name, as the journal keeps them (the publish
            // names them physically again).
            add.partition_values = mapping.logical_values(add.partition_values);
            match label {
                _ if layout.by_rows => {
                    let span = layout.time.file_span(add.stats.as_deref(), false);
                    by_rows.push((add, span));
                }
                Some(label) => files.entry(label).or_default().push(add),
                None => {}
            }
        }
        let mut joined = None;
        let scope = if layout.by_rows {
            let spans: Vec<Option<Span>> = by_rows.iter().map(|(_, span)| *span).collect();
            let (batches, of_file) = joined_batches(&report.batches, &spans, range.grain);
            for ((add, _), batch) in by_rows.into_iter().zip(of_file) {
                files
                    .entry(batches[batch].start.clone())
                    .or_default()
                    .push(add);
            }
            joined = Some(batches);
            Some(Scope::Range {
                layout: Box::new(layout.clone()),
                range: Box::new(range.clone()),
            })
        } else {
            range.rows.clone().map(Scope::Rows)
        };
        plan.vectors = Some(Arc::new(Self {
            threshold: DEFAULT_THRESHOLD,
            root: plan.target.table_url().clone(),
            files,
            scope,
            max_rows: UNLIMITED_MATCH_MEMORY / 4 / BYTES_PER_MATCHED_ROW,
        }));
        if let Some(batches) = joined {
            plan.report.batches = batches;
        }
        plan.report.by_vectors = Some(DEFAULT_THRESHOLD);
        Ok(())
    }

    /// Whether the rows outside the fix's scope stay in the files read (`--where`, by rows):
    /// then no batch carries them over, and a partition that cannot be cut stops the run.
    pub fn scoped(&self) -> bool {
        self.scope.is_some()
    }

    /// The key of [`Self::files`] the old files of the rows of `batch` in the period `label` are
    /// under: by rows, the batch's first period (its files hold rows of its periods only); else
    /// the period's own.
    pub(crate) fn unit<'b>(&self, batch: &'b crate::plan::BatchPlan, label: &'b str) -> &'b str {
        match self.scope {
            Some(Scope::Range { .. }) => &batch.start,
            _ => label,
        }
    }

    /// By rows, the label the counts of the rows of `batch` go under ("first..last" of its
    /// periods); else the period's own (`label`).
    pub(crate) fn counted_as(&self, batch: &crate::plan::BatchPlan, label: &str) -> String {
        match self.scope {
            Some(Scope::Range { .. }) if batch.start != batch.end => {
                format!("{}..{}", batch.start, batch.end)
            }
            Some(Scope::Range { .. }) => batch.start.clone(),
            _ => label.to_string(),
        }
    }
}

/// The times an old file's rows may hold, by its statistics
/// ([`lakefill_table::partition::TimeColumn::file_span`]).
type Span = (chrono::NaiveDateTime, chrono::NaiveDateTime);

/// `batches` (the batches of the range's periods, in order, then the carry batch) with those one
/// of `spans` (each old file's times; `None`: unknown, every batch) reaches joined into one, and
/// for each span the index of its batch among them. Batches keep their order and are numbered
/// again; the carry batch stays last.
pub(crate) fn joined_batches(
    batches: &[crate::plan::BatchPlan],
    spans: &[Option<Span>],
    grain: lakefill_table::time::Grain,
) -> (Vec<crate::plan::BatchPlan>, Vec<usize>) {
    use lakefill_table::time::Period;
    let (periods, others): (Vec<_>, Vec<_>) =
        batches.iter().cloned().partition(|b| !b.carry && !b.null);
    let bounds: Vec<Option<Span>> = periods
        .iter()
        .map(|b| {
            let first = Period::from_label(grain, &b.start)?;
            let last = Period::from_label(grain, &b.end)?;
            Some((first.start(), last.end()))
        })
        .collect();
    let count = periods.len();
    // The batches each span reaches: the first and the last (as `file_may_hold` decides).
    let reach = |span: &Option<Span>| -> (usize, usize) {
        let all = (0, count.saturating_sub(1));
        let Some((min, max)) = span else { return all };
        if bounds.iter().any(Option::is_none) {
            return all;
        }
        let first = bounds.partition_point(|b| b.is_some_and(|(_, end)| end <= *min));
        let after = bounds.partition_point(|b| b.is_some_and(|(start, _)| start < *max));
        if first >= after {
            // Reaches none (the plan found it may hold rows of the range): the nearest.
            let at = first.min(count.saturating_sub(1));
            return (at, at);
        }
        (first, after - 1)
    };
    let reached: Vec<(usize, usize)> = spans.iter().map(reach).collect();
    // joined[k]: batches k and k + 1 are one (a span reaches both), by a running count.
    let mut starts = vec![0i64; count + 1];
    for (first, last) in &reached {
        if first < last {
            starts[*first] += 1;
            starts[*last] -= 1;
        }
    }
    let mut group_of = Vec::with_capacity(count);
    let mut joined: Vec<crate::plan::BatchPlan> = Vec::new();
    let mut open = 0i64;
    let mut previous_joined = false;
    for (k, batch) in periods.into_iter().enumerate() {
        match joined.last_mut() {
            Some(last) if previous_joined => {
                last.end = batch.end;
                last.partitions.extend(batch.partitions);
            }
            _ => joined.push(crate::plan::BatchPlan {
                index: joined.len(),
                ..batch
            }),
        }
        group_of.push(joined.len() - 1);
        open += starts[k];
        previous_joined = open > 0;
    }
    for batch in others {
        joined.push(crate::plan::BatchPlan {
            index: joined.len(),
            ..batch
        });
    }
    let of_span = reached
        .iter()
        .map(|(first, _)| group_of.get(*first).copied().unwrap_or(0))
        .collect();
    (joined, of_span)
}

/// The keys a fix published by deletion vectors changes, as staging finds them while it
/// matches: the key hashes ([`lakefill_table::rowhash::key_hashes`], first half) of the old
/// rows it deletes and of the rows it writes, batch by batch. Every key whose rows differ
/// between the old and new sides has one of them: a key none of whose rows is deleted or written
/// has each old row used up by an identical new row, and each new row by an old one. So the
/// change data feed needs to compare only the rows of these keys (and those with a NULL key
/// column, which it compares whole); a hash an unchanged key shares only brings that key into
/// the comparison, which finds it unchanged.
#[derive(Debug, Default)]
pub struct ChangedKeys {
    /// By batch index: what it found, or `None` when a partition of the batch was not matched
    /// (its old files could not be cut, or it was staged without vectors).
    batches: Mutex<BTreeMap<usize, Option<Found>>>,
}

/// What staging found of the keys a batch changes: their hashes, and the old files it read
/// (the keys of a partition it did not read, whose rows the fix removes whole, are not among
/// them).
#[derive(Debug, Default)]
pub struct Found {
    pub(crate) keys: HashSet<u64>,
    pub(crate) read: std::collections::BTreeSet<String>,
}

impl ChangedKeys {
    /// The positions of the `key` columns among `file_schema`'s, when each is a column of the
    /// files (not a partition column) whose values hash alike exactly when SQL's `=` holds
    /// ([`lakefill_table::rowhash::key_hashable`]); `None` otherwise, or without a key.
    pub fn columns(key: &[String], file_schema: &Schema) -> Option<Vec<usize>> {
        if key.is_empty() {
            return None;
        }
        key.iter()
            .map(|column| {
                let at = file_schema.index_of(column).ok()?;
                lakefill_table::rowhash::key_hashable(file_schema.field(at).data_type())
                    .then_some(at)
            })
            .collect()
    }

    /// Records what the attempt at batch `index` found (a later attempt's replaces it).
    pub fn finish(&self, index: usize, found: Option<Found>) {
        self.with_batches(|batches| {
            batches.insert(index, found);
        });
    }

    /// The key hashes of the keys the batches `indices` change, when this process staged
    /// exactly those, matched every partition of them and read every file of `old` (the old
    /// files of the plan by vectors).
    pub fn of(&self, indices: &[usize], old: &VectorPlan) -> Option<HashSet<u64>> {
        self.with_batches(|batches| {
            if batches.len() != indices.len() || indices.iter().any(|i| !batches.contains_key(i)) {
                return None;
            }
            let (mut keys, mut read) = (HashSet::new(), std::collections::BTreeSet::new());
            for found in batches.values() {
                let found = found.as_ref()?;
                keys.extend(&found.keys);
                read.extend(found.read.iter().map(String::as_str));
            }
            let every_file = old
                .files
                .values()
                .flatten()
                .all(|file| read.contains(file.path.as_str()));
            every_file.then_some(keys)
        })
    }

    fn with_batches<T>(&self, f: impl FnOnce(&mut BTreeMap<usize, Option<Found>>) -> T) -> T {
        let mut batches = self
            .batches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut batches)
    }
}

/// The first half of the key hash of each row of `batch` by the columns at `key`; a row with a
/// NULL key column gets 0 (the feed compares such rows whole whatever their hash).
fn key_hashes(batch: &RecordBatch, key: &[usize]) -> Result<Vec<u64>> {
    let columns: Vec<ArrayRef> = key.iter().map(|i| Arc::clone(batch.column(*i))).collect();
    let hashes = lakefill_table::rowhash::key_hashes(0, &columns, batch.num_rows())?;
    Ok(hashes.iter().map(|h| h.unwrap_or(0)).collect())
}

/// Whether `file_type` (an old file's column) holds the values of `table_type` as they are: the
/// same type, up to the flavour of strings and binaries, a dictionary's encoding, and the
/// spelling of a UTC time zone; a nested type, up to its fields' metadata and nullability (see
/// [`same_nesting`]). `table_type` names nested fields as the files do (column mapping).
fn same_values(file_type: &DataType, table_type: &DataType) -> bool {
    use DataType::*;
    fn utc(tz: &Option<Arc<str>>) -> Option<&str> {
        tz.as_deref().map(|tz| {
            if matches!(tz, "UTC" | "+00:00" | "Z" | "Etc/UTC") {
                "UTC"
            } else {
                tz
            }
        })
    }
    match (file_type, table_type) {
        (Dictionary(_, value), table) => same_values(value, table),
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        (Timestamp(a, tz_a), Timestamp(b, tz_b)) => a == b && utc(tz_a) == utc(tz_b),
        (a, b) if a.is_nested() => same_nesting(a, b),
        (a, b) => a == b,
    }
}

/// Whether the nested `file_type` is `table_type` up to the metadata and nullability of its
/// fields (a writer's field ids, a list's element name): the same fields by name, in order, of
/// exactly the same types inside. Such a column is the table's by renaming alone (the same
/// buffers, [`lakefill_table::mapping::renamed`]); any other difference is not cut.
fn same_nesting(file_type: &DataType, table_type: &DataType) -> bool {
    use DataType::*;
    match (file_type, table_type) {
        (Struct(a), Struct(b)) => {
            a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(a, b)| {
                    a.name() == b.name() && same_nesting(a.data_type(), b.data_type())
                })
        }
        (List(a), List(b)) | (LargeList(a), LargeList(b)) => {
            same_nesting(a.data_type(), b.data_type())
        }
        (Map(a, sorted_a), Map(b, sorted_b)) => {
            sorted_a == sorted_b && same_nesting(a.data_type(), b.data_type())
        }
        (a, b) => a == b,
    }
}

/// The table's file columns (`table`), and the same columns as the files name them (`files`:
/// [`lakefill_table::mapping::ColumnMapping::physical_schema`]; the same names without column
/// mapping), field by field: an old file's columns are found by the names of `files`, and read
/// as `table` types them.
#[derive(Debug, Clone)]
pub(crate) struct OldColumns {
    pub(crate) table: SchemaRef,
    pub(crate) files: SchemaRef,
    /// Column mapping by id: readers find a file's columns by their field ids, so a file whose
    /// column of a field's id has another name than the field's physical one (or whose column
    /// of that name has another id) is not cut.
    pub(crate) by_id: bool,
}

/// Whether `file`'s column of `field` (as [`OldColumns::files`] names it, with its field id in
/// its metadata) is the one of its name: the same column found by id and by name, or neither.
fn same_column(file: &Schema, field: &Field) -> bool {
    let id = |f: &Field| {
        f.metadata()
            .get(lakefill_table::mapping::PARQUET_FIELD_ID)
            .cloned()
    };
    let wanted = id(field);
    let by_id = file
        .fields()
        .iter()
        .find(|f| wanted.is_some() && id(f) == wanted);
    match (file.field_with_name(field.name()).ok(), by_id) {
        (None, None) => true,
        (Some(named), Some(by_id)) => named.name() == by_id.name(),
        _ => false,
    }
}

/// The reader of one old file, its footer read.
#[expect(
    deprecated,
    reason = "parquet's object store reader is what DataFusion 55 reads with too; its successor is \
              not in parquet 59's API yet"
)]
async fn open_old(
    store: &Arc<dyn deltalake::ObjectStore>,
    file: &Add,
) -> Result<
    ParquetRecordBatchStreamBuilder<deltalake::parquet::arrow::async_reader::ParquetObjectReader>,
> {
    let reader = deltalake::parquet::arrow::async_reader::ParquetObjectReader::new(
        Arc::clone(store),
        lakefill_table::storage::object_path(&file.path),
    )
    .with_file_size(u64::try_from(file.size).unwrap_or(0));
    ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(|e| Error::Internal(format!("cannot read the old file `{}`: {e}", file.path)))
}

/// Whether an old file of `schema` (its footer's) holds the table's columns as they are, so its
/// rows can be matched by value (see [`same_values`]; by id, [`same_column`]).
fn cuttable(schema: &Schema, file: &Add, columns: &OldColumns) -> bool {
    for field in columns.files.fields() {
        if columns.by_id && !same_column(schema, field) {
            tracing::debug!(file = %file.path, column = %field.name(),
                "an old file's column of this field id is not the one of its name: rewritten");
            return false;
        }
        if let Ok(column) = schema.field_with_name(field.name())
            && !same_values(column.data_type(), field.data_type())
        {
            tracing::debug!(file = %file.path, column = %field.name(), file_type = %column.data_type(),
                table_type = %field.data_type(), "an old file's column is not of the table's type: rewritten");
            return false;
        }
    }
    true
}

/// One old file's rows, batch by batch in file order, for [`as_table`] to type as the table does.
/// `Ok(None)`: a column of the file is not of the table's type (see [`cuttable`]).
#[expect(
    deprecated,
    reason = "parquet's object store reader is what DataFusion 55 reads with too; its successor is \
              not in parquet 59's API yet"
)]
async fn read_old(
    store: &Arc<dyn deltalake::ObjectStore>,
    file: &Add,
    columns: &OldColumns,
) -> Result<
    Option<ParquetRecordBatchStream<deltalake::parquet::arrow::async_reader::ParquetObjectReader>>,
> {
    let builder = open_old(store, file).await?;
    if !cuttable(builder.schema(), file, columns) {
        return Ok(None);
    }
    let stream = builder
        .with_batch_size(8192)
        .build()
        .map_err(|e| Error::Internal(format!("cannot read the old file `{}`: {e}", file.path)))?;
    Ok(Some(stream))
}

/// Whether every file of `plan` can be cut (by their footers: [`cuttable`]).
pub(crate) async fn every_file_cuttable(
    plan: &VectorPlan,
    store: &Arc<dyn deltalake::ObjectStore>,
    columns: &OldColumns,
) -> Result<bool> {
    let files: Vec<Add> = plan.files.values().flatten().cloned().collect();
    let mut footers = futures::stream::iter(files)
        .map(|file| {
            let (store, columns) = (Arc::clone(store), columns.clone());
            async move {
                let builder = open_old(&store, &file).await?;
                Ok::<_, Error>(cuttable(builder.schema(), &file, &columns))
            }
        })
        .buffer_unordered(16);
    while let Some(cuttable) = footers.next().await {
        if !cuttable? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `batch` (rows of an old file, checked by [`read_old`]) with the table's file columns in the
/// table's types and names; a column the file lacks (added later) is NULL, as a reader reads it.
fn as_table(batch: &RecordBatch, columns: &OldColumns) -> Result<RecordBatch> {
    let typed = columns
        .table
        .fields()
        .iter()
        .zip(columns.files.fields())
        .map(
            |(field, in_files)| match batch.column_by_name(in_files.name()) {
                Some(column) if column.data_type() == field.data_type() => Ok(Arc::clone(column)),
                Some(column) if column.data_type().is_nested() => {
                    lakefill_table::mapping::renamed(column, field.data_type())
                }
                Some(column) => cast(column, field.data_type())
                    .map_err(|e| Error::Internal(format!("cannot type an old file's rows: {e}"))),
                None => Ok(new_null_array(field.data_type(), batch.num_rows())),
            },
        )
        .collect::<Result<Vec<ArrayRef>>>()?;
    RecordBatch::try_new(Arc::clone(&columns.table), typed)
        .map_err(|e| Error::Internal(format!("cannot type an old file's rows: {e}")))
}

/// `batch` (rows of one partition, in the table's file columns) with the partition's `values`
/// as columns (named `columns`) after them.
fn with_partition_columns(
    batch: &RecordBatch,
    (columns, values): (&[String], &[ScalarValue]),
) -> Result<RecordBatch> {
    let fail = |e: &dyn std::fmt::Display| {
        Error::Internal(format!("cannot add a partition's values to its rows: {e}"))
    };
    let rows = batch.num_rows();
    let mut fields: Vec<_> = batch.schema().fields().iter().cloned().collect();
    let mut arrays = batch.columns().to_vec();
    for (column, value) in columns.iter().zip(values) {
        fields.push(Arc::new(Field::new(column, value.data_type(), true)));
        arrays.push(value.to_array_of_size(rows).map_err(|e| fail(&e))?);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(|e| fail(&e))
}

/// Hands the rows of `batch` (old rows, in the table's file columns) that `scoped` holds (those
/// live before the fix, and with `--where` selected by it) to the old side's `capture`, with the
/// partition's values as columns, which holds their records back: one per row of `batch`
/// (`None` for a row out of scope, or settled at once). Those of the rows no new row uses up are
/// given back when the partition is settled ([`OldPartition::release`]); the others are left
/// out of the capture, and the new rows that used them up stand for them (their twins).
/// `hashed`: the value hashes of `batch`'s columns, reused when every row is in scope. A failure
/// spoils the capture (validation then reads the old rows), never the match.
fn capture_old(
    capture: &mut CaptureWriter,
    batch: &RecordBatch,
    (scoped, hashed): (&[bool], &[Vec<u64>]),
    partition: (&[String], &[ScalarValue]),
) -> Result<Vec<Option<Held>>> {
    let all = scoped.iter().all(|s| *s);
    let batch = if all {
        batch.clone()
    } else {
        let keep: BooleanArray = scoped.iter().map(|s| Some(*s)).collect();
        filter_record_batch(batch, &keep).map_err(|e| {
            Error::Internal(format!(
                "cannot hash an old file's rows for validation: {e}"
            ))
        })?
    };
    let live = all.then_some(hashed);
    let whole = with_partition_columns(&batch, partition)?;
    let schema = batch.schema();
    let mut held = capture
        .hold_batch(&whole, |name| {
            let at = schema.index_of(name).ok()?;
            live.and_then(|hashes| hashes.get(at)).map(Vec::as_slice)
        })
        .into_iter();
    Ok(scoped
        .iter()
        .map(|s| match s {
            true => held.next().flatten(),
            false => None,
        })
        .collect())
}

fn check_hashes(batch: &RecordBatch) -> Result<Vec<u64>> {
    lakefill_table::rowhash::check_hashes(batch.columns(), batch.num_rows())
}

/// The old rows of one partition, matched against its new rows as they are written.
pub(crate) struct OldPartition {
    /// The partition's label (its period).
    pub(crate) label: String,
    /// Its old files, and for each the rows deleted before and its rows in all.
    files: Vec<Add>,
    before: Vec<RoaringTreemap>,
    rows: Vec<u64>,
    located: Located,
    /// Old rows live before the fix (with `--where`, those it selects).
    live: u64,
    /// New rows seen, and those written (not among the old).
    new_rows: u64,
    added: u64,
    /// Each old file's live rows before the fix, and the rows written (not among the old): their
    /// checksums, which the files' digests hold ([`lakefill_table::rowhash::FileDigest`]).
    sums: Vec<RowChecksum>,
    written: RowChecksum,
    /// With `--where`, the live old rows it does not select: they stay where they are.
    carried: RowChecksum,
    /// The proof ([`Self::prove`]): each old row's check hash (by file and position), and the
    /// sums of the check hashes of the live old rows, the new rows and those written.
    checks: Vec<Vec<u64>>,
    /// With the keys the fix changes tracked ([`ChangedKeys`]): the key columns' positions, each
    /// old row's key hash (by file and position), and the key hashes of the rows written.
    key: Option<Vec<usize>>,
    keys: Vec<Vec<u64>>,
    written_keys: HashSet<u64>,
    /// The records of its old rows that the old side's capture holds back (by file and
    /// position; `None` for those it settled, or when nothing captures them): given back for
    /// the rows no new row uses up ([`Self::release`]).
    held: Vec<Vec<Option<Held>>>,
    live_check: u64,
    new_check: u64,
    added_check: u64,
    /// The partition's values, as its writer takes them.
    pub(crate) at: Option<(
        Vec<delta_kernel::expressions::Scalar>,
        lakefill_table::partition::PartitionValues,
    )>,
}

/// Whether `file`'s partition values are `values` (a group's, typed as its arrays are).
fn of_partition(file: &Add, columns: &[String], values: &[ScalarValue]) -> bool {
    columns.iter().zip(values).all(|(column, value)| {
        match file.partition_values.get(column).cloned().flatten() {
            None => value.is_null(),
            Some(text) => ScalarValue::Utf8(Some(text))
                .cast_to(&value.data_type())
                .is_ok_and(|parsed| parsed == *value),
        }
    })
}

impl OldPartition {
    /// Reads the old files of the partition whose values are `values` (of `columns`) among
    /// `candidates` (the files of its label); `None` when they cannot be cut (a column of
    /// another type). Their live rows (with `scope`, those it selects: the others are carried,
    /// never deleted) also go to `capture`, with the partition's values, each file noted once
    /// read whole. `key`: the key columns' positions, when the keys the fix changes are tracked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn load(
        store: &Arc<dyn deltalake::ObjectStore>,
        root: &url::Url,
        label: String,
        candidates: &[Add],
        (columns, values): (&[String], &[ScalarValue]),
        old_columns: &OldColumns,
        (scope, key): (Option<&Scope>, Option<&[usize]>),
        mut capture: Option<&mut CaptureWriter>,
    ) -> Result<Option<Self>> {
        let selector: Option<RowSelector> = match scope {
            Some(rows) => {
                let empty = RecordBatch::new_empty(Arc::clone(&old_columns.table));
                let whole = with_partition_columns(&empty, (columns, values))?;
                Some(rows.selector(&whole.schema())?)
            }
            None => None,
        };
        let mine: Vec<Add> = candidates
            .iter()
            .filter(|f| of_partition(f, columns, values))
            .cloned()
            .collect();
        let mut old = Self {
            label,
            files: Vec::new(),
            before: Vec::new(),
            rows: Vec::new(),
            // The partition's live rows by the log's statistics (at most the plan's
            // `max_rows`: a larger partition is not read, [`too_large`]).
            located: Located::with_capacity(usize::try_from(live_rows(&mine)).unwrap_or(0)),
            sums: Vec::new(),
            written: RowChecksum::default(),
            carried: RowChecksum::default(),
            live: 0,
            new_rows: 0,
            added: 0,
            checks: Vec::new(),
            key: key.map(<[usize]>::to_vec),
            keys: Vec::new(),
            written_keys: HashSet::new(),
            held: Vec::new(),
            live_check: 0,
            new_check: 0,
            added_check: 0,
            at: None,
        };
        for file in mine {
            let before = lakefill_table::vectors::deleted_rows(
                store.as_ref(),
                root,
                file.deletion_vector.as_ref(),
            )
            .await?;
            let Some(mut stream) = read_old(store, &file, old_columns).await? else {
                return Ok(None);
            };
            let index = u32::try_from(old.files.len()).unwrap_or(u32::MAX);
            let mut position = 0u64;
            let mut checks = Vec::new();
            let mut keys = Vec::new();
            let mut held = Vec::new();
            let mut sum = RowChecksum::default();
            while let Some(batch) = stream.next().await {
                let batch = batch.map_err(|e| {
                    Error::Internal(format!("cannot read the old file `{}`: {e}", file.path))
                })?;
                let batch = as_table(&batch, old_columns)?;
                let values_hashed = batch
                    .columns()
                    .iter()
                    .map(lakefill_table::rowhash::value_hashes)
                    .collect::<Result<Vec<_>>>()?;
                let hashes = lakefill_table::rowhash::combine_rows(
                    &values_hashed.iter().map(Vec::as_slice).collect::<Vec<_>>(),
                    batch.num_rows(),
                );
                // Live before the fix, and in the fix's scope (the rest of them are carried).
                let live: Vec<bool> = if before.is_empty() {
                    vec![true; batch.num_rows()]
                } else {
                    (position..position + batch.num_rows() as u64)
                        .map(|p| !before.contains(p))
                        .collect()
                };
                let scoped: Vec<bool> = match &selector {
                    Some(selector) => selector
                        .select(&with_partition_columns(&batch, (columns, values))?)?
                        .into_iter()
                        .zip(&live)
                        .map(|(selected, live)| selected && *live)
                        .collect(),
                    None => live.clone(),
                };
                if let Some(capture) = capture.as_deref_mut() {
                    match capture_old(
                        capture,
                        &batch,
                        (&scoped, &values_hashed),
                        (columns, values),
                    ) {
                        Ok(records) => held.extend(records),
                        Err(why) => capture.spoil(&why.to_string()),
                    }
                }
                old.located
                    .add(index, position, &hashes, |p| {
                        !scoped[usize::try_from(p - position).unwrap_or(usize::MAX)]
                    })
                    .map_err(|e| Error::Internal(e.to_string()))?;
                let batch_checks = check_hashes(&batch)?;
                // The live rows' checksum (the file's digest); the check hashes of those in
                // scope (the proof), and the checksum of those carried.
                for (offset, (check, hash)) in batch_checks.iter().zip(&hashes).enumerate() {
                    if !live[offset] {
                        continue;
                    }
                    sum.rows += 1;
                    sum.sum += u128::from(*hash);
                    if scoped[offset] {
                        old.live_check = old.live_check.wrapping_add(*check);
                        old.live += 1;
                    } else {
                        old.carried.rows += 1;
                        old.carried.sum += u128::from(*hash);
                    }
                }
                checks.extend(batch_checks);
                if let Some(key) = key {
                    keys.extend(key_hashes(&batch, key)?);
                }
                position += batch.num_rows() as u64;
            }
            if let Some(capture) = capture.as_deref_mut() {
                capture.read_whole(&file.path);
            }
            old.checks.push(checks);
            old.keys.push(keys);
            old.held.push(held);
            old.sums.push(sum);
            old.files.push(file);
            old.before.push(before);
            old.rows.push(position);
        }
        Ok(Some(old))
    }

    /// The rows of `part` (new rows of the partition, whose columns' value hashes are `values`,
    /// [`lakefill_table::rowhash::value_hashes`]) to write: those not among the old rows left;
    /// and per row of `part` whether it used up an old row (is its twin, not written).
    pub(crate) fn added(
        &mut self,
        part: &RecordBatch,
        values: &[Vec<u64>],
    ) -> Result<(RecordBatch, Vec<bool>)> {
        let rows = part.num_rows();
        let hashes = lakefill_table::rowhash::combine_rows(
            &values.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            rows,
        );
        let kept = self.located.take(&hashes);
        let write: BooleanArray = kept.iter().map(|k| Some(!k)).collect();
        let written = filter_record_batch(part, &write)
            .map_err(|e| Error::Internal(format!("cannot select the rows to write: {e}")))?;
        self.new_rows += rows as u64;
        self.added += written.num_rows() as u64;
        if let Some(key) = &self.key {
            self.written_keys.extend(key_hashes(&written, key)?);
        }
        for ((check, kept), hash) in check_hashes(part)?.into_iter().zip(&kept).zip(hashes) {
            self.new_check = self.new_check.wrapping_add(check);
            if !*kept {
                self.added_check = self.added_check.wrapping_add(check);
                self.written.rows += 1;
                self.written.sum += u128::from(hash);
            }
        }
        Ok((written, kept))
    }

    /// The checksum of the rows written (the new rows the old files lack).
    pub(crate) fn written(&self) -> RowChecksum {
        self.written
    }

    /// The checksum of the live old rows outside the fix's `--where` (none without one): they
    /// stay in their files, or, in a partition rewritten, are written again with its rows.
    pub(crate) fn carried(&self) -> RowChecksum {
        self.carried
    }

    /// The key hashes of the old rows the fix deletes and of the rows it writes (none when the
    /// keys are not tracked): see [`ChangedKeys`].
    pub(crate) fn changed_keys(&self) -> impl Iterator<Item = u64> + '_ {
        let deleted = self
            .located
            .unused()
            .filter_map(|(file, position)| self.keys.get(file as usize)?.get(position as usize));
        self.written_keys.iter().chain(deleted).copied()
    }

    /// Gives back to the old side's `capture` the records it held of the old rows no new row
    /// used up (those the fix deletes); the others are the twins of new rows ([`capture_old`]).
    pub(crate) fn release(&self, capture: &mut CaptureWriter) {
        capture.release(self.located.unused().filter_map(|(file, position)| {
            *self.held.get(file as usize)?.get(position as usize)?
        }));
    }

    /// The paths of its old files.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|f| f.path.as_str())
    }

    /// Proves, with a hash independent of the one rows were matched by, that the old rows kept
    /// and the rows written are the new rows: their counts and the sums of their check hashes.
    pub(crate) fn prove(&self) -> Result<()> {
        let unused = self
            .located
            .unused()
            .map(|(file, position)| self.checks[file as usize][position as usize])
            .fold(0u64, u64::wrapping_add);
        let kept = self.live_check.wrapping_sub(unused);
        let counts = self.counts();
        if self.live - counts.deleted + counts.added != self.new_rows
            || kept.wrapping_add(self.added_check) != self.new_check
        {
            return Err(Error::Internal(format!(
                "partition {}: the old rows kept by deletion vectors and the rows written are not \
                 the model's rows ({} live old rows, {} deleted, {} written, {} new); nothing was \
                 published",
                self.label, self.live, counts.deleted, counts.added, self.new_rows
            )));
        }
        Ok(())
    }

    /// What the fix changes in the partition.
    pub(crate) fn counts(&self) -> VectorCounts {
        VectorCounts {
            deleted: self.located.left(),
            added: self.added,
            rows: self.new_rows,
        }
    }

    /// Whether the fix changes more of the partition than `threshold` (of its old and new rows;
    /// with `--where`, the rows it does not select count on both sides, as a rewrite carries
    /// them: a fix of every row of one country of eight changes an eighth of the partition).
    pub(crate) fn over(&self, threshold: f64) -> bool {
        let counts = self.counts();
        let all = self.live + self.new_rows + 2 * self.carried.rows;
        all > 0 && (counts.deleted + counts.added) as f64 / all as f64 > threshold
    }

    /// Each old file with the rows it no longer holds once the fix is published (those deleted
    /// before, and those the fix deletes), whether the fix deletes any of its rows, and the
    /// checksum of the rows it then holds; with its rows in all, which its statistics then say.
    pub(crate) fn cut(self) -> Vec<(Add, RoaringTreemap, bool, RowChecksum)> {
        let mut deleted: Vec<RoaringTreemap> = vec![RoaringTreemap::new(); self.files.len()];
        let mut sums = self.sums;
        for (hash, file, position) in self.located.unused_hashed() {
            deleted[file as usize].insert(position);
            let sum = &mut sums[file as usize];
            sum.rows -= 1;
            sum.sum -= u128::from(hash);
        }
        self.files
            .into_iter()
            .zip(self.before)
            .zip(self.rows)
            .zip(deleted)
            .zip(sums)
            .map(|((((file, before), rows), deleted), sum)| {
                let cut = !deleted.is_empty();
                (with_row_count(file, rows), before | deleted, cut, sum)
            })
            .collect()
    }

    /// Each old file with the rows it does not keep (deleted before, or by the fix): for a
    /// partition rewritten after all, whose old rows that stay are written again
    /// ([`kept_rows`]).
    pub(crate) fn rewritten(self) -> Vec<(Add, RoaringTreemap)> {
        let mut deleted: Vec<RoaringTreemap> = self.before;
        for (file, position) in self.located.unused() {
            deleted[file as usize].insert(position);
        }
        self.files.into_iter().zip(deleted).collect()
    }
}

/// The rows of the old `file` not in `deleted`, as the table types them.
pub(crate) async fn kept_rows(
    store: &Arc<dyn deltalake::ObjectStore>,
    file: &Add,
    deleted: RoaringTreemap,
    columns: &OldColumns,
) -> Result<impl Stream<Item = Result<RecordBatch>> + Send + use<>> {
    let Some(stream) = read_old(store, file, columns).await? else {
        return Err(Error::Internal(format!(
            "the old file `{}` changed types while it was read",
            file.path
        )));
    };
    let (path, columns) = (file.path.clone(), columns.clone());
    let mut position = 0u64;
    Ok(stream
        .map_err(move |e| Error::Internal(format!("cannot read the old file `{path}`: {e}")))
        .and_then(move |batch| {
            let keep: BooleanArray = (position..position + batch.num_rows() as u64)
                .map(|p| Some(!deleted.contains(p)))
                .collect();
            position += batch.num_rows() as u64;
            let kept = as_table(&batch, &columns).and_then(|batch| {
                filter_record_batch(&batch, &keep)
                    .map_err(|e| Error::Internal(format!("cannot select the rows kept: {e}")))
            });
            futures::future::ready(kept)
        }))
}

/// `file` with statistics that give its rows in all (`rows`), which a reader of its deletion
/// vector needs: the log's, or, where it has none, just the count.
fn with_row_count(mut file: Add, rows: u64) -> Add {
    if file
        .get_stats()
        .ok()
        .flatten()
        .is_none_or(|stats| u64::try_from(stats.num_records).ok() != Some(rows))
    {
        file.stats =
            Some(serde_json::json!({"numRecords": rows, "tightBounds": false}).to_string());
    }
    file
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By rows, batches join where an old file's times reach over their boundary, and only
    /// there: a file of one day leaves its batch alone, a file reaching into the next day joins
    /// its batch, a file of unknown times joins them all; the carry batch stays last, numbered
    /// again.
    #[test]
    fn batches_join_where_an_old_file_reaches_over_their_boundary() {
        use lakefill_table::time::Grain;
        let day = |d: u32| format!("2026-01-{d:02}");
        let batch = |index: usize, from: u32, to: u32| crate::plan::BatchPlan {
            index,
            start: day(from),
            end: day(to),
            partitions: (from..=to).map(day).collect(),
            null: false,
            carry: false,
        };
        let carry = crate::plan::BatchPlan {
            carry: true,
            ..batch(5, 1, 10)
        };
        // Five batches of two days: 1-2, 3-4, 5-6, 7-8, 9-10.
        let batches: Vec<_> = (0..5)
            .map(|i| batch(i, 2 * i as u32 + 1, 2 * i as u32 + 2))
            .chain([carry])
            .collect();
        let at = |d: u32, h: u32| {
            chrono::NaiveDate::from_ymd_opt(2026, 1, d)
                .unwrap()
                .and_hms_opt(h, 0, 0)
                .unwrap()
        };
        let ms = chrono::TimeDelta::milliseconds(1);
        let joined = |spans: &[Option<Span>]| {
            let (batches, of) = joined_batches(&batches, spans, Grain::Day);
            let bounds: Vec<(usize, String, String, bool)> = batches
                .iter()
                .map(|b| (b.index, b.start.clone(), b.end.clone(), b.carry))
                .collect();
            (bounds, of)
        };
        let bounds = |pairs: &[(u32, u32)]| -> Vec<(usize, String, String, bool)> {
            pairs
                .iter()
                .enumerate()
                .map(|(i, (from, to))| (i, day(*from), day(*to), false))
                .chain([(pairs.len(), day(1), day(10), true)])
                .collect()
        };
        // Files of a day (a DATE's: its one instant, and a millisecond): batches as they were.
        let (got, of) = joined(&[
            Some((at(1, 0), at(1, 0) + ms)),
            Some((at(4, 0), at(4, 0) + ms)),
            Some((at(9, 5), at(9, 6))),
        ]);
        assert_eq!(got, bounds(&[(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]));
        assert_eq!(of, [0, 1, 4]);
        // A file from day 4 to day 5 (noon) joins 3-4 and 5-6; one from 6 to 7, those and 7-8.
        let (got, of) = joined(&[
            Some((at(4, 0), at(5, 12))),
            Some((at(6, 0), at(7, 1))),
            Some((at(10, 0), at(10, 1))),
        ]);
        assert_eq!(got, bounds(&[(1, 2), (3, 8), (9, 10)]));
        assert_eq!(of, [1, 1, 2]);
        // Times outside the range on both sides reach the first and last batch.
        let (got, _) = joined(&[Some((at(1, 0) - chrono::TimeDelta::days(30), at(2, 0)))]);
        assert_eq!(got, bounds(&[(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]));
        // Unknown times: one batch.
        let (got, of) = joined(&[Some((at(1, 0), at(1, 1))), None]);
        assert_eq!(got, bounds(&[(1, 10)]));
        assert_eq!(of, [0, 0]);
        assert_eq!(
            joined_batches(&batches, &[None], Grain::Day).0[0]
                .partitions
                .len(),
            10
        );
    }

    #[test]
    fn values_are_alike_only_in_the_same_type() {
        use deltalake::arrow::datatypes::TimeUnit;
        let utc = |tz: &str| DataType::Timestamp(TimeUnit::Microsecond, Some(tz.into()));
        assert!(same_values(&utc("+00:00"), &utc("UTC")));
        assert!(!same_values(
            &DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            &utc("UTC")
        ));
        assert!(!same_values(&utc("Europe/Paris"), &utc("UTC")));
        assert!(same_values(&DataType::Utf8View, &DataType::Utf8));
        assert!(same_values(
            &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            &DataType::LargeUtf8
        ));
        assert!(!same_values(&DataType::Int32, &DataType::Int64));
    }

    /// By column id, a file's column is read by its physical name only when the column of the
    /// field's id is that one (a column added later is in neither).
    #[test]
    fn by_id_the_column_of_a_name_is_the_column_of_its_id() {
        use std::collections::HashMap;
        let field = |name: &str, id: &str| {
            Field::new(name, DataType::Int64, true).with_metadata(HashMap::from([(
                lakefill_table::mapping::PARQUET_FIELD_ID.to_string(),
                id.to_string(),
            )]))
        };
        let wanted = field("col-a", "1");
        let file = |fields: Vec<Field>| Schema::new(fields);
        assert!(same_column(&file(vec![field("col-a", "1")]), &wanted));
        assert!(same_column(&file(vec![field("col-b", "2")]), &wanted));
        assert!(!same_column(&file(vec![field("col-b", "1")]), &wanted));
        assert!(!same_column(&file(vec![field("col-a", "2")]), &wanted));
        assert!(!same_column(
            &file(vec![field("col-a", "2"), field("col-b", "1")]),
            &wanted
        ));
    }

    /// A nested column is the table's when only its fields' metadata (a writer's field ids) and
    /// nullability differ; a field named otherwise, or of another flavour inside, is not.
    #[test]
    fn nested_values_are_alike_up_to_metadata_and_nullability() {
        use std::collections::HashMap;
        let field = |name: &str, data_type: DataType, nullable: bool, id: Option<&str>| {
            let field = Field::new(name, data_type, nullable);
            match id {
                Some(id) => field.with_metadata(HashMap::from([(
                    "PARQUET:field_id".to_string(),
                    id.to_string(),
                )])),
                None => field,
            }
        };
        let point = |x: &str, tag: DataType, nullable: bool, id: Option<&str>| {
            DataType::Struct(
                vec![
                    field(x, DataType::Int64, nullable, id),
                    field("col-tag", tag, true, None),
                ]
                .into(),
            )
        };
        let table = point("col-x", DataType::Utf8, true, None);
        assert!(same_values(
            &point("col-x", DataType::Utf8, false, Some("7")),
            &table
        ));
        assert!(!same_values(
            &point("x", DataType::Utf8, true, None),
            &table
        ));
        assert!(!same_values(
            &point("col-x", DataType::LargeUtf8, true, None),
            &table
        ));
        let list = |element: &str, inner: DataType| {
            DataType::List(Arc::new(Field::new(element, inner, true)))
        };
        assert!(same_values(
            &list("element", table.clone()),
            &list("item", table.clone())
        ));
        assert!(!same_values(
            &list("element", DataType::Int32),
            &list("element", DataType::Int64)
        ));
    }
}
