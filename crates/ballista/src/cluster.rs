//! A Ballista scheduler and executors for `lakefill cluster up`, with lakefill's codec
//! registered: the scheduler built from the crate's server (bound to the address asked for), each
//! executor from the executor crate's process entry point. The scheduler pushes tasks to the
//! executors, so it can also cancel them.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_core::extension::SessionConfigExt as _;
use ballista_core::serde::BallistaCodec;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_core::utils::{GrpcServerConfig, create_grpc_server, default_session_builder};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::metrics::default_metrics_collector;
use ballista_scheduler::scheduler_server::SchedulerServer;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use deltalake::datafusion::execution::SessionStateBuilder;
use deltalake::datafusion::execution::object_store::{
    DefaultObjectStoreRegistry, ObjectStoreRegistry,
};
use deltalake::datafusion::execution::runtime_env::RuntimeEnvBuilder;
use deltalake::datafusion::prelude::SessionConfig;

use super::writer::LakefillCodec;
use lakefill_table::error::{Error, Result};

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

/// A running scheduler: where it listens, and what it knows of its executors.
pub struct Scheduler {
    /// Where it listens.
    pub address: SocketAddr,
    state: Arc<ballista_scheduler::state::SchedulerState<LogicalPlanNode, PhysicalPlanNode>>,
}

impl Scheduler {
    /// How many executors have registered with it.
    pub async fn registered_executors(&self) -> usize {
        self.state
            .executor_manager
            .get_executors_state()
            .await
            .map_or(0, |executors| executors.len())
    }
}

/// See `lakefill::start_scheduler`.
pub async fn start_scheduler(bind: SocketAddr) -> Result<Scheduler> {
    // Bound first: the scheduler names itself by this address to the executors, which send
    // their task updates there (with port 0, the port the system picked).
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| failed("scheduler", format!("cannot listen on {bind}: {e}")))?;
    let address = listener.local_addr().map_err(|e| failed("scheduler", e))?;
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
        address.to_string(),
        session_builder,
        Arc::clone(&config_producer),
    );
    let metrics = default_metrics_collector().map_err(|e| failed("scheduler", e))?;
    let mut server: SchedulerServer<LogicalPlanNode, PhysicalPlanNode> = SchedulerServer::new(
        address.to_string(),
        cluster,
        codec(),
        Arc::new(
            // Round robin: a job's tasks (a run's batches) go one per executor in turn, where
            // Ballista's default fills the first executor's slots before the next gets any.
            SchedulerConfig::default()
                .with_scheduler_policy(ballista_core::config::TaskSchedulingPolicy::PushStaged)
                .with_task_distribution(
                    ballista_scheduler::config::TaskDistributionPolicy::RoundRobin,
                ),
        ),
        metrics,
    );
    server.init().await.map_err(|e| failed("scheduler", e))?;
    let state = Arc::clone(&server.state);
    let size = config_producer().ballista_grpc_client_max_message_size();
    let service = SchedulerGrpcServer::new(server)
        .max_decoding_message_size(size)
        .max_encoding_message_size(size);
    tokio::spawn(
        create_grpc_server(&GrpcServerConfig::default())
            .add_service(service)
            .serve_with_incoming(unify_tokio_stream::wrappers::TcpListenerStream::new(
                listener,
            )),
    );
    Ok(Scheduler { address, state })
}

/// See `lakefill::run_executor`.
pub async fn run_executor(
    scheduler: &str,
    bind: std::net::IpAddr,
    vcores: usize,
    memory_limit: Option<u64>,
) -> Result<()> {
    let url = url::Url::parse(scheduler).map_err(|e| {
        failed(
            "executor",
            format!("bad scheduler address `{scheduler}`: {e}"),
        )
    })?;
    let (Some(scheduler_host), Some(scheduler_port)) = (url.host_str(), url.port()) else {
        return Err(failed(
            "executor",
            format!("expected the scheduler as `http://HOST:PORT`, not `{scheduler}`"),
        ));
    };
    // The executor's two services (results and shuffles over Arrow Flight; the task service
    // the scheduler launches and cancels tasks through) on ports free now.
    let free_port = || {
        std::net::TcpListener::bind((bind, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| failed("executor", format!("no free port on {bind}: {e}")))
    };
    let (port, grpc_port) = loop {
        let (a, b) = (free_port()?, free_port()?);
        if a != b {
            break (a, b);
        }
    };
    let external = if bind.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        bind.to_string()
    };
    let stores = Arc::new(ExecutorStores::default());
    // Ballista gives each task a memory pool of its share of the executor's (`memory_limit`
    // split over the task slots); queries spill to disk beyond it, as a local run's do.
    let runtime: ballista_core::RuntimeProducer = Arc::new(move |_: &SessionConfig| {
        Ok(Arc::new(
            RuntimeEnvBuilder::new()
                .with_object_store_registry(Arc::clone(&stores) as Arc<dyn ObjectStoreRegistry>)
                .with_disk_manager_builder(lakefill_table::spill::disk_manager())
                .build()?,
        ))
    });
    let config = ballista_executor::executor_process::ExecutorProcessConfig {
        bind_host: bind.to_string(),
        external_host: Some(external),
        port,
        grpc_port,
        scheduler_host: scheduler_host.to_string(),
        scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        vcores: vcores.max(1),
        // The scheduler launches tasks, and cancels them when a client stops waiting.
        task_scheduling_policy: ballista_core::config::TaskSchedulingPolicy::PushStaged,
        memory_pool_size: Some(memory_limit.unwrap_or(0)),
        override_runtime_producer: Some(runtime),
        override_config_producer: Some(config_producer()),
        override_logical_codec: Some(Arc::new(
            ballista_core::serde::BallistaLogicalExtensionCodec::default(),
        )),
        override_physical_codec: Some(Arc::new(LakefillCodec::default())),
        ..Default::default()
    };
    ballista_executor::executor_process::start_executor_process(Arc::new(config))
        .await
        .map_err(|e| failed("executor", e))
}

/// The object stores of a scheduler or executor: the local file system, and an S3 bucket's or
/// Azure container's store built the first time a task asks for it, from this process's own
/// environment (`AWS_*`, `AZURE_*`; never from the plan, which carries no credentials).
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
        lakefill_table::store::Store::register_handlers();
        let kind = lakefill_table::store::Store::of(url);
        if !kind.is_object_store() {
            return self.known.get_store(url);
        }
        let options: std::collections::HashMap<String, String> = std::env::vars()
            .filter(|(key, _)| kind.reads_from_env(key))
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
