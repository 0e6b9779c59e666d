//! `GpuHashJoinExec`: DataFusion's `HashJoinExec` (equi-joins) on the GPU.
//!
//! The left input is the build side, as DataFusion plans it. Its batches are concatenated on
//! the device and its rows grouped by key in an open-addressing table (the aggregation's), and
//! the rows of each group are listed together (CSR). Each probe (right) batch then:
//! 1. looks every row's keys up in the table (a NULL key matches nothing, unless the join
//!    treats NULLs as equal), which gives its group and its number of output rows;
//! 2. a prefix sum of those counts places every probe row's output, and one kernel writes the
//!    (probe row, build row) pairs; inner and outer joins gather both sides' columns by them,
//!    semi and anti joins keep the probe rows that did or did not match.
//!
//! Left, full, left semi, left anti and left mark joins mark the build groups that matched and
//! emit the build rows that did (not) match (all of them, for a mark join) after the last probe
//! batch. In `CollectLeft` mode the build
//! side (and its marks) is shared by all probe partitions, and the last partition to finish
//! emits them; in `Partitioned` mode each partition has its own build side.
//!
//! Output order is probe order (then the build side's unmatched rows), as DataFusion's; the
//! build rows of one probe row come in any order. A residual join filter is evaluated on the
//! candidate pairs by the expression JIT; then matches (and so outer, semi and anti rows) are
//! decided per row pair. A null-aware anti join (`NOT IN`) emits nothing once a probe key is
//! NULL, and no NULL-keyed build row unless the probe side was empty. Mark joins (`EXISTS` or
//! `IN` under OR) decide matches as semi joins do and emit every row with its mark (`mark`).

mod build;
mod codegen;
mod fallback;
mod grace;
mod mark;
mod probe;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::StreamExt;
use spate_kernels::{DeviceSlice, Stream as DeviceStream};

use self::build::{BuildSide, build_side};
use self::codegen::JoinProgram;
use self::fallback::CpuProbe;
use self::grace::{Grace, Step};
use self::probe::ProbeState;
use super::batching::KeepsCounts;
use super::hash_table::Kernels;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, collected_input, gpu_context,
    per_batch_input, to_df,
};
use crate::column::{
    DeviceBatch, Gather, RowCount, append_device_batches, concat_device_batches, gather_batch,
};
use crate::error::{Result, SpateError};
use crate::exec::held::HeldBatches;
use crate::exec::retry::Retry;
use crate::exec::spill::{HostPartitions, SpillOptions, TOP_SHIFT};
use crate::expr::{DevType, PredicateKernel, Unsupported, predicate_kernel};

/// A residual join filter: evaluated on the candidate pairs, from columns of both sides.
#[derive(Debug)]
struct FilterPlan {
    predicate: PredicateKernel,
    /// Per column of the filter's schema: from the build side (`true`) or the probe side, and
    /// which column.
    columns: Vec<(bool, usize)>,
    schema: SchemaRef,
}

/// What the GPU computes for one `HashJoinExec`.
#[derive(Debug)]
struct JoinPlan {
    build_keys: Vec<usize>,
    probe_keys: Vec<usize>,
    program: JoinProgram,
    filter: Option<FilterPlan>,
    /// Whether a build side over its share of the budget may spill (`grace.rs`).
    spillable: bool,
}

/// A hash join running on the GPU.
pub struct GpuHashJoinExec {
    /// The `HashJoinExec` this replaces (its properties and rebuilds are reused).
    cpu: Arc<dyn ExecutionPlan>,
    join_type: JoinType,
    collect_left: bool,
    null_equal: bool,
    /// A null-aware anti join (`NOT IN`), see [`BuildSide`]'s flags.
    null_aware: bool,
    projection: Option<Vec<usize>>,
    fetch: Option<usize>,
    plan: Arc<JoinPlan>,
    /// The build keys are unique, as the plan shows (`plan::unique`): a join that
    /// `may_probe_unique` then probes unique keys from its first batch.
    build_unique: bool,
    /// The probe keys are unique, as the plan shows: see `pairs_by_unique_probe_keys`.
    probe_unique: bool,
    /// The build side in `CollectLeft` mode, built once for every probe partition: once per
    /// device that probes it, by [`spate_kernels::Device::id`]: with several devices a
    /// broadcast build side (`plan/devices.rs`) is built on each, from its copy there.
    shared: Arc<SharedBuilds>,
    /// Probe partitions of a shared build side still running: the last one to finish emits
    /// the build rows that did (not) match.
    pending: Arc<std::sync::atomic::AtomicUsize>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for GpuHashJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuHashJoinExec")
            .field("cpu", &self.cpu)
            .field("plan", &self.plan)
            .finish()
    }
}

fn key_columns(
    exprs: impl Iterator<Item = Arc<dyn PhysicalExpr>>,
    schema: &arrow::datatypes::Schema,
    side: &str,
) -> std::result::Result<(Vec<usize>, Vec<DevType>), Unsupported> {
    let mut columns = Vec::new();
    let mut types = Vec::new();
    for e in exprs {
        let c = e.downcast_ref::<Column>().ok_or_else(|| {
            Unsupported(format!(
                "{side} join key `{e}` is an expression; GPU joins take columns for now"
            ))
        })?;
        let data_type = schema.field(c.index()).data_type();
        // Float keys hash and compare as DataFusion's do: by bit pattern, with -0.0 folded
        // into +0.0 (so a NaN matches a NaN with the same bits).
        let ty = DevType::of(data_type).ok_or_else(|| {
            Unsupported(format!(
                "{side} join key `{e}` has type {data_type}, which GPU joins do not support yet"
            ))
        })?;
        columns.push(c.index());
        types.push(ty);
    }
    Ok((columns, types))
}

/// Join types whose build rows are emitted after probing (they need every probe row).
fn emits_build_rows(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Left
            | JoinType::Full
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

impl GpuHashJoinExec {
    /// Why `join` must stay on the CPU, if it must.
    pub fn check(join: &HashJoinExec) -> std::result::Result<(), Unsupported> {
        Self::plan_for(join).map(|_| ())
    }

    /// The GPU version of `plan` (a `HashJoinExec`), or why it must stay on the CPU.
    pub fn try_new(plan: Arc<dyn ExecutionPlan>) -> std::result::Result<Self, Unsupported> {
        let join = plan
            .downcast_ref::<HashJoinExec>()
            .ok_or_else(|| Unsupported(format!("{} is not a hash join", plan.name())))?;
        let (collect_left, join_plan) = Self::plan_for(join)?;
        let build_unique = crate::plan::unique::is_unique(join.left(), &join_plan.build_keys);
        let probe_unique = crate::plan::unique::is_unique(join.right(), &join_plan.probe_keys);
        Ok(GpuHashJoinExec {
            build_unique,
            probe_unique,
            join_type: *join.join_type(),
            collect_left,
            null_equal: join.null_equality() == NullEquality::NullEqualsNull,
            null_aware: join.null_aware,
            projection: join.projection.as_ref().map(|p| p.to_vec()),
            fetch: join.fetch(),
            cpu: Arc::clone(&plan),
            plan: Arc::new(join_plan),
            shared: Arc::new(SharedBuilds::default()),
            pending: Arc::new(std::sync::atomic::AtomicUsize::new(
                join.right()
                    .properties()
                    .output_partitioning()
                    .partition_count(),
            )),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn plan_for(join: &HashJoinExec) -> std::result::Result<(bool, JoinPlan), Unsupported> {
        let left = join.left().schema();
        let right = join.right().schema();
        check_input_types(&left)?;
        check_input_types(&right)?;
        let join_type = *join.join_type();
        if !matches!(
            join_type,
            JoinType::Inner
                | JoinType::Left
                | JoinType::Right
                | JoinType::Full
                | JoinType::LeftSemi
                | JoinType::LeftAnti
                | JoinType::RightSemi
                | JoinType::RightAnti
                | JoinType::LeftMark
                | JoinType::RightMark
        ) {
            return Err(Unsupported(format!(
                "{join_type} joins do not run on the GPU yet"
            )));
        }
        let filter = match join.filter() {
            None => None,
            Some(f) => {
                let schema = Arc::clone(f.schema());
                check_input_types(&schema)?;
                let predicate = predicate_kernel(f.expression().as_ref(), &schema)?;
                let columns = f
                    .column_indices()
                    .iter()
                    .map(|c| match c.side {
                        JoinSide::Left => Ok((true, c.index)),
                        JoinSide::Right => Ok((false, c.index)),
                        JoinSide::None => Err(Unsupported(
                            "a join filter over a mark column does not run on the GPU yet".into(),
                        )),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Some(FilterPlan {
                    predicate,
                    columns,
                    schema,
                })
            }
        };
        if join.null_aware && (join.on().len() != 1 || join_type != JoinType::LeftAnti) {
            return Err(Unsupported(
                "a null-aware join other than a one-key left anti join".into(),
            ));
        }
        let collect_left = match join.partition_mode() {
            PartitionMode::CollectLeft => true,
            PartitionMode::Partitioned => false,
            PartitionMode::Auto => {
                return Err(Unsupported(
                    "a join whose partition mode is not decided yet".into(),
                ));
            }
        };
        let (build_keys, build_types) =
            key_columns(join.on().iter().map(|(l, _)| Arc::clone(l)), &left, "left")?;
        let (probe_keys, probe_types) = key_columns(
            join.on().iter().map(|(_, r)| Arc::clone(r)),
            &right,
            "right",
        )?;
        if build_types != probe_types {
            return Err(Unsupported(format!(
                "join keys of different types ({build_types:?} and {probe_types:?})"
            )));
        }
        let program = codegen::generate(&build_types, &format!("{join_type} join"));
        Ok((
            collect_left,
            JoinPlan {
                build_keys,
                probe_keys,
                program,
                filter,
                spillable: grace::can_spill(&build_types, join.null_aware),
            },
        ))
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        crate::exec::rebuild_gpu_dyn(cpu, GpuHashJoinExec::try_new)
    }

    fn left(&self) -> &Arc<dyn ExecutionPlan> {
        self.cpu.children()[0]
    }

    /// Whether the plan shows the build keys unique and the join can use it: its probe then
    /// keeps counts on the device from the first batch.
    fn probes_unique_keys(&self) -> bool {
        self.build_unique && !self.null_aware && may_probe_unique(self.join_type, &self.plan)
    }

    /// Whether the plan shows the probe keys unique (and the build keys are not known to
    /// be), so that a build row pairs with one probe row at most: a probe batch's pairs then
    /// fit the build side's rows, and their count stays on the device
    /// (`ProbeState::probe_by_build`).
    fn pairs_by_unique_probe_keys(&self) -> bool {
        self.probe_unique
            && !self.probes_unique_keys()
            && !self.null_aware
            && may_probe_unique(self.join_type, &self.plan)
    }

    fn right(&self) -> &Arc<dyn ExecutionPlan> {
        self.cpu.children()[1]
    }
}

/// The build side's rows as one batch: appended on the device, their count left there, when
/// some batch's count is on the device and they append (`column::append_device_batches`);
/// else concatenated, which reads the counts.
fn build_input(
    stream: &DeviceStream,
    schema: &SchemaRef,
    batches: Vec<DeviceBatch>,
) -> Result<DeviceBatch> {
    if batches.len() > 1
        && batches.iter().any(|b| b.host_rows().is_none())
        && let Some(all) = append_device_batches(stream, schema, &batches)?
    {
        return Ok(all);
    }
    concat_device_batches(stream, schema, batches)
}

/// Whether a probe of unique build keys makes at most one candidate pair per probe row, and
/// only for a matched one, that its output can be compacted from: inner and left joins, and
/// left semi and anti joins with a filter (which run it on those pairs). Then the probe leaves
/// its output's count on the device (`ProbeState::probe_unique`), and the build checks whether
/// its keys are unique.
fn may_probe_unique(join_type: JoinType, plan: &JoinPlan) -> bool {
    match join_type {
        JoinType::Inner | JoinType::Left => true,
        // Without a filter these only mark build rows, in the probe kernel; with one, the
        // filter runs on the candidate pairs of a unique probe.
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => plan.filter.is_some(),
        _ => false,
    }
}

/// The join's output columns from the build rows `build` and probe rows `probe` (either side
/// absent for semi and anti joins), with the embedded projection applied.
#[allow(clippy::too_many_arguments)]
fn assemble(
    stream: &DeviceStream,
    schema: &SchemaRef,
    projection: Option<&[usize]>,
    build: Option<(&DeviceBatch, DeviceSlice<'_, u32>, bool)>,
    probe: Option<(&DeviceBatch, DeviceSlice<'_, u32>, bool)>,
    rows: usize,
) -> Result<DeviceBatch> {
    assemble_counted(
        stream,
        schema,
        projection,
        build,
        probe,
        &RowCount::Host(rows),
        Once::Neither,
    )
}

/// Which side of a join's pairs takes each of its rows at most once: a string column gathered
/// from that side holds no more bytes than its source (`Gather::each_row_once`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Once {
    Neither,
    /// The build keys are unique: a probe row pairs with one build row at most.
    Probe,
    /// The probe keys are unique: a build row pairs with one probe row at most.
    Build,
}

/// [`assemble`] for pairs whose count is `rows`: the indices are `rows.bound()` long, and only
/// the first `rows` of them are pairs. A device count stays on the device unless string
/// columns read their totals back (see `column::gather_counted`).
fn assemble_counted(
    stream: &DeviceStream,
    schema: &SchemaRef,
    projection: Option<&[usize]>,
    build: Option<(&DeviceBatch, DeviceSlice<'_, u32>, bool)>,
    probe: Option<(&DeviceBatch, DeviceSlice<'_, u32>, bool)>,
    rows: &RowCount,
    once: Once,
) -> Result<DeviceBatch> {
    let build_width = build.map_or(0, |(b, _, _)| b.columns().len());
    let probe_width = probe.map_or(0, |(p, _, _)| p.columns().len());
    let all: Vec<usize> = (0..build_width + probe_width).collect();
    let wanted = projection.unwrap_or(&all);
    let mut gathers = Vec::with_capacity(wanted.len());
    for &c in wanted {
        let (batch, indices, may_be_null, index, once) = if c < build_width {
            let (b, i, null) = build.ok_or_else(|| SpateError::Internal {
                message: "a join output column from a missing build side".into(),
            })?;
            (b, i, null, c, once == Once::Build)
        } else {
            let (p, i, null) = probe.ok_or_else(|| SpateError::Internal {
                message: "a join output column from a missing probe side".into(),
            })?;
            (p, i, null, c - build_width, once == Once::Probe)
        };
        let column = &batch.columns()[index];
        let gather = if may_be_null {
            Gather::rows_or_null(column, indices)
        } else {
            Gather::rows(column, indices)
        };
        gathers.push(if once { gather.each_row_once() } else { gather });
    }
    // One readback for the byte totals of all the string columns (and a device count), or
    // none when the count is on the device and every string column's bytes have a bound.
    gather_batch(stream, Arc::clone(schema), &gathers, rows)
}

impl DisplayAs for GpuHashJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)?;
        let unique = [
            (self.probes_unique_keys(), "build_keys=unique"),
            (self.pairs_by_unique_probe_keys(), "probe_keys=unique"),
        ];
        for (shown, text) in unique {
            if shown {
                match t {
                    DisplayFormatType::TreeRender => writeln!(f, "{text}")?,
                    _ => write!(f, ", {text}")?,
                }
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for GpuHashJoinExec {
    fn name(&self) -> &str {
        "GpuHashJoinExec"
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

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }
}

impl GpuExec for GpuHashJoinExec {
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
        let program = &self.plan.program;
        let kernels = Arc::new(Kernels {
            program: Kernels::compile(&gpu, &program.source, &program.entries).map_err(to_df)?,
            computed: match &self.plan.filter {
                Some(f) => Some(
                    gpu.generated_kernel(&f.predicate.source, &f.predicate.entry)
                        .map_err(to_df)?,
                ),
                None => None,
            },
        });
        let join_type = self.join_type;
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let collect_left = self.collect_left;
        let left = Arc::clone(self.left());
        let left_schema = left.schema();
        let shared = self.shared.on(stream.device());
        let build_plan = Arc::clone(&self.plan);
        let build_kernels = Arc::clone(&kernels);
        let build_context = Arc::clone(&context);
        let build_stream = Arc::clone(&stream);
        let build_transfer = transfer.clone();
        let track = emits_build_rows(join_type);
        let known_unique = self.probes_unique_keys();
        // Known from the plan, or checked on the device while building.
        let check_unique = may_probe_unique(join_type, &self.plan) && !known_unique;
        let probe_partitions = self
            .right()
            .properties()
            .output_partitioning()
            .partition_count();
        // A shared build side probed by several partitions stays in memory, and so does one
        // whose output keeps an order (a grace join emits partition by partition).
        let may_spill = self.plan.spillable
            && (!collect_left || probe_partitions == 1)
            && self.properties().output_ordering().is_none();
        let limit = crate::exec::memory::state_limit(&gpu, context.session_config().options());
        let spill_options = SpillOptions::new(&context, self.name(), &self.metrics, partition)?;
        let build_spill = spill_options.clone();
        let build_gpu = Arc::clone(&gpu);
        let grace_flags = (track, check_unique, known_unique);
        let build = async move {
            let make = |stream: Arc<DeviceStream>, left_partition: usize| async move {
                // The build takes a row count on the device: its input's counts stay there.
                let mut input = collected_input(
                    &left,
                    left_partition,
                    &build_context,
                    &stream,
                    &build_transfer,
                    KeepsCounts::always(),
                )?;
                // The build's input waits on the device, where the coordinator may move it
                // to the host for an operator below that runs out (`held.rs`).
                let batches = HeldBatches::register(&build_gpu, Arc::clone(&stream), &build_spill);
                let mut bytes = 0usize;
                let mut spilled: Option<HostPartitions> = None;
                while let Some(batch) = input.next().await {
                    let batch = batch?;
                    if let Some(parts) = &mut spilled {
                        parts.spill(&stream, &batch).map_err(to_df)?;
                        continue;
                    }
                    bytes += crate::exec::memory::with_table(&batch);
                    batches.push(batch);
                    if may_spill && crate::exec::memory::should_spill(bytes, limit, stream.device())
                    {
                        // Over the join's share of the budget: a grace join.
                        let mut parts = HostPartitions::new(
                            Arc::clone(&left_schema),
                            build_plan.build_keys.clone(),
                            TOP_SHIFT,
                            &build_spill,
                        );
                        batches.drain(|b| parts.spill(&stream, &b)).map_err(to_df)?;
                        spilled = Some(parts);
                    }
                }
                if let Some(parts) = spilled {
                    return DFResult::Ok(Built::Spilled(Box::new(parts)));
                }
                let all = build_input(&stream, &left_schema, batches.take().map_err(to_df)?)
                    .map_err(to_df)?;
                let side = build_side(
                    &stream,
                    &build_kernels,
                    &build_plan,
                    all,
                    track,
                    check_unique,
                )
                .map_err(to_df)?;
                if known_unique {
                    let _ = side.unique.set(true);
                }
                DFResult::Ok(Built::Side(Arc::new(side)))
            };
            if collect_left && !may_spill {
                let own = Arc::new(build_stream.sibling().map_err(|e| to_df(e.into()))?);
                shared
                    .get_or_try_init(|| async move {
                        match make(own, 0).await? {
                            Built::Side(side) => Ok(side),
                            Built::Spilled(_) => Err(to_df(SpateError::Internal {
                                message: "a shared join build side spilled".into(),
                            })),
                        }
                    })
                    .await
                    .map(|side| Built::Side(Arc::clone(side)))
            } else {
                make(build_stream, if collect_left { 0 } else { partition }).await
            }
        };
        // Whether the probe keeps its input's counts on the device is known once the build
        // keys are known to be unique (or not): from the plan, or after a probe batch or two.
        let by_build = self.pairs_by_unique_probe_keys();
        let keeps_counts = if known_unique || by_build {
            KeepsCounts::always()
        } else {
            KeepsCounts::later()
        };
        let probe = per_batch_input(
            self.right(),
            partition,
            &context,
            &stream,
            &transfer,
            keeps_counts.clone(),
        )?;
        let pending = collect_left.then(|| Arc::clone(&self.pending));
        let retry = Retry::new(
            Arc::clone(&gpu),
            Arc::clone(&stream),
            &self.metrics,
            partition,
        );
        let state = (
            ProbeState {
                stream,
                kernels,
                plan: Arc::clone(&self.plan),
                build: None,
                join_type,
                null_equal: self.null_equal,
                null_aware: self.null_aware,
                projection: self.projection.clone(),
                schema: self.schema(),
                probe_schema: self.right().schema(),
                remaining: self.fetch,
                pending,
                baseline: BaselineMetrics::new(&self.metrics, partition),
                largest_output_bytes: MetricBuilder::new(&self.metrics)
                    .gauge("largest_output_bytes", partition),
                batch_bytes: crate::exec::batch_target(&context)?,
                chunks: None,
                wide_probe_strings: Vec::new(),
                settlement: crate::exec::device_counts::Settlement::of(&self.metrics, partition),
                keeps_counts,
                pairs_by_build: by_build,
                totals_read: 0,
                retry,
                split_left: Vec::new(),
                cpu: CpuProbe {
                    twin: Arc::clone(&self.cpu),
                    context: Arc::clone(&context),
                    build: None,
                    out: std::collections::VecDeque::new(),
                },
            },
            Some(Box::pin(build)
                as std::pin::Pin<
                    Box<dyn Future<Output = DFResult<Built>> + Send>,
                >),
            probe,
            false,
            None::<Box<Grace>>,
            Spill {
                options: spill_options,
                build_schema: self.left().schema(),
                probe_schema: self.right().schema(),
                limit,
                flags: grace_flags,
                chunkable: grace::can_chunk(self.join_type),
            },
        );
        Ok(Box::pin(futures::stream::unfold(
            state,
            |(mut s, mut build, mut probe, mut finished, mut grace, spill)| async move {
                if let Some(b) = build.take() {
                    match b.await {
                        // Other partitions' streams read a shared build side: they wait for
                        // it on the device.
                        Ok(Built::Side(side)) => match side.order_before(&s.stream) {
                            Ok(()) => s.set_build(side),
                            Err(e) => {
                                return Some((Err(to_df(e)), (s, None, probe, true, None, spill)));
                            }
                        },
                        Ok(Built::Spilled(parts)) => {
                            match spill_probe(&s, &mut probe, &spill).await {
                                Ok(probe_parts) => {
                                    // Each partition emits its own build rows.
                                    s.pending = None;
                                    grace = Some(Box::new(Grace::new(
                                        *parts,
                                        probe_parts,
                                        Arc::clone(&spill.build_schema),
                                        spill.limit,
                                        spill.flags,
                                        spill
                                            .chunkable
                                            .then(|| spill.options.counter(grace::JOIN_CHUNKS)),
                                    )));
                                }
                                Err(e) => {
                                    return Some((Err(e), (s, None, probe, true, None, spill)));
                                }
                            }
                        }
                        Err(e) => return Some((Err(e), (s, None, probe, true, None, spill))),
                    }
                }
                loop {
                    if s.remaining == Some(0) {
                        return None;
                    }
                    // A probe batch's output may come in several chunks: those first, then
                    // the halves of a batch split after running out of device memory.
                    let out = if s.has_chunks() {
                        s.next_chunk()
                    } else if let Some((piece, splits)) = s.take_split() {
                        s.probe_piece(piece, splits)
                    } else if let Some(g) = grace.as_mut() {
                        match g.step(&mut s) {
                            Ok(Step::Out(out)) => Ok(out),
                            Ok(Step::Done) => return None,
                            Err(e) => Err(e),
                        }
                    } else if finished {
                        return None;
                    } else {
                        match probe.next().await {
                            Some(Err(e)) => {
                                return Some((Err(e), (s, None, probe, true, None, spill)));
                            }
                            Some(Ok(batch)) => s.probe(&batch),
                            None => {
                                finished = true;
                                s.finish_partition()
                            }
                        }
                    };
                    let out = out.and_then(|o| match o {
                        Some(batch) => s.limit(batch),
                        None => Ok(None),
                    });
                    match out {
                        Ok(Some(batch)) => {
                            s.record(&batch);
                            return Some((Ok(batch), (s, None, probe, finished, grace, spill)));
                        }
                        Ok(None) => continue,
                        Err(e) => {
                            s.chunks = None;
                            s.split_left.clear();
                            s.cpu.out.clear();
                            return Some((Err(to_df(e)), (s, None, probe, true, None, spill)));
                        }
                    }
                }
            },
        )))
    }
}

/// A `CollectLeft` join's build sides, one per device that probes it.
#[derive(Default)]
struct SharedBuilds(std::sync::Mutex<HashMap<usize, Arc<tokio::sync::OnceCell<Arc<BuildSide>>>>>);

impl fmt::Debug for SharedBuilds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sides = self.0.lock().map_or(0, |s| s.len());
        f.debug_struct("SharedBuilds")
            .field("devices", &sides)
            .finish()
    }
}

impl SharedBuilds {
    /// The build side of `device`, built by the first probe partition there to ask.
    fn on(&self, device: &spate_kernels::Device) -> Arc<tokio::sync::OnceCell<Arc<BuildSide>>> {
        let mut sides = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(sides.entry(device.id()).or_default())
    }
}

/// A join's build side: built on the device, or spilled to the host in partitions.
enum Built {
    Side(Arc<BuildSide>),
    Spilled(Box<HostPartitions>),
}

/// What a grace join needs to spill its probe side and build its partitions.
struct Spill {
    options: SpillOptions,
    build_schema: SchemaRef,
    probe_schema: SchemaRef,
    /// The device bytes a partition's build side may take.
    limit: usize,
    /// Whether build sides track matches, check their keys unique, or know them unique.
    flags: (bool, bool, bool),
    /// Whether a partition's build side may be joined in chunks (see `grace.rs`).
    chunkable: bool,
}

/// A grace join's probe side: every probe batch spilled to the host by the hash of its keys.
async fn spill_probe(
    s: &ProbeState,
    probe: &mut DeviceBatchStream,
    spill: &Spill,
) -> DFResult<HostPartitions> {
    let mut parts = HostPartitions::new(
        Arc::clone(&spill.probe_schema),
        s.plan.probe_keys.clone(),
        TOP_SHIFT,
        &spill.options,
    );
    while let Some(batch) = probe.next().await {
        parts.spill(&s.stream, &batch?).map_err(to_df)?;
    }
    Ok(parts)
}
