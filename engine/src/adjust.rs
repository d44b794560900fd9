//! Adjustments (DESIGN §4 "Adjustments"): publishing a correction to a table that must never be
//! rewritten (a ledger, a table streaming readers follow, `delta.appendOnly = true`) as rows
//! appended to it, whose sum with the old rows is the corrected history.
//!
//! The model's output is staged as for any run (the new rows, which validation compares with the
//! old ones), but it is not what the publish commits. Per batch, the old rows are the table's
//! *net* rows at the read version (its rows with every earlier reversal cancelling the row it
//! reversed: grouped by every column but the measures and the lineage columns, the measures
//! summed, kept while more rows than reversals remain) and the adjustments are the differences
//! of whole rows, partition by partition:
//!
//! - a **reversal** for each old row that is not among the new rows (a changed or removed key):
//!   its values with the measures negated;
//! - a **correction** for each new row that is not among the old rows (a changed or new key).
//!
//! Each carries the lineage columns `_lakefill_run_id`, `_lakefill_kind` (`reversal` or
//! `correction`) and `_lakefill_reason`. A row's partition is part of it, so the difference is
//! the same taken per batch or over the whole range: a fix that moves a row to another day
//! reverses it on the old day and corrects it on the new one. Validation then proves, per
//! partition and key, that the old rows plus the adjustments give the new rows (each measure, and
//! the number of rows), and the publish is a plain append of the adjustment files (WRITE/Append,
//! no removes) with the run's metadata and application transaction.

use std::sync::Arc;

use deltalake::arrow::datatypes::Schema;
use deltalake::datafusion::prelude::SessionContext;
use serde_json::json;

use lakefill_recompute::plan::adjust::register_net_rows;
use lakefill_table::adjustments::{AdjustmentCounts, KIND_COLUMN, REVERSAL};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::sqltext::ident;
use lakefill_table::staged::StagedTable;
use lakefill_validate::CheckResult;
use lakefill_validate::net::{adjustments_sql, counts};

/// Proves the adjustments: per partition and key, the old net rows plus the adjustments give
/// the new rows, in rows (a reversal counts -1) and in every measure (exactly for integers and
/// decimals, to a relative 1e-9 for floats). `previous`, `adjustments` and `output` are
/// registered views.
pub(crate) async fn conservation_check(
    ctx: &SessionContext,
    schema: &Schema,
    group: &[String],
    measures: &[String],
    sample: usize,
) -> Result<CheckResult> {
    let name = "adjustments conserve";
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
    let mut failures = Vec::new();
    for batch in &batches {
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
        failures.push(json!({"more_keys": total - failures.len()}));
    }
    Ok(CheckResult::new(name, failures, Vec::new()))
}

/// Stages the adjustment rows of every batch of new rows in `batches` (see the module docs);
/// returns them per batch, and how many of each kind.
pub(crate) async fn stage(
    plan: &lakefill_recompute::plan::BackfillPlan,
    batches: &[lakefill_log::journal::BatchRecord],
    resources: &lakefill_table::resources::Resources,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<(Vec<lakefill_log::journal::BatchRecord>, AdjustmentCounts)> {
    let report = &plan.report;
    let layout = &report.layout;
    let write_schema = Arc::new(lakefill_recompute::plan::query::target_schema(plan)?);
    let measures = plan.rules.summed_measures();
    let mut records = Vec::with_capacity(batches.len());
    let mut counted = AdjustmentCounts::default();
    for new_rows in batches {
        let Some(batch) = report.batches.iter().find(|b| b.index == new_rows.index) else {
            return Err(lakefill_table::error::Error::Internal(format!(
                "staged batch {} is not in the plan",
                new_rows.index
            )));
        };
        let ctx = resources.session();
        let periods = lakefill_table::partition::PartitionRange {
            from: batch.start.clone(),
            to: batch.end.clone(),
            grain: report.range.grain,
            include_null: false,
            rows: None,
        };
        register_net_rows(&ctx, "__lf_old", plan, &periods).await?;
        StagedTable::register_as(
            &ctx,
            "__lf_new",
            &plan.target,
            &write_schema,
            &layout.partition_columns,
            &new_rows.files,
            report.run_id.as_str(),
        )?;
        let sql = adjustments_sql(
            "__lf_old",
            "__lf_new",
            &write_schema,
            &measures,
            report.run_id.as_str(),
            report.reason.as_deref(),
        );
        let df = ctx
            .sql(&sql)
            .await
            .query_context(|| "cannot plan the adjustment rows".into())?;
        let record = lakefill_recompute::stage::write_batch(
            plan,
            batch,
            df,
            Arc::clone(&write_schema),
            Arc::clone(&store),
            None,
        )
        .await?;
        // Count them from what was written.
        StagedTable::register_as(
            &ctx,
            "__lf_adjustments",
            &plan.target,
            &write_schema,
            &layout.partition_columns,
            &record.files,
            &format!("{}-adjustments", report.run_id),
        )?;
        let batch_counts = counts(&ctx, "__lf_adjustments").await?;
        counted.reversals += batch_counts.reversals;
        counted.corrections += batch_counts.corrections;
        tracing::debug!(
            batch = batch.index,
            reversals = batch_counts.reversals,
            corrections = batch_counts.corrections,
            "staged adjustments"
        );
        records.push(record);
    }
    Ok((records, counted))
}

/// With a companion: refuses to publish when a commit after the version the run read changed
/// the corrected table in the range (the adjustments were derived from the rows it held then).
/// `table` is the corrected table at any version; its latest is read.
pub(crate) async fn check_adjusted_unchanged(
    table: &deltalake::DeltaTable,
    journal: &lakefill_log::journal::Journal,
) -> Result<()> {
    let Some((name, read)) = &journal.inputs.adjusts else {
        return Ok(());
    };
    let latest = lakefill_table::storage::latest(table).await?;
    let until = lakefill_table::storage::loaded_version(&latest)?;
    let later = lakefill_log::commits_in_range(
        &latest,
        *read,
        &journal.inputs.layout,
        &journal.inputs.range,
        until,
    )
    .await?;
    if later.is_empty() {
        return Ok(());
    }
    Err(lakefill_table::error::Error::Conflict {
        table: name.clone(),
        read_version: *read,
        source: Box::new(deltalake::DeltaTableError::Generic(format!(
            "version(s) {} of `{name}` changed the range the adjustments were derived from",
            later
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    })
}
