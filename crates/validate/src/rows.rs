//! Streaming helpers shared by comparison and checks: run a query, count and sample its rows,
//! format values as text.

use std::collections::BTreeMap;

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::datatypes::{DataType, UInt64Type};
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::prelude::SessionContext;
use serde_json::{Map, Value};

use lakefill_table::error::{Error, QueryContext, Result};

/// Formats up to `limit` rows of `batch` as JSON objects of text values.
pub fn batch_to_json(batch: &RecordBatch, limit: usize) -> Result<Vec<Value>> {
    let formatters = formatters_for(batch)?;
    let schema = batch.schema();
    Ok((0..batch.num_rows().min(limit))
        .map(|row| {
            let mut object = Map::new();
            for (i, field) in schema.fields().iter().enumerate() {
                let value = if batch.column(i).is_null(row) {
                    Value::Null
                } else {
                    Value::String(formatters[i].value(row).to_string())
                };
                object.insert(field.name().clone(), value);
            }
            Value::Object(object)
        })
        .collect())
}

/// A formatter for each column of `batch`, for values as text.
pub fn formatters_for(batch: &RecordBatch) -> Result<Vec<ArrayFormatter<'_>>> {
    let options = FormatOptions::default();
    batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Internal(format!("cannot format values: {e}")))
}

/// Plans and runs the read-only query `sql` (to `what`, for errors) and streams its rows.
pub async fn run(
    ctx: &SessionContext,
    sql: &str,
    what: &str,
) -> Result<deltalake::datafusion::execution::SendableRecordBatchStream> {
    let options = lakefill_table::sqltext::read_only();
    let df = ctx
        .sql_with_options(sql, options)
        .await
        .query_context(|| format!("cannot plan the query to {what}"))?;
    df.execute_stream()
        .await
        .query_context(|| format!("cannot run the query to {what}"))
}

/// The column names of `table` in `ctx`.
pub async fn column_names(ctx: &SessionContext, table: &str) -> Result<Vec<String>> {
    let provider = ctx
        .table_provider(table)
        .await
        .query_context(|| format!("table `{table}` is not registered"))?;
    Ok(provider
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// Text values of a column (any string type, or cast through the formatter).
pub fn text_column(batch: &RecordBatch, index: usize) -> Vec<Option<String>> {
    let column = batch.column(index);
    match column.data_type() {
        DataType::Utf8 => column
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        DataType::LargeUtf8 => column
            .as_string::<i64>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        DataType::Utf8View => column
            .as_string_view()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        DataType::UInt64 => column
            .as_primitive::<UInt64Type>()
            .iter()
            .map(|v| v.map(|n| n.to_string()))
            .collect(),
        _ => {
            let options = FormatOptions::default();
            match ArrayFormatter::try_new(column.as_ref(), &options) {
                Ok(f) => (0..column.len())
                    .map(|i| (!column.is_null(i)).then(|| f.value(i).to_string()))
                    .collect(),
                Err(_) => vec![None; column.len()],
            }
        }
    }
}

/// Makes the known-count maps from `(partition, rows)` pairs.
pub fn counts_from<'a>(
    pairs: impl IntoIterator<Item = (&'a String, u64)>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (p, n) in pairs {
        *out.entry(p.clone()).or_default() += n;
    }
    out
}

/// Registers `table` restricted to the partitions of `range` as `name` in `ctx`.
pub async fn register_range(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    name: &str,
    table: &deltalake::DeltaTable,
    layout: &lakefill_table::partition::Layout,
    range: &lakefill_table::partition::PartitionRange,
) -> Result<()> {
    let schema = table
        .snapshot()
        .map_err(|source| Error::Delta {
            context: "cannot read the target's snapshot".into(),
            source: Box::new(source),
        })?
        .snapshot()
        .arrow_schema();
    let predicate = layout.range_predicate(range, &schema)?;
    let provider = table
        .table_provider()
        .await
        .query_context(|| "cannot scan the target".into())?;
    let df = ctx
        .read_table(provider)
        .and_then(|df| df.filter(predicate))
        .query_context(|| "cannot restrict the target to the range".into())?;
    ctx.register_table(name, df.into_view())
        .query_context(|| format!("cannot register the rows of the range as `{name}`"))?;
    Ok(())
}
