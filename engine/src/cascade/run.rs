//! Running a cascade (`backfill --cascade`): every node staged and validated before any is
//! published, then published in dependency order, recorded in a cascade record.
//!
//! A child reads each parent of the cascade as the parent's next version would be: the parent
//! at its current version with the parent run's range taken out and its staged files put in (an
//! overlay), so the cascade is computed as if every parent had been published, without publishing
//! anything. One failed validation (or a failure while staging) publishes nothing. Each node then
//! publishes with its own application transaction, in order; the record under the root target
//! (`_lakefill/cascades/<cascade id>.json`) says which tables are published, and running the same
//! command again finishes the rest: a published node is found in its table's log, a staged one is
//! taken over from its journal. Delta has no multi-table commit: between two node publishes a
//! reader of both tables can see the new parent next to the old child.

use std::sync::Arc;

use serde::Serialize;

use super::CascadePlan;
use crate::run::report::{Outcome, RunReport};
use crate::run::{BackfillBuilder, manage::publish_run};
use lakefill_log::journal::cascade::{CascadeRecord, RecordNode, save};
use lakefill_log::journal::{Journal, RunState};
use lakefill_recompute::plan::Overlay;
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::staged::StagedTable;

/// What a cascade did.
#[derive(Debug, Clone, Serialize)]
pub struct CascadeRunReport {
    /// The cascade.
    pub cascade_id: String,
    /// `published`, `staged`, `validation-failed`, `up-to-date` (no node changes anything) or
    /// `already-published` (the cascade was published before).
    pub outcome: String,
    /// Each node's run, in dependency order.
    pub nodes: Vec<RunReport>,
}

impl CascadeRunReport {
    /// The error a cascade that failed validation ends with (exit code 3), naming the node.
    pub fn validation_error(&self) -> Option<Error> {
        self.nodes.iter().find_map(RunReport::validation_error)
    }
}

/// Runs a planned cascade.
#[must_use = "a CascadeRunner does nothing until it is awaited"]
pub struct CascadeRunner {
    project: Project,
    plan: CascadePlan,
    stage_only: bool,
    interrupt: Option<tokio::sync::watch::Receiver<bool>>,
}

impl CascadeRunner {
    /// Prepares to run `plan` of `project`.
    pub fn new(project: &Project, plan: CascadePlan) -> Self {
        Self {
            project: project.clone(),
            plan,
            stage_only: false,
            interrupt: None,
        }
    }

    /// Stops cleanly when `interrupt` turns `true` (e.g. on Ctrl-C): the node being staged stops
    /// as a single run does (its finished batches journaled, resumable), no later node starts,
    /// and nothing is published if the publishing has not begun; once it has, every node is
    /// published (a commit is never interrupted). Running the same cascade again goes on.
    pub fn with_interrupt(mut self, interrupt: Option<tokio::sync::watch::Receiver<bool>>) -> Self {
        self.interrupt = interrupt;
        self
    }

    /// Stops after every node is staged and validated.
    pub fn with_stage_only(mut self, stage_only: bool) -> Self {
        self.stage_only = stage_only;
        self
    }

    async fn run(self) -> Result<CascadeRunReport> {
        let CascadePlan {
            report,
            nodes,
            settings,
        } = self.plan;
        let interrupted = || self.interrupt.as_ref().is_some_and(|i| *i.borrow());
        let root_store = nodes
            .first()
            .map(|n| n.target.object_store())
            .ok_or_else(|| Error::Internal("a cascade without nodes".into()))?;
        let mut record = new_record(&report);
        save(&root_store, &mut record).await;

        // Stage and validate every node; children read their parents' staged output.
        let mut staged: Vec<(String, Journal)> = Vec::new();
        let mut staged_tables: std::collections::HashMap<String, deltalake::DeltaTable> =
            std::collections::HashMap::new();
        let mut reports = Vec::new();
        for (index, mut plan) in nodes.into_iter().enumerate() {
            if interrupted() {
                record.nodes[index].state = "interrupted".into();
                save(&root_store, &mut record).await;
                return Err(Error::Interrupted);
            }
            read_staged(&mut plan, &staged, &staged_tables);
            let table = plan.report.target.clone();
            let target_table = plan.target.clone();
            let store = plan.target.object_store();
            let run_id = plan.report.run_id.clone();
            let run = BackfillBuilder::new(plan)
                .with_stage_only(true)
                .with_settings(settings.clone())
                .with_interrupt(self.interrupt.clone())
                .await;
            let run = match run {
                Ok(run) => run,
                Err(error) => {
                    if matches!(error, Error::Interrupted) {
                        record.nodes[index].state = "interrupted".into();
                        save(&root_store, &mut record).await;
                    }
                    return Err(error);
                }
            };
            record.nodes[index].state = run.state.to_string();
            save(&root_store, &mut record).await;
            if run.outcome == Outcome::ValidationFailed {
                reports.push(run);
                return Ok(CascadeRunReport {
                    cascade_id: report.cascade_id,
                    outcome: "validation-failed".into(),
                    nodes: reports,
                });
            }
            if run.state == RunState::Validated
                && let Some(journal) = Journal::load(&store, &run_id).await?
            {
                staged_tables.insert(table.clone(), target_table.clone());
                staged.push((table, journal));
            }
            reports.push(run);
        }
        if self.stage_only || staged.is_empty() {
            let outcome = if !staged.is_empty() {
                "staged"
            } else if reports
                .iter()
                .all(|r| r.outcome == Outcome::AlreadyPublished)
            {
                "already-published"
            } else {
                "up-to-date"
            };
            return Ok(CascadeRunReport {
                cascade_id: report.cascade_id,
                outcome: outcome.into(),
                nodes: reports,
            });
        }
        // Publish in dependency order; the record follows each landing. An interrupt before
        // this point publishes nothing; after it, the publishing runs to the end.
        if interrupted() {
            return Err(Error::Interrupted);
        }
        publish_in_order(&self.project, &mut reports, &mut record, &root_store).await?;
        Ok(CascadeRunReport {
            cascade_id: report.cascade_id,
            outcome: "published".into(),
            nodes: reports,
        })
    }
}

/// Publishes each validated node in dependency order, checking first that its parents did
/// not move where it reads them; the record follows each landing.
async fn publish_in_order(
    project: &Project,
    reports: &mut [RunReport],
    record: &mut CascadeRecord,
    root_store: &Arc<dyn deltalake::ObjectStore>,
) -> Result<()> {
    for (index, run) in reports.iter_mut().enumerate() {
        if run.state != RunState::Validated {
            continue;
        }
        let published = match super::parents::check_parents(project, record, index).await {
            Ok(()) => publish_run(project, &run.run_id, None).await,
            Err(error) => Err(error),
        };
        let published = match published {
            Ok(published) => published,
            Err(error) => {
                record.nodes[index].state = format!("failed: {error}");
                save(root_store, record).await;
                return Err(error);
            }
        };
        record.nodes[index].state = published.state.to_string();
        record.nodes[index].published_version = published.published_version;
        save(root_store, record).await;
        *run = published;
        failpoint::reach(CrashPoint::CascadeBetweenPublishes).await?;
    }
    Ok(())
}

/// The record of a cascade about to run: every node planned.
fn new_record(report: &super::CascadeReport) -> CascadeRecord {
    CascadeRecord {
        cascade_id: report.cascade_id.clone(),
        root: report.root.clone(),
        nodes: report
            .nodes
            .iter()
            .map(|n| RecordNode {
                model: n.model.clone(),
                table: n.target.clone(),
                run_id: n.run_id.clone(),
                state: "planned".into(),
                published_version: None,
            })
            .collect(),
        created_at: lakefill_table::time::now(),
        updated_at: lakefill_table::time::now(),
    }
}

/// Points `plan` at the output of the nodes staged before it: each source that is a staged
/// parent reads its staged rows, and the checks' `staged.<table>` sees every staged node.
fn read_staged(
    plan: &mut lakefill_recompute::plan::BackfillPlan,
    staged: &[(String, Journal)],
    staged_tables: &std::collections::HashMap<String, deltalake::DeltaTable>,
) {
    for source in &mut plan.sources {
        let Some((_, parent)) = staged.iter().find(|(table, _)| *table == source.name) else {
            continue;
        };
        source.overlay = overlay(parent);
    }
    for (table, journal) in staged {
        let Some(next) = overlay(journal) else {
            continue;
        };
        let Some(opened) = staged_tables.get(table) else {
            continue;
        };
        plan.cascade_staged
            .push((table.clone(), opened.clone(), next));
    }
}

impl std::future::IntoFuture for CascadeRunner {
    type Output = Result<CascadeRunReport>;
    type IntoFuture = futures::future::BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// The parent's staged output as an overlay of its table for a child's queries.
fn overlay(parent: &Journal) -> Option<Overlay> {
    let adds: Vec<deltalake::kernel::Add> = parent.new_row_files().cloned().collect();
    let layout = parent.inputs.layout.clone();
    let range = parent.inputs.range.clone();
    let partition_columns = layout.partition_columns.clone();
    let key = format!("cascade-{}", parent.run_id);
    Some(Overlay {
        layout,
        range,
        staged: Arc::new(move |ctx, table, schema| {
            let staged =
                StagedTable::register_store(ctx, table, schema, &partition_columns, &adds, &key)?;
            Ok(staged)
        }),
    })
}
