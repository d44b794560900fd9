//! `lakefill runs`, `publish`, `discard`, `revert`, `notify`, `report` and `gc`: what happens to
//! a run after staging.

use crate::args::{
    DiscardArgs, GcArgs, GlobalArgs, NotifyArgs, PublishArgs, ReportArgs, ReportFormatArg,
    RevertArgs, RunsArgs,
};
use lakefill::{RunSettings, SettingFlags};

use crate::commands::backfill::run_hooks;
use crate::commands::outcome::{finish, write_report};
use crate::printer::Printer;
use crate::settings;

pub(crate) async fn list(
    global: &GlobalArgs,
    args: &RunsArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let runs = lakefill::list_runs(&project, args.table.as_deref()).await?;
    printer.result(&crate::render::runs::list(&runs), &runs)
}

pub(crate) async fn publish(
    global: &GlobalArgs,
    args: &PublishArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let force = args.force_publish.then(|| args.reason.clone()).flatten();
    let acted = lakefill::publish(&project, &args.run_id, force).await?;
    if let (Some(path), lakefill::Acted::Run(run)) = (&args.report, &acted) {
        write_report(&project, &run.run_id, None, path, printer).await?;
    }
    finish(printer, &acted)
}

pub(crate) async fn revert(
    global: &GlobalArgs,
    args: &RevertArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    // Every setting resolved (flag, else `[defaults]`, else built in) before anything runs.
    let resolved = RunSettings::resolve(
        &project,
        &SettingFlags {
            max_parallel: args.max_parallel,
            memory_limit: args.memory_limit.clone(),
            ..SettingFlags::default()
        },
    )?;
    let request = lakefill::RevertRequest {
        id: args.run_id.clone(),
        reason: args.reason.clone(),
        logical: args.logical,
        stage_only: args.stage_only,
        settings: resolved,
    };
    let revert = lakefill::Revert::prepare(&project, request).await?;
    if let Some(plan) = revert.plan() {
        for line in crate::render::run::revert_plan(&args.run_id, plan) {
            printer.status(&line);
        }
    }
    let acted = revert.run(&project, || run_hooks(printer)).await?;
    // Rows it would put back that break the table's rules now: exit 3, nothing committed.
    finish(printer, &acted)
}

pub(crate) async fn notify(
    global: &GlobalArgs,
    args: &NotifyArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let window = lakefill::Window {
        since: args.since,
        replay: args.replay,
    };
    let deliveries = lakefill::notify(&project, &args.table, window).await?;
    let text = crate::render::run::notifications_of(&args.table, &deliveries);
    printer.result(&text, &deliveries)
}

pub(crate) async fn report(
    global: &GlobalArgs,
    args: &ReportArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let format = args.format.map(|f| match f {
        ReportFormatArg::Html => lakefill::ReportFormat::Html,
        ReportFormatArg::Md => lakefill::ReportFormat::Markdown,
        ReportFormatArg::Json => lakefill::ReportFormat::Json,
    });
    match &args.out {
        Some(path) => write_report(&project, &args.run_id, format, path, printer).await,
        None => {
            let text = lakefill::rendered_report(
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
    let project = settings::project(global).await?;
    let acted = lakefill::discard(&project, &args.run_id).await?;
    finish(printer, &acted)
}

pub(crate) async fn gc(global: &GlobalArgs, args: &GcArgs, printer: Printer) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let older_than = lakefill::parse_duration(&args.older_than)?;
    let report = lakefill::gc(&project, &args.table, args.dry_run, older_than).await?;
    printer.result(&crate::render::runs::gc(&report), &report)
}
