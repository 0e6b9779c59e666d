//! Running a GPU operator's CPU twin (the DataFusion operator it replaces) over host rows:
//! split-and-retry's fallback (`retry.rs`) for a piece of a batch that still runs out of
//! device memory after three splits.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;

/// A one-partition input of `rows`, of `schema`.
pub(crate) fn rows_input(rows: RecordBatch, schema: SchemaRef) -> DFResult<Arc<dyn ExecutionPlan>> {
    Ok(MemorySourceConfig::try_new_exec(&[vec![rows]], schema, None)? as Arc<dyn ExecutionPlan>)
}

/// The rows of `plan`'s partition 0, whose inputs are rows in memory ([`rows_input`]), in one
/// batch (see [`run_batches`]).
pub(crate) fn run(
    plan: &Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
) -> DFResult<RecordBatch> {
    let batches = run_batches(plan, context)?;
    Ok(arrow::compute::concat_batches(&plan.schema(), &batches)?)
}

/// The batches of `plan`'s partition 0, whose inputs are rows in memory ([`rows_input`]). It
/// runs on this thread, which waits for it: DataFusion's operators over rows in memory wait on
/// nothing outside them, but its memory source yields when the tokio task's budget runs out,
/// and the task cannot yield here, so it runs without a budget.
pub(crate) fn run_batches(
    plan: &Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
) -> DFResult<Vec<RecordBatch>> {
    let rows = datafusion::physical_plan::common::collect(plan.execute(0, Arc::clone(context))?);
    futures::executor::block_on(tokio::task::coop::unconstrained(rows))
}
