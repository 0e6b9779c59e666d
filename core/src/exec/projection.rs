//! `GpuProjectionExec`: DataFusion's `ProjectionExec` on the GPU.
//!
//! Column references pass through without copying (the output column shares the input's
//! device memory); every computed expression of the projection is evaluated by one generated
//! kernel per batch. Output order is input order.
//!
//! Over a `GpuFilterExec`, the projection is fused with the filter: it takes the filter's kept
//! row indices and its kernel reads those rows of the filter's input directly, so the computed
//! columns are never gathered first; only the columns passed through are gathered.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;

use super::batching::KeepsCounts;
use super::device_counts::Settlement;
use super::filter::{GpuFilterExec, Selected};
use super::retry::{Retry, Where, flatten, is_device_oom};
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, gpu_context, per_batch_input,
    rebuild_gpu, to_df,
};
use crate::column::{DeviceBatch, DeviceColumn, Gather, RowCount, gather_counted};
use crate::error::SpateError;
use crate::expr::{Unsupported, ValueKernel, evaluate_values, evaluate_values_at, value_kernel};

/// Where each output column comes from.
#[derive(Debug, Clone)]
enum Source {
    /// An input column, passed through.
    Input(usize),
    /// Output `k` of the generated kernel.
    Computed(usize),
}

/// A projection running on the GPU.
#[derive(Debug)]
pub struct GpuProjectionExec {
    cpu: Arc<ProjectionExec>,
    sources: Vec<Source>,
    kernel: Option<ValueKernel>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuProjectionExec {
    /// The GPU version of `projection`, or why it must stay on the CPU.
    pub fn try_new(projection: Arc<ProjectionExec>) -> Result<Self, Unsupported> {
        let input_schema = projection.input().schema();
        check_input_types(&input_schema)?;
        let mut sources = Vec::new();
        let mut computed: Vec<&dyn PhysicalExpr> = Vec::new();
        for p in projection.expr() {
            match p.expr.downcast_ref::<Column>() {
                Some(c) => sources.push(Source::Input(c.index())),
                None => {
                    sources.push(Source::Computed(computed.len()));
                    computed.push(p.expr.as_ref());
                }
            }
        }
        let kernel = if computed.is_empty() {
            None
        } else {
            Some(value_kernel(&computed, &input_schema)?)
        };
        Ok(GpuProjectionExec {
            cpu: projection,
            sources,
            kernel,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        rebuild_gpu::<ProjectionExec, _>(cpu, GpuProjectionExec::try_new)
    }
}

impl DisplayAs for GpuProjectionExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)?;
        if self.cpu.input().downcast_ref::<GpuFilterExec>().is_some()
            && !matches!(t, DisplayFormatType::TreeRender)
        {
            write!(f, ", fused_with_filter=true")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for GpuProjectionExec {
    fn name(&self) -> &str {
        "GpuProjectionExec"
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
        self.cpu.apply_expressions(f)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
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
        Self::rebuild(cpu)
    }

    crate::exec::gpu_plan_methods!(cpu);

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Equal
    }
}

impl GpuExec for GpuProjectionExec {
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
        let gpu = gpu_context(&context)?;
        let kernel = match &self.kernel {
            Some(k) => Some((
                gpu.generated_kernel(&k.source, &k.entry).map_err(to_df)?,
                k.clone(),
            )),
            None => None,
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let settlement = Settlement::of(&self.metrics, partition);
        let sources = self.sources.clone();
        let schema = self.schema();
        let project = Arc::new(Project {
            kernel: kernel.clone(),
            sources: sources.clone(),
            schema: Arc::clone(&schema),
            stream: Arc::clone(&stream),
            baseline: baseline.clone(),
            settlement: settlement.clone(),
            exprs: self
                .cpu
                .expr()
                .iter()
                .map(|p| Arc::clone(&p.expr))
                .collect(),
            retry: Retry::new(gpu, Arc::clone(&stream), &self.metrics, partition),
        });
        // Over a GPU filter, read the kept rows through their indices: the filter's gather
        // and this projection's kernel become one pass.
        if let Some(filter) = self.cpu.input().downcast_ref::<GpuFilterExec>() {
            let selected = filter.execute_selected(partition, context, Arc::clone(&stream))?;
            let fused = move |selected: &Selected| -> DFResult<DeviceBatch> {
                let _timer = baseline.elapsed_compute().timer();
                let rows = selected.kept().map_err(to_df)?;
                // With indices, the kernel stops at their count; without, at the batch's.
                let live = selected.rows.live();
                let computed = match &kernel {
                    Some((k, values)) => {
                        evaluate_values_at(&stream, k, values, &selected.batch, rows, live)
                            .map_err(to_df)?
                    }
                    None => Vec::new(),
                };
                // The kept rows of the input columns, gathered together: one readback for
                // all their string byte totals, which brings a device count back too (the
                // computed columns are then cut to it), unless each string column's bytes
                // are bounded by its source's (the filter keeps each row at most once).
                let inputs = selected.batch.columns();
                let (gathered, count) = match rows {
                    Some(rows) => {
                        let gathers: Vec<Gather<'_>> = sources
                            .iter()
                            .filter_map(|s| match s {
                                Source::Input(i) => {
                                    Some(Gather::rows(&inputs[*i], rows).each_row_once())
                                }
                                Source::Computed(_) => None,
                            })
                            .collect();
                        gather_counted(&stream, &gathers, &selected.rows).map_err(to_df)?
                    }
                    None => (
                        sources
                            .iter()
                            .filter_map(|s| match s {
                                Source::Input(i) => Some(inputs[*i].clone()),
                                Source::Computed(_) => None,
                            })
                            .collect(),
                        selected.rows.clone(),
                    ),
                };
                let mut gathered = gathered.into_iter();
                let cut = |c: &DeviceColumn| match count.host() {
                    Some(n) if n < c.len() => c.prefix(n).map_err(to_df),
                    _ => Ok(c.clone()),
                };
                let columns = sources
                    .iter()
                    .map(|s| match s {
                        Source::Input(_) => gathered.next().ok_or_else(|| {
                            to_df(SpateError::Internal {
                                message: "a projection lost one of its gathered columns".into(),
                            })
                        }),
                        Source::Computed(k) => cut(&computed[*k]),
                    })
                    .collect::<DFResult<Vec<_>>>()?;
                let out = DeviceBatch::try_new_counted(Arc::clone(&schema), columns, count)
                    .map_err(to_df)?;
                record_rows(&baseline, &settlement, &out, &stream);
                Ok(out)
            };
            return Ok(Box::pin(flatten(selected.map(move |selected| {
                let selected = selected?;
                match fused(&selected) {
                    // Out of device memory reading the kept rows through their indices:
                    // they are gathered first and projected batch by batch, split and
                    // retried.
                    Err(e) if is_device_oom(&e) => {
                        let batch = selected.gather(&project.stream).map_err(to_df)?;
                        project.run(&batch)
                    }
                    other => other.map(|b| vec![b]),
                }
            }))));
        }
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let input = per_batch_input(
            self.cpu.input(),
            partition,
            &context,
            &stream,
            &transfer,
            KeepsCounts::always(),
        )?;
        Ok(Box::pin(flatten(
            input.map(move |batch| project.run(&batch?)),
        )))
    }
}

/// The per-batch projection: the generated kernel's columns beside the ones passed through,
/// split and retried when it runs out of device memory (`exec/retry.rs`).
struct Project {
    kernel: Option<(spate_kernels::Kernel, ValueKernel)>,
    sources: Vec<Source>,
    schema: arrow::datatypes::SchemaRef,
    stream: Arc<DeviceStream>,
    baseline: BaselineMetrics,
    settlement: Settlement,
    /// The CPU projection's expressions, for a piece of a batch that runs on the CPU.
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    retry: Retry,
}

impl Project {
    fn run(&self, batch: &DeviceBatch) -> DFResult<Vec<DeviceBatch>> {
        self.retry.run(batch, &mut |piece, place| match place {
            Where::Gpu => self.on_gpu(piece),
            Where::Cpu => self.on_cpu(piece),
        })
    }

    fn on_gpu(&self, batch: &DeviceBatch) -> DFResult<DeviceBatch> {
        let _timer = self.baseline.elapsed_compute().timer();
        let computed = match &self.kernel {
            Some((k, values)) => evaluate_values(&self.stream, k, values, batch).map_err(to_df)?,
            None => Vec::new(),
        };
        let columns = self
            .sources
            .iter()
            .map(|s| match s {
                Source::Input(i) => batch.columns()[*i].clone(),
                Source::Computed(k) => computed[*k].clone(),
            })
            .collect();
        let out = DeviceBatch::try_new_counted(
            Arc::clone(&self.schema),
            columns,
            batch.row_count().clone(),
        )
        .map_err(to_df)?;
        record_rows(&self.baseline, &self.settlement, &out, &self.stream);
        Ok(out)
    }

    /// The projection of `batch` computed on the CPU by DataFusion's expressions, uploaded.
    fn on_cpu(&self, batch: &DeviceBatch) -> DFResult<DeviceBatch> {
        let _timer = self.baseline.elapsed_compute().timer();
        let out = self.retry.on_cpu(batch, &self.schema, |host| {
            let rows = host.num_rows();
            let columns = self
                .exprs
                .iter()
                .map(|e| e.evaluate(&host)?.into_array(rows))
                .collect::<DFResult<Vec<_>>>()?;
            let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows));
            Ok(arrow::record_batch::RecordBatch::try_new_with_options(
                Arc::clone(&self.schema),
                columns,
                &options,
            )?)
        })?;
        record_rows(&self.baseline, &self.settlement, &out, &self.stream);
        Ok(out)
    }
}

/// Counts an output batch's rows: now, or once its device count is read back.
fn record_rows(
    baseline: &BaselineMetrics,
    settlement: &Settlement,
    out: &DeviceBatch,
    stream: &Arc<DeviceStream>,
) {
    match out.row_count() {
        RowCount::Host(n) => baseline.record_output(*n),
        RowCount::Device { word, .. } => {
            settlement.count_rows(word, baseline.output_rows(), stream)
        }
    }
}
