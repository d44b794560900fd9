//! The checks over a comparison and the staged rows: thresholds, keys, custom SQL checks and the
//! table's protocol rules.

use std::collections::BTreeMap;

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::datatypes::Int64Type;
use deltalake::datafusion::prelude::SessionContext;
use futures::StreamExt;
use serde_json::{Value, json};

use super::compare::{KnownCounts, compare_keyed};
use super::keymerge::KeyFacts;
use super::report::{CheckResult, ValidationReport};
use super::rows::{batch_to_json, run};
use super::rules::ValidationRules;
use super::spec::{CompareSpec, LoggedChecksums, PartitionKey};
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::protocol::RowRule;
use lakefill_table::rowhash::{RowChecksum, row_hash_sql};
use lakefill_table::sqltext::ident;

/// What is known of the sides before anything is read: the new side's aggregates, and the old
/// side's checksums that its files' log entries hold.
#[derive(Debug)]
pub struct Known {
    /// The new side's rows and sums per partition, from staging.
    pub new: KnownCounts,
    /// The old side's row checksums, as its files' log entries hold them.
    pub old_checksums: Option<LoggedChecksums>,
    /// The old side's rows as something that read them whole hashed them, with their totals
    /// ([`super::keymerge::Capture::old_side`]): then not read again, when it fits.
    pub old_captured: Option<std::sync::Arc<super::keymerge::Capture>>,
    /// The keys around the range, for the key merge to look up (see [`super::edges`]).
    pub edges: Option<std::sync::Arc<super::edges::EdgeProbe>>,
    /// Where the key merge records how each changed key changed, for the change data feed.
    pub changes: Option<std::sync::Arc<super::keymerge::KeyChanges>>,
    /// The table whose rows the commit appends, which the table's own rules must hold for:
    /// `output`, or with adjustments `adjustments` (#33).
    pub appended: &'static str,
}

/// Runs every check of `rules` over `previous` and `output` in `ctx`.
pub async fn validate(
    ctx: &SessionContext,
    partitions: &PartitionKey,
    rules: &ValidationRules,
    sample: usize,
    known: Known,
    checksum_columns: Vec<String>,
    extra_checks: Vec<CheckResult>,
) -> Result<ValidationReport> {
    let started = std::time::Instant::now();
    let spec = CompareSpec {
        partitions: partitions.clone(),
        key: rules.key.clone(),
        measures: rules.summed_measures(),
        sample,
        checksum_columns: Some(checksum_columns),
        edges: known.edges.clone(),
        changes: known.changes.clone(),
    };
    // The old side is scanned but where its logged checksums settle a partition (its files' own,
    // never of a file with a deletion vector): its counts then honour deletion vectors, which
    // the log's statistics do not.
    let (comparison, facts) = compare_keyed(
        ctx,
        &spec,
        None,
        known.new,
        known.old_checksums.as_ref(),
        known.old_captured,
    )
    .await?;
    failpoint::reach(CrashPoint::MidValidate).await?;
    let mut checks = extra_checks;

    if !rules.key.is_empty() {
        let started = std::time::Instant::now();
        // The row diff counted repeated and NULL keys in its pass; only when it found some (to
        // sample them) or could not count them does the check need its own query.
        let (unique, not_null) = match facts {
            Some(facts) if facts == KeyFacts::default() => (
                CheckResult::new("key_unique", Vec::new(), Vec::new()),
                CheckResult::new("key_not_null", Vec::new(), Vec::new()),
            ),
            _ => key_checks(ctx, &rules.key, sample).await?,
        };
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checked keys"
        );
        checks.push(unique);
        checks.push(not_null);
    }
    if let Some(limit) = rules.max_row_change {
        let failures = comparison
            .partitions
            .iter()
            .filter(|p| limit.exceeded(p.old_rows as f64, p.new_rows as f64))
            .map(|p| {
                json!({
                    "partition": p.value, "old_rows": p.old_rows, "new_rows": p.new_rows,
                    "change": p.new_rows as i64 - p.old_rows as i64, "limit": limit.describe(),
                })
            })
            .collect();
        checks.push(CheckResult::new("max_row_change", failures, Vec::new()));
    }
    if let Some(limit) = rules.max_measure_change {
        let mut failures = Vec::new();
        for p in &comparison.partitions {
            for measure in &rules.measures {
                let change = p.measures.get(measure).cloned().unwrap_or_default();
                if limit.exceeded(change.old, change.new) {
                    failures.push(json!({
                        "partition": p.value, "measure": measure, "old": change.old, "new": change.new,
                        "change": change.new - change.old, "limit": limit.describe(),
                    }));
                }
            }
        }
        checks.push(CheckResult::new("max_measure_change", failures, Vec::new()));
    }
    for measure in &rules.conserve {
        let total = comparison
            .totals
            .measures
            .get(measure)
            .cloned()
            .unwrap_or_default();
        let tolerance = 1e-9 * total.old.abs().max(1.0);
        let failures = if (total.new - total.old).abs() > tolerance {
            vec![
                json!({"measure": measure, "old_total": total.old, "new_total": total.new, "change": total.new - total.old}),
            ]
        } else {
            Vec::new()
        };
        checks.push(CheckResult::new(
            format!("conserve({measure})"),
            failures,
            Vec::new(),
        ));
    }
    for check in &rules.checks {
        let (rows, sample_rows) =
            count_and_sample(ctx, &check.sql, sample, &format!("check `{}`", check.name))
                .await
                .map_err(|error| match error {
                    Error::Query { source, .. } => Error::Check {
                        name: check.name.clone(),
                        source,
                    },
                    other => other,
                })?;
        let failures = if rows > 0 {
            vec![
                json!({"rows": rows, "message": format!("the check returned {rows} rows; it must return none")}),
            ]
        } else {
            Vec::new()
        };
        checks.push(CheckResult::new(
            format!("check: {}", check.name),
            failures,
            sample_rows,
        ));
    }
    checks.extend(protocol_checks(ctx, partitions, &rules.protocol, sample, known.appended).await?);
    for column in &rules.identity_kept {
        checks.push(identity_kept(ctx, column, sample, known.appended).await?);
    }
    let passed = checks.iter().all(|c| c.passed);
    Ok(ValidationReport {
        passed,
        checks,
        comparison,
        elapsed_ms: started.elapsed().as_millis() as u64,
        edges_ms: 0,
        notes: Vec::new(),
    })
}

/// The table's protocol rules over the new rows: one scan counts every rule's violations per
/// partition, then a few rows of each broken rule are fetched as a sample.
pub async fn protocol_checks(
    ctx: &SessionContext,
    partitions: &PartitionKey,
    rules: &[RowRule],
    sample: usize,
    appended: &str,
) -> Result<Vec<CheckResult>> {
    if rules.is_empty() {
        return Ok(Vec::new());
    }
    let counts = rules
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            format!(
                "SUM(CASE WHEN {} THEN 1 ELSE 0 END) AS __lf_r{i}",
                rule.violation
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let keys = partitions.columns().len();
    let group_by = partitions.group_by();
    let mut select = partitions.select(ident);
    select.push(counts);
    let sql = format!("SELECT {} FROM {appended}{group_by}", select.join(", "));
    let mut violations: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); rules.len()];
    let mut stream = run(ctx, &sql, "check the table's constraints").await?;
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "cannot check the table's constraints".into())?;
        let parts = partitions.labels(&batch, 0);
        for (i, found) in violations.iter_mut().enumerate() {
            let column = batch.column(keys + i).as_primitive::<Int64Type>();
            for (row, part) in parts.iter().enumerate() {
                let n = if column.is_null(row) {
                    0
                } else {
                    column.value(row)
                };
                if n > 0 {
                    *found.entry(part.clone()).or_default() += u64::try_from(n).unwrap_or(0);
                }
            }
        }
    }
    let mut checks = Vec::new();
    for (rule, found) in rules.iter().zip(violations) {
        let failures: Vec<Value> = found
            .iter()
            .map(|(partition, rows)| {
                json!({"partition": partition, "rows": rows, "message": format!("{rows} staged rows break `{}`", rule.name)})
            })
            .collect();
        let rows = if failures.is_empty() || sample == 0 {
            Vec::new()
        } else {
            count_and_sample(
                ctx,
                &format!(
                    "SELECT * FROM {appended} WHERE {} LIMIT {sample}",
                    rule.violation
                ),
                sample,
                &format!("sample the rows that break `{}`", rule.name),
            )
            .await?
            .1
        };
        let mut check = CheckResult::new(rule.name.clone(), failures, rows);
        check.protocol = true;
        checks.push(check);
    }
    Ok(checks)
}

/// The row count and checksum of every row of `table` (columns `columns`, in order).
pub async fn checksum_of(
    ctx: &SessionContext,
    table: &str,
    columns: &[String],
) -> Result<RowChecksum> {
    lakefill_table::rowhash::register_hash_functions(ctx);
    let hash = row_hash_sql(columns);
    let sql = format!("SELECT COUNT(*), SUM(CAST({hash} AS DECIMAL(38, 0))) FROM {table}");
    let mut stream = run(ctx, &sql, &format!("checksum `{table}`")).await?;
    let mut checksum = RowChecksum::default();
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("cannot checksum `{table}`"))?;
        for row in 0..batch.num_rows() {
            let rows = batch.column(0).as_primitive::<Int64Type>().value(row);
            let sums = batch
                .column(1)
                .as_primitive::<deltalake::arrow::datatypes::Decimal128Type>();
            checksum.merge(&RowChecksum {
                rows: u64::try_from(rows).unwrap_or(0),
                sum: if sums.is_null(row) {
                    0
                } else {
                    u128::try_from(sums.value(row)).unwrap_or(0)
                },
            });
        }
    }
    Ok(checksum)
}

/// A `GENERATED ALWAYS` identity column the model passes through holds only values the table had
/// (in `previous`): Delta's writers assign its values, and no model may write its own.
async fn identity_kept(
    ctx: &SessionContext,
    column: &str,
    sample: usize,
    appended: &str,
) -> Result<CheckResult> {
    let quoted = ident(column);
    let sql = format!(
        "SELECT * FROM {appended} o WHERE NOT EXISTS (SELECT 1 FROM previous p WHERE p.{quoted} = o.{quoted})"
    );
    let what = format!("check the values of identity column `{column}`");
    let (rows, sample_rows) = count_and_sample(ctx, &sql, sample, &what).await?;
    let failures = if rows > 0 {
        vec![json!({
            "rows": rows,
            "message": format!("{rows} staged rows have values of the GENERATED ALWAYS identity column `{column}` that the table did not have: only Delta's writers assign them; leave `{column}` out of the model to have new values assigned, or pass the table's values through"),
        })]
    } else {
        Vec::new()
    };
    let mut check = CheckResult::new(
        format!("identity column {column} keeps the table's values"),
        failures,
        sample_rows,
    );
    check.protocol = true;
    Ok(check)
}

/// Key uniqueness and NOT NULL keys of the new rows, in one aggregation.
async fn key_checks(
    ctx: &SessionContext,
    key: &[String],
    sample: usize,
) -> Result<(CheckResult, CheckResult)> {
    let columns = key.iter().map(|k| ident(k)).collect::<Vec<_>>().join(", ");
    let any_null = key
        .iter()
        .map(|k| format!("{} IS NULL", ident(k)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let sql = format!(
        "SELECT {columns}, COUNT(*) AS copies, ({any_null}) AS __lf_null FROM output \
         GROUP BY {columns} HAVING COUNT(*) > 1 OR ({any_null})"
    );
    let mut stream = run(ctx, &sql, "check keys").await?;
    let (mut duplicate_keys, mut null_rows) = (0u64, 0u64);
    let (mut duplicate_sample, mut null_sample) = (Vec::new(), Vec::new());
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "key checks failed".into())?;
        let copies = batch.column(key.len()).as_primitive::<Int64Type>();
        let nulls = batch.column(key.len() + 1).as_boolean();
        let shown = batch
            .project(&(0..=key.len()).collect::<Vec<_>>())
            .map_err(|e| Error::Internal(e.to_string()))?;
        let rows = batch_to_json(&shown, batch.num_rows())?;
        for (row, value) in rows.into_iter().enumerate() {
            if nulls.value(row) {
                null_rows += u64::try_from(copies.value(row)).unwrap_or(0);
                if null_sample.len() < sample {
                    null_sample.push(value);
                }
            } else {
                duplicate_keys += 1;
                if duplicate_sample.len() < sample {
                    duplicate_sample.push(value);
                }
            }
        }
    }
    let unique = if duplicate_keys > 0 {
        vec![
            json!({"duplicate_keys": duplicate_keys, "message": format!("{duplicate_keys} keys occur more than once in the new rows")}),
        ]
    } else {
        Vec::new()
    };
    let not_null = if null_rows > 0 {
        vec![
            json!({"rows": null_rows, "message": format!("{null_rows} new rows have a NULL key column")}),
        ]
    } else {
        Vec::new()
    };
    Ok((
        CheckResult::new("key_unique", unique, duplicate_sample),
        CheckResult::new("key_not_null", not_null, null_sample),
    ))
}

/// Streams `sql`, counting its rows and keeping the first `sample` as JSON objects.
pub async fn count_and_sample(
    ctx: &SessionContext,
    sql: &str,
    sample: usize,
    what: &str,
) -> Result<(u64, Vec<Value>)> {
    let mut stream = run(ctx, sql, what).await?;
    let mut rows = 0u64;
    let mut sampled = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| format!("{what} failed"))?;
        if sampled.len() < sample && batch.num_rows() > 0 {
            sampled.extend(batch_to_json(&batch, sample - sampled.len())?);
        }
        rows += batch.num_rows() as u64;
    }
    Ok((rows, sampled))
}
