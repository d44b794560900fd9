//! The partitions around a run's range, read for the edge check (#32; the check's logic is
//! [`lakefill_validate::edges`]): the target's keys there at the read version, and the keys the
//! model produces there (computed, never written).
//!
//! Before validation, [`EdgeScan::prepare`] reads the partitions the plan names
//! ([`lakefill_recompute::plan::EdgePlan`]) into the probe the key merge consults. After it,
//! [`EdgeScan::check`] counts the keys that cross an edge and, when some do, reads further out
//! until it finds the range no key crosses (or has read as far as the range is long).

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray, StringArray};
use deltalake::arrow::datatypes::DataType;
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;
use serde_json::json;

use lakefill_recompute::plan::{BackfillPlan, BatchPlan};
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::partition::PartitionRange;
use lakefill_table::resources::Resources;
use lakefill_table::sqltext::ident;
use lakefill_table::time::Period;
use lakefill_validate::edges::{
    EDGE_CHECK, EdgeFindings, EdgeProbe, KeyHash, KeyMap, add_sightings, closure,
};
use lakefill_validate::{CheckResult, Comparison, PartitionKey};

/// The keys around a run's range, and how far they were read.
pub(crate) struct EdgeScan {
    from: Period,
    to: Period,
    /// Partitions read before and after the range at first (and the margin the closure keeps).
    widths: (i64, i64),
    /// The first and last partitions read (the range and the partitions around it).
    read: (Period, Period),
    probe: Arc<EdgeProbe>,
}

impl EdgeScan {
    /// Reads the keys of the partitions around the range, old and as the model writes them;
    /// `None` when the plan has no edge check.
    pub(crate) async fn prepare(
        plan: &BackfillPlan,
        resources: &Resources,
    ) -> Result<Option<Self>> {
        let Some(edges) = &plan.report.edges else {
            return Ok(None);
        };
        let range = &plan.report.range;
        let (Some(from), Some(to)) = (range.first(), range.last()) else {
            return Ok(None);
        };
        let widths = (i64::from(edges.width_before), i64::from(edges.width_after));
        let zones: Vec<(Period, Period)> = [
            (from.offset(-widths.0), from.offset(-1)),
            (to.offset(1), to.offset(widths.1)),
        ]
        .into_iter()
        .filter_map(|(first, last)| first.zip(last))
        .collect();
        // Both sides at once, each reading the old rows and running the model side by side.
        let sides = futures::future::try_join_all(
            zones
                .iter()
                .map(|(first, last)| read_around(plan, resources, *first, *last)),
        )
        .await?;
        let mut keys = KeyMap::default();
        let mut read = (from, to);
        for ((first, last), (old, new)) in zones.into_iter().zip(sides) {
            add_sightings(&mut keys, false, old);
            add_sightings(&mut keys, true, new);
            read = (read.0.min(first), read.1.max(last));
        }
        Ok(Some(Self {
            from,
            to,
            widths,
            read,
            probe: Arc::new(EdgeProbe::new(keys)),
        }))
    }

    /// The probe for the key merge.
    pub(crate) fn probe(&self) -> Arc<EdgeProbe> {
        Arc::clone(&self.probe)
    }

    /// The check, once the key merge has consulted the probe: the keys that cross an edge per
    /// partition outside the range, and the range no key crosses. Allowed crossings
    /// (`--allow-edge-moves`) pass, still listed.
    pub(crate) async fn check(
        self,
        plan: &BackfillPlan,
        resources: &Resources,
        comparison: &Comparison,
    ) -> Result<CheckResult> {
        let allowed = plan.report.edges.as_ref().and_then(|e| e.allowed.clone());
        let passed = CheckResult::new(EDGE_CHECK, Vec::new(), Vec::new());
        if self.probe.is_empty() || comparison.identical == Some(true) {
            // No key around the range, or no row of the range changed: none can cross.
            return Ok(passed);
        }
        if !self.probe.was_consulted() {
            let failure = json!({
                "message": format!(
                    "cannot tell whether keys cross the range's edge: the key ({}) is not compared by its hashes (floating-point or nested columns)",
                    comparison.key.join(", ")
                ),
            });
            return Ok(allow(
                CheckResult::new(EDGE_CHECK, vec![failure], Vec::new()),
                allowed,
            ));
        }
        let Self {
            from,
            to,
            widths,
            mut read,
            probe,
        } = self;
        let width = widths.0.max(widths.1);
        let grain = plan.report.range.grain;
        let (mut keys, found) = match Arc::try_unwrap(probe) {
            Ok(probe) => probe.into_sightings(grain),
            Err(_) => return Err(Error::Internal("the edge probe is still shared".into())),
        };
        let findings = EdgeFindings::of(&keys, &found, from, to);
        if findings.is_clean() {
            return Ok(passed);
        }
        if allowed.is_some() {
            // Crossing on purpose: what crosses is recorded; no wider range is looked for.
            return Ok(allow(
                CheckResult::new(EDGE_CHECK, findings.failures(), Vec::new()),
                allowed,
            ));
        }
        // Widen until no key crosses, reading further out as needed: at most twice the range's
        // length (a month, or 8 windows, at least) on each side, or as far as the calendar goes.
        let budget = (2 * period_span(from, to)).max(31).max(8 * width);
        let complete = loop {
            let (low, high) = closure(&keys, from, to);
            let need_before = low.offset(-widths.0).is_some_and(|p| p < read.0);
            let need_after = high.offset(widths.1).is_some_and(|p| p > read.1);
            if !need_before && !need_after {
                break true;
            }
            let mut grew = false;
            if need_before {
                let step = period_span(read.0, from).max(width);
                if period_span(read.0, from) < budget
                    && let (Some(first), Some(last)) = (read.0.offset(-step), read.0.offset(-1))
                {
                    read_into(&mut keys, plan, resources, first, last).await?;
                    read.0 = first;
                    grew = true;
                }
            }
            if need_after {
                let step = period_span(to, read.1).max(width);
                if period_span(to, read.1) < budget
                    && let (Some(first), Some(last)) = (read.1.offset(1), read.1.offset(step))
                {
                    read_into(&mut keys, plan, resources, first, last).await?;
                    read.1 = last;
                    grew = true;
                }
            }
            if !grew {
                break false;
            }
        };
        let (low, high) = closure(&keys, from, to);
        let mut failures = findings.failures();
        failures.push(json!({
            "suggested_from": low.label(),
            "suggested_to": high.label(),
            "complete": complete,
            "message": if complete {
                format!("no key crosses the edges of {}..={}: run the backfill with `--from {} --to {}`", low.label(), high.label(), low.label(), high.label())
            } else {
                format!("keys still cross beyond {}..={} (read {}..={}): widen the range at least that far", low.label(), high.label(), read.0.label(), read.1.label())
            },
        }));
        Ok(allow(
            CheckResult::new(EDGE_CHECK, failures, Vec::new()),
            allowed,
        ))
    }
}

/// `check`, passed when the run allows keys to cross (`--allow-edge-moves`), with the reason.
pub(crate) fn allow(mut check: CheckResult, allowed: Option<String>) -> CheckResult {
    if let Some(reason) = allowed
        && !check.passed
    {
        check.passed = true;
        check
            .failures
            .push(json!({"allowed": true, "reason": reason}));
    }
    check
}

/// How many periods lie between `a` and `b` (0 when they are the same).
fn period_span(a: Period, b: Period) -> i64 {
    lakefill_table::partition::period_count(a.min(b), a.max(b)) - 1
}

/// Reads the keys of the partitions `first..=last` (see [`read_around`]) into `keys`.
async fn read_into(
    keys: &mut KeyMap,
    plan: &BackfillPlan,
    resources: &Resources,
    first: Period,
    last: Period,
) -> Result<()> {
    let (old, new) = read_around(plan, resources, first, last).await?;
    add_sightings(keys, false, old);
    add_sightings(keys, true, new);
    Ok(())
}

/// Keys with the partition they were seen in.
type Seen = Vec<(KeyHash, Period)>;

/// Reads the keys of the partitions `first..=last`: the target's at the read version (old) and
/// the model's output for them (new), side by side.
async fn read_around(
    plan: &BackfillPlan,
    resources: &Resources,
    first: Period,
    last: Period,
) -> Result<(Seen, Seen)> {
    let report = &plan.report;
    let zone = PartitionRange {
        from: first.label(),
        to: last.label(),
        grain: report.range.grain,
        include_null: false,
        // Keys cross the range's edges in its scope: rows outside the predicate stay.
        rows: report.range.rows.clone(),
    };
    tracing::debug!(from = %zone.from, to = %zone.to, "reading the keys around the range");
    futures::try_join!(
        old_keys(plan, resources, &zone),
        model_keys(plan, resources, &zone)
    )
}

/// The keys of the target at the read version in `zone` (of a table corrected by adjustments:
/// its net rows).
async fn old_keys(
    plan: &BackfillPlan,
    resources: &Resources,
    zone: &PartitionRange,
) -> Result<Seen> {
    let report = &plan.report;
    let layout = &report.layout;
    let ctx = resources.session();
    if report.publish == lakefill_table::adjustments::PublishMode::Adjustments {
        lakefill_recompute::plan::adjust::register_net_rows(&ctx, "__lf_edge", plan, zone).await?;
    } else {
        lakefill_validate::rows::register_range(&ctx, "__lf_edge", &plan.target, layout, zone)
            .await?;
    }
    collect_keys(&ctx, plan).await
}

/// The keys of the model's output for the partitions of `zone`, as staging would write them.
async fn model_keys(
    plan: &BackfillPlan,
    resources: &Resources,
    zone: &PartitionRange,
) -> Result<Seen> {
    let report = &plan.report;
    let layout = &report.layout;
    let schema = lakefill_recompute::plan::query::target_schema(plan)?;
    let batch = BatchPlan {
        index: usize::MAX,
        start: zone.from.clone(),
        end: zone.to.clone(),
        partitions: zone.periods().iter().map(Period::label).collect(),
        null: false,
        carry: false,
    };
    let (ctx, df) =
        lakefill_recompute::plan::query::batch_dataframe(plan, &batch, resources).await?;
    let df = lakefill_recompute::stage::target_projection(plan, df, &schema)?;
    let inside = layout.range_predicate(zone, &schema)?;
    let df = df
        .filter(inside)
        .query_context(|| "cannot keep the model's rows around the range".into())?;
    ctx.register_table("__lf_edge", df.into_view())
        .query_context(|| "cannot register the model's rows around the range".into())?;
    collect_keys(&ctx, plan).await
}

/// The key hash (as the key merge knows it) and period of every row of `__lf_edge` in `ctx`
/// whose key has no NULL.
async fn collect_keys(ctx: &SessionContext, plan: &BackfillPlan) -> Result<Seen> {
    let partitions = PartitionKey::Time(plan.report.layout.clone());
    let (key, grain, table) = (&plan.rules.key, plan.report.range.grain, "__lf_edge");
    let mut select = partitions.select(ident);
    let first_key = select.len();
    select.extend(key.iter().map(|k| ident(k)));
    let sql = format!("SELECT {} FROM {}", select.join(", "), ident(table));
    let mut stream =
        lakefill_validate::rows::run(ctx, &sql, "read the keys around the range").await?;
    // A zone holds a few partitions: each distinct partition value is labelled once, not once a
    // row (labelling parses and formats times).
    let mut periods: HashMap<String, Option<Period>> = HashMap::new();
    let mut text = String::new();
    let mut out = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "cannot read the keys around the range".into())?;
        let rows = batch.num_rows();
        let parts = (0..first_key)
            .map(|i| {
                deltalake::arrow::compute::cast(batch.column(i), &DataType::Utf8)
                    .map_err(|e| Error::Internal(format!("cannot read a partition value: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<&StringArray> = parts.iter().map(|c| c.as_string::<i32>()).collect();
        let columns = batch.columns()[first_key..].to_vec();
        let k1 = lakefill_table::rowhash::key_hashes(0, &columns, rows)?;
        let k2 = lakefill_table::rowhash::key_hashes(1, &columns, rows)?;
        for row in 0..rows {
            if k1.is_null(row) {
                continue;
            }
            text.clear();
            for part in &parts {
                if part.is_valid(row) {
                    text.push_str(part.value(row));
                }
                text.push('\u{1f}');
            }
            let period = match periods.get(text.as_str()) {
                Some(period) => *period,
                None => {
                    let values: Vec<Option<String>> = parts
                        .iter()
                        .map(|p| p.is_valid(row).then(|| p.value(row).to_string()))
                        .collect();
                    let period = Period::from_label(grain, &partitions.label(&values));
                    periods.insert(text.clone(), period);
                    period
                }
            };
            if let Some(period) = period {
                out.push(((k1.value(row), k2.value(row) as u32), period));
            }
        }
    }
    Ok(out)
}
