//! A Ballista scheduler and executors for `lakefill cluster up`, with lakefill's codec
//! registered, built from the Ballista crates' own standalone entry points (the scheduler's
//! bound to the address asked for instead of a random port).

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_core::extension::SessionConfigExt as _;
use ballista_core::serde::BallistaCodec;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_core::utils::{GrpcServerConfig, create_grpc_server, default_session_builder};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::metrics::default_metrics_collector;
use ballista_scheduler::scheduler_server::SchedulerServer;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use deltalake::datafusion::execution::SessionStateBuilder;
use deltalake::datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
use deltalake::datafusion::execution::object_store::{
    DefaultObjectStoreRegistry, ObjectStoreRegistry,
};
use deltalake::datafusion::execution::runtime_env::RuntimeEnvBuilder;
use deltalake::datafusion::prelude::SessionConfig;

use super::writer::LakefillCodec;
use crate::error::{Error, Result};

fn codec() -> BallistaCodec<LogicalPlanNode, PhysicalPlanNode> {
    BallistaCodec::new(
        Arc::new(ballista_core::serde::BallistaLogicalExtensionCodec::default()),
        Arc::new(LakefillCodec::default()),
    )
}

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::InvalidOption {
        option: "cluster".into(),
        value: what.into(),
        message: format!("cannot start the {what}: {e}"),
    }
}

fn config_producer() -> ballista_core::ConfigProducer {
    Arc::new(|| {
        SessionConfig::new_with_ballista()
            .with_ballista_physical_extension_codec(Arc::new(LakefillCodec::default()))
    })
}

/// See [`crate::cluster::start_scheduler`].
pub(crate) async fn start_scheduler(bind: SocketAddr) -> Result<SocketAddr> {
    let config_producer = config_producer();
    // The scheduler decodes the plans it is sent: a scan of an S3 table needs that bucket's store.
    let stores = Arc::new(ExecutorStores::default());
    let session_builder: ballista_scheduler::scheduler_server::SessionBuilder =
        Arc::new(move |config: SessionConfig| {
            let state = default_session_builder(config)?;
            let runtime = RuntimeEnvBuilder::new()
                .with_object_store_registry(Arc::clone(&stores) as Arc<dyn ObjectStoreRegistry>)
                .build()?;
            Ok(SessionStateBuilder::new_from_existing(state)
                .with_runtime_env(Arc::new(runtime))
                .build())
        });
    let cluster = BallistaCluster::new_memory(
        bind.to_string(),
        session_builder,
        Arc::clone(&config_producer),
    );
    let metrics = default_metrics_collector().map_err(|e| failed("scheduler", e))?;
    let mut server: SchedulerServer<LogicalPlanNode, PhysicalPlanNode> = SchedulerServer::new(
        bind.to_string(),
        cluster,
        codec(),
        Arc::new(
            SchedulerConfig::default()
                .with_scheduler_policy(ballista_core::config::TaskSchedulingPolicy::PullStaged),
        ),
        metrics,
    );
    server.init().await.map_err(|e| failed("scheduler", e))?;
    let size = config_producer().ballista_grpc_client_max_message_size();
    let service = SchedulerGrpcServer::new(server)
        .max_decoding_message_size(size)
        .max_encoding_message_size(size);
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| failed("scheduler", format!("cannot listen on {bind}: {e}")))?;
    let address = listener.local_addr().map_err(|e| failed("scheduler", e))?;
    tokio::spawn(
        create_grpc_server(&GrpcServerConfig::default())
            .add_service(service)
            .serve_with_incoming(unify_tokio_stream::wrappers::TcpListenerStream::new(
                listener,
            )),
    );
    Ok(address)
}

/// See [`crate::cluster::start_executor`].
pub(crate) async fn start_executor(
    scheduler: &str,
    vcores: usize,
    memory_limit: Option<u64>,
) -> Result<()> {
    let client = connect(scheduler).await?;
    let stores = Arc::new(ExecutorStores::default());
    // One pool for every task of the executor (the producer runs per task): its queries spill
    // to disk beyond it, as a local run's do.
    let pool: Option<Arc<dyn MemoryPool>> = memory_limit.map(|limit| {
        Arc::new(FairSpillPool::new(
            usize::try_from(limit).unwrap_or(usize::MAX),
        )) as Arc<dyn MemoryPool>
    });
    let runtime: ballista_core::RuntimeProducer = Arc::new(move |_: &SessionConfig| {
        let mut builder = RuntimeEnvBuilder::new()
            .with_object_store_registry(Arc::clone(&stores) as Arc<dyn ObjectStoreRegistry>);
        if let Some(pool) = &pool {
            builder = builder.with_memory_pool(Arc::clone(pool));
        }
        Ok(Arc::new(builder.build()?))
    });
    ballista_executor::new_standalone_executor_from_builder(
        client,
        vcores.max(1),
        config_producer(),
        runtime,
        codec(),
        Default::default(),
    )
    .await
    .map_err(|e| failed("executor", e))
}

/// The object stores of a scheduler or executor: the local file system, and an S3 bucket's store built the first
/// time a task asks for it, from this process's own `AWS_*` environment (never from the plan,
/// which carries no credentials).
#[derive(Debug, Default)]
struct ExecutorStores {
    known: DefaultObjectStoreRegistry,
}

impl ObjectStoreRegistry for ExecutorStores {
    fn register_store(
        &self,
        url: &url::Url,
        store: Arc<dyn deltalake::ObjectStore>,
    ) -> Option<Arc<dyn deltalake::ObjectStore>> {
        self.known.register_store(url, store)
    }

    fn deregister_store(
        &self,
        url: &url::Url,
    ) -> deltalake::datafusion::common::Result<Arc<dyn deltalake::ObjectStore>> {
        self.known.deregister_store(url)
    }

    fn get_store(
        &self,
        url: &url::Url,
    ) -> deltalake::datafusion::common::Result<Arc<dyn deltalake::ObjectStore>> {
        if let Ok(store) = self.known.get_store(url) {
            return Ok(store);
        }
        if !matches!(url.scheme(), "s3" | "s3a") {
            return self.known.get_store(url);
        }
        let options: std::collections::HashMap<String, String> = std::env::vars()
            .filter(|(key, _)| key.starts_with("AWS_"))
            .collect();
        let store = deltalake::DeltaTableBuilder::from_url(url.clone())
            .and_then(|b| b.with_storage_options(options).build_storage())
            .map_err(|e| {
                deltalake::datafusion::error::DataFusionError::External(
                    format!("this executor cannot open `{url}`: {e}").into(),
                )
            })?
            .root_object_store(None);
        self.known.register_store(url, Arc::clone(&store));
        Ok(store)
    }
}

async fn connect(url: &str) -> Result<SchedulerGrpcClient<tonic::transport::Channel>> {
    let mut last = None;
    for _ in 0..100 {
        match SchedulerGrpcClient::connect(url.to_string()).await {
            Ok(client) => return Ok(client),
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(failed(
        "executor",
        format!(
            "the scheduler at {url} does not answer: {}",
            last.unwrap_or_default()
        ),
    ))
}
