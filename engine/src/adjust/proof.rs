//! The proof of an adjustments run, before it publishes: the old net rows plus the adjustments
//! are the new rows, per partition and key.

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::{DataType, Decimal128Type, Int64Type};
use deltalake::datafusion::prelude::SessionContext;
use serde_json::json;

use lakefill_table::adjustments::{KIND_COLUMN, REVERSAL};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::rowhash::check_hash_sql;
use lakefill_table::sqltext::{cast_sql, ident};
use lakefill_validate::CheckResult;
/// The name of the check that proves the adjustments.
const CONSERVE: &str = "adjustments conserve";

/// Proves the adjustments: per partition, the old net rows less the rows the reversals take
/// back (their measures negated again) plus the corrections are the new rows, as multisets of
/// whole rows. Then, per key, the old rows plus the adjustments give the new rows in rows (a
/// reversal counts -1) and in every measure, and the net rows after the publish are the new
/// rows. `previous`, `adjustments` and `output` are registered views; `schema` is the staged
/// files'.
///
/// The multisets are compared by the count and the exact sum of a row hash independent of the
/// one the adjustments were found with (`lakefill_check_hash`), in one streaming pass over each
/// side with a group per partition. Only when a partition differs are the sums per key
/// computed (a grouping of every row), to show which keys.
pub(crate) async fn conservation_check(
    ctx: &SessionContext,
    schema: &Schema,
    partition_columns: &[String],
    key: &[String],
    measures: &[String],
    sample: usize,
) -> Result<CheckResult> {
    let differing = differing_partitions(ctx, schema, partition_columns, measures, sample).await?;
    if differing.is_empty() {
        return Ok(CheckResult::new(CONSERVE, Vec::new(), Vec::new()));
    }
    let mut group = partition_columns.to_vec();
    for column in key {
        if !group.contains(column) {
            group.push(column.clone());
        }
    }
    let by_key = conservation_by_key(ctx, schema, &group, measures, sample).await?;
    Ok(if by_key.passed {
        // Every key adds up, yet the rows are not the same: reversals that are not copies of
        // old rows (the net rows after the publish would not be the new rows).
        CheckResult::new(CONSERVE, differing, Vec::new())
    } else {
        by_key
    })
}

/// The partitions where the old net rows less the reversed rows plus the corrections are not
/// the new rows (see [`conservation_check`]), at most `sample` of them and a count of the rest.
async fn differing_partitions(
    ctx: &SessionContext,
    schema: &Schema,
    partition_columns: &[String],
    measures: &[String],
    sample: usize,
) -> Result<Vec<serde_json::Value>> {
    let values: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| !lakefill_table::adjustments::is_lineage(f.name()))
        .collect();
    // Every side's rows in the staged files' types, hashed: the reversals with their measures
    // negated back (the old rows they take back).
    let side = |table: &str, filter: &str, unnegate: bool| {
        let row: Vec<String> = values
            .iter()
            .map(|field| {
                let column = ident(field.name());
                let value = if unnegate && measures.contains(field.name()) {
                    format!("-({column})")
                } else {
                    column
                };
                format!(
                    "{} AS {}",
                    cast_sql(&value, field.data_type()),
                    ident(field.name())
                )
            })
            .collect();
        let names: Vec<String> = values.iter().map(|f| f.name().clone()).collect();
        let mut select: Vec<String> = partition_columns.iter().map(|c| ident(c)).collect();
        select.push(format!("{} AS __lf_h", check_hash_sql(&names)));
        format!(
            "SELECT {} FROM (SELECT {} FROM {table}{filter})",
            select.join(", "),
            row.join(", ")
        )
    };
    let kind = ident(KIND_COLUMN);
    let partition: Vec<String> = partition_columns.iter().map(|c| ident(c)).collect();
    // Each side apart (a union of sides would mix the columns' metadata, which a column-mapped
    // table's rows carry on one side only): per partition, rows and the exact sum of hashes.
    let mut balance: std::collections::BTreeMap<Vec<Option<String>>, (i64, i128)> =
        std::collections::BTreeMap::new();
    for (table, weight, filter, unnegate) in [
        ("previous", 1, String::new(), false),
        (
            "adjustments",
            -1,
            format!(" WHERE {kind} = '{REVERSAL}'"),
            true,
        ),
        (
            "adjustments",
            1,
            format!(" WHERE {kind} IS DISTINCT FROM '{REVERSAL}'"),
            false,
        ),
        ("output", -1, String::new(), false),
    ] {
        let shown: Vec<String> = partition
            .iter()
            .map(|c| format!("CAST({c} AS VARCHAR) AS {c}"))
            .chain([
                "COUNT(*) AS __lf_rows".to_string(),
                "SUM(CAST(__lf_h AS DECIMAL(38, 0))) AS __lf_sum".to_string(),
            ])
            .collect();
        let group_by = if partition.is_empty() {
            String::new()
        } else {
            format!(" GROUP BY {}", partition.join(", "))
        };
        let sql = format!(
            "SELECT {} FROM ({}){group_by}",
            shown.join(", "),
            side(table, &filter, unnegate)
        );
        tracing::debug!(%sql, "summing a side of the adjustments' proof");
        let context = || "cannot check that the adjustments conserve the new rows".to_string();
        let batches = ctx
            .sql(&sql)
            .await
            .query_context(context)?
            .collect()
            .await
            .query_context(context)?;
        for batch in &batches {
            let rows = batch.column(partition.len()).as_primitive::<Int64Type>();
            let sums = batch
                .column(partition.len() + 1)
                .as_primitive::<Decimal128Type>();
            let texts = (0..partition.len())
                .map(|i| deltalake::arrow::compute::cast(batch.column(i), &DataType::Utf8))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| lakefill_table::error::Error::Internal(e.to_string()))?;
            for row in 0..batch.num_rows() {
                let values = texts
                    .iter()
                    .map(|column| {
                        let column = column.as_string::<i32>();
                        column.is_valid(row).then(|| column.value(row).to_string())
                    })
                    .collect();
                let entry = balance.entry(values).or_default();
                entry.0 += weight * rows.value(row);
                entry.1 += i128::from(weight)
                    * if sums.is_valid(row) {
                        sums.value(row)
                    } else {
                        0
                    };
            }
        }
    }
    let mut differing = Vec::new();
    let mut more = 0;
    for (values, (rows, sum)) in balance {
        if rows == 0 && sum == 0 {
            continue;
        }
        if differing.len() >= sample.max(1) {
            more += 1;
            continue;
        }
        let mut object = serde_json::Map::new();
        for (column, value) in partition_columns.iter().zip(values) {
            object.insert(column.clone(), json!(value));
        }
        object.insert("rows_not_accounted_for".into(), json!(rows));
        object.insert("values_differ".into(), json!(sum != 0));
        differing.push(serde_json::Value::Object(object));
    }
    if more > 0 {
        differing.push(json!({"more_partitions": more}));
    }
    Ok(differing)
}

/// The rows of `batches` as JSON objects of their values as text: at most `sample` (at least
/// one), then a count of the rest.
fn sampled(batches: &[RecordBatch], sample: usize) -> Vec<serde_json::Value> {
    let mut failures = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            if failures.len() >= sample.max(1) {
                break;
            }
            let mut object = serde_json::Map::new();
            for (i, field) in batch.schema().fields().iter().enumerate() {
                let value =
                    deltalake::arrow::util::display::array_value_to_string(batch.column(i), row)
                        .unwrap_or_default();
                object.insert(field.name().clone(), json!(value));
            }
            failures.push(serde_json::Value::Object(object));
        }
    }
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    if total > failures.len() {
        failures.push(json!({"more": total - failures.len()}));
    }
    failures
}

/// Per partition and key, the old net rows plus the adjustments against the new rows, in rows
/// (a reversal counts -1) and in every measure (exactly for integers and decimals, to a relative
/// 1e-9 for floats).
async fn conservation_by_key(
    ctx: &SessionContext,
    schema: &Schema,
    group: &[String],
    measures: &[String],
    sample: usize,
) -> Result<CheckResult> {
    let group_list: Vec<String> = group.iter().map(|c| ident(c)).collect();
    let group_list = group_list.join(", ");
    let float = |m: &String| {
        schema
            .field_with_name(m)
            .is_ok_and(|f| f.data_type().is_floating())
    };
    let sums = |table: &str, weight: &str| {
        let mut select = vec![group_list.clone(), format!("SUM({weight}) AS __lf_rows")];
        for (i, m) in measures.iter().enumerate() {
            // Integers and decimals add up exactly as decimals; floats as doubles.
            let as_type = if float(m) {
                "DOUBLE"
            } else {
                "DECIMAL(38, 10)"
            };
            select.push(format!("SUM(CAST({} AS {as_type})) AS __lf_m{i}", ident(m)));
        }
        format!(
            "SELECT {} FROM {table} GROUP BY {group_list}",
            select.join(", ")
        )
    };
    let weight = format!(
        "CASE WHEN {} = '{REVERSAL}' THEN -1 ELSE 1 END",
        ident(KIND_COLUMN)
    );
    let lhs_rows = format!(
        "SELECT {group_list}, 1 AS __lf_w, {} FROM previous UNION ALL SELECT {group_list}, {weight} AS __lf_w, {} FROM adjustments",
        measures
            .iter()
            .map(|m| ident(m))
            .collect::<Vec<_>>()
            .join(", "),
        measures
            .iter()
            .map(|m| ident(m))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let lhs = sums(&format!("({lhs_rows})"), "__lf_w");
    let rhs = sums("output", "1");
    let on: Vec<String> = group
        .iter()
        .map(|c| format!("(l.{0} IS NOT DISTINCT FROM r.{0})", ident(c)))
        .collect();
    let mut differs = vec!["COALESCE(l.__lf_rows, 0) <> COALESCE(r.__lf_rows, 0)".to_string()];
    for (i, m) in measures.iter().enumerate() {
        differs.push(if float(m) {
            format!(
                "abs(COALESCE(l.__lf_m{i}, 0) - COALESCE(r.__lf_m{i}, 0)) > 1e-9 * greatest(abs(COALESCE(l.__lf_m{i}, 0)), abs(COALESCE(r.__lf_m{i}, 0)), 1)"
            )
        } else {
            format!("COALESCE(l.__lf_m{i}, 0) <> COALESCE(r.__lf_m{i}, 0)")
        });
    }
    let shown: Vec<String> = group
        .iter()
        .map(|c| format!("CAST(COALESCE(l.{0}, r.{0}) AS VARCHAR) AS {0}", ident(c)))
        .chain([
            "CAST(COALESCE(l.__lf_rows, 0) AS BIGINT) AS old_plus_adjustment_rows".to_string(),
            "CAST(COALESCE(r.__lf_rows, 0) AS BIGINT) AS new_rows".to_string(),
        ])
        .collect();
    let sql = format!(
        "SELECT {} FROM ({lhs}) l FULL OUTER JOIN ({rhs}) r ON {} WHERE {}",
        shown.join(", "),
        on.join(" AND "),
        differs.join(" OR ")
    );
    tracing::debug!(%sql, "checking that the adjustments conserve the new rows");
    let df = ctx
        .sql(&sql)
        .await
        .query_context(|| "cannot check that the adjustments conserve the new rows".into())?;
    let batches = df
        .collect()
        .await
        .query_context(|| "cannot check that the adjustments conserve the new rows".into())?;
    let mut failures = sampled(&batches, sample);
    if let Some(serde_json::Value::Object(more)) = failures.last_mut()
        && let Some(count) = more.remove("more")
    {
        more.insert("more_keys".into(), count);
    }
    Ok(CheckResult::new(CONSERVE, failures, Vec::new()))
}

/// The name of the check that balances the table's stored rows against the new rows.
const BALANCE: &str = "ledger balances";

/// The buckets of groups per partition in [`balance_check`]: a wrong net row shows in its
/// bucket; two wrong ones hide each other only when they share a bucket and their differences
/// cancel.
const BUCKETS: u64 = 1021;

/// How a measure is summed in [`balance_check`].
#[derive(Clone, Copy)]
enum Summed {
    /// Exactly, as a decimal of this scale (integers 0).
    Exact(i8),
    /// As a double, with the sum of absolute values for the tolerance.
    Float,
}

/// A partition's values as text (NULL as `None`).
type PartitionValues = Vec<Option<String>>;

/// Per partition and bucket, each measure's [`Balance`].
type Balances = std::collections::BTreeMap<(PartitionValues, u64), Vec<Balance>>;

/// A bucket's sums of one measure, over the sides with their weights.
#[derive(Default, Clone, Copy)]
struct Balance {
    exact: i128,
    float: f64,
    absolute: f64,
}

/// Checks the old net rows the adjustments were derived from, without reading them: per
/// partition, the measures of the table's rows as stored in the range (its rows at the
/// read version, with the companion's, registered as `__lf_ledger`; earlier reversals carry their
/// measures negated) plus the
/// adjustments' are the new rows' (`output`), summed over each bucket of groups (rows alike but
/// for the measures and the lineage, spread over [`BUCKETS`] by a hash of their values).
///
/// The proof ([`conservation_check`]) starts from the net rows, as staging did, so it holds
/// whatever they are. This check reads the stored rows with no grouping and no filter of the
/// groups adjustments touch: a net row computed wrong (a group left out, or taken for another)
/// makes its adjustments wrong, and the sums of its bucket differ. It costs one scan of the range
/// and of each side, with a group per bucket. Integers and decimals add up exactly; floats to a
/// relative 1e-9 of the bucket's sum of absolute values.
pub(crate) async fn balance_check(
    ctx: &SessionContext,
    schema: &Schema,
    partition_columns: &[String],
    measures: &[String],
    sample: usize,
) -> Result<CheckResult> {
    let context = || "cannot check that the table's rows balance the new rows".to_string();
    let values: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| !lakefill_table::adjustments::is_lineage(f.name()))
        .collect();
    let group: Vec<String> = values
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !measures.contains(name))
        .collect();
    let summed: Vec<Summed> = measures
        .iter()
        .map(|m| match schema.field_with_name(m).map(|f| f.data_type()) {
            Ok(DataType::Decimal128(_, scale)) => Summed::Exact((*scale).max(0)),
            Ok(t) if t.is_integer() => Summed::Exact(0),
            _ => Summed::Float,
        })
        .collect();
    let partition: Vec<String> = partition_columns.iter().map(|c| ident(c)).collect();
    let mut balance = Balances::new();
    // Each side apart, as in the proof (a union would mix the columns' metadata).
    for (table, weight) in [("__lf_ledger", 1), ("adjustments", 1), ("output", -1)] {
        let present = ctx.table(table).await.query_context(context)?;
        let present = present.schema();
        // Every value in the staged files' types (a column the side lacks is NULL).
        let row: Vec<String> = values
            .iter()
            .map(|field| {
                let value = if present.field_with_unqualified_name(field.name()).is_ok() {
                    ident(field.name())
                } else {
                    "NULL".to_string()
                };
                format!(
                    "{} AS {}",
                    cast_sql(&value, field.data_type()),
                    ident(field.name())
                )
            })
            .collect();
        let mut keyed = partition.clone();
        keyed.push(format!("{} % {BUCKETS} AS __lf_b", check_hash_sql(&group)));
        // The partition values as text once per group, not per row.
        let mut sums: Vec<String> = partition
            .iter()
            .map(|c| format!("CAST({c} AS VARCHAR) AS {c}"))
            .collect();
        sums.push("__lf_b".to_string());
        for (i, (measure, how)) in measures.iter().zip(&summed).enumerate() {
            let measure = ident(measure);
            match how {
                Summed::Exact(scale) => {
                    keyed.push(format!(
                        "CAST({measure} AS DECIMAL(38, {scale})) AS __lf_m{i}"
                    ));
                    sums.push(format!("SUM(__lf_m{i}) AS __lf_m{i}"));
                }
                Summed::Float => {
                    keyed.push(format!("CAST({measure} AS DOUBLE) AS __lf_m{i}"));
                    sums.push(format!("SUM(__lf_m{i}) AS __lf_m{i}"));
                    sums.push(format!("SUM(abs(__lf_m{i})) AS __lf_a{i}"));
                }
            }
        }
        let mut by = partition.clone();
        by.push("__lf_b".to_string());
        let sql = format!(
            "SELECT {} FROM (SELECT {} FROM (SELECT {} FROM {table})) GROUP BY {}",
            sums.join(", "),
            keyed.join(", "),
            row.join(", "),
            by.join(", ")
        );
        tracing::debug!(%sql, "summing a side of the ledger's balance");
        let batches = ctx
            .sql(&sql)
            .await
            .query_context(context)?
            .collect()
            .await
            .query_context(context)?;
        for batch in &batches {
            add_side(batch, partition.len(), &summed, weight, &mut balance)?;
        }
    }
    Ok(CheckResult::new(
        BALANCE,
        unbalanced(balance, partition_columns, measures, &summed, sample),
        Vec::new(),
    ))
}

/// Adds one side's sums per partition and bucket (`batch`: the partition values, the bucket,
/// then each measure's sum, and for floats its sum of absolute values) to `balance`.
fn add_side(
    batch: &RecordBatch,
    partitions: usize,
    summed: &[Summed],
    weight: i8,
    balance: &mut Balances,
) -> Result<()> {
    use deltalake::arrow::compute::cast;
    use deltalake::arrow::datatypes::{Float64Type, UInt64Type};
    let internal = |e: deltalake::arrow::error::ArrowError| {
        lakefill_table::error::Error::Internal(e.to_string())
    };
    let texts = (0..partitions)
        .map(|i| cast(batch.column(i), &DataType::Utf8))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(internal)?;
    let bucket = cast(batch.column(partitions), &DataType::UInt64).map_err(internal)?;
    let bucket = bucket.as_primitive::<UInt64Type>();
    let mut column = partitions + 1;
    let mut sums = Vec::with_capacity(summed.len());
    for how in summed {
        sums.push(match how {
            Summed::Exact(scale) => {
                let sum = cast(batch.column(column), &DataType::Decimal128(38, *scale))
                    .map_err(internal)?;
                column += 1;
                (sum, None)
            }
            Summed::Float => {
                let sum = cast(batch.column(column), &DataType::Float64).map_err(internal)?;
                let absolute =
                    cast(batch.column(column + 1), &DataType::Float64).map_err(internal)?;
                column += 2;
                (sum, Some(absolute))
            }
        });
    }
    for row in 0..batch.num_rows() {
        let values = texts
            .iter()
            .map(|column| {
                let column = column.as_string::<i32>();
                column.is_valid(row).then(|| column.value(row).to_string())
            })
            .collect();
        let entry = balance
            .entry((values, bucket.value(row)))
            .or_insert_with(|| vec![Balance::default(); summed.len()]);
        for (at, (sum, absolute)) in entry.iter_mut().zip(&sums) {
            if !sum.is_valid(row) {
                continue;
            }
            match absolute {
                None => {
                    let exact = sum.as_primitive::<Decimal128Type>().value(row);
                    at.exact += i128::from(weight) * exact;
                }
                Some(absolute) => {
                    at.float += f64::from(weight) * sum.as_primitive::<Float64Type>().value(row);
                    at.absolute += absolute.as_primitive::<Float64Type>().value(row);
                }
            }
        }
    }
    Ok(())
}

/// The partitions and measures whose buckets do not balance in [`balance_check`]: how many
/// buckets, and the difference over them (the stored rows plus the adjustments, less the new
/// rows); at most `sample` of them, then a count of the rest.
fn unbalanced(
    balance: Balances,
    partition_columns: &[String],
    measures: &[String],
    summed: &[Summed],
    sample: usize,
) -> Vec<serde_json::Value> {
    // Per partition and measure: the buckets that differ and their difference.
    let mut off: std::collections::BTreeMap<(PartitionValues, usize), (u64, Balance)> =
        std::collections::BTreeMap::new();
    for ((values, _), sums) in balance {
        for (i, (sum, how)) in sums.iter().zip(summed).enumerate() {
            let differs = match how {
                Summed::Exact(_) => sum.exact != 0,
                Summed::Float => sum.float.abs() > 1e-9 * sum.absolute.max(1.0),
            };
            if differs {
                let entry = off.entry((values.clone(), i)).or_default();
                entry.0 += 1;
                entry.1.exact += sum.exact;
                entry.1.float += sum.float;
            }
        }
    }
    let mut failures = Vec::new();
    let total = off.len();
    for ((values, i), (buckets, difference)) in off.into_iter().take(sample.max(1)) {
        let mut object = serde_json::Map::new();
        for (column, value) in partition_columns.iter().zip(values) {
            object.insert(column.clone(), json!(value));
        }
        object.insert("measure".into(), json!(measures[i]));
        object.insert("buckets_off".into(), json!(buckets));
        let difference = match summed[i] {
            Summed::Exact(scale) => {
                use deltalake::arrow::datatypes::DecimalType as _;
                Decimal128Type::format_decimal(difference.exact, 38, scale)
            }
            Summed::Float => difference.float.to_string(),
        };
        object.insert("stored_plus_adjustments_less_new".into(), json!(difference));
        failures.push(serde_json::Value::Object(object));
    }
    if total > failures.len() {
        failures.push(json!({"more": total - failures.len()}));
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{ArrayRef, Int64Array, StringArray};
    use deltalake::arrow::datatypes::Field;
    use deltalake::datafusion::datasource::MemTable;
    use std::sync::Arc;

    /// (day, id, country, amount, kind)
    type Row = (&'static str, i64, &'static str, i64, Option<&'static str>);

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("day", DataType::Utf8, false),
            Field::new("id", DataType::Int64, false),
            Field::new("country", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("_lakefill_run_id", DataType::Utf8, true),
            Field::new("_lakefill_kind", DataType::Utf8, true),
            Field::new("_lakefill_reason", DataType::Utf8, true),
        ]))
    }

    fn register(ctx: &SessionContext, name: &str, rows: &[Row]) {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(vec![Some("run"); rows.len()])),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.4).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(vec![None::<&str>; rows.len()])),
        ];
        let batch = RecordBatch::try_new(schema(), columns).expect("batch");
        let table = MemTable::try_new(schema(), vec![vec![batch]]).expect("table");
        ctx.register_table(name, Arc::new(table)).expect("register");
    }

    async fn check(adjustments: &[Row]) -> CheckResult {
        let ctx = SessionContext::new();
        lakefill_table::rowhash::register_hash_functions(&ctx);
        let old: [Row; 3] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 20, None),
            ("d2", 3, "DE", 30, None),
        ];
        // The fix: id 2 is 25, id 3 moves to d1.
        let new: [Row; 3] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 25, None),
            ("d1", 3, "DE", 30, None),
        ];
        register(&ctx, "previous", &old);
        register(&ctx, "output", &new);
        register(&ctx, "adjustments", adjustments);
        conservation_check(
            &ctx,
            &schema(),
            &["day".to_string()],
            &["id".to_string()],
            &["amount".to_string()],
            5,
        )
        .await
        .expect("check")
    }

    #[tokio::test]
    async fn the_proof_fails_for_adjustments_that_do_not_take_the_old_rows_to_the_new() {
        let right: [Row; 4] = [
            ("d1", 2, "FR", -20, Some(REVERSAL)),
            ("d1", 2, "FR", 25, Some("correction")),
            ("d2", 3, "DE", -30, Some(REVERSAL)),
            ("d1", 3, "DE", 30, Some("correction")),
        ];
        let passed = check(&right).await;
        assert!(passed.passed, "{:?}", passed.failures);
        // A correction left out: key 3 is missing on d1.
        let missing = check(&right[..3]).await;
        assert!(!missing.passed);
        assert_eq!(missing.failures.len(), 1, "{:?}", missing.failures);
        assert_eq!(missing.failures[0]["id"], "3");
        assert_eq!(missing.failures[0]["old_plus_adjustment_rows"], "0");
        // Every key adds up, but the reversal is of a row that was never there (another
        // country): the net rows after the publish would not be the new rows.
        let mut wrong = right;
        wrong[0].2 = "DE";
        let reported = check(&wrong).await;
        assert!(!reported.passed);
        assert_eq!(
            reported.failures,
            vec![json!({"day": "d1", "rows_not_accounted_for": 0, "values_differ": true})]
        );
        // An appended row without a kind counts too (as a correction nobody asked for).
        let mut unkinded = right.to_vec();
        unkinded.push(("d1", 9, "XX", 1, None));
        let reported = check(&unkinded).await;
        assert!(!reported.passed);
        assert_eq!(reported.failures[0]["id"], "9", "{:?}", reported.failures);
        // A measure not negated: sums differ per key.
        let mut unnegated = right;
        unnegated[0].3 = 20;
        let reported = check(&unnegated).await;
        assert!(!reported.passed);
        assert_eq!(reported.failures[0]["id"], "2");
    }

    /// The balance of `stored` (the table's rows), `adjustments` and the fix of [`check`], with
    /// `previous` (the net rows the adjustments were derived from) proven too: (proof, balance).
    async fn prove_and_balance(
        stored: &[Row],
        previous: &[Row],
        adjustments: &[Row],
    ) -> (CheckResult, CheckResult) {
        let ctx = SessionContext::new();
        lakefill_table::rowhash::register_hash_functions(&ctx);
        let new: [Row; 3] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 25, None),
            ("d1", 3, "DE", 30, None),
        ];
        register(&ctx, "__lf_ledger", stored);
        register(&ctx, "previous", previous);
        register(&ctx, "output", &new);
        register(&ctx, "adjustments", adjustments);
        let day = ["day".to_string()];
        let amount = ["amount".to_string()];
        let proof = conservation_check(&ctx, &schema(), &day, &["id".to_string()], &amount, 5)
            .await
            .expect("proof");
        let balance = balance_check(&ctx, &schema(), &day, &amount, 5)
            .await
            .expect("balance");
        (proof, balance)
    }

    #[tokio::test]
    async fn the_balance_fails_for_adjustments_derived_from_wrong_net_rows_the_proof_passes() {
        // Stored: id 2 was adjusted once already (20 → 22).
        let stored: [Row; 5] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 20, None),
            ("d1", 2, "FR", -20, Some(REVERSAL)),
            ("d1", 2, "FR", 22, Some("correction")),
            ("d2", 3, "DE", 30, None),
        ];
        let net =
            |id2: Row| -> [Row; 3] { [("d1", 1, "DE", 10, None), id2, ("d2", 3, "DE", 30, None)] };
        // The fix against each net: id 2 becomes 25, id 3 moves to d1.
        let against = |id2: Row| -> [Row; 4] {
            [
                (id2.0, id2.1, id2.2, -id2.3, Some(REVERSAL)),
                ("d1", 2, "FR", 25, Some("correction")),
                ("d2", 3, "DE", -30, Some(REVERSAL)),
                ("d1", 3, "DE", 30, Some("correction")),
            ]
        };
        let right: Row = ("d1", 2, "FR", 22, None);
        let (proof, balance) = prove_and_balance(&stored, &net(right), &against(right)).await;
        assert!(proof.passed, "{:?}", proof.failures);
        assert!(balance.passed, "{:?}", balance.failures);
        // Net rows that miss the earlier adjustment: the proof holds (it starts from them), the
        // stored rows plus the adjustments are 2 more than the fix.
        let stale: Row = ("d1", 2, "FR", 20, None);
        let (proof, balance) = prove_and_balance(&stored, &net(stale), &against(stale)).await;
        assert!(proof.passed, "{:?}", proof.failures);
        assert!(!balance.passed);
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d1", "measure": "amount", "buckets_off": 1, "stored_plus_adjustments_less_new": "2"})
            ]
        );
        // Net rows that take the row for another group (another country): the partition's sum
        // is right, two buckets are not.
        let other: Row = ("d1", 2, "DE", 22, None);
        let (proof, balance) = prove_and_balance(&stored, &net(other), &against(other)).await;
        assert!(proof.passed, "{:?}", proof.failures);
        assert!(!balance.passed);
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d1", "measure": "amount", "buckets_off": 2, "stored_plus_adjustments_less_new": "0"})
            ]
        );
        // A group left out of the net rows: its reversal is missing, d2 keeps 30.
        let (_, balance) = prove_and_balance(
            &stored,
            &net(right),
            &against(right)[..2]
                .iter()
                .chain(&against(right)[3..])
                .copied()
                .collect::<Vec<_>>(),
        )
        .await;
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d2", "measure": "amount", "buckets_off": 1, "stored_plus_adjustments_less_new": "30"})
            ]
        );
    }
}
