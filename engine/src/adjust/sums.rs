//! The sums the proof of an adjustments run compares ([`super::proof`]), of one side's rows at a
//! time: per partition the rows and the exact sum of their check hashes, and per partition and
//! bucket of groups each measure's sum as stored.
//!
//! Summed in Rust rather than by a query, so that they can be taken from rows already streaming
//! for another reason: the multiset difference that finds the adjustments reads the old net rows
//! and the new rows whole, and sums them on the way ([`Summer::watch`]); validation then reads
//! only the sides no pass of staging read. Every side is summed by this one implementation, so
//! sums taken in staging and in validation add up exactly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use deltalake::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use deltalake::arrow::compute::cast;
use deltalake::arrow::compute::kernels::numeric::neg_wrapping;
use deltalake::arrow::compute::kernels::zip::zip;
use deltalake::arrow::datatypes::{DataType, Decimal128Type, FieldRef, Float64Type, Schema};
use deltalake::datafusion::error::{DataFusionError, Result as DfResult};
use futures::StreamExt as _;

use lakefill_table::adjustments::{KIND_COLUMN, REVERSAL};
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::rowhash::{check_value_hashes, combine_rows};

/// A partition's values as text (NULL as `None`).
pub(crate) type PartitionValues = Vec<Option<String>>;

/// How a measure is summed in the balance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Summed {
    /// Exactly, as a decimal of this scale (integers 0).
    Exact(i8),
    /// As a double, with the sum of absolute values for the tolerance.
    Float,
}

/// A bucket's sums of one measure.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub(crate) struct Balance {
    pub(crate) exact: i128,
    pub(crate) float: f64,
    pub(crate) absolute: f64,
}

/// Per partition, each bucket's [`Balance`] of each measure: bucket `b`'s sums of the measures
/// at `b * measures .. (b + 1) * measures`.
pub(crate) type Balances = BTreeMap<PartitionValues, Vec<Balance>>;

/// Adds `from` into `into`, the sums of the same buckets; `sign` weighs the sums (not the sums
/// of absolute values).
pub(crate) fn add_balances(into: &mut Vec<Balance>, from: &[Balance], sign: i8) {
    if into.len() < from.len() {
        into.resize(from.len(), Balance::default());
    }
    for (into, from) in into.iter_mut().zip(from) {
        into.exact += i128::from(sign) * from.exact;
        into.float += f64::from(sign) * from.float;
        into.absolute += from.absolute;
    }
}

/// One side's sums, unweighted: what [`Summer::add`] added up.
#[derive(Default, Clone, Debug, PartialEq)]
pub(crate) struct SideSums {
    /// Per partition: the rows and the exact sum of their check hashes (of the adjustments'
    /// rows, a reversal's counted against: -1 and its hash negated).
    pub(crate) proof: BTreeMap<PartitionValues, (i64, i128)>,
    /// Per partition and bucket: each measure as stored (a reversal's negated).
    pub(crate) balance: Balances,
    /// How many measures each bucket sums.
    pub(crate) width: usize,
}

/// A measure's column of a batch, as the balance sums it.
enum Stored<'a> {
    /// The batch lacks it (NULL).
    Absent,
    Exact(&'a deltalake::arrow::array::Decimal128Array),
    Float(&'a deltalake::arrow::array::Float64Array),
}

/// Sums the rows of one side of the proof into [`SideSums`].
#[derive(Clone, Debug)]
pub(crate) struct Summer {
    /// Every column that makes a row (the staged files' columns but the lineage), in order and
    /// in the staged files' types.
    values: Vec<FieldRef>,
    /// The positions in `values` of the partition columns.
    partitions: Vec<usize>,
    /// The positions in `values` of the columns that make a group (all but the measures).
    grouped: Vec<usize>,
    /// The measures' names and how each is summed.
    measures: Vec<(String, Summed)>,
    buckets: u64,
    /// The side is the adjustments: a reversal is an old row taken back, its measures negated.
    kinds: bool,
    /// The side is in the proof (else only in the balance: its rows' hashes are not taken).
    proof: bool,
}

impl Summer {
    /// A summer of rows of the staged files' `schema`, grouped into `buckets` buckets per
    /// partition; `kinds` for the adjustments' rows.
    pub(crate) fn new(
        schema: &Schema,
        partition_columns: &[String],
        measures: &[String],
        buckets: u64,
        kinds: bool,
    ) -> Result<Self> {
        let values: Vec<FieldRef> = schema
            .fields()
            .iter()
            .filter(|f| !lakefill_table::adjustments::is_lineage(f.name()))
            .cloned()
            .collect();
        let position = |name: &String| {
            values
                .iter()
                .position(|f| f.name() == name)
                .ok_or_else(|| Error::Internal(format!("the staged files have no column `{name}`")))
        };
        let partitions = partition_columns
            .iter()
            .map(position)
            .collect::<Result<_>>()?;
        let grouped = (0..values.len())
            .filter(|i| !measures.contains(values[*i].name()))
            .collect();
        let measures = measures
            .iter()
            .map(|m| {
                let how = match schema.field_with_name(m).map(|f| f.data_type()) {
                    Ok(DataType::Decimal128(_, scale)) => Summed::Exact((*scale).max(0)),
                    Ok(t) if t.is_integer() => Summed::Exact(0),
                    _ => Summed::Float,
                };
                (m.clone(), how)
            })
            .collect();
        Ok(Self {
            values,
            partitions,
            grouped,
            measures,
            buckets: buckets.max(1),
            kinds,
            proof: true,
        })
    }

    /// The same summer, of the adjustments' rows (`kinds`) or of plain rows.
    pub(crate) fn for_kinds(&self, kinds: bool) -> Self {
        Self {
            kinds,
            ..self.clone()
        }
    }

    /// The same summer, of a side only the balance sums (the stored rows): its rows' hashes,
    /// and the measures' values hashed into them, are not taken, nor its proof's sums.
    pub(crate) fn balance_only(&self) -> Self {
        Self {
            proof: false,
            ..self.clone()
        }
    }

    /// How each measure is summed, in order.
    pub(crate) fn summed(&self) -> Vec<Summed> {
        self.measures.iter().map(|(_, how)| *how).collect()
    }

    /// Adds the rows of `batch` (a side's columns by name, in any Arrow flavour; a column of
    /// the row it lacks is NULL) to `sums`.
    pub(crate) fn add(&self, sums: &mut SideSums, batch: &RecordBatch) -> DfResult<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let reversal: Option<BooleanArray> = if self.kinds {
            Some(match batch.column_by_name(KIND_COLUMN) {
                Some(kind) => {
                    let kind = cast(kind, &DataType::Utf8)?;
                    let kind = kind.as_string::<i32>();
                    (0..rows)
                        .map(|row| Some(kind.is_valid(row) && kind.value(row) == REVERSAL))
                        .collect()
                }
                None => BooleanArray::from(vec![false; rows]),
            })
        } else {
            None
        };
        // Every value in the staged files' type (those the sums use); a reversal's measures
        // negated back.
        let used = |at: usize| self.proof || self.grouped.contains(&at);
        let values = self
            .values
            .iter()
            .enumerate()
            .map(|(at, field)| {
                if !used(at) {
                    return Ok(None);
                }
                let value = match batch.column_by_name(field.name()) {
                    Some(column) if column.data_type() == field.data_type() => Arc::clone(column),
                    Some(column) => cast(column, field.data_type())?,
                    None => deltalake::arrow::array::new_null_array(field.data_type(), rows),
                };
                match &reversal {
                    Some(reversal)
                        if self.measures.iter().any(|(m, _)| m == field.name())
                            && reversal.true_count() > 0 =>
                    {
                        Ok(Some(zip(reversal, &neg_wrapping(&value)?, &value)?))
                    }
                    _ => Ok(Some(value)),
                }
            })
            .collect::<DfResult<Vec<Option<ArrayRef>>>>()?;
        let hashed = values
            .iter()
            .map(|value| value.as_ref().map(check_value_hashes).transpose())
            .collect::<lakefill_table::error::Result<Vec<_>>>()
            .map_err(|e| DataFusionError::External(e.into()))?;
        let row_hashes = if self.proof {
            combine_rows(
                &hashed
                    .iter()
                    .flatten()
                    .map(Vec::as_slice)
                    .collect::<Vec<_>>(),
                rows,
            )
        } else {
            Vec::new()
        };
        let group_hashes = combine_rows(
            &self
                .grouped
                .iter()
                .filter_map(|i| hashed[*i].as_deref())
                .collect::<Vec<_>>(),
            rows,
        );
        // The measures as stored (a reversal's negated), as the balance sums them.
        let stored = self
            .measures
            .iter()
            .map(|(name, how)| {
                let Some(column) = batch.column_by_name(name) else {
                    return Ok(None);
                };
                let as_type = match how {
                    Summed::Exact(scale) => DataType::Decimal128(38, *scale),
                    Summed::Float => DataType::Float64,
                };
                Ok(Some(cast(column, &as_type)?))
            })
            .collect::<DfResult<Vec<_>>>()?;
        let stored: Vec<Stored<'_>> = stored
            .iter()
            .map(|column| match column {
                None => Stored::Absent,
                Some(c) if c.data_type() == &DataType::Float64 => {
                    Stored::Float(c.as_primitive::<Float64Type>())
                }
                Some(c) => Stored::Exact(c.as_primitive::<Decimal128Type>()),
            })
            .collect();
        let width = stored.len();
        sums.width = width;
        // A run of rows' sums per bucket, dense, and which buckets it touched.
        let mut dense = vec![Balance::default(); self.buckets as usize * width];
        let mut touched: Vec<usize> = Vec::new();
        let mut seen = vec![false; self.buckets as usize];
        // Rows of one partition come together: summed per run of them (found on the values as
        // they are; only each run's first row is written as text), then added.
        let partition_values: Vec<ArrayRef> = self
            .partitions
            .iter()
            .map(|i| {
                values[*i].clone().ok_or_else(|| {
                    DataFusionError::Internal("a partition column is a measure".into())
                })
            })
            .collect::<DfResult<_>>()?;
        let runs = if partition_values.is_empty() {
            std::iter::once(0..rows).collect()
        } else {
            deltalake::arrow::compute::partition(&partition_values)?.ranges()
        };
        for run in runs {
            let mut partition = PartitionValues::with_capacity(partition_values.len());
            for column in &partition_values {
                let text = cast(&column.slice(run.start, 1), &DataType::Utf8)?;
                let text = text.as_string::<i32>();
                partition.push(text.is_valid(0).then(|| text.value(0).to_string()));
            }
            let (mut count, mut hash_sum) = (0i64, 0i128);
            for row in run {
                let reversed = reversal.as_ref().is_some_and(|r| r.value(row));
                let weight: i64 = if reversed { -1 } else { 1 };
                count += weight;
                if self.proof {
                    hash_sum += i128::from(weight) * i128::from(row_hashes[row]);
                }
                if width == 0 {
                    continue;
                }
                let bucket = (group_hashes[row] % self.buckets) as usize;
                if !seen[bucket] {
                    seen[bucket] = true;
                    touched.push(bucket);
                }
                let at = &mut dense[bucket * width..(bucket + 1) * width];
                for (sum, measure) in at.iter_mut().zip(&stored) {
                    match measure {
                        Stored::Float(column) if column.is_valid(row) => {
                            let value = column.value(row);
                            sum.float += value;
                            sum.absolute += value.abs();
                        }
                        Stored::Exact(column) if column.is_valid(row) => {
                            sum.exact =
                                sum.exact.checked_add(column.value(row)).ok_or_else(|| {
                                    DataFusionError::Execution(
                                        "a measure's sum overflows 128 bits".into(),
                                    )
                                })?;
                        }
                        _ => {}
                    }
                }
            }
            if self.proof {
                let proof = sums.proof.entry(partition.clone()).or_default();
                proof.0 += count;
                proof.1 += hash_sum;
            }
            if width == 0 {
                continue;
            }
            let balance = sums
                .balance
                .entry(partition)
                .or_insert_with(|| vec![Balance::default(); dense.len()]);
            for bucket in touched.drain(..) {
                seen[bucket] = false;
                let at = bucket * width..(bucket + 1) * width;
                for (into, from) in balance[at.clone()].iter_mut().zip(&mut dense[at]) {
                    into.exact += from.exact;
                    into.float += from.float;
                    into.absolute += from.absolute;
                    *from = Balance::default();
                }
            }
        }
        Ok(())
    }

    /// Sums every row of the registered view `table`.
    pub(crate) async fn read(
        &self,
        ctx: &deltalake::datafusion::prelude::SessionContext,
        table: &str,
    ) -> Result<SideSums> {
        let context = || "cannot check that the adjustments conserve the new rows".to_string();
        let mut stream = ctx
            .table(table)
            .await
            .query_context(context)?
            .execute_stream()
            .await
            .query_context(context)?;
        let mut sums = SideSums::default();
        while let Some(batch) = stream.next().await {
            let batch = batch.query_context(context)?;
            self.add(&mut sums, &batch).query_context(context)?;
        }
        Ok(sums)
    }

    /// A sink for rows that stream for another reason (the multiset difference's passes): each
    /// batch is added to the returned sums.
    pub(crate) fn watch(self) -> (Arc<Mutex<SideSums>>, lakefill_validate::multiset::Watch) {
        let sums = Arc::new(Mutex::new(SideSums::default()));
        let into = Arc::clone(&sums);
        let watch = Box::new(move |batch: &RecordBatch, _: &[Vec<u64>]| {
            let mut sums = into.lock().expect("the sums are never poisoned");
            self.add(&mut sums, batch)
        });
        (sums, watch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int32Array, Int64Array, StringViewArray};
    use deltalake::arrow::datatypes::Field;
    use deltalake::datafusion::datasource::MemTable;
    use deltalake::datafusion::prelude::SessionContext;
    use futures::TryStreamExt as _;
    use lakefill_validate::multiset::Watchers;
    use lakefill_validate::net::{Lineage, adjustment_rows};

    /// The staged files' schema: a partition, a key, a text, a measure, and the lineage.
    fn staged_schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("day", DataType::Utf8, false),
            Field::new("id", DataType::Int64, false),
            Field::new("country", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
            Field::new("_lakefill_run_id", DataType::Utf8, true),
            Field::new("_lakefill_kind", DataType::Utf8, true),
            Field::new("_lakefill_reason", DataType::Utf8, true),
        ]))
    }

    /// A side in other Arrow flavours than the staged files' (text as views, the measure as
    /// 32-bit), rows in partition order.
    fn register(ctx: &SessionContext, name: &str, rows: &[(&str, i64, Option<&str>, i32)]) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("day", DataType::Utf8View, false),
            Field::new("id", DataType::Int64, false),
            Field::new("country", DataType::Utf8View, true),
            Field::new("amount", DataType::Int32, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringViewArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(StringViewArray::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(Int32Array::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch");
        // Two batches, so that a partition's rows span them.
        let (first, second) = (
            batch.slice(0, rows.len() / 2),
            batch.slice(rows.len() / 2, rows.len() - rows.len() / 2),
        );
        let table = MemTable::try_new(schema, vec![vec![first, second]]).expect("table");
        ctx.register_table(name, Arc::new(table)).expect("register");
    }

    /// What the difference's watchers sum of the old and new rows, as they stream in staging,
    /// is what reading each side apart sums; and the adjustments' own sums take the old to the
    /// new.
    #[tokio::test]
    async fn sums_watched_in_the_difference_are_the_sums_of_each_side_read_apart() {
        let ctx = SessionContext::new();
        let old = [
            ("d1", 1, Some("DE"), 10),
            ("d1", 2, Some("FR"), 20),
            ("d1", 2, Some("FR"), 20),
            ("d2", 3, None, 30),
            ("d2", 4, Some("DE"), -5),
        ];
        let new = [
            ("d1", 1, Some("DE"), 10),
            ("d1", 2, Some("FR"), 25),
            ("d1", 2, Some("FR"), 20),
            ("d1", 3, None, 30),
            ("d2", 4, Some("DE"), -5),
            ("d3", 5, Some("US"), 7),
        ];
        register(&ctx, "old", &old);
        register(&ctx, "new", &new);
        let schema = staged_schema();
        let (day, amount) = (["day".to_string()], ["amount".to_string()]);
        let summer = Summer::new(&schema, &day, &amount, 7, false).expect("summer");
        let (previous, watch_old) = summer.clone().watch();
        let (output, watch_new) = summer.clone().watch();
        let adjustments = adjustment_rows(
            &ctx,
            "old",
            "new",
            &schema,
            &amount,
            Lineage {
                run_id: "run",
                reason: None,
            },
            Watchers {
                old: Some(watch_old),
                new: Some(watch_new),
            },
            None,
        )
        .await
        .expect("adjustments");
        let rows: Vec<RecordBatch> = adjustments.rows.try_collect().await.expect("rows");
        let watched = [previous, output].map(|s| s.lock().expect("sums").clone());
        let read = [
            summer.read(&ctx, "old").await.expect("old"),
            summer.read(&ctx, "new").await.expect("new"),
        ];
        assert_eq!(watched, read);
        assert_eq!(read[0].proof.values().map(|p| p.0).sum::<i64>(), 5);
        assert_eq!(read[1].proof.len(), 3, "{:?}", read[1].proof);
        // The old rows, less the reversals, plus the corrections: the new rows' sums exactly.
        let mut applied = SideSums::default();
        let kinds = summer.for_kinds(true);
        for batch in &rows {
            kinds.add(&mut applied, batch).expect("adjustments' sums");
        }
        let mut left = read[0].clone();
        for (partition, (count, hash)) in &applied.proof {
            let entry = left.proof.entry(partition.clone()).or_default();
            entry.0 += count;
            entry.1 += hash;
        }
        left.proof.retain(|_, sums| *sums != (0, 0));
        assert_eq!(left.proof, read[1].proof);
        // The proof would see a difference: the two sides' sums are not alike.
        assert_ne!(read[0], read[1]);
        // A side only the balance sums: the same balance, no proof's sums.
        let balanced = summer.balance_only().read(&ctx, "old").await.expect("old");
        assert_eq!(balanced.balance, read[0].balance);
        assert!(balanced.proof.is_empty() && !read[0].proof.is_empty());
    }
}
