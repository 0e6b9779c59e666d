//! A Ballista scheduler in this process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::{create_scheduler, start_grpc_service_with_listener};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use spate::Result;
use tokio::task::JoinHandle;

use crate::failed;

/// How a scheduler treats its executors.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// An executor not heard from for this long is lost: the tasks it ran go to others and
    /// the shuffle output it held is computed again. Executors poll every 50 ms when idle and
    /// at least every 5 s when busy, so this must be well above 5 s.
    pub executor_timeout: Duration,
    /// How often lost executors are looked for.
    pub expire_interval: Duration,
    /// How long a query waits without any executor before it fails.
    pub no_executors_grace: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            executor_timeout: Duration::from_secs(30),
            expire_interval: Duration::from_secs(5),
            no_executors_grace: Duration::from_secs(60),
        }
    }
}

/// A running scheduler. Dropping it stops its gRPC service.
#[derive(Debug)]
pub struct Scheduler {
    address: SocketAddr,
    service: JoinHandle<()>,
}

impl Scheduler {
    /// Where it listens (the port chosen when the bind address asked for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its address as clients give it: `df://host:port`.
    pub fn url(&self) -> String {
        format!("df://{}", self.address)
    }

    /// Waits until the service stops (it runs until the process ends).
    pub async fn wait(&mut self) -> Result<()> {
        (&mut self.service)
            .await
            .map_err(|e| failed("the scheduler stopped", e))
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.service.abort();
    }
}

/// Starts a scheduler listening on `bind` (`host:port`; port 0 picks a free one), with
/// executors polling it for tasks (Ballista's pull-staged scheduling). Returns once it listens.
pub async fn start_scheduler(bind: &str, options: &SchedulerOptions) -> Result<Scheduler> {
    let listener =
        tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| spate::SpateError::Config {
                message: format!("the scheduler cannot listen on {bind}: {e}"),
            })?;
    let address = listener
        .local_addr()
        .map_err(|e| failed("the scheduler's address", e))?;
    let config = SchedulerConfig {
        bind_host: address.ip().to_string(),
        external_host: address.ip().to_string(),
        bind_port: address.port(),
        scheduling_policy: TaskSchedulingPolicy::PullStaged,
        executor_timeout_seconds: options.executor_timeout.as_secs().max(1),
        expire_dead_executor_interval_seconds: options.expire_interval.as_secs().max(1),
        no_executors_grace_period_seconds: options.no_executors_grace.as_secs(),
        // A stopped executor is let go of at once.
        executor_termination_grace_period: 0,
        override_session_builder: Some(Arc::new(session_with_spate_functions)),
        ..SchedulerConfig::default()
    };
    config
        .validate()
        .map_err(|e| failed("the scheduler's configuration", e))?;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| failed("the scheduler's state", e))?;
    let scheduler =
        create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::new(config))
            .await
            .map_err(|e| failed("starting the scheduler", e))?;
    let service = tokio::spawn(async move {
        if let Err(e) = start_grpc_service_with_listener(listener, scheduler).await {
            log::error!("the scheduler's service stopped: {e}");
        }
    });
    log::info!("Ballista scheduler listening on {address}");
    Ok(Scheduler { address, service })
}

/// Ballista's session, with Spate's vector distances (`spate::vector`) in place of
/// DataFusion's, so a client's plan that calls them decodes to the functions it was planned
/// with.
fn session_with_spate_functions(
    config: datafusion::prelude::SessionConfig,
) -> datafusion::common::Result<datafusion::execution::SessionState> {
    use datafusion::execution::FunctionRegistry as _;
    let mut state = ballista_core::utils::default_session_builder(config)?;
    for udf in spate::vector::functions() {
        state.register_udf(udf)?;
    }
    Ok(state)
}
