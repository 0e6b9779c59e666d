//! A grouped aggregation past its share of the device budget that cannot run in stages
//! (`staged.rs`): one whose partial state DataFusion keeps as a list, as COUNT(DISTINCT)'s.
//! Its input rows, their group key values appended, spill to host memory in hash partitions by
//! those keys (`exec/spill.rs`); every row of a group lands in one partition, so each partition
//! is aggregated whole by the aggregation's own plan, one at a time. A partition still over the
//! share is split again by the next hash bits, unless a split left every row in one partition
//! (one hot group), which is then aggregated as it is.
//!
//! Not with grouping sets (a row feeds groups whose left-out keys are NULL, which its full key
//! does not hash to) or an output that keeps an order (groups would come out partition by
//! partition); those keep the one pass over the collected input.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use spate_kernels::Stream as DeviceStream;

use super::aggregate_batch;
use super::plan::AggPlan;
use super::staged::keyed_rows;
use crate::column::DeviceBatch;
use crate::error::Result;
use crate::exec::hash_table::Kernels;
use crate::exec::spill::{HostPartitions, SpillOptions, TOP_SHIFT};

/// Whether `plan` may aggregate partition by partition (see the module docs).
pub(super) fn applies(plan: &AggPlan) -> bool {
    !plan.keys.is_empty() && !plan.per_batch && plan.order.is_none() && plan.spec.sets.is_empty()
}

/// A partitioned aggregation taking its input.
pub(super) struct Partitioned {
    plan: Arc<AggPlan>,
    kernels: Arc<Kernels>,
    stream: Arc<DeviceStream>,
    /// The aggregation's input and output schemas.
    input_schema: SchemaRef,
    schema: SchemaRef,
    /// The keyed rows, once the first batch gave their schema.
    rows: Option<HostPartitions>,
    limit: usize,
    spill: SpillOptions,
}

impl Partitioned {
    pub(super) fn new(
        (plan, kernels): (Arc<AggPlan>, Arc<Kernels>),
        stream: Arc<DeviceStream>,
        (input_schema, schema): (SchemaRef, SchemaRef),
        limit: usize,
        spill: SpillOptions,
    ) -> Self {
        Partitioned {
            plan,
            kernels,
            stream,
            input_schema,
            schema,
            rows: None,
            limit,
            spill,
        }
    }

    /// Moves `batch`'s rows to the host, keyed.
    pub(super) fn push(&mut self, batch: &DeviceBatch) -> Result<()> {
        let stream = Arc::clone(&self.stream);
        let batch = batch.resolve(&stream)?;
        let keyed = keyed_rows(&stream, &self.plan, &self.kernels, &batch)?;
        let rows = self.rows.get_or_insert_with(|| {
            let width = batch.columns().len();
            HostPartitions::new(
                Arc::clone(keyed.schema()),
                (width..keyed.columns().len()).collect(),
                TOP_SHIFT,
                &self.spill,
            )
        });
        rows.spill(&stream, &keyed)
    }

    /// The output, partition by partition.
    pub(super) fn finish(mut self) -> Finishing {
        let stack = self
            .rows
            .take()
            .map(|rows| Level {
                rows,
                p: 0,
                splits: true,
            })
            .into_iter()
            .collect();
        Finishing { agg: self, stack }
    }
}

/// One level of partitions.
struct Level {
    rows: HostPartitions,
    p: usize,
    /// Whether an oversized partition of this level is split again.
    splits: bool,
}

/// The output of a partitioned aggregation, produced partition by partition.
pub(super) struct Finishing {
    agg: Partitioned,
    /// Partitions still to aggregate, the innermost level last.
    stack: Vec<Level>,
}

impl Finishing {
    /// The next output batch, or `None` after the last.
    pub(super) fn next_batch(&mut self) -> Result<Option<DeviceBatch>> {
        let agg = &self.agg;
        let stream = Arc::clone(&agg.stream);
        loop {
            let Some(level) = self.stack.last_mut() else {
                return Ok(None);
            };
            if level.p == level.rows.len() {
                self.stack.pop();
                continue;
            }
            let p = level.p;
            level.p += 1;
            if level.splits
                && level.rows.with_table(p) > agg.limit
                && let Some(rows) = level.rows.split(&stream, p)?
            {
                let splits = !rows.is_degenerate();
                self.stack.push(Level { rows, p: 0, splits });
                continue;
            }
            let Some(keyed) = level.rows.take(&stream, p)? else {
                continue;
            };
            // The input columns lead the keyed rows.
            let width = agg.input_schema.fields().len();
            let input = DeviceBatch::try_new(
                Arc::clone(&agg.input_schema),
                keyed.columns()[..width].to_vec(),
                keyed.bound(),
            )?;
            drop(keyed);
            let out = aggregate_batch(&stream, &agg.kernels, &agg.plan, &agg.schema, &input)?;
            if out.bound() > 0 {
                return Ok(Some(out));
            }
        }
    }
}
