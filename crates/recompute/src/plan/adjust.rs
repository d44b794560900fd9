//! What a run that publishes by adjustments needs of its plan: the table and model checked for
//! them, the table's rules that reversal rows would break refused, the companion table created,
//! and the old rows (net, with the companion's) registered for validation and the edge check.

use deltalake::arrow::datatypes::{DataType, Schema};
use deltalake::datafusion::prelude::SessionContext;
use serde_json::json;

use lakefill_table::adjustments::LINEAGE_COLUMNS;
use lakefill_table::error::{Error, QueryContext, Result};
use std::sync::Arc;

use deltalake::datafusion::execution::disk_manager::DiskManager;
use lakefill_validate::net::{
    KeptNet, StreamedNet, register_net, register_net_spilled, register_net_streamed,
};

/// Checks what adjustments need of the table and the model: a key and measures (signed numbers,
/// not partition columns), no NULL partition in the range, and the lineage columns as strings
/// (or a model that may add them). Returns the lineage columns the publish adds.
pub fn check_plan(
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
pub fn check_rules(
    rules: &lakefill_validate::ValidationRules,
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

/// Creates the companion table adjustments of `target` (named `of`) go to: the target's
/// columns, the lineage columns, the same partitioning, `delta.appendOnly`. When another process
/// created it first, that table is used.
pub async fn create_companion(
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
pub async fn register_net_rows(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
) -> Result<()> {
    let (rows, schema) = register_old_rows(ctx, name, plan, range).await?;
    register_net(
        ctx,
        name,
        &rows,
        &schema,
        &plan.rules.summed_measures(),
        &plan.rules.key,
    )
    .await
}

/// [`register_net_rows`] for net rows read more than once (by staging, then validation): the
/// grouped rows of the adjusted groups are computed once, into a spill file of `disk`, which
/// lives as long as the returned value ([`lakefill_validate::net::register_net_spilled`]).
pub async fn register_net_rows_spilled(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
    disk: &Arc<DiskManager>,
) -> Result<KeptNet> {
    let (rows, schema) = register_old_rows(ctx, name, plan, range).await?;
    register_net_spilled(
        ctx,
        name,
        &rows,
        &schema,
        &plan.rules.summed_measures(),
        &plan.rules.key,
        disk,
    )
    .await
}

/// [`register_net_rows`] for staging's multiset difference, which reads them once: one scan of
/// the stored rows, each seen by `raw` on the way ([`lakefill_validate::net::register_net_streamed`]);
/// the grouped rows are kept in a spill file of `disk` for validation.
pub async fn register_net_rows_streamed(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
    disk: &Arc<DiskManager>,
    raw: lakefill_validate::multiset::Watch,
) -> Result<StreamedNet> {
    let (rows, schema) = register_old_rows(ctx, name, plan, range).await?;
    register_net_streamed(
        ctx,
        name,
        &rows,
        &schema,
        &plan.rules.summed_measures(),
        &plan.rules.key,
        disk,
        raw,
    )
    .await
}

/// Registers as `name` the net rows of `range` that `kept` holds, as
/// [`register_net_rows_spilled`] computed them for the same plan and range (in any session).
pub async fn register_kept_net_rows(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
    kept: &KeptNet,
) -> Result<()> {
    let (rows, schema) = register_old_rows(ctx, name, plan, range).await?;
    kept.register(
        ctx,
        name,
        &rows,
        &schema,
        &plan.rules.summed_measures(),
        &plan.rules.key,
    )
    .await
}

/// Registers the rows (target and companion) whose net rows `name` will be; their view's name
/// and schema.
async fn register_old_rows(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
) -> Result<(String, Schema)> {
    let rows = format!("__lf_rows_of_{name}");
    register_ledger_rows(ctx, &rows, plan, range).await?;
    let schema = ctx
        .table(rows.as_str())
        .await
        .query_context(|| "cannot read the old rows".into())?
        .schema()
        .as_arrow()
        .clone();
    Ok((rows, schema))
}

/// Registers as `name` the rows of the table a run corrects in `range`, at the versions the run
/// read: the target's, and with a companion, the companion's too (the columns of both).
pub async fn register_ledger_rows(
    ctx: &SessionContext,
    name: &str,
    plan: &crate::plan::BackfillPlan,
    range: &lakefill_table::partition::PartitionRange,
) -> Result<()> {
    let layout = &plan.report.layout;
    match plan.publish() {
        crate::plan::Publish::Rewrite | crate::plan::Publish::Adjustments => {
            lakefill_validate::rows::register_range(ctx, name, &plan.target, layout, range).await
        }
        crate::plan::Publish::AdjustmentsToCompanion(adjusted) => {
            let ledger = format!("{name}__ledger");
            let companion = format!("{name}__companion");
            lakefill_validate::rows::register_range(ctx, &ledger, &adjusted.table, layout, range)
                .await?;
            lakefill_validate::rows::register_range(ctx, &companion, &plan.target, layout, range)
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
