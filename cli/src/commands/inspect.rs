//! `lakefill diff`, `history`, `blame` and `sql`: explaining history.

use std::fmt::Write as _;

use lakefill::DiffTarget;

use crate::args::{BlameArgs, DiffArgs, GlobalArgs, HistoryArgs, SqlArgs};
use crate::printer::{Printer, comparison_text};
use crate::settings;

pub(crate) async fn diff(
    global: &GlobalArgs,
    args: &DiffArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let target = match &args.run {
        Some(run) => DiffTarget::Run(run.clone()),
        None => DiffTarget::Version(args.to_version),
    };
    let report = lakefill::diff(
        &project,
        &args.table,
        args.from_version,
        target,
        args.key.clone(),
        args.sample,
    )
    .await?;
    let mut text = String::new();
    let against = match (&report.run_id, report.to_version) {
        (Some(run), _) => format!("staged run {run}"),
        (None, Some(version)) => format!("version {version}"),
        (None, None) => "?".into(),
    };
    let _ = writeln!(
        text,
        "diff {}: version {} -> {against} ({} partitions changed, {} unchanged)",
        report.table, report.from_version, report.changed_partitions, report.unchanged_partitions
    );
    let _ = write!(
        text,
        "  {:<14} {:>10} {:>10} {:>9}",
        report.partition_column, "old rows", "new rows", "change"
    );
    let key = !report.comparison.key.is_empty();
    if key {
        let _ = write!(text, " {:>8} {:>8} {:>8}", "added", "removed", "changed");
    }
    for measure in &report.measures {
        let _ = write!(text, "  {measure} (old -> new)");
    }
    text.push('\n');
    for p in &report.comparison.partitions {
        let _ = write!(
            text,
            "  {:<14} {:>10} {:>10} {:>9}",
            p.value,
            p.old_rows,
            p.new_rows,
            p.new_rows as i64 - p.old_rows as i64
        );
        if key {
            let _ = write!(text, " {:>8} {:>8} {:>8}", p.added, p.removed, p.changed);
        }
        for measure in &report.measures {
            let m = p.measures.get(measure).cloned().unwrap_or_default();
            let _ = write!(text, "  {} -> {}", m.old, m.new);
        }
        text.push('\n');
    }
    let t = &report.comparison.totals;
    let _ = writeln!(
        text,
        "  {:<14} {:>10} {:>10} {:>9}",
        "total",
        t.old_rows,
        t.new_rows,
        t.new_rows as i64 - t.old_rows as i64
    );
    text.push_str(&comparison_text(&serde_json::to_value(&report.comparison)?));
    printer.result(&text, &report)
}

pub(crate) async fn history(
    global: &GlobalArgs,
    args: &HistoryArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
    let entries = lakefill::history(&project, &args.table, args.limit).await?;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:>7}  {:<24} {:<13} {:<20} {:<34} partitions / reason",
        "version", "time", "operation", "model", "run"
    );
    for e in &entries {
        let partitions = match &e.range {
            Some((from, to)) => format!("{from}..={to} ({} partitions)", e.partitions.len()),
            None => summarize(&e.partitions),
        };
        let reason = e
            .reason
            .as_deref()
            .map(|r| format!("  \"{r}\""))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "{:>7}  {:<24} {:<13} {:<20} {:<34} {partitions}{reason}",
            e.version,
            e.timestamp.as_deref().unwrap_or("-"),
            e.operation.as_deref().unwrap_or("-"),
            e.model.as_deref().unwrap_or("-"),
            e.run_id.as_deref().unwrap_or("-"),
        );
    }
    printer.result(&text, &entries)
}

fn summarize(partitions: &[String]) -> String {
    match partitions {
        [] => "-".into(),
        [one] => one.clone(),
        [first, .., last] => format!("{first}..{last} ({} partitions)", partitions.len()),
    }
}

pub(crate) async fn blame(
    global: &GlobalArgs,
    args: &BlameArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global)?;
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
                    let _ = writeln!(
                        text,
                        "  run          {}",
                        meta["run_id"].as_str().unwrap_or("?")
                    );
                    let _ = writeln!(
                        text,
                        "  model        {}@{}",
                        meta["model"].as_str().unwrap_or("?"),
                        meta["model_version"].as_str().unwrap_or("?")
                    );
                    let _ = writeln!(
                        text,
                        "  fingerprint  sha256:{}",
                        meta["fingerprint"].as_str().unwrap_or("?")
                    );
                    if let Some(sources) = meta["sources"].as_object() {
                        let list: Vec<String> =
                            sources.iter().map(|(t, v)| format!("{t}@{v}")).collect();
                        let _ = writeln!(text, "  sources      {}", list.join(", "));
                    }
                    let _ = writeln!(
                        text,
                        "  range        {}..={}",
                        meta["range"][0].as_str().unwrap_or("?"),
                        meta["range"][1].as_str().unwrap_or("?")
                    );
                    let _ = writeln!(
                        text,
                        "  reason       {}",
                        meta["reason"].as_str().unwrap_or("-")
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
    let project = settings::project(global)?;
    let result = lakefill::sql(&project, &args.query, args.max_rows).await?;
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
