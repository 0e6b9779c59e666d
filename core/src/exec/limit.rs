//! `GpuLimitExec`: DataFusion's `GlobalLimitExec` and `LocalLimitExec` over a GPU input, on
//! the device.
//!
//! A limit computes nothing, but on the host between two GPU operators it is an exchange: the
//! input's batches are downloaded for it and uploaded again. Here the first `skip` rows are
//! dropped and the input's device batches pass through until `fetch` rows have gone by: a
//! batch cut at its end is a prefix (a view, no copy) unless it holds strings, and is gathered
//! otherwise. The input is dropped then, so it stops. Each batch's row count is read back (one
//! readback per batch, as a limit must know it); over a CPU consumer only the rows kept are
//! downloaded.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;

use super::{DeviceBatchStream, GpuExec, TransferMetrics, as_gpu_exec, device_input, to_df};
use crate::column::{DeviceBatch, DeviceValues, Gather, gather_columns};
use crate::expr::Unsupported;

/// A limit over a GPU input, on the device.
#[derive(Debug)]
pub struct GpuLimitExec {
    /// The `GlobalLimitExec` or `LocalLimitExec` this replaces.
    cpu: Arc<dyn ExecutionPlan>,
    skip: usize,
    /// `None`: every row after `skip`.
    fetch: Option<usize>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuLimitExec {
    /// The GPU version of `limit`, when its input is a GPU operator.
    pub fn try_new(limit: Arc<dyn ExecutionPlan>) -> Result<Self, Unsupported> {
        let (input, skip, fetch) = if let Some(g) = limit.downcast_ref::<GlobalLimitExec>() {
            (g.input(), g.skip(), g.fetch())
        } else if let Some(l) = limit.downcast_ref::<LocalLimitExec>() {
            (l.input(), 0, Some(l.fetch()))
        } else {
            return Err(Unsupported("it is not a limit".into()));
        };
        if as_gpu_exec(input.as_ref()).is_none() {
            return Err(Unsupported(
                "its input is on the CPU: a limit of host batches needs no GPU".into(),
            ));
        }
        Ok(GpuLimitExec {
            cpu: limit,
            skip,
            fetch,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        crate::exec::rebuild_gpu_dyn(cpu, GpuLimitExec::try_new)
    }
}

/// Rows `start..start + rows` of `batch` (host-counted): a view of a prefix, or a gather.
fn rows_of(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    start: usize,
    rows: usize,
) -> crate::error::Result<DeviceBatch> {
    if start == 0 && rows == batch.bound() {
        return Ok(batch.clone());
    }
    // A prefix view keeps a string column's bytes whole, which only a producer that leaves its
    // count on the device may do (`DeviceColumn::prefix`): a cut string column is gathered.
    let strings = batch.columns().iter().any(|c| {
        matches!(
            c.values(),
            DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. }
        )
    });
    let columns = if start == 0 && !strings {
        batch
            .columns()
            .iter()
            .map(|c| c.prefix(rows))
            .collect::<crate::error::Result<Vec<_>>>()?
    } else {
        // Pairs of rows start.. with one "right" row: the indices start..start + rows. A
        // gather takes each row once, so strings are sized exactly.
        let (indices, _) = spate_kernels::cross::cross_pairs(stream, start, rows, 1)?;
        let gathers: Vec<Gather<'_>> = batch
            .columns()
            .iter()
            .map(|c| Gather::rows(c, indices.as_slice()))
            .collect();
        gather_columns(stream, &gathers)?
    };
    DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows)
}

impl DisplayAs for GpuLimitExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuLimitExec {
    fn name(&self) -> &str {
        "GpuLimitExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.cpu.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.cpu.children()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        self.cpu.maintains_input_order()
    }

    fn input_distribution_requirements(
        &self,
    ) -> datafusion::physical_plan::InputDistributionRequirements {
        self.cpu.input_distribution_requirements()
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let cpu = Arc::clone(&self.cpu).replace_children(children, options)?;
        Self::rebuild(cpu)
    }

    crate::exec::gpu_plan_methods!(cpu);
}

impl GpuExec for GpuLimitExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn replaces(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.cpu.as_ref())
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        // It passes batches (or views of them) through: no device traffic of its own.
        None
    }

    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let input = self.cpu.children()[0];
        let transfer = TransferMetrics::passing_through(&self.metrics, partition);
        let batches = device_input(input, partition, &context, &stream, &transfer)?;
        // Rows still to skip, and still to pass.
        let state = (batches, self.skip, self.fetch.unwrap_or(usize::MAX), stream);
        Ok(Box::pin(futures::stream::unfold(
            state,
            |(mut batches, mut skip, left, stream)| async move {
                if left == 0 {
                    // Dropping the input stops it.
                    return None;
                }
                loop {
                    let batch = match batches.next().await? {
                        Ok(b) => b,
                        Err(e) => return Some((Err(e), (batches, 0, 0, stream))),
                    };
                    let batch = match batch.resolve(&stream) {
                        Ok(b) => b,
                        Err(e) => return Some((Err(to_df(e)), (batches, 0, 0, stream))),
                    };
                    let rows = batch.bound();
                    let start = rows.min(skip);
                    skip -= start;
                    let take = (rows - start).min(left);
                    if take == 0 {
                        continue;
                    }
                    let out = rows_of(&stream, &batch, start, take).map_err(to_df);
                    return Some((out, (batches, skip, left - take, stream)));
                }
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use spate_kernels::{Device, DeviceOptions};

    use super::*;
    use crate::column::{concat_device_batches, download_batch, upload_batch};

    /// A batch the limit cuts, concatenated with another (as a sort or a join build does),
    /// keeps its last string whole: only the kept rows' bytes go on.
    #[test]
    fn cut_strings_stay_whole_when_concatenated() {
        let stream = Device::emulated(DeviceOptions::default())
            .unwrap()
            .new_stream()
            .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batch = |from: i64| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from_iter_values(from..from + 10)) as ArrayRef,
                    Arc::new(StringArray::from_iter_values(
                        (from..from + 10).map(|i| format!("s{i}")),
                    )),
                ],
            )
            .unwrap()
        };
        let (a, b) = (batch(0), batch(100));
        for (start, rows) in [(0, 3), (2, 5), (0, 10)] {
            let cut = rows_of(&stream, &upload_batch(&stream, &a).unwrap(), start, rows).unwrap();
            let other = upload_batch(&stream, &b).unwrap();
            let joined = concat_device_batches(&stream, &schema, vec![cut, other]).unwrap();
            let back = download_batch(&stream, &joined).unwrap();
            let want = arrow::compute::concat_batches(&schema, &[a.slice(start, rows), b.clone()])
                .unwrap();
            assert_eq!(back, want, "rows {start}..{}", start + rows);
        }
    }
}
