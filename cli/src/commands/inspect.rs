//! `lakefill diff`, `history`, `blame` and `sql`: explaining history.

use std::fmt::Write as _;

use lakefill::DiffTarget;

use crate::args::{BlameArgs, DiffArgs, GlobalArgs, HistoryArgs, SqlArgs};
use crate::printer::Printer;
use crate::render;
use crate::settings;

pub(crate) async fn diff(
    global: &GlobalArgs,
    args: &DiffArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    if let Some(version) = args.cdf {
        let report = lakefill::change_feed(&project, &args.table, version, args.sample).await?;
        return printer.result(&render::diff::feed_text(&report), &report);
    }
    let target = match &args.run {
        Some(run) => DiffTarget::Run(run.clone()),
        None => DiffTarget::Version(args.to_version),
    };
    let report = lakefill::diff(
        &project,
        &args.table,
        args.from_version.unwrap_or_default(),
        target,
        args.key.clone(),
        args.sample,
        args.rows.as_deref(),
    )
    .await?;
    let text = render::diff::text(&report)?;
    printer.result(&text, &report)
}

pub(crate) async fn history(
    global: &GlobalArgs,
    args: &HistoryArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let entries = lakefill::history(&project, &args.table, args.limit).await?;
    let text = render::history::text(&entries);
    printer.result(&text, &entries)
}

pub(crate) async fn stale(
    global: &GlobalArgs,
    args: &crate::args::StaleArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let reports = lakefill::stale(&project, &args.tables, args.cascade).await?;
    let document = serde_json::json!({
        "stale": reports.iter().any(lakefill::StaleReport::needs_refresh),
        "tables": reports,
    });
    printer.result(&render::stale::text(&reports), &document)?;
    let stale: Vec<&lakefill::StaleReport> = reports.iter().filter(|r| r.needs_refresh()).collect();
    if stale.is_empty() {
        return Ok(());
    }
    Err(lakefill::Error::StaleHistory {
        tables: stale.iter().map(|r| r.table.clone()).collect(),
        ranges: stale.iter().map(|r| r.stale.len() + r.outdated.len()).sum(),
    }
    .into())
}

pub(crate) async fn blame(
    global: &GlobalArgs,
    args: &BlameArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    let report = lakefill::blame(&project, &args.table, &args.partition).await?;
    let mut text = String::new();
    let rows = report.rows.map_or_else(|| "?".into(), |r| r.to_string());
    let _ = writeln!(
        text,
        "{} partition {}: {} files, {rows} rows now",
        report.table, report.partition, report.files
    );
    match &report.last_write {
        None => {
            let _ = writeln!(text, "  no retained commit wrote this partition");
        }
        Some(e) => {
            let _ = writeln!(
                text,
                "  last written by version {} ({}) at {}",
                e.version,
                e.operation.as_deref().unwrap_or("?"),
                e.timestamp.as_deref().unwrap_or("?")
            );
            match &e.lakefill {
                Some(meta) => {
                    let sources: Vec<String> = meta
                        .sources
                        .iter()
                        .map(|(table, version)| format!("{table}@{version}"))
                        .collect();
                    let _ = writeln!(text, "  run          {}", meta.run_id);
                    if let Some(reverted) = &meta.revert_of {
                        let _ = writeln!(
                            text,
                            "  revert of    {reverted}: the rows are those from before that run (see the versions before it with `lakefill history {}`)",
                            report.table
                        );
                    }
                    if let Some(counts) = &meta.adjustments {
                        let _ = writeln!(
                            text,
                            "  adjustments  {} reversals and {} corrections appended (rows with `_lakefill_run_id` = {}); the partition's rows are its net rows",
                            counts.reversals, counts.corrections, meta.run_id
                        );
                    }
                    let _ = writeln!(text, "  model        {}@{}", meta.model, meta.model_version);
                    let _ = writeln!(text, "  fingerprint  sha256:{}", meta.fingerprint);
                    let _ = writeln!(text, "  sources      {}", sources.join(", "));
                    let _ = writeln!(text, "  range        {}..={}", meta.range.0, meta.range.1);
                    if let Some(predicate) = &meta.rows {
                        let _ = writeln!(
                            text,
                            "  where        {predicate} (only the rows that match were replaced; the partition's other rows are older)"
                        );
                    }
                    let _ = writeln!(
                        text,
                        "  reason       {}",
                        meta.reason.as_deref().unwrap_or("-")
                    );
                }
                None if e.run_id.is_some() => {
                    let _ = writeln!(
                        text,
                        "  run          {} (its metadata is in a form this version cannot read)",
                        e.run_id.as_deref().unwrap_or("?")
                    );
                }
                None => {
                    let _ = writeln!(text, "  not a lakefill commit: another writer made it");
                }
            }
        }
    }
    printer.result(&text, &report)
}

pub(crate) async fn sql(
    global: &GlobalArgs,
    args: &SqlArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    // `-`: the query is read from stdin (a query longer than a command line takes).
    let query = if args.query == "-" {
        let mut query = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut query)
            .map_err(|e| anyhow::anyhow!("cannot read the query from stdin: {e}"))?;
        query
    } else {
        args.query.clone()
    };
    let result =
        lakefill::sql_in_release(&project, &query, args.max_rows, args.cascade.as_deref()).await?;
    let mut text = result.to_table()?;
    text.push('\n');
    if result.truncated {
        let _ = writeln!(
            text,
            "(showing the first {} rows; raise --max-rows to see more)",
            args.max_rows
        );
    }
    printer.result(&text, &result)
}
