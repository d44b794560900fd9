//! Publishing: the staged files of a run become one new Delta version (DESIGN §4.4).
//!
//! One commit removes every file of the affected partitions at the read version and adds every
//! staged file. It is a WRITE/Overwrite whose predicate is the range, so delta-rs's conflict
//! checker fails it when a concurrent commit touched an affected partition, and keeps commits
//! elsewhere. It carries the application transaction `lakefill:<run_id>`, which makes a retried
//! publish detectable, and the run's metadata under `lakefill` (and as `userMetadata` text).

use deltalake::errors::DeltaTableError;
use deltalake::kernel::transaction::{
    CommitBuilder, CommitProperties, TableReference, TransactionError,
};
use deltalake::kernel::{Action, Add, Transaction};
use deltalake::protocol::{DeltaOperation, SaveMode};
use serde_json::Value;

use crate::error::{DeltaContext, Error, Result};
use crate::plan::{APP_ID_PREFIX, BackfillPlan};

/// Commits `adds` in place of the affected partitions; returns the new version.
pub(crate) async fn commit(plan: &BackfillPlan, adds: Vec<Add>, metadata: Value) -> Result<u64> {
    let report = &plan.report;
    let snapshot = plan
        .target
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", report.target))?;
    let mut actions: Vec<Action> = snapshot
        .log_data()
        .iter()
        .filter(|file| {
            matches!(
                file.partition_values_map().get(&report.partition_column),
                Some(Some(value)) if report.range.contains(value)
            )
        })
        .map(|file| Action::Remove(file.remove_action(true)))
        .collect();
    actions.extend(adds.into_iter().map(Action::Add));

    let operation = DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: Some(vec![report.partition_column.clone()]),
        predicate: Some(range_predicate(
            &report.partition_column,
            &report.range.from,
            &report.range.to,
        )),
    };
    let user_metadata =
        serde_json::to_string(&metadata).map_err(|e| Error::Internal(format!("metadata: {e}")))?;
    let properties = CommitProperties::default()
        .with_metadata([
            ("lakefill".to_string(), metadata),
            ("userMetadata".to_string(), Value::String(user_metadata)),
        ])
        .with_application_transaction(Transaction::new(
            format!("{APP_ID_PREFIX}{}", report.run_id),
            1,
        ));
    let finalized = CommitBuilder::from(properties)
        .with_actions(actions)
        .build(
            Some(snapshot as &dyn TableReference),
            plan.target.log_store(),
            operation,
        )
        .await
        .map_err(|source| match source {
            DeltaTableError::Transaction {
                source: TransactionError::CommitConflict(_),
            } => Error::Conflict {
                table: report.target.clone(),
                read_version: report.read_version,
                source: Box::new(source),
            },
            source => Error::Delta {
                context: format!("cannot commit the backfill to `{}`", report.target),
                source: Box::new(source),
            },
        })?;
    Ok(finalized.version())
}

/// The range as a SQL predicate on the partition column, for the conflict checker.
fn range_predicate(column: &str, from: &str, to: &str) -> String {
    let quote = |value: &str| value.replace('\'', "''");
    format!(
        "{column} >= '{}' AND {column} <= '{}'",
        quote(from),
        quote(to)
    )
}
