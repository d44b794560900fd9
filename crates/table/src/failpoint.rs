//! Crash points for fault-injection tests.
//!
//! Every place a run can be made to stop is a [`CrashPoint`]; the tests' fault matrices are made
//! from [`CrashPoint::ALL`], so a new point is tried by every matrix that covers its command.
//!
//! With the `failpoints` feature (enabled by the test builds only), the environment variable
//! `LAKEFILL_FAILPOINTS` arms points by name, each with an action: `name` or `name=abort` aborts
//! the process the way a power cut or a `kill -9` would (no cleanup, no journal update),
//! `name=error` makes the point return an error as a failing store or query would, `name=once`
//! fails it the first time a process reaches it, where the caller asks (see [`armed_once`]),
//! `name=pause` stops there until the process is signalled (for SIGINT and SIGKILL tests), and
//! `name=sleep-MS` waits there MS milliseconds, then goes on.
//! Without the feature every point is a no-op the compiler removes.

use std::fmt;

use crate::error::Result;

/// A place where a run can be stopped, in the order a backfill reaches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrashPoint<'a> {
    /// The plan is made; no journal exists yet.
    AfterPlan,
    /// While staging batch `k` (counted from 0).
    StageBatch(usize),
    /// After the first batch is journaled.
    MidStage,
    /// In a cluster's executor: a writer task starts.
    StageWriterStart,
    /// In a cluster's executor: a writer task has staged this partition's files and not reported
    /// them.
    StageWriter(&'a str),
    /// On a cluster's client, each time its job's status says queued or running.
    ClusterJobStatus,
    /// Every batch is staged and journaled.
    AfterStage,
    /// With adjustments: the adjustment rows are staged and journaled.
    AfterAdjust,
    /// While validating.
    MidValidate,
    /// Validated; the commit is not attempted yet.
    BeforeCommit,
    /// lakefill's own commit (for a table whose features delta-rs's commit refuses) is complete
    /// for the version it goes on, and not yet written.
    OwnCommitWrite,
    /// The commit lands but reports a failure (`error` only).
    LostCommitResponse,
    /// The commit is in the log; the journal does not know yet.
    AfterCommit,
    /// The event is in the outbox; no sink has it yet.
    MidNotify,
    /// A cascade published a node and not yet the next.
    CascadeBetweenPublishes,
    /// `publish`, `discard`: the run's table is found, its lease not yet taken.
    RunFound,
    /// `gc`: the garbage is listed, none deleted.
    GcListed,
}

impl CrashPoint<'static> {
    /// Every point, one of each kind (batch 0 and partition `p` for the parameterized ones), in
    /// the order a run reaches them.
    pub const ALL: [CrashPoint<'static>; 17] = [
        CrashPoint::AfterPlan,
        CrashPoint::StageBatch(0),
        CrashPoint::MidStage,
        CrashPoint::StageWriterStart,
        CrashPoint::StageWriter("p"),
        CrashPoint::ClusterJobStatus,
        CrashPoint::AfterStage,
        CrashPoint::AfterAdjust,
        CrashPoint::MidValidate,
        CrashPoint::BeforeCommit,
        CrashPoint::OwnCommitWrite,
        CrashPoint::LostCommitResponse,
        CrashPoint::AfterCommit,
        CrashPoint::MidNotify,
        CrashPoint::CascadeBetweenPublishes,
        CrashPoint::RunFound,
        CrashPoint::GcListed,
    ];
}

impl CrashPoint<'_> {
    /// What a run that reaches this point is doing.
    pub fn phase(&self) -> CrashPhase {
        match self {
            CrashPoint::AfterPlan => CrashPhase::Plan,
            CrashPoint::StageBatch(_)
            | CrashPoint::MidStage
            | CrashPoint::StageWriterStart
            | CrashPoint::StageWriter(_)
            | CrashPoint::ClusterJobStatus => CrashPhase::Stage,
            CrashPoint::AfterStage | CrashPoint::AfterAdjust => CrashPhase::Staged,
            CrashPoint::MidValidate => CrashPhase::Validate,
            CrashPoint::BeforeCommit | CrashPoint::OwnCommitWrite => CrashPhase::Commit,
            CrashPoint::LostCommitResponse | CrashPoint::AfterCommit | CrashPoint::MidNotify => {
                CrashPhase::Committed
            }
            CrashPoint::CascadeBetweenPublishes => CrashPhase::Committed,
            CrashPoint::RunFound | CrashPoint::GcListed => CrashPhase::Other,
        }
    }

    /// Whether a local backfill of the given kind passes this point.
    pub fn on_local_backfill(&self, adjustments: bool) -> bool {
        match self {
            CrashPoint::StageWriterStart
            | CrashPoint::StageWriter(_)
            | CrashPoint::ClusterJobStatus
            | CrashPoint::CascadeBetweenPublishes
            | CrashPoint::RunFound
            | CrashPoint::GcListed
            // Reached only when the table has sinks.
            | CrashPoint::MidNotify
            // Reached only on tables lakefill commits to itself.
            | CrashPoint::OwnCommitWrite => false,
            CrashPoint::AfterAdjust => adjustments,
            _ => true,
        }
    }

    /// Whether a revert (of the files a run replaced, or logical) passes this point.
    pub fn on_revert(&self, logical: bool) -> bool {
        match self {
            CrashPoint::BeforeCommit | CrashPoint::LostCommitResponse | CrashPoint::AfterCommit => {
                true
            }
            CrashPoint::AfterStage => logical,
            _ => false,
        }
    }

    /// Whether the point acts only with `error` (it has nothing to abort in between).
    pub fn error_only(&self) -> bool {
        matches!(self, CrashPoint::LostCommitResponse)
    }
}

/// The phases of a run, as its crash points see them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPhase {
    /// Scoping; nothing recorded.
    Plan,
    /// Batches being staged.
    Stage,
    /// Everything staged, not validated.
    Staged,
    /// Validating.
    Validate,
    /// Validated, not committed.
    Commit,
    /// The commit is in the log.
    Committed,
    /// Not part of a run's phases (`publish`, `discard`, `gc`).
    Other,
}

impl fmt::Display for CrashPoint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashPoint::AfterPlan => f.write_str("after-plan"),
            CrashPoint::StageBatch(k) => write!(f, "stage-batch-{k}"),
            CrashPoint::MidStage => f.write_str("mid-stage"),
            CrashPoint::StageWriterStart => f.write_str("stage-writer-start"),
            CrashPoint::StageWriter(partition) => write!(f, "stage-writer-{partition}"),
            CrashPoint::ClusterJobStatus => f.write_str("cluster-job-status"),
            CrashPoint::AfterStage => f.write_str("after-stage"),
            CrashPoint::AfterAdjust => f.write_str("after-adjust"),
            CrashPoint::MidValidate => f.write_str("mid-validate"),
            CrashPoint::BeforeCommit => f.write_str("before-commit"),
            CrashPoint::OwnCommitWrite => f.write_str("own-commit-write"),
            CrashPoint::LostCommitResponse => f.write_str("lost-commit-response"),
            CrashPoint::AfterCommit => f.write_str("after-commit"),
            CrashPoint::MidNotify => f.write_str("mid-notify"),
            CrashPoint::CascadeBetweenPublishes => f.write_str("cascade-between-publishes"),
            CrashPoint::RunFound => f.write_str("run-found"),
            CrashPoint::GcListed => f.write_str("gc-listed"),
        }
    }
}

/// Acts on the point if it is armed.
pub async fn reach(point: CrashPoint<'_>) -> Result<()> {
    #[cfg(feature = "failpoints")]
    if let Some(action) = armed(point) {
        let name = point.to_string();
        let name = name.as_str();
        match action.as_str() {
            "error" => {
                return Err(crate::error::Error::Internal(format!(
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
    let _ = point;
    Ok(())
}

/// Returns whether the point is armed with `error` (for points inside synchronous code).
pub fn armed_error(point: CrashPoint<'_>) -> bool {
    #[cfg(feature = "failpoints")]
    return armed(point).is_some_and(|action| action == "error");
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = point;
        false
    }
}

/// Whether the point is armed with `once` and this process reaches it for the first time (for a
/// failure the caller turns into one its retry logic retries, e.g. a cluster task's).
pub fn armed_once(point: CrashPoint<'_>) -> bool {
    #[cfg(feature = "failpoints")]
    {
        static FIRED: std::sync::Mutex<std::collections::BTreeSet<String>> =
            std::sync::Mutex::new(std::collections::BTreeSet::new());
        armed(point).is_some_and(|action| action == "once")
            && FIRED
                .lock()
                .map(|mut fired| fired.insert(point.to_string()))
                .unwrap_or(false)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = point;
        false
    }
}

#[cfg(feature = "failpoints")]
fn armed(point: CrashPoint<'_>) -> Option<String> {
    let armed = std::env::var("LAKEFILL_FAILPOINTS").ok()?;
    let name = point.to_string();
    armed.split(',').find_map(|entry| {
        let (point, action) = entry
            .trim()
            .split_once('=')
            .unwrap_or((entry.trim(), "abort"));
        (point == name).then(|| action.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_has_its_own_name() {
        let names: std::collections::BTreeSet<String> =
            CrashPoint::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names.len(), CrashPoint::ALL.len());
        assert_eq!(CrashPoint::StageBatch(2).to_string(), "stage-batch-2");
    }
}
