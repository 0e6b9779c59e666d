//! The CPU half of split-and-retry for a partial aggregation (`exec/retry.rs`): a piece of a
//! batch that still runs out of device memory after three splits gets its states from
//! DataFusion's own partial aggregation.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::ChildrenPropertiesMode;
use datafusion::physical_plan::{ExecutionPlan, ReplaceChildrenOptions};

use crate::exec::cpu_twin;

/// A partial aggregation's states for `rows`, computed by its CPU twin (DataFusion's own
/// `AggregateExec`, over the rows as its only input). The states have DataFusion's layout, as
/// the GPU's do.
pub(super) fn states_on_cpu(
    cpu: &Arc<AggregateExec>,
    context: &Arc<TaskContext>,
    rows: RecordBatch,
) -> DFResult<RecordBatch> {
    let input = cpu_twin::rows_input(rows, cpu.input().schema())?;
    // The rows are a slice of the input's partition, with its properties (its order).
    let twin = Arc::clone(cpu).replace_children(
        vec![input],
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep),
    )?;
    cpu_twin::run(&twin, context)
}
