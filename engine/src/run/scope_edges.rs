//! Keys that cross the edge of a run's `--where` predicate (#36), as [`crate::run::edges`] checks
//! those that cross the range's edges.
//!
//! Inside the range, a scoped run replaces the rows where the predicate holds and keeps the
//! others. A key can cross that edge two ways:
//! - **out**: the target holds it where the predicate holds, and the fix writes it where it does
//!   not. The old row is replaced, the new one is dropped by the predicate: the key would vanish.
//! - **in**: the fix writes it where the predicate holds, and the target still holds it in a row
//!   of the range where it does not, which is kept: the key would be there twice.
//!
//! Both show in the scoped comparison first, as removed and added keys. The rows outside the
//! predicate are read only when there are some: a key that moved out needs the model run over
//! the range without the predicate (the cost a scoped run otherwise saves), one that moved in
//! needs the target's keys of the range.

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::datatypes::DataType;
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;
use serde_json::json;

use lakefill_recompute::plan::{BackfillPlan, BatchPlan};
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::partition::PartitionRange;
use lakefill_table::resources::Resources;
use lakefill_table::sqltext::ident;
use lakefill_table::time::Period;
use lakefill_validate::edges::SCOPE_EDGE_CHECK;
use lakefill_validate::{CheckResult, Comparison};

/// How many keys of each kind the check names.
const SAMPLE_KEYS: usize = 5;

/// The check of a run scoped by `--where` that compares rows by key, once the comparison is
/// known; `None` otherwise. `ctx` is validation's session, where `output` holds the new rows of
/// the scope. Crossings pass when the run allows keys to cross (`--allow-edge-moves`).
pub(crate) async fn check(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    resources: &Resources,
    comparison: &Comparison,
) -> Result<Option<CheckResult>> {
    let range = &plan.report.range;
    let key = &plan.rules.key;
    let Some(predicate) = &range.rows else {
        return Ok(None);
    };
    if key.is_empty() || comparison.key.is_empty() {
        return Ok(None);
    }
    let mut failures = Vec::new();
    if comparison.totals.removed > 0 {
        let (count, keys) = moved_out(plan, resources).await?;
        if count > 0 {
            failures.push(json!({
                "moved_out": count,
                "keys": keys,
                "message": format!(
                    "{count} keys the table holds where {predicate} are written by the fix where it does not hold: their old rows are replaced and their new ones fall outside the scope, so they would vanish"
                ),
            }));
        }
    }
    if comparison.totals.added > 0 {
        let (count, keys) = moved_in(ctx, plan).await?;
        if count > 0 {
            failures.push(json!({
                "moved_in": count,
                "keys": keys,
                "message": format!(
                    "{count} keys the fix writes where {predicate} are still in rows of the range where it does not hold, which are kept: they would be there twice"
                ),
            }));
        }
    }
    if !failures.is_empty() {
        failures.push(json!({
            "message": format!(
                "widen `--where` to hold both sides of these keys (or drop it), or run again with `--allow-edge-moves --reason TEXT` if they are meant to cross"
            ),
        }));
    }
    let allowed = plan.report.edges.as_ref().and_then(|e| e.allowed.clone());
    Ok(Some(crate::run::edges::allow(
        CheckResult::new(SCOPE_EDGE_CHECK, failures, Vec::new()),
        allowed,
    )))
}

/// The keys the target holds in the scope that the model, run over the range without the
/// predicate, writes where it does not hold.
async fn moved_out(plan: &BackfillPlan, resources: &Resources) -> Result<(u64, Vec<String>)> {
    let range = &plan.report.range;
    let mut unscoped = plan.clone();
    unscoped.report.range.rows = None;
    let batch = BatchPlan {
        index: usize::MAX,
        start: range.from.clone(),
        end: range.to.clone(),
        partitions: range.periods().iter().map(Period::label).collect(),
        null: false,
        carry: false,
    };
    let (ctx, df) =
        lakefill_recompute::plan::query::batch_dataframe(&unscoped, &batch, resources).await?;
    let schema = lakefill_recompute::plan::query::target_schema(plan)?;
    let df = lakefill_recompute::stage::target_projection(&unscoped, df, &schema)?;
    ctx.register_table("__lf_scope_model", df.into_view())
        .query_context(|| "cannot register the model's rows outside the predicate".into())?;
    lakefill_validate::rows::register_range(
        &ctx,
        "__lf_scope_old",
        &plan.target,
        &plan.report.layout,
        range,
    )
    .await?;
    let sql = crossing_sql(plan, "__lf_scope_model", true, "__lf_scope_old", false);
    crossing_keys(&ctx, &sql, "find the keys that move out of the predicate").await
}

/// The keys the model writes in the scope that the target still holds in the range where the
/// predicate does not hold. Only keys the scoped comparison found added can be such keys (one the
/// scope held before is not new there), so those few are looked up in the kept rows: the kept
/// rows' keys are streamed past them, never collected.
async fn moved_in(ctx: &SessionContext, plan: &BackfillPlan) -> Result<(u64, Vec<String>)> {
    let whole = PartitionRange {
        rows: None,
        ..plan.report.range.clone()
    };
    lakefill_validate::rows::register_range(
        ctx,
        "__lf_scope_range",
        &plan.target,
        &plan.report.layout,
        &whole,
    )
    .await?;
    let columns: Vec<String> = plan.rules.key.iter().map(|k| ident(k)).collect();
    let listed = columns.join(", ");
    ctx.register_table(
        "__lf_scope_added",
        ctx.sql(&format!(
            "SELECT {listed} FROM output EXCEPT SELECT {listed} FROM previous"
        ))
        .await
        .query_context(|| "cannot find the keys the fix adds to the scope".into())?
        .into_view(),
    )
    .query_context(|| "cannot register the keys the fix adds to the scope".into())?;
    let sql = crossing_sql(plan, "__lf_scope_added", false, "__lf_scope_range", true);
    crossing_keys(ctx, &sql, "find the keys that move into the predicate").await
}

/// The distinct keys of `a` (its rows outside the predicate when `a_outside`) that `b` (its rows
/// outside the predicate when `b_outside`) holds too, as text. `a` is the smaller side: it is
/// made distinct and built into the join's table; `b` is streamed past it.
fn crossing_sql(plan: &BackfillPlan, a: &str, a_outside: bool, b: &str, b_outside: bool) -> String {
    let key = &plan.rules.key;
    let predicate = plan
        .report
        .range
        .rows
        .as_ref()
        .map(|p| p.sql.as_str())
        .unwrap_or("true");
    let columns: Vec<String> = key.iter().map(|k| ident(k)).collect();
    let side = |table: &str, outside: bool, distinct: &str| {
        let filter = if outside {
            format!("({predicate}) IS NOT TRUE")
        } else {
            "true".to_string()
        };
        format!(
            "SELECT {distinct}{} FROM {} WHERE {filter}",
            columns.join(", "),
            ident(table)
        )
    };
    let text: Vec<String> = columns
        .iter()
        .map(|c| format!("CAST(a.{c} AS VARCHAR)"))
        .collect();
    format!(
        "SELECT DISTINCT concat_ws(', ', {}) FROM ({}) a JOIN ({}) b USING ({})",
        text.join(", "),
        side(a, a_outside, "DISTINCT "),
        side(b, b_outside, ""),
        columns.join(", ")
    )
}

/// Runs `sql` (one text column, a key a row) and returns how many rows it gave and the first few.
async fn crossing_keys(ctx: &SessionContext, sql: &str, what: &str) -> Result<(u64, Vec<String>)> {
    let mut stream = lakefill_validate::rows::run(ctx, sql, what).await?;
    let (mut count, mut keys) = (0u64, Vec::new());
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("cannot {what}"))?;
        count += batch.num_rows() as u64;
        if keys.len() < SAMPLE_KEYS && batch.num_rows() > 0 {
            let column = deltalake::arrow::compute::cast(batch.column(0), &DataType::Utf8)
                .map_err(|e| Error::Internal(format!("cannot read a key: {e}")))?;
            let text = column.as_string::<i32>();
            keys.extend(
                (0..text.len())
                    .filter(|i| text.is_valid(*i))
                    .map(|i| text.value(i).to_string())
                    .take(SAMPLE_KEYS - keys.len()),
            );
        }
    }
    Ok((count, keys))
}
