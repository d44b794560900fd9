//! The proof of an adjustments run, before it publishes: the old net rows plus the adjustments
//! are the new rows, per partition and key; and the table's rows as stored plus the adjustments
//! sum to the new rows, which checks the net rows the proof starts from.

use std::collections::BTreeMap;

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{Decimal128Type, Schema};
use deltalake::datafusion::prelude::SessionContext;
use serde_json::json;

use lakefill_table::adjustments::{KIND_COLUMN, REVERSAL};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::sqltext::ident;

use super::sums::{Balance, Balances, PartitionValues, SideSums, Summed, Summer, add_balances};
use lakefill_validate::CheckResult;

/// The name of the check that proves the adjustments.
const CONSERVE: &str = "adjustments conserve";

/// The name of the check that balances the table's stored rows against the new rows.
const BALANCE: &str = "ledger balances";

/// The most buckets of groups per partition in the balance: a wrong net row shows in its bucket;
/// two wrong ones hide each other only when they share a bucket and their differences cancel.
const MAX_BUCKETS: u64 = 1021;

/// The fewest buckets per partition, however long the range.
const MIN_BUCKETS: u64 = 7;

/// The buckets of a whole range, which the balance's sums are held for (about 100 bytes each):
/// a range of more than 256 partitions gets fewer buckets per partition.
const BUCKET_BUDGET: u64 = 262_144;

/// The buckets per partition of a range of `partitions` partitions.
pub(crate) fn buckets(partitions: usize) -> u64 {
    (BUCKET_BUDGET / (partitions.max(1) as u64)).clamp(MIN_BUCKETS, MAX_BUCKETS)
}

/// What the proof and the balance compare, besides the registered views.
pub(crate) struct Compared<'a> {
    /// The staged files' schema.
    pub(crate) schema: &'a Schema,
    pub(crate) partition_columns: &'a [String],
    pub(crate) key: &'a [String],
    pub(crate) measures: &'a [String],
    /// The old net rows are the stored rows as they are (see [`sides`]).
    pub(crate) previous_is_stored: bool,
    /// How many partitions the range has (the balance's buckets per partition follow,
    /// [`buckets`]).
    pub(crate) partitions: usize,
}

/// Proves the adjustments and balances the table's stored rows; returns the two checks, the
/// proof ([`CONSERVE`]) then the balance ([`BALANCE`]). `previous` (the old net rows),
/// `__lf_ledger` (the table's rows as stored in the range at the read version, with the
/// companion's; not read when `previous_is_stored`, see [`sides`]), `adjustments` and `output`
/// are registered views; `schema` is the staged files'.
///
/// **The proof**: per partition, the old net rows less the rows the reversals take back (their
/// measures negated again) plus the corrections are the new rows, as multisets of whole rows.
/// Then, per key, the old rows plus the adjustments give the new rows in rows (a reversal counts
/// -1) and in every measure, and the net rows after the publish are the new rows.
///
/// **The balance**: the proof starts from the net rows, as staging did, so it holds whatever
/// they are. The balance reads the stored rows with no grouping and no filter of the groups
/// adjustments touch: per partition, their measures (earlier reversals carry theirs negated)
/// plus the adjustments' are the new rows', summed over each bucket of groups (rows alike but
/// for the measures and the lineage, spread over [`MAX_BUCKETS`] by a hash of their values, fewer
/// on ranges of many partitions, see [`buckets`]). A net
/// row computed wrong (a group left out, or taken for another) makes its adjustments wrong, and
/// its bucket's sums differ. Integers and decimals add up exactly; floats to a relative 1e-9 of
/// the bucket's sum of absolute values.
///
/// Both are summed in one streaming pass over each side ([`super::sums`]): the multisets by the
/// count and the exact sum of a row hash independent of the one the adjustments were found with
/// (the check hash), per partition; the measures per partition and bucket. The old net rows and
/// the new rows are summed by staging when it read them for the difference (`staged`, used when
/// it summed them in as many buckets); the other sides are read here. Only when a partition
/// differs are the sums per key computed (a grouping of every row), to show which keys.
pub(crate) async fn prove(
    ctx: &SessionContext,
    compared: &Compared<'_>,
    sample: usize,
    staged: Option<&StagedSums>,
) -> Result<(CheckResult, CheckResult)> {
    let Compared {
        schema,
        partition_columns,
        key,
        measures,
        previous_is_stored,
        partitions,
    } = *compared;
    let sides = sides(previous_is_stored);
    let summer = Summer::new(
        schema,
        partition_columns,
        measures,
        buckets(partitions),
        false,
    )?;
    let staged = staged.filter(|staged| staged.buckets == buckets(partitions));
    let sums = Sums::read(ctx, &sides, &summer, staged).await?;
    let balance = CheckResult::new(
        BALANCE,
        unbalanced(
            &sums.balance,
            partition_columns,
            measures,
            &sums.summed,
            sample,
        ),
        Vec::new(),
    );
    let differing = differing_partitions(&sums.proof, partition_columns, sample);
    if differing.is_empty() {
        return Ok((CheckResult::new(CONSERVE, Vec::new(), Vec::new()), balance));
    }
    let mut group = partition_columns.to_vec();
    for column in key {
        if !group.contains(column) {
            group.push(column.clone());
        }
    }
    let by_key = conservation_by_key(ctx, schema, &group, measures, sample).await?;
    let proof = if by_key.passed {
        // Every key adds up, yet the rows are not the same: reversals that are not copies of
        // old rows (the net rows after the publish would not be the new rows).
        CheckResult::new(CONSERVE, differing, Vec::new())
    } else {
        by_key
    };
    Ok((proof, balance))
}

/// What one registered view adds to the proof and the balance.
struct Side {
    table: &'static str,
    /// The weight of its rows in the proof (0: not in it).
    proof: i8,
    /// The weight of its measures in the balance (0: not in it).
    balance: i8,
    /// The adjustments: a reversal counts against the proof with its measures negated back (the
    /// old row it takes back).
    kinds: bool,
}

/// Every side of the proof and the balance. Each is read apart (a union of sides would mix the
/// columns' metadata, which a column-mapped table's rows carry on one side only).
/// `previous_is_stored`: the old net rows are the stored rows as they are (a table no adjustment
/// was ever appended to), so one pass over them serves both.
fn sides(previous_is_stored: bool) -> Vec<Side> {
    let mut sides = vec![Side {
        table: "previous",
        proof: 1,
        balance: i8::from(previous_is_stored),
        kinds: false,
    }];
    if !previous_is_stored {
        sides.push(Side {
            table: "__lf_ledger",
            proof: 0,
            balance: 1,
            kinds: false,
        });
    }
    sides.extend([
        Side {
            table: "adjustments",
            proof: 1,
            balance: 1,
            kinds: true,
        },
        Side {
            table: "output",
            proof: -1,
            balance: -1,
            kinds: false,
        },
    ]);
    sides
}

/// The sums of every side, weighted: zero where the proof and the balance hold.
struct Sums {
    summed: Vec<Summed>,
    /// Per partition: rows and the exact sum of row hashes, the old net rows less the rows
    /// reversals take back plus the corrections less the new rows.
    proof: BTreeMap<PartitionValues, (i64, i128)>,
    /// Per partition and bucket: each measure, the stored rows plus the adjustments less the new
    /// rows.
    balance: Balances,
}

impl Sums {
    /// Sums every side of `sides`, the balance's groups in `buckets` buckets per partition: the
    /// sides staging summed (`staged`, when it summed them in as many buckets) as it did, the
    /// others read once each.
    async fn read(
        ctx: &SessionContext,
        sides: &[Side],
        summer: &Summer,
        staged: Option<&StagedSums>,
    ) -> Result<Self> {
        let mut sums = Sums {
            summed: summer.summed(),
            proof: BTreeMap::new(),
            balance: Balances::new(),
        };
        let mut read = Vec::new();
        for side in sides {
            let kept = staged.and_then(|staged| match side.table {
                "previous" => Some(&staged.previous),
                "output" => Some(&staged.output),
                "__lf_ledger" => staged.ledger.as_ref(),
                "adjustments" => staged.adjustments.as_ref(),
                _ => None,
            });
            match kept {
                Some(kept) => sums.absorb(side, kept),
                None => {
                    tracing::debug!(
                        table = side.table,
                        "summing a side of the adjustments' proof"
                    );
                    let summer = match side.proof {
                        0 => summer.balance_only(),
                        _ => summer.for_kinds(side.kinds),
                    };
                    let summed = summer.read(ctx, side.table).await?;
                    sums.absorb(side, &summed);
                    read.push(side.table);
                }
            }
        }
        tracing::debug!(
            read_previous = read.contains(&"previous"),
            read_ledger = read.contains(&"__lf_ledger"),
            read_adjustments = read.contains(&"adjustments"),
            read_output = read.contains(&"output"),
            "summed the proof's sides"
        );
        Ok(sums)
    }

    /// Adds one side's sums with its weights.
    fn absorb(&mut self, side: &Side, sums: &SideSums) {
        if side.proof != 0 {
            let weight = i64::from(side.proof);
            for (partition, (rows, hashes)) in &sums.proof {
                let entry = self.proof.entry(partition.clone()).or_default();
                entry.0 += weight * rows;
                entry.1 += i128::from(weight) * hashes;
            }
        }
        if side.balance != 0 {
            for (partition, buckets) in &sums.balance {
                let entry = self.balance.entry(partition.clone()).or_default();
                add_balances(entry, buckets, side.balance);
            }
        }
    }
}

/// The sums of the old net rows and of the new rows that staging took while the multiset
/// difference read them (see [`super::sums`]), over every batch.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct StagedSums {
    /// How many buckets per partition they were summed in.
    pub(crate) buckets: u64,
    pub(crate) previous: SideSums,
    pub(crate) output: SideSums,
    /// The stored rows (`__lf_ledger`), when staging's scans saw every one.
    pub(crate) ledger: Option<SideSums>,
    /// The adjustments, as they went to their writers.
    pub(crate) adjustments: Option<SideSums>,
}

impl StagedSums {
    /// Adds the sums of another batch (of other partitions, in as many buckets).
    /// A side is summed only when every batch summed it.
    pub(crate) fn merge(&mut self, other: StagedSums) {
        let add = |mine: &mut SideSums, theirs: SideSums| {
            for (partition, (rows, hashes)) in theirs.proof {
                let entry = mine.proof.entry(partition).or_default();
                entry.0 += rows;
                entry.1 += hashes;
            }
            for (partition, buckets) in theirs.balance {
                add_balances(mine.balance.entry(partition).or_default(), &buckets, 1);
            }
            mine.width = theirs.width;
        };
        add(&mut self.previous, other.previous);
        add(&mut self.output, other.output);
        for (mine, theirs) in [
            (&mut self.ledger, other.ledger),
            (&mut self.adjustments, other.adjustments),
        ] {
            *mine = match (mine.take(), theirs) {
                (Some(mut mine), Some(theirs)) => {
                    add(&mut mine, theirs);
                    Some(mine)
                }
                _ => None,
            };
        }
    }
}

/// The partitions where the old net rows less the reversed rows plus the corrections are not
/// the new rows (`proof`, of [`Sums`]), at most `sample` of them and a count of the rest.
fn differing_partitions(
    proof: &BTreeMap<PartitionValues, (i64, i128)>,
    partition_columns: &[String],
    sample: usize,
) -> Vec<serde_json::Value> {
    let mut differing = Vec::new();
    let mut more = 0;
    for (values, (rows, sum)) in proof {
        if *rows == 0 && *sum == 0 {
            continue;
        }
        if differing.len() >= sample.max(1) {
            more += 1;
            continue;
        }
        let mut object = serde_json::Map::new();
        for (column, value) in partition_columns.iter().zip(values) {
            object.insert(column.clone(), json!(value));
        }
        object.insert("rows_not_accounted_for".into(), json!(rows));
        object.insert("values_differ".into(), json!(*sum != 0));
        differing.push(serde_json::Value::Object(object));
    }
    if more > 0 {
        differing.push(json!({"more_partitions": more}));
    }
    differing
}

/// The partitions and measures whose buckets do not balance in [`balance_check`]: how many
/// buckets, and the difference over them (the stored rows plus the adjustments, less the new
/// rows); at most `sample` of them, then a count of the rest.
fn unbalanced(
    balance: &Balances,
    partition_columns: &[String],
    measures: &[String],
    summed: &[Summed],
    sample: usize,
) -> Vec<serde_json::Value> {
    // Per partition and measure: the buckets that differ and their difference.
    let mut off: std::collections::BTreeMap<(PartitionValues, usize), (u64, Balance)> =
        std::collections::BTreeMap::new();
    for (values, buckets) in balance {
        for (i, sum, how) in buckets
            .chunks(summed.len().max(1))
            .flat_map(|sums| sums.iter().zip(summed).enumerate())
            .map(|(i, (sum, how))| (i, sum, how))
        {
            let differs = match how {
                Summed::Exact(_) => sum.exact != 0,
                Summed::Float => sum.float.abs() > 1e-9 * sum.absolute.max(1.0),
            };
            if differs {
                let entry = off.entry((values.clone(), i)).or_default();
                entry.0 += 1;
                entry.1.exact += sum.exact;
                entry.1.float += sum.float;
            }
        }
    }
    let mut failures = Vec::new();
    let total = off.len();
    for ((values, i), (buckets, difference)) in off.into_iter().take(sample.max(1)) {
        let mut object = serde_json::Map::new();
        for (column, value) in partition_columns.iter().zip(values) {
            object.insert(column.clone(), json!(value));
        }
        object.insert("measure".into(), json!(measures[i]));
        object.insert("buckets_off".into(), json!(buckets));
        let difference = match summed[i] {
            Summed::Exact(scale) => {
                use deltalake::arrow::datatypes::DecimalType as _;
                Decimal128Type::format_decimal(difference.exact, 38, scale)
            }
            Summed::Float => difference.float.to_string(),
        };
        object.insert("stored_plus_adjustments_less_new".into(), json!(difference));
        failures.push(serde_json::Value::Object(object));
    }
    if total > failures.len() {
        failures.push(json!({"more": total - failures.len()}));
    }
    failures
}

/// The rows of `batches` as JSON objects of their values as text: at most `sample` (at least
/// one), then a count of the rest.
fn sampled(batches: &[RecordBatch], sample: usize) -> Vec<serde_json::Value> {
    let mut failures = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            if failures.len() >= sample.max(1) {
                break;
            }
            let mut object = serde_json::Map::new();
            for (i, field) in batch.schema().fields().iter().enumerate() {
                let value =
                    deltalake::arrow::util::display::array_value_to_string(batch.column(i), row)
                        .unwrap_or_default();
                object.insert(field.name().clone(), json!(value));
            }
            failures.push(serde_json::Value::Object(object));
        }
    }
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    if total > failures.len() {
        failures.push(json!({"more": total - failures.len()}));
    }
    failures
}

/// Per partition and key, the old net rows plus the adjustments against the new rows, in rows
/// (a reversal counts -1) and in every measure (exactly for integers and decimals, to a relative
/// 1e-9 for floats).
async fn conservation_by_key(
    ctx: &SessionContext,
    schema: &Schema,
    group: &[String],
    measures: &[String],
    sample: usize,
) -> Result<CheckResult> {
    let group_list: Vec<String> = group.iter().map(|c| ident(c)).collect();
    let group_list = group_list.join(", ");
    let float = |m: &String| {
        schema
            .field_with_name(m)
            .is_ok_and(|f| f.data_type().is_floating())
    };
    let sums = |table: &str, weight: &str| {
        let mut select = vec![group_list.clone(), format!("SUM({weight}) AS __lf_rows")];
        for (i, m) in measures.iter().enumerate() {
            // Integers and decimals add up exactly as decimals; floats as doubles.
            let as_type = if float(m) {
                "DOUBLE"
            } else {
                "DECIMAL(38, 10)"
            };
            select.push(format!("SUM(CAST({} AS {as_type})) AS __lf_m{i}", ident(m)));
        }
        format!(
            "SELECT {} FROM {table} GROUP BY {group_list}",
            select.join(", ")
        )
    };
    let weight = format!(
        "CASE WHEN {} = '{REVERSAL}' THEN -1 ELSE 1 END",
        ident(KIND_COLUMN)
    );
    let lhs_rows = format!(
        "SELECT {group_list}, 1 AS __lf_w, {} FROM previous UNION ALL SELECT {group_list}, {weight} AS __lf_w, {} FROM adjustments",
        measures
            .iter()
            .map(|m| ident(m))
            .collect::<Vec<_>>()
            .join(", "),
        measures
            .iter()
            .map(|m| ident(m))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let lhs = sums(&format!("({lhs_rows})"), "__lf_w");
    let rhs = sums("output", "1");
    let on: Vec<String> = group
        .iter()
        .map(|c| format!("(l.{0} IS NOT DISTINCT FROM r.{0})", ident(c)))
        .collect();
    let mut differs = vec!["COALESCE(l.__lf_rows, 0) <> COALESCE(r.__lf_rows, 0)".to_string()];
    for (i, m) in measures.iter().enumerate() {
        differs.push(if float(m) {
            format!(
                "abs(COALESCE(l.__lf_m{i}, 0) - COALESCE(r.__lf_m{i}, 0)) > 1e-9 * greatest(abs(COALESCE(l.__lf_m{i}, 0)), abs(COALESCE(r.__lf_m{i}, 0)), 1)"
            )
        } else {
            format!("COALESCE(l.__lf_m{i}, 0) <> COALESCE(r.__lf_m{i}, 0)")
        });
    }
    let shown: Vec<String> = group
        .iter()
        .map(|c| format!("CAST(COALESCE(l.{0}, r.{0}) AS VARCHAR) AS {0}", ident(c)))
        .chain([
            "CAST(COALESCE(l.__lf_rows, 0) AS BIGINT) AS old_plus_adjustment_rows".to_string(),
            "CAST(COALESCE(r.__lf_rows, 0) AS BIGINT) AS new_rows".to_string(),
        ])
        .collect();
    let sql = format!(
        "SELECT {} FROM ({lhs}) l FULL OUTER JOIN ({rhs}) r ON {} WHERE {}",
        shown.join(", "),
        on.join(" AND "),
        differs.join(" OR ")
    );
    tracing::debug!(%sql, "checking that the adjustments conserve the new rows");
    let df = ctx
        .sql(&sql)
        .await
        .query_context(|| "cannot check that the adjustments conserve the new rows".into())?;
    let batches = df
        .collect()
        .await
        .query_context(|| "cannot check that the adjustments conserve the new rows".into())?;
    let mut failures = sampled(&batches, sample);
    if let Some(serde_json::Value::Object(more)) = failures.last_mut()
        && let Some(count) = more.remove("more")
    {
        more.insert("more_keys".into(), count);
    }
    Ok(CheckResult::new(CONSERVE, failures, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{ArrayRef, Int64Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field};
    use deltalake::datafusion::datasource::MemTable;
    use std::sync::Arc;

    /// (day, id, country, amount, kind)
    type Row = (&'static str, i64, &'static str, i64, Option<&'static str>);

    fn schema() -> Arc<Schema> {
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

    fn register(ctx: &SessionContext, name: &str, rows: &[Row]) {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(vec![Some("run"); rows.len()])),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.4).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(vec![None::<&str>; rows.len()])),
        ];
        let batch = RecordBatch::try_new(schema(), columns).expect("batch");
        let table = MemTable::try_new(schema(), vec![vec![batch]]).expect("table");
        ctx.register_table(name, Arc::new(table)).expect("register");
    }

    async fn check(adjustments: &[Row]) -> CheckResult {
        let ctx = SessionContext::new();
        lakefill_table::rowhash::register_hash_functions(&ctx);
        let old: [Row; 3] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 20, None),
            ("d2", 3, "DE", 30, None),
        ];
        // The fix: id 2 is 25, id 3 moves to d1.
        let new: [Row; 3] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 25, None),
            ("d1", 3, "DE", 30, None),
        ];
        register(&ctx, "previous", &old);
        register(&ctx, "__lf_ledger", &old);
        register(&ctx, "output", &new);
        register(&ctx, "adjustments", adjustments);
        // The old net rows are the stored rows here: read apart or in one pass, the same checks;
        // and the same with the old net rows and the new rows summed as staging sums them.
        let (schema, day, id, amount) = (
            schema(),
            ["day".to_string()],
            ["id".to_string()],
            ["amount".to_string()],
        );
        let compared = |previous_is_stored| Compared {
            schema: &schema,
            partition_columns: &day,
            key: &id,
            measures: &amount,
            previous_is_stored,
            partitions: 2,
        };
        let summer = Summer::new(&schema, &day, &amount, buckets(2), false).expect("summer");
        let sides = StagedSums {
            buckets: buckets(2),
            previous: summer.read(&ctx, "previous").await.expect("previous"),
            output: summer.read(&ctx, "output").await.expect("output"),
            ledger: None,
            adjustments: None,
        };
        // Every side summed in staging (the stored rows by its scans, the adjustments as they
        // were written), in two batches merged (a batch that did not sum a side leaves it to
        // validation).
        let mut every = StagedSums {
            ledger: Some(
                summer
                    .balance_only()
                    .read(&ctx, "__lf_ledger")
                    .await
                    .expect("ledger"),
            ),
            adjustments: Some(
                summer
                    .for_kinds(true)
                    .read(&ctx, "adjustments")
                    .await
                    .expect("adjustments"),
            ),
            ..sides.clone()
        };
        every.merge(StagedSums {
            buckets: buckets(2),
            ledger: Some(SideSums::default()),
            adjustments: Some(SideSums::default()),
            ..StagedSums::default()
        });
        let mut partly = every.clone();
        partly.merge(StagedSums {
            buckets: buckets(2),
            adjustments: Some(SideSums::default()),
            ..StagedSums::default()
        });
        assert!(partly.ledger.is_none() && partly.adjustments.is_some());
        // Sums staging took in other buckets are not used.
        let elsewhere = StagedSums {
            buckets: buckets(2) - 1,
            previous: sides.output.clone(),
            output: sides.previous.clone(),
            ledger: sides.previous.clone().into(),
            adjustments: sides.output.clone().into(),
        };
        let mut checked = Vec::new();
        for previous_is_stored in [false, true] {
            for staged in [
                None,
                Some(&sides),
                Some(&every),
                Some(&partly),
                Some(&elsewhere),
            ] {
                checked.push(
                    prove(&ctx, &compared(previous_is_stored), 5, staged)
                        .await
                        .expect("check"),
                );
            }
        }
        let shown = |(proof, balance): &(CheckResult, CheckResult)| {
            format!("{:?} {:?}", proof.failures, balance.failures)
        };
        for other in &checked[1..] {
            assert_eq!(shown(&checked[0]), shown(other));
        }
        checked.remove(0).0
    }

    #[tokio::test]
    async fn the_proof_fails_for_adjustments_that_do_not_take_the_old_rows_to_the_new() {
        let right: [Row; 4] = [
            ("d1", 2, "FR", -20, Some(REVERSAL)),
            ("d1", 2, "FR", 25, Some("correction")),
            ("d2", 3, "DE", -30, Some(REVERSAL)),
            ("d1", 3, "DE", 30, Some("correction")),
        ];
        let passed = check(&right).await;
        assert!(passed.passed, "{:?}", passed.failures);
        // A correction left out: key 3 is missing on d1.
        let missing = check(&right[..3]).await;
        assert!(!missing.passed);
        assert_eq!(missing.failures.len(), 1, "{:?}", missing.failures);
        assert_eq!(missing.failures[0]["id"], "3");
        assert_eq!(missing.failures[0]["old_plus_adjustment_rows"], "0");
        // Every key adds up, but the reversal is of a row that was never there (another
        // country): the net rows after the publish would not be the new rows.
        let mut wrong = right;
        wrong[0].2 = "DE";
        let reported = check(&wrong).await;
        assert!(!reported.passed);
        assert_eq!(
            reported.failures,
            vec![json!({"day": "d1", "rows_not_accounted_for": 0, "values_differ": true})]
        );
        // An appended row without a kind counts too (as a correction nobody asked for).
        let mut unkinded = right.to_vec();
        unkinded.push(("d1", 9, "XX", 1, None));
        let reported = check(&unkinded).await;
        assert!(!reported.passed);
        assert_eq!(reported.failures[0]["id"], "9", "{:?}", reported.failures);
        // A measure not negated: sums differ per key.
        let mut unnegated = right;
        unnegated[0].3 = 20;
        let reported = check(&unnegated).await;
        assert!(!reported.passed);
        assert_eq!(reported.failures[0]["id"], "2");
    }

    /// The balance of `stored` (the table's rows), `adjustments` and the fix of [`check`], with
    /// `previous` (the net rows the adjustments were derived from) proven too: (proof, balance).
    async fn prove_and_balance(
        stored: &[Row],
        previous: &[Row],
        adjustments: &[Row],
    ) -> (CheckResult, CheckResult) {
        let ctx = SessionContext::new();
        lakefill_table::rowhash::register_hash_functions(&ctx);
        let new: [Row; 3] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 25, None),
            ("d1", 3, "DE", 30, None),
        ];
        register(&ctx, "__lf_ledger", stored);
        register(&ctx, "previous", previous);
        register(&ctx, "output", &new);
        register(&ctx, "adjustments", adjustments);
        prove(
            &ctx,
            &Compared {
                schema: &schema(),
                partition_columns: &["day".to_string()],
                key: &["id".to_string()],
                measures: &["amount".to_string()],
                previous_is_stored: false,
                partitions: 2,
            },
            5,
            None,
        )
        .await
        .expect("proof")
    }

    #[tokio::test]
    async fn the_balance_fails_for_adjustments_derived_from_wrong_net_rows_the_proof_passes() {
        // Stored: id 2 was adjusted once already (20 → 22).
        let stored: [Row; 5] = [
            ("d1", 1, "DE", 10, None),
            ("d1", 2, "FR", 20, None),
            ("d1", 2, "FR", -20, Some(REVERSAL)),
            ("d1", 2, "FR", 22, Some("correction")),
            ("d2", 3, "DE", 30, None),
        ];
        let net =
            |id2: Row| -> [Row; 3] { [("d1", 1, "DE", 10, None), id2, ("d2", 3, "DE", 30, None)] };
        // The fix against each net: id 2 becomes 25, id 3 moves to d1.
        let against = |id2: Row| -> [Row; 4] {
            [
                (id2.0, id2.1, id2.2, -id2.3, Some(REVERSAL)),
                ("d1", 2, "FR", 25, Some("correction")),
                ("d2", 3, "DE", -30, Some(REVERSAL)),
                ("d1", 3, "DE", 30, Some("correction")),
            ]
        };
        let right: Row = ("d1", 2, "FR", 22, None);
        let (proof, balance) = prove_and_balance(&stored, &net(right), &against(right)).await;
        assert!(proof.passed, "{:?}", proof.failures);
        assert!(balance.passed, "{:?}", balance.failures);
        // Net rows that miss the earlier adjustment: the proof holds (it starts from them), the
        // stored rows plus the adjustments are 2 more than the fix.
        let stale: Row = ("d1", 2, "FR", 20, None);
        let (proof, balance) = prove_and_balance(&stored, &net(stale), &against(stale)).await;
        assert!(proof.passed, "{:?}", proof.failures);
        assert!(!balance.passed);
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d1", "measure": "amount", "buckets_off": 1, "stored_plus_adjustments_less_new": "2"})
            ]
        );
        // Net rows that take the row for another group (another country): the partition's sum
        // is right, two buckets are not.
        let other: Row = ("d1", 2, "DE", 22, None);
        let (proof, balance) = prove_and_balance(&stored, &net(other), &against(other)).await;
        assert!(proof.passed, "{:?}", proof.failures);
        assert!(!balance.passed);
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d1", "measure": "amount", "buckets_off": 2, "stored_plus_adjustments_less_new": "0"})
            ]
        );
        // A group left out of the net rows: its reversal is missing, d2 keeps 30.
        let (_, balance) = prove_and_balance(
            &stored,
            &net(right),
            &against(right)[..2]
                .iter()
                .chain(&against(right)[3..])
                .copied()
                .collect::<Vec<_>>(),
        )
        .await;
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d2", "measure": "amount", "buckets_off": 1, "stored_plus_adjustments_less_new": "30"})
            ]
        );
    }

    /// A decimal measure is balanced at its scale: a net row off by two of its last places fails
    /// the balance, with the difference at that scale.
    #[tokio::test]
    async fn a_decimal_measure_balances_at_its_scale() {
        use deltalake::arrow::array::Decimal128Array;
        let schema = Arc::new(Schema::new(vec![
            Field::new("day", DataType::Utf8, false),
            Field::new("id", DataType::Int64, false),
            Field::new("fee", DataType::Decimal128(18, 4), true),
            Field::new("_lakefill_kind", DataType::Utf8, true),
        ]));
        // (day, id, fee in ten-thousandths, kind)
        let register = |ctx: &SessionContext,
                        name: &str,
                        rows: &[(&str, i64, i128, Option<&str>)]| {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(
                    Decimal128Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())
                        .with_precision_and_scale(18, 4)
                        .expect("decimal"),
                ),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
            ];
            let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch");
            let table = MemTable::try_new(Arc::clone(&schema), vec![vec![batch]]).expect("table");
            ctx.register_table(name, Arc::new(table)).expect("register");
        };
        let ctx = SessionContext::new();
        lakefill_table::rowhash::register_hash_functions(&ctx);
        // Stored 1.0001; the fix makes it 1.0003; the net rows were taken as 1.0003 already (two
        // ten-thousandths off), so the adjustments reverse and correct 1.0003 and change nothing.
        register(&ctx, "__lf_ledger", &[("d1", 1, 10_001, None)]);
        register(&ctx, "previous", &[("d1", 1, 10_003, None)]);
        register(
            &ctx,
            "adjustments",
            &[
                ("d1", 1, -10_003, Some(REVERSAL)),
                ("d1", 1, 10_003, Some("correction")),
            ],
        );
        register(&ctx, "output", &[("d1", 1, 10_003, None)]);
        let (proof, balance) = prove(
            &ctx,
            &Compared {
                schema: &schema,
                partition_columns: &["day".to_string()],
                key: &["id".to_string()],
                measures: &["fee".to_string()],
                previous_is_stored: false,
                partitions: 1,
            },
            5,
            None,
        )
        .await
        .expect("proof");
        assert!(proof.passed, "{:?}", proof.failures);
        assert_eq!(
            balance.failures,
            vec![
                json!({"day": "d1", "measure": "fee", "buckets_off": 1, "stored_plus_adjustments_less_new": "-0.0002"})
            ]
        );
    }

    #[test]
    fn long_ranges_get_fewer_buckets_per_partition_and_never_too_few() {
        assert_eq!(buckets(0), MAX_BUCKETS);
        assert_eq!(buckets(30), MAX_BUCKETS);
        assert_eq!(buckets(365), 718);
        assert_eq!(buckets(8_760), 29);
        assert_eq!(buckets(100_000), MIN_BUCKETS);
        // What the sums are held for stays near the budget up to 37,449 partitions.
        assert!(
            (1..40_000).all(|p| buckets(p) * p as u64 <= BUCKET_BUDGET.max(MIN_BUCKETS * p as u64))
        );
    }
}
