//! Split-and-retry: a GPU operator that works batch by batch (a filter, a projection, a join's
//! probe, a partial aggregation) and runs out of device memory on a batch does not fail the
//! query at once.
//!
//! 1. It asks the device's spill coordinator ([`crate::device::GpuContext::relieve_memory`])
//!    to free what it can, least recently used first: cached tables not in use move to the
//!    host until a scan needs them again, and so does the input sorts, join builds, final
//!    aggregations and windows hold until they need it (`exec/held.rs`).
//! 2. It retries on the batch's two halves (`DeviceBatch::slice`: views, but for the rebased
//!    offsets of string columns), and on their halves if they run out too, down to an eighth
//!    of the batch: three splits.
//! 3. A piece that still runs out after three splits runs on the CPU: downloaded, computed by
//!    the operator's CPU twin (DataFusion's own expressions, partial aggregation or hash join;
//!    `cpu_twin.rs`), and uploaded again for the GPU operator above. So does a piece too short
//!    of memory even for its halves' offsets. A probe piece of a join that records on the
//!    device which build rows matched (left, full, left semi, anti and mark joins) fails
//!    instead (`join/fallback.rs`).
//!
//! An upload that runs out (`exec/upload.rs`) only asks the coordinator for room and tries once
//! more: its host batches are already as small as a device batch.
//!
//! Only the device's out-of-memory error is retried; any other error, and an out-of-memory
//! error of an input operator (which already carries that operator's name), fails as before.
//! `EXPLAIN ANALYZE` shows `oom_splits`, `cpu_fallbacks` and `evicted_bytes` on an operator
//! that needed them.

use std::sync::{Arc, OnceLock};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;

use super::counted::GPU_OOM;
use super::to_df;
use crate::column::{DeviceBatch, download_batch, upload_batches};
use crate::device::GpuContext;

/// Where [`Retry::run`] asks for a piece to be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    Gpu,
    /// On the CPU: the piece ran out of device memory after [`MAX_SPLITS`] splits (see
    /// [`Retry::on_cpu`]).
    Cpu,
}

/// Splits before a piece of a batch runs on the CPU.
pub(crate) const MAX_SPLITS: u32 = 3;

/// Metric names (see the module docs).
pub const OOM_SPLITS: &str = "oom_splits";
/// See [`OOM_SPLITS`].
pub const CPU_FALLBACKS: &str = "cpu_fallbacks";
/// See [`OOM_SPLITS`]: device bytes the spill coordinator let go of for the operator.
pub const EVICTED_BYTES: &str = "evicted_bytes";

/// True for the device's own out-of-memory error, not yet named after an operator.
pub(crate) fn is_device_oom(error: &DataFusionError) -> bool {
    matches!(error, DataFusionError::ResourcesExhausted(m) if m.starts_with(GPU_OOM))
}

/// [`is_device_oom`] for the engine's own error type.
pub(crate) fn runs_out_of_device(error: &crate::error::SpateError) -> bool {
    matches!(error, crate::error::SpateError::ResourcesExhausted { message } if message.starts_with(GPU_OOM))
}

/// The metrics of [`Retry`].
struct Counts {
    splits: Count,
    fallbacks: Count,
    evicted: Count,
}

/// One operator partition's retries, and the metrics they are counted in (registered at the
/// first, so that operators that never ran out show none).
pub(crate) struct Retry {
    gpu: Arc<GpuContext>,
    stream: Arc<DeviceStream>,
    metrics: ExecutionPlanMetricsSet,
    partition: usize,
    counts: OnceLock<Counts>,
}

impl Retry {
    pub(crate) fn new(
        gpu: Arc<GpuContext>,
        stream: Arc<DeviceStream>,
        metrics: &ExecutionPlanMetricsSet,
        partition: usize,
    ) -> Self {
        Retry {
            gpu,
            stream,
            metrics: metrics.clone(),
            partition,
            counts: OnceLock::new(),
        }
    }

    fn counts(&self) -> &Counts {
        self.counts.get_or_init(|| {
            let count = |name| MetricBuilder::new(&self.metrics).counter(name, self.partition);
            Counts {
                splits: count(OOM_SPLITS),
                fallbacks: count(CPU_FALLBACKS),
                evicted: count(EVICTED_BYTES),
            }
        })
    }

    /// `work(batch, Where::Gpu)`, or, when it runs out of device memory, the same over the
    /// batch's halves, and `work(piece, Where::Cpu)` for a piece that runs out after
    /// [`MAX_SPLITS`] splits (see the module docs). The results come in row order.
    pub(crate) fn run<T>(
        &self,
        batch: &DeviceBatch,
        work: &mut dyn FnMut(&DeviceBatch, Where) -> DFResult<T>,
    ) -> DFResult<Vec<T>> {
        let mut out = Vec::with_capacity(1);
        // A stack: the first half is taken first, so results keep the rows' order.
        let mut pieces = vec![(batch.clone(), 0u32)];
        while let Some((piece, splits)) = pieces.pop() {
            match work(&piece, Where::Gpu) {
                Ok(t) => {
                    out.push(t);
                    continue;
                }
                Err(e) if is_device_oom(&e) => {}
                Err(e) => return Err(e),
            }
            match self.split(&piece, splits)? {
                Some((first, second)) => {
                    pieces.push((second, splits + 1));
                    pieces.push((first, splits + 1));
                }
                None => {
                    self.counts().fallbacks.add(1);
                    out.push(work(&piece, Where::Cpu)?);
                }
            }
        }
        Ok(out)
    }

    /// Counts a piece computed on the CPU by a caller that splits on its own (a probe).
    pub(crate) fn fell_back(&self) {
        self.counts().fallbacks.add(1);
    }

    /// Asks the spill coordinator to free about `want` device bytes; the bytes it let go of,
    /// counted in `evicted_bytes`.
    pub(crate) fn relieve(&self, want: usize) -> usize {
        let freed = self.gpu.relieve_memory(want);
        self.counts().evicted.add(freed);
        freed
    }

    /// `piece` ran out of device memory after `splits` splits: the spill coordinator frees
    /// what it can, and the piece comes back as its two halves, or `None` when it may not be
    /// split again (past [`MAX_SPLITS`], a single row, or too short of memory even for its
    /// halves' string offsets).
    pub(crate) fn split(
        &self,
        piece: &DeviceBatch,
        splits: u32,
    ) -> DFResult<Option<(DeviceBatch, DeviceBatch)>> {
        self.relieve(piece.held_bytes().max(1));
        let counts = self.counts();
        if splits >= MAX_SPLITS {
            return Ok(None);
        }
        let piece = piece.resolve(&self.stream).map_err(to_df)?;
        let rows = piece.host_rows().unwrap_or(0);
        if rows < 2 {
            return Ok(None);
        }
        let half = rows / 2;
        let halves = piece
            .slice(&self.stream, 0, half)
            .and_then(|first| Ok((first, piece.slice(&self.stream, half, rows - half)?)));
        match halves.map_err(to_df) {
            Ok(halves) => {
                counts.splits.add(1);
                Ok(Some(halves))
            }
            Err(e) if is_device_oom(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The CPU half of a fallback: `batch` downloaded, computed by `f` into a batch of
    /// `schema`, and uploaded again.
    pub(crate) fn on_cpu(
        &self,
        batch: &DeviceBatch,
        schema: &SchemaRef,
        f: impl FnOnce(RecordBatch) -> DFResult<RecordBatch>,
    ) -> DFResult<DeviceBatch> {
        let host = download_batch(&self.stream, batch).map_err(to_df)?;
        let computed = f(host)?;
        upload_batches(&self.stream, schema, &[computed]).map_err(to_df)
    }
}

/// A stream of results that each hold a batch's pieces, as a stream of the pieces.
pub(crate) fn flatten<T: Send + 'static>(
    results: impl futures::Stream<Item = DFResult<Vec<T>>> + Send + 'static,
) -> impl futures::Stream<Item = DFResult<T>> + Send + 'static {
    results.flat_map(|r| {
        let items: Vec<DFResult<T>> = match r {
            Ok(pieces) => pieces.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        futures::stream::iter(items)
    })
}
