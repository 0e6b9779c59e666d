//! `GpuNearestExec`: the rows of each batch that can be among the first `k` of
//! `ORDER BY <distance>(emb, <constant>) LIMIT k`, chosen without computing the distance
//! column.
//!
//! The plan pass `plan/nearest.rs` puts it under a GPU top-k sort (or under the projection
//! that computes the sort's distance) whose one key is a distance of an embedding column to a
//! constant vector. For each batch of more than `k` rows it scores every row against the
//! constant in the vector top-k kernels (`kernels/cuda/vector/topk.cu`: a radix select per
//! tile in shared memory, then a merge), keeps the first `k` rows of the sort's own order
//! (its direction, its NULLs first or last, NaN above every number), ties by row, and gathers
//! them, in row order. The sort above then sorts at most `k` rows per batch, and the distance
//! is computed for those rows only. A batch whose row count is on the device (a GPU filter's)
//! keeps it there: the kernels stop at it, and the output's count is on the device too, so
//! the operator never waits. The rows the sort keeps are the rows it would keep
//! without this operator, up to the choice among rows tied on the distance, which one sort
//! key leaves open.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;
use spate_kernels::vector_topk::{NearestItems, Order, Vectors};

use super::batching::KeepsCounts;
use super::{DeviceBatchStream, GpuExec, TransferMetrics, batch_target, per_batch_input, to_df};
use crate::column::{DeviceBatch, DeviceCount, DeviceValues, Gather, RowCount, gather_batch};
use crate::error::{Result, SpateError};
use crate::vector::{Elem, Metric};

/// What a pre-selection keeps: the first `k` rows by the distance of column `column` to
/// `query`, in `order`.
#[derive(Debug, Clone)]
pub struct Preselection {
    /// The embedding column of the input.
    pub column: usize,
    /// The constant vector, as f32s.
    pub query: Arc<Vec<f32>>,
    pub metric: Metric,
    /// Rows kept per batch: the sort's fetch.
    pub k: usize,
    pub descending: bool,
    pub nulls_first: bool,
    /// The sort key as the plan prints it, for `EXPLAIN`.
    pub key: String,
}

/// The rows of each batch that can be among the first `k` of a sort by a distance (see the
/// module docs).
#[derive(Debug)]
pub struct GpuNearestExec {
    input: Arc<dyn ExecutionPlan>,
    select: Preselection,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuNearestExec {
    /// The pre-selection `select` over `input`.
    pub fn new(input: Arc<dyn ExecutionPlan>, select: Preselection) -> Self {
        GpuNearestExec {
            input,
            select,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn order(&self) -> Order {
        Order::Sql {
            descending: self.select.descending,
            nulls_first: self.select.nulls_first,
        }
    }
}

/// The first `select.k` rows of `batch` by the distance, in row order, or `batch` when it
/// has no more rows than that.
fn preselect(
    stream: &DeviceStream,
    batch: DeviceBatch,
    select: &Preselection,
    order: Order,
    query: &spate_kernels::DeviceBuffer<u8>,
    budget: usize,
) -> Result<DeviceBatch> {
    // A row count still on the device stays there: the kernels stop at it.
    let rows = batch.bound();
    if rows <= select.k {
        return Ok(batch);
    }
    let column = &batch.columns()[select.column];
    let (Some((elem, dim)), DeviceValues::Fixed { bytes, .. }) =
        (Elem::of(column.data_type()), column.values())
    else {
        return Err(SpateError::Internal {
            message: format!(
                "a nearest-row selection over a {} column",
                column.data_type()
            ),
        });
    };
    let items = Vectors {
        bytes: bytes.as_slice(),
        validity: column.validity().map(|v| v.bitmap()),
        rows,
        dim,
        elem: elem.code(),
    };
    let query = Vectors {
        bytes: query.as_slice(),
        validity: None,
        rows: 1,
        dim,
        elem: Elem::F32.code(),
    };
    let mut top = NearestItems::ordered(stream, 1, select.k, select.metric.code(), order)?;
    top.add_counted(stream, items, batch.row_count().live(), query, budget)?;
    // In an SQL order every row has a key: k rows are kept, or all of a device count below
    // k. The count stays on the device.
    let (indices, count) = top.rows(stream)?;
    let gathers: Vec<Gather<'_>> = batch
        .columns()
        .iter()
        .map(|c| Gather::rows(c, indices.as_slice()))
        .collect();
    gather_batch(
        stream,
        Arc::clone(batch.schema()),
        &gathers,
        &RowCount::Device {
            bound: select.k,
            word: DeviceCount::new(count)?,
        },
    )
}

impl DisplayAs for GpuNearestExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "k={}", self.select.k),
            _ => write!(
                f,
                "GpuNearestExec: first {} rows per batch by {}",
                self.select.k, self.select.key
            ),
        }
    }
}

impl ExecutionPlan for GpuNearestExec {
    fn name(&self) -> &str {
        "GpuNearestExec"
    }

    /// The input's: the rows are some of the input's, in its order.
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let [input]: [Arc<dyn ExecutionPlan>; 1] = children
            .try_into()
            .map_err(|_| DataFusionError::Internal("GpuNearestExec takes one child".into()))?;
        Ok(Arc::new(GpuNearestExec::new(input, self.select.clone())))
    }

    crate::exec::gpu_plan_methods!();
}

impl GpuExec for GpuNearestExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
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
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let input = per_batch_input(
            &self.input,
            partition,
            &context,
            &stream,
            &transfer,
            // The kernels stop at a row count on the device: nothing reads it here.
            KeepsCounts::always(),
        )?;
        let budget = batch_target(&context)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (select, order) = (self.select.clone(), self.order());
        let bytes: Vec<u8> = select.query.iter().flat_map(|v| v.to_le_bytes()).collect();
        let query = stream.from_host(&bytes).map_err(|e| to_df(e.into()))?;
        Ok(Box::pin(input.map(move |batch| {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            let out = preselect(&stream, batch, &select, order, &query, budget).map_err(to_df)?;
            baseline.record_output(out.bound());
            Ok(out)
        })))
    }
}
