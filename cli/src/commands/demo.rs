//! `lakefill demo`: build a lake with a timezone bug and walk through the fix.

use lakefill::{BackfillBuilder, PlanBuilder, Project};
use lakefill_fixtures::DemoLake;
use serde_json::json;

use crate::args::{DemoArgs, OutputFormat};
use crate::printer::{Printer, plan_text, run_text};
use crate::settings::display_path;

pub(crate) async fn run(args: &DemoArgs, printer: Printer) -> anyhow::Result<()> {
    let lake = DemoLake {
        days: args.days.max(1),
        events_per_day: args.events_per_day.max(1),
        ..DemoLake::default()
    };
    let dir = std::path::absolute(&args.dir)?;
    let shown = display_path(&dir);
    printer.status(&format!(
        "building the demo lake in {shown}: {} days x {} events, history written by events@v1 (a UTC-8 timezone bug)",
        lake.days, lake.events_per_day
    ));
    let created = lake.create(&dir).await?;
    let project = Project::load(&dir)?;
    let (from, to) = (created.first_day.to_string(), created.last_day.to_string());

    let mut text = String::new();
    text.push_str(&format!(
        "The demo lake is in {shown}: raw_events ({} rows), events and daily_revenue written by v1.\n\
         events@v1 dates each event at a fixed UTC-8 offset, so events before 08:00 UTC sit one day early.\n\n",
        created.raw_rows
    ));

    printer.status("1/3 planning events@v2 (the fix) over the whole history");
    let plan = PlanBuilder::new(&project, "events", &from, &to).await?;
    text.push_str("== 1. plan: events@v2 over the whole history ==\n");
    text.push_str(&plan_text(plan.report()));
    let plan_json = serde_json::to_value(plan.report())?;

    printer.status("2/3 backfilling events@v2");
    let events = BackfillBuilder::new(plan).await?;
    text.push_str("\n== 2. backfill events@v2: rows move to their UTC day ==\n");
    text.push_str(&run_text(&events));

    printer
        .status("3/3 backfilling daily_revenue@v1 over the same range, from the corrected events");
    let plan = PlanBuilder::new(&project, "daily_revenue", &from, &to)
        .with_reason(Some("recompute after the events timezone fix".into()))
        .await?;
    let revenue = BackfillBuilder::new(plan).await?;
    text.push_str("\n== 3. backfill daily_revenue@v1 from the corrected events ==\n");
    text.push_str(&run_text(&revenue));

    text.push_str(&format!(
        "\nexplore the project:\n  cd {shown}\n  lakefill plan events --from {from} --to {to}\n  \
         lakefill backfill events --from {from} --to {to}    # already published: changes nothing\n  \
         lakefill backfill events --from {from} --to {to} --model-version v1 --reason \"compare\"\n"
    ));
    let value = json!({
        "dir": dir.display().to_string(),
        "raw_rows": created.raw_rows,
        "range": [from, to],
        "plan": plan_json,
        "events": events,
        "daily_revenue": revenue,
    });
    if printer.format() == OutputFormat::Json {
        printer.result("", &value)
    } else {
        printer.result(&text, &value)
    }
}
