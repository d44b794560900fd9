//! A cascade after staging, by its id: `publish CASCADE_ID` publishes its staged nodes in
//! dependency order, `discard CASCADE_ID` deletes what its unpublished nodes staged, `revert
//! CASCADE_ID` reverts its published nodes in reverse order. Each node goes through the same
//! checks as a run of its own; the cascade record follows.

use super::run::CascadeRunReport;
use crate::run::manage::{discard_run, list_runs, publish_run};
use crate::run::report::RunReport;
use crate::run::revert::{logical_revert_plan, revert_run, reverts_logically};
use lakefill_log::journal::RunState;
use lakefill_log::journal::cascade::{CascadeRecord, load_record, save};
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};

/// Whether `id` names a cascade rather than a run.
pub fn is_cascade_id(id: &str) -> bool {
    id.starts_with("cascade-")
}

/// Publishes every staged (validated) node of the cascade `id`, parents first.
pub async fn publish_cascade(project: &Project, id: &str) -> Result<CascadeRunReport> {
    let (store, mut record) = load_record(project, id).await?;
    let mut nodes = Vec::new();
    for index in 0..record.nodes.len() {
        let run_id = record.nodes[index].run_id.clone();
        let published = match super::parents::check_parents(project, &record, index).await {
            Ok(()) => publish_run(project, &run_id, None).await,
            Err(error) => Err(error),
        };
        let report = match published {
            Ok(report) => report,
            Err(error) => {
                // The record says exactly how far the release got.
                record.nodes[index].state = format!("failed: {error}");
                save(&store, &mut record).await;
                return Err(error);
            }
        };
        record.nodes[index].state = report.state.to_string();
        record.nodes[index].published_version = report.published_version;
        save(&store, &mut record).await;
        nodes.push(report);
    }
    Ok(outcome(record, nodes, "published"))
}

/// Deletes the staged files of every node of the cascade `id` that is not published.
pub async fn discard_cascade(project: &Project, id: &str) -> Result<CascadeRunReport> {
    let (store, mut record) = load_record(project, id).await?;
    let states = states(project).await?;
    let published = |run_id: &str| {
        states
            .iter()
            .any(|(r, s)| r == run_id && *s == RunState::Published)
    };
    if record.nodes.iter().all(|n| published(&n.run_id)) {
        return Err(Error::RunState {
            run_id: id.to_string(),
            state: RunState::Published.to_string(),
            action: "discarded".into(),
            next: format!(
                "every table of it holds the cascade's data since it was published; to undo it, run `lakefill revert {id}`"
            ),
        });
    }
    let mut nodes = Vec::new();
    for index in 0..record.nodes.len() {
        let run_id = record.nodes[index].run_id.clone();
        if published(&run_id) {
            continue;
        }
        let report = discard_run(project, &run_id).await?;
        record.nodes[index].state = report.state.to_string();
        save(&store, &mut record).await;
        nodes.push(report);
    }
    Ok(outcome(record, nodes, "discarded"))
}

/// Reverts every published node of the cascade `id`, children first: by files, or with
/// `logical` by recomputing each node's range as it was (see [`crate::logical_revert_plan`]; a
/// node that appended adjustments always is). A node whose revert is refused (by files, a later
/// commit in its range) stops the revert there, with the nodes after it (its parents)
/// untouched; the same command with `logical` finishes it.
pub async fn revert_cascade(
    project: &Project,
    id: &str,
    reason: Option<String>,
    logical: bool,
) -> Result<CascadeRunReport> {
    let (store, mut record) = load_record(project, id).await?;
    let states = states(project).await?;
    let reason = reason.or_else(|| Some(format!("revert of {id}")));
    let mut nodes = Vec::new();
    for index in (0..record.nodes.len()).rev() {
        let run_id = record.nodes[index].run_id.clone();
        if !states
            .iter()
            .any(|(r, s)| *r == run_id && *s == RunState::Published)
        {
            continue;
        }
        let report = if logical || reverts_logically(project, &run_id).await? {
            let plan = logical_revert_plan(project, &run_id, reason.clone(), None).await?;
            crate::run::BackfillBuilder::new(plan).await?
        } else {
            revert_run(project, &run_id, reason.clone(), false).await?
        };
        record.nodes[index].state = format!("reverted by {}", report.run_id);
        save(&store, &mut record).await;
        nodes.push(report);
    }
    Ok(outcome(record, nodes, "reverted"))
}

fn outcome(record: CascadeRecord, nodes: Vec<RunReport>, done: &str) -> CascadeRunReport {
    CascadeRunReport {
        cascade_id: record.cascade_id,
        outcome: done.to_string(),
        nodes,
    }
}

/// Every run of the project with its state, reconciled with the logs.
async fn states(project: &Project) -> Result<Vec<(String, RunState)>> {
    Ok(list_runs(project, None)
        .await?
        .into_iter()
        .map(|r| (r.run_id, r.state))
        .collect())
}
