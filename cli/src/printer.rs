//! The only module that prints: results on stdout, status and errors on stderr.

#![expect(clippy::print_stderr, reason = "the printer is where output happens")]

use std::fmt::Write as _;
use std::io::Write as _;

use lakefill::{PlanReport, RunReport};
use serde::Serialize;

use crate::args::OutputFormat;

/// Writes results and status lines according to the global flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    format: OutputFormat,
    quiet: bool,
}

impl Printer {
    pub(crate) fn new(format: OutputFormat, quiet: bool) -> Self {
        Self { format, quiet }
    }

    pub(crate) fn format(&self) -> OutputFormat {
        self.format
    }

    /// Prints a result: `text` for people, or `value` as one JSON document.
    pub(crate) fn result(&self, text: &str, value: &impl Serialize) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        match self.format {
            OutputFormat::Text => stdout.write_all(text.as_bytes())?,
            OutputFormat::Json => {
                serde_json::to_writer_pretty(&mut stdout, value)?;
                stdout.write_all(b"\n")?;
            }
        }
        stdout.flush()?;
        Ok(())
    }

    /// Prints a status line on stderr, unless `-q`.
    pub(crate) fn status(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }

    /// Prints an error chain and its hint on stderr (always, even under `-q`).
    pub(crate) fn error(&self, error: &anyhow::Error, hint: Option<String>) {
        let mut out = format!("error: {error}\n");
        // Some errors repeat their source in their own message; print each text once.
        let mut previous = error.to_string();
        for cause in error.chain().skip(1) {
            let text = cause.to_string();
            if !previous.contains(&text) {
                let _ = writeln!(out, "caused by: {text}");
            }
            previous = text;
        }
        if let Some(hint) = hint {
            let _ = write!(out, "\nhint: {hint}\n");
        }
        eprint!("{out}");
    }
}

/// Renders a plan for people.
pub(crate) fn plan_text(plan: &PlanReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan: {}@{} -> {} (run {})",
        plan.model, plan.model_version, plan.target, plan.run_id
    );
    let _ = writeln!(
        out,
        "  model file    {}",
        crate::settings::display_path(std::path::Path::new(&plan.model_file))
    );
    let _ = writeln!(out, "  fingerprint   sha256:{}", plan.fingerprint);
    let _ = writeln!(
        out,
        "  target        {} at version {} ({}), partitioned by {} ({})",
        plan.target,
        plan.read_version,
        plan.target_uri,
        plan.partition_column,
        match plan.partition_type {
            lakefill::PartitionType::Date => "date",
            lakefill::PartitionType::String => "string",
        }
    );
    let _ = writeln!(
        out,
        "  range         {} ..= {} ({} partitions, {} batches of up to {})",
        plan.range.from,
        plan.range.to,
        plan.partitions.len(),
        plan.batches.len(),
        plan.batch_partitions
    );
    if let Some(reason) = &plan.reason {
        let _ = writeln!(out, "  reason        {reason}");
    }
    if let Some(policy) = &plan.allow_spill {
        let _ = writeln!(out, "  spill         {policy} rows outside the range");
    }
    if plan.already_published {
        let _ = writeln!(
            out,
            "  status        already published: running it again changes nothing"
        );
    }
    let _ = writeln!(out, "\nsources (pinned)");
    for source in &plan.sources {
        let window = match &source.window {
            Some(column) => format!(
                "window {column} -{}/+{} days",
                source.lookback, source.lookahead
            ),
            None => "whole table".into(),
        };
        let note = if source.reads_target {
            "  (the target, at the read version)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:<16} version {:<6} {window}{note}",
            source.table, source.version
        );
    }
    let _ = writeln!(out, "\npartitions now (from the Delta log)");
    let _ = writeln!(
        out,
        "  {:<14} {:>6} {:>10} {:>12}",
        plan.partition_column, "files", "rows", "bytes"
    );
    for p in &plan.partitions {
        let _ = writeln!(
            out,
            "  {:<14} {:>6} {:>10} {:>12}",
            p.value,
            p.files,
            rows(p.rows),
            bytes(p.bytes)
        );
    }
    let _ = writeln!(
        out,
        "  {:<14} {:>6} {:>10} {:>12}",
        "total",
        plan.totals.files,
        rows(plan.totals.rows),
        bytes(plan.totals.bytes)
    );
    let _ = writeln!(out, "\nbatches");
    for batch in &plan.batches {
        let _ = writeln!(
            out,
            "  #{:<3} {} ..= {}  ({} partitions)",
            batch.index,
            batch.start,
            batch.end,
            batch.partitions.len()
        );
    }
    let _ = writeln!(out, "\ndownstream models");
    if plan.downstream.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for model in &plan.downstream {
        let _ = writeln!(
            out,
            "  {}@{} -> {}  (re-run it over the same range after this backfill)",
            model.model, model.version, model.target
        );
    }
    out
}

/// Renders a backfill report for people.
pub(crate) fn run_text(report: &RunReport) -> String {
    let mut out = String::new();
    match (report.outcome, report.published_version) {
        (lakefill::Outcome::AlreadyPublished, version) => {
            let version = version
                .map(|v| format!(" as version {v}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "already published: run {} of {}@{} was committed to {}{version}; nothing to do",
                report.run_id, report.model, report.model_version, report.table
            );
            return out;
        }
        (_, Some(version)) => {
            let _ = writeln!(
                out,
                "published {} version {version} (read version {}), run {} of {}@{}",
                report.table,
                report.read_version,
                report.run_id,
                report.model,
                report.model_version
            );
        }
        (_, None) => {
            let _ = writeln!(out, "run {} is {}", report.run_id, report.state);
        }
    }
    let _ = writeln!(
        out,
        "  {:<14} {:>10} {:>10} {:>9}",
        "partition", "old rows", "new rows", "change"
    );
    let (mut old_total, mut new_total) = (0u64, 0u64);
    for p in &report.partitions {
        let old = p.old_rows.unwrap_or(0);
        old_total += old;
        new_total += p.new_rows;
        let note = if p.new_rows == 0 { "  (now empty)" } else { "" };
        let _ = writeln!(
            out,
            "  {:<14} {:>10} {:>10} {:>9}{note}",
            p.value,
            rows(p.old_rows),
            p.new_rows,
            signed(p.new_rows as i64 - old as i64)
        );
    }
    let _ = writeln!(
        out,
        "  {:<14} {:>10} {:>10} {:>9}",
        "total",
        old_total,
        new_total,
        signed(new_total as i64 - old_total as i64)
    );
    if report.spill_dropped > 0 {
        let _ = writeln!(
            out,
            "  dropped {} rows for partitions outside the range (--allow-spill drop): {}",
            report.spill_dropped,
            report
                .spill
                .iter()
                .map(|(p, n)| format!("{p} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        out,
        "  staged {} files, {} in {:.1}s; commit {:.1}s",
        report.files_written,
        bytes(report.bytes_written),
        report.timings.stage_ms as f64 / 1000.0,
        report.timings.publish_ms as f64 / 1000.0
    );
    out
}

fn rows(rows: Option<u64>) -> String {
    rows.map_or_else(|| "?".into(), |r| r.to_string())
}

fn signed(n: i64) -> String {
    if n > 0 {
        format!("+{n}")
    } else {
        n.to_string()
    }
}

/// Formats a byte count with a binary unit.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
