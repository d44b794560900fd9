//! A run: what `backfill`, `publish`, `discard` and `revert` did, with its validation and the
//! notifications it sent.

use std::fmt::Write as _;

use lakefill::RunReport;

use super::{bytes, compact, number, rows, signed, signed_f};

/// Renders a backfill, publish, discard or revert report for people: what happened, per
/// partition, validation and what else the run reports, and what it staged.
pub(crate) fn text(report: &RunReport) -> String {
    let mut out = String::new();
    if headline(report, &mut out) == Told::All {
        return out;
    }
    partitions(report, &mut out);
    details(report, &mut out);
    footer(report, &mut out);
    out
}

/// Whether a headline said all there is to say.
#[derive(PartialEq, Eq)]
enum Told {
    All,
    More,
}

/// What the command did to the run, in one line (two for a revert).
fn headline(report: &RunReport, out: &mut String) -> Told {
    use lakefill::Outcome;
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
            return Told::All;
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
            return Told::All;
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
                return Told::All;
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
    Told::More
}

/// Rows before and after, per partition and in total.
fn partitions(report: &RunReport, out: &mut String) {
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
}

/// Dropped rows, validation, an override, adjustments, notifications and notes.
fn details(report: &RunReport, out: &mut String) {
    if report.spill_dropped > 0 {
        let _ = writeln!(
            out,
            "  dropped {} rows for partitions outside the range (--allow-spill drop)",
            report.spill_dropped
        );
    }
    if let Some(validation) = &report.validation {
        out.push_str(&self::validation(validation));
    }
    if let Some(reason) = &report.forced {
        let _ = writeln!(out, "  validation overridden: {reason}");
    }
    if let Some(vectors) = report
        .deletion_vectors
        .as_ref()
        .filter(|v| v.files_cut > 0 || !v.rewritten.is_empty() || !v.uncut.is_empty())
    {
        let sum = |f: fn(&lakefill::VectorCounts) -> u64| -> u64 {
            vectors.partitions.values().map(f).sum()
        };
        let _ = writeln!(
            out,
            "  deletion vectors: {} partitions by vectors ({} old rows deleted in place in {} files, {} rows added), {} rewritten (the fix changes too much of them)",
            vectors.partitions.len(),
            sum(|c| c.deleted),
            vectors.files_cut,
            sum(|c| c.added),
            vectors.rewritten.len(),
        );
        let other_type: Vec<&str> = vectors
            .uncut
            .difference(&vectors.too_large)
            .map(String::as_str)
            .collect();
        if !other_type.is_empty() {
            let _ = writeln!(
                out,
                "  {} partitions rewritten whole: a column of their old files is not of the table's type, and such files are never cut ({})",
                other_type.len(),
                other_type.join(", "),
            );
        }
        if !vectors.too_large.is_empty() {
            let _ = writeln!(
                out,
                "  {} partitions rewritten whole: more live rows than matching may hold in memory (a quarter of --memory-limit, 64 bytes a row); raise it to cut them ({})",
                vectors.too_large.len(),
                vectors
                    .too_large
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
    }
    if let Some(counts) = &report.adjustments {
        let _ = writeln!(
            out,
            "  adjustments: {} reversals and {} corrections appended, nothing removed (files below)",
            counts.reversals, counts.corrections
        );
    }
    out.push_str(&notifications(&report.notifications));
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
}

/// What was staged and how long each phase took (for a revert by files: the files it swapped).
fn footer(report: &RunReport, out: &mut String) {
    let t = &report.timings;
    if report.outcome == lakefill::Outcome::Reverted && report.files_written == 0 {
        let _ = writeln!(
            out,
            "  removed the {} files the run added, re-added the {} it replaced | {:.1}s",
            report.partitions.iter().map(|p| p.old_files).sum::<u64>(),
            report.partitions.iter().map(|p| p.new_files).sum::<u64>(),
            t.total_ms as f64 / 1000.0
        );
        return;
    }
    let carried = if report.rows_carried > 0 {
        format!(
            " ({} of their {} rows carried over unchanged)",
            report.rows_carried, report.rows_written
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  staged {} files, {}{carried} | stage {:.1}s, validate {:.1}s, commit {:.1}s",
        report.files_written,
        bytes(report.bytes_written),
        t.stage_ms as f64 / 1000.0,
        t.validate_ms as f64 / 1000.0,
        t.publish_ms as f64 / 1000.0
    );
}

/// One line per sink: what it was told now, and what failed (retried by later commands).
pub(crate) fn notifications(deliveries: &[lakefill::Delivery]) -> String {
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
pub(crate) fn validation(validation: &lakefill::ValidationReport) -> String {
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
    out.push_str(&comparison(&validation.comparison));
    for note in &validation.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

/// Renders the key-level part of a comparison: counts and samples.
pub(crate) fn comparison(comparison: &lakefill::Comparison) -> String {
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

/// What `notify` delivered, or that every sink of `table` is up to date.
pub(crate) fn notifications_of(table: &str, deliveries: &[lakefill::Delivery]) -> String {
    if deliveries
        .iter()
        .all(|d| d.delivered.is_empty() && d.failed.is_empty() && d.skipped.is_empty())
    {
        return format!("{table}: every sink is up to date\n");
    }
    notifications(deliveries)
}

/// The status lines a logical revert of `run_id` starts with: what it recomputes, and the notes
/// on its range.
pub(crate) fn revert_plan(run_id: &str, report: &lakefill::PlanReport) -> Vec<String> {
    let mut lines = vec![format!(
        "reverting {run_id} in {} ({} partitions in {} batches, read version {})",
        super::spaced(&report.range),
        report.partitions.len(),
        report.batches.len(),
        report.read_version
    )];
    if !report.already_published {
        lines.extend(
            report
                .range_notes
                .iter()
                .map(|note| format!("note: {note}")),
        );
    }
    lines
}

/// The status line a backfill starts with: what it recomputes, with which model, from which
/// version.
pub(crate) fn backfill_plan(report: &lakefill::PlanReport) -> String {
    format!(
        "backfilling {} {}{} with {}@{} ({} partitions in {} batches, read version {})",
        report.target,
        super::spaced(&report.range),
        report
            .rows
            .as_deref()
            .map(|p| format!(" where {p}"))
            .unwrap_or_default(),
        report.model,
        report.model_version,
        report.partitions.len(),
        report.batches.len(),
        report.read_version
    )
}
