//! Inputs read in order.
//!
//! `vector_topk` numbers its inputs' rows by position: each input's partitions read one after
//! the other, in order (`VectorTopKExec`, `GpuVectorTopKExec`). Planning must then not shuffle
//! rows between the scan and the operator. DataFusion spreads a filter's input round-robin
//! for CPU parallelism, a view planned on its own may merge partitions (on the device too, by
//! the GPU rules that planned it), and either would reorder the rows, or make their order
//! depend on timing. [`InOrderInputs`] removes such merges and spreads below the operator,
//! through the operators that compute each partition from the same partition of their input
//! (filters, projections, batch coalescing) and through unions ([`keeps_order`]); the region
//! pass keeps them out (`regions::rewrite_in_order`), and the multi-device pass leaves such an
//! operator on one device.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DFResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, replace_children_if_necessary};

use crate::exec::{
    GpuCoalescePartitionsExec, GpuExchangeExec, GpuFilterExec, GpuProjectionExec, GpuUnionExec,
    as_gpu_exec,
};
use crate::vector::VectorTopKExec;

/// Removes the merges and spreads below operators that read their inputs in order.
#[derive(Debug, Default)]
pub struct InOrderInputs;

/// Whether `node` reads its inputs' partitions one after the other, in order.
pub(crate) fn reads_in_order(node: &dyn ExecutionPlan) -> bool {
    node.downcast_ref::<VectorTopKExec>().is_some()
        || as_gpu_exec(node).is_some_and(|g| g.reads_partitions_in_order())
}

/// A node that moves rows between partitions without computing anything: a round-robin
/// spread, a merge without a row limit, or an exchange between devices (a view planned on
/// its own may have spread its rows over the devices).
pub(crate) fn reorders(node: &dyn ExecutionPlan) -> bool {
    if let Some(r) = node.downcast_ref::<RepartitionExec>() {
        return matches!(r.partitioning(), Partitioning::RoundRobinBatch(_));
    }
    if let Some(c) = node.downcast_ref::<CoalescePartitionsExec>() {
        return c.fetch().is_none();
    }
    node.downcast_ref::<GpuCoalescePartitionsExec>().is_some()
        || node.downcast_ref::<GpuExchangeExec>().is_some()
}

/// A node whose partitions, read in order, hold its inputs' rows in their order: one that
/// computes partition `p` from partition `p` of its one input, without a row limit (a
/// limit of the whole output would become one per partition), or a union, whose partitions
/// are its inputs' one after the other.
pub(crate) fn keeps_order(node: &dyn ExecutionPlan) -> bool {
    let per_partition = node.downcast_ref::<FilterExec>().is_some()
        || node.downcast_ref::<ProjectionExec>().is_some()
        || node.downcast_ref::<GpuFilterExec>().is_some()
        || node.downcast_ref::<GpuProjectionExec>().is_some()
        || matches!(node.name(), "CoalesceBatchesExec" | "CooperativeExec");
    let union =
        node.downcast_ref::<UnionExec>().is_some() || node.downcast_ref::<GpuUnionExec>().is_some();
    (per_partition && node.fetch().is_none()) || union
}

/// `input` of an in-order reader without the nodes that would reorder its rows.
pub(crate) fn unmerged(input: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
    if reorders(input.as_ref()) {
        return unmerged(Arc::clone(input.children()[0]));
    }
    if !keeps_order(input.as_ref()) {
        return Ok(input);
    }
    let children = input
        .children()
        .into_iter()
        .map(|c| unmerged(Arc::clone(c)))
        .collect::<DFResult<Vec<_>>>()?;
    replace_children_if_necessary(input, children)
}

impl PhysicalOptimizerRule for InOrderInputs {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !reads_in_order(node.as_ref()) {
                return Ok(Transformed::no(node));
            }
            let children = node
                .children()
                .into_iter()
                .map(|c| unmerged(Arc::clone(c)))
                .collect::<DFResult<Vec<_>>>()?;
            Ok(Transformed::yes(replace_children_if_necessary(
                node, children,
            )?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "InOrderInputs"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
