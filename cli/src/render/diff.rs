//! `lakefill diff`: two versions of a table compared.

use std::fmt::Write as _;

/// Renders a diff report for people.
pub(crate) fn text(report: &lakefill::DiffReport) -> anyhow::Result<String> {
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
    if let Some(rows) = &report.rows {
        let _ = writeln!(
            text,
            "  where {rows}: only the rows that match are compared"
        );
    }
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
    text.push_str(&super::run::comparison(&report.comparison));
    Ok(text)
}
