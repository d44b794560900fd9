//! `lakefill runs` and `gc`: the runs of a project, and the staged files collected.

use std::fmt::Write as _;

use super::bytes;

/// The runs of a project, one per line, then each cascade with its nodes.
pub(crate) fn list(runs: &[lakefill::RunSummary]) -> String {
    let mut text = String::new();
    if runs.is_empty() {
        text.push_str("no runs\n");
    } else {
        let _ = writeln!(
            text,
            "{:<34} {:<14} {:<18} {:<18} {:<25} {:>5} {:>9}  created",
            "run", "table", "state", "model", "range", "read", "published"
        );
    }
    for run in runs {
        let _ = writeln!(
            text,
            "{:<34} {:<14} {:<18} {:<18} {:<25} {:>5} {:>9}  {}",
            run.run_id,
            run.table,
            run.state.to_string(),
            match &run.revert_of {
                Some(_) => format!("revert of {}@{}", run.model, run.model_version),
                None => format!("{}@{}", run.model, run.model_version),
            },
            match &run.rows {
                Some(predicate) => format!("{} where {predicate}", run.range.span()),
                None => run.range.span(),
            },
            run.read_version,
            run.published_version
                .map_or_else(|| "-".into(), |v| v.to_string()),
            run.created_at
        );
    }
    // Cascades, with their nodes.
    let mut cascades: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for run in runs {
        if let Some(cascade) = &run.cascade {
            cascades
                .entry(cascade)
                .or_default()
                .push(format!("{} ({})", run.run_id, run.state));
        }
    }
    for (cascade, nodes) in cascades {
        let _ = writeln!(text, "\n{cascade}: {}", nodes.join(", "));
    }
    text
}

/// What `gc` deleted (or would), and the runs it marked discarded.
pub(crate) fn gc(report: &lakefill::GcReport) -> String {
    let mut text = String::new();
    let verb = if report.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let _ = writeln!(
        text,
        "{} {verb} {} staged files ({}); kept {} that may still be published",
        report.table,
        report.files.len(),
        bytes(report.bytes),
        report.kept
    );
    for file in &report.files {
        let _ = writeln!(
            text,
            "  {}  ({}, {})",
            file.path,
            bytes(file.size),
            file.reason
        );
    }
    for run in &report.runs_discarded {
        let _ = writeln!(text, "  run {run} is now discarded");
    }
    text
}
