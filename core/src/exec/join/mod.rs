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
//! Left, full, left semi and left anti joins mark the build groups that matched and emit the
//! build rows that did (not) match after the last probe batch. In `CollectLeft` mode the build
//! side (and its marks) is shared by all probe partitions, and the last partition to finish
//! emits them; in `Partitioned` mode each partition has its own build side.
//!
//! Output order is probe order (then the build side's unmatched rows), as DataFusion's; the
//! build rows of one probe row come in any order. A residual join filter is evaluated on the
//! candidate pairs by the expression JIT; then matches (and so outer, semi and anti rows) are
//! decided per row pair. A null-aware anti join (`NOT IN`) emits nothing once a probe key is
//! NULL, and no NULL-keyed build row unless the probe side was empty. Mark joins stay on the
//! CPU.

mod build;
mod codegen;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};
use spate_kernels::compact::{self, Mask};
use spate_kernels::{DeviceBuffer, DeviceSlice, KernelArg, Stream as DeviceStream};

use self::build::{BuildSide, build_side};
use self::codegen::JoinProgram;
use super::aggregate::{Kernels, launch};
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, device_input, gpu_context,
    to_df,
};
use crate::column::{
    DeviceBatch, concat_device_batches, gather_column, gather_column_or_null, upload_batch,
};
use crate::error::{Result, SpateError};
use crate::expr::{
    DevType, PredicateKernel, Unsupported, column_args, evaluate_predicate, predicate_kernel,
};

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
    /// The build side in `CollectLeft` mode, built once for every probe partition.
    shared: Arc<tokio::sync::OnceCell<Arc<BuildSide>>>,
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
        JoinType::Left | JoinType::Full | JoinType::LeftSemi | JoinType::LeftAnti
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
        Ok(GpuHashJoinExec {
            join_type: *join.join_type(),
            collect_left,
            null_equal: join.null_equality() == NullEquality::NullEqualsNull,
            null_aware: join.null_aware,
            projection: join.projection.as_ref().map(|p| p.to_vec()),
            fetch: join.fetch(),
            cpu: Arc::clone(&plan),
            plan: Arc::new(join_plan),
            shared: Arc::new(tokio::sync::OnceCell::new()),
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
            },
        ))
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        // The GPU join again if it still applies, else the CPU node, which is always correct.
        match GpuHashJoinExec::try_new(Arc::clone(&cpu)) {
            Ok(gpu) => Ok(Arc::new(gpu)),
            Err(_) => Ok(cpu),
        }
    }

    fn left(&self) -> &Arc<dyn ExecutionPlan> {
        self.cpu.children()[0]
    }

    fn right(&self) -> &Arc<dyn ExecutionPlan> {
        self.cpu.children()[1]
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
    let build_width = build.map_or(0, |(b, _, _)| b.columns().len());
    let probe_width = probe.map_or(0, |(p, _, _)| p.columns().len());
    let all: Vec<usize> = (0..build_width + probe_width).collect();
    let wanted = projection.unwrap_or(&all);
    let mut columns = Vec::with_capacity(wanted.len());
    for &c in wanted {
        let (batch, indices, may_be_null, index) = if c < build_width {
            let (b, i, null) = build.ok_or_else(|| SpateError::Internal {
                message: "a join output column from a missing build side".into(),
            })?;
            (b, i, null, c)
        } else {
            let (p, i, null) = probe.ok_or_else(|| SpateError::Internal {
                message: "a join output column from a missing probe side".into(),
            })?;
            (p, i, null, c - build_width)
        };
        let column = &batch.columns()[index];
        columns.push(if may_be_null {
            gather_column_or_null(stream, column, indices)?
        } else {
            gather_column(stream, column, indices)?
        });
    }
    DeviceBatch::try_new(Arc::clone(schema), columns, rows)
}

struct ProbeState {
    stream: Arc<DeviceStream>,
    kernels: Arc<Kernels>,
    plan: Arc<JoinPlan>,
    /// Set once the build side is ready.
    build: Option<Arc<BuildSide>>,
    join_type: JoinType,
    null_equal: bool,
    null_aware: bool,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    probe_schema: SchemaRef,
    remaining: Option<usize>,
    /// The count of running probe partitions of a shared build side.
    pending: Option<Arc<std::sync::atomic::AtomicUsize>>,
    baseline: BaselineMetrics,
}

impl Drop for ProbeState {
    /// However the probe ends (its last batch, an error, a cancellation, a satisfied limit),
    /// the build side's frees wait for what this stream has queued (see `build.rs`).
    fn drop(&mut self) {
        if let Some(build) = &self.build {
            build.release_from(&self.stream);
        }
    }
}

impl ProbeState {
    fn build(&self) -> Result<&BuildSide> {
        self.build.as_deref().ok_or_else(|| SpateError::Internal {
            message: "a GPU join probed before its build side was ready".into(),
        })
    }

    fn probe(&self, batch: &DeviceBatch) -> Result<Option<DeviceBatch>> {
        let _timer = self.baseline.elapsed_compute().timer();
        let s = &self.stream;
        let n = batch.num_rows();
        if n >= u32::MAX as usize {
            return Err(SpateError::Unsupported {
                message: format!("a GPU join probe batch of {n} rows (the limit is 2^32 - 2)"),
            });
        }
        let build = self.build()?;
        if self.null_aware {
            use std::sync::atomic::Ordering;
            if n > 0 {
                build.probe_non_empty.store(true, Ordering::Relaxed);
            }
            if batch.columns()[self.plan.probe_keys[0]].null_count() > 0 {
                build.probe_has_null.store(true, Ordering::Relaxed);
            }
            if build.probe_has_null.load(Ordering::Relaxed) {
                // `x NOT IN (..., NULL)` is never true: nothing left to match.
                return Ok(None);
            }
        }
        let outer_probe = matches!(self.join_type, JoinType::Right | JoinType::Full);
        let mut args = Vec::new();
        for &k in &self.plan.probe_keys {
            column_args(&batch.columns()[k], &mut args);
        }
        for k in &build.keys {
            column_args(k, &mut args);
        }
        let filtered = self.plan.filter.is_some();
        // With a residual filter, outer rows and matches are decided after the filter.
        let outer_probe = outer_probe && !filtered;
        let pgroup = s.alloc::<u32>(n.max(1))?;
        let counts = s.alloc::<u64>(n.max(1))?;
        args.extend([
            KernelArg::U64(n as u64),
            (&build.grouping.hashes).into(),
            (&build.grouping.table).into(),
            KernelArg::U64(build.grouping.table.len() as u64 - 1),
            (&build.grouping.group_of_slot).into(),
            (&build.sizes).into(),
            KernelArg::U32(u32::from(self.null_equal)),
            KernelArg::U32(u32::from(outer_probe)),
            (&pgroup).into(),
            (&counts).into(),
            if filtered {
                KernelArg::null()
            } else {
                build.matched.as_ref().into()
            },
        ]);
        launch(s, self.kernels.get("probe")?, n, &args)?;
        if filtered {
            return self.probe_filtered(batch, &pgroup, &counts);
        }
        match self.join_type {
            JoinType::LeftSemi | JoinType::LeftAnti => Ok(None),
            JoinType::RightSemi | JoinType::RightAnti => {
                let mask = s.alloc::<u8>(n.max(1))?;
                launch(
                    s,
                    self.kernels.get("pmask")?,
                    n,
                    &[
                        (&pgroup).into(),
                        KernelArg::U64(n as u64),
                        KernelArg::U32(u32::from(self.join_type == JoinType::RightSemi)),
                        (&mask).into(),
                    ],
                )?;
                let kept = compact::select_indices(s, Mask::Bytes(mask.as_slice()), None, n)?;
                let rows = kept.len();
                if rows == 0 {
                    return Ok(None);
                }
                assemble(
                    s,
                    &self.schema,
                    self.projection.as_deref(),
                    None,
                    Some((batch, kept.as_slice(), false)),
                    rows,
                )
                .map(Some)
            }
            _ => {
                let (offsets, total) =
                    spate_kernels::scan::exclusive_sum_with_total(s, counts.slice(..n)?)?;
                let total = total as usize;
                if total == 0 {
                    return Ok(None);
                }
                if total >= u32::MAX as usize {
                    return Err(SpateError::Unsupported {
                        message: format!(
                            "a GPU join producing {total} rows from one probe batch (the limit \
                             is 2^32 - 2); lower spate.gpu.batch_bytes"
                        ),
                    });
                }
                let out_probe = s.alloc::<u32>(total)?;
                let out_build = s.alloc::<u32>(total)?;
                launch(
                    s,
                    self.kernels.get("pairs")?,
                    total,
                    &[
                        (&pgroup).into(),
                        (&offsets).into(),
                        KernelArg::U64(n as u64),
                        KernelArg::U64(total as u64),
                        (&build.group_start).into(),
                        (&build.rows_by_group).into(),
                        (&out_probe).into(),
                        (&out_build).into(),
                    ],
                )?;
                assemble(
                    s,
                    &self.schema,
                    self.projection.as_deref(),
                    Some((&build.batch, out_build.as_slice(), outer_probe)),
                    Some((batch, out_probe.as_slice(), false)),
                    total,
                )
                .map(Some)
            }
        }
    }

    /// The candidate pairs of a probe batch, kept where the residual filter is TRUE; matches
    /// (and so outer, semi and anti rows) are decided by the kept pairs.
    fn probe_filtered(
        &self,
        batch: &DeviceBatch,
        pgroup: &DeviceBuffer<u32>,
        counts: &DeviceBuffer<u64>,
    ) -> Result<Option<DeviceBatch>> {
        let s = &self.stream;
        let build = self.build()?;
        let n = batch.num_rows();
        let Some(filter) = &self.plan.filter else {
            return Ok(None);
        };
        let (offsets, total) =
            spate_kernels::scan::exclusive_sum_with_total(s, counts.slice(..n)?)?;
        let total = total as usize;
        if total >= u32::MAX as usize {
            return Err(SpateError::Unsupported {
                message: format!(
                    "a GPU join with {total} candidate pairs in one probe batch (the limit is \
                     2^32 - 2); lower spate.gpu.batch_bytes"
                ),
            });
        }
        let out_probe = s.alloc::<u32>(total.max(1))?;
        let out_build = s.alloc::<u32>(total.max(1))?;
        launch(
            s,
            self.kernels.get("pairs")?,
            total,
            &[
                pgroup.into(),
                (&offsets).into(),
                KernelArg::U64(n as u64),
                KernelArg::U64(total as u64),
                (&build.group_start).into(),
                (&build.rows_by_group).into(),
                (&out_probe).into(),
                (&out_build).into(),
            ],
        )?;
        let (probe_rows, build_rows) = (out_probe.slice(..total)?, out_build.slice(..total)?);
        // The filter's input: its columns gathered from both sides by the pairs.
        let columns = filter
            .columns
            .iter()
            .map(|&(from_build, c)| {
                if from_build {
                    gather_column(s, &build.batch.columns()[c], build_rows)
                } else {
                    gather_column(s, &batch.columns()[c], probe_rows)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let pairs = DeviceBatch::try_new(Arc::clone(&filter.schema), columns, total)?;
        let filter_kernel = self
            .kernels
            .computed
            .as_ref()
            .ok_or_else(|| SpateError::Internal {
                message: "a GPU join filter without its kernel".into(),
            })?;
        let keep = evaluate_predicate(s, filter_kernel, &filter.predicate, &pairs)?;
        let mark = |rows: DeviceSlice<'_, u32>, flags: &DeviceBuffer<u32>| {
            launch(
                s,
                self.kernels.get("mark")?,
                total,
                &[
                    rows.into(),
                    (&keep).into(),
                    KernelArg::U64(total as u64),
                    flags.into(),
                ],
            )
        };
        if let Some(matched) = &build.matched {
            mark(build_rows, matched)?;
        }
        let probe_flags = if matches!(
            self.join_type,
            JoinType::Right | JoinType::Full | JoinType::RightSemi | JoinType::RightAnti
        ) {
            let flags = s.alloc_zeroed::<u32>(n.max(1))?;
            mark(probe_rows, &flags)?;
            Some(flags)
        } else {
            None
        };
        let select = |flags: &DeviceBuffer<u32>, want: bool| -> Result<DeviceBuffer<u32>> {
            let mask = s.alloc::<u8>(n.max(1))?;
            launch(
                s,
                self.kernels.get("fmask")?,
                n,
                &[
                    flags.into(),
                    KernelArg::U64(n as u64),
                    KernelArg::U32(u32::from(want)),
                    (&mask).into(),
                ],
            )?;
            Ok(compact::select_indices(
                s,
                Mask::Bytes(mask.slice(..n)?),
                None,
                n,
            )?)
        };
        match self.join_type {
            JoinType::LeftSemi | JoinType::LeftAnti => Ok(None),
            JoinType::RightSemi | JoinType::RightAnti => {
                let Some(flags) = &probe_flags else {
                    return Ok(None);
                };
                let kept = select(flags, self.join_type == JoinType::RightSemi)?;
                if kept.is_empty() {
                    return Ok(None);
                }
                assemble(
                    s,
                    &self.schema,
                    self.projection.as_deref(),
                    None,
                    Some((batch, kept.as_slice(), false)),
                    kept.len(),
                )
                .map(Some)
            }
            _ => {
                let passing =
                    compact::select_indices(s, Mask::Bytes(keep.slice(..total)?), None, total)?;
                let p = spate_kernels::gather::gather(s, probe_rows, passing.as_slice())?;
                let b = spate_kernels::gather::gather(s, build_rows, passing.as_slice())?;
                let lonely = match &probe_flags {
                    Some(flags) => select(flags, false)?,
                    None => s.alloc::<u32>(0)?,
                };
                let rows = passing.len() + lonely.len();
                if rows == 0 {
                    return Ok(None);
                }
                if lonely.is_empty() {
                    return assemble(
                        s,
                        &self.schema,
                        self.projection.as_deref(),
                        Some((&build.batch, b.as_slice(), false)),
                        Some((batch, p.as_slice(), false)),
                        rows,
                    )
                    .map(Some);
                }
                // Right and full outer: the probe rows no kept pair matched join NULLs. Kept
                // pairs are in probe order; a stable sort on the probe row merges the two
                // lists back into probe order, as DataFusion's output is.
                let mut all_probe = s.alloc::<u32>(rows)?;
                s.copy_device(p.as_slice(), &mut all_probe, 0)?;
                s.copy_device(lonely.as_slice(), &mut all_probe, p.len())?;
                let mut all_build = s.alloc::<u32>(rows)?;
                s.copy_device(b.as_slice(), &mut all_build, 0)?;
                let nothing =
                    s.from_host(&vec![spate_kernels::launch::NULL_INDEX; lonely.len()])?;
                s.copy_device(nothing.as_slice(), &mut all_build, b.len())?;
                let sorted = spate_kernels::sort::sort_pairs(s, all_probe.as_slice(), None, 32)?;
                let build_order = spate_kernels::gather::gather(
                    s,
                    all_build.as_slice(),
                    sorted.values.as_slice(),
                )?;
                assemble(
                    s,
                    &self.schema,
                    self.projection.as_deref(),
                    Some((&build.batch, build_order.as_slice(), true)),
                    Some((batch, sorted.keys.as_slice(), false)),
                    rows,
                )
                .map(Some)
            }
        }
    }

    /// After the last probe batch: the build rows that matched (left semi) or did not (left
    /// anti, and with NULLs for the probe side, left and full outer).
    fn finish(&self) -> Result<Option<DeviceBatch>> {
        let _timer = self.baseline.elapsed_compute().timer();
        let s = &self.stream;
        let build = self.build()?;
        let Some(matched) = &build.matched else {
            return Ok(None);
        };
        let n = build.batch.num_rows();
        if n == 0 {
            return Ok(None);
        }
        let (probe_has_null, probe_non_empty) = {
            use std::sync::atomic::Ordering;
            (
                build.probe_has_null.load(Ordering::Relaxed),
                build.probe_non_empty.load(Ordering::Relaxed),
            )
        };
        if self.null_aware && probe_has_null {
            return Ok(None);
        }
        // `NULL NOT IN (rows)` is NULL, but `NULL NOT IN (empty)` is true.
        let key_validity = if self.null_aware && probe_non_empty {
            build.keys[0].validity().map(|v| v.bitmap())
        } else {
            None
        };
        let mask = s.alloc::<u8>(n)?;
        let want = KernelArg::U32(u32::from(self.join_type == JoinType::LeftSemi));
        if self.plan.filter.is_some() {
            // Matches were flagged per build row.
            launch(
                s,
                self.kernels.get("fmask")?,
                n,
                &[
                    matched.into(),
                    KernelArg::U64(n as u64),
                    want,
                    (&mask).into(),
                ],
            )?;
        } else {
            launch(
                s,
                self.kernels.get("bmask")?,
                n,
                &[
                    (&build.grouping.gid).into(),
                    KernelArg::U64(n as u64),
                    matched.into(),
                    want,
                    (&mask).into(),
                ],
            )?;
        }
        let kept = compact::select_indices(s, Mask::Bytes(mask.as_slice()), key_validity, n)?;
        let rows = kept.len();
        if rows == 0 {
            return Ok(None);
        }
        if matches!(self.join_type, JoinType::LeftSemi | JoinType::LeftAnti) {
            return assemble(
                s,
                &self.schema,
                self.projection.as_deref(),
                Some((&build.batch, kept.as_slice(), false)),
                None,
                rows,
            )
            .map(Some);
        }
        // Left and full outer: the probe side is all NULL.
        let nothing = s.from_host(&vec![spate_kernels::launch::NULL_INDEX; rows])?;
        let empty = upload_batch(s, &RecordBatch::new_empty(Arc::clone(&self.probe_schema)))?;
        assemble(
            s,
            &self.schema,
            self.projection.as_deref(),
            Some((&build.batch, kept.as_slice(), false)),
            Some((&empty, nothing.as_slice(), true)),
            rows,
        )
        .map(Some)
    }

    /// The end of this partition's probe rows. With a shared build side only the last probe
    /// partition to finish emits the build rows: every other one waits for its stream first,
    /// so that its matches are on the device when the last one reads them.
    fn finish_partition(&self) -> Result<Option<DeviceBatch>> {
        use std::sync::atomic::Ordering;
        let Some(pending) = &self.pending else {
            return self.finish();
        };
        if self.build()?.matched.is_none() {
            return Ok(None);
        }
        self.stream.synchronize()?;
        if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish()
        } else {
            Ok(None)
        }
    }

    /// Applies the join's fetch (LIMIT) to an output batch.
    fn limit(&mut self, batch: DeviceBatch) -> Result<Option<DeviceBatch>> {
        let Some(remaining) = self.remaining.as_mut() else {
            return Ok(Some(batch));
        };
        let rows = batch.num_rows().min(*remaining);
        *remaining -= rows;
        if rows == 0 {
            return Ok(None);
        }
        if rows == batch.num_rows() {
            return Ok(Some(batch));
        }
        let first: Vec<u32> = (0..rows as u32).collect();
        let first = self.stream.from_host(&first)?;
        let columns = batch
            .columns()
            .iter()
            .map(|c| gather_column(&self.stream, c, first.as_slice()))
            .collect::<Result<Vec<_>>>()?;
        DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows).map(Some)
    }
}

impl DisplayAs for GpuHashJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
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

    crate::exec::gpu_plan_methods!();

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }
}

impl GpuExec for GpuHashJoinExec {
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
        let shared = Arc::clone(&self.shared);
        let build_plan = Arc::clone(&self.plan);
        let build_kernels = Arc::clone(&kernels);
        let build_context = Arc::clone(&context);
        let build_stream = Arc::clone(&stream);
        let build_transfer = transfer.clone();
        let track = emits_build_rows(join_type);
        let build = async move {
            let make = |stream: Arc<DeviceStream>, left_partition: usize| async move {
                let input = device_input(
                    &left,
                    left_partition,
                    &build_context,
                    &stream,
                    &build_transfer,
                )?;
                let batches: Vec<DeviceBatch> = input.try_collect().await?;
                let all = concat_device_batches(&stream, &left_schema, batches).map_err(to_df)?;
                let side =
                    build_side(&stream, &build_kernels, &build_plan, all, track).map_err(to_df)?;
                // Other partitions' streams read the build side: it must be complete.
                stream.synchronize().map_err(|e| to_df(e.into()))?;
                DFResult::Ok(Arc::new(side))
            };
            if collect_left {
                let own = Arc::new(gpu.device().new_stream().map_err(|e| to_df(e.into()))?);
                shared
                    .get_or_try_init(|| make(own, 0))
                    .await
                    .map(Arc::clone)
            } else {
                make(build_stream, partition).await
            }
        };
        let probe = device_input(self.right(), partition, &context, &stream, &transfer)?;
        let pending = collect_left.then(|| Arc::clone(&self.pending));
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
            },
            Some(Box::pin(build)
                as std::pin::Pin<
                    Box<dyn Future<Output = DFResult<Arc<BuildSide>>> + Send>,
                >),
            probe,
            false,
        );
        Ok(Box::pin(futures::stream::unfold(
            state,
            |(mut s, mut build, mut probe, mut finished)| async move {
                if let Some(b) = build.take() {
                    match b.await {
                        Ok(side) => s.build = Some(side),
                        Err(e) => return Some((Err(e), (s, None, probe, true))),
                    }
                }
                loop {
                    if finished || s.remaining == Some(0) {
                        return None;
                    }
                    let out = match probe.next().await {
                        Some(Err(e)) => return Some((Err(e), (s, None, probe, true))),
                        Some(Ok(batch)) => s.probe(&batch),
                        None => {
                            finished = true;
                            s.finish_partition()
                        }
                    };
                    let out = out.and_then(|o| match o {
                        Some(batch) => s.limit(batch),
                        None => Ok(None),
                    });
                    match out {
                        Ok(Some(batch)) => {
                            s.baseline.record_output(batch.num_rows());
                            return Some((Ok(batch), (s, None, probe, finished)));
                        }
                        Ok(None) => continue,
                        Err(e) => return Some((Err(to_df(e)), (s, None, probe, true))),
                    }
                }
            },
        )))
    }
}
