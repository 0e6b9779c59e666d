//! A window's input past its share of the device budget, windowed in chunks of whole
//! partitions.
//!
//! The input arrives sorted on the partition keys, so each window partition is a run of
//! consecutive rows. Once what the window holds passes its share, the rows before the last
//! partition start are whole partitions: they are windowed and emitted, and the last
//! partition, which may go on in the next batch, is copied out and held with the batches that
//! follow (the rows before it are freed with the output). The output keeps the input's order,
//! as a single pass would. A partition larger than the share (and a window without PARTITION
//! BY, one partition) is held whole: after a cut that found one partition, the window holds
//! twice as much before it tries again. `window_chunks` in `EXPLAIN ANALYZE` counts the cuts.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::metrics::Count;
use spate_kernels::Stream as DeviceStream;

use super::{Kernels, WindowPlan, last_partition_start};
use crate::column::{DeviceBatch, concat_device_batches, copy_device_batch};
use crate::error::Result;
use crate::exec::held::HeldBatches;

/// Metric of the cuts a window made in its input.
pub(crate) const WINDOW_CHUNKS: &str = "window_chunks";

/// Device bytes a window takes per row beyond its input: its bounds, ids and starts.
const BYTES_PER_ROW: usize = 24;

/// The held input of a window, cut into whole partitions as it grows (see the module docs).
pub(super) struct Chunks {
    held: Arc<HeldBatches>,
    /// The held rows' device bytes and rows.
    bytes: usize,
    rows: usize,
    /// The window's share of the budget.
    limit: usize,
    /// What the held rows must take before the next cut is tried: 0 after a cut that found
    /// whole partitions, twice what was held after one that found a single partition.
    next_try: usize,
    /// The batches' schema (the input's, with computed keys appended).
    schema: SchemaRef,
    /// Whether cuts may be made: the window has partition keys.
    cuts: bool,
    chunks: Count,
}

impl Chunks {
    pub(super) fn new(
        held: Arc<HeldBatches>,
        schema: SchemaRef,
        plan: &WindowPlan,
        limit: usize,
        chunks: Count,
    ) -> Self {
        Chunks {
            held,
            bytes: 0,
            rows: 0,
            limit,
            next_try: 0,
            schema,
            cuts: !plan.partition.is_empty(),
            chunks,
        }
    }

    /// Holds `batch`; past the threshold, the whole partitions held so far in one batch
    /// (`None` while they are held).
    pub(super) fn push(
        &mut self,
        stream: &DeviceStream,
        (kernels, plan): (&Kernels, &WindowPlan),
        batch: DeviceBatch,
    ) -> Result<Option<DeviceBatch>> {
        self.bytes += batch.device_bytes();
        self.rows += batch.bound();
        self.held.push(batch);
        let needed = 2 * self.bytes + BYTES_PER_ROW * self.rows;
        if !self.cuts
            || needed < self.next_try
            || !crate::exec::memory::should_spill(needed, self.limit, stream.device())
        {
            return Ok(None);
        }
        let all = self.take(stream)?;
        let n = all.bound();
        let start = if n == 0 {
            0
        } else {
            last_partition_start(stream, kernels, plan, &all)?
        };
        if start == 0 {
            // One partition so far: held whole until it has doubled.
            self.next_try = needed.saturating_mul(2);
            self.hold(all);
            return Ok(None);
        }
        self.chunks.add(1);
        self.next_try = 0;
        let whole = all.slice(stream, 0, start)?;
        // A copy: a view would keep all the rows allocated while the last partition is held
        // (but a view where the copy does not fit).
        let tail = all.slice(stream, start, n - start)?;
        let last = match copy_device_batch(stream, &tail) {
            Ok(copy) => copy,
            Err(e) if crate::exec::retry::runs_out_of_device(&e) => tail,
            Err(e) => return Err(e),
        };
        drop(all);
        self.hold(last);
        Ok(Some(whole))
    }

    fn hold(&mut self, batch: DeviceBatch) {
        self.bytes = batch.device_bytes();
        self.rows = batch.bound();
        self.held.push(batch);
    }

    /// Every row held, in one batch.
    pub(super) fn take(&mut self, stream: &DeviceStream) -> Result<DeviceBatch> {
        (self.bytes, self.rows) = (0, 0);
        let batches = self.held.take()?;
        concat_device_batches(stream, &self.schema, batches)?.resolve(stream)
    }
}
