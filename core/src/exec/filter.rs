//! `GpuFilterExec`: DataFusion's `FilterExec` on the GPU, with its embedded projection and fetch.
//!
//! Per device batch: the generated predicate kernel writes a byte per row (TRUE → 1; FALSE and
//! NULL → 0), stream compaction turns it into the kept row indices (in order), and every
//! output column is gathered by them. Output order is input order, as `FilterExec`'s.
//!
//! The kept count stays on the device (`RowCount::Device`): nothing waits for it, and the
//! output's columns have room for every input row. Consumers stop at the count, or read it
//! back when they need it on the host. The one exception is a filter with a fetch (a LIMIT),
//! which must count its rows on the host to stop. The filter's `output_rows` and the bytes of
//! its output wait for the counts (`exec/device_counts.rs`): a consumer that reads one back
//! pays them, and the rest are read once the query has run; `counted_on_device` says how
//! many batches kept their count on the device.
//!
//! A `GpuProjectionExec` right above takes the kept indices instead of gathered batches
//! ([`GpuFilterExec::execute_selected`]): its generated kernel reads the kept rows straight
//! from the filter's input, so the filter and the projection's expressions make one pass over
//! the data, and only the columns passed through unchanged are gathered.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    apply_expression_roots,
};
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;
use spate_kernels::compact::{self, Mask};

use super::batching::KeepsCounts;
use super::device_counts::Settlement;
use super::retry::{Retry, Where};
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, gpu_context, per_batch_input,
    rebuild_gpu, to_df,
};
use crate::column::{DeviceBatch, DeviceCount, Gather, RowCount, gather_batch};
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
        if filter.fetch().is_some() && !kernel.checks.is_empty() {
            // With a LIMIT the CPU stops reading once it has enough rows, so rows after that
            // never fail it; the GPU evaluates larger (coalesced) batches and could.
            return Err(Unsupported(format!(
                "the predicate `{}` can fail, and under a LIMIT the CPU evaluates fewer rows",
                filter.predicate()
            )));
        }
        Ok(GpuFilterExec {
            cpu: filter,
            kernel,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        rebuild_gpu::<FilterExec, _>(cpu, GpuFilterExec::try_new)
    }
}

impl DisplayAs for GpuFilterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
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

    crate::exec::gpu_plan_methods!(cpu);

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

/// The rows of one input batch that passed a filter, not yet gathered.
pub(crate) struct Selected {
    /// The input batch with the filter's embedded projection applied (a view: no copy), in the
    /// filter's output schema, with all its rows.
    pub(crate) batch: DeviceBatch,
    /// The kept rows in order, or `None` when every row was kept (`rows` is then the
    /// batch's own count).
    pub(crate) indices: Option<spate_kernels::DeviceBuffer<u32>>,
    /// How many rows were kept: the first `rows.bound()` elements of `indices` are read, and
    /// only the first `rows` of them are kept rows.
    pub(crate) rows: RowCount,
}

impl Selected {
    /// The kept indices the count bounds, when not every row was kept.
    pub(crate) fn kept(&self) -> crate::error::Result<Option<spate_kernels::DeviceSlice<'_, u32>>> {
        Ok(match &self.indices {
            Some(indices) => Some(indices.slice(..self.rows.bound())?),
            None => None,
        })
    }

    /// The kept rows as a batch: the columns gathered, or passed through when all rows passed.
    pub(crate) fn gather(&self, stream: &DeviceStream) -> crate::error::Result<DeviceBatch> {
        let schema = Arc::clone(self.batch.schema());
        match self.kept()? {
            None => DeviceBatch::try_new_counted(
                schema,
                self.batch.columns().to_vec(),
                self.rows.clone(),
            ),
            Some(indices) => {
                let gathers: Vec<Gather<'_>> = self
                    .batch
                    .columns()
                    .iter()
                    .map(|c| Gather::rows(c, indices).each_row_once())
                    .collect();
                gather_batch(stream, schema, &gathers, &self.rows)
            }
        }
    }
}

/// A stream of [`Selected`] batches.
pub(crate) type SelectedStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = DFResult<Selected>> + Send>>;

struct FilterState {
    input: DeviceBatchStream,
    /// Kept batches of an input batch that was split after running out of device memory,
    /// not yet returned.
    ready: std::collections::VecDeque<Selected>,
    retry: Arc<Retry>,
    /// The CPU filter's predicate, for a piece of a batch that runs on the CPU.
    cpu_predicate: Arc<dyn PhysicalExpr>,
    stream: Arc<DeviceStream>,
    kernel: spate_kernels::Kernel,
    predicate: PredicateKernel,
    projection: Option<Vec<usize>>,
    schema: arrow::datatypes::SchemaRef,
    remaining: Option<usize>,
    baseline: BaselineMetrics,
    /// Where `output_rows` waits for the counts left on the device.
    settlement: Settlement,
}

impl FilterState {
    /// [`FilterState::select`], split and retried when it runs out of device memory
    /// (`exec/retry.rs`); the kept batches go to `ready`.
    fn select_retried(&mut self, batch: &DeviceBatch) -> DFResult<()> {
        let retry = Arc::clone(&self.retry);
        let kept = retry.run(batch, &mut |piece, place| match place {
            Where::Gpu => self.select(piece),
            Where::Cpu => self.select_on_cpu(&retry, piece),
        })?;
        self.ready.extend(kept.into_iter().flatten());
        Ok(())
    }

    /// The kept rows of `batch` computed on the CPU by DataFusion's predicate, uploaded.
    fn select_on_cpu(&mut self, retry: &Retry, batch: &DeviceBatch) -> DFResult<Option<Selected>> {
        let _timer = self.baseline.elapsed_compute().timer();
        let (predicate, projection) = (Arc::clone(&self.cpu_predicate), self.projection.clone());
        let remaining = self.remaining;
        let out = retry.on_cpu(batch, &self.schema, |host| {
            let mask = predicate.evaluate(&host)?.into_array(host.num_rows())?;
            let mask = datafusion::common::cast::as_boolean_array(&mask)?;
            let kept = arrow::compute::filter_record_batch(&host, mask)?;
            let kept = match &projection {
                Some(p) => kept.project(p)?,
                None => kept,
            };
            Ok(match remaining {
                Some(r) if kept.num_rows() > r => kept.slice(0, r),
                _ => kept,
            })
        })?;
        let rows = out.bound();
        if let Some(r) = self.remaining.as_mut() {
            *r -= rows;
        }
        if rows == 0 {
            return Ok(None);
        }
        self.baseline.record_output(rows);
        Ok(Some(Selected {
            batch: out,
            indices: None,
            rows: RowCount::Host(rows),
        }))
    }

    fn select(&mut self, batch: &DeviceBatch) -> DFResult<Option<Selected>> {
        let _timer = self.baseline.elapsed_compute().timer();
        let n = batch.bound();
        if n == 0 {
            return Ok(None);
        }
        let s = &self.stream;
        let mask = evaluate_predicate(s, &self.kernel, &self.predicate, batch).map_err(to_df)?;
        let mask = Mask::Bytes(mask.as_slice());
        let columns = match &self.projection {
            Some(p) => p.iter().map(|&c| batch.columns()[c].clone()).collect(),
            None => batch.columns().to_vec(),
        };
        // The view keeps the input's count: its rows past a device count are not rows.
        let view = DeviceBatch::try_new_counted(
            Arc::clone(&self.schema),
            columns,
            batch.row_count().clone(),
        )
        .map_err(to_df)?;
        let Some(remaining) = self.remaining.as_mut() else {
            // The predicate wrote 0 for the rows past a device count, so the compaction of
            // all `n` rows keeps only rows.
            let word =
                DeviceCount::new(s.alloc::<u32>(1).map_err(|e| to_df(e.into()))?).map_err(to_df)?;
            let kept = compact::select_indices_on_device(s, mask, None, n, word.as_slice())
                .map_err(|e| to_df(e.into()))?;
            // Whoever reads the count back adds it to this filter's `output_rows`.
            self.settlement
                .count_rows(&word, self.baseline.output_rows(), &self.stream);
            return Ok(Some(Selected {
                batch: view,
                indices: Some(kept),
                rows: RowCount::Device { bound: n, word },
            }));
        };
        // Under a fetch the host counts, to stop at it.
        let kept = compact::select_indices(s, mask, None, n).map_err(|e| to_df(e.into()))?;
        let rows = kept.len().min(*remaining);
        *remaining -= rows;
        if rows == 0 {
            return Ok(None);
        }
        self.baseline.record_output(rows);
        Ok(Some(Selected {
            batch: view,
            // Every row passed (so a device count was `n` too): the columns pass through
            // without a copy.
            indices: (rows < n).then_some(kept),
            rows: RowCount::Host(rows),
        }))
    }
}

impl GpuFilterExec {
    /// The kept rows of each input batch, not gathered: for a GPU parent that reads them
    /// through the indices (a fused projection).
    pub(crate) fn execute_selected(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<SelectedStream> {
        let gpu = gpu_context(&context)?;
        let kernel = gpu
            .generated_kernel(&self.kernel.source, &self.kernel.entry)
            .map_err(to_df)?;
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let input = per_batch_input(
            self.cpu.input(),
            partition,
            &context,
            &stream,
            &transfer,
            KeepsCounts::always(),
        )?;
        let retry = Arc::new(Retry::new(
            Arc::clone(&gpu),
            Arc::clone(&stream),
            &self.metrics,
            partition,
        ));
        let state = FilterState {
            input,
            ready: std::collections::VecDeque::new(),
            retry,
            cpu_predicate: Arc::clone(self.cpu.predicate()),
            stream,
            kernel,
            predicate: self.kernel.clone(),
            projection: self.cpu.projection().as_ref().map(|p| p.to_vec()),
            schema: self.schema(),
            remaining: self.cpu.fetch(),
            baseline: BaselineMetrics::new(&self.metrics, partition),
            settlement: Settlement::of(&self.metrics, partition),
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut s| async move {
                loop {
                    if let Some(out) = s.ready.pop_front() {
                        return Some((Ok(out), s));
                    }
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
                        Some(Ok(batch)) => {
                            if let Err(e) = s.select_retried(&batch) {
                                return Some((Err(e), s));
                            }
                        }
                    }
                }
            },
        )))
    }
}

impl GpuExec for GpuFilterExec {
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
        let selected = self.execute_selected(partition, context, Arc::clone(&stream))?;
        Ok(Box::pin(selected.map(move |s| {
            s.and_then(|s| s.gather(&stream).map_err(to_df))
        })))
    }
}

impl From<Unsupported> for DataFusionError {
    fn from(u: Unsupported) -> Self {
        DataFusionError::NotImplemented(u.0)
    }
}
