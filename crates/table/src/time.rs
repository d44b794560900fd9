//! Time grains and the periods they cut time into (DESIGN §2: "the time grain of every partition
//! column is known; ranges are rounded to whole partitions and compared as times, never as text").
//!
//! A [`Period`] is one partition's worth of time: an hour, a day, a month or a year, named by its
//! first instant. Its label (`2026-01-05T13`, `2026-01-05`, `2026-01`, `2026`) is how plans,
//! journals and reports name partitions; labels of one grain sort like the periods they name.
//! How a table stores a period in its partition columns is left to [`crate::partition`].

use chrono::{Datelike, Days, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Timelike};
use serde::{Deserialize, Serialize};

/// The length of one time partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Grain {
    /// One partition per hour.
    Hour,
    /// One partition per day.
    Day,
    /// One partition per month.
    Month,
    /// One partition per year.
    Year,
    /// No time at all: the whole table is one period (a table with no time column, scoped by
    /// `--where` alone). Its one period is labelled [`WHOLE_LABEL`].
    Whole,
}

impl Grain {
    /// Parses a grain name as the model header writes it.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "hour" | "hourly" => Some(Grain::Hour),
            "day" | "daily" => Some(Grain::Day),
            "month" | "monthly" => Some(Grain::Month),
            "year" | "yearly" => Some(Grain::Year),
            _ => None,
        }
    }

    /// The grain's name in plans and reports.
    pub fn name(self) -> &'static str {
        match self {
            Grain::Hour => "hour",
            Grain::Day => "day",
            Grain::Month => "month",
            Grain::Year => "year",
            Grain::Whole => "whole table",
        }
    }

    /// Whether periods of this grain are whole days (so `$start`/`$end` are dates).
    pub fn is_calendar(self) -> bool {
        self != Grain::Hour
    }
}

impl std::fmt::Display for Grain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How reports name the partition whose time is NULL.
pub const NULL_LABEL: &str = "(null)";

/// How plans and reports name the one period of a table with no time column.
pub const WHOLE_LABEL: &str = "(all)";

/// How journals name the rows a by-rows backfill carries over unchanged.
pub const CARRIED_LABEL: &str = "(carried)";

/// The first and last years lakefill handles: labels of other years would not sort as times.
const YEARS: std::ops::RangeInclusive<i32> = 1..=9999;

/// One partition's worth of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Period {
    start: NaiveDateTime,
    grain: Grain,
}

impl Period {
    /// The period of `grain` that holds `instant`; `None` outside the years 1 to 9999.
    pub fn containing(grain: Grain, instant: NaiveDateTime) -> Option<Self> {
        if grain == Grain::Whole {
            return Some(Self::whole());
        }
        if !YEARS.contains(&instant.year()) {
            return None;
        }
        let date = instant.date();
        let start = match grain {
            Grain::Hour => date.and_hms_opt(instant.hour(), 0, 0)?,
            Grain::Day => date.and_time(NaiveTime::MIN),
            Grain::Month => date.with_day(1)?.and_time(NaiveTime::MIN),
            Grain::Year => NaiveDate::from_ymd_opt(date.year(), 1, 1)?.and_time(NaiveTime::MIN),
            Grain::Whole => return Some(Self::whole()),
        };
        Some(Self { start, grain })
    }

    /// The one period of [`Grain::Whole`]: every row of a table with no time column.
    pub fn whole() -> Self {
        Self {
            start: NaiveDate::from_ymd_opt(*YEARS.start(), 1, 1)
                .unwrap_or(NaiveDate::MIN)
                .and_time(NaiveTime::MIN),
            grain: Grain::Whole,
        }
    }

    /// The period of `grain` that holds `date`.
    pub fn of_date(grain: Grain, date: NaiveDate) -> Option<Self> {
        Self::containing(grain, date.and_time(NaiveTime::MIN))
    }

    /// The grain.
    pub fn grain(&self) -> Grain {
        self.grain
    }

    /// The first instant.
    pub fn start(&self) -> NaiveDateTime {
        self.start
    }

    /// The first day.
    pub fn first_day(&self) -> NaiveDate {
        self.start.date()
    }

    /// The period `n` periods later (earlier for negative `n`), if it exists.
    pub fn offset(&self, n: i64) -> Option<Self> {
        let start = match self.grain {
            // The whole table has no neighbours.
            Grain::Whole => return (n == 0).then_some(*self),
            Grain::Hour => self.start.checked_add_signed(TimeDelta::try_hours(n)?)?,
            Grain::Day => self.start.checked_add_signed(TimeDelta::try_days(n)?)?,
            Grain::Month | Grain::Year => {
                let months = if self.grain == Grain::Year {
                    n.checked_mul(12)?
                } else {
                    n
                };
                let magnitude = Months::new(u32::try_from(months.unsigned_abs()).ok()?);
                if months >= 0 {
                    self.start.checked_add_months(magnitude)?
                } else {
                    self.start.checked_sub_months(magnitude)?
                }
            }
        };
        Self::containing(self.grain, start)
    }

    /// The next period.
    pub fn next(&self) -> Option<Self> {
        self.offset(1)
    }

    /// The first instant after the period (its exclusive end). Defined for every period lakefill
    /// handles (the year 10000 starts after the last of them).
    pub fn end(&self) -> NaiveDateTime {
        match self.grain {
            Grain::Hour => self.start + TimeDelta::hours(1),
            Grain::Day => self.start + Days::new(1),
            Grain::Month => self
                .start
                .checked_add_months(Months::new(1))
                .unwrap_or(NaiveDateTime::MAX),
            Grain::Year => self
                .start
                .checked_add_months(Months::new(12))
                .unwrap_or(NaiveDateTime::MAX),
            Grain::Whole => NaiveDateTime::MAX,
        }
    }

    /// The last day the period touches.
    pub fn last_day(&self) -> NaiveDate {
        (self.end() - TimeDelta::microseconds(1)).date()
    }

    /// The label: `2026-01-05T13`, `2026-01-05`, `2026-01` or `2026`.
    pub fn label(&self) -> String {
        match self.grain {
            Grain::Hour => self.start.format("%Y-%m-%dT%H").to_string(),
            Grain::Day => self.start.format("%Y-%m-%d").to_string(),
            Grain::Month => self.start.format("%Y-%m").to_string(),
            Grain::Year => self.start.format("%Y").to_string(),
            Grain::Whole => WHOLE_LABEL.to_string(),
        }
    }

    /// Parses a label of `grain` exactly as [`Period::label`] writes it.
    pub fn from_label(grain: Grain, label: &str) -> Option<Self> {
        if grain == Grain::Whole {
            return (label == WHOLE_LABEL).then(Self::whole);
        }
        let instant = parse_instant(label)?;
        let period = Self::containing(grain, instant.0)?;
        (period.label() == label).then_some(period)
    }

    /// Parses what a user may write for a period of `grain` (`2026-01-05`, `2026-01`, `2026`,
    /// `2026-01-05T13`, `2026-01-05 13:00`, ...): the period that holds the instant written, and
    /// whether that instant was the period's first (so nothing was rounded).
    pub fn parse_user(grain: Grain, text: &str) -> Option<(Self, bool)> {
        let (instant, _) = parse_instant(text.trim())?;
        let period = Self::containing(grain, instant)?;
        Some((period, period.start == instant))
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

/// Parses an instant written as a year, a month, a day, or a day with a time (`T` or a space),
/// with or without a UTC offset (times are UTC). Returns the instant and how precisely it was
/// written.
pub fn parse_instant(text: &str) -> Option<(NaiveDateTime, Grain)> {
    let text = text.trim();
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some((time.naive_utc(), Grain::Hour));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(time) = NaiveDateTime::parse_from_str(text, format) {
            return Some((time, Grain::Hour));
        }
    }
    for separator in ['T', ' ', '-'] {
        if let Some((day, hour)) = text.rsplit_once(separator)
            && hour.len() == 2
            && day.len() == 10
            && let (Ok(date), Ok(hour)) = (
                NaiveDate::parse_from_str(day, "%Y-%m-%d"),
                hour.parse::<u32>(),
            )
        {
            return Some((date.and_hms_opt(hour, 0, 0)?, Grain::Hour));
        }
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Some((date.and_time(NaiveTime::MIN), Grain::Day));
    }
    if text.len() == 7
        && let Ok(date) = NaiveDate::parse_from_str(&format!("{text}-01"), "%Y-%m-%d")
    {
        return Some((date.and_time(NaiveTime::MIN), Grain::Month));
    }
    if text.len() == 4
        && let Ok(year) = text.parse::<i32>()
    {
        return Some((
            NaiveDate::from_ymd_opt(year, 1, 1)?.and_time(NaiveTime::MIN),
            Grain::Year,
        ));
    }
    None
}

/// The current time in RFC 3339, UTC.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(grain: Grain, label: &str) -> Period {
        Period::from_label(grain, label).expect(label)
    }

    #[test]
    fn labels_roundtrip_and_sort_like_time() {
        for (grain, labels) in [
            (
                Grain::Hour,
                ["2025-12-31T23", "2026-01-01T00", "2026-01-01T09"],
            ),
            (Grain::Day, ["2025-12-31", "2026-01-01", "2026-01-10"]),
            (Grain::Month, ["2025-12", "2026-01", "2026-10"]),
            (Grain::Year, ["0999", "2025", "2026"]),
        ] {
            let periods: Vec<Period> = labels.iter().map(|l| period(grain, l)).collect();
            for (p, l) in periods.iter().zip(labels) {
                assert_eq!(p.label(), l);
            }
            assert!(periods.windows(2).all(|w| w[0] < w[1]));
            assert!(labels.windows(2).all(|w| w[0] < w[1]));
        }
        assert!(Period::from_label(Grain::Day, "2026-1-5").is_none());
        assert!(Period::from_label(Grain::Month, "2026-01-01").is_none());
    }

    #[test]
    fn offsets_cross_months_years_and_leap_days() {
        let feb = period(Grain::Day, "2024-02-28");
        assert_eq!(feb.offset(1).expect("next").label(), "2024-02-29");
        assert_eq!(feb.offset(2).expect("next").label(), "2024-03-01");
        assert_eq!(
            period(Grain::Month, "2026-01")
                .offset(-1)
                .expect("prev")
                .label(),
            "2025-12"
        );
        assert_eq!(
            period(Grain::Month, "2026-11")
                .offset(14)
                .expect("next")
                .label(),
            "2028-01"
        );
        assert_eq!(
            period(Grain::Hour, "2026-01-01T00")
                .offset(-1)
                .expect("prev")
                .label(),
            "2025-12-31T23"
        );
        assert_eq!(
            period(Grain::Month, "2026-02").last_day().to_string(),
            "2026-02-28"
        );
        assert_eq!(
            period(Grain::Year, "2024").last_day().to_string(),
            "2024-12-31"
        );
        assert!(period(Grain::Year, "9999").next().is_none());
        assert!(period(Grain::Day, "2026-01-01").offset(i64::MAX).is_none());
        assert!(
            period(Grain::Day, "2026-01-01")
                .offset(-(u32::MAX as i64))
                .is_none()
        );
    }

    #[test]
    fn users_write_periods_many_ways_and_learn_when_they_were_rounded() {
        let (p, exact) = Period::parse_user(Grain::Month, "2026-12-15").expect("day in a month");
        assert_eq!((p.label().as_str(), exact), ("2026-12", false));
        let (p, exact) = Period::parse_user(Grain::Month, "2026-12").expect("month");
        assert_eq!((p.label().as_str(), exact), ("2026-12", true));
        let (p, _) = Period::parse_user(Grain::Hour, "2026-01-05 13:00").expect("hour");
        assert_eq!(p.label(), "2026-01-05T13");
        let (p, _) = Period::parse_user(Grain::Hour, "2026-01-05T13").expect("hour label");
        assert_eq!(p.label(), "2026-01-05T13");
        let (p, exact) = Period::parse_user(Grain::Day, "2026-01-05T13:30:00Z").expect("rfc3339");
        assert_eq!((p.label().as_str(), exact), ("2026-01-05", false));
        for bad in ["2026-01-1x", "yesterday", "2026-13", "", "20260105"] {
            assert!(Period::parse_user(Grain::Day, bad).is_none(), "{bad}");
        }
    }
}
