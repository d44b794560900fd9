//! `lakefill backfill`: stage and publish.

use lakefill::{BackfillBuilder, Outcome, RunSettings, SettingFlags};

use crate::args::{BackfillArgs, GlobalArgs, RevertArgs};
use crate::commands::outcome::{finish, finish_cascade, write_report};
use crate::printer::Printer;
use crate::settings;

pub(crate) async fn run(
    global: &GlobalArgs,
    args: &BackfillArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
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
        if let Some(engine) = &resolved.engine {
            return Err(lakefill::Error::InvalidOption {
                option: "--engine".into(),
                value: engine.clone(),
                message:
                    "a cascade cannot be staged on a cluster yet; run it with `--engine local`"
                        .into(),
            }
            .into());
        }
        return cascade(&project, args, &resolved, printer).await;
    }
    let plan = settings::plan_builder(&project, &args.scope)?
        .with_batch_partitions(Some(resolved.batch_partitions))
        .with_create_companion(true)
        .await?;
    let report = plan.report();
    printer.status(&format!(
        "backfilling {} {} ..= {} with {}@{} ({} partitions in {} batches, read version {})",
        report.target,
        report.range.from,
        report.range.to,
        report.model,
        report.model_version,
        report.partitions.len(),
        report.batches.len(),
        report.read_version
    ));
    let force = args
        .force_publish
        .then(|| args.scope.reason.clone())
        .flatten();
    let run = runner(plan, &resolved, printer)
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
    finish(printer, &run)
}

/// `revert RUN_ID --logical`: the run's range recomputed as it was, run like a backfill.
pub(crate) async fn revert_logical(
    project: &lakefill::Project,
    args: &RevertArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let resolved = RunSettings::resolve(
        project,
        &SettingFlags {
            max_parallel: args.max_parallel,
            memory_limit: args.memory_limit.clone(),
            batch_partitions: None,
            throttle: None,
            engine: None,
        },
    )?;
    let plan = lakefill::logical_revert_plan(
        project,
        &args.run_id,
        args.reason.clone(),
        Some(resolved.batch_partitions),
    )
    .await?;
    let report = plan.report();
    printer.status(&format!(
        "reverting {} in {} ..= {} ({} partitions in {} batches, read version {})",
        args.run_id,
        report.range.from,
        report.range.to,
        report.partitions.len(),
        report.batches.len(),
        report.read_version
    ));
    if !report.already_published {
        for note in &report.range_notes {
            printer.status(&format!("note: {note}"));
        }
    }
    let run = runner(plan, &resolved, printer)
        .with_stage_only(args.stage_only)
        .await?;
    finish(printer, &run)
}

/// A runner of `plan` with the resolved settings, Ctrl-C handling and the printer's progress.
fn runner(
    plan: lakefill::BackfillPlan,
    resolved: &RunSettings,
    printer: Printer,
) -> BackfillBuilder {
    BackfillBuilder::new(plan)
        .with_interrupt(Some(interrupt_on_ctrl_c(printer)))
        .with_max_parallel(Some(resolved.max_parallel))
        .with_memory_limit(resolved.memory_limit)
        .with_throttle(resolved.throttle)
        .with_engine(resolved.engine.clone())
        .with_progress(printer.progress())
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

/// Prints a run report; a failed validation becomes exit code 3 after the report is out.
/// `backfill --cascade`: plan, stage and validate every node, then publish them in order.
async fn cascade(
    project: &lakefill::Project,
    args: &BackfillArgs,
    resolved: &RunSettings,
    printer: Printer,
) -> anyhow::Result<()> {
    let scope = &args.scope;
    crate::commands::plan::refuse_single_model_flags(scope)?;
    let (_, pins) = settings::model_versions(scope, true)?;
    let plan = lakefill::CascadeBuilder::new(project, &scope.model, &scope.from, &scope.to)
        .with_model_versions(pins)
        .with_max_expansion(args.max_expansion)
        .with_batch_partitions(Some(resolved.batch_partitions))
        .with_reason(scope.reason.clone())
        .with_allow_edge_moves(
            scope
                .allow_edge_moves
                .then(|| scope.reason.clone())
                .flatten(),
        )
        .with_create_companion(true)
        .await?;
    printer.status(&format!(
        "cascade {}: {} models, {} partitions in {} batches",
        plan.report().cascade_id,
        plan.report().nodes.len(),
        plan.report().total_partitions,
        plan.report().total_batches
    ));
    let run = lakefill::CascadeRunner::new(project, plan)
        .with_interrupt(Some(interrupt_on_ctrl_c(printer)))
        .with_stage_only(args.stage_only)
        .with_memory_limit(resolved.memory_limit)
        .with_max_parallel(Some(resolved.max_parallel))
        .await?;
    finish_cascade(printer, &run)
}
