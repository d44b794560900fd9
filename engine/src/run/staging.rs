//! Where a run's batches are staged: here (`lakefill-recompute`'s `stage`), or on the Ballista cluster that
//! `--engine df://HOST:PORT` names (`lakefill-ballista`, feature `distributed`). The runner
//! chooses; staging never reaches for the cluster itself.

use std::collections::BTreeSet;

use lakefill_log::journal::BatchRecord;
use lakefill_recompute::plan::BackfillPlan;
use lakefill_recompute::stage::StageOptions;
use lakefill_table::error::Result;

/// Stages the batches of `plan` not in `skip`, where `options.engine` says (see
/// [`lakefill_recompute::stage::stage`]): each finished batch is sent to `finished`.
pub(crate) async fn stage(
    plan: &BackfillPlan,
    options: &StageOptions,
    skip: &BTreeSet<usize>,
    done: &[BatchRecord],
    finished: tokio::sync::mpsc::Sender<BatchRecord>,
) -> Result<()> {
    if let Some(engine) = &options.engine {
        check_engine(plan, engine, options.throttle.is_some())?;
        #[cfg(feature = "distributed")]
        return lakefill_ballista::stage(plan, options, engine, skip, finished).await;
    }
    lakefill_recompute::stage::stage(plan, options, skip, done, finished).await
}

/// Refuses a run on the cluster at `engine` that cannot be staged there (see
/// `lakefill-ballista`), or any when this build has no distributed staging.
pub(crate) fn check_engine(plan: &BackfillPlan, engine: &str, throttled: bool) -> Result<()> {
    #[cfg(feature = "distributed")]
    return lakefill_ballista::check(plan, engine, throttled);
    #[cfg(not(feature = "distributed"))]
    {
        let _ = (plan, throttled);
        Err(lakefill_table::error::Error::InvalidOption {
            option: "--engine".into(),
            value: engine.to_string(),
            message: "this lakefill was built without distributed staging; build it with `--features distributed` or run with `--engine local`".into(),
        })
    }
}
