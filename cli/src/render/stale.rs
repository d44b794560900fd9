//! `lakefill stale`: the partitions to refresh, why, and how.

use std::fmt::Write as _;

/// Renders the stale ranges of each table for people.
pub(crate) fn text(reports: &[lakefill::StaleReport]) -> String {
    let mut out = String::new();
    for report in reports {
        let verdict = if report.needs_refresh() {
            "needs refreshing"
        } else {
            "up to date with its sources"
        };
        let _ = writeln!(
            out,
            "{} (version {}, {} partitions): {verdict}",
            report.table, report.version, report.partitions
        );
        for range in &report.stale {
            let _ = writeln!(
                out,
                "  stale    {} ..= {} ({} partitions): a source changed where they read it",
                range.span.from, range.span.to, range.span.partitions
            );
            for change in &range.changes {
                let _ = writeln!(
                    out,
                    "           {} version {}{}{}: {} files, +{} / -{} rows",
                    change.table,
                    change.version,
                    change
                        .operation
                        .as_deref()
                        .map(|o| format!(" {o}"))
                        .unwrap_or_default(),
                    change
                        .timestamp
                        .as_deref()
                        .map(|t| format!(" at {t}"))
                        .unwrap_or_default(),
                    change.files,
                    change.rows_added,
                    change.rows_removed
                );
            }
            let _ = writeln!(out, "           refresh: {}", range.command);
        }
        for range in &report.outdated {
            let _ = writeln!(
                out,
                "  outdated {} ..= {} ({} partitions): written by {}, the newest is {}\n           refresh: {}",
                range.span.from,
                range.span.to,
                range.span.partitions,
                range.model_version,
                range.newest_version,
                range.command
            );
        }
        for span in &report.unknown {
            let _ = writeln!(
                out,
                "  unknown  {} ..= {} ({} partitions): written by another writer (or its run's journal is gone)",
                span.from, span.to, span.partitions
            );
        }
    }
    out
}
