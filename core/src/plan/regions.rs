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
//!   first, by a [`GpuCoalescePartitionsExec`]. Over a CPU input that is the first upload: each
//!   partition is decoded in a task of its own and uploaded into the one device stream.
//! - Every node above is rebuilt, so its partitioning follows: a final aggregation or a
//!   partitioned join over one partition each side is correct as it is (one partition
//!   satisfies any hash distribution), and a sorted merge over one sorted partition passes it
//!   through.
//! - Where a CPU operator above a GPU region relied on its partitions (a partitioned CPU join
//!   whose other side keeps its hash partitions, say), the region's output is repartitioned
//!   back on the host, as it was planned: that edge downloads anyway.

use std::sync::Arc;

use datafusion::error::Result as DFResult;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, Partitioning, replace_children_if_necessary,
};

use super::offload::PLUMBING;
use crate::exec::{GpuCoalescePartitionsExec, as_gpu_exec};

/// `plan` with every GPU region in one partition (see the module docs).
pub fn one_partition_per_device(plan: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
    rewrite(plan, false)
}

/// Exchanges that only serve CPU parallelism, dropped under a GPU consumer.
fn is_cpu_exchange(node: &dyn ExecutionPlan) -> bool {
    matches!(node.name(), "RepartitionExec" | "CoalesceBatchesExec") && node.children().len() == 1
}

/// `node` rewritten; `gpu_consumer`: the nearest computing node above it (through plumbing) is
/// a GPU operator.
fn rewrite(node: Arc<dyn ExecutionPlan>, gpu_consumer: bool) -> DFResult<Arc<dyn ExecutionPlan>> {
    if gpu_consumer && is_cpu_exchange(node.as_ref()) {
        let input = Arc::clone(node.children()[0]);
        return rewrite(input, true);
    }
    let on_gpu = as_gpu_exec(node.as_ref()).is_some();
    let below = on_gpu || (gpu_consumer && PLUMBING.contains(&node.name()));
    let before: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
    let mut children = Vec::with_capacity(before.len());
    for child in &before {
        let rewritten = rewrite(Arc::clone(child), below)?;
        children.push(if on_gpu {
            merged(rewritten)?
        } else if !below {
            // A CPU consumer: give it the partitions it was planned with.
            as_planned(rewritten, child.output_partitioning())?
        } else {
            rewritten
        });
    }
    replace_children_if_necessary(node, children)
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
