//! `GpuUnionExec`: DataFusion's `UnionExec` over GPU inputs, passing their device batches
//! through.
//!
//! A union computes nothing: its output partitions are its inputs' partitions side by side. On
//! the CPU, between GPU operators, it is a host exchange: each input's batches are downloaded
//! for it and uploaded again by the GPU operator above. Here output partition `p` is the
//! device stream of the input partition it stands for, so `UNION ALL` of GPU subtrees stays on
//! the device; a CPU input is uploaded as any GPU operator's is. It moves no device data and
//! records no device traffic of its own.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use spate_kernels::Stream as DeviceStream;

use super::{DeviceBatchStream, GpuExec, TransferMetrics, as_gpu_exec, device_input, rebuild_gpu};
use crate::expr::Unsupported;

/// A union of GPU inputs, on the device.
#[derive(Debug)]
pub struct GpuUnionExec {
    cpu: Arc<UnionExec>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuUnionExec {
    /// The GPU version of `union`, when some input is a GPU operator (a union of host batches
    /// needs no GPU). A CPU input's batches are uploaded, partition by partition, as any GPU
    /// operator's CPU input is: the offload rule makes this node only when every input is on
    /// the GPU, the one-partition rewrite also under a GPU consumer (`plan::regions`), where
    /// the CPU input's batches go up anyway.
    pub fn try_new(union: Arc<UnionExec>) -> Result<Self, Unsupported> {
        if union
            .inputs()
            .iter()
            .all(|input| as_gpu_exec(input.as_ref()).is_none())
        {
            return Err(Unsupported(
                "its inputs are on the CPU: a union of host batches needs no GPU".into(),
            ));
        }
        Ok(GpuUnionExec {
            cpu: union,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The input and its partition that output partition `partition` stands for.
    fn input_of(&self, partition: usize) -> DFResult<(&Arc<dyn ExecutionPlan>, usize)> {
        let mut rest = partition;
        for input in self.cpu.inputs() {
            let count = input.output_partitioning().partition_count();
            if rest < count {
                return Ok((input, rest));
            }
            rest -= count;
        }
        let total: usize = self
            .cpu
            .inputs()
            .iter()
            .map(|i| i.output_partitioning().partition_count())
            .sum();
        Err(DataFusionError::Internal(format!(
            "GpuUnionExec has {total} output partitions, asked for {partition} (this is a bug)"
        )))
    }
}

impl DisplayAs for GpuUnionExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuUnionExec {
    fn name(&self) -> &str {
        "GpuUnionExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.cpu.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.cpu.inputs().iter().collect()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let cpu = Arc::clone(&self.cpu).replace_children(children, options)?;
        rebuild_gpu::<UnionExec, _>(cpu, GpuUnionExec::try_new)
    }

    crate::exec::gpu_plan_methods!(cpu);
}

impl GpuExec for GpuUnionExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn replaces(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.cpu.as_ref())
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        // It passes batches through: no device traffic of its own.
        None
    }

    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let (input, input_partition) = self.input_of(partition)?;
        let transfer = TransferMetrics::passing_through(&self.metrics, partition);
        device_input(input, input_partition, &context, &stream, &transfer)
    }
}
