//! The algebra of adjustments over rows, as SQL: a table's *net* rows (each reversal cancels the
//! row it reversed), the adjustment rows that take old net rows to new rows, and their counts.
//! Used where the rows are read: a model's sources, validation, publishing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashSet;
use std::hash::BuildHasherDefault;

use deltalake::arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::compute::kernels::numeric::neg;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use deltalake::datafusion::error::{DataFusionError, Result as DfResult};
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::datafusion::execution::disk_manager::DiskManager;
use deltalake::datafusion::execution::spill_file::SpillFile;
use deltalake::datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use deltalake::datafusion::prelude::SessionContext;

use crate::multiset::{Change, Prehashed, Shape, Watchers, difference};

use lakefill_table::adjustments::{
    AdjustmentCounts, CORRECTION, KIND_COLUMN, REASON_COLUMN, REVERSAL, RUN_ID_COLUMN, is_lineage,
};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::rowhash::{register_hash_functions, row_hash_sql};
use lakefill_table::sqltext::{cast_sql, ident};

mod spill;
mod streamed;

use spill::IpcSpill;
pub use streamed::{StreamedNet, register_net_streamed};

/// The net rows of `rows` (a view of the table): every column of `schema` in order, the
/// measures summed over the rows that are the same but for them and the lineage, kept while the
/// rows outnumber their reversals; the lineage columns NULL.
///
/// Only the rows an adjustment may net with are grouped: those alike (but for the measures and
/// the lineage) with an adjustment row. `adjusted` names a registered function telling the hashes
/// ([`group_hash_sql`]) of the adjustment rows' groups; `None` when there are none (or the table
/// has no lineage columns): the rows are then their own net rows, and grouping would only cost.
/// A hash two groups share only sends a few more rows to the grouping.
fn net_sql(
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
    adjusted: Option<&str>,
) -> String {
    let (plain, grouped) = net_parts(rows, schema, measures, key, adjusted);
    match grouped {
        Some(grouped) => format!("{plain} UNION ALL {grouped}"),
        None => plain,
    }
}

/// The two parts of [`net_sql`]: the rows no adjustment touches, as they are, and (when some
/// are) the grouped rows of the groups adjustments touch.
fn net_parts(
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
    adjusted: Option<&str>,
) -> (String, Option<String>) {
    // Every column as it is, the lineage NULL.
    let plain: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| {
            if is_lineage(field.name()) {
                typed_null(field)
            } else {
                ident(field.name())
            }
        })
        .collect();
    let Some(adjusted) = adjusted else {
        let only_rows = if schema.field_with_name(KIND_COLUMN).is_ok() {
            format!(" WHERE {} IS NULL", ident(KIND_COLUMN))
        } else {
            String::new()
        };
        return (
            format!("SELECT {} FROM {rows}{only_rows}", plain.join(", ")),
            None,
        );
    };
    let hash = group_hash_sql(schema, measures, key);
    (
        format!(
            "SELECT {} FROM {rows} WHERE {} IS NULL AND NOT {adjusted}({hash})",
            plain.join(", "),
            ident(KIND_COLUMN)
        ),
        Some(grouped_sql(
            rows,
            schema,
            measures,
            Some(&format!("{adjusted}({hash})")),
        )),
    )
}

/// The net rows of the rows of `rows` that `filter` (an SQL condition, if any) keeps, grouped:
/// every column of `schema` in order, the measures summed over the rows that are the same but
/// for them and the lineage, kept while the rows outnumber their reversals; the lineage NULL.
fn grouped_sql(rows: &str, schema: &Schema, measures: &[String], filter: Option<&str>) -> String {
    let grouped: Vec<String> = group_columns(schema, measures)
        .iter()
        .map(|name| ident(name))
        .collect();
    let select: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            if is_lineage(name) {
                typed_null(field)
            } else if measures.contains(name) {
                let sum = format!("SUM({})", ident(name));
                format!("{} AS {}", cast_sql(&sum, field.data_type()), ident(name))
            } else {
                ident(name)
            }
        })
        .collect();
    let weight = format!(
        "CASE WHEN {} = '{REVERSAL}' THEN -1 ELSE 1 END",
        ident(KIND_COLUMN)
    );
    let group_by = if grouped.is_empty() {
        String::new()
    } else {
        format!(" GROUP BY {}", grouped.join(", "))
    };
    let filter = filter.map(|f| format!(" WHERE {f}")).unwrap_or_default();
    format!(
        "SELECT {} FROM {rows}{filter}{group_by} HAVING SUM({weight}) > 0",
        select.join(", ")
    )
}

/// `NULL` as a value of `field`, named after it.
fn typed_null(field: &Field) -> String {
    format!(
        "{} AS {}",
        cast_sql("NULL", field.data_type()),
        ident(field.name())
    )
}

/// The columns whose values make rows the same for netting: all but the measures and the
/// lineage.
fn group_columns(schema: &Schema, measures: &[String]) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !is_lineage(name) && !measures.contains(name))
        .collect()
}

/// The hash a row's group is found by: of the key columns among the [`group_columns`] (rows
/// alike in all of these are alike in those), else of all of them.
fn group_hash_sql(schema: &Schema, measures: &[String], key: &[String]) -> String {
    let group = group_columns(schema, measures);
    let by_key: Vec<String> = key.iter().filter(|k| group.contains(k)).cloned().collect();
    row_hash_sql(if by_key.is_empty() { &group } else { &by_key })
}

/// The adjustment rows that take the net rows `old` to the rows `new` (both registered views
/// with every column of `schema` but the lineage columns), in `schema`: a reversal (the measures
/// negated) of each old row that is not among the new rows, a correction for each new row that
/// is not among the old rows (a [`multiset`](crate::multiset) difference of whole rows), each
/// with the lineage columns. `counts` holds how many of each kind once the stream has ended.
/// `watchers` see every old and every new row once, in the schema's columns and types.
/// `staged`: the new rows' hashes as staging took them (of the schema's columns but the
/// lineage, in order), counted instead of reading the new rows for it.
#[allow(clippy::too_many_arguments)]
pub async fn adjustment_rows(
    ctx: &SessionContext,
    old: &str,
    new: &str,
    schema: &SchemaRef,
    measures: &[String],
    lineage: Lineage<'_>,
    watchers: Watchers,
    staged: Option<Vec<u64>>,
) -> Result<Adjustments> {
    let Lineage { run_id, reason } = lineage;
    // Both sides in the schema's columns and types.
    let values: Vec<&Field> = schema
        .fields()
        .iter()
        .filter(|f| !is_lineage(f.name()))
        .map(AsRef::as_ref)
        .collect();
    let side = |table: &str| {
        let table = table.to_string();
        let select: Vec<String> = values
            .iter()
            .map(|field| {
                let column = ident(field.name());
                format!("{} AS {column}", cast_sql(&column, field.data_type()))
            })
            .collect();
        async move {
            ctx.sql(&format!(
                "SELECT {} FROM {}",
                select.join(", "),
                ident(&table)
            ))
            .await
            .query_context(|| format!("cannot read the {table} rows of the adjustments"))
        }
    };
    let (old, new) = (side(old).await?, side(new).await?);
    let counts = Arc::new(AdjustmentTally::default());
    let tally = Arc::clone(&counts);
    let out = Arc::clone(schema);
    let measures = measures.to_vec();
    let (run_id, reason) = (run_id.to_string(), reason.map(str::to_string));
    let shape: Shape = Arc::new(move |change, rows: RecordBatch| {
        let (kind, negate) = match change {
            Change::Removed => {
                tally
                    .reversals
                    .fetch_add(rows.num_rows() as u64, Ordering::Relaxed);
                (REVERSAL, true)
            }
            Change::Added => {
                tally
                    .corrections
                    .fetch_add(rows.num_rows() as u64, Ordering::Relaxed);
                (CORRECTION, false)
            }
        };
        let text = |value: Option<&str>| -> ArrayRef {
            Arc::new(StringArray::from(vec![value; rows.num_rows()]))
        };
        let columns = out
            .fields()
            .iter()
            .map(|field| {
                let column = match field.name().as_str() {
                    RUN_ID_COLUMN => text(Some(&run_id)),
                    KIND_COLUMN => text(Some(kind)),
                    REASON_COLUMN => text(reason.as_deref()),
                    name => {
                        let column = rows.column_by_name(name).ok_or_else(|| {
                            DataFusionError::Internal(format!("no column `{name}` in the rows"))
                        })?;
                        if negate && measures.iter().any(|m| m == name) {
                            neg(column)?
                        } else {
                            Arc::clone(column)
                        }
                    }
                };
                Ok(if column.data_type() == field.data_type() {
                    column
                } else {
                    cast(&column, field.data_type())?
                })
            })
            .collect::<DfResult<Vec<ArrayRef>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
    });
    Ok(Adjustments {
        rows: difference(old, new, Arc::clone(schema), shape, watchers, staged),
        counts,
    })
}

/// What the lineage columns of a run's adjustment rows say.
#[derive(Debug, Clone, Copy)]
pub struct Lineage<'a> {
    /// `_lakefill_run_id`.
    pub run_id: &'a str,
    /// `_lakefill_reason`.
    pub reason: Option<&'a str>,
}

/// The adjustment rows of a run, as they stream.
pub struct Adjustments {
    /// Reversals, then corrections.
    pub rows: SendableRecordBatchStream,
    /// How many of each kind the stream gave.
    pub counts: Arc<AdjustmentTally>,
}

/// Reversals and corrections counted as they stream.
#[derive(Debug, Default)]
pub struct AdjustmentTally {
    reversals: AtomicU64,
    corrections: AtomicU64,
}

impl AdjustmentTally {
    /// The counts so far.
    pub fn counts(&self) -> AdjustmentCounts {
        AdjustmentCounts {
            reversals: self.reversals.load(Ordering::Relaxed),
            corrections: self.corrections.load(Ordering::Relaxed),
        }
    }
}

/// Registers `name` in `ctx` as the net rows of the view `rows`. `key`: the columns that
/// identify a row, if known (rows are found for the grouping by them, which is cheaper than by
/// every column).
pub async fn register_net(
    ctx: &SessionContext,
    name: &str,
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
) -> Result<()> {
    register_net_kept(ctx, name, rows, schema, measures, key, None)
        .await
        .map(drop)
}

/// [`register_net`] for net rows read more than once: the grouped rows of the adjusted groups
/// (the costly part, a grouping of every row of those groups) are computed once, into a spill
/// file of `disk` (Arrow IPC, which costs no encoding), and read from it. The rows no
/// adjustment touches are still read from `rows` (a filtered scan costs less than writing
/// them). The returned [`KeptNet`] holds the file (which must outlive every query of `name`)
/// and registers the same net rows in another session.
pub async fn register_net_spilled(
    ctx: &SessionContext,
    name: &str,
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
    disk: &Arc<DiskManager>,
) -> Result<KeptNet> {
    register_net_kept(ctx, name, rows, schema, measures, key, Some(disk)).await
}

/// [`register_net`], with the grouped rows spilled to `disk` when given.
async fn register_net_kept(
    ctx: &SessionContext,
    name: &str,
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
    disk: Option<&Arc<DiskManager>>,
) -> Result<KeptNet> {
    register_hash_functions(ctx);
    // The groups adjustment rows touch, collected (one hash each) into a function that tells
    // whether a row is in one: a filter on each scan of the rows. (Joined instead, DataFusion
    // repartitions every row of the ledger to meet the few adjusted groups.)
    let started = std::time::Instant::now();
    let mut kept = KeptNet {
        hashes: adjusted_groups(ctx, rows, schema, measures, key).await?,
        grouped: None,
    };
    let found_ms = started.elapsed().as_millis() as u64;
    if let (Some(disk), Some(adjusted)) = (disk, kept.adjusted_function(ctx, name)) {
        let (_, grouped) = net_parts(rows, schema, measures, key, Some(&adjusted));
        if let Some(grouped) = grouped {
            kept.grouped = spill_rows(ctx, &grouped, disk).await?;
        }
    }
    tracing::debug!(
        groups = kept.hashes.as_ref().map_or(0, |h| h.len()),
        found_ms,
        grouped_ms = started.elapsed().as_millis() as u64 - found_ms,
        "netted the rows adjustments touch"
    );
    kept.register(ctx, name, rows, schema, measures, key)
        .await?;
    Ok(kept)
}

/// The hashes ([`group_hash_sql`]) of the groups adjustment rows of `rows` touch; `None` when
/// there are none (or the rows have no lineage columns).
async fn adjusted_groups(
    ctx: &SessionContext,
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
) -> Result<Option<Arc<GroupHashes>>> {
    let context = || "cannot find the rows adjustments touch".into();
    if schema.field_with_name(KIND_COLUMN).is_err() {
        return Ok(None);
    }
    let batches = ctx
        .sql(&format!(
            "SELECT DISTINCT {} AS __lf_g FROM {rows} WHERE {} IS NOT NULL",
            group_hash_sql(schema, measures, key),
            ident(KIND_COLUMN)
        ))
        .await
        .query_context(context)?
        .collect()
        .await
        .query_context(context)?;
    let mut hashes = HashSet::default();
    for batch in &batches {
        let column = batch.column(0).as_primitive::<UInt64Type>();
        hashes.extend(column.iter().flatten());
    }
    Ok((!hashes.is_empty()).then(|| Arc::new(hashes)))
}

/// Net rows computed once ([`register_net_spilled`]): the hashes of the groups adjustment rows
/// touch, and the grouped rows of those groups in a spill file when they were kept there.
/// [`KeptNet::register`] makes them the net rows of the same rows in any session of the
/// process, without grouping again.
#[derive(Clone, Default)]
pub struct KeptNet {
    hashes: Option<Arc<GroupHashes>>,
    grouped: Option<Arc<dyn SpillFile>>,
}

/// The number of hashes and the file, never the hashes (as `AdjustedGroup`'s `Debug`).
impl std::fmt::Debug for KeptNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptNet")
            .field("hashes", &self.hashes.as_ref().map(|h| h.len()))
            .field(
                "grouped",
                &self.grouped.as_ref().and_then(|file| file.path()),
            )
            .finish()
    }
}

impl KeptNet {
    /// Whether the grouped rows are in a spill file (else a session that registers these net
    /// rows groups them again).
    pub fn is_spilled(&self) -> bool {
        self.grouped.is_some()
    }

    /// Registers in `ctx` the function telling whether a row's group is adjusted, named after
    /// `name`; `None` when no group is.
    fn adjusted_function(&self, ctx: &SessionContext, name: &str) -> Option<String> {
        let hashes = self.hashes.as_ref()?;
        let function = format!("__lf_adjusted_group_of_{}", sql_name(name));
        ctx.register_udf(ScalarUDF::from(AdjustedGroup {
            name: function.clone(),
            signature: Signature::exact(vec![DataType::UInt64], Volatility::Immutable),
            hashes: Arc::clone(hashes),
        }));
        Some(function)
    }

    /// Registers `name` in `ctx` as these net rows of the view `rows` (the rows they were
    /// computed from, with the same `schema`, `measures` and `key`).
    pub async fn register(
        &self,
        ctx: &SessionContext,
        name: &str,
        rows: &str,
        schema: &Schema,
        measures: &[String],
        key: &[String],
    ) -> Result<()> {
        use deltalake::datafusion::datasource::file_format::options::ArrowReadOptions;
        register_hash_functions(ctx);
        let context = || "cannot net the table's rows (reversals against what they reverse)".into();
        let adjusted = self.adjusted_function(ctx, name);
        let sql = match (&self.grouped, &adjusted) {
            (Some(file), Some(adjusted)) => {
                let path = file.path().and_then(|p| p.to_str()).ok_or_else(|| {
                    lakefill_table::error::Error::Internal(
                        "the grouped net rows' spill file has no path".into(),
                    )
                })?;
                // Registered by a name SQL does not fold (`register_arrow` parses it).
                let grouped = format!("__lf_grouped_net_of_{}", sql_name(name));
                ctx.register_arrow(
                    &grouped,
                    path,
                    ArrowReadOptions {
                        file_extension: "",
                        ..ArrowReadOptions::default()
                    },
                )
                .await
                .query_context(context)?;
                let (plain, _) = net_parts(rows, schema, measures, key, Some(adjusted));
                format!("{plain} UNION ALL SELECT * FROM {}", ident(&grouped))
            }
            _ => net_sql(rows, schema, measures, key, adjusted.as_deref()),
        };
        let df = ctx.sql(&sql).await.query_context(context)?;
        ctx.register_table(name, df.into_view())
            .query_context(|| format!("cannot register the net rows as `{name}`"))?;
        Ok(())
    }
}

/// `name` as a part of an SQL name that is never quoted: lower case (SQL folds unquoted names),
/// letters, digits and `_`.
fn sql_name(name: &str) -> String {
    name.to_ascii_lowercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
}

/// Runs `sql` into a spill file of `disk` (Arrow IPC); `None` (nothing run) when the rows
/// cannot be kept in one ([`IpcSpill::create`]).
async fn spill_rows(
    ctx: &SessionContext,
    sql: &str,
    disk: &Arc<DiskManager>,
) -> Result<Option<Arc<dyn SpillFile>>> {
    use futures::StreamExt as _;
    let context = || "cannot keep the grouped net rows in a spill file".to_string();
    let mut rows = ctx
        .sql(sql)
        .await
        .query_context(context)?
        .execute_stream()
        .await
        .query_context(context)?;
    let Some(mut spill) =
        IpcSpill::create(disk, &rows.schema(), "grouped net rows").query_context(context)?
    else {
        return Ok(None);
    };
    while let Some(batch) = rows.next().await {
        spill
            .write(&batch.query_context(context)?)
            .query_context(context)?;
    }
    Ok(Some(spill.finish().query_context(context)?))
}

/// The hashes of the groups adjustment rows touch.
type GroupHashes = HashSet<u64, BuildHasherDefault<Prehashed>>;

/// `name(hash)`: whether a group's hash is one of `hashes`.
struct AdjustedGroup {
    name: String,
    signature: Signature,
    hashes: Arc<GroupHashes>,
}

/// The name and the number of hashes, never the hashes: delta-rs formats every filter it cannot
/// push into its scan with `Debug` while DataFusion plans (several times per query), and the
/// set holds a hash per adjusted row group (two million in the benchmark's month, where
/// printing them took a tenth of the run).
impl std::fmt::Debug for AdjustedGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdjustedGroup")
            .field("name", &self.name)
            .field("hashes", &self.hashes.len())
            .finish_non_exhaustive()
    }
}

impl PartialEq for AdjustedGroup {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && Arc::ptr_eq(&self.hashes, &other.hashes)
    }
}

impl Eq for AdjustedGroup {}

impl std::hash::Hash for AdjustedGroup {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for AdjustedGroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let hashes = ColumnarValue::values_to_arrays(&args.args)?;
        let column = hashes[0].as_primitive::<UInt64Type>();
        let found: BooleanArray = column
            .iter()
            .map(|hash| Some(hash.is_some_and(|h| self.hashes.contains(&h))))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(found)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::Int64Type;
    use deltalake::datafusion::datasource::MemTable;
    use futures::TryStreamExt as _;

    /// Planning formats the filter function (delta-rs does, for each filter it cannot push
    /// down): its text stays short however many groups it holds.
    #[test]
    fn the_filter_function_prints_its_size_not_its_hashes() {
        let function = AdjustedGroup {
            name: "__lf_adjusted_group_of_previous".into(),
            signature: Signature::exact(vec![DataType::UInt64], Volatility::Immutable),
            hashes: Arc::new((0..100_000u64).collect()),
        };
        let text = format!("{:?}", ScalarUDF::from(function));
        assert!(text.len() < 300, "{text}");
        assert!(text.contains("hashes: 100000"), "{text}");
    }

    /// The batches of `sql` in `ctx`.
    async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
        ctx.sql(sql)
            .await
            .expect("sql")
            .execute_stream()
            .await
            .expect("stream")
            .try_collect()
            .await
            .expect("rows")
    }

    /// Every row of `table` in `ctx`, as text, sorted.
    async fn rows_as_text(ctx: &SessionContext, table: &str) -> Vec<String> {
        let batches = collect(ctx, &format!("SELECT * FROM {table}")).await;
        let mut rows = Vec::new();
        for batch in &batches {
            for row in 0..batch.num_rows() {
                let values: Vec<String> = batch
                    .columns()
                    .iter()
                    .map(|column| {
                        if column.is_null(row) {
                            "NULL".to_string()
                        } else {
                            format!(
                                "{:?}",
                                deltalake::arrow::util::display::array_value_to_string(column, row)
                                    .expect("text")
                            )
                        }
                    })
                    .collect();
                rows.push(values.join(" | "));
            }
        }
        rows.sort();
        rows
    }

    /// Net rows of a ledger: an adjusted key sums, a key reversed away is gone, rows loaded
    /// twice and never adjusted stay two rows, untouched rows stay; found by key or by every
    /// column, from a view whose name has capitals.
    #[tokio::test]
    async fn net_rows_group_only_what_adjustments_touch() {
        let rows: [(i64, &str, i64, Option<&str>); 8] = [
            (1, "FR", 10, None),
            (1, "FR", -10, Some(REVERSAL)),
            (1, "FR", 12, Some(CORRECTION)),
            (2, "DE", 5, None),
            (2, "DE", 5, None),
            (3, "US", 7, None),
            (3, "US", -7, Some(REVERSAL)),
            (4, "JP", 1, None),
        ];
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("country", DataType::Utf8, false),
            Field::new("amount", DataType::Int64, false),
            Field::new(KIND_COLUMN, DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("batch");
        for (key, spilled) in [
            (vec!["id".to_string()], false),
            (Vec::new(), false),
            (vec!["id".to_string()], true),
            (Vec::new(), true),
        ] {
            let ctx = SessionContext::new();
            let table =
                MemTable::try_new(Arc::clone(&schema), vec![vec![batch.clone()]]).expect("table");
            ctx.register_table("ledger", Arc::new(table))
                .expect("register");
            let measures = ["amount".to_string()];
            let _kept = if spilled {
                let disk = Arc::clone(&ctx.runtime_env().disk_manager);
                let kept =
                    register_net_spilled(&ctx, "Net", "ledger", &schema, &measures, &key, &disk)
                        .await
                        .expect("net");
                assert!(kept.is_spilled(), "the grouped rows are in a spill file");
                // Read again in another session from the kept rows: the same net rows.
                let again = SessionContext::new();
                let table = MemTable::try_new(Arc::clone(&schema), vec![vec![batch.clone()]])
                    .expect("table");
                again
                    .register_table("ledger", Arc::new(table))
                    .expect("register");
                kept.register(&again, "Net", "ledger", &schema, &measures, &key)
                    .await
                    .expect("registered again");
                assert_eq!(
                    rows_as_text(&again, "Net").await,
                    rows_as_text(&ctx, "Net").await
                );
                Some(kept)
            } else {
                register_net(&ctx, "Net", "ledger", &schema, &measures, &key)
                    .await
                    .expect("net");
                None
            };
            let batches =
                collect(&ctx, "SELECT id, country, amount, _lakefill_kind FROM Net").await;
            let mut net = Vec::new();
            for batch in &batches {
                let country = deltalake::arrow::compute::cast(batch.column(1), &DataType::Utf8)
                    .expect("text");
                for row in 0..batch.num_rows() {
                    assert!(batch.column(3).is_null(row), "lineage is NULL");
                    net.push((
                        batch.column(0).as_primitive::<Int64Type>().value(row),
                        country.as_string::<i32>().value(row).to_string(),
                        batch.column(2).as_primitive::<Int64Type>().value(row),
                    ));
                }
            }
            net.sort();
            assert_eq!(
                net,
                vec![
                    (1, "FR".to_string(), 12),
                    (2, "DE".to_string(), 5),
                    (2, "DE".to_string(), 5),
                    (4, "JP".to_string(), 1),
                ],
                "key {key:?}, spilled {spilled}"
            );
        }
    }
}

#[cfg(test)]
mod streamed_tests {
    use super::*;
    use deltalake::arrow::array::{DictionaryArray, Int64Array};
    use deltalake::arrow::datatypes::{Int32Type, Int64Type};
    use deltalake::datafusion::datasource::MemTable;
    use futures::TryStreamExt as _;
    use std::sync::Mutex;

    /// A ledger's rows: id, day (a dictionary, as partition values come), amount, kind.
    type Row = (i64, &'static str, i64, Option<&'static str>);

    fn ledger(rows: &[Row], with_kind: bool, dictionary: bool) -> RecordBatch {
        let days: ArrayRef = if dictionary {
            Arc::new(
                rows.iter()
                    .map(|r| r.1)
                    .collect::<DictionaryArray<Int32Type>>(),
            )
        } else {
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            ))
        };
        let mut fields = vec![
            Field::new("id", DataType::Int64, false),
            Field::new("day", days.data_type().clone(), false),
            Field::new("amount", DataType::Int64, false),
        ];
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            days,
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
        ];
        if with_kind {
            fields.push(Field::new(KIND_COLUMN, DataType::Utf8, true));
            columns.push(Arc::new(StringArray::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch")
    }

    /// A session with `batch` registered as `ledger`, in batches of 3 rows.
    fn session(batch: &RecordBatch) -> SessionContext {
        let ctx = SessionContext::new();
        let parts: Vec<RecordBatch> = (0..batch.num_rows())
            .step_by(3)
            .map(|at| batch.slice(at, 3.min(batch.num_rows() - at)))
            .collect();
        let table = MemTable::try_new(batch.schema(), vec![parts]).expect("table");
        ctx.register_table("ledger", Arc::new(table))
            .expect("register");
        ctx
    }

    /// Every row of `sql` as text (day as text), sorted.
    async fn rows_of(ctx: &SessionContext, sql: &str) -> Vec<(i64, String, i64, bool)> {
        let batches: Vec<RecordBatch> = ctx
            .sql(sql)
            .await
            .expect("sql")
            .execute_stream()
            .await
            .expect("stream")
            .try_collect()
            .await
            .expect("rows");
        let mut rows = Vec::new();
        for batch in &batches {
            let day = cast(batch.column(1), &DataType::Utf8).expect("text");
            let kind = batch.column_by_name(KIND_COLUMN);
            for row in 0..batch.num_rows() {
                rows.push((
                    batch.column(0).as_primitive::<Int64Type>().value(row),
                    day.as_string::<i32>().value(row).to_string(),
                    batch.column(2).as_primitive::<Int64Type>().value(row),
                    kind.is_none_or(|k| k.is_null(row)),
                ));
            }
        }
        rows.sort();
        rows
    }

    /// Net rows read once in one scan are the net rows of SQL: an adjusted key sums, a key
    /// reversed away is gone, a row moved to another day nets on each, rows loaded twice and never
    /// adjusted stay two rows, untouched rows stay; with no adjustment rows, and with no lineage
    /// columns (netted by SQL, nothing watched). The watcher sees every stored row once; the
    /// kept rows, registered in another session, are the same net rows.
    #[tokio::test]
    async fn net_rows_read_once_are_the_net_rows_of_sql_and_every_stored_row_is_watched() {
        let adjusted: &[Row] = &[
            (1, "d1", 10, None),
            (1, "d1", -10, Some(REVERSAL)),
            (1, "d1", 12, Some(CORRECTION)),
            (2, "d1", 5, None),
            (2, "d1", 5, None),
            (3, "d2", 7, None),
            (3, "d2", -7, Some(REVERSAL)),
            (4, "d2", 1, None),
            (5, "d1", 3, None),
            (5, "d1", -3, Some(REVERSAL)),
            (5, "d2", 3, Some(CORRECTION)),
        ];
        let never: &[Row] = &[(1, "d1", 10, None), (2, "d2", 4, None), (2, "d2", 4, None)];
        // (Grouped rows with dictionaries are not kept: an IPC file takes one per column.)
        for (rows, with_kind, dictionary, streamed) in [
            (adjusted, true, false, true),
            (adjusted, true, true, true),
            (never, true, false, true),
            (adjusted, false, false, false),
        ] {
            let batch = ledger(rows, with_kind, dictionary);
            let schema = batch.schema();
            let measures = ["amount".to_string()];
            for key in [vec!["id".to_string()], Vec::new()] {
                let expected = {
                    let ctx = session(&batch);
                    register_net(&ctx, "Net", "ledger", &schema, &measures, &key)
                        .await
                        .expect("net");
                    rows_of(&ctx, "SELECT id, day, amount FROM Net").await
                };
                let ctx = session(&batch);
                let disk = Arc::clone(&ctx.runtime_env().disk_manager);
                let watched = Arc::new(Mutex::new((0usize, 0i64)));
                let seen = Arc::clone(&watched);
                let watch: crate::multiset::Watch = Box::new(move |batch, _| {
                    let mut seen = seen.lock().expect("seen");
                    seen.0 += batch.num_rows();
                    let amount = batch.column_by_name("amount").expect("amount");
                    seen.1 += amount
                        .as_primitive::<Int64Type>()
                        .iter()
                        .flatten()
                        .sum::<i64>();
                    Ok(())
                });
                let net = register_net_streamed(
                    &ctx, "Net", "ledger", &schema, &measures, &key, &disk, watch,
                )
                .await
                .expect("net");
                assert!(!net.watched_every_row(), "nothing read yet");
                let read = rows_of(&ctx, "SELECT * FROM Net").await;
                let shown = format!("{rows:?}, key {key:?}, dictionary {dictionary}");
                assert_eq!(
                    read.iter()
                        .map(|(i, d, a, _)| (*i, d.clone(), *a, true))
                        .collect::<Vec<_>>(),
                    expected,
                    "{shown}"
                );
                assert!(read.iter().all(|r| r.3), "the lineage is NULL: {shown}");
                assert_eq!(net.watched_every_row(), streamed, "{shown}");
                if streamed {
                    let all = rows.iter().map(|r| r.2).sum::<i64>();
                    assert_eq!(*watched.lock().expect("seen"), (rows.len(), all), "{shown}");
                }
                // Kept for another session: the same rows, without grouping again.
                let kept = net.kept();
                assert_eq!(
                    kept.is_spilled(),
                    streamed && rows == adjusted && !dictionary,
                    "{shown}"
                );
                let again = session(&batch);
                kept.register(&again, "Net", "ledger", &schema, &measures, &key)
                    .await
                    .expect("registered again");
                assert_eq!(
                    rows_of(&again, "SELECT id, day, amount FROM Net").await,
                    expected,
                    "{shown}"
                );
                drop(net);
                assert_eq!(
                    ctx.table("Net").await.is_err(),
                    streamed,
                    "read once, dropped with the reader: {shown}"
                );
            }
        }
    }

    /// A grouping that fails (here: it has no disk to keep its rows on) fails the reading with
    /// its own error, whether the scan was still sending it rows or had ended.
    #[tokio::test]
    async fn a_grouping_that_fails_fails_the_reading_with_its_error() {
        use deltalake::datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
        use deltalake::datafusion::execution::runtime_env::RuntimeEnvBuilder;
        let rows: Vec<Row> = (0..3000)
            .flat_map(|id| {
                [
                    (id, "d1", 10, None),
                    (id, "d1", -10, Some(REVERSAL)),
                    (id, "d2", 10, Some(CORRECTION)),
                ]
            })
            .collect();
        let batch = ledger(&rows, true, false);
        let runtime = RuntimeEnvBuilder::new()
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
            .expect("runtime");
        let ctx = SessionContext::new_with_config_rt(Default::default(), runtime);
        let parts: Vec<RecordBatch> = (0..batch.num_rows())
            .step_by(3)
            .map(|at| batch.slice(at, 3))
            .collect();
        let table = MemTable::try_new(batch.schema(), vec![parts]).expect("table");
        ctx.register_table("ledger", Arc::new(table))
            .expect("register");
        let disk = Arc::clone(&ctx.runtime_env().disk_manager);
        let net = register_net_streamed(
            &ctx,
            "Net",
            "ledger",
            &batch.schema(),
            &["amount".to_string()],
            &["id".to_string()],
            &disk,
            Box::new(|_, _| Ok(())),
        )
        .await
        .expect("net");
        let read: DfResult<Vec<RecordBatch>> = async {
            ctx.sql("SELECT * FROM Net")
                .await?
                .execute_stream()
                .await?
                .try_collect()
                .await
        }
        .await;
        let error = read.expect_err("the grouping has no disk").to_string();
        assert!(!error.contains("stopped"), "{error}");
        assert!(error.contains("DiskManager is disabled"), "{error}");
        drop(net);
    }
}
