//! `GpuWindowExec`: DataFusion's `WindowAggExec` and `BoundedWindowAggExec` on the GPU, for the
//! ranking functions, aggregates over whole partitions and running aggregates.
//!
//! The input arrives sorted on the partition keys, then on the ORDER BY keys (DataFusion sorts
//! it below, on the GPU too). A partition's device batches are concatenated (keys that are
//! expressions computed into columns appended to each), or, past the window's share of the
//! budget, its whole window partitions so far (`chunks.rs`), then:
//! 1. a generated kernel flags each row that starts a window partition (its partition keys
//!    differ from the previous row's) and each that starts a run of peers (its ORDER BY keys
//!    differ too). Keys compare as DataFusion's partitioning compares them: NULL equals NULL,
//!    floats by their bits (IEEE total order: -0.0 and +0.0 differ), strings by bytes;
//! 2. exclusive scans of the flags number the partitions and the peer runs (one readback: the
//!    number of partitions), and a kernel records the row each starts at;
//! 3. `row_number`, `rank` and `dense_rank` follow from those starts. Aggregates over the whole
//!    partition (a frame from UNBOUNDED PRECEDING to UNBOUNDED FOLLOWING, or a RANGE frame
//!    without ORDER BY) run
//!    as the aggregation's own kernels with the partition's number as the group
//!    (`aggregate::SegmentAggregate`), and are gathered back to the partition's rows. Running
//!    SUM, COUNT, MIN and MAX (UNBOUNDED PRECEDING to CURRENT ROW; ROWS, RANGE or GROUPS) walk each
//!    partition in order on one thread, as DataFusion's accumulators do (`codegen.rs`): many
//!    partitions run in parallel, one huge partition runs alone.
//!
//! Sliding SUM, COUNT, MIN and MAX over `ROWS BETWEEN k PRECEDING AND CURRENT ROW` (pandas'
//! `rolling(k + 1)`) take one thread per row, which folds its frame's rows in order
//! (`codegen::sliding_kernel`; `k` up to `codegen::MAX_SLIDING`): wrapping integer and decimal
//! sums, counts, minima and maxima do not depend on the order of folding. A float sum walks its
//! partition in the `running` kernel instead, adding the entering row and then subtracting the
//! leaving one as DataFusion's sliding accumulator does, so the two agree bit for bit.
//!
//! `lag` and `lead` gather the row `offset` before (after) each row in its partition, NULL
//! past its edges (`shift`); `first_value` and `last_value` gather the row at the frame's edge
//! (`edges`); `percent_rank`, `cume_dist` and `ntile` follow from the partition and peer-run
//! starts (`ratios`, `ntile`).
//!
//! Other frames (sliding RANGE and GROUPS frames, ROWS without ORDER BY), other functions
//! (`nth_value`, ...),
//! lag/lead with a default, IGNORE NULLS, FILTER and DISTINCT window
//! aggregates, float MIN/MAX and float sums over RANGE frames stay on the CPU, with the reason.

mod chunks;
mod codegen;
mod functions;

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{WindowFrameBound, WindowFrameUnits};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::window::{
    PlainAggregateWindowExpr, SlidingAggregateWindowExpr, StandardWindowExpr, WindowExpr,
};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec, WindowUDFExpr};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, InputOrderMode,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::TryStreamExt;
use spate_kernels::{DeviceBuffer, KernelArg, Stream as DeviceStream};

use self::chunks::{Chunks, WINDOW_CHUNKS};
use self::codegen::{Running, RunningKind};
use self::functions::{Starts, edge, ntile, shift};
use super::aggregate::SegmentAggregate;
use super::appended::Appended;
use super::batching::KeepsCounts;
use super::hash_table::{Kernels, launch};
use super::held::HeldBatches;
use super::spill::SpillOptions;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, collected_input, gpu_context,
    to_df,
};
use crate::column::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, Gather, gather_columns,
};
use crate::error::{Result, SpateError};
use crate::expr::{DevType, Unsupported, column_args};

/// What one window expression computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Function {
    RowNumber,
    Rank,
    DenseRank,
    /// Output `k` of the partition aggregates.
    Aggregate(usize),
    /// Running aggregate `k` (`codegen::Running`).
    Running(usize),
    /// `lag` (a positive offset) or `lead` (negative) of input column `column`, NULL outside the
    /// partition.
    Shift {
        column: usize,
        offset: i64,
    },
    /// `percent_rank` or (`cume`) `cume_dist`.
    Ratio {
        cume: bool,
    },
    /// `ntile(buckets)`.
    Ntile(u64),
    /// `first_value` or `last_value` of input column `column`: the value at the row the `edges`
    /// kernel picks (`which`).
    Edge {
        column: usize,
        which: u32,
    },
}

/// What the GPU computes for one window operator.
#[derive(Debug)]
struct WindowPlan {
    /// Partition key columns and ORDER BY key columns, in the batch with the computed keys
    /// appended.
    partition: Vec<usize>,
    order: Vec<usize>,
    /// Keys that are expressions, computed into columns appended to the input batch; the
    /// output leaves them out.
    computed: Option<Appended>,
    functions: Vec<Function>,
    aggregates: Option<SegmentAggregate>,
    running: Vec<Running>,
    /// The input columns the running aggregates read, in the `running` kernel's order.
    running_args: Vec<usize>,
    /// The generated program (`bounds`, `starts`, `numbers`, `running`) and its
    /// `(name, entry)` pairs.
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

/// The window's keys as columns of the input batch with the computed ones appended.
struct Keys<'a> {
    schema: &'a Schema,
    computed: Vec<Arc<dyn PhysicalExpr>>,
}

impl Keys<'_> {
    /// The column of key `e`, and its device type compared by bits.
    fn column(
        &mut self,
        e: &Arc<dyn PhysicalExpr>,
    ) -> std::result::Result<(usize, DevType), Unsupported> {
        let data_type = e
            .data_type(self.schema)
            .map_err(|err| Unsupported(format!("window key `{e}`: {err}")))?;
        let ty = exact(DevType::of(&data_type)).ok_or_else(|| {
            Unsupported(format!(
                "window key `{e}` has type {data_type}, which the GPU does not compare yet"
            ))
        })?;
        if let Some(c) = e.downcast_ref::<Column>() {
            return Ok((c.index(), ty));
        }
        let width = self.schema.fields().len();
        let k = match self.computed.iter().position(|c| c == e) {
            Some(k) => k,
            None => {
                self.computed.push(Arc::clone(e));
                self.computed.len() - 1
            }
        };
        Ok((width + k, ty))
    }
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
        let mut keys = Keys {
            schema: &schema,
            computed: Vec::new(),
        };
        let (mut partition, mut partition_types) = (Vec::new(), Vec::new());
        for e in first.partition_by() {
            let (k, ty) = keys.column(e)?;
            partition.push(k);
            partition_types.push(ty);
        }
        let (mut order, mut order_types) = (Vec::new(), Vec::new());
        for s in first.order_by() {
            let (k, ty) = keys.column(&s.expr)?;
            order.push(k);
            order_types.push(ty);
        }
        let mut functions = Vec::with_capacity(exprs.len());
        let mut aggregates = Vec::new();
        let (mut running, mut running_args) = (Vec::new(), Vec::new());
        for e in exprs {
            if e.partition_by() != first.partition_by() || e.order_by() != first.order_by() {
                return Err(Unsupported(format!(
                    "`{}` has other PARTITION BY or ORDER BY keys than `{}`",
                    e.name(),
                    first.name()
                )));
            }
            functions.push(function(
                e.as_ref(),
                &schema,
                &mut aggregates,
                &mut running,
                &mut running_args,
            )?);
        }
        let aggregates = if aggregates.is_empty() {
            None
        } else {
            Some(SegmentAggregate::try_new(aggregates, input)?)
        };
        let exprs: Vec<&dyn PhysicalExpr> = keys.computed.iter().map(|e| e.as_ref()).collect();
        let computed = Appended::new(&exprs, &schema, "__spate_window_key_")?;
        let (source, entries) = codegen::program(
            &partition_types,
            &order_types,
            &running,
            running_args.len(),
            window.name(),
        );
        let gpu = GpuWindowExec {
            cpu: Arc::clone(&window),
            plan: Arc::new(WindowPlan {
                partition,
                order,
                computed,
                functions,
                aggregates,
                running,
                running_args,
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
                Function::Running(k) => {
                    DevType::of(field.data_type()) == Some(self.plan.running[*k].out_ty)
                }
                // A value of the input column, gathered as it is.
                Function::Shift { column, .. } | Function::Edge { column, .. } => {
                    self.input().schema().field(*column).data_type() == field.data_type()
                }
                Function::Ratio { .. } => field.data_type() == &DataType::Float64,
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

/// What window expression `e` computes on the GPU; an aggregate over the whole partition is
/// added to `aggregates`, a running one to `running` (its argument column to `running_args`).
fn function(
    e: &dyn WindowExpr,
    schema: &Schema,
    aggregates: &mut Vec<Arc<AggregateFunctionExpr>>,
    running: &mut Vec<Running>,
    running_args: &mut Vec<usize>,
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
            "lag" | "lead" => shift(e, standard, &name),
            "percent_rank" => Ok(Function::Ratio { cume: false }),
            "cume_dist" => Ok(Function::Ratio { cume: true }),
            "ntile" => ntile(e, standard),
            "first_value" | "last_value" => edge(e, standard, &name),
            other => Err(Unsupported(format!(
                "window function `{other}` does not run on the GPU yet"
            ))),
        };
    }
    // Whether the aggregate has a FILTER: DataFusion 55 keeps `AggregateWindowExpr::filter_expr`
    // in a private module, so its Debug form (`filter: Some(..)`) tells.
    let filtered = |debug: String| !debug.contains("filter: None");
    let (aggregate, filtered) =
        if let Some(a) = e.as_any().downcast_ref::<PlainAggregateWindowExpr>() {
            (a.get_aggregate_expr(), filtered(format!("{a:?}")))
        } else if let Some(a) = e.as_any().downcast_ref::<SlidingAggregateWindowExpr>() {
            (a.get_aggregate_expr(), filtered(format!("{a:?}")))
        } else {
            return Err(Unsupported(format!(
                "window expression `{}` does not run on the GPU yet",
                e.name()
            )));
        };
    if filtered {
        return Err(Unsupported(format!(
            "`{}`: a window aggregate's FILTER does not run on the GPU yet",
            e.name()
        )));
    }
    if aggregate.is_distinct() {
        return Err(Unsupported(format!(
            "`{}`: a DISTINCT window aggregate does not run on the GPU yet",
            e.name()
        )));
    }
    let frame = e.get_window_frame();
    if !frame.start_bound.is_unbounded() {
        let preceding = sliding_rows(e, frame)?;
        let r = running_aggregate(e, aggregate, schema, running_args)?;
        running.push(Running {
            preceding: Some(preceding),
            ..r
        });
        return Ok(Function::Running(running.len() - 1));
    }
    // The whole partition: a frame to the last row, or a RANGE or GROUPS frame without ORDER
    // BY (every row a peer of every other). A ROWS frame without ORDER BY runs in the
    // input's order, which nothing fixes.
    let peers_only = e.order_by().is_empty() && frame.units != WindowFrameUnits::Rows;
    if frame.end_bound.is_unbounded() || peers_only {
        aggregates.push(Arc::new(aggregate.clone()));
        return Ok(Function::Aggregate(aggregates.len() - 1));
    }
    if e.order_by().is_empty() {
        return Err(Unsupported(format!(
            "`{}`: a running aggregate without ORDER BY follows the input's order (frame \
             {frame})",
            e.name()
        )));
    }
    if !matches!(frame.end_bound, WindowFrameBound::CurrentRow) {
        return Err(Unsupported(format!(
            "`{}`: this frame does not run on the GPU yet (frame {frame})",
            e.name()
        )));
    }
    let r = running_aggregate(e, aggregate, schema, running_args)?;
    // RANGE and GROUPS frames end at the current row's last peer.
    running.push(Running {
        range: frame.units != WindowFrameUnits::Rows,
        ..r
    });
    if running
        .last()
        .is_some_and(|r| r.range && r.kind == RunningKind::SumF64)
    {
        // DataFusion adds a run of peers as one batch sum, in an order of its own.
        return Err(Unsupported(format!(
            "`{}`: a float sum over a RANGE or GROUPS frame adds peers in the CPU's own order",
            e.name()
        )));
    }
    Ok(Function::Running(running.len() - 1))
}

/// The rows before the current one in a sliding frame the GPU folds: `ROWS BETWEEN k
/// PRECEDING AND CURRENT ROW` with an ORDER BY and `k` up to `codegen::MAX_SLIDING`.
fn sliding_rows(
    e: &dyn WindowExpr,
    frame: &datafusion::logical_expr::WindowFrame,
) -> std::result::Result<u64, Unsupported> {
    let unsupported = |why: &str| {
        Err(Unsupported(format!(
            "`{}`: {why} (frame {frame})",
            e.name()
        )))
    };
    if frame.units != WindowFrameUnits::Rows {
        return unsupported("sliding RANGE and GROUPS frames do not run on the GPU yet");
    }
    if e.order_by().is_empty() {
        return unsupported("a sliding frame without ORDER BY follows the input's order");
    }
    let (WindowFrameBound::Preceding(start), WindowFrameBound::CurrentRow) =
        (&frame.start_bound, &frame.end_bound)
    else {
        return unsupported(
            "this frame does not run on the GPU yet (sliding frames from k PRECEDING to CURRENT \
             ROW do)",
        );
    };
    let k = match start {
        datafusion::common::ScalarValue::UInt64(Some(k)) => *k,
        _ => return unsupported("the frame's start is not a row count"),
    };
    if k > codegen::MAX_SLIDING {
        return unsupported(&format!(
            "sliding frames over {} rows run on the CPU",
            codegen::MAX_SLIDING
        ));
    }
    Ok(k)
}

/// A running SUM, COUNT, MIN or MAX of a column (or COUNT(*)).
fn running_aggregate(
    e: &dyn WindowExpr,
    aggregate: &AggregateFunctionExpr,
    schema: &Schema,
    running_args: &mut Vec<usize>,
) -> std::result::Result<Running, Unsupported> {
    let unsupported = |why: &str| Unsupported(format!("`{}`: {why}", e.name()));
    let name = aggregate.fun().name().to_ascii_lowercase();
    if aggregate.is_distinct() {
        return Err(unsupported(
            "a running DISTINCT aggregate does not run on the GPU yet",
        ));
    }
    let out_ty = DevType::of(aggregate.field().data_type())
        .ok_or_else(|| unsupported("its result type does not run on the GPU"))?;
    let exprs = aggregate.expressions();
    let [arg] = exprs.as_slice() else {
        return Err(unsupported("it takes several arguments"));
    };
    let column = match arg.downcast_ref::<Column>() {
        Some(c) => Some(c.index()),
        None if name == "count"
            && arg
                .downcast_ref::<Literal>()
                .is_some_and(|l| !l.value().is_null()) =>
        {
            None
        }
        None => return Err(unsupported("its argument is not a column")),
    };
    let arg_ty = match column {
        Some(c) => DevType::of(schema.field(c).data_type())
            .ok_or_else(|| unsupported("its argument's type does not run on the GPU"))?,
        None => out_ty,
    };
    let int64 = DevType::Int {
        bits: 64,
        signed: true,
    };
    let kind = match (name.as_str(), arg_ty, out_ty) {
        ("sum", DevType::Int { .. }, o) if o == int64 => RunningKind::SumInt,
        ("sum", DevType::Dec { scale: a, .. }, DevType::Dec { scale: o, .. }) if a == o => {
            RunningKind::SumDec
        }
        ("sum", DevType::F64, DevType::F64) => RunningKind::SumF64,
        ("count", _, o) if o == int64 => RunningKind::Count,
        ("min" | "max", DevType::Int { .. } | DevType::Dec { .. }, o) if o == arg_ty => {
            if name == "min" {
                RunningKind::Min
            } else {
                RunningKind::Max
            }
        }
        _ => {
            return Err(unsupported(
                "this running aggregate does not run on the GPU yet (SUM, COUNT and, \
                 except on floats, MIN and MAX do)",
            ));
        }
    };
    let arg = column.map(|c| {
        running_args.push(c);
        running_args.len() - 1
    });
    Ok(Running {
        kind,
        arg,
        arg_ty,
        out_ty,
        out_type: aggregate.field().data_type().clone(),
        range: false,
        preceding: None,
    })
}

/// The window functions over one (host-counted, sorted) batch: its input columns and one per
/// function.
fn window_batch(
    stream: &DeviceStream,
    kernels: &Kernels,
    aggregate_kernels: Option<&Kernels>,
    plan: &WindowPlan,
    schema: &SchemaRef,
    batch: &DeviceBatch,
) -> Result<DeviceBatch> {
    let n = batch.bound();
    let width = schema.fields().len() - plan.functions.len();
    let mut columns = batch.columns()[..width].to_vec();
    if n == 0 {
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
    let Bounds {
        nq,
        pid,
        qid,
        pstart,
        qstart,
        partitions,
    } = bounds(stream, kernels, plan, batch)?;
    // Aggregates over whole partitions: each row takes its partition's values.
    let per_partition = match (&plan.aggregates, aggregate_kernels) {
        (Some(aggregates), Some(k)) => aggregates.evaluate(stream, k, batch, &pid, partitions)?,
        _ => Vec::new(),
    };
    let gathers: Vec<Gather<'_>> = per_partition
        .iter()
        .map(|c| Gather::rows(c, pid.as_slice()))
        .collect();
    let gathered = if gathers.is_empty() {
        Vec::new()
    } else {
        gather_columns(stream, &gathers)?
    };
    let running = running_columns(stream, kernels, plan, batch, &pstart, &pid, partitions, &nq)?;
    for f in &plan.functions {
        let column = match *f {
            Function::Aggregate(k) => gathered.get(k).cloned(),
            Function::Running(k) => running.get(k).cloned(),
            _ => functions::column(
                stream,
                kernels,
                *f,
                batch,
                &Starts {
                    pid: &pid,
                    qid: &qid,
                    pstart: &pstart,
                    qstart: &qstart,
                    partitions,
                },
            )?,
        };
        columns.push(column.ok_or_else(|| SpateError::Internal {
            message: format!("the window's {f:?} was not computed"),
        })?);
    }
    DeviceBatch::try_new(Arc::clone(schema), columns, n)
}

/// Where `batch`'s window partitions and peer runs start (one readback: the number of
/// partitions).
struct Bounds {
    /// 1 where a run of peers starts.
    nq: DeviceBuffer<u32>,
    /// Each row's partition and peer run.
    pid: DeviceBuffer<u32>,
    qid: DeviceBuffer<u32>,
    /// The row each partition and each peer run starts at.
    pstart: DeviceBuffer<u32>,
    qstart: DeviceBuffer<u32>,
    partitions: usize,
}

/// The [`Bounds`] of a batch of at least one row.
fn bounds(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &WindowPlan,
    batch: &DeviceBatch,
) -> Result<Bounds> {
    let n = batch.bound();
    let mut args = Vec::with_capacity((plan.partition.len() + plan.order.len()) * 5 + 3);
    for &k in plan.partition.iter().chain(&plan.order) {
        column_args(&batch.columns()[k], &mut args);
    }
    let np = stream.alloc::<u32>(n)?;
    let nq = stream.alloc::<u32>(n)?;
    args.extend([KernelArg::U64(n as u64), (&np).into(), (&nq).into()]);
    launch(stream, kernels.get("bounds")?, n, &args)?;
    let (pe, partitions) = spate_kernels::scan::exclusive_sum_with_total(stream, np.as_slice())?;
    let partitions = partitions as usize;
    let qe = spate_kernels::scan::exclusive_sum(stream, nq.as_slice())?;
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
    Ok(Bounds {
        nq,
        pid,
        qid,
        pstart,
        qstart,
        partitions,
    })
}

/// The row the last window partition of `batch` (at least one row) starts at: the rows before
/// it are whole partitions, when the input is sorted on the partition keys.
fn last_partition_start(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &WindowPlan,
    batch: &DeviceBatch,
) -> Result<usize> {
    let b = bounds(stream, kernels, plan, batch)?;
    let mut start = [0u32];
    stream.copy_to_host(
        b.pstart
            .as_slice()
            .slice(b.partitions.saturating_sub(1)..b.partitions.max(1))?,
        &mut start,
    )?;
    Ok(start[0] as usize)
}

/// The running aggregates' columns over `batch` (one `running` launch for all of them).
fn running_columns(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &WindowPlan,
    batch: &DeviceBatch,
    pstart: &DeviceBuffer<u32>,
    pid: &DeviceBuffer<u32>,
    partitions: usize,
    nq: &DeviceBuffer<u32>,
) -> Result<Vec<DeviceColumn>> {
    if plan.running.is_empty() {
        return Ok(Vec::new());
    }
    let n = batch.bound();
    let mut columns = Vec::new();
    for &c in &plan.running_args {
        column_args(&batch.columns()[c], &mut columns);
    }
    let mut outputs = Vec::with_capacity(plan.running.len());
    let mut out_args: Vec<KernelArg> = Vec::with_capacity(2 * plan.running.len());
    for r in &plan.running {
        let width = r.out_type.primitive_width().unwrap_or(8);
        let values = stream.alloc::<u8>((n * width).max(16))?;
        let validity = stream.alloc_zeroed::<u8>(spate_kernels::gather::bitmap_bytes(n).max(4))?;
        outputs.push((values, validity, width));
    }
    for (values, validity, _) in &outputs {
        out_args.push(values.into());
        out_args.push(validity.into());
    }
    // Aggregates from the partition's first row, and sliding float sums: one thread per
    // partition.
    if plan.running.iter().any(|r| !r.per_row()) {
        let mut args = columns.clone();
        args.extend([
            pstart.into(),
            KernelArg::U64(partitions as u64),
            nq.into(),
            KernelArg::U64(n as u64),
        ]);
        args.extend(out_args.iter().copied());
        launch(stream, kernels.get("running")?, partitions, &args)?;
    }
    // The other sliding frames: one thread per row.
    if plan.running.iter().any(Running::per_row) {
        let mut args = columns;
        args.extend([pstart.into(), pid.into(), KernelArg::U64(n as u64)]);
        args.extend(out_args);
        launch(stream, kernels.get("sliding")?, n, &args)?;
    }
    Ok(outputs
        .into_iter()
        .zip(&plan.running)
        .map(|((values, validity, width), r)| {
            DeviceColumn::with_uncounted_nulls(
                r.out_type.clone(),
                n,
                Some(DeviceValidity {
                    bytes: DeviceBytes::new(validity),
                    offset: 0,
                }),
                DeviceValues::Fixed {
                    bytes: DeviceBytes::new(values),
                    width,
                },
            )
        })
        .collect())
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
        let keys_kernel = match &plan.computed {
            Some(c) => Some(c.kernel(&gpu).map_err(to_df)?),
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
        let input_schema = self.input().schema();
        // The held rows: the input's, with computed keys appended to each batch.
        let wide = plan
            .computed
            .as_ref()
            .map_or(input_schema, |c| Arc::clone(c.wide()));
        let limit = crate::exec::memory::state_limit(&gpu, context.session_config().options());
        let spill = SpillOptions::new(&context, self.name(), &self.metrics, partition)?;
        // The held input waits on the device, where the coordinator may move it to the host
        // for an operator below that runs out (`held.rs`).
        let held = HeldBatches::register(&gpu, Arc::clone(&stream), &spill);
        let cuts = MetricBuilder::new(&self.metrics).counter(WINDOW_CHUNKS, partition);
        let run = Run {
            input,
            chunks: Chunks::new(held, wide, &plan, limit, cuts),
            stream,
            kernels,
            aggregate_kernels,
            keys_kernel,
            plan,
            schema: self.schema(),
            baseline,
        };
        let out = futures::stream::unfold(Some(run), |run| async move {
            let mut run = run?;
            loop {
                let batch = match run.input.try_next().await {
                    Ok(batch) => batch,
                    Err(e) => return Some((Err(e), None)),
                };
                let elapsed = run.baseline.elapsed_compute().clone();
                let _timer = elapsed.timer();
                let (rows, last) = match run.rows(batch) {
                    Ok(Some(rows)) => rows,
                    Ok(None) => continue,
                    Err(e) => return Some((Err(to_df(e)), None)),
                };
                let out = window_batch(
                    &run.stream,
                    &run.kernels,
                    run.aggregate_kernels.as_ref(),
                    &run.plan,
                    &run.schema,
                    &rows,
                )
                .map_err(to_df);
                drop(rows);
                if let Ok(out) = &out {
                    run.baseline.record_output(out.bound());
                }
                let next = (!last && out.is_ok()).then_some(run);
                return Some((out, next));
            }
        });
        Ok(Box::pin(
            out.try_filter(|b| futures::future::ready(b.bound() > 0)),
        ))
    }
}

/// A window partition running: its input, what it holds, and how it computes.
struct Run {
    input: DeviceBatchStream,
    chunks: Chunks,
    stream: Arc<DeviceStream>,
    kernels: Kernels,
    aggregate_kernels: Option<Kernels>,
    keys_kernel: Option<spate_kernels::Kernel>,
    plan: Arc<WindowPlan>,
    schema: SchemaRef,
    baseline: BaselineMetrics,
}

impl Run {
    /// Takes the next input batch (`None` at the end): the rows to window now, and whether
    /// they are the last, or `None` while the window holds them.
    fn rows(&mut self, batch: Option<DeviceBatch>) -> Result<Option<(DeviceBatch, bool)>> {
        let Some(batch) = batch else {
            return Ok(Some((self.chunks.take(&self.stream)?, true)));
        };
        let batch = batch.resolve(&self.stream)?;
        let batch = match (&self.plan.computed, &self.keys_kernel) {
            (Some(c), Some(kernel)) => c.append(&self.stream, kernel, batch)?,
            _ => batch,
        };
        let whole = self
            .chunks
            .push(&self.stream, (&self.kernels, &self.plan), batch)?;
        Ok(whole.map(|rows| (rows, false)))
    }
}
