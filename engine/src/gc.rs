//! `lakefill gc`: delete staged files nobody will publish, never a file a version references.
//!
//! Staged files live in `<partition>/lakefill-<run_id>/` directories. A file there is garbage
//! when no retained version of the table references it and its run will not publish it: the run
//! failed, failed validation, was discarded, published without it (an orphan of a crashed
//! batch), has no journal, or was abandoned (staging or staged with no journal update for longer
//! than `--older-than`). Vacuum-style retention of replaced files is left to Delta's own VACUUM.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use deltalake::DeltaTable;
use deltalake::logstore::object_store::ObjectStoreExt as _;
use futures::TryStreamExt;
use serde::Serialize;

use crate::config::Project;
use crate::error::{DeltaContext, Error, Result};
use crate::inspect::read_commit;
use crate::journal::{Journal, RunState, now};
use crate::storage::{loaded_version, open_table};

/// What `gc` deleted, or would delete with `--dry-run`.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    /// The table.
    pub table: String,
    /// Whether files were only listed.
    pub dry_run: bool,
    /// Files deleted (or to delete).
    pub files: Vec<GcFile>,
    /// Their total size.
    pub bytes: u64,
    /// Staged files kept because their run may still publish them.
    pub kept: u64,
    /// Runs marked discarded because their staged files were deleted.
    pub runs_discarded: Vec<String>,
}

/// One garbage file.
#[derive(Debug, Clone, Serialize)]
pub struct GcFile {
    /// Path relative to the table root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// The run that staged it.
    pub run_id: String,
    /// Why it is garbage.
    pub reason: String,
}

/// Parses durations like `30m`, `24h`, `7d` or `90s`.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let invalid = || Error::InvalidOption {
        option: "--older-than".into(),
        value: text.to_string(),
        message: "expected a number and a unit: s, m, h or d (e.g. `24h`)".into(),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let seconds = match unit {
        "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        "d" => number * 86_400,
        _ => return Err(invalid()),
    };
    Ok(Duration::from_secs(seconds))
}

/// Deletes (or with `dry_run` lists) the garbage staged files of `table`.
pub async fn gc(
    project: &Project,
    table: &str,
    dry_run: bool,
    older_than: Duration,
) -> Result<GcReport> {
    let config = project.table(table, "the command line")?;
    let opened = open_table(config, None).await?;
    let store = opened.object_store();
    let referenced = referenced_files(&opened).await?;

    let journals: BTreeMap<String, Journal> = Journal::list(&store)
        .await?
        .into_iter()
        .map(|j| (j.run_id.clone(), j))
        .collect();
    let cutoff = chrono::Utc::now()
        - chrono::Duration::from_std(older_than).unwrap_or_else(|_| chrono::Duration::zero());

    let objects: Vec<_> =
        store
            .list(None)
            .try_collect()
            .await
            .map_err(|source| Error::Storage {
                path: "/".into(),
                source,
            })?;
    let mut files = Vec::new();
    let mut kept = 0u64;
    let mut abandoned = BTreeSet::new();
    for object in objects {
        let path = object.location.to_string();
        if path.starts_with("_delta_log/") || path.starts_with("_lakefill/") {
            continue;
        }
        let Some(run_id) = path
            .split('/')
            .find_map(|segment| segment.strip_prefix("lakefill-"))
            .map(str::to_string)
        else {
            continue;
        };
        let run_id = run_id.as_str();
        if referenced.contains(&path) || referenced.contains(&decode(&path)) {
            continue;
        }
        let reason = match journals.get(run_id) {
            None => Some("no journal".to_string()),
            Some(journal) => match journal.state {
                RunState::Failed => Some("run failed".into()),
                RunState::FailedValidation => Some("run failed validation".into()),
                RunState::Discarded => Some("run discarded".into()),
                RunState::Published => Some("not part of the published run".into()),
                RunState::Planned | RunState::Staging | RunState::Staged => {
                    let updated = chrono::DateTime::parse_from_rfc3339(&journal.updated_at)
                        .map(|t| t.with_timezone(&chrono::Utc))
                        .unwrap_or(cutoff);
                    if updated < cutoff || older_than.is_zero() {
                        abandoned.insert(run_id.to_string());
                        Some(format!(
                            "run {} since {}",
                            journal.state, journal.updated_at
                        ))
                    } else {
                        None
                    }
                }
            },
        };
        match reason {
            Some(reason) => files.push(GcFile {
                path,
                size: object.size,
                run_id: run_id.to_string(),
                reason,
            }),
            None => kept += 1,
        }
    }

    let mut runs_discarded = Vec::new();
    if !dry_run {
        for file in &files {
            match store.delete(&object_path(&file.path)).await {
                Ok(()) | Err(deltalake::ObjectStoreError::NotFound { .. }) => {}
                Err(source) => {
                    return Err(Error::Storage {
                        path: file.path.clone(),
                        source,
                    });
                }
            }
        }
        for run_id in &abandoned {
            if let Some(mut journal) = journals.get(run_id).cloned() {
                journal.state = RunState::Discarded;
                journal.error = Some(format!(
                    "staged files deleted by `lakefill gc` at {}",
                    now()
                ));
                journal.save(&store).await?;
                runs_discarded.push(run_id.clone());
            }
        }
    }
    Ok(GcReport {
        table: table.to_string(),
        dry_run,
        bytes: files.iter().map(|f| f.size).sum(),
        files,
        kept,
        runs_discarded,
    })
}

fn object_path(path: &str) -> deltalake::Path {
    deltalake::Path::parse(path).unwrap_or_else(|_| deltalake::Path::from(path))
}

/// Every data file any retained version references: the adds and removes of every retained
/// commit, plus the snapshot at the oldest retained commit (it may rest on a checkpoint).
async fn referenced_files(table: &DeltaTable) -> Result<BTreeSet<String>> {
    let mut referenced = BTreeSet::new();
    let latest = loaded_version(table)?;
    let mut oldest = latest;
    for version in (0..=latest).rev() {
        let Some(commit) = read_commit(table, version).await? else {
            break;
        };
        oldest = version;
        for path in commit.paths {
            referenced.insert(decode(&path));
            referenced.insert(path);
        }
    }
    if oldest > 0 {
        let mut at_oldest = table.clone();
        at_oldest
            .load_version(oldest)
            .await
            .delta_context(|| format!("cannot load version {oldest}"))?;
        for file in at_oldest
            .snapshot()
            .delta_context(|| "cannot read the snapshot".into())?
            .log_data()
            .iter()
        {
            referenced.insert(file.path().to_string());
        }
    }
    Ok(referenced)
}

/// Percent-decodes a path as Delta writes them in the log.
fn decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(byte) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(
            parse_duration("90s").expect("valid"),
            Duration::from_secs(90)
        );
        assert_eq!(
            parse_duration("24h").expect("valid"),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            parse_duration("7d").expect("valid"),
            Duration::from_secs(604_800)
        );
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
    }

    #[test]
    fn paths_decode() {
        assert_eq!(decode("c=a%2Fb/part.parquet"), "c=a/b/part.parquet");
        assert_eq!(decode("plain/path"), "plain/path");
    }
}
