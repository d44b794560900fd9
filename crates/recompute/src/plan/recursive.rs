//! Models that read their own target's past (#32): a running total reads the day before from the
//! table it writes. Each partition then depends on the one before it as this run computes it, not
//! as the table held it: the run stages the range one partition at a time, in order, each reading
//! the rows staged before it (see [`crate::stage`]), and a change reaches every later partition, so
//! the range must run through the table's last one.
//!
//! A model that reads its own future (a lookahead on its target) cannot be ordered so, and is
//! refused by name.

use super::{LogFile, SourcePlan};
use lakefill_table::error::{Error, Result};
use lakefill_table::model::Model;
use lakefill_table::partition::{Layout, PartitionRange};
use lakefill_table::time::Period;

/// Whether the model reads its own target's past. Refuses what lakefill cannot order: a model
/// reading its own future, a range that stops short of the table's last partition (naming the
/// range to run), and a table whose range selects rows (`range_column`). Adds a note saying how
/// the run is staged.
pub(crate) fn reads_own_past(
    model: &Model,
    sources: &[SourcePlan],
    layout: &Layout,
    range: &PartitionRange,
    files: &[LogFile],
    notes: &mut Vec<String>,
) -> Result<bool> {
    let Some(own) = sources
        .iter()
        .find(|s| s.reads_target && s.window.is_some())
    else {
        return Ok(false);
    };
    let field = |name: &str, value: u32| format!("`[sources.{}] {name} = {value}`", own.table);
    if own.lookahead > 0 {
        return Err(Error::Model {
            path: model.path().to_path_buf(),
            message: format!(
                "the model reads its own future ({}): each partition would read later ones that the run has not computed yet",
                field("lookahead", own.lookahead)
            ),
            hint: format!(
                "read what comes later from another table, or drop the lookahead on `{}`",
                own.table
            ),
        });
    }
    if own.lookback == 0 {
        // A fix in place: each partition reads only its own old rows.
        return Ok(false);
    }
    if layout.rewrites_files(range) {
        return Err(Error::Model {
            path: model.path().to_path_buf(),
            message: format!(
                "the model reads its own past ({}) in a table whose range selects rows (`range_column`, or `--where`), which lakefill cannot stage in order",
                field("lookback", own.lookback)
            ),
            hint: "partition the table by its time column, or read the past from another table"
                .into(),
        });
    }
    let last = files
        .iter()
        .filter_map(|f| layout.time.period_of(&f.values).ok().flatten())
        .max();
    if let (Some(last), Some(to)) = (last, range.last())
        && to < last
    {
        return Err(Error::RangeTooShort {
            model: model.name().to_string(),
            why: format!(
                "it reads its own past ({}), so a change reaches every later partition, through the table's last, {}",
                field("lookback", own.lookback),
                last.label()
            ),
            command: format!(
                "lakefill backfill {} --from {} --to {}",
                model.name(),
                range.from,
                last.label()
            ),
        });
    }
    notes.push(format!(
        "the model reads its own past ({}): partitions are staged one at a time, in order, each reading the rows staged before it; a change reaches every later partition, so the range runs through the table's last{}",
        field("lookback", own.lookback),
        last.map_or(String::new(), |p: Period| format!(" ({})", p.label()))
    ));
    Ok(true)
}
