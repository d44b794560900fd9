//! Partition values and backfill ranges.
//!
//! A target is partitioned by one column, a date or a string. Values travel through plans,
//! journals and reports as strings (`2026-01-31`), which compare correctly in both cases because
//! dates are ISO formatted. This module parses and enumerates ranges and builds the hive
//! directory name of a partition; reading and writing rows is left to [`crate::execute`].

use chrono::{Days, NaiveDate};
use deltalake::arrow::datatypes::DataType;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The type of a target's partition column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionType {
    /// A `DATE` column: one partition per day.
    Date,
    /// A string column: partitions are compared as strings.
    String,
}

impl PartitionType {
    /// Returns the partition type for an Arrow type, if lakefill supports it.
    pub(crate) fn from_arrow(data_type: &DataType) -> Option<Self> {
        match data_type {
            DataType::Date32 => Some(Self::Date),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(Self::String),
            _ => None,
        }
    }
}

/// An inclusive range of partition values, `from..=to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRange {
    /// First partition value.
    pub from: String,
    /// Last partition value.
    pub to: String,
    /// Type of the values.
    pub kind: PartitionType,
}

impl PartitionRange {
    /// Parses `from` and `to` as values of `kind` for the column `column`.
    pub(crate) fn parse(from: &str, to: &str, kind: PartitionType, column: &str) -> Result<Self> {
        let (from, to) = match kind {
            PartitionType::Date => {
                let from_date = parse_date(from, "--from", column)?;
                let to_date = parse_date(to, "--to", column)?;
                (from_date.to_string(), to_date.to_string())
            }
            PartitionType::String => {
                if from.is_empty() || to.is_empty() {
                    return Err(Error::InvalidRange {
                        message: "`--from` and `--to` must not be empty".into(),
                    });
                }
                (from.to_string(), to.to_string())
            }
        };
        if from > to {
            return Err(Error::InvalidRange {
                message: format!("`--from {from}` is after `--to {to}`"),
            });
        }
        Ok(Self { from, to, kind })
    }

    /// Returns whether `value` lies in the range.
    pub(crate) fn contains(&self, value: &str) -> bool {
        self.from.as_str() <= value && value <= self.to.as_str()
    }

    /// Returns every date of a date range, in order; `None` for string ranges.
    pub(crate) fn dates(&self) -> Option<Vec<NaiveDate>> {
        if self.kind != PartitionType::Date {
            return None;
        }
        let from = NaiveDate::parse_from_str(&self.from, "%Y-%m-%d").ok()?;
        let to = NaiveDate::parse_from_str(&self.to, "%Y-%m-%d").ok()?;
        Some(from.iter_days().take_while(|d| *d <= to).collect())
    }
}

fn parse_date(value: &str, option: &str, column: &str) -> Result<NaiveDate> {
    NaiveDate::parse_from_str(value, "%Y-%m-%d").map_err(|_| Error::InvalidRange {
        message: format!(
            "`{option} {value}` is not a date (YYYY-MM-DD), but `{column}` is a date column"
        ),
    })
}

/// Days since the Unix epoch, as Arrow's `Date32` stores them.
pub(crate) fn date_to_days(date: NaiveDate) -> i32 {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("the epoch is a valid date");
    i32::try_from((date - epoch).num_days()).unwrap_or(i32::MAX)
}

/// The date of an Arrow `Date32` value.
pub(crate) fn days_to_date(days: i32) -> Option<NaiveDate> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    if days >= 0 {
        epoch.checked_add_days(Days::new(days.unsigned_abs().into()))
    } else {
        epoch.checked_sub_days(Days::new(days.unsigned_abs().into()))
    }
}

/// Parses a partition value of a date partition.
pub(crate) fn parse_partition_date(value: &str) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(value, "%Y-%m-%d").ok()
}

/// The partition value as a DataFusion literal of the partition column's type.
pub(crate) fn partition_literal(
    kind: PartitionType,
    value: &str,
) -> Result<deltalake::datafusion::common::ScalarValue> {
    use deltalake::datafusion::common::ScalarValue;
    match kind {
        PartitionType::Date => parse_partition_date(value)
            .map(|d| ScalarValue::Date32(Some(date_to_days(d))))
            .ok_or_else(|| Error::Internal(format!("partition value `{value}` is not a date"))),
        PartitionType::String => Ok(ScalarValue::Utf8(Some(value.to_string()))),
    }
}

/// The directory a run stages a partition's files in: `<partition dir>/lakefill-<run_id>`.
pub(crate) fn staging_prefix(column: &str, value: &str, run_id: &str) -> String {
    format!("{}/lakefill-{run_id}", hive_directory(column, value))
}

/// Percent-encodes a partition value for a hive directory name, as Delta writers do.
pub(crate) fn hive_directory(column: &str, value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        let c = byte as char;
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ') {
            encoded.push(c);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("{column}={encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_ranges_enumerate_days_and_reject_reversed() {
        let range = PartitionRange::parse("2026-01-30", "2026-02-02", PartitionType::Date, "d")
            .expect("valid");
        let days: Vec<String> = range
            .dates()
            .expect("dates")
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(
            days,
            ["2026-01-30", "2026-01-31", "2026-02-01", "2026-02-02"]
        );
        let err = PartitionRange::parse("2026-02-02", "2026-01-30", PartitionType::Date, "d")
            .expect_err("reversed");
        assert_eq!(err.exit_code(), 2);
        let err = PartitionRange::parse("yesterday", "2026-01-30", PartitionType::Date, "d")
            .expect_err("not a date");
        assert!(
            err.to_string().contains("`--from yesterday` is not a date"),
            "{err}"
        );
    }

    #[test]
    fn date_days_roundtrip() {
        let date = NaiveDate::from_ymd_opt(2026, 1, 31).expect("date");
        assert_eq!(days_to_date(date_to_days(date)), Some(date));
        assert_eq!(
            date_to_days(NaiveDate::from_ymd_opt(1969, 12, 31).expect("date")),
            -1
        );
    }

    #[test]
    fn hive_directory_encodes_special_characters() {
        assert_eq!(hive_directory("d", "2026-01-31"), "d=2026-01-31");
        assert_eq!(hive_directory("c", "a/b=c"), "c=a%2Fb%3Dc");
    }
}
