//! `lakefill cluster up`: an Apache Ballista cluster on this machine for trying distributed
//! staging (see `lakefill-ballista`, behind the `distributed` feature): a scheduler, and
//! executors that the CLI starts as processes of their own.

use std::net::SocketAddr;

use lakefill_table::error::Result;

/// Starts a Ballista scheduler listening on `bind` (port 0 picks a free one), with lakefill's
/// codec registered; it runs until the process exits. Returns where it listens.
pub async fn start_scheduler(bind: SocketAddr) -> Result<SocketAddr> {
    #[cfg(feature = "distributed")]
    return lakefill_ballista::cluster::start_scheduler(bind).await;
    #[cfg(not(feature = "distributed"))]
    Err(not_built(&bind.to_string()))
}

/// Runs a Ballista executor of `vcores` task slots for the scheduler at `scheduler`
/// (`http://HOST:PORT`), its services on free ports of `bind`, with lakefill's codec
/// registered, until the process is stopped (Ctrl-C, SIGTERM) or the future is dropped. The
/// scheduler pushes tasks to it and cancels them through it. It reads and writes tables with
/// this process's own object-store credentials, never the client's. Its tasks share
/// `memory_limit` bytes (each task a pool of its slots' share; they spill to disk beyond it);
/// `None` lifts the bound.
pub async fn run_executor(
    scheduler: &str,
    bind: std::net::IpAddr,
    vcores: usize,
    memory_limit: Option<u64>,
) -> Result<()> {
    #[cfg(feature = "distributed")]
    return lakefill_ballista::cluster::run_executor(scheduler, bind, vcores, memory_limit).await;
    #[cfg(not(feature = "distributed"))]
    {
        let _ = (bind, vcores, memory_limit);
        Err(not_built(scheduler))
    }
}

#[cfg(not(feature = "distributed"))]
fn not_built(value: &str) -> lakefill_table::error::Error {
    lakefill_table::error::Error::InvalidOption {
        option: "cluster".into(),
        value: value.into(),
        message: "this lakefill was built without distributed staging; build it with `--features distributed`".into(),
    }
}
