//! `lakefill runs`, `publish` and `discard`: the write-audit-publish workflow after staging.

use std::fmt::Write as _;

use crate::args::{DiscardArgs, GcArgs, GlobalArgs, NotifyArgs, PublishArgs, RevertArgs, RunsArgs};
use crate::commands::backfill::finish;
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
    printer.result(&text, &runs)
}

pub(crate) async fn publish(
    global: &GlobalArgs,
    args: &PublishArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let force = args.force_publish.then(|| args.reason.clone()).flatten();
    let run = lakefill::publish_run(&project, &args.run_id, force).await?;
    finish(printer, &run)
}

pub(crate) async fn revert(
    global: &GlobalArgs,
    args: &RevertArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let run = lakefill::revert_run(&project, &args.run_id, args.reason.clone()).await?;
    printer.result(&run_text(&run), &run)
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

pub(crate) async fn discard(
    global: &GlobalArgs,
    args: &DiscardArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
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
