//! `lakefill backfill`: stage and publish.

use lakefill::{BackfillBuilder, Outcome, RunSettings, SettingFlags};

use crate::args::{BackfillArgs, GlobalArgs};
use crate::printer::{Printer, run_text};
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
        },
    )?;
    let plan = settings::plan_builder(&project, &args.scope)?
        .with_batch_partitions(Some(resolved.batch_partitions))
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
    let run = BackfillBuilder::new(plan)
        .with_interrupt(Some(interrupt_on_ctrl_c(printer)))
        .with_max_parallel(Some(resolved.max_parallel))
        .with_memory_limit(resolved.memory_limit)
        .with_throttle(resolved.throttle)
        .with_progress(printer.progress())
        .with_stage_only(args.stage_only)
        .with_force_publish(force)
        .with_sample(args.sample)
        .await?;
    if run.outcome == Outcome::AlreadyPublished {
        printer.status("nothing to do: this run is already published");
    }
    if let Some(path) = &args.report {
        crate::commands::runs::write_report(&project, &run.run_id, None, path, printer).await?;
    }
    finish(printer, &run)
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
pub(crate) fn finish(printer: Printer, run: &lakefill::RunReport) -> anyhow::Result<()> {
    printer.result(&run_text(run), run)?;
    match run.validation_error() {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}
