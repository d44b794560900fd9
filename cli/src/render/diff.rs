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

/// Renders the change data feed of a version for people.
pub(crate) fn feed_text(report: &lakefill::FeedReport) -> String {
    let counts = |c: &lakefill::FeedCounts| {
        format!(
            "{:>9} {:>9} {:>9} {:>9}",
            c.insert, c.delete, c.update_preimage, c.update_postimage
        )
    };
    let mut text = String::new();
    let source = if report.recorded {
        "its change data files"
    } else {
        "no change data files: its adds and removes, as inserts and deletes"
    };
    let _ = writeln!(
        text,
        "change feed of {} version {} ({source}): {} rows",
        report.table,
        report.version,
        report.counts.rows()
    );
    let _ = writeln!(
        text,
        "  {:<30} {:>9} {:>9} {:>9} {:>9}",
        "partition", "insert", "delete", "pre", "post"
    );
    for partition in &report.partitions {
        let name = if partition.partition.is_empty() {
            "(table)"
        } else {
            partition.partition.as_str()
        };
        let _ = writeln!(text, "  {name:<30} {}", counts(&partition.counts));
    }
    let _ = writeln!(text, "  {:<30} {}", "total", counts(&report.counts));
    if !report.rows.is_empty() {
        let _ = writeln!(text, "  sample:");
        for row in &report.rows {
            let _ = writeln!(text, "    {}", super::compact(row));
        }
    }
    text
}
