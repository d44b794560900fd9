//! A cascade: its plan (`plan --cascade`), and what running, publishing, discarding or reverting
//! it did.

use std::fmt::Write as _;

use super::bytes;

/// ` where <predicate>` when the range is scoped by one.
fn scoped(range: &lakefill::PartitionRange) -> String {
    range
        .rows
        .as_ref()
        .map(|p| format!(" where {}", p.sql))
        .unwrap_or_default()
}

/// Renders a cascade plan: each node with its range and why, each edge, the total work.
pub(crate) fn plan(cascade: &lakefill::CascadeReport) -> String {
    let mut out = String::new();
    let root = cascade.nodes.first();
    let _ = writeln!(
        out,
        "cascade {} from {}: {} models, {} partitions in {} batches, {}",
        cascade.cascade_id,
        root.map_or_else(String::new, |r| format!(
            "{}@{} over {} ..= {}{}",
            r.model,
            r.version,
            r.range.from,
            r.range.to,
            scoped(&r.range)
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
            "\n  {}. {}@{} -> {}  {} ..= {}{}  ({} partitions, {} batches, {}; read version {})",
            i + 1,
            node.model,
            node.version,
            node.target,
            node.range.from,
            node.range.to,
            scoped(&node.range),
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
            let scope = match edge.where_passed {
                Some(true) => "; `--where` passes",
                Some(false) => "; `--where` does not pass: every row of the range",
                None => "",
            };
            let _ = writeln!(
                out,
                "  {} -> {} (reads {}; {window}): {reach}{scope}",
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

/// What running, publishing, discarding or reverting a cascade did: its outcome, then each
/// node's run.
pub(crate) fn outcome(run: &lakefill::CascadeRunReport) -> String {
    let mut text = format!("cascade {}: {}\n", run.cascade_id, run.outcome);
    for node in &run.nodes {
        text.push('\n');
        text.push_str(&super::run::text(node));
    }
    text
}

/// The status line a cascade starts with.
pub(crate) fn started(report: &lakefill::CascadeReport) -> String {
    format!(
        "cascade {}: {} models, {} partitions in {} batches",
        report.cascade_id,
        report.nodes.len(),
        report.total_partitions,
        report.total_batches
    )
}
