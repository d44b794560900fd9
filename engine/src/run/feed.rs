//! The change data feed phase of a run: when the target records a change data feed
//! (`delta.enableChangeDataFeed`), the rows the run really changes are written as change data
//! files before the run is published, so that its commit shows a feed reader those rows and
//! nothing else, instead of the whole replaced range deleted and inserted again.
//!
//! The old side is the target's rows of the range at the read version, the new side the staged
//! rows of the range, as validation registers them; rows carried over unchanged (by rows,
//! `--where`) are on neither side. Partitions whose checksums agree (the log's for files an
//! earlier run wrote, the run's writers' for the staged ones) hold the same rows and are not read.
//! Computing the rows is `lakefill_validate::feed`, writing them `lakefill_recompute::stage::feed`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use deltalake::kernel::Add;
use futures::{StreamExt as _, TryStreamExt as _};

use deltalake::datafusion::prelude::SessionContext;

use lakefill_log::journal::{ChangeFeed, Journal};
use lakefill_recompute::plan::BackfillPlan;
use lakefill_recompute::stage::feed::FeedWritten;
use lakefill_table::adjustments::PublishMode;
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::resources::Resources;
use lakefill_validate::keymerge::{FoundChanges, KeyChange};

use crate::run::validation::{
    comparison_session, logged_checksums, register_output, staged_checksums, table_schema,
};

/// First halves of key hashes ([`lakefill_table::rowhash::key_hash_sql`]).
type KeyHashes = std::collections::HashSet<u64>;

/// Partitions whose files the feed copies whole at once.
const COPYING_PARTITIONS: usize = 8;

/// The table property that turns the change data feed on.
const FEED_PROPERTY: &str = "delta.enableChangeDataFeed";

/// Whether a run of `plan` writes a change data feed: its target records one and the run
/// replaces rows (adjustments only append, which a feed reader reads as inserts already).
pub(crate) fn records_feed(plan: &BackfillPlan, journal: &Journal) -> Result<bool> {
    if journal.inputs.publish_as != PublishMode::Rewrite {
        return Ok(false);
    }
    table_records_feed(&plan.target)
}

/// Whether `table` (at the version it is loaded at) records a change data feed.
pub(crate) fn table_records_feed(table: &deltalake::DeltaTable) -> Result<bool> {
    let snapshot = table.snapshot().map_err(|source| Error::Delta {
        context: "cannot read the table's snapshot".into(),
        source: Box::new(source),
    })?;
    Ok(snapshot
        .metadata()
        .configuration()
        .get(FEED_PROPERTY)
        .is_some_and(|v| v.eq_ignore_ascii_case("true")))
}

/// Computes the run's change data feed and writes its files (after deleting any an interrupted
/// attempt left in the run's feed directory). `changed`: the keys this process's staging found
/// the fix changes by deletion vectors, if it tracked them; when they cover every batch of the
/// journal, only the rows of those keys are compared. `found`: how each key changed, as this
/// process's validation found it: then each side is read once, for the rows of those keys, in
/// the partitions validation compared.
pub(crate) async fn write_change_feed(
    plan: &BackfillPlan,
    journal: &Journal,
    resources: &Resources,
    (changed, found): (
        Option<&lakefill_recompute::stage::vectors::ChangedKeys>,
        Option<Arc<FoundChanges>>,
    ),
) -> Result<ChangeFeed> {
    let started = Instant::now();
    let store = plan.target.object_store();
    // What an interrupted attempt left (the journal lists no feed while validating).
    crate::run::cleanup::delete_unjournaled_feed(&plan.target, journal).await?;
    let layout = &journal.inputs.layout;
    let range = &journal.inputs.range;
    let ctx = comparison_session(resources.session(), &plan.target, layout, range).await?;
    lakefill_table::rowhash::register_hash_functions(&ctx);
    let write_schema = Arc::new(lakefill_recompute::plan::query::target_schema(plan)?);
    let target_schema = table_schema(plan)?;
    register_output(&ctx, plan, journal, &write_schema, &target_schema).await?;
    let mapping = match &plan.write_schema {
        Some(schema) => plan.report.protocol.mapping.clone().with_added(schema),
        None => plan.report.protocol.mapping.clone(),
    };
    // The partitions whose every row is one change on each side: their files copied whole.
    let (whole, copied) = match &found {
        Some(found) => {
            let copy = lakefill_recompute::stage::feed::WholeCopy::new(
                &write_schema,
                &journal.inputs.target,
                layout,
                &mapping,
                &journal.run_id,
                Arc::clone(&store),
            )?;
            copy_whole_partitions(plan, journal, found, &copy).await?
        }
        None => (BTreeSet::new(), FeedWritten::default()),
    };
    let found = match found {
        Some(found) => {
            let sides = match cut_sides(&ctx, plan, journal, &found, &write_schema).await? {
                Some(sides) => Some(sides),
                None => compared_sides(&ctx, journal, &found, &whole).await?,
            };
            sides.map(|sides| (sides, found))
        }
        None => None,
    };
    let (old, new, found) = match found {
        Some(((old, new), found)) => (old, new, Some(found)),
        None => {
            let (old, new) = differing_sides(&ctx, plan, journal, &target_schema).await?;
            (old, new, None)
        }
    };
    if let Some(found) = &found {
        tracing::debug!(
            keys = found.len(),
            "the feed takes the changed keys validation found"
        );
    }
    let among = match found {
        Some(_) => None,
        None => changed_keys(plan, journal, changed).map(Arc::new),
    };
    let mut feed = write_feed_between(
        &ctx,
        (&old, &new),
        (&plan.rules.key, among, found),
        journal,
        &mapping,
        store,
    )
    .await?;
    feed.files.extend(copied.files);
    feed.files.sort_by(|a, b| a.path.cmp(&b.path));
    feed.counts.merge(&copied.counts);
    feed.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(feed)
}

/// Copies into change data files, whole, the files of each partition the key merge compared
/// whose every row is one change on each side (every old row a `delete` or an
/// `update_preimage`, every new row an `insert` or an `update_postimage`); returns those
/// partitions' labels, which the feed then leaves out, and what was written. A partition is
/// copied only when the rows its files hold are the rows the merge counted on each side: a run
/// by deletion vectors, by rows or with `--where` (whose files also hold rows that did not
/// change) copies none.
async fn copy_whole_partitions(
    plan: &BackfillPlan,
    journal: &Journal,
    found: &FoundChanges,
    copy: &lakefill_recompute::stage::feed::WholeCopy,
) -> Result<(BTreeSet<String>, FeedWritten)> {
    let (layout, range) = (&journal.inputs.layout, &journal.inputs.range);
    let mut copied = (BTreeSet::new(), FeedWritten::default());
    let Some(labels) = found.labels() else {
        return Ok(copied);
    };
    if layout.rewrites_files(range)
        || layout.is_timeless()
        || layout.partition_columns.is_empty()
        || journal.vectors().next().is_some()
    {
        return Ok(copied);
    }
    // Each compared partition's files: the target's at the read version, and the staged ones.
    let snapshot = plan.target.snapshot().map_err(|source| Error::Delta {
        context: "cannot read the target's snapshot".into(),
        source: Box::new(source),
    })?;
    let mapping = &plan.report.protocol.mapping;
    let mut files: BTreeMap<&String, [Vec<Add>; 2]> = BTreeMap::new();
    for file in snapshot.log_data().iter() {
        let values = mapping.logical_values(file.partition_values_map());
        let Some(label) = layout.label_in(range, &values).and_then(|l| labels.get(&l)) else {
            continue;
        };
        #[expect(
            deprecated,
            reason = "the log's own add entry is the only way delta-rs 1.1 gives a file's vector"
        )]
        let mut add = file.add_action();
        add.partition_values = values;
        files.entry(label).or_default()[0].push(add);
    }
    for add in journal.new_row_files() {
        if let Some(label) = layout
            .label_in(range, &add.partition_values)
            .and_then(|l| labels.get(&l))
        {
            files.entry(label).or_default()[1].push(add.clone());
        }
    }
    // Which change each side's rows all are, per partition where each side's rows are one.
    let mut candidates = Vec::new();
    for label in labels {
        if label == lakefill_table::partition::NULL_LABEL {
            continue;
        }
        let Some([old_rows, new_rows]) = found.partition_rows(label) else {
            continue;
        };
        let old_change = match (old_rows.rows, old_rows.whole()) {
            (0, _) => None,
            (_, Some(KeyChange::Update)) => Some("update_preimage"),
            (_, Some(KeyChange::Delete)) => Some("delete"),
            _ => continue,
        };
        let new_change = match (new_rows.rows, new_rows.whole()) {
            (0, _) => None,
            (_, Some(KeyChange::Update)) => Some("update_postimage"),
            (_, Some(KeyChange::Insert)) => Some("insert"),
            _ => continue,
        };
        let [old_files, new_files] = files.remove(label).unwrap_or_default();
        candidates.push((
            label,
            [
                (old_files, old_rows.rows, old_change),
                (new_files, new_rows.rows, new_change),
            ],
        ));
    }
    // Partitions side by side: their files are read and written whole, which on object
    // storage is mostly waiting. (Futures made first, then buffered: a stream holding the
    // closure is not `Send` for every lifetime the runner's future needs.)
    let copies: Vec<_> = candidates
        .into_iter()
        .map(|(label, sides)| Box::pin(copy_partition(copy, label, sides)))
        .collect();
    let partitions = futures::stream::iter(copies).buffer_unordered(COPYING_PARTITIONS);
    futures::pin_mut!(partitions);
    while let Some(partition) = partitions.try_next().await? {
        if let Some((label, written)) = partition {
            copied.0.insert(label.clone());
            copied.1.files.extend(written.files);
            copied.1.counts.merge(&written.counts);
        }
    }
    tracing::debug!(
        partitions = copied.0.len(),
        files = copied.1.files.len(),
        "the feed copied partitions whose every row is one change whole"
    );
    Ok(copied)
}

/// Copies the files of partition `label` whole, each side's (its files, the rows the merge
/// counted there, the change every one is) when the files hold exactly the rows counted; `None`
/// when a side's do not, or cannot be copied.
async fn copy_partition<'a>(
    copy: &lakefill_recompute::stage::feed::WholeCopy,
    label: &'a String,
    sides: [(Vec<Add>, u64, Option<&'static str>); 2],
) -> Result<Option<(&'a String, FeedWritten)>> {
    let mut whole = Vec::with_capacity(2);
    for (files, counted, change) in sides {
        let Some(side) = copy.side(files).await? else {
            return Ok(None);
        };
        // The files hold the rows the merge counted, and only those.
        if side.rows != counted {
            tracing::debug!(%label, rows = side.rows, counted,
                "a partition's files hold other rows than the merge counted: its feed is computed row by row");
            return Ok(None);
        }
        whole.push((side, change));
    }
    let mut written = FeedWritten::default();
    for (side, change) in whole {
        if let Some(change) = change {
            let copied = copy.copy(side, change).await?;
            written.files.extend(copied.files);
            written.counts.merge(&copied.counts);
        }
    }
    Ok(Some((label, written)))
}

/// With a run by deletion vectors, the sides of its feed without the rows it leaves where they
/// are: the old side is the rows its vectors delete (read from the cut files by a row selection,
/// [`StagedTable::register_deleted_as`]) and the old rows of the compared partitions it
/// rewrites; the new side is its staged files. The rows left out are the same on both sides (a
/// kept row is the very row it was), but a key could have rows among them too: this holds only
/// when, in every compared partition published by vectors, the rows the key merge counted of
/// changed keys are exactly the rows the vectors delete (old) and the rows staged (new), which
/// is when every row of a changed key is deleted or written there (a row deleted or written is
/// of a changed key: an old row of an unchanged key is used up by its twin). `None` otherwise,
/// and for any other run.
///
/// [`StagedTable::register_deleted_as`]: lakefill_table::staged::StagedTable::register_deleted_as
async fn cut_sides(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    found: &FoundChanges,
    write_schema: &deltalake::arrow::datatypes::SchemaRef,
) -> Result<Option<(String, String)>> {
    let (layout, range) = (&journal.inputs.layout, &journal.inputs.range);
    // The partitions compared (`None`: all of them).
    let labels = found.labels();
    if found.null_keys()
        || journal.vectors().next().is_none()
        || layout.rewrites_files(range)
        || layout.is_timeless()
        || layout.partition_columns.is_empty()
    {
        return Ok(None);
    }
    // The partitions published by vectors, and what their vectors delete and their files add.
    let mut by_vectors: BTreeMap<&String, lakefill_log::journal::VectorCounts> = BTreeMap::new();
    for vectors in journal.vectors() {
        for (label, counts) in &vectors.partitions {
            let all = by_vectors.entry(label).or_default();
            all.deleted += counts.deleted;
            all.added += counts.added;
        }
    }
    for (label, counts) in &by_vectors {
        let [old, new] = match found.partition_rows(label) {
            Some(rows) => rows,
            None if counts.deleted + counts.added == 0 => continue,
            // A partition the fix changes that the merge did not compare.
            None => return Ok(None),
        };
        if old.delete + old.update != counts.deleted || new.insert + new.update != counts.added {
            tracing::debug!(%label, deleted = counts.deleted, added = counts.added,
                "a partition published by vectors keeps rows of changed keys: its feed reads it whole");
            return Ok(None);
        }
    }
    // The cut files of the compared partitions, with the vectors they had at the read version.
    let snapshot = plan.target.snapshot().map_err(|source| Error::Delta {
        context: "cannot read the target's snapshot".into(),
        source: Box::new(source),
    })?;
    let before: BTreeMap<String, Option<deltalake::kernel::DeletionVectorDescriptor>> = snapshot
        .log_data()
        .iter()
        .map(|file| (file.path().into_owned(), file.deletion_vector_descriptor()))
        .collect();
    let mut cuts = Vec::new();
    for vectors in journal.vectors() {
        for add in vectors
            .kept
            .iter()
            .filter(|a| vectors.cut.contains(&a.path))
        {
            let Some(label) = layout.label_in(range, &add.partition_values) else {
                return Ok(None);
            };
            if labels.is_some_and(|labels| !labels.contains(&label)) {
                continue;
            }
            let Some(had) = before.get(&add.path) else {
                return Ok(None);
            };
            cuts.push((add.clone(), had.clone()));
        }
    }
    let key = format!("{}-feed", journal.run_id);
    let (cut_rows, staged_rows) = ("__lf_feed_cut", "__lf_feed_staged");
    let columns = (write_schema.as_ref(), layout.partition_columns.as_slice());
    lakefill_table::staged::StagedTable::register_deleted_as(
        ctx,
        cut_rows,
        &plan.target,
        columns,
        &cuts,
        &key,
    )?;
    // The files the run writes (the feed is only written for runs that publish their rows).
    let staged: Vec<Add> = journal.published_files().cloned().collect();
    lakefill_table::staged::StagedTable::register_as(
        ctx,
        staged_rows,
        &plan.target,
        columns.0,
        columns.1,
        &staged,
        &key,
    )?;
    let schema = table_rows(ctx, "previous")
        .await?
        .schema()
        .as_arrow()
        .clone();
    // The compared partitions the fix rewrites: of those the merge read, the ones not cut.
    let rewritten: Vec<&String> = found
        .read_labels()
        .filter(|l| !by_vectors.contains_key(l))
        .collect();
    let predicate = |labels: &[&String]| -> Result<Option<deltalake::datafusion::prelude::Expr>> {
        if labels.is_empty() {
            return Ok(Some(deltalake::datafusion::prelude::lit(false)));
        }
        lakefill_validate::compare::periods_predicate(layout, labels, &schema)
    };
    // The staged rows of the compared partitions.
    let compared_rows = match labels {
        Some(labels) => match predicate(&labels.iter().collect::<Vec<_>>())? {
            Some(predicate) => predicate,
            None => return Ok(None),
        },
        None => deltalake::datafusion::prelude::lit(true),
    };
    let cut = table_rows(ctx, cut_rows).await?;
    let old = if rewritten.is_empty() {
        cut
    } else {
        let Some(rewritten_rows) = predicate(&rewritten)? else {
            return Ok(None);
        };
        let joined = table_rows(ctx, "previous")
            .await?
            .filter(rewritten_rows)
            .and_then(|previous| previous.union_by_name(cut));
        match joined {
            Ok(joined) => joined,
            Err(error) => {
                tracing::debug!(%error,
                    "the rows the cut files delete do not join the old rows of the rewritten partitions: the feed reads both sides whole");
                return Ok(None);
            }
        }
    };
    let new = table_rows(ctx, staged_rows)
        .await?
        .filter(compared_rows)
        .query_context(|| "cannot select the compared partitions of the staged rows".into())?;
    let names = ("__lf_by_vectors_old", "__lf_by_vectors_new");
    for (name, rows) in [(names.0, old), (names.1, new)] {
        ctx.register_table(name, rows.into_view())
            .query_context(|| format!("cannot register `{name}`"))?;
    }
    tracing::debug!(
        cut = cuts.len(),
        staged = staged.len(),
        rewritten = rewritten.len(),
        "the feed of a run by vectors reads the rows it deletes and writes"
    );
    Ok(Some((names.0.to_string(), names.1.to_string())))
}

/// The rows of the table `name` registered in `ctx`.
async fn table_rows(
    ctx: &SessionContext,
    name: &str,
) -> Result<deltalake::datafusion::prelude::DataFrame> {
    ctx.table(name)
        .await
        .query_context(|| format!("table `{name}` is not registered"))
}

/// The key hashes `changed` holds, when they are every key the run's fix changes: this process
/// staged every batch of the journal by deletion vectors and read every old file of the range.
fn changed_keys(
    plan: &BackfillPlan,
    journal: &Journal,
    changed: Option<&lakefill_recompute::stage::vectors::ChangedKeys>,
) -> Option<std::collections::HashSet<u64>> {
    let indices: Vec<usize> = journal.progress.batches.iter().map(|b| b.index).collect();
    let keys = changed?.of(&indices, plan.vectors.as_deref()?);
    match &keys {
        Some(keys) => tracing::debug!(
            keys = keys.len(),
            "the feed compares the keys staging found changed"
        ),
        None => tracing::debug!(
            "the keys staging found changed are not all of them: the feed compares every key"
        ),
    }
    keys
}

/// Writes the change data feed from the rows of `old` to those of `new` (tables registered in
/// `ctx`, which has the hash functions) into the change data directory of `journal`'s run, by
/// `key` ([`lakefill_validate::feed::change_rows`]; `among`: the only key hashes that may have
/// changed).
pub(crate) async fn write_feed_between(
    ctx: &SessionContext,
    (old, new): (&str, &str),
    (key, among, found): (&[String], Option<Arc<KeyHashes>>, Option<Arc<FoundChanges>>),
    journal: &Journal,
    mapping: &lakefill_table::mapping::ColumnMapping,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<ChangeFeed> {
    let started = Instant::now();
    // (The rows it holds in memory, if any, are held until the feed is written.)
    let changes = lakefill_validate::feed::change_rows(ctx, old, new, key, (among, found)).await?;
    let streams = changes
        .rows
        .clone()
        .execute_stream_partitioned()
        .await
        .query_context(|| "cannot compute the change feed".into())?;
    let written = lakefill_recompute::stage::feed::write_feed_parallel(
        streams,
        &journal.inputs.target,
        &journal.inputs.layout,
        mapping,
        &journal.run_id,
        store,
    )
    .await?;
    drop(changes);
    Ok(ChangeFeed {
        files: written.files,
        counts: written.counts,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// The sides validation's key merge compared (`found`): `previous` and `output`, or their
/// partitions it compared; `None` when they cannot be selected so (by rows, only whole sides).
async fn compared_sides(
    ctx: &SessionContext,
    journal: &Journal,
    found: &FoundChanges,
    copied: &BTreeSet<String>,
) -> Result<Option<(String, String)>> {
    let (layout, range) = (&journal.inputs.layout, &journal.inputs.range);
    let Some(labels) = found.labels() else {
        return Ok(Some(("previous".to_string(), "output".to_string())));
    };
    if layout.rewrites_files(range) || layout.is_timeless() {
        return Ok(None);
    }
    let labels: Vec<&String> = labels.iter().filter(|l| !copied.contains(*l)).collect();
    sides_of(ctx, layout, &labels).await
}

/// `previous` and `output` narrowed to the partitions `labels` (none: no rows), or `None` when
/// they cannot be selected by a short predicate.
async fn sides_of(
    ctx: &SessionContext,
    layout: &lakefill_table::partition::Layout,
    labels: &[&String],
) -> Result<Option<(String, String)>> {
    let schema = ctx
        .table("previous")
        .await
        .query_context(|| "table `previous` is not registered".into())?
        .schema()
        .as_arrow()
        .clone();
    let predicate = if labels.is_empty() {
        Some(deltalake::datafusion::prelude::lit(false))
    } else {
        lakefill_validate::compare::periods_predicate(layout, labels, &schema)?
    };
    match predicate {
        Some(predicate) => Ok(Some(
            lakefill_validate::compare::differing_views(ctx, Some(predicate)).await?,
        )),
        None => Ok(None),
    }
}

/// The old and new sides to compare: `previous` and `output`, or only their partitions whose
/// checksums differ when both sides' are known.
async fn differing_sides(
    ctx: &SessionContext,
    plan: &BackfillPlan,
    journal: &Journal,
    target_schema: &deltalake::arrow::datatypes::Schema,
) -> Result<(String, String)> {
    let (layout, range) = (&journal.inputs.layout, &journal.inputs.range);
    let whole = || Ok(("previous".to_string(), "output".to_string()));
    if layout.rewrites_files(range) || layout.is_timeless() {
        return whole();
    }
    let columns: Vec<String> = target_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !layout.partition_columns.contains(name))
        .collect();
    let Some(old) = logged_checksums(plan, layout, range, target_schema, &columns)? else {
        return whole();
    };
    let new = staged_checksums(journal);
    let labels: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let differing: Vec<&String> = labels
        .iter()
        .copied()
        .filter(
            |label| match (old.get(*label).copied().flatten(), new.get(*label)) {
                (Some(old), Some(new)) => old != *new,
                (Some(old), None) => old.rows > 0,
                (None, Some(new)) if !old.contains_key(*label) => new.rows > 0,
                _ => true,
            },
        )
        .collect();
    if differing.len() == labels.len() {
        return whole();
    }
    match sides_of(ctx, layout, &differing).await? {
        Some(sides) => Ok(sides),
        None => whole(),
    }
}
