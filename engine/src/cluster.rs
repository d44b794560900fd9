//! `lakefill cluster up`: an Apache Ballista cluster on this machine for trying distributed
//! staging (see `lakefill-ballista`, behind the `distributed` feature): a scheduler, and
//! executors that the CLI starts as processes of their own.

use std::net::SocketAddr;

use lakefill_table::error::Result;

/// A running scheduler (see [`start_scheduler`]).
pub struct Scheduler {
    #[cfg(feature = "distributed")]
    inner: lakefill_ballista::cluster::Scheduler,
}

impl Scheduler {
    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        #[cfg(feature = "distributed")]
        return self.inner.address;
        #[cfg(not(feature = "distributed"))]
        unreachable!("no scheduler starts without distributed staging")
    }

    /// Waits (at most `timeout`) until `count` executors have registered with it; returns how
    /// many have.
    pub async fn await_executors(&self, count: usize, timeout: std::time::Duration) -> usize {
        #[cfg(feature = "distributed")]
        {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let registered = self.inner.registered_executors().await;
                if registered >= count || tokio::time::Instant::now() >= deadline {
                    return registered;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        #[cfg(not(feature = "distributed"))]
        {
            let _ = (count, timeout);
            0
        }
    }
}

/// Starts a Ballista scheduler listening on `bind` (port 0 picks a free one), with lakefill's
/// codec registered; it runs until the process exits.
pub async fn start_scheduler(bind: SocketAddr) -> Result<Scheduler> {
    #[cfg(feature = "distributed")]
    return Ok(Scheduler {
        inner: lakefill_ballista::cluster::start_scheduler(bind).await?,
    });
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
