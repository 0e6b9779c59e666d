//! `ORDER BY <distance>(emb, <constant>) LIMIT k` on the GPU without the distance column: a
//! [`GpuNearestExec`] under the GPU top-k keeps, of each batch, the `k` rows that can be first,
//! so the sort, and the projection that computes the distance, see `k` rows per batch.
//!
//! The pass applies to a GPU sort with a fetch of at most 4,096 rows and one sort key: a
//! Spate distance (`cosine_distance`, `inner_product`, `array_distance`) between an embedding
//! column and a constant vector of numbers without NULLs, either as the key itself or as the
//! column a GPU projection right below the sort computes. With a second key, rows tied on the
//! distance would be chosen by row instead of by that key, so the plan stays as it is.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DFResult;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, PhysicalSortExpr, ScalarFunctionExpr};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, replace_children_if_necessary};

use crate::exec::nearest::{GpuNearestExec, Preselection};
use crate::exec::{GpuExec, GpuProjectionExec, GpuSortExec};
use crate::expr::constant_vector;
use crate::vector::{Elem, Metric};

/// The largest fetch pre-selected (the kernels' largest k).
const MAX_K: usize = spate_kernels::vector_topk::MAX_K;

/// `plan` with a [`GpuNearestExec`] under every GPU top-k sort by a distance (see the module
/// docs).
pub fn preselect(plan: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        Ok(match under_sort(&node)? {
            Some(rewritten) => Transformed::yes(rewritten),
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// The distance `expr` computes over `input`: its embedding column, the constant as f32s and
/// the metric; `None` when it is not a Spate distance of a column and a constant.
fn distance_of(
    expr: &Arc<dyn PhysicalExpr>,
    input: &Arc<dyn ExecutionPlan>,
) -> Option<(usize, Vec<f32>, Metric)> {
    let f = expr.downcast_ref::<ScalarFunctionExpr>()?;
    if !crate::vector::is_spate_distance(f.fun()) {
        return None;
    }
    let metric = Metric::of_function(f.fun().name())?;
    let [a, b] = f.args() else { return None };
    let (column, constant) = match (
        a.downcast_ref::<Column>(),
        b.downcast_ref::<Literal>(),
        b.downcast_ref::<Column>(),
        a.downcast_ref::<Literal>(),
    ) {
        (Some(c), Some(l), _, _) | (_, _, Some(c), Some(l)) => (c, l),
        _ => return None,
    };
    let schema = input.schema();
    let field = schema.fields().get(column.index())?;
    let (_, dim) = Elem::of(field.data_type())?;
    let query = constant_vector(constant.value())?;
    (query.len() == dim).then_some((column.index(), query, metric))
}

fn selection(
    key: &PhysicalSortExpr,
    column: usize,
    query: Vec<f32>,
    metric: Metric,
    k: usize,
) -> Preselection {
    Preselection {
        column,
        query: Arc::new(query),
        metric,
        k,
        descending: key.options.descending,
        nulls_first: key.options.nulls_first,
        key: key.to_string(),
    }
}

/// `node` (a GPU top-k sort by a distance) with the pre-selection under it, or `None`.
fn under_sort(node: &Arc<dyn ExecutionPlan>) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    let Some(gpu) = node.downcast_ref::<GpuSortExec>() else {
        return Ok(None);
    };
    let Some(sort) = gpu.replaces().and_then(|c| c.downcast_ref::<SortExec>()) else {
        return Ok(None);
    };
    let Some(k) = sort.fetch().filter(|k| (1..=MAX_K).contains(k)) else {
        return Ok(None);
    };
    let [key] = sort.expr().as_ref() else {
        return Ok(None);
    };
    let input = sort.input();
    if input.downcast_ref::<GpuNearestExec>().is_some() {
        return Ok(None);
    }
    // The key is the distance itself.
    if let Some((column, query, metric)) = distance_of(&key.expr, input) {
        let nearest = Arc::new(GpuNearestExec::new(
            Arc::clone(input),
            selection(key, column, query, metric, k),
        ));
        return Ok(Some(replace_children_if_necessary(
            Arc::clone(node),
            vec![nearest],
        )?));
    }
    // The key is a column the GPU projection below computes as the distance.
    let Some(at) = key.expr.downcast_ref::<Column>().map(Column::index) else {
        return Ok(None);
    };
    let Some(projection) = input
        .downcast_ref::<GpuProjectionExec>()
        .and_then(|g| g.replaces())
        .and_then(|c| c.downcast_ref::<ProjectionExec>())
    else {
        return Ok(None);
    };
    let below = projection.input();
    if below.downcast_ref::<GpuNearestExec>().is_some() {
        return Ok(None);
    }
    let Some(computed) = projection.expr().get(at) else {
        return Ok(None);
    };
    let Some((column, query, metric)) = distance_of(&computed.expr, below) else {
        return Ok(None);
    };
    // Printed as the distance it sorts by, not as the projection's output column.
    let key = PhysicalSortExpr::new(Arc::clone(&computed.expr), key.options);
    let nearest = Arc::new(GpuNearestExec::new(
        Arc::clone(below),
        selection(&key, column, query, metric, k),
    ));
    let projection = replace_children_if_necessary(Arc::clone(input), vec![nearest])?;
    Ok(Some(replace_children_if_necessary(
        Arc::clone(node),
        vec![projection],
    )?))
}
