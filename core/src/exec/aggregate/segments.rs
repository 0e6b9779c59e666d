//! Aggregates over segments of a batch's rows that the caller numbers (row `i` in segment
//! `segment[i]`), with the aggregation's own kernels: the GPU window operator's aggregates over
//! whole partitions.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use spate_kernels::{DeviceBuffer, Stream as DeviceStream};

use super::{Accumulators, AggPlan, Kernels, analyze, finish_outputs};
use crate::column::{DeviceBatch, DeviceColumn};
use crate::error::Result;
use crate::expr::Unsupported;

/// The aggregates of a window operator, planned as a single-stage aggregation without keys.
#[derive(Debug)]
pub(crate) struct SegmentAggregate {
    plan: AggPlan,
    /// The planned aggregation's output: one column per aggregate.
    schema: SchemaRef,
}

impl SegmentAggregate {
    /// `aggregates` over the rows of `input`, or why the GPU cannot compute them.
    pub(crate) fn try_new(
        aggregates: Vec<Arc<AggregateFunctionExpr>>,
        input: &Arc<dyn ExecutionPlan>,
    ) -> std::result::Result<Self, Unsupported> {
        let filters = vec![None; aggregates.len()];
        let agg = AggregateExec::try_new(
            AggregateMode::Single,
            PhysicalGroupBy::new_single(Vec::new()),
            aggregates,
            filters,
            Arc::clone(input),
            input.schema(),
        )
        .map_err(|e| Unsupported(format!("its aggregates: {e}")))?;
        Ok(SegmentAggregate {
            plan: analyze(&agg)?,
            schema: agg.schema(),
        })
    }

    /// The compiled kernels (once per session).
    pub(crate) fn kernels(&self, gpu: &crate::device::GpuContext) -> Result<Kernels> {
        self.plan.kernels(gpu)
    }

    /// Each aggregate's value per segment (`segments` of them) over the rows of `batch`
    /// (host-counted).
    pub(crate) fn evaluate(
        &self,
        stream: &DeviceStream,
        kernels: &Kernels,
        batch: &DeviceBatch,
        segment: &DeviceBuffer<u32>,
        segments: usize,
    ) -> Result<Vec<DeviceColumn>> {
        let (_, args) = self.plan.operands(stream, kernels, batch)?;
        let acc = Accumulators::new(stream, &self.plan, segments)?;
        if segments > 0 && batch.bound() > 0 {
            acc.update(
                stream,
                kernels,
                &args,
                batch.row_count(),
                Some(segment),
                segments,
            )?;
        }
        finish_outputs(
            stream,
            kernels,
            &self.plan,
            &self.schema,
            segments,
            &acc.acc,
            &acc.seen,
        )
    }
}
