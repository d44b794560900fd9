//! A cascade after staging, by its id: `publish CASCADE_ID` publishes its staged nodes in
//! dependency order, `discard CASCADE_ID` deletes what its unpublished nodes staged, `revert
//! CASCADE_ID` reverts its published nodes in reverse order. Each node goes through the same
//! checks as a run of its own; the cascade record follows.

use super::run::{CascadeRecord, CascadeRunReport, load_record, save};
use crate::journal::{Journal, RunState};
use crate::run::manage::{discard_run, list_runs, publish_run};
use crate::run::report::RunReport;
use crate::run::revert::{logical_revert_plan, revert_run, reverts_logically};
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};
use lakefill_table::model::Model;
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{loaded_version, open_table};

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
        let published = match check_parents(project, &record, index).await {
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

/// Refuses to publish node `index` of a cascade when one of its parents has changed, since the
/// node read it, where the node reads it: a commit of the parent's table after the version the
/// node read, other than the parent run's own, that added or removed files in the node's window
/// of it (its range widened by the source's lookback and lookahead; anywhere, when the node
/// reads the parent without a window on its partitions). A node already published, or whose
/// journal is gone, is left to `publish` itself.
pub(crate) async fn check_parents(
    project: &Project,
    record: &CascadeRecord,
    index: usize,
) -> Result<()> {
    let node = &record.nodes[index];
    let config = project.table(&node.table, "the cascade record")?;
    let table = open_table(config, None).await?;
    let Some(journal) = Journal::load(&table.object_store(), &RunId::parse(&node.run_id)?).await?
    else {
        return Ok(());
    };
    if journal.state == RunState::Published {
        return Ok(());
    }
    let model = Model::load(project, &journal.model, Some(&journal.model_version))?;
    for parent in &record.nodes[..index] {
        let Some(&read) = journal.sources.get(&parent.table) else {
            continue;
        };
        let parent_table =
            open_table(project.table(&parent.table, "the cascade record")?, None).await?;
        let parent_run =
            Journal::load(&parent_table.object_store(), &RunId::parse(&parent.run_id)?).await?;
        let own = parent_run.as_ref().and_then(|j| j.published_version);
        let window = parent_run.as_ref().and_then(|parent_run| {
            let spec = model.header().sources.get(&parent.table)?;
            read_window(&journal, spec, &parent_run.layout)
        });
        let mut moved = Vec::new();
        for version in read + 1..=loaded_version(&parent_table)? {
            if Some(version) == own {
                continue;
            }
            let touched = match crate::log::read_commit(&parent_table, version).await? {
                Some(commit) if commit.added + commit.removed == 0 => false,
                Some(commit) => match &window {
                    Some((layout, low, high)) => commit.partitions.iter().any(|values| {
                        // A partition whose time cannot be read may hold anything.
                        match layout.time.period_of(values) {
                            Ok(Some(period)) => period.start() < *high && *low < period.end(),
                            Ok(None) => false,
                            Err(_) => true,
                        }
                    }),
                    None => true,
                },
                // Its commit is no longer in the log: it may have.
                None => true,
            };
            if touched {
                moved.push(version);
            }
        }
        if !moved.is_empty() {
            let (from, to) = match Journal::load(
                &open_table(
                    project.table(&record.nodes[0].table, "the cascade record")?,
                    None,
                )
                .await?
                .object_store(),
                &RunId::parse(&record.nodes[0].run_id)?,
            )
            .await?
            {
                Some(root) => (root.range.from, root.range.to),
                None => ("FROM".into(), "TO".into()),
            };
            return Err(Error::CascadeParentMoved(Box::new(
                lakefill_table::error::ParentMoved {
                    cascade: record.cascade_id.clone(),
                    table: node.table.clone(),
                    parent: parent.table.clone(),
                    read,
                    versions: moved,
                    rerun: format!(
                        "lakefill backfill {} --from {from} --to {to} --cascade",
                        record.root
                    ),
                },
            )));
        }
    }
    Ok(())
}

/// What a node read of a parent, as times: its range widened by the source's lookback and
/// lookahead, when the source's window is the parent's partition time column (so that a
/// commit's partitions tell whether it reached into it); `None` when any commit may have.
fn read_window(
    journal: &Journal,
    spec: &lakefill_table::model::SourceSpec,
    parent_layout: &lakefill_table::partition::Layout,
) -> Option<(
    lakefill_table::partition::Layout,
    chrono::NaiveDateTime,
    chrono::NaiveDateTime,
)> {
    let window = spec.window.as_ref()?;
    let columns = parent_layout.time.encoding.columns();
    if parent_layout.by_rows
        || window
            .iter()
            .map(String::as_str)
            .ne(columns.iter().copied())
    {
        return None;
    }
    let grain = parent_layout.time.grain;
    let first = journal.range.first()?;
    let last = journal.range.last()?;
    let low = lakefill_table::time::Period::containing(grain, first.start())?
        .offset(-i64::from(spec.lookback))?;
    let high = lakefill_table::time::Period::containing(
        grain,
        last.end() - chrono::TimeDelta::microseconds(1),
    )?
    .offset(i64::from(spec.lookahead))?;
    Some((parent_layout.clone(), low.start(), high.end()))
}

/// Every run of the project with its state, reconciled with the logs.
async fn states(project: &Project) -> Result<Vec<(String, RunState)>> {
    Ok(list_runs(project, None)
        .await?
        .into_iter()
        .map(|r| (r.run_id, r.state))
        .collect())
}

impl CascadeRecord {
    /// The error of a cascade id that names no record.
    pub(crate) fn unknown(id: &str, searched: Vec<String>) -> Error {
        Error::UnknownRun {
            run_id: id.to_string(),
            searched,
        }
    }
}
