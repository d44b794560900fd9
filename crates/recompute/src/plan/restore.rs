//! The plan of a logical revert (`lakefill revert RUN_ID --logical`): a backfill of the run's
//! range whose "model" is the table as it was just before the run's commit.
//!
//! It stages the range's rows read from that version (through the same batches, windows,
//! journal and validation as any run: old = the range now, new = the range restored), and
//! publishes them with the usual conflict check. Unlike a revert by files, it does not need the
//! range untouched since the run: compaction, later appends or other fixes in the range are
//! replaced too (the plan names them), so the range ends exactly as it was before the run.

use std::collections::BTreeMap;

use deltalake::DeltaTable;

use super::{
    BackfillPlan, DEFAULT_MAX_PARTITIONS, PlanReport, PlannedSource, SourcePlan, affected, batches,
    check_model_unedited, find_downstream, log_files, source_window, storage_descriptions,
};
use lakefill_log::journal::Journal;
use lakefill_log::journal::RunKind;
use lakefill_log::published_sequence;
use lakefill_table::adjustments::PublishMode;
use lakefill_table::config::{Project, TableConfig};
use lakefill_table::error::{DeltaContext, Result};
use lakefill_table::model::{Model, SourceSpec};
use lakefill_table::partition::{Layout, PartitionRange, TimeEncoding};
use lakefill_table::protocol::TableProtocol;
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{loaded_version, open_table};
use lakefill_validate::ValidationRules;

/// What a logical revert needs to know about the run it reverts.
pub struct Restore<'a> {
    /// The project.
    pub project: &'a Project,
    /// The reverted run's table, as the project configures it.
    pub config: &'a TableConfig,
    /// The target at its latest version: the read version of the revert.
    pub latest: &'a DeltaTable,
    /// The published run.
    pub run: &'a Journal,
    /// The version its commit created.
    pub version: u64,
    /// The id of the revert run.
    pub revert_id: RunId,
    /// Why the run is reverted.
    pub reason: Option<String>,
    /// Periods per batch.
    pub batch_partitions: usize,
    /// Later commits that changed the range: their changes in it are replaced too.
    pub later: Vec<u64>,
}

/// Plans the recomputation of the run's range from the version before its commit.
pub async fn restore_plan(restore: Restore<'_>) -> Result<BackfillPlan> {
    let Restore {
        project,
        config,
        latest,
        run,
        version,
        ..
    } = &restore;
    let target = config.name();
    let model = Model::load(project, &run.inputs.model, Some(&run.inputs.model_version))?;
    check_model_unedited(latest, &model).await?;
    let read_version = loaded_version(latest)?;
    let publish = run.inputs.publish_as;
    let protocol = TableProtocol::read(latest, target, publish == PublishMode::Adjustments)?;
    let snapshot = latest
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{target}`"))?;
    let schema = snapshot.snapshot().arrow_schema();
    let files = log_files(snapshot)?;
    let layout = run.inputs.layout.clone();
    let range = run.inputs.range.clone();

    let before = open_table(config, Some(version - 1)).await?;
    // What is read back: the table as it was; for adjustments in a companion, the corrected
    // table now with the companion as it was (see `BackfillPlan::adjusted`).
    let (source_name, source) = match &run.inputs.adjusts {
        None => (target.to_string(), before.clone()),
        Some((corrected, _)) => {
            let corrected_config = project.table(corrected, "the run's journal")?;
            (corrected.clone(), open_table(corrected_config, None).await?)
        }
    };
    let before_schema = source
        .snapshot()
        .delta_context(|| format!("cannot read `{source_name}`"))?
        .snapshot()
        .arrow_schema();
    let sql = restoring_sql(&schema, &before_schema, &source_name);
    let spec = window_spec(&layout);
    let model = model.restoring(sql, BTreeMap::from([(source_name.clone(), spec.clone())]));
    let window = source_window(&model, &source_name, &spec, &source)?;

    let affected = affected(target, &layout, &range, &files, &schema)?;
    let batches = batches(&range, &layout, restore.batch_partitions, &affected.files);
    let sequence = published_sequence(latest, &restore.revert_id).await?;
    let table_columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let mut rules = ValidationRules::from_spec(
        model.header().validate.as_ref(),
        &table_columns,
        model.path(),
    )?;
    // The other tables a fix's totals were tied to say nothing about the rows before it.
    rules.conserve_with.clear();
    rules.protocol = protocol.rules.clone();
    let range_notes = notes(&restore, &range);

    let where_text = range.rows.as_ref().map(|r| r.sql.clone());
    let files_ruled_out = range.rows.is_some().then_some(affected.ruled_out);
    let report = PlanReport {
        run_id: restore.revert_id.clone(),
        model: model.name().to_string(),
        model_version: model.version().to_string(),
        fingerprint: model.fingerprint().to_string(),
        model_file: model.path().display().to_string(),
        target: target.to_string(),
        target_uri: config.uri().to_string(),
        resolved_location: super::resolved_location(config),
        partition_column: layout.time.encoding.columns().join(", "),
        read_version,
        range,
        range_notes,
        batch_partitions: restore.batch_partitions,
        partitions: affected.partitions,
        totals: affected.totals,
        sources: vec![SourcePlan {
            table: source_name.clone(),
            version: loaded_version(&source)?,
            window: spec.window.as_ref().map(|w| w.join(", ")),
            window_time: window.as_ref().map(|w| w.time.clone()),
            lookback: 0,
            lookahead: 0,
            reads_target: false,
            where_reached: None,
        }],
        batches,
        downstream: find_downstream(project, model.name(), target),
        reason: restore
            .reason
            .clone()
            .or_else(|| Some(format!("revert of {}", run.run_id))),
        allow_spill: None,
        storage: storage_descriptions(project, config, model.header())?,
        already_published: sequence.is_some(),
        publish_sequence: sequence.unwrap_or(1),
        max_partitions: DEFAULT_MAX_PARTITIONS,
        memory_limit: lakefill_table::settings::memory_limit(project, None)?,
        protocol,
        affected_files: affected.files,
        rows: where_text,
        files_ruled_out,
        added_columns: Vec::new(),
        layout,
        publish,
        // The range as it was, read from the table itself: no row changes partition.
        edges: None,
        reads_own_past: false,
        by_vectors: None,
    };
    let mut plan = BackfillPlan {
        target_config: (*config).clone(),
        report,
        model,
        rules,
        target: (*latest).clone(),
        sources: vec![PlannedSource {
            name: source_name.clone(),
            spec,
            table: source.clone(),
            window,
            overlay: None,
        }],
        write_schema: None,
        resume: Some(format!("lakefill revert {} --logical", run.run_id)),
        kind: RunKind::LogicalRevert {
            of: run.run_id.clone(),
        },
        cascade_staged: Vec::new(),
        adjusted: run
            .inputs
            .adjusts
            .as_ref()
            .map(|(name, _)| super::Adjusted {
                name: name.clone(),
                table: source.clone(),
                companion_rows: before.clone(),
            }),
        vectors: None,
    };
    let (write_schema, added_columns, identity_kept) = super::query::check_model(&plan).await?;
    plan.rules.identity_kept = identity_kept;
    plan.write_schema = Some(write_schema);
    plan.report.added_columns = added_columns;
    // On a table that takes deletion vectors, the rows the range gets back are published by
    // them too: the rows the run added are deleted in place, the rows it deleted written again.
    crate::stage::vectors::VectorPlan::set(&mut plan)?;
    Ok(plan)
}

/// The query that reads the range back from `source_name`: exactly the table's columns now, a
/// column added since read as NULL, as in the old files. (A table corrected by adjustments
/// reads as its net rows: see `register_source`.)
fn restoring_sql(
    schema: &deltalake::arrow::datatypes::Schema,
    before_schema: &deltalake::arrow::datatypes::Schema,
    source_name: &str,
) -> String {
    let columns: Vec<String> = schema
        .fields()
        .iter()
        .map(|field| {
            let name = quote(field.name());
            if before_schema.field_with_name(field.name()).is_ok() {
                name
            } else {
                format!(
                    "{} AS {name}",
                    lakefill_table::sqltext::cast_sql("NULL", field.data_type())
                )
            }
        })
        .collect();
    format!("SELECT {} FROM {}", columns.join(", "), quote(source_name))
}

/// The source as the restoring query reads it: windowed on the table's own time columns, in
/// its grain and text format.
fn window_spec(layout: &Layout) -> SourceSpec {
    if layout.is_timeless() {
        // No time to window by: the version before is read whole (`--where` narrows it).
        return SourceSpec::default();
    }
    SourceSpec {
        window: Some(
            layout
                .time
                .encoding
                .columns()
                .iter()
                .map(ToString::to_string)
                .collect(),
        ),
        grain: Some(layout.time.grain.to_string()),
        format: match &layout.time.encoding {
            TimeEncoding::Text { format, .. } => Some(format.clone()),
            _ => None,
        },
        ..SourceSpec::default()
    }
}

/// What the plan of a logical revert says about its range.
fn notes(restore: &Restore<'_>, range: &PartitionRange) -> Vec<String> {
    let mut notes = vec![format!(
        "restores {}..={} as version {} held it (before {} committed version {})",
        range.from,
        range.to,
        restore.version - 1,
        restore.run.run_id,
        restore.version
    )];
    if !restore.later.is_empty() {
        let later: Vec<String> = restore.later.iter().map(ToString::to_string).collect();
        notes.push(format!(
            "later commits changed the range (versions {}): their changes in it are replaced too",
            later.join(", ")
        ));
    }
    notes
}

/// `name` as a SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
