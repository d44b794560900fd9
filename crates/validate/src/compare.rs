//! Old rows against new, per partition: row counts, measure sums and a row-level diff by key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::datatypes::Int64Type;
use deltalake::datafusion::catalog::TableProvider;
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;

use super::keymerge::{Capture, Decision, KeyFacts, LabelTotals, merge_diff, merge_diff_whole_old};
use super::rowdiff::row_diff;
use super::rows::run;
use super::spec::{
    CompareSpec, Comparison, ComparisonTotals, LoggedChecksums, PartitionComparison, PartitionKey,
    Samples,
};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::partition::{Layout, NULL_LABEL, PartitionRange};
use lakefill_table::rowhash::{PartitionChecksums, RowChecksum, row_hash_sql};
use lakefill_table::sqltext::ident;
use lakefill_table::time::Period;

/// What is known of one side without a scan: rows per partition (from the log or staging) and,
/// when staging computed them, measure sums per partition.
#[derive(Debug, Clone, Default)]
pub struct KnownSide {
    /// Rows per partition label.
    pub rows: BTreeMap<String, u64>,
    /// Measure sums per partition label, by measure.
    pub sums: Option<BTreeMap<String, BTreeMap<String, f64>>>,
    /// Row checksums per partition label.
    pub checksums: Option<PartitionChecksums>,
    /// Most of its partitions are expected to differ from the other side's (a hint, e.g. from
    /// row counts): the key merge then reads the other side whole, once, and aggregates it in
    /// the same pass.
    pub mostly_changed: bool,
    /// Its rows as the key merge reads them, hashed by the writers that staged them (the merge
    /// then does not read this side).
    pub captured: Option<Arc<Capture>>,
}

impl KnownSide {
    /// Row counts only; measures and checksums, if wanted, need a scan.
    pub fn rows(rows: BTreeMap<String, u64>) -> Self {
        Self {
            rows,
            sums: None,
            checksums: None,
            mostly_changed: false,
            captured: None,
        }
    }
}

/// One side's known aggregates, if any.
pub type KnownCounts = Option<KnownSide>;

/// Compares `previous` with `output` in `ctx`.
pub async fn compare(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old_counts: KnownCounts,
    new_counts: KnownCounts,
) -> Result<Comparison> {
    Ok(compare_keyed(ctx, spec, old_counts, new_counts, None, None)
        .await?
        .0)
}

/// [`compare`], and what the row diff saw of the new rows' keys when it could count them in
/// the same pass (`None` when it did not: then the key checks need a query of their own).
/// `logged`: every old partition, as the log knows it (by its files' entries), with its checksum
/// when each of its files carries one; a partition whose logged checksum equals the new rows' is
/// not read on the old side. `old_captured`: the old rows as something that read them whole
/// hashed them ([`Capture::old_side`]): the old side is then not read, when the capture fits.
pub async fn compare_keyed(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old_counts: KnownCounts,
    new_counts: KnownCounts,
    logged: Option<&LoggedChecksums>,
    old_captured: Option<Arc<Capture>>,
) -> Result<(Comparison, Option<KeyFacts>)> {
    if spec.checksum_columns.is_some() {
        lakefill_table::rowhash::register_hash_functions(ctx);
    }
    let mostly_changed = new_counts.as_ref().is_some_and(|c| c.mostly_changed);
    let mut new_counts = new_counts;
    let captured = new_counts.as_mut().and_then(|c| c.captured.take());
    let new = side_aggregates(ctx, "output", spec, new_counts).await?;
    // Partitions whose old rows are known to be the new ones: their old totals are the new
    // totals, and `previous` is narrowed to the other partitions for as long as this compares.
    let settled = settled_partitions(spec, &new, logged);
    let narrowed = match logged {
        Some(logged) if !settled.is_empty() => {
            let others: Vec<&String> = logged
                .keys()
                .chain(new.keys())
                .filter(|label| !settled.contains_key(*label))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            narrow_previous(ctx, spec, &others).await?
        }
        _ => None,
    };
    let settled = match narrowed {
        Some(_) => settled,
        None => SideAggregates::new(),
    };
    // (A captured old side costs nothing to read whole: its totals tell the partitions that
    // differ. It holds every old row, so not once `previous` is narrowed to unsettled ones.)
    let old_captured = old_captured.filter(|_| settled.is_empty());
    let whole_old =
        mostly_changed || old_captured.is_some() || logged_all_differ(&new, &settled, logged);
    let compared = compare_sides(
        ctx,
        spec,
        old_counts,
        new,
        &settled,
        logged,
        whole_old,
        (captured.as_deref(), old_captured.as_deref()),
    )
    .await;
    if let Some(original) = narrowed {
        let _ = ctx.deregister_table("previous");
        ctx.register_table("previous", original)
            .query_context(|| "cannot register the old rows again".into())?;
    }
    let (mut comparison, facts) = compared?;
    comparison.old_unread = settled.len() as u64;
    Ok((comparison, facts))
}

/// The partitions of `new` whose logged old checksum is the new rows' checksum, with their
/// (new, hence old) totals.
fn settled_partitions(
    spec: &CompareSpec,
    new: &SideAggregates,
    logged: Option<&LoggedChecksums>,
) -> SideAggregates {
    let (Some(logged), Some(_), PartitionKey::Time(layout)) =
        (logged, &spec.checksum_columns, &spec.partitions)
    else {
        return SideAggregates::new();
    };
    if layout.by_rows {
        return SideAggregates::new();
    }
    new.iter()
        .filter(|(label, totals)| {
            totals.rows > 0
                && totals.checksum.is_some()
                && logged.get(*label).copied().flatten() == totals.checksum
        })
        .map(|(label, totals)| (label.clone(), totals.clone()))
        .collect()
}

/// Whether the log shows that every old partition not `settled` differs from its new rows: each
/// has a logged checksum, other than the new rows' (or no new rows). Then every old row not
/// settled is diffed, and one read of the old side serves its totals and the key merge; else the
/// totals are read first to find the partitions that differ (a fix that changes few of them).
fn logged_all_differ(
    new: &SideAggregates,
    settled: &SideAggregates,
    logged: Option<&LoggedChecksums>,
) -> bool {
    let Some(logged) = logged else {
        return false;
    };
    !logged.is_empty()
        && logged
            .iter()
            .filter(|(label, _)| !settled.contains_key(*label))
            .all(|(label, checksum)| match (checksum, new.get(label)) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(old), Some(totals)) => totals.checksum.is_some_and(|new| new != *old),
            })
}

/// Narrows `previous` to the partitions `labels` (a predicate on the partition columns, so the
/// scan reads only their files); returns what it was, to be put back, or `None` (and leaves it)
/// when they cannot be selected by a short predicate.
async fn narrow_previous(
    ctx: &SessionContext,
    spec: &CompareSpec,
    labels: &[&String],
) -> Result<Option<Arc<dyn TableProvider>>> {
    let PartitionKey::Time(layout) = &spec.partitions else {
        return Ok(None);
    };
    let schema = previous_schema(ctx).await?;
    let predicate = if labels.is_empty() {
        deltalake::datafusion::prelude::lit(false)
    } else {
        match periods_predicate(layout, labels, &schema)? {
            Some(predicate) => predicate,
            None => return Ok(None),
        }
    };
    let rest = ctx
        .table("previous")
        .await
        .and_then(|df| df.filter(predicate))
        .query_context(|| "cannot leave out the partitions known to be unchanged".into())?;
    let original = ctx
        .deregister_table("previous")
        .query_context(|| "cannot take the old rows back".into())?
        .ok_or_else(|| {
            lakefill_table::error::Error::Internal("table `previous` is not registered".into())
        })?;
    ctx.register_table("previous", rest.into_view())
        .query_context(|| "cannot register the old rows of the other partitions".into())?;
    Ok(Some(original))
}

/// [`compare_keyed`] once `previous` holds the partitions not `settled` (whose old totals are
/// the new ones).
#[allow(clippy::too_many_arguments)]
async fn compare_sides(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old_counts: KnownCounts,
    new: SideAggregates,
    settled: &SideAggregates,
    logged: Option<&LoggedChecksums>,
    whole_old: bool,
    (captured, old_captured): (Option<&Capture>, Option<&Capture>),
) -> Result<(Comparison, Option<KeyFacts>)> {
    let started = std::time::Instant::now();
    let with_settled = |mut old: SideAggregates| {
        old.extend(settled.iter().map(|(l, t)| (l.clone(), t.clone())));
        old
    };
    // Most partitions differ (or all that are read): one read of the old side serves its totals
    // and the key merge.
    let fused = match (&spec.partitions, &spec.checksum_columns) {
        (PartitionKey::Time(layout), Some(columns))
            if whole_old && old_counts.is_none() && !spec.key.is_empty() && !layout.by_rows =>
        {
            let schema = previous_schema(ctx).await?;
            let expected_rows = 2 * new.values().map(|t| t.rows).sum::<u64>();
            merge_diff_whole_old(
                ctx,
                spec,
                "previous",
                "output",
                columns,
                logged,
                expected_rows,
                (captured, old_captured),
                |totals| {
                    let old = with_settled(side_from_totals(spec, totals));
                    match differing_partitions(spec, &old, &new, &schema)? {
                        _ if identical_sides(&old, &new) => Ok(Decision::Identical),
                        differing => Ok(Decision::Diff(differing)),
                    }
                },
            )
            .await?
        }
        _ => None,
    };
    let (old, fused_diff) = match fused {
        Some((totals, diff)) => (with_settled(side_from_totals(spec, &totals)), Some(diff)),
        None => (
            with_settled(side_aggregates(ctx, "previous", spec, old_counts).await?),
            None,
        ),
    };
    tracing::debug!(
        fused = fused_diff.is_some(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "aggregated old and new rows"
    );
    let identical = spec
        .checksum_columns
        .as_ref()
        .map(|_| identical_sides(&old, &new));
    let mut partitions = by_partition(&old, &new);

    let mut samples = Samples::default();
    let mut facts = None;
    // Identical sides have no row differences: the join would only confirm it.
    if !spec.key.is_empty() && identical != Some(true) {
        let started = std::time::Instant::now();
        let (differing, labels) = match differing_predicate(ctx, spec, &old, &new).await? {
            Some((predicate, labels)) => (Some(predicate), Some(labels)),
            None => (None, None),
        };
        let expected_rows = old.values().chain(new.values()).map(|t| t.rows).sum();
        let merged = match fused_diff {
            Some(diff) => diff,
            None => {
                if let Some(changes) = &spec.changes {
                    changes.start(labels.clone());
                }
                merge_diff(
                    ctx,
                    spec,
                    "previous",
                    "output",
                    differing.clone(),
                    expected_rows,
                    captured.map(|c| (c, labels.as_ref())),
                )
                .await?
            }
        };
        let diff = match merged {
            Some((diff, key_facts)) => {
                facts = Some(key_facts);
                diff
            }
            None => {
                if let Some(changes) = &spec.changes {
                    changes.give_up();
                }
                let (old_rows, new_rows) = differing_views(ctx, differing).await?;
                row_diff(ctx, spec, &old_rows, &new_rows).await?
            }
        };
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compared rows by key"
        );
        for (value, counts) in diff.counts {
            let entry = partitions
                .entry(value.clone())
                .or_insert_with(|| PartitionComparison {
                    value,
                    ..Default::default()
                });
            entry.added = counts[0];
            entry.removed = counts[1];
            entry.changed = counts[2];
        }
        samples = diff.samples;
    }

    let comparison = comparison_of(spec, partitions.into_values().collect(), samples, identical);
    Ok((comparison, facts))
}

/// Each partition of either side with its rows and measure sums on both.
fn by_partition(
    old: &SideAggregates,
    new: &SideAggregates,
) -> BTreeMap<String, PartitionComparison> {
    let mut partitions: BTreeMap<String, PartitionComparison> = BTreeMap::new();
    for (side_is_new, side) in [(false, old), (true, new)] {
        for (value, totals) in side {
            let entry = partitions
                .entry(value.clone())
                .or_insert_with(|| PartitionComparison {
                    value: value.clone(),
                    ..Default::default()
                });
            if side_is_new {
                entry.new_rows = totals.rows;
            } else {
                entry.old_rows = totals.rows;
            }
            for (measure, sum) in &totals.sums {
                let change = entry.measures.entry(measure.clone()).or_default();
                if side_is_new {
                    change.new = *sum;
                } else {
                    change.old = *sum;
                }
            }
        }
    }
    partitions
}

/// The comparison of `partitions`: their totals, and the partitions that appeared or
/// disappeared.
fn comparison_of(
    spec: &CompareSpec,
    partitions: Vec<PartitionComparison>,
    samples: Samples,
    identical: Option<bool>,
) -> Comparison {
    let mut totals = ComparisonTotals::default();
    for p in &partitions {
        totals.old_rows += p.old_rows;
        totals.new_rows += p.new_rows;
        totals.added += p.added;
        totals.removed += p.removed;
        totals.changed += p.changed;
        for (measure, change) in &p.measures {
            let total = totals.measures.entry(measure.clone()).or_default();
            total.old += change.old;
            total.new += change.new;
        }
    }
    let appeared = partitions
        .iter()
        .filter(|p| p.old_rows == 0 && p.new_rows > 0)
        .map(|p| p.value.clone())
        .collect();
    let disappeared = partitions
        .iter()
        .filter(|p| p.old_rows > 0 && p.new_rows == 0)
        .map(|p| p.value.clone())
        .collect();
    Comparison {
        key: spec.key.clone(),
        partitions,
        totals,
        appeared,
        disappeared,
        samples,
        identical,
        old_unread: 0,
    }
}

/// What one side holds in one partition.
#[derive(Debug, Clone, Default)]
struct SideTotals {
    rows: u64,
    sums: BTreeMap<String, f64>,
    checksum: Option<RowChecksum>,
}

/// The rows the row diff needs to look at: only the partitions whose checksums differ (a
/// partition whose rows are the same on both sides has no row that differs), as a predicate
/// with their labels; `None` for the whole sides, when every partition differs or no checksums
/// were taken.
async fn differing_predicate(
    ctx: &SessionContext,
    spec: &CompareSpec,
    old: &SideAggregates,
    new: &SideAggregates,
) -> Result<Option<(Expr, BTreeSet<String>)>> {
    if !matches!(spec.partitions, PartitionKey::Time(_)) || spec.checksum_columns.is_none() {
        return Ok(None);
    }
    let schema = previous_schema(ctx).await?;
    differing_partitions(spec, old, new, &schema)
}

/// The Arrow schema of `previous`.
async fn previous_schema(ctx: &SessionContext) -> Result<deltalake::arrow::datatypes::Schema> {
    Ok(ctx
        .table("previous")
        .await
        .query_context(|| "table `previous` is not registered".into())?
        .schema()
        .as_arrow()
        .clone())
}

/// Whether every partition's checksum is the same on both sides.
fn identical_sides(old: &SideAggregates, new: &SideAggregates) -> bool {
    let checksum = |side: &SideAggregates, p: &String| {
        side.get(p)
            .and_then(|totals| totals.checksum)
            .unwrap_or_default()
    };
    old.keys()
        .chain(new.keys())
        .all(|p| checksum(old, p) == checksum(new, p))
}

/// [`differing_predicate`] over `schema` (the old side's), with the labels it selects.
fn differing_partitions(
    spec: &CompareSpec,
    old: &SideAggregates,
    new: &SideAggregates,
    schema: &deltalake::arrow::datatypes::Schema,
) -> Result<Option<(Expr, BTreeSet<String>)>> {
    let PartitionKey::Time(layout) = &spec.partitions else {
        return Ok(None);
    };
    if spec.checksum_columns.is_none() {
        return Ok(None);
    }
    let checksum = |side: &SideAggregates, p: &String| side.get(p).and_then(|t| t.checksum);
    let labels: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let differing: Vec<&String> = labels
        .iter()
        .copied()
        .filter(|p| checksum(old, p).unwrap_or_default() != checksum(new, p).unwrap_or_default())
        .collect();
    if differing.len() == labels.len() {
        return Ok(None);
    }
    let selected = differing.iter().map(|l| (*l).clone()).collect();
    Ok(periods_predicate(layout, &differing, schema)?.map(|p| (p, selected)))
}

/// One side's aggregates from the key merge's totals per label.
fn side_from_totals(spec: &CompareSpec, totals: &BTreeMap<String, LabelTotals>) -> SideAggregates {
    totals
        .iter()
        .map(|(label, t)| {
            let sums = spec
                .measures
                .iter()
                .zip(t.sums.iter().chain(std::iter::repeat(&0.0)))
                .map(|(m, v)| (m.clone(), *v))
                .collect();
            (
                label.clone(),
                SideTotals {
                    rows: t.rows,
                    sums,
                    checksum: Some(RowChecksum {
                        rows: t.rows,
                        sum: t.checksum,
                    }),
                },
            )
        })
        .collect()
}

/// The old and new rows of `differing` (or the whole sides: `previous` and `output`), as views
/// registered for the row diff; returns their names.
pub async fn differing_views(
    ctx: &SessionContext,
    differing: Option<Expr>,
) -> Result<(String, String)> {
    let Some(predicate) = differing else {
        return Ok(("previous".to_string(), "output".to_string()));
    };
    let mut names = Vec::new();
    for table in ["previous", "output"] {
        let view = format!("__lf_differing_{table}");
        let rows = ctx
            .table(table)
            .await
            .and_then(|df| df.filter(predicate.clone()))
            .query_context(|| format!("cannot select the differing partitions of `{table}`"))?;
        ctx.register_table(view.as_str(), rows.into_view())
            .query_context(|| "cannot register the differing partitions".into())?;
        names.push(view);
    }
    let new_view = names.pop().unwrap_or_default();
    let old_view = names.pop().unwrap_or_default();
    Ok((old_view, new_view))
}

/// A predicate selecting the rows of the periods `labels` (consecutive periods as one range, the
/// NULL partition by `IS NULL`); `None` when there are too many ranges to be worth it.
pub fn periods_predicate(
    layout: &Layout,
    labels: &[&String],
    schema: &deltalake::arrow::datatypes::Schema,
) -> Result<Option<Expr>> {
    const MAX_RANGES: usize = 256;
    let grain = layout.time.grain;
    let include_null = labels.iter().any(|l| l.as_str() == NULL_LABEL);
    let mut periods: Vec<Period> = Vec::new();
    for label in labels.iter().filter(|l| l.as_str() != NULL_LABEL) {
        match Period::from_label(grain, label) {
            Some(period) => periods.push(period),
            None => return Ok(None),
        }
    }
    periods.sort();
    let mut ranges: Vec<(Period, Period)> = Vec::new();
    for period in periods {
        match ranges.last_mut() {
            Some((_, last)) if last.next().as_ref() == Some(&period) => *last = period,
            _ => ranges.push((period, period)),
        }
    }
    if ranges.len() > MAX_RANGES {
        return Ok(None);
    }
    let mut predicate: Option<Expr> = None;
    for (first, last) in &ranges {
        let range = PartitionRange {
            from: first.label(),
            to: last.label(),
            grain,
            include_null: false,
            rows: None,
        };
        let p = layout.range_predicate(&range, schema)?;
        predicate = Some(match predicate {
            Some(q) => q.or(p),
            None => p,
        });
    }
    if include_null {
        let null = layout
            .time
            .encoding
            .columns()
            .into_iter()
            .map(|c| {
                Expr::Column(deltalake::datafusion::common::Column::new_unqualified(c)).is_null()
            })
            .reduce(Expr::or);
        predicate = match (predicate, null) {
            (Some(p), Some(n)) => Some(p.or(n)),
            (p, n) => p.or(n),
        };
    }
    Ok(predicate)
}

type SideAggregates = BTreeMap<String, SideTotals>;

/// Row counts, measure sums and (when the spec asks) row checksums per partition of one side.
/// Skips the scan when what is known already answers.
async fn side_aggregates(
    ctx: &SessionContext,
    table: &str,
    spec: &CompareSpec,
    known: KnownCounts,
) -> Result<SideAggregates> {
    if let Some(known) = known
        && (spec.measures.is_empty() || known.sums.is_some())
        && (spec.checksum_columns.is_none() || known.checksums.is_some())
    {
        let sums = known.sums.unwrap_or_default();
        let checksums = known.checksums;
        return Ok(known
            .rows
            .into_iter()
            .map(|(p, rows)| {
                let measures = spec
                    .measures
                    .iter()
                    .map(|m| {
                        (
                            m.clone(),
                            sums.get(&p).and_then(|s| s.get(m)).copied().unwrap_or(0.0),
                        )
                    })
                    .collect();
                let checksum = checksums
                    .as_ref()
                    .map(|c| c.get(&p).copied().unwrap_or_default());
                (
                    p,
                    SideTotals {
                        rows,
                        sums: measures,
                        checksum,
                    },
                )
            })
            .collect());
    }
    let keys = spec.partitions.columns().len();
    let mut select: Vec<String> = spec
        .partitions
        .select_raw(ident)
        .into_iter()
        .enumerate()
        .map(|(i, raw)| format!("{raw} AS __lf_t{i}"))
        .collect();
    let mut outer: Vec<String> = (0..keys)
        .map(|i| format!("CAST(__lf_t{i} AS VARCHAR) AS __lf_t{i}"))
        .collect();
    outer.push("__lf_rows".into());
    outer.extend((0..spec.measures.len()).map(|i| format!("__lf_m{i}")));
    if spec.checksum_columns.is_some() {
        outer.push("__lf_hash".into());
    }
    select.push("COUNT(*) AS __lf_rows".to_string());
    for (i, measure) in spec.measures.iter().enumerate() {
        select.push(format!(
            "CAST(SUM({}) AS DOUBLE) AS __lf_m{i}",
            ident(measure)
        ));
    }
    if let Some(columns) = &spec.checksum_columns {
        // The exact sum of 64-bit hashes: DECIMAL(38, 0) holds 2^64 x 2^60 rows.
        let hash = row_hash_sql(columns);
        select.push(format!("SUM(CAST({hash} AS DECIMAL(38, 0))) AS __lf_hash"));
    }
    let group_by = spec.partitions.group_by();
    let sql = format!(
        "SELECT {} FROM (SELECT {} FROM {table}{group_by}) __lf_groups",
        outer.join(", "),
        select.join(", ")
    );
    let mut out = SideAggregates::new();
    let mut stream = run(ctx, &sql, "aggregate rows per partition").await?;
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("cannot aggregate `{table}`"))?;
        let labels = spec.partitions.labels(&batch, 0);
        let rows = batch.column(keys).as_primitive::<Int64Type>();
        let hashes = spec.checksum_columns.as_ref().map(|_| {
            batch
                .column(keys + 1 + spec.measures.len())
                .as_primitive::<deltalake::arrow::datatypes::Decimal128Type>()
        });
        for (row, label) in labels.into_iter().enumerate() {
            // Several groups may name one partition (its sub-partitions): add them up.
            let totals = out.entry(label).or_default();
            for (i, measure) in spec.measures.iter().enumerate() {
                let column = batch
                    .column(keys + 1 + i)
                    .as_primitive::<deltalake::arrow::datatypes::Float64Type>();
                if !column.is_null(row) {
                    *totals.sums.entry(measure.clone()).or_default() += column.value(row);
                } else {
                    totals.sums.entry(measure.clone()).or_default();
                }
            }
            let group_rows = u64::try_from(rows.value(row)).unwrap_or(0);
            totals.rows += group_rows;
            if let Some(column) = hashes {
                totals
                    .checksum
                    .get_or_insert_with(RowChecksum::default)
                    .merge(&RowChecksum {
                        rows: group_rows,
                        sum: u128::try_from(column.value(row)).unwrap_or(0),
                    });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Date32Array, Int64Array, RecordBatch, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::datafusion::datasource::MemTable;
    use lakefill_table::partition::{TimeColumn, TimeEncoding};
    use lakefill_table::time::Grain;
    use std::sync::Arc;

    type Row = (Option<i32>, Option<i64>, Option<&'static str>, Option<i64>);

    fn batch_of(rows: &[Row]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
            Field::new("day", DataType::Date32, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.3))),
                Arc::new(Date32Array::from_iter(rows.iter().map(|r| r.0))),
            ],
        )
        .expect("batch")
    }

    fn table(rows: &[Row]) -> MemTable {
        let batch = batch_of(rows);
        let schema = batch.schema();
        let half = batch.num_rows() / 2;
        let parts = vec![
            vec![batch.slice(0, half)],
            vec![batch.slice(half, batch.num_rows() - half)],
        ];
        MemTable::try_new(schema, parts).expect("memtable")
    }

    /// Old rows over five days and a NULL day; new rows equal on `same` days, and elsewhere
    /// dropped, added, changed, moved to another day, with NULL and repeated keys.
    fn sides(same: &[i32]) -> (Vec<Row>, Vec<Row>) {
        let days = [
            Some(20_000),
            Some(20_001),
            Some(20_002),
            Some(20_003),
            Some(20_004),
            None,
        ];
        let texts = [Some("x"), Some("y"), None];
        let mut old = Vec::new();
        for i in 0..600i64 {
            let id = match i % 40 {
                0 => None,
                1 => Some(7),
                _ => Some(i),
            };
            old.push((
                days[(i % 6) as usize],
                id,
                texts[(i % 3) as usize],
                Some(i * 3 % 17),
            ));
        }
        let mut new = Vec::new();
        for (n, r) in old.iter().enumerate() {
            if r.0.is_some_and(|d| same.contains(&d)) {
                new.push(*r);
                continue;
            }
            match n % 7 {
                0 => {}
                1 => new.push((r.0, r.1, Some("changed"), r.3)),
                2 => new.push((r.0, r.1, r.2, r.3.map(|v| v + 1))),
                3 => new.push((days[(n * 5 % 6) % 5], r.1, r.2, r.3)),
                _ => new.push(*r),
            }
        }
        for i in 600..630i64 {
            let day = days[(i % 5) as usize];
            if day.is_some_and(|d| same.contains(&d)) {
                continue;
            }
            new.push((
                day,
                if i % 11 == 0 { None } else { Some(i) },
                Some("new"),
                Some(i),
            ));
        }
        (old, new)
    }

    fn spec() -> CompareSpec {
        CompareSpec {
            partitions: PartitionKey::Time(Layout {
                partition_columns: vec!["day".into()],
                time: TimeColumn {
                    encoding: TimeEncoding::Date {
                        column: "day".into(),
                    },
                    grain: Grain::Day,
                    grain_reason: String::new(),
                },
                by_rows: false,
            }),
            key: vec!["id".into()],
            measures: vec!["v".into()],
            sample: 4,
            checksum_columns: Some(vec!["id".into(), "s".into(), "v".into()]),
            edges: None,
            changes: None,
        }
    }

    /// A context with `old` as `previous` and `new` as `output`.
    fn context(old: &[Row], new: &[Row]) -> SessionContext {
        let ctx = SessionContext::new();
        ctx.register_table("previous", Arc::new(table(old)))
            .expect("register");
        ctx.register_table("output", Arc::new(table(new)))
            .expect("register");
        ctx
    }

    /// The comparison (as JSON) and key facts of `previous` and `output`, first with the old
    /// side read twice (totals, then the diff), then with most partitions said to differ (read
    /// whole once).
    async fn both_ways(
        ctx: &SessionContext,
        logged: Option<&LoggedChecksums>,
    ) -> Vec<(serde_json::Value, Option<KeyFacts>)> {
        let mut results = Vec::new();
        for mostly_changed in [false, true] {
            let hint = KnownSide {
                mostly_changed,
                ..KnownSide::default()
            };
            let (comparison, facts) = compare_keyed(ctx, &spec(), None, Some(hint), logged, None)
                .await
                .expect("compare");
            results.push((serde_json::to_value(&comparison).expect("json"), facts));
        }
        results
    }

    #[tokio::test]
    async fn reading_the_old_side_whole_once_gives_exactly_the_comparison_of_two_reads() {
        for same in [
            vec![],
            vec![20_001, 20_003],
            vec![20_000, 20_001, 20_002, 20_003, 20_004],
        ] {
            let (old, new) = sides(&same);
            let ctx = context(&old, &new);
            let results = both_ways(&ctx, None).await;
            assert_eq!(results[0], results[1], "same days {same:?}");
            let totals = &results[0].0["totals"];
            assert_eq!(totals["old_rows"], old.len() as u64);
            assert_eq!(totals["new_rows"], new.len() as u64);
            // The whole-old read did run (the key is hashable).
            let whole = merge_diff_whole_old(
                &ctx,
                &spec(),
                "previous",
                "output",
                &["id".into(), "s".into(), "v".into()],
                None,
                0,
                (None, None),
                |_| Ok(Decision::Diff(None)),
            )
            .await
            .expect("merge");
            let (totals, diff) = whole.expect("hashable");
            assert_eq!(
                totals.values().map(|t| t.rows).sum::<u64>(),
                old.len() as u64
            );
            assert!(diff.is_some());
        }
    }

    #[test]
    fn the_old_side_is_read_whole_once_only_when_the_log_shows_every_partition_read_differs() {
        let checksum = |rows: u64, sum: u128| Some(RowChecksum { rows, sum });
        let totals = |checksum: Option<RowChecksum>| SideTotals {
            rows: checksum.map_or(1, |c| c.rows),
            sums: BTreeMap::new(),
            checksum,
        };
        let new: SideAggregates = [
            ("a".to_string(), totals(checksum(2, 10))),
            ("b".to_string(), totals(checksum(2, 20))),
            ("c".to_string(), totals(checksum(2, 30))),
        ]
        .into();
        let settled: SideAggregates = [("a".to_string(), totals(checksum(2, 10)))].into();
        let none = SideAggregates::new();
        let logged = |entries: &[(&str, Option<RowChecksum>)]| -> LoggedChecksums {
            entries.iter().map(|(l, c)| (l.to_string(), *c)).collect()
        };
        // b and c differ by the log; a is settled (or, if not, equal: read first).
        let differ = logged(&[
            ("a", checksum(2, 10)),
            ("b", checksum(2, 21)),
            ("c", checksum(1, 30)),
        ]);
        assert!(logged_all_differ(&new, &settled, Some(&differ)));
        assert!(!logged_all_differ(&new, &none, Some(&differ)));
        // An old partition the new rows lack differs; one without a logged checksum is unknown.
        let gone = logged(&[("b", checksum(2, 21)), ("d", checksum(3, 1))]);
        assert!(logged_all_differ(&new, &none, Some(&gone)));
        let unknown = logged(&[("b", checksum(2, 21)), ("c", None)]);
        assert!(!logged_all_differ(&new, &none, Some(&unknown)));
        // New rows without a checksum (rounded floats) cannot be told apart.
        let unhashed: SideAggregates = [("b".to_string(), totals(None))].into();
        assert!(!logged_all_differ(
            &unhashed,
            &none,
            Some(&logged(&[("b", checksum(1, 1))]))
        ));
        assert!(!logged_all_differ(
            &new,
            &none,
            Some(&LoggedChecksums::new())
        ));
        assert!(!logged_all_differ(&new, &none, None));
    }

    #[tokio::test]
    async fn the_logs_checksums_stand_in_for_the_old_sides_and_a_partition_it_lacks_is_read_again()
    {
        let columns: Vec<String> = vec!["id".into(), "s".into(), "v".into()];
        for same in [vec![], vec![20_001, 20_003]] {
            let (old, new) = sides(&same);
            let ctx = context(&old, &new);
            // What the log would hold: the old partitions' own checksums, as a scan makes them.
            let (totals, _) = merge_diff_whole_old(
                &ctx,
                &spec(),
                "previous",
                "output",
                &columns,
                None,
                0,
                (None, None),
                |_| Ok(Decision::Identical),
            )
            .await
            .expect("merge")
            .expect("hashable");
            let logged: LoggedChecksums = totals
                .iter()
                .map(|(label, t)| {
                    let checksum = lakefill_table::rowhash::RowChecksum {
                        rows: t.rows,
                        sum: t.checksum,
                    };
                    (label.clone(), Some(checksum))
                })
                .collect();
            let mut lacking = logged.clone();
            lacking.pop_first();
            for (logged, stands_in) in [(&logged, true), (&lacking, false)] {
                let whole = merge_diff_whole_old(
                    &ctx,
                    &spec(),
                    "previous",
                    "output",
                    &columns,
                    Some(logged),
                    0,
                    (None, None),
                    |_| Ok(Decision::Identical),
                )
                .await
                .expect("merge");
                assert_eq!(whole.is_some(), stands_in, "same days {same:?}");
                if let Some((from_log, _)) = whole {
                    assert_eq!(from_log, totals);
                }
                // Whichever way the old side is read, the comparison is the one of two reads.
                let results = both_ways(&ctx, Some(logged)).await;
                assert_eq!(results[0], results[1], "same days {same:?}");
                assert_eq!(results[0].0["totals"]["old_rows"], old.len() as u64);
            }
        }
    }

    /// `previous`'s rows, batch by batch, as a capture of the old side takes them while
    /// something else reads them whole; an attempt that never finishes also sees some of them.
    async fn capture_previous(
        ctx: &SessionContext,
        schema: &Schema,
        memory_rows: usize,
        absent_null: &[String],
        spec: &CompareSpec,
    ) -> Arc<Capture> {
        let disk = Arc::clone(&ctx.runtime_env().disk_manager);
        let capture = Capture::old_side(
            disk,
            schema,
            &spec.key,
            &["day".to_string()],
            spec.sample,
            spec.checksum_columns.as_deref().expect("checksum columns"),
            &spec.measures,
            absent_null,
        )
        .expect("a capture")
        .with_memory_rows(memory_rows);
        let capture = Arc::new(capture);
        let mut read = ctx
            .table("previous")
            .await
            .expect("previous")
            .collect()
            .await
            .expect("rows");
        // Rows of several days in one batch, and batches of all sizes.
        let all =
            deltalake::arrow::compute::concat_batches(&read[0].schema(), &read).expect("concat");
        read = (0..all.num_rows())
            .step_by(97)
            .map(|at| all.slice(at, 97.min(all.num_rows() - at)))
            .collect();
        let without = |batch: &RecordBatch| {
            let keep: Vec<usize> = (0..batch.num_columns())
                .filter(|i| !absent_null.contains(batch.schema().field(*i).name()))
                .collect();
            batch.project(&keep).expect("project")
        };
        let mut failed = capture.writer();
        failed.add_batch(&without(&read[0]), |_| None);
        drop(failed);
        let mut writer = capture.writer();
        for (n, batch) in read.iter().enumerate() {
            let batch = without(batch);
            // Some batches with their columns' value hashes taken (as the difference takes
            // them), the others hashed by the capture.
            let values: Vec<Vec<u64>> = batch
                .columns()
                .iter()
                .map(|c| lakefill_table::rowhash::value_hashes(c).expect("hashes"))
                .collect();
            let schema = batch.schema();
            writer.add_batch(&batch, |name| match n % 2 {
                0 => values.get(schema.index_of(name).ok()?).map(Vec::as_slice),
                _ => None,
            });
        }
        writer.finish(0, ["a".to_string()].into_iter());
        capture
    }

    #[tokio::test]
    async fn an_old_side_hashed_as_it_is_read_elsewhere_gives_exactly_the_comparison_of_reading_it()
    {
        let columns = |note: bool| {
            let mut fields = vec![
                Field::new("id", DataType::Int64, true),
                Field::new("s", DataType::Utf8, true),
                Field::new("v", DataType::Int64, true),
                Field::new("day", DataType::Date32, true),
            ];
            if note {
                fields.insert(3, Field::new("note", DataType::Utf8, true));
            }
            Schema::new(fields)
        };
        for same in [
            vec![],
            vec![20_001, 20_003],
            vec![20_000, 20_001, 20_002, 20_003, 20_004],
        ] {
            for (memory_rows, note) in [(1 << 20, false), (50, false), (1 << 20, true)] {
                let (old, new) = sides(&same);
                let ctx = context(&old, &new);
                let mut spec = spec();
                let absent: Vec<String> = match note {
                    // A column the rows read lack, NULL on both sides (as the lineage columns
                    // of net rows).
                    true => {
                        for side in ["previous", "output"] {
                            let rows = ctx
                                .sql(&format!(
                                    "SELECT id, s, v, CAST(NULL AS VARCHAR) AS note, day FROM {side}"
                                ))
                                .await
                                .expect("view");
                            ctx.deregister_table(side).expect("deregister");
                            ctx.register_table(side, rows.into_view())
                                .expect("register");
                        }
                        spec.checksum_columns =
                            Some(vec!["id".into(), "s".into(), "v".into(), "note".into()]);
                        vec!["note".into()]
                    }
                    false => Vec::new(),
                };
                let hint = || KnownSide {
                    mostly_changed: true,
                    ..KnownSide::default()
                };
                let (read, read_facts) = compare_keyed(&ctx, &spec, None, Some(hint()), None, None)
                    .await
                    .expect("compare");
                let capture =
                    capture_previous(&ctx, &columns(note), memory_rows, &absent, &spec).await;
                let (from_capture, facts) = compare_keyed(
                    &ctx,
                    &spec,
                    None,
                    Some(KnownSide::default()),
                    None,
                    Some(Arc::clone(&capture)),
                )
                .await
                .expect("compare");
                let case = format!("same {same:?}, {memory_rows} rows in memory, note {note}");
                assert!(capture.sealed(), "{case}: the capture was used");
                // The same comparison; samples as many, of partitions with such differences
                // (which ones are chosen depends on the order the rows came in).
                let (mut captured_json, mut read_json) = (
                    serde_json::to_value(&from_capture).expect("json"),
                    serde_json::to_value(&read).expect("json"),
                );
                let (captured_samples, read_samples) =
                    (captured_json["samples"].take(), read_json["samples"].take());
                assert_eq!(captured_json, read_json, "{case}");
                for kind in ["added", "removed", "changed"] {
                    let samples = captured_samples[kind].as_array().expect("samples");
                    assert_eq!(
                        samples.len(),
                        read_samples[kind].as_array().expect("samples").len(),
                        "{case}: {kind}"
                    );
                    for sample in samples {
                        let partition = from_capture
                            .partitions
                            .iter()
                            .find(|p| serde_json::json!(p.value) == sample["partition"])
                            .expect("a sample's partition is compared");
                        let count = match kind {
                            "added" => partition.added,
                            "removed" => partition.removed,
                            _ => partition.changed,
                        };
                        assert!(count > 0, "{case}: {kind} sample {sample}");
                    }
                }
                assert_eq!(facts, read_facts, "{case}");
                assert_eq!(from_capture.totals.old_rows, old.len() as u64, "{case}");
            }
        }
    }

    #[tokio::test]
    async fn an_old_side_hashed_in_other_types_is_not_used_and_the_old_rows_are_read() {
        let (old, new) = sides(&[20_001]);
        let ctx = context(&old, &new);
        // The measure hashed as a 32-bit integer: its values hash apart from the 64-bit ones.
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Int32, true),
            Field::new("day", DataType::Date32, true),
        ]);
        let capture = capture_previous(&ctx, &schema, 1 << 20, &[], &spec()).await;
        let hint = KnownSide {
            mostly_changed: true,
            ..KnownSide::default()
        };
        let (read, _) = compare_keyed(&ctx, &spec(), None, Some(hint), None, None)
            .await
            .expect("compare");
        let (unused, _) = compare_keyed(
            &ctx,
            &spec(),
            None,
            Some(KnownSide::default()),
            None,
            Some(Arc::clone(&capture)),
        )
        .await
        .expect("compare");
        assert!(!capture.sealed());
        assert_eq!(
            serde_json::to_value(&unused).expect("json"),
            serde_json::to_value(&read).expect("json")
        );
    }

    /// The old rows and new rows of a fix by deletion vectors as staging captures them: each
    /// new row that uses up an identical old row of its day (by a multiset match, as staging's)
    /// is flagged as its twin, and the old side's capture holds every old row back and is given
    /// only those no new row used up. `memory_rows`: what each capture keeps in memory.
    fn capture_with_twins(
        ctx: &SessionContext,
        (old, new): (&[Row], &[Row]),
        spec: &CompareSpec,
        memory_rows: usize,
    ) -> (Arc<Capture>, Arc<Capture>) {
        use deltalake::datafusion::common::ScalarValue;
        use std::collections::HashMap;
        let disk = Arc::clone(&ctx.runtime_env().disk_manager);
        let schema = batch_of(old).schema();
        let days = ["day".to_string()];
        let mut left: HashMap<Row, Vec<usize>> = HashMap::new();
        for (i, row) in old.iter().enumerate() {
            left.entry(*row).or_default().push(i);
        }
        let mut used = vec![false; old.len()];
        let twins: Vec<bool> = new
            .iter()
            .map(|row| match left.get_mut(row).and_then(Vec::pop) {
                Some(i) => {
                    used[i] = true;
                    true
                }
                None => false,
            })
            .collect();
        let old_side = Capture::old_side(
            Arc::clone(&disk),
            &schema,
            &spec.key,
            &days,
            spec.sample,
            spec.checksum_columns.as_deref().expect("checksum columns"),
            &spec.measures,
            &[],
        )
        .expect("a capture")
        .with_memory_rows(memory_rows);
        let old_side = Arc::new(old_side);
        let mut writer = old_side.writer();
        let mut held = Vec::new();
        for at in (0..old.len()).step_by(97) {
            let rows = &old[at..old.len().min(at + 97)];
            held.extend(writer.hold_batch(&batch_of(rows), |_| None));
        }
        assert_eq!(held.len(), old.len());
        writer.release(
            held.into_iter()
                .zip(&used)
                .filter(|(_, used)| !**used)
                .filter_map(|(held, _)| held),
        );
        writer.finish(0, ["a".to_string()].into_iter());
        let new_side = Capture::new(disk, &schema, &spec.key, &days, spec.sample)
            .expect("a capture")
            .with_memory_rows(memory_rows);
        let new_side = Arc::new(new_side);
        let mut writer = new_side.writer();
        let mut by_day: BTreeMap<Option<i32>, Vec<usize>> = BTreeMap::new();
        for (i, row) in new.iter().enumerate() {
            by_day.entry(row.0).or_default().push(i);
        }
        for (day, rows) in by_day {
            let part: Vec<Row> = rows.iter().map(|i| new[*i]).collect();
            let flags: Vec<bool> = rows.iter().map(|i| twins[*i]).collect();
            let batch = batch_of(&part);
            writer.add(
                |name| batch.column_by_name(name).cloned(),
                |_| None,
                (part.len(), Some(&flags)),
                |_| Some(vec![ScalarValue::Date32(day)]),
            );
        }
        writer.finish(0, ["b".to_string()].into_iter());
        (old_side, new_side)
    }

    /// A fix by deletion vectors leaves out of the old side's capture the old rows that new rows
    /// used up, and flags those new rows as their twins: the comparison is exactly the one of
    /// reading both sides (repeated keys, NULL keys, rows moved to another day, changed rows
    /// whose key has an identical twin), in memory or in spill files. Such an old side is not
    /// used beside new rows read again: it lacks rows they do not stand for.
    #[tokio::test]
    async fn twins_of_old_rows_left_out_give_exactly_the_comparison_of_reading_both_sides() {
        use crate::keymerge::KeyChanges;
        use deltalake::datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
        for same in [vec![], vec![20_001, 20_003]] {
            for memory_rows in [1 << 20, 50] {
                let (old, mut new) = sides(&same);
                // Key 7's rows: one of them comes back twice, beside its twin.
                let seven = *old.iter().find(|r| r.1 == Some(7)).expect("key 7");
                new.push(seven);
                let ctx = context(&old, &new);
                let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
                // How each key changed, as the merge records it for the change data feed.
                let recording = || {
                    let mut spec = spec();
                    spec.changes = Some(KeyChanges::new(&pool, usize::MAX));
                    spec
                };
                let found = |spec: &CompareSpec| {
                    let changes = spec.changes.as_ref().and_then(|c| c.found());
                    changes.map(|f| (f.keys().to_vec(), f.null_keys()))
                };
                let spec = recording();
                let hint = KnownSide {
                    mostly_changed: true,
                    ..KnownSide::default()
                };
                let (read, read_facts) = compare_keyed(&ctx, &spec, None, Some(hint), None, None)
                    .await
                    .expect("compare");
                let read_changes = found(&spec);
                assert!(read_changes.as_ref().is_some_and(|c| !c.0.is_empty()));
                let spec = recording();
                let (old_side, new_side) =
                    capture_with_twins(&ctx, (&old, &new), &spec, memory_rows);
                let known = KnownSide {
                    captured: Some(Arc::clone(&new_side)),
                    ..KnownSide::default()
                };
                let (paired, facts) = compare_keyed(
                    &ctx,
                    &spec,
                    None,
                    Some(known),
                    None,
                    Some(Arc::clone(&old_side)),
                )
                .await
                .expect("compare");
                let case = format!("same {same:?}, {memory_rows} rows in memory");
                assert!(old_side.sealed() && new_side.sealed(), "{case}: both used");
                let (mut paired_json, mut read_json) = (
                    serde_json::to_value(&paired).expect("json"),
                    serde_json::to_value(&read).expect("json"),
                );
                let (paired_samples, read_samples) =
                    (paired_json["samples"].take(), read_json["samples"].take());
                assert_eq!(paired_json, read_json, "{case}");
                assert!(read.totals.changed > 0 && read.totals.added > 0, "{case}");
                for kind in ["added", "removed", "changed"] {
                    assert_eq!(
                        paired_samples[kind].as_array().map(Vec::len),
                        read_samples[kind].as_array().map(Vec::len),
                        "{case}: {kind}"
                    );
                }
                assert_eq!(facts, read_facts, "{case}");
                assert!(facts.is_some_and(|f| f.duplicate_keys > 0), "{case}");
                assert_eq!(found(&spec), read_changes, "{case}");

                // The old side alone, beside new rows read from `output`: not used.
                let (old_side, _) = capture_with_twins(&ctx, (&old, &new), &spec, memory_rows);
                let (alone, _) = compare_keyed(
                    &ctx,
                    &recording(),
                    None,
                    Some(KnownSide::default()),
                    None,
                    Some(Arc::clone(&old_side)),
                )
                .await
                .expect("compare");
                assert!(!old_side.sealed(), "{case}");
                let mut alone_json = serde_json::to_value(&alone).expect("json");
                alone_json["samples"].take();
                assert_eq!(alone_json, read_json, "{case}");
            }
        }
    }
}
