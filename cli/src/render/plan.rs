//! `lakefill plan`: the scope of a backfill.

use std::fmt::Write as _;

use lakefill::PlanReport;

use super::{bytes, rows};

/// Renders a plan for people: its header, scope, sources, protocol, partitions and batches.
pub(crate) fn text(plan: &PlanReport) -> String {
    let mut out = String::new();
    header(plan, &mut out);
    scope(plan, &mut out);
    sources(plan, &mut out);
    protocol(plan, &mut out);
    partitions(plan, &mut out);
    batches(plan, &mut out);
    out
}

/// The run, its model file and the target as the plan found it.
fn header(plan: &PlanReport, out: &mut String) {
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
    if layout.is_timeless() {
        let _ = writeln!(
            out,
            "  target        {} at version {} ({}), {}, with no time column",
            plan.target,
            plan.read_version,
            target_location(plan),
            partitioning(layout),
        );
    } else if layout.by_rows {
        let _ = writeln!(
            out,
            "  target        {} at version {} ({}), {}; the range replaces rows by {}",
            plan.target,
            plan.read_version,
            target_location(plan),
            partitioning(layout),
            layout.time.encoding.describe()
        );
    } else {
        let _ = writeln!(
            out,
            "  target        {} at version {} ({}), partitioned by {}{}",
            plan.target,
            plan.read_version,
            target_location(plan),
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
    if let Some(threshold) = plan.by_vectors {
        let _ = writeln!(
            out,
            "  publish       by deletion vectors (the table takes them): in a partition the fix changes {}% or less of, old rows are deleted in place and only new ones written; above, rewritten",
            (threshold * 100.0).round()
        );
    }
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
}

/// `partitioned by a, b`, or `not partitioned`.
fn partitioning(layout: &lakefill::Layout) -> String {
    if layout.partition_columns.is_empty() {
        "not partitioned".to_string()
    } else {
        format!("partitioned by {}", layout.partition_columns.join(", "))
    }
}

/// What the run replaces, with what memory, and the notes on its range and edges.
fn scope(plan: &PlanReport, out: &mut String) {
    let _ = writeln!(
        out,
        "  range         {} ({} partitions, {} batches of up to {}; at most {} without `--max-partitions`)",
        super::spaced(&plan.range),
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
    if let Some(predicate) = &plan.rows {
        let _ = writeln!(
            out,
            "  where         {predicate}: the range's rows that match are replaced by the model's rows that match; the other rows of the {} files rewritten are carried over unchanged, and {} more files of the range that cannot match are not touched",
            plan.affected_files.len(),
            plan.files_ruled_out.unwrap_or(0)
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
}

/// Each source and the version it is pinned at.
fn sources(plan: &PlanReport, out: &mut String) {
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
        let mut note = if source.reads_target {
            "  (the target, at the read version)".to_string()
        } else {
            String::new()
        };
        match source.where_reached {
            Some(true) => note.push_str("  `--where` reaches its scan"),
            Some(false) => note.push_str(
                "  `--where` does not reach it: the model reads its whole window, and its output is filtered",
            ),
            None => {}
        }
        let _ = writeln!(
            out,
            "  {:<16} version {:<6} {window}{note}",
            source.table, source.version
        );
    }
}

/// The target's protocol and how the run honours it, and the storage options in effect.
fn protocol(plan: &PlanReport, out: &mut String) {
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
}

/// The partitions (or, by rows, the files) the range holds now, from the Delta log.
fn partitions(plan: &PlanReport, out: &mut String) {
    let layout = &plan.layout;
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
}

/// The batches, and the models downstream.
fn batches(plan: &PlanReport, out: &mut String) {
    let _ = writeln!(out, "\nbatches");
    for batch in &plan.batches {
        let what = if batch.carry && plan.by_vectors.is_some() {
            "stages nothing: the files' other rows stay where they are, cut by deletion vectors"
                .to_string()
        } else if batch.carry {
            "the other rows of the files rewritten, carried over".to_string()
        } else if batch.null {
            "the rows whose time is NULL".to_string()
        } else {
            format!("{} partitions", batch.partitions.len())
        };
        let _ = writeln!(
            out,
            "  #{:<3} {} ..= {}  ({what})",
            batch.index, batch.start, batch.end,
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
}

/// The target's location as configured, and for a catalog name where it resolved to.
fn target_location(plan: &PlanReport) -> String {
    match &plan.resolved_location {
        Some(location) => format!("{} at {location}", plan.target_uri),
        None => plan.target_uri.clone(),
    }
}
