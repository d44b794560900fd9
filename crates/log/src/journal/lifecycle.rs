//! The life cycle of a run: its states and the only transitions between them (DESIGN §4).
//!
//! ```text
//! planned ─► staging ─► staged ─► validating ─┬─► validated ─────────┬─► publishing ─► published
//!               │                     │       ├─► failed-validation ─┘ (forced)  │
//!               │                     │       └─► up-to-date                      │
//!               └──────► failed ◄─────┴──────────────────────────────────────────┘
//! ```
//!
//! `failed` means staging or validation could not finish (or the target moved under the
//! publish): the run is resumed by running its backfill again, or discarded, never published.
//! Every state but `published` may be discarded. Which command may do what with a run is decided
//! here, in one place; the commands call [`RunState::check_transition`] and
//! [`RunState::publishable`] instead of testing states themselves.

use serde::{Deserialize, Serialize};

use lakefill_table::error::{Error, Result};

/// The state of a run (DESIGN §4, `lakefill runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    /// Planned, nothing staged yet.
    Planned,
    /// Staging batches.
    Staging,
    /// Every batch staged; not validated yet.
    Staged,
    /// Comparing the staged rows with the rows they replace.
    Validating,
    /// Staged and validated; waiting to be published.
    Validated,
    /// Validation failed; publishable only with `--force-publish --reason`.
    FailedValidation,
    /// The commit is being made (a crash here is resolved by reading the Delta log).
    Publishing,
    /// Committed to the target.
    Published,
    /// The staged rows equal the current rows: nothing to publish.
    UpToDate,
    /// Staging or validation could not finish; resume it by running the backfill again.
    Failed,
    /// Staged files deleted on request.
    Discarded,
}

impl RunState {
    /// Every state, in life-cycle order.
    pub const ALL: [RunState; 11] = [
        RunState::Planned,
        RunState::Staging,
        RunState::Staged,
        RunState::Validating,
        RunState::Validated,
        RunState::FailedValidation,
        RunState::Publishing,
        RunState::Published,
        RunState::UpToDate,
        RunState::Failed,
        RunState::Discarded,
    ];

    /// Returns whether a run may go from `self` to `next`.
    pub fn allows(self, next: RunState) -> bool {
        use RunState::*;
        match (self, next) {
            // Resuming: any run that did not publish may be staged again (its kept batches are
            // checked against the journal first).
            (
                Planned | Staging | Staged | Validating | Validated | FailedValidation | Publishing
                | Failed | UpToDate | Discarded,
                Staging,
            ) => true,
            (Planned, Discarded) => true,
            (Staging, Staged | Failed) => true,
            (Staged, Validating | Failed) => true,
            (Validating, Validated | FailedValidation | UpToDate | Failed) => true,
            (Validated | FailedValidation, Publishing) => true,
            // A publish whose commit did not land: the run is as it was before.
            (Publishing, Validated | FailedValidation | Failed) => true,
            // The log says the commit is there (the only way into `published`).
            (Publishing, Published) => true,
            (
                Staging | Staged | Validating | Validated | FailedValidation | Publishing | Failed
                | UpToDate,
                Discarded,
            ) => true,
            _ => false,
        }
    }

    /// Fails with an internal error when the transition is not in the life cycle.
    pub fn check_transition(self, next: RunState, run_id: &str) -> Result<()> {
        if self.allows(next) {
            Ok(())
        } else {
            Err(Error::Internal(format!(
                "run `{run_id}` cannot go from {self} to {next}"
            )))
        }
    }

    /// Returns whether the run is finished and will not change again by itself.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Published | RunState::UpToDate | RunState::Discarded
        )
    }

    /// Returns whether the run is on its way to being published: neither finished nor failed.
    pub fn is_in_progress(self) -> bool {
        matches!(
            self,
            RunState::Planned
                | RunState::Staging
                | RunState::Staged
                | RunState::Validating
                | RunState::Validated
                | RunState::FailedValidation
                | RunState::Publishing
        )
    }

    /// Decides whether `publish` may commit a run in this state (DESIGN §4).
    ///
    /// `forced` is the non-empty reason given with `--force-publish`; `resume` the command that
    /// resumes the run; `failed_checks` the checks its validation failed.
    pub fn publishable(
        self,
        run_id: &str,
        forced: Option<&str>,
        resume: &str,
        failed_checks: Vec<String>,
        protocol_violations: Vec<String>,
    ) -> Result<Publishable> {
        let refuse = |next: String| Error::RunState {
            run_id: run_id.to_string(),
            state: self.to_string(),
            action: "published".to_string(),
            next,
        };
        match self {
            RunState::Validated => Ok(Publishable::Commit),
            RunState::FailedValidation => match forced {
                Some(_) if protocol_violations.is_empty() => Ok(Publishable::Commit),
                _ => Err(Error::ValidationFailed {
                    run_id: run_id.to_string(),
                    forceable: protocol_violations.is_empty(),
                    failed: failed_checks,
                    clean_range: None,
                }),
            },
            RunState::Published => Ok(Publishable::AlreadyPublished),
            RunState::UpToDate => Ok(Publishable::UpToDate),
            RunState::Staged | RunState::Validating => Err(refuse(format!(
                "its validation never completed: run `{resume}` to resume it (the staged batches are kept) and validate it"
            ))),
            RunState::Planned | RunState::Staging | RunState::Failed | RunState::Publishing => {
                Err(refuse(format!(
                    "it did not finish: run `{resume}` to resume it, or `lakefill discard {run_id}` to drop it"
                )))
            }
            RunState::Discarded => Err(refuse(format!(
                "its staged files were deleted: run `{resume}` to stage it again"
            ))),
        }
    }
}

/// What `publish` does with a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publishable {
    /// Make the commit.
    Commit,
    /// Nothing: the log already has it.
    AlreadyPublished,
    /// Nothing: the staged rows equal the current ones.
    UpToDate,
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            RunState::Planned => "planned",
            RunState::Staging => "staging",
            RunState::Staged => "staged",
            RunState::Validating => "validating",
            RunState::Validated => "validated",
            RunState::FailedValidation => "failed-validation",
            RunState::Publishing => "publishing",
            RunState::Published => "published",
            RunState::UpToDate => "up-to-date",
            RunState::Failed => "failed",
            RunState::Discarded => "discarded",
        };
        f.write_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_validated_or_forced_failed_validation_runs_publish() {
        for state in RunState::ALL {
            let plain = state.publishable("r", None, "lakefill backfill m", Vec::new(), Vec::new());
            let forced = state.publishable(
                "r",
                Some("because"),
                "lakefill backfill m",
                Vec::new(),
                Vec::new(),
            );
            match state {
                RunState::Validated => {
                    assert_eq!(plain.expect("validated"), Publishable::Commit);
                }
                RunState::FailedValidation => {
                    assert_eq!(plain.expect_err("not forced").exit_code(), 3);
                    assert_eq!(forced.expect("forced"), Publishable::Commit);
                    let broken = state.publishable(
                        "r",
                        Some("because"),
                        "lakefill backfill m",
                        vec!["constraint c".into()],
                        vec!["constraint c".into()],
                    );
                    assert_eq!(broken.expect_err("protocol").exit_code(), 3);
                }
                RunState::Published => {
                    assert_eq!(plain.expect("done"), Publishable::AlreadyPublished)
                }
                RunState::UpToDate => assert_eq!(plain.expect("done"), Publishable::UpToDate),
                _ => {
                    assert_eq!(plain.expect_err("refused").exit_code(), 2, "{state}");
                    assert_eq!(forced.expect_err("refused").exit_code(), 2, "{state}");
                }
            }
        }
    }

    #[test]
    fn the_log_is_the_only_way_into_published_and_published_never_leaves() {
        for state in RunState::ALL {
            assert_eq!(
                state.allows(RunState::Published),
                state == RunState::Publishing,
                "{state}"
            );
            assert!(!RunState::Published.allows(state), "published -> {state}");
        }
    }

    #[test]
    fn failed_runs_resume_or_are_discarded_never_published() {
        for next in RunState::ALL {
            let allowed = RunState::Failed.allows(next);
            assert_eq!(
                allowed,
                matches!(next, RunState::Staging | RunState::Discarded),
                "failed -> {next}"
            );
        }
    }
}
