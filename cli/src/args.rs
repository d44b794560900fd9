//! Command-line arguments (clap types only; DESIGN §3).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Safe backfills on Delta Lake tables: versioned SQL, staged files, one atomic commit.
#[derive(Debug, Parser)]
#[command(name = "lakefill", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// Project directory holding `lakefill.toml` [default: the nearest one upward from the
    /// current directory].
    #[arg(long, global = true, env = "LAKEFILL_PROJECT", value_name = "DIR")]
    pub(crate) project: Option<PathBuf>,
    /// Format of the results on stdout; `json` prints one JSON document.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Text)]
    pub(crate) output_format: OutputFormat,
    /// Print only results: no status lines on stderr.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// Log more on stderr (`-v` debug, `-vv` trace); `RUST_LOG` overrides. Hides the progress bar.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

/// Format of the results on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// Tables for people.
    Text,
    /// One JSON document (a stable contract).
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Build a small local lake with a real timezone bug and walk through fixing it.
    Demo(DemoArgs),
    /// Write a starter `lakefill.toml` (and an identity model for each `--table`).
    Init(InitArgs),
    /// Print shell completions (bash, zsh, fish, ...) to stdout.
    Completions(CompletionsArgs),
    /// Show what a backfill would read and replace, without writing anything.
    Plan(PlanArgs),
    /// Stage, validate and publish a backfill as one Delta commit.
    Backfill(BackfillArgs),
    /// List runs and their state (planned, staging, staged, failed-validation, published, ...).
    Runs(RunsArgs),
    /// Publish a staged run that passed validation (write-audit-publish).
    Publish(PublishArgs),
    /// Delete the staged files of a run that was not published.
    Discard(DiscardArgs),
    /// Undo a published run: one new commit that puts back exactly what it replaced, in its range
    /// only (refused when a later commit changed that range).
    Revert(RevertArgs),
    /// Deliver the notifications of a table's published versions that its sinks have not had
    /// (a crash, a sink that was down), or again with `--replay`.
    Notify(NotifyArgs),
    /// Write a run's report for people: verdict, thresholds, per-partition charts, row diff,
    /// checks, lineage, model diff and the revert command, as HTML, Markdown or JSON.
    Report(ReportArgs),
    /// Compare two versions of a table, or a version with a staged run.
    Diff(DiffArgs),
    /// Show a table's versions with operation, run, model@version, reason and partitions.
    History(HistoryArgs),
    /// Show which run, model version, fingerprint and source versions last wrote a partition.
    Blame(BlameArgs),
    /// List the published partitions whose sources changed where they read them since they were
    /// written (late data, another team's backfill, a delete), those written by an older model
    /// version, and those of unknown lineage, with the command that refreshes each range. Reads
    /// only the Delta logs. Exits 5 when something needs refreshing.
    Stale(StaleArgs),
    /// Run a read-only query over the project's tables; `"events@12"` reads version 12.
    Sql(SqlArgs),
    /// Delete staged files of failed, discarded and abandoned runs (never a file a version uses).
    Gc(GcArgs),
    /// Run an Apache Ballista cluster on this machine for `backfill --engine df://…`.
    Cluster(ClusterArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    pub(crate) action: ClusterAction,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterAction {
    /// Start a scheduler in this process and executors as processes of their own, on this
    /// machine, until Ctrl-C (needs a lakefill built with `--features distributed`). Executors use
    /// their own environment for object-store credentials.
    Up {
        /// The scheduler's port (0 picks a free one; the address is printed).
        #[arg(long, default_value_t = 50050)]
        port: u16,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// Executors to start.
        #[arg(long, default_value_t = 2, value_parser = at_least_one)]
        executors: usize,
        /// Task slots per executor [default: the cores shared out among the executors].
        #[arg(long, value_name = "N", value_parser = at_least_one)]
        vcores: Option<usize>,
        /// Memory per executor, e.g. `2GiB`, or `unlimited`, split over its task slots; its tasks
        /// spill to disk beyond it [default: as a local run's, a quarter of RAM, at most 1 GiB].
        #[arg(long, value_name = "SIZE")]
        memory_limit: Option<String>,
    },
    /// One executor for the scheduler at `--scheduler` (what `up` starts); stops when its
    /// standard input closes.
    #[command(hide = true)]
    Executor {
        /// The scheduler, `http://HOST:PORT`.
        #[arg(long)]
        scheduler: String,
        /// The address its services listen on (on free ports).
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// Task slots.
        #[arg(long, default_value_t = 2, value_parser = at_least_one)]
        vcores: usize,
        /// Memory for the executor's tasks (bytes); absent: unbounded.
        #[arg(long, value_name = "BYTES")]
        memory_limit: Option<u64>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Directory to build the demo project in; must be empty or absent.
    #[arg(long, default_value = "lakefill-demo", value_name = "DIR")]
    pub(crate) dir: PathBuf,
    /// Days of history to generate.
    #[arg(long, default_value_t = 28)]
    pub(crate) days: u32,
    /// Events per day to generate.
    #[arg(long, default_value_t = 2000)]
    pub(crate) events_per_day: u32,
    /// Put the tables on S3 under this location (`s3://bucket/prefix`; the bucket must exist),
    /// reached with the `AWS_*` variables of the environment (endpoint, region, keys).
    #[arg(long, value_name = "S3_URI", conflicts_with = "azure")]
    pub(crate) s3: Option<String>,
    /// Put the tables on Azure Blob Storage under this location (`az://container/prefix`; the
    /// container must exist), reached with the `AZURE_*` variables of the environment (account,
    /// key or SAS token, endpoint; `AZURE_STORAGE_USE_EMULATOR=true` for a local Azurite).
    #[arg(long, value_name = "AZURE_URI")]
    pub(crate) azure: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Directory of the new project [default: the current directory].
    #[arg(value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// An existing Delta table to declare, with an identity model written from its schema and
    /// partitioning (repeatable), e.g. `events=lake/events` or `events=s3://bucket/events`.
    #[arg(long = "table", value_name = "NAME=URI")]
    pub(crate) tables: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

/// What to backfill: the model and the range.
#[derive(Debug, Clone, Args)]
pub(crate) struct ScopeArgs {
    /// The model to run (a directory under `sql/`).
    pub(crate) model: String,
    /// First partition of the range (inclusive), e.g. `2026-01-01` [default: with `--where`, the
    /// table's first; a table with no time column takes no range].
    #[arg(long, value_name = "PARTITION", requires = "to")]
    pub(crate) from: Option<String>,
    /// Last partition of the range (inclusive) [default: with `--where`, the table's last].
    #[arg(long, value_name = "PARTITION", requires = "from")]
    pub(crate) to: Option<String>,
    /// Replace only the rows of the range that match this SQL condition on the target's columns,
    /// e.g. `"country = 'DE'"` or `"customer_id IN (17, 42)"`; every other row is kept as it is.
    /// Without `--from`/`--to`, the matching rows of the whole table [default: every row of the
    /// range].
    #[arg(long = "where", value_name = "PREDICATE")]
    pub(crate) rows: Option<String>,
    /// Model version to run [default: the newest, by natural sort]; with `--cascade`, also
    /// `MODEL=VERSION` for any model of the cascade (repeatable).
    #[arg(long, value_name = "VERSION")]
    pub(crate) model_version: Vec<String>,
    /// Partitions per batch [default: `[defaults] batch_partitions`, else 7].
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) batch_partitions: Option<usize>,
    /// Read a source at a given version instead of its latest (repeatable), e.g. `raw_events=3`.
    #[arg(long = "source-version", value_name = "TABLE=VERSION")]
    pub(crate) source_versions: Vec<String>,
    /// Drop rows the model produces for partitions outside the range, instead of failing.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub(crate) allow_spill: Option<SpillPolicy>,
    /// Publish even when keys cross the range's edges (a key the fix writes into the range that
    /// the table still holds just outside it, or one it removes that the model writes just
    /// outside it); requires `--reason`, which the commit records [default: such keys fail
    /// validation, and the report suggests the range no key crosses].
    #[arg(long, requires = "reason")]
    pub(crate) allow_edge_moves: bool,
    /// The most partitions the range may have; a larger range is refused as a likely typo
    /// [default: 10000].
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub(crate) max_partitions: Option<u64>,
    /// Also replace the partition whose time is NULL (computed by one more batch over the whole
    /// range, keeping only the rows with a NULL time) [default: it is left untouched].
    #[arg(long)]
    pub(crate) include_null: bool,
    /// Why this backfill runs; recorded in the commit [default: the model header's `reason`].
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,
    /// How to publish: `rewrite` replaces the range's files; `adjustments` appends reversal and
    /// correction rows (for append-only tables) [default: the model header's `publish`, else
    /// rewrite].
    #[arg(long, value_enum, value_name = "MODE")]
    pub(crate) publish_as: Option<PublishAs>,
}

impl ScopeArgs {
    /// `--from` and `--to`, when given (clap requires both or neither).
    pub(crate) fn range(&self) -> Option<(String, String)> {
        self.from.clone().zip(self.to.clone())
    }
}

/// How a backfill publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PublishAs {
    /// Replace the range's files with the new rows.
    Rewrite,
    /// Append reversal and correction rows.
    Adjustments,
}

/// Parses a count that must be at least 1.
fn at_least_one_u64(text: &str) -> Result<u64, String> {
    at_least_one(text).map(|n| n as u64)
}

/// Parses a count that must be at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a whole number")),
    }
}

/// What to do with rows for partitions outside the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SpillPolicy {
    /// Drop them; the report and the commit metadata count them.
    Drop,
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) scope: ScopeArgs,
    /// Plan the fix and every model computed from its table, downstream: each node's range
    /// through its windows, explained per edge.
    #[arg(long)]
    pub(crate) cascade: bool,
    /// With `--cascade`: the widest a node's range may span, relative to the root's [default: 4].
    #[arg(long, value_name = "FACTOR", requires = "cascade")]
    pub(crate) max_expansion: Option<f64>,
}

#[derive(Debug, Args)]
pub(crate) struct BackfillArgs {
    #[command(flatten)]
    pub(crate) scope: ScopeArgs,
    /// Batches in flight [default: `[defaults] max_parallel`, else the number of cores].
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) max_parallel: Option<usize>,
    /// Memory for the run's queries, e.g. `2GiB`, or `unlimited`; beyond it they spill to disk
    /// [default: `[defaults] memory_limit`, else a quarter of RAM, at most 1 GiB; `plan` shows it].
    #[arg(long, value_name = "SIZE")]
    pub(crate) memory_limit: Option<String>,
    /// Bound the bytes written per second, e.g. `50MiB/s` (reads follow); use with
    /// `--max-parallel 1` to keep the load on shared storage smooth [default: unthrottled].
    #[arg(long, value_name = "RATE")]
    pub(crate) throttle: Option<String>,
    /// Where batches are staged: `local` (this process) or an Apache Ballista scheduler,
    /// `df://HOST:PORT` (needs a lakefill built with `--features distributed`; validation and
    /// the commit stay here) [default: `[engine] scheduler`, else `local`].
    #[arg(long, value_name = "ENGINE")]
    pub(crate) engine: Option<String>,
    /// Stop after validation; publish later with `lakefill publish RUN_ID`.
    #[arg(long)]
    pub(crate) stage_only: bool,
    /// Publish even if validation fails; requires `--reason`, which the commit records.
    #[arg(long, requires = "reason")]
    pub(crate) force_publish: bool,
    /// Sample rows per kind of difference in the validation report.
    #[arg(long, value_name = "N", default_value_t = lakefill::DEFAULT_SAMPLE)]
    pub(crate) sample: usize,
    /// Also write the run's report for people to FILE (`.html`, `.md` or `.json`).
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// Fix the model's table and every table computed from it: each node staged against its
    /// parents' staged output, the whole cascade validated, then published in order.
    #[arg(long, conflicts_with_all = ["force_publish", "report"])]
    pub(crate) cascade: bool,
    /// With `--cascade`: the widest a node's range may span, relative to the root's [default: 4].
    #[arg(long, value_name = "FACTOR", requires = "cascade")]
    pub(crate) max_expansion: Option<f64>,
    /// Recompute exactly what `lakefill stale` lists for the model's table (stale and outdated
    /// ranges), one run per contiguous range: a run over their span would rewrite the
    /// up-to-date partitions between them too, and each range stays resumable and revertible
    /// on its own. Stops at the first range that fails.
    #[arg(long, conflicts_with_all = ["from", "to", "rows", "cascade", "force_publish", "report"])]
    pub(crate) stale: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RunsArgs {
    /// Only runs of this table [default: every table of the project].
    pub(crate) table: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// The run to publish (see `lakefill runs`).
    pub(crate) run_id: String,
    /// Publish even if validation failed; requires `--reason`, which the commit records.
    #[arg(long, requires = "reason")]
    pub(crate) force_publish: bool,
    /// Why validation is overridden.
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,
    /// Also write the run's report for people to FILE (`.html`, `.md` or `.json`).
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct RevertArgs {
    /// The published run to revert (see `lakefill runs` or `lakefill history`).
    pub(crate) run_id: String,
    /// Why it is reverted; the commit records it [default: `revert of RUN_ID`].
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,
    /// Recompute the range as it was before the run instead of putting its files back: staged,
    /// validated and published like a backfill, so later commits in the range (compaction,
    /// appends, other fixes) do not block it; their changes in the range are replaced too.
    #[arg(long)]
    pub(crate) logical: bool,
    /// Check (and, with `--logical`, stage and validate) without committing; publish later
    /// with `lakefill publish REVERT_ID`.
    #[arg(long)]
    pub(crate) stage_only: bool,
    /// With `--logical`: memory for its queries, as for `backfill` [default: as for `backfill`].
    #[arg(long, value_name = "SIZE", requires = "logical")]
    pub(crate) memory_limit: Option<String>,
    /// With `--logical`: batches in flight, as for `backfill` [default: as for `backfill`].
    #[arg(long, value_name = "N", value_parser = at_least_one, requires = "logical")]
    pub(crate) max_parallel: Option<usize>,
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The run, or a cascade (`cascade-…`): every table's run in one report (see `lakefill runs`).
    pub(crate) run_id: String,
    /// The format [default: from the extension of `--out`, else html].
    #[arg(long, value_enum)]
    pub(crate) format: Option<ReportFormatArg>,
    /// Where to write it [default: standard output].
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
}

/// The formats of `lakefill report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ReportFormatArg {
    /// One self-contained HTML file (no script, no external link).
    Html,
    /// Markdown, for a pull request or a chat.
    Md,
    /// The report's model as JSON.
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct NotifyArgs {
    /// The table whose sinks to catch up.
    pub(crate) table: String,
    /// Deliver the events of this version and later, whatever the sinks had [default: the
    /// versions after the last one each sink settled].
    #[arg(long, value_name = "VERSION")]
    pub(crate) since: Option<u64>,
    /// Deliver again events that were delivered (receivers deduplicate by `event_id`).
    #[arg(long)]
    pub(crate) replay: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DiscardArgs {
    /// The run to discard (see `lakefill runs`).
    pub(crate) run_id: String,
}

#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The table.
    pub(crate) table: String,
    /// The old version.
    #[arg(long, value_name = "VERSION", required_unless_present = "cdf")]
    pub(crate) from_version: Option<u64>,
    /// The new version [default: the latest].
    #[arg(long, value_name = "VERSION", conflicts_with = "run")]
    pub(crate) to_version: Option<u64>,
    /// Compare with a staged run instead of a version.
    #[arg(long, value_name = "RUN_ID")]
    pub(crate) run: Option<String>,
    /// Columns identifying a row, comma separated [default: `[validate] key` of the table's model].
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub(crate) key: Option<Vec<String>>,
    /// Sample rows per kind of difference.
    #[arg(long, value_name = "N", default_value_t = lakefill::DEFAULT_SAMPLE)]
    pub(crate) sample: usize,
    /// Compare only the rows that match this SQL condition on the table's columns, e.g.
    /// `"country = 'DE'"` [default: every row of the partitions whose files differ].
    #[arg(long = "where", value_name = "PREDICATE")]
    pub(crate) rows: Option<String>,
    /// Instead of comparing versions, print the change data feed of this version as a feed
    /// reader reads it: rows per change type and partition, and `--sample` rows of each type.
    #[arg(
        long,
        value_name = "VERSION",
        conflicts_with_all = ["from_version", "to_version", "run", "key", "rows"]
    )]
    pub(crate) cdf: Option<u64>,
}

#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// The table.
    pub(crate) table: String,
    /// Versions to show, newest first.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub(crate) limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct StaleArgs {
    /// The tables [default: every table a model of the project writes].
    pub(crate) tables: Vec<String>,
    /// Also every table computed from them, downstream.
    #[arg(long)]
    pub(crate) cascade: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BlameArgs {
    /// The table.
    pub(crate) table: String,
    /// The partition value, e.g. `2026-01-31`.
    #[arg(long, value_name = "VALUE")]
    pub(crate) partition: String,
}

#[derive(Debug, Args)]
pub(crate) struct SqlArgs {
    /// The query (one SELECT); `-` reads it from stdin.
    pub(crate) query: String,
    /// Rows to print at most.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) max_rows: usize,
    /// Read every table of this cascade (not given a version) at the version the cascade
    /// published it as: one consistent release.
    #[arg(long, value_name = "CASCADE_ID")]
    pub(crate) cascade: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// The table.
    pub(crate) table: String,
    /// List what would be deleted; delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// A staging or staged run is abandoned when its journal is older than this (`30m`, `24h`, `7d`).
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    pub(crate) older_than: String,
}
