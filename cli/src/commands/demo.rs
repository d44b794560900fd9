//! `lakefill demo`: build a lake with a timezone bug and walk through the fix.

use lakefill::{CascadeBuilder, CascadeRunner, DiffTarget, Project};
use lakefill_fixtures::{DemoLake, LakeLocation};
use serde_json::json;

use crate::args::{DemoArgs, OutputFormat};
use crate::printer::Printer;
use crate::render;
use crate::settings::display_path;

pub(crate) async fn run(args: &DemoArgs, printer: Printer) -> anyhow::Result<()> {
    let lake = DemoLake {
        days: args.days.max(1),
        events_per_day: args.events_per_day.max(1),
        rolling: true,
        ..DemoLake::default()
    };
    let dir = std::path::absolute(&args.dir)?;
    let shown = display_path(&dir);
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(lakefill::Error::InvalidOption {
            option: "--dir".into(),
            value: shown,
            message: "the directory exists and is not empty; pass another `--dir` or remove it"
                .into(),
        }
        .into());
    }
    printer.status(&format!(
        "building the demo lake in {shown}: {} days x {} events, history written by events@v1 (a UTC-8 timezone bug)",
        lake.days, lake.events_per_day
    ));
    let location = match (&args.s3, &args.azure) {
        (Some(uri), _) => object_store_location(uri, "--s3", &S3)?,
        (None, Some(uri)) => object_store_location(uri, "--azure", &AZURE)?,
        (None, None) => LakeLocation::local(),
    };
    let created = lake.create_at(&dir, &location).await?;
    // Consumers of every table hear of each fix: one JSON line per published version.
    let project_file = dir.join(lakefill::PROJECT_FILE);
    let toml = std::fs::read_to_string(&project_file)?;
    std::fs::write(
        &project_file,
        format!(
            "# Every published version of every table is announced here (a webhook works alike).\n\
             notify = [\"file:notifications.jsonl\"]\n\n{toml}"
        ),
    )?;
    let project = Project::load(&dir)?;
    let (from, to) = (created.first_day.to_string(), created.last_day.to_string());

    let mut text = String::new();
    text.push_str(&format!(
        "The demo lake is in {shown}: raw_events ({} rows), and events, daily_revenue and revenue_7d (a 7-day\n\
         rolling revenue over daily_revenue) written by v1.\n\
         events@v1 dates each event at a fixed UTC-8 offset, so events before 08:00 UTC sit one day early.\n\n",
        created.raw_rows
    ));

    let partial = partial_fix(&project, &created, printer, &mut text).await?;

    printer.status(
        "1/5 planning events@v2 (the fix) over the whole history, and everything computed from it",
    );
    let plan = CascadeBuilder::new(&project, "events", &from, &to).await?;
    text.push_str("\n== 1. plan --cascade: events@v2, and the tables downstream of events ==\n");
    text.push_str(&render::cascade::plan(plan.report()));
    let plan_json = serde_json::to_value(plan.report())?;

    printer.status(
        "2/5 backfilling the cascade: stage and validate every table, then publish in order",
    );
    let cascade = CascadeRunner::new(&project, plan).await?;
    text.push_str(&format!(
        "\n== 2. backfill --cascade: events, daily_revenue and revenue_7d fixed together ({}) ==\n",
        cascade.outcome
    ));
    for node in &cascade.nodes {
        text.push_str(&render::run::text(node));
        text.push('\n');
    }
    let events = cascade
        .nodes
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the cascade has no nodes"))?;

    printer.status("3/5 comparing the two versions of events by time travel");
    let published = events.published_version.unwrap_or(events.read_version);
    let diff = lakefill::diff(
        &project,
        "events",
        events.read_version,
        DiffTarget::Version(Some(published)),
        None,
        3,
        None,
    )
    .await?;
    text.push_str(&format!(
        "\n== 3. diff events {} -> {published}: which events moved ==\n",
        events.read_version
    ));
    text.push_str(&render::diff::text(&diff)?);

    printer.status("4/5 reading the history of events");
    let history = lakefill::history(&project, "events", 10).await?;
    text.push_str("\n== 4. history of events: every version says why it exists ==\n");
    text.push_str(&render::history::text(&history));

    printer.status("5/5 writing the report of the fix and the consumers' notifications");
    let report = lakefill::report(&project, &events.run_id).await?;
    std::fs::write(
        dir.join("report.html"),
        lakefill::render_report(&report, lakefill::ReportFormat::Html)?,
    )?;
    let notified = std::fs::read_to_string(dir.join("notifications.jsonl"))
        .map_or(0, |text| text.lines().count());
    text.push_str(&format!(
        "\nwrote {shown}/report.html, the report of the events fix for people (open it in a browser),\n\
         and {shown}/notifications.jsonl, {notified} events for consumers (one per published version)\n"
    ));
    text.push_str(&format!(
        "\nexplore the project:\n  cd {shown}\n  lakefill plan events --from {from} --to {to} --cascade\n  \
         lakefill backfill events --from {from} --to {to} --cascade    # already published: changes nothing\n  \
         lakefill sql --cascade {cascade_id} 'SELECT COUNT(*) FROM revenue_7d'\n  \
         lakefill blame events --partition {from}\n  \
         lakefill sql 'SELECT COUNT(*) FROM \"events@1\"'\n  \
         lakefill diff daily_revenue --from-version 1 --to-version 2\n  \
         lakefill report {run} --format md\n  \
         lakefill revert {run}    # undo the fix, in its range only\n",
        run = events.run_id,
        cascade_id = cascade.cascade_id
    ));
    let value = json!({
        "dir": dir.display().to_string(),
        "raw_rows": created.raw_rows,
        "range": [from, to],
        "partial_fix": partial,
        "plan": plan_json,
        "cascade": cascade,
        "diff": diff,
        "history": history,
        "report": dir.join("report.html").display().to_string(),
        "notifications": dir.join("notifications.jsonl").display().to_string(),
    });
    if printer.format() == OutputFormat::Json {
        printer.result("", &value)
    } else {
        printer.result(&text, &value)
    }
}

/// A fix of one week only, as a hurried run would try it: the time zone fix moves events across
/// the week's edges, so validation fails (`edges`) and names the range no key crosses; the staged
/// run is discarded. Skipped for lakes of fewer than 10 days.
async fn partial_fix(
    project: &Project,
    created: &lakefill_fixtures::CreatedLake,
    printer: Printer,
    text: &mut String,
) -> anyhow::Result<Option<lakefill::RunReport>> {
    let days = (created.last_day - created.first_day).num_days();
    if days < 9 {
        return Ok(None);
    }
    let nth = |n: i64| {
        created
            .first_day
            .iter_days()
            .nth(usize::try_from(n).unwrap_or(0))
    };
    let (Some(from), Some(to)) = (nth(days / 4), nth(days / 4 + 6)) else {
        return Ok(None);
    };
    printer.status(&format!(
        "0/5 first, a fix of one week only ({from} ..= {to}): validated, and checked at its edges"
    ));
    let plan =
        lakefill::PlanBuilder::new(project, "events", from.to_string(), to.to_string()).await?;
    let run = lakefill::BackfillBuilder::new(plan)
        .with_stage_only(true)
        .await?;
    text.push_str(&format!(
        "== 0. backfill events --from {from} --to {to}: a week of the fix, refused at its edges ==\n"
    ));
    if let Some(validation) = &run.validation {
        for line in render::run::validation(validation).lines() {
            if line.contains("validation:")
                || line.contains("edges")
                || line.contains("outside=")
                || line.contains("suggested_from")
            {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    if let Some(hint) = run.validation_error().and_then(|e| e.hint()) {
        text.push_str(&format!("hint: {hint}\n"));
    }
    lakefill::discard_run(project, &run.run_id).await?;
    text.push_str("(the week's staged run is discarded; the whole history is fixed below)\n");
    Ok(Some(run))
}

/// An object store the demo can put its tables in: the store its locations must name, their form,
/// and the variables the demo passes on, written into `lakefill.toml` as `${VAR}` references so
/// that no secret lands in the file.
struct DemoStore {
    store: lakefill::Store,
    form: &'static str,
    variables: &'static [&'static str],
}

const S3: DemoStore = DemoStore {
    store: lakefill::Store::S3,
    form: "s3://bucket/prefix",
    variables: &[
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ],
};

const AZURE: DemoStore = DemoStore {
    store: lakefill::Store::Azure,
    form: "az://container/prefix",
    variables: &[
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_STORAGE_ENDPOINT",
        "AZURE_ALLOW_HTTP",
        "AZURE_STORAGE_USE_EMULATOR",
    ],
};

fn object_store_location(
    uri: &str,
    option: &str,
    kind: &DemoStore,
) -> anyhow::Result<LakeLocation> {
    if lakefill::Store::of_uri(uri) != kind.store
        || uri.trim_end_matches('/').matches('/').count() < 2
    {
        return Err(lakefill::Error::InvalidOption {
            option: option.into(),
            value: uri.to_string(),
            message: format!("expected `{}`", kind.form),
        }
        .into());
    }
    let mut location = LakeLocation {
        base_uri: Some(uri.trim_end_matches('/').to_string()),
        ..LakeLocation::default()
    };
    for variable in kind.variables {
        if let Ok(value) = std::env::var(variable) {
            location
                .project_storage
                .push((variable.to_string(), format!("${{{variable}}}")));
            location.storage.insert(variable.to_string(), value);
        }
    }
    Ok(location)
}
