//! `GpuCrossJoinExec`: DataFusion's `CrossJoinExec` on the GPU.
//!
//! The left side is collected (DataFusion gives it one partition) into one device batch, once
//! for all output partitions, as DataFusion's cross join does; each right batch is then paired
//! with every left row. A kernel writes the pairs' row indices
//! (`kernels/cuda/join/cross.cu`, left-major, as the CPU emits them) and both sides' columns
//! are gathered by them. A right batch's output is cut into batches of at most
//! [`OUTPUT_ROWS`] rows, whole left rows at a time, so a large product never needs one
//! allocation for all of it.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::CrossJoinExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};
use spate_kernels::Stream as DeviceStream;
use spate_kernels::cross::cross_pairs;

use super::batching::KeepsCounts;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, collected_input,
    per_batch_input, to_df,
};
use crate::column::{DeviceBatch, Gather, concat_device_batches, gather_columns};
use crate::error::Result;
use crate::expr::Unsupported;

/// The most rows of one output batch (fewer when one left row pairs with more right rows).
const OUTPUT_ROWS: usize = 1 << 22;

/// A cross join on the GPU.
#[derive(Debug)]
pub struct GpuCrossJoinExec {
    /// The `CrossJoinExec` this replaces.
    cpu: Arc<dyn ExecutionPlan>,
    /// The collected left side, shared by the output partitions: the first to run collects it
    /// (a left input may not run twice: a repartition below it would not).
    left: Arc<tokio::sync::OnceCell<DeviceBatch>>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuCrossJoinExec {
    /// The GPU version of `join` (a `CrossJoinExec`), or why it stays on the CPU.
    pub fn try_new(join: Arc<dyn ExecutionPlan>) -> std::result::Result<Self, Unsupported> {
        let Some(cross) = join.downcast_ref::<CrossJoinExec>() else {
            return Err(Unsupported("it is not a cross join".into()));
        };
        Self::check(cross)?;
        Ok(GpuCrossJoinExec {
            cpu: join,
            left: Arc::new(tokio::sync::OnceCell::new()),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Whether `join` can run on the GPU, or why not.
    pub fn check(join: &CrossJoinExec) -> std::result::Result<(), Unsupported> {
        check_input_types(&join.left().schema())?;
        check_input_types(&join.right().schema())
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        crate::exec::rebuild_gpu_dyn(cpu, GpuCrossJoinExec::try_new)
    }

    fn side(&self, k: usize) -> &Arc<dyn ExecutionPlan> {
        self.cpu.children()[k]
    }
}

/// Every left row of `left` paired with every row of `right`, left-major, as batches of at
/// most [`OUTPUT_ROWS`] rows (whole left rows each).
fn cross(
    stream: &DeviceStream,
    schema: &arrow::datatypes::SchemaRef,
    left: &DeviceBatch,
    right: &DeviceBatch,
) -> Result<Vec<DeviceBatch>> {
    let right = right.resolve(stream)?;
    let (nl, nr) = (left.bound(), right.bound());
    if nl == 0 || nr == 0 {
        return Ok(Vec::new());
    }
    let per_batch = (OUTPUT_ROWS / nr).max(1);
    let mut out = Vec::with_capacity(nl.div_ceil(per_batch));
    let mut first = 0;
    while first < nl {
        let rows = per_batch.min(nl - first);
        let (li, ri) = cross_pairs(stream, first, rows, nr)?;
        let gathers: Vec<Gather<'_>> = left
            .columns()
            .iter()
            .map(|c| Gather::rows(c, li.as_slice()))
            .chain(
                right
                    .columns()
                    .iter()
                    .map(|c| Gather::rows(c, ri.as_slice())),
            )
            .collect();
        let columns = gather_columns(stream, &gathers)?;
        out.push(DeviceBatch::try_new(
            Arc::clone(schema),
            columns,
            rows * nr,
        )?);
        first += rows;
    }
    Ok(out)
}

impl DisplayAs for GpuCrossJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuCrossJoinExec {
    fn name(&self) -> &str {
        "GpuCrossJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.cpu.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.cpu.children()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        self.cpu.apply_expressions(f)
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.cpu.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        self.cpu.maintains_input_order()
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let cpu = Arc::clone(&self.cpu).replace_children(children, options)?;
        Self::rebuild(cpu)
    }

    crate::exec::gpu_plan_methods!(cpu);
}

impl GpuExec for GpuCrossJoinExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn replaces(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.cpu.as_ref())
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        Some(&self.metrics)
    }

    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let (left_plan, right_plan) = (self.side(0), self.side(1));
        if left_plan.properties().partitioning.partition_count() != 1 {
            return Err(DataFusionError::Internal(
                "GpuCrossJoinExec's left side has several partitions (this is a bug)".into(),
            ));
        }
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let right = per_batch_input(
            right_plan,
            partition,
            &context,
            &stream,
            &transfer,
            KeepsCounts::never(),
        )?;
        // Several output partitions read the left side on their own streams: it is then
        // marked shared and complete before any of them reads it (one wait).
        let shared = right_plan.properties().partitioning.partition_count() > 1;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (schema, left_schema) = (self.schema(), left_plan.schema());
        let (left_plan, cell) = (Arc::clone(left_plan), Arc::clone(&self.left));
        let out = futures::stream::once(async move {
            let left = cell
                .get_or_try_init(|| async {
                    let input = collected_input(
                        &left_plan,
                        0,
                        &context,
                        &stream,
                        &transfer,
                        KeepsCounts::never(),
                    )?;
                    let batches: Vec<DeviceBatch> = input.try_collect().await?;
                    let left = concat_device_batches(&stream, &left_schema, batches)
                        .and_then(|b| b.resolve(&stream))
                        .map_err(to_df)?;
                    if shared {
                        left.share_across_streams();
                        stream.synchronize().map_err(|e| to_df(e.into()))?;
                    }
                    Ok::<_, DataFusionError>(left)
                })
                .await?
                .clone();
            let joined = right.map(move |batch| {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                let out = cross(&stream, &schema, &left, &batch).map_err(to_df)?;
                for b in &out {
                    baseline.record_output(b.bound());
                }
                Ok::<_, DataFusionError>(futures::stream::iter(out.into_iter().map(Ok)))
            });
            Ok::<_, DataFusionError>(joined.try_flatten())
        })
        .try_flatten();
        Ok(Box::pin(out))
    }
}
