//! What a comparison of old and new rows is asked (the partitions, the key, the measures, what
//! is known of each side without a scan) and what it answers (per partition and in total, with
//! samples): the vocabulary of [`super::compare`](mod@super::compare), the row diff and the key merge.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::arrow::array::RecordBatch;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rows::text_column;
use lakefill_table::partition::{Layout, NULL_LABEL, PartitionValues, TimeEncoding, label_of};
use lakefill_table::rowhash::RowChecksum;

/// How rows are grouped into the partitions reports name.
#[derive(Debug, Clone)]
pub enum PartitionKey {
    /// By the period of the layout's time column (its label, or `(null)`).
    Time(Layout),
    /// By the raw values of one column, for tables whose time lakefill cannot tell.
    Column(String),
}

impl PartitionKey {
    /// The columns the key reads.
    pub fn columns(&self) -> Vec<String> {
        match self {
            PartitionKey::Time(layout) => layout
                .time
                .encoding
                .columns()
                .into_iter()
                .map(str::to_string)
                .collect(),
            PartitionKey::Column(column) => vec![column.clone()],
        }
    }

    /// `CAST(<column> AS VARCHAR) AS __lf_t<i>` for each key column, reading `qualify(column)`.
    /// By rows, a date or timestamp is cut to its period first, so rows group by period.
    pub fn select(&self, qualify: impl Fn(&str) -> String) -> Vec<String> {
        self.select_raw(qualify)
            .into_iter()
            .enumerate()
            .map(|(i, raw)| format!("CAST({raw} AS VARCHAR) AS __lf_t{i}"))
            .collect()
    }

    /// The expressions of [`Self::select`] before their cast to text: grouping by these and
    /// casting the groups costs a cast per partition instead of one per row.
    pub fn select_raw(&self, qualify: impl Fn(&str) -> String) -> Vec<String> {
        let truncate = match self {
            PartitionKey::Time(layout) if layout.by_rows => match &layout.time.encoding {
                TimeEncoding::Date { .. } | TimeEncoding::Timestamp { .. } => {
                    Some(layout.time.grain.name())
                }
                _ => None,
            },
            _ => None,
        };
        self.columns()
            .iter()
            .map(|c| match truncate {
                Some(grain) => format!("date_trunc('{grain}', {})", qualify(c)),
                None => qualify(c),
            })
            .collect()
    }

    /// ` GROUP BY 1, …, n` over the key's `n` columns, or nothing when it has none (a table with no
    /// time column is one partition).
    pub fn group_by(&self) -> String {
        let keys = self.columns().len();
        if keys == 0 {
            return String::new();
        }
        let positions: Vec<String> = (1..=keys).map(|i| i.to_string()).collect();
        format!(" GROUP BY {}", positions.join(", "))
    }

    /// The partition label of a row, from the text values of the key columns.
    pub fn label(&self, texts: &[Option<String>]) -> String {
        match self {
            PartitionKey::Time(layout) => {
                let values: PartitionValues = self
                    .columns()
                    .into_iter()
                    .zip(texts.iter().cloned())
                    .collect();
                label_of(layout, &values)
            }
            PartitionKey::Column(_) => texts
                .first()
                .cloned()
                .flatten()
                .unwrap_or_else(|| NULL_LABEL.to_string()),
        }
    }

    /// The labels of every row of `batch`, whose key columns start at `first`.
    pub fn labels(&self, batch: &RecordBatch, first: usize) -> Vec<String> {
        let columns: Vec<Vec<Option<String>>> = (0..self.columns().len())
            .map(|i| text_column(batch, first + i))
            .collect();
        (0..batch.num_rows())
            .map(|row| {
                let texts: Vec<Option<String>> = columns.iter().map(|c| c[row].clone()).collect();
                self.label(&texts)
            })
            .collect()
    }
}

/// What to compare: the partitions, the row identity and the summed measures.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    /// How partitions are labelled on both sides.
    pub partitions: PartitionKey,
    /// The row identity (empty: rows are compared as wholes).
    pub key: Vec<String>,
    /// The measures summed per partition.
    pub measures: Vec<String>,
    /// How many differences to sample.
    pub sample: usize,
    /// The columns whose values make a row (every column but the partition columns, in the
    /// table's order): when set, both sides are checksummed to tell whether they are identical.
    pub checksum_columns: Option<Vec<String>>,
    /// The keys of the partitions around the range, which the key merge looks up for every key
    /// it finds added or removed (see [`super::edges`]).
    pub edges: Option<Arc<super::edges::EdgeProbe>>,
    /// Where the key merge records how each changed key changed, for the change data feed
    /// ([`super::keymerge::KeyChanges`]).
    pub changes: Option<Arc<super::keymerge::KeyChanges>>,
}

/// Old versus new, per partition and in total.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Comparison {
    /// Columns identifying a row; empty when the row-level diff was skipped.
    pub key: Vec<String>,
    /// Per partition, in order.
    pub partitions: Vec<PartitionComparison>,
    /// Sums over all partitions.
    pub totals: ComparisonTotals,
    /// Partitions that have rows only in the new data.
    pub appeared: Vec<String>,
    /// Partitions that have rows only in the old data.
    pub disappeared: Vec<String>,
    /// Example rows of each kind of difference.
    pub samples: Samples,
    /// Whether both sides hold the same rows, row for row (by checksums of every row); `None`
    /// when not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identical: Option<bool>,
    /// Partitions whose old rows were not read: the checksums an earlier lakefill run wrote
    /// into their files' `add` actions equal the new rows' (see [`lakefill_table::rowhash::FileDigest`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub old_unread: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One partition, old versus new.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PartitionComparison {
    /// Partition value.
    pub value: String,
    /// Rows before.
    pub old_rows: u64,
    /// Rows after.
    pub new_rows: u64,
    /// Sum of each measure, before and after.
    pub measures: BTreeMap<String, MeasureChange>,
    /// Keys only in the new rows.
    pub added: u64,
    /// Keys only in the old rows.
    pub removed: u64,
    /// Keys in both with different values.
    pub changed: u64,
}

/// A measure's sum before and after.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct MeasureChange {
    /// Sum before.
    pub old: f64,
    /// Sum after.
    pub new: f64,
}

/// Sums over all partitions.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ComparisonTotals {
    /// Rows before.
    pub old_rows: u64,
    /// Rows after.
    pub new_rows: u64,
    /// Sum of each measure, before and after.
    pub measures: BTreeMap<String, MeasureChange>,
    /// Keys only in the new rows.
    pub added: u64,
    /// Keys only in the old rows.
    pub removed: u64,
    /// Keys in both with different values.
    pub changed: u64,
}

/// Example rows of each kind of difference.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Samples {
    /// New rows whose key did not exist.
    pub added: Vec<Value>,
    /// Old rows whose key is gone.
    pub removed: Vec<Value>,
    /// Rows whose values changed: key, then old and new values of the changed columns.
    pub changed: Vec<Value>,
}

/// Every old partition by the log, with its checksum when each of its files carries one.
pub type LoggedChecksums = BTreeMap<String, Option<RowChecksum>>;
