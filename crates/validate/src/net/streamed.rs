//! Net rows for a reader that reads them once, whole (staging's multiset difference), in one scan
//! of the table's rows: the rows no adjustment touches pass on as they come, the rows of the
//! groups adjustments touch go to a grouping that runs beside the scan (on a task of its own),
//! whose rows follow once the scan has ended (kept in a spill file, for validation:
//! [`KeptNet`]). A watcher sees every stored row on the way, before any is netted (the balance of
//! the adjustments' proof sums them, which checks the netting).
//!
//! [`super::register_net_spilled`] gives the same rows from three scans: the groups adjustments
//! touch, the rows of those groups (grouped), the other rows (as they are). The first is kept
//! (it reads two columns, and the split needs the groups before the first row); the other two
//! are this one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deltalake::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, new_null_array,
};
use deltalake::arrow::compute::kernels::boolean::{and, is_null, not};
use deltalake::arrow::compute::{cast, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use deltalake::datafusion::catalog::streaming::StreamingTable;
use deltalake::datafusion::error::{DataFusionError, Result as DfResult};
use deltalake::datafusion::execution::disk_manager::DiskManager;
use deltalake::datafusion::execution::spill_file::SpillFile;
use deltalake::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use deltalake::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use deltalake::datafusion::physical_plan::streaming::PartitionStream;
use deltalake::datafusion::prelude::SessionContext;
use futures::{StreamExt as _, TryStreamExt as _};
use tracing::Instrument as _;

use lakefill_table::adjustments::{KIND_COLUMN, is_lineage};
use lakefill_table::error::{QueryContext, Result};
use lakefill_table::rowhash::register_hash_functions;
use lakefill_table::sqltext::ident;

use super::spill::{IpcSpill, holds_dictionaries};
use super::{
    GroupHashes, KeptNet, adjusted_groups, group_hash_sql, grouped_sql, net_sql, register_net_kept,
    sql_name,
};
use crate::multiset::Watch;

/// The net rows registered by [`register_net_streamed`]: once a reading of them has ended, what
/// validation may keep of them, and whether the watcher saw every stored row.
pub struct StreamedNet {
    /// The net rows as [`register_net_spilled`](super::register_net_spilled) computed them, when
    /// they could not be streamed.
    computed: Option<KeptNet>,
    shared: Option<Arc<Shared>>,
}

impl StreamedNet {
    /// The net rows kept for another reading ([`KeptNet::register`]): the groups adjustments
    /// touch, and their grouped rows once a reading has ended.
    pub fn kept(&self) -> KeptNet {
        match (&self.computed, &self.shared) {
            (Some(kept), _) => kept.clone(),
            (None, Some(shared)) => KeptNet {
                hashes: shared.hashes.clone(),
                grouped: shared
                    .grouped
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone(),
            },
            (None, None) => KeptNet::default(),
        }
    }

    /// Whether a reading ended with the watcher having seen every stored row (once).
    pub fn watched_every_row(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|shared| shared.watched.load(Ordering::Acquire))
    }
}

/// The registered net rows hold what they share with their reader (which holds the session):
/// they are taken out of the session with it.
impl Drop for StreamedNet {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            let _ = shared.ctx.deregister_table(shared.name.as_str());
        }
    }
}

/// Registers `name` in `ctx` as the net rows of the view `rows` (as
/// [`register_net`](super::register_net) does), for a reader that reads them once; `raw` sees
/// every row of `rows` as it is stored, in the first reading. When the rows cannot be read so
/// (no lineage columns, dictionaries within nested values), they are netted as
/// [`register_net_spilled`](super::register_net_spilled) does and `raw` sees nothing
/// ([`StreamedNet::watched_every_row`] is false).
#[allow(clippy::too_many_arguments)]
pub async fn register_net_streamed(
    ctx: &SessionContext,
    name: &str,
    rows: &str,
    schema: &Schema,
    measures: &[String],
    key: &[String],
    disk: &Arc<DiskManager>,
    raw: Watch,
) -> Result<StreamedNet> {
    register_hash_functions(ctx);
    let context = || "cannot net the table's rows (reversals against what they reverse)".into();
    let nested_dictionaries = schema.fields().iter().any(|field| {
        !matches!(field.data_type(), DataType::Dictionary(_, _))
            && holds_dictionaries(field.data_type())
    });
    if schema.field_with_name(KIND_COLUMN).is_err() || nested_dictionaries {
        let kept = register_net_kept(ctx, name, rows, schema, measures, key, Some(disk)).await?;
        return Ok(StreamedNet {
            computed: Some(kept),
            shared: None,
        });
    }
    let started = std::time::Instant::now();
    let hashes = adjusted_groups(ctx, rows, schema, measures, key).await?;
    // The rows of the touched groups, as they are stored (dictionaries unpacked).
    let touched_schema = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|field| match field.data_type() {
                DataType::Dictionary(_, values) => Arc::new(
                    field
                        .as_ref()
                        .clone()
                        .with_data_type(values.as_ref().clone()),
                ),
                _ => Arc::clone(field),
            })
            .collect::<Vec<_>>(),
    ));
    // The net rows' columns and types are those of the same rows netted by SQL.
    let adjusted = KeptNet {
        hashes: hashes.clone(),
        grouped: None,
    }
    .adjusted_function(ctx, name);
    let out: SchemaRef = Arc::new(
        ctx.sql(&net_sql(rows, schema, measures, key, adjusted.as_deref()))
            .await
            .query_context(context)?
            .schema()
            .as_arrow()
            .clone(),
    );
    tracing::debug!(
        groups = hashes.as_ref().map_or(0, |h| h.len()),
        found_ms = started.elapsed().as_millis() as u64,
        "found the groups adjustments touch"
    );
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        name: name.to_string(),
        scan: format!(
            "SELECT *, {} AS __lf_g FROM {rows}",
            group_hash_sql(schema, measures, key)
        ),
        schema: schema.clone(),
        measures: measures.to_vec(),
        hashes,
        disk: Arc::clone(disk),
        out: Arc::clone(&out),
        touched_schema,
        raw: Mutex::new(Some(raw)),
        grouped: Mutex::new(None),
        watched: AtomicBool::new(false),
    });
    let table = StreamingTable::try_new(
        out,
        vec![Arc::new(NetScan {
            shared: Arc::clone(&shared),
        })],
    )
    .query_context(context)?;
    ctx.register_table(name, Arc::new(table))
        .query_context(|| format!("cannot register the net rows as `{name}`"))?;
    Ok(StreamedNet {
        computed: None,
        shared: Some(shared),
    })
}

/// What the readings of the net rows share.
struct Shared {
    ctx: SessionContext,
    /// The net rows' name (for the names of what they register).
    name: String,
    /// The scan of every stored row, with its group's hash last.
    scan: String,
    /// The stored rows' columns.
    schema: Schema,
    measures: Vec<String>,
    /// The groups adjustments touch.
    hashes: Option<Arc<GroupHashes>>,
    disk: Arc<DiskManager>,
    /// The net rows' columns.
    out: SchemaRef,
    /// The touched rows' columns, as the grouping reads them.
    touched_schema: SchemaRef,
    /// The watcher, which only the first reading has.
    raw: Mutex<Option<Watch>>,
    /// The grouped rows of the touched groups, once a reading has grouped them.
    grouped: Mutex<Option<Arc<dyn SpillFile>>>,
    /// Whether the watcher saw every stored row.
    watched: AtomicBool,
}

/// The net rows as a partition of a [`StreamingTable`].
struct NetScan {
    shared: Arc<Shared>,
}

/// Never the hashes (as `AdjustedGroup`'s `Debug`).
impl std::fmt::Debug for NetScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetScan")
            .field("name", &self.shared.name)
            .field("groups", &self.shared.hashes.as_ref().map(|h| h.len()))
            .finish_non_exhaustive()
    }
}

impl PartitionStream for NetScan {
    fn schema(&self) -> &SchemaRef {
        &self.shared.out
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let shared = Arc::clone(&self.shared);
        let rows = futures::stream::once(async move { shared.read().await }).try_flatten();
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.shared.out),
            rows,
        ))
    }
}

/// Numbers the touched rows' tables, which every reading registers under its own name.
static READINGS: AtomicU64 = AtomicU64::new(0);

/// How many batches of touched rows wait for the grouping.
const WAITING_BATCHES: usize = 2;

impl Shared {
    /// One reading: the plain rows of one scan as they come, while the touched rows are grouped
    /// beside it (on a task of their own), then the grouped rows.
    async fn read(
        self: Arc<Self>,
    ) -> DfResult<impl futures::Stream<Item = DfResult<RecordBatch>> + Send> {
        let raw = self
            .raw
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let watching = raw.is_some();
        let grouping = match self.hashes {
            Some(_) => Some(Arc::clone(&self).start_grouping().await?),
            None => None,
        };
        let (sender, task) = match grouping {
            Some((sender, task)) => (Some(sender), Some(task)),
            None => (None, None),
        };
        let state = Arc::new(Mutex::new(Reading {
            raw,
            sender,
            task,
            started: std::time::Instant::now(),
            touched_rows: 0,
        }));
        let scan = self.ctx.sql(&self.scan).await?.execute_stream().await?;
        let plain = {
            let (shared, state) = (Arc::clone(&self), Arc::clone(&state));
            scan.then(move |batch| {
                let (shared, state) = (Arc::clone(&shared), Arc::clone(&state));
                async move {
                    let (plain, touched, sender) = {
                        let mut state = state
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        let (plain, touched) = shared.split(&batch?, &mut state)?;
                        (plain, touched, state.sender.clone())
                    };
                    if let Some(touched) = touched {
                        let sender = sender.ok_or_else(|| {
                            DataFusionError::Internal("the touched rows have no grouping".into())
                        })?;
                        if sender.send(touched).await.is_err() {
                            // The grouping stopped: its error is the reading's.
                            let task = state
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .task
                                .take();
                            if let Some(task) = task {
                                task.join().await?;
                            }
                            return Err(DataFusionError::Execution(
                                "the grouping of the rows adjustments touch stopped".into(),
                            ));
                        }
                    }
                    Ok(plain)
                }
            })
            .try_filter(|batch| futures::future::ready(batch.num_rows() > 0))
        };
        let grouped = futures::stream::once(async move {
            let (started, touched_rows, task) = {
                let mut state = state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // The grouping's input ends here.
                state.sender = None;
                (state.started, state.touched_rows, state.task.take())
            };
            // The scan has ended: every stored row was watched.
            if watching {
                self.watched.store(true, Ordering::Release);
            }
            let plain_ms = started.elapsed().as_millis() as u64;
            let grouped = match task {
                Some(task) => Some(task.join().await?),
                None => None,
            };
            tracing::debug!(
                touched_rows,
                plain_ms,
                grouped_ms = started.elapsed().as_millis() as u64 - plain_ms,
                "read the rows adjustments do not touch, grouped the others"
            );
            let rows: Box<dyn futures::Stream<Item = DfResult<RecordBatch>> + Send + Unpin> =
                match grouped {
                    None => Box::new(futures::stream::empty()),
                    Some(Grouped::Held(batches)) => {
                        Box::new(futures::stream::iter(batches.into_iter().map(Ok)))
                    }
                    Some(Grouped::Kept(file)) => {
                        let rows = read_kept(&file)?;
                        *self
                            .grouped
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(file);
                        Box::new(rows)
                    }
                };
            Ok::<_, DataFusionError>(rows)
        })
        .try_flatten();
        Ok(plain.chain(grouped))
    }

    /// The plain rows of `batch` (a scan's, its group's hash last): the rows of no touched group
    /// and not adjustment rows, in the net rows' columns; and the rows of touched groups, in
    /// their own. The watcher sees every row.
    fn split(
        &self,
        batch: &RecordBatch,
        state: &mut Reading,
    ) -> DfResult<(RecordBatch, Option<RecordBatch>)> {
        let stored = batch.num_columns() - 1;
        let hashes = batch.column(stored).as_primitive::<UInt64Type>();
        let rows = batch.project(&(0..stored).collect::<Vec<_>>())?;
        if let Some(raw) = &mut state.raw {
            raw(&rows, &[])?;
        }
        let kind = rows.column_by_name(KIND_COLUMN).ok_or_else(|| {
            DataFusionError::Internal(format!("the stored rows have no `{KIND_COLUMN}`"))
        })?;
        let (plain, touched) = match &self.hashes {
            Some(groups) => {
                let touched: BooleanArray = hashes
                    .iter()
                    .map(|hash| Some(hash.is_some_and(|h| groups.contains(&h))))
                    .collect();
                let kept = if touched.true_count() > 0 {
                    let kept = filter_record_batch(&rows, &touched)?;
                    state.touched_rows += kept.num_rows() as u64;
                    Some(conform(&kept, &self.touched_schema, false)?)
                } else {
                    None
                };
                (and(&not(&touched)?, &is_null(kind)?)?, kept)
            }
            None => (is_null(kind)?, None),
        };
        Ok((
            conform(&filter_record_batch(&rows, &plain)?, &self.out, true)?,
            touched,
        ))
    }

    /// Starts grouping the touched rows sent to the returned sender, on a task of its own; the
    /// grouped rows are kept in a spill file (for [`KeptNet::register`]), or held when they
    /// cannot be.
    async fn start_grouping(
        self: Arc<Self>,
    ) -> DfResult<(tokio::sync::mpsc::Sender<RecordBatch>, Task<Grouped>)> {
        let (sender, receiver) = tokio::sync::mpsc::channel(WAITING_BATCHES);
        let table = format!(
            "__lf_touched_of_{}_{}",
            sql_name(&self.name),
            READINGS.fetch_add(1, Ordering::Relaxed)
        );
        let touched = StreamingTable::try_new(
            Arc::clone(&self.touched_schema),
            vec![Arc::new(Received {
                schema: Arc::clone(&self.touched_schema),
                receiver: Mutex::new(Some(receiver)),
            })],
        )?;
        self.ctx.register_table(table.as_str(), Arc::new(touched))?;
        let grouped = self
            .ctx
            .sql(&grouped_sql(
                &ident(&table),
                &self.schema,
                &self.measures,
                None,
            ))
            .await;
        let _ = self.ctx.deregister_table(table.as_str());
        let grouped = grouped?;
        let task = tokio::spawn(
            async move {
                let mut rows = grouped.execute_stream().await?;
                let mut keep = IpcSpill::create(&self.disk, &self.out, "grouped net rows")?;
                let mut held = Vec::new();
                while let Some(batch) = rows.next().await {
                    let batch = conform(&batch?, &self.out, true)?;
                    match &mut keep {
                        Some(keep) => keep.write(&batch)?,
                        None => held.push(batch),
                    }
                }
                Ok(match keep {
                    Some(keep) => Grouped::Kept(keep.finish()?),
                    None => Grouped::Held(held),
                })
            }
            .in_current_span(),
        );
        Ok((sender, Task(task)))
    }
}

/// The grouped rows of the touched groups.
enum Grouped {
    /// In a spill file.
    Kept(Arc<dyn SpillFile>),
    /// In memory (they hold dictionaries, which the spill file cannot).
    Held(Vec<RecordBatch>),
}

/// The batches of a kept spill file, read one at a time.
fn read_kept(
    file: &Arc<dyn SpillFile>,
) -> DfResult<impl futures::Stream<Item = DfResult<RecordBatch>> + Send + Unpin + use<>> {
    let path = file
        .path()
        .ok_or_else(|| DataFusionError::Internal("the grouped rows' file has no path".into()))?;
    let reader = deltalake::arrow::ipc::reader::FileReader::try_new(
        std::io::BufReader::new(std::fs::File::open(path)?),
        None,
    )?;
    Ok(futures::stream::iter(
        reader.map(|batch| batch.map_err(DataFusionError::from)),
    ))
}

/// A spawned task, aborted when dropped (a reading that stops stops its grouping).
struct Task<T>(tokio::task::JoinHandle<DfResult<T>>);

impl<T> Task<T> {
    async fn join(mut self) -> DfResult<T> {
        (&mut self.0).await.map_err(|e| {
            DataFusionError::Execution(format!(
                "the grouping of the rows adjustments touch did not finish: {e}"
            ))
        })?
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The touched rows as they are sent, as a partition of a [`StreamingTable`] (read once).
struct Received {
    schema: SchemaRef,
    receiver: Mutex<Option<tokio::sync::mpsc::Receiver<RecordBatch>>>,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received").finish_non_exhaustive()
    }
}

impl PartitionStream for Received {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let receiver = self
            .receiver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let rows = futures::stream::unfold(receiver, |receiver| async move {
            match receiver {
                Some(mut receiver) => {
                    let batch = receiver.recv().await?;
                    Some((Ok(batch), Some(receiver)))
                }
                None => Some((
                    Err(DataFusionError::Internal(
                        "the touched rows are read once".into(),
                    )),
                    None,
                )),
            }
        });
        let rows = rows.scan(false, |failed, row| {
            // (After the error, nothing more.)
            let next = (!*failed).then_some(row);
            *failed |= next.as_ref().is_some_and(Result::is_err);
            futures::future::ready(next)
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            rows,
        ))
    }
}

/// A reading's state while its scan streams.
struct Reading {
    raw: Option<Watch>,
    /// Where the touched rows go, until the scan ends.
    sender: Option<tokio::sync::mpsc::Sender<RecordBatch>>,
    /// The grouping they go to.
    task: Option<Task<Grouped>>,
    started: std::time::Instant,
    touched_rows: u64,
}

/// `batch` in the columns and types of `schema` (a column it lacks NULL); with `null_lineage`
/// the lineage columns NULL whatever they hold.
fn conform(batch: &RecordBatch, schema: &SchemaRef, null_lineage: bool) -> DfResult<RecordBatch> {
    let rows = batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|field: &Arc<Field>| {
            let column: ArrayRef = match batch.column_by_name(field.name()) {
                Some(column) if !(null_lineage && is_lineage(field.name())) => Arc::clone(column),
                _ => new_null_array(field.data_type(), rows),
            };
            Ok(if column.data_type() == field.data_type() {
                column
            } else {
                cast(&column, field.data_type())?
            })
        })
        .collect::<DfResult<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}
