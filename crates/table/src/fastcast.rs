//! `CAST(timestamp AS DATE)` without a calendar per row, for timestamps in UTC or without a zone.
//!
//! Arrow casts a timestamp to a date by making each value a chrono date-time and, for a timestamp
//! with a time zone (a Delta `timestamp` is `Timestamp(µs, "UTC")`), by looking the zone's offset
//! up for each value: in a time-zone fix (`CAST(event_ts AS DATE)`, in the filter and the
//! projection) that was a fifth of a backfill's CPU. In UTC or without a zone, a value's date is
//! the floor of its seconds divided by a day's, so [`FastTimestampDates`], a physical optimizer
//! rule, puts [`TimestampDate`] in place of those casts in filters and projections: the same
//! dates, failing where Arrow's cast fails (a value outside chrono's dates) with Arrow's error.
//!
//! A filter that compares such a cast with a date (`CAST(event_ts AS DATE) BETWEEN $start AND
//! $end`) is pushed into the Parquet scan and evaluated there, where a physical rule cannot reach
//! it. [`UnwrapDateCasts`], a logical optimizer rule, compares the timestamp itself instead
//! (`event_ts >= TIMESTAMP '<$start>' AND event_ts < TIMESTAMP '<$end + 1 day>'`): the same rows
//! for every timestamp that has a date, no calendar per row, and min/max statistics of the
//! timestamp prune files and row groups directly. (A timestamp too far from year 0 to have a date
//! in chrono, beyond ±262,143 years, fails Arrow's cast; the comparison just places it.)

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use deltalake::arrow::array::{Array, ArrayRef, AsArray, Date32Array, RecordBatch};
use deltalake::arrow::datatypes::{
    ArrowTimestampType, DataType, Field, FieldRef, Schema, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use deltalake::arrow::error::ArrowError;
use deltalake::datafusion::common::config::ConfigOptions;
use deltalake::datafusion::common::tree_node::{Transformed, TransformedResult as _, TreeNode};
use deltalake::datafusion::common::{DFSchema, Result, ScalarValue};
use deltalake::datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable as _, LogicalPlan, Operator,
};
use deltalake::datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use deltalake::datafusion::physical_expr::PhysicalExpr;
use deltalake::datafusion::physical_expr::expressions::CastExpr;
use deltalake::datafusion::physical_optimizer::PhysicalOptimizerRule;
use deltalake::datafusion::physical_plan::ExecutionPlan;
use deltalake::datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use deltalake::datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

/// `state` with [`UnwrapDateCasts`] and [`FastTimestampDates`]. The logical rule goes before
/// common subexpressions are taken out: a cast compared twice (`CAST(ts AS DATE) BETWEEN ...`,
/// or compared and selected) would otherwise be compared as a column of a projection below the
/// filter, out of the rule's reach, and cast row by row in the scan.
pub fn with_rules(
    state: deltalake::datafusion::execution::SessionState,
) -> deltalake::datafusion::execution::SessionState {
    deltalake::datafusion::execution::SessionStateBuilder::new_from_existing(with_logical_rule(
        state,
    ))
    .with_physical_optimizer_rule(Arc::new(FastTimestampDates))
    .build()
}

/// `state` with [`UnwrapDateCasts`] alone (plain expressions, for a cluster that does not know
/// lakefill's physical ones), where [`with_rules`] puts it.
pub fn with_logical_rule(
    state: deltalake::datafusion::execution::SessionState,
) -> deltalake::datafusion::execution::SessionState {
    let mut rules = state.optimizers().to_vec();
    let at = rules
        .iter()
        .position(|r| r.name() == "common_sub_expression_eliminate")
        .unwrap_or(rules.len());
    rules.insert(at, Arc::new(UnwrapDateCasts));
    deltalake::datafusion::execution::SessionStateBuilder::new_from_existing(state)
        .with_optimizer_rules(rules)
        .build()
}

/// Rewrites comparisons of `CAST(<timestamp in UTC or without a zone> AS DATE)` with a date into
/// comparisons of the timestamp with the first instant of that date or of the next, in filters
/// and in the filters pushed into scans.
#[derive(Debug, Default)]
pub struct UnwrapDateCasts;

impl OptimizerRule for UnwrapDateCasts {
    fn name(&self) -> &str {
        "lakefill_unwrap_date_casts"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let schema = match &plan {
            LogicalPlan::Filter(filter) => Arc::clone(filter.input.schema()),
            // Filters pushed into a scan refer to the source's columns, not to its projection.
            LogicalPlan::TableScan(scan) if !scan.filters.is_empty() => {
                Arc::new(DFSchema::try_from_qualified_schema(
                    scan.table_name.clone(),
                    &scan.source.schema(),
                )?)
            }
            _ => return Ok(Transformed::no(plan)),
        };
        plan.map_expressions(|expr| expr.transform_up(|e| unwrap_comparison(e, &schema)))
    }
}

/// `e` as a comparison of a timestamp, when it compares a date cast of a UTC or zone-less
/// timestamp with a date literal.
fn unwrap_comparison(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &e else {
        return Ok(Transformed::no(e));
    };
    let (cast, date, op) = match (left.as_ref(), right.as_ref()) {
        (Expr::Cast(cast), Expr::Literal(ScalarValue::Date32(Some(date)), _)) => (cast, *date, *op),
        (Expr::Literal(ScalarValue::Date32(Some(date)), _), Expr::Cast(cast)) => match op.swap() {
            Some(op) => (cast, *date, op),
            None => return Ok(Transformed::no(e)),
        },
        _ => return Ok(Transformed::no(e)),
    };
    if cast.field.data_type() != &DataType::Date32 {
        return Ok(Transformed::no(e));
    }
    let DataType::Timestamp(unit, zone) = cast.expr.get_type(schema)? else {
        return Ok(Transformed::no(e));
    };
    if !in_utc(&DataType::Timestamp(unit, zone.clone())) {
        return Ok(Transformed::no(e));
    }
    let per_day: i64 = 86_400
        * match unit {
            TimeUnit::Second => 1,
            TimeUnit::Millisecond => 1_000,
            TimeUnit::Microsecond => 1_000_000,
            TimeUnit::Nanosecond => 1_000_000_000,
        };
    // The first instant of `date` and of the day after, as timestamps of the column's type.
    let instant = |days: i64| {
        let value = days.checked_mul(per_day)?;
        let zone = zone.clone();
        Some(Expr::Literal(
            match unit {
                TimeUnit::Second => ScalarValue::TimestampSecond(Some(value), zone),
                TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(Some(value), zone),
                TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(Some(value), zone),
                TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(Some(value), zone),
            },
            None,
        ))
    };
    let (Some(first), Some(next)) = (instant(i64::from(date)), instant(i64::from(date) + 1)) else {
        return Ok(Transformed::no(e));
    };
    let ts = cast.expr.as_ref().clone();
    let rewritten = match op {
        Operator::Eq => ts.clone().gt_eq(first).and(ts.lt(next)),
        Operator::NotEq => ts.clone().lt(first).or(ts.gt_eq(next)),
        Operator::Lt => ts.lt(first),
        Operator::LtEq => ts.lt(next),
        Operator::Gt => ts.gt_eq(next),
        Operator::GtEq => ts.gt_eq(first),
        _ => return Ok(Transformed::no(e)),
    };
    Ok(Transformed::yes(rewritten))
}

/// Replaces `CAST(<timestamp in UTC or without a zone> AS DATE)` in filters and projections by
/// [`TimestampDate`].
#[derive(Debug, Default)]
pub struct FastTimestampDates;

impl PhysicalOptimizerRule for FastTimestampDates {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if let Some(filter) = node.downcast_ref::<FilterExec>() {
                let predicate = rewrite(filter.predicate(), &filter.input().schema())?;
                if predicate.transformed {
                    let filter = FilterExecBuilder::from(filter)
                        .with_predicate(predicate.data)
                        .build()?;
                    return Ok(Transformed::yes(Arc::new(filter) as Arc<dyn ExecutionPlan>));
                }
            } else if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                let schema = projection.input().schema();
                let mut changed = false;
                let mut exprs = Vec::with_capacity(projection.expr().len());
                for item in projection.expr() {
                    let expr = rewrite(&item.expr, &schema)?;
                    changed |= expr.transformed;
                    exprs.push(ProjectionExpr {
                        expr: expr.data,
                        alias: item.alias.clone(),
                    });
                }
                if changed {
                    let projection =
                        ProjectionExec::try_new(exprs, Arc::clone(projection.input()))?;
                    return Ok(Transformed::yes(
                        Arc::new(projection) as Arc<dyn ExecutionPlan>
                    ));
                }
            }
            Ok(Transformed::no(node))
        })
        .data()
    }

    fn name(&self) -> &str {
        "lakefill_fast_timestamp_dates"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `expr` (over `schema`) with its casts of timestamps to dates replaced.
fn rewrite(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
) -> Result<Transformed<Arc<dyn PhysicalExpr>>> {
    Arc::clone(expr).transform_up(|e| {
        if let Some(cast) = e.downcast_ref::<CastExpr>()
            && cast.cast_type() == &DataType::Date32
            // A TRY_CAST-like cast makes failures NULL; Arrow's own keeps that.
            && !cast.cast_options().safe
            && in_utc(&cast.expr().data_type(schema)?)
        {
            return Ok(Transformed::yes(
                Arc::new(TimestampDate::new(Arc::clone(cast.expr()))) as Arc<dyn PhysicalExpr>,
            ));
        }
        Ok(Transformed::no(e))
    })
}

/// A timestamp type whose values are UTC instants or zone-less: its local date is the UTC date.
/// Only zone names Arrow parses to UTC itself.
fn in_utc(data_type: &DataType) -> bool {
    match data_type {
        DataType::Timestamp(_, None) => true,
        DataType::Timestamp(_, Some(zone)) => {
            matches!(zone.as_ref(), "UTC" | "Etc/UTC" | "+00:00")
        }
        _ => false,
    }
}

/// The date of a timestamp in UTC or without a zone, as `CAST(... AS DATE)` gives it.
#[derive(Debug, Clone, Eq)]
pub struct TimestampDate {
    input: Arc<dyn PhysicalExpr>,
}

// By hand, as DataFusion's own expressions do (rust-lang/rust#78808).
impl PartialEq for TimestampDate {
    fn eq(&self, other: &Self) -> bool {
        self.input.eq(&other.input)
    }
}

impl Hash for TimestampDate {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.input.hash(state);
    }
}

impl TimestampDate {
    /// The cast of `input`.
    pub fn new(input: Arc<dyn PhysicalExpr>) -> Self {
        Self { input }
    }
}

impl fmt::Display for TimestampDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "utc_date({})", self.input)
    }
}

impl PhysicalExpr for TimestampDate {
    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        let input = self.input.return_field(input_schema)?;
        Ok(Arc::new(Field::new(
            input.name(),
            DataType::Date32,
            input.is_nullable(),
        )))
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        match self.input.evaluate(batch)? {
            ColumnarValue::Array(array) => Ok(ColumnarValue::Array(dates(&array)?)),
            ColumnarValue::Scalar(scalar) => {
                let dates = dates(&scalar.to_array()?)?;
                Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                    &dates, 0,
                )?))
            }
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|_| {
            deltalake::datafusion::common::DataFusionError::Internal(
                "a timestamp's date has one input".into(),
            )
        })?;
        Ok(Arc::new(Self::new(input)))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CAST(")?;
        self.input.fmt_sql(f)?;
        write!(f, " AS DATE)")
    }
}

/// The dates of the timestamps `array`.
pub fn dates(array: &ArrayRef) -> Result<ArrayRef> {
    let out = match array.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => of::<TimestampSecondType>(array, 1),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            of::<TimestampMillisecondType>(array, 1_000)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            of::<TimestampMicrosecondType>(array, 1_000_000)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            of::<TimestampNanosecondType>(array, 1_000_000_000)
        }
        other => Err(ArrowError::CastError(format!(
            "a timestamp's date of a {other} value"
        ))),
    }?;
    Ok(Arc::new(out))
}

/// Seconds of the first and last instants chrono has dates for.
fn second_bounds() -> (i64, i64) {
    (
        chrono::DateTime::<chrono::Utc>::MIN_UTC.timestamp(),
        chrono::DateTime::<chrono::Utc>::MAX_UTC.timestamp(),
    )
}

/// The dates of timestamps of `per_second` units a second.
fn of<T: ArrowTimestampType>(
    array: &ArrayRef,
    per_second: i64,
) -> std::result::Result<Date32Array, ArrowError> {
    let values = array.as_primitive::<T>();
    let (first, last) = second_bounds();
    let day = |v: i64| (v.div_euclid(per_second).div_euclid(86_400)) as i32;
    let in_range = |v: i64| (first..=last).contains(&v.div_euclid(per_second));
    // Values all in range (what a minimum and maximum tell): a plain loop over the values.
    let range = deltalake::arrow::compute::min(values).zip(deltalake::arrow::compute::max(values));
    if range.is_none_or(|(min, max)| in_range(min) && in_range(max)) {
        return Ok(values.unary(day));
    }
    values.try_unary(|v| {
        if in_range(v) {
            Ok(day(v))
        } else {
            Err(ArrowError::CastError(format!(
                "Cannot convert {} {v} to datetime",
                std::any::type_name::<T>()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{TimestampMicrosecondArray, TimestampSecondArray};
    use deltalake::arrow::compute::{CastOptions, cast_with_options};

    /// Arrow's own cast, as DataFusion calls it for `CAST`.
    fn arrow_dates(array: &ArrayRef) -> std::result::Result<ArrayRef, ArrowError> {
        let options = CastOptions {
            safe: false,
            ..Default::default()
        };
        cast_with_options(array, &DataType::Date32, &options)
    }

    #[test]
    fn dates_are_arrows_for_every_unit_zone_and_edge() {
        let (first, last) = second_bounds();
        let seconds: Vec<Option<i64>> = vec![
            Some(0),
            Some(-1),
            Some(1),
            Some(86_399),
            Some(86_400),
            Some(-86_400),
            Some(-86_401),
            Some(1_735_689_599),
            Some(1_735_689_600),
            None,
            Some(first),
            Some(last),
            Some(-62_135_596_800),
        ];
        for zone in [None, Some("UTC"), Some("+00:00"), Some("Etc/UTC")] {
            for (unit, per_second) in [
                (TimeUnit::Second, 1i64),
                (TimeUnit::Millisecond, 1_000),
                (TimeUnit::Microsecond, 1_000_000),
                (TimeUnit::Nanosecond, 1_000_000_000),
            ] {
                // Every value a unit either side of each second, where the unit can hold it.
                let values: Vec<Option<i64>> = seconds
                    .iter()
                    .flat_map(|s| {
                        [-1i64, 0, 1]
                            .into_iter()
                            .map(move |d| s.and_then(|s| s.checked_mul(per_second)?.checked_add(d)))
                    })
                    .collect();
                let array: ArrayRef = match unit {
                    TimeUnit::Second => {
                        Arc::new(TimestampSecondArray::from(values.clone()).with_timezone_opt(zone))
                    }
                    TimeUnit::Millisecond => Arc::new(
                        deltalake::arrow::array::TimestampMillisecondArray::from(values.clone())
                            .with_timezone_opt(zone),
                    ),
                    TimeUnit::Microsecond => Arc::new(
                        TimestampMicrosecondArray::from(values.clone()).with_timezone_opt(zone),
                    ),
                    TimeUnit::Nanosecond => Arc::new(
                        deltalake::arrow::array::TimestampNanosecondArray::from(values.clone())
                            .with_timezone_opt(zone),
                    ),
                };
                assert!(in_utc(array.data_type()));
                // One value at a time: the whole array fails where any value does.
                for (i, value) in values.iter().enumerate() {
                    let one = array.slice(i, 1);
                    match (arrow_dates(&one), dates(&one)) {
                        (Ok(expected), Ok(got)) => {
                            assert_eq!(&expected, &got, "{zone:?} {unit:?} {value:?}")
                        }
                        (Err(expected), Err(got)) => assert_eq!(
                            expected.to_string(),
                            arrow_text(got),
                            "{zone:?} {unit:?} {value:?}"
                        ),
                        (expected, got) => {
                            panic!("{zone:?} {unit:?} {value:?}: {expected:?} vs {got:?}")
                        }
                    }
                }
            }
        }
    }

    /// The text of an error as Arrow prints it.
    fn arrow_text(error: deltalake::datafusion::common::DataFusionError) -> String {
        match error {
            deltalake::datafusion::common::DataFusionError::ArrowError(e, _) => e.to_string(),
            other => other.to_string(),
        }
    }

    #[test]
    fn other_zones_keep_arrows_cast() {
        for zone in ["America/New_York", "+01:00", "-00:30", "Europe/Paris"] {
            assert!(!in_utc(&DataType::Timestamp(
                TimeUnit::Microsecond,
                Some(zone.into())
            )));
        }
        assert!(!in_utc(&DataType::Date64));
    }

    /// The rows of `sql` in `ctx`, and its physical plan as text.
    async fn run_with_plan(
        ctx: &deltalake::datafusion::prelude::SessionContext,
        sql: &str,
    ) -> (Vec<deltalake::arrow::array::RecordBatch>, String) {
        let df = ctx.sql(sql).await.expect("plan");
        let physical = df.clone().create_physical_plan().await.expect("physical");
        let text = deltalake::datafusion::physical_plan::displayable(physical.as_ref())
            .indent(true)
            .to_string();
        (df.collect().await.expect("run"), text)
    }

    /// A session without the rules and one with them.
    fn sessions() -> [deltalake::datafusion::prelude::SessionContext; 2] {
        use deltalake::datafusion::execution::SessionStateBuilder;
        use deltalake::datafusion::prelude::SessionContext;
        let plain = SessionContext::new();
        let fresh = SessionContext::new();
        let state = with_rules(SessionStateBuilder::new_from_existing(fresh.state()).build());
        [plain, SessionContext::new_with_state(state)]
    }

    /// A model's usual shape over a Parquet scan (which takes filters): its time's date both
    /// selected and compared twice. Nothing is cast, not even in the scan's own filter.
    #[tokio::test]
    async fn a_date_selected_and_compared_twice_is_not_cast_in_the_scan() {
        use deltalake::arrow::array::{RecordBatch, TimestampMicrosecondArray};
        use deltalake::arrow::datatypes::{Field, Schema};
        let dir = tempfile::tempdir().expect("dir");
        let values: Vec<i64> = (-3..3)
            .map(|d| d * 43_200_000_000 + 20_089 * 86_400_000_000)
            .collect();
        let ts = TimestampMicrosecondArray::from(values).with_timezone("UTC");
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            ts.data_type().clone(),
            true,
        )]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ts)]).expect("batch");
        let path = dir.path().join("t.parquet");
        let file = std::fs::File::create(&path).expect("file");
        let mut writer =
            deltalake::parquet::arrow::ArrowWriter::try_new(file, schema, None).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
        let sql = "SELECT ts, CAST(ts AS DATE) AS d FROM t \
                   WHERE CAST(ts AS DATE) BETWEEN DATE '2025-01-01' AND DATE '2025-01-02' ORDER BY ts";
        let mut results = Vec::new();
        for ctx in sessions() {
            ctx.register_parquet("t", path.to_str().expect("path"), Default::default())
                .await
                .expect("register");
            results.push(run_with_plan(&ctx, sql).await);
        }
        assert_eq!(results[0].0, results[1].0);
        let rows: usize = results[1].0.iter().map(|b| b.num_rows()).sum();
        // 2025-01-01 00:00 and 12:00, and 2025-01-02 00:00.
        assert_eq!(rows, 3);
        assert!(results[0].1.contains("AS Date32)"), "{}", results[0].1);
        assert!(!results[1].1.contains("AS Date32)"), "{}", results[1].1);
    }

    /// Comparisons of a timestamp's date with a date select the same rows as the cast does,
    /// on both sides of every day boundary, for every operator, unit and zone, the literal on
    /// either side; and the filters that are rewritten cast nothing any more.
    #[tokio::test]
    async fn comparisons_of_dates_of_timestamps_select_the_same_rows_without_a_cast() {
        let [plain, fast] = sessions();
        // Seconds around the start and end of 2025-01-01 and of 1969-12-31.
        let mut seconds: Vec<String> = Vec::new();
        for day in [20_089i64, -1] {
            for edge in [day * 86_400, (day + 1) * 86_400] {
                for d in [-1, 0, 1] {
                    seconds.push(format!("({})", edge + d));
                }
            }
        }
        seconds.push("(NULL)".into());
        let values = seconds.join(", ");
        let predicates = [
            "CAST(ts AS DATE) = DATE '2025-01-01'",
            "CAST(ts AS DATE) <> DATE '2025-01-01'",
            "CAST(ts AS DATE) < DATE '2025-01-01'",
            "CAST(ts AS DATE) <= DATE '2025-01-01'",
            "CAST(ts AS DATE) > DATE '2025-01-01'",
            "CAST(ts AS DATE) >= DATE '2025-01-01'",
            "DATE '2025-01-01' > CAST(ts AS DATE)",
            "DATE '1969-12-31' = CAST(ts AS DATE)",
            "CAST(ts AS DATE) BETWEEN DATE '1969-12-31' AND DATE '2025-01-01'",
            "CAST(ts AS DATE) NOT BETWEEN DATE '1969-12-31' AND DATE '2024-12-31'",
            "CAST(ts AS DATE) >= DATE '1970-01-01' OR CAST(ts AS DATE) = DATE '1969-12-31'",
        ];
        for zone in [
            "Some(\"UTC\")",
            "None",
            "Some(\"+00:00\")",
            "Some(\"America/New_York\")",
        ] {
            for unit in ["Second", "Millisecond", "Microsecond", "Nanosecond"] {
                let scale = match unit {
                    "Second" => 1,
                    "Millisecond" => 1_000,
                    "Microsecond" => 1_000_000,
                    _ => 1_000_000_000,
                };
                for predicate in predicates {
                    let sql = format!(
                        "WITH t AS (SELECT arrow_cast(column1 * {scale}, 'Timestamp({unit}, {zone})') AS ts \
                         FROM (VALUES {values}) v) SELECT arrow_cast(ts, 'Int64') AS v FROM t \
                         WHERE {predicate} ORDER BY v"
                    );
                    let mut results = Vec::new();
                    for ctx in [&plain, &fast] {
                        results.push(run_with_plan(ctx, &sql).await);
                    }
                    assert_eq!(results[0].0, results[1].0, "{zone} {unit} {predicate}");
                    let casts = |text: &str| text.matches("AS Date32)").count();
                    assert!(casts(&results[0].1) > 0, "{}", results[0].1);
                    if zone.contains("New_York") {
                        assert_eq!(
                            casts(&results[1].1),
                            casts(&results[0].1),
                            "{}",
                            results[1].1
                        );
                    } else {
                        assert_eq!(
                            casts(&results[1].1),
                            0,
                            "{zone} {predicate}: {}",
                            results[1].1
                        );
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn the_rule_replaces_the_casts_of_filters_and_projections_and_their_results_agree() {
        let [plain, fast] = sessions();
        let sql = "WITH t AS (SELECT arrow_cast(column1, 'Timestamp(Microsecond, Some(\"UTC\"))') AS ts, \
                   arrow_cast(column1, 'Timestamp(Second, None)') AS plain, \
                   arrow_cast(column1, 'Timestamp(Second, Some(\"America/New_York\"))') AS ny \
                   FROM (VALUES (0), (-1), (86399), (86400), (1735700000), (NULL)) v) \
                   SELECT CAST(ts AS DATE) AS d, CAST(plain AS DATE), CAST(ny AS DATE) AS n FROM t \
                   WHERE CAST(ts AS DATE) >= DATE '1969-12-31' OR ts IS NULL ORDER BY d NULLS LAST";
        let mut results = Vec::new();
        for ctx in [&plain, &fast] {
            results.push(run_with_plan(ctx, sql).await);
        }
        assert_eq!(results[0].0, results[1].0);
        // The plain session casts; the fast one computes the UTC and zone-less dates and still
        // casts New York's.
        let (plain_plan, fast_plan) = (&results[0].1, &results[1].1);
        assert!(!plain_plan.contains("utc_date("), "{plain_plan}");
        assert!(fast_plan.contains("utc_date("), "{fast_plan}");
        assert!(fast_plan.contains("AS Date32)"), "{fast_plan}");
        let rows: usize = results[1].0.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 6);
    }
}
