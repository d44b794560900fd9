//! Commits lakefill writes into the log itself, for tables whose features delta-rs's commit
//! refuses (row tracking, in-commit timestamps, domain metadata, clustering, identity columns):
//! delta-rs 1.1 checks a table's writer features before it commits and has no writer for these,
//! but each asks only for fields in the commit that lakefill can fill in itself, as the Delta
//! protocol says (PROTOCOL.md: "Row Tracking", "In-Commit Timestamps", "Identity Columns",
//! "Clustered Table"). Everything else about the commit (the actions, `commitInfo`, the
//! application transaction) is what delta-rs would write, built by its own [`CommitData`].
//!
//! Each attempt reads the versions committed since the run's read version: a commit another
//! writer made that the caller says conflicts (or that changed the table's metadata or protocol)
//! fails the publish as a conflict. Otherwise the commit is completed against the latest
//! version (fresh row ids above its high-water mark, a timestamp after its own) and written with
//! put-if-absent; a lost race reads again.

use std::collections::HashMap;

use deltalake::DeltaTable;
use deltalake::kernel::transaction::{CommitData, TransactionError};
use deltalake::kernel::{Action, DomainMetadata, Transaction};
use deltalake::logstore::CommitOrBytes;
use deltalake::logstore::object_store::{ObjectStoreExt as _, PutPayload};
use deltalake::protocol::DeltaOperation;
use serde_json::{Value, json};

use lakefill_table::error::{DeltaContext, Error, Result};

use crate::{Commit, read_commit};

/// The domain of row tracking's high-water mark.
pub const ROW_TRACKING_DOMAIN: &str = "delta.rowTracking";
/// How many times a commit is tried again after another writer took its version.
const ATTEMPTS: usize = 16;

/// What a commit must carry for the table's features, as the table is at the version it goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitRules {
    /// Row tracking (supported and not suspended): new files get `baseRowId` above this mark
    /// (`None`: no row id assigned yet) and `defaultRowCommitVersion`.
    pub row_ids: Option<Option<i64>>,
    /// In-commit timestamps: `commitInfo` goes first and carries a timestamp after this one
    /// (the previous commit's; `None` when it has none).
    pub in_commit_timestamp: Option<Option<i64>>,
}

/// Whether delta-rs can commit to `table` (at the version it is loaded at) itself.
pub fn delta_rs_commits(table: &DeltaTable) -> bool {
    table.snapshot().is_ok_and(|snapshot| {
        deltalake::kernel::transaction::PROTOCOL
            .can_write_to(snapshot)
            .is_ok()
    })
}

/// What a commit on `table` (loaded at the latest version) must carry.
pub async fn rules(table: &DeltaTable) -> Result<CommitRules> {
    let snapshot = table
        .snapshot()
        .delta_context(|| "cannot read the table's snapshot".into())?;
    let protocol = snapshot.protocol();
    let writer_features: Vec<String> = protocol
        .writer_features()
        .into_iter()
        .flatten()
        .map(|f| f.to_string())
        .collect();
    let has = |feature: &str| writer_features.iter().any(|f| f == feature);
    let config = snapshot.metadata().configuration();
    let enabled = |key: &str| {
        config
            .get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    };
    let mut rules = CommitRules::default();
    if has("rowTracking") && !enabled("delta.rowTrackingSuspended") {
        let mark = crate::domains::configuration(table, ROW_TRACKING_DOMAIN)
            .await?
            .map(|configuration| {
                serde_json::from_str::<Value>(&configuration)
                    .ok()
                    .and_then(|v| v["rowIdHighWaterMark"].as_i64())
                    .ok_or_else(|| {
                        Error::Internal(format!(
                            "the `{ROW_TRACKING_DOMAIN}` domain metadata is not a high-water mark: {configuration}"
                        ))
                    })
            })
            .transpose()?;
        rules.row_ids = Some(mark);
    }
    if has("inCommitTimestamp") && enabled("delta.enableInCommitTimestamps") {
        let version = snapshot.version();
        let previous = read_commit(table, version)
            .await?
            .and_then(|commit| commit.info["inCommitTimestamp"].as_i64());
        rules.in_commit_timestamp = Some(previous);
    }
    Ok(rules)
}

/// The actions of a commit as it goes on version `version` under `rules`: new files (those
/// without a `baseRowId`) numbered above the high-water mark and stamped with the version,
/// which then advances in the same commit; `commitInfo` first, with its in-commit timestamp.
pub fn complete(
    mut actions: Vec<Action>,
    rules: &CommitRules,
    version: u64,
    now: i64,
) -> Vec<Action> {
    if let Some(mark) = rules.row_ids {
        let mut next = mark.map_or(0, |m| m + 1);
        let version = i64::try_from(version).unwrap_or(i64::MAX);
        for action in &mut actions {
            if let Action::Add(add) = action
                && add.base_row_id.is_none()
            {
                let records = add
                    .stats
                    .as_deref()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .and_then(|s| s["numRecords"].as_i64())
                    .unwrap_or(0);
                add.base_row_id = Some(next);
                add.default_row_commit_version = Some(version);
                next += records.max(1);
            }
        }
        let high = next - 1;
        if mark.is_none_or(|m| high > m) {
            actions.push(Action::DomainMetadata(DomainMetadata {
                domain: ROW_TRACKING_DOMAIN.to_string(),
                configuration: json!({ "rowIdHighWaterMark": high }).to_string(),
                removed: false,
            }));
        }
    }
    if let Some(previous) = rules.in_commit_timestamp {
        let stamp = previous.map_or(now, |p| now.max(p + 1));
        if let Some(position) = actions
            .iter()
            .position(|a| matches!(a, Action::CommitInfo(_)))
        {
            let mut info = actions.remove(position);
            if let Action::CommitInfo(info) = &mut info {
                info.in_commit_timestamp = Some(stamp);
                info.timestamp = Some(stamp);
            }
            actions.insert(0, info);
        }
    }
    actions
}

/// A commit lakefill writes itself: the actions, the operation and the commit's metadata.
pub struct OwnCommit<'a> {
    /// The table, loaded at the version the actions were derived from.
    pub table: &'a DeltaTable,
    /// Its name in the project (for errors).
    pub name: &'a str,
    /// The actions (no `commitInfo`, no `txn`).
    pub actions: Vec<Action>,
    /// The operation `commitInfo` names.
    pub operation: DeltaOperation,
    /// Entries of `commitInfo` (lakefill's metadata).
    pub app_metadata: HashMap<String, Value>,
    /// The run's application transaction.
    pub transaction: Transaction,
    /// Why a commit another writer made since the read version conflicts with this one, if it
    /// does.
    pub conflicts: &'a (dyn Fn(&Commit) -> Option<String> + Sync),
}

impl OwnCommit<'_> {
    /// Writes the commit; returns its version.
    pub async fn commit(self) -> Result<u64> {
        let read_version = loaded(self.table)?;
        let log_store = self.table.log_store();
        let operation_id = uuid::Uuid::new_v4();
        let mut checked = read_version;
        let mut latest_table = self.table.clone();
        for _ in 0..ATTEMPTS {
            let latest = log_store
                .get_latest_version(checked)
                .await
                .delta_context(|| format!("cannot list the log of `{}`", self.name))?;
            for version in checked + 1..=latest {
                let commit = read_commit(self.table, version).await?;
                if let Some(why) = conflict(commit.as_ref(), self.conflicts) {
                    return Err(Error::Conflict {
                        table: self.name.to_string(),
                        read_version,
                        source: Box::new(deltalake::DeltaTableError::Generic(format!(
                            "version {version}, committed since the run read version {read_version}, {why}"
                        ))),
                    });
                }
            }
            checked = latest;
            if latest > loaded(&latest_table)? {
                latest_table
                    .load_version(latest)
                    .await
                    .delta_context(|| format!("cannot read `{}` at version {latest}", self.name))?;
            }
            let rules = rules(&latest_table).await?;
            let data = CommitData::new(
                self.actions.clone(),
                self.operation.clone(),
                self.app_metadata.clone(),
                vec![self.transaction.clone()],
            );
            let version = latest + 1;
            let now = chrono::Utc::now().timestamp_millis();
            let actions = complete(data.actions, &rules, version, now);
            let bytes = serialize(&actions)?;
            let entry =
                if ["DefaultLogStore", "LakeFSLogStore"].contains(&log_store.name().as_str()) {
                    CommitOrBytes::LogBytes(bytes)
                } else {
                    // Stores without put-if-absent commit a temporary file by copy-if-absent.
                    let path = deltalake::Path::from_iter([
                        "_delta_log",
                        &format!("_commit_{}.json.tmp", uuid::Uuid::new_v4()),
                    ]);
                    log_store
                        .object_store(Some(operation_id))
                        .put(&path, PutPayload::from(bytes))
                        .await
                        .map_err(|e| Error::Internal(format!("cannot write the commit: {e}")))?;
                    CommitOrBytes::TmpCommit(path)
                };
            lakefill_table::failpoint::reach(lakefill_table::failpoint::CrashPoint::OwnCommitWrite)
                .await?;
            match log_store
                .write_commit_entry(version, entry, operation_id)
                .await
            {
                Ok(()) => return Ok(version),
                Err(TransactionError::VersionAlreadyExists(_)) => {}
                Err(source) => {
                    return Err(Error::Delta {
                        context: format!("cannot commit to `{}`", self.name),
                        source: Box::new(source.into()),
                    });
                }
            }
        }
        Err(Error::Internal(format!(
            "`{}` moved on {ATTEMPTS} times while lakefill committed; run the command again",
            self.name
        )))
    }
}

/// The `remove` action of a live file: as delta-rs writes it, with the row tracking fields of the
/// file's `add`, which the protocol asks a remove to repeat.
pub fn remove(file: &deltalake::kernel::LogicalFileView) -> deltalake::kernel::Remove {
    #[expect(
        deprecated,
        reason = "the log's own add entry is the only way delta-rs 1.1 gives a file's row ids"
    )]
    let add = file.add_action();
    deltalake::kernel::Remove {
        base_row_id: add.base_row_id,
        default_row_commit_version: add.default_row_commit_version,
        ..file.remove_action(true)
    }
}

/// Why `commit` (another writer's, made since the read version) conflicts, if it does: a change
/// of the table's metadata or protocol always does, the rest as `conflicts` says; a commit that
/// is gone (log cleanup) may have.
fn conflict(
    commit: Option<&Commit>,
    conflicts: &(dyn Fn(&Commit) -> Option<String> + Sync),
) -> Option<String> {
    let Some(commit) = commit else {
        return Some("is no longer in the log".into());
    };
    if commit.changes_table {
        return Some("changed the table's schema, properties or protocol".into());
    }
    conflicts(commit)
}

fn loaded(table: &DeltaTable) -> Result<u64> {
    table
        .version()
        .ok_or_else(|| Error::Internal("the table is not loaded at a version".into()))
}

fn serialize(actions: &[Action]) -> Result<bytes::Bytes> {
    let lines = actions
        .iter()
        .map(serde_json::to_string)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Internal(format!("cannot write the commit as JSON: {e}")))?;
    Ok(bytes::Bytes::from(lines.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::kernel::{Add, CommitInfo};

    fn add(path: &str, rows: i64, base: Option<i64>) -> Action {
        Action::Add(Add {
            path: path.into(),
            stats: Some(json!({ "numRecords": rows }).to_string()),
            base_row_id: base,
            default_row_commit_version: base.map(|_| 3),
            ..Default::default()
        })
    }

    #[test]
    fn new_files_are_numbered_above_the_mark_and_the_mark_advances() {
        let rules = CommitRules {
            row_ids: Some(Some(99)),
            in_commit_timestamp: Some(Some(5_000)),
        };
        let actions = vec![
            add("a", 10, None),
            add("old", 7, Some(40)),
            add("b", 5, None),
            Action::CommitInfo(CommitInfo::default()),
        ];
        let done = complete(actions, &rules, 12, 4_000);
        let Action::CommitInfo(info) = &done[0] else {
            panic!("commitInfo is not first: {done:?}")
        };
        assert_eq!(
            info.in_commit_timestamp,
            Some(5_001),
            "after the previous one"
        );
        let bases: Vec<_> = done
            .iter()
            .filter_map(|a| match a {
                Action::Add(add) => Some((add.base_row_id, add.default_row_commit_version)),
                _ => None,
            })
            .collect();
        assert_eq!(
            bases,
            vec![
                (Some(100), Some(12)),
                (Some(40), Some(3)),
                (Some(110), Some(12))
            ]
        );
        let Some(Action::DomainMetadata(mark)) = done.last() else {
            panic!("no high-water mark: {done:?}")
        };
        assert_eq!(mark.configuration, r#"{"rowIdHighWaterMark":114}"#);
    }

    #[test]
    fn a_table_without_ids_starts_at_zero_and_a_clock_ahead_wins() {
        let rules = CommitRules {
            row_ids: Some(None),
            in_commit_timestamp: Some(Some(5_000)),
        };
        let done = complete(
            vec![Action::CommitInfo(CommitInfo::default()), add("a", 3, None)],
            &rules,
            1,
            9_000,
        );
        let Action::CommitInfo(info) = &done[0] else {
            panic!("{done:?}")
        };
        assert_eq!(info.in_commit_timestamp, Some(9_000));
        let Action::Add(add) = &done[1] else {
            panic!("{done:?}")
        };
        assert_eq!(add.base_row_id, Some(0));
        let Some(Action::DomainMetadata(mark)) = done.last() else {
            panic!("{done:?}")
        };
        assert_eq!(mark.configuration, r#"{"rowIdHighWaterMark":2}"#);
    }
}
