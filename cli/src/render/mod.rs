//! What each command shows people: one module per command (or group of commands), each turning
//! the engine's typed result into text. No module here decides anything about data; the JSON
//! documents are the results themselves, serialized by the printer.

pub(crate) mod cascade;
pub(crate) mod diff;
pub(crate) mod history;
pub(crate) mod plan;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod stale;

use serde_json::Value;

/// One-line JSON without quotes around simple keys, for samples and failures.
pub(crate) fn compact(value: &Value) -> String {
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

pub(crate) fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        format!("{}", n as i64)
    } else {
        format!("{n:.4}")
    }
}

pub(crate) fn signed_f(n: f64) -> String {
    if n > 0.0 {
        format!("+{}", number(n))
    } else {
        number(n)
    }
}

pub(crate) fn rows(rows: Option<u64>) -> String {
    rows.map_or_else(|| "?".into(), |r| r.to_string())
}

pub(crate) fn signed(n: i64) -> String {
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

/// Lays out rows in columns as wide as their widest cell, without borders (the first column
/// right-aligned), one line per row.
pub(crate) fn columns(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
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

pub(crate) fn summarize(partitions: &[String]) -> String {
    match partitions {
        [] => "-".into(),
        [one] => one.clone(),
        [first, .., last] => format!("{first}..{last} ({} partitions)", partitions.len()),
    }
}

/// A range as status lines write it: `2026-01-01 ..= 2026-01-31`, or `the whole table`.
pub(crate) fn spaced(range: &lakefill::PartitionRange) -> String {
    if range.grain == lakefill::Grain::Whole {
        return "the whole table".into();
    }
    format!("{} ..= {}", range.from, range.to)
}
