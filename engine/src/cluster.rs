//! `lakefill cluster up`: an Apache Ballista cluster on this machine for trying distributed
//! staging (see `crate::distributed`, behind the `distributed` feature): a scheduler, and
//! executors that the CLI starts as processes of their own.

use std::net::SocketAddr;

use crate::error::Result;

/// Starts a Ballista scheduler listening on `bind` (port 0 picks a free one), with lakefill's
/// codec registered; it runs until the process exits. Returns where it listens.
pub async fn start_scheduler(bind: SocketAddr) -> Result<SocketAddr> {
    #[cfg(feature = "distributed")]
    return crate::distributed::cluster::start_scheduler(bind).await;
    #[cfg(not(feature = "distributed"))]
    Err(not_built(&bind.to_string()))
}

/// Starts a Ballista executor of `vcores` task slots for the scheduler at `scheduler`
/// (`http://HOST:PORT`), listening on a free loopback port, with lakefill's codec registered; it
/// runs until the process exits. It reads and writes tables with this process's own object-store
/// credentials, never the client's. Its tasks share one memory pool of `memory_limit` bytes
/// (they spill to disk beyond it); `None` lifts the bound.
pub async fn start_executor(
    scheduler: &str,
    vcores: usize,
    memory_limit: Option<u64>,
) -> Result<()> {
    #[cfg(feature = "distributed")]
    return crate::distributed::cluster::start_executor(scheduler, vcores, memory_limit).await;
    #[cfg(not(feature = "distributed"))]
    {
        let _ = (vcores, memory_limit);
        Err(not_built(scheduler))
    }
}

#[cfg(not(feature = "distributed"))]
fn not_built(value: &str) -> crate::error::Error {
    crate::error::Error::InvalidOption {
        option: "cluster".into(),
        value: value.into(),
        message: "this lakefill was built without distributed staging; build it with `--features distributed`".into(),
    }
}
