//! Staging: run the model per batch and stream its output into invisible Parquet files.
//!
//! Each batch gets its own DataFusion session in which every source is registered as a view over
//! the table at its pinned version, filtered to the batch window widened by lookback/lookahead
//! (so the Delta scan prunes partitions). The SELECT runs with `$start`/`$end` bound, and its
//! output streams, record batch by record batch, into one Parquet writer per partition under
//! `<partition dir>/lakefill-<run_id>/`. Those files are not in the Delta log until
//! [`crate::publish`] commits them. Nothing is collected in memory: a writer holds at most one
//! row group per open partition, and a batch has at most `batch_partitions` partitions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use delta_kernel::expressions::Scalar;
use delta_kernel::table_properties::DataSkippingNumIndexedCols;
use deltalake::Path;
use deltalake::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use deltalake::arrow::compute::take;
use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::datafile::writer::{PartitionWriter, PartitionWriterConfig};
use deltalake::datafusion::common::{Column, ScalarValue};
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::datafusion::logical_expr::{Expr, cast, lit};
use deltalake::datafusion::prelude::{DataFrame, SQLOptions, SessionContext};
use deltalake::kernel::Add;
use deltalake::parquet::basic::Compression;
use deltalake::parquet::file::properties::WriterProperties;
use futures::{StreamExt, TryStreamExt};
use indexmap::IndexMap;

use crate::error::{DeltaContext, Error, QueryContext, Result};
use crate::journal::BatchRecord;
use crate::partition::{
    PartitionType, date_to_days, days_to_date, parse_partition_date, partition_literal,
    staging_prefix,
};
use crate::plan::{BackfillPlan, BatchPlan, PlannedSource};
use crate::resources::Resources;
use crate::rowhash::{RowChecksum, hash_rows};
use crate::throttle::{Throttle, ThrottledStore};

/// Rows per Parquet row group: bounds the memory of each open partition writer.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Staging options.
#[derive(Debug, Clone)]
pub(crate) struct StageOptions {
    /// Batches in flight.
    pub(crate) max_parallel: usize,
    /// The runtime (memory pool) every batch's session shares.
    pub(crate) resources: Resources,
    /// The bound on bytes written per second, if any.
    pub(crate) throttle: Option<Arc<Throttle>>,
}

/// Checks the model's output schema against the target, then stages every batch not in `skip`.
///
/// Each finished batch is sent to `finished`, in completion order, so the caller can journal it
/// before more finish; the channel's bound keeps staging from running far ahead of the journal.
pub(crate) async fn stage(
    plan: &BackfillPlan,
    options: &StageOptions,
    skip: &BTreeSet<usize>,
    finished: tokio::sync::mpsc::Sender<BatchRecord>,
) -> Result<()> {
    let target_schema = target_schema(plan)?;
    // The schema is a property of the SQL, not of the batch: check it once, before writing.
    if let Some(first) = plan.report.batches.first() {
        let (_ctx, df) = batch_dataframe(plan, first, &options.resources).await?;
        check_schema(plan, df.schema().as_arrow(), &target_schema)?;
    }
    let target_schema = Arc::new(target_schema);
    let pending: Vec<BatchPlan> = plan
        .report
        .batches
        .iter()
        .filter(|b| !skip.contains(&b.index))
        .cloned()
        .collect();
    // Owned batches keep the stream's future `Send` (borrowed items trip higher-ranked lifetimes).
    let mut staged = futures::stream::iter(pending)
        .map(|batch| {
            let schema = Arc::clone(&target_schema);
            let resources = options.resources.clone();
            let store = ThrottledStore::wrap(plan.target.object_store(), options.throttle.clone());
            async move { stage_batch(plan, &batch, schema, &resources, store).await }
        })
        .buffer_unordered(options.max_parallel.max(1));
    while let Some(record) = staged.try_next().await? {
        if finished.send(record).await.is_err() {
            // The journal stopped listening: it failed, and reports why.
            break;
        }
    }
    Ok(())
}

fn target_schema(plan: &BackfillPlan) -> Result<Schema> {
    let snapshot = plan
        .target
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", plan.report.target))?;
    Ok(snapshot.snapshot().arrow_schema().as_ref().clone())
}

/// Builds the session and the model's DataFrame for one batch.
async fn batch_dataframe(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    resources: &Resources,
) -> Result<(SessionContext, DataFrame)> {
    let ctx = resources.session();
    for source in &plan.sources {
        register_source(&ctx, plan, source, batch).await?;
    }
    let options = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    let model = &plan.model;
    let df = ctx
        .sql_with_options(model.sql(), options)
        .await
        .map_err(|source| Error::Model {
            path: model.path().to_path_buf(),
            message: format!("the SQL cannot be planned: {source}"),
            hint: "check column and table names (they are case-sensitive) against the sources"
                .into(),
        })?;
    let (start, end) = match plan.report.partition_type {
        PartitionType::Date => (date_scalar(&batch.start)?, date_scalar(&batch.end)?),
        PartitionType::String => (
            ScalarValue::Utf8(Some(batch.start.clone())),
            ScalarValue::Utf8(Some(batch.end.clone())),
        ),
    };
    let df = df
        .with_param_values(vec![("start", start), ("end", end)])
        .map_err(|source| Error::Model {
            path: model.path().to_path_buf(),
            message: format!("cannot bind `$start`/`$end`: {source}"),
            hint: "only `$start` and `$end` may be used as parameters".into(),
        })?;
    Ok((ctx, df))
}

fn date_scalar(value: &str) -> Result<ScalarValue> {
    partition_literal(PartitionType::Date, value)
}

/// Registers `source` under its name as a view restricted to the batch window.
async fn register_source(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    source: &PlannedSource,
    batch: &BatchPlan,
) -> Result<()> {
    let provider = source
        .table
        .table_provider()
        .await
        .query_context(|| format!("cannot scan source `{}`", source.name))?;
    let mut df = ctx
        .read_table(provider)
        .query_context(|| format!("cannot read source `{}`", source.name))?;
    if let Some(window) = &source.spec.window {
        let (low, high) = window_bounds(plan, source, batch)?;
        let field_type = df
            .schema()
            .as_arrow()
            .field_with_name(window)
            .map(|f| f.data_type().clone())
            .map_err(|_| {
                Error::Internal(format!(
                    "window column `{window}` vanished from `{}`",
                    source.name
                ))
            })?;
        let column = Expr::Column(Column::new_unqualified(window));
        let (low, high) = match (&field_type, plan.report.partition_type) {
            (DataType::Date32, PartitionType::Date) => (date_scalar(&low)?, date_scalar(&high)?),
            (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, _) => {
                (ScalarValue::Utf8(Some(low)), ScalarValue::Utf8(Some(high)))
            }
            (other, _) => {
                return Err(Error::Model {
                    path: plan.model.path().to_path_buf(),
                    message: format!(
                        "window column `{window}` of source `{}` has type {other}, which cannot be compared with the `{}` partitions",
                        source.name, plan.report.partition_column
                    ),
                    hint: "use a DATE (or a string holding dates) partition column as the window"
                        .into(),
                });
            }
        };
        df = df
            .filter(column.between(lit(low), lit(high)))
            .query_context(|| format!("cannot restrict source `{}` to its window", source.name))?;
    }
    ctx.register_table(source.name.as_str(), df.into_view())
        .query_context(|| format!("cannot register source `{}`", source.name))?;
    Ok(())
}

/// The batch window of a source, widened by its lookback and lookahead (in days).
fn window_bounds(
    plan: &BackfillPlan,
    source: &PlannedSource,
    batch: &BatchPlan,
) -> Result<(String, String)> {
    match plan.report.partition_type {
        PartitionType::String => Ok((batch.start.clone(), batch.end.clone())),
        PartitionType::Date => {
            let start = parse_partition_date(&batch.start).ok_or_else(|| {
                Error::Internal(format!("batch bound `{}` is not a date", batch.start))
            })?;
            let end = parse_partition_date(&batch.end).ok_or_else(|| {
                Error::Internal(format!("batch bound `{}` is not a date", batch.end))
            })?;
            let out_of_range = || Error::InvalidRange {
                message: format!(
                    "the window of source `{}` around {}..{} leaves the calendar",
                    source.name, batch.start, batch.end
                ),
            };
            let low = start
                .checked_sub_days(chrono::Days::new(source.spec.lookback.into()))
                .ok_or_else(out_of_range)?;
            let high = end
                .checked_add_days(chrono::Days::new(source.spec.lookahead.into()))
                .ok_or_else(out_of_range)?;
            Ok((low.to_string(), high.to_string()))
        }
    }
}

/// Compares the model's output with the target schema; names every column that differs.
fn check_schema(plan: &BackfillPlan, output: &Schema, target: &Schema) -> Result<()> {
    let mut problems = Vec::new();
    for field in target.fields() {
        match output.field_with_name(field.name()) {
            Err(_) => problems.push(format!(
                "  missing column `{}` (the table has {})",
                field.name(),
                field.data_type()
            )),
            Ok(produced) if normalize(produced.data_type()) != normalize(field.data_type()) => {
                problems.push(format!(
                    "  column `{}`: the model produces {}, the table has {}",
                    field.name(),
                    produced.data_type(),
                    field.data_type()
                ))
            }
            Ok(_) => {}
        }
    }
    for field in output.fields() {
        if target.field_with_name(field.name()).is_err() {
            problems.push(format!(
                "  extra column `{}` ({}), which the table does not have",
                field.name(),
                field.data_type()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::SchemaMismatch {
            model: format!("{}@{}", plan.model.name(), plan.model.version()),
            table: plan.report.target.clone(),
            problems,
        })
    }
}

/// String flavours are one logical type: Delta stores them alike.
fn normalize(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::Dictionary(_, value) => normalize(value),
        other => other.clone(),
    }
}

/// A partition value as the row router sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum RowPartition {
    Date(i32),
    Text(String),
    Null,
}

impl RowPartition {
    fn render(&self) -> String {
        match self {
            RowPartition::Date(days) => days_to_date(*days)
                .map(|d| d.to_string())
                .unwrap_or_else(|| days.to_string()),
            RowPartition::Text(text) => text.clone(),
            RowPartition::Null => "null".into(),
        }
    }
}

/// Runs one batch and writes its partitions; returns what it staged.
async fn stage_batch(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    target_schema: SchemaRef,
    resources: &Resources,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<BatchRecord> {
    let report = &plan.report;
    let partition_column = report.partition_column.as_str();
    tracing::debug!(batch = batch.index, start = %batch.start, end = %batch.end, "staging batch");
    crate::failpoint::reach(&format!("stage-batch-{}", batch.index)).await?;
    let (_ctx, df) = batch_dataframe(plan, batch, resources).await?;
    // Put the columns in the target's order and types.
    let projection: Vec<Expr> = target_schema
        .fields()
        .iter()
        .map(|f| {
            cast(
                Expr::Column(Column::new_unqualified(f.name())),
                f.data_type().clone(),
            )
            .alias(f.name())
        })
        .collect();
    let df = df.select(projection).query_context(|| {
        format!(
            "cannot cast the output of `{}` to the target schema",
            plan.model.name()
        )
    })?;
    let mut stream: SendableRecordBatchStream = df.execute_stream().await.query_context(|| {
        format!(
            "cannot run model `{}` for batch {}..{}",
            plan.model.name(),
            batch.start,
            batch.end
        )
    })?;

    let partition_index = target_schema.index_of(partition_column).map_err(|_| {
        Error::Internal(format!(
            "partition column `{partition_column}` is not in the target schema"
        ))
    })?;
    // Nullable on purpose: a NULL in a NOT NULL column must reach validation, which names the
    // column, the partition and the rows, instead of stopping the write.
    let file_fields: Vec<_> = target_schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != partition_index)
        .map(|(_, f)| Arc::new(f.as_ref().clone().with_nullable(true)))
        .collect();
    let file_schema: SchemaRef = Arc::new(Schema::new(file_fields));

    let bounds = Bounds::new(
        report.partition_type,
        &batch.start,
        &batch.end,
        &report.range.from,
        &report.range.to,
    )?;
    let mut writers: BTreeMap<RowPartition, PartitionWriter> = BTreeMap::new();
    let mut rows: BTreeMap<String, u64> = BTreeMap::new();
    let mut spill: BTreeMap<String, u64> = BTreeMap::new();
    let mut sums: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut checksums: BTreeMap<String, RowChecksum> = BTreeMap::new();
    // Measures summed while writing, so validation need not scan the staged files for them.
    let measures: Vec<(String, usize)> = plan
        .rules
        .summed_measures()
        .into_iter()
        .filter_map(|m| file_schema.index_of(&m).ok().map(|i| (m, i)))
        .collect();

    while let Some(record_batch) = stream.next().await {
        let record_batch = record_batch.query_context(|| {
            format!(
                "model `{}` failed in batch {}..{}",
                plan.model.name(),
                batch.start,
                batch.end
            )
        })?;
        if record_batch.num_rows() == 0 {
            continue;
        }
        let keys = row_partitions(record_batch.column(partition_index).as_ref())?;
        let mut groups: HashMap<RowPartition, Vec<u32>> = HashMap::new();
        for (row, key) in keys.into_iter().enumerate() {
            match bounds.classify(&key) {
                Placement::Batch => groups.entry(key).or_default().push(row as u32),
                // Produced again, and kept, by the batch that owns the partition.
                Placement::OtherBatch => {}
                Placement::OutsideRange => *spill.entry(key.render()).or_default() += 1,
            }
        }
        for (key, indices) in groups {
            let indices = UInt32Array::from(indices);
            let columns = record_batch
                .columns()
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != partition_index)
                .map(|(_, column)| take(column.as_ref(), &indices, None))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Internal(format!("cannot split a batch by partition: {e}")))?;
            let part = RecordBatch::try_new(Arc::clone(&file_schema), columns).map_err(|e| Error::Model {
                path: plan.model.path().to_path_buf(),
                message: format!("the output does not fit the table: {e}"),
                hint: "a column the table declares NOT NULL received NULL; filter or COALESCE it in the model".into(),
            })?;
            let rendered = key.render();
            *rows.entry(rendered.clone()).or_default() += part.num_rows() as u64;
            checksums
                .entry(rendered.clone())
                .or_default()
                .add_hashes(&hash_rows(part.columns(), part.num_rows())?);
            if !measures.is_empty() {
                let partition_sums = sums.entry(rendered).or_default();
                for (measure, index) in &measures {
                    *partition_sums.entry(measure.clone()).or_default() +=
                        column_sum(part.column(*index))?;
                }
            }
            let writer = match writers.entry(key.clone()) {
                std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    entry.insert(partition_writer(
                        plan,
                        &key,
                        partition_column,
                        Arc::clone(&file_schema),
                        Arc::clone(&store),
                    )?)
                }
            };
            writer
                .write(&part)
                .await
                .map_err(|source| Error::StagingWrite {
                    table: report.target.clone(),
                    partition: key.render(),
                    source: Box::new(source),
                })?;
        }
    }
    let mut files: Vec<Add> = Vec::new();
    for (key, writer) in writers {
        let adds = writer.close().await.map_err(|source| Error::StagingWrite {
            table: report.target.clone(),
            partition: key.render(),
            source: Box::new(source),
        })?;
        files.extend(adds);
    }
    Ok(BatchRecord {
        index: batch.index,
        start: batch.start.clone(),
        end: batch.end.clone(),
        files,
        rows,
        spill,
        sums,
        checksums,
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

fn partition_writer(
    plan: &BackfillPlan,
    key: &RowPartition,
    partition_column: &str,
    file_schema: SchemaRef,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<PartitionWriter> {
    let scalar = match key {
        RowPartition::Date(days) => Scalar::Date(*days),
        RowPartition::Text(text) => Scalar::String(text.clone()),
        RowPartition::Null => {
            return Err(Error::Internal(
                "null partition routed into the batch".into(),
            ));
        }
    };
    let prefix = staging_prefix(partition_column, &key.render(), &plan.report.run_id);
    let prefix = Path::parse(&prefix)
        .map_err(|e| Error::Internal(format!("invalid staging path `{prefix}`: {e}")))?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let config = PartitionWriterConfig::try_new(
        file_schema,
        IndexMap::from([(partition_column.to_string(), scalar)]),
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

fn row_partitions(array: &dyn Array) -> Result<Vec<RowPartition>> {
    match array.data_type() {
        DataType::Date32 => Ok(array
            .as_primitive::<deltalake::arrow::datatypes::Date32Type>()
            .iter()
            .map(|v| v.map_or(RowPartition::Null, RowPartition::Date))
            .collect()),
        DataType::Utf8 => Ok(array
            .as_string::<i32>()
            .iter()
            .map(|v| v.map_or(RowPartition::Null, |s| RowPartition::Text(s.to_string())))
            .collect()),
        other => Err(Error::Internal(format!(
            "unsupported partition column type {other}"
        ))),
    }
}

enum Placement {
    Batch,
    OtherBatch,
    OutsideRange,
}

/// Batch and range bounds in the partition column's own representation.
struct Bounds {
    batch: (RowPartition, RowPartition),
    range: (RowPartition, RowPartition),
}

impl Bounds {
    fn new(kind: PartitionType, start: &str, end: &str, from: &str, to: &str) -> Result<Self> {
        let value = |text: &str| -> Result<RowPartition> {
            match kind {
                PartitionType::Date => parse_partition_date(text)
                    .map(|d| RowPartition::Date(date_to_days(d)))
                    .ok_or_else(|| Error::Internal(format!("`{text}` is not a date"))),
                PartitionType::String => Ok(RowPartition::Text(text.to_string())),
            }
        };
        Ok(Self {
            batch: (value(start)?, value(end)?),
            range: (value(from)?, value(to)?),
        })
    }

    fn classify(&self, key: &RowPartition) -> Placement {
        if *key == RowPartition::Null {
            return Placement::OutsideRange;
        }
        if self.batch.0 <= *key && *key <= self.batch.1 {
            Placement::Batch
        } else if self.range.0 <= *key && *key <= self.range.1 {
            Placement::OtherBatch
        } else {
            Placement::OutsideRange
        }
    }
}
