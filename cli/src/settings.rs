//! Merges arguments, the project file and the environment into engine calls.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use lakefill::{PlanBuilder, Project, RunSettings};

use crate::args::{GlobalArgs, ScopeArgs, SpillPolicy};

/// Loads the project named by `--project`, or the nearest one upward from the current dir, and
/// resolves the tables it names through a catalog (`glue://…`), once for the whole command.
pub(crate) async fn project(global: &GlobalArgs) -> anyhow::Result<Project> {
    let mut project = match &global.project {
        Some(dir) => Project::load(dir)?,
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            Project::discover(&cwd)?
        }
    };
    project.resolve_catalog().await?;
    Ok(project)
}

/// Builds the plan request for `scope`, with `settings` resolved.
pub(crate) fn plan_builder(
    project: &Project,
    scope: &ScopeArgs,
    settings: RunSettings,
) -> anyhow::Result<PlanBuilder> {
    let mut versions = Vec::new();
    for pin in &scope.source_versions {
        versions.push(parse_source_version(pin)?);
    }
    Ok(PlanBuilder::scoped(project, &scope.model, scope.range())
        .with_model_version(model_versions(scope, false)?.0)
        .with_settings(settings)
        .with_source_versions(versions)
        .with_allow_spill_drop(scope.allow_spill == Some(SpillPolicy::Drop))
        .with_include_null(scope.include_null)
        .with_where(scope.rows.clone())
        .with_max_partitions(scope.max_partitions)
        .with_reason(scope.reason.clone())
        .with_allow_edge_moves(
            scope
                .allow_edge_moves
                .then(|| scope.reason.clone())
                .flatten(),
        )
        .with_publish_as(scope.publish_as.map(|mode| {
            match mode {
                crate::args::PublishAs::Rewrite => "rewrite",
                crate::args::PublishAs::Adjustments => "adjustments",
            }
            .to_string()
        })))
}

/// The root model's version, and every `MODEL=VERSION` pin of `--model-version`; pins of other
/// models are refused unless `cascade`.
pub(crate) fn model_versions(
    scope: &ScopeArgs,
    cascade: bool,
) -> Result<(Option<String>, BTreeMap<String, String>), lakefill::Error> {
    let mut root = None;
    let mut pins = BTreeMap::new();
    for entry in &scope.model_version {
        let (model, version) = match entry.split_once('=') {
            Some((model, version)) => (model.trim().to_string(), version.trim().to_string()),
            None => (scope.model.clone(), entry.trim().to_string()),
        };
        let invalid = |message: String| lakefill::Error::InvalidOption {
            option: "--model-version".into(),
            value: entry.clone(),
            message,
        };
        if version.is_empty() {
            return Err(invalid("expected VERSION or MODEL=VERSION".into()));
        }
        if model != scope.model && !cascade {
            return Err(invalid(format!(
                "`{model}` is not the model run here (`{}`); other models are pinned only with `--cascade`",
                scope.model
            )));
        }
        if pins.insert(model.clone(), version.clone()).is_some() {
            return Err(invalid(format!("`{model}` is pinned twice")));
        }
        if model == scope.model {
            root = Some(version);
        }
    }
    Ok((root, pins))
}

fn parse_source_version(pin: &str) -> Result<(String, u64), lakefill::Error> {
    let invalid = |message: &str| lakefill::Error::InvalidOption {
        option: "--source-version".into(),
        value: pin.to_string(),
        message: message.to_string(),
    };
    let (table, version) = pin
        .split_once('=')
        .ok_or_else(|| invalid("expected TABLE=VERSION"))?;
    let version: u64 = version
        .trim()
        .parse()
        .map_err(|_| invalid("the version must be a whole number, 0 or more"))?;
    Ok((table.trim().to_string(), version))
}

/// Shows a path relative to the current directory when it is below it.
pub(crate) fn display_path(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| path.display().to_string())
}
