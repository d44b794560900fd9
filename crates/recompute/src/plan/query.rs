//! The model as a query: each batch's DataFusion session, with every source registered at its
//! pinned version and filtered to the batch's window, and the model's SELECT with `$start`,
//! `$end` and `$next` bound. [`check_model`] plans it once when the plan is made, so what `plan`
//! accepts, `backfill` runs; staging ([`crate::stage`]) runs the same query per batch.

use std::sync::Arc;

use deltalake::arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::datafusion::common::{Column, ScalarValue};
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::prelude::{DataFrame, SessionContext};

use super::{BackfillPlan, BatchPlan, PlannedSource};
use lakefill_table::error::{DeltaContext, Error, QueryContext, Result};
use lakefill_table::partition::TimeEncoding;
use lakefill_table::protocol::AddedColumn;
use lakefill_table::resources::Resources;
use lakefill_table::time::Period;

/// Plans the model for the first batch and checks its output against the target's schema:
/// names every column that differs. Reads no data.
///
/// Returns the schema staged files are written with: the target's, plus the nullable columns the
/// model adds when its header says `schema = "add-columns"`.
///
/// Also returns the `GENERATED ALWAYS` identity columns the model passes through, whose values
/// validation holds to the table's.
pub async fn check_model(
    plan: &BackfillPlan,
) -> Result<(SchemaRef, Vec<AddedColumn>, Vec<String>)> {
    let table = target_schema(plan)?;
    let Some(first) = plan.report.batches.first() else {
        return Ok((Arc::new(table), Vec::new(), Vec::new()));
    };
    let (_ctx, df) = batch_dataframe(plan, first, &Resources::new(None)).await?;
    let produced = produced_columns(&df);
    let kept = plan
        .report
        .protocol
        .identity
        .iter()
        .filter(|c| c.always && produced.contains(&c.name))
        .map(|c| c.name.clone())
        .collect();
    let (schema, added) = check_schema(plan, df.schema().as_arrow(), &table)?;
    Ok((schema, added, kept))
}

/// The columns of a model's output.
pub fn produced_columns(df: &DataFrame) -> Vec<String> {
    df.schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

/// Plans each `[[validate.checks]]` query against empty tables of the shapes validation gives
/// it (`output` and `previous` with the rows' columns, `staged` in by-rows mode, and
/// `staged.<table>` for any table of the project a cascade may stage before this model), so a
/// missing table or column is named when the plan is made, not after staging. Reads no data.
pub async fn check_checks(
    plan: &BackfillPlan,
    project: &lakefill_table::config::Project,
    rows: &SchemaRef,
) -> Result<()> {
    use deltalake::datafusion::catalog::{MemTable, MemorySchemaProvider, SchemaProvider};
    use deltalake::datafusion::sql::parser::DFParser;
    use deltalake::datafusion::sql::resolve::resolve_table_references;
    use deltalake::datafusion::sql::sqlparser::dialect::GenericDialect;
    if plan.rules.checks.is_empty() {
        return Ok(());
    }
    let empty = |schema: SchemaRef| -> Result<Arc<MemTable>> {
        MemTable::try_new(schema, vec![vec![]])
            .map(Arc::new)
            .query_context(|| "cannot make an empty table for the checks".into())
    };
    let ctx = SessionContext::new();
    let mut names = vec!["output", "previous"];
    if plan.report.layout.rewrites_files(&plan.report.range) {
        names.push("staged");
    }
    for name in names {
        ctx.register_table(name, empty(Arc::clone(rows))?)
            .query_context(|| format!("cannot register `{name}`"))?;
    }
    let staged = Arc::new(MemorySchemaProvider::new());
    for check in &plan.rules.checks {
        let as_check = |source: deltalake::datafusion::error::DataFusionError| Error::Check {
            name: check.name.clone(),
            source: Box::new(source),
        };
        let statements =
            DFParser::parse_sql_with_dialect(&check.sql, &GenericDialect {}).map_err(as_check)?;
        for statement in &statements {
            let (tables, _) = resolve_table_references(statement, false).map_err(as_check)?;
            for table in tables {
                let (Some("staged"), name) = (table.schema(), table.table()) else {
                    continue;
                };
                if staged.table_exist(name) {
                    continue;
                }
                // Unknown tables are left unregistered: planning names them.
                let Ok(config) = project.table(name, "a check") else {
                    continue;
                };
                let opened = lakefill_table::storage::open_table(config, None).await?;
                let schema = opened
                    .snapshot()
                    .delta_context(|| format!("cannot read the snapshot of `{name}`"))?
                    .snapshot()
                    .arrow_schema();
                staged
                    .register_table(name.to_string(), empty(schema)?)
                    .query_context(|| format!("cannot register `staged.{name}`"))?;
            }
        }
    }
    if let Some(catalog) = ctx.catalog(&ctx.state().config().options().catalog.default_catalog) {
        catalog
            .register_schema("staged", staged)
            .query_context(|| "cannot register the staged tables".into())?;
    }
    for check in &plan.rules.checks {
        ctx.sql_with_options(&check.sql, lakefill_table::sqltext::read_only())
            .await
            .map_err(|source| Error::Check {
                name: check.name.clone(),
                source: Box::new(source),
            })?;
    }
    Ok(())
}

/// The schema staged files are written with: the target's, plus any columns the run adds.
pub fn target_schema(plan: &BackfillPlan) -> Result<Schema> {
    if let Some(schema) = &plan.write_schema {
        return Ok(schema.as_ref().clone());
    }
    let snapshot = plan
        .target
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", plan.report.target))?;
    Ok(snapshot.snapshot().arrow_schema().as_ref().clone())
}

/// The periods a batch computes: its first and last (for the NULL batch, the whole range's).
pub fn batch_periods(plan: &BackfillPlan, batch: &BatchPlan) -> Result<(Period, Period)> {
    let grain = plan.report.range.grain;
    let parse = |label: &str| {
        Period::from_label(grain, label)
            .ok_or_else(|| Error::Internal(format!("batch bound `{label}` is not a {grain}")))
    };
    Ok((parse(&batch.start)?, parse(&batch.end)?))
}

/// `$start`, `$end` and `$next` of a batch: for day, month and year partitions the batch's first
/// day, last day and the day after it (DATE); for hours the batch's first hour, last hour and the
/// hour after it (TIMESTAMP).
pub fn batch_parameters(
    plan: &BackfillPlan,
    batch: &BatchPlan,
) -> Result<Vec<(&'static str, ScalarValue)>> {
    let (first, last) = batch_periods(plan, batch)?;
    if first.grain() == lakefill_table::time::Grain::Whole {
        // A table with no time column: a batch has no bounds.
        return Ok(Vec::new());
    }
    if first.grain().is_calendar() {
        let date = |d: chrono::NaiveDate| {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("the epoch is a date");
            ScalarValue::Date32(Some(
                i32::try_from((d - epoch).num_days()).unwrap_or(i32::MAX),
            ))
        };
        return Ok(vec![
            ("start", date(first.first_day())),
            ("end", date(last.last_day())),
            ("next", date(last.end().date())),
        ]);
    }
    let timezone: Option<Arc<str>> = match &plan.report.layout.time.encoding {
        TimeEncoding::Timestamp { timezone, .. } => timezone.as_deref().map(Into::into),
        _ => Some("UTC".into()),
    };
    let micros = |t: chrono::NaiveDateTime| {
        ScalarValue::TimestampMicrosecond(Some(t.and_utc().timestamp_micros()), timezone.clone())
    };
    Ok(vec![
        ("start", micros(first.start())),
        ("end", micros(last.start())),
        ("next", micros(last.end())),
    ])
}

/// Builds the session and the model's DataFrame for one batch.
pub async fn batch_dataframe(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    resources: &Resources,
) -> Result<(SessionContext, DataFrame)> {
    let ctx = resources.session();
    for source in &plan.sources {
        register_source(&ctx, plan, source, batch).await?;
    }
    let df = model_dataframe(&ctx, plan, batch).await?;
    Ok((ctx, df))
}

/// The model's SELECT in `ctx` (its sources registered), with the batch's parameters bound.
pub async fn model_dataframe(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    batch: &BatchPlan,
) -> Result<DataFrame> {
    let options = lakefill_table::sqltext::read_only();
    let model = &plan.model;
    let df = ctx
        .sql_with_options(model.sql(), options)
        .await
        .map_err(|source| Error::Model {
            path: model.path().to_path_buf(),
            message: format!("the SQL cannot be planned: {source}"),
            hint: "check column and table names (they are case-sensitive) against the sources"
                .into(),
        })?;
    let df = df
        .with_param_values(batch_parameters(plan, batch)?)
        .map_err(|source| Error::Model {
            path: model.path().to_path_buf(),
            message: format!("cannot bind `$start`/`$end`/`$next`: {source}"),
            hint: if plan.report.layout.is_timeless() {
                format!(
                    "`{}` has no time column, so a batch has no `$start`/`$end`/`$next`: drop them from the SELECT (scope the run with `--where`)",
                    plan.report.target
                )
            } else {
                "only `$start`, `$end` and `$next` may be used as parameters".into()
            },
        })?;
    under_predicate(plan, df)
}

/// The model's output under the run's `--where` predicate (`SELECT * FROM (model) WHERE
/// predicate`): DataFusion pushes it into the sources' scans where the columns line up, so a
/// scoped run reads the rows it needs, not the whole range's.
fn under_predicate(plan: &BackfillPlan, df: DataFrame) -> Result<DataFrame> {
    let Some(rows) = &plan.report.range.rows else {
        return Ok(df);
    };
    let predicate = rows
        .expr(df.schema().as_arrow())
        .map_err(|_| Error::Model {
            path: plan.model.path().to_path_buf(),
            message: format!(
                "the model's output lacks a column of `--where {rows}`: it has {}",
                produced_columns(&df).join(", ")
            ),
            hint: "scope the run by columns the model writes".into(),
        })?;
    df.filter(predicate)
        .query_context(|| format!("cannot keep the model's rows where {rows}"))
}

/// With `--where`, for each source: whether DataFusion pushed the predicate into its scan, as
/// the optimized plan of `batch` shows it against the plan without the predicate.
pub async fn where_reached(plan: &BackfillPlan, batch: &BatchPlan) -> Result<Vec<bool>> {
    use deltalake::datafusion::common::tree_node::TreeNode;
    use deltalake::datafusion::logical_expr::LogicalPlan;
    let filters = |optimized: &LogicalPlan| -> Result<std::collections::BTreeMap<String, usize>> {
        let mut counts = std::collections::BTreeMap::new();
        optimized
            .apply(|node| {
                if let LogicalPlan::TableScan(scan) = node {
                    *counts
                        .entry(scan.table_name.table().to_string())
                        .or_default() += scan.filters.len();
                }
                Ok(deltalake::datafusion::common::tree_node::TreeNodeRecursion::Continue)
            })
            .query_context(|| "cannot read the model's plan".into())?;
        Ok(counts)
    };
    let resources = Resources::new(None);
    let (_ctx, scoped) = batch_dataframe(plan, batch, &resources).await?;
    let mut unscoped_plan = plan.clone();
    unscoped_plan.report.range.rows = None;
    let (_ctx, unscoped) = batch_dataframe(&unscoped_plan, batch, &resources).await?;
    let optimize = |df: DataFrame| {
        df.into_optimized_plan()
            .query_context(|| "cannot optimize the model's plan".into())
    };
    let with = filters(&optimize(scoped)?)?;
    let without = filters(&optimize(unscoped)?)?;
    Ok(plan
        .sources
        .iter()
        .map(|s| {
            with.get(&s.name).copied().unwrap_or(0) > without.get(&s.name).copied().unwrap_or(0)
        })
        .collect())
}

/// Registers `source` under its name as a view restricted to the batch window.
pub async fn register_source(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    source: &PlannedSource,
    batch: &BatchPlan,
) -> Result<()> {
    let provider = source
        .table
        .table_provider()
        .await
        .query_context(|| format!("cannot scan source `{}`", source.name))?;
    register_source_with(ctx, plan, source, batch, provider).await
}

/// Registers `source`, read through `provider`, under its name as a view restricted to the batch
/// window.
pub async fn register_source_with(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    source: &PlannedSource,
    batch: &BatchPlan,
    provider: Arc<dyn deltalake::datafusion::catalog::TableProvider>,
) -> Result<()> {
    // A scan named by the source, so the plan can tell where a predicate reached.
    let scan = deltalake::datafusion::logical_expr::LogicalPlanBuilder::scan(
        source.name.as_str(),
        deltalake::datafusion::datasource::provider_as_source(provider),
        None,
    )
    .and_then(|builder| builder.build())
    .query_context(|| format!("cannot read source `{}`", source.name))?;
    let mut df = DataFrame::new(ctx.state(), scan);
    if let Some(overlay) = &source.overlay {
        df = overlaid(ctx, df, &source.name, &source.table, overlay)?;
    }
    // A table corrected by adjustments is read as its net rows.
    let nets = !matches!(plan.publish(), crate::plan::Publish::Rewrite)
        && source.name == plan.model.header().target
        && source.overlay.is_none();
    if nets && let crate::plan::Publish::AdjustmentsToCompanion(adjusted) = plan.publish() {
        // The table a companion corrects reads with the companion's rows (the window below
        // restricts both).
        let provider = adjusted
            .companion_rows
            .table_provider()
            .await
            .query_context(|| "cannot scan the companion table".into())?;
        let companion = ctx
            .read_table(provider)
            .query_context(|| "cannot read the companion table".into())?;
        df = df
            .union_by_name(companion)
            .query_context(|| "cannot read the table with its companion".into())?;
    }
    if let Some(window) = &source.window {
        let (low, high) = window_periods(plan, source, batch)?;
        let mut predicate =
            window
                .time
                .predicate(low, high, window.partition_column, &window.data_type)?;
        if batch.null {
            // The NULL partition is computed from the rows whose time is unknown.
            for column in window.time.encoding.columns() {
                predicate = predicate.or(Expr::Column(Column::new_unqualified(column)).is_null());
            }
        }
        df = df
            .filter(predicate)
            .query_context(|| format!("cannot restrict source `{}` to its window", source.name))?;
    }
    if nets {
        // A table corrected by adjustments reads as its net rows (each reversal cancels what
        // it reversed), also to a model that reads its own target.
        let rows = format!("__lf_rows_{}", source.name);
        let schema = df.schema().as_arrow().clone();
        ctx.register_table(rows.as_str(), df.into_view())
            .query_context(|| format!("cannot register source `{}`", source.name))?;
        return lakefill_validate::net::register_net(
            ctx,
            &source.name,
            &lakefill_table::sqltext::ident(&rows),
            &schema,
            &plan.rules.summed_measures(),
            &plan.rules.key,
        )
        .await;
    }
    ctx.register_table(source.name.as_str(), df.into_view())
        .query_context(|| format!("cannot register source `{}`", source.name))?;
    Ok(())
}

/// `df` (all of `table`) as its next version under `overlay`: its rows outside the overlaid
/// range, and the staged ones.
pub fn overlaid(
    ctx: &SessionContext,
    df: deltalake::datafusion::dataframe::DataFrame,
    name: &str,
    table: &deltalake::DeltaTable,
    overlay: &super::Overlay,
) -> Result<deltalake::datafusion::dataframe::DataFrame> {
    let schema = df.schema().as_arrow().clone();
    let in_range = overlay.layout.range_predicate(&overlay.range, &schema)?;
    let staged = (overlay.staged)(ctx, table, &schema)?;
    let mut staged = ctx
        .read_table(staged)
        .query_context(|| format!("cannot read the staged output of `{name}`"))?;
    if overlay.layout.rewrites_files(&overlay.range) {
        // The staged files also hold the rewritten files' other rows, carried over: the table
        // side already has them.
        staged = staged
            .filter(in_range.clone())
            .query_context(|| format!("cannot read the staged output of `{name}`"))?;
    }
    df.filter(in_range.is_not_true())
        .and_then(|kept| kept.union_by_name(staged))
        .query_context(|| format!("cannot overlay the staged output of `{name}`"))
}

/// The periods (of the source's grain) a source is read over for a batch: those the batch's
/// time touches, widened by the source's lookback and lookahead.
pub fn window_periods(
    plan: &BackfillPlan,
    source: &PlannedSource,
    batch: &BatchPlan,
) -> Result<(Period, Period)> {
    let Some(window) = &source.window else {
        return Err(Error::Internal(format!(
            "source `{}` has no window",
            source.name
        )));
    };
    let (first, last) = batch_periods(plan, batch)?;
    let grain = window.time.grain;
    let out_of_range = || Error::InvalidRange {
        message: format!(
            "the window of source `{}` around {}..{} leaves the calendar",
            source.name, batch.start, batch.end
        ),
    };
    let low = Period::containing(grain, first.start())
        .and_then(|p| p.offset(-i64::from(source.spec.lookback)))
        .ok_or_else(out_of_range)?;
    let last_instant = last.end() - chrono::TimeDelta::microseconds(1);
    let high = Period::containing(grain, last_instant)
        .and_then(|p| p.offset(i64::from(source.spec.lookahead)))
        .ok_or_else(out_of_range)?;
    Ok((low, high))
}

/// Compares the model's output with the target schema; names every column that differs.
/// Extra columns are refused unless the model adds columns, then they are added (nullable).
pub fn check_schema(
    plan: &BackfillPlan,
    output: &Schema,
    target: &Schema,
) -> Result<(SchemaRef, Vec<AddedColumn>)> {
    let mut problems = Vec::new();
    let adjustments = plan.report.publish == lakefill_table::adjustments::PublishMode::Adjustments;
    for field in target.fields() {
        match output.field_with_name(field.name()) {
            // Adjustments fill the lineage columns themselves.
            Err(_) if adjustments && lakefill_table::adjustments::is_lineage(field.name()) => {}
            // The writer assigns an identity column the model leaves out.
            Err(_)
                if plan
                    .report
                    .protocol
                    .identity
                    .iter()
                    .any(|c| c.name == *field.name()) => {}
            Err(_) => problems.push(format!(
                "  missing column `{}` (the table has {})",
                field.name(),
                field.data_type()
            )),
            Ok(produced) if normalize(produced.data_type()) != normalize(field.data_type()) => {
                problems.push(format!(
                    "  column `{}`: the model produces {}, the table has {}",
                    field.name(),
                    produced.data_type(),
                    field.data_type()
                ))
            }
            Ok(_) => {}
        }
    }
    let mut fields: Vec<Arc<deltalake::arrow::datatypes::Field>> =
        target.fields().iter().map(Arc::clone).collect();
    let mut added = Vec::new();
    for field in output.fields() {
        if target.field_with_name(field.name()).is_ok() {
            continue;
        }
        if !plan.model.adds_columns() {
            problems.push(format!(
                "  extra column `{}` ({}), which the table does not have (`schema = \"add-columns\"` in the header adds it)",
                field.name(),
                field.data_type()
            ));
            continue;
        }
        let data_type = normalize(field.data_type());
        match lakefill_table::protocol::delta_type(&data_type, &plan.report.protocol) {
            Ok(delta_type) => {
                added.push(AddedColumn {
                    name: field.name().clone(),
                    delta_type,
                });
                fields.push(Arc::new(deltalake::arrow::datatypes::Field::new(
                    field.name(),
                    data_type,
                    true,
                )));
            }
            Err(message) => problems.push(format!("  new column `{}`: {message}", field.name())),
        }
    }
    // The lineage columns the table lacks join it with the first publish (a companion table
    // has them from its creation).
    if adjustments && plan.target_config.adjustments().is_none() {
        for column in lakefill_table::adjustments::LINEAGE_COLUMNS {
            if target.field_with_name(column).is_err() && output.field_with_name(column).is_err() {
                added.push(AddedColumn {
                    name: column.to_string(),
                    delta_type: "string".into(),
                });
                fields.push(Arc::new(deltalake::arrow::datatypes::Field::new(
                    column,
                    DataType::Utf8,
                    true,
                )));
            }
        }
    }
    if problems.is_empty() {
        Ok((Arc::new(Schema::new(fields)), added))
    } else {
        Err(Error::SchemaMismatch {
            model: format!("{}@{}", plan.model.name(), plan.model.version()),
            table: plan.report.target.clone(),
            problems,
        })
    }
}

/// The type as Delta stores it (see [`lakefill_table::types::canonical`]).
pub fn normalize(data_type: &DataType) -> DataType {
    lakefill_table::types::canonical(data_type)
}
