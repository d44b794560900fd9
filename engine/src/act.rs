//! Acting on what an id names: a run of its own, or a cascade (`cascade-…`). The commands that
//! take an id (`publish`, `discard`, `revert`, `report`) come here, so what an id names and how a
//! run is reverted are decided by the engine, and a front end only renders what was done.

use std::sync::Arc;

use serde::Serialize;

use crate::cascade::manage::{discard_cascade, is_cascade_id, publish_cascade, revert_cascade};
use crate::cascade::run::CascadeRunReport;
use crate::report::{ReportFormat, cascade_report, render, render_cascade, report};
use crate::run::BackfillBuilder;
use crate::run::manage::{discard_run, publish_run};
use crate::run::report::RunReport;
use crate::run::revert::{logical_revert_plan, revert_run, reverts_logically};
use lakefill_recompute::plan::{BackfillPlan, PlanReport};
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};
use lakefill_table::resources::ProgressSink;
use lakefill_table::settings::RunSettings;

/// What acting on an id did: one run, or each node of a cascade. Serialized as the report it
/// holds, so each keeps its own JSON document.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Acted {
    /// A run of its own.
    Run(Box<RunReport>),
    /// The nodes of a cascade, in dependency order.
    Cascade(Box<CascadeRunReport>),
}

impl Acted {
    /// The error a run or cascade that failed validation ends with (exit code 3).
    pub fn validation_error(&self) -> Option<Error> {
        match self {
            Acted::Run(run) => run.validation_error(),
            Acted::Cascade(cascade) => cascade.validation_error(),
        }
    }
}

/// Publishes the staged run, or every staged node of the cascade, that `id` names; `force`
/// publishes a run that failed validation, recording the reason.
pub async fn publish(project: &Project, id: &str, force: Option<String>) -> Result<Acted> {
    if is_cascade_id(id) {
        return Ok(Acted::Cascade(Box::new(
            publish_cascade(project, id).await?,
        )));
    }
    Ok(Acted::Run(Box::new(publish_run(project, id, force).await?)))
}

/// Discards the unpublished run, or the unpublished nodes of the cascade, that `id` names.
pub async fn discard(project: &Project, id: &str) -> Result<Acted> {
    if is_cascade_id(id) {
        return Ok(Acted::Cascade(Box::new(
            discard_cascade(project, id).await?,
        )));
    }
    Ok(Acted::Run(Box::new(discard_run(project, id).await?)))
}

/// The report of the run or cascade `id` names, rendered as `format`.
pub async fn rendered_report(project: &Project, id: &str, format: ReportFormat) -> Result<String> {
    if is_cascade_id(id) {
        return render_cascade(&cascade_report(project, id).await?, format);
    }
    render(&report(project, id).await?, format)
}

/// What `revert ID` was asked.
#[derive(Debug, Clone)]
pub struct RevertRequest {
    /// The run or cascade to revert.
    pub id: String,
    /// Why (recorded in the revert's commit).
    pub reason: Option<String>,
    /// Recompute the range as it was instead of putting back the files the run replaced.
    pub logical: bool,
    /// Check (and, for a logical revert, stage and validate) without committing.
    pub stage_only: bool,
    /// The settings of a logical revert's run, resolved once.
    pub settings: RunSettings,
}

/// What the caller lends a run: a way to interrupt it and where its progress goes.
#[derive(Default)]
pub struct RunHooks {
    /// Turns `true` to stop the run cleanly (see [`BackfillBuilder::with_interrupt`]).
    pub interrupt: Option<tokio::sync::watch::Receiver<bool>>,
    /// Receives the run's progress events.
    pub progress: Option<Arc<dyn ProgressSink>>,
}

/// How a revert goes, decided from what the id names and how its run was published.
#[derive(Debug)]
pub enum Revert {
    /// A cascade: its published nodes reverted in reverse order, each committed as it goes.
    Cascade(RevertRequest),
    /// A run that replaced files: one commit puts back the files it replaced.
    Files(RevertRequest),
    /// The run's range recomputed as it was and run like a backfill: asked for with `logical`,
    /// or the run appended adjustments (its revert appends their negation).
    Logical {
        /// The plan of the revert run.
        plan: Box<BackfillPlan>,
        /// What was asked.
        request: RevertRequest,
    },
}

impl Revert {
    /// Decides how `request` is carried out; refuses what cannot be (a cascade reviewed before
    /// its commits: each node is committed as it goes).
    pub async fn prepare(project: &Project, request: RevertRequest) -> Result<Self> {
        if is_cascade_id(&request.id) {
            if request.stage_only {
                return Err(Error::InvalidOption {
                    option: "--stage-only".into(),
                    value: request.id.clone(),
                    message: "a cascade is reverted node by node, each committed as it goes; revert a node's run on its own to review it first (see `lakefill runs`)".into(),
                });
            }
            return Ok(Revert::Cascade(request));
        }
        if request.logical || reverts_logically(project, &request.id).await? {
            let plan = logical_revert_plan(
                project,
                &request.id,
                request.reason.clone(),
                Some(request.settings.batch_partitions),
            )
            .await?;
            return Ok(Revert::Logical {
                plan: Box::new(plan),
                request,
            });
        }
        Ok(Revert::Files(request))
    }

    /// The plan of a logical revert (what it recomputes), before it runs.
    pub fn plan(&self) -> Option<&PlanReport> {
        match self {
            Revert::Logical { plan, .. } => Some(plan.report()),
            Revert::Cascade(_) | Revert::Files(_) => None,
        }
    }

    /// Carries the revert out. `hooks` is asked for only when a run is staged (a logical
    /// revert), so a revert by files keeps the caller's default Ctrl-C.
    pub async fn run(self, project: &Project, hooks: impl FnOnce() -> RunHooks) -> Result<Acted> {
        match self {
            Revert::Cascade(request) => {
                let report =
                    revert_cascade(project, &request.id, request.reason, request.logical).await?;
                Ok(Acted::Cascade(Box::new(report)))
            }
            Revert::Files(request) => {
                let report =
                    revert_run(project, &request.id, request.reason, request.stage_only).await?;
                Ok(Acted::Run(Box::new(report)))
            }
            Revert::Logical { plan, request } => {
                let hooks = hooks();
                let report = BackfillBuilder::new(*plan)
                    .with_interrupt(hooks.interrupt)
                    .with_settings(request.settings)
                    .with_progress(hooks.progress)
                    .with_stage_only(request.stage_only)
                    .await?;
                Ok(Acted::Run(Box::new(report)))
            }
        }
    }
}
