//! Each GPU operator's runtime calls, counted while it runs and shown by `EXPLAIN ANALYZE`.
//!
//! While a GPU operator's output stream is polled (and while its batches are downloaded for a
//! CPU parent), the thread enters the operator's [`Counters`]
//! ([`spate_kernels::counters::in_scope`]). The kernel runtime counts every launch, host
//! synchronisation, allocation and copy in the innermost scope, so an operator is charged for
//! the calls made on its behalf (the upload of a CPU input included) and not for its GPU
//! inputs', which are polled in their own scopes. After each poll the counts move into the
//! operator's metrics:
//!
//! | metric | counts |
//! |---|---|
//! | `launches` | kernel launches |
//! | `host_syncs` | host waits for the device: readbacks, synchronizes, event waits |
//! | `dev_allocs` | device buffers allocated |
//! | `h2d_bytes`, `d2h_bytes` | bytes over the bus, the small readbacks of sizes and totals included |
//! | `gpu_peak_bytes` | the most device memory in use just after one of its allocations (the device's, so a concurrent query's too) |

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, Metric, MetricBuilder, MetricValue,
};
use futures::{Stream, StreamExt};
use spate_kernels::Counters;
use spate_kernels::counters::in_scope;

use super::DeviceBatchStream;
use crate::column::DeviceBatch;

/// Metric names of the runtime counts (see the module docs).
pub const LAUNCHES: &str = "launches";
/// See [`LAUNCHES`].
pub const HOST_SYNCS: &str = "host_syncs";
/// See [`LAUNCHES`].
pub const DEV_ALLOCS: &str = "dev_allocs";
/// See [`LAUNCHES`].
pub const H2D_BYTES: &str = "h2d_bytes";
/// See [`LAUNCHES`].
pub const D2H_BYTES: &str = "d2h_bytes";
/// See [`LAUNCHES`].
pub const GPU_PEAK_BYTES: &str = "gpu_peak_bytes";

/// The operator's `gpu_peak_bytes` gauge, one for all its partitions: a peak is the most any
/// of them saw, where DataFusion would sum one gauge per partition.
fn shared_peak(metrics: &ExecutionPlanMetricsSet) -> Gauge {
    // Partitions start on many threads: one finds what another registered.
    static REGISTERING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = REGISTERING.lock().unwrap_or_else(|p| p.into_inner());
    let existing = metrics.clone_inner().iter().find_map(|m| match m.value() {
        MetricValue::Gauge { name, gauge } if name == GPU_PEAK_BYTES => Some(gauge.clone()),
        _ => None,
    });
    existing.unwrap_or_else(|| {
        let gauge = Gauge::new();
        metrics.register(Arc::new(Metric::new(
            MetricValue::Gauge {
                name: GPU_PEAK_BYTES.into(),
                gauge: gauge.clone(),
            },
            None,
        )));
        gauge
    })
}

/// One operator partition's scope, and the metrics its counts move into.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeScope {
    counters: Arc<Counters>,
    launches: Count,
    host_syncs: Count,
    dev_allocs: Count,
    h2d_bytes: Count,
    d2h_bytes: Count,
    gpu_peak_bytes: Gauge,
}

impl RuntimeScope {
    pub(crate) fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let counter = |name| MetricBuilder::new(metrics).counter(name, partition);
        RuntimeScope {
            counters: Counters::new(),
            launches: counter(LAUNCHES),
            host_syncs: counter(HOST_SYNCS),
            dev_allocs: counter(DEV_ALLOCS),
            h2d_bytes: counter(H2D_BYTES),
            d2h_bytes: counter(D2H_BYTES),
            gpu_peak_bytes: shared_peak(metrics),
        }
    }

    /// Runs `f` in the scope and moves what it counted into the metrics.
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        let out = in_scope(&self.counters, f);
        let counts = self.counters.take();
        let add = |count: &Count, n: u64| count.add(usize::try_from(n).unwrap_or(usize::MAX));
        add(&self.launches, counts.launches);
        add(&self.host_syncs, counts.host_syncs);
        add(&self.dev_allocs, counts.allocations);
        add(&self.h2d_bytes, counts.h2d_bytes);
        add(&self.d2h_bytes, counts.d2h_bytes);
        self.gpu_peak_bytes
            .set_max(usize::try_from(counts.peak_device_bytes).unwrap_or(usize::MAX));
        out
    }

    /// `batches` of the operator `name`, each poll run in the scope. A GPU out-of-memory
    /// error that comes out of the operator names it.
    pub(crate) fn wrap(self, batches: DeviceBatchStream, name: &str) -> DeviceBatchStream {
        Box::pin(Scoped {
            inner: batches,
            scope: self,
            name: name.to_string(),
        })
    }
}

struct Scoped {
    inner: DeviceBatchStream,
    scope: RuntimeScope,
    name: String,
}

/// How the kernel runtime's out-of-memory message begins (`KernelError::OutOfMemory`).
pub(crate) const GPU_OOM: &str = "GPU out of memory:";

/// `error`, saying which operator ran out when it is a GPU out-of-memory error that does not
/// say yet.
pub(crate) fn name_operator(error: DataFusionError, name: &str) -> DataFusionError {
    match error {
        DataFusionError::ResourcesExhausted(message) if message.starts_with(GPU_OOM) => {
            DataFusionError::ResourcesExhausted(format!(
                "GPU out of memory in {name}:{}",
                &message[GPU_OOM.len()..]
            ))
        }
        other => other,
    }
}

impl Stream for Scoped {
    type Item = DFResult<DeviceBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let inner = &mut this.inner;
        match this.scope.run(|| inner.poll_next_unpin(cx)) {
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(name_operator(e, &this.name)))),
            other => other,
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_share_one_peak_and_it_is_the_largest() {
        let metrics = ExecutionPlanMetricsSet::new();
        let (a, b) = (
            RuntimeScope::new(&metrics, 0),
            RuntimeScope::new(&metrics, 1),
        );
        a.gpu_peak_bytes.set_max(300);
        b.gpu_peak_bytes.set_max(200);
        let peak = metrics
            .clone_inner()
            .aggregate_by_name()
            .sum_by_name(GPU_PEAK_BYTES)
            .map(|v| v.as_usize());
        assert_eq!(peak, Some(300));
    }
}
