//! `GpuFilterExec`: DataFusion's `FilterExec` on the GPU, with its embedded projection and fetch.
//!
//! Per device batch: the generated predicate kernel writes a byte per row (TRUE → 1; FALSE and
//! NULL → 0), stream compaction turns it into the kept row indices (in order), and every
//! output column is gathered by them. Output order is input order, as `FilterExec`'s.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, apply_expression_roots,
};
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;
use spate_kernels::compact::{self, Mask};

use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, device_input, execute_for_host,
    gpu_context, rebuild_gpu, to_df,
};
use crate::column::{DeviceBatch, gather_column};
use crate::expr::{PredicateKernel, Unsupported, evaluate_predicate, predicate_kernel};

/// A filter (with optional projection and fetch) running on the GPU.
#[derive(Debug)]
pub struct GpuFilterExec {
    /// The CPU node this replaces: its properties, statistics and rebuilds are reused.
    cpu: Arc<FilterExec>,
    kernel: PredicateKernel,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuFilterExec {
    /// The GPU version of `filter`, or why it must stay on the CPU.
    pub fn try_new(filter: Arc<FilterExec>) -> Result<Self, Unsupported> {
        let input_schema = filter.input().schema();
        check_input_types(&input_schema)?;
        let kernel = predicate_kernel(filter.predicate().as_ref(), &input_schema)?;
        Ok(GpuFilterExec {
            cpu: filter,
            kernel,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The predicate.
    pub fn predicate(&self) -> &Arc<dyn PhysicalExpr> {
        self.cpu.predicate()
    }

    /// The generated kernel source (for EXPLAIN VERBOSE and debugging).
    pub fn kernel_source(&self) -> &str {
        &self.kernel.source
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        rebuild_gpu::<FilterExec, _>(cpu, GpuFilterExec::try_new)
    }
}

impl DisplayAs for GpuFilterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gpu")?;
        self.cpu.fmt_as(t, f)
    }
}

impl ExecutionPlan for GpuFilterExec {
    fn name(&self) -> &str {
        "GpuFilterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.cpu.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.cpu.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        apply_expression_roots([self.cpu.predicate()], f)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let cpu = Arc::clone(&self.cpu).replace_children(children, options)?;
        Self::rebuild(cpu)
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        execute_for_host(self, partition, context, &self.metrics)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::LowerEqual
    }

    fn fetch(&self) -> Option<usize> {
        self.cpu.fetch()
    }

    fn with_fetch(&self, fetch: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        let cpu = self.cpu.with_fetch(fetch)?;
        Self::rebuild(cpu).ok()
    }
}

struct FilterState {
    input: DeviceBatchStream,
    stream: Arc<DeviceStream>,
    kernel: spate_kernels::Kernel,
    predicate: PredicateKernel,
    projection: Option<Vec<usize>>,
    schema: arrow::datatypes::SchemaRef,
    remaining: Option<usize>,
    baseline: BaselineMetrics,
}

impl FilterState {
    fn filter(&mut self, batch: &DeviceBatch) -> DFResult<Option<DeviceBatch>> {
        let _timer = self.baseline.elapsed_compute().timer();
        let n = batch.num_rows();
        let s = &self.stream;
        let mask = evaluate_predicate(s, &self.kernel, &self.predicate, batch).map_err(to_df)?;
        let kept = compact::select_indices(s, Mask::Bytes(mask.as_slice()), None, n)
            .map_err(|e| to_df(e.into()))?;
        drop(mask);
        let mut rows = kept.len();
        if let Some(r) = self.remaining.as_mut() {
            rows = rows.min(*r);
            *r -= rows;
        }
        if rows == 0 {
            return Ok(None);
        }
        let indices = kept.slice(..rows).map_err(|e| to_df(e.into()))?;
        let all: Vec<usize>;
        let columns = match &self.projection {
            Some(p) => p,
            None => {
                all = (0..batch.columns().len()).collect();
                &all
            }
        };
        let out = if rows == n {
            // Every row passed: the columns pass through without a copy.
            columns
                .iter()
                .map(|&c| batch.columns()[c].clone())
                .collect()
        } else {
            columns
                .iter()
                .map(|&c| gather_column(s, &batch.columns()[c], indices))
                .collect::<crate::error::Result<Vec<_>>>()
                .map_err(to_df)?
        };
        let out = DeviceBatch::try_new(Arc::clone(&self.schema), out, rows).map_err(to_df)?;
        self.baseline.record_output(rows);
        Ok(Some(out))
    }
}

impl GpuExec for GpuFilterExec {
    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let gpu = gpu_context(&context)?;
        let kernel = gpu
            .generated_kernel(&self.kernel.source, &self.kernel.entry)
            .map_err(to_df)?;
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let input = device_input(self.cpu.input(), partition, &context, &stream, &transfer)?;
        let state = FilterState {
            input,
            stream,
            kernel,
            predicate: self.kernel.clone(),
            projection: self.cpu.projection().as_ref().map(|p| p.to_vec()),
            schema: self.schema(),
            remaining: self.cpu.fetch(),
            baseline: BaselineMetrics::new(&self.metrics, partition),
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut s| async move {
                loop {
                    if s.remaining == Some(0) {
                        s.baseline.done();
                        return None;
                    }
                    match s.input.next().await {
                        None => {
                            s.baseline.done();
                            return None;
                        }
                        Some(Err(e)) => return Some((Err(e), s)),
                        Some(Ok(batch)) => match s.filter(&batch) {
                            Ok(Some(out)) => return Some((Ok(out), s)),
                            Ok(None) => continue,
                            Err(e) => return Some((Err(e), s)),
                        },
                    }
                }
            },
        )))
    }
}

impl From<Unsupported> for DataFusionError {
    fn from(u: Unsupported) -> Self {
        DataFusionError::NotImplemented(u.0)
    }
}
