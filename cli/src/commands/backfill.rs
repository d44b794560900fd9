//! `lakefill backfill`: stage and publish.

use lakefill::{BackfillBuilder, Outcome};

use crate::args::{BackfillArgs, GlobalArgs};
use crate::printer::{Printer, run_text};
use crate::settings;

pub(crate) async fn run(
    global: &GlobalArgs,
    args: &BackfillArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let plan = settings::plan_builder(&project, &args.scope)?.await?;
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
    let run = BackfillBuilder::new(plan)
        .with_max_parallel(settings::max_parallel(&project, args.max_parallel))
        .await?;
    if run.outcome == Outcome::AlreadyPublished {
        printer.status("nothing to do: this run is already published");
    }
    printer.result(&run_text(&run), &run)
}
