//! The `lakefill` command: parse, run the command, map the outcome to an exit code (DESIGN §3).

mod args;
mod commands;
mod printer;
mod render;
mod settings;

use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, Command};
use crate::printer::{Failure, Printer};

/// Stack of the thread that plans queries: deep SQL (a 20,000-item `IN` list) recurses deeply
/// in the planner and optimizer. The memory is reserved, not used, until a query needs it.
const PLANNING_STACK: usize = 512 * 1024 * 1024;

/// Threads the runtime may block on reads. delta-rs reads each deletion vector of a table on a
/// blocking thread that waits, in `block_on`, for a read that needs another blocking thread: with
/// more files with vectors than blocking threads (tokio's default is 512), every thread waits on a
/// read none is left to do, and the scan hangs (seen at 730 files with vectors). Threads are
/// started only as reads need them.
const BLOCKING_THREADS: usize = 16_384;

/// Stack of the runtime's worker threads, which execute plans.
const WORKER_STACK: usize = 64 * 1024 * 1024;

fn main() -> ExitCode {
    match std::thread::Builder::new()
        .name("lakefill".into())
        .stack_size(PLANNING_STACK)
        .spawn(lakefill_main)
    {
        Ok(handle) => handle.join().unwrap_or(ExitCode::from(1)),
        Err(_) => lakefill_main(),
    }
}

fn lakefill_main() -> ExitCode {
    let cli = Cli::parse();
    let printer = Printer::new(
        cli.global.output_format,
        cli.global.quiet,
        cli.global.verbose > 0,
    );
    init_logging(cli.global.verbose);
    quiet_caught_panics();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(WORKER_STACK)
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            printer.error(
                &anyhow::Error::new(error).context("cannot start the async runtime"),
                &Failure {
                    exit_code: 1,
                    ..Failure::default()
                },
            );
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(&cli, printer));
    // Nothing spills any more: this process's spill directory goes (a killed process's is
    // removed by the next one).
    drop(runtime);
    lakefill::spill::release();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if is_broken_pipe(&error) {
                return ExitCode::SUCCESS;
            }
            let engine_error = find_engine_error(&error);
            let (run_id, state) = engine_error
                .and_then(lakefill::Error::run_state)
                .map(|(run, state)| (Some(run.to_string()), Some(state)))
                .unwrap_or_default();
            let failure = Failure {
                hint: engine_error.and_then(lakefill::Error::hint),
                // Clap's own usage errors exit 2 before this point; anything else is ours.
                exit_code: engine_error.map_or(1, lakefill::Error::exit_code),
                run_id,
                state,
            };
            printer.error(&error, &failure);
            ExitCode::from(failure.exit_code)
        }
    }
}

async fn run(cli: &Cli, printer: Printer) -> anyhow::Result<()> {
    match &cli.command {
        Command::Demo(args) => commands::demo::run(args, printer).await,
        Command::Init(args) => commands::init::run(args, printer).await,
        Command::Completions(args) => printer.completions(args.shell),
        Command::Plan(args) => commands::plan::run(&cli.global, args, printer).await,
        Command::Backfill(args) => commands::backfill::run(&cli.global, args, printer).await,
        Command::Runs(args) => commands::runs::list(&cli.global, args, printer).await,
        Command::Publish(args) => commands::runs::publish(&cli.global, args, printer).await,
        Command::Discard(args) => commands::runs::discard(&cli.global, args, printer).await,
        Command::Revert(args) => commands::runs::revert(&cli.global, args, printer).await,
        Command::Notify(args) => commands::runs::notify(&cli.global, args, printer).await,
        Command::Report(args) => commands::runs::report(&cli.global, args, printer).await,
        Command::Diff(args) => commands::inspect::diff(&cli.global, args, printer).await,
        Command::History(args) => commands::inspect::history(&cli.global, args, printer).await,
        Command::Blame(args) => commands::inspect::blame(&cli.global, args, printer).await,
        Command::Stale(args) => commands::inspect::stale(&cli.global, args, printer).await,
        Command::Sql(args) => commands::inspect::sql(&cli.global, args, printer).await,
        Command::Gc(args) => commands::runs::gc(&cli.global, args, printer).await,
        Command::Cluster(args) => commands::cluster::run(args, printer).await,
    }
}

/// Keeps the panics a dependency catches itself off the terminal. delta-rs aborts a failed
/// upload with object_store's `BufWriter::abort`, which panics ("Already shut down") when the
/// upload failed while completing (a full disk, a file too large); delta-rs catches that panic
/// and returns the write error, which lakefill reports with its hint. The default hook would
/// still print the panic and its backtrace first. Every other panic goes to the default hook.
fn quiet_caught_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str));
        let in_buffered_writer = info.location().is_some_and(|l| {
            l.file().contains("object_store") && l.file().ends_with("buffered.rs")
        });
        if in_buffered_writer && message == Some("Already shut down") {
            tracing::debug!(
                "object_store's writer panicked on abort after a failed upload (caught by delta-rs)"
            );
            return;
        }
        default(info);
    }));
}

/// Finds the engine error in a chain (it may be wrapped by the fixtures or by context).
fn find_engine_error(error: &anyhow::Error) -> Option<&lakefill::Error> {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<lakefill::Error>())
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        // By default only lakefill's own warnings: the libraries' (delta-rs, DataFusion, the
        // Delta kernel, which logs every error it creates) are lakefill's to report or not.
        0 => "off,lakefill=warn",
        1 => "warn,delta_kernel=off,buoyant_kernel=off,lakefill=debug",
        _ => "info,lakefill=trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| MaskingStderr)
        .with_ansi(colour)
        .with_target(verbose > 0)
        .init();
}

/// stderr for log lines, with secrets masked.
struct MaskingStderr;

impl std::io::Write for MaskingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = lakefill::mask_secrets(&String::from_utf8_lossy(buf));
        std::io::stderr().write_all(text.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
