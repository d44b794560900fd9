//! Inline SVG charts of the HTML report: no script, no external reference; each mark carries a
//! `<title>` so hovering shows its numbers.

use std::fmt::Write as _;

use super::ReportPartition;

const WIDTH: f64 = 760.0;
/// Above this many partitions, the rows chart is a calendar of the change instead of bars.
const MAX_BARS: usize = 62;

/// Old versus new rows per partition: bars, or a calendar of the relative change.
pub(super) fn rows(partitions: &[ReportPartition]) -> String {
    if partitions.is_empty() {
        return String::new();
    }
    if partitions.len() > MAX_BARS {
        return calendar(partitions);
    }
    let height = 200.0;
    let top = partitions
        .iter()
        .map(|p| p.new_rows.max(p.old_rows.unwrap_or(0)))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let slot = WIDTH / partitions.len() as f64;
    let bar = (slot * 0.4).max(1.0);
    let mut svg = open(WIDTH, height + 30.0, "rows per partition, old and new");
    for (i, p) in partitions.iter().enumerate() {
        let x = i as f64 * slot + slot * 0.1;
        let old = p.old_rows.unwrap_or(0) as f64;
        let new = p.new_rows as f64;
        let (h_old, h_new) = (height * old / top, height * new / top);
        let _ = write!(
            svg,
            r##"<rect class="old" x="{x:.1}" y="{:.1}" width="{bar:.1}" height="{h_old:.1}"><title>{}: {} rows before</title></rect>"##,
            height - h_old,
            escape(&p.partition),
            p.old_rows.map_or_else(|| "?".into(), |r| r.to_string())
        );
        let _ = write!(
            svg,
            r##"<rect class="new" x="{:.1}" y="{:.1}" width="{bar:.1}" height="{h_new:.1}"><title>{}: {} rows after</title></rect>"##,
            x + bar,
            height - h_new,
            escape(&p.partition),
            p.new_rows
        );
    }
    axis_labels(&mut svg, partitions, height);
    svg.push_str("</svg>");
    svg
}

/// The change of `measure` per partition: bars up or down from zero.
pub(super) fn measure(partitions: &[ReportPartition], measure: &str) -> String {
    let deltas: Vec<(String, f64)> = partitions
        .iter()
        .map(|p| {
            let delta = p
                .measures
                .iter()
                .find(|m| m.name == measure)
                .map_or(0.0, |m| m.delta);
            (p.partition.clone(), delta)
        })
        .collect();
    if deltas.is_empty() {
        return String::new();
    }
    let height = 120.0;
    let mid = height / 2.0;
    let top = deltas
        .iter()
        .map(|(_, d)| d.abs())
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let slot = WIDTH / deltas.len() as f64;
    let bar = (slot * 0.8).max(1.0);
    let mut svg = open(
        WIDTH,
        height + 30.0,
        &format!("change of {measure} per partition"),
    );
    let _ = write!(
        svg,
        r##"<line class="zero" x1="0" y1="{mid}" x2="{WIDTH}" y2="{mid}"/>"##
    );
    for (i, (partition, delta)) in deltas.iter().enumerate() {
        let h = mid * delta.abs() / top;
        let y = if *delta >= 0.0 { mid - h } else { mid };
        let class = if *delta >= 0.0 { "up" } else { "down" };
        let _ = write!(
            svg,
            r##"<rect class="{class}" x="{:.1}" y="{y:.1}" width="{bar:.1}" height="{h:.1}"><title>{}: {delta:+}</title></rect>"##,
            i as f64 * slot + slot * 0.1,
            escape(partition),
        );
    }
    axis_labels(&mut svg, partitions, height);
    svg.push_str("</svg>");
    svg
}

/// A calendar of the relative row change: a week a column for daily partitions, else rows of
/// 53 cells; red for fewer rows, blue for more, grey for none.
fn calendar(partitions: &[ReportPartition]) -> String {
    let cell = 13.0;
    let days: Vec<Option<chrono::NaiveDate>> = partitions
        .iter()
        .map(|p| chrono::NaiveDate::parse_from_str(&p.partition, "%Y-%m-%d").ok())
        .collect();
    let daily = days.iter().all(Option::is_some);
    let positions: Vec<(f64, f64)> = if daily {
        use chrono::Datelike as _;
        let first = days[0].unwrap_or_default();
        let start = first - chrono::Days::new(u64::from(first.weekday().num_days_from_monday()));
        days.iter()
            .map(|d| {
                let d = d.unwrap_or_default();
                let week = (d - start).num_days() / 7;
                (week as f64, f64::from(d.weekday().num_days_from_monday()))
            })
            .collect()
    } else {
        (0..partitions.len())
            .map(|i| ((i % 53) as f64, (i / 53) as f64))
            .collect()
    };
    let columns = positions.iter().map(|p| p.0).fold(0.0_f64, f64::max) + 1.0;
    let rows = positions.iter().map(|p| p.1).fold(0.0_f64, f64::max) + 1.0;
    let top = partitions
        .iter()
        .filter_map(|p| p.row_change_pct)
        .map(f64::abs)
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut svg = open(
        columns * cell + 2.0,
        rows * cell + 2.0,
        "relative row change per partition",
    );
    for (p, (column, row)) in partitions.iter().zip(positions) {
        let pct = p.row_change_pct.unwrap_or(0.0);
        let strength = (pct.abs() / top).clamp(0.0, 1.0);
        let fill = if pct == 0.0 {
            "#e5e5e5".to_string()
        } else if pct < 0.0 {
            blend((215, 48, 39), strength)
        } else {
            blend((69, 117, 180), strength)
        };
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}"><title>{}: {} to {} rows ({pct:+.2}%)</title></rect>"##,
            column * cell + 1.0,
            row * cell + 1.0,
            cell - 2.0,
            cell - 2.0,
            escape(&p.partition),
            p.old_rows.map_or_else(|| "?".into(), |r| r.to_string()),
            p.new_rows
        );
    }
    svg.push_str("</svg>");
    svg
}

/// `color` at `strength` over white.
fn blend((r, g, b): (u8, u8, u8), strength: f64) -> String {
    let mix = |c: u8| (255.0 - (255.0 - f64::from(c)) * (0.25 + 0.75 * strength)).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(r), mix(g), mix(b))
}

fn open(width: f64, height: f64, label: &str) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{}" viewBox="0 0 {width:.0} {height:.0}" width="100%">"##,
        escape(label)
    )
}

/// The first and last partition under the chart.
fn axis_labels(svg: &mut String, partitions: &[ReportPartition], height: f64) {
    let (Some(first), Some(last)) = (partitions.first(), partitions.last()) else {
        return;
    };
    let _ = write!(
        svg,
        r##"<text x="0" y="{:.0}">{}</text><text x="{WIDTH}" y="{:.0}" text-anchor="end">{}</text>"##,
        height + 20.0,
        escape(&first.partition),
        height + 20.0,
        escape(&last.partition)
    );
}

/// Text for SVG markup.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
