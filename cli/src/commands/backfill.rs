//! `lakefill backfill`: stage and publish.

use lakefill::{Acted, BackfillBuilder, Outcome, RunSettings, SettingFlags};

use crate::args::{BackfillArgs, GlobalArgs};
use crate::commands::outcome::{finish, write_report};
use crate::printer::Printer;
use crate::settings;

pub(crate) async fn run(
    global: &GlobalArgs,
    args: &BackfillArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    // Every setting resolved (flag, else `[defaults]`, else built in) before anything runs.
    let resolved = RunSettings::resolve(
        &project,
        &SettingFlags {
            max_parallel: args.max_parallel,
            memory_limit: args.memory_limit.clone(),
            batch_partitions: args.scope.batch_partitions,
            throttle: args.throttle.clone(),
            engine: args.engine.clone(),
        },
    )?;
    if args.cascade {
        return cascade(&project, args, resolved, printer).await;
    }
    if args.stale {
        return stale(&project, args, resolved, printer).await;
    }
    let plan = settings::plan_builder(&project, &args.scope, resolved.clone())?
        .with_create_companion(true)
        .await?;
    printer.status(&crate::render::run::backfill_plan(plan.report()));
    let force = args
        .force_publish
        .then(|| args.scope.reason.clone())
        .flatten();
    let hooks = run_hooks(printer);
    let run = BackfillBuilder::new(plan)
        .with_settings(resolved)
        .with_interrupt(hooks.interrupt)
        .with_progress(hooks.progress)
        .with_stage_only(args.stage_only)
        .with_force_publish(force)
        .with_sample(args.sample)
        .await?;
    if run.outcome == Outcome::AlreadyPublished {
        printer.status("nothing to do: this run is already published");
    }
    if let Some(path) = &args.report {
        write_report(&project, &run.run_id, None, path, printer).await?;
    }
    finish(printer, &Acted::Run(Box::new(run)))
}

/// `backfill --stale`: one run per contiguous range that `lakefill stale` lists for the model's
/// table, in order; stops at the first that does not publish (or stage, with `--stage-only`).
async fn stale(
    project: &lakefill::Project,
    args: &BackfillArgs,
    resolved: RunSettings,
    printer: Printer,
) -> anyhow::Result<()> {
    let model = lakefill::Model::load(project, &args.scope.model, None)?;
    let table = model.header().target.clone();
    let reports = lakefill::stale(project, std::slice::from_ref(&table), false).await?;
    let mut ranges: Vec<(String, String)> = reports
        .iter()
        .flat_map(|r| {
            r.stale
                .iter()
                .map(|s| &s.span)
                .chain(r.outdated.iter().map(|o| &o.span))
        })
        .map(|span| (span.from.clone(), span.to.clone()))
        .collect();
    // Labels of one grain sort like the periods they name: overlapping ranges become one.
    ranges.sort();
    let mut merged: Vec<(String, String)> = Vec::new();
    for (from, to) in ranges {
        match merged.last_mut() {
            Some((_, last)) if from <= *last => *last = to.max(last.clone()),
            _ => merged.push((from, to)),
        }
    }
    if merged.is_empty() {
        printer.status(&format!("nothing to do: no partition of {table} is stale"));
    }
    let mut runs = Vec::new();
    let mut failed = None;
    for (from, to) in &merged {
        let mut scope = args.scope.clone();
        scope.from = Some(from.clone());
        scope.to = Some(to.clone());
        let plan = settings::plan_builder(project, &scope, resolved.clone())?
            .with_create_companion(true)
            .await?;
        printer.status(&crate::render::run::backfill_plan(plan.report()));
        let hooks = run_hooks(printer);
        let run = BackfillBuilder::new(plan)
            .with_settings(resolved.clone())
            .with_interrupt(hooks.interrupt)
            .with_progress(hooks.progress)
            .with_stage_only(args.stage_only)
            .with_sample(args.sample)
            .await?;
        failed = run.validation_error();
        runs.push(run);
        if failed.is_some() {
            break;
        }
    }
    let text: String = runs.iter().map(crate::render::run::text).collect();
    let document = serde_json::json!({
        "table": table,
        "ranges": merged,
        "runs": runs,
    });
    printer.result(&text, &document)?;
    match failed {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// What a run borrows from the terminal: Ctrl-C to stop it cleanly, and the printer's progress.
pub(crate) fn run_hooks(printer: Printer) -> lakefill::RunHooks {
    lakefill::RunHooks {
        interrupt: Some(interrupt_on_ctrl_c(printer)),
        progress: printer.progress(),
    }
}

/// The first Ctrl-C asks the run to stop cleanly (journal kept, lease released, resumable); a
/// second one stops the process at once.
fn interrupt_on_ctrl_c(printer: Printer) -> tokio::sync::watch::Receiver<bool> {
    let (sender, receiver) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        printer.status(
            "interrupted: stopping the run and recording where it stopped (Ctrl-C again to quit at once)",
        );
        let _ = sender.send(true);
        if tokio::signal::ctrl_c().await.is_ok() {
            quit_now();
        }
    });
    receiver
}

#[expect(
    clippy::exit,
    reason = "a second Ctrl-C must end the process even if the run does not stop"
)]
fn quit_now() {
    std::process::exit(130);
}

/// `backfill --cascade`: plan, stage and validate every node, then publish them in order.
async fn cascade(
    project: &lakefill::Project,
    args: &BackfillArgs,
    resolved: RunSettings,
    printer: Printer,
) -> anyhow::Result<()> {
    let scope = &args.scope;
    crate::commands::plan::refuse_single_model_flags(scope)?;
    let (_, pins) = settings::model_versions(scope, true)?;
    let (from, to) = crate::commands::plan::cascade_range(scope)?;
    let plan = lakefill::CascadeBuilder::new(project, &scope.model, from, to)
        .with_where(scope.rows.clone())
        .with_model_versions(pins)
        .with_max_expansion(args.max_expansion)
        .with_settings(resolved)
        .with_reason(scope.reason.clone())
        .with_allow_edge_moves(
            scope
                .allow_edge_moves
                .then(|| scope.reason.clone())
                .flatten(),
        )
        .with_create_companion(true)
        .await?;
    printer.status(&crate::render::cascade::started(plan.report()));
    let run = lakefill::CascadeRunner::new(project, plan)
        .with_interrupt(Some(interrupt_on_ctrl_c(printer)))
        .with_stage_only(args.stage_only)
        .await?;
    finish(printer, &Acted::Cascade(Box::new(run)))
}
