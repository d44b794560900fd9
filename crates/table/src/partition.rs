//! How a table keeps time in its partition columns, and the ranges a backfill replaces.
//!
//! A target's [`Layout`] names its partition columns (in the table's order) and the one
//! [`TimeColumn`] among them: a `DATE` column (day, month or year partitions), a `TIMESTAMP`
//! (hours), a string holding dates in some format (`2026-01-05`, `20260105`, `2026-01-05-13`),
//! or integer parts (`year`, `month`, `day`, `hour`). Its grain is declared in the model header
//! or inferred from the values in the Delta log, and the plan says which and why; it is never
//! silently assumed. Every other partition column (a `country`) is replaced whole under each
//! period of the range. Sources are windowed through the same [`TimeColumn`] type.
//!
//! Values travel as the strings the Delta log holds; a value becomes a [`Period`] only through
//! the layout, so ranges are compared as times, never as text. Hive paths are built the way
//! delta-rs builds them, so every value is encoded exactly once. Reading and writing rows is
//! left to the runner (`lakefill::stage`).

use std::collections::{BTreeMap, HashMap};

use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use deltalake::arrow::datatypes::{DataType, Schema, TimeUnit};
use deltalake::datafusion::common::{Column, ScalarValue};
use deltalake::datafusion::logical_expr::{Expr, lit};
use deltalake::kernel::scalars::ScalarExt as _;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::time::{CARRIED_LABEL, NULL_LABEL};
use crate::time::{Grain, Period, parse_instant};

/// How one column (or the integer parts of a date) holds time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TimeEncoding {
    /// A `DATE` column.
    Date {
        /// The column.
        column: String,
    },
    /// A `TIMESTAMP` or `TIMESTAMP_NTZ` column.
    Timestamp {
        /// The column.
        column: String,
        /// Its time zone (`None` for `TIMESTAMP_NTZ`).
        timezone: Option<String>,
    },
    /// A string column holding times in `format` (chrono syntax, e.g. `%Y%m%d`).
    Text {
        /// The column.
        column: String,
        /// The format of its values.
        format: String,
    },
    /// Integer columns holding the parts of a time.
    Parts {
        /// The year column.
        year: String,
        /// The month column, if any.
        month: Option<String>,
        /// The day-of-month column, if any.
        day: Option<String>,
        /// The hour column, if any.
        hour: Option<String>,
    },
    /// No column holds time: the whole table is one period ([`Grain::Whole`]), and a run is
    /// scoped by `--where` alone.
    None,
}

impl TimeEncoding {
    /// The columns that hold the time.
    pub fn columns(&self) -> Vec<&str> {
        match self {
            TimeEncoding::Date { column }
            | TimeEncoding::Timestamp { column, .. }
            | TimeEncoding::Text { column, .. } => vec![column.as_str()],
            TimeEncoding::Parts {
                year,
                month,
                day,
                hour,
            } => [Some(year), month.as_ref(), day.as_ref(), hour.as_ref()]
                .into_iter()
                .flatten()
                .map(String::as_str)
                .collect(),
            TimeEncoding::None => Vec::new(),
        }
    }

    /// How plans describe it, e.g. `event_date (date)` or `ds (string, %Y%m%d)`.
    pub fn describe(&self) -> String {
        match self {
            TimeEncoding::Date { column } => format!("{column} (date)"),
            TimeEncoding::Timestamp { column, .. } => format!("{column} (timestamp)"),
            TimeEncoding::Text { column, format } => format!("{column} (string, {format})"),
            TimeEncoding::Parts { .. } => format!("{} (integer parts)", self.columns().join(", ")),
            TimeEncoding::None => "no time column".to_string(),
        }
    }
}

/// A time column and the grain of the periods it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeColumn {
    /// How the time is stored.
    pub encoding: TimeEncoding,
    /// The grain of its values.
    pub grain: Grain,
    /// Why this grain: declared, or what the values showed.
    pub grain_reason: String,
}

/// The values of one file's (or one row's) partition columns, as the Delta log writes them.
pub type PartitionValues = HashMap<String, Option<String>>;

impl TimeColumn {
    /// Whether a file may hold rows whose time lies in `range` (or is NULL, when the range takes
    /// the NULL partition), by its statistics (the `add` action's JSON, keyed by logical
    /// names); without statistics it may.
    pub fn file_may_hold(&self, range: &PartitionRange, stats: Option<&str>) -> bool {
        let (Some(first), Some(last)) = (range.first(), range.last()) else {
            return true;
        };
        match self.file_span(stats, range.include_null) {
            Some((min, max)) => min < last.end() && max > first.start(),
            None => true,
        }
    }

    /// The times a file's rows may hold by its statistics (`stats`, the log's JSON): from its
    /// minimum to just past its maximum (statistics of timestamps are cut to milliseconds: the
    /// true maximum may be a little later). `None` when they do not say, or, with `null`, when
    /// the file may hold a NULL time.
    pub fn file_span(
        &self,
        stats: Option<&str>,
        null: bool,
    ) -> Option<(NaiveDateTime, NaiveDateTime)> {
        let stats = stats.and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())?;
        // No time: every file is of the whole table.
        let column = self.encoding.columns().first().copied()?;
        let instant = |value: &serde_json::Value| self.instant_of(value.as_str()?);
        if null && stats["nullCount"][column].as_u64() != Some(0) {
            return None;
        }
        let min = instant(&stats["minValues"][column])?;
        let max = instant(&stats["maxValues"][column])?;
        Some((min, max + chrono::TimeDelta::milliseconds(1)))
    }

    /// The instant a value of the column names, as its statistics or partition values write it
    /// (in its format, for a string column).
    pub fn instant_of(&self, text: &str) -> Option<NaiveDateTime> {
        match &self.encoding {
            TimeEncoding::Text { format, .. } => parse_with_format(text, format),
            _ => parse_instant(text).map(|(t, _)| t),
        }
    }

    /// The period a file's partition values fall in: `Ok(None)` for NULL, `Err` (with the value)
    /// for a value that is not a time of this grain.
    pub fn period_of(
        &self,
        values: &PartitionValues,
    ) -> std::result::Result<Option<Period>, String> {
        let get = |column: &str| -> std::result::Result<Option<&str>, String> {
            match values.get(column) {
                Some(value) => Ok(value.as_deref()),
                None => Err(format!("no value for `{column}`")),
            }
        };
        match &self.encoding {
            TimeEncoding::Date { column } => {
                let Some(text) = get(column)? else {
                    return Ok(None);
                };
                let date = NaiveDate::parse_from_str(text, "%Y-%m-%d")
                    .map_err(|_| format!("`{column}` = `{text}` is not a date"))?;
                self.exact(
                    Period::of_date(self.grain, date),
                    date.and_time(NaiveTime::MIN),
                    column,
                    text,
                )
            }
            TimeEncoding::Timestamp { column, .. } => {
                let Some(text) = get(column)? else {
                    return Ok(None);
                };
                let (instant, _) = parse_instant(text)
                    .ok_or_else(|| format!("`{column}` = `{text}` is not a timestamp"))?;
                self.exact(
                    Period::containing(self.grain, instant),
                    instant,
                    column,
                    text,
                )
            }
            TimeEncoding::Text { column, format } => {
                let Some(text) = get(column)? else {
                    return Ok(None);
                };
                let instant = parse_with_format(text, format).ok_or_else(|| {
                    format!("`{column}` = `{text}` does not hold a time in the format `{format}`")
                })?;
                let period = Period::containing(self.grain, instant)
                    .ok_or_else(|| format!("`{column}` = `{text}` is out of range"))?;
                if format_period(&period, format) != text {
                    return Err(format!(
                        "`{column}` = `{text}` is not how `{format}` writes the {} {period}",
                        self.grain
                    ));
                }
                Ok(Some(period))
            }
            TimeEncoding::Parts {
                year,
                month,
                day,
                hour,
            } => {
                let mut parts = Vec::new();
                for column in [Some(year), month.as_ref(), day.as_ref(), hour.as_ref()]
                    .into_iter()
                    .flatten()
                {
                    let Some(text) = get(column)? else {
                        return Ok(None);
                    };
                    let number: u32 = text
                        .trim()
                        .parse()
                        .map_err(|_| format!("`{column}` = `{text}` is not a whole number"))?;
                    parts.push(number);
                }
                let year_number = i32::try_from(parts[0]).unwrap_or(0);
                let month_number = if month.is_some() { parts[1] } else { 1 };
                let day_number = if day.is_some() { parts[2] } else { 1 };
                let hour_number = if hour.is_some() {
                    parts[parts.len() - 1]
                } else {
                    0
                };
                let instant = NaiveDate::from_ymd_opt(year_number, month_number, day_number)
                    .and_then(|d| d.and_hms_opt(hour_number, 0, 0))
                    .ok_or_else(|| {
                        format!(
                            "{} = {} is not a time",
                            self.encoding.columns().join("/"),
                            parts
                                .iter()
                                .map(u32::to_string)
                                .collect::<Vec<_>>()
                                .join("/")
                        )
                    })?;
                Ok(Period::containing(self.grain, instant))
            }
            TimeEncoding::None => Ok(Some(Period::whole())),
        }
    }

    /// The period a row's value falls in, wherever inside the period it lies (for a time column
    /// that is not a partition column).
    pub fn period_containing(
        &self,
        values: &PartitionValues,
    ) -> std::result::Result<Option<Period>, String> {
        let text = |column: &str| values.get(column).cloned().flatten();
        match &self.encoding {
            TimeEncoding::Date { column } | TimeEncoding::Timestamp { column, .. } => {
                let Some(text) = text(column) else {
                    return Ok(None);
                };
                let (instant, _) = parse_instant(&text)
                    .ok_or_else(|| format!("`{column}` = `{text}` is not a time"))?;
                Ok(Period::containing(self.grain, instant))
            }
            TimeEncoding::Text { column, format } => {
                let Some(text) = text(column) else {
                    return Ok(None);
                };
                let instant = parse_with_format(&text, format).ok_or_else(|| {
                    format!("`{column}` = `{text}` does not hold a time in the format `{format}`")
                })?;
                Ok(Period::containing(self.grain, instant))
            }
            TimeEncoding::Parts { .. } | TimeEncoding::None => self.period_of(values),
        }
    }

    /// A value that must be the first instant of its period (a partition value of this grain).
    fn exact(
        &self,
        period: Option<Period>,
        instant: NaiveDateTime,
        column: &str,
        text: &str,
    ) -> std::result::Result<Option<Period>, String> {
        let period = period.ok_or_else(|| format!("`{column}` = `{text}` is out of range"))?;
        if period.start() != instant {
            return Err(format!(
                "`{column}` = `{text}` is not the first instant of a {} (the {} {period} starts at {})",
                self.grain,
                self.grain,
                period.start()
            ));
        }
        Ok(Some(period))
    }

    /// Rows whose time lies in `from..=to` (both of this column's grain), as a filter that
    /// prunes partitions. `exact_values` says the column holds only period values (a partition
    /// column), so a list of values may be used; otherwise any time inside the periods matches.
    pub fn predicate(
        &self,
        from: Period,
        to: Period,
        exact_values: bool,
        column_type: &DataType,
    ) -> Result<Expr> {
        let column = |name: &str| Expr::Column(Column::new_unqualified(name));
        match &self.encoding {
            TimeEncoding::Date { column: name } => Ok(column(name).between(
                lit(date_scalar(from.first_day())),
                lit(date_scalar(to.last_day())),
            )),
            TimeEncoding::Timestamp {
                column: name,
                timezone,
            } => {
                let unit = match column_type {
                    DataType::Timestamp(unit, _) => *unit,
                    _ => TimeUnit::Microsecond,
                };
                let low = timestamp_scalar(from.start(), unit, timezone.clone())?;
                let high = timestamp_scalar(to.end(), unit, timezone.clone())?;
                Ok(column(name).gt_eq(lit(low)).and(column(name).lt(lit(high))))
            }
            TimeEncoding::Text {
                column: name,
                format,
            } => {
                let count = period_count(from, to);
                if exact_values && count <= MAX_LISTED_VALUES {
                    let values = periods(from, to)
                        .map(|p| lit(format_period(&p, format)))
                        .collect::<Vec<_>>();
                    return Ok(column(name).in_list(values, false));
                }
                if !is_sortable_format(format) {
                    return Err(Error::InvalidRange {
                        message: format!(
                            "`{name}` holds times as `{format}`, which does not sort like time, and the range has {count} values"
                        ),
                    });
                }
                let last = Period::containing(Grain::Hour, to.end() - chrono::TimeDelta::hours(1))
                    .map(|p| p.start())
                    .unwrap_or(to.start());
                Ok(column(name).between(
                    lit(from.start().format(format).to_string()),
                    lit(last.format(format).to_string()),
                ))
            }
            TimeEncoding::Parts { .. } => {
                let names = self.encoding.columns();
                let low = part_values(&self.encoding, from.start());
                let last = to.end() - chrono::TimeDelta::microseconds(1);
                let high = part_values(&self.encoding, last);
                let columns: Vec<Expr> = names.iter().map(|n| column(n)).collect();
                Ok(tuple_at_least(&columns, &low).and(tuple_at_most(&columns, &high)))
            }
            TimeEncoding::None => Ok(lit(true)),
        }
    }
}

/// Above this many values, a text window is a range comparison instead of a list.
const MAX_LISTED_VALUES: i64 = 10_000;

fn periods(from: Period, to: Period) -> impl Iterator<Item = Period> {
    std::iter::successors(Some(from), move |p| p.next().filter(|n| *n <= to))
}

/// How many periods `from..=to` holds (0 when reversed).
pub fn period_count(from: Period, to: Period) -> i64 {
    if to < from {
        return 0;
    }
    let (a, b) = (from.start(), to.start());
    match from.grain() {
        Grain::Hour => (b - a).num_hours() + 1,
        Grain::Day => (b - a).num_days() + 1,
        Grain::Month => {
            i64::from(b.year() - a.year()) * 12 + i64::from(b.month()) - i64::from(a.month()) + 1
        }
        Grain::Year => i64::from(b.year() - a.year()) + 1,
        Grain::Whole => 1,
    }
}

fn date_scalar(date: NaiveDate) -> ScalarValue {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("the epoch is a valid date");
    ScalarValue::Date32(Some(
        i32::try_from((date - epoch).num_days()).unwrap_or(i32::MAX),
    ))
}

fn timestamp_scalar(
    instant: NaiveDateTime,
    unit: TimeUnit,
    timezone: Option<String>,
) -> Result<ScalarValue> {
    let utc = instant.and_utc();
    let timezone = timezone.map(Into::into);
    let out_of_range = || Error::InvalidRange {
        message: format!("{instant} cannot be written as a timestamp"),
    };
    Ok(match unit {
        TimeUnit::Second => ScalarValue::TimestampSecond(Some(utc.timestamp()), timezone),
        TimeUnit::Millisecond => {
            ScalarValue::TimestampMillisecond(Some(utc.timestamp_millis()), timezone)
        }
        TimeUnit::Microsecond => {
            ScalarValue::TimestampMicrosecond(Some(utc.timestamp_micros()), timezone)
        }
        TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(
            Some(utc.timestamp_nanos_opt().ok_or_else(out_of_range)?),
            timezone,
        ),
    })
}

/// The year, month, day and hour of `instant`, as many as the encoding has.
fn part_values(encoding: &TimeEncoding, instant: NaiveDateTime) -> Vec<i64> {
    let TimeEncoding::Parts {
        month, day, hour, ..
    } = encoding
    else {
        return Vec::new();
    };
    let mut values = vec![i64::from(instant.year())];
    if month.is_some() {
        values.push(i64::from(instant.month()));
    }
    if day.is_some() {
        values.push(i64::from(instant.day()));
    }
    if hour.is_some() {
        values.push(i64::from(instant.hour()));
    }
    values
}

/// `(c1, c2, ...) >= (v1, v2, ...)` in lexicographic order, as plain column comparisons.
fn tuple_at_least(columns: &[Expr], values: &[i64]) -> Expr {
    match (columns, values) {
        ([column], [value]) => column.clone().gt_eq(lit(*value)),
        ([column, rest @ ..], [value, rest_values @ ..]) => {
            column.clone().gt(lit(*value)).or(column
                .clone()
                .eq(lit(*value))
                .and(tuple_at_least(rest, rest_values)))
        }
        _ => lit(true),
    }
}

/// `(c1, c2, ...) <= (v1, v2, ...)` in lexicographic order.
fn tuple_at_most(columns: &[Expr], values: &[i64]) -> Expr {
    match (columns, values) {
        ([column], [value]) => column.clone().lt_eq(lit(*value)),
        ([column, rest @ ..], [value, rest_values @ ..]) => {
            column.clone().lt(lit(*value)).or(column
                .clone()
                .eq(lit(*value))
                .and(tuple_at_most(rest, rest_values)))
        }
        _ => lit(true),
    }
}

/// Formats tried, in order, when a string column's format is not declared.
const KNOWN_FORMATS: [&str; 9] = [
    "%Y-%m-%d",
    "%Y%m%d",
    "%Y-%m-%d-%H",
    "%Y-%m-%dT%H",
    "%Y-%m-%d %H",
    "%Y%m%d%H",
    "%Y-%m",
    "%Y%m",
    "%Y",
];

/// The grain of the periods a format writes.
pub fn format_grain(format: &str) -> Option<Grain> {
    if format.contains("%M") || format.contains("%S") {
        return None;
    }
    Some(if format.contains("%H") {
        Grain::Hour
    } else if format.contains("%d") || format.contains("%e") || format.contains("%j") {
        Grain::Day
    } else if format.contains("%m") || format.contains("%b") || format.contains("%B") {
        Grain::Month
    } else if format.contains("%Y") {
        Grain::Year
    } else {
        return None;
    })
}

/// Whether values of `format` sort like the times they hold (year first, zero padded).
fn is_sortable_format(format: &str) -> bool {
    let order: Vec<usize> = ["%Y", "%m", "%d", "%H"]
        .iter()
        .filter_map(|f| format.find(f))
        .collect();
    format.starts_with("%Y") && order.windows(2).all(|w| w[0] < w[1])
}

/// Parses `text` written in `format`, filling in what a coarse format leaves out.
pub fn parse_with_format(text: &str, format: &str) -> Option<NaiveDateTime> {
    let grain = format_grain(format)?;
    let parsed = match grain {
        Grain::Hour => {
            NaiveDateTime::parse_from_str(&format!("{text}:00"), &format!("{format}:%M")).ok()?
        }
        Grain::Day => NaiveDate::parse_from_str(text, format)
            .ok()?
            .and_time(NaiveTime::MIN),
        Grain::Month => NaiveDate::parse_from_str(&format!("{text}|01"), &format!("{format}|%d"))
            .ok()?
            .and_time(NaiveTime::MIN),
        Grain::Year => {
            NaiveDate::parse_from_str(&format!("{text}|01|01"), &format!("{format}|%m|%d"))
                .ok()?
                .and_time(NaiveTime::MIN)
        }
        Grain::Whole => return None,
    };
    Some(parsed)
}

/// Writes `period` in `format`.
pub fn format_period(period: &Period, format: &str) -> String {
    period.start().format(format).to_string()
}

/// The format among [`KNOWN_FORMATS`] that writes every value exactly, if one does.
fn infer_format<'a>(values: impl Iterator<Item = &'a str> + Clone) -> Option<&'static str> {
    KNOWN_FORMATS.into_iter().find(|format| {
        let mut any = false;
        let all = values.clone().all(|value| {
            any = true;
            let grain = format_grain(format).unwrap_or(Grain::Day);
            parse_with_format(value, format)
                .and_then(|instant| Period::containing(grain, instant))
                .is_some_and(|period| format_period(&period, format) == value)
        });
        any && all
    })
}

/// What to go on when deciding how a column holds time: its type, its values in the log (for a
/// partition column), and what the model header declares.
pub struct ColumnFacts<'a> {
    /// The column.
    pub column: &'a str,
    /// Its Arrow type.
    pub data_type: &'a DataType,
    /// Its distinct non-NULL values in the log, when it is a partition column.
    pub values: Option<Vec<String>>,
    /// Declared `grain`.
    pub grain: Option<Grain>,
    /// Declared `format`.
    pub format: Option<&'a str>,
}

/// The value type behind a dictionary.
fn value_type(data_type: &DataType) -> &DataType {
    match data_type {
        DataType::Dictionary(_, value) => value_type(value),
        other => other,
    }
}

fn is_string(data_type: &DataType) -> bool {
    matches!(
        value_type(data_type),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

fn is_integer(data_type: &DataType) -> bool {
    value_type(data_type).is_integer()
}

/// How one column holds time, or why it does not (a message for the user).
pub fn time_column(facts: &ColumnFacts<'_>) -> std::result::Result<TimeColumn, String> {
    let column = facts.column;
    let values = facts.values.as_deref().unwrap_or(&[]);
    match value_type(facts.data_type) {
        DataType::Date32 | DataType::Date64 => {
            let encoding = TimeEncoding::Date {
                column: column.to_string(),
            };
            let dates: Vec<NaiveDate> = values
                .iter()
                .filter_map(|v| NaiveDate::parse_from_str(v, "%Y-%m-%d").ok())
                .collect();
            let (grain, grain_reason) = match facts.grain {
                Some(Grain::Hour) => {
                    return Err(format!("`{column}` is a DATE: it cannot hold hours"));
                }
                Some(grain) => (grain, "declared in the model header".to_string()),
                None if facts.values.is_none() => (Grain::Day, "a DATE column".to_string()),
                None => infer_date_grain(&dates)?,
            };
            Ok(TimeColumn {
                encoding,
                grain,
                grain_reason,
            })
        }
        DataType::Timestamp(_, timezone) => {
            let encoding = TimeEncoding::Timestamp {
                column: column.to_string(),
                timezone: timezone.as_ref().map(|tz| tz.to_string()),
            };
            let (grain, grain_reason) = match facts.grain {
                Some(grain) => (grain, "declared in the model header".to_string()),
                None if facts.values.is_none() => (Grain::Hour, "a TIMESTAMP column".to_string()),
                None => {
                    let instants: Vec<NaiveDateTime> = values
                        .iter()
                        .filter_map(|v| parse_instant(v).map(|p| p.0))
                        .collect();
                    if instants
                        .iter()
                        .any(|t| t.minute() != 0 || t.second() != 0 || t.nanosecond() != 0)
                    {
                        return Err(format!(
                            "`{column}` holds timestamps that are not whole hours, so its partitions are not periods of a grain"
                        ));
                    }
                    if instants.len() >= 2 && instants.iter().all(|t| t.hour() == 0) {
                        (
                            Grain::Day,
                            format!("inferred: every value ({}) is a midnight", instants.len()),
                        )
                    } else {
                        (
                            Grain::Hour,
                            "a TIMESTAMP partition of whole hours".to_string(),
                        )
                    }
                }
            };
            Ok(TimeColumn {
                encoding,
                grain,
                grain_reason,
            })
        }
        other if is_string(other) => {
            let (format, reason) = match facts.format {
                Some(format) => (
                    format.to_string(),
                    "declared in the model header".to_string(),
                ),
                None => {
                    if facts.values.is_none() {
                        return Err(format!(
                            "`{column}` is a string column that is not a partition column, so its values cannot be checked: if it holds dates, declare their format (e.g. `format = \"%Y-%m-%d\"`); otherwise choose a column that holds times"
                        ));
                    }
                    let format =
                        infer_format(values.iter().map(String::as_str)).ok_or_else(|| {
                            let example = values.first().map_or_else(
                                || "no values yet".to_string(),
                                |v| format!("values like `{v}`"),
                            );
                            format!("`{column}` holds no dates ({example})")
                        })?;
                    (
                        format.to_string(),
                        format!(
                            "inferred: every value ({}) is written `{format}`",
                            values.len()
                        ),
                    )
                }
            };
            let format_grain = format_grain(&format).ok_or_else(|| {
                format!("the format `{format}` of `{column}` does not name whole hours, days, months or years")
            })?;
            let grain = facts.grain.unwrap_or(format_grain);
            if grain != format_grain {
                return Err(format!(
                    "`{column}` is written `{format}`, which names {}s, not {}s",
                    format_grain, grain
                ));
            }
            let column_time = TimeColumn {
                encoding: TimeEncoding::Text {
                    column: column.to_string(),
                    format,
                },
                grain,
                grain_reason: if facts.grain.is_some() {
                    "declared in the model header".into()
                } else {
                    reason
                },
            };
            // A declared format must fit the values too.
            for value in values {
                let map = PartitionValues::from([(column.to_string(), Some(value.clone()))]);
                column_time.period_of(&map)?;
            }
            Ok(column_time)
        }
        other => Err(format!(
            "`{column}` has type {other}; a time column is a DATE, a TIMESTAMP, a string holding dates, or integer `year`/`month`/`day`/`hour` parts"
        )),
    }
}

/// Integer columns named `year`, `month`, `day` and `hour` holding the parts of a time: every
/// name must be one of those, `year` must be there, and there is no gap from the top.
pub fn parts_time(columns: &[String], schema: &Schema) -> std::result::Result<TimeColumn, String> {
    let mut parts: [Option<String>; 4] = Default::default();
    for column in columns {
        let slot = ["year", "month", "day", "hour"]
            .iter()
            .position(|p| column.eq_ignore_ascii_case(p))
            .ok_or_else(|| format!("`{column}` is not one of the parts year, month, day, hour"))?;
        let data_type = schema
            .field_with_name(column)
            .map(|f| f.data_type().clone())
            .map_err(|_| format!("there is no column `{column}`"))?;
        if !is_integer(&data_type) {
            return Err(format!("`{column}` has type {data_type}, not an integer"));
        }
        parts[slot] = Some(column.clone());
    }
    let [year, month, day, hour] = parts;
    let Some(year) = year else {
        return Err("integer time parts start with `year`".into());
    };
    if day.is_some() && month.is_none() || hour.is_some() && day.is_none() {
        return Err(
            "integer time parts have a gap: use year, month, day, hour from the top".into(),
        );
    }
    let grain = if hour.is_some() {
        Grain::Hour
    } else if day.is_some() {
        Grain::Day
    } else if month.is_some() {
        Grain::Month
    } else {
        Grain::Year
    };
    Ok(TimeColumn {
        encoding: TimeEncoding::Parts {
            year,
            month,
            day,
            hour,
        },
        grain,
        grain_reason: "integer parts name it".into(),
    })
}

/// The grain of a DATE partition column from its values.
fn infer_date_grain(dates: &[NaiveDate]) -> std::result::Result<(Grain, String), String> {
    let n = dates.len();
    if n == 0 {
        return Ok((
            Grain::Day,
            "assumed: the table has no partitions yet (declare `grain` if it is not daily)".into(),
        ));
    }
    let all_first_of_month = dates.iter().all(|d| d.day() == 1);
    let all_new_year = dates.iter().all(|d| d.day() == 1 && d.month() == 1);
    if n == 1 && all_first_of_month {
        return Err(format!(
            "the table's only partition is {}: it cannot tell whether the table is daily or monthly; declare `grain` in the model header",
            dates[0]
        ));
    }
    Ok(if all_new_year {
        (
            Grain::Year,
            format!("inferred: all {n} partitions are firsts of January"),
        )
    } else if all_first_of_month {
        (
            Grain::Month,
            format!("inferred: all {n} partitions are firsts of months"),
        )
    } else {
        (
            Grain::Day,
            format!("inferred from {n} partitions, not all on the first of a month"),
        )
    })
}

/// Whether a partition column of this type and these values may hold times (so that failing
/// to read them as times is an error): a DATE or a TIMESTAMP, or a string column with no values
/// yet or with a value that reads as a time or looks like one in a format lakefill does not
/// know (`2026/01/05`: digits and separators, starting with a digit). Erring towards "may":
/// a table taken for one without time would have its range refused, and a run without one
/// replaces the whole table.
fn may_hold_time(data_type: &DataType, values: Option<&Vec<String>>) -> bool {
    match value_type(data_type) {
        DataType::Date32 | DataType::Date64 | DataType::Timestamp(..) => true,
        other if is_string(other) => values.is_none_or(|values| {
            values.is_empty()
                || values.iter().any(|v| {
                    looks_like_time(v)
                        || parse_instant(v).is_some()
                        || KNOWN_FORMATS.iter().any(|format| {
                            parse_with_format(v, format)
                                .is_some_and(|t| t.format(format).to_string() == *v)
                        })
                })
        }),
        // Dates kept as numbers (`20260105`) are times lakefill cannot read yet, not ids.
        other if is_integer(other) => values.is_some_and(|v| v.iter().any(|v| looks_like_time(v))),
        _ => false,
    }
}

/// A value that starts with a digit and holds at least six digits, with separators between them
/// or eight to ten digits alone (`2026/01/05`, `05.01.2026`, `2026010513`).
fn looks_like_time(value: &str) -> bool {
    let digits = value.chars().filter(char::is_ascii_digit).count();
    let separated = value
        .chars()
        .any(|c| matches!(c, '-' | '/' | '.' | ':' | ' ' | 'T'));
    let all_digits = digits == value.len();
    value.starts_with(|c: char| c.is_ascii_digit())
        && digits >= 6
        && (separated || (all_digits && (8..=10).contains(&digits)))
}

/// Why the model's `partition_by` does not describe the table.
fn mismatch(table: &str, partition_by: &[String], partition_columns: &[String]) -> String {
    if partition_by.is_empty() {
        return format!(
            "the header sets no `partition_by`, but `{table}` is partitioned by [{}]",
            partition_columns.join(", ")
        );
    }
    format!(
        "the model says `{table}` is partitioned by [{}], but the table is partitioned by [{}]",
        partition_by.join(", "),
        partition_columns.join(", ")
    )
}

/// How a target is partitioned: all its partition columns and the time column among them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Every partition column, in the table's order.
    pub partition_columns: Vec<String>,
    /// The column(s) holding the time the range selects.
    pub time: TimeColumn,
    /// Whether the range selects rows by the time column (`range_column`: an unpartitioned
    /// table, or one partitioned coarser than the range) instead of whole partitions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_rows: bool,
}

impl Layout {
    /// Decides the layout of table `table` from its partition columns, schema and log values,
    /// and what the model header says (`partition_by`, `grain`, `format`).
    pub fn detect(
        table: &str,
        partition_columns: &[String],
        schema: &Schema,
        log_values: &BTreeMap<String, Vec<String>>,
        partition_by: &[String],
        grain: Option<Grain>,
        format: Option<&str>,
    ) -> std::result::Result<Self, String> {
        if partition_columns.is_empty() && partition_by.is_empty() {
            if grain.is_some() || format.is_some() {
                return Err(format!(
                    "`{table}` is not partitioned, so the model's `grain`/`format` has no column to describe; name the time column with `range_column`"
                ));
            }
            return Ok(Self::timeless(
                partition_columns,
                format!("`{table}` is not partitioned and the model names no `range_column`"),
            ));
        }
        let mut declared = partition_by.to_vec();
        declared.sort();
        let mut actual = partition_columns.to_vec();
        actual.sort();
        if declared != actual {
            return Err(mismatch(table, partition_by, partition_columns));
        }
        let type_of = |column: &str| -> std::result::Result<&DataType, String> {
            schema
                .field_with_name(column)
                .map(|f| f.data_type())
                .map_err(|_| {
                    format!("partition column `{column}` is not in the schema of `{table}`")
                })
        };
        // Integer parts: year, and optionally month, day and hour, by name.
        let part = |name: &str| -> Option<String> {
            partition_columns
                .iter()
                .find(|c| c.eq_ignore_ascii_case(name))
                .filter(|c| type_of(c).is_ok_and(is_integer))
                .cloned()
        };
        if let Some(year) = part("year") {
            let (month, day, hour) = (part("month"), part("day"), part("hour"));
            if day.is_some() && month.is_none() || hour.is_some() && day.is_none() {
                return Err(format!(
                    "`{table}` has integer time parts [{}] with a gap: use year, month, day, hour from the top",
                    [Some(&year), month.as_ref(), day.as_ref(), hour.as_ref()]
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let finest = if hour.is_some() {
                Grain::Hour
            } else if day.is_some() {
                Grain::Day
            } else if month.is_some() {
                Grain::Month
            } else {
                Grain::Year
            };
            if let Some(declared) = grain
                && declared != finest
            {
                return Err(format!(
                    "`{table}` keeps time in integer parts down to the {finest}; `grain = \"{declared}\"` does not match"
                ));
            }
            let time = TimeColumn {
                encoding: TimeEncoding::Parts {
                    year,
                    month,
                    day,
                    hour,
                },
                grain: finest,
                grain_reason: "integer parts name it".into(),
            };
            return Ok(Self {
                partition_columns: partition_columns.to_vec(),
                time,
                by_rows: false,
            });
        }
        // Otherwise one column holds time: the first in `partition_by` that does.
        let mut reasons = Vec::new();
        let mut timelike = false;
        for column in partition_by {
            let data_type = type_of(column)?;
            timelike |= may_hold_time(data_type, log_values.get(column));
            let facts = ColumnFacts {
                column,
                data_type,
                values: Some(log_values.get(column).cloned().unwrap_or_default()),
                grain,
                format,
            };
            match time_column(&facts) {
                Ok(time) => {
                    return Ok(Self {
                        partition_columns: partition_columns.to_vec(),
                        time,
                        by_rows: false,
                    });
                }
                Err(reason) => reasons.push(reason),
            }
        }
        let reason = format!(
            "no partition column of `{table}` holds times: {}",
            reasons.join("; ")
        );
        if timelike || grain.is_some() || format.is_some() {
            // A column that holds times of no grain, or a model that says there is a time:
            // that no column holds it is an error, not a table without time.
            return Err(reason);
        }
        Ok(Self::timeless(partition_columns, reason))
    }

    /// The layout of a table with no time column: the whole table is one period, each file
    /// rewritten or kept by `--where`. `reason` says why no column holds time.
    pub fn timeless(partition_columns: &[String], reason: String) -> Self {
        Self {
            partition_columns: partition_columns.to_vec(),
            time: TimeColumn {
                encoding: TimeEncoding::None,
                grain: Grain::Whole,
                grain_reason: reason,
            },
            by_rows: false,
        }
    }

    /// Whether the table has no time column ([`Layout::timeless`]).
    pub fn is_timeless(&self) -> bool {
        self.time.encoding == TimeEncoding::None
    }

    /// The layout of a table whose range selects rows by `range_column` (a column that is not a
    /// partition column): unpartitioned, or partitioned coarser than the range.
    pub fn detect_rows(
        table: &str,
        partition_columns: &[String],
        schema: &Schema,
        partition_by: &[String],
        range_column: &str,
        grain: Option<Grain>,
        format: Option<&str>,
    ) -> std::result::Result<Self, String> {
        let mut declared = partition_by.to_vec();
        declared.sort();
        let mut actual = partition_columns.to_vec();
        actual.sort();
        if declared != actual {
            return Err(mismatch(table, partition_by, partition_columns));
        }
        if partition_columns.iter().any(|c| c == range_column) {
            return Err(format!(
                "`{range_column}` is a partition column of `{table}`: drop `range_column`, the range replaces its partitions"
            ));
        }
        let field = schema.field_with_name(range_column).map_err(|_| {
            format!("`{table}` has no column `{range_column}` (the `range_column`)")
        })?;
        let time = time_column(&ColumnFacts {
            column: range_column,
            data_type: field.data_type(),
            values: None,
            grain,
            format,
        })?;
        Ok(Self {
            partition_columns: partition_columns.to_vec(),
            time,
            by_rows: true,
        })
    }

    /// The partition columns that do not hold the time (replaced whole under each period).
    pub fn other_columns(&self) -> Vec<&str> {
        let time = self.time.encoding.columns();
        self.partition_columns
            .iter()
            .map(String::as_str)
            .filter(|c| !time.contains(c))
            .collect()
    }

    /// Whether this is [`Layout::unknown`]: its time names no column.
    pub fn is_unknown(&self) -> bool {
        matches!(&self.time.encoding, TimeEncoding::Date { column } if column.is_empty())
    }

    /// A layout with no columns: what a journal without one holds until it is upgraded.
    pub fn unknown() -> Self {
        Self {
            by_rows: false,
            partition_columns: Vec::new(),
            time: TimeColumn {
                encoding: TimeEncoding::Date {
                    column: String::new(),
                },
                grain: Grain::Day,
                grain_reason: String::new(),
            },
        }
    }

    /// A layout of one DATE or string column, as journals of format 1 recorded it.
    pub fn legacy(column: &str, text: bool) -> Self {
        let encoding = if text {
            TimeEncoding::Text {
                column: column.to_string(),
                format: "%Y-%m-%d".into(),
            }
        } else {
            TimeEncoding::Date {
                column: column.to_string(),
            }
        };
        Self {
            partition_columns: vec![column.to_string()],
            time: TimeColumn {
                encoding,
                grain: Grain::Day,
                grain_reason: "recorded by an earlier lakefill".into(),
            },
            by_rows: false,
        }
    }

    /// The hive directory of a file's partition values (`a=1/b=x%2Fy`), encoded the way delta-rs
    /// encodes them.
    pub fn hive_path(&self, values: &PartitionValues) -> String {
        self.partition_columns
            .iter()
            .map(|column| {
                let encoded = match values.get(column).cloned().flatten() {
                    Some(value) => {
                        delta_kernel::expressions::Scalar::String(value).serialize_encoded()
                    }
                    None => NULL_PARTITION_DIR.to_string(),
                };
                format!("{column}={encoded}")
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Rows of the range's partitions (and of the NULL partition when the range includes it), as
    /// a filter on the partition columns that prunes files. `schema` is the table's.
    pub fn range_predicate(&self, range: &PartitionRange, schema: &Schema) -> Result<Expr> {
        let Some(time_column) = self.time.encoding.columns().first().map(|c| c.to_string()) else {
            // No time: the range is the whole table.
            return match &range.rows {
                Some(rows) => rows.expr(schema),
                None => Ok(lit(true)),
            };
        };
        let data_type = schema
            .field_with_name(&time_column)
            .map(|f| f.data_type().clone())
            .map_err(|_| {
                Error::Internal(format!("time column `{time_column}` is not in the schema"))
            })?;
        let (Some(from), Some(to)) = (range.first(), range.last()) else {
            return Err(Error::Internal(format!(
                "the range {}..={} is not of the {} grain",
                range.from, range.to, range.grain
            )));
        };
        let mut predicate = self.time.predicate(from, to, !self.by_rows, &data_type)?;
        if range.include_null {
            let null = self
                .time
                .encoding
                .columns()
                .into_iter()
                .map(|c| Expr::Column(Column::new_unqualified(c)).is_null())
                .reduce(Expr::or)
                .unwrap_or(lit(false));
            predicate = predicate.or(null);
        }
        if let Some(rows) = &range.rows {
            predicate = predicate.and(rows.expr(schema)?);
        }
        Ok(predicate)
    }

    /// Whether a run over `range` rewrites the files it touches, carrying over their rows
    /// outside it, instead of replacing whole partitions: by rows, or when `--where` scopes the
    /// rows.
    pub fn rewrites_files(&self, range: &PartitionRange) -> bool {
        self.by_rows || range.rows.is_some()
    }

    /// For each file, whether it may hold rows of `range`: by its partition values when the time
    /// is a partition column, by its statistics when the range selects rows; with `--where`,
    /// also unless its values and statistics rule out a match. `schema` is the table's.
    pub fn files_in_scope(
        &self,
        range: &PartitionRange,
        files: &[crate::scope::FileFacts<'_>],
        schema: &Schema,
    ) -> Result<Vec<bool>> {
        let mut keep: Vec<bool> = files
            .iter()
            .map(|file| {
                if self.by_rows {
                    self.time.file_may_hold(range, file.stats)
                } else {
                    self.label_in(range, file.values).is_some()
                }
            })
            .collect();
        if let Some(rows) = &range.rows {
            for (keep, may) in keep.iter_mut().zip(rows.may_match(schema, files)?) {
                *keep &= may;
            }
        }
        Ok(keep)
    }

    /// The label of the partition a file with these values belongs to, if it lies in `range`.
    pub fn label_in(&self, range: &PartitionRange, values: &PartitionValues) -> Option<String> {
        match self.time.period_of(values) {
            Ok(Some(period)) if range.contains(&period) => Some(period.label()),
            Ok(None) if range.include_null => Some(NULL_LABEL.to_string()),
            _ => None,
        }
    }

    /// The directory a run stages one partition's files in: `<hive path>/lakefill-<run_id>`.
    pub fn staging_prefix(
        &self,
        values: &PartitionValues,
        run_id: &crate::run_id::RunId,
    ) -> String {
        if self.partition_columns.is_empty() {
            return run_id.staging_dir();
        }
        format!("{}/{}", self.hive_path(values), run_id.staging_dir())
    }
}

/// An inclusive range of periods, `from..=to`, named by their labels (and whether the NULL time
/// partition is part of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRange {
    /// The first period's label.
    pub from: String,
    /// The last period's label.
    pub to: String,
    /// The grain of the periods.
    #[serde(default = "day")]
    pub grain: Grain,
    /// Whether the partition with a NULL time is replaced too (`--include-null`).
    #[serde(default)]
    pub include_null: bool,
    /// The rows of the range the run replaces, when not all of them (`--where`): every other row
    /// of the files it rewrites is carried over unchanged.
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub rows: Option<crate::scope::RowPredicate>,
}

fn day() -> Grain {
    Grain::Day
}

/// The most periods one run may span.
pub const MAX_PERIODS: i64 = 100_000;

impl PartitionRange {
    /// Parses `--from` and `--to` for `time`, rounding each to the period that holds it.
    /// Returns the range and a note for each bound that was rounded.
    pub fn parse(
        from: &str,
        to: &str,
        time: &TimeColumn,
        include_null: bool,
    ) -> Result<(Self, Vec<String>)> {
        let grain = time.grain;
        let bound = |text: &str, option: &str| -> Result<(Period, Option<String>)> {
            let native = match &time.encoding {
                TimeEncoding::Text { format, .. } => parse_with_format(text, format)
                    .and_then(|t| Period::containing(grain, t))
                    .filter(|p| format_period(p, format) == text)
                    .map(|p| (p, true)),
                _ => None,
            };
            let (period, exact) = native
                .or_else(|| Period::parse_user(grain, text))
                .ok_or_else(|| Error::InvalidRange {
                    message: format!(
                        "`{option} {text}` is not a {}; `{}` is partitioned by {}s, e.g. `{option} {}`",
                        if grain.is_calendar() { "date" } else { "time" },
                        time.encoding.describe(),
                        grain,
                        example(time)
                    ),
                })?;
            let note = (!exact).then(|| {
                format!(
                    "`{option} {text}` is rounded to the {grain} {}",
                    period.label()
                )
            });
            Ok((period, note))
        };
        let (from_period, from_note) = bound(from, "--from")?;
        let (to_period, to_note) = bound(to, "--to")?;
        if from_period > to_period {
            return Err(Error::InvalidRange {
                message: format!("`--from {from}` is after `--to {to}`"),
            });
        }
        let count = period_count(from_period, to_period);
        if count > MAX_PERIODS {
            return Err(Error::InvalidRange {
                message: format!(
                    "{from}..={to} spans {count} {grain} partitions, more than the {MAX_PERIODS} one run may replace"
                ),
            });
        }
        Ok((
            Self {
                from: from_period.label(),
                to: to_period.label(),
                grain,
                include_null,
                rows: None,
            },
            from_note.into_iter().chain(to_note).collect(),
        ))
    }

    /// The range of a table with no time column: the whole table, one period.
    pub fn whole() -> Self {
        let label = Period::whole().label();
        Self {
            from: label.clone(),
            to: label,
            grain: Grain::Whole,
            include_null: false,
            rows: None,
        }
    }

    /// The range from the first to the last period of `layout` that `files` hold (by their
    /// partition values, or by the time column's statistics by rows), and the NULL partition
    /// when a file holds it: every row of the table. `None` when the files show no time.
    pub fn spanning(
        layout: &Layout,
        files: &[crate::scope::FileFacts<'_>],
    ) -> std::result::Result<Option<Self>, String> {
        if layout.is_timeless() {
            return Ok(Some(Self::whole()));
        }
        let grain = layout.time.grain;
        let mut periods: Vec<Period> = Vec::new();
        let mut include_null = false;
        for file in files {
            if layout.by_rows {
                let column = layout.time.encoding.columns()[0];
                let Some(stats) = file
                    .stats
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
                else {
                    return Err(format!(
                        "a file of the table has no statistics for `{column}`, so the span of its times is unknown"
                    ));
                };
                if stats["nullCount"][column].as_u64() != Some(0) {
                    include_null = true;
                }
                for bound in ["minValues", "maxValues"] {
                    let value = &stats[bound][column];
                    if value.is_null() {
                        continue;
                    }
                    let text = value
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or(value.to_string());
                    let period = layout
                        .time
                        .instant_of(&text)
                        .and_then(|t| Period::containing(grain, t))
                        .ok_or_else(|| {
                            format!(
                                "the statistics of `{column}` hold `{text}`, which is not a time"
                            )
                        })?;
                    periods.push(period);
                }
            } else {
                match layout.time.period_of(file.values)? {
                    Some(period) => periods.push(period),
                    None => include_null = true,
                }
            }
        }
        let (Some(first), Some(last)) = (periods.iter().min(), periods.iter().max()) else {
            return Ok(None);
        };
        Ok(Some(Self {
            from: first.label(),
            to: last.label(),
            grain,
            include_null,
            rows: None,
        }))
    }

    /// How plans and lists name the range: `2026-01-01..=2026-01-31`, or `whole table`.
    pub fn span(&self) -> String {
        if self.grain == Grain::Whole {
            return "whole table".into();
        }
        format!("{}..={}", self.from, self.to)
    }

    /// The first period.
    pub fn first(&self) -> Option<Period> {
        Period::from_label(self.grain, &self.from)
    }

    /// The last period.
    pub fn last(&self) -> Option<Period> {
        Period::from_label(self.grain, &self.to)
    }

    /// Every period of the range, in order.
    pub fn periods(&self) -> Vec<Period> {
        match (self.first(), self.last()) {
            (Some(from), Some(to)) => periods(from, to).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether `period` lies in the range.
    pub fn contains(&self, period: &Period) -> bool {
        period.grain() == self.grain
            && self.first().is_some_and(|from| from <= *period)
            && self.last().is_some_and(|to| *period <= to)
    }

    /// Whether the period labelled `label` lies in the range.
    pub fn contains_label(&self, label: &str) -> bool {
        Period::from_label(self.grain, label).is_some_and(|p| self.contains(&p))
    }
}

/// An example value of the grain for messages.
fn example(time: &TimeColumn) -> String {
    let period = Period::of_date(
        time.grain,
        NaiveDate::from_ymd_opt(2026, 1, 5).expect("a date"),
    )
    .expect("a period");
    match &time.encoding {
        TimeEncoding::Text { format, .. } => format_period(&period, format),
        _ => period.label(),
    }
}

/// The label of the partition a file's (or a row's) values fall in, for reports: the period,
/// `(null)`, or the raw values when they are not times of the grain.
pub fn label_of(layout: &Layout, values: &PartitionValues) -> String {
    let period = if layout.by_rows {
        layout.time.period_containing(values)
    } else {
        layout.time.period_of(values)
    };
    match period {
        Ok(Some(period)) => period.label(),
        Ok(None) => NULL_LABEL.to_string(),
        Err(_) => layout
            .time
            .encoding
            .columns()
            .iter()
            .map(|c| values.get(*c).cloned().flatten().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("/"),
    }
}

/// How a hive directory names a NULL partition value (as delta-rs writes it).
pub const NULL_PARTITION_DIR: &str = "__HIVE_DEFAULT_PARTITION__";

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::datatypes::Field;

    fn values(pairs: &[(&str, Option<&str>)]) -> PartitionValues {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    fn detect(
        columns: &[(&str, DataType)],
        log: &[(&str, &[&str])],
        grain: Option<Grain>,
        format: Option<&str>,
    ) -> std::result::Result<Layout, String> {
        let schema = Schema::new(
            columns
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        );
        let names: Vec<String> = columns.iter().map(|(n, _)| n.to_string()).collect();
        let log: BTreeMap<String, Vec<String>> = log
            .iter()
            .map(|(c, vs)| (c.to_string(), vs.iter().map(|v| v.to_string()).collect()))
            .collect();
        Layout::detect("t", &names, &schema, &log, &names, grain, format)
    }

    #[test]
    fn grains_are_inferred_from_the_log_or_refused_when_ambiguous() {
        let month = detect(
            &[("m", DataType::Date32)],
            &[("m", &["2026-11-01", "2026-12-01"])],
            None,
            None,
        )
        .expect("monthly");
        assert_eq!(month.time.grain, Grain::Month);
        assert!(month.time.grain_reason.contains("firsts of months"));
        let daily = detect(
            &[("d", DataType::Date32)],
            &[("d", &["2026-12-01", "2026-12-02"])],
            None,
            None,
        )
        .expect("daily");
        assert_eq!(daily.time.grain, Grain::Day);
        let err = detect(
            &[("m", DataType::Date32)],
            &[("m", &["2026-12-01"])],
            None,
            None,
        )
        .expect_err("one value on the first");
        assert!(err.contains("declare `grain`"), "{err}");
        let declared = detect(
            &[("m", DataType::Date32)],
            &[("m", &["2026-12-01"])],
            Some(Grain::Month),
            None,
        )
        .expect("declared");
        assert_eq!(declared.time.grain, Grain::Month);
        let yearly = detect(
            &[("y", DataType::Date32)],
            &[("y", &["2025-01-01", "2026-01-01"])],
            None,
            None,
        )
        .expect("yearly");
        assert_eq!(yearly.time.grain, Grain::Year);
    }

    #[test]
    fn string_formats_are_inferred_and_values_compare_as_times() {
        let ds = detect(
            &[("ds", DataType::Utf8)],
            &[("ds", &["2026-01-05", "2026-01-10"])],
            None,
            None,
        )
        .expect("string dates");
        assert_eq!(
            ds.time.encoding,
            TimeEncoding::Text {
                column: "ds".into(),
                format: "%Y-%m-%d".into()
            }
        );
        let (range, notes) =
            PartitionRange::parse("2026-01-1", "2026-01-3", &ds.time, false).expect("range");
        assert_eq!(
            (range.from.as_str(), range.to.as_str()),
            ("2026-01-01", "2026-01-03")
        );
        assert!(notes.is_empty());
        let tenth = ds
            .time
            .period_of(&values(&[("ds", Some("2026-01-10"))]))
            .expect("parse")
            .expect("value");
        assert!(
            !range.contains(&tenth),
            "2026-01-10 is not between the 1st and the 3rd"
        );
        let compact = detect(
            &[("ds", DataType::Utf8)],
            &[("ds", &["20260105", "20260110"])],
            None,
            None,
        )
        .expect("compact");
        let (range, _) =
            PartitionRange::parse("20260101", "2026-01-31", &compact.time, false).expect("range");
        assert_eq!(range.to, "2026-01-31");
        let hourly = detect(
            &[("h", DataType::Utf8)],
            &[("h", &["2026-01-05-13", "2026-01-05-14"])],
            None,
            None,
        )
        .expect("hourly");
        assert_eq!(hourly.time.grain, Grain::Hour);
        // A column that holds no times makes a table without time, saying why.
        let timeless = detect(
            &[("country", DataType::Utf8)],
            &[("country", &["DE", "FR"])],
            None,
            None,
        )
        .expect("no dates: no time column");
        assert!(timeless.is_timeless(), "{timeless:?}");
        let reason = &timeless.time.grain_reason;
        assert!(
            reason.contains("holds no dates") && reason.contains("`DE`"),
            "{reason}"
        );
        // Dates in a format lakefill does not know are an error (declare `format`), not a table
        // without time.
        let err = detect(
            &[("ds", DataType::Utf8)],
            &[("ds", &["2026/01/05", "2026/01/06"])],
            None,
            None,
        )
        .expect_err("unknown date format");
        assert!(err.contains("holds no dates"), "{err}");
        // Nor are dates kept as integers.
        detect(
            &[("dt", DataType::Int32)],
            &[("dt", &["20260105", "20260106"])],
            None,
            None,
        )
        .expect_err("dates as integers");
        // Integer-like and code-like values are not times.
        for values in [&["1", "2", "17"][..], &["A-2024-77", "B-2025-01"][..]] {
            let layout =
                detect(&[("p", DataType::Utf8)], &[("p", values)], None, None).expect("no time");
            assert!(layout.is_timeless(), "{values:?}");
        }
        // Some values are dates: the others are an error, not a reason to ignore time.
        let err = detect(
            &[("ds", DataType::Utf8)],
            &[("ds", &["2026-01-05", "unknown"])],
            None,
            None,
        )
        .expect_err("dates among other values");
        assert!(err.contains("holds no dates"), "{err}");
        // So is a model that declares a grain.
        detect(
            &[("country", DataType::Utf8)],
            &[("country", &["DE", "FR"])],
            Some(Grain::Day),
            None,
        )
        .expect_err("a declared grain needs a time column");
        let dictionary = DataType::Dictionary(Box::new(DataType::UInt16), Box::new(DataType::Utf8));
        detect(
            &[("ds", dictionary)],
            &[("ds", &["2026-01-05", "2026-01-06"])],
            None,
            None,
        )
        .expect("dictionary-encoded strings");
    }

    #[test]
    fn several_columns_and_integer_parts() {
        let layout = detect(
            &[
                ("country", DataType::Utf8),
                ("event_date", DataType::Date32),
            ],
            &[
                ("country", &["DE", "FR"]),
                ("event_date", &["2026-01-05", "2026-01-06"]),
            ],
            None,
            None,
        )
        .expect("two columns");
        assert_eq!(layout.time.encoding.columns(), vec!["event_date"]);
        assert_eq!(layout.other_columns(), vec!["country"]);
        let parts = detect(
            &[("year", DataType::Int32), ("month", DataType::Int32)],
            &[("year", &["2026"]), ("month", &["1", "12"])],
            None,
            None,
        )
        .expect("parts");
        assert_eq!(parts.time.grain, Grain::Month);
        let period = parts
            .time
            .period_of(&values(&[("year", Some("2026")), ("month", Some("7"))]))
            .expect("parse")
            .expect("value");
        assert_eq!(period.label(), "2026-07");
    }

    #[test]
    fn values_off_the_grain_are_errors_and_nulls_are_none() {
        let month = detect(
            &[("m", DataType::Date32)],
            &[("m", &["2026-11-01", "2026-12-01"])],
            None,
            None,
        )
        .expect("monthly");
        let err = month
            .time
            .period_of(&values(&[("m", Some("2026-12-15"))]))
            .expect_err("mid-month");
        assert!(err.contains("not the first instant of a month"), "{err}");
        assert_eq!(month.time.period_of(&values(&[("m", None)])), Ok(None));
        let (range, notes) =
            PartitionRange::parse("2026-12-15", "2026-12-31", &month.time, false).expect("range");
        assert_eq!(
            (range.from.as_str(), range.to.as_str()),
            ("2026-12", "2026-12")
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
    }

    #[test]
    fn hive_paths_encode_once_like_delta() {
        let layout = detect(
            &[
                ("event_date", DataType::Date32),
                ("country", DataType::Utf8),
            ],
            &[
                ("event_date", &["2026-01-05", "2026-01-06"]),
                ("country", &["x"]),
            ],
            None,
            None,
        )
        .expect("layout");
        let path = layout.hive_path(&values(&[
            ("event_date", Some("2026-01-05")),
            ("country", Some("x/y=z%")),
        ]));
        assert_eq!(path, "event_date=2026-01-05/country=x%2Fy%3Dz%25");
        let null = layout.hive_path(&values(&[
            ("event_date", Some("2026-01-05")),
            ("country", None),
        ]));
        assert_eq!(
            null,
            "event_date=2026-01-05/country=__HIVE_DEFAULT_PARTITION__"
        );
    }

    #[test]
    fn huge_ranges_are_refused() {
        let day = detect(
            &[("d", DataType::Date32)],
            &[("d", &["2026-01-05", "2026-01-06"])],
            None,
            None,
        )
        .expect("daily");
        let err =
            PartitionRange::parse("0001-01-01", "9999-12-31", &day.time, false).expect_err("huge");
        assert_eq!(err.exit_code(), 2);
    }
}
