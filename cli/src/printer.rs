//! The only module that prints: results on stdout, status and errors on stderr.

#![expect(clippy::print_stderr, reason = "the printer is where output happens")]

use std::fmt::Write as _;
use std::io::Write as _;

use std::io::IsTerminal as _;
use std::sync::Arc;

use lakefill::{PlanReport, ProgressEvent, ProgressSink, RunReport};
use serde::Serialize;
use serde_json::Value;

use crate::args::OutputFormat;

/// Whether a result document went to stdout (so an error after it adds none).
static RESULT_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a failed command tells its caller besides the message.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    /// The next step.
    pub(crate) hint: Option<String>,
    /// The process exit code.
    pub(crate) exit_code: u8,
    /// The run the error is about.
    pub(crate) run_id: Option<String>,
    /// The run's state.
    pub(crate) state: Option<String>,
}

/// Writes results and status lines according to the global flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    format: OutputFormat,
    quiet: bool,
    verbose: bool,
}

impl Printer {
    pub(crate) fn new(format: OutputFormat, quiet: bool, verbose: bool) -> Self {
        Self {
            format,
            quiet,
            verbose,
        }
    }

    /// Where a run's progress goes: JSON lines on stderr with `--output-format json`, a bar on
    /// a terminal, nothing under `-q` (or `-v`, whose logs would garble a bar).
    pub(crate) fn progress(&self) -> Option<Arc<dyn ProgressSink>> {
        if self.quiet {
            return None;
        }
        match self.format {
            OutputFormat::Json => Some(Arc::new(JsonProgress)),
            OutputFormat::Text if !self.verbose && std::io::stderr().is_terminal() => {
                Some(Arc::new(BarProgress::new()))
            }
            OutputFormat::Text => None,
        }
    }

    pub(crate) fn format(&self) -> OutputFormat {
        self.format
    }

    /// Prints a result: `text` for people, or `value` as one JSON document.
    pub(crate) fn result(&self, text: &str, value: &impl Serialize) -> anyhow::Result<()> {
        RESULT_PRINTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut stdout = std::io::stdout().lock();
        match self.format {
            OutputFormat::Text => stdout.write_all(safe_text(text).as_bytes())?,
            OutputFormat::Json => {
                // JSON stays exact (its encoder escapes control characters); secrets still go.
                let document = serde_json::to_string_pretty(value)?;
                stdout.write_all(lakefill::mask_secrets(&document).as_bytes())?;
                stdout.write_all(b"\n")?;
            }
        }
        stdout.flush()?;
        Ok(())
    }

    /// Prints a document (a report) on stdout as it is: already masked, and meant to be saved.
    pub(crate) fn raw(&self, text: &str) -> anyhow::Result<()> {
        RESULT_PRINTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        Ok(())
    }

    /// Prints shell completions for `lakefill` on stdout.
    pub(crate) fn completions(&self, shell: clap_complete::Shell) -> anyhow::Result<()> {
        use clap::CommandFactory as _;
        let mut command = crate::args::Cli::command();
        let mut stdout = std::io::stdout().lock();
        clap_complete::generate(shell, &mut command, "lakefill", &mut stdout);
        stdout.flush()?;
        Ok(())
    }

    /// Prints a status line on stderr, unless `-q`.
    pub(crate) fn status(&self, line: &str) {
        if !self.quiet {
            eprintln!("{}", safe_text(line));
        }
    }

    /// Prints an error chain and its hint on stderr (always, even under `-q`). With
    /// `--output-format json` it also prints one JSON document on stdout, unless the command
    /// already printed its result there (a failed validation prints its report first).
    pub(crate) fn error(&self, error: &anyhow::Error, failure: &Failure) {
        let mut out = format!("error: {error}\n");
        // Some errors repeat their source in their own message; print each text once.
        let mut previous = error.to_string();
        let mut causes = Vec::new();
        for cause in error.chain().skip(1) {
            let text = without_backtrace(&cause.to_string());
            if !previous.contains(&text) {
                let _ = writeln!(out, "caused by: {text}");
                causes.push(text.clone());
            }
            previous = text;
        }
        if let Some(hint) = &failure.hint {
            let _ = write!(out, "\nhint: {hint}\n");
        }
        eprint!("{}", safe_text(&out));
        if self.format == OutputFormat::Json
            && !RESULT_PRINTED.load(std::sync::atomic::Ordering::SeqCst)
        {
            let document = serde_json::json!({
                "error": error.to_string(),
                "caused_by": causes,
                "hint": failure.hint,
                "exit_code": failure.exit_code,
                "run_id": failure.run_id,
                "state": failure.state,
            });
            let mut stdout = std::io::stdout().lock();
            if let Ok(document) = serde_json::to_string_pretty(&document) {
                let _ = stdout.write_all(lakefill::mask_secrets(&document).as_bytes());
            }
            let _ = stdout.write_all(b"\n");
            let _ = stdout.flush();
        }
    }
}

/// Text for a terminal: secrets masked, and control characters (an escape sequence in a reason
/// another writer put in the log) shown escaped instead of acted on. Newlines and tabs stay.
pub(crate) fn safe_text(text: &str) -> String {
    let masked = lakefill::mask_secrets(text);
    if !masked
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return masked;
    }
    let mut out = String::with_capacity(masked.len());
    for c in masked.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
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
    let layout = &plan.layout;
    let others = layout.other_columns();
    if layout.by_rows {
        let _ = writeln!(
            out,
            "  target        {} at version {} ({}), {}; the range replaces rows by {}",
            plan.target,
            plan.read_version,
            plan.target_uri,
            if layout.partition_columns.is_empty() {
                "not partitioned".to_string()
            } else {
                format!("partitioned by {}", layout.partition_columns.join(", "))
            },
            layout.time.encoding.describe()
        );
    } else {
        let _ = writeln!(
            out,
            "  target        {} at version {} ({}), partitioned by {}{}",
            plan.target,
            plan.read_version,
            plan.target_uri,
            layout.time.encoding.describe(),
            if others.is_empty() {
                String::new()
            } else {
                format!(" and {}", others.join(", "))
            }
        );
    }
    let _ = writeln!(
        out,
        "  grain         {} ({})",
        layout.time.grain, layout.time.grain_reason
    );
    if plan.publish == lakefill::PublishMode::Adjustments {
        let _ = writeln!(
            out,
            "  publish       adjustments: reversal and correction rows are appended, nothing is removed{}",
            if plan.added_columns.is_empty() {
                String::new()
            } else {
                format!(
                    " (adds {})",
                    plan.added_columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
    let _ = writeln!(
        out,
        "  range         {} ..= {} ({} partitions, {} batches of up to {}; at most {} without `--max-partitions`)",
        plan.range.from,
        plan.range.to,
        plan.partitions.len(),
        plan.batches.len(),
        plan.batch_partitions,
        plan.max_partitions
    );
    let _ = writeln!(
        out,
        "  memory        {}",
        match plan.memory_limit {
            Some(limit) => format!(
                "{} for the run's queries, spilling to disk beyond it (`--memory-limit` to change)",
                bytes(limit)
            ),
            None => "unlimited (`memory_limit = \"unlimited\"`)".to_string(),
        }
    );
    for note in &plan.range_notes {
        let _ = writeln!(out, "  note          {note}");
    }
    if plan.range.include_null {
        let _ = writeln!(
            out,
            "  null          the partition whose time is NULL is replaced too"
        );
    }
    if let Some(reason) = &plan.reason {
        let _ = writeln!(out, "  reason        {reason}");
    }
    if let Some(policy) = &plan.allow_spill {
        let _ = writeln!(out, "  spill         {policy} rows outside the range");
    }
    if let Some(edges) = &plan.edges {
        let zones: Vec<String> = [&edges.before, &edges.after]
            .into_iter()
            .flatten()
            .map(|(first, last)| {
                if first == last {
                    first.clone()
                } else {
                    format!("{first}..={last}")
                }
            })
            .collect();
        let verdict = match &edges.allowed {
            Some(reason) => format!("keys that cross are allowed (`--allow-edge-moves`: {reason})"),
            None => "a key that would be lost or written twice there fails the run".into(),
        };
        let _ = writeln!(
            out,
            "  edges         keys checked in {} ({}); {verdict}",
            zones.join(" and "),
            edges.why
        );
    }
    if plan.already_published {
        let _ = writeln!(
            out,
            "  status        already published: running it again changes nothing"
        );
    }
    let _ = writeln!(out, "\nsources (pinned)");
    for source in &plan.sources {
        let window = match (&source.window, &source.window_time) {
            (Some(column), Some(time)) => format!(
                "window {column} -{}/+{} {}s ({})",
                source.lookback, source.lookahead, time.grain, time.grain_reason
            ),
            (Some(column), None) => {
                format!("window {column} -{}/+{}", source.lookback, source.lookahead)
            }
            (None, _) => "whole table".into(),
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
    let protocol = &plan.protocol;
    let _ = writeln!(
        out,
        "\nprotocol of {} (reader {}, writer {})",
        plan.target, protocol.min_reader_version, protocol.min_writer_version
    );
    if protocol.features.is_empty() {
        let _ = writeln!(out, "  no table features");
    }
    for feature in &protocol.features {
        let _ = writeln!(out, "  {:<22} {}", feature.name, feature.handling);
    }
    for rule in &protocol.rules {
        let _ = writeln!(out, "  enforced: {}", rule.name);
    }
    if plan.storage.values().any(|options| !options.is_empty()) {
        let _ = writeln!(
            out,
            "\nstorage options (table > [storage] > environment; secrets masked)"
        );
        for (table, options) in &plan.storage {
            for option in options {
                let _ = writeln!(
                    out,
                    "  {:<16} {} = {}  ({})",
                    table, option.key, option.value, option.from
                );
            }
        }
    }
    if layout.by_rows {
        let _ = writeln!(
            out,
            "\nfiles the range may touch (by their statistics; the rest are kept as they are)\n  {} files, {} rows, {}; rows of the range are counted when validating",
            plan.totals.files,
            rows(plan.totals.rows),
            bytes(plan.totals.bytes)
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
            "  {}@{} -> {}  (`--cascade` plans the range each needs)",
            model.model, model.version, model.target
        );
    }
    out
}

/// Renders a cascade plan: each node with its range and why, each edge, the total work.
pub(crate) fn cascade_text(cascade: &lakefill::CascadeReport) -> String {
    let mut out = String::new();
    let root = cascade.nodes.first();
    let _ = writeln!(
        out,
        "cascade {} from {}: {} models, {} partitions in {} batches, {}",
        cascade.cascade_id,
        root.map_or_else(String::new, |r| format!(
            "{}@{} over {} ..= {}",
            r.model, r.version, r.range.from, r.range.to
        )),
        cascade.nodes.len(),
        cascade.total_partitions,
        cascade.total_batches,
        bytes(cascade.total_bytes)
    );
    for (i, node) in cascade.nodes.iter().enumerate() {
        let sources: Vec<String> = node
            .sources
            .iter()
            .map(|(t, v)| format!("{t}@{v}"))
            .collect();
        let _ = writeln!(
            out,
            "\n  {}. {}@{} -> {}  {} ..= {}  ({} partitions, {} batches, {}; read version {})",
            i + 1,
            node.model,
            node.version,
            node.target,
            node.range.from,
            node.range.to,
            node.partitions,
            node.batches,
            bytes(node.bytes),
            node.read_version
        );
        let _ = writeln!(
            out,
            "     run {}; reads {}",
            node.run_id,
            sources.join(", ")
        );
        for why in &node.why {
            let _ = writeln!(out, "     why: {why}");
        }
    }
    if !cascade.edges.is_empty() {
        let _ = writeln!(out, "\nedges");
        for edge in &cascade.edges {
            let window = match (&edge.window, edge.grain) {
                (Some(w), Some(g)) => format!(
                    "window {w}, lookback {} / lookahead {} {g}s",
                    edge.lookback, edge.lookahead
                ),
                _ => "no window: reads the whole table".into(),
            };
            let reach = edge.reaches.as_ref().map_or_else(
                || "reaches nothing".into(),
                |(f, t)| format!("reaches {f} ..= {t}"),
            );
            let _ = writeln!(
                out,
                "  {} -> {} (reads {}; {window}): {reach}",
                edge.parent, edge.child, edge.table
            );
        }
    }
    let _ = writeln!(
        out,
        "\nno node widens beyond {}x the root's span (`--max-expansion`); nothing was written",
        cascade.max_expansion
    );
    out
}

/// Renders a backfill, publish or discard report for people.
pub(crate) fn run_text(report: &RunReport) -> String {
    use lakefill::Outcome;
    let mut out = String::new();
    let run = format!(
        "run {} of {}@{}",
        report.run_id, report.model, report.model_version
    );
    match report.outcome {
        Outcome::AlreadyPublished => {
            let version = report
                .published_version
                .map(|v| format!(" as version {v}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "already published: {run} was committed to {}{version}; nothing to do",
                report.table
            );
            return out;
        }
        Outcome::Published => {
            let _ = writeln!(
                out,
                "published {} version {} (read version {}), {run}",
                report.table,
                report
                    .published_version
                    .map_or_else(|| "?".into(), |v| v.to_string()),
                report.read_version
            );
        }
        Outcome::Staged => {
            let _ = writeln!(
                out,
                "staged {run} for {} (read version {}); nothing is visible to readers yet
                   publish it with `lakefill publish {}` or drop it with `lakefill discard {}`",
                report.table, report.read_version, report.run_id, report.run_id
            );
        }
        Outcome::ValidationFailed => {
            let _ = writeln!(
                out,
                "validation FAILED for {run} on {}; nothing was published (the run stays staged)",
                report.table
            );
        }
        Outcome::UpToDate => {
            let _ = writeln!(
                out,
                "up to date: {run} produces exactly the rows {} holds now (read version {}); nothing was published and nothing stays staged",
                report.table, report.read_version
            );
        }
        Outcome::Discarded => {
            let _ = writeln!(out, "discarded {run}: its staged files are deleted");
            return out;
        }
        Outcome::Reverted | Outcome::AlreadyReverted => {
            let reverted = report.revert_of.as_deref().unwrap_or("?");
            let version = report
                .published_version
                .map_or_else(|| "?".into(), |v| v.to_string());
            if report.outcome == Outcome::AlreadyReverted {
                let _ = writeln!(
                    out,
                    "already reverted: {reverted} was reverted by {} as version {version} of {}; nothing to do",
                    report.run_id, report.table
                );
                return out;
            }
            let _ = writeln!(
                out,
                "reverted {reverted}: {} version {version} puts back {}..={} as it was before the run (read version {}; revert run {})
  undo this with `lakefill revert {}`",
                report.table,
                report.range.from,
                report.range.to,
                report.read_version,
                report.run_id,
                report.run_id
            );
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
            "  dropped {} rows for partitions outside the range (--allow-spill drop)",
            report.spill_dropped
        );
    }
    if let Some(validation) = &report.validation {
        out.push_str(&validation_text(validation));
    }
    if let Some(reason) = &report.forced {
        let _ = writeln!(out, "  validation overridden: {reason}");
    }
    if let Some(counts) = &report.adjustments {
        let _ = writeln!(
            out,
            "  adjustments: {} reversals and {} corrections appended, nothing removed (files below)",
            counts.reversals, counts.corrections
        );
    }
    out.push_str(&notifications_text(&report.notifications));
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    let t = &report.timings;
    if report.outcome == Outcome::Reverted && report.files_written == 0 {
        let _ = writeln!(
            out,
            "  removed the {} files the run added, re-added the {} it replaced | {:.1}s",
            report.partitions.iter().map(|p| p.old_files).sum::<u64>(),
            report.partitions.iter().map(|p| p.new_files).sum::<u64>(),
            t.total_ms as f64 / 1000.0
        );
        return out;
    }
    let _ = writeln!(
        out,
        "  staged {} files, {} | stage {:.1}s, validate {:.1}s, commit {:.1}s",
        report.files_written,
        bytes(report.bytes_written),
        t.stage_ms as f64 / 1000.0,
        t.validate_ms as f64 / 1000.0,
        t.publish_ms as f64 / 1000.0
    );
    out
}

/// One line per sink: what it was told now, and what failed (retried by later commands).
pub(crate) fn notifications_text(deliveries: &[lakefill::Delivery]) -> String {
    let versions = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    let mut out = String::new();
    for d in deliveries {
        let mut parts = Vec::new();
        if !d.delivered.is_empty() {
            parts.push(format!("delivered version {}", versions(&d.delivered)));
        }
        if !d.skipped.is_empty() {
            parts.push(format!("skipped {} (filters)", versions(&d.skipped)));
        }
        if !d.failed.is_empty() {
            parts.push(format!(
                "FAILED {} ({}); `lakefill notify` or the next command retries",
                versions(&d.failed),
                d.error.as_deref().unwrap_or("?")
            ));
        }
        if !d.pending.is_empty() {
            parts.push(format!(
                "not tried {} (out of time); `lakefill notify` or the next command delivers",
                versions(&d.pending)
            ));
        }
        if parts.is_empty() {
            parts.push("nothing new".into());
        }
        let _ = writeln!(out, "  notify {}: {}", d.sink, parts.join("; "));
    }
    out
}

/// Renders a validation report.
pub(crate) fn validation_text(validation: &lakefill::ValidationReport) -> String {
    let mut out = String::new();
    let checks = &validation.checks;
    let failed = validation.failed();
    if failed.is_empty() {
        let _ = writeln!(out, "validation: passed ({} checks)", checks.len());
    } else {
        let _ = writeln!(
            out,
            "validation: FAILED {} of {} checks: {}",
            failed.len(),
            checks.len(),
            failed.join(", ")
        );
    }
    for check in checks {
        let _ = writeln!(
            out,
            "  {:<4} {}",
            if check.passed { "ok" } else { "FAIL" },
            check.name
        );
        for failure in check.failures.iter().take(10) {
            let _ = writeln!(out, "         {}", compact(failure));
        }
        for row in &check.sample {
            if let Some(column) = row["added_column"].as_str() {
                let _ = writeln!(
                    out,
                    "         adds column `{column}` ({})",
                    row["type"].as_str().unwrap_or("?")
                );
            } else if !check.passed {
                let _ = writeln!(out, "         sample: {}", compact(row));
            }
        }
    }
    out.push_str(&comparison_text(&validation.comparison));
    for note in &validation.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

/// Renders the key-level part of a comparison: counts and samples.
pub(crate) fn comparison_text(comparison: &lakefill::Comparison) -> String {
    let mut out = String::new();
    let totals = &comparison.totals;
    for (name, change) in &totals.measures {
        let _ = writeln!(
            out,
            "  sum({name}): {} -> {} ({})",
            number(change.old),
            number(change.new),
            signed_f(change.new - change.old)
        );
    }
    if comparison.key.is_empty() {
        let _ = writeln!(
            out,
            "  rows by key: skipped (no key; set `[validate] key` or pass `--key`)"
        );
    } else {
        let _ = writeln!(
            out,
            "  rows by key ({}): {} added, {} removed, {} changed",
            comparison.key.join(", "),
            totals.added,
            totals.removed,
            totals.changed
        );
        let samples = &comparison.samples;
        for (kind, rows) in [
            ("added", &samples.added),
            ("removed", &samples.removed),
            ("changed", &samples.changed),
        ] {
            for sample in rows {
                let _ = writeln!(out, "    {kind:<8} {}", compact(sample));
            }
        }
    }
    if comparison.old_unread > 0 {
        let _ = writeln!(
            out,
            "  old rows of {} unchanged partitions not read: their files' checksums in the log equal the new rows'",
            comparison.old_unread
        );
    }
    for (label, list) in [
        ("appeared", &comparison.appeared),
        ("disappeared", &comparison.disappeared),
    ] {
        if !list.is_empty() {
            let _ = writeln!(out, "  partitions {label}: {}", list.join(", "));
        }
    }
    out
}

/// An error's text without the Rust backtrace some libraries append to it (the Delta kernel
/// does under `RUST_BACKTRACE`): numbered frames are for bug reports, not for users (#32).
fn without_backtrace(text: &str) -> String {
    let frame = |line: &str| {
        let line = line.trim_start();
        line.split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    let mut lines: Vec<&str> = Vec::new();
    for line in text.lines() {
        if frame(line) && line.starts_with(char::is_whitespace) {
            break;
        }
        lines.push(line);
    }
    lines.join("\n").trim_end().to_string()
}

/// One-line JSON without quotes around simple keys, for samples and failures.
fn compact(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let parts: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}={}", compact(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        format!("{}", n as i64)
    } else {
        format!("{n:.4}")
    }
}

fn signed_f(n: f64) -> String {
    if n > 0.0 {
        format!("+{}", number(n))
    } else {
        number(n)
    }
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

/// Formats a byte count with a binary unit. (Eight lines; no crate in the dependency tree does
/// it, and one would be a new dependency for this alone.)
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

/// Renders a diff report for people.
pub(crate) fn diff_text(report: &lakefill::DiffReport) -> anyhow::Result<String> {
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
    text.push_str(&comparison_text(&report.comparison));
    Ok(text)
}

/// Renders a table's history for people.
pub(crate) fn history_text(entries: &[lakefill::HistoryEntry]) -> String {
    let rows = entries.iter().map(|e| {
        let partitions = match &e.range {
            Some((from, to)) => format!("{from}..={to} ({} partitions)", e.partitions.len()),
            None => summarize(&e.partitions),
        };
        let reason = e
            .reason
            .as_deref()
            .map(|r| format!("  \"{r}\""))
            .unwrap_or_default();
        // Adjustments append: say so, since the operation alone reads like any write.
        let operation = match e.lakefill.as_ref().and_then(|m| m.adjustments) {
            Some(counts) => format!(
                "{} (+{} reversals, +{} corrections)",
                e.operation.as_deref().unwrap_or("WRITE"),
                counts.reversals,
                counts.corrections
            ),
            None => e.operation.clone().unwrap_or_else(|| "-".into()),
        };
        vec![
            e.version.to_string(),
            e.timestamp.clone().unwrap_or_else(|| "-".into()),
            operation,
            e.model.clone().unwrap_or_else(|| "-".into()),
            e.run_id.clone().unwrap_or_else(|| "-".into()),
            format!("{partitions}{reason}"),
        ]
    });
    columns(
        &[
            "version",
            "time",
            "operation",
            "model",
            "run",
            "partitions / reason",
        ],
        rows,
    )
}

/// Lays out rows in columns as wide as their widest cell, without borders (the first column
/// right-aligned), one line per row.
fn columns(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header.iter().copied());
    for row in rows {
        table.add_row(row);
    }
    if let Some(first) = table.column_mut(0) {
        first.set_cell_alignment(comfy_table::CellAlignment::Right);
    }
    let mut text: String = table
        .lines()
        .map(|line| line.trim_end().to_string() + "\n")
        .collect();
    if text.is_empty() {
        text.push('\n');
    }
    text
}

fn summarize(partitions: &[String]) -> String {
    match partitions {
        [] => "-".into(),
        [one] => one.clone(),
        [first, .., last] => format!("{first}..{last} ({} partitions)", partitions.len()),
    }
}

/// Progress as one JSON document per line on stderr, for schedulers.
struct JsonProgress;

impl ProgressSink for JsonProgress {
    fn event(&self, event: &ProgressEvent) {
        if let Ok(line) = serde_json::to_string(event) {
            eprintln!("{line}");
        }
    }
}

/// A progress bar per run on stderr.
struct BarProgress {
    bar: indicatif::ProgressBar,
}

impl BarProgress {
    fn new() -> Self {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stderr(),
        );
        let style = indicatif::ProgressStyle::with_template(
            "{spinner} [{bar:28}] {pos}/{len} batches  {msg}  ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        Self { bar }
    }
}

impl ProgressSink for BarProgress {
    fn event(&self, event: &ProgressEvent) {
        match event {
            ProgressEvent::Started {
                batches_total,
                batches_resumed,
                ..
            } => {
                self.bar.set_length(*batches_total as u64);
                self.bar.set_position(*batches_resumed as u64);
                self.bar.set_message("staging");
                self.bar
                    .enable_steady_tick(std::time::Duration::from_millis(120));
            }
            ProgressEvent::BatchFinished {
                batches_done,
                rows_total,
                bytes_total,
                elapsed_ms,
                ..
            } => {
                self.bar.set_position(*batches_done as u64);
                let rate = *rows_total as f64 / (*elapsed_ms as f64 / 1000.0).max(0.001);
                self.bar.set_message(format!(
                    "{rows_total} rows ({rate:.0} rows/s), {} written",
                    bytes(*bytes_total)
                ));
            }
            ProgressEvent::Phase { phase, .. } => self.bar.set_message(phase.clone()),
            ProgressEvent::Finished { .. } => self.bar.finish_and_clear(),
        }
    }
}
