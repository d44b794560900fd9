//! Which partitions around the range a backfill checks for keys that cross its edges (#32; the
//! check itself is [`lakefill_validate::edges`]).
//!
//! A model reads each source over the batch's window widened by the source's lookback and
//! lookahead, so a row can land up to that many partitions away from the range. The check looks
//! that far before (lookback) and after (lookahead) the range, at least one partition and at
//! most [`MAX_EDGE_WIDTH`] on each side, in partitions of the target's grain.

use serde::Serialize;

use super::SourcePlan;
use lakefill_table::error::Result;
use lakefill_table::partition::{Layout, PartitionRange};
use lakefill_table::time::{Grain, Period};

/// The most partitions checked on each side of the range.
pub(crate) const MAX_EDGE_WIDTH: u32 = 31;

/// The partitions around a backfill's range whose keys it checks.
#[derive(Debug, Clone, Serialize)]
pub struct EdgePlan {
    /// Partitions checked before the range (as far as the sources' lookback reaches, at least 1).
    pub width_before: u32,
    /// Partitions checked after the range (as far as the sources' lookahead reaches, at least 1).
    pub width_after: u32,
    /// The partitions checked before the range, first and last (`null` before the calendar).
    pub before: Option<(String, String)>,
    /// The partitions checked after the range, first and last.
    pub after: Option<(String, String)>,
    /// Why that many: the source windows that reach beyond the range.
    pub why: String,
    /// The reason to publish even when keys cross (`--allow-edge-moves`), if given.
    pub allowed: Option<String>,
}

/// The edge check of a run with row identity `key` over `range`, or `None` when no key can cross
/// an edge (no key, or a key holding the time). Adds a note for each source whose window reads
/// partitions outside the range, which the run does not replace.
pub(crate) fn plan(
    key: &[String],
    layout: &Layout,
    range: &PartitionRange,
    sources: &[SourcePlan],
    allowed: Option<String>,
    notes: &mut Vec<String>,
) -> Result<Option<EdgePlan>> {
    if allowed.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err(lakefill_table::error::Error::InvalidOption {
            option: "--allow-edge-moves".into(),
            value: String::new(),
            message: "`--reason` must not be empty: say why keys may cross the range's edges; the commit records it".into(),
        });
    }
    let grain = range.grain;
    let (Some(first), Some(last)) = (range.first(), range.last()) else {
        return Ok(None);
    };
    if layout.is_timeless() {
        // The whole table has no edges in time (the predicate's are checked by `where_edges`).
        return Ok(None);
    }
    let time_columns = layout.time.encoding.columns();
    let keyed = !key.is_empty() && !time_columns.iter().all(|c| key.iter().any(|k| k == c));
    // How far each source is read before and after a batch, in partitions of the target.
    let reach = sources
        .iter()
        .filter_map(|s| {
            let window = s.window_time.as_ref()?;
            let before = in_grain(s.lookback, window.grain, grain);
            let after = in_grain(s.lookahead, window.grain, grain);
            Some((s, (before, after)))
        })
        .collect::<Vec<_>>();
    let zone = |from: Option<Period>, to: Option<Period>| {
        from.zip(to).map(|(f, t)| (f.label(), t.label()))
    };
    let time_keyed = !key.is_empty() && !keyed;
    for (source, _) in reach
        .iter()
        .filter(|(s, _)| s.lookback + s.lookahead > 0 && !time_keyed)
    {
        let sides = [
            (source.lookback, "before", "lookback"),
            (source.lookahead, "past", "lookahead"),
        ]
        .into_iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(n, side, field)| format!("{} {side} the range ({field})", partitions(n)))
        .collect::<Vec<_>>()
        .join(" and ");
        let consequence = if keyed {
            "a row may land on the other side of the range's edge from where it was: the backfill fails if a key would be lost or written twice there"
        } else {
            "a row may land on the other side of the range's edge from where it was, and without `[validate] key` the backfill cannot check that none is lost or written twice; set the key"
        };
        notes.push(format!(
            "`{}` is read {sides}, which this run does not replace: {consequence}",
            source.table
        ));
    }
    if !keyed {
        return Ok(None);
    }
    // The sources' windows around the range, at least the partition next to each edge.
    let widest = |side: fn(&(u32, u32)) -> u32| {
        reach
            .iter()
            .map(|(_, r)| side(r))
            .max()
            .unwrap_or(0)
            .clamp(1, MAX_EDGE_WIDTH)
    };
    let (width_before, width_after) = (widest(|r| r.0), widest(|r| r.1));
    let capped = reach
        .iter()
        .any(|(_, (b, a))| *b > MAX_EDGE_WIDTH || *a > MAX_EDGE_WIDTH);
    let why = match reach.iter().find(|(s, _)| s.lookback + s.lookahead > 0) {
        Some(_) => format!(
            "the sources' windows: {} before, {} after{}",
            partitions(width_before),
            partitions(width_after),
            if capped {
                format!(" (checked up to {MAX_EDGE_WIDTH})")
            } else {
                String::new()
            }
        ),
        None => "the partition next to each edge".to_string(),
    };
    Ok(Some(EdgePlan {
        width_before,
        width_after,
        before: zone(first.offset(-i64::from(width_before)), first.offset(-1)),
        after: zone(last.offset(1), last.offset(i64::from(width_after))),
        why,
        allowed,
    }))
}

/// `n partitions`, or `1 partition`.
fn partitions(n: u32) -> String {
    if n == 1 {
        "1 partition".into()
    } else {
        format!("{n} partitions")
    }
}

/// `count` periods of `grain` in periods of `target` (rounded up).
fn in_grain(count: u32, grain: Grain, target: Grain) -> u32 {
    let hours = |g: Grain| -> u64 {
        match g {
            Grain::Hour => 1,
            Grain::Day => 24,
            Grain::Month => 24 * 31,
            Grain::Year => 24 * 366,
            // No source window reaches past the whole table.
            Grain::Whole => u64::MAX / 2,
        }
    };
    let total = u64::from(count) * hours(grain);
    u32::try_from(total.div_ceil(hours(target))).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_in_the_target_grain() {
        assert_eq!(in_grain(1, Grain::Day, Grain::Day), 1);
        assert_eq!(in_grain(6, Grain::Hour, Grain::Day), 1);
        assert_eq!(in_grain(1, Grain::Month, Grain::Day), 31);
        assert_eq!(in_grain(2, Grain::Day, Grain::Hour), 48);
        assert_eq!(in_grain(0, Grain::Day, Grain::Month), 0);
    }
}
