//! `GpuVectorTopKExec`: `vector_topk` on the GPU ([`VectorTopKExec`]'s rows, bit for bit).
//!
//! The queries are uploaded (or taken from a GPU child) whole, into one device batch. Each
//! batch of items is then scored against every query and merged into each query's running k
//! nearest (`spate_kernels::vector_topk`: a radix select per tile of items, a merge per query),
//! and at the end each query's entries are sorted and written out. The distance matrix is
//! never held: a batch's candidates take at most `spate.gpu.batch_bytes` at a time.
//!
//! Positions are rows in partition order, as on the CPU: the inputs' partitions are read one
//! after the other, in order (the region pass leaves them unmerged, see
//! [`GpuExec::reads_partitions_in_order`]). A batch whose row count is still on the device is
//! read back before it is scored (its rows place the next batch): one wait per such batch.
//! The output is one device batch whose row count stays on the device.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};
use spate_kernels::Stream as DeviceStream;
use spate_kernels::vector_topk::{NearestItems, Vectors};

use super::batching::KeepsCounts;
use super::device_counts::Settlement;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, batch_target, check_input_types, per_batch_input,
    to_df,
};
use crate::column::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceCount, DeviceValues, RowCount,
    concat_device_batches,
};
use crate::error::{Result, SpateError};
use crate::expr::Unsupported;
use crate::vector::{Elem, VectorTopKExec};

/// `vector_topk` on the GPU.
#[derive(Debug)]
pub struct GpuVectorTopKExec {
    /// The `VectorTopKExec` this replaces.
    cpu: Arc<dyn ExecutionPlan>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuVectorTopKExec {
    /// The GPU version of `plan` (a `VectorTopKExec`), or why it stays on the CPU.
    pub fn try_new(plan: Arc<dyn ExecutionPlan>) -> std::result::Result<Self, Unsupported> {
        let Some(top) = plan.downcast_ref::<VectorTopKExec>() else {
            return Err(Unsupported("it is not a vector top-k".into()));
        };
        Self::check(top)?;
        Ok(GpuVectorTopKExec {
            cpu: plan,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Whether `top` can run on the GPU, or why not.
    pub fn check(top: &VectorTopKExec) -> std::result::Result<(), Unsupported> {
        check_input_types(&top.items().schema())?;
        check_input_types(&top.queries().schema())
    }

    fn top(&self) -> Result<&VectorTopKExec> {
        self.cpu
            .downcast_ref::<VectorTopKExec>()
            .ok_or_else(|| SpateError::Internal {
                message: "GpuVectorTopKExec over another operator".into(),
            })
    }
}

/// An embedding column of a resolved batch, as the kernels take it.
fn vectors<'a>(batch: &'a DeviceBatch, rows: usize) -> Result<Vectors<'a>> {
    let column = &batch.columns()[0];
    let (Some((elem, dim)), DeviceValues::Fixed { bytes, .. }) =
        (Elem::of(column.data_type()), column.values())
    else {
        return Err(SpateError::Internal {
            message: format!("vector top-k over a {} column", column.data_type()),
        });
    };
    Ok(Vectors {
        bytes: bytes.as_slice(),
        validity: column.validity().map(|v| v.bitmap()),
        rows,
        dim,
        elem: elem.code(),
    })
}

/// One UInt64 (or Float64) output column of `bound` rows.
fn output_column(
    data_type: arrow::datatypes::DataType,
    bound: usize,
    buffer: spate_kernels::DeviceBuffer<u8>,
) -> DeviceColumn {
    DeviceColumn::new(
        data_type,
        bound,
        0,
        None,
        DeviceValues::Fixed {
            bytes: DeviceBytes::new(buffer),
            width: 8,
        },
    )
}

/// Every partition of `plan` as device batches, one partition after the other in order.
fn in_partition_order(
    plan: &Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
    stream: &Arc<DeviceStream>,
    transfer: &TransferMetrics,
) -> DeviceBatchStream {
    let partitions = plan.output_partitioning().partition_count();
    let (plan, context, stream, transfer) = (
        Arc::clone(plan),
        Arc::clone(context),
        Arc::clone(stream),
        transfer.clone(),
    );
    Box::pin(
        futures::stream::iter(0..partitions)
            .map(move |p| {
                per_batch_input(&plan, p, &context, &stream, &transfer, KeepsCounts::never())
            })
            .try_flatten(),
    )
}

impl DisplayAs for GpuVectorTopKExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuVectorTopKExec {
    fn name(&self) -> &str {
        "GpuVectorTopKExec"
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

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        self.cpu.benefits_from_input_partitioning()
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let cpu = Arc::clone(&self.cpu).replace_children(children, options)?;
        crate::exec::rebuild_gpu_dyn(cpu, GpuVectorTopKExec::try_new)
    }

    crate::exec::gpu_plan_methods!();
}

impl GpuExec for GpuVectorTopKExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn replaces(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.cpu.as_ref())
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        Some(&self.metrics)
    }

    fn reads_partitions_in_order(&self) -> bool {
        true
    }

    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "GpuVectorTopKExec has one partition, not {partition}"
            )));
        }
        let top = self.top().map_err(to_df)?;
        let (k, metric) = (top.k(), top.metric().code());
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let queries = in_partition_order(top.queries(), &context, &stream, &transfer);
        let mut items = in_partition_order(top.items(), &context, &stream, &transfer);
        let query_schema = top.queries().schema();
        let schema = self.schema();
        let budget = batch_target(&context)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let settlement = Settlement::of(&self.metrics, partition);
        let out = futures::stream::once(async move {
            let queries: Vec<DeviceBatch> = queries.try_collect().await?;
            let queries = concat_device_batches(&stream, &query_schema, queries)
                .and_then(|b| b.resolve(&stream))
                .map_err(to_df)?;
            let query_rows = queries.bound();
            let mut nearest =
                NearestItems::new(&stream, query_rows, k, metric).map_err(|e| to_df(e.into()))?;
            while let Some(batch) = items.next().await {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                let batch = batch.resolve(&stream).map_err(to_df)?;
                let (item_vectors, query_vectors) = (
                    vectors(&batch, batch.bound()).map_err(to_df)?,
                    vectors(&queries, query_rows).map_err(to_df)?,
                );
                nearest
                    .add_items(&stream, item_vectors, query_vectors, budget)
                    .map_err(|e| to_df(e.into()))?;
            }
            let _timer = baseline.elapsed_compute().timer();
            let out = nearest.finish(&stream, 0).map_err(|e| to_df(e.into()))?;
            let bound = out.bound;
            let fields = schema.fields();
            let columns = [out.query, out.item, out.rank]
                .into_iter()
                .map(|b| b.into_bytes())
                .chain(std::iter::once(out.distance.into_bytes()))
                .zip(fields.iter())
                .map(|(bytes, field)| output_column(field.data_type().clone(), bound, bytes))
                .collect();
            let count = DeviceCount::new(out.count).map_err(to_df)?;
            // Whoever reads the count back adds it to this operator's `output_rows`.
            settlement.count_rows(&count, baseline.output_rows(), &stream);
            let batch = DeviceBatch::try_new_counted(
                Arc::clone(&schema),
                columns,
                RowCount::Device { bound, word: count },
            )
            .map_err(to_df)?;
            Ok::<_, DataFusionError>(batch)
        });
        Ok(Box::pin(out))
    }
}
