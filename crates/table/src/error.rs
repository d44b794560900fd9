//! The engine's one public error type.
//!
//! Variants are split by what the caller can do about them: fix the project (`exit 2`), retry or
//! investigate the store (`exit 1`), or re-run because the table moved (`exit 4`). Each variant
//! that a user can fix has a [`Error::hint`]. The CLI maps [`Error::exit_code`] onto the process
//! exit code of DESIGN §3.

use std::path::PathBuf;

use deltalake::DeltaTableError;
use deltalake::datafusion::error::DataFusionError;

/// Errors returned by the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No `lakefill.toml` was found in the directory or any parent.
    #[error("no `lakefill.toml` found in `{}` or any parent directory", start.display())]
    ProjectNotFound {
        /// Directory the search started from.
        start: PathBuf,
    },
    /// `init` found a project where it was to write one.
    #[error("`{}` already exists; init never overwrites a project or a model", path.display())]
    ProjectExists {
        /// The existing project file.
        path: PathBuf,
    },
    /// A file of the project could not be read.
    #[error("cannot read `{}`", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `lakefill.toml` is not valid TOML or does not have the expected shape.
    #[error("invalid project file `{}` at line {line}, column {column}: {message}", path.display())]
    ConfigParse {
        /// The project file.
        path: PathBuf,
        /// The line of the problem (1-based).
        line: usize,
        /// The column of the problem (1-based).
        column: usize,
        /// What the parser says (without quoting the line, which may hold a secret).
        message: String,
    },
    /// A value in `lakefill.toml` is not acceptable.
    #[error("invalid value for `{field}` in `{}`: {message}", path.display())]
    ConfigValue {
        /// The project file.
        path: PathBuf,
        /// Dotted path of the field, e.g. `tables.events.uri`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A `${VAR}` in a storage option names an environment variable that is not set.
    #[error("environment variable `{variable}` used by `{field}` is not set")]
    MissingEnv {
        /// The variable name.
        variable: String,
        /// Dotted path of the option that uses it.
        field: String,
    },
    /// A table name is not declared in `lakefill.toml`.
    #[error("unknown table `{table}` (used by {used_by})")]
    UnknownTable {
        /// The table name.
        table: String,
        /// Where the name appeared, e.g. a model file's header.
        used_by: String,
        /// Tables the project declares.
        known: Vec<String>,
    },
    /// No model of that name exists under `sql/`.
    #[error("unknown model `{model}`: no `{}` directory with `.sql` files", dir.display())]
    UnknownModel {
        /// The model name.
        model: String,
        /// Where its versions should be.
        dir: PathBuf,
        /// Models the project has.
        known: Vec<String>,
    },
    /// `--model-version` names a version that does not exist.
    #[error("model `{model}` has no version `{version}`")]
    UnknownModelVersion {
        /// The model name.
        model: String,
        /// The requested version.
        version: String,
        /// Versions that exist.
        known: Vec<String>,
    },
    /// A model file is malformed: header, SQL, or its declarations.
    #[error("invalid model file `{}`: {message}", path.display())]
    Model {
        /// The model file.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// What to do about it.
        hint: String,
    },
    /// The backfill range is not usable.
    #[error("invalid range: {message}")]
    InvalidRange {
        /// What is wrong.
        message: String,
    },
    /// A table's Delta log was read but does not parse.
    #[error("the Delta log of `{table}` is damaged")]
    DamagedLog {
        /// The table.
        table: String,
        /// What did not parse.
        #[source]
        source: Box<deltalake::DeltaTableError>,
    },
    /// The range stops short of the partitions the model's change reaches.
    #[error("the range of `{model}` stops short: {why}")]
    RangeTooShort {
        /// The model.
        model: String,
        /// Why the change reaches further.
        why: String,
        /// The backfill over the range it reaches.
        command: String,
    },
    /// A command-line option value is not usable.
    #[error("invalid value `{value}` for `{option}`: {message}")]
    InvalidOption {
        /// The option, e.g. `--source-version`.
        option: String,
        /// The value given.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// A table named through a catalog (`glue://database/table`) could not be resolved.
    #[error("cannot resolve table `{table}` ({name}): {message}")]
    Catalog {
        /// The table name.
        table: String,
        /// The catalog name, `glue://database/table`.
        name: String,
        /// What the catalog answered.
        message: String,
        /// What to check.
        hint: String,
    },
    /// A table could not be opened: its store is unreachable, refuses access, or failed.
    #[error("cannot open table `{table}` at `{uri}`")]
    OpenTable {
        /// The table name.
        table: String,
        /// Its location.
        uri: String,
        /// The error delta-rs reported.
        #[source]
        source: Box<DeltaTableError>,
    },
    /// The range has more partitions than a run may replace without saying so.
    #[error(
        "the range {range} has {count} {grain} partitions, more than the {max} a run replaces unless told to"
    )]
    TooManyPartitions {
        /// The range.
        range: String,
        /// Its partitions.
        count: u64,
        /// The limit.
        max: u64,
        /// Their grain.
        grain: crate::time::Grain,
    },
    /// A version was asked for that the table does not have.
    #[error("table `{table}` has no version {version}: its latest version is {latest}")]
    NoSuchVersion {
        /// The table.
        table: String,
        /// The version asked for.
        version: u64,
        /// Its latest version.
        latest: u64,
    },
    /// A version whose commits the log no longer keeps (cleaned up after a checkpoint).
    #[error(
        "version {version} of `{table}` is no longer in its log: the oldest version it can be read at is {earliest}"
    )]
    VersionCleanedUp {
        /// The table.
        table: String,
        /// The version asked for.
        version: u64,
        /// The oldest version the log can still be read at.
        earliest: u64,
    },
    /// A time was asked for before the table's first commit.
    #[error("table `{table}` did not exist at {at}: its first commit is from {first}")]
    BeforeHistory {
        /// The table.
        table: String,
        /// The time asked for.
        at: String,
        /// When its first commit was made.
        first: String,
    },
    /// A query of `lakefill sql` failed.
    #[error("the query cannot run")]
    Sql {
        /// DataFusion's error.
        #[source]
        source: Box<DataFusionError>,
    },
    /// A `[[validate.checks]]` query of a model failed.
    #[error("check `{name}` cannot run")]
    Check {
        /// The check's name.
        name: String,
        /// DataFusion's error.
        #[source]
        source: Box<DataFusionError>,
    },
    /// A table's location does not hold a Delta table.
    #[error("table `{table}` at `{uri}` is not a Delta table")]
    NotADeltaTable {
        /// The table name.
        table: String,
        /// Its location.
        uri: String,
        /// The error delta-rs reported.
        #[source]
        source: Box<DeltaTableError>,
    },
    /// The table is not partitioned the way the model says.
    #[error("{message}")]
    Partitioning {
        /// What is wrong.
        message: String,
        /// What to do about it.
        hint: String,
    },
    /// The model's output schema does not match the target's schema.
    #[error("output of model `{model}` does not match the schema of `{table}`:\n{}", problems.join("\n"))]
    SchemaMismatch {
        /// The model.
        model: String,
        /// The target table.
        table: String,
        /// One line per column that differs.
        problems: Vec<String>,
    },
    /// The model produced rows for partitions outside the backfill range.
    #[error(
        "model `{model}` produced {total} rows for partitions outside the range {range}: {}",
        partitions.iter().map(|(p, n)| format!("{p} ({n} rows)")).collect::<Vec<_>>().join(", ")
    )]
    Spill {
        /// The model.
        model: String,
        /// The range, as `from..=to`.
        range: String,
        /// Each partition outside the range with its row count.
        partitions: Vec<(String, u64)>,
        /// Total rows outside the range.
        total: u64,
        /// The smallest range (from, to) that holds every produced row.
        suggested: Box<(String, String)>,
    },
    /// The model wrote time values that are not partitions of the table's grain.
    #[error(
        "model `{model}` wrote time values that are not {grain}s: {}",
        values.iter().map(|(v, n)| format!("{v} ({n} rows)")).collect::<Vec<_>>().join("; ")
    )]
    OffGrain {
        /// The model.
        model: String,
        /// The grain of the table's partitions.
        grain: crate::time::Grain,
        /// Each problem with its row count.
        values: Vec<(String, u64)>,
    },
    /// The object store cannot guarantee that two writers never overwrite each other's commit.
    #[error("refusing to commit to `{table}`: {reason}")]
    UnsafeStore {
        /// The table.
        table: String,
        /// What the probe found.
        reason: String,
    },
    /// Writing a staged file failed.
    #[error("cannot write staged files for partition `{partition}` of `{table}`")]
    StagingWrite {
        /// The target table.
        table: String,
        /// The partition being written.
        partition: String,
        /// delta-rs's error.
        #[source]
        source: Box<DeltaTableError>,
    },
    /// Another writer committed into an affected partition after the read version.
    #[error(
        "`{table}` changed in the backfill range after version {read_version}; nothing was published"
    )]
    Conflict {
        /// The target table.
        table: String,
        /// The version the run read.
        read_version: u64,
        /// delta-rs's conflict report.
        #[source]
        source: Box<DeltaTableError>,
    },
    /// A Delta operation failed.
    #[error("{context}")]
    Delta {
        /// What the engine was doing.
        context: String,
        /// The delta-rs error.
        #[source]
        source: Box<DeltaTableError>,
    },
    /// Planning or executing a query failed.
    #[error("{context}")]
    Query {
        /// What the engine was doing.
        context: String,
        /// The DataFusion error.
        #[source]
        source: Box<DataFusionError>,
    },
    /// Reading or writing an object failed.
    #[error("cannot access `{path}`")]
    Storage {
        /// The object path.
        path: String,
        /// The object store's error.
        #[source]
        source: deltalake::ObjectStoreError,
    },
    /// No table of the project has a journal for the run id.
    #[error("no run `{run_id}` in any table of the project")]
    UnknownRun {
        /// The run id.
        run_id: String,
        /// Tables whose journals were searched.
        searched: Vec<String>,
    },
    /// The run is not in a state that allows the action.
    #[error("run `{run_id}` is {state}; it cannot be {action}")]
    RunState {
        /// The run id.
        run_id: String,
        /// Its state.
        state: String,
        /// What was asked, e.g. `published`.
        action: String,
        /// What the user can do instead.
        next: String,
    },
    /// Another process holds the run's lease.
    #[error("run `{run_id}` is being worked on by another process ({holder}) since {since}")]
    RunBusy {
        /// The run id.
        run_id: String,
        /// Who holds it.
        holder: String,
        /// Since when.
        since: String,
        /// When its lease expires unless renewed.
        expires: String,
    },
    /// This process lost the run's lease to another one and stopped writing.
    #[error("lost run `{run_id}` to another process; stopped without writing more")]
    LeaseLost {
        /// The run id.
        run_id: String,
    },
    /// The run was interrupted (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
    /// A model file was edited after its version was published.
    #[error(
        "model file `{}` was edited after `{model}@{version}` was published: it was published with fingerprint {published}, the file now has {current}",
        path.display()
    )]
    ModelEdited {
        /// The model.
        model: String,
        /// The version.
        version: String,
        /// The file.
        path: PathBuf,
        /// The fingerprint that was published.
        published: String,
        /// The file's fingerprint now.
        current: String,
    },
    /// A run stopped before publishing; the cause is the source.
    #[error("run `{run_id}` stopped while {phase}; it is {state} and nothing was published")]
    RunStopped {
        /// The run id.
        run_id: String,
        /// Its state now (`failed`).
        state: String,
        /// What it was doing, e.g. `staging`.
        phase: String,
        /// The command that resumes it.
        resume: String,
        /// Why it stopped.
        #[source]
        source: Box<Error>,
    },
    /// Validation failed; nothing was published.
    #[error("validation of run `{run_id}` failed ({}); nothing was published", failed.join(", "))]
    ValidationFailed {
        /// The run id.
        run_id: String,
        /// Names of the failed checks.
        failed: Vec<String>,
        /// Whether `--force-publish` may override them: not when rows break the table's
        /// protocol (constraints, NOT NULL, invariants, generated columns).
        forceable: bool,
        /// When keys cross the range's edges: the backfill over the range no key crosses.
        clean_range: Option<String>,
    },
    /// The target has a Delta table feature lakefill cannot honour.
    #[error(
        "`{table}` uses the Delta table feature `{feature}`, which lakefill cannot honour: {why}"
    )]
    UnsupportedFeature {
        /// The table.
        table: String,
        /// The feature's protocol name.
        feature: String,
        /// Why lakefill refuses it.
        why: String,
        /// What to do instead.
        hint: String,
    },
    /// Staged files of the run are gone, so it cannot be published.
    #[error("{missing} staged files of run `{run_id}` are missing")]
    StagedFilesMissing {
        /// The run id.
        run_id: String,
        /// How many are missing.
        missing: usize,
    },
    /// A staged file is not the one validation saw (replaced or rewritten since).
    #[error("staged file `{}` of run `{run_id}` changed after validation{}; nothing was published", paths[0], if paths.len() > 1 { format!(" (and {} more)", paths.len() - 1) } else { String::new() })]
    StagedFileChanged {
        /// The run id.
        run_id: String,
        /// The files that changed.
        paths: Vec<String>,
    },
    /// Commits after a run changed its range (or the files it added): reverting it by files
    /// would undo them too.
    #[error(
        "cannot revert run `{run_id}`: {}; nothing was committed",
        describe_versions(versions)
    )]
    RevertBlocked {
        /// The run.
        run_id: String,
        /// The table.
        table: String,
        /// The later versions in the way.
        versions: Vec<u64>,
        /// The run's range, as `from..=to`.
        range: String,
    },
    /// Files a revert would put back are gone from storage (vacuumed).
    #[error(
        "cannot revert run `{run_id}`: {} of the files it replaced are gone from `{table}` ({}); nothing was committed",
        missing.len(),
        quote_some(missing)
    )]
    RevertFilesGone {
        /// The run.
        run_id: String,
        /// The table.
        table: String,
        /// The missing files.
        missing: Vec<String>,
        /// The table's `delta.deletedFileRetentionDuration`.
        retention: String,
    },
    /// A cascade cannot be planned as asked (a cycle, a table written by two models, a range
    /// that would widen too far).
    #[error("{message}")]
    Cascade {
        /// What is wrong.
        message: String,
        /// What to do.
        hint: String,
    },
    /// A node of a cascade was computed from a parent that has changed since, where the node
    /// read it: publishing it would make the two tables disagree.
    #[error("{0}")]
    CascadeParentMoved(Box<ParentMoved>),
    /// `lakefill stale` found published partitions that no longer match their inputs (exit 5,
    /// after the report): a scheduler's signal to refresh them.
    #[error("{ranges} ranges of {} are stale", tables.join(", "))]
    StaleHistory {
        /// The tables with stale ranges.
        tables: Vec<String>,
        /// How many ranges, over those tables.
        ranges: usize,
    },
    /// A run journal could not be read or written.
    #[error("run journal `{path}` is unreadable: {message}")]
    Journal {
        /// The journal's path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The cluster a run was sent to (`--engine ballista://…`) could not be reached, lost the
    /// job, or stopped answering: not a bug, and nothing is published.
    #[error("{message} (scheduler {scheduler})")]
    Cluster {
        /// The scheduler's address, `http://HOST:PORT`.
        scheduler: String,
        /// What happened, and what the client saw.
        message: String,
    },
    /// An engine invariant did not hold. This is a bug.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result type of every fallible engine function.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cascade node's parent that changed since the node read it ([`Error::CascadeParentMoved`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "`{table}` of cascade `{cascade}` was computed from `{parent}` at version {read}, and `{parent}` has changed since where `{table}` reads it (version {}); nothing of `{table}` was published",
    versions.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
)]
pub struct ParentMoved {
    /// The cascade.
    pub cascade: String,
    /// The node's table.
    pub table: String,
    /// The parent's table.
    pub parent: String,
    /// The parent's version the node read (with the parent run's output on top).
    pub read: u64,
    /// The parent's commits since, other than its run's own, in what the node read.
    pub versions: Vec<u64>,
    /// The command that recomputes the cascade.
    pub rerun: String,
}

impl Error {
    /// Returns the process exit code of DESIGN §3 for this error.
    ///
    /// `2` for mistakes in the project, the model or the command line, `4` when the table moved
    /// under the run, `1` for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            // A file the log names is gone: not a usage error.
            Error::Sql { source } if is_missing_data_file(&source.to_string()) => 1,
            Error::ProjectNotFound { .. }
            | Error::ProjectExists { .. }
            | Error::ConfigParse { .. }
            | Error::ConfigValue { .. }
            | Error::MissingEnv { .. }
            | Error::UnknownTable { .. }
            | Error::UnknownModel { .. }
            | Error::UnknownModelVersion { .. }
            | Error::Model { .. }
            | Error::InvalidRange { .. }
            | Error::RangeTooShort { .. }
            | Error::InvalidOption { .. }
            | Error::Partitioning { .. }
            | Error::SchemaMismatch { .. }
            | Error::UnsafeStore { .. } => 2,
            Error::UnknownRun { .. }
            | Error::RunState { .. }
            | Error::ModelEdited { .. }
            | Error::UnsupportedFeature { .. }
            | Error::NoSuchVersion { .. }
            | Error::VersionCleanedUp { .. }
            | Error::TooManyPartitions { .. }
            | Error::BeforeHistory { .. }
            | Error::Sql { .. }
            | Error::Check { .. }
            | Error::Cascade { .. } => 2,
            Error::ValidationFailed { .. } => 3,
            Error::Conflict { .. }
            | Error::RunBusy { .. }
            | Error::LeaseLost { .. }
            | Error::CascadeParentMoved(_)
            | Error::RevertBlocked { .. } => 4,
            Error::StaleHistory { .. } => 5,
            Error::Interrupted => 130,
            Error::RunStopped { source, .. } => source.exit_code(),
            Error::StagedFilesMissing { .. }
            | Error::StagedFileChanged { .. }
            | Error::RevertFilesGone { .. } => 1,
            Error::ReadFile { .. }
            | Error::OpenTable { .. }
            | Error::Catalog { .. }
            | Error::DamagedLog { .. }
            | Error::StagingWrite { .. }
            | Error::NotADeltaTable { .. }
            | Error::Spill { .. }
            | Error::OffGrain { .. }
            | Error::Delta { .. }
            | Error::Query { .. }
            | Error::Storage { .. }
            | Error::Journal { .. }
            | Error::Cluster { .. }
            | Error::Internal(_) => 1,
        }
    }

    /// Returns a next step for errors the user can fix.
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            Error::ProjectNotFound { .. } => {
                "run from a project directory, pass `--project DIR`, or create one with `lakefill demo`".into()
            }
            Error::ReadFile { .. } => "check that the file exists and is readable".into(),
            Error::ProjectExists { path } if path.ends_with("identity.sql") => format!(
                "init wrote nothing; move `{}` away first, or write the project in another directory",
                path.display()
            ),
            Error::ProjectExists { .. } => {
                "run `lakefill init` in an empty directory (`lakefill init DIR`), or add tables to the existing lakefill.toml by hand".into()
            }
            Error::ConfigParse { .. } => {
                "fix the TOML at the line and column shown; DESIGN §1 shows the expected shape".into()
            }
            Error::ConfigValue { field, .. } => format!("correct `{field}` in lakefill.toml"),
            Error::MissingEnv { variable, .. } => {
                format!("export `{variable}` before running lakefill, or write the value in lakefill.toml")
            }
            Error::UnknownTable { known, .. } => format!(
                "declare it as `[tables.<name>]` in lakefill.toml; known tables: {}",
                list_or_none(known)
            ),
            Error::UnknownModel { known, .. } => {
                format!("models in this project: {}", list_or_none(known))
            }
            Error::UnknownModelVersion { known, .. } => {
                format!("versions that exist: {}", list_or_none(known))
            }
            Error::Model { hint, .. } | Error::Partitioning { hint, .. } => hint.clone(),
            Error::InvalidRange { .. } => {
                "pass `--from` and `--to` as partition values with `--from` <= `--to`, e.g. `--from 2026-01-01 --to 2026-01-31`".into()
            }
            Error::RangeTooShort { command, .. } => {
                format!("run `{command}`: the range the change reaches")
            }
            Error::InvalidOption { option, .. } => match option.as_str() {
                "QUERY" => "`lakefill sql` runs one read-only SELECT over the tables of lakefill.toml; quote a table with a version or a time: `\"events@12\"`, `\"events@2026-01-31T00:00:00Z\"`".into(),
                "--source-version" => "write it as TABLE=VERSION, e.g. `--source-version raw_events=3`; `lakefill history TABLE` lists the versions".into(),
                "--older-than" => "give an age with a unit: `90s`, `30m`, `24h` or `7d`".into(),
                "--memory-limit" => "give a size such as `512MiB` or `4GiB`".into(),
                "--throttle" => "give a rate such as `50MiB/s`".into(),
                "--where" => "give a SQL condition on the target's columns, quoted for the shell, e.g. `--where \"country = 'DE'\"` or `--where \"customer_id IN (17, 42)\"`; `lakefill sql \"SELECT * FROM <table> LIMIT 5\"` shows the columns".into(),
                "--from" => "a table with no time column is scoped by `--where` alone, e.g. `lakefill backfill <model> --where \"part IN (1, 2)\"`; without `--where` the run replaces the whole table".into(),
                "--reason" => "say why, e.g. `--reason \"rows dropped on purpose: test accounts\"`".into(),
                "MODEL" => "a model is a directory under `sql/` holding version files: `lakefill plan <model> --from A --to B`".into(),
                "RUN_ID" => "`lakefill runs` lists the runs and their ids".into(),
                "--table" => "write it as NAME=URI, e.g. `--table events=lake/events`".into(),
                option => format!("see `lakefill help` for the form of `{option}`"),
            },
            Error::DamagedLog { table, .. } => format!(
                "a commit or checkpoint file under `_delta_log/` of `{table}` does not parse: restore it from a backup or ask whoever wrote it; lakefill changed nothing (`lakefill history {table}` shows the commits it can read)"
            ),
            Error::Catalog { table, hint, .. } => {
                format!("{hint}; `tables.{table}` in lakefill.toml names the table")
            }
            Error::OpenTable { table, uri, source } => {
                let store = crate::store::Store::of_uri(uri);
                store.diagnose(table, &format!("{source} {source:?}")).unwrap_or_else(|| {
                    if store.is_object_store() {
                        format!(
                            "check `tables.{table}` in lakefill.toml: the location, and storage options: {}; `lakefill plan` lists the options in effect",
                            store.options_hint()
                        )
                    } else {
                        format!("check `tables.{table}.uri` in lakefill.toml: {}", store.options_hint())
                    }
                })
            }
            Error::NotADeltaTable { table, .. } => format!(
                "check `tables.{table}.uri` in lakefill.toml; the location must hold a `_delta_log` directory"
            ),
            Error::SchemaMismatch { .. } => {
                "change the model's SELECT (names, types, e.g. with CAST) so that it produces the target's columns".into()
            }
            Error::Spill {
                suggested,
                partitions,
                ..
            } => {
                let nulls = partitions
                    .iter()
                    .any(|(p, _)| p == crate::time::NULL_LABEL);
                let widen = (partitions.len() > usize::from(nulls)).then(|| {
                    format!("widen the range to `--from {} --to {}`", suggested.0, suggested.1)
                });
                let null = nulls.then(|| {
                    "pass `--include-null` to replace the partition whose time is NULL too".to_string()
                });
                let steps: Vec<String> = widen
                    .into_iter()
                    .chain(null)
                    .chain([
                        "filter the model's output with `$start`/`$end`".to_string(),
                        "pass `--allow-spill drop` to drop those rows on purpose".to_string(),
                    ])
                    .collect();
                steps.join(", or ")
            }
            Error::OffGrain { grain, .. } => format!(
                "write each row's partition value as the first instant of its {grain} (e.g. `date_trunc('{grain}', ts)`, or `CAST(date_trunc('{grain}', d) AS DATE)`), or declare the table's real `grain` in the model header"
            ),
            Error::UnsafeStore { .. } => {
                "use a store that supports conditional writes (AWS S3, MinIO, moto, Azure Blob Storage, Azurite) and do not set `aws_conditional_put = disabled`".into()
            }
            Error::StagingWrite { .. } => {
                "the table's storage refused a write (permissions, space, or something in the way); nothing was published; fix it and run the same command again to resume".into()
            }
            Error::Conflict { .. } => {
                "another writer changed the affected partitions; re-run the same command to recompute against the new version".into()
            }
            Error::RevertBlocked { table, range, run_id, .. } => format!(
                "see them with `lakefill history {table}`: a revert by files would undo them too. Revert those runs first (newest first), or recompute {range} as it was before the run with `lakefill revert {run_id} --logical` (their changes in the range are replaced too; `--stage-only` to review it first)"
            ),
            Error::Cascade { hint, .. } => hint.clone(),
            Error::StaleHistory { .. } => {
                "run the `lakefill backfill` command the report gives for each range; `lakefill stale` then exits 0".into()
            }
            Error::CascadeParentMoved(moved) => format!(
                "run the cascade again (`{}`): it recomputes the children from their parents as they are now, and publishes them together",
                moved.rerun
            ),
            Error::RevertFilesGone { retention, table, .. } => format!(
                "VACUUM deletes files a version no longer uses once they are older than the table's `delta.deletedFileRetentionDuration` ({retention}); they cannot be put back by files. Recompute the range with a backfill instead, and raise the retention of `{table}` if reverts must reach further back"
            ),
            Error::UnknownRun { searched, .. } => format!(
                "list runs with `lakefill runs`; searched the journals of {}",
                list_or_none(searched)
            ),
            Error::RunState { next, .. } => next.clone(),
            Error::RunBusy { expires, .. } => format!(
                "wait for it to finish, then run the command again (`lakefill runs` shows the run's state); if that process is gone for good, its lease expires at {expires}"
            ),
            Error::LeaseLost { .. } => {
                "another lakefill took the run over after this one stopped renewing its lease; see `lakefill runs`".into()
            }
            Error::Interrupted => {
                "run the same command again to resume where it stopped".into()
            }
            Error::ModelEdited { model, path, .. } => format!(
                "a published model version is never edited: restore `{}` as it was (e.g. with `git checkout`) and put the change into a new version file under `sql/{model}/`",
                path.display()
            ),
            Error::RunStopped { source, resume, run_id, .. } => match source.as_ref() {
                Error::Spill { .. } | Error::Conflict { .. } | Error::Interrupted => {
                    source.hint().unwrap_or_default()
                }
                other => match other.hint() {
                    Some(hint) => format!(
                        "{hint}; the finished batches are kept: `{resume}` resumes the run, `lakefill discard {run_id}` drops it"
                    ),
                    None => format!(
                        "the finished batches are kept: `{resume}` resumes the run, `lakefill discard {run_id}` drops it"
                    ),
                },
            },
            Error::ValidationFailed {
                clean_range: Some(command),
                ..
            } => format!(
                "keys cross the range's edges (see the `edges` check above): run `{command}`, the range no key crosses; or, if the rows are meant to cross, run again with `--allow-edge-moves --reason TEXT`"
            ),
            Error::ValidationFailed {
                run_id,
                forceable: true,
                ..
            } => format!(
                "read the report above; fix the model and run the backfill again, or publish anyway with `lakefill publish {run_id} --force-publish --reason TEXT`"
            ),
            Error::ValidationFailed { .. } => {
                "read the report above: rows break the table's own rules (constraints, NOT NULL, invariants or generated columns), which Delta's writers refuse and `--force-publish` cannot override; fix the model and run the backfill again".into()
            }
            Error::UnsupportedFeature { hint, .. } => hint.clone(),
            Error::TooManyPartitions { count, .. } => format!(
                "check `--from` and `--to`; if the range is right, pass `--max-partitions {count}`"
            ),
            Error::NoSuchVersion { table, .. } => format!(
                "`lakefill history {table}` lists its versions; `\"{table}@N\"` reads version N"
            ),
            Error::VersionCleanedUp { table, earliest, .. } => format!(
                "the table's log was cleaned up (`delta.logRetentionDuration`) before that version; read version {earliest} or later, or a copy of the table kept from then; `lakefill history {table}` lists what is kept"
            ),
            Error::BeforeHistory { table, .. } => format!(
                "ask for a time after the first commit; `lakefill history {table}` lists every version with its time"
            ),
            Error::Sql { source } if is_missing_data_file(&source.to_string()) => {
                "a data file of the version read is gone (vacuumed?): read a newer version (`\"table@N\"`; `lakefill history TABLE` lists them), or check the table's retention".into()
            }
            Error::Sql { .. } => {
                "check table and column names (they are case-sensitive; quote `\"events@12\"` to read version 12); `lakefill sql` reads the tables of lakefill.toml and writes nothing".into()
            }
            Error::Check { name, .. } => format!(
                "check `{name}` is a SELECT over `output` (the staged rows) and `previous` (the rows they replace), with the target's columns; fix it in the model's `[[validate.checks]]`"
            ),
            Error::StagedFileChanged { run_id, .. } => format!(
                "something wrote into the run's staging directory after validation: discard it with `lakefill discard {run_id}` and run the backfill again"
            ),
            Error::StagedFilesMissing { run_id, .. } => format!(
                "discard it with `lakefill discard {run_id}` and run the backfill again"
            ),
            Error::Journal { message, path } if message.contains("newer lakefill") => format!(
                "upgrade lakefill to read `{path}`, or run with the version that wrote it"
            ),
            Error::Journal { path, .. } => format!(
                "move the damaged journal `{path}` (under the table's root) out of the way and run the command again; `lakefill gc` then deletes the run's staged files"
            ),
            Error::Query { source, .. } if is_missing_data_file(&source.to_string()) => {
                "a data file of a pinned version is gone (vacuumed?); pin a newer version with `--source-version TABLE=N`, or check the table's retention".into()
            }
            Error::Query { .. } | Error::Storage { .. } | Error::Delta { .. } => {
                "nothing was published and the table is unchanged; fix the cause above and run the same command again".into()
            }
            Error::Cluster { .. } => {
                "nothing was published; check that the cluster's scheduler and executors are up, then run the same command again".into()
            }
            Error::Internal(_) => {
                "this is a bug in lakefill; nothing was published. Please report it with the output of the same command run with `-vv`".into()
            }
        })
    }
}

impl Error {
    /// The run id and state an error is about, for the JSON error document.
    pub fn run_state(&self) -> Option<(&str, String)> {
        match self {
            Error::RunStopped { run_id, state, .. } => Some((run_id, state.clone())),
            Error::RunState { run_id, state, .. } => Some((run_id, state.clone())),
            Error::ValidationFailed { run_id, .. } => Some((run_id, "failed-validation".into())),
            Error::RunBusy { run_id, .. } | Error::LeaseLost { run_id } => {
                Some((run_id, "busy".into()))
            }
            _ => None,
        }
    }
}

/// Whether an error message says a data file (Parquet) of a table was not found: the only case
/// where the vacuum hint is right.
fn is_missing_data_file(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    (lower.contains("not found") || lower.contains("no such file")) && lower.contains(".parquet")
}

/// `version 5 changed its range` or `versions 5, 7 changed its range`.
fn describe_versions(versions: &[u64]) -> String {
    let list: Vec<String> = versions.iter().map(u64::to_string).collect();
    match list.as_slice() {
        [one] => format!("version {one} changed its range after it"),
        _ => format!("versions {} changed its range after it", list.join(", ")),
    }
}

/// The first few items, quoted, with how many more there are.
fn quote_some(items: &[String]) -> String {
    let mut quoted: Vec<String> = items.iter().take(3).map(|i| format!("`{i}`")).collect();
    if items.len() > 3 {
        quoted.push(format!("{} more", items.len() - 3));
    }
    quoted.join(", ")
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".into()
    } else {
        items
            .iter()
            .map(|i| format!("`{i}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Wraps a delta-rs error with what the engine was doing.
pub trait DeltaContext<T> {
    /// Wraps a delta-rs error with what the engine was doing.
    fn delta_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> DeltaContext<T> for std::result::Result<T, DeltaTableError> {
    fn delta_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Delta {
            context: context(),
            source: Box::new(source),
        })
    }
}

/// Wraps a DataFusion error with what the engine was doing.
pub trait QueryContext<T> {
    /// Wraps a DataFusion error with what the engine was doing.
    fn query_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> QueryContext<T> for std::result::Result<T, DataFusionError> {
    fn query_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Query {
            context: context(),
            source: Box::new(source),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta() -> Box<DeltaTableError> {
        Box::new(DeltaTableError::Generic("delta".into()))
    }

    fn datafusion() -> Box<DataFusionError> {
        Box::new(DataFusionError::Plan("plan".into()))
    }

    /// One value of every variant; the match below makes a new variant fail to compile until it
    /// is listed here with its exit code and hint.
    fn every_variant() -> Vec<Error> {
        let s = || "x".to_string();
        let p = || PathBuf::from("x");
        vec![
            Error::ProjectNotFound { start: p() },
            Error::ProjectExists { path: p() },
            Error::ReadFile {
                path: p(),
                source: std::io::Error::other("io"),
            },
            Error::ConfigParse {
                path: p(),
                line: 1,
                column: 1,
                message: s(),
            },
            Error::ConfigValue {
                path: p(),
                field: s(),
                message: s(),
            },
            Error::MissingEnv {
                variable: s(),
                field: s(),
            },
            Error::UnknownTable {
                table: s(),
                used_by: s(),
                known: vec![],
            },
            Error::UnknownModel {
                model: s(),
                dir: p(),
                known: vec![],
            },
            Error::UnknownModelVersion {
                model: s(),
                version: s(),
                known: vec![],
            },
            Error::Model {
                path: p(),
                message: s(),
                hint: s(),
            },
            Error::InvalidRange { message: s() },
            Error::RangeTooShort {
                model: s(),
                why: s(),
                command: s(),
            },
            Error::InvalidOption {
                option: s(),
                value: s(),
                message: s(),
            },
            Error::OpenTable {
                table: s(),
                uri: s(),
                source: delta(),
            },
            Error::DamagedLog {
                table: s(),
                source: delta(),
            },
            Error::TooManyPartitions {
                range: s(),
                count: 2,
                max: 1,
                grain: crate::time::Grain::Day,
            },
            Error::NoSuchVersion {
                table: s(),
                version: 9,
                latest: 1,
            },
            Error::VersionCleanedUp {
                table: s(),
                version: 1,
                earliest: 2,
            },
            Error::BeforeHistory {
                table: s(),
                at: s(),
                first: s(),
            },
            Error::Sql {
                source: datafusion(),
            },
            Error::Check {
                name: s(),
                source: datafusion(),
            },
            Error::NotADeltaTable {
                table: s(),
                uri: s(),
                source: delta(),
            },
            Error::Partitioning {
                message: s(),
                hint: s(),
            },
            Error::SchemaMismatch {
                model: s(),
                table: s(),
                problems: vec![],
            },
            Error::Spill {
                model: s(),
                range: s(),
                partitions: vec![],
                total: 0,
                suggested: Box::new((s(), s())),
            },
            Error::OffGrain {
                model: s(),
                grain: crate::time::Grain::Month,
                values: vec![],
            },
            Error::UnsafeStore {
                table: s(),
                reason: s(),
            },
            Error::StagingWrite {
                table: s(),
                partition: s(),
                source: delta(),
            },
            Error::Conflict {
                table: s(),
                read_version: 1,
                source: delta(),
            },
            Error::Delta {
                context: s(),
                source: delta(),
            },
            Error::Query {
                context: s(),
                source: datafusion(),
            },
            Error::Storage {
                path: s(),
                source: deltalake::ObjectStoreError::NotImplemented {
                    operation: s(),
                    implementer: s(),
                },
            },
            Error::UnknownRun {
                run_id: s(),
                searched: vec![],
            },
            Error::RunState {
                run_id: s(),
                state: s(),
                action: s(),
                next: s(),
            },
            Error::RunBusy {
                run_id: s(),
                holder: s(),
                since: s(),
                expires: s(),
            },
            Error::LeaseLost { run_id: s() },
            Error::Interrupted,
            Error::ModelEdited {
                model: s(),
                version: s(),
                path: p(),
                published: s(),
                current: s(),
            },
            Error::RunStopped {
                run_id: s(),
                state: "failed".into(),
                phase: s(),
                resume: s(),
                source: Box::new(Error::Interrupted),
            },
            Error::ValidationFailed {
                run_id: s(),
                failed: vec![],
                forceable: true,
                clean_range: None,
            },
            Error::UnsupportedFeature {
                table: s(),
                feature: s(),
                why: s(),
                hint: s(),
            },
            Error::StagedFilesMissing {
                run_id: s(),
                missing: 1,
            },
            Error::StagedFileChanged {
                run_id: s(),
                paths: vec![s()],
            },
            Error::StaleHistory {
                tables: vec![s()],
                ranges: 1,
            },
            Error::CascadeParentMoved(Box::new(ParentMoved {
                cascade: s(),
                table: s(),
                parent: s(),
                read: 1,
                versions: vec![2],
                rerun: s(),
            })),
            Error::RevertBlocked {
                run_id: s(),
                table: s(),
                versions: vec![3, 4],
                range: s(),
            },
            Error::Cascade {
                message: s(),
                hint: s(),
            },
            Error::RevertFilesGone {
                run_id: s(),
                table: s(),
                missing: vec![s()],
                retention: s(),
            },
            Error::Journal {
                path: s(),
                message: s(),
            },
            Error::Catalog {
                table: s(),
                name: s(),
                message: s(),
                hint: s(),
            },
            Error::Cluster {
                scheduler: s(),
                message: s(),
            },
            Error::Internal(s()),
        ]
    }

    #[test]
    fn every_error_has_an_exit_code_of_the_contract_and_a_hint() {
        for error in every_variant() {
            // Exhaustive on purpose: a new variant must be added to `every_variant`.
            let listed = match &error {
                Error::ProjectNotFound { .. }
                | Error::ProjectExists { .. }
                | Error::ReadFile { .. }
                | Error::ConfigParse { .. }
                | Error::ConfigValue { .. }
                | Error::MissingEnv { .. }
                | Error::UnknownTable { .. }
                | Error::UnknownModel { .. }
                | Error::UnknownModelVersion { .. }
                | Error::Model { .. }
                | Error::InvalidRange { .. }
                | Error::RangeTooShort { .. }
                | Error::InvalidOption { .. }
                | Error::OpenTable { .. }
                | Error::Catalog { .. }
                | Error::DamagedLog { .. }
                | Error::TooManyPartitions { .. }
                | Error::NoSuchVersion { .. }
                | Error::VersionCleanedUp { .. }
                | Error::BeforeHistory { .. }
                | Error::Sql { .. }
                | Error::Check { .. }
                | Error::NotADeltaTable { .. }
                | Error::Partitioning { .. }
                | Error::SchemaMismatch { .. }
                | Error::Spill { .. }
                | Error::OffGrain { .. }
                | Error::UnsafeStore { .. }
                | Error::StagingWrite { .. }
                | Error::Conflict { .. }
                | Error::Delta { .. }
                | Error::Query { .. }
                | Error::Storage { .. }
                | Error::UnknownRun { .. }
                | Error::RunState { .. }
                | Error::RunBusy { .. }
                | Error::LeaseLost { .. }
                | Error::Interrupted
                | Error::ModelEdited { .. }
                | Error::RunStopped { .. }
                | Error::ValidationFailed { .. }
                | Error::UnsupportedFeature { .. }
                | Error::StagedFilesMissing { .. }
                | Error::StagedFileChanged { .. }
                | Error::RevertBlocked { .. }
                | Error::RevertFilesGone { .. }
                | Error::Cascade { .. }
                | Error::CascadeParentMoved(_)
                | Error::StaleHistory { .. }
                | Error::Journal { .. }
                | Error::Cluster { .. }
                | Error::Internal(_) => true,
            };
            assert!(listed);
            assert!(
                matches!(error.exit_code(), 1..=5 | 130),
                "{error}: {}",
                error.exit_code()
            );
            let hint = error.hint().unwrap_or_default();
            assert!(!hint.trim().is_empty(), "{error:?} has no hint");
            assert!(
                !error.to_string().ends_with('.'),
                "{error}: no final period"
            );
        }
    }
}
