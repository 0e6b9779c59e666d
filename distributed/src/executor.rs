//! A Ballista executor in this process, running its tasks on a Spate engine.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::BallistaCodec;
use ballista_core::serde::protobuf::ExecutorRegistration;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::scheduler::{
    ExecutorOperatingSystemSpecification, ExecutorSpecification,
};
use ballista_core::utils::{GrpcServerConfig, create_grpc_server};
use ballista_core::{BALLISTA_PROTOCOL_VERSION, ConfigProducer, RuntimeProducer};
use ballista_executor::execution_loop::poll_loop;
use ballista_executor::executor::Executor as BallistaExecutor;
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::health::ExecutorHealth;
use ballista_executor::metrics::LoggingMetricsCollector;
use datafusion::prelude::SessionConfig;
use spate::{Engine, Result};
use tokio::task::JoinHandle;

use crate::engine::GpuStages;
use crate::failed;

/// What an executor runs on and where it listens.
#[derive(Debug)]
pub struct ExecutorOptions {
    /// The scheduler: `df://host:port` or `host:port`.
    pub scheduler: String,
    /// Where its Arrow Flight service listens for other executors and clients fetching the
    /// shuffle files and results it holds (`host:port`; port 0 picks a free one).
    pub bind: String,
    /// The host other executors and clients reach it at, when not the bind address's (a
    /// container's bind address 0.0.0.0, say: its pod's IP).
    pub advertise: Option<String>,
    /// The engine its tasks run on: its backend, devices and memory limits.
    pub engine: Engine,
    /// Tasks it runs at once.
    pub tasks: usize,
}

/// A running executor, registered with its scheduler by its first poll. [`Executor::kill`] or
/// dropping it stops it at once, its running tasks with it (what a crash looks like to the
/// scheduler).
pub struct Executor {
    id: String,
    address: SocketAddr,
    engine: Engine,
    poll: JoinHandle<()>,
    flight: JoinHandle<()>,
    /// Shuffle files and spills; removed when the executor is dropped.
    _work_dir: tempfile::TempDir,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("id", &self.id)
            .field("address", &self.address)
            .finish()
    }
}

impl Executor {
    /// Its id at the scheduler.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where its Flight service listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The engine its tasks run on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Stops polling and serving at once, abandoning its running tasks.
    pub fn kill(self) {
        drop(self);
    }

    /// Waits until it stops (its poll loop ends when the scheduler goes away).
    pub async fn wait(&mut self) -> Result<()> {
        (&mut self.poll)
            .await
            .map_err(|e| failed("the executor stopped", e))
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.poll.abort();
        self.flight.abort();
    }
}

/// Starts an executor: binds its Flight service, then polls the scheduler for tasks, running
/// each on `options.engine` (see [`crate`]). Fails when the scheduler cannot be reached.
pub async fn start_executor(options: ExecutorOptions) -> Result<Executor> {
    let ExecutorOptions {
        scheduler,
        bind,
        advertise,
        engine,
        tasks,
    } = options;
    let scheduler_url = spate::scheduler_address(&scheduler)?;
    let client = SchedulerGrpcClient::connect(scheduler_url.clone())
        .await
        .map_err(|e| spate::SpateError::Config {
            message: format!("cannot reach the scheduler at {scheduler}: {e}"),
        })?;
    let listener =
        tokio::net::TcpListener::bind(&bind)
            .await
            .map_err(|e| spate::SpateError::Config {
                message: format!("the executor cannot listen on {bind}: {e}"),
            })?;
    let address = listener
        .local_addr()
        .map_err(|e| failed("the executor's address", e))?;
    let work_dir = tempfile::Builder::new()
        .prefix("spate-executor-")
        .tempdir()
        .map_err(|e| failed("the executor's work folder", e))?;
    let work_path = work_dir.path().to_string_lossy().into_owned();
    let id = ballista_core::ids::new_instance_id();
    let tasks = tasks.max(1);
    let registration = ExecutorRegistration {
        id: id.clone(),
        host: Some(advertise.unwrap_or_else(|| address.ip().to_string())),
        port: u32::from(address.port()),
        grpc_port: 0,
        specification: Some(
            ExecutorSpecification::default()
                .with_vcores(u32::try_from(tasks).unwrap_or(u32::MAX))
                .into(),
        ),
        os_info: Some(ExecutorOperatingSystemSpecification::default().into()),
        ballista_protocol_version: BALLISTA_PROTOCOL_VERSION,
    };
    // Every task's session: Ballista's settings, and the engine's GPU with Spate's options.
    let config_engine = engine.clone();
    let config_producer: ConfigProducer = Arc::new(move || {
        let base = SessionConfig::new_with_ballista();
        config_engine.stage_config(base.clone()).unwrap_or(base)
    });
    let runtime = engine.context().runtime_env();
    let runtime_producer: RuntimeProducer = Arc::new(move |_| Ok(Arc::clone(&runtime)));
    let executor = Arc::new(BallistaExecutor::new(
        registration,
        &work_path,
        runtime_producer,
        config_producer,
        Arc::new(function_registry()),
        Arc::new(LoggingMetricsCollector::default()),
        tasks,
        Arc::new(GpuStages::new(
            engine.offload_rule(),
            engine.gpu().map_or(1, |g| g.devices().len()),
        )),
    ));
    let flight = FlightServiceServer::new(BallistaFlightService::new(work_path));
    let serve = create_grpc_server(&GrpcServerConfig::default())
        .add_service(flight)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let flight = tokio::spawn(async move {
        if let Err(e) = serve.await {
            log::error!("the executor's Flight service stopped: {e}");
        }
    });
    let poll = tokio::spawn(async move {
        let codec: BallistaCodec = BallistaCodec::default();
        if let Err(e) = poll_loop(client, executor, codec, None, None, ExecutorHealth::new()).await
        {
            log::error!("the executor stopped polling its scheduler: {e}");
        }
    });
    log::info!("Ballista executor {id} listening on {address}, polling {scheduler_url}");
    Ok(Executor {
        id,
        address,
        engine,
        poll,
        flight,
        _work_dir: work_dir,
    })
}

/// Ballista's functions, with Spate's vector distances (`spate::vector`) in place of
/// DataFusion's: a task's plan names the functions it was planned with.
fn function_registry() -> BallistaFunctionRegistry {
    let mut registry = BallistaFunctionRegistry::default();
    for udf in spate::vector::functions() {
        let names = std::iter::once(udf.name()).chain(udf.aliases().iter().map(String::as_str));
        for name in names {
            registry
                .scalar_functions
                .insert(name.to_string(), Arc::clone(&udf));
        }
    }
    registry
}
