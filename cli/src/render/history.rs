//! `lakefill history`: a table's versions, runs, models and reasons.

use super::{columns, summarize};

/// Renders a table's history for people.
pub(crate) fn text(entries: &[lakefill::HistoryEntry]) -> String {
    let rows = entries.iter().map(|e| {
        let scope = e
            .rows
            .as_deref()
            .map(|p| format!(" where {p}"))
            .unwrap_or_default();
        let partitions = match &e.range {
            // A table with no time column: its one period.
            Some((from, to)) if from == lakefill::WHOLE_LABEL && to == from => {
                format!("whole table{scope} ({} partitions)", e.partitions.len())
            }
            Some((from, to)) => {
                format!("{from}..={to}{scope} ({} partitions)", e.partitions.len())
            }
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
