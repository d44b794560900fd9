//! `lakefill cluster up`: a Ballista scheduler in this process and executors as child processes,
//! on this machine, until Ctrl-C.

use std::process::Stdio;

use tokio::io::AsyncReadExt as _;

use crate::args::{ClusterAction, ClusterArgs};
use crate::printer::Printer;

#[derive(serde::Serialize)]
struct Up {
    /// What to pass as `backfill --engine`.
    engine: String,
    scheduler: String,
    executors: Vec<u32>,
    vcores: usize,
    /// Memory per executor in bytes; absent: unbounded.
    memory_limit: Option<u64>,
}

pub(crate) async fn run(args: &ClusterArgs, printer: Printer) -> anyhow::Result<()> {
    match &args.action {
        ClusterAction::Up {
            port,
            bind,
            executors,
            vcores,
            memory_limit,
        } => {
            let memory_limit = match memory_limit.as_deref() {
                None => Some(lakefill::default_memory_limit()),
                Some(text) if text.eq_ignore_ascii_case("unlimited") => None,
                Some(text) => Some(lakefill::parse_size(text).map_err(|_| {
                    lakefill::Error::InvalidOption {
                        option: "--memory-limit".into(),
                        value: text.into(),
                        message: "expected a size such as `2GiB`, or `unlimited`".into(),
                    }
                })?),
            };
            up(*bind, *port, *executors, *vcores, memory_limit, printer).await
        }
        ClusterAction::Executor {
            scheduler,
            bind,
            vcores,
            memory_limit,
        } => {
            let executor = lakefill::run_executor(scheduler, *bind, *vcores, *memory_limit);
            // Until whoever started it goes away (its end of our standard input closes), or the
            // executor stops by itself (Ctrl-C, SIGTERM, an error).
            let parent_gone = async {
                let mut stdin = tokio::io::stdin();
                let mut buffer = [0u8; 64];
                loop {
                    match stdin.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            };
            tokio::select! {
                ran = executor => Ok(ran?),
                () = parent_gone => Ok(()),
            }
        }
    }
}

async fn up(
    bind: std::net::IpAddr,
    port: u16,
    executors: usize,
    vcores: Option<usize>,
    memory_limit: Option<u64>,
    printer: Printer,
) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let vcores = vcores.unwrap_or_else(|| (cores / executors).max(1));
    let started = lakefill::start_scheduler(std::net::SocketAddr::new(bind, port)).await?;
    let address = started.address();
    let scheduler = format!("http://{address}");
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    // Held until this process exits (waiting on a child would close its standard input).
    let mut pipes = Vec::new();
    for _ in 0..executors {
        // Each executor's standard input is a pipe from this process: when it exits, however it
        // exits, the pipe closes and the executor stops.
        let mut command = tokio::process::Command::new(&exe);
        command
            .args(["cluster", "executor", "--scheduler", &scheduler, "--vcores"])
            .arg(vcores.to_string())
            .arg("--bind")
            .arg(bind.to_string());
        if let Some(limit) = memory_limit {
            command.arg("--memory-limit").arg(limit.to_string());
        }
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let mut child = child;
        pipes.push(child.stdin.take());
        children.push(child);
    }
    // Up once every executor has registered: a backfill sent sooner would find fewer task
    // slots than the message says (and run all its tasks on the first executor up).
    let registered = started
        .await_executors(executors, std::time::Duration::from_secs(60))
        .await;
    if registered < executors {
        anyhow::bail!(
            "only {registered} of {executors} executors registered with the scheduler within a minute; see their errors above"
        );
    }
    let up = Up {
        engine: format!("df://{address}"),
        scheduler: address.to_string(),
        executors: children.iter().filter_map(|c| c.id()).collect(),
        vcores,
        memory_limit,
    };
    printer.result(
        &format!(
            "scheduler listening on {address} with {executors} executors of {vcores} task slots and {} each; stage on it with `lakefill backfill … --engine {}`; Ctrl-C stops it\n",
            memory_limit.map_or("unbounded memory".to_string(), |m| format!("{} of memory", crate::render::bytes(m))),
            up.engine
        ),
        &up,
    )?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        exited = wait_any(&mut children) => {
            anyhow::bail!("an executor stopped: {exited}");
        }
    }
    printer.status("stopping the cluster");
    drop(pipes);
    Ok(())
}

/// Waits until one of `children` exits; describes how.
async fn wait_any(children: &mut [tokio::process::Child]) -> String {
    let waits = children.iter_mut().map(|c| Box::pin(c.wait()));
    let (status, _, _) = futures::future::select_all(waits).await;
    match status {
        Ok(status) => status.to_string(),
        Err(e) => e.to_string(),
    }
}
