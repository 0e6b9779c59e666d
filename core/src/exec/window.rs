//! `GpuWindowExec`: DataFusion's `WindowAggExec` and `BoundedWindowAggExec` on the GPU, for the
//! ranking functions and for aggregates over whole partitions.
//!
//! The input arrives sorted on the partition keys, then on the ORDER BY keys (DataFusion sorts
//! it below, on the GPU too). A partition's device batches are concatenated, then:
//! 1. a generated kernel flags each row that starts a window partition (its partition keys
//!    differ from the previous row's) and each that starts a run of peers (its ORDER BY keys
//!    differ too). Keys compare as DataFusion's partitioning compares them: NULL equals NULL,
//!    floats by their bits (IEEE total order: -0.0 and +0.0 differ), strings by bytes;
//! 2. exclusive scans of the flags number the partitions and the peer runs (one readback: the
//!    number of partitions), and a kernel records the row each starts at;
//! 3. `row_number`, `rank` and `dense_rank` follow from those starts. Aggregates over the whole
//!    partition (no ORDER BY, or a frame from UNBOUNDED PRECEDING to UNBOUNDED FOLLOWING) run
//!    as the aggregation's own kernels with the partition's number as the group
//!    (`aggregate::SegmentAggregate`), and are gathered back to the partition's rows.
//!
//! Other frames (running and sliding aggregates), other functions (`lag`, `lead`, `ntile`, ...)
//! and partition or ORDER BY keys that are expressions stay on the CPU, with the reason.

use std::collections::HashMap;
use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::window::{
    PlainAggregateWindowExpr, SlidingAggregateWindowExpr, StandardWindowExpr, WindowExpr,
};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec, WindowUDFExpr};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, InputOrderMode,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::TryStreamExt;
use spate_kernels::{KernelArg, Stream as DeviceStream};

use super::aggregate::SegmentAggregate;
use super::batching::KeepsCounts;
use super::hash_table::codegen::{finish_program, key_equal};
use super::hash_table::{Kernels, launch};
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, collected_input, gpu_context,
    to_df,
};
use crate::column::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceValues, Gather, concat_device_batches,
    gather_columns,
};
use crate::error::{Result, SpateError};
use crate::expr::{DevType, Unsupported, column_args, column_params};

/// What one window expression computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    RowNumber,
    Rank,
    DenseRank,
    /// Output `k` of the partition aggregates.
    Aggregate(usize),
}

impl Function {
    /// The `kind` argument of the `numbers` kernel.
    fn kind(self) -> Option<u32> {
        match self {
            Function::RowNumber => Some(0),
            Function::Rank => Some(1),
            Function::DenseRank => Some(2),
            Function::Aggregate(_) => None,
        }
    }
}

/// What the GPU computes for one window operator.
#[derive(Debug)]
struct WindowPlan {
    /// Partition key columns, then ORDER BY key columns (input indices).
    partition: Vec<usize>,
    order: Vec<usize>,
    functions: Vec<Function>,
    aggregates: Option<SegmentAggregate>,
    /// The generated program (`bounds`, `starts`, `numbers`) and its `(name, entry)` pairs.
    source: String,
    entries: Vec<(String, String)>,
}

/// A window operator running on the GPU.
#[derive(Debug)]
pub struct GpuWindowExec {
    /// The `WindowAggExec` or `BoundedWindowAggExec` this replaces.
    cpu: Arc<dyn ExecutionPlan>,
    plan: Arc<WindowPlan>,
    metrics: ExecutionPlanMetricsSet,
}

/// Key columns of `exprs` (input indices), or why one is not a column.
fn key_columns<'a>(
    exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
    what: &str,
) -> std::result::Result<Vec<usize>, Unsupported> {
    exprs
        .into_iter()
        .map(|e| {
            e.downcast_ref::<Column>()
                .map(Column::index)
                .ok_or_else(|| Unsupported(format!("{what} `{e}` is not a column")))
        })
        .collect()
}

impl GpuWindowExec {
    /// The GPU version of `window` (a `WindowAggExec` or `BoundedWindowAggExec`), or why it
    /// must stay on the CPU.
    pub fn try_new(window: Arc<dyn ExecutionPlan>) -> std::result::Result<Self, Unsupported> {
        let (exprs, input) = if let Some(w) = window.downcast_ref::<WindowAggExec>() {
            (w.window_expr(), w.input())
        } else if let Some(w) = window.downcast_ref::<BoundedWindowAggExec>() {
            if w.input_order_mode != InputOrderMode::Sorted {
                return Err(Unsupported(
                    "its input is not sorted on the partition keys".into(),
                ));
            }
            (w.window_expr(), w.input())
        } else {
            return Err(Unsupported("it is not a window operator".into()));
        };
        let schema = input.schema();
        check_input_types(&schema)?;
        let Some(first) = exprs.first() else {
            return Err(Unsupported("it computes no window function".into()));
        };
        let partition = key_columns(first.partition_by(), "partition key")?;
        let order = key_columns(first.order_by().iter().map(|s| &s.expr), "ORDER BY key")?;
        let mut functions = Vec::with_capacity(exprs.len());
        let mut aggregates = Vec::new();
        for e in exprs {
            let same_keys = key_columns(e.partition_by(), "partition key")? == partition
                && key_columns(e.order_by().iter().map(|s| &s.expr), "ORDER BY key")? == order;
            if !same_keys {
                return Err(Unsupported(format!(
                    "`{}` has other PARTITION BY or ORDER BY keys than `{}`",
                    e.name(),
                    first.name()
                )));
            }
            functions.push(function(e.as_ref(), &mut aggregates)?);
        }
        for &k in partition.iter().chain(&order) {
            let field = schema.field(k);
            if DevType::of(field.data_type()).is_none() {
                return Err(Unsupported(format!(
                    "window key `{}` has type {}, which the GPU does not compare yet",
                    field.name(),
                    field.data_type()
                )));
            }
        }
        let aggregates = if aggregates.is_empty() {
            None
        } else {
            let planned = SegmentAggregate::try_new(aggregates, input)?;
            Some(planned)
        };
        let key_type = |k: &usize| exact(DevType::of(schema.field(*k).data_type()));
        let (source, entries) = program(
            &partition.iter().filter_map(key_type).collect::<Vec<_>>(),
            &order.iter().filter_map(key_type).collect::<Vec<_>>(),
            window.name(),
        );
        let gpu = GpuWindowExec {
            cpu: Arc::clone(&window),
            plan: Arc::new(WindowPlan {
                partition,
                order,
                functions,
                aggregates,
                source,
                entries,
            }),
            metrics: ExecutionPlanMetricsSet::new(),
        };
        gpu.check_output_types()?;
        Ok(gpu)
    }

    /// The output is the input's columns and one per function, of DataFusion's types.
    fn check_output_types(&self) -> std::result::Result<(), Unsupported> {
        let out = self.cpu.schema();
        let width = out.fields().len() - self.plan.functions.len();
        for (field, f) in out.fields()[width..].iter().zip(&self.plan.functions) {
            let ok = match f {
                Function::Aggregate(_) => DevType::of(field.data_type()).is_some(),
                _ => field.data_type() == &DataType::UInt64,
            };
            if !ok {
                return Err(Unsupported(format!(
                    "window output `{}` is {}, which the GPU does not produce",
                    field.name(),
                    field.data_type()
                )));
            }
        }
        Ok(())
    }

    /// Why a window operator must stay on the CPU (`Ok` when it need not), for `EXPLAIN`.
    pub fn check(window: &dyn ExecutionPlan) -> std::result::Result<(), Unsupported> {
        let node = window
            .downcast_ref::<WindowAggExec>()
            .map(|w| Arc::new(w.clone()) as Arc<dyn ExecutionPlan>)
            .or_else(|| {
                window
                    .downcast_ref::<BoundedWindowAggExec>()
                    .map(|w| Arc::new(w.clone()) as Arc<dyn ExecutionPlan>)
            })
            .ok_or_else(|| Unsupported("it is not a window operator".into()))?;
        GpuWindowExec::try_new(node).map(|_| ())
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        crate::exec::rebuild_gpu_dyn(cpu, GpuWindowExec::try_new)
    }

    fn input(&self) -> &Arc<dyn ExecutionPlan> {
        self.cpu.children()[0]
    }
}

/// Key types compared by their bits: floats as unsigned integers of their width, so -0.0 and
/// +0.0 differ (the aggregation's key equality folds them).
fn exact(ty: Option<DevType>) -> Option<DevType> {
    Some(match ty? {
        DevType::F32 => DevType::Int {
            bits: 32,
            signed: false,
        },
        DevType::F64 => DevType::Int {
            bits: 64,
            signed: false,
        },
        other => other,
    })
}

/// What window expression `e` computes on the GPU; an aggregate is added to `aggregates`.
fn function(
    e: &dyn WindowExpr,
    aggregates: &mut Vec<Arc<datafusion::physical_expr::aggregate::AggregateFunctionExpr>>,
) -> std::result::Result<Function, Unsupported> {
    if let Some(standard) = e.as_any().downcast_ref::<StandardWindowExpr>() {
        let name = standard
            .get_standard_func_expr()
            .as_any()
            .downcast_ref::<WindowUDFExpr>()
            .map(|u| u.fun().name().to_string())
            .unwrap_or_else(|| e.name().to_string());
        return match name.as_str() {
            "row_number" => Ok(Function::RowNumber),
            "rank" => Ok(Function::Rank),
            "dense_rank" => Ok(Function::DenseRank),
            other => Err(Unsupported(format!(
                "window function `{other}` does not run on the GPU yet"
            ))),
        };
    }
    let aggregate = if let Some(a) = e.as_any().downcast_ref::<PlainAggregateWindowExpr>() {
        a.get_aggregate_expr()
    } else if let Some(a) = e.as_any().downcast_ref::<SlidingAggregateWindowExpr>() {
        a.get_aggregate_expr()
    } else {
        return Err(Unsupported(format!(
            "window expression `{}` does not run on the GPU yet",
            e.name()
        )));
    };
    // The whole partition: no ORDER BY (every row a peer of every other), or a frame from
    // the first row to the last.
    let frame = e.get_window_frame();
    let whole = frame.start_bound.is_unbounded()
        && (frame.end_bound.is_unbounded() || e.order_by().is_empty());
    if !whole {
        return Err(Unsupported(format!(
            "`{}`: only aggregates over the whole partition run on the GPU yet (frame {frame})",
            e.name()
        )));
    }
    aggregates.push(Arc::new(aggregate.clone()));
    Ok(Function::Aggregate(aggregates.len() - 1))
}

/// The window program: `bounds`, `starts` and `numbers` (see the module docs) for partition keys
/// and ORDER BY keys of these (exact) types.
fn program(
    partition: &[DevType],
    order: &[DevType],
    label: &str,
) -> (String, Vec<(String, String)>) {
    let equal = |prefix: &str, keys: &[DevType]| -> String {
        keys.iter()
            .enumerate()
            .map(|(k, ty)| key_equal(prefix, prefix, k, *ty))
            .collect()
    };
    let (pparams, oparams) = (
        column_params("p", partition.len()),
        column_params("o", order.len()),
    );
    let (pequal, oequal) = (equal("p", partition), equal("o", order));
    let mut body = String::new();
    let _ = write!(
        body,
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_bounds({pparams}{oparams}u64 n, u32* np, u32* nq) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        bool newp = i == 0ull;
        if (!newp) {{
            const u64 a = i - 1ull;
            const u64 b = i;
            bool eq = true;
{pequal}            newp = !eq;
        }}
        bool newq = newp;
        if (!newq) {{
            const u64 a = i - 1ull;
            const u64 b = i;
            bool eq = true;
{oequal}            newq = !eq;
        }}
        np[i] = newp ? 1u : 0u;
        nq[i] = newq ? 1u : 0u;
    }}
}}
SPATE_EXPORT(ENTRY_bounds)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_starts(const u32* np, const u32* nq, const u32* pe, const u32* qe, u64 n, u32* pid, u32* qid, u32* pstart, u32* qstart) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u32 p = pe[i] + np[i] - 1u;
        const u32 q = qe[i] + nq[i] - 1u;
        pid[i] = p;
        qid[i] = q;
        if (np[i] != 0u) pstart[p] = (u32)i;
        if (nq[i] != 0u) qstart[q] = (u32)i;
    }}
}}
SPATE_EXPORT(ENTRY_starts)

// kind 0: row_number, 1: rank (the first row of the row's peers, counted from 1), 2: dense_rank
// (the row's peer run, counted from 1), all within the row's partition.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_numbers(const u32* pid, const u32* qid, const u32* pstart, const u32* qstart, u64 n, u32 kind, u64* out) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u32 s = pstart[pid[i]];
        u64 v;
        if (kind == 0u) v = i - (u64)s + 1ull;
        else if (kind == 1u) v = (u64)qstart[qid[i]] - (u64)s + 1ull;
        else v = (u64)qid[i] - (u64)qid[s] + 1ull;
        out[i] = v;
    }}
}}
SPATE_EXPORT(ENTRY_numbers)

"#
    );
    let names: Vec<String> = ["bounds", "starts", "numbers"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    finish_program(
        &body,
        &names,
        "window",
        &format!("spate::exec::window for {label}"),
    )
}

/// The window functions over one (host-counted, sorted) batch: its columns and one per function.
fn window_batch(
    stream: &DeviceStream,
    kernels: &Kernels,
    aggregate_kernels: Option<&Kernels>,
    plan: &WindowPlan,
    schema: &arrow::datatypes::SchemaRef,
    batch: &DeviceBatch,
) -> Result<DeviceBatch> {
    let n = batch.bound();
    if n == 0 {
        let mut columns = batch.columns().to_vec();
        let width = schema.fields().len() - plan.functions.len();
        for field in &schema.fields()[width..] {
            columns.push(DeviceColumn::nulls(stream, field.data_type(), 0)?);
        }
        return DeviceBatch::try_new(Arc::clone(schema), columns, 0);
    }
    if n >= u32::MAX as usize {
        return Err(SpateError::Unsupported {
            message: format!("a GPU window over one partition of {n} rows (the limit is 2^32 - 2)"),
        });
    }
    let mut args = Vec::with_capacity((plan.partition.len() + plan.order.len()) * 5 + 3);
    for &k in plan.partition.iter().chain(&plan.order) {
        column_args(&batch.columns()[k], &mut args);
    }
    let np = stream.alloc::<u32>(n.max(1))?;
    let nq = stream.alloc::<u32>(n.max(1))?;
    args.extend([KernelArg::U64(n as u64), (&np).into(), (&nq).into()]);
    launch(stream, kernels.get("bounds")?, n, &args)?;
    let (pe, partitions) = spate_kernels::scan::exclusive_sum_with_total(stream, np.slice(..n)?)?;
    let partitions = partitions as usize;
    let qe = spate_kernels::scan::exclusive_sum(stream, nq.slice(..n)?)?;
    let pid = stream.alloc::<u32>(n)?;
    let qid = stream.alloc::<u32>(n)?;
    let pstart = stream.alloc::<u32>(partitions.max(1))?;
    let qstart = stream.alloc::<u32>(n)?;
    launch(
        stream,
        kernels.get("starts")?,
        n,
        &[
            (&np).into(),
            (&nq).into(),
            (&pe).into(),
            (&qe).into(),
            KernelArg::U64(n as u64),
            (&pid).into(),
            (&qid).into(),
            (&pstart).into(),
            (&qstart).into(),
        ],
    )?;
    let per_partition = match (&plan.aggregates, aggregate_kernels) {
        (Some(aggregates), Some(k)) => aggregates.evaluate(stream, k, batch, &pid, partitions)?,
        _ => Vec::new(),
    };
    let mut columns = batch.columns().to_vec();
    let mut gathered: HashMap<usize, DeviceColumn> = HashMap::new();
    if !per_partition.is_empty() {
        // Each row takes its partition's values.
        let indices = pid.slice(..n)?;
        let gathers: Vec<Gather<'_>> = per_partition
            .iter()
            .map(|c| Gather::rows(c, indices))
            .collect();
        gathered = gather_columns(stream, &gathers)?
            .into_iter()
            .enumerate()
            .collect();
    }
    for f in &plan.functions {
        match (f, f.kind()) {
            (Function::Aggregate(k), _) => {
                let column = gathered
                    .get(k)
                    .cloned()
                    .ok_or_else(|| SpateError::Internal {
                        message: format!("the window's aggregate {k} was not computed"),
                    })?;
                columns.push(column);
            }
            (_, Some(kind)) => {
                let out = stream.alloc::<u64>(n)?;
                launch(
                    stream,
                    kernels.get("numbers")?,
                    n,
                    &[
                        (&pid).into(),
                        (&qid).into(),
                        (&pstart).into(),
                        (&qstart).into(),
                        KernelArg::U64(n as u64),
                        KernelArg::U32(kind),
                        (&out).into(),
                    ],
                )?;
                columns.push(DeviceColumn::new(
                    DataType::UInt64,
                    n,
                    0,
                    None,
                    DeviceValues::Fixed {
                        bytes: DeviceBytes::new(out.into_bytes()),
                        width: 8,
                    },
                ));
            }
            (_, None) => unreachable!("every function but an aggregate has a kind"),
        }
    }
    DeviceBatch::try_new(Arc::clone(schema), columns, n)
}

impl DisplayAs for GpuWindowExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuWindowExec {
    fn name(&self) -> &str {
        "GpuWindowExec"
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

impl GpuExec for GpuWindowExec {
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
        let plan = Arc::clone(&self.plan);
        let kernels = Kernels {
            program: Kernels::compile(&gpu, &plan.source, &plan.entries).map_err(to_df)?,
            computed: None,
        };
        let aggregate_kernels = match &plan.aggregates {
            Some(a) => Some(a.kernels(&gpu).map_err(to_df)?),
            None => None,
        };
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let input = collected_input(
            self.input(),
            partition,
            &context,
            &stream,
            &transfer,
            KeepsCounts::never(),
        )?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (schema, input_schema) = (self.schema(), self.input().schema());
        let out = futures::stream::once(async move {
            let batches: Vec<DeviceBatch> = input.try_collect().await?;
            let _timer = baseline.elapsed_compute().timer();
            let all = concat_device_batches(&stream, &input_schema, batches)
                .and_then(|b| b.resolve(&stream))
                .map_err(to_df)?;
            let out = window_batch(
                &stream,
                &kernels,
                aggregate_kernels.as_ref(),
                &plan,
                &schema,
                &all,
            )
            .map_err(to_df)?;
            baseline.record_output(out.bound());
            Ok(out)
        });
        Ok(Box::pin(
            out.try_filter(|b| futures::future::ready(b.bound() > 0)),
        ))
    }
}
