//! The settings of a run, resolved in one place: a command-line flag, else the project's
//! `[defaults]`, else the built-in default. A bad value is reported under the name the user
//! gave it where they gave it: `--memory-limit` on the command line, `memory_limit` in the
//! `[defaults]` of `lakefill.toml`.

use crate::config::Project;
use crate::error::{Error, Result};
use crate::resources::parse_size;

/// Partitions per batch when neither the command nor `[defaults] batch_partitions` says.
pub const DEFAULT_BATCH_PARTITIONS: usize = 7;

/// What the command line said, each `None` when the flag was not given.
#[derive(Debug, Clone, Default)]
pub struct SettingFlags {
    /// `--max-parallel`.
    pub max_parallel: Option<usize>,
    /// `--memory-limit`, as typed.
    pub memory_limit: Option<String>,
    /// `--batch-partitions`.
    pub batch_partitions: Option<usize>,
    /// `--throttle`, as typed.
    pub throttle: Option<String>,
    /// `--engine`, as typed (`local` or `df://HOST:PORT`).
    pub engine: Option<String>,
}

/// The settings a run uses, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSettings {
    /// Batches in flight.
    pub max_parallel: usize,
    /// The memory pool of the run's queries in bytes; `None` is unlimited.
    pub memory_limit: Option<u64>,
    /// Partitions per batch.
    pub batch_partitions: usize,
    /// Bytes written per second; `None` is unthrottled.
    pub throttle: Option<u64>,
    /// The Ballista scheduler that stages the batches (`df://HOST:PORT`); `None` is this process.
    pub engine: Option<String>,
}

/// Where a setting's value came from, named as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Flag(&'static str),
    Defaults(&'static str),
}

impl Origin {
    fn name(self) -> String {
        match self {
            Origin::Flag(flag) => flag.to_string(),
            Origin::Defaults(key) => format!("`{key}` in [defaults] of lakefill.toml"),
        }
    }
}

/// A flag, else the project's default, with where it came from.
fn pick<T: Clone>(
    flag: Option<T>,
    flag_name: &'static str,
    default: Option<T>,
    key: &'static str,
) -> Option<(T, Origin)> {
    flag.map(|v| (v, Origin::Flag(flag_name)))
        .or_else(|| default.map(|v| (v, Origin::Defaults(key))))
}

impl Default for RunSettings {
    fn default() -> Self {
        Self::built_in()
    }
}

impl RunSettings {
    /// The built-in settings, for a run with no flags and no `[defaults]`: as many batches in
    /// flight as cores, [`default_memory_limit`], [`DEFAULT_BATCH_PARTITIONS`] per batch,
    /// unthrottled, staged in this process.
    pub fn built_in() -> Self {
        Self {
            max_parallel: default_parallelism(),
            memory_limit: Some(default_memory_limit()),
            batch_partitions: DEFAULT_BATCH_PARTITIONS,
            throttle: None,
            engine: None,
        }
    }

    /// The settings a plan needs: the partitions per batch resolved (flag, else `[defaults]`,
    /// else built in), everything else built in, since planning runs nothing.
    pub fn for_planning(project: &Project, batch_partitions: Option<usize>) -> Result<Self> {
        Ok(Self {
            batch_partitions: self::batch_partitions(project, batch_partitions)?,
            ..Self::built_in()
        })
    }

    /// Resolves every setting: flag, else `[defaults]`, else built in.
    pub fn resolve(project: &Project, flags: &SettingFlags) -> Result<Self> {
        Ok(Self {
            max_parallel: max_parallel(project, flags.max_parallel)?,
            memory_limit: memory_limit(project, flags.memory_limit.as_deref())?,
            batch_partitions: batch_partitions(project, flags.batch_partitions)?,
            throttle: flags.throttle.as_deref().map(parse_rate).transpose()?,
            engine: engine(project, flags.engine.as_deref())?,
        })
    }
}

/// Where batches are staged: `--engine` (`local`, or a scheduler), else `[engine] scheduler`,
/// else this process.
pub fn engine(project: &Project, flag: Option<&str>) -> Result<Option<String>> {
    let Some((value, origin)) = pick(
        flag.map(str::to_string),
        "--engine",
        project.engine().scheduler.clone(),
        "scheduler",
    ) else {
        return Ok(None);
    };
    if value == "local" && matches!(origin, Origin::Flag(_)) {
        return Ok(None);
    }
    if value
        .strip_prefix("df://")
        .is_none_or(|rest| rest.is_empty())
    {
        let option = match origin {
            Origin::Flag(flag) => flag.to_string(),
            Origin::Defaults(_) => "`scheduler` in [engine] of lakefill.toml".to_string(),
        };
        return Err(Error::InvalidOption {
            option,
            value,
            message: "expected `local` or an Apache Ballista scheduler as `df://HOST:PORT`".into(),
        });
    }
    Ok(Some(value))
}

/// Batches in flight: `--max-parallel`, else `[defaults] max_parallel`, else the number of
/// cores.
pub fn max_parallel(project: &Project, flag: Option<usize>) -> Result<usize> {
    match pick(
        flag,
        "--max-parallel",
        project.defaults().max_parallel,
        "max_parallel",
    ) {
        Some((0, origin)) => Err(Error::InvalidOption {
            option: origin.name(),
            value: "0".into(),
            message: "at least one batch must run at a time".into(),
        }),
        Some((n, _)) => Ok(n),
        None => Ok(default_parallelism()),
    }
}

/// The built-in number of batches in flight: the number of cores.
pub fn default_parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Partitions per batch: `--batch-partitions`, else `[defaults] batch_partitions`, else
/// [`DEFAULT_BATCH_PARTITIONS`].
pub fn batch_partitions(project: &Project, flag: Option<usize>) -> Result<usize> {
    match pick(
        flag,
        "--batch-partitions",
        project.defaults().batch_partitions,
        "batch_partitions",
    ) {
        Some((0, origin)) => Err(Error::InvalidOption {
            option: origin.name(),
            value: "0".into(),
            message: "a batch holds at least one partition".into(),
        }),
        Some((n, _)) => Ok(n),
        None => Ok(DEFAULT_BATCH_PARTITIONS),
    }
}

/// The memory pool in bytes: `--memory-limit`, else `[defaults] memory_limit`, else
/// [`default_memory_limit`]. `unlimited` lifts the bound (`None`).
pub fn memory_limit(project: &Project, flag: Option<&str>) -> Result<Option<u64>> {
    let Some((text, origin)) = pick(
        flag.map(str::to_string),
        "--memory-limit",
        project.defaults().memory_limit.clone(),
        "memory_limit",
    ) else {
        return Ok(Some(default_memory_limit()));
    };
    if text.trim().eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    parse_size(&text)
        .map(Some)
        .map_err(|message| Error::InvalidOption {
            option: origin.name(),
            value: text,
            message: format!("{message}, or `unlimited`"),
        })
}

/// The memory pool of a run nobody sized: a quarter of the memory this process may use (the
/// machine's, or its cgroup's when that is lower), at most 1 GiB and at least 128 MiB. Beyond
/// it, sorts and aggregations spill to disk, so a year of history does not take the machine.
pub fn default_memory_limit() -> u64 {
    const MIB: u64 = 1024 * 1024;
    let available = [machine_memory(), cgroup_memory()]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(4 * 1024 * MIB);
    (available / 4).clamp(128 * MIB, 1024 * MIB)
}

/// `MemTotal` of `/proc/meminfo`, where there is one.
fn machine_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The cgroup v2 memory limit of this process, when it has one.
fn cgroup_memory() -> Option<u64> {
    std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Parses `--throttle`, a rate such as `50MiB/s`, into bytes per second.
pub fn parse_rate(text: &str) -> Result<u64> {
    let invalid = || Error::InvalidOption {
        option: "--throttle".into(),
        value: text.to_string(),
        message: "expected a rate such as `50MiB/s`".into(),
    };
    let size = text.trim().strip_suffix("/s").ok_or_else(invalid)?;
    parse_size(size).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(defaults: &str) -> (tempfile::TempDir, Project) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("lakefill.toml"),
            format!("[tables.t]\nuri = \"./t\"\n\n[defaults]\n{defaults}\n"),
        )
        .expect("write");
        let project = Project::load(dir.path()).expect("project");
        (dir, project)
    }

    #[test]
    fn unlimited_lifts_the_bound_and_the_default_is_a_bounded_share() {
        let (_dir, p) = project("memory_limit = \"Unlimited\"");
        assert_eq!(memory_limit(&p, None).expect("defaults"), None);
        let (_dir, bare) = project("");
        assert_eq!(memory_limit(&bare, Some("unlimited")).expect("flag"), None);
        let default = default_memory_limit();
        assert!((128 << 20..=1 << 30).contains(&default), "{default}");
        let message = memory_limit(&bare, Some("lots"))
            .expect_err("bad")
            .to_string();
        assert!(message.contains("`unlimited`"), "{message}");
    }

    #[test]
    fn a_flag_wins_over_the_defaults_which_win_over_the_built_in() {
        let (_dir, p) = project("max_parallel = 3\nbatch_partitions = 2\nmemory_limit = \"1KiB\"");
        let none = RunSettings::resolve(&p, &SettingFlags::default()).expect("resolve");
        assert_eq!(
            (none.max_parallel, none.batch_partitions, none.memory_limit),
            (3, 2, Some(1024))
        );
        let flags = SettingFlags {
            max_parallel: Some(1),
            memory_limit: Some("2KiB".into()),
            batch_partitions: Some(5),
            throttle: Some("1MiB/s".into()),
            engine: Some("local".into()),
        };
        let all = RunSettings::resolve(&p, &flags).expect("resolve");
        assert_eq!(
            all,
            RunSettings {
                max_parallel: 1,
                memory_limit: Some(2048),
                batch_partitions: 5,
                throttle: Some(1024 * 1024),
                engine: None,
            }
        );
        let (_dir, bare) = project("");
        let built_in = RunSettings::resolve(&bare, &SettingFlags::default()).expect("resolve");
        assert_eq!(built_in.batch_partitions, DEFAULT_BATCH_PARTITIONS);
        assert_eq!(built_in.max_parallel, default_parallelism());
        assert_eq!(built_in.memory_limit, Some(default_memory_limit()));
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("50MiB/s").expect("valid"), 50 * 1024 * 1024);
        assert!(parse_rate("50MiB").is_err());
    }

    #[test]
    fn errors_name_the_setting_where_it_was_set() {
        let (_dir, p) = project("memory_limit = \"lots\"");
        let option = |e: Error| match e {
            Error::InvalidOption { option, .. } => option,
            other => panic!("unexpected {other}"),
        };
        let from_file = RunSettings::resolve(&p, &SettingFlags::default()).expect_err("bad");
        assert!(option(from_file).contains("[defaults]"));
        let flags = SettingFlags {
            max_parallel: Some(2),
            memory_limit: Some("lots".into()),
            ..SettingFlags::default()
        };
        let from_flag = RunSettings::resolve(&p, &flags).expect_err("bad");
        assert_eq!(option(from_flag), "--memory-limit");
        // Zeros in `[defaults]` are refused when the project loads; on the command line here.
        let zero = max_parallel(&p, Some(0)).expect_err("zero");
        assert_eq!(option(zero), "--max-parallel");
    }
}
