//! The algebra of adjustments over rows, as SQL: a table's *net* rows (each reversal cancels the
//! row it reversed), the adjustment rows that take old net rows to new rows, and their counts.
//! Used where the rows are read: a model's sources, validation, publishing.

use deltalake::arrow::datatypes::Schema;
use deltalake::datafusion::prelude::SessionContext;

use lakefill_table::adjustments::{
    AdjustmentCounts, CORRECTION, KIND_COLUMN, REASON_COLUMN, REVERSAL, RUN_ID_COLUMN, is_lineage,
};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::sqltext::ident;

/// The net rows of `rows` (a view of the table): every column of `schema` in order, the
/// measures summed over the rows that are the same but for them and the lineage, kept while the
/// rows outnumber their reversals; the lineage columns NULL.
pub fn net_sql(rows: &str, schema: &Schema, measures: &[String]) -> String {
    let has_kind = schema.field_with_name(KIND_COLUMN).is_ok();
    let grouped: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !is_lineage(name) && !measures.contains(name))
        .map(|name| ident(&name))
        .collect();
    let select: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            let data_type = lakefill_table::types::without_metadata(field.data_type())
                .to_string()
                .replace('\'', "''");
            if is_lineage(name) {
                format!("arrow_cast(NULL, '{data_type}') AS {}", ident(name))
            } else if measures.contains(name) {
                format!("arrow_cast(SUM({0}), '{data_type}') AS {0}", ident(name))
            } else {
                ident(name)
            }
        })
        .collect();
    if !has_kind {
        // No adjustment was ever appended (the table has no lineage columns): its rows are its
        // net rows, and grouping them would only cost.
        let select: Vec<String> = schema
            .fields()
            .iter()
            .map(|field| ident(field.name()))
            .collect();
        return format!("SELECT {} FROM {rows}", select.join(", "));
    }
    let weight = format!(
        "CASE WHEN {} = '{REVERSAL}' THEN -1 ELSE 1 END",
        ident(KIND_COLUMN)
    );
    let group_by = if grouped.is_empty() {
        String::new()
    } else {
        format!(" GROUP BY {}", grouped.join(", "))
    };
    format!(
        "SELECT {} FROM {rows}{group_by} HAVING SUM({weight}) > 0",
        select.join(", ")
    )
}

/// The adjustment rows that take the net rows `old` to the rows `new` (both views with every
/// column of `schema`): reversals of the old rows that are not new rows, corrections for the new
/// rows that are not old rows, each with the lineage columns.
pub fn adjustments_sql(
    old: &str,
    new: &str,
    schema: &Schema,
    measures: &[String],
    run_id: &str,
    reason: Option<&str>,
) -> String {
    let values: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !is_lineage(name))
        .map(|name| ident(&name))
        .collect();
    let text = |value: &str| format!("'{}'", value.replace('\'', "''"));
    let side = |kind: &str, negate: bool| -> String {
        schema
            .fields()
            .iter()
            .map(|field| {
                let name = field.name();
                let data_type = lakefill_table::types::without_metadata(field.data_type())
                    .to_string()
                    .replace('\'', "''");
                let value = match name.as_str() {
                    RUN_ID_COLUMN => text(run_id),
                    KIND_COLUMN => text(kind),
                    REASON_COLUMN => reason.map_or_else(|| "NULL".to_string(), text),
                    _ if negate && measures.contains(name) => format!("-({})", ident(name)),
                    _ => ident(name),
                };
                format!("arrow_cast({value}, '{data_type}') AS {}", ident(name))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let values = values.join(", ");
    format!(
        "SELECT {} FROM (SELECT {values} FROM {old} EXCEPT ALL SELECT {values} FROM {new}) \
         UNION ALL \
         SELECT {} FROM (SELECT {values} FROM {new} EXCEPT ALL SELECT {values} FROM {old})",
        side(REVERSAL, true),
        side(CORRECTION, false)
    )
}

/// Counts the reversals and corrections of `adjustments` (a registered view).
pub async fn counts(ctx: &SessionContext, adjustments: &str) -> Result<AdjustmentCounts> {
    let batches = ctx
        .sql(&format!(
            "SELECT CAST(COALESCE(SUM(CASE WHEN {0} = '{REVERSAL}' THEN 1 ELSE 0 END), 0) AS BIGINT), \
             CAST(COALESCE(SUM(CASE WHEN {0} = '{CORRECTION}' THEN 1 ELSE 0 END), 0) AS BIGINT) \
             FROM {adjustments}",
            ident(KIND_COLUMN)
        ))
        .await
        .query_context(|| "cannot count the adjustments".into())?
        .collect()
        .await
        .query_context(|| "cannot count the adjustments".into())?;
    let value = |column: usize| -> u64 {
        batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .and_then(|b| {
                b.column(column)
                    .as_any()
                    .downcast_ref::<deltalake::arrow::array::Int64Array>()
                    .map(|a| u64::try_from(a.value(0)).unwrap_or(0))
            })
            .unwrap_or(0)
    };
    Ok(AdjustmentCounts {
        reversals: value(0),
        corrections: value(1),
    })
}

/// Registers `name` in `ctx` as the net rows of the view `rows`.
pub async fn register_net(
    ctx: &SessionContext,
    name: &str,
    rows: &str,
    schema: &Schema,
    measures: &[String],
) -> Result<()> {
    let df = ctx
        .sql(&net_sql(rows, schema, measures))
        .await
        .query_context(|| {
            "cannot net the table's rows (reversals against what they reverse)".into()
        })?;
    ctx.register_table(name, df.into_view())
        .query_context(|| format!("cannot register the net rows as `{name}`"))?;
    Ok(())
}
