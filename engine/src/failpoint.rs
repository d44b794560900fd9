//! Fault points for fault-injection tests.
//!
//! With the `failpoints` feature (enabled by the test builds only), the environment variable
//! `LAKEFILL_FAILPOINTS` arms points by name, each with an action: `name` or `name=abort` aborts
//! the process the way a power cut or a `kill -9` would (no cleanup, no journal update),
//! `name=error` makes the point return an error as a failing store or query would, `name=once`
//! fails it the first time a process reaches it, where the caller asks (see [`armed_once`]),
//! `name=pause` stops there until the process is signalled (for SIGINT and SIGKILL tests), and
//! `name=sleep-MS` waits there MS milliseconds, then goes on.
//! Without the feature every point is a no-op the compiler removes.
//!
//! Points, in the order a backfill reaches them: `after-plan`, `stage-batch-<k>` (while staging
//! batch `k`), `mid-stage` (after the first batch is journaled), `stage-writer-start` (in a cluster's
//! executor: a writer task starts), `stage-writer-<partition>` (there: a writer task has staged
//! that partition's files and not reported them), `cluster-job-status` (the client of a cluster,
//! each time its job's status says queued or running), `after-stage`, `after-adjust`
//! (with adjustments: the adjustment rows are staged and journaled), `mid-validate`,
//! `before-commit`, `lost-commit-response` (error only: the commit lands but reports a failure),
//! `after-commit` (the commit is in the log, the journal does not know yet), `mid-notify` (the
//! event is in the outbox, no sink has it yet). `lakefill revert` passes `before-commit`,
//! `lost-commit-response` and `after-commit` too. `run-found` (`publish`, `discard`: the run's
//! table is found, its lease not yet taken) and `gc-listed` (`gc`: the garbage is listed, none
//! deleted) are for races with other processes.

use lakefill_table::error::Result;

/// Acts on the point `name` if it is armed.
pub(crate) async fn reach(name: &str) -> Result<()> {
    #[cfg(feature = "failpoints")]
    if let Some(action) = armed(name) {
        match action.as_str() {
            "error" => {
                return Err(lakefill_table::error::Error::Internal(format!(
                    "injected failure at `{name}`"
                )));
            }
            // Acted on by the caller, through `armed_once`.
            "once" => {}
            "pause" => {
                tracing::error!(failpoint = name, "failpoint hit: pausing");
                futures::future::pending::<()>().await;
            }
            sleep if sleep.starts_with("sleep-") => {
                let millis = sleep["sleep-".len()..].parse().unwrap_or(1000);
                tracing::error!(failpoint = name, millis, "failpoint hit: sleeping");
                tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
            }
            _ => {
                tracing::error!(failpoint = name, "failpoint hit: aborting");
                std::process::abort();
            }
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
    Ok(())
}

/// Returns whether the point `name` is armed with `error` (for points inside synchronous code).
pub(crate) fn armed_error(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    return armed(name).is_some_and(|action| action == "error");
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// Whether the point `name` is armed with `once` and this process reaches it for the first time
/// (for a failure the caller turns into one its retry logic retries, e.g. a cluster task's).
#[cfg(feature = "distributed")]
pub(crate) fn armed_once(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        static FIRED: std::sync::Mutex<std::collections::BTreeSet<String>> =
            std::sync::Mutex::new(std::collections::BTreeSet::new());
        armed(name).is_some_and(|action| action == "once")
            && FIRED
                .lock()
                .map(|mut fired| fired.insert(name.to_string()))
                .unwrap_or(false)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

#[cfg(feature = "failpoints")]
fn armed(name: &str) -> Option<String> {
    let armed = std::env::var("LAKEFILL_FAILPOINTS").ok()?;
    armed.split(',').find_map(|entry| {
        let (point, action) = entry
            .trim()
            .split_once('=')
            .unwrap_or((entry.trim(), "abort"));
        (point == name).then(|| action.to_string())
    })
}
