//! Publishing: the staged files of a run become one new Delta version (DESIGN §4.4).
//!
//! One commit removes every file of the affected partitions at the read version and adds every
//! staged file. It is a WRITE/Overwrite whose predicate is the range, so delta-rs's conflict
//! checker fails it when a concurrent commit touched an affected partition, and keeps commits
//! elsewhere. It carries the application transaction `lakefill:<run_id>`, which makes a retried
//! publish detectable, and the run's metadata under `lakefill` (and as `userMetadata` text).
//!
//! The staged `add` actions name partition columns logically, as the journal keeps them; a
//! column-mapped table gets them by physical name ([`ColumnMapping`]). A table whose features
//! delta-rs's commit refuses (row tracking, in-commit timestamps, identity columns, domain
//! metadata, clustering) is committed by `lakefill_log::writer`, with the same conflict rule
//! (`conflict`); identity columns' high-water marks move past the values written.

use deltalake::DeltaTable;
use deltalake::errors::DeltaTableError;
use deltalake::kernel::transaction::{
    CommitBuilder, CommitProperties, TableReference, TransactionError,
};
use deltalake::kernel::{Action, Add, Transaction};
use deltalake::protocol::{DeltaOperation, SaveMode};
use serde_json::{Value, json};

use lakefill_log::journal::Journal;
use lakefill_log::metadata::{CommitMetadata, CommittedPartition, ValidationSummary};
use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::mapping::ColumnMapping;

/// The commit metadata of a run (DESIGN §4.4).
pub(crate) fn commit_metadata(journal: &Journal) -> CommitMetadata {
    let validation = journal
        .progress
        .validation
        .as_ref()
        .map(|report| ValidationSummary {
            forced: journal.outcome.forced.is_some(),
            force_reason: journal.outcome.forced.clone(),
            ..report.summary()
        });
    CommitMetadata {
        run_id: journal.run_id.to_string(),
        model: journal.inputs.model.clone(),
        model_version: journal.inputs.model_version.clone(),
        fingerprint: journal.inputs.fingerprint.clone(),
        sources: journal.inputs.sources.clone(),
        range: (
            journal.inputs.range.from.clone(),
            journal.inputs.range.to.clone(),
        ),
        read_version: journal.inputs.read_version,
        reason: journal.inputs.reason.clone(),
        partitions: journal
            .progress
            .partitions
            .iter()
            .map(|p| CommittedPartition {
                value: p.value.clone(),
                old_rows: p.old_rows,
                new_rows: p.new_rows,
            })
            .collect(),
        spill_dropped: journal.progress.spill_dropped,
        validation,
        revert_of: journal.inputs.kind.revert_of().map(ToString::to_string),
        cascade: journal.inputs.kind.cascade().map(str::to_string),
        adjustments: (journal.inputs.publish_as
            == lakefill_table::adjustments::PublishMode::Adjustments)
            .then(|| journal.progress.adjustment_counts.unwrap_or_default()),
        edge_moves: journal
            .progress
            .validation
            .as_ref()
            .and_then(lakefill_validate::ValidationReport::allowed_edge_moves),
        rows: journal.inputs.range.rows.as_ref().map(|r| r.sql.clone()),
        change_feed: journal.progress.change_feed.as_ref().map(|f| f.counts),
        deletion_vectors: journal.vector_summary(),
    }
}

/// The table's metadata as the run's commit leaves it, if the commit changes it: with the run's
/// added columns, and identity columns' high-water marks beyond the values the run writes.
fn new_metadata(
    snapshot: &deltalake::table::state::DeltaTableState,
    journal: &Journal,
) -> Result<Option<deltalake::kernel::Metadata>> {
    let widened = (!journal.inputs.added_columns.is_empty())
        .then(|| added_columns_metadata(snapshot, journal))
        .transpose()?;
    let base = widened
        .clone()
        .unwrap_or_else(|| snapshot.metadata().clone());
    Ok(identity_marks(&base, journal, &mapping_of(snapshot, journal)?)?.or(widened))
}

/// `metadata` with each identity column's high-water mark moved past the values the run writes
/// (the lowest and highest, from the statistics of its staged files); `None` when none moves.
fn identity_marks(
    metadata: &deltalake::kernel::Metadata,
    journal: &Journal,
    mapping: &ColumnMapping,
) -> Result<Option<deltalake::kernel::Metadata>> {
    use deltalake::kernel::MetadataExt as _;
    let mut schema: Value = serde_json::from_str(metadata.schema_string())
        .map_err(|e| Error::Internal(format!("the table's schema is not JSON: {e}")))?;
    let fields = schema["fields"].as_array().cloned().unwrap_or_default();
    let identity =
        lakefill_table::protocol::IdentityColumn::of_fields(&fields).map_err(Error::Internal)?;
    let mut moved = false;
    for column in identity {
        let physical = mapping.physical(&column.name);
        let (mut lowest, mut highest) = (None::<i64>, None::<i64>);
        for add in journal.published_files() {
            let stats: Value = add
                .stats
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            if stats["numRecords"].as_i64() == Some(0) {
                continue;
            }
            let bound = |side: &str| stats[side][physical].as_i64();
            let (Some(min), Some(max)) = (bound("minValues"), bound("maxValues")) else {
                if stats["nullCount"][physical].as_i64() == stats["numRecords"].as_i64() {
                    continue;
                }
                return Err(Error::Internal(format!(
                    "staged file `{}` has no statistics of identity column `{}`, so its high-water mark cannot be moved past the values written",
                    add.path, column.name
                )));
            };
            lowest = Some(lowest.map_or(min, |l| l.min(min)));
            highest = Some(highest.map_or(max, |h| h.max(max)));
        }
        let (Some(lowest), Some(highest)) = (lowest, highest) else {
            continue;
        };
        if let Some(mark) = column.advanced(lowest, highest) {
            for field in schema["fields"].as_array_mut().into_iter().flatten() {
                if field["name"] == column.name.as_str() {
                    field["metadata"]["delta.identity.highWaterMark"] = json!(mark);
                    moved = true;
                }
            }
        }
    }
    if !moved {
        return Ok(None);
    }
    let schema: deltalake::kernel::StructType = serde_json::from_value(schema)
        .map_err(|e| Error::Internal(format!("the schema with new high-water marks: {e}")))?;
    metadata
        .clone()
        .with_schema(&schema)
        .map(Some)
        .map_err(|e| Error::Internal(format!("cannot move the identity high-water marks: {e}")))
}

/// The table's metadata with the run's added columns (nullable) at the end of its schema.
fn added_columns_metadata(
    snapshot: &deltalake::table::state::DeltaTableState,
    journal: &Journal,
) -> Result<deltalake::kernel::Metadata> {
    use deltalake::kernel::MetadataExt as _;
    let metadata = snapshot.metadata();
    let mut schema: Value = serde_json::from_str(metadata.schema_string())
        .map_err(|e| Error::Internal(format!("the table's schema is not JSON: {e}")))?;
    let fields = schema["fields"]
        .as_array_mut()
        .ok_or_else(|| Error::Internal("the table's schema has no fields".into()))?;
    // A column-mapped table's new columns get the ids and physical names the staged files use.
    let mapping = mapping_of(snapshot, journal)?;
    for column in &journal.inputs.added_columns {
        fields.push(json!({
            "name": column.name,
            "type": column.delta_type,
            "nullable": true,
            "metadata": mapping.field_metadata(&column.name),
        }));
    }
    let schema: deltalake::kernel::StructType = serde_json::from_value(schema)
        .map_err(|e| Error::Internal(format!("the widened schema is not valid: {e}")))?;
    let widened = metadata.clone().with_schema(&schema);
    let widened = if mapping.is_none() {
        widened
    } else {
        widened.and_then(|m| {
            m.add_config_key(
                lakefill_table::mapping::MAX_ID_PROPERTY.to_string(),
                mapping.max_column_id.to_string(),
            )
        })
    };
    widened.map_err(|e| {
        Error::Internal(format!(
            "cannot add columns to the schema of `{}`: {e}",
            journal.inputs.target
        ))
    })
}

/// The column mapping of the table at the run's read version, with the run's added columns.
fn mapping_of(
    snapshot: &deltalake::table::state::DeltaTableState,
    journal: &Journal,
) -> Result<ColumnMapping> {
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    let metadata = snapshot.metadata();
    let mapping = ColumnMapping::of_metadata(
        metadata.schema_string(),
        metadata.configuration(),
        metadata.id(),
    )?;
    // Only the names matter to the ids and physical names a column is given.
    let mut fields: Vec<Field> = snapshot
        .snapshot()
        .arrow_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.extend(
        journal
            .inputs
            .added_columns
            .iter()
            .map(|c| Field::new(&c.name, DataType::Null, true)),
    );
    Ok(mapping.with_added(&Schema::new(fields)))
}

/// A staged `add` (partition values keyed by logical name, as the journal keeps them) as the log
/// keys it.
fn physical_add(add: &Add, mapping: &ColumnMapping) -> Action {
    let mut add = add.clone();
    add.partition_values = mapping.physical_values(add.partition_values);
    Action::Add(add)
}

/// Commits the run of `journal` against `target`, loaded at the run's read version; returns the
/// new version.
pub(crate) async fn commit(target: &DeltaTable, journal: &Journal) -> Result<u64> {
    if journal.inputs.kind.reverts_files() {
        return Err(Error::Internal(format!(
            "run `{}` is a revert: it has no staged files to publish",
            journal.run_id
        )));
    }
    let snapshot = target
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", journal.inputs.target))?;
    let layout = &journal.inputs.layout;
    if journal.inputs.publish_as == lakefill_table::adjustments::PublishMode::Adjustments {
        // Adjustments only append: nothing of the table is removed.
        let mapping = mapping_of(snapshot, journal)?;
        let mut actions: Vec<Action> = journal
            .published_files()
            .map(|add| physical_add(add, &mapping))
            .collect();
        if let Some(metadata) = new_metadata(snapshot, journal)? {
            actions.push(Action::Metadata(metadata));
        }
        return commit_actions(target, journal, actions).await;
    }
    let mapping = mapping_of(snapshot, journal)?;
    // Every file of the range's partitions (all their sub-partitions) at the read version.
    let affected: std::collections::BTreeSet<&str> = journal
        .inputs
        .affected_files
        .iter()
        .map(String::as_str)
        .collect();
    // Files of partitions published by deletion vectors stay (some with a new vector).
    let kept: std::collections::BTreeSet<&str> = journal
        .vectors()
        .flat_map(|v| v.kept.iter().map(|a| a.path.as_str()))
        .collect();
    let mut actions: Vec<Action> = snapshot
        .log_data()
        .iter()
        .filter(|file| {
            if layout.rewrites_files(&journal.inputs.range) {
                // By rows or `--where`: the files the plan chose by their values and statistics.
                affected.contains(file.path().as_ref() as &str)
            } else {
                layout
                    .label_in(
                        &journal.inputs.range,
                        &mapping.logical_values(file.partition_values_map()),
                    )
                    .is_some()
            }
        })
        .filter(|file| !kept.contains(file.path().as_ref() as &str))
        .map(|file| Action::Remove(lakefill_log::writer::remove(&file)))
        .collect();
    // Kept files the fix deleted rows of: their `remove` (with the vector they had) and their
    // `add` with the new one; the others stay as they are.
    for vectors in journal.vectors() {
        for add in vectors
            .kept
            .iter()
            .filter(|a| vectors.cut.contains(&a.path))
        {
            let file = snapshot
                .log_data()
                .iter()
                .find(|f| f.path().as_ref() as &str == add.path.as_str())
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "`{}`, a file the run deletes rows of, is not in the table at its read version",
                        add.path
                    ))
                })?;
            actions.push(Action::Remove(lakefill_log::writer::remove(&file)));
            actions.push(physical_add(add, &mapping));
        }
    }
    actions.extend(
        journal
            .published_files()
            .map(|add| physical_add(add, &mapping)),
    );
    let mut actions = with_change_feed(actions, journal, &mapping);
    if let Some(metadata) = new_metadata(snapshot, journal)? {
        // The added columns join the schema in the same commit (earlier versions keep theirs),
        // and identity columns' high-water marks pass the values written.
        actions.push(Action::Metadata(metadata));
    }
    commit_actions(target, journal, actions).await
}

/// `actions` (adds and removes, partition values by physical name) with the run's change data
/// feed, when it has one: its files as `cdc` actions (what a feed reader reads of the commit
/// instead of its adds and removes), and `dataChange` false on the files of partitions it has no
/// rows in.
pub(crate) fn with_change_feed(
    mut actions: Vec<Action>,
    journal: &Journal,
    mapping: &ColumnMapping,
) -> Vec<Action> {
    let Some(feed) = &journal.progress.change_feed else {
        return actions;
    };
    let changes = DataChanges::of(journal);
    for action in &mut actions {
        match action {
            Action::Add(add) => {
                add.data_change =
                    changes.changes(&mapping.logical_values(add.partition_values.clone()));
            }
            Action::Remove(remove) => {
                let values = remove.partition_values.clone().unwrap_or_default();
                remove.data_change = changes.changes(&mapping.logical_values(values));
            }
            _ => {}
        }
    }
    actions.extend(feed.files.iter().map(|file| {
        let mut file = file.clone();
        file.partition_values = mapping.physical_values(file.partition_values);
        Action::Cdc(file)
    }));
    actions
}

/// Which files of a commit change data (`dataChange`): with a change data feed, only those of
/// partitions the feed has rows in; the others are rewritten with the same rows, as a compaction
/// would (readers of the table's changes, and streams, skip them). Without a feed, all.
struct DataChanges<'a> {
    layout: &'a lakefill_table::partition::Layout,
    /// The labels of the partitions the feed has rows in; `None` without a feed.
    changed: Option<std::collections::BTreeSet<String>>,
}

impl<'a> DataChanges<'a> {
    fn of(journal: &'a Journal) -> Self {
        let layout = &journal.inputs.layout;
        let changed = journal.progress.change_feed.as_ref().map(|feed| {
            feed.files
                .iter()
                .map(|f| lakefill_table::partition::label_of(layout, &f.partition_values))
                .collect()
        });
        Self { layout, changed }
    }

    /// Whether a file of the partition `values` (logical names) changes data.
    fn changes(&self, values: &std::collections::HashMap<String, Option<String>>) -> bool {
        let Some(changed) = &self.changed else {
            return true;
        };
        if self.layout.by_rows || self.layout.is_timeless() {
            // Files hold rows of many periods: any change changes them all.
            return !changed.is_empty();
        }
        changed.contains(&lakefill_table::partition::label_of(self.layout, values))
    }
}

/// Why `commit`, another writer's since the run's read version, conflicts with the run, if it
/// does (as delta-rs's conflict checker decides for the commits it makes): partitioned, it added
/// or removed files in the range's partitions; by rows, it removed a file the run replaces, or
/// added one whose statistics do not rule out rows in the range.
fn conflict(journal: &Journal, commit: &lakefill_log::Commit) -> Option<String> {
    let (layout, range) = (&journal.inputs.layout, &journal.inputs.range);
    if !layout.rewrites_files(range) {
        return commit
            .touches(layout, range)
            .then(|| "added or removed files in the run's range".to_string());
    }
    let replaced = |path: &str| {
        let decoded = lakefill_table::storage::decode(path);
        journal
            .inputs
            .affected_files
            .iter()
            .any(|f| *f == path || *f == decoded)
    };
    if let Some(path) = commit.removed_paths.iter().find(|p| replaced(p)) {
        return Some(format!("removed `{path}`, a file the run replaces"));
    }
    // An added file in the range may hold rows of its scope: the predicate is not asked (the
    // conflict is decided without the schema, and erring this way loses nothing).
    commit
        .added_paths
        .iter()
        .zip(&commit.added_stats)
        .zip(&commit.added_values)
        .find(|((_, stats), values)| {
            if layout.by_rows {
                layout.time.file_may_hold(range, stats.as_deref())
            } else {
                layout.label_in(range, values).is_some()
            }
        })
        .map(|((path, _), _)| format!("added `{path}`, which may hold rows of the run's range"))
}

/// Commits `actions` for the run of `journal` against `target` (loaded at the version the
/// actions were derived from): a WRITE/Overwrite whose predicate is the run's range, with the
/// run's application transaction and metadata. Shared by publishing and reverting.
pub(crate) async fn commit_actions(
    target: &DeltaTable,
    journal: &Journal,
    actions: Vec<Action>,
) -> Result<u64> {
    lakefill_table::storage::ensure_conditional_writes(target, &journal.inputs.target).await?;
    let snapshot = target
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{}`", journal.inputs.target))?;
    let layout = &journal.inputs.layout;

    // The range as the operation's predicate, so the conflict checker fails the commit when a
    // concurrent one touched the range (and keeps commits elsewhere).
    let predicate =
        layout.range_predicate(&journal.inputs.range, &snapshot.snapshot().arrow_schema())?;
    let predicate = deltalake::datafusion::sql::unparser::expr_to_sql(&predicate)
        .map_err(|e| Error::Internal(format!("cannot write the range as SQL: {e}")))?
        .to_string();
    // Adjustments append; the range as the predicate still makes a concurrent commit in it a
    // conflict (the adjustments were derived from the rows the run read).
    let mode = match journal.inputs.publish_as {
        lakefill_table::adjustments::PublishMode::Adjustments => SaveMode::Append,
        lakefill_table::adjustments::PublishMode::Rewrite => SaveMode::Overwrite,
    };
    let operation = DeltaOperation::Write {
        mode,
        partition_by: (!layout.partition_columns.is_empty())
            .then(|| layout.partition_columns.clone()),
        predicate: Some(predicate),
    };
    // The metadata is public: whatever it quotes (a reason, sample values) is masked.
    let user_metadata = lakefill_table::secrets::mask(
        &serde_json::to_string(&commit_metadata(journal))
            .map_err(|e| Error::Internal(format!("metadata: {e}")))?,
    );
    let metadata: Value = serde_json::from_str(&user_metadata)
        .map_err(|e| Error::Internal(format!("metadata: {e}")))?;
    let app_metadata = [
        ("lakefill".to_string(), metadata),
        ("userMetadata".to_string(), Value::String(user_metadata)),
    ];
    let transaction = Transaction::new(
        journal.run_id.app_id(),
        i64::try_from(journal.outcome.sequence).unwrap_or(i64::MAX),
    );
    if !lakefill_log::writer::delta_rs_commits(target) {
        // A table with features delta-rs's commit refuses: lakefill writes the commit itself.
        let conflicts = |commit: &lakefill_log::Commit| conflict(journal, commit);
        let version = lakefill_log::writer::OwnCommit {
            table: target,
            name: &journal.inputs.target,
            actions,
            operation,
            app_metadata: app_metadata.into_iter().collect(),
            transaction,
            conflicts: &conflicts,
        }
        .commit()
        .await?;
        if failpoint::armed_error(CrashPoint::LostCommitResponse) {
            return Err(Error::Delta {
                context: format!("cannot commit the backfill to `{}`", journal.inputs.target),
                source: Box::new(DeltaTableError::Generic(
                    "injected: the commit's response was lost".into(),
                )),
            });
        }
        return Ok(version);
    }
    // Checkpoints and log cleanup are left to the table's other writers (a `v2Checkpoint` table
    // would get a classic checkpoint, a `checkpointProtection` table a cleanup it forbids).
    let properties = CommitProperties::default()
        .with_metadata(app_metadata)
        .with_application_transaction(transaction)
        .with_create_checkpoint(false)
        .with_cleanup_expired_logs(Some(false));
    let finalized = CommitBuilder::from(properties)
        .with_actions(actions)
        .build(
            Some(snapshot as &dyn TableReference),
            target.log_store(),
            operation,
        )
        .await
        .and_then(|finalized| {
            // Test builds can lose the response of a commit that landed.
            if failpoint::armed_error(CrashPoint::LostCommitResponse) {
                return Err(DeltaTableError::Generic(
                    "injected: the commit's response was lost".into(),
                ));
            }
            Ok(finalized)
        })
        .map_err(|source| match source {
            DeltaTableError::Transaction {
                source: TransactionError::CommitConflict(_),
            } => Error::Conflict {
                table: journal.inputs.target.clone(),
                read_version: journal.inputs.read_version,
                source: Box::new(source),
            },
            source => Error::Delta {
                context: format!("cannot commit the backfill to `{}`", journal.inputs.target),
                source: Box::new(source),
            },
        })?;
    Ok(finalized.version())
}
