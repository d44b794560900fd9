//! Staging: run the model per batch and stream its output into invisible Parquet files.
//!
//! Each batch gets its own DataFusion session in which every source is registered as a view over
//! the table at its pinned version, filtered to the batch window widened by lookback/lookahead
//! periods of the source's own grain (so the Delta scan prunes partitions). The SELECT runs with
//! `$start`, `$end` and `$next` bound, and its output streams, record batch by record batch, into
//! one Parquet writer per partition (every partition column of the target) under
//! `<partition dir>/lakefill-<run_id>/`. Those files are not in the Delta log until
//! the runner's `publish` commits them. Nothing is collected in memory: a writer holds at most one
//! row group per open partition, a batch has at most `batch_partitions` periods, and at most
//! `OPEN_WRITERS` (64) writers are open at once (the batch carrying rows over may reach every
//! partition of the range).
//!
//! [`check_model`](crate::plan::query::check_model) plans the model once when the plan is made, so what `plan` accepts,
//! `backfill` runs.

pub mod feed;
mod hasher;
pub mod throttle;
pub mod vectors;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use delta_kernel::expressions::Scalar;
use delta_kernel::table_properties::DataSkippingNumIndexedCols;
use deltalake::Path;
use deltalake::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use deltalake::arrow::compute::take;
use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::arrow::row::{RowConverter, SortField};
use deltalake::datafile::writer::{PartitionWriter, PartitionWriterConfig};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::common::ScalarValue;
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::datafusion::logical_expr::{Expr, cast};
use deltalake::datafusion::prelude::{DataFrame, SessionContext};
use deltalake::kernel::Add;
use deltalake::kernel::scalars::ScalarExt as _;
use deltalake::parquet::basic::Compression;
use deltalake::parquet::file::properties::WriterProperties;
use futures::{StreamExt, TryStreamExt};
use indexmap::IndexMap;
use tracing::Instrument as _;

use crate::plan::query::{batch_dataframe, target_schema};
use crate::plan::{BackfillPlan, BatchPlan};
use crate::stage::hasher::{Hashed, Hasher, Job};
use crate::stage::throttle::{Throttle, ThrottledStore};
use lakefill_log::journal::BatchRecord;
use lakefill_table::error::{DeltaContext, Error, QueryContext, Result};
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::mapping::ColumnMapping;
use lakefill_table::partition::{CARRIED_LABEL, NULL_LABEL, PartitionValues};
use lakefill_table::protocol::IdentityColumn;
use lakefill_table::resources::Resources;
use lakefill_table::rowhash::{DIGEST_TAG, FileDigest, RowChecksum};
use lakefill_table::time::Period;
use lakefill_validate::keymerge::{Capture, CaptureWriter};
use lakefill_validate::multiset::StagedHashes;

/// Rows per Parquet row group: bounds the memory of each open partition writer.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Staging options.
#[derive(Debug, Clone)]
pub struct StageOptions {
    /// Batches in flight.
    pub max_parallel: usize,
    /// The runtime (memory pool) every batch's session shares.
    pub resources: Resources,
    /// The bound on bytes written per second, if any.
    pub throttle: Option<Arc<Throttle>>,
    /// The Ballista scheduler (`df://HOST:PORT`) that stages the batches, if not this process.
    pub engine: Option<String>,
    /// The generation of the run's lease this process holds: a cluster's writer tasks stop
    /// writing once it is no longer held.
    pub lease: Option<u64>,
    /// What the writers hash of the new rows for the steps after staging.
    pub hashing: Hashing,
}

/// What a run's writers hash of the new rows beside writing them, for the steps that would
/// otherwise read the staged files back to hash them; nothing by default.
#[derive(Debug, Clone, Default)]
pub struct Hashing {
    /// The key and row hashes of validation's key merge.
    pub capture: Option<Arc<Capture>>,
    /// The whole rows' hashes of the adjustments' multiset difference.
    pub rows: Option<Arc<StagedHashes>>,
    /// With deletion vectors, the old rows as staging reads them to match them
    /// ([`Capture::old_side`]), so that validation does not read them again.
    pub old: Option<Arc<Capture>>,
    /// With deletion vectors and a change data feed, the keys the fix changes, so that the
    /// feed compares only their rows.
    pub changed: Option<Arc<vectors::ChangedKeys>>,
}

/// Stages every batch not in `skip` (`done` holds the records of those, from an earlier attempt).
///
/// Each finished batch is sent to `finished`, in completion order, so the caller can journal it
/// before more finish; the channel's bound keeps staging from running far ahead of the journal.
pub async fn stage(
    plan: &BackfillPlan,
    options: &StageOptions,
    skip: &BTreeSet<usize>,
    done: &[BatchRecord],
    finished: tokio::sync::mpsc::Sender<BatchRecord>,
) -> Result<()> {
    let target_schema = Arc::new(target_schema(plan)?);
    if plan.report.reads_own_past {
        return stage_in_order(plan, options, skip, done, finished, target_schema).await;
    }
    each_batch(plan, skip, options.max_parallel, finished, |batch| {
        let schema = Arc::clone(&target_schema);
        let resources = options.resources.clone();
        let store = ThrottledStore::wrap(plan.target.object_store(), options.throttle.clone());
        let hashing = options.hashing.clone();
        async move { stage_batch(plan, &batch, schema, &resources, store, &hashing).await }
    })
    .await
}

/// The plan by deletion vectors of `plan`'s run, whose queries may use `memory_limit` bytes
/// ([`vectors::VectorPlan::with_memory_limit`]). By rows, where a partition that cannot be cut
/// stops the run (no batch carries the rows outside the range), none when an old file cannot
/// be cut (a column in another type than the table's, as its footer says: Spark's INT96
/// timestamps): the run then rewrites, as before vectors.
pub async fn vectors_for_run(
    plan: &BackfillPlan,
    memory_limit: Option<u64>,
) -> Result<Option<Arc<vectors::VectorPlan>>> {
    let Some(bounded) = plan
        .vectors
        .as_ref()
        .and_then(|v| v.with_memory_limit(memory_limit))
    else {
        return Ok(None);
    };
    if plan.report.layout.by_rows && plan.publishes_by_vectors() {
        let target_schema = target_schema(plan)?;
        let mapping = plan
            .report
            .protocol
            .mapping
            .clone()
            .with_added(&target_schema);
        let columns = Columns::split(&plan.report.layout, &mapping, &target_schema)?;
        let store = plan.target.object_store();
        if !vectors::every_file_cuttable(&bounded, &store, &columns.old()).await? {
            tracing::info!(
                "an old file holds a column in another type than the table's: the fix by rows is \
                 published by rewriting its files"
            );
            return Ok(None);
        }
    }
    Ok(Some(Arc::new(bounded)))
}

/// Stages a model that reads its own past (see [`crate::plan`]'s `recursive`): one batch (of one
/// partition) at a time, in order, each reading its target as this run will publish it so far,
/// the rows at the read version with every partition staged before overlaid.
async fn stage_in_order(
    plan: &BackfillPlan,
    options: &StageOptions,
    skip: &BTreeSet<usize>,
    done: &[BatchRecord],
    finished: tokio::sync::mpsc::Sender<BatchRecord>,
    target_schema: SchemaRef,
) -> Result<()> {
    let mut staged: Vec<Add> = done.iter().flat_map(|b| b.files.iter().cloned()).collect();
    let store = ThrottledStore::wrap(plan.target.object_store(), options.throttle.clone());
    for batch in &plan.report.batches {
        if skip.contains(&batch.index) {
            continue;
        }
        let reading = plan.reading_staged(batch, &staged)?;
        let record = stage_batch(
            &reading,
            batch,
            Arc::clone(&target_schema),
            &options.resources,
            Arc::clone(&store),
            &options.hashing,
        )
        .await?;
        staged.extend(record.files.iter().cloned());
        if finished.send(record).await.is_err() {
            // The journal stopped listening: it failed, and reports why.
            break;
        }
    }
    Ok(())
}

/// Runs `stage_one` on every batch of `plan` not in `skip`, `max_parallel` at a time, and sends
/// each record to `finished` as it comes, so the caller can journal it before more finish; the
/// channel's bound keeps staging from running far ahead of the journal.
pub async fn each_batch<F, Fut>(
    plan: &BackfillPlan,
    skip: &BTreeSet<usize>,
    max_parallel: usize,
    finished: tokio::sync::mpsc::Sender<BatchRecord>,
    stage_one: F,
) -> Result<()>
where
    F: FnMut(BatchPlan) -> Fut,
    Fut: std::future::Future<Output = Result<BatchRecord>>,
{
    let pending: Vec<BatchPlan> = plan
        .report
        .batches
        .iter()
        .filter(|b| !skip.contains(&b.index))
        .cloned()
        .collect();
    // Owned batches keep the stream's future `Send` (borrowed items trip higher-ranked lifetimes).
    let mut staged = futures::stream::iter(pending)
        .map(stage_one)
        .buffer_unordered(max_parallel.max(1));
    while let Some(record) = staged.try_next().await? {
        if finished.send(record).await.is_err() {
            // The journal stopped listening: it failed, and reports why.
            break;
        }
    }
    Ok(())
}

/// Where the rows of one partition go.
enum Placement {
    /// Written by this batch.
    Batch,
    /// Produced again, and kept, by the batch that owns the partition.
    OtherBatch,
    /// Outside the range: counted as spill under this label.
    Outside(String),
    /// Not a value of the grain (e.g. the 15th in a monthly table).
    OffGrain(String),
}

/// A partition being written: its label, its writer, and the checksum of the rows written (its
/// file's [`FileDigest`]).
struct OpenPartition {
    label: String,
    writer: PartitionWriter,
    /// When it last took rows (the batch's count of groups written then).
    used: u64,
}

impl OpenPartition {
    /// Closes the writer of `target`: its files.
    async fn close(self, target: &str) -> Result<Vec<Add>> {
        self.writer
            .close()
            .await
            .map_err(|source| Error::StagingWrite {
                table: target.to_string(),
                partition: self.label,
                source: Box::new(source),
            })
    }
}

/// Partition writers a batch keeps open at once (each holds up to a row group in memory). A
/// batch of periods opens at most `batch_partitions` × the sub-partitions of each; the batch that
/// carries rows over (by rows, `--where`) may reach every partition of the range, so beyond this
/// the least recently written is closed (its partition may then get one more file).
const OPEN_WRITERS: usize = 64;

/// Runs one batch and writes its partitions; returns what it staged.
async fn stage_batch(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    target_schema: SchemaRef,
    resources: &Resources,
    store: Arc<dyn deltalake::ObjectStore>,
    hashing: &Hashing,
) -> Result<BatchRecord> {
    tracing::debug!(batch = batch.index, start = %batch.start, end = %batch.end, "staging batch");
    failpoint::reach(CrashPoint::StageBatch(batch.index)).await?;
    if batch.carry && plan.publishes_by_vectors() {
        // `--where` by deletion vectors: the rows it does not select stay in their files (the
        // other batches read them, and count them as carried). The batch stages nothing, and
        // what hashes the sides for validation knows it finished so.
        for capture in [&hashing.capture, &hashing.old].into_iter().flatten() {
            capture.writer().finish(batch.index, std::iter::empty());
        }
        if let Some(changed) = &hashing.changed {
            changed.finish(batch.index, Some(vectors::Found::default()));
        }
        return Ok(batch.empty_record());
    }
    let (_ctx, df) = if batch.carry {
        carried_dataframe(plan, resources).await?
    } else {
        batch_dataframe(plan, batch, resources).await?
    };
    write_batch(plan, batch, df, target_schema, store, hashing).await
}

/// Streams `df` (rows of `batch`) into staged files, one writer per partition; returns what it
/// staged: files, and per partition rows, measure sums and row checksums. The rows' hashes also
/// go where `hashing` says.
pub async fn write_batch(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    df: DataFrame,
    target_schema: SchemaRef,
    store: Arc<dyn deltalake::ObjectStore>,
    hashing: &Hashing,
) -> Result<BatchRecord> {
    let produced = crate::plan::query::produced_columns(&df);
    let df = target_projection(plan, df, &target_schema)?;
    let stream: SendableRecordBatchStream = df.execute_stream().await.query_context(|| {
        format!(
            "cannot run model `{}` for batch {}..{}",
            plan.model.name(),
            batch.start,
            batch.end
        )
    })?;
    write_stream(
        plan,
        batch,
        stream,
        &produced,
        target_schema,
        store,
        hashing,
    )
    .await
}

/// Stages the rows of `stream` (of `target_schema`) for `batch`, like [`write_batch`] does the
/// rows of a query; `produced`: the columns the rows came with (an identity column left out is
/// assigned).
pub async fn write_stream(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    stream: SendableRecordBatchStream,
    produced: &[String],
    target_schema: SchemaRef,
    store: Arc<dyn deltalake::ObjectStore>,
    hashing: &Hashing,
) -> Result<BatchRecord> {
    let spec = WriteSpec::of(plan, batch).assigning_identity(plan, produced);
    // The rows are routed, encoded and written on a task of their own: batches staged side by
    // side then encode on every core, where polled from the run's own task they took turns on
    // one thread (the runtime's other threads waiting on them).
    let writer = spec.clone();
    let hashing = hashing.clone();
    let task = AbortOnDrop(tokio::spawn(
        async move { writer.write(stream, target_schema, store, &hashing).await }.in_current_span(),
    ));
    task.join().await??.into_record(&spec)
}

/// A spawned task that is aborted when its handle is dropped: a batch whose run stopped (another
/// batch failed, an interrupt) stops writing at its next await, as it did when it was a future of
/// the run's own task.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    async fn join(mut self) -> Result<T> {
        (&mut self.0).await.map_err(|e| {
            if e.is_panic() {
                Error::Internal(format!("a batch's writer panicked: {e}"))
            } else {
                Error::Internal("a batch's writer was cancelled".into())
            }
        })
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The model's output cast to `target_schema` (its columns in the target's order and types).
pub fn target_projection(
    plan: &BackfillPlan,
    df: DataFrame,
    target_schema: &Schema,
) -> Result<DataFrame> {
    // The model leaves the lineage columns of adjustments to them: they are NULL in its rows.
    let produced: BTreeSet<String> = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let projection: Vec<Expr> = target_schema
        .fields()
        .iter()
        .map(|f| {
            // Rows carried over by rows are the table's: they have none of the run's added
            // columns, which are NULL in them as in every other row the run did not write.
            let added = plan
                .report
                .added_columns
                .iter()
                .any(|c| c.name == *f.name());
            // An identity column the model leaves out is assigned by the writer.
            let identity = plan
                .report
                .protocol
                .identity
                .iter()
                .any(|c| c.name == *f.name());
            let value = if !produced.contains(f.name())
                && (lakefill_table::adjustments::is_lineage(f.name()) || added || identity)
            {
                Expr::Literal(deltalake::datafusion::common::ScalarValue::Null, None)
            } else {
                Expr::Column(Column::new_unqualified(f.name()))
            };
            cast(value, f.data_type().clone()).alias(f.name())
        })
        .collect();
    df.select(projection).query_context(|| {
        format!(
            "cannot cast the output of `{}` to the target schema",
            plan.model.name()
        )
    })
}

/// What writing one batch's rows needs to know of its run: everything, so that a task on another
/// machine (see `crate::distributed`) writes exactly as a local batch does.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WriteSpec {
    /// The target's name (for errors).
    pub target: String,
    /// The model's name and version (for errors).
    pub model: String,
    /// The model's version.
    pub model_version: String,
    /// How the target keeps time in its partitions.
    pub layout: lakefill_table::partition::Layout,
    /// The run's range.
    pub range: lakefill_table::partition::PartitionRange,
    /// The run (names its staging directories).
    pub run_id: lakefill_table::run_id::RunId,
    /// The measures summed while writing.
    pub measures: Vec<String>,
    /// The key columns (written without a dictionary).
    pub key: Vec<String>,
    /// The batch to stage.
    pub batch: BatchPlan,
    /// The names and ids the target's files use for its columns (and the run's added ones).
    #[serde(default)]
    pub mapping: ColumnMapping,
    /// The identity columns whose NULL values the writer assigns (those the model leaves out,
    /// and those that take explicit values too).
    #[serde(default)]
    pub identity: Vec<IdentityColumn>,
    /// The old files the batch may publish its fix into by deletion vectors, if any (a cluster's
    /// writers rewrite).
    #[serde(skip)]
    pub vectors: Option<Arc<vectors::VectorPlan>>,
}

/// What one writer staged: the batch's record, and the rows whose time is not a value of the
/// grain (an error, raised by whoever gathers the records).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Written {
    /// The batch's record, when the writer staged anything.
    pub record: Option<BatchRecord>,
    /// Rows per partition label whose time is not a value of the grain.
    pub off_grain: BTreeMap<String, u64>,
}

impl WriteSpec {
    /// What a writer of `batch` of `plan` needs to know.
    pub fn of(plan: &BackfillPlan, batch: &BatchPlan) -> Self {
        Self {
            target: plan.report.target.clone(),
            model: plan.model.name().to_string(),
            model_version: plan.model.version().to_string(),
            layout: plan.report.layout.clone(),
            range: plan.report.range.clone(),
            run_id: plan.report.run_id.clone(),
            measures: plan.rules.summed_measures(),
            key: plan.rules.key.clone(),
            batch: batch.clone(),
            mapping: match &plan.write_schema {
                Some(schema) => plan.report.protocol.mapping.clone().with_added(schema),
                None => plan.report.protocol.mapping.clone(),
            },
            identity: Vec::new(),
            // Reverts rewrite (their kind is set after the plan is made).
            vectors: plan
                .vectors
                .clone()
                .filter(|_| !batch.carry && plan.publishes_by_vectors()),
        }
    }

    /// The spec with the identity columns whose values the writer assigns, for a model whose
    /// output has the columns `produced`: those it leaves out, and those that take explicit
    /// values (`GENERATED BY DEFAULT`) where it gives NULL. Rows carried over keep theirs.
    #[must_use]
    pub fn assigning_identity(mut self, plan: &BackfillPlan, produced: &[String]) -> Self {
        if !self.batch.carry {
            self.identity = plan
                .report
                .protocol
                .identity
                .iter()
                .filter(|c| !c.always || !produced.contains(&c.name))
                .cloned()
                .collect();
        }
        self
    }

    /// Where this batch's identity values start: `index · 2^32` steps beyond the high-water mark.
    fn identity_block(&self) -> i64 {
        i64::from(u32::try_from(self.batch.index).unwrap_or(u32::MAX)) << 32
    }

    /// `record_batch` with the NULLs of the identity columns this batch assigns replaced by new
    /// values: batch `i` numbers its values from `i * 2^32 + 1` steps beyond the high-water
    /// mark, so that batches staged side by side, or again after a resume, never share one.
    fn assign_identity(&self, record_batch: &RecordBatch, next: &mut i64) -> Result<RecordBatch> {
        use deltalake::arrow::array::Int64Array;
        let mut columns = record_batch.columns().to_vec();
        let block_end = self.identity_block() + (1 << 32);
        let start = *next;
        for column in &self.identity {
            let Ok(index) = record_batch.schema().index_of(&column.name) else {
                continue;
            };
            let array = &columns[index];
            if array.null_count() == 0 {
                continue;
            }
            let values = array
                .as_primitive_opt::<deltalake::arrow::datatypes::Int64Type>()
                .ok_or_else(|| {
                    Error::Internal(format!("identity column `{}` is not a long", column.name))
                })?;
            let mut k = start;
            let filled: Vec<i64> = values
                .iter()
                .map(|value| match value {
                    Some(value) => Ok(value),
                    None => {
                        k += 1;
                        if k >= block_end {
                            return Err(Error::Internal(format!(
                                "batch {} assigns more than 2^32 values to identity column `{}`; use smaller batches (`--batch-partitions`)",
                                self.batch.index, column.name
                            )));
                        }
                        column.value(k).ok_or_else(|| {
                            Error::Internal(format!(
                                "identity column `{}` overflows a long after {}",
                                column.name,
                                column.high_water_mark.unwrap_or(column.start)
                            ))
                        })
                    }
                })
                .collect::<Result<_>>()?;
            *next = (*next).max(k);
            columns[index] = Arc::new(Int64Array::from(filled));
        }
        RecordBatch::try_new(record_batch.schema(), columns)
            .map_err(|e| Error::Internal(format!("cannot assign identity values: {e}")))
    }

    fn periods(&self) -> Result<(Period, Period)> {
        let grain = self.range.grain;
        let parse = |label: &str| {
            Period::from_label(grain, label)
                .ok_or_else(|| Error::Internal(format!("batch bound `{label}` is not a {grain}")))
        };
        Ok((parse(&self.batch.start)?, parse(&self.batch.end)?))
    }

    /// Streams `stream` (rows of the batch, in `target_schema`) into staged files, one writer
    /// per partition; returns what it staged: files, and per partition rows, measure sums and
    /// row checksums. The rows' hashes also go where `hashing` says.
    pub async fn write(
        &self,
        mut stream: SendableRecordBatchStream,
        target_schema: SchemaRef,
        store: Arc<dyn deltalake::ObjectStore>,
        hashing: &Hashing,
    ) -> Result<Written> {
        let mut staging = Staging::start(self, target_schema, store, hashing)?;
        let mut identity_next = self.identity_block();
        while let Some(record_batch) = stream.next().await {
            let record_batch = record_batch.query_context(|| {
                format!(
                    "model `{}` failed in batch {}..{}",
                    self.model, self.batch.start, self.batch.end
                )
            })?;
            if record_batch.num_rows() > 0 {
                let record_batch = if self.identity.is_empty() {
                    record_batch
                } else {
                    self.assign_identity(&record_batch, &mut identity_next)?
                };
                staging.take(&record_batch).await?;
            }
        }
        staging.finish().await
    }
}

/// The columns of the target as a batch writes them: the partition columns (and how their values
/// compare), the columns that go into the files, and, by rows, the one holding a row's time.
pub(crate) struct Columns {
    pub(crate) partition: Vec<usize>,
    pub(crate) file: Vec<usize>,
    pub(crate) file_schema: SchemaRef,
    /// The file columns as the files name them (column mapping).
    pub(crate) physical_schema: SchemaRef,
    /// Column mapping by id (readers find the files' columns by field id).
    by_id: bool,
    pub(crate) converter: RowConverter,
    time: Option<usize>,
}

impl Columns {
    fn of(spec: &WriteSpec, target_schema: &Schema) -> Result<Self> {
        let layout = &spec.layout;
        let mut columns = Self::split(layout, &spec.mapping, target_schema)?;
        // By rows, a row's period comes from its time column, which is not a partition column.
        columns.time = match (layout.by_rows, spec.batch.carry) {
            (true, false) => {
                let column = layout.time.encoding.columns()[0];
                Some(target_schema.index_of(column).map_err(|_| {
                    Error::Internal(format!(
                        "range column `{column}` is not in the target schema"
                    ))
                })?)
            }
            _ => None,
        };
        Ok(columns)
    }

    /// The file columns as deletion vectors read old files: by the names the files give them.
    pub(crate) fn old(&self) -> vectors::OldColumns {
        vectors::OldColumns {
            table: Arc::clone(&self.file_schema),
            files: Arc::clone(&self.physical_schema),
            by_id: self.by_id,
        }
    }

    /// The partition columns of `layout` and the file columns of `target_schema` (also what the
    /// change feed's files are written by), without a time column.
    pub(crate) fn split(
        layout: &lakefill_table::partition::Layout,
        mapping: &ColumnMapping,
        target_schema: &Schema,
    ) -> Result<Self> {
        let partition: Vec<usize> = layout
            .partition_columns
            .iter()
            .map(|c| {
                target_schema.index_of(c).map_err(|_| {
                    Error::Internal(format!(
                        "partition column `{c}` is not in the target schema"
                    ))
                })
            })
            .collect::<Result<_>>()?;
        let file: Vec<usize> = (0..target_schema.fields().len())
            .filter(|i| !partition.contains(i))
            .collect();
        // Nullable on purpose: a NULL in a NOT NULL column must reach validation, which names the
        // column, the partition and the rows, instead of stopping the write.
        let file_schema: SchemaRef = Arc::new(Schema::new(
            file.iter()
                .map(|i| Arc::new(target_schema.field(*i).clone().with_nullable(true)))
                .collect::<Vec<_>>(),
        ));
        let physical_schema = mapping.physical_schema(&file_schema);
        let converter = RowConverter::new(
            partition
                .iter()
                .map(|i| SortField::new(target_schema.field(*i).data_type().clone()))
                .collect(),
        )
        .map_err(|e| Error::Internal(format!("cannot compare partition values: {e}")))?;
        Ok(Self {
            partition,
            file,
            file_schema,
            physical_schema,
            by_id: mapping.mode == lakefill_table::mapping::MappingMode::Id,
            converter,
            time: None,
        })
    }
}

/// A row's period: by its time column (by rows) or its partition values; `Err` holds a value
/// that is not a time of the grain.
type RowPeriod = std::result::Result<Option<Period>, String>;

/// The rows of one record batch, grouped by partition values (and, by rows, by period).
struct Groups {
    /// The partition columns' arrays.
    partition_arrays: Vec<deltalake::arrow::array::ArrayRef>,
    /// By rows, each row's period.
    row_times: Option<Vec<RowPeriod>>,
    /// The row indices of each group, in order of first appearance.
    groups: Vec<Vec<u32>>,
}

impl Groups {
    /// Groups the rows of `record_batch`, compared as Arrow rows (cheap), so that where a group
    /// goes is decided once.
    fn of(spec: &WriteSpec, columns: &Columns, record_batch: &RecordBatch) -> Result<Self> {
        let partition_arrays: Vec<_> = columns
            .partition
            .iter()
            .map(|i| Arc::clone(record_batch.column(*i)))
            .collect();
        // An unpartitioned table has one partition: no key to compare.
        let keys = if partition_arrays.is_empty() {
            None
        } else {
            Some(
                columns
                    .converter
                    .convert_columns(&partition_arrays)
                    .map_err(|e| {
                        Error::Internal(format!("cannot compare partition values: {e}"))
                    })?,
            )
        };
        let row_times = match columns.time {
            Some(index) => Some(row_periods(record_batch.column(index), &spec.layout.time)?),
            None => None,
        };
        let mut group_of: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut groups: Vec<Vec<u32>> = Vec::new();
        let mut key_bytes = Vec::new();
        // Rows mostly come in runs of one partition (a source file holds a day): a row like the
        // one before goes where it went, without building and looking up its key.
        let like_previous = |row: usize| {
            row > 0
                && keys
                    .as_ref()
                    .is_none_or(|keys| keys.row(row) == keys.row(row - 1))
                && row_times
                    .as_ref()
                    .is_none_or(|times| times[row] == times[row - 1])
        };
        let mut previous_group = 0;
        for row in 0..record_batch.num_rows() {
            if like_previous(row) {
                groups[previous_group].push(row as u32);
                continue;
            }
            key_bytes.clear();
            if let Some(keys) = &keys {
                key_bytes.extend_from_slice(keys.row(row).as_ref());
            }
            if let Some(times) = &row_times {
                match &times[row] {
                    Ok(Some(period)) => key_bytes.extend_from_slice(period.label().as_bytes()),
                    Ok(None) => key_bytes.push(0),
                    Err(message) => key_bytes.extend_from_slice(message.as_bytes()),
                }
                key_bytes.push(0xff);
            }
            let group = match group_of.get(key_bytes.as_slice()) {
                Some(group) => *group,
                None => {
                    group_of.insert(key_bytes.clone(), groups.len());
                    groups.push(Vec::new());
                    groups.len() - 1
                }
            };
            groups[group].push(row as u32);
            previous_group = group;
        }
        Ok(Self {
            partition_arrays,
            row_times,
            groups,
        })
    }
}

/// One batch's writing in progress: a writer per partition, and what it has counted so far.
struct Staging<'a> {
    spec: &'a WriteSpec,
    columns: Columns,
    store: Arc<dyn deltalake::ObjectStore>,
    /// The batch's first and last periods.
    first: Period,
    last: Period,
    /// Measures summed while writing, so validation need not scan the staged files for them.
    measures: Vec<(String, usize)>,
    writers: BTreeMap<Vec<Option<String>>, OpenPartition>,
    rows: BTreeMap<String, u64>,
    spill: BTreeMap<String, u64>,
    off_grain: BTreeMap<String, u64>,
    sums: BTreeMap<String, BTreeMap<String, f64>>,
    hasher: Hasher,
    /// Groups of rows written so far (what [`OpenPartition::used`] counts in).
    groups_written: u64,
    /// Files of writers closed before the batch ended, and the partitions they were of (whose
    /// files then carry no checksum tag: their writers' checksums cover more than one file).
    closed: Vec<Add>,
    rolled: BTreeSet<Vec<Option<String>>>,
    /// With deletion vectors, each partition's old rows (`None`: it cannot be cut, and is
    /// rewritten).
    old: BTreeMap<Vec<Option<String>>, Option<vectors::OldPartition>>,
    /// With deletion vectors, the labels of the partitions that cannot be cut, and of those
    /// among them too large to match in memory.
    uncut: BTreeSet<String>,
    too_large: BTreeSet<String>,
    /// With deletion vectors, where the old rows read go for validation ([`Hashing::old`]).
    old_capture: Option<CaptureWriter>,
    /// With deletion vectors and `--where`, the checksum of the old rows it does not select
    /// (they stay where they are): what the batch carries over.
    carried: RowChecksum,
    /// Where the keys the fix changes go ([`Hashing::changed`]), the key columns' positions
    /// when they are tracked, and those found; `None` once a partition is not matched.
    changed: Option<Arc<vectors::ChangedKeys>>,
    changed_key: Option<Vec<usize>>,
    changed_found: Option<vectors::Found>,
    /// The target's columns as the batch stages them.
    target_schema: SchemaRef,
}

impl<'a> Staging<'a> {
    fn start(
        spec: &'a WriteSpec,
        target_schema: SchemaRef,
        store: Arc<dyn deltalake::ObjectStore>,
        hashing: &Hashing,
    ) -> Result<Self> {
        let columns = Columns::of(spec, &target_schema)?;
        let (first, last) = spec.periods()?;
        let measures = spec
            .measures
            .iter()
            .filter_map(|m| columns.file_schema.index_of(m).ok().map(|i| (m.clone(), i)))
            .collect();
        // The keys the fix changes are tracked only when the batch publishes by vectors.
        let changed_key = spec
            .vectors
            .as_ref()
            .and(hashing.changed.as_ref())
            .and_then(|_| vectors::ChangedKeys::columns(&spec.key, &columns.file_schema));
        let hasher = Hasher::start(
            hashing.capture.as_ref().map(Capture::writer),
            hashing.rows.as_ref().map(StagedHashes::writer),
            Arc::clone(&columns.file_schema),
            Arc::clone(&target_schema),
        );
        Ok(Self {
            spec,
            columns,
            store,
            first,
            last,
            measures,
            writers: BTreeMap::new(),
            rows: BTreeMap::new(),
            spill: BTreeMap::new(),
            off_grain: BTreeMap::new(),
            sums: BTreeMap::new(),
            hasher,
            groups_written: 0,
            closed: Vec::new(),
            rolled: BTreeSet::new(),
            old: BTreeMap::new(),
            uncut: BTreeSet::new(),
            too_large: BTreeSet::new(),
            old_capture: spec
                .vectors
                .as_ref()
                .and(hashing.old.as_ref())
                .map(Capture::writer),
            carried: RowChecksum::default(),
            changed: hashing.changed.clone(),
            changed_key,
            changed_found: Some(vectors::Found::default()),
            target_schema,
        })
    }

    /// The rows of `part` (new rows of the partition `key`, whose values are those of
    /// `record_batch`'s row `first_row`) to write: with deletion vectors, those its old files
    /// lack (its old rows are read on its first rows), and the value hashes of `part`'s columns
    /// the match computed (the hasher's too), with per row of `part` whether it used up an old
    /// row (the twin flags of validation's capture).
    async fn rows_to_write(
        &mut self,
        key: &[Option<String>],
        label: &str,
        (record_batch, first_row): (&RecordBatch, usize),
        (scalars, values): (&[Scalar], &PartitionValues),
        part: &RecordBatch,
    ) -> Result<(RecordBatch, Option<(Vec<Vec<u64>>, Vec<bool>)>)> {
        let Some(plan) = &self.spec.vectors else {
            return Ok((part.clone(), None));
        };
        if !self.old.contains_key(key) {
            let typed = self
                .columns
                .partition
                .iter()
                .map(|i| ScalarValue::try_from_array(record_batch.column(*i), first_row))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Internal(format!("cannot read a partition value: {e}")))?;
            let candidates = plan
                .files
                .get(plan.unit(&self.spec.batch, label))
                .map_or(&[][..], Vec::as_slice);
            // A partition too large to match in memory is not read: it is rewritten.
            let too_large = vectors::too_large(plan, candidates);
            if let (Some(why), true) = (&too_large, plan.scoped()) {
                return Err(self.cannot_cut(label, why));
            }
            let old = match too_large {
                Some(_) => {
                    self.too_large.insert(label.to_string());
                    None
                }
                None => vectors::OldPartition::load(
                    &self.store,
                    &plan.root,
                    plan.counted_as(&self.spec.batch, label),
                    candidates,
                    (&self.spec.layout.partition_columns, &typed),
                    &self.columns.old(),
                    (plan.scope.as_ref(), self.changed_key.as_deref()),
                    self.old_capture.as_mut(),
                )
                .await?
                .map(|mut old| {
                    old.at = Some((scalars.to_vec(), values.clone()));
                    old
                }),
            };
            if old.is_none() && plan.scoped() {
                return Err(self.cannot_cut(label, vectors::OTHER_TYPE));
            }
            if old.is_none() {
                self.uncut.insert(label.to_string());
                if let Some(capture) = &mut self.old_capture {
                    capture.spoil("a partition's old files were not read whole (it is rewritten)");
                }
                self.changed_found = None;
            }
            self.old.insert(key.to_vec(), old);
        }
        match self.old.get_mut(key) {
            Some(Some(old)) => {
                let hashes = part
                    .columns()
                    .iter()
                    .map(lakefill_table::rowhash::value_hashes)
                    .collect::<Result<Vec<_>>>()?;
                let (written, twins) = old.added(part, &hashes)?;
                Ok((written, Some((hashes, twins))))
            }
            _ => Ok((part.clone(), None)),
        }
    }

    /// Closes the writer that took rows least recently, keeping its files for the batch's record.
    async fn close_least_recent(&mut self) -> Result<()> {
        let Some(key) = self
            .writers
            .iter()
            .min_by_key(|(_, open)| open.used)
            .map(|(key, _)| key.clone())
        else {
            return Ok(());
        };
        let Some(open) = self.writers.remove(&key) else {
            return Ok(());
        };
        let adds = open.close(&self.spec.target).await?;
        self.closed.extend(adds);
        self.rolled.insert(key);
        Ok(())
    }

    /// Writes the rows of `record_batch` that this batch owns, each group to its partition's
    /// writer; counts the rest as spill, rows of another batch, or off the grain.
    async fn take(&mut self, record_batch: &RecordBatch) -> Result<()> {
        let Groups {
            partition_arrays,
            row_times,
            groups,
        } = Groups::of(self.spec, &self.columns, record_batch)?;
        for indices in groups {
            let first_row = indices[0] as usize;
            let scalars = partition_scalars(&partition_arrays, first_row)?;
            let values: PartitionValues = self
                .spec
                .layout
                .partition_columns
                .iter()
                .zip(&scalars)
                .map(|(c, s)| (c.clone(), (!s.is_null()).then(|| s.serialize())))
                .collect();
            let period = match &row_times {
                Some(times) => times[first_row].clone(),
                None if self.spec.batch.carry => Ok(None),
                None => self.spec.layout.time.period_of(&values),
            };
            let count = indices.len() as u64;
            match self.placement(&period) {
                Placement::Batch => {}
                Placement::OtherBatch => continue,
                Placement::Outside(label) => {
                    *self.spill.entry(label).or_default() += count;
                    continue;
                }
                Placement::OffGrain(message) => {
                    *self.off_grain.entry(message).or_default() += count;
                    continue;
                }
            }
            self.write_group(record_batch, indices, first_row, &scalars, &values, &period)
                .await?;
        }
        Ok(())
    }

    /// Where the rows of a group whose period is `period` go.
    fn placement(&self, period: &RowPeriod) -> Placement {
        let (batch, range) = (&self.spec.batch, &self.spec.range);
        match period.clone() {
            _ if batch.carry => Placement::Batch,
            Err(message) => Placement::OffGrain(message),
            Ok(None) if batch.null => Placement::Batch,
            Ok(None) if range.include_null => Placement::OtherBatch,
            Ok(None) => Placement::Outside(NULL_LABEL.to_string()),
            Ok(Some(_)) if batch.null => Placement::OtherBatch,
            Ok(Some(period)) if self.first <= period && period <= self.last => Placement::Batch,
            Ok(Some(period)) if range.contains(&period) => Placement::OtherBatch,
            Ok(Some(period)) => Placement::Outside(period.label()),
        }
    }

    /// Writes one group of this batch's rows to its partition's writer (opened on its first
    /// rows), counting its rows and measures and hashing it for validation.
    async fn write_group(
        &mut self,
        record_batch: &RecordBatch,
        indices: Vec<u32>,
        first_row: usize,
        scalars: &[Scalar],
        values: &PartitionValues,
        period: &RowPeriod,
    ) -> Result<()> {
        let spec = self.spec;
        let indices = UInt32Array::from(indices);
        let columns = self
            .columns
            .file
            .iter()
            .map(|i| take(record_batch.column(*i).as_ref(), &indices, None))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Internal(format!("cannot split a batch by partition: {e}")))?;
        let part =
            RecordBatch::try_new(Arc::clone(&self.columns.file_schema), columns).map_err(|e| {
                Error::Internal(format!("the output does not fit the staged files: {e}"))
            })?;
        let key: Vec<Option<String>> = spec
            .layout
            .partition_columns
            .iter()
            .map(|c| values.get(c).cloned().flatten())
            .collect();
        // The partition a row's counts belong to: its period (by rows, several periods may share
        // one file's directory), or the rows carried over unchanged.
        let label = match period {
            _ if spec.batch.carry => CARRIED_LABEL.to_string(),
            Ok(Some(period)) => period.label(),
            _ => NULL_LABEL.to_string(),
        };
        let (written, matched) = self
            .rows_to_write(
                &key,
                &label,
                (record_batch, first_row),
                (scalars, values),
                &part,
            )
            .await?;
        let (hashes, twins) = matched.unzip();
        *self.rows.entry(label.clone()).or_default() += part.num_rows() as u64;
        if !self.measures.is_empty() {
            let partition_sums = self.sums.entry(label.clone()).or_default();
            for (measure, index) in &self.measures {
                *partition_sums.entry(measure.clone()).or_default() +=
                    column_sum(part.column(*index))?;
            }
        }
        self.hasher
            .hash(Job {
                writer: key.clone(),
                label: label.clone(),
                part: part.clone(),
                batch: record_batch.clone(),
                indices,
                first_row,
                values: hashes,
                twins,
            })
            .await?;
        if written.num_rows() == 0 {
            return Ok(());
        }
        self.write_rows(key, label, scalars, values, &written).await
    }

    /// Writes `part` (file columns) to the writer of the partition `key` (opened on its first
    /// rows).
    async fn write_rows(
        &mut self,
        key: Vec<Option<String>>,
        label: String,
        scalars: &[Scalar],
        values: &PartitionValues,
        part: &RecordBatch,
    ) -> Result<()> {
        let spec = self.spec;
        if !self.writers.contains_key(&key) && self.writers.len() >= OPEN_WRITERS {
            self.close_least_recent().await?;
        }
        self.groups_written += 1;
        let used = self.groups_written;
        let open = match self.writers.entry(key) {
            std::collections::btree_map::Entry::Occupied(entry) => {
                let open = entry.into_mut();
                open.used = used;
                open
            }
            std::collections::btree_map::Entry::Vacant(entry) => entry.insert(OpenPartition {
                label: label.clone(),
                used,
                writer: partition_writer(
                    spec,
                    scalars,
                    values,
                    &near_unique_columns(part),
                    Arc::clone(&self.columns.physical_schema),
                    Arc::clone(&self.store),
                )?,
            }),
        };
        open.writer
            .write(
                &spec
                    .mapping
                    .to_physical(part, &self.columns.physical_schema)?,
            )
            .await
            .map_err(|source| Error::StagingWrite {
                table: spec.target.clone(),
                partition: label,
                source: Box::new(source),
            })
    }

    /// With deletion vectors, decides each partition's publish: by vectors (its old files with
    /// the rows the fix deletes, in a vector file written now, each tagged with the checksum of
    /// the rows it keeps), or, when the fix changes too much of it, rewritten (its old rows that
    /// stay written after its new ones). Returns the batch's vectors, and the checksum of the
    /// rows its writer wrote for each partition whose files hold not just their new rows (their
    /// writers' checksums do not describe them): by vectors, the new rows the old files lack;
    /// rewritten, none.
    async fn settle_vectors(
        &mut self,
    ) -> Result<(
        Option<lakefill_log::journal::BatchVectors>,
        BTreeMap<Vec<Option<String>>, Option<RowChecksum>>,
    )> {
        let mut written_apart = BTreeMap::new();
        let Some(plan) = self.spec.vectors.clone() else {
            return Ok((None, written_apart));
        };
        let mut record = lakefill_log::journal::BatchVectors {
            uncut: std::mem::take(&mut self.uncut),
            too_large: std::mem::take(&mut self.too_large),
            ..Default::default()
        };
        let mut cuts = Vec::new();
        let unvisited = self.unvisited(&plan).await?;
        let add = |counts: &mut lakefill_log::journal::VectorCounts,
                   more: lakefill_log::journal::VectorCounts| {
            counts.deleted += more.deleted;
            counts.added += more.added;
            counts.rows += more.rows;
        };
        let visited = std::mem::take(&mut self.old).into_iter();
        for ((key, old), unvisited) in visited
            .map(|entry| (entry, false))
            .chain(unvisited.into_iter().map(|entry| (entry, true)))
        {
            let Some(old) = old else { continue };
            old.prove()?;
            if let Some(capture) = &mut self.old_capture {
                old.release(capture);
            }
            if let Some(found) = &mut self.changed_found {
                found.keys.extend(old.changed_keys());
                found.read.extend(old.paths().map(str::to_string));
            }
            self.carried.merge(&old.carried());
            let counts = old.counts();
            // A partition the model left without rows has no writer: it keeps its files.
            let over = !unvisited && old.over(plan.threshold);
            written_apart.insert(key.clone(), (!over).then(|| old.written()));
            if over {
                add(
                    record.rewritten.entry(old.label.clone()).or_default(),
                    counts,
                );
                let (scalars, values) = old.at.clone().ok_or_else(|| {
                    Error::Internal("a partition's old rows without its values".into())
                })?;
                let label = old.label.clone();
                let (store, columns) = (Arc::clone(&self.store), self.columns.old());
                for (file, deleted) in old.rewritten() {
                    let mut rows =
                        std::pin::pin!(vectors::kept_rows(&store, &file, deleted, &columns).await?);
                    while let Some(rows) = rows.next().await {
                        let rows = rows?;
                        if rows.num_rows() > 0 {
                            self.write_rows(key.clone(), label.clone(), &scalars, &values, &rows)
                                .await?;
                        }
                    }
                }
            } else {
                add(
                    record.partitions.entry(old.label.clone()).or_default(),
                    counts,
                );
                for (file, deleted, cut, kept) in old.cut() {
                    if cut && kept.rows == 0 {
                        // Every row of it deleted: removed whole, as Delta's own DELETE does,
                        // rather than kept behind a vector that hides all of it.
                        continue;
                    }
                    if cut {
                        cuts.push((file, deleted, kept));
                    } else {
                        record.kept.push(file);
                    }
                }
            }
        }
        if !cuts.is_empty() {
            let written = lakefill_table::vectors::write(
                self.store.as_ref(),
                cuts.iter().map(|(_, deleted, _)| deleted.clone()).collect(),
            )
            .await?;
            record.vector_files.push(written.path);
            for ((file, _, kept), descriptor) in cuts.into_iter().zip(written.descriptors) {
                record.cut.insert(file.path.clone());
                let tag = FileDigest::tag(
                    &kept,
                    self.columns.file_schema.fields(),
                    &file.path,
                    Some(&lakefill_table::vectors::fingerprint(&descriptor)),
                );
                let mut add = lakefill_table::vectors::cut_add(&file, descriptor);
                add.tags
                    .get_or_insert_with(Default::default)
                    .insert(DIGEST_TAG.to_string(), Some(tag));
                record.kept.push(add);
            }
        }
        let any = !record.partitions.is_empty()
            || !record.rewritten.is_empty()
            || !record.uncut.is_empty();
        Ok((any.then_some(record), written_apart))
    }

    /// With `--where`, the old rows of the partitions of this batch that the model left without
    /// rows: the rows it selects there are the fix's to delete, and the others stay (no batch
    /// carries them over). Without, such a partition's files are removed whole, as in a rewrite.
    async fn unvisited(
        &mut self,
        plan: &vectors::VectorPlan,
    ) -> Result<Vec<(Vec<Option<String>>, Option<vectors::OldPartition>)>> {
        let Some(scope) = &plan.scope else {
            return Ok(Vec::new());
        };
        let read: BTreeSet<String> = self
            .old
            .values()
            .flatten()
            .flat_map(|old| old.paths().map(str::to_string))
            .collect();
        let columns = &self.spec.layout.partition_columns;
        let mut partitions: BTreeMap<(String, Vec<Option<String>>), Vec<Add>> = BTreeMap::new();
        let batch = &self.spec.batch;
        // By rows, the batch's files are under its first period, for each of its periods.
        let units: BTreeSet<&str> = batch
            .partitions
            .iter()
            .map(|label| plan.unit(batch, label))
            .collect();
        for unit in units {
            let label = plan.counted_as(batch, unit);
            for file in plan.files.get(unit).into_iter().flatten() {
                if read.contains(&file.path) {
                    continue;
                }
                let key: Vec<Option<String>> = columns
                    .iter()
                    .map(|c| file.partition_values.get(c).cloned().flatten())
                    .collect();
                partitions
                    .entry((label.clone(), key))
                    .or_default()
                    .push(file.clone());
            }
        }
        let mut loaded = Vec::new();
        for ((label, key), files) in partitions {
            let values = columns
                .iter()
                .zip(&key)
                .map(|(column, text)| {
                    let field = self.target_schema.field_with_name(column).map_err(|e| {
                        Error::Internal(format!("partition column `{column}`: {e}"))
                    })?;
                    lakefill_table::staged::partition_scalar(field.data_type(), text.as_deref())
                })
                .collect::<Result<Vec<_>>>()?;
            if let Some(why) = vectors::too_large(plan, &files) {
                return Err(self.cannot_cut(&label, &why));
            }
            let old = vectors::OldPartition::load(
                &self.store,
                &plan.root,
                label.clone(),
                &files,
                (columns, &values),
                &self.columns.old(),
                (Some(scope), self.changed_key.as_deref()),
                self.old_capture.as_mut(),
            )
            .await?;
            if old.is_none() {
                return Err(self.cannot_cut(&label, vectors::OTHER_TYPE));
            }
            loaded.push((key, old));
        }
        Ok(loaded)
    }

    /// Why a fix by deletion vectors scoped to some rows of the files it reads (`--where`, by
    /// rows) stops at a partition whose old files it cannot cut: no batch carries the rows
    /// outside the scope, so the partition cannot be rewritten instead.
    fn cannot_cut(&self, label: &str, why: &str) -> Error {
        let scope = self
            .spec
            .vectors
            .as_ref()
            .and_then(|plan| plan.scope.as_ref())
            .map(ToString::to_string)
            .unwrap_or_default();
        let hint = if self.spec.layout.by_rows {
            // (Not expected: a fix by rows is published by rewriting when a file's footer or the
            // log's statistics say it cannot be cut, before staging.)
            "run the fix again: its old files are checked before staging, and a fix by rows \
             whose files cannot be cut is published by rewriting them"
        } else {
            "run the fix without `--where` (a partition that cannot be cut is then rewritten \
             whole), or rewrite that partition first"
        };
        Error::UnsupportedFeature {
            table: self.spec.target.clone(),
            feature: "deletionVectors".into(),
            why: format!(
                "with {scope} a fix is published by deletion vectors, which keep the rows outside \
                 it in their files; partition {label} {why}, so it cannot be cut; nothing was \
                 published"
            ),
            hint: hint.into(),
        }
    }

    /// Closes every writer: the batch's files, each tagged with its rows' checksum, and its
    /// record. Nothing of a batch that produced rows off the grain is kept.
    async fn finish(mut self) -> Result<Written> {
        if !self.off_grain.is_empty() {
            // The writers are dropped unclosed.
            return Ok(Written {
                record: None,
                off_grain: self.off_grain,
            });
        }
        // (Settling reads the partitions the model left without rows, with `--where`: their old
        // rows go to the capture too.)
        let (vectors, mut written_apart) = self.settle_vectors().await?;
        let old_capture = self.old_capture.take();
        if let Some(changed) = &self.changed {
            // Tracked only when the batch published by vectors, with a key the feed can use.
            let found = self
                .changed_found
                .take()
                .filter(|_| self.changed_key.is_some());
            changed.finish(self.spec.batch.index, found);
        }
        let Hashed {
            mut checksums,
            mut by_writer,
            capture,
            rows,
        } = self.hasher.finish().await?;
        let mut files: Vec<Add> = self.closed;
        for (key, open) in self.writers {
            let checksum = match written_apart.remove(&key) {
                Some(written) => written,
                None => Some(by_writer.remove(&key).unwrap_or_default()),
            };
            let mut adds = open.close(&self.spec.target).await?;
            // A writer that never rolls (no target size) writes one file: its rows' checksum goes
            // into its `add`, for whoever compares with these rows once they are published
            // (unless an earlier writer of its partition was closed: the checksum covers both).
            if let ([add], Some(checksum)) = (adds.as_mut_slice(), checksum)
                && !self.rolled.contains(&key)
            {
                let tag = FileDigest::tag(
                    &checksum,
                    self.columns.file_schema.fields(),
                    &add.path,
                    None,
                );
                add.tags
                    .get_or_insert_with(Default::default)
                    .insert(DIGEST_TAG.to_string(), Some(tag));
            }
            files.extend(adds);
        }
        if self.carried.rows > 0 {
            checksums
                .entry(CARRIED_LABEL.to_string())
                .or_default()
                .merge(&self.carried);
        }
        for capture in [capture, old_capture].into_iter().flatten() {
            capture.finish(self.spec.batch.index, files.iter().map(|a| a.path.clone()));
        }
        if let Some(rows) = rows {
            rows.finish(self.spec.batch.index, files.iter().map(|a| a.path.clone()));
        }
        Ok(Written {
            record: Some(BatchRecord {
                files,
                rows: self.rows,
                spill: self.spill,
                sums: self.sums,
                checksums,
                vectors,
                ..self.spec.batch.empty_record()
            }),
            off_grain: self.off_grain,
        })
    }
}

impl Written {
    /// The batch's record; an error naming the rows whose time is not a value of the grain.
    pub fn into_record(self, spec: &WriteSpec) -> Result<BatchRecord> {
        if !self.off_grain.is_empty() {
            return Err(Error::OffGrain {
                model: format!("{}@{}", spec.model, spec.model_version),
                grain: spec.layout.time.grain,
                values: self.off_grain.into_iter().collect(),
            });
        }
        self.record
            .ok_or_else(|| Error::Internal("a batch was written without its record".into()))
    }
}

/// The rows of the files a by-rows backfill rewrites that lie outside its range (and, unless the
/// range takes the NULL partition, those whose time is NULL), read at the read version: they are
/// written again unchanged.
async fn carried_dataframe(
    plan: &BackfillPlan,
    resources: &Resources,
) -> Result<(SessionContext, DataFrame)> {
    let report = &plan.report;
    let layout = &report.layout;
    let ctx = resources.session();
    let provider = plan
        .target
        .table_provider()
        .with_file_paths(
            report
                .affected_files
                .iter()
                .map(|p| lakefill_table::storage::selection_path(p)),
        )
        .await
        .query_context(|| "cannot scan the files the backfill rewrites".into())?;
    let schema = target_schema(plan)?;
    let in_range = layout.range_predicate(&report.range, &schema)?;
    // NULL comparisons are not false: rows with a NULL time are outside unless they are in.
    let outside = in_range.is_not_true();
    let df = ctx
        .read_table(provider)
        .and_then(|df| df.filter(outside))
        .query_context(|| "cannot select the rows to carry over".into())?;
    Ok((ctx, df))
}

/// The period of each row's time value, for a time column that is not a partition column.
fn row_periods(
    array: &deltalake::arrow::array::ArrayRef,
    time: &lakefill_table::partition::TimeColumn,
) -> Result<Vec<std::result::Result<Option<Period>, String>>> {
    use deltalake::arrow::datatypes::{Date32Type, TimeUnit, TimestampMicrosecondType};
    let grain = time.grain;
    let out_of_range = |what: String| Err(format!("{what} is out of range"));
    Ok(match array.data_type() {
        DataType::Date32 => array
            .as_primitive::<Date32Type>()
            .iter()
            .map(|days| match days {
                None => Ok(None),
                Some(days) => match chrono::NaiveDate::from_ymd_opt(1970, 1, 1).and_then(|epoch| {
                    epoch.checked_add_signed(chrono::TimeDelta::days(i64::from(days)))
                }) {
                    Some(date) => Ok(Period::of_date(grain, date)),
                    None => out_of_range(format!("day {days}")),
                },
            })
            .collect(),
        DataType::Timestamp(_, _) => {
            let micros = deltalake::arrow::compute::cast(
                array,
                &DataType::Timestamp(TimeUnit::Microsecond, None),
            )
            .map_err(|e| Error::Internal(format!("cannot read a timestamp: {e}")))?;
            micros
                .as_primitive::<TimestampMicrosecondType>()
                .iter()
                .map(|value| match value {
                    None => Ok(None),
                    Some(micros) => match chrono::DateTime::from_timestamp_micros(micros) {
                        Some(instant) => Ok(Period::containing(grain, instant.naive_utc())),
                        None => out_of_range(format!("timestamp {micros}")),
                    },
                })
                .collect()
        }
        _ => {
            let text = deltalake::arrow::compute::cast(array, &DataType::Utf8).map_err(|e| {
                Error::Internal(format!("cannot read the time column as text: {e}"))
            })?;
            let lakefill_table::partition::TimeEncoding::Text { column, format } = &time.encoding
            else {
                return Err(Error::Internal(format!(
                    "the range column has type {}, which holds no times",
                    array.data_type()
                )));
            };
            text.as_string::<i32>()
                .iter()
                .map(|value| match value {
                    None => Ok(None),
                    Some(value) => lakefill_table::partition::parse_with_format(value, format)
                        .map(|instant| Period::containing(grain, instant))
                        .ok_or_else(|| format!("`{column}` = `{value}` is not written `{format}`")),
                })
                .collect()
        }
    })
}

/// The sum of a numeric column as `f64`; NULLs count as nothing.
fn column_sum(column: &deltalake::arrow::array::ArrayRef) -> Result<f64> {
    let as_float = deltalake::arrow::compute::cast(column, &DataType::Float64)
        .map_err(|e| Error::Internal(format!("cannot sum a measure: {e}")))?;
    Ok(deltalake::arrow::compute::sum(
        as_float.as_primitive::<deltalake::arrow::datatypes::Float64Type>(),
    )
    .unwrap_or(0.0))
}

/// The columns of `sample` (a partition's first rows) whose values are nearly all distinct: a
/// dictionary of them costs the time to build and saves nothing, and Parquet's writer gives it
/// up only once a row group's dictionary passes a megabyte (about a whole row group of 64-bit
/// values). Too few rows tell nothing.
pub(crate) fn near_unique_columns(sample: &RecordBatch) -> Vec<String> {
    const MIN_ROWS: usize = 1024;
    const MAX_ROWS: usize = 8192;
    let rows = sample.num_rows().min(MAX_ROWS);
    if rows < MIN_ROWS {
        return Vec::new();
    }
    sample
        .schema()
        .fields()
        .iter()
        .zip(sample.columns())
        .filter_map(|(field, column)| {
            let hashes = lakefill_table::rowhash::hash_rows(&[column.slice(0, rows)], rows).ok()?;
            let distinct: std::collections::HashSet<u64> = hashes.into_iter().collect();
            (distinct.len() * 100 >= rows * 95).then(|| field.name().clone())
        })
        .collect()
}

/// The partition values of row `row` of `arrays` (the partition columns of a batch).
pub(crate) fn partition_scalars(
    arrays: &[deltalake::arrow::array::ArrayRef],
    row: usize,
) -> Result<Vec<Scalar>> {
    arrays
        .iter()
        .map(|array| {
            Scalar::from_array(array.as_ref(), row).ok_or_else(|| {
                Error::Internal(format!(
                    "cannot read a partition value of type {}",
                    array.data_type()
                ))
            })
        })
        .collect()
}

fn partition_writer(
    spec: &WriteSpec,
    scalars: &[Scalar],
    values: &PartitionValues,
    plain: &[String],
    file_schema: SchemaRef,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<PartitionWriter> {
    let layout = &spec.layout;
    let prefix = layout.staging_prefix(values, &spec.run_id);
    let prefix = Path::parse(&prefix)
        .map_err(|e| Error::Internal(format!("invalid staging path `{prefix}`: {e}")))?;
    let mut properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS));
    // A key's values are unique, and so are nearly those of `plain`: a dictionary of them never
    // pays for the time spent building it.
    for key in spec.key.iter().chain(plain) {
        let key = spec.mapping.physical(key);
        if file_schema.index_of(key).is_ok() {
            properties = properties.set_column_dictionary_enabled(
                deltalake::parquet::schema::types::ColumnPath::from(key),
                false,
            );
        }
    }
    let properties = properties.build();
    let partition_values: IndexMap<String, Scalar> = layout
        .partition_columns
        .iter()
        .cloned()
        .zip(scalars.iter().cloned())
        .collect();
    let config = PartitionWriterConfig::try_new(
        file_schema,
        partition_values,
        Some(properties),
        None,
        None,
        None,
        Some(prefix),
    )
    .delta_context(|| "cannot configure the Parquet writer".into())?;
    PartitionWriter::try_with_config(
        store,
        config,
        DataSkippingNumIndexedCols::NumColumns(32),
        None,
    )
    .delta_context(|| "cannot create the Parquet writer".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};
    use deltalake::arrow::datatypes::Field;

    /// `rows` rows: an id, a timestamp-like value 96% distinct, an amount of 3,000 values, a
    /// country of 12, and an all-NULL column.
    fn batch(rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("ts", DataType::Int64, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("country", DataType::Utf8, true),
            Field::new("empty", DataType::Int64, true),
        ]));
        let columns: Vec<deltalake::arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(0..rows)),
            Arc::new(Int64Array::from_iter_values(
                (0..rows).map(|i| if i % 25 == 0 { 0 } else { i * 1_000 }),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..rows).map(|i| (i * 7_919) % 3_000),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("c{}", i % 12)),
            )),
            Arc::new(Int64Array::from(vec![None::<i64>; rows as usize])),
        ];
        RecordBatch::try_new(schema, columns).expect("batch")
    }

    #[test]
    fn only_nearly_unique_columns_are_written_without_a_dictionary() {
        assert_eq!(near_unique_columns(&batch(8_192)), ["id", "ts"]);
        // More rows than the sample: the first 8,192 tell.
        assert_eq!(near_unique_columns(&batch(50_000)), ["id", "ts"]);
        // Too few rows to tell.
        assert!(near_unique_columns(&batch(1_000)).is_empty());
    }
}
