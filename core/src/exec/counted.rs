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

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::error::Result as DFResult;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
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

/// One operator partition's scope, and the metrics its counts move into.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeScope {
    counters: Arc<Counters>,
    launches: Count,
    host_syncs: Count,
    dev_allocs: Count,
    h2d_bytes: Count,
    d2h_bytes: Count,
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
        out
    }

    /// `batches`, each poll run in the scope.
    pub(crate) fn wrap(self, batches: DeviceBatchStream) -> DeviceBatchStream {
        Box::pin(Scoped {
            inner: batches,
            scope: self,
        })
    }
}

struct Scoped {
    inner: DeviceBatchStream,
    scope: RuntimeScope,
}

impl Stream for Scoped {
    type Item = DFResult<DeviceBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let inner = &mut this.inner;
        this.scope.run(|| inner.poll_next_unpin(cx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}
