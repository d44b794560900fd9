//! Crash points for fault-injection tests.
//!
//! With the `failpoints` feature (enabled by the test builds only), [`hit`] aborts the process
//! when the environment variable `LAKEFILL_FAILPOINTS` lists the point's name, the way a power
//! cut or a `kill -9` would stop it: no cleanup, no journal update. Without the feature it is a
//! no-op the compiler removes.
//!
//! Points, in the order a backfill reaches them: `after-plan`, `mid-stage` (after the first
//! batch is journaled), `after-stage`, `mid-validate`, `before-commit`, `after-commit` (the
//! commit is in the log, the journal does not know yet).

/// Aborts the process if the failpoint `name` is armed.
pub(crate) fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("LAKEFILL_FAILPOINTS")
        .is_ok_and(|armed| armed.split(',').any(|p| p.trim() == name))
    {
        tracing::error!(failpoint = name, "failpoint hit: aborting");
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
