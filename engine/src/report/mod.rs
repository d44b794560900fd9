//! The report a person reads (DESIGN §3 `report`): one model of a run, rendered as one
//! self-contained HTML file (inline CSS and SVG, no script, no external link), as Markdown (for a
//! pull request or a chat), or as JSON, from the same [`Report`].
//!
//! Verdict first, then the thresholds that decided it, per-partition old versus new rows and
//! sums (bars per partition, or a calendar of the change for long ranges), the row diff with the
//! columns that changed and before/after samples, each check, lineage (sources and versions),
//! the diff between the previous model version and this one, and the commands to look further
//! and to undo.

mod cascade;
mod charts;
mod markdown;

pub use cascade::{
    CASCADE_REPORT_SCHEMA, CascadeDocument, NodeLine, cascade_report, render_cascade,
};

use std::collections::BTreeMap;

use serde::Serialize;

use crate::run::found::find_run;
use crate::run::reconcile::reconcile;
use lakefill_log::journal::{Journal, RunState};
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};
use lakefill_table::model::{Model, list_versions};
use lakefill_table::run_id::RunId;

/// The version of the report document.
pub const REPORT_SCHEMA: &str = "lakefill.report/v1";

/// How a report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFormat {
    /// One self-contained HTML file.
    Html,
    /// Markdown.
    Markdown,
    /// The report model as JSON.
    Json,
}

impl ReportFormat {
    /// The format a file name asks for (`.html`, `.md`, `.json`), if it asks for one.
    pub fn from_path(path: &std::path::Path) -> Option<Self> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "html" | "htm" => Some(Self::Html),
            "md" | "markdown" => Some(Self::Markdown),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// The report of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always [`REPORT_SCHEMA`].
    pub schema: String,
    /// The run.
    pub run_id: String,
    /// The target table.
    pub table: String,
    /// The run's state.
    pub state: String,
    /// The verdict, first thing a reader sees.
    pub verdict: Verdict,
    /// The model run.
    pub model: ReportModel,
    /// Why.
    pub reason: Option<String>,
    /// The range.
    pub range: (String, String),
    /// The `--where` predicate the run is scoped by (null when it replaces every row of the
    /// range).
    #[serde(rename = "where")]
    pub rows: Option<String>,
    /// The version of the target the run read.
    pub read_version: u64,
    /// The version it published, if it did.
    pub published_version: Option<u64>,
    /// The run this one reverts, when it is a revert.
    pub revert_of: Option<String>,
    /// When the run appends adjustment rows: how many of each kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adjustments: Option<lakefill_table::adjustments::AdjustmentCounts>,
    /// The thresholds of the model's `[validate]`.
    pub thresholds: Vec<Threshold>,
    /// Each check.
    pub checks: Vec<ReportCheck>,
    /// The key rows were compared by (empty when they were not).
    pub key: Vec<String>,
    /// Per partition, old versus new.
    pub partitions: Vec<ReportPartition>,
    /// Over the range.
    pub totals: ReportTotals,
    /// The columns that changed in the sampled changed rows.
    pub column_changes: Vec<ColumnChange>,
    /// Example rows.
    pub samples: ReportSamples,
    /// Sources and the versions they were read at.
    pub lineage: Vec<Source>,
    /// The previous version of the model against this one.
    pub model_diff: Option<ModelDiff>,
    /// Commands to look further and to undo.
    pub commands: Vec<Command>,
    /// Charts (SVG), for the HTML report.
    #[serde(skip)]
    pub charts: Charts,
}

/// The verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// `passed`, `failed`, `forced`, `not-validated` or `reverted`.
    pub status: String,
    /// One sentence.
    pub headline: String,
}

/// The model of a report.
#[derive(Debug, Clone, Serialize)]
pub struct ReportModel {
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// SHA-256 of the file.
    pub fingerprint: String,
}

/// A threshold of the model's `[validate]`.
#[derive(Debug, Clone, Serialize)]
pub struct Threshold {
    /// The setting.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct ReportCheck {
    /// Name.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// How many failures.
    pub failures: usize,
    /// Whether the table's protocol requires it (never forceable).
    pub protocol: bool,
    /// The first failures, one line each.
    pub details: Vec<String>,
}

/// One partition.
#[derive(Debug, Clone, Serialize)]
pub struct ReportPartition {
    /// The partition.
    pub partition: String,
    /// Rows before, when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// The difference, when known.
    pub row_delta: Option<i64>,
    /// The difference relative to the old rows, in percent.
    pub row_change_pct: Option<f64>,
    /// Each measure.
    pub measures: Vec<MeasureLine>,
    /// Keys added.
    pub added: u64,
    /// Keys removed.
    pub removed: u64,
    /// Keys changed.
    pub changed: u64,
}

/// A measure's sums.
#[derive(Debug, Clone, Serialize)]
pub struct MeasureLine {
    /// The measure.
    pub name: String,
    /// Before.
    pub old: f64,
    /// After.
    pub new: f64,
    /// `new - old`.
    pub delta: f64,
    /// The difference relative to `old`, in percent.
    pub change_pct: Option<f64>,
}

/// Totals over the range.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReportTotals {
    /// Rows before, when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// The difference, when known.
    pub row_delta: Option<i64>,
    /// Keys added.
    pub added: u64,
    /// Keys removed.
    pub removed: u64,
    /// Keys changed.
    pub changed: u64,
    /// Each measure.
    pub measures: Vec<MeasureLine>,
}

/// How often a column changed among the sampled changed rows.
#[derive(Debug, Clone, Serialize)]
pub struct ColumnChange {
    /// The column.
    pub column: String,
    /// Sampled changed rows in which it changed.
    pub rows: usize,
    /// Share of the sampled changed rows, in percent.
    pub share_pct: f64,
}

/// Example rows, one line each.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReportSamples {
    /// New rows whose key did not exist.
    pub added: Vec<String>,
    /// Old rows whose key is gone.
    pub removed: Vec<String>,
    /// Changed rows: the key and each changed column before and after.
    pub changed: Vec<ChangedRow>,
}

/// One changed row.
#[derive(Debug, Clone, Serialize)]
pub struct ChangedRow {
    /// The partition.
    pub partition: String,
    /// The key, `column=value` joined.
    pub key: String,
    /// Each changed column.
    pub changes: Vec<(String, String, String)>,
}

/// A source of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    /// The table.
    pub table: String,
    /// The version read.
    pub version: u64,
}

/// The previous version of the model against this one.
#[derive(Debug, Clone, Serialize)]
pub struct ModelDiff {
    /// The previous version.
    pub from: String,
    /// This version.
    pub to: String,
    /// A unified diff.
    pub unified: String,
}

/// A command the reader may run.
#[derive(Debug, Clone, Serialize)]
pub struct Command {
    /// What it does.
    pub label: String,
    /// The command.
    pub command: String,
}

/// Charts of the HTML report, as inline SVG.
#[derive(Debug, Clone, Default)]
pub struct Charts {
    /// Old versus new rows per partition (bars, or a calendar for long ranges).
    pub rows: String,
    /// The change of each measure per partition.
    pub measures: Vec<(String, String)>,
}

/// Builds the report of `run_id` from its journal (as the Delta log says it is now) and the
/// project's model files. It reads only: no lease is taken and nothing is written.
pub async fn report(project: &Project, run_id: &str) -> Result<Report> {
    let run_id = RunId::parse(run_id)?;
    let (config, latest) = find_run(project, &run_id).await?;
    let mut journal = Journal::load(&latest.object_store(), &run_id)
        .await?
        .ok_or_else(|| Error::UnknownRun {
            run_id: run_id.to_string(),
            searched: vec![config.name().to_string()],
        })?;
    reconcile(&latest, &mut journal).await?;
    Ok(build(project, &journal))
}

/// Renders `report` as `format`.
pub fn render(report: &Report, format: ReportFormat) -> Result<String> {
    if format == ReportFormat::Json {
        return serde_json::to_string_pretty(report)
            .map_err(|e| Error::Internal(format!("report: {e}")));
    }
    let env = environment()?;
    let name = match format {
        ReportFormat::Html => "report.html",
        _ => "report.md",
    };
    let rendered = env
        .get_template(name)
        .and_then(|t| t.render(node_context(report)))
        .map_err(|e| Error::Internal(format!("cannot render the report: {e:#}")))?;
    // Whatever the report quotes (reasons, sample values) is masked like every other output.
    Ok(lakefill_table::secrets::mask(&rendered))
}

/// The templates of run and cascade reports: every value they quote is escaped for its format
/// (HTML, or Markdown text, code span or fence), so a reason or a sample value is shown, never
/// acted on.
fn environment() -> Result<minijinja::Environment<'static>> {
    let mut env = minijinja::Environment::new();
    env.set_auto_escape_callback(|name| {
        if name.ends_with(".html") {
            minijinja::AutoEscape::Html
        } else {
            minijinja::AutoEscape::Custom(markdown::AUTO_ESCAPE)
        }
    });
    env.set_formatter(markdown::formatter);
    env.add_filter("code", markdown::code);
    env.add_filter("fenced", markdown::fenced);
    for (name, text) in [
        ("style.html", include_str!("style.html")),
        ("run.html", include_str!("run.html")),
        ("report.html", include_str!("report.html")),
        ("report.md", include_str!("report.md")),
        ("cascade.html", include_str!("cascade.html")),
        ("cascade.md", include_str!("cascade.md")),
    ] {
        env.add_template(name, text)
            .map_err(|e| Error::Internal(format!("the {name} template: {e}")))?;
    }
    Ok(env)
}

/// What the templates of one run's report read: the report and its charts.
fn node_context(report: &Report) -> minijinja::Value {
    minijinja::context! {
        r => minijinja::Value::from_serialize(report),
        rows_chart => minijinja::Value::from_safe_string(report.charts.rows.clone()),
        measure_charts => report
            .charts
            .measures
            .iter()
            .map(|(name, svg)| (name.clone(), minijinja::Value::from_safe_string(svg.clone())))
            .collect::<Vec<_>>(),
    }
}

fn build(project: &Project, journal: &Journal) -> Report {
    let model = Model::load(
        project,
        &journal.inputs.model,
        Some(&journal.inputs.model_version),
    )
    .ok();
    let validation = journal.progress.validation.as_ref();
    let comparison = validation.map(|v| &v.comparison);
    let verdict = verdict(journal);
    let thresholds = model.as_ref().map(thresholds).unwrap_or_default();
    let checks = validation
        .map(|v| {
            v.checks
                .iter()
                .map(|c| ReportCheck {
                    name: c.name.clone(),
                    passed: c.passed,
                    failures: c.failures.len(),
                    protocol: c.protocol,
                    details: c.failures.iter().take(5).map(|f| f.to_string()).collect(),
                })
                .collect()
        })
        .unwrap_or_default();
    let partitions = report_partitions(journal, comparison);
    let old_rows = partitions.iter().map(|p| p.old_rows).sum::<Option<u64>>();
    let new_rows = partitions.iter().map(|p| p.new_rows).sum();
    let totals = ReportTotals {
        old_rows,
        new_rows,
        row_delta: old_rows.map(|old| new_rows as i64 - old as i64),
        added: comparison.map_or(0, |c| c.totals.added),
        removed: comparison.map_or(0, |c| c.totals.removed),
        changed: comparison.map_or(0, |c| c.totals.changed),
        measures: comparison
            .map(|c| measure_lines(&c.totals.measures))
            .unwrap_or_default(),
    };
    let (samples, column_changes) = samples(comparison);
    let charts = Charts {
        rows: charts::rows(&partitions),
        measures: totals
            .measures
            .iter()
            .map(|m| (m.name.clone(), charts::measure(&partitions, &m.name)))
            .collect(),
    };
    let commands = next_commands(journal);
    Report {
        schema: REPORT_SCHEMA.to_string(),
        run_id: journal.run_id.to_string(),
        table: journal.inputs.target.clone(),
        state: journal.progress.state.to_string(),
        verdict,
        model: ReportModel {
            name: journal.inputs.model.clone(),
            version: journal.inputs.model_version.clone(),
            fingerprint: journal.inputs.fingerprint.clone(),
        },
        reason: journal.inputs.reason.clone(),
        range: (
            journal.inputs.range.from.clone(),
            journal.inputs.range.to.clone(),
        ),
        rows: journal.inputs.range.rows.as_ref().map(|r| r.sql.clone()),
        read_version: journal.inputs.read_version,
        published_version: journal.outcome.published_version,
        revert_of: journal.inputs.kind.revert_of().map(ToString::to_string),
        adjustments: journal.progress.adjustment_counts,
        thresholds,
        checks,
        key: comparison.map(|c| c.key.clone()).unwrap_or_default(),
        partitions,
        totals,
        column_changes,
        samples,
        lineage: journal
            .inputs
            .sources
            .iter()
            .map(|(table, version)| Source {
                table: table.clone(),
                version: *version,
            })
            .collect(),
        model_diff: model.as_ref().and_then(|m| model_diff(project, m)),
        commands,
        charts,
    }
}

/// The model's `[validate]` settings, as the report lists them.
fn thresholds(model: &Model) -> Vec<Threshold> {
    let Some(spec) = model.header().validate.clone() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut push = |name: &str, value: Option<String>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            out.push(Threshold {
                name: name.to_string(),
                value,
            });
        }
    };
    push("key", Some(spec.key.join(", ")));
    push("measures", Some(spec.measures.join(", ")));
    push("max_row_change", spec.max_row_change.clone());
    push("max_measure_change", spec.max_measure_change.clone());
    push("conserve", Some(spec.conserve.join(", ")));
    for check in &spec.checks {
        push(&format!("check `{}`", check.name), Some(check.sql.clone()));
    }
    out
}

/// Each partition of the run: rows before and after, and what the comparison found in it.
fn report_partitions(
    journal: &Journal,
    comparison: Option<&lakefill_validate::Comparison>,
) -> Vec<ReportPartition> {
    journal
        .progress
        .partitions
        .iter()
        .map(|p| {
            let compared =
                comparison.and_then(|c| c.partitions.iter().find(|cp| cp.value == p.value));
            ReportPartition {
                partition: p.value.clone(),
                old_rows: p.old_rows,
                new_rows: p.new_rows,
                row_delta: p.old_rows.map(|old| p.new_rows as i64 - old as i64),
                row_change_pct: p
                    .old_rows
                    .filter(|old| *old > 0)
                    .map(|old| 100.0 * (p.new_rows as f64 - old as f64) / old as f64),
                measures: compared
                    .map(|cp| measure_lines(&cp.measures))
                    .unwrap_or_default(),
                added: compared.map_or(0, |cp| cp.added),
                removed: compared.map_or(0, |cp| cp.removed),
                changed: compared.map_or(0, |cp| cp.changed),
            }
        })
        .collect()
}

/// The commands that take the run further: publish or compare a staged run; compare or undo a
/// published one.
fn next_commands(journal: &Journal) -> Vec<Command> {
    let mut commands = Vec::new();
    if matches!(
        journal.progress.state,
        RunState::Validated | RunState::FailedValidation
    ) {
        commands.push(Command {
            label: "publish it".into(),
            command: format!("lakefill publish {}", journal.run_id),
        });
        commands.push(Command {
            label: "compare it with the table, row by row".into(),
            command: format!(
                "lakefill diff {} --from-version {} --run {}",
                journal.inputs.target, journal.inputs.read_version, journal.run_id
            ),
        });
    }
    if let Some(version) = journal.outcome.published_version {
        commands.push(Command {
            label: "compare the versions".into(),
            command: format!(
                "lakefill diff {} --from-version {} --to-version {version}",
                journal.inputs.target,
                version.saturating_sub(1)
            ),
        });
        commands.push(Command {
            label: "undo it".into(),
            command: format!("lakefill revert {}", journal.run_id),
        });
    }
    commands
}

fn verdict(journal: &Journal) -> Verdict {
    let run = &journal.run_id;
    let (status, headline) = if let Some(reverted) = journal.inputs.kind.revert_of() {
        (
            "reverted",
            format!(
                "Run {run} put {}..={} of {} back as it was before run {reverted}.",
                journal.inputs.range.from, journal.inputs.range.to, journal.inputs.target
            ),
        )
    } else {
        match journal.progress.validation.as_ref() {
            None => (
                "not-validated",
                format!(
                    "Run {run} has not been validated (state {}).",
                    journal.progress.state
                ),
            ),
            Some(v) if v.passed => (
                "passed",
                format!(
                    "Validation passed: every check of run {run} held ({} checks).",
                    v.checks.len()
                ),
            ),
            Some(v) if journal.outcome.forced.is_some() => (
                "forced",
                format!(
                    "Validation FAILED ({}), and the run was published anyway: {}.",
                    v.failed().join(", "),
                    journal.outcome.forced.as_deref().unwrap_or("")
                ),
            ),
            Some(v) => (
                "failed",
                format!(
                    "Validation FAILED: {}. Nothing was published.",
                    v.failed().join(", ")
                ),
            ),
        }
    };
    Verdict {
        status: status.to_string(),
        headline,
    }
}

fn measure_lines(
    measures: &BTreeMap<String, lakefill_validate::spec::MeasureChange>,
) -> Vec<MeasureLine> {
    measures
        .iter()
        .map(|(name, m)| MeasureLine {
            name: name.clone(),
            old: m.old,
            new: m.new,
            delta: m.new - m.old,
            change_pct: (m.old != 0.0).then(|| 100.0 * (m.new - m.old) / m.old.abs()),
        })
        .collect()
}

/// The samples as lines, and how often each column changed among the changed ones.
fn samples(
    comparison: Option<&lakefill_validate::spec::Comparison>,
) -> (ReportSamples, Vec<ColumnChange>) {
    let Some(comparison) = comparison else {
        return (ReportSamples::default(), Vec::new());
    };
    let line = |value: &serde_json::Value| {
        let partition = value["partition"].as_str().unwrap_or("");
        let row = value.get("row").unwrap_or(value);
        format!("{partition}: {}", compact(row))
    };
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let changed: Vec<ChangedRow> = comparison
        .samples
        .changed
        .iter()
        .map(|value| {
            let old = value["old"].as_object().cloned().unwrap_or_default();
            let new = value["new"].as_object().cloned().unwrap_or_default();
            let changes: Vec<(String, String, String)> = old
                .keys()
                .chain(new.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|column| {
                    *counts.entry(column.clone()).or_default() += 1;
                    (
                        column.clone(),
                        old.get(column).map(text).unwrap_or_default(),
                        new.get(column).map(text).unwrap_or_default(),
                    )
                })
                .collect();
            ChangedRow {
                partition: value["partition"].as_str().unwrap_or("").to_string(),
                key: compact(&value["key"]),
                changes,
            }
        })
        .collect();
    let sampled = changed.len().max(1);
    let mut column_changes: Vec<ColumnChange> = counts
        .into_iter()
        .map(|(column, rows)| ColumnChange {
            column,
            rows,
            share_pct: 100.0 * rows as f64 / sampled as f64,
        })
        .collect();
    column_changes.sort_by(|a, b| b.rows.cmp(&a.rows).then(a.column.cmp(&b.column)));
    (
        ReportSamples {
            added: comparison.samples.added.iter().map(line).collect(),
            removed: comparison.samples.removed.iter().map(line).collect(),
            changed,
        },
        column_changes,
    )
}

/// `a=1, b=x` for a JSON object, its text otherwise.
fn compact(value: &serde_json::Value) -> String {
    match value.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", text(v)))
            .collect::<Vec<_>>()
            .join(", "),
        None => text(value),
    }
}

fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "NULL".into(),
        other => other.to_string(),
    }
}

/// The previous version of `model` (natural order) against it, as a unified diff.
fn model_diff(project: &Project, model: &Model) -> Option<ModelDiff> {
    let dir = project.sql_dir().join(model.name());
    let versions = list_versions(&dir);
    let position = versions.iter().position(|v| v == model.version())?;
    let previous = versions.get(position.checked_sub(1)?)?;
    let old = std::fs::read_to_string(dir.join(format!("{previous}.sql"))).ok()?;
    let new = std::fs::read_to_string(model.path()).ok()?;
    let unified = similar::TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(
            &format!("sql/{}/{previous}.sql", model.name()),
            &format!("sql/{}/{}.sql", model.name(), model.version()),
        )
        .to_string();
    Some(ModelDiff {
        from: previous.clone(),
        to: model.version().to_string(),
        unified,
    })
}
