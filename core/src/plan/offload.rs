//! The GPU offload rule and the fallback policy.
//!
//! Walking the finished physical plan bottom-up, the rule swaps every operator that has a GPU
//! version and whose expressions and types the GPU supports (`FilterExec` → `GpuFilterExec`,
//! `ProjectionExec` → `GpuProjectionExec`, `SortExec` → `GpuSortExec`, `AggregateExec` →
//! `GpuAggregateExec`, `HashJoinExec` → `GpuHashJoinExec` today). GPU operators exchange device batches directly (see `crate::exec`), so a chain of
//! them keeps its data on the device. Every compute operator left on the CPU is a fallback,
//! handled by `spate.gpu.fallback`: `cpu` counts it, `warn` also logs the reason, `error`
//! fails the query naming the operator and the reason.
//!
//! Plumbing that has no GPU work in it (scans, exchanges including the merge of sorted
//! partitions, batch coalescing, projections that only select or rename columns, and
//! `ScalarSubqueryExec`, which only runs its subqueries before passing its input through) is
//! not a fallback. GPU expressions read a scalar subquery's result as a kernel parameter.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{CrossJoinExec, HashJoinExec};
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, replace_children_if_necessary,
};

use crate::config::{DeviceErrorPolicy, FallbackPolicy, SpateOptions};
use crate::device::GpuContext;
use crate::exec::{
    GpuAggregateExec, GpuCoalescePartitionsExec, GpuCrossJoinExec, GpuFilterExec, GpuHashJoinExec,
    GpuLimitExec, GpuProjectionExec, GpuSortExec, GpuUnionExec, GpuVectorTopKExec, GpuWindowExec,
    as_gpu_exec,
};
use crate::vector::VectorTopKExec;

/// Operators that move or read data but compute nothing a GPU would do for them.
pub(crate) const PLUMBING: &[&str] = &[
    "DataSourceExec",
    "RepartitionExec",
    "CoalescePartitionsExec",
    "CoalesceBatchesExec",
    "SortPreservingMergeExec",
    "CooperativeExec",
    "EmptyExec",
    "PlaceholderRowExec",
    "OutputRequirementExec",
    "StreamingTableExec",
    "LazyMemoryExec",
    "MemoryExec",
    "WorkTableExec",
    "ScalarSubqueryExec",
    "UnionExec",
    "InterleaveExec",
    "GlobalLimitExec",
    "LocalLimitExec",
];

/// Swaps supported operators for GPU operators (see the module docs).
#[derive(Debug)]
pub struct GpuOffloadRule {
    gpu: Arc<GpuContext>,
}

impl GpuOffloadRule {
    /// The rule for a session's GPU.
    pub fn new(gpu: Arc<GpuContext>) -> Self {
        GpuOffloadRule { gpu }
    }

    fn fallback(&self, policy: FallbackPolicy, operator: &str, reason: &str) -> DFResult<()> {
        self.gpu.record_fallback();
        match policy {
            FallbackPolicy::Cpu => Ok(()),
            FallbackPolicy::Warn => {
                log::warn!("{operator} runs on the CPU: {reason}");
                Ok(())
            }
            FallbackPolicy::Error => Err(DataFusionError::NotImplemented(format!(
                "{operator} cannot run on the GPU: {reason} (spate.gpu.fallback = error; set it \
                 to cpu or warn to run such operators on the CPU)"
            ))),
        }
    }
}

/// A projection that only selects or renames columns computes nothing: leaving it on the CPU
/// is not a fallback.
fn is_column_selection(node: &dyn ExecutionPlan) -> bool {
    node.downcast_ref::<ProjectionExec>().is_some_and(|p| {
        p.expr()
            .iter()
            .all(|e| e.expr.downcast_ref::<Column>().is_some())
    })
}

/// Whether `node` is one of DataFusion's window operators.
fn is_window(node: &dyn ExecutionPlan) -> bool {
    matches!(node.name(), "WindowAggExec" | "BoundedWindowAggExec")
}

/// Why a node the rule left on the CPU is there, in words for `EXPLAIN`.
fn cpu_reason(node: &dyn ExecutionPlan) -> String {
    match node.name() {
        "DataSourceExec" | "StreamingTableExec" | "LazyMemoryExec" | "MemoryExec"
        | "WorkTableExec" => {
            "reads its input on the host; the GPU operator above uploads it".into()
        }
        "RepartitionExec" | "CoalescePartitionsExec" | "CoalesceBatchesExec" => {
            "moves batches between partitions on the host".into()
        }
        "UnionExec" | "InterleaveExec" => {
            "passes its inputs' partitions through side by side, on the host (an exchange)".into()
        }
        "GlobalLimitExec" | "LocalLimitExec" => {
            "stops reading once it has the rows it needs; no computation".into()
        }
        "SortPreservingMergeExec" => {
            "merges partitions that are already sorted, on the host (an exchange)".into()
        }
        "EmptyExec" | "PlaceholderRowExec" => "produces no data to compute on".into(),
        "CooperativeExec" | "OutputRequirementExec" => "scheduling wrapper, no work".into(),
        "ScalarSubqueryExec" => "runs each uncorrelated scalar subquery once, then passes its \
                                 input through; the subquery plans below it are placed like any \
                                 other"
            .into(),
        _ => {
            if let Some(filter) = node.downcast_ref::<FilterExec>() {
                match GpuFilterExec::try_new(Arc::new(filter.clone())) {
                    Err(reason) => reason.0,
                    Ok(_) => "a GPU filter was not chosen for it".into(),
                }
            } else if let Some(sort) = node.downcast_ref::<SortExec>() {
                match GpuSortExec::try_new(Arc::new(sort.clone())) {
                    Err(reason) => reason.0,
                    Ok(_) => "a GPU sort was not chosen for it".into(),
                }
            } else if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
                match GpuAggregateExec::try_new(Arc::new(aggregate.clone())) {
                    Err(reason) => reason.0,
                    Ok(_) => "a GPU aggregation was not chosen for it".into(),
                }
            } else if let Some(join) = node.downcast_ref::<HashJoinExec>() {
                match GpuHashJoinExec::check(join) {
                    Err(reason) => reason.0,
                    Ok(()) => "a GPU join was not chosen for it".into(),
                }
            } else if let Some(cross) = node.downcast_ref::<CrossJoinExec>() {
                match GpuCrossJoinExec::check(cross) {
                    Err(reason) => reason.0,
                    Ok(()) => "a GPU cross join was not chosen for it".into(),
                }
            } else if is_window(node) {
                match GpuWindowExec::check(node) {
                    Err(reason) => reason.0,
                    Ok(()) => "a GPU window operator was not chosen for it".into(),
                }
            } else if let Some(top) = node.downcast_ref::<VectorTopKExec>() {
                match GpuVectorTopKExec::check(top) {
                    Err(reason) => reason.0,
                    Ok(()) => "a GPU vector top-k was not chosen for it".into(),
                }
            } else if is_column_selection(node) {
                "only selects or renames columns of a CPU input".into()
            } else if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                match GpuProjectionExec::try_new(Arc::new(projection.clone())) {
                    Err(reason) => reason.0,
                    Ok(_) => "its input and its consumer are on the CPU, and moving the data to \
                              the GPU and back would cost more than the projection"
                        .into(),
                }
            } else {
                "there is no GPU operator for it yet".into()
            }
        }
    }
}

/// Where the operators of a physical plan run, for reports: every GPU operator, every
/// operator left on the CPU that computes something (plumbing such as scans, exchanges and
/// column selections is not counted), and every host exchange.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Names of the GPU operators, in pre-order.
    pub gpu: Vec<String>,
    /// `(name, reason)` of each compute operator left on the CPU, in pre-order.
    pub cpu: Vec<(String, String)>,
    /// Names of the exchanges that move a GPU operator's output through the host (see
    /// [`is_host_exchange`]), in pre-order.
    pub host_exchanges: Vec<String>,
}

impl Placement {
    /// True when no compute operator runs on the CPU and at least one runs on the GPU.
    pub fn fully_on_gpu(&self) -> bool {
        self.cpu.is_empty() && !self.gpu.is_empty()
    }

    /// [`Placement::fully_on_gpu`], with no host exchange either: the data stays on the device
    /// from the first upload to the result.
    pub fn fully_on_device(&self) -> bool {
        self.fully_on_gpu() && self.host_exchanges.is_empty()
    }
}

/// Exchanges that merge or split partitions: over a GPU operator's output they download it and
/// move it on the host, whoever consumes it.
const PARTITION_EXCHANGES: &[&str] = &[
    "RepartitionExec",
    "CoalescePartitionsExec",
    "SortPreservingMergeExec",
    "UnionExec",
    "InterleaveExec",
];

/// Plumbing that passes batches along within a partition: a host exchange only between two GPU
/// operators (device, host, device again); under a CPU consumer the data goes to the host
/// anyway.
const PASS_THROUGH: &[&str] = &["CoalesceBatchesExec", "GlobalLimitExec", "LocalLimitExec"];

/// True when a GPU operator's output reaches `node` through plumbing only.
fn fed_by_gpu(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.children().into_iter().any(|child| {
        as_gpu_exec(child.as_ref()).is_some()
            || (PLUMBING.contains(&child.name()) && fed_by_gpu(child))
    })
}

/// True when host plumbing `node` moves a GPU operator's output through host memory: a
/// partition exchange fed by a GPU operator, or a pass-through node between two GPU operators
/// (`gpu_consumer`: the nearest computing node above it, through plumbing, is a GPU operator).
/// A partition exchange from one partition to one passes batches through.
pub fn is_host_exchange(node: &Arc<dyn ExecutionPlan>, gpu_consumer: bool) -> bool {
    let name = node.name();
    let moves_partitions = node.output_partitioning().partition_count() > 1
        || node.children().len() > 1
        || node
            .children()
            .iter()
            .any(|c| c.output_partitioning().partition_count() > 1);
    let exchange = if PARTITION_EXCHANGES.contains(&name) && moves_partitions {
        true
    } else {
        gpu_consumer && (PASS_THROUGH.contains(&name) || PARTITION_EXCHANGES.contains(&name))
    };
    exchange && fed_by_gpu(node)
}

/// Why a host exchange is one, for `EXPLAIN`.
const HOST_EXCHANGE: &str =
    "host exchange: a GPU operator's output is downloaded and moved on the host";

/// Calls `f` on every node in pre-order with whether it is a host exchange.
fn walk(
    node: &Arc<dyn ExecutionPlan>,
    gpu_consumer: bool,
    f: &mut impl FnMut(&Arc<dyn ExecutionPlan>, bool),
) {
    f(node, is_host_exchange(node, gpu_consumer));
    let on_gpu = as_gpu_exec(node.as_ref()).is_some();
    let below = if on_gpu {
        true
    } else if PLUMBING.contains(&node.name()) {
        gpu_consumer
    } else {
        false
    };
    for child in node.children() {
        walk(child, below, f);
    }
}

/// Classifies every node of `plan` (see [`Placement`]).
pub fn placement(plan: &Arc<dyn ExecutionPlan>) -> Placement {
    let mut out = Placement::default();
    walk(plan, false, &mut |node, host_exchange| {
        if as_gpu_exec(node.as_ref()).is_some() {
            out.gpu.push(node.name().to_string());
        } else if host_exchange {
            out.host_exchanges.push(node.name().to_string());
        } else if !PLUMBING.contains(&node.name()) && !is_column_selection(node.as_ref()) {
            out.cpu
                .push((node.name().to_string(), cpu_reason(node.as_ref())));
        }
    });
    out
}

/// The indented plan text (as `EXPLAIN` prints it) with each node marked `[GPU]`,
/// `[CPU: host exchange: …]` or `[CPU: reason]`.
pub fn annotate(plan: &Arc<dyn ExecutionPlan>) -> String {
    fn marks(node: &Arc<dyn ExecutionPlan>, out: &mut Vec<String>) {
        walk(node, false, &mut |node, host_exchange| {
            out.push(if as_gpu_exec(node.as_ref()).is_some() {
                "GPU".to_string()
            } else if host_exchange {
                format!("CPU: {HOST_EXCHANGE}")
            } else {
                format!("CPU: {}", cpu_reason(node.as_ref()))
            });
        });
    }
    let text = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    let mut all = Vec::new();
    marks(plan, &mut all);
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() != all.len() {
        // A node printed over several lines: keep DataFusion's text rather than guess.
        return text;
    }
    lines
        .iter()
        .zip(all)
        .map(|(line, mark)| format!("{line}  [{mark}]\n"))
        .collect()
}

impl GpuOffloadRule {
    /// The second, top-down pass: a computing projection still on the CPU moves to the GPU
    /// when its consumer is a GPU operator, which would upload its output anyway (so the
    /// projection costs no extra transfer there: e.g. a projection between a round-robin
    /// repartition and a GPU aggregate). Any other computing projection on the CPU is a
    /// fallback.
    fn place_projections(
        &self,
        node: Arc<dyn ExecutionPlan>,
        parent_on_gpu: bool,
        policy: FallbackPolicy,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let mut node = node;
        if let Some(projection) = node.downcast_ref::<ProjectionExec>()
            && !is_column_selection(node.as_ref())
        {
            match GpuProjectionExec::try_new(Arc::new(projection.clone())) {
                Ok(gpu) if parent_on_gpu => node = Arc::new(gpu),
                _ => {
                    let name = node.name().to_string();
                    self.fallback(policy, &name, &cpu_reason(node.as_ref()))?;
                }
            }
        }
        let on_gpu = as_gpu_exec(node.as_ref()).is_some();
        let children = node
            .children()
            .into_iter()
            .map(|child| self.place_projections(Arc::clone(child), on_gpu, policy))
            .collect::<DFResult<Vec<_>>>()?;
        replace_children_if_necessary(node, children)
    }
}

impl PhysicalOptimizerRule for GpuOffloadRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let options = config.extensions.get::<SpateOptions>();
        if let Err(fault) = self.gpu.check_health() {
            // The device failed earlier in the session: the query runs on the CPU, or not at
            // all, as `spate.gpu.on_device_error` says.
            return match options.map(|o| o.gpu.on_device_error).unwrap_or_default() {
                DeviceErrorPolicy::Cpu => {
                    log::warn!("running on the CPU: {fault}");
                    Ok(plan)
                }
                DeviceErrorPolicy::Error => Err(DataFusionError::Execution(format!(
                    "{fault}; the query was refused (spate.gpu.on_device_error = 'error'): \
                     SET spate.gpu.on_device_error = 'cpu' to run it on the CPU"
                ))),
            };
        }
        let policy = options.map(|o| o.gpu.fallback).unwrap_or_default();
        let one_partition = options.is_none_or(|o| o.gpu.one_partition);
        plan.transform_up(|node| {
            // Merging partitions of a GPU input stays on the device (no round trip over the
            // bus); over a CPU input it is host plumbing like any other exchange.
            if let Some(coalesce) = node.downcast_ref::<CoalescePartitionsExec>()
                && let Ok(gpu) = GpuCoalescePartitionsExec::try_new(Arc::new(coalesce.clone()))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            // A merge with a row limit over a GPU input: the merge on the device, then the
            // limit there too.
            if let Some(coalesce) = node.downcast_ref::<CoalescePartitionsExec>()
                && let Some(fetch) = coalesce.fetch()
                && let Ok(merge) = GpuCoalescePartitionsExec::try_new(Arc::new(
                    CoalescePartitionsExec::new(Arc::clone(coalesce.input())),
                ))
                && let Ok(gpu) = GpuLimitExec::try_new(Arc::new(GlobalLimitExec::new(
                    Arc::new(merge),
                    0,
                    Some(fetch),
                )))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            // So does a union of GPU inputs: their device batches pass through.
            if let Some(union) = node.downcast_ref::<UnionExec>()
                && union
                    .inputs()
                    .iter()
                    .all(|input| as_gpu_exec(input.as_ref()).is_some())
                && let Ok(gpu) = GpuUnionExec::try_new(Arc::new(union.clone()))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            // And a limit over a GPU input: it passes device batches until it has its rows.
            if matches!(node.name(), "GlobalLimitExec" | "LocalLimitExec")
                && let Ok(gpu) = GpuLimitExec::try_new(Arc::clone(&node))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if as_gpu_exec(node.as_ref()).is_some() || PLUMBING.contains(&node.name()) {
                return Ok(Transformed::no(node));
            }
            if let Some(filter) = node.downcast_ref::<FilterExec>()
                && let Ok(gpu) = GpuFilterExec::try_new(Arc::new(filter.clone()))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            // A projection only pays on the GPU when its input is already there: on its own
            // it would move data to the device and straight back (ping-pong).
            if let Some(projection) = node.downcast_ref::<ProjectionExec>()
                && as_gpu_exec(projection.input().as_ref()).is_some()
                && let Ok(gpu) = GpuProjectionExec::try_new(Arc::new(projection.clone()))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if let Some(sort) = node.downcast_ref::<SortExec>()
                && let Ok(gpu) = GpuSortExec::try_new(Arc::new(sort.clone()))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if let Some(aggregate) = node.downcast_ref::<AggregateExec>()
                && let Ok(gpu) = GpuAggregateExec::try_new(Arc::new(aggregate.clone()))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if node.downcast_ref::<HashJoinExec>().is_some()
                && let Ok(gpu) = GpuHashJoinExec::try_new(Arc::clone(&node))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if node.downcast_ref::<CrossJoinExec>().is_some()
                && let Ok(gpu) = GpuCrossJoinExec::try_new(Arc::clone(&node))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if is_window(node.as_ref())
                && let Ok(gpu) = GpuWindowExec::try_new(Arc::clone(&node))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            if node.downcast_ref::<VectorTopKExec>().is_some()
                && let Ok(gpu) = GpuVectorTopKExec::try_new(Arc::clone(&node))
            {
                return Ok(Transformed::yes(Arc::new(gpu) as Arc<dyn ExecutionPlan>));
            }
            // A projection whose input stays on the CPU is decided top-down below, once its
            // consumer's placement is known.
            if node.downcast_ref::<ProjectionExec>().is_some() {
                return Ok(Transformed::no(node));
            }
            let name = node.name().to_string();
            self.fallback(policy, &name, &cpu_reason(node.as_ref()))?;
            Ok(Transformed::no(node))
        })
        .and_then(|t| self.place_projections(t.data, false, policy))
        .and_then(super::nearest::preselect)
        .and_then(|plan| {
            let devices = self.gpu.devices().len();
            if one_partition && devices > 1 {
                // Spread over the devices where this pass can place the plan; one device
                // otherwise.
                match super::devices::across_devices(Arc::clone(&plan), config, devices) {
                    Some(placed) => Ok(placed),
                    None => super::regions::one_partition_per_device(plan, config),
                }
            } else if one_partition {
                super::regions::one_partition_per_device(plan, config)
            } else {
                Ok(plan)
            }
        })
    }

    fn name(&self) -> &str {
        "GpuOffload"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
