//! Adjustments (DESIGN §4 "Adjustments"): publishing a correction to a table that must never be
//! rewritten (a ledger, a table streaming readers follow, `delta.appendOnly = true`) as rows
//! appended to it, whose sum with the old rows is the corrected history.
//!
//! The model's output is staged as for any run (the new rows, which validation compares with the
//! old ones), but it is not what the publish commits. Per batch, the old rows are the table's
//! *net* rows at the read version (its rows with every earlier reversal cancelling the row it
//! reversed: grouped by every column but the measures and the lineage columns, the measures
//! summed, kept while more rows than reversals remain) and the adjustments are the differences
//! of whole rows, partition by partition:
//!
//! - a **reversal** for each old row that is not among the new rows (a changed or removed key):
//!   its values with the measures negated;
//! - a **correction** for each new row that is not among the old rows (a changed or new key).
//!
//! Each carries the lineage columns `_lakefill_run_id`, `_lakefill_kind` (`reversal` or
//! `correction`) and `_lakefill_reason`. A row's partition is part of it, so the difference is
//! the same taken per batch or over the whole range: a fix that moves a row to another day
//! reverses it on the old day and corrects it on the new one. Validation then proves, per
//! partition and key, that the old rows plus the adjustments give the new rows (each measure, and
//! the number of rows), and the publish is a plain append of the adjustment files (WRITE/Append,
//! no removes) with the run's metadata and application transaction.

mod proof;
mod sums;

pub(crate) use proof::{Compared, StagedSums, prove};

use std::sync::{Arc, Mutex};

use deltalake::arrow::datatypes::Schema;

use lakefill_recompute::plan::adjust::register_net_rows_streamed;
use lakefill_table::adjustments::AdjustmentCounts;
use lakefill_table::error::Result;
use lakefill_table::staged::StagedTable;
use lakefill_validate::keymerge::{Capture, CaptureWriter};
use lakefill_validate::net::{KeptNet, Lineage, adjustment_rows};

/// The old net rows of each batch as staging computed them (by batch index), for validation to
/// read without grouping them again ([`KeptNet`]).
pub(crate) type KeptNets = std::collections::BTreeMap<usize, KeptNet>;

/// What staging kept of the adjustments for validation, which then need not read it again.
#[derive(Default)]
pub(crate) struct Kept {
    /// The old net rows of each batch.
    pub(crate) nets: KeptNets,
    /// The proof's sums of the old net rows and of the new rows, over every batch (`None`
    /// unless staging summed every batch).
    pub(crate) sums: Option<StagedSums>,
    /// The old net rows as the key merge reads them, hashed as the difference read them, with
    /// their totals (an attempt per batch, finished with its adjustment files).
    pub(crate) old_rows: Option<Arc<Capture>>,
}

/// Stages the adjustment rows of every batch of new rows in `batches` (see the module docs);
/// returns them per batch, how many of each kind, and what validation may use of what staging
/// read ([`Kept`]). `hashed`: the new rows' hashes as their writers took them, if they did;
/// `old_rows`: where to hash the old net rows for the key merge as the difference reads them.
pub(crate) async fn stage(
    plan: &lakefill_recompute::plan::BackfillPlan,
    batches: &[lakefill_log::journal::BatchRecord],
    resources: &lakefill_table::resources::Resources,
    store: Arc<dyn deltalake::ObjectStore>,
    max_parallel: usize,
    (hashed, old_rows): (
        Option<&lakefill_validate::multiset::StagedHashes>,
        Option<Arc<Capture>>,
    ),
) -> Result<(
    Vec<lakefill_log::journal::BatchRecord>,
    AdjustmentCounts,
    Kept,
)> {
    use futures::{StreamExt as _, TryStreamExt as _};
    let write_schema = Arc::new(lakefill_recompute::plan::query::target_schema(plan)?);
    // Batches side by side, as staging runs them: each difference is one thread's work, and
    // the next batch starts as soon as any one ends (in order, a batch that ended would hold
    // its place until the one before it ends, leaving a core idle). They are put back in
    // order after, so that the sums are added in one order whatever the timing (floats).
    // (Futures made first, then buffered: a stream holding the closure is not `Send` for
    // every lifetime the runner's future needs.)
    let batch_futures: Vec<_> = batches
        .iter()
        .map(|new_rows| {
            Box::pin(stage_batch(
                plan,
                new_rows,
                resources,
                &store,
                &write_schema,
                (hashed, old_rows.as_ref()),
            ))
        })
        .collect();
    let mut staged: Vec<_> = futures::stream::iter(batch_futures)
        .buffer_unordered(max_parallel.max(1))
        .try_collect()
        .await?;
    staged.sort_by_key(|(record, ..)| record.index);
    let mut counted = AdjustmentCounts::default();
    let mut records = Vec::with_capacity(staged.len());
    // The stored rows the balance reads are the range's; the batches' scans read its periods,
    // which are all of it unless it also takes the rows of no period or is chosen by rows.
    let range = &plan.report.range;
    let whole_range = !range.include_null && range.rows.is_none();
    let mut kept = Kept {
        sums: Some(StagedSums {
            ledger: whole_range.then(sums::SideSums::default),
            adjustments: Some(sums::SideSums::default()),
            ..StagedSums::default()
        }),
        old_rows: old_rows.clone(),
        ..Kept::default()
    };
    for (record, counts, net, sums) in staged {
        counted.reversals += counts.reversals;
        counted.corrections += counts.corrections;
        kept.nets.insert(record.index, net);
        kept.sums = match (kept.sums, sums) {
            (Some(mut all), Some(batch)) => {
                all.buckets = batch.buckets;
                all.merge(batch);
                Some(all)
            }
            _ => None,
        };
        records.push(record);
    }
    Ok((records, counted, kept))
}

/// Stages the adjustment rows of one batch of new rows; returns them, their counts, the batch's
/// old net rows and the proof's sums of its old net rows and new rows (see [`sums`]; not when
/// the staged files also hold rows carried over, which the proof does not compare).
async fn stage_batch(
    plan: &lakefill_recompute::plan::BackfillPlan,
    new_rows: &lakefill_log::journal::BatchRecord,
    resources: &lakefill_table::resources::Resources,
    store: &Arc<dyn deltalake::ObjectStore>,
    write_schema: &Arc<Schema>,
    (hashed, old_rows): (
        Option<&lakefill_validate::multiset::StagedHashes>,
        Option<&Arc<Capture>>,
    ),
) -> Result<(
    lakefill_log::journal::BatchRecord,
    AdjustmentCounts,
    KeptNet,
    Option<StagedSums>,
)> {
    let report = &plan.report;
    let layout = &report.layout;
    let Some(batch) = report.batches.iter().find(|b| b.index == new_rows.index) else {
        return Err(lakefill_table::error::Error::Internal(format!(
            "staged batch {} is not in the plan",
            new_rows.index
        )));
    };
    let ctx = resources.session();
    let started = std::time::Instant::now();
    let periods = lakefill_table::partition::PartitionRange {
        from: batch.start.clone(),
        to: batch.end.clone(),
        grain: report.range.grain,
        include_null: false,
        rows: None,
    };
    // The proof's sums, taken as the rows stream by, in the buckets validation will use for a
    // range of this many partitions: of the stored rows as the net rows' scan reads them (the
    // balance), of the old net rows and the new rows as the difference reads them, of the
    // adjustments as they are written.
    let buckets = proof::buckets(report.range.periods().len());
    let measures = plan.rules.summed_measures();
    let summer = if layout.rewrites_files(&report.range) {
        None
    } else {
        Some(sums::Summer::new(
            write_schema,
            &layout.partition_columns,
            &measures,
            buckets,
            false,
        )?)
    };
    let (ledger, raw) = match &summer {
        Some(summer) => {
            let (ledger, raw) = summer.balance_only().watch();
            (Some(ledger), raw)
        }
        None => {
            let raw: lakefill_validate::multiset::Watch = Box::new(|_, _| Ok(()));
            (None, raw)
        }
    };
    let net = register_net_rows_streamed(
        &ctx,
        "__lf_old",
        plan,
        &periods,
        &resources.disk_manager(),
        raw,
    )
    .await?;
    let net_ms = started.elapsed().as_millis() as u64;
    StagedTable::register_as(
        &ctx,
        "__lf_new",
        &plan.target,
        write_schema,
        &layout.partition_columns,
        &new_rows.files,
        report.run_id.as_str(),
    )?;
    // The new rows' hashes, if this process staged them (the files are then read once).
    let staged = match hashed {
        Some(hashed) => {
            let files = new_rows.files.iter().map(|a| a.path.clone()).collect();
            hashed.take(new_rows.index, &files).await
        }
        None => None,
    };
    let counted = staged.is_some();
    let (watchers, summed, watch_adjustments) = match &summer {
        None => (lakefill_validate::multiset::Watchers::default(), None, None),
        Some(summer) => {
            let (previous, old) = summer.clone().watch();
            let (output, new) = summer.clone().watch();
            let (adjusted, adjustments) = summer.for_kinds(true).watch();
            let watchers = lakefill_validate::multiset::Watchers {
                old: Some(old),
                new: Some(new),
            };
            (
                watchers,
                Some((previous, output, adjusted)),
                Some(adjustments),
            )
        }
    };
    // The old net rows hashed for the key merge as they stream by.
    let old_writer = old_rows.map(|c| Arc::new(Mutex::new(Some(c.writer()))));
    let watchers = match &old_writer {
        Some(writer) => lakefill_validate::multiset::Watchers {
            old: Some(also_capture(watchers.old, Arc::clone(writer))),
            new: watchers.new,
        },
        None => watchers,
    };
    let adjustments = adjustment_rows(
        &ctx,
        "__lf_old",
        "__lf_new",
        write_schema,
        &measures,
        Lineage {
            run_id: report.run_id.as_str(),
            reason: report.reason.as_deref(),
        },
        watchers,
        staged,
    )
    .await?;
    let produced: Vec<String> = write_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    // The adjustments summed as they go to their writer.
    let rows = match watch_adjustments {
        Some(mut watch) => {
            let schema = adjustments.rows.schema();
            let summed = futures::StreamExt::map(adjustments.rows, move |batch| {
                let batch = batch?;
                watch(&batch, &[])?;
                Ok(batch)
            });
            Box::pin(
                deltalake::datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                    schema, summed,
                ),
            ) as deltalake::datafusion::execution::SendableRecordBatchStream
        }
        None => adjustments.rows,
    };
    let record = lakefill_recompute::stage::write_stream(
        plan,
        batch,
        rows,
        &produced,
        Arc::clone(write_schema),
        Arc::clone(store),
        &lakefill_recompute::stage::Hashing::default(),
    )
    .await?;
    if let Some(writer) = old_writer.and_then(|w| w.lock().ok()?.take()) {
        writer.finish(batch.index, record.files.iter().map(|a| a.path.clone()));
    }
    let counts = adjustments.counts.counts();
    tracing::debug!(
        batch = batch.index,
        reversals = counts.reversals,
        corrections = counts.corrections,
        counted,
        net_ms,
        difference_ms = started.elapsed().as_millis() as u64 - net_ms,
        "staged adjustments"
    );
    // The stream has ended: the difference read both sides whole.
    let taken = |sums: std::sync::Arc<std::sync::Mutex<sums::SideSums>>| {
        std::mem::take(&mut *sums.lock().expect("the sums are never poisoned"))
    };
    let watched = net.watched_every_row();
    let summed = summed.map(|(previous, output, adjusted)| StagedSums {
        buckets,
        previous: taken(previous),
        output: taken(output),
        ledger: ledger.filter(|_| watched).map(taken),
        adjustments: Some(taken(adjusted)),
    });
    Ok((record, counts, net.kept(), summed))
}

/// `watch` (if any), then `writer` hashing the same rows.
fn also_capture(
    watch: Option<lakefill_validate::multiset::Watch>,
    writer: Arc<Mutex<Option<CaptureWriter>>>,
) -> lakefill_validate::multiset::Watch {
    let mut watch = watch;
    Box::new(move |batch, values| {
        if let Some(watch) = &mut watch {
            watch(batch, values)?;
        }
        if let Some(writer) = writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            let schema = batch.schema();
            writer.add_batch(batch, |name| {
                let at = schema.index_of(name).ok()?;
                values.get(at).map(Vec::as_slice)
            });
        }
        Ok(())
    })
}

/// With a companion: refuses to publish when a commit after the version the run read changed
/// the corrected table in the range (the adjustments were derived from the rows it held then).
/// `table` is the corrected table at any version; its latest is read.
pub(crate) async fn check_adjusted_unchanged(
    table: &deltalake::DeltaTable,
    journal: &lakefill_log::journal::Journal,
) -> Result<()> {
    let Some((name, read)) = &journal.inputs.adjusts else {
        return Ok(());
    };
    let latest = lakefill_table::storage::latest(table).await?;
    let until = lakefill_table::storage::loaded_version(&latest)?;
    let later = lakefill_log::commits_in_range(
        &latest,
        *read,
        &journal.inputs.layout,
        &journal.inputs.range,
        until,
    )
    .await?;
    if later.is_empty() {
        return Ok(());
    }
    Err(lakefill_table::error::Error::Conflict {
        table: name.clone(),
        read_version: *read,
        source: Box::new(deltalake::DeltaTableError::Generic(format!(
            "version(s) {} of `{name}` changed the range the adjustments were derived from",
            later
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    })
}
