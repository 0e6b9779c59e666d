//! `GpuAggregateExec`: DataFusion's `AggregateExec` (hash aggregation) on the GPU.
//!
//! Per batch of rows:
//! 1. group keys and aggregate arguments are input columns, or computed by one generated value
//!    kernel (the expression JIT);
//! 2. with group keys, every row is hashed and inserted into an open-addressing table (the
//!    one joins share, `exec::hash_table`); the occupied slots, numbered by a prefix scan, are
//!    the groups (in hash order: results equal the CPU's up to row order, which only an
//!    ORDER BY fixes);
//! 3. one generated kernel folds every row into its group's accumulators with atomics (in
//!    shared memory first when there are few groups), and another turns the accumulators into
//!    output columns;
//! 4. the key columns are gathered from each group's first row.
//!
//! Modes: `Partial` (and `PartialReduce`) aggregates each input batch on its own and emits
//! partial states; `Final`, `FinalPartitioned`, `Single` and `SinglePartitioned` concatenate
//! their partition's batches on the device and aggregate once. State layouts and result types
//! are DataFusion's (`state_fields()`, `field()`), so a GPU partial stage can feed a CPU final
//! stage and the other way round.
//!
//! Aggregates: SUM (Int64/UInt64 wrapping, Float64, Decimal128 wrapping as DataFusion's
//! `add_wrapping`), COUNT and COUNT(*), MIN/MAX (integers, dates, times, timestamps,
//! Decimal128 up to precision 18, and floats without GROUP BY, in IEEE total order as
//! DataFusion's ungrouped MIN/MAX; its grouped float MIN/MAX depends on row order) and AVG (Float64, and Decimal128 up to
//! precision 24, so that `sum * 10^shift` cannot overflow where the CPU would raise an error).
//! COUNT(DISTINCT x) (not on floats) runs in single-stage aggregations (`Single`,
//! `SinglePartitioned`): a second hash table over (group keys, x) finds the distinct pairs.
//! In two-stage plans its partial state is a list, which stays on the CPU; DataFusion rewrites
//! a query's single COUNT(DISTINCT x) into a two-level GROUP BY, which runs here anyway. FILTER
//! clauses and ordered aggregates stay on the CPU. Grouping sets (ROLLUP, CUBE) run in the first
//! phase: each row once per set, its left-out keys NULL, with DataFusion's `__grouping_id`.
//! VAR/STDDEV keep DataFusion's (count, mean, m2) state, m2 computed in a second pass. A
//! GROUP BY with a pushed-down LIMIT computes every group; the limit above keeps k.
//!
//! Float sums are added in a different order than on the CPU, so they agree within rounding,
//! not bit for bit. Dynamic filters this aggregate would publish (MIN/MAX bounds for the scan)
//! are not updated on the GPU: they keep their initial, pass-everything value, which is correct
//! and only forgoes the pruning.

pub(crate) mod codegen;
mod fallback;
mod outgrown;
mod partitioned;
mod plan;
mod segments;
mod sets;
mod staged;

pub(crate) use segments::SegmentAggregate;

use self::fallback::states_on_cpu;
use self::outgrown::Outgrown;
use self::partitioned::Partitioned;
use self::plan::{AggPlan, analyze};
use self::sets::{empty_sets_batch, expand_sets};
use self::staged::{Staged, Stages};

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};
use spate_kernels::gather::bitmap_bytes;
use spate_kernels::{DeviceBuffer, KernelArg, Stream as DeviceStream};

use self::codegen::SlotKind;
use super::batching::KeepsCounts;
use super::hash_table::{Kernels, group_rows, launch};
use super::held::HeldBatches;
use super::retry::{Retry, Where};
use super::sort::Sorter;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, collected_input, device_input, gpu_context,
    per_batch_input, rebuild_gpu, to_df,
};
use crate::column::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, Gather, RowCount,
    concat_device_batches, gather_columns,
};
use crate::error::{Result, SpateError};
use crate::expr::{DevType, Unsupported, column_args};

/// An aggregation running on the GPU.
#[derive(Debug)]
pub struct GpuAggregateExec {
    cpu: Arc<AggregateExec>,
    plan: Arc<AggPlan>,
    /// How it runs when its input outgrows its share of the device budget (`staged.rs`):
    /// planned the first time an input does, never for aggregations that fit.
    stages: Arc<std::sync::OnceLock<Option<Arc<Stages>>>>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuAggregateExec {
    /// The GPU version of `aggregate`, or why it must stay on the CPU.
    pub fn try_new(aggregate: Arc<AggregateExec>) -> std::result::Result<Self, Unsupported> {
        let plan = analyze(&aggregate)?;
        Ok(GpuAggregateExec {
            stages: Arc::new(std::sync::OnceLock::new()),
            cpu: aggregate,
            plan: Arc::new(plan),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        rebuild_gpu::<AggregateExec, _>(cpu, GpuAggregateExec::try_new)
    }

    /// The CPU aggregation this one computes.
    pub fn cpu(&self) -> &Arc<AggregateExec> {
        &self.cpu
    }
}

/// An aggregation without group keys ([`AggPlan::folds`]): each input batch is folded into the
/// accumulators as it comes, up to its row count, which may stay on the device; the one
/// output row is finished after the last.
fn fold(
    input: DeviceBatchStream,
    stream: Arc<DeviceStream>,
    kernels: Arc<Kernels>,
    plan: Arc<AggPlan>,
    schema: SchemaRef,
    baseline: BaselineMetrics,
) -> DeviceBatchStream {
    Box::pin(futures::stream::once(async move {
        let acc = Accumulators::new(&stream, &plan, 1).map_err(to_df)?;
        let mut input = input;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            if batch.is_certainly_empty() {
                continue;
            }
            let (_, args) = plan.operands(&stream, &kernels, &batch).map_err(to_df)?;
            acc.update(&stream, &kernels, &args, batch.row_count(), None, 1)
                .map_err(to_df)?;
        }
        let _timer = baseline.elapsed_compute().timer();
        let columns = finish_outputs(&stream, &kernels, &plan, &schema, 1, &acc.acc, &acc.seen)
            .map_err(to_df)?;
        let out = DeviceBatch::try_new(schema, columns, 1).map_err(to_df)?;
        baseline.record_output(1);
        Ok(out)
    }))
}

/// Aggregates one device batch into one batch of groups.
fn aggregate_batch(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    schema: &SchemaRef,
    batch: &DeviceBatch,
) -> Result<DeviceBatch> {
    // The grouping kernels size their tables by the row count: it must be on the host.
    let batch = &batch.resolve(stream)?;
    let n = batch.bound();
    if n >= u32::MAX as usize {
        return Err(SpateError::Unsupported {
            message: format!(
                "a GPU aggregation over one batch of {n} rows (the limit is 2^32 - 2)"
            ),
        });
    }
    let (keys, args) = plan.operands(stream, kernels, batch)?;
    // Grouping sets: every row once per set, with the set's keys NULL and its id.
    let (keys, args, n) = if plan.spec.sets.is_empty() {
        (keys, args, n)
    } else {
        expand_sets(stream, kernels, plan, keys, args, n)?
    };
    let rows = RowCount::Host(n);
    let row_count = if plan.spec.sets.is_empty() {
        batch.row_count()
    } else {
        &rows
    };

    let (gid, reps, groups) = if keys.is_empty() {
        (None, None, 1)
    } else {
        let (gid, reps, groups) = group_rows(stream, kernels, ("hash", "build"), &keys, n)?;
        (Some(gid), Some(reps), groups)
    };

    let acc = Accumulators::new(stream, plan, groups)?;
    if groups > 0 {
        acc.update(stream, kernels, &args, row_count, gid.as_ref(), groups)?;
    }
    let Accumulators { acc, seen } = acc;
    for (j, slot) in plan.spec.slots.iter().enumerate() {
        let (SlotKind::CountDistinct, Some(arg)) = (slot.kind, slot.arg) else {
            continue;
        };
        if n == 0 {
            continue;
        }
        let value = &args[arg];
        let mut pair = keys.clone();
        pair.push(value.clone());
        let (hash, build) = (format!("dhash{j}"), format!("dbuild{j}"));
        let (_, pair_reps, distinct) = group_rows(stream, kernels, (&hash, &build), &pair, n)?;
        let (valid, offset) = match value.validity() {
            Some(v) => (
                KernelArg::Ptr(v.bytes.as_slice().address()),
                v.offset as u64,
            ),
            None => (KernelArg::null(), 0),
        };
        launch(
            stream,
            kernels.get(&format!("dcount{j}"))?,
            distinct,
            &[
                valid,
                KernelArg::U64(offset),
                (&pair_reps).into(),
                KernelArg::U64(distinct as u64),
                gid.as_ref().into(),
                KernelArg::U64(groups as u64),
                (&acc).into(),
            ],
        )?;
    }

    let mut columns = Vec::with_capacity(keys.len() + plan.spec.outputs.len());
    match &reps {
        Some(reps) => {
            let reps = reps.slice(..groups)?;
            // One readback for the byte totals of all the string keys.
            let gathers: Vec<Gather<'_>> = keys.iter().map(|k| Gather::rows(k, reps)).collect();
            let gathered = gather_columns(stream, &gathers)?;
            for (column, ty) in gathered.into_iter().zip(&plan.spec.keys) {
                if matches!(ty, DevType::F32 | DevType::F64)
                    && let DeviceValues::Fixed { bytes, width } = column.values()
                {
                    // The gathered column is new, so folding -0.0 in place touches no input.
                    launch(
                        stream,
                        kernels.get("canon")?,
                        groups,
                        &[
                            KernelArg::Ptr(bytes.as_slice().address()),
                            KernelArg::U64(groups as u64),
                            KernelArg::U64(*width as u64),
                        ],
                    )?;
                }
                columns.push(column);
            }
        }
        None => debug_assert!(keys.is_empty()),
    }
    columns.extend(finish_outputs(
        stream, kernels, plan, schema, groups, &acc, &seen,
    )?);
    DeviceBatch::try_new(Arc::clone(schema), columns, groups)
}

/// The accumulators of an aggregation: `acc` words and `seen` flags for `groups` groups,
/// zeroed (see `codegen`'s module docs).
struct Accumulators {
    acc: DeviceBuffer<u64>,
    seen: DeviceBuffer<u32>,
}

impl Accumulators {
    fn new(stream: &DeviceStream, plan: &AggPlan, groups: usize) -> Result<Self> {
        Ok(Accumulators {
            acc: stream.alloc_zeroed::<u64>((plan.program.words * groups).max(1))?,
            seen: stream.alloc_zeroed::<u32>((plan.spec.slots.len() * groups).max(1))?,
        })
    }

    /// Folds the rows of `args` (up to `rows`, whose count may be on the device) into the
    /// accumulators, row `i` into group `gid[i]` (all into group 0 without `gid`).
    fn update(
        &self,
        stream: &DeviceStream,
        kernels: &Kernels,
        args: &[DeviceColumn],
        rows: &RowCount,
        gid: Option<&DeviceBuffer<u32>>,
        groups: usize,
    ) -> Result<()> {
        if self.seen.is_empty() || args.iter().any(|a| a.len() != rows.bound()) {
            return Err(SpateError::Internal {
                message: "aggregate arguments of another length than their rows".into(),
            });
        }
        let n = rows.bound();
        let mut a = Vec::with_capacity(args.len() * 5 + 6);
        for c in args {
            column_args(c, &mut a);
        }
        a.extend([
            rows.live_arg(),
            KernelArg::U64(n as u64),
            gid.into(),
            KernelArg::U64(groups as u64),
            (&self.acc).into(),
            (&self.seen).into(),
        ]);
        launch(stream, kernels.get("update")?, n, &a)?;
        if kernels.program.contains_key("second") {
            // The same arguments, without `seen`, once every first-pass word is final: the
            // low words of wide MIN/MAX, variance's m2.
            a.pop();
            launch(stream, kernels.get("second")?, n, &a)?;
        }
        Ok(())
    }
}

/// The aggregate output columns of `groups` groups, from their accumulators (no readback: the
/// null counts stay on the device until a host consumer asks for them).
fn finish_outputs(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    schema: &SchemaRef,
    groups: usize,
    acc: &DeviceBuffer<u64>,
    seen: &DeviceBuffer<u32>,
) -> Result<Vec<DeviceColumn>> {
    let mut outputs = Vec::with_capacity(plan.spec.outputs.len());
    let mut a = vec![KernelArg::U64(groups as u64), acc.into(), seen.into()];
    for (j, (_, ty)) in plan.spec.outputs.iter().enumerate() {
        let field = schema.field(plan.spec.keys.len() + j);
        // Width 0: a boolean output, a bitmap.
        let width = match ty {
            DevType::Int { bits, .. } => usize::from(*bits) / 8,
            DevType::F32 => 4,
            DevType::F64 => 8,
            DevType::Dec { .. } => 16,
            DevType::Bool => 0,
            DevType::Str => {
                return Err(SpateError::Internal {
                    message: format!("a GPU aggregate output is {}", field.data_type()),
                });
            }
        };
        let data = if width == 0 {
            stream.alloc::<u8>(bitmap_bytes(groups).max(4))?
        } else {
            stream.alloc::<u8>((groups * width).max(16))?
        };
        // No bitmap for an output that cannot be null (COUNT); the kernel skips a null one.
        let valid = match plan.program.nullable.get(j) {
            Some(false) => None,
            _ => Some(stream.alloc::<u8>(bitmap_bytes(groups).max(4))?),
        };
        a.push((&data).into());
        a.push(valid.as_ref().into());
        outputs.push((data, valid, width, field.data_type().clone()));
    }
    launch(stream, kernels.get("finish")?, groups, &a)?;
    let mut columns = Vec::with_capacity(outputs.len());
    for (data, valid, width, data_type) in outputs {
        let validity = valid.map(|valid| DeviceValidity {
            bytes: DeviceBytes::new(valid),
            offset: 0,
        });
        let values = if width == 0 {
            DeviceValues::Bits {
                bytes: DeviceBytes::new(data),
                offset: 0,
            }
        } else {
            DeviceValues::Fixed {
                bytes: DeviceBytes::new(data),
                width,
            }
        };
        columns.push(DeviceColumn::with_uncounted_nulls(
            data_type, groups, validity, values,
        ));
    }
    Ok(columns)
}

impl DisplayAs for GpuAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuAggregateExec {
    fn name(&self) -> &str {
        "GpuAggregateExec"
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

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.cpu.input_distribution_requirements()
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        self.cpu.benefits_from_input_partitioning()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::LowerEqual
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

impl GpuExec for GpuAggregateExec {
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
        let kernels = Arc::new(self.plan.kernels(&gpu).map_err(to_df)?);
        let transfer = TransferMetrics::new(&self.metrics, partition);
        if self.plan.folds() {
            let input = device_input(self.cpu.input(), partition, &context, &stream, &transfer)?;
            return Ok(fold(
                input,
                stream,
                kernels,
                Arc::clone(&self.plan),
                self.schema(),
                BaselineMetrics::new(&self.metrics, partition),
            ));
        }
        let input = if self.plan.per_batch {
            per_batch_input(
                self.cpu.input(),
                partition,
                &context,
                &stream,
                &transfer,
                KeepsCounts::never(),
            )?
        } else {
            collected_input(
                self.cpu.input(),
                partition,
                &context,
                &stream,
                &transfer,
                KeepsCounts::never(),
            )?
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let plan = Arc::clone(&self.plan);
        let schema = self.schema();
        let grouped = !plan.keys.is_empty();
        // Groups sorted by the order the output keeps. Per batch, that is still the order of
        // the whole output: over sorted input a later batch's groups come after an earlier's.
        let sorter = match &plan.order {
            Some(keys) => Some(Arc::new(Sorter::new(&gpu, keys.clone()).map_err(to_df)?)),
            None => None,
        };
        let ordered = move |stream: &DeviceStream, out: DeviceBatch| match &sorter {
            Some(sorter) => sorter.sort(stream, &out),
            None => Ok(out),
        };
        if plan.per_batch {
            // Whether any group came out: a partition that saw no rows still produces the
            // groups of its empty grouping sets, at the end.
            let produced = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (seen, last) = (Arc::clone(&produced), Arc::clone(&stream));
            let (last_kernels, last_plan, last_schema) =
                (Arc::clone(&kernels), Arc::clone(&plan), Arc::clone(&schema));
            // States of a batch that runs out of device memory come from its halves: partial
            // states of one group in two batches merge downstream as any others do. A piece
            // that still runs out gets its states from DataFusion's partial aggregation.
            let retry = Retry::new(gpu, Arc::clone(&stream), &self.metrics, partition);
            let cpu = Arc::clone(&self.cpu);
            let out = input.map(move |batch| {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                retry.run(&batch, &mut |piece, at| {
                    let out = match at {
                        Where::Gpu => aggregate_batch(&stream, &kernels, &plan, &schema, piece)
                            .map_err(to_df)?,
                        Where::Cpu => retry
                            .on_cpu(piece, &schema, |rows| states_on_cpu(&cpu, &context, rows))?,
                    };
                    let out = ordered(&stream, out).map_err(to_df)?;
                    baseline.record_output(out.bound());
                    if out.bound() > 0 {
                        seen.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(out)
                })
            });
            let out = crate::exec::retry::flatten(out);
            let empty_sets = futures::stream::once(async move {
                if produced.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(None);
                }
                empty_sets_batch(&last, &last_kernels, &last_plan, &last_schema).map_err(to_df)
            })
            .filter_map(|b: DFResult<Option<DeviceBatch>>| futures::future::ready(b.transpose()));
            return Ok(Box::pin(
                out.chain(empty_sets)
                    .try_filter(|b| futures::future::ready(b.bound() > 0)),
            ));
        }
        let input_schema = self.cpu.input().schema();
        let options = context.session_config().options();
        let limit = crate::exec::memory::state_limit(&gpu, options);
        let spill =
            crate::exec::spill::SpillOptions::new(&context, self.name(), &self.metrics, partition)?;
        let (stages, cpu) = (Arc::clone(&self.stages), Arc::clone(&self.cpu));
        // The collected input waits on the device, where the coordinator may move it to the
        // host for an operator below that runs out (`held.rs`).
        let batches = HeldBatches::register(&gpu, Arc::clone(&stream), &spill);
        let once = futures::stream::once(async move {
            let mut input = input;
            let mut bytes = 0usize;
            let mut outgrown: Option<Outgrown> = None;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                if let Some(outgrown) = &mut outgrown {
                    outgrown.push(&batch).map_err(to_df)?;
                    continue;
                }
                bytes += crate::exec::memory::with_table(&batch);
                batches.push(batch);
                if !crate::exec::memory::should_spill(bytes, limit, stream.device()) {
                    continue;
                }
                // Past the operator's share of the budget: aggregate in stages, or partition
                // by partition where stages do not apply.
                let mut taken = if let Some(stages) =
                    stages.get_or_init(|| Stages::of(&cpu, &plan).map(Arc::new))
                {
                    Outgrown::Staged(Box::new(
                        Staged::new(
                            Arc::clone(stages),
                            &gpu,
                            Arc::clone(&stream),
                            limit,
                            spill.clone(),
                        )
                        .map_err(to_df)?,
                    ))
                } else if partitioned::applies(&plan) {
                    Outgrown::Partitioned(Box::new(Partitioned::new(
                        (Arc::clone(&plan), Arc::clone(&kernels)),
                        Arc::clone(&stream),
                        (Arc::clone(&input_schema), Arc::clone(&schema)),
                        limit,
                        spill.clone(),
                    )))
                } else {
                    continue;
                };
                batches.drain(|b| taken.push(&b)).map_err(to_df)?;
                outgrown = Some(taken);
            }
            if let Some(outgrown) = outgrown {
                let finishing = {
                    let _timer = baseline.elapsed_compute().timer();
                    outgrown.finish().map_err(to_df)?
                };
                let out = futures::stream::unfold(Some(finishing), move |state| {
                    let baseline = baseline.clone();
                    async move {
                        let mut finishing = state?;
                        let _timer = baseline.elapsed_compute().timer();
                        match finishing.next_batch() {
                            Ok(Some(out)) => {
                                baseline.record_output(out.bound());
                                Some((Ok(out), Some(finishing)))
                            }
                            Ok(None) => None,
                            Err(e) => Some((Err(to_df(e)), None)),
                        }
                    }
                });
                return Ok::<DeviceBatchStream, datafusion::error::DataFusionError>(Box::pin(out));
            }
            let _timer = baseline.elapsed_compute().timer();
            let batches = batches.take().map_err(to_df)?;
            let all = concat_device_batches(&stream, &input_schema, batches).map_err(to_df)?;
            let out = aggregate_batch(&stream, &kernels, &plan, &schema, &all).map_err(to_df)?;
            let out = match out.bound() {
                0 => empty_sets_batch(&stream, &kernels, &plan, &schema)
                    .map_err(to_df)?
                    .unwrap_or(out),
                _ => out,
            };
            let out = ordered(&stream, out).map_err(to_df)?;
            baseline.record_output(out.bound());
            let one: DeviceBatchStream =
                Box::pin(futures::stream::once(futures::future::ready(Ok(out))));
            Ok(one)
        })
        .try_flatten();
        // Without group keys the one output row is always produced (COUNT of nothing is 0).
        Ok(Box::pin(once.try_filter(move |b| {
            futures::future::ready(!grouped || b.bound() > 0)
        })))
    }
}
