//! Submitting a physical plan to a Ballista scheduler as one job, and cancelling that job when
//! the client stops waiting for it.
//!
//! Ballista's own `execute_physical_plan` keeps the job's id to itself, so a client that is
//! interrupted (Ctrl-C) or fails cannot cancel the job, whose writer tasks would go on staging
//! files for a run that has stopped. This is the same protocol (submit, poll the status, fetch
//! the result partitions from the executors), holding the job in a [`Job`] that cancels it when
//! dropped before the job ended.

use std::sync::Arc;
use std::time::Duration;

use ballista_core::client::BallistaClient;
use ballista_core::config::BallistaConfig;
use ballista_core::serde::protobuf::execute_query_params::Query;
use ballista_core::serde::protobuf::execute_query_result::Result as Submitted;
use ballista_core::serde::protobuf::get_job_status_result::FlightProxy;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{
    CancelJobParams, ExecuteQueryParams, GetJobStatusParams, KeyValuePair, PartitionLocation,
    SuccessfulJob, job_status,
};
use ballista_core::utils::{GrpcClientConfig, create_grpc_client_endpoint};
use datafusion_proto::physical_plan::{AsExecutionPlan as _, PhysicalExtensionCodec};
use datafusion_proto::protobuf::PhysicalPlanNode;
use deltalake::arrow::array::RecordBatch;
use deltalake::datafusion::physical_plan::ExecutionPlan;
use deltalake::datafusion::prelude::SessionConfig;
use futures::TryStreamExt as _;
use tonic::transport::Channel;

use lakefill_table::error::{Error, Result};
use lakefill_table::failpoint::{self, CrashPoint};

/// How often the job's status is asked for.
const POLL: Duration = Duration::from_millis(50);
/// How long a cancel may hold up the client that stops.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// How long a submitted job may be unknown to the scheduler before it first has a status: until
/// the scheduler's event loop queues it (a moment, unless the scheduler is swamped).
const QUEUED_WITHIN: Duration = Duration::from_secs(60);
/// How long a job that had a status may be unknown before the client gives up on it: a scheduler
/// restarted since keeps its jobs in memory and has forgotten it.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(5);
/// How long the scheduler may not answer at all (a dropped connection, a restart) before the
/// client gives up on the job; meanwhile it keeps asking, and the channel reconnects.
const UNREACHABLE_FOR: Duration = Duration::from_secs(30);

/// Runs `plan` on the cluster whose scheduler is at `scheduler` (`http://HOST:PORT`) as one job
/// with the settings of `config`; returns its output. If this future is dropped before the job
/// ended (the run was interrupted, or another batch failed), the job is cancelled: its tasks
/// stop, and no task starts any more.
pub(crate) async fn run_job(
    scheduler: &str,
    plan: Arc<dyn ExecutionPlan>,
    codec: &dyn PhysicalExtensionCodec,
    config: &SessionConfig,
) -> Result<Vec<RecordBatch>> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::Internal(format!("{what} (scheduler {scheduler}): {e}"))
    };
    // What the cluster did, not a bug of ours: the hint says to check it and run again.
    let cluster = |message: String| Error::Cluster {
        scheduler: scheduler.to_string(),
        message,
    };
    let message = PhysicalPlanNode::try_from_physical_plan(plan, codec)
        .map_err(|e| failed("cannot serialize the plan for the cluster", &e))?;
    let mut encoded = Vec::new();
    message
        .try_encode(&mut encoded)
        .map_err(|e| failed("cannot encode the plan for the cluster", &e))?;
    let settings = config
        .options()
        .entries()
        .into_iter()
        .map(|entry| KeyValuePair {
            key: entry.key,
            value: entry.value,
        })
        .collect();
    let ballista = BallistaConfig::default();
    let grpc = GrpcClientConfig::from(&ballista);
    let channel = create_grpc_client_endpoint(scheduler.to_string(), Some(&grpc))
        .map_err(|e| failed("bad scheduler address", &e))?
        .connect()
        .await
        .map_err(|e| cluster(format!("cannot reach the cluster's scheduler: {e}")))?;
    let max_message = ballista.grpc_client_max_message_size();
    let mut client = SchedulerGrpcClient::new(channel)
        .max_encoding_message_size(max_message)
        .max_decoding_message_size(max_message);
    let mut request = tonic::Request::new(ExecuteQueryParams {
        query: Some(Query::PhysicalPlan(encoded)),
        settings,
        session_id: uuid::Uuid::new_v4().to_string(),
        operation_id: uuid::Uuid::now_v7().to_string(),
    });
    ballista_core::version::insert_version_header(request.metadata_mut());
    let submitted = client
        .execute_query(request)
        .await
        .map_err(|e| cluster(format!("the scheduler refused the job: {e}")))?
        .into_inner()
        .result;
    let job_id = match submitted {
        Some(Submitted::Success(success)) => success.job_id,
        Some(Submitted::Failure(failure)) => {
            return Err(failed(
                "the scheduler refused the job",
                &format!("{failure:?}"),
            ));
        }
        None => return Err(failed("the scheduler refused the job", &"no answer")),
    };
    let mut job = Job {
        client: client.clone(),
        id: job_id,
        ended: false,
    };
    // Since when the scheduler has not known the job, and whether it ever did.
    let (mut unknown_since, mut seen) = (std::time::Instant::now(), false);
    // Since when the scheduler has not answered at all, if it does not now.
    let mut unreachable_since: Option<std::time::Instant> = None;
    let (locations, proxy) = loop {
        let status = match client
            .get_job_status(GetJobStatusParams {
                job_id: job.id.clone(),
            })
            .await
        {
            Ok(status) => {
                unreachable_since = None;
                status.into_inner()
            }
            Err(e) if is_transient(&e) => {
                let since = *unreachable_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= UNREACHABLE_FOR {
                    return Err(cluster(format!(
                        "lost the cluster's scheduler: no answer about job {} for {} s ({}); \
                         rerun the same command to resume the run: files the lost job's tasks \
                         stage are not used",
                        job.id,
                        UNREACHABLE_FOR.as_secs(),
                        e.message()
                    )));
                }
                tokio::time::sleep(POLL * 4).await;
                continue;
            }
            Err(e) => {
                return Err(cluster(format!(
                    "the cluster's scheduler refused to report on job {}: {e}",
                    job.id
                )));
            }
        };
        match status.status.and_then(|s| s.status) {
            Some(job_status::Status::Successful(SuccessfulJob {
                partition_location, ..
            })) => break (partition_location, status.flight_proxy),
            Some(job_status::Status::Failed(failure)) => {
                job.ended = true;
                return Err(failed(&format!("job {} failed", job.id), &failure.error));
            }
            Some(_) => {
                (unknown_since, seen) = (std::time::Instant::now(), true);
                failpoint::reach(CrashPoint::ClusterJobStatus).await?;
            }
            None if seen && unknown_since.elapsed() >= FORGOTTEN_AFTER => {
                return Err(cluster(format!(
                    "the cluster's scheduler no longer knows job {} (was it restarted?): no \
                     status for {} s; rerun the same command to resume the run: files the lost \
                     job's tasks stage are not used",
                    job.id,
                    FORGOTTEN_AFTER.as_secs()
                )));
            }
            None if unknown_since.elapsed() >= QUEUED_WITHIN => {
                return Err(cluster(format!(
                    "the cluster's scheduler accepted job {} but never queued it: no status for \
                     {} s; rerun the same command to resume the run",
                    job.id,
                    QUEUED_WITHIN.as_secs()
                )));
            }
            None => {}
        }
        tokio::time::sleep(POLL).await;
    };
    job.ended = true;
    let mut batches = Vec::new();
    for location in locations {
        batches.extend(fetch(scheduler, location, proxy.as_ref(), &ballista, &grpc).await?);
    }
    Ok(batches)
}

/// Whether a failed status request may succeed when asked again: the connection dropped or was
/// refused (the scheduler restarting), as opposed to a scheduler that answered with an error.
fn is_transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Aborted
    )
}

/// The rows of one result partition of a finished job.
async fn fetch(
    scheduler: &str,
    location: PartitionLocation,
    proxy: Option<&FlightProxy>,
    ballista: &BallistaConfig,
    grpc: &GrpcClientConfig,
) -> Result<Vec<RecordBatch>> {
    let failed = |e: &dyn std::fmt::Display| {
        Error::Internal(format!("cannot fetch a result of the cluster's job: {e}"))
    };
    let layout = location.layout();
    let (Some(executor), Some(partition)) = (location.executor_meta, location.partition_id) else {
        return Err(failed(&"the scheduler named no executor or partition"));
    };
    let host_port = |address: &str| {
        let url = url::Url::parse(address).map_err(|e| failed(&e))?;
        Ok::<_, Error>((
            url.host_str().unwrap_or_default().to_string(),
            url.port().unwrap_or(50050),
        ))
    };
    // Where the result is served from: the executor, or a proxy the scheduler names.
    let (host, port) = match proxy {
        Some(FlightProxy::External(address)) => host_port(&format!("http://{address}"))?,
        Some(FlightProxy::Local(true)) => host_port(scheduler)?,
        _ => (
            executor.host.clone(),
            u16::try_from(executor.port).map_err(|e| failed(&e))?,
        ),
    };
    let mut client = BallistaClient::try_new(
        &host,
        port,
        ballista.grpc_client_max_message_size(),
        false,
        None,
        grpc.io_retries_times,
        grpc.io_retry_wait_time_ms,
        0,
        0,
    )
    .await
    .map_err(|e| failed(&e))?;
    let stream = client
        .fetch_partition_proxied(
            &executor.id,
            &partition.into(),
            location.file_id,
            layout,
            &executor.host,
            u16::try_from(executor.port).map_err(|e| failed(&e))?,
            true,
        )
        .await
        .map_err(|e| failed(&e))?;
    stream.try_collect().await.map_err(|e| failed(&e))
}

/// A submitted job; cancelled if dropped before it ended.
struct Job {
    client: SchedulerGrpcClient<Channel>,
    id: String,
    ended: bool,
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut client = self.client.clone();
        let job_id = self.id.clone();
        let cancel = async move {
            let asked = client.cancel_job(CancelJobParams {
                job_id: job_id.clone(),
            });
            match tokio::time::timeout(CANCEL_WAIT, asked).await {
                Ok(Ok(_)) => tracing::info!(job = %job_id, "cancelled the cluster's job"),
                Ok(Err(e)) => {
                    tracing::warn!(job = %job_id, error = %e, "could not cancel the cluster's job");
                }
                Err(_) => {
                    tracing::warn!(job = %job_id, "no answer to cancelling the cluster's job")
                }
            }
        };
        // Wait for the answer where the runtime allows it, so that a client about to exit has
        // cancelled the job first; elsewhere, send it on its way.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            // Only the cancel future moves in; `block_in_place` refuses (panics) before running
            // anything where blocking is not allowed (a `LocalSet`), and then it is spawned.
            let cancel = std::sync::Mutex::new(Some(cancel));
            let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tokio::task::block_in_place(|| {
                    if let Some(cancel) = cancel.lock().ok().and_then(|mut c| c.take()) {
                        runtime.block_on(cancel);
                    }
                });
            }));
            if waited.is_ok() {
                return;
            }
            if let Some(cancel) = cancel.lock().ok().and_then(|mut c| c.take()) {
                runtime.spawn(cancel);
            }
        } else {
            runtime.spawn(cancel);
        }
    }
}
