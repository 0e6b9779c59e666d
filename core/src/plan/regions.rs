//! One GPU partition per device.
//!
//! DataFusion plans for CPU parallelism: a scan in several partitions, a round-robin
//! repartition to spread a single one, a hash repartition between the partial and final halves
//! of an aggregation and under a partitioned join, a sorted merge of per-partition sorts. The
//! offload rule keeps that shape, so a GPU subtree runs as several partitions whose exchanges
//! run on the host: each one a download, a host shuffle and an upload. A GPU needs none of it;
//! its parallelism is inside the kernels. After the offload rule, this pass gives every GPU
//! region one partition:
//! - An exchange (`RepartitionExec`, `CoalesceBatchesExec`) whose consumer is a GPU operator
//!   leaves the plan.
//! - A GPU operator whose input still has several partitions gets them merged on the device
//!   first, by a [`GpuCoalescePartitionsExec`] (except one that reads them in order itself,
//!   `vector_topk`'s). Over a CPU input that is the first upload: each
//!   partition is decoded in a task of its own and uploaded into the one device stream.
//! - Every node above is rebuilt, so its partitioning follows: a final aggregation or a
//!   partitioned join over one partition each side is correct as it is (one partition
//!   satisfies any hash distribution), and a sorted merge over one sorted partition passes it
//!   through. Under a GPU consumer such a merge leaves the plan (its fetch becomes a GPU
//!   limit) when the partition is in its order: it would download the partition only to pass
//!   it through on the host.
//! - A final aggregation over the partial one below it (now in the same partition) becomes one
//!   single-stage aggregation over the partial's input, when the GPU runs it and its schema is
//!   the final's.
//! - A union or an `InterleaveExec` under a GPU consumer becomes a [`GpuUnionExec`] of its
//!   inputs (a CPU input uploaded), merged into one partition on the device by the consumer:
//!   one partition satisfies the hash distribution an interleave served.
//! - A rewrite that DataFusion's `SanityCheckPlan` rejects (the sorted partitions of an
//!   ordered scan under a sorted merge) is dropped, and the plan keeps DataFusion's partitions.
//! - Where a CPU operator above a GPU region relied on its partitions (a partitioned CPU join
//!   whose other side keeps its hash partitions, say), the region's output is repartitioned
//!   back on the host, as it was planned: that edge downloads anyway.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DFResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    Distribution, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    replace_children_if_necessary,
};

use super::in_order;
use super::offload::PLUMBING;
use crate::exec::{
    GpuAggregateExec, GpuCoalescePartitionsExec, GpuLimitExec, GpuProjectionExec, GpuUnionExec,
    as_gpu_exec,
};

/// `plan` with every GPU region in one partition (see the module docs), or `plan` as it is
/// when the rewritten plan would not be valid.
///
/// Some plans rely on their partitions beyond what a node's distribution requirement says:
/// the sorted partitions of an ordered file scan that a sorted merge above a GPU filter
/// combines (merging them on the device would lose their order). Such a plan keeps
/// DataFusion's partitions: the rewrite is checked with DataFusion's own `SanityCheckPlan`, and
/// a rewrite that fails it, or fails to rebuild, is dropped.
pub fn one_partition_per_device(
    plan: Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let rewritten = rewrite(Arc::clone(&plan), false).and_then(|p| {
        p.transform_up(|node| {
            Ok(match single_stage(&node)? {
                Some(fused) => Transformed::yes(fused),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    });
    Ok(match rewritten {
        Ok(p)
            if SanityCheckPlan::new()
                .optimize(Arc::clone(&p), config)
                .is_ok() =>
        {
            p
        }
        _ => plan,
    })
}

/// A GPU final aggregation over a GPU partial one in the same partition, as one single-stage
/// GPU aggregation over the partial's input; `None` where that does not apply.
///
/// A pair the GPU could not run in two stages (COUNT(DISTINCT), whose partial state is a list)
/// is fused too when its final stage has one partition and the partial stage's input is on the
/// GPU: that input's partitions are merged on the device, and the single stage runs there.
fn single_stage(node: &Arc<dyn ExecutionPlan>) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    let (last, on_gpu) = if let Some(g) = node.downcast_ref::<GpuAggregateExec>() {
        (g.cpu().as_ref(), true)
    } else if let Some(a) = node.downcast_ref::<AggregateExec>() {
        (a, false)
    } else {
        return Ok(None);
    };
    let final_modes = if on_gpu {
        matches!(
            last.mode(),
            AggregateMode::Final | AggregateMode::FinalPartitioned
        )
    } else {
        last.mode() == &AggregateMode::Final
    };
    if !final_modes {
        return Ok(None);
    }
    let mut below = last.input();
    // A merge of one partition hands batches through; over CPU stages, a merge of several
    // becomes the device merge of the partial stage's input.
    loop {
        if let Some(c) = below.downcast_ref::<GpuCoalescePartitionsExec>()
            && c.children()[0].output_partitioning().partition_count() == 1
        {
            below = c.children()[0];
        } else if !on_gpu && matches!(below.name(), "CoalescePartitionsExec") {
            below = below.children()[0];
        } else {
            break;
        }
    }
    let first = if let Some(g) = below.downcast_ref::<GpuAggregateExec>() {
        g.cpu().as_ref()
    } else if let Some(a) = below.downcast_ref::<AggregateExec>()
        && !on_gpu
    {
        a
    } else {
        return Ok(None);
    };
    let mut input = Arc::clone(first.input());
    if first.mode() != &AggregateMode::Partial || first.group_expr().has_grouping_set() {
        return Ok(None);
    }
    if !on_gpu {
        // The exchanges that spread the partial stage's input serve CPU parallelism only.
        while is_cpu_exchange(input.as_ref()) {
            input = Arc::clone(input.children()[0]);
        }
        if as_gpu_exec(input.as_ref()).is_none() {
            return Ok(None);
        }
        input = merged(input)?;
    } else if input.output_partitioning().partition_count() > 1 {
        return Ok(None);
    }
    let Ok(single) = AggregateExec::try_new(
        AggregateMode::Single,
        first.group_expr().clone(),
        first.aggr_expr().to_vec(),
        first.filter_expr().to_vec(),
        Arc::clone(&input),
        input.schema(),
    ) else {
        return Ok(None);
    };
    if single.schema() != last.schema() {
        return Ok(None);
    }
    let single = single.with_limit_options(last.limit_options());
    Ok(GpuAggregateExec::try_new(Arc::new(single))
        .ok()
        .map(|gpu| Arc::new(gpu) as Arc<dyn ExecutionPlan>))
}

/// Exchanges that only serve CPU parallelism, dropped under a GPU consumer.
fn is_cpu_exchange(node: &dyn ExecutionPlan) -> bool {
    matches!(node.name(), "RepartitionExec" | "CoalesceBatchesExec") && node.children().len() == 1
}

/// A CPU operator that pairs the partitions of its inputs (a partitioned CPU join): it needs
/// them hash-partitioned as planned.
pub(super) fn pairs_partitions(node: &dyn ExecutionPlan) -> bool {
    node.input_distribution_requirements()
        .into_per_child()
        .iter()
        .any(|d| {
            #[expect(
                deprecated,
                reason = "HashPartitioned is what DataFusion 55 still plans"
            )]
            let keyed = matches!(
                d,
                Distribution::HashPartitioned(_) | Distribution::KeyPartitioned(_)
            );
            keyed
        })
}

/// `node` rewritten; `gpu_consumer`: the nearest computing node above it (through plumbing) is
/// a GPU operator.
fn rewrite(node: Arc<dyn ExecutionPlan>, gpu_consumer: bool) -> DFResult<Arc<dyn ExecutionPlan>> {
    if gpu_consumer && is_cpu_exchange(node.as_ref()) {
        let input = Arc::clone(node.children()[0]);
        return rewrite(input, true);
    }
    // A projection left on the CPU between two CPU nodes that now sit in a GPU region (under a
    // union that became a GPU union, say) runs on the GPU when its input is there.
    if gpu_consumer
        && let Some(projection) = node.downcast_ref::<ProjectionExec>()
        && let Some(gpu) = projection_on_gpu(projection)?
    {
        return Ok(gpu);
    }
    // A sorted merge between GPU operators whose input, rewritten, is one partition on the
    // device already in its order (a GPU sort's): it would only download it and pass it
    // through on the host. (An input whose partitions were merged unsorted keeps the merge,
    // and the plan DataFusion made: the sanity check cannot see the order it establishes.)
    if gpu_consumer && let Some(merge) = node.downcast_ref::<SortPreservingMergeExec>() {
        let input = rewrite(Arc::clone(merge.input()), true)?;
        if input.output_partitioning().partition_count() == 1
            && as_gpu_exec(input.as_ref()).is_some()
            && input
                .equivalence_properties()
                .ordering_satisfy(merge.expr().clone())?
        {
            return Ok(match merge.fetch() {
                None => input,
                Some(fetch) => {
                    let limit = Arc::new(GlobalLimitExec::new(input, 0, Some(fetch)));
                    match GpuLimitExec::try_new(Arc::clone(&limit) as Arc<dyn ExecutionPlan>) {
                        Ok(gpu) => Arc::new(gpu),
                        Err(_) => limit,
                    }
                }
            });
        }
        // The merge stays, over the input rewritten once (it is plumbing under a GPU
        // consumer, which the general case below would rewrite again).
        return replace_children_if_necessary(node, vec![input]);
    }
    if gpu_consumer && matches!(node.name(), "InterleaveExec" | "UnionExec") {
        let children = node
            .children()
            .into_iter()
            .map(|c| rewrite(Arc::clone(c), true))
            .collect::<DFResult<Vec<_>>>()?;
        return union_of(children);
    }
    let on_gpu = as_gpu_exec(node.as_ref()).is_some();
    // An operator that reads its inputs' partitions in order keeps them (see
    // `GpuExec::reads_partitions_in_order`).
    if in_order::reads_in_order(node.as_ref()) {
        let below = as_gpu_exec(node.as_ref()).is_some();
        let children = node
            .children()
            .into_iter()
            .map(|c| rewrite_in_order(Arc::clone(c), below))
            .collect::<DFResult<Vec<_>>>()?;
        return replace_children_if_necessary(node, children);
    }
    let below = on_gpu || (gpu_consumer && PLUMBING.contains(&node.name()));
    let before: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
    // A CPU consumer that pairs the partitions of its inputs (a partitioned join) gets them as
    // planned; any other takes one partition as it takes several.
    let co_partitioned = !on_gpu && before.len() > 1 && pairs_partitions(node.as_ref());
    let mut children = Vec::with_capacity(before.len());
    for child in &before {
        let rewritten = rewrite(Arc::clone(child), below)?;
        children.push(if on_gpu {
            merged(rewritten)?
        } else if co_partitioned {
            as_planned(rewritten, child.output_partitioning())?
        } else {
            rewritten
        });
    }
    replace_children_if_necessary(node, children)
}

/// A subtree whose partitions the operator above reads one after the other, in order
/// (`in_order::reads_in_order`); `gpu_consumer`: the nearest computing node above is a GPU
/// operator. Filters, projections and unions, whose partitions hold their inputs' rows in
/// order (`in_order::keeps_order`), keep their partitions (a union under a GPU consumer
/// becomes a GPU union of its inputs), and the exchanges and merges below them are dropped:
/// they would reorder the rows. Below anything else the rewrite goes on as usual.
fn rewrite_in_order(
    node: Arc<dyn ExecutionPlan>,
    gpu_consumer: bool,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    if is_cpu_exchange(node.as_ref()) || in_order::reorders(node.as_ref()) {
        return rewrite_in_order(Arc::clone(node.children()[0]), gpu_consumer);
    }
    if !in_order::keeps_order(node.as_ref()) {
        return rewrite(node, gpu_consumer);
    }
    let on_gpu = as_gpu_exec(node.as_ref()).is_some();
    let below = on_gpu || (gpu_consumer && PLUMBING.contains(&node.name()));
    let children = node
        .children()
        .into_iter()
        .map(|c| rewrite_in_order(Arc::clone(c), below))
        .collect::<DFResult<Vec<_>>>()?;
    if gpu_consumer && node.name() == "UnionExec" {
        return union_of(children);
    }
    replace_children_if_necessary(node, children)
}

/// `projection` on the GPU over its rewritten input, when that input is a GPU operator (its CPU
/// exchanges dropped); `None` otherwise.
fn projection_on_gpu(projection: &ProjectionExec) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    // Its input is rewritten only for a projection the GPU can compute (the rewrite above
    // redoes it otherwise).
    if GpuProjectionExec::try_new(Arc::new(projection.clone())).is_err() {
        return Ok(None);
    }
    let input = rewrite(Arc::clone(projection.input()), true)?;
    if as_gpu_exec(input.as_ref()).is_none() {
        return Ok(None);
    }
    let cpu = ProjectionExec::try_new(projection.expr().to_vec(), merged(input)?)?;
    Ok(GpuProjectionExec::try_new(Arc::new(cpu))
        .ok()
        .map(|gpu| Arc::new(gpu) as Arc<dyn ExecutionPlan>))
}

/// The inputs of a union or an `InterleaveExec` under a GPU consumer, as a [`GpuUnionExec`]
/// when some input is on the GPU (a CPU input is uploaded: under a GPU consumer its batches
/// go up anyway). An interleave paired its inputs' hash partitions for a consumer that needs
/// each key in one partition; that consumer now merges the union's partitions into one on the
/// device, which satisfies it. Column renames the union puts on its inputs (where their schemas
/// differ from the union's in names or nullability) run on the GPU over a GPU input.
fn union_of(children: Vec<Arc<dyn ExecutionPlan>>) -> DFResult<Arc<dyn ExecutionPlan>> {
    let union = UnionExec::try_new(children)?;
    let Some(cpu) = union.downcast_ref::<UnionExec>() else {
        return Ok(union);
    };
    let inputs = cpu
        .inputs()
        .iter()
        .map(|input| match input.downcast_ref::<ProjectionExec>() {
            Some(p) if as_gpu_exec(p.input().as_ref()).is_some() => {
                GpuProjectionExec::try_new(Arc::new(p.clone())).map_or_else(
                    |_| Arc::clone(input),
                    |g| Arc::new(g) as Arc<dyn ExecutionPlan>,
                )
            }
            _ => Arc::clone(input),
        })
        .collect::<Vec<_>>();
    let union = UnionExec::try_new(inputs)?;
    Ok(match union.downcast_ref::<UnionExec>() {
        Some(u) => GpuUnionExec::try_new(Arc::new(u.clone())).map_or_else(
            |_| Arc::clone(&union),
            |g| Arc::new(g) as Arc<dyn ExecutionPlan>,
        ),
        None => union,
    })
}

/// `input` in one partition: as it is, or merged on the device.
fn merged(input: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
    if input.output_partitioning().partition_count() <= 1 {
        return Ok(input);
    }
    let coalesce = Arc::new(CoalescePartitionsExec::new(input));
    Ok(Arc::new(GpuCoalescePartitionsExec::merging(coalesce)))
}

/// `input` repartitioned on the host to `planned` when the rewrite changed its partition count.
fn as_planned(
    input: Arc<dyn ExecutionPlan>,
    planned: &Partitioning,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let count = planned.partition_count();
    if input.output_partitioning().partition_count() == count {
        return Ok(input);
    }
    let partitioning = match planned {
        Partitioning::Hash(..) => planned.clone(),
        _ if count == 1 => return Ok(Arc::new(CoalescePartitionsExec::new(input))),
        _ => Partitioning::RoundRobinBatch(count),
    };
    Ok(Arc::new(RepartitionExec::try_new(input, partitioning)?))
}
