//! The exact change data feed of a run: the rows that differ between the old and new sides, each
//! with the `_change_type` the Delta protocol's change data feed gives it.
//!
//! With a key, the sides are compared key by key: a key whose rows came back identical is not in
//! the feed; a key on both sides whose rows differ gives its old rows as `update_preimage` and its
//! new ones as `update_postimage`; a key on one side only gives `delete` or `insert` rows. Rows
//! with a NULL in a key column (they match nothing by key), and every row of a run without a key,
//! are compared as whole rows: identical rows pair off one for one (a multiset difference), and
//! the rest are `delete` (old) or `insert` (new).
//!
//! Rows are compared by a 64-bit hash of every column (partition columns included: a row that
//! moved to another partition changed). DataFusion has every piece (hash aggregation, joins,
//! window functions, all of which spill or stream), so this is SQL. The changed keys come from
//! one aggregation of both sides by key (no join: under a memory limit joins are sort-merge
//! joins, which sort both sides) and are held in memory, as a table the two scans of whole rows
//! join with; when they are few, each scan first leaves out the rows of other keys as they stream
//! by (by the hash of their key), so that only changed rows are joined. When the caller knows
//! which keys may have changed (a fix published by deletion vectors: staging found them) and
//! their rows are few, each side's rows of those keys are read once, into the session's memory,
//! and both the aggregation and the join read them there.

use std::collections::HashSet;
use std::sync::Arc;

use deltalake::arrow::array::{AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array};
use deltalake::arrow::compute::take;
use deltalake::arrow::datatypes::{DataType, Schema, UInt64Type};
use deltalake::datafusion::catalog::TableProvider;
use deltalake::datafusion::common::{DataFusionError, Result as DfResult};
use deltalake::datafusion::dataframe::DataFrame;
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use deltalake::datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use crate::keymerge::{FirstOf, FoundChanges, KeyChange};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::rowhash::{key_hash_sql, key_hashes, row_hash_sql};
use lakefill_table::sqltext::{cast_sql, ident};

/// The column of a change data file naming the kind of change, as the Delta protocol names it.
pub const CHANGE_TYPE: &str = "_change_type";

/// How many rows of each `_change_type` a feed holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedCounts {
    /// New rows of keys the old side did not have (or new whole rows).
    pub insert: u64,
    /// Old rows of keys the new side does not have (or old whole rows).
    pub delete: u64,
    /// Old rows of keys whose rows changed.
    pub update_preimage: u64,
    /// New rows of keys whose rows changed.
    pub update_postimage: u64,
}

impl FeedCounts {
    /// Every row of the feed.
    pub fn rows(&self) -> u64 {
        self.insert + self.delete + self.update_preimage + self.update_postimage
    }

    /// Adds `other`'s rows.
    pub fn merge(&mut self, other: &FeedCounts) {
        self.insert += other.insert;
        self.delete += other.delete;
        self.update_preimage += other.update_preimage;
        self.update_postimage += other.update_postimage;
    }

    /// Counts one more row of `change_type`; `false` for a name the protocol does not have.
    pub fn count(&mut self, change_type: &str, rows: u64) -> bool {
        let slot = match change_type {
            "insert" => &mut self.insert,
            "delete" => &mut self.delete,
            "update_preimage" => &mut self.update_preimage,
            "update_postimage" => &mut self.update_postimage,
            _ => return false,
        };
        *slot += rows;
        true
    }
}

/// The rows of `new` (a registered table: every column of the table after the change, in its
/// order) that differ from those of `old` (the same columns, or fewer: a column the change adds
/// is NULL on the old side), and the old rows that differ, each with its [`CHANGE_TYPE`].
/// `key`: the columns identifying a row (none: whole rows). `among`, with a key: the first half
/// of the key hash ([`lakefill_table::rowhash::key_hash_sql`]) of every key whose rows may differ
/// (others too, harmlessly); only the rows of those keys, and those with a NULL key column, are
/// compared. `found`, with a key: how each key of the sides changed, as the key merge found it
/// comparing exactly these sides ([`FoundChanges`]): each side is then read once, its rows of
/// changed keys kept, instead of grouping both by key (`among` is not needed then). The session
/// must have the hash functions registered.
pub async fn change_rows(
    ctx: &SessionContext,
    old: &str,
    new: &str,
    key: &[String],
    (among, found): (Option<Arc<HashSet<u64>>>, Option<Arc<FoundChanges>>),
) -> Result<ChangeRows> {
    let limits = Limits {
        filtered_keys: MAX_CHANGED_FILTER,
        held_bytes: MAX_HELD_BYTES,
    };
    change_rows_within(ctx, (old, new), key, (among, found), limits).await
}

/// The rows of a change data feed ([`change_rows`]), and the memory that holds what they are
/// computed from: keep it until they have been read.
pub struct ChangeRows {
    /// The feed's rows, each with its [`CHANGE_TYPE`].
    pub rows: DataFrame,
    /// The session's memory the sides held in memory take, if they are.
    _held: Option<MemoryReservation>,
}

/// How much of the work [`change_rows_within`] may do in memory.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Changed keys (found, or given) up to which each scan leaves out the rows of other keys
    /// as they stream by; beyond it, the rows of the keys given are not held either.
    filtered_keys: usize,
    /// Bytes of the sides' rows of the keys given that may be held in memory, so that both
    /// passes read them there instead of scanning each side twice.
    held_bytes: usize,
}

/// [`change_rows`], the rows of the changed keys left out as they stream by when they are at
/// most `limits.filtered_keys` keys, and the rows of the keys given held in memory when they
/// take at most `limits.held_bytes`.
async fn change_rows_within(
    ctx: &SessionContext,
    (old, new): (&str, &str),
    key: &[String],
    (among, found): (Option<Arc<HashSet<u64>>>, Option<Arc<FoundChanges>>),
    limits: Limits,
) -> Result<ChangeRows> {
    let schema = |table: &str| {
        let table = table.to_string();
        async move {
            Ok::<Schema, lakefill_table::error::Error>(
                ctx.table(table.as_str())
                    .await
                    .query_context(|| format!("table `{table}` is not registered"))?
                    .schema()
                    .as_arrow()
                    .clone(),
            )
        }
    };
    let (old_schema, new_schema) = (schema(old).await?, schema(new).await?);
    let columns: Vec<String> = new_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    // The old side in the new side's columns and types.
    let old_columns: Vec<String> = new_schema
        .fields()
        .iter()
        .map(|field| {
            let column = ident(field.name());
            match old_schema.field_with_name(field.name()) {
                Ok(f) if f.data_type() == field.data_type() => column,
                Ok(_) => format!("{} AS {column}", cast_sql(&column, field.data_type())),
                Err(_) => format!("{} AS {column}", cast_sql("NULL", field.data_type())),
            }
        })
        .collect();
    let hash = row_hash_sql(&columns);
    // With `among`, the rows of a key whose hash is among its own, or with a NULL key column: a
    // key's rows are all in or all out, so what is left out is the same on both sides. A filter
    // as the rows stream by (a join would sort both sides under a memory limit).
    let found = found.filter(|_| !key.is_empty());
    let among = among.filter(|_| !key.is_empty() && found.is_none());
    if let Some(among) = &among {
        ctx.register_udf(ScalarUDF::from(AmongUdf(AMONG, Arc::clone(among))));
    }
    let keys: Vec<String> = key.iter().map(|k| ident(k)).collect();
    let no_null_key = keys
        .iter()
        .map(|k| format!("{k} IS NOT NULL"))
        .collect::<Vec<_>>()
        .join(" AND ");
    let only = |rows: String| match &among {
        Some(_) => format!(
            "SELECT * FROM ({rows}) WHERE {AMONG}({}) OR NOT ({no_null_key})",
            key_hash_sql(0, key),
        ),
        None => rows,
    };
    let prepare = |name: &'static str, sql: String| async move {
        ctx.sql(&sql)
            .await
            .query_context(|| format!("cannot prepare the change feed's `{name}`"))
    };
    let sides = [
        (
            "__lf_feed_old",
            prepare(
                "__lf_feed_old",
                format!(
                    "SELECT *, {hash} AS __lf_h FROM ({})",
                    only(format!(
                        "SELECT {} FROM {}",
                        old_columns.join(", "),
                        ident(old)
                    ))
                ),
            )
            .await?,
        ),
        (
            "__lf_feed_new",
            prepare(
                "__lf_feed_new",
                format!(
                    "SELECT *, {hash} AS __lf_h FROM ({})",
                    only(format!("SELECT * FROM {}", ident(new)))
                ),
            )
            .await?,
        ),
    ];
    // The rows of the keys given are read once, into memory, when they are few: both passes
    // below (how each key changed, then its rows) read them there. Otherwise each pass scans
    // the sides.
    let held = match &among {
        Some(among) if among.len() <= limits.filtered_keys => {
            match held_bytes(ctx, limits.held_bytes) {
                0 => None,
                budget => hold_sides(ctx, &sides, budget).await?,
            }
        }
        _ => None,
    };
    let held = match held {
        Some((tables, reservation)) => {
            for ((name, _), table) in sides.iter().zip(tables) {
                ctx.register_table(*name, table)
                    .query_context(|| format!("cannot register the change feed's `{name}`"))?;
            }
            Some(reservation)
        }
        None => {
            for (name, rows) in sides {
                ctx.register_table(name, rows.into_view())
                    .query_context(|| format!("cannot register the change feed's `{name}`"))?;
            }
            None
        }
    };
    let done = |rows: DataFrame| ChangeRows { rows, _held: held };
    let select = |alias: &str| {
        columns
            .iter()
            .map(|c| format!("{alias}.{}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    // The rows compared whole (without a key, or with a NULL key column), if any are.
    let whole_rows = if keys.is_empty() {
        Some("TRUE".to_string())
    } else if let Some(found) = &found {
        // How each key changed is known: each side's rows of changed keys, as they stream by.
        let all = columns
            .iter()
            .map(|c| ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        for (table, is_new) in [("__lf_feed_old", false), ("__lf_feed_new", true)] {
            let udf = ChangeUdf::new(Arc::clone(found), is_new);
            let name = udf.name;
            ctx.register_udf(ScalarUDF::from(udf));
            parts.push(format!(
                "SELECT {all}, {ct} FROM (SELECT {all}, {name}({keys}) AS {ct} \
                 FROM {table}) WHERE {ct} IS NOT NULL",
                ct = ident(CHANGE_TYPE),
                keys = keys.join(", "),
            ));
        }
        found.null_keys().then(|| format!("NOT ({no_null_key})"))
    } else {
        // The keys whose rows differ, and how: one aggregation of both sides by key (it spills;
        // no join, which would sort both sides under a memory limit), held in memory.
        let side = |table: &str, side: u8| {
            format!(
                "SELECT {keys}, __lf_h, {side} AS __lf_side FROM {table}",
                keys = keys.join(", ")
            )
        };
        let of_side = |side: u8| {
            format!(
                "COUNT(*) FILTER (WHERE __lf_side = {side}) AS __lf_c{side}, \
                 MIN(__lf_h) FILTER (WHERE __lf_side = {side}) AS __lf_min{side}, \
                 MAX(__lf_h) FILTER (WHERE __lf_side = {side}) AS __lf_max{side}, \
                 BIT_XOR(__lf_h) FILTER (WHERE __lf_side = {side}) AS __lf_x{side}"
            )
        };
        let changed = format!(
            "SELECT {keys}, CASE WHEN __lf_c0 = 0 THEN 'insert' WHEN __lf_c1 = 0 THEN 'delete' ELSE 'update' END AS __lf_kind \
             FROM (SELECT {keys}, {old}, {new} FROM ({old_rows} UNION ALL {new_rows}) GROUP BY {keys}) \
             WHERE (__lf_c0 <> __lf_c1) OR (__lf_min0 IS DISTINCT FROM __lf_min1) \
             OR (__lf_max0 IS DISTINCT FROM __lf_max1) OR (__lf_x0 IS DISTINCT FROM __lf_x1)",
            keys = keys.join(", "),
            old = of_side(0),
            new = of_side(1),
            old_rows = side("__lf_feed_old", 0),
            new_rows = side("__lf_feed_new", 1),
        );
        let changed = ctx
            .sql(&changed)
            .await
            .query_context(|| "cannot find the keys whose rows changed".into())?
            .cache()
            .await
            .query_context(|| "cannot find the keys whose rows changed".into())?;
        ctx.register_table("__lf_feed_keys", changed.into_view())
            .query_context(|| "cannot register the changed keys".into())?;
        // Rows with a NULL in a key column group apart (and match nothing by key): only when
        // some of those groups differ are rows compared whole too.
        let null_keys = ctx
            .sql(&format!(
                "SELECT 1 FROM __lf_feed_keys WHERE NOT ({no_null_key}) LIMIT 1"
            ))
            .await
            .query_context(|| "cannot find rows with a NULL key".into())?
            .count()
            .await
            .query_context(|| "cannot find rows with a NULL key".into())?;
        // Each side's rows of the changed keys: when they are few, the rows of other keys are
        // left out as they stream by (their key hash is not among the changed keys'), so that
        // only the changed rows are joined with the keys.
        let filtered = match changed_key_hashes(ctx, key, limits.filtered_keys).await? {
            Some(hashes) => {
                ctx.register_udf(ScalarUDF::from(AmongUdf(CHANGED, Arc::new(hashes))));
                true
            }
            None => false,
        };
        let of_changed = |table: &str| {
            if filtered {
                format!(
                    "(SELECT * FROM {table} WHERE {CHANGED}({}))",
                    key_hash_sql(0, key)
                )
            } else {
                table.to_string()
            }
        };
        let on = |left: &str, right: &str| {
            keys.iter()
                .map(|k| format!("{left}.{k} = {right}.{k}"))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        parts.push(format!(
            "SELECT {cols}, CASE WHEN c.__lf_kind = 'delete' THEN 'delete' ELSE 'update_preimage' END AS {ct} \
             FROM {old} o JOIN __lf_feed_keys c ON {on}",
            cols = select("o"),
            ct = ident(CHANGE_TYPE),
            old = of_changed("__lf_feed_old"),
            on = on("o", "c"),
        ));
        parts.push(format!(
            "SELECT {cols}, CASE WHEN c.__lf_kind = 'insert' THEN 'insert' ELSE 'update_postimage' END AS {ct} \
             FROM {new} n JOIN __lf_feed_keys c ON {on}",
            cols = select("n"),
            ct = ident(CHANGE_TYPE),
            new = of_changed("__lf_feed_new"),
            on = on("n", "c"),
        ));
        (null_keys > 0).then(|| format!("NOT ({no_null_key})"))
    };
    // Whole rows: the n-th copy of a row on one side pairs with the n-th copy on the other.
    if let Some(whole_rows) = whole_rows {
        let numbered = |table: &str, columns: &str| {
            format!(
                "SELECT {columns}, ROW_NUMBER() OVER (PARTITION BY __lf_h) AS __lf_n FROM {table} WHERE {whole_rows}"
            )
        };
        for (from, other, change) in [
            ("__lf_feed_old", "__lf_feed_new", "delete"),
            ("__lf_feed_new", "__lf_feed_old", "insert"),
        ] {
            parts.push(format!(
                "SELECT {cols}, '{change}' AS {ct} FROM ({rows}) r LEFT ANTI JOIN ({others}) x \
                 ON r.__lf_h = x.__lf_h AND r.__lf_n = x.__lf_n",
                cols = select("r"),
                ct = ident(CHANGE_TYPE),
                rows = numbered(from, "*"),
                others = numbered(other, "__lf_h"),
            ));
        }
    }
    ctx.sql(&parts.join(" UNION ALL "))
        .await
        .query_context(|| "cannot compute the change feed".into())
        .map(done)
}

/// The bytes the sides' rows may take in memory: at most `max`, and an eighth of the session's
/// memory pool when it has a limit; nothing under a pool of less than [`MIN_POOL_TO_HOLD`]. The
/// aggregation and the join that read them, and the sorts of the sort-merge join, need the rest:
/// under `--memory-limit 64MiB`, 6 MB held left a sort of the join 0.9 MB and failed the run.
fn held_bytes(ctx: &SessionContext, max: usize) -> usize {
    use deltalake::datafusion::execution::memory_pool::MemoryLimit;
    match ctx.runtime_env().memory_pool.memory_limit() {
        MemoryLimit::Finite(pool) if pool < MIN_POOL_TO_HOLD => 0,
        MemoryLimit::Finite(pool) => max.min(pool / 8),
        _ => max,
    }
}

/// The smallest memory pool of a session in which the feed holds rows in memory.
const MIN_POOL_TO_HOLD: usize = 256 << 20;

/// Each of `sides` read into memory, as tables of as many partitions as the session's scans
/// have, with the reservation of the session's memory they take; `None` when they would take
/// more than `max_bytes` or than the session's memory pool grants (what was read is dropped).
async fn hold_sides(
    ctx: &SessionContext,
    sides: &[(&'static str, DataFrame)],
    max_bytes: usize,
) -> Result<Option<(Vec<Arc<dyn TableProvider>>, MemoryReservation)>> {
    let reservation = MemoryConsumer::new("change feed: the changed keys' rows")
        .register(&ctx.runtime_env().memory_pool);
    let partitions = ctx.state().config().target_partitions().max(1);
    let mut tables: Vec<Arc<dyn TableProvider>> = Vec::with_capacity(sides.len());
    for (name, rows) in sides {
        let context = || format!("cannot read the change feed's `{name}`");
        let schema = Arc::new(rows.schema().as_arrow().clone());
        let mut stream = rows.clone().execute_stream().await.query_context(context)?;
        let mut held: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions];
        let mut next = 0;
        while let Some(batch) = stream.next().await {
            let batch = batch.query_context(context)?;
            let size = batch.get_array_memory_size();
            if reservation.size() + size > max_bytes || reservation.try_grow(size).is_err() {
                tracing::debug!(
                    side = *name,
                    held_bytes = reservation.size(),
                    "the changed keys' rows take too much memory to hold: both passes scan"
                );
                return Ok(None);
            }
            held[next % partitions].push(batch);
            next += 1;
        }
        let table = MemTable::try_new(schema, held).query_context(context)?;
        tables.push(Arc::new(table));
    }
    tracing::debug!(
        held_bytes = reservation.size(),
        "holds the changed keys' rows of both sides in memory"
    );
    Ok(Some((tables, reservation)))
}

/// The SQL name of the [`AmongUdf`] of the keys the caller says may have changed.
const AMONG: &str = "__lf_among";

/// The SQL name of the [`AmongUdf`] of the keys found changed.
const CHANGED: &str = "__lf_changed";

/// Changed keys beyond which the rows of the changed keys are picked by the join alone (the
/// set of their hashes would take more memory than leaving out the others saves).
const MAX_CHANGED_FILTER: usize = 1 << 21;

/// The most memory the rows of the keys given may take to be held for both passes (about
/// 2,000,000 rows of ten narrow columns), and at most an eighth of the session's pool
/// ([`held_bytes`]).
const MAX_HELD_BYTES: usize = 256 << 20;

/// The first half of the key hash of each key of `__lf_feed_keys` (NULL keys are not), when
/// there are at most `max`.
async fn changed_key_hashes(
    ctx: &SessionContext,
    key: &[String],
    max: usize,
) -> Result<Option<HashSet<u64>>> {
    let batches = ctx
        .sql(&format!(
            "SELECT {} AS h FROM __lf_feed_keys LIMIT {}",
            key_hash_sql(0, key),
            max + 1
        ))
        .await
        .query_context(|| "cannot read the changed keys".into())?
        .collect()
        .await
        .query_context(|| "cannot read the changed keys".into())?;
    let mut hashes = HashSet::new();
    for batch in &batches {
        if let Some(column) = batch.column(0).as_primitive_opt::<UInt64Type>() {
            hashes.extend(column.iter().flatten());
        }
    }
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    Ok((rows <= max).then_some(hashes))
}

/// `__lf_change_old(key columns)` and `__lf_change_new(key columns)`: the `_change_type` of a
/// row of that side, as [`FoundChanges`] tells how its key changed; NULL for a key that did not
/// change (or a NULL key). The first half of the key hash is computed for every row, the second
/// only for the rows whose first half a changed key has (one function, so that a side of few
/// changed keys is hashed about once, not twice).
#[derive(Debug)]
struct ChangeUdf {
    found: Arc<FoundChanges>,
    is_new: bool,
    name: &'static str,
    signature: Signature,
}

impl ChangeUdf {
    fn new(found: Arc<FoundChanges>, is_new: bool) -> Self {
        Self {
            found,
            is_new,
            name: if is_new {
                "__lf_change_new"
            } else {
                "__lf_change_old"
            },
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

impl PartialEq for ChangeUdf {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.found, &other.found) && self.is_new == other.is_new
    }
}

impl Eq for ChangeUdf {}

impl std::hash::Hash for ChangeUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.found).hash(state);
        self.is_new.hash(state);
    }
}

impl ScalarUDFImpl for ChangeUdf {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let keys = ColumnarValue::values_to_arrays(&args.args)?;
        let external = |e: lakefill_table::error::Error| DataFusionError::External(Box::new(e));
        let k1 = key_hashes(0, &keys, rows).map_err(external)?;
        // The rows whose first half a changed key has (a NULL key has none), and where.
        let (candidates, firsts): (Vec<u32>, Vec<FirstOf>) = k1
            .iter()
            .enumerate()
            .filter_map(|(row, h)| Some((row as u32, self.found.first_of(h?)?)))
            .unzip();
        let candidates = UInt32Array::from(candidates);
        let mut change_types: Vec<Option<&str>> = vec![None; rows];
        if !candidates.is_empty() {
            // Every row's key (a partition whose every key changed): hashed as it is.
            let k2 = if candidates.len() == rows {
                key_hashes(1, &keys, rows)
            } else {
                let picked = keys
                    .iter()
                    .map(|column| take(column.as_ref(), &candidates, None))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                key_hashes(1, &picked, candidates.len())
            }
            .map_err(external)?;
            for (at, (row, first)) in candidates.values().iter().zip(firsts).enumerate() {
                let row = *row as usize;
                let change = self.found.change_at(first, k1.value(row), k2.value(at));
                change_types[row] = match (change, self.is_new) {
                    (Some(KeyChange::Insert), true) => Some("insert"),
                    (Some(KeyChange::Update), true) => Some("update_postimage"),
                    (Some(KeyChange::Delete), false) => Some("delete"),
                    (Some(KeyChange::Update), false) => Some("update_preimage"),
                    _ => None,
                };
            }
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(
            change_types,
        ))))
    }
}

/// `<name>(h)`: whether the `UInt64` `h` is one of the set's (NULL is not).
#[derive(Debug)]
struct AmongUdf(&'static str, Arc<HashSet<u64>>);

impl PartialEq for AmongUdf {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0 && Arc::ptr_eq(&self.1, &other.1)
    }
}

impl Eq for AmongUdf {}

impl std::hash::Hash for AmongUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        Arc::as_ptr(&self.1).hash(state);
    }
}

impl ScalarUDFImpl for AmongUdf {
    fn name(&self) -> &str {
        self.0
    }

    fn signature(&self) -> &Signature {
        static SIGNATURE: std::sync::LazyLock<Signature> = std::sync::LazyLock::new(|| {
            Signature::exact(vec![DataType::UInt64], Volatility::Immutable)
        });
        &SIGNATURE
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let hashes = ColumnarValue::values_to_arrays(&args.args)?;
        let hashes = hashes
            .first()
            .and_then(|h| h.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| DataFusionError::Internal(format!("{} takes a UInt64", self.0)))?;
        let among: BooleanArray = hashes
            .iter()
            .map(|h| Some(h.is_some_and(|h| self.1.contains(&h))))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(among)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, RecordBatch, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field};
    use deltalake::datafusion::datasource::MemTable;
    use std::sync::Arc;

    fn table(ctx: &SessionContext, name: &str, rows: &[(Option<i64>, &str)]) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
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
            ],
        )
        .expect("batch");
        let provider = MemTable::try_new(schema, vec![vec![batch]]).expect("table");
        ctx.register_table(name, Arc::new(provider))
            .expect("register");
    }

    async fn feed(
        old: &[(Option<i64>, &str)],
        new: &[(Option<i64>, &str)],
        key: &[&str],
    ) -> Vec<String> {
        let key: Vec<String> = key.iter().map(|k| (*k).to_string()).collect();
        let session = || {
            let ctx = SessionContext::new();
            lakefill_table::rowhash::register_hash_functions(&ctx);
            table(&ctx, "old", old);
            table(&ctx, "new", new);
            ctx
        };
        let rows = feed_of(&session(), &key, None, LIMITS).await;
        // The same rows when the changed keys' rows are picked by the join alone.
        let limits = Limits {
            filtered_keys: 0,
            ..LIMITS
        };
        assert_eq!(feed_of(&session(), &key, None, limits).await, rows);
        rows
    }

    /// The limits [`change_rows`] uses.
    const LIMITS: Limits = Limits {
        filtered_keys: MAX_CHANGED_FILTER,
        held_bytes: MAX_HELD_BYTES,
    };

    /// [`change_rows`] of the tables `old` and `new` of `ctx`, as `id:v:change type`, sorted.
    async fn feed_of(
        ctx: &SessionContext,
        key: &[String],
        among: Option<Arc<HashSet<u64>>>,
        limits: Limits,
    ) -> Vec<String> {
        let batches = change_rows_within(ctx, ("old", "new"), key, (among, None), limits)
            .await
            .expect("feed")
            .rows
            .collect()
            .await
            .expect("rows");
        let mut rows = Vec::new();
        for batch in &batches {
            for row in crate::rows::batch_to_json(batch, usize::MAX).expect("json") {
                rows.push(format!(
                    "{}:{}:{}",
                    row["id"].as_str().unwrap_or("null"),
                    row["v"].as_str().unwrap_or("null"),
                    row[CHANGE_TYPE].as_str().unwrap_or("?")
                ));
            }
        }
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn keys_whole_rows_nulls_and_repeats_give_exactly_the_changes() {
        // By key: 1 identical, 2 changed, 3 removed, 4 added.
        let old = [(Some(1), "a"), (Some(2), "b"), (Some(3), "c")];
        let new = [(Some(1), "a"), (Some(2), "B"), (Some(4), "d")];
        assert_eq!(
            feed(&old, &new, &["id"]).await,
            [
                "2:B:update_postimage",
                "2:b:update_preimage",
                "3:c:delete",
                "4:d:insert"
            ]
        );
        // Rows with a NULL key pair off whole: one identical, one gone, one new.
        let old = [(Some(1), "a"), (None, "x"), (None, "y")];
        let new = [(Some(1), "a"), (None, "x"), (None, "z")];
        assert_eq!(
            feed(&old, &new, &["id"]).await,
            ["null:y:delete", "null:z:insert"]
        );
        // Without a key, repeated rows are a multiset: two copies become three, one `b` goes.
        let old = [(Some(1), "a"), (Some(1), "a"), (Some(2), "b")];
        let new = [(Some(1), "a"), (Some(1), "a"), (Some(1), "a")];
        assert_eq!(feed(&old, &new, &[]).await, ["1:a:insert", "2:b:delete"]);
        // A repeated key whose rows come back the same is not a change.
        let old = [(Some(5), "p"), (Some(5), "q")];
        let new = [(Some(5), "q"), (Some(5), "p")];
        assert!(feed(&old, &new, &["id"]).await.is_empty());
        // Identical sides: nothing.
        assert!(feed(&old, &old, &[]).await.is_empty());
    }

    #[test]
    fn rows_are_held_in_an_eighth_of_a_pool_large_enough() {
        use deltalake::datafusion::execution::memory_pool::FairSpillPool;
        use deltalake::datafusion::execution::runtime_env::RuntimeEnvBuilder;
        let with_pool = |bytes: usize| {
            let runtime = RuntimeEnvBuilder::new()
                .with_memory_pool(Arc::new(FairSpillPool::new(bytes)))
                .build_arc()
                .expect("runtime");
            SessionContext::new_with_config_rt(Default::default(), runtime)
        };
        assert_eq!(
            held_bytes(&SessionContext::new(), MAX_HELD_BYTES),
            MAX_HELD_BYTES
        );
        assert_eq!(held_bytes(&with_pool(64 << 20), MAX_HELD_BYTES), 0);
        assert_eq!(
            held_bytes(&with_pool(MIN_POOL_TO_HOLD - 1), MAX_HELD_BYTES),
            0
        );
        assert_eq!(
            held_bytes(&with_pool(MIN_POOL_TO_HOLD), MAX_HELD_BYTES),
            32 << 20
        );
        assert_eq!(held_bytes(&with_pool(1 << 30), MAX_HELD_BYTES), 128 << 20);
        assert_eq!(
            held_bytes(&with_pool(64 << 30), MAX_HELD_BYTES),
            MAX_HELD_BYTES
        );
    }

    #[tokio::test]
    async fn among_the_keys_given_only_their_rows_and_null_keys_are_compared() {
        let session = || {
            let ctx = SessionContext::new();
            lakefill_table::rowhash::register_hash_functions(&ctx);
            table(
                &ctx,
                "old",
                &[(Some(1), "a"), (Some(2), "b"), (Some(3), "c"), (None, "x")],
            );
            table(
                &ctx,
                "new",
                &[(Some(1), "A"), (Some(2), "B"), (Some(4), "d"), (None, "y")],
            );
            ctx
        };
        // Keys 2 and 3 (and 5, which neither side has), not 1 nor 4.
        let keys: Arc<dyn deltalake::arrow::array::Array> =
            Arc::new(Int64Array::from(vec![2, 3, 5]));
        let hashes = lakefill_table::rowhash::key_hashes(0, &[keys], 3).expect("hashes");
        let among: Arc<HashSet<u64>> = Arc::new(hashes.iter().flatten().collect());
        let expected = [
            "2:B:update_postimage",
            "2:b:update_preimage",
            "3:c:delete",
            "null:x:delete",
            "null:y:insert",
        ];
        let key = ["id".to_string()];
        // The sides' rows of those keys held in memory for both passes.
        let ctx = session();
        let feed = change_rows_within(
            &ctx,
            ("old", "new"),
            &key,
            (Some(Arc::clone(&among)), None),
            LIMITS,
        )
        .await
        .expect("feed");
        for side in ["__lf_feed_old", "__lf_feed_new"] {
            let provider = ctx.table_provider(side).await.expect("side");
            assert!(provider.is::<MemTable>(), "{side} is held in memory");
        }
        drop(feed);
        assert_eq!(
            feed_of(&session(), &key, Some(Arc::clone(&among)), LIMITS).await,
            expected
        );
        // The same rows whatever memory may hold (none, part of a side, one side but not the
        // other, both) and however the changed keys' rows are picked.
        for held_bytes in (0..16 * 1024).step_by(256).chain([usize::MAX]) {
            for filtered_keys in [0, MAX_CHANGED_FILTER] {
                let limits = Limits {
                    filtered_keys,
                    held_bytes,
                };
                assert_eq!(
                    feed_of(&session(), &key, Some(Arc::clone(&among)), limits).await,
                    expected,
                    "{limits:?}"
                );
            }
        }
    }
}
