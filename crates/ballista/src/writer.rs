//! The node that stages a batch's rows on the executors, and the codec that ships it.
//!
//! [`StageWriterExec`] sits on a hash repartition by the target's partition columns, so each of
//! its partitions (one task) writes whole target partitions: exactly what a local batch writes
//! for them ([`WriteSpec::write`]), into the run's staging directories. It commits nothing; each
//! task returns one row: its partition, a random attempt id, and what it staged as JSON (the
//! `add` actions, rows, sums and checksums per partition).
//!
//! [`LakefillCodec`] encodes the node as a tagged JSON message (the [`WriteSpec`] and the
//! table's URL: no credentials; executors use their own) and hands every other node to
//! Ballista's codec.

use lakefill_table::failpoint::{self, CrashPoint};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use deltalake::arrow::array::{RecordBatch, StringArray, UInt32Array};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::common::{
    DataFusionError, Result as DfResult, tree_node::TreeNodeRecursion,
};
use deltalake::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use deltalake::datafusion::logical_expr::{AggregateUDF, ScalarUDF, WindowUDF};
use deltalake::datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use deltalake::datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use deltalake::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use deltalake::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::logstore::object_store::prefix::PrefixStore;
use serde::{Deserialize, Serialize};

use lakefill_recompute::stage::WriteSpec;

/// The first bytes of an encoded [`StageWriterExec`].
const TAG: &[u8] = b"lakefill.stage-writer/1\n";

/// What travels to the executors: no secrets.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WriterMessage {
    spec: WriteSpec,
    /// The target's root, e.g. `s3://bucket/events` or `file:///lake/events`.
    table_url: String,
    /// The generation of the run's lease the client held when it submitted the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease: Option<u64>,
}

impl WriterMessage {
    /// Fails once the client no longer holds the lease it submitted the job under (see
    /// [`lakefill_log::journal::lease::still_held`]), after deleting `files` (paths from the table's
    /// root) this task wrote.
    async fn check_lease(
        &self,
        store: &Arc<dyn deltalake::ObjectStore>,
        files: &[String],
    ) -> lakefill_table::error::Result<()> {
        let Some(generation) = self.lease else {
            return Ok(());
        };
        let run_id = &self.spec.run_id;
        if lakefill_log::journal::lease::still_held(store, run_id, generation).await {
            return Ok(());
        }
        for file in files {
            let path = lakefill_table::storage::object_path(file);
            if let Err(error) = store.delete(&path).await {
                tracing::warn!(%run_id, %path, %error, "cannot delete a file of a stopped job; `lakefill gc` will");
            }
        }
        Err(lakefill_table::error::Error::Internal(format!(
            "run `{run_id}` is no longer held by the client that submitted this job (stopped, or taken over); this writer task stops{}",
            if files.is_empty() {
                String::new()
            } else {
                format!(" and deleted the {} files it staged", files.len())
            }
        )))
    }
}

/// Stages its input's rows into the run's staging directories; one row per partition.
#[derive(Debug)]
pub(crate) struct StageWriterExec {
    input: Arc<dyn ExecutionPlan>,
    message: WriterMessage,
    properties: Arc<PlanProperties>,
}

/// The columns of the writer's rows.
pub(crate) fn output_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("partition", DataType::UInt32, false),
        Field::new("attempt", DataType::Utf8, false),
        Field::new("writer", DataType::Utf8, false),
        Field::new("written", DataType::Utf8, false),
    ]))
}

impl StageWriterExec {
    pub(crate) fn new(
        input: Arc<dyn ExecutionPlan>,
        spec: WriteSpec,
        table_url: String,
        lease: Option<u64>,
    ) -> Self {
        Self::of_message(
            input,
            WriterMessage {
                spec,
                table_url,
                lease,
            },
        )
    }

    fn of_message(input: Arc<dyn ExecutionPlan>, message: WriterMessage) -> Self {
        let partitions = input.properties().output_partitioning().partition_count();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(output_schema()),
            deltalake::datafusion::physical_plan::Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            input,
            message,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for StageWriterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "LakefillStageWriter: run={}, batch={}",
            self.message.spec.run_id, self.message.spec.batch.index
        )
    }
}

impl ExecutionPlan for StageWriterExec {
    fn name(&self) -> &str {
        "LakefillStageWriter"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|_| {
            DataFusionError::Internal("the stage writer has exactly one input".into())
        })?;
        Ok(Arc::new(Self::of_message(input, self.message.clone())))
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let target_schema = self.input.schema();
        let message = self.message.clone();
        let schema = output_schema();
        let out = Arc::clone(&schema);
        let work = async move {
            let external = |e: lakefill_table::error::Error| DataFusionError::External(Box::new(e));
            failpoint::reach(CrashPoint::StageWriterStart)
                .await
                .map_err(external)?;
            let store = table_store(&context, &message.table_url).map_err(external)?;
            message.check_lease(&store, &[]).await.map_err(external)?;
            let written = message
                .spec
                .write(
                    input,
                    target_schema,
                    Arc::clone(&store),
                    &Default::default(),
                )
                .await
                .map_err(external)?;
            // A job the client stopped waiting for (Ctrl-C, a failure, a takeover) may still run
            // here (cancelling aborts the task, not always every partition of it): its files go.
            let files: Vec<String> = written
                .record
                .iter()
                .flat_map(|r| r.files.iter().map(|a| a.path.clone()))
                .collect();
            message
                .check_lease(&store, &files)
                .await
                .map_err(external)?;
            // A task that dies here has written files nobody hears of: the client deletes them.
            for label in written.record.iter().flat_map(|r| r.rows.keys()) {
                let point = CrashPoint::StageWriter(label);
                if failpoint::armed_once(point) {
                    // As a lost connection to the store would: Ballista runs the task again.
                    return Err(DataFusionError::IoError(std::io::Error::other(format!(
                        "injected failure at `{point}`, once"
                    ))));
                }
                failpoint::reach(point).await.map_err(external)?;
            }
            let json = serde_json::to_string(&written)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            let attempt = uuid::Uuid::new_v4().to_string();
            RecordBatch::try_new(
                out,
                vec![
                    Arc::new(UInt32Array::from(vec![partition as u32])),
                    Arc::new(StringArray::from(vec![attempt])),
                    Arc::new(StringArray::from(vec![writer_name()])),
                    Arc::new(StringArray::from(vec![json])),
                ],
            )
            .map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(work),
        )))
    }
}

/// This process, as the journal names a writer: `pid N@HOST`.
fn writer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    format!("pid {}@{host}", std::process::id())
}

/// The executor's own store for the table at `table_url`, rooted at the table.
fn table_store(
    context: &TaskContext,
    table_url: &str,
) -> lakefill_table::error::Result<Arc<dyn deltalake::ObjectStore>> {
    let url = url::Url::parse(table_url).map_err(|e| {
        lakefill_table::error::Error::Internal(format!("bad table URL `{table_url}`: {e}"))
    })?;
    let (store_url, root) = super::store_location(&url)?;
    let store = context.runtime_env().object_store(&store_url).map_err(|e| {
        lakefill_table::error::Error::Internal(format!(
            "this executor has no object store for `{store_url}` (it uses its own credentials): {e}"
        ))
    })?;
    Ok(Arc::new(PrefixStore::new(store, root)))
}

/// Ships [`StageWriterExec`]; every other node goes to Ballista's codec.
#[derive(Debug, Default)]
pub(crate) struct LakefillCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for LakefillCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let Some(message) = buf.strip_prefix(TAG) else {
            return self.inner.try_decode(buf, inputs, ctx, proto_converter);
        };
        let message: WriterMessage = serde_json::from_slice(message).map_err(|e| {
            DataFusionError::Internal(format!("cannot decode the stage writer: {e}"))
        })?;
        let [input] = inputs else {
            return Err(DataFusionError::Internal(
                "the stage writer has exactly one input".into(),
            ));
        };
        Ok(Arc::new(StageWriterExec::of_message(
            Arc::clone(input),
            message,
        )))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let Some(writer) = (node.as_ref() as &dyn Any).downcast_ref::<StageWriterExec>() else {
            return self.inner.try_encode(node, buf, proto_converter);
        };
        buf.extend_from_slice(TAG);
        serde_json::to_writer(buf, &writer.message)
            .map_err(|e| DataFusionError::Internal(format!("cannot encode the stage writer: {e}")))
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> DfResult<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> DfResult<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}
