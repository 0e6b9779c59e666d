//! The CPU half of split-and-retry for a partial aggregation (`exec/retry.rs`): a piece of a
//! batch that still runs out of device memory after three splits gets its states from
//! DataFusion's own partial aggregation.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::ChildrenPropertiesMode;
use datafusion::physical_plan::{ExecutionPlan, ReplaceChildrenOptions};

/// A partial aggregation's states for `rows`, computed by its CPU twin (DataFusion's own
/// `AggregateExec`, over the rows as its only input): split-and-retry's fallback for a piece
/// that still runs out of device memory. The states have DataFusion's layout, as the GPU's do.
pub(super) fn states_on_cpu(
    cpu: &Arc<AggregateExec>,
    context: &Arc<TaskContext>,
    rows: RecordBatch,
) -> DFResult<RecordBatch> {
    let source = MemorySourceConfig::try_new_exec(&[vec![rows]], cpu.input().schema(), None)?;
    // The rows are a slice of the input's partition, with its properties (its order).
    let twin = Arc::clone(cpu).replace_children(
        vec![source as Arc<dyn ExecutionPlan>],
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep),
    )?;
    // DataFusion's aggregation over batches in memory waits on nothing outside it, but its
    // memory source yields when the tokio task's budget runs out, and this task cannot yield
    // here: it runs without a budget.
    let collect = datafusion::physical_plan::common::collect(twin.execute(0, Arc::clone(context))?);
    let states = futures::executor::block_on(tokio::task::coop::unconstrained(collect))?;
    Ok(arrow::compute::concat_batches(&cpu.schema(), &states)?)
}
