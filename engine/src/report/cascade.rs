//! The report of a cascade (`lakefill report CASCADE_ID`): its verdict over every table, a line
//! per table in the order they publish, then each node's own run report, in one document of the
//! same formats as a run's.

use serde::Serialize;

use super::{Command, Report, ReportFormat, Verdict, environment, node_context, report};
use lakefill_log::journal::cascade::load_record;
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};

/// The version of the cascade report document.
pub const CASCADE_REPORT_SCHEMA: &str = "lakefill.cascade-report/v1";

/// The report of one cascade.
#[derive(Debug, Clone, Serialize)]
pub struct CascadeDocument {
    /// Always [`CASCADE_REPORT_SCHEMA`].
    pub schema: String,
    /// The cascade.
    pub cascade_id: String,
    /// The model the fix started from.
    pub root: String,
    /// Over every table: failed if any failed validation, forced if any was forced, not
    /// validated if any was not, else passed; the headline says how far publishing got.
    pub verdict: Verdict,
    /// A line per table, in the order they publish.
    pub nodes: Vec<NodeLine>,
    /// Commands for the whole cascade.
    pub commands: Vec<Command>,
    /// Each table's run report, in the same order.
    pub reports: Vec<Report>,
}

/// One table of a cascade.
#[derive(Debug, Clone, Serialize)]
pub struct NodeLine {
    /// The model.
    pub model: String,
    /// Its table.
    pub table: String,
    /// Its run.
    pub run_id: String,
    /// The run's state, as its journal and the log say.
    pub state: String,
    /// Its verdict (`passed`, `failed`, `forced`, `not-validated`).
    pub status: String,
    /// Rows of its range before, when known.
    pub old_rows: Option<u64>,
    /// Rows of its range after.
    pub new_rows: u64,
    /// The version it published, if it did.
    pub published_version: Option<u64>,
}

/// Builds the report of cascade `id` from its record and each node's journal. It reads only.
pub async fn cascade_report(project: &Project, id: &str) -> Result<CascadeDocument> {
    let (_, record) = load_record(project, id).await?;
    let mut reports = Vec::with_capacity(record.nodes.len());
    for node in &record.nodes {
        reports.push(report(project, &node.run_id).await?);
    }
    let nodes: Vec<NodeLine> = record
        .nodes
        .iter()
        .zip(&reports)
        .map(|(node, report)| NodeLine {
            model: node.model.clone(),
            table: node.table.clone(),
            run_id: node.run_id.clone(),
            state: report.state.clone(),
            status: report.verdict.status.clone(),
            old_rows: report.totals.old_rows,
            new_rows: report.totals.new_rows,
            published_version: report.published_version,
        })
        .collect();
    let verdict = verdict(&record.cascade_id, &nodes);
    let published = nodes.iter().all(|n| n.state == "published");
    let mut commands = Vec::new();
    if !published && !nodes.iter().any(|n| n.status == "failed") {
        commands.push(Command {
            label: "publish every table, parents first".into(),
            command: format!("lakefill publish {id}"),
        });
    }
    if !published {
        commands.push(Command {
            label: "drop what is staged".into(),
            command: format!("lakefill discard {id}"),
        });
    } else {
        commands.push(Command {
            label: "read the tables as this cascade published them".into(),
            command: format!("lakefill sql --cascade {id} 'SELECT …'"),
        });
        commands.push(Command {
            label: "undo every table, children first".into(),
            command: format!("lakefill revert {id}"),
        });
    }
    Ok(CascadeDocument {
        schema: CASCADE_REPORT_SCHEMA.to_string(),
        cascade_id: record.cascade_id.clone(),
        root: record.root.clone(),
        verdict,
        nodes,
        commands,
        reports,
    })
}

fn verdict(id: &str, nodes: &[NodeLine]) -> Verdict {
    let with = |status: &str| -> Vec<&str> {
        nodes
            .iter()
            .filter(|n| n.status == status)
            .map(|n| n.table.as_str())
            .collect()
    };
    let published = nodes.iter().filter(|n| n.state == "published").count();
    let progress = match published {
        0 => "nothing is published".to_string(),
        n if n == nodes.len() => format!("all {n} tables are published"),
        n => format!("{n} of {} tables are published", nodes.len()),
    };
    let (status, headline) = if !with("failed").is_empty() {
        (
            "failed",
            format!(
                "Validation FAILED for {}; {progress}.",
                with("failed").join(", ")
            ),
        )
    } else if !with("forced").is_empty() {
        (
            "forced",
            format!(
                "Validation failed for {} and was overridden; {progress}.",
                with("forced").join(", ")
            ),
        )
    } else if !with("not-validated").is_empty() {
        (
            "not-validated",
            format!(
                "{} not validated; {progress}.",
                with("not-validated").join(", ")
            ),
        )
    } else {
        (
            "passed",
            format!(
                "Validation passed for every table of cascade {id} ({}); {progress}.",
                nodes.len()
            ),
        )
    };
    Verdict {
        status: status.to_string(),
        headline,
    }
}

/// Renders `report` as `format`.
pub fn render_cascade(report: &CascadeDocument, format: ReportFormat) -> Result<String> {
    if format == ReportFormat::Json {
        return serde_json::to_string_pretty(report)
            .map_err(|e| Error::Internal(format!("cascade report: {e}")));
    }
    let env = environment()?;
    let name = match format {
        ReportFormat::Html => "cascade.html",
        _ => "cascade.md",
    };
    let context = minijinja::context! {
        c => minijinja::Value::from_serialize(report),
        nodes => report.reports.iter().map(node_context).collect::<Vec<_>>(),
    };
    let rendered = env
        .get_template(name)
        .and_then(|t| t.render(context))
        .map_err(|e| Error::Internal(format!("cannot render the cascade report: {e:#}")))?;
    Ok(lakefill_table::secrets::mask(&rendered))
}
