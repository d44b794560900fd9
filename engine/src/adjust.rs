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

use deltalake::arrow::datatypes::{DataType, Schema};
use deltalake::datafusion::prelude::SessionContext;
use serde_json::json;

use crate::stage::staged::StagedTable;
use crate::validate::CheckResult;
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::sqltext::ident;

use lakefill_table::adjustments::{
    AdjustmentCounts, CORRECTION, KIND_COLUMN, LINEAGE_COLUMNS, REASON_COLUMN, REVERSAL,
    RUN_ID_COLUMN, is_lineage,
};

/// Checks what adjustments need of the table and the model: a key and measures (signed numbers,
/// not partition columns), no NULL partition in the range, and the lineage columns as strings
/// (or a model that may add them). Returns the lineage columns the publish adds.
pub(crate) fn check_plan(
    schema: &Schema,
    key: &[String],
    measures: &[String],
    partition_columns: &[String],
    include_null: bool,
    adds_columns: bool,
) -> std::result::Result<Vec<String>, String> {
    if key.is_empty() || measures.is_empty() {
        return Err("adjustments need `[validate] key` (which rows are the same row) and `measures` (the columns a reversal negates)".into());
    }
    for measure in measures {
        let field = schema
            .field_with_name(measure)
            .map_err(|_| format!("measure `{measure}` is not a column of the table"))?;
        if partition_columns.contains(measure) {
            return Err(format!(
                "measure `{measure}` is a partition column: a reversal cannot negate it"
            ));
        }
        let signed = matches!(
            field.data_type(),
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::Float32
                | DataType::Float64
                | DataType::Decimal128(_, _)
                | DataType::Decimal256(_, _)
        );
        if !signed {
            return Err(format!(
                "measure `{measure}` is {}: a reversal negates measures, so they must be signed numbers",
                field.data_type()
            ));
        }
    }
    if include_null {
        return Err(
            "adjustments of the NULL partition (`--include-null`) are not supported".into(),
        );
    }
    let mut missing = Vec::new();
    for column in LINEAGE_COLUMNS {
        match schema.field_with_name(column) {
            Ok(field) if crate::plan::query::normalize(field.data_type()) == DataType::Utf8 => {}
            Ok(field) => {
                return Err(format!(
                    "`{column}` is {}: adjustments write their lineage there as strings",
                    field.data_type()
                ));
            }
            Err(_) => missing.push(column.to_string()),
        }
    }
    if !missing.is_empty() && !adds_columns {
        return Err(format!(
            "the table has no lineage columns {}: adjustment rows carry them; set `schema = \"add-columns\"` in the model header to add them (nullable strings) with the first publish",
            missing.join(", ")
        ));
    }
    Ok(missing)
}

/// Refuses adjustments into `table` when one of its rules (CHECK constraints, invariants,
/// generated columns; NOT NULL holds for a negated value) reads a measure the reversal rows
/// negate: those rows would break it, and Delta's writers refuse them (#33). Every rule is
/// also checked over the rows the commit appends.
pub(crate) fn check_rules(
    rules: &crate::validate::ValidationRules,
    table: &str,
    model: &std::path::Path,
) -> Result<()> {
    let measures = rules.summed_measures();
    for rule in rules
        .protocol
        .iter()
        .filter(|r| !r.name.starts_with("not null "))
    {
        let text = rule.violation.to_ascii_lowercase();
        let mentions = |measure: &String| {
            let name = measure.to_ascii_lowercase();
            text.match_indices(&name).any(|(at, _)| {
                let before = text[..at].chars().next_back();
                let after = text[at + name.len()..].chars().next();
                let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !word(before) && !word(after)
            })
        };
        if let Some(measure) = measures.iter().find(|m| mentions(m)) {
            return Err(Error::Model {
                path: model.to_path_buf(),
                message: format!(
                    "the {} of `{table}` reads `{measure}`, which adjustment rows negate to reverse old rows: the reversals would break it, and Delta's writers refuse such rows",
                    rule.name
                ),
                hint: format!(
                    "publish this fix as a rewrite (`--publish-as rewrite`) if `{table}` allows it, or leave `{measure}` out of `[validate] measures` if it is no measure to reverse"
                ),
            });
        }
    }
    Ok(())
}

/// The net rows of `rows` (a view of the table): every column of `schema` in order, the
/// measures summed over the rows that are the same but for them and the lineage, kept while the
/// rows outnumber their reversals; the lineage columns NULL.
pub(crate) fn net_sql(rows: &str, schema: &Schema, measures: &[String]) -> String {
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
            let data_type = field.data_type().to_string().replace('\'', "''");
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
pub(crate) fn adjustments_sql(
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
                let data_type = field.data_type().to_string().replace('\'', "''");
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
pub(crate) async fn counts(ctx: &SessionContext, adjustments: &str) -> Result<AdjustmentCounts> {
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

/// Registers `name` in `ctx` as the net rows of the view `rows`.
pub(crate) async fn register_net(
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

/// Stages the adjustment rows of every batch of new rows in `batches` (see the module docs);
/// returns them per batch, and how many of each kind.
pub(crate) async fn stage(
    plan: &crate::plan::BackfillPlan,
    batches: &[crate::journal::BatchRecord],
    resources: &lakefill_table::resources::Resources,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<(Vec<crate::journal::BatchRecord>, AdjustmentCounts)> {
    let report = &plan.report;
    let layout = &report.layout;
    let write_schema = Arc::new(crate::plan::query::target_schema(plan)?);
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
        let record = crate::stage::write_batch(
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

/// Creates the companion table adjustments of `target` (named `of`) go to: the target's
/// columns, the lineage columns, the same partitioning, `delta.appendOnly`. When another process
/// created it first, that table is used.
pub(crate) async fn create_companion(
    config: &lakefill_table::config::TableConfig,
    target: &deltalake::DeltaTable,
    partition_columns: &[String],
    of: &str,
) -> Result<deltalake::DeltaTable> {
    use deltalake::kernel::{DataType as DeltaType, StructField};
    use lakefill_table::error::DeltaContext as _;
    let schema = target
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{of}`"))?
        .schema();
    let mut fields: Vec<StructField> = schema.fields().cloned().collect();
    for column in LINEAGE_COLUMNS {
        if schema.field(column).is_none() {
            fields.push(StructField::new(column, DeltaType::STRING, true));
        }
    }
    let properties = deltalake::kernel::transaction::CommitProperties::default()
        .with_metadata([("lakefill".to_string(), json!({"companion_of": of}))]);
    let created = deltalake::operations::create::CreateBuilder::new()
        .with_location(config.url().as_str())
        .with_storage_options(lakefill_table::storage::effective_options(config))
        .with_columns(fields)
        .with_partition_columns(partition_columns.to_vec())
        .with_configuration_property(deltalake::TableProperty::AppendOnly, Some("true"))
        .with_commit_properties(properties)
        .await;
    match created {
        Ok(table) => {
            tracing::info!(
                table = config.name(),
                of,
                "created the companion for adjustments"
            );
            Ok(table)
        }
        // Another process may have just created it.
        Err(error) => lakefill_table::storage::open_table(config, None)
            .await
            .map_err(|_| lakefill_table::error::Error::Delta {
                context: format!(
                    "cannot create `{}`, the companion table for adjustments of `{of}`",
                    config.name()
                ),
                source: Box::new(error),
            }),
    }
}

/// Registers as `name` the net rows of the table a run corrects in `range` (with its
/// companion's), at the versions the run read: the old rows of an adjustments run.
pub(crate) async fn register_net_rows(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
) -> Result<()> {
    let rows = format!("__lf_rows_of_{name}");
    register_ledger_rows(ctx, &rows, plan, range).await?;
    let schema = ctx
        .table(rows.as_str())
        .await
        .query_context(|| "cannot read the old rows".into())?
        .schema()
        .as_arrow()
        .clone();
    register_net(ctx, name, &rows, &schema, &plan.rules.summed_measures()).await
}

/// Registers as `name` the rows of the table a run corrects in `range`, at the versions the run
/// read: the target's, and with a companion, the companion's too (the columns of both).
async fn register_ledger_rows(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
) -> Result<()> {
    let layout = &plan.report.layout;
    match &plan.adjusted {
        None => {
            crate::run::validation::register_range(ctx, name, &plan.target, layout, range).await
        }
        Some(adjusted) => {
            let ledger = format!("{name}__ledger");
            let companion = format!("{name}__companion");
            crate::run::validation::register_range(ctx, &ledger, &adjusted.table, layout, range)
                .await?;
            crate::run::validation::register_range(ctx, &companion, &plan.target, layout, range)
                .await?;
            let context = || "cannot read the table with its companion".to_string();
            let rows = ctx.table(ledger.as_str()).await.query_context(context)?;
            let companion_rows = ctx.table(companion.as_str()).await.query_context(context)?;
            let union = rows.union_by_name(companion_rows).query_context(context)?;
            ctx.register_table(name, union.into_view())
                .query_context(|| format!("cannot register the rows as `{name}`"))?;
            Ok(())
        }
    }
}

/// With a companion: refuses to publish when a commit after the version the run read changed
/// the corrected table in the range (the adjustments were derived from the rows it held then).
/// `table` is the corrected table at any version; its latest is read.
pub(crate) async fn check_adjusted_unchanged(
    table: &deltalake::DeltaTable,
    journal: &crate::journal::Journal,
) -> Result<()> {
    let Some((name, read)) = &journal.adjusts else {
        return Ok(());
    };
    let latest = lakefill_table::storage::latest(table).await?;
    let until = lakefill_table::storage::loaded_version(&latest)?;
    let later =
        crate::log::commits_in_range(&latest, *read, &journal.layout, &journal.range, until)
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
