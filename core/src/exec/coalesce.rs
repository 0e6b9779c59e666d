//! `GpuCoalescePartitionsExec`: DataFusion's `CoalescePartitionsExec` over a GPU input, merging
//! the input's partitions into one stream of device batches without leaving the device.
//!
//! On the CPU, `CoalescePartitionsExec` sits under every `CollectLeft` join's build side and
//! under single-partition stages (final aggregates, global sorts). Over a GPU input it would
//! download every partition's batches for the GPU operator above to upload them again: a
//! round trip over the bus per batch, and a synchronisation each time. This operator hands the
//! device batches through instead.
//!
//! All input partitions run on the one stream the output is consumed on. Their kernels then
//! execute in the order they are issued, so every batch is complete before the consumer's
//! kernels read it and is freed in stream order after them, with no events between streams.
//! The input partitions are still polled concurrently on the host, so CPU work below a GPU
//! leaf (a Parquet scan, say) keeps its parallelism. It computes nothing and moves no device
//! data, so it records no device traffic of its own.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use spate_kernels::Stream as DeviceStream;

use super::{DeviceBatchStream, GpuExec, TransferMetrics, as_gpu_exec, device_input, rebuild_gpu};
use crate::expr::Unsupported;

/// Merges a GPU input's partitions into one partition, on the device.
#[derive(Debug)]
pub struct GpuCoalescePartitionsExec {
    /// The CPU node this replaces: its properties and rebuilds are reused.
    cpu: Arc<CoalescePartitionsExec>,
    /// Placed to merge a GPU region's input into one partition
    /// (`plan::regions`), whatever its input: over a CPU input it uploads every partition.
    merging: bool,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuCoalescePartitionsExec {
    /// The GPU version of `coalesce`, when its input is a GPU operator and it has no row limit
    /// (a limit stops reading early, which the CPU node does better).
    pub fn try_new(coalesce: Arc<CoalescePartitionsExec>) -> Result<Self, Unsupported> {
        if as_gpu_exec(coalesce.input().as_ref()).is_none() {
            return Err(Unsupported(
                "its input is on the CPU: merging host partitions needs no GPU".into(),
            ));
        }
        if coalesce.fetch().is_some() {
            return Err(Unsupported(
                "it stops after a row limit, which the CPU merge does without reading on".into(),
            ));
        }
        Ok(GpuCoalescePartitionsExec {
            cpu: coalesce,
            merging: false,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The merge of a GPU region's input partitions into one (see `plan::regions`): over a GPU
    /// input it hands device batches through, over a CPU input it uploads each partition, each
    /// decoded in a task of its own, into the one device stream.
    pub fn merging(coalesce: Arc<CoalescePartitionsExec>) -> Self {
        GpuCoalescePartitionsExec {
            cpu: coalesce,
            merging: true,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn rebuild(&self, cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        if self.merging {
            return Ok(match cpu.downcast_ref::<CoalescePartitionsExec>() {
                Some(c) if c.fetch().is_none() => {
                    Arc::new(GpuCoalescePartitionsExec::merging(Arc::new(c.clone())))
                }
                _ => cpu,
            });
        }
        rebuild_gpu::<CoalescePartitionsExec, _>(cpu, GpuCoalescePartitionsExec::try_new)
    }
}

impl DisplayAs for GpuCoalescePartitionsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuCoalescePartitionsExec {
    fn name(&self) -> &str {
        "GpuCoalescePartitionsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.cpu.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.cpu.input()]
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
        self.rebuild(cpu)
    }

    crate::exec::gpu_plan_methods!(cpu);
}

impl GpuExec for GpuCoalescePartitionsExec {
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
        if partition != 0 {
            return Err(datafusion::error::DataFusionError::Internal(format!(
                "GpuCoalescePartitionsExec has one output partition, asked for {partition} \
                 (this is a bug)"
            )));
        }
        let input = self.cpu.input();
        let inputs = (0..input.output_partitioning().partition_count())
            .map(|p| {
                let transfer = TransferMetrics::passing_through(&self.metrics, p);
                device_input(input, p, &context, &stream, &transfer)
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Box::pin(futures::stream::select_all(inputs)))
    }
}
