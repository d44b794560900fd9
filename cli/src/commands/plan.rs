//! `lakefill plan`: scope a backfill (or, with `--cascade`, a backfill and everything downstream)
//! without writing.

use crate::args::{GlobalArgs, PlanArgs, ScopeArgs};
use crate::printer::Printer;
use crate::render;
use crate::settings;

pub(crate) async fn run(
    global: &GlobalArgs,
    args: &PlanArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let project = settings::project(global).await?;
    if args.cascade {
        let scope = &args.scope;
        refuse_single_model_flags(scope)?;
        let (_, pins) = settings::model_versions(scope, true)?;
        let (from, to) = cascade_range(scope)?;
        let cascade = lakefill::CascadeBuilder::new(&project, &scope.model, from, to)
            .with_where(scope.rows.clone())
            .with_model_versions(pins)
            .with_max_expansion(args.max_expansion)
            .with_settings(lakefill::RunSettings::for_planning(
                &project,
                scope.batch_partitions,
            )?)
            .with_reason(scope.reason.clone())
            .with_allow_edge_moves(
                scope
                    .allow_edge_moves
                    .then(|| scope.reason.clone())
                    .flatten(),
            )
            .await?;
        return printer.result(&render::cascade::plan(cascade.report()), cascade.report());
    }
    let planning = lakefill::RunSettings::for_planning(&project, args.scope.batch_partitions)?;
    let plan = settings::plan_builder(&project, &args.scope, planning)?.await?;
    printer.result(&render::plan::text(plan.report()), plan.report())
}

/// The range of a cascade: `--from` and `--to` are needed, since each node's range follows from
/// the root's through the windows.
pub(crate) fn cascade_range(scope: &ScopeArgs) -> Result<(String, String), lakefill::Error> {
    scope.range().ok_or_else(|| lakefill::Error::InvalidRange {
        message: "`--cascade` needs `--from` and `--to`: each model's range follows from the root's through the windows".into(),
    })
}

/// Flags that apply to one model are refused with `--cascade`.
pub(crate) fn refuse_single_model_flags(scope: &ScopeArgs) -> Result<(), lakefill::Error> {
    for (given, flag) in [
        (!scope.source_versions.is_empty(), "--source-version"),
        (scope.allow_spill.is_some(), "--allow-spill"),
        (scope.include_null, "--include-null"),
        (scope.max_partitions.is_some(), "--max-partitions"),
        (scope.publish_as.is_some(), "--publish-as"),
    ] {
        if given {
            return Err(lakefill::Error::InvalidOption {
                option: flag.into(),
                value: String::new(),
                message: "applies to one model; run that model without `--cascade`".into(),
            });
        }
    }
    Ok(())
}
