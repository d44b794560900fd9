//! `lakefill plan`: scope a backfill without writing.

use crate::args::{GlobalArgs, PlanArgs};
use crate::printer::{Printer, plan_text};
use crate::settings;

pub(crate) async fn run(
    global: &GlobalArgs,
    args: &PlanArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let plan = settings::plan_builder(&project, &args.scope)?.await?;
    printer.result(&plan_text(plan.report()), plan.report())
}
