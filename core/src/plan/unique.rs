//! Which sets of a plan's output columns are known to be unique: no two rows are equal on
//! all of them, NULL counting as equal to NULL (as GROUP BY groups them).
//!
//! A GPU join whose build keys are unique makes at most one output row per probe row, so its
//! output fits the probe batch's own bound and its count can stay on the device
//! (`exec::join`, `probe_unique`): no pair total comes back. Knowing it when the plan is made,
//! rather than learning it from the build on the device, saves the readback of the first
//! probe batch, which at small scales is the only one.
//!
//! What is known comes from two places, and flows up through the operators that keep rows
//! apart:
//! - a table cached in device memory, whose load proves columns unique from their values
//!   (`exec::column_facts`);
//! - an aggregation, whose group keys are unique in its output (but for a partial
//!   aggregation, whose groups repeat across batches and partitions, and grouping sets).
//!
//! Filters, projections of columns, sorts, limits and exchanges keep every row at most once,
//! so what is unique below them is unique above. An inner join keeps one side's unique sets
//! when the other side's join keys are unique (each row of the first side then appears at
//! most once), and a pair of unique sets, one from each side, is unique in any inner join;
//! semi and anti joins keep their side's. Anything else is not known, which costs a
//! readback, never a wrong answer.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;

use crate::exec::as_gpu_exec;
use crate::exec::cache::GpuCachedScanExec;
use crate::exec::coalesce::GpuCoalescePartitionsExec;

/// True when no two rows of `plan`'s output are equal on all of `columns` (NULL equal to
/// NULL), as far as the plan shows. An empty set is never known to be unique.
pub fn is_unique(plan: &Arc<dyn ExecutionPlan>, columns: &[usize]) -> bool {
    if columns.is_empty() {
        return false;
    }
    if let Some(scan) = plan.downcast_ref::<GpuCachedScanExec>() {
        return columns.iter().any(|&c| scan.column_facts(c).unique);
    }
    // A GPU operator computes the rows of the CPU node it replaced, over the same children.
    let node: &dyn ExecutionPlan = match as_gpu_exec(plan.as_ref()).and_then(|g| g.replaces()) {
        Some(cpu) => cpu,
        None => plan.as_ref(),
    };
    if let Some(filter) = node.downcast_ref::<FilterExec>() {
        let Some(inputs) = map_columns(columns, |c| {
            filter
                .projection()
                .as_ref()
                .map_or(Some(c), |p| p.get(c).copied())
        }) else {
            return false;
        };
        return is_unique(filter.input(), &inputs);
    }
    if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        // Only the columns passed through: if they are unique, so is any set holding them.
        let inputs: Vec<usize> = columns
            .iter()
            .filter_map(|&c| {
                let e = projection.expr().get(c)?;
                e.expr.downcast_ref::<Column>().map(Column::index)
            })
            .collect();
        return is_unique(projection.input(), &inputs);
    }
    if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
        return aggregate_keys_unique(aggregate, columns);
    }
    if let Some(join) = node.downcast_ref::<HashJoinExec>() {
        return join_keeps_unique(join, columns);
    }
    let passes_rows = node.is::<SortExec>()
        || node.is::<SortPreservingMergeExec>()
        || node.is::<CoalescePartitionsExec>()
        || node.is::<GpuCoalescePartitionsExec>()
        // Deprecated in DataFusion 55, but still planned: named, as `plan::regions` does.
        || node.name() == "CoalesceBatchesExec"
        || node.is::<RepartitionExec>()
        || node.is::<GlobalLimitExec>()
        || node.is::<LocalLimitExec>();
    match node.children().as_slice() {
        [input] if passes_rows => is_unique(input, columns),
        _ => false,
    }
}

/// `columns` mapped by `f`, or `None` when one does not map.
fn map_columns(columns: &[usize], f: impl Fn(usize) -> Option<usize>) -> Option<Vec<usize>> {
    columns.iter().map(|&c| f(c)).collect()
}

/// An aggregation's output holds one row per group: its group keys (its first columns) are
/// unique, and with no keys it has one row. Not a partial aggregation's (each batch or
/// partition has its own groups), nor one with grouping sets.
fn aggregate_keys_unique(aggregate: &AggregateExec, columns: &[usize]) -> bool {
    if matches!(aggregate.mode(), AggregateMode::Partial) || !aggregate.group_expr().is_single() {
        return false;
    }
    let keys = aggregate.group_expr().expr().len();
    (0..keys).all(|k| columns.contains(&k))
}

/// See the module docs: which unique sets a hash join's output keeps.
fn join_keeps_unique(join: &HashJoinExec, columns: &[usize]) -> bool {
    let left_width = join.left().schema().fields().len();
    // Output columns, before the join's own projection: the left side's, then the right's
    // (for inner joins), or one side's only (semi and anti joins).
    let Some(columns) = map_columns(columns, |c| match &join.projection {
        Some(p) => p.get(c).copied(),
        None => Some(c),
    }) else {
        return false;
    };
    match join.join_type() {
        JoinType::LeftSemi | JoinType::LeftAnti => is_unique(join.left(), &columns),
        JoinType::RightSemi | JoinType::RightAnti => is_unique(join.right(), &columns),
        JoinType::Inner => {
            let left: Vec<usize> = columns
                .iter()
                .copied()
                .filter(|&c| c < left_width)
                .collect();
            let right: Vec<usize> = columns
                .iter()
                .filter(|&&c| c >= left_width)
                .map(|&c| c - left_width)
                .collect();
            let keys = |side: usize| -> Option<Vec<usize>> {
                join.on()
                    .iter()
                    .map(|on| {
                        let e = if side == 0 { &on.0 } else { &on.1 };
                        e.downcast_ref::<Column>().map(Column::index)
                    })
                    .collect()
            };
            let keys_unique = |side: usize, input: &Arc<dyn ExecutionPlan>| {
                keys(side).is_some_and(|k| is_unique(input, &k))
            };
            let left_unique = is_unique(join.left(), &left);
            let right_unique = is_unique(join.right(), &right);
            // Each right row appears at most once when the left keys are unique, and the
            // other way round; a pair of unique sets is unique in any case.
            (right_unique && keys_unique(0, join.left()))
                || (left_unique && keys_unique(1, join.right()))
                || (left_unique && right_unique)
        }
        // Outer joins pad with NULLs, which repeat.
        _ => false,
    }
}
