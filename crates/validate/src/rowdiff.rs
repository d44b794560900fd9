//! The row-level diff by key, without joining whole rows.
//!
//! Each side is first reduced to narrow rows: the partition columns, the key, and one 64-bit
//! hash of every other column both sides have ([`lakefill_table::rowhash`]). Only those are joined, a
//! full outer join on the key (a sort-merge join that spills when the run has a memory limit),
//! so the join holds about 24 bytes a row instead of whole rows. Two rows whose hashes agree are
//! equal but for a 2⁻⁶⁴ chance; the rows that differ stream out and are counted per partition,
//! and only the sampled ones are read back whole, from the partitions they lie in.
//!
//! The result is the full outer join of whole rows on the key, with `IS DISTINCT FROM` on every
//! other column, that the tests keep as the reference: the same pairs, counted the same way (a
//! NULL key matches nothing; a repeated key pairs every old row with every new one).

use std::collections::BTreeMap;

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::datatypes::{Int64Type, UInt64Type};
use deltalake::arrow::util::display::ArrayFormatter;
use deltalake::datafusion::common::{Column, ScalarValue};
use deltalake::datafusion::logical_expr::{Expr, lit};
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::rows::{column_names, formatters_for, run};
use super::spec::{CompareSpec, Samples};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::rowhash::{key_hash_sql, row_hash_sql};
use lakefill_table::sqltext::ident;

/// Differences by key.
#[derive(Debug)]
pub struct RowDiff {
    /// Per partition: added, removed, changed.
    pub counts: BTreeMap<String, [u64; 3]>,
    /// Example rows of each kind.
    pub samples: Samples,
}

/// The kinds of difference, as the diff query numbers them.
pub const ADDED: usize = 0;
/// A row whose key only the new side has.
pub const REMOVED: usize = 1;
/// A row whose key only the old side has.
pub const CHANGED: usize = 2;

/// One side of a sampled difference: the row's partition column values and its hash.
pub type SideOfRow = Option<(Vec<ScalarValue>, u64)>;

/// Rows to read back: partition column values and the key.
type Wanted<'a> = Vec<(Vec<ScalarValue>, &'a SampledKey)>;

/// How a sampled row's key is known.
#[derive(Debug, Clone)]
pub enum SampledKey {
    /// By its values.
    Values(Vec<ScalarValue>),
    /// By the two halves of its hash ([`lakefill_table::rowhash::key_hashes`]).
    Hashes(u64, u64),
    /// A key with a NULL in it (known by the row's hash only).
    Null,
}

impl SampledKey {
    /// How rows read back by hash are matched to it.
    pub fn identity(&self) -> String {
        match self {
            SampledKey::Hashes(k1, k2) => hash_identity(Some((*k1, *k2))),
            _ => hash_identity(None),
        }
    }
}

/// The identity of a row read back by key hash: the 96 bits the key merge knows a key by (the
/// first half, and the low 32 bits of the second).
fn hash_identity(key: Option<(u64, u64)>) -> String {
    key.map_or_else(
        || "null".into(),
        |(k1, k2)| format!("{k1:016x}{:08x}", k2 as u32),
    )
}

/// A sampled difference, until its whole rows are read back.
pub struct Sampled {
    /// [`ADDED`], [`REMOVED`] or [`CHANGED`].
    pub kind: usize,
    /// The partition label the comparison reports it under.
    pub partition: String,
    /// The key, as text (how rows read back are matched to it).
    pub key_text: String,
    /// The key.
    pub key: SampledKey,
    /// The old row's partition column values and hash, when there is an old row.
    pub old: SideOfRow,
    /// The new row's, when there is a new row.
    pub new: SideOfRow,
}

/// Compares `old` with `new` (tables or views registered in `ctx`) by `spec.key`.
pub async fn row_diff(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old: &str,
    new: &str,
) -> Result<RowDiff> {
    lakefill_table::rowhash::register_hash_functions(ctx);
    let (common, compared) = compared_columns(ctx, spec, old, new).await?;
    let parts = spec.partitions.columns();
    // The narrow row: partition columns and key (each once), and the hash of the rest.
    let mut narrow: Vec<String> = parts.clone();
    for k in &spec.key {
        if !narrow.contains(k) {
            narrow.push(k.clone());
        }
    }
    let hash = row_hash_sql(&compared);
    let side = |table: &str, flag: &str| {
        let columns: Vec<String> = narrow.iter().map(|c| ident(c)).collect();
        format!(
            "SELECT {}, {hash} AS __lf_h, TRUE AS {flag} FROM {table}",
            columns.join(", ")
        )
    };
    let join = spec
        .key
        .iter()
        .map(|k| format!("o.{0} = n.{0}", ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let labels = parts.len();
    // Partition labels are worked out per distinct value, not per row (see `Labels`).
    let mut select = vec![
        "CASE WHEN o.__lf_o IS NULL THEN 0 WHEN n.__lf_n IS NULL THEN 1 ELSE 2 END AS __lf_kind"
            .to_string(),
    ];
    for (i, c) in parts.iter().enumerate() {
        select.push(format!("o.{} AS __lf_op{i}", ident(c)));
    }
    for (i, c) in parts.iter().enumerate() {
        select.push(format!("n.{} AS __lf_np{i}", ident(c)));
    }
    for (i, k) in spec.key.iter().enumerate() {
        select.push(format!("COALESCE(n.{0}, o.{0}) AS __lf_k{i}", ident(k)));
    }
    select.push("o.__lf_h AS __lf_oh".into());
    select.push("n.__lf_h AS __lf_nh".into());
    let sql = format!(
        "SELECT {} FROM ({}) o FULL OUTER JOIN ({}) n ON {join} \
         WHERE o.__lf_o IS NULL OR n.__lf_n IS NULL OR o.__lf_h <> n.__lf_h",
        select.join(", "),
        side(old, "__lf_o"),
        side(new, "__lf_n"),
    );

    let mut counts: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    let mut cache = Labels {
        spec,
        width: labels,
        known: std::collections::HashMap::new(),
    };
    let mut sampled: Vec<Sampled> = Vec::new();
    let mut taken = [0usize; 3];
    let mut stream = run(ctx, &sql, "compare rows by key").await?;
    // Column positions in the result.
    let kind_at = 0;
    let old_parts_at = kind_at + 1;
    let new_parts_at = old_parts_at + labels;
    let key_at = new_parts_at + labels;
    let old_hash_at = key_at + spec.key.len();
    let new_hash_at = old_hash_at + 1;
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "cannot compare rows by key".into())?;
        let partitions = cache.labels(&batch, old_parts_at, new_parts_at)?;
        let kinds = batch.column(kind_at).as_primitive::<Int64Type>();
        let mut formatters: Option<Vec<ArrayFormatter>> = None;
        for (row, partition) in partitions.into_iter().enumerate() {
            let kind = usize::try_from(kinds.value(row))
                .unwrap_or(CHANGED)
                .min(CHANGED);
            counts.entry(partition.clone()).or_default()[kind] += 1;
            if taken[kind] >= spec.sample {
                continue;
            }
            taken[kind] += 1;
            let formatters = match &mut formatters {
                Some(f) => f,
                None => formatters.insert(formatters_for(&batch)?),
            };
            let scalars = |from: usize, count: usize| -> Result<Vec<ScalarValue>> {
                (from..from + count)
                    .map(|i| {
                        ScalarValue::try_from_array(batch.column(i), row)
                            .query_context(|| "cannot read a sampled value".into())
                    })
                    .collect()
            };
            let side = |parts_at: usize, hash_at: usize| -> Result<SideOfRow> {
                let hashes = batch.column(hash_at).as_primitive::<UInt64Type>();
                if hashes.is_null(row) {
                    return Ok(None);
                }
                Ok(Some((scalars(parts_at, labels)?, hashes.value(row))))
            };
            sampled.push(Sampled {
                kind,
                partition,
                key_text: key_text((key_at..key_at + spec.key.len()).map(|i| {
                    (!batch.column(i).is_null(row)).then(|| formatters[i].value(row).to_string())
                })),
                key: SampledKey::Values(scalars(key_at, spec.key.len())?),
                old: side(old_parts_at, old_hash_at)?,
                new: side(new_parts_at, new_hash_at)?,
            });
        }
    }
    let samples = read_back(ctx, spec, &common, &hash, old, new, &parts, sampled).await?;
    Ok(RowDiff { counts, samples })
}

/// The columns both sides have (in the old side's order), and those of them a row's hash covers
/// (all but the key).
pub async fn compared_columns(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old: &str,
    new: &str,
) -> Result<(Vec<String>, Vec<String>)> {
    let old_columns = column_names(ctx, old).await?;
    let new_columns = column_names(ctx, new).await?;
    let common: Vec<String> = old_columns
        .into_iter()
        .filter(|c| new_columns.contains(c))
        .collect();
    let compared = common
        .iter()
        .filter(|c| !spec.key.contains(c))
        .cloned()
        .collect();
    Ok((common, compared))
}

/// Partition labels of diff rows, each worked out once per distinct value of the partition
/// columns: the new row's values, else the old row's (as `COALESCE(new, old)`), read as text the
/// way `CAST(... AS VARCHAR)` reads them. Formatting and parsing a date per row would cost more
/// than the join.
struct Labels<'a> {
    spec: &'a CompareSpec,
    width: usize,
    known: std::collections::HashMap<Vec<ScalarValue>, String>,
}

impl Labels<'_> {
    fn labels(&mut self, batch: &RecordBatch, old_at: usize, new_at: usize) -> Result<Vec<String>> {
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let values = (0..self.width)
                .map(|i| {
                    let new = batch.column(new_at + i);
                    let column = if new.is_null(row) {
                        batch.column(old_at + i)
                    } else {
                        new
                    };
                    ScalarValue::try_from_array(column, row)
                        .query_context(|| "cannot read a partition value".into())
                })
                .collect::<Result<Vec<_>>>()?;
            if let Some(label) = self.known.get(&values) {
                out.push(label.clone());
                continue;
            }
            let label = partition_label(self.spec, &values)?;
            self.known.insert(values, label.clone());
            out.push(label);
        }
        Ok(out)
    }
}

/// The partition label of a row's partition column values, read as text the way
/// `CAST(... AS VARCHAR)` reads them.
pub fn partition_label(spec: &CompareSpec, values: &[ScalarValue]) -> Result<String> {
    let texts = values
        .iter()
        .map(|value| {
            if value.is_null() {
                return Ok(None);
            }
            let array = value
                .to_array()
                .query_context(|| "cannot read a partition value".into())?;
            let text = deltalake::arrow::compute::cast(
                &array,
                &deltalake::arrow::datatypes::DataType::Utf8,
            )
            .map_err(|e| lakefill_table::error::Error::Internal(e.to_string()))?;
            Ok(Some(text.as_string::<i32>().value(0).to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(spec.partitions.label(&texts))
}

/// The key as one text, NULLs told apart from the text `NULL`.
fn key_text(values: impl Iterator<Item = Option<String>>) -> String {
    values
        .map(|v| v.unwrap_or_else(|| "\u{0}".into()))
        .collect::<Vec<_>>()
        .join("\u{1f}")
}

/// Reads the sampled rows back whole, from their own partitions only, and writes the samples
/// as the comparison reports them: whole rows for added and removed ones, and for changed ones
/// the key with the old and new values of the columns that differ.
#[allow(clippy::too_many_arguments)]
pub async fn read_back(
    ctx: &SessionContext,
    spec: &CompareSpec,
    common: &[String],
    hash: &str,
    old: &str,
    new: &str,
    parts: &[String],
    sampled: Vec<Sampled>,
) -> Result<Samples> {
    let mut samples = Samples::default();
    if sampled.is_empty() {
        return Ok(samples);
    }
    let wanted = |pick: fn(&Sampled) -> &SideOfRow| -> Wanted<'_> {
        sampled
            .iter()
            .filter_map(|s| pick(s).as_ref().map(|(p, _)| (p.clone(), &s.key)))
            .collect()
    };
    let old_rows = fetch(
        ctx,
        old,
        common,
        hash,
        parts,
        &spec.key,
        &wanted(|s| &s.old),
    )
    .await?;
    let new_rows = fetch(
        ctx,
        new,
        common,
        hash,
        parts,
        &spec.key,
        &wanted(|s| &s.new),
    )
    .await?;
    let row_of =
        |rows: &BTreeMap<(String, u64), Map<String, Value>>, side: &SideOfRow, key: &str| {
            side.as_ref()
                .and_then(|(_, h)| rows.get(&(key.to_string(), *h)).cloned())
                .unwrap_or_default()
        };
    for s in sampled {
        let old_row = row_of(&old_rows, &s.old, &s.key_text);
        let new_row = row_of(&new_rows, &s.new, &s.key_text);
        match s.kind {
            ADDED => samples
                .added
                .push(json!({"partition": s.partition, "row": new_row})),
            REMOVED => samples
                .removed
                .push(json!({"partition": s.partition, "row": old_row})),
            _ => {
                let mut key = Map::new();
                let mut before = Map::new();
                let mut after = Map::new();
                for c in common {
                    let (o, n) = (
                        old_row.get(c).cloned().unwrap_or(Value::Null),
                        new_row.get(c).cloned().unwrap_or(Value::Null),
                    );
                    if spec.key.contains(c) {
                        key.insert(c.clone(), n);
                    } else if o != n {
                        before.insert(c.clone(), o);
                        after.insert(c.clone(), n);
                    }
                }
                samples.changed.push(json!({
                    "partition": s.partition, "key": key, "old": before, "new": after,
                }));
            }
        }
    }
    Ok(samples)
}

/// The rows of `table` in the given partitions with the given keys, by key text and row hash.
async fn fetch(
    ctx: &SessionContext,
    table: &str,
    common: &[String],
    hash: &str,
    parts: &[String],
    key: &[String],
    wanted: &Wanted<'_>,
) -> Result<BTreeMap<(String, u64), Map<String, Value>>> {
    let mut out = BTreeMap::new();
    let equal = |column: &str, value: &ScalarValue| {
        let column = Expr::Column(Column::new_unqualified(column));
        if value.is_null() {
            column.is_null()
        } else {
            column.eq(lit(value.clone()))
        }
    };
    let by_hash = wanted
        .iter()
        .any(|(_, k)| !matches!(k, SampledKey::Values(_)));
    // By hash, rows are selected by partition only, and picked out by their key hashes as they
    // stream back (the hashes computed once a row, not once for every sample).
    let mut identities: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut partitions: Vec<&Vec<ScalarValue>> = Vec::new();
    let Some(predicate) = wanted
        .iter()
        .filter_map(|(part_values, sampled_key)| {
            let parts = parts.iter().zip(part_values).map(|(c, v)| equal(c, v));
            let keys: Vec<Expr> = match sampled_key {
                SampledKey::Values(values) => {
                    key.iter().zip(values).map(|(c, v)| equal(c, v)).collect()
                }
                hashed => {
                    identities.insert(hashed.identity());
                    if partitions.contains(&part_values) {
                        return None;
                    }
                    partitions.push(part_values);
                    Vec::new()
                }
            };
            // No partition columns and a hashed key: the whole table is the one partition.
            Some(parts.chain(keys).reduce(Expr::and).unwrap_or(lit(true)))
        })
        .reduce(Expr::or)
    else {
        return Ok(out);
    };
    let view = format!("__lf_sampled_{table}");
    let filtered = ctx
        .table(table)
        .await
        .and_then(|df| df.filter(predicate))
        .query_context(|| format!("cannot select the sampled rows of `{table}`"))?;
    ctx.register_table(view.as_str(), filtered.into_view())
        .query_context(|| "cannot register the sampled rows".into())?;
    let mut columns: Vec<String> = common.iter().map(|c| ident(c)).collect();
    columns.push(format!("{hash} AS __lf_h"));
    if by_hash {
        columns.push(key_hash_sql(0, key));
        columns.push(key_hash_sql(1, key));
    }
    let sql = format!("SELECT {} FROM {view}", columns.join(", "));
    let result = async {
        let mut stream = run(ctx, &sql, "read the sampled rows").await?;
        while let Some(batch) = stream.next().await {
            let batch = batch.query_context(|| "cannot read the sampled rows".into())?;
            let wanted = by_hash.then_some(&identities);
            collect_rows(&batch, common, key, wanted, &mut out)?;
        }
        Ok::<_, lakefill_table::error::Error>(())
    }
    .await;
    let _ = ctx.deregister_table(view.as_str());
    result?;
    Ok(out)
}

/// Adds each row of `batch` (the common columns, the hash, then, by hash, the halves of the key
/// hash) under its key text (or key hash) and hash; by hash, only rows whose key hash is one of
/// `by_hash`.
fn collect_rows(
    batch: &RecordBatch,
    common: &[String],
    key: &[String],
    by_hash: Option<&std::collections::HashSet<String>>,
    out: &mut BTreeMap<(String, u64), Map<String, Value>>,
) -> Result<()> {
    let formatters = formatters_for(batch)?;
    let hashes = batch.column(common.len()).as_primitive::<UInt64Type>();
    for row in 0..batch.num_rows() {
        let cell = |i: usize| {
            (!batch.column(i).is_null(row)).then(|| formatters[i].value(row).to_string())
        };
        let key_text = if let Some(wanted) = by_hash {
            let k1 = batch.column(common.len() + 1).as_primitive::<UInt64Type>();
            let k2 = batch.column(common.len() + 2).as_primitive::<UInt64Type>();
            let identity = hash_identity(k1.is_valid(row).then(|| (k1.value(row), k2.value(row))));
            if !wanted.contains(&identity) {
                continue;
            }
            identity
        } else {
            key_text(
                key.iter()
                    .map(|k| common.iter().position(|c| c == k).and_then(cell)),
            )
        };
        let values: Map<String, Value> = common
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), cell(i).map_or(Value::Null, Value::String)))
            .collect();
        out.entry((key_text, hashes.value(row))).or_insert(values);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: the full outer join of whole rows on the key, `IS DISTINCT FROM` on every
    /// other column (what the diff was before rows were hashed).
    async fn full_join_diff(ctx: &SessionContext, spec: &CompareSpec) -> Result<RowDiff> {
        let old_columns = column_names(ctx, "previous").await?;
        let new_columns = column_names(ctx, "output").await?;
        let common: Vec<String> = old_columns
            .iter()
            .filter(|c| new_columns.contains(c))
            .cloned()
            .collect();
        let compared: Vec<&String> = common.iter().filter(|c| !spec.key.contains(c)).collect();
        let join = spec
            .key
            .iter()
            .map(|k| format!("o.{0} = n.{0}", ident(k)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let differs = if compared.is_empty() {
            "FALSE".to_string()
        } else {
            compared
                .iter()
                .map(|c| format!("(o.{0} IS DISTINCT FROM n.{0})", ident(c)))
                .collect::<Vec<_>>()
                .join(" OR ")
        };
        let keys = spec.partitions.columns().len();
        let mut select = spec
            .partitions
            .select(|c| format!("COALESCE(n.{0}, o.{0})", ident(c)));
        select.push(
        "CASE WHEN o.__lf_o IS NULL THEN 0 WHEN n.__lf_n IS NULL THEN 1 ELSE 2 END AS __lf_kind"
            .to_string(),
    );
        for c in &common {
            select.push(format!(
                "o.{} AS {}",
                ident(c),
                ident(&format!("__lf_old_{c}"))
            ));
        }
        for c in &common {
            select.push(format!(
                "n.{} AS {}",
                ident(c),
                ident(&format!("__lf_new_{c}"))
            ));
        }
        let sql = format!(
            "SELECT {} FROM (SELECT *, TRUE AS __lf_o FROM previous) o \
         FULL OUTER JOIN (SELECT *, TRUE AS __lf_n FROM output) n ON {join} \
         WHERE o.__lf_o IS NULL OR n.__lf_n IS NULL OR ({differs})",
            select.join(", ")
        );
        let mut counts: BTreeMap<String, [u64; 3]> = BTreeMap::new();
        let mut samples = Samples::default();
        let mut stream = run(ctx, &sql, "compare rows by key").await?;
        let width = common.len();
        while let Some(batch) = stream.next().await {
            let batch = batch.query_context(|| "cannot compare rows by key".into())?;
            let parts = spec.partitions.labels(&batch, 0);
            let kinds = batch.column(keys).as_primitive::<Int64Type>();
            let mut formatters: Option<Vec<ArrayFormatter>> = None;
            for (row, part) in parts.into_iter().enumerate() {
                let kind = usize::try_from(kinds.value(row)).unwrap_or(2).min(2);
                counts.entry(part.clone()).or_default()[kind] += 1;
                let bucket = match kind {
                    0 => &mut samples.added,
                    1 => &mut samples.removed,
                    _ => &mut samples.changed,
                };
                if bucket.len() >= spec.sample {
                    continue;
                }
                let formatters = match &mut formatters {
                    Some(f) => f,
                    None => formatters.insert(formatters_for(&batch)?),
                };
                let cell = |column: usize| -> Value {
                    if batch.column(column).is_null(row) {
                        Value::Null
                    } else {
                        Value::String(formatters[column].value(row).to_string())
                    }
                };
                let sample = match kind {
                    0 | 1 => {
                        let offset = if kind == 0 {
                            keys + 1 + width
                        } else {
                            keys + 1
                        };
                        let mut values = Map::new();
                        for (i, c) in common.iter().enumerate() {
                            values.insert(c.clone(), cell(offset + i));
                        }
                        json!({"partition": part, "row": values})
                    }
                    _ => {
                        let mut key = Map::new();
                        let mut old = Map::new();
                        let mut new = Map::new();
                        for (i, c) in common.iter().enumerate() {
                            let (o, n) = (cell(keys + 1 + i), cell(keys + 1 + width + i));
                            if spec.key.contains(c) {
                                key.insert(c.clone(), n);
                            } else if o != n {
                                old.insert(c.clone(), o);
                                new.insert(c.clone(), n);
                            }
                        }
                        json!({"partition": part, "key": key, "old": old, "new": new})
                    }
                };
                bucket.push(sample);
            }
        }
        Ok(RowDiff { counts, samples })
    }

    use std::collections::BTreeSet;
    use std::sync::Arc;

    use deltalake::arrow::array::{
        ArrayRef, Float64Array, Int64Array, ListArray, StringArray, StructArray,
    };
    use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema};
    use deltalake::datafusion::datasource::MemTable;

    use crate::spec::PartitionKey;

    /// A row: partition, key, a float, a text, a struct, a list.
    type Row = (
        Option<&'static str>,
        Option<i64>,
        Option<f64>,
        Option<&'static str>,
        Option<(i64, &'static str)>,
        Option<Vec<i64>>,
    );

    fn batch(rows: &[Row]) -> RecordBatch {
        let struct_fields = Fields::from(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("t", DataType::Utf8, true),
        ]);
        let item = Arc::new(Field::new("item", DataType::Int64, true));
        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Utf8, true),
            Field::new("id", DataType::Int64, true),
            Field::new("x", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("st", DataType::Struct(struct_fields.clone()), true),
            Field::new("l", DataType::List(Arc::clone(&item)), true),
        ]));
        let st = StructArray::new(
            struct_fields,
            vec![
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.4.map(|v| v.0)))) as ArrayRef,
                Arc::new(StringArray::from_iter(
                    rows.iter().map(|r| r.4.map(|v| v.1)),
                )),
            ],
            Some(rows.iter().map(|r| r.4.is_some()).collect()),
        );
        let l = ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().map(|r| {
            r.5.as_ref()
                .map(|v| v.iter().map(|x| Some(*x)).collect::<Vec<_>>())
        }));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
                Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
                Arc::new(st),
                Arc::new(l),
            ],
        )
        .expect("batch")
    }

    /// SplitMix64: the same rows every time.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn pick<T: Copy>(&mut self, items: &[T]) -> T {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    /// Old rows, and new rows that drop, add, change and move some of them; NULL keys, repeated
    /// keys, NaN, -0.0 and NULLs in every column, nested values.
    fn sides() -> (Vec<Row>, Vec<Row>) {
        let mut rng = Rng(7);
        let parts = [Some("a"), Some("b"), Some("c"), None];
        let floats = [Some(0.0), Some(-0.0), Some(1.5), Some(f64::NAN), None];
        let texts = [Some("x"), Some("y"), Some(""), None];
        let structs = [Some((1, "p")), Some((1, "q")), Some((2, "p")), None];
        let lists: [Option<&[i64]>; 4] = [Some(&[1, 2]), Some(&[2, 1]), Some(&[]), None];
        let row = |rng: &mut Rng, id: Option<i64>| -> Row {
            (
                rng.pick(&parts),
                id,
                rng.pick(&floats),
                rng.pick(&texts),
                rng.pick(&structs),
                rng.pick(&lists).map(<[i64]>::to_vec),
            )
        };
        let mut old = Vec::new();
        for i in 0..400 {
            let id = match i % 50 {
                0 => None,
                1 => Some(7), // repeated
                _ => Some(i),
            };
            old.push(row(&mut rng, id));
        }
        let mut new = Vec::new();
        for r in &old {
            match rng.next() % 10 {
                0 => {}                                                             // removed
                1 | 2 => new.push(row(&mut rng, r.1)), // changed (or not, by chance)
                3 => new.push((rng.pick(&parts), r.1, r.2, r.3, r.4, r.5.clone())), // moved
                _ => new.push(r.clone()),              // kept
            }
        }
        for i in 400..440 {
            new.push(row(&mut rng, if i % 13 == 0 { None } else { Some(i) }));
        }
        (old, new)
    }

    async fn session(old: &[Row], new: &[Row]) -> SessionContext {
        let ctx = SessionContext::new();
        for (name, rows) in [("previous", old), ("output", new)] {
            // Two partitions, so that the merge reads each side with two tasks.
            let batch = batch(rows);
            let half = batch.num_rows() / 2;
            let parts = vec![
                vec![batch.slice(0, half)],
                vec![batch.slice(half, batch.num_rows() - half)],
            ];
            let table = MemTable::try_new(batch.schema(), parts).expect("memtable");
            ctx.register_table(name, Arc::new(table)).expect("register");
        }
        lakefill_table::rowhash::register_hash_functions(&ctx);
        ctx
    }

    /// The new side as a run's writers hash it while staging `rows`: one partition at a time,
    /// in two finished attempts (batches 0 and 1), after an attempt that failed midway with
    /// `junk` rows (which must not count); in memory, or `spilled` to files.
    fn capture_of(
        ctx: &SessionContext,
        rows: &[Row],
        junk: &[Row],
        key: &[String],
        spilled: bool,
    ) -> Arc<crate::keymerge::Capture> {
        use crate::keymerge::{Capture, CaptureWriter};
        use deltalake::arrow::compute::take;
        let schema = batch(rows).schema();
        let disk = Arc::clone(&ctx.runtime_env().disk_manager);
        let capture = Capture::new(disk, &schema, key, &["d".to_string()], 5)
            .expect("a hashable key")
            .with_memory_rows(if spilled { 0 } else { usize::MAX });
        let capture = Arc::new(capture);
        let add = |writer: &mut CaptureWriter, rows: &[Row]| {
            let batch = batch(rows);
            let parts = batch.column(0).as_string::<i32>();
            let mut groups: BTreeMap<Option<&str>, Vec<u32>> = BTreeMap::new();
            for row in 0..batch.num_rows() {
                let part = parts.is_valid(row).then(|| parts.value(row));
                groups.entry(part).or_default().push(row as u32);
            }
            for (part, indices) in groups {
                let indices = deltalake::arrow::array::UInt32Array::from(indices);
                let columns: Vec<ArrayRef> = batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &indices, None).expect("take"))
                    .collect();
                writer.add(
                    |name| Some(Arc::clone(&columns[schema.index_of(name).ok()?])),
                    |_| None,
                    (indices.len(), None),
                    |_| Some(vec![ScalarValue::Utf8(part.map(str::to_string))]),
                );
            }
        };
        let mut failed = capture.writer();
        add(&mut failed, junk);
        drop(failed);
        let half = rows.len() / 2;
        for (batch, rows) in [(0, &rows[..half]), (1, &rows[half..])] {
            let mut writer = capture.writer();
            add(&mut writer, rows);
            writer.finish(batch, std::iter::once(format!("part-{batch}.parquet")));
        }
        capture
    }

    #[tokio::test]
    async fn hashed_rows_give_exactly_the_whole_row_join() {
        let (old, new) = sides();
        let ctx = session(&old, &new).await;
        for key in [vec!["id"], vec!["id", "s"], vec!["d", "id"]] {
            let spec = CompareSpec {
                partitions: PartitionKey::Column("d".into()),
                key: key.iter().map(|k| k.to_string()).collect(),
                measures: Vec::new(),
                sample: 5,
                checksum_columns: None,
                edges: None,
                changes: None,
            };
            let hashed = row_diff(&ctx, &spec, "previous", "output")
                .await
                .expect("hashed");
            let reference = full_join_diff(&ctx, &spec).await.expect("reference");
            assert_eq!(hashed.counts, reference.counts, "key {key:?}");
            let total = |d: &RowDiff, kind: usize| d.counts.values().map(|c| c[kind]).sum::<u64>();
            assert!(total(&hashed, ADDED) > 0 && total(&hashed, REMOVED) > 0);
            assert!(total(&hashed, CHANGED) > 0, "key {key:?}");
            // Samples are read back whole: every changed one names what changed.
            assert_eq!(hashed.samples.changed.len(), 5);
            for sample in &hashed.samples.changed {
                assert_ne!(sample["old"], sample["new"], "{sample}");
                assert!(
                    !sample["key"].as_object().expect("key").is_empty(),
                    "{sample}"
                );
            }
            for sample in hashed.samples.added.iter().chain(&hashed.samples.removed) {
                assert_eq!(sample["row"].as_object().expect("row").len(), 6, "{sample}");
            }
        }
    }

    /// The change data feed from `old` to `new` (in a session of their own), each row as its
    /// JSON, sorted.
    async fn feed_rows(
        (old, new): (&[Row], &[Row]),
        key: &[String],
        found: Option<Arc<crate::keymerge::FoundChanges>>,
    ) -> Vec<String> {
        let ctx = session(old, new).await;
        let feed = crate::feed::change_rows(&ctx, "previous", "output", key, (None, found))
            .await
            .expect("feed");
        let batches = feed.rows.collect().await.expect("rows");
        let mut rows: Vec<String> = batches
            .iter()
            .flat_map(|b| crate::rows::batch_to_json(b, usize::MAX).expect("json"))
            .map(|row| row.to_string())
            .collect();
        rows.sort();
        rows
    }

    /// The rows the merge counted per partition, side and change ([`FoundChanges::partition_rows`])
    /// are the rows of each kind the reference feed has there, and every row of the side there,
    /// rows with a NULL key column left out (the merge pairs none of them).
    fn assert_partition_rows(
        found: &crate::keymerge::FoundChanges,
        (old, new): (&[Row], &[Row]),
        key: &[String],
        reference: &[String],
        what: &str,
    ) {
        use crate::keymerge::SideRows;
        use std::collections::BTreeMap;
        let keyed = |row: &Row| {
            key.iter().all(|k| match k.as_str() {
                "d" => row.0.is_some(),
                "id" => row.1.is_some(),
                "s" => row.3.is_some(),
                other => panic!("no column {other}"),
            })
        };
        let mut expected: BTreeMap<Option<String>, [SideRows; 2]> = BTreeMap::new();
        for (side, rows) in [(0, old), (1, new)] {
            for row in rows.iter().filter(|r| keyed(r)) {
                expected.entry(row.0.map(str::to_string)).or_default()[side].rows += 1;
            }
        }
        for line in reference {
            let row: serde_json::Value = serde_json::from_str(line).expect("json");
            let null_key = key.iter().any(|k| row[k.as_str()].is_null());
            if null_key {
                continue;
            }
            let d = row["d"].as_str().map(str::to_string);
            let sides = expected.entry(d).or_default();
            match row["_change_type"].as_str().expect("a change type") {
                "update_preimage" => sides[0].update += 1,
                "delete" => sides[0].delete += 1,
                "update_postimage" => sides[1].update += 1,
                "insert" => sides[1].insert += 1,
                other => panic!("{other}"),
            }
        }
        let counted = found.every_partition_rows();
        assert_eq!(counted.len(), expected.len(), "{what}: {counted:?}");
        for (d, sides) in &expected {
            // A partition's label is its value (`(null)` for none).
            let label = d
                .clone()
                .unwrap_or_else(|| lakefill_table::partition::NULL_LABEL.into());
            assert_eq!(
                found.partition_rows(&label),
                Some(*sides),
                "{what}: partition {label}"
            );
        }
    }

    #[tokio::test]
    async fn the_changes_the_merge_records_give_the_feed_that_grouping_both_sides_gives() {
        use crate::keymerge::{KeyChanges, merge_diff};
        use deltalake::datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
        // Changed, removed, added and moved rows, a repeated key, NULL keys, floats, structs;
        // and keys repeated on both sides: 900's rows change as many as they were, 901's come
        // back the same in another order, 902's move between partitions.
        let (mut old, mut new) = sides();
        let row = |d: &'static str, id: i64, s: &'static str| -> Row {
            (Some(d), Some(id), None, Some(s), None, None)
        };
        old.extend([row("a", 900, "p"), row("a", 900, "q")]);
        new.extend([row("a", 900, "p"), row("a", 900, "r")]);
        old.extend([row("a", 901, "p"), row("b", 901, "q")]);
        new.extend([row("b", 901, "q"), row("a", 901, "p")]);
        old.extend([row("a", 902, "p"), row("a", 902, "q")]);
        new.extend([row("a", 902, "p"), row("b", 902, "q")]);
        let ctx = session(&old, &new).await;
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        // A comparison by `key` whose merge records its changes in `changes`.
        let spec_of = |key: Vec<String>, changes: &Arc<KeyChanges>| CompareSpec {
            partitions: PartitionKey::Column("d".into()),
            key,
            measures: Vec::new(),
            sample: 5,
            checksum_columns: None,
            edges: None,
            changes: Some(Arc::clone(changes)),
        };
        for key in [vec!["id"], vec!["id", "s"], vec!["d", "id"]] {
            let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
            let reference = feed_rows((&old, &new), &key, None).await;
            assert!(reference.len() > 100, "key {key:?}: {}", reference.len());
            // In memory, through buckets on disk, and with the new side as staging hashed it.
            for (captured, in_files, expected_rows) in [
                (false, false, 0),
                (false, false, 1 << 30),
                (true, false, 0),
                (true, true, 1 << 25),
            ] {
                let changes = KeyChanges::new(&pool, usize::MAX);
                let spec = spec_of(key.clone(), &changes);
                let capture = captured.then(|| capture_of(&ctx, &new, &old, &key, in_files));
                changes.start(None);
                merge_diff(
                    &ctx,
                    &spec,
                    "previous",
                    "output",
                    None,
                    expected_rows,
                    capture.as_ref().map(|c| (c.as_ref(), None)),
                )
                .await
                .expect("merge")
                .expect("hashable");
                let found = changes.found().expect("every changed key recorded");
                assert!(found.null_keys(), "the sides have NULL keys");
                let what = format!("key {key:?} captured {captured} files {in_files}");
                assert_partition_rows(&found, (&old, &new), &key, &reference, &what);
                assert_eq!(
                    feed_rows((&old, &new), &key, Some(found)).await,
                    reference,
                    "{what}"
                );
            }
        }
        // A side whose column types differ is not recorded (the feed compares it cast).
        let changes = KeyChanges::new(&pool, usize::MAX);
        let recast = SessionContext::new();
        lakefill_table::rowhash::register_hash_functions(&recast);
        let previous = ctx.table("previous").await.expect("previous");
        let output = ctx
            .sql("SELECT d, id, CAST(x AS FLOAT) AS x, s, st, l FROM output")
            .await
            .expect("recast");
        recast
            .register_table("previous", previous.into_view())
            .expect("register");
        recast
            .register_table("output", output.into_view())
            .expect("register");
        let spec = spec_of(vec!["id".into()], &changes);
        changes.start(None);
        merge_diff(&recast, &spec, "previous", "output", None, 0, None)
            .await
            .expect("merge")
            .expect("hashable");
        assert!(changes.found().is_none(), "a recast side is not recorded");
    }

    #[tokio::test]
    async fn the_merge_of_key_hashes_gives_exactly_the_whole_row_join_and_counts_keys() {
        use crate::keymerge::{KeyFacts, merge_diff};
        let (old, new) = sides();
        let ctx = session(&old, &new).await;
        for key in [vec!["id"], vec!["id", "s"], vec!["d", "id"]] {
            let spec = CompareSpec {
                partitions: PartitionKey::Column("d".into()),
                key: key.iter().map(|k| k.to_string()).collect(),
                measures: Vec::new(),
                sample: 5,
                checksum_columns: None,
                edges: None,
                changes: None,
            };
            // In memory, and through buckets on disk (as for a side of a billion rows).
            let (merged, facts) = merge_diff(&ctx, &spec, "previous", "output", None, 0, None)
                .await
                .expect("merge")
                .expect("an integer and text key is hashable");
            let (spilled, spilled_facts) =
                merge_diff(&ctx, &spec, "previous", "output", None, 1 << 30, None)
                    .await
                    .expect("merge")
                    .expect("hashable");
            assert_eq!(spilled.counts, merged.counts);
            assert_eq!(spilled_facts, facts);
            // The new side as staging hashed it, in memory or in spill files, merged in memory
            // or in buckets: the same diff, and the same key facts.
            for (in_files, expected_rows) in
                [(false, 0), (true, 0), (false, 1 << 25), (true, 1 << 25)]
            {
                let capture = capture_of(&ctx, &new, &old, &spec.key, in_files);
                let (captured, captured_facts) = merge_diff(
                    &ctx,
                    &spec,
                    "previous",
                    "output",
                    None,
                    expected_rows,
                    Some((&capture, None)),
                )
                .await
                .expect("merge")
                .expect("hashable");
                assert!(capture.sealed(), "the capture was used");
                assert_eq!(
                    captured.counts, merged.counts,
                    "key {key:?} files {in_files}"
                );
                assert_eq!(captured_facts, facts, "key {key:?} files {in_files}");
                for (a, b) in [
                    (&captured.samples.added, &merged.samples.added),
                    (&captured.samples.removed, &merged.samples.removed),
                    (&captured.samples.changed, &merged.samples.changed),
                ] {
                    assert_eq!(a.len(), b.len(), "key {key:?}");
                }
                for sample in &captured.samples.changed {
                    assert_ne!(sample["old"], sample["new"], "{sample}");
                }
            }
            let reference = full_join_diff(&ctx, &spec).await.expect("reference");
            assert_eq!(merged.counts, reference.counts, "key {key:?}");
            assert_eq!(merged.samples.changed.len(), 5, "key {key:?}");
            for sample in &merged.samples.changed {
                assert_ne!(sample["old"], sample["new"], "{sample}");
                assert!(
                    !sample["key"].as_object().expect("key").is_empty(),
                    "{sample}"
                );
            }
            for sample in merged.samples.added.iter().chain(&merged.samples.removed) {
                assert_eq!(sample["row"].as_object().expect("row").len(), 6, "{sample}");
            }
            // The key facts, against plain SQL over the new rows.
            let columns = key.join(", ");
            let any_null = key
                .iter()
                .map(|k| format!("{k} IS NULL"))
                .collect::<Vec<_>>()
                .join(" OR ");
            let count = |sql: String| {
                let ctx = &ctx;
                async move {
                    let batches = ctx
                        .sql(&sql)
                        .await
                        .expect("sql")
                        .collect()
                        .await
                        .expect("rows");
                    batches[0].column(0).as_primitive::<Int64Type>().value(0) as u64
                }
            };
            let expected = KeyFacts {
                duplicate_keys: count(format!(
                    "SELECT COUNT(*) FROM (SELECT {columns} FROM output WHERE NOT ({any_null}) \
                     GROUP BY {columns} HAVING COUNT(*) > 1)"
                ))
                .await,
                null_rows: count(format!("SELECT COUNT(*) FROM output WHERE {any_null}")).await,
            };
            assert_eq!(facts, expected, "key {key:?}");
            assert!(expected.duplicate_keys > 0 && expected.null_rows > 0);
        }
        // A key of every column: nothing else to hash, rows differ only by being there or not.
        for (name, table) in [("narrow_old", "previous"), ("narrow_new", "output")] {
            let view = ctx
                .sql(&format!("SELECT d, id FROM {table}"))
                .await
                .expect("sql")
                .into_view();
            ctx.register_table(name, view).expect("register");
        }
        let whole_key = CompareSpec {
            partitions: PartitionKey::Column("d".into()),
            key: vec!["d".into(), "id".into()],
            measures: Vec::new(),
            sample: 5,
            checksum_columns: None,
            edges: None,
            changes: None,
        };
        let (merged, _) = merge_diff(&ctx, &whole_key, "narrow_old", "narrow_new", None, 0, None)
            .await
            .expect("merge")
            .expect("hashable");
        let joined = row_diff(&ctx, &whole_key, "narrow_old", "narrow_new")
            .await
            .expect("join");
        assert_eq!(merged.counts, joined.counts);
        assert!(merged.counts.values().all(|c| c[CHANGED] == 0));
        // Float keys, and keys whose types differ between the sides, are left to the join.
        let spec = |key: &str| CompareSpec {
            partitions: PartitionKey::Column("d".into()),
            key: vec![key.to_string()],
            measures: Vec::new(),
            sample: 5,
            checksum_columns: None,
            edges: None,
            changes: None,
        };
        assert!(
            merge_diff(&ctx, &spec("x"), "previous", "output", None, 0, None)
                .await
                .expect("x")
                .is_none()
        );
        ctx.register_table(
            "recast",
            ctx.sql("SELECT CAST(id AS INT) AS id, d, x, s, st, l FROM output")
                .await
                .expect("sql")
                .into_view(),
        )
        .expect("register");
        assert!(
            merge_diff(&ctx, &spec("id"), "previous", "recast", None, 0, None)
                .await
                .expect("id")
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_merge_diffs_only_flagged_partitions_but_counts_every_new_key() {
        use crate::keymerge::merge_diff;
        use deltalake::datafusion::prelude::col;
        let (old, new) = sides();
        let ctx = session(&old, &new).await;
        let spec = CompareSpec {
            partitions: PartitionKey::Column("d".into()),
            key: vec!["id".into()],
            measures: Vec::new(),
            sample: 3,
            checksum_columns: None,
            edges: None,
            changes: None,
        };
        let only_a = col("d").eq(lit("a"));
        let (merged, facts) = merge_diff(
            &ctx,
            &spec,
            "previous",
            "output",
            Some(only_a.clone()),
            0,
            None,
        )
        .await
        .expect("merge")
        .expect("hashable");
        // The keys of every new row count, differing partition or not.
        let (_, all_facts) = merge_diff(&ctx, &spec, "previous", "output", None, 0, None)
            .await
            .expect("merge")
            .expect("hashable");
        assert_eq!(facts, all_facts);
        assert!(facts.duplicate_keys > 0 && facts.null_rows > 0);
        // With the new side hashed while staging, the flag comes from the labels.
        let only_a_label: BTreeSet<String> = ["a".to_string()].into();
        for in_files in [false, true] {
            let capture = capture_of(&ctx, &new, &old, &spec.key, in_files);
            let (captured, captured_facts) = merge_diff(
                &ctx,
                &spec,
                "previous",
                "output",
                Some(only_a.clone()),
                0,
                Some((&capture, Some(&only_a_label))),
            )
            .await
            .expect("merge")
            .expect("hashable");
            assert!(capture.sealed());
            assert_eq!(captured.counts, merged.counts);
            assert_eq!(captured_facts, facts);
        }
        // The reference: the join over the views of partition `a` alone.
        for table in ["previous", "output"] {
            let view = ctx
                .table(table)
                .await
                .expect("table")
                .filter(only_a.clone())
                .expect("filter");
            ctx.register_table(format!("a_{table}").as_str(), view.into_view())
                .expect("register");
        }
        let reference = row_diff(&ctx, &spec, "a_previous", "a_output")
            .await
            .expect("reference");
        assert_eq!(merged.counts, reference.counts);
        assert!(!merged.counts.is_empty());
    }
}
