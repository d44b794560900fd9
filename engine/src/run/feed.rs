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

use std::sync::Arc;
use std::time::Instant;

use deltalake::datafusion::prelude::SessionContext;

use lakefill_log::journal::{ChangeFeed, Journal};
use lakefill_recompute::plan::BackfillPlan;
use lakefill_table::adjustments::PublishMode;
use lakefill_table::error::{Error, QueryContext, Result};
use lakefill_table::resources::Resources;
use lakefill_validate::keymerge::FoundChanges;

use crate::run::validation::{
    comparison_session, logged_checksums, register_output, staged_checksums, table_schema,
};

/// First halves of key hashes ([`lakefill_table::rowhash::key_hash_sql`]).
type KeyHashes = std::collections::HashSet<u64>;

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
    let found = match found {
        Some(found) => compared_sides(&ctx, journal, &found)
            .await?
            .map(|sides| (sides, found)),
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
    let mapping = match &plan.write_schema {
        Some(schema) => plan.report.protocol.mapping.clone().with_added(schema),
        None => plan.report.protocol.mapping.clone(),
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
    feed.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(feed)
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
) -> Result<Option<(String, String)>> {
    let (layout, range) = (&journal.inputs.layout, &journal.inputs.range);
    let Some(labels) = found.labels() else {
        return Ok(Some(("previous".to_string(), "output".to_string())));
    };
    if layout.rewrites_files(range) || layout.is_timeless() {
        return Ok(None);
    }
    sides_of(ctx, layout, &labels.iter().collect::<Vec<_>>()).await
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
