//! The validation phase of a run: the old and new rows side by side in one session, the checks
//! of the model and the table, and what the staged rows change per partition.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::datafusion::prelude::SessionContext;
use serde_json::json;

use lakefill_log::journal::BatchRecord;
use lakefill_log::journal::Journal;
use lakefill_log::journal::PartitionChange;
use lakefill_recompute::plan::BackfillPlan;
use lakefill_table::error::Error;
use lakefill_table::error::QueryContext;
use lakefill_table::error::Result;
use lakefill_table::partition::CARRIED_LABEL;
use lakefill_table::partition::Layout;
use lakefill_table::partition::PartitionRange;
use lakefill_table::partition::PartitionValues;
use lakefill_table::partition::label_of;
use lakefill_table::resources::Resources;
use lakefill_table::rowhash::RowChecksum;
use lakefill_table::staged::StagedTable;
use lakefill_validate::CheckResult;
use lakefill_validate::KnownSide;
use lakefill_validate::PartitionKey;
use lakefill_validate::ValidationReport;
use lakefill_validate::checks::Known;
use lakefill_validate::rows::counts_from;
use lakefill_validate::spec::LoggedChecksums;
use lakefill_validate::validate;

/// Registers `previous` (the target at the read version, affected partitions only) and `output`
/// (the staged files) in a new session and validates them.
/// In a cascade, each node staged before this one as `staged.<table>` (its next version: what
/// the table holds once the cascade is published), for the checks.
async fn register_cascade_staged(ctx: &SessionContext, plan: &BackfillPlan) -> Result<()> {
    use deltalake::datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
    if plan.cascade_staged.is_empty() {
        return Ok(());
    }
    let schema = Arc::new(MemorySchemaProvider::new());
    for (name, table, overlay) in &plan.cascade_staged {
        let provider = table
            .table_provider()
            .await
            .query_context(|| format!("cannot scan `{name}`"))?;
        let df = ctx
            .read_table(provider)
            .query_context(|| format!("cannot read `{name}`"))?;
        let next = lakefill_recompute::plan::query::overlaid(ctx, df, name, table, overlay)?;
        schema
            .register_table(name.clone(), next.into_view())
            .query_context(|| format!("cannot register `staged.{name}`"))?;
    }
    let catalog = ctx
        .catalog(&ctx.state().config().options().catalog.default_catalog)
        .ok_or_else(|| Error::Internal("the session has no default catalog".into()))?;
    catalog
        .register_schema("staged", schema)
        .query_context(|| "cannot register the staged tables of the cascade".into())?;
    Ok(())
}

/// The check that the total of `measure` over the new rows equals the total of `column` of
/// `table` over the same range: `table` as the cascade staged it, else as the model read it.
async fn conserve_with(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    measure: &str,
    table: &str,
    column: &str,
) -> Result<CheckResult> {
    use lakefill_table::sqltext::ident;
    let name = format!("conserve_with({measure} = {table}.{column})");
    let other = if plan.cascade_staged.iter().any(|(t, _, _)| t == table) {
        format!("staged.{}", ident(table))
    } else if let Some(source) = plan.sources.iter().find(|s| s.name == table) {
        let provider = source
            .table
            .table_provider()
            .await
            .query_context(|| format!("cannot scan `{table}`"))?;
        let view = format!("__lf_conserve_{table}");
        ctx.register_table(view.as_str(), provider)
            .query_context(|| format!("cannot register `{table}`"))?;
        ident(&view)
    } else {
        return Err(Error::Model {
            path: plan.model.path().to_path_buf(),
            message: format!(
                "`validate.conserve_with` compares with `{table}`, which is neither a table of the cascade staged before this model nor a source of it"
            ),
            hint: format!(
                "run it with `--cascade` from a model upstream of `{table}`'s, or read `{table}` as a source of the model"
            ),
        });
    };
    let other_schema = ctx
        .table(other.as_str())
        .await
        .query_context(|| format!("cannot read `{table}`"))?
        .schema()
        .as_arrow()
        .clone();
    let in_range = journal
        .inputs.layout
        .range_predicate(&journal.inputs.range, &other_schema)
        .map_err(|_| Error::Model {
            path: plan.model.path().to_path_buf(),
            message: format!(
                "`validate.conserve_with` cannot restrict `{table}` to the range: it lacks the target's time column(s) {}",
                journal.inputs.layout.time.encoding.columns().join(", ")
            ),
            hint: "compare with a table partitioned by the same time column".into(),
        })?;
    let other_total = ctx
        .table(other.as_str())
        .await
        .and_then(|df| df.filter(in_range))
        .and_then(|df| {
            df.aggregate(
                vec![],
                vec![deltalake::datafusion::functions_aggregate::expr_fn::sum(
                    deltalake::datafusion::prelude::cast(
                        deltalake::datafusion::logical_expr::Expr::Column(
                            deltalake::datafusion::common::Column::new_unqualified(column),
                        ),
                        deltalake::arrow::datatypes::DataType::Float64,
                    ),
                )],
            )
        })
        .query_context(|| format!("cannot sum `{table}.{column}`"))?;
    let own_total = ctx
        .sql(&format!(
            "SELECT SUM(CAST({} AS DOUBLE)) FROM output",
            ident(measure)
        ))
        .await
        .query_context(|| format!("cannot sum `{measure}`"))?;
    let first = |batches: Vec<deltalake::arrow::array::RecordBatch>| {
        batches
            .first()
            .and_then(|b| {
                use deltalake::arrow::array::{Array, AsArray};
                let c = b
                    .column(0)
                    .as_primitive::<deltalake::arrow::datatypes::Float64Type>();
                (b.num_rows() > 0 && c.is_valid(0)).then(|| c.value(0))
            })
            .unwrap_or(0.0)
    };
    let other_total = first(
        other_total
            .collect()
            .await
            .query_context(|| format!("cannot sum `{table}.{column}`"))?,
    );
    let own_total = first(
        own_total
            .collect()
            .await
            .query_context(|| format!("cannot sum `{measure}`"))?,
    );
    let tolerance = 1e-9 * other_total.abs().max(1.0);
    let failures = if (own_total - other_total).abs() > tolerance {
        vec![json!({
            "measure": measure, "total": own_total, "other": format!("{table}.{column}"),
            "other_total": other_total, "difference": own_total - other_total,
        })]
    } else {
        Vec::new()
    };
    Ok(CheckResult::new(name, failures, Vec::new()))
}

/// What this process's staging kept for validation, so that it does not read again what staging
/// read or wrote.
#[derive(Default)]
pub(crate) struct FromStaging {
    /// The new rows as the writers hashed them, for the key merge.
    pub(crate) capture: Option<Arc<lakefill_validate::keymerge::Capture>>,
    /// Adjustments: the old net rows of each batch, and the proof's sums staging took.
    pub(crate) kept_net: Option<crate::adjust::Kept>,
    /// By deletion vectors: the old rows as staging hashed them while it matched the new rows
    /// against them.
    pub(crate) old_rows: Option<Arc<lakefill_validate::keymerge::Capture>>,
    /// Where the key merge records how each changed key changed, for the change data feed.
    pub(crate) changes: Option<Arc<lakefill_validate::keymerge::KeyChanges>>,
}

/// Validates the run's staged rows against the old rows at the read version (with what staging
/// kept of them), with `extra_checks`; `compare_rows` false runs the extra checks only.
pub(crate) async fn run_validation(
    plan: &BackfillPlan,
    journal: &Journal,
    sample: usize,
    extra_checks: Vec<CheckResult>,
    resources: &Resources,
    compare_rows: bool,
    staged: FromStaging,
) -> Result<ValidationReport> {
    let FromStaging {
        capture,
        kept_net,
        old_rows: old_files,
        changes,
    } = staged;
    let (kept_net, staged_sums, old_rows) = match kept_net {
        Some(kept) => (Some(kept.nets), kept.sums, kept.old_rows),
        None => (
            None,
            None,
            old_files.filter(|c| read_every_old_file(plan, journal, c)),
        ),
    };
    let rules = &plan.rules;
    if !compare_rows {
        return Ok(ValidationReport {
            passed: extra_checks.iter().all(|c| c.passed),
            checks: extra_checks,
            ..ValidationReport::default()
        });
    }
    let layout = &journal.inputs.layout;
    let ctx = comparison_session(
        resources.session(),
        &plan.target,
        layout,
        &journal.inputs.range,
    )
    .await?;
    // `[validate] decimals`: rows are compared with their floats rounded, in this session's
    // row hashes only (checks and protocol rules see the values as they are).
    let rounding = rules.decimals.is_some();
    lakefill_table::rowhash::register_hash_functions_rounding(&ctx, rules.decimals);
    let adjustments =
        journal.inputs.publish_as == lakefill_table::adjustments::PublishMode::Adjustments;
    // The schema the run's files were staged with: the plan's, else the target's.
    let write_schema = Arc::new(lakefill_recompute::plan::query::target_schema(plan)?);
    let target_schema = table_schema(plan)?;
    // Holds the spill files of the old net rows (adjustments) while validation reads them.
    let _kept = register_sides(
        &ctx,
        plan,
        journal,
        &write_schema,
        &target_schema,
        adjustments.then_some((resources, kept_net)),
    )
    .await?;
    let mut extra_checks = extra_checks;
    if adjustments {
        extra_checks.extend(
            adjustments_conserved(
                &ctx,
                plan,
                journal,
                &write_schema,
                sample,
                staged_sums.as_ref(),
            )
            .await?,
        );
    }
    for (measure, table, column) in &rules.conserve_with {
        extra_checks.push(conserve_with(&ctx, plan, journal, measure, table, column).await?);
    }
    let (mut new_side, carried) = new_side(journal, capture, plan);
    // Every column but the partition columns, in the table's order: what makes a row.
    let checksum_columns: Vec<String> = target_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !layout.partition_columns.contains(name))
        .collect();
    if layout.rewrites_files(&journal.inputs.range) && !journal.inputs.affected_files.is_empty() {
        extra_checks.push(
            carried_check(
                plan,
                journal,
                // Carried rows must be exactly as they were: hashed without rounding.
                &resources.session(),
                &write_schema,
                carried.unwrap_or_default(),
            )
            .await?,
        );
    }
    new_side.mostly_changed = mostly_changed(journal);
    // The old rows of files an earlier run wrote carry their checksums in the log (not those
    // of a table corrected by adjustments: its old rows are its net rows).
    let logged = (!layout.rewrites_files(&journal.inputs.range) && !adjustments)
        .then(|| {
            logged_checksums(
                plan,
                layout,
                &journal.inputs.range,
                &target_schema,
                &checksum_columns,
            )
        })
        .transpose()?
        .flatten()
        .filter(|_| !rounding);
    if rounding {
        // Staging hashed the rows as written; rounded, the new side is hashed again from the
        // staged files.
        new_side.checksums = None;
        new_side.captured = None;
    }
    // The old net rows as the adjustments' difference hashed them: when it read every batch's
    // (the attempts finished are the journal's adjustment batches) and they are `previous`'s
    // rows, with the lineage columns it did not read NULL. (The old files staging read by
    // deletion vectors were checked above.)
    let old_rows = match old_rows {
        Some(captured) if !adjustments => (!rounding).then_some(captured),
        Some(captured) if !rounding && previous_lineage_null(&ctx).await? => captured
            .covers(&batch_files(&journal.progress.adjustments))
            .then_some(captured),
        _ => None,
    };
    // The keys around the range, for the key merge to look up (see `crate::run::edges`).
    let started = std::time::Instant::now();
    let edges = crate::run::edges::EdgeScan::prepare(plan, resources).await?;
    let mut edges_ms = started.elapsed().as_millis() as u64;
    let mut report = validate(
        &ctx,
        &PartitionKey::Time(layout.clone()),
        rules,
        sample,
        Known {
            new: Some(new_side),
            old_checksums: logged,
            old_captured: old_rows,
            edges: edges.as_ref().map(crate::run::edges::EdgeScan::probe),
            changes,
            appended: if adjustments { "adjustments" } else { "output" },
        },
        checksum_columns,
        extra_checks,
    )
    .await?;
    if let Some(edges) = edges {
        let started = std::time::Instant::now();
        let check = edges.check(plan, resources, &report.comparison).await?;
        edges_ms += started.elapsed().as_millis() as u64;
        report.passed &= check.passed;
        report.checks.push(check);
    }
    let started = std::time::Instant::now();
    if let Some(check) =
        crate::run::scope_edges::check(&ctx, plan, resources, &report.comparison).await?
    {
        report.passed &= check.passed;
        report.checks.push(check);
    }
    edges_ms += started.elapsed().as_millis() as u64;
    report.edges_ms = edges_ms;
    if rules.decimals.is_none()
        && let Some(note) = float_noise(&report.comparison, &target_schema)
    {
        report.notes.push(note);
    }
    Ok(report)
}

/// Registers what validation compares in `ctx`: `previous` (the net rows for adjustments),
/// `output` (the staged rows of the range; by rows also `staged`, every staged row), and the
/// cascade's other nodes as `staged.<table>`. `adjustments`: the run publishes by them, with the
/// net rows staging kept of each batch, if it did. Returns the net rows read, which hold the
/// spill files of their grouped part (see [`lakefill_validate::net::KeptNet`]): they must
/// outlive every query of `previous`.
async fn register_sides(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    write_schema: &deltalake::arrow::datatypes::SchemaRef,
    target_schema: &deltalake::arrow::datatypes::Schema,
    adjustments: Option<(&Resources, Option<crate::adjust::KeptNets>)>,
) -> Result<Vec<lakefill_validate::net::KeptNet>> {
    let mut kept = Vec::new();
    if let Some((resources, staged)) = adjustments {
        // The old rows of a table corrected by adjustments are its net rows (with a companion,
        // of the table and the companion together).
        ctx.deregister_table("previous")
            .query_context(|| "cannot take the old rows back".into())?;
        // The rows as stored, which the balance of the adjustments reads.
        lakefill_recompute::plan::adjust::register_ledger_rows(
            ctx,
            "__lf_ledger",
            plan,
            &journal.inputs.range,
        )
        .await?;
        if stored_rows_are_net(ctx).await? {
            let stored = ctx
                .table("__lf_ledger")
                .await
                .query_context(|| "cannot read the old rows".into())?;
            ctx.register_table("previous", stored.into_view())
                .query_context(|| "cannot register the old rows".into())?;
        } else {
            kept = register_previous_net(ctx, plan, journal, resources, staged).await?;
        }
    }
    register_output(ctx, plan, journal, write_schema, target_schema).await?;
    register_cascade_staged(ctx, plan).await?;
    Ok(kept)
}

/// Whether the lineage columns of an adjustments run's `previous` are NULL in every row: it is
/// net rows (which leave them NULL), or stored rows without them.
async fn previous_lineage_null(ctx: &SessionContext) -> Result<bool> {
    if !stored_rows_are_net(ctx).await? {
        return Ok(true);
    }
    let previous = ctx
        .table("previous")
        .await
        .query_context(|| "cannot read the old rows".into())?;
    Ok(!previous
        .schema()
        .fields()
        .iter()
        .any(|f| lakefill_table::adjustments::is_lineage(f.name())))
}

/// Whether the rows of the table an adjustments run corrects (registered as `__lf_ledger`) are
/// their own net rows: they have no `_lakefill_kind` column, so no adjustment was ever appended
/// to them ([`lakefill_validate::net`] nets them as they are).
async fn stored_rows_are_net(ctx: &SessionContext) -> Result<bool> {
    let stored = ctx
        .table("__lf_ledger")
        .await
        .query_context(|| "cannot read the old rows".into())?;
    Ok(stored
        .schema()
        .field_with_unqualified_name(lakefill_table::adjustments::KIND_COLUMN)
        .is_err())
}

/// Registers `previous` as the old net rows of an adjustments run. The proof and the comparison
/// both read them, so they are not grouped for each read: when staging kept every batch's net
/// rows (this process staged them all), those are read, batch by batch; otherwise (a resumed
/// run) they are grouped here, once, into a spill file.
async fn register_previous_net(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    resources: &Resources,
    staged: Option<crate::adjust::KeptNets>,
) -> Result<Vec<lakefill_validate::net::KeptNet>> {
    use lakefill_recompute::plan::adjust::{register_kept_net_rows, register_net_rows_spilled};
    let report = &plan.report;
    let batches = &report.batches;
    // (When no batch's grouped rows were spilled, one scan of the range costs less than one per
    // batch.)
    let covered = staged.filter(|kept| {
        kept.len() == batches.len()
            && batches.iter().all(|b| kept.contains_key(&b.index))
            && kept
                .values()
                .any(lakefill_validate::net::KeptNet::is_spilled)
    });
    let Some(mut staged) = covered.filter(|_| !batches.is_empty()) else {
        return Ok(vec![
            register_net_rows_spilled(
                ctx,
                "previous",
                plan,
                &journal.inputs.range,
                &resources.disk_manager(),
            )
            .await?,
        ]);
    };
    let mut kept = Vec::with_capacity(batches.len());
    let mut parts = Vec::with_capacity(batches.len());
    for batch in batches {
        let periods = PartitionRange {
            from: batch.start.clone(),
            to: batch.end.clone(),
            grain: report.range.grain,
            include_null: false,
            rows: None,
        };
        let name = format!("__lf_previous_{}", batch.index);
        let net = staged.remove(&batch.index).unwrap_or_default();
        register_kept_net_rows(ctx, &name, plan, &periods, &net).await?;
        parts.push(format!("SELECT * FROM {name}"));
        kept.push(net);
    }
    let previous = ctx
        .sql(&parts.join(" UNION ALL "))
        .await
        .query_context(|| "cannot read the old net rows staging kept".into())?;
    ctx.register_table("previous", previous.into_view())
        .query_context(|| "cannot register the old rows".into())?;
    Ok(kept)
}

/// Registers `output`: the staged rows of the range (by rows also `staged`, every staged row).
pub(crate) async fn register_output(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    write_schema: &deltalake::arrow::datatypes::SchemaRef,
    target_schema: &deltalake::arrow::datatypes::Schema,
) -> Result<()> {
    let layout = &journal.inputs.layout;
    let adds: Vec<_> = journal.new_row_files().cloned().collect();
    let staged = StagedTable::register_store(
        ctx,
        &plan.target,
        write_schema,
        &layout.partition_columns,
        &adds,
        &journal.run_id,
    )?;
    if layout.rewrites_files(&journal.inputs.range) {
        // Staged files hold the range's new rows and the rows carried over: `output` is the
        // range's.
        ctx.register_table("staged", staged)
            .query_context(|| "cannot register the staged files".into())?;
        let in_range = layout.range_predicate(&journal.inputs.range, target_schema)?;
        let output = ctx
            .table("staged")
            .await
            .and_then(|df| df.filter(in_range))
            .query_context(|| "cannot restrict the staged rows to the range".into())?;
        ctx.register_table("output", output.into_view())
            .query_context(|| "cannot register the staged rows".into())?;
    } else {
        ctx.register_table("output", staged)
            .query_context(|| "cannot register the staged files".into())?;
    }
    Ok(())
}

/// The proof that the old net rows plus the adjustments give the new rows, per partition and
/// key (the adjustment files registered as `adjustments`), and the balance of the table's stored
/// rows (`__lf_ledger`), which checks the net rows the proof starts from. `staged`: the sums of
/// the old net rows and the new rows this process's staging took.
async fn adjustments_conserved(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    write_schema: &deltalake::arrow::datatypes::SchemaRef,
    sample: usize,
    staged: Option<&crate::adjust::StagedSums>,
) -> Result<Vec<CheckResult>> {
    let (layout, rules) = (&journal.inputs.layout, &plan.rules);
    let adds: Vec<_> = journal
        .progress
        .adjustments
        .iter()
        .flat_map(|b| b.files.iter().cloned())
        .collect();
    StagedTable::register_as(
        ctx,
        "adjustments",
        &plan.target,
        write_schema,
        &layout.partition_columns,
        &adds,
        &journal.run_id,
    )?;
    let measures = rules.summed_measures();
    let compared = crate::adjust::Compared {
        schema: write_schema,
        partition_columns: &layout.partition_columns,
        key: &rules.key,
        measures: &measures,
        previous_is_stored: stored_rows_are_net(ctx).await?,
        partitions: staged_partitions(journal).max(journal.inputs.range.periods().len()),
    };
    let (proof, balance) = crate::adjust::prove(ctx, &compared, sample, staged).await?;
    Ok(vec![proof, balance])
}

/// How many partitions the run's staged files (new rows and adjustments) are in.
fn staged_partitions(journal: &Journal) -> usize {
    let adjustments = journal
        .progress
        .adjustments
        .iter()
        .flat_map(|b| b.files.iter());
    journal
        .new_row_files()
        .chain(adjustments)
        .map(|add| {
            let mut values: Vec<_> = add.partition_values.iter().collect();
            values.sort();
            values
        })
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// What staging knows of the new rows without reading them: per partition their counts, measure
/// sums and checksums, and what this process's writers hashed (when they staged every batch);
/// and the checksum of the rows carried over unchanged (by rows).
fn new_side(
    journal: &Journal,
    capture: Option<Arc<lakefill_validate::keymerge::Capture>>,
    plan: &BackfillPlan,
) -> (KnownSide, Option<RowChecksum>) {
    let (layout, rules) = (&journal.inputs.layout, &plan.rules);
    let mut checksums = staged_checksums(journal);
    let carried = checksums.remove(CARRIED_LABEL);
    let mut new_side = KnownSide {
        rows: counts_from(
            journal
                .progress
                .batches
                .iter()
                .flat_map(|b| b.rows.iter().map(|(p, n)| (p, *n)))
                .filter(|(p, _)| p.as_str() != CARRIED_LABEL),
        ),
        sums: Some(BTreeMap::new()),
        checksums: Some(checksums),
        mostly_changed: false,
        // What this process's writers hashed, if they staged every batch of the journal.
        captured: capture.filter(|c| {
            let batches: Vec<(usize, std::collections::BTreeSet<String>)> = journal
                .progress
                .batches
                .iter()
                .map(|b| (b.index, b.files.iter().map(|a| a.path.clone()).collect()))
                .collect();
            c.covers(&batches)
        }),
    };
    for batch in &journal.progress.batches {
        for (partition, measures) in batch
            .sums
            .iter()
            .filter(|(p, _)| p.as_str() != CARRIED_LABEL)
        {
            let entry = new_side
                .sums
                .get_or_insert_with(BTreeMap::new)
                .entry(partition.clone())
                .or_default();
            for (measure, sum) in measures {
                *entry.entry(measure.clone()).or_default() += sum;
            }
        }
    }
    // Sums are computed while staging only for measures that are file columns.
    if rules
        .summed_measures()
        .iter()
        .any(|m| layout.partition_columns.contains(m))
    {
        new_side.sums = None;
    }
    (new_side, carried)
}

/// The checksum of the staged rows of each partition (by rows, of the rows carried over under
/// [`CARRIED_LABEL`]), as the run's writers hashed them.
pub(crate) fn staged_checksums(journal: &Journal) -> BTreeMap<String, RowChecksum> {
    let mut checksums: BTreeMap<String, RowChecksum> = BTreeMap::new();
    for batch in &journal.progress.batches {
        for (partition, checksum) in &batch.checksums {
            checksums
                .entry(partition.clone())
                .or_default()
                .merge(checksum);
        }
    }
    checksums
}

/// Whether most partitions' row counts changed (the log's against staging's): a fix that moves
/// rows; then the key merge reads the old side whole, once.
fn mostly_changed(journal: &Journal) -> bool {
    let counted: Vec<bool> = journal
        .progress
        .partitions
        .iter()
        .filter_map(|p| p.old_rows.map(|old| old != p.new_rows))
        .collect();
    !counted.is_empty() && counted.iter().filter(|d| **d).count() * 10 >= counted.len() * 9
}

/// A note when every sampled changed row differs only in float or double columns, each by less
/// than one part in 10^9: the model most likely computes the same numbers in another order, and
/// `[validate] decimals` compares them to a number of places (#32).
fn float_noise(
    comparison: &lakefill_validate::Comparison,
    schema: &deltalake::arrow::datatypes::Schema,
) -> Option<String> {
    use deltalake::arrow::datatypes::DataType;
    let samples = &comparison.samples.changed;
    if comparison.totals.changed == 0 || samples.is_empty() {
        return None;
    }
    let is_float = |column: &str| {
        schema.field_with_name(column).is_ok_and(|f| {
            matches!(
                f.data_type(),
                DataType::Float16 | DataType::Float32 | DataType::Float64
            )
        })
    };
    let number = |v: &serde_json::Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse::<f64>().ok()))
    };
    let mut columns = std::collections::BTreeSet::new();
    for sample in samples {
        let (Some(old), Some(new)) = (sample["old"].as_object(), sample["new"].as_object()) else {
            return None;
        };
        for (column, value) in new {
            let (Some(a), Some(b)) = (old.get(column).and_then(number), number(value)) else {
                return None;
            };
            let scale = a.abs().max(b.abs()).max(f64::MIN_POSITIVE);
            if !is_float(column) || (a - b).abs() / scale >= 1e-9 {
                return None;
            }
            columns.insert(column.clone());
        }
    }
    Some(format!(
        "the {} changed rows sampled differ only in float columns ({}), each by less than one part in 10^9: the same numbers computed in another order? `decimals = N` under `[validate]` compares floats to N decimal places",
        samples.len(),
        columns.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Each batch of `records` with its files' paths: what a capture's finished attempts must be
/// ([`lakefill_validate::keymerge::Capture::covers`]).
fn batch_files(records: &[BatchRecord]) -> Vec<(usize, std::collections::BTreeSet<String>)> {
    records
        .iter()
        .map(|b| (b.index, b.files.iter().map(|a| a.path.clone()).collect()))
        .collect()
}

/// Whether the old rows staging hashed while it matched the new rows against them by deletion
/// vectors (`captured`) are the old side: every batch of the journal staged by this process
/// (each attempt finished is a batch, with its files), and every old file of the plan by vectors
/// read whole (every file of the range at the read version; with `--where`, every file that may
/// hold rows it selects). Without `--where`, a partition the model left without rows is not read
/// by staging.
fn read_every_old_file(
    plan: &BackfillPlan,
    journal: &Journal,
    captured: &lakefill_validate::keymerge::Capture,
) -> bool {
    let batches = batch_files(&journal.progress.batches);
    let Some(read) = captured.read_whole() else {
        return false;
    };
    let Some(vectors) = &plan.vectors else {
        return false;
    };
    let old: std::collections::BTreeSet<String> = vectors
        .files
        .values()
        .flatten()
        .map(|file| file.path.clone())
        .collect();
    let whole = captured.covers(&batches) && read == old;
    if !whole {
        tracing::debug!(
            read = read.len(),
            old = old.len(),
            "the old rows staging read by deletion vectors are not the whole old side: read again"
        );
    }
    whole
}

/// The partitions of `range` at the read version, each with its row checksum when every file
/// of it carries its own, as lakefill writes them into the `add` action of a staged file
/// ([`lakefill_table::rowhash::FileDigest`]: of that file, of these `columns` with the types they have
/// now, and of the rows its deletion vector leaves, if it has one: a file cut by a fix published by
/// vectors carries the digest of its rows after the cut). Such a partition's old rows need not be
/// read to be compared.
pub(crate) fn logged_checksums(
    plan: &BackfillPlan,
    layout: &Layout,
    range: &PartitionRange,
    schema: &deltalake::arrow::datatypes::Schema,
    columns: &[String],
) -> Result<Option<LoggedChecksums>> {
    use lakefill_table::rowhash::{DIGEST_TAG, FileDigest};
    let fields: Vec<_> = columns
        .iter()
        .filter_map(|c| schema.field_with_name(c).ok().map(|f| Arc::new(f.clone())))
        .collect();
    let fingerprint = lakefill_table::rowhash::columns_fingerprint(&fields);
    let snapshot = plan.target.snapshot().map_err(|source| Error::Delta {
        context: "cannot read the target's snapshot".into(),
        source: Box::new(source),
    })?;
    // Per partition: the sum of its files' checksums, or `None` once one file has none.
    let mut partitions = LoggedChecksums::new();
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot)?;
    for file in snapshot.log_data().iter() {
        let values = mapping.logical_values(file.partition_values_map());
        if layout.time.period_of(&values).is_err() {
            // A partition value that is no period of the grain: which rows of the range are whose
            // is for the scan to tell.
            return Ok(None);
        }
        let Some(label) = layout.label_in(range, &values) else {
            continue;
        };
        #[expect(
            deprecated,
            reason = "the log's own add entry is the only way delta-rs 1.1 gives a file's tags"
        )]
        let tags = file.add_action().tags;
        let path = file.path();
        // The rows a file holds: its records less those its deletion vector deletes.
        let vector = file.deletion_vector_descriptor();
        let live = file.num_records().and_then(|records| {
            let deleted = vector.as_ref().map_or(0, |v| v.cardinality);
            u64::try_from(i64::try_from(records).ok()? - deleted).ok()
        });
        let vector = vector.as_ref().map(lakefill_table::vectors::fingerprint);
        let digest = tags
            .as_ref()
            .and_then(|tags| tags.get(DIGEST_TAG).cloned().flatten())
            .and_then(|tag| FileDigest::read(&tag, &path, live, vector.as_deref(), &fingerprint));
        let entry = partitions
            .entry(label)
            .or_insert_with(|| Some(RowChecksum::default()));
        match (entry.as_mut(), digest) {
            (Some(sum), Some(digest)) => sum.merge(&digest),
            _ => *entry = None,
        }
    }
    Ok(Some(partitions))
}

/// By rows: the rows of the rewritten files outside the range must be staged again exactly as
/// they were (with the run's added columns NULL, as staging writes them). Compares the checksum
/// of what staging carried (every column of `write_schema` but the partition columns) with the
/// old rows, read again.
pub(crate) async fn carried_check(
    plan: &BackfillPlan,
    journal: &Journal,
    ctx: &SessionContext,
    write_schema: &deltalake::arrow::datatypes::SchemaRef,
    carried: RowChecksum,
) -> Result<CheckResult> {
    use deltalake::datafusion::common::{Column, ScalarValue};
    use deltalake::datafusion::logical_expr::{Expr, cast};
    let columns: Vec<String> = write_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !journal.inputs.layout.partition_columns.contains(name))
        .collect();
    let added: Vec<&str> = journal
        .inputs
        .added_columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let projection: Vec<Expr> = write_schema
        .fields()
        .iter()
        .map(|f| {
            if added.contains(&f.name().as_str()) {
                cast(
                    Expr::Literal(ScalarValue::Null, None),
                    f.data_type().clone(),
                )
                .alias(f.name())
            } else {
                Expr::Column(Column::new_unqualified(f.name()))
            }
        })
        .collect();
    let provider = plan
        .target
        .table_provider()
        .with_file_paths(
            journal
                .inputs
                .affected_files
                .iter()
                .map(|p| lakefill_table::storage::selection_path(p)),
        )
        .await
        .query_context(|| "cannot scan the files the backfill rewrites".into())?;
    let schema = table_schema(plan)?;
    let outside = journal
        .inputs
        .layout
        .range_predicate(&journal.inputs.range, &schema)?
        .is_not_true();
    let old = ctx
        .read_table(provider)
        .and_then(|df| df.filter(outside))
        .and_then(|df| df.select(projection))
        .query_context(|| "cannot select the rows outside the range".into())?;
    ctx.register_table("__lf_carried_old", old.into_view())
        .query_context(|| "cannot register the rows outside the range".into())?;
    let expected =
        lakefill_validate::checks::checksum_of(ctx, "__lf_carried_old", &columns).await?;
    let mut check = CheckResult::new(
        "carried rows unchanged",
        if expected == carried {
            Vec::new()
        } else {
            vec![json!({
                "old_rows": expected.rows,
                "carried_rows": carried.rows,
                "message": "the rows outside the range of the rewritten files were not carried over exactly",
            })]
        },
        Vec::new(),
    );
    // A rewrite that changes rows outside the range is never published, forced or not.
    check.protocol = true;
    Ok(check)
}

/// A session with `previous` registered: `table` restricted to the partitions of `range`.
pub(crate) async fn comparison_session(
    ctx: SessionContext,
    table: &DeltaTable,
    layout: &Layout,
    range: &PartitionRange,
) -> Result<SessionContext> {
    lakefill_validate::rows::register_range(&ctx, "previous", table, layout, range).await?;
    Ok(ctx)
}

/// Old and new row counts per partition: the plan's partitions plus any the model created.
pub(crate) fn partition_changes(
    plan: &BackfillPlan,
    batches: &[BatchRecord],
) -> Vec<PartitionChange> {
    let layout = &plan.report.layout;
    let mut new_rows: BTreeMap<String, u64> = BTreeMap::new();
    let mut new_files: BTreeMap<String, u64> = BTreeMap::new();
    for record in batches {
        for (partition, rows) in record
            .rows
            .iter()
            .filter(|(p, _)| p.as_str() != CARRIED_LABEL)
        {
            *new_rows.entry(partition.clone()).or_default() += rows;
        }
        for add in record.files.iter().filter(|_| !layout.by_rows) {
            let values: PartitionValues = add
                .partition_values
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            *new_files.entry(label_of(layout, &values)).or_default() += 1;
        }
    }
    let mut partitions: Vec<PartitionChange> = plan
        .report
        .partitions
        .iter()
        .map(|p| PartitionChange {
            value: p.value.clone(),
            old_rows: p.rows,
            new_rows: new_rows.get(&p.value).copied().unwrap_or(0),
            old_files: p.files,
            new_files: new_files.get(&p.value).copied().unwrap_or(0),
        })
        .collect();
    for (value, rows) in &new_rows {
        if !partitions.iter().any(|p| &p.value == value) {
            partitions.push(PartitionChange {
                value: value.clone(),
                old_rows: Some(0),
                new_rows: *rows,
                old_files: 0,
                new_files: new_files.get(value).copied().unwrap_or(0),
            });
        }
    }
    partitions.sort_by(|a, b| a.value.cmp(&b.value));
    partitions
}

/// The target's schema at the read version, as Arrow.
pub(crate) fn table_schema(plan: &BackfillPlan) -> Result<deltalake::arrow::datatypes::SchemaRef> {
    Ok(plan
        .target
        .snapshot()
        .map_err(|source| Error::Delta {
            context: "cannot read the target's snapshot".into(),
            source: Box::new(source),
        })?
        .snapshot()
        .arrow_schema())
}
