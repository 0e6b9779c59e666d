//! The stages an executor runs, placed on its GPU.

use std::sync::Arc;

use ballista_core::JobId;
use ballista_core::serde::protobuf::{
    RuntimeStatsReport, ShuffleWritePartition, TaskColumnStats, WindowStateReport,
};
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use datafusion::prelude::SessionConfig;
use spate::GpuOffloadRule;

/// Ballista's execution engine, with each stage's plan (under its shuffle writer) placed on the
/// executor's GPU first. The rule keeps the plan's partitions (the session config says
/// `spate.gpu.one_partition = false`), since the writer and the task run the stage partition by
/// partition. Each task runs on one of the executor's devices, in turn (`spate.gpu.device`):
/// the partitions of a task share what its plan collects once (a join's build side). Without a
/// GPU the stages run as Ballista plans them, on DataFusion's operators.
pub(crate) struct GpuStages {
    rule: Option<GpuOffloadRule>,
    devices: usize,
    /// Tasks this executor was given so far: the next one's device is this modulo `devices`.
    /// (The scheduler's task ids are global: executors taking turns would leave devices idle.)
    tasks: std::sync::atomic::AtomicUsize,
    inner: DefaultExecutionEngine,
}

impl GpuStages {
    pub(crate) fn new(rule: Option<GpuOffloadRule>, devices: usize) -> Self {
        GpuStages {
            rule,
            devices: devices.max(1),
            tasks: std::sync::atomic::AtomicUsize::new(0),
            inner: DefaultExecutionEngine::new(),
        }
    }
}

impl ExecutionEngine for GpuStages {
    fn create_query_stage_exec(
        &self,
        job_id: JobId,
        stage_id: usize,
        task_id: usize,
        global_output_partition_ids: Vec<usize>,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> DFResult<Arc<dyn QueryStageExecutor>> {
        let plan = match (&self.rule, plan.children().as_slice()) {
            (Some(rule), [stage]) => {
                let placed = rule.optimize(Arc::clone(stage), config.options())?;
                log::debug!(
                    "job {job_id} stage {stage_id}: {}",
                    datafusion::physical_plan::displayable(placed.as_ref()).indent(true)
                );
                Arc::clone(&plan).replace_children(
                    vec![placed],
                    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
                )?
            }
            _ => plan,
        };
        let stage = self.inner.create_query_stage_exec(
            job_id,
            stage_id,
            task_id,
            global_output_partition_ids,
            plan,
            work_dir,
            config,
        )?;
        Ok(Arc::new(OnDevice {
            stage,
            device: self
                .tasks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                % self.devices,
        }))
    }
}

/// A stage's task, run on one of the executor's devices.
#[derive(Debug)]
struct OnDevice {
    stage: Arc<dyn QueryStageExecutor>,
    device: usize,
}

impl std::fmt::Display for OnDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (device {})", self.stage, self.device)
    }
}

#[async_trait::async_trait]
impl QueryStageExecutor for OnDevice {
    async fn execute_query_stage(
        &self,
        task_id: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<Vec<ShuffleWritePartition>> {
        let mut config = context.session_config().clone();
        if config
            .options()
            .extensions
            .get::<spate::SpateOptions>()
            .is_some()
        {
            config
                .options_mut()
                .set("spate.gpu.device", &self.device.to_string())?;
        }
        let context = TaskContext::new(
            context.task_id(),
            context.session_id(),
            config,
            context.scalar_functions().clone(),
            context.higher_order_functions().clone(),
            context.aggregate_functions().clone(),
            context.window_functions().clone(),
            context.runtime_env(),
        );
        self.stage
            .execute_query_stage(task_id, Arc::new(context))
            .await
    }

    fn collect_plan_metrics(&self) -> Vec<MetricsSet> {
        self.stage.collect_plan_metrics()
    }

    fn collect_runtime_stats_reports(&self) -> Vec<RuntimeStatsReport> {
        self.stage.collect_runtime_stats_reports()
    }

    fn collect_window_state_reports(&self) -> DFResult<Vec<WindowStateReport>> {
        self.stage.collect_window_state_reports()
    }

    fn collect_column_stats(&self) -> Vec<TaskColumnStats> {
        self.stage.collect_column_stats()
    }
}
