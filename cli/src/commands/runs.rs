//! `lakefill runs`, `publish`, `discard`, `revert`, `notify`, `report` and `gc`: what happens to
//! a run after staging.

use std::fmt::Write as _;

use crate::args::{
    DiscardArgs, GcArgs, GlobalArgs, NotifyArgs, PublishArgs, ReportArgs, ReportFormatArg,
    RevertArgs, RunsArgs,
};
use crate::commands::outcome::{finish, finish_cascade, rendered_report, write_report};
use crate::printer::{Printer, notifications_text, run_text};
use crate::settings;

pub(crate) async fn list(
    global: &GlobalArgs,
    args: &RunsArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let runs = lakefill::list_runs(&project, args.table.as_deref()).await?;
    let mut text = String::new();
    if runs.is_empty() {
        text.push_str("no runs\n");
    } else {
        let _ = writeln!(
            text,
            "{:<34} {:<14} {:<18} {:<18} {:<25} {:>5} {:>9}  created",
            "run", "table", "state", "model", "range", "read", "published"
        );
    }
    for run in &runs {
        let _ = writeln!(
            text,
            "{:<34} {:<14} {:<18} {:<18} {:<25} {:>5} {:>9}  {}",
            run.run_id,
            run.table,
            run.state.to_string(),
            match &run.revert_of {
                Some(_) => format!("revert of {}@{}", run.model, run.model_version),
                None => format!("{}@{}", run.model, run.model_version),
            },
            format!("{}..={}", run.range.from, run.range.to),
            run.read_version,
            run.published_version
                .map_or_else(|| "-".into(), |v| v.to_string()),
            run.created_at
        );
    }
    // Cascades, with their nodes.
    let mut cascades: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for run in &runs {
        if let Some(cascade) = &run.cascade {
            cascades
                .entry(cascade)
                .or_default()
                .push(format!("{} ({})", run.run_id, run.state));
        }
    }
    for (cascade, nodes) in cascades {
        let _ = writeln!(text, "\n{cascade}: {}", nodes.join(", "));
    }
    printer.result(&text, &runs)
}

pub(crate) async fn publish(
    global: &GlobalArgs,
    args: &PublishArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    if lakefill::is_cascade_id(&args.run_id) {
        let run = lakefill::publish_cascade(&project, &args.run_id).await?;
        return finish_cascade(printer, &run);
    }
    let force = args.force_publish.then(|| args.reason.clone()).flatten();
    let run = lakefill::publish_run(&project, &args.run_id, force).await?;
    if let Some(path) = &args.report {
        write_report(&project, &run.run_id, None, path, printer).await?;
    }
    finish(printer, &run)
}

pub(crate) async fn revert(
    global: &GlobalArgs,
    args: &RevertArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    if lakefill::is_cascade_id(&args.run_id) {
        if args.stage_only {
            return Err(lakefill::Error::InvalidOption {
                option: "--stage-only".into(),
                value: args.run_id.clone(),
                message: "a cascade is reverted node by node, each committed as it goes; revert a node's run on its own to review it first (see `lakefill runs`)".into(),
            }
            .into());
        }
        let run =
            lakefill::revert_cascade(&project, &args.run_id, args.reason.clone(), args.logical)
                .await?;
        return finish_cascade(printer, &run);
    }
    // A run that appended adjustments is reverted by appending their negation.
    if args.logical || lakefill::reverts_logically(&project, &args.run_id).await? {
        return crate::commands::backfill::revert_logical(&project, args, printer).await;
    }
    let run =
        lakefill::revert_run(&project, &args.run_id, args.reason.clone(), args.stage_only).await?;
    // Rows it would put back that break the table's rules now: exit 3, nothing committed.
    finish(printer, &run)
}

pub(crate) async fn notify(
    global: &GlobalArgs,
    args: &NotifyArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let window = lakefill::Window {
        since: args.since,
        replay: args.replay,
    };
    let deliveries = lakefill::notify(&project, &args.table, window).await?;
    let mut text = notifications_text(&deliveries);
    if deliveries
        .iter()
        .all(|d| d.delivered.is_empty() && d.failed.is_empty() && d.skipped.is_empty())
    {
        text = format!("{}: every sink is up to date\n", args.table);
    }
    printer.result(&text, &deliveries)
}

pub(crate) async fn report(
    global: &GlobalArgs,
    args: &ReportArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let format = args.format.map(|f| match f {
        ReportFormatArg::Html => lakefill::ReportFormat::Html,
        ReportFormatArg::Md => lakefill::ReportFormat::Markdown,
        ReportFormatArg::Json => lakefill::ReportFormat::Json,
    });
    match &args.out {
        Some(path) => write_report(&project, &args.run_id, format, path, printer).await,
        None => {
            let text = rendered_report(
                &project,
                &args.run_id,
                format.unwrap_or(lakefill::ReportFormat::Html),
            )
            .await?;
            printer.raw(&text)
        }
    }
}

pub(crate) async fn discard(
    global: &GlobalArgs,
    args: &DiscardArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    if lakefill::is_cascade_id(&args.run_id) {
        let run = lakefill::discard_cascade(&project, &args.run_id).await?;
        return finish_cascade(printer, &run);
    }
    let run = lakefill::discard_run(&project, &args.run_id).await?;
    printer.result(&run_text(&run), &run)
}

pub(crate) async fn gc(global: &GlobalArgs, args: &GcArgs, printer: Printer) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let older_than = lakefill::parse_duration(&args.older_than)?;
    let report = lakefill::gc(&project, &args.table, args.dry_run, older_than).await?;
    let mut text = String::new();
    let verb = if report.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let _ = writeln!(
        text,
        "{} {verb} {} staged files ({}); kept {} that may still be published",
        report.table,
        report.files.len(),
        crate::printer::bytes(report.bytes),
        report.kept
    );
    for file in &report.files {
        let _ = writeln!(
            text,
            "  {}  ({}, {})",
            file.path,
            crate::printer::bytes(file.size),
            file.reason
        );
    }
    for run in &report.runs_discarded {
        let _ = writeln!(text, "  run {run} is now discarded");
    }
    printer.result(&text, &report)
}
