//! Counts of the runtime calls that cost a GPU time whatever the kernels do: launches, host
//! synchronisations, device allocations, and bytes over the bus and within the device.
//!
//! Every call is counted twice: in its device's running totals ([`Device::counters`]), and in
//! the innermost [`Counters`] the calling thread has entered with [`in_scope`], if any. The
//! engine enters an operator's counters while it polls that operator, so each operator is
//! charged for the calls made on its behalf and not for its inputs' (they enter their own).
//! Calls are counted when they are issued, on the issuing thread; on an asynchronous stream
//! that is before they run.
//!
//! A host synchronisation is any call that makes the host wait for the device: a copy to
//! pageable host memory, a stream or device synchronize, an event wait (a pinned buffer's
//! included), an event timing.
//!
//! [`Device::counters`]: crate::Device::counters

use std::cell::RefCell;
use std::ops::{Add, Sub};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Running counts, shared by whoever reads them.
#[derive(Debug, Default)]
pub struct Counters {
    launches: AtomicU64,
    host_syncs: AtomicU64,
    allocations: AtomicU64,
    h2d_bytes: AtomicU64,
    d2h_bytes: AtomicU64,
    d2d_bytes: AtomicU64,
    peer_bytes: AtomicU64,
    /// The most device memory in use just after an allocation counted here.
    peak_device_bytes: AtomicU64,
}

/// A reading of [`Counters`]; the difference of two readings is what happened between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Kernel launches (a launch of zero blocks is not issued and not counted).
    pub launches: u64,
    /// Calls that made the host wait for the device.
    pub host_syncs: u64,
    /// Device buffers allocated (zero-byte buffers allocate nothing and are not counted).
    pub allocations: u64,
    /// Bytes copied from host to device memory.
    pub h2d_bytes: u64,
    /// Bytes copied from device to host memory.
    pub d2h_bytes: u64,
    /// Bytes copied from device memory to device memory by copy calls (kernels' own traffic
    /// is not seen here).
    pub d2d_bytes: u64,
    /// Bytes copied into this device's memory from another device's (peer copies, counted
    /// on the receiving device).
    pub peer_bytes: u64,
    /// The most device memory in use (the device pool's, every query's) just after an
    /// allocation counted here: a peak, so readings combine by their maximum, and the
    /// difference of two keeps the later one's.
    pub peak_device_bytes: u64,
}

impl CounterSnapshot {
    /// Bytes over the bus, both ways.
    pub fn bus_bytes(&self) -> u64 {
        self.h2d_bytes + self.d2h_bytes
    }

    fn zip(self, other: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        CounterSnapshot {
            launches: f(self.launches, other.launches),
            host_syncs: f(self.host_syncs, other.host_syncs),
            allocations: f(self.allocations, other.allocations),
            h2d_bytes: f(self.h2d_bytes, other.h2d_bytes),
            d2h_bytes: f(self.d2h_bytes, other.d2h_bytes),
            d2d_bytes: f(self.d2d_bytes, other.d2d_bytes),
            peer_bytes: f(self.peer_bytes, other.peer_bytes),
            peak_device_bytes: self.peak_device_bytes,
        }
    }
}

impl Add for CounterSnapshot {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        CounterSnapshot {
            peak_device_bytes: self.peak_device_bytes.max(other.peak_device_bytes),
            ..self.zip(other, u64::saturating_add)
        }
    }
}

impl Sub for CounterSnapshot {
    type Output = Self;
    /// Saturating: counters only grow, so a negative field means readings in the wrong order.
    fn sub(self, other: Self) -> Self {
        self.zip(other, u64::saturating_sub)
    }
}

/// What one runtime call adds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    Launch,
    HostSync,
    /// A device allocation, and the device memory in use once it is made.
    Allocation(usize),
    HostToDevice(usize),
    DeviceToHost(usize),
    DeviceToDevice(usize),
    /// A copy from another device's memory.
    Peer(usize),
}

impl Counters {
    /// Counters at zero.
    pub fn new() -> Arc<Self> {
        Arc::new(Counters::default())
    }

    /// The counts so far.
    pub fn snapshot(&self) -> CounterSnapshot {
        self.read(|c| c.load(Ordering::Relaxed))
    }

    /// The counts so far, leaving zeros behind (for moving them into another tally).
    pub fn take(&self) -> CounterSnapshot {
        self.read(|c| c.swap(0, Ordering::Relaxed))
    }

    fn read(&self, read: impl Fn(&AtomicU64) -> u64) -> CounterSnapshot {
        CounterSnapshot {
            launches: read(&self.launches),
            host_syncs: read(&self.host_syncs),
            allocations: read(&self.allocations),
            h2d_bytes: read(&self.h2d_bytes),
            d2h_bytes: read(&self.d2h_bytes),
            d2d_bytes: read(&self.d2d_bytes),
            peer_bytes: read(&self.peer_bytes),
            peak_device_bytes: read(&self.peak_device_bytes),
        }
    }

    fn add(&self, call: Call) {
        let (counter, n) = match call {
            Call::Launch => (&self.launches, 1),
            Call::HostSync => (&self.host_syncs, 1),
            Call::Allocation(in_use) => {
                self.peak_device_bytes
                    .fetch_max(in_use as u64, Ordering::Relaxed);
                (&self.allocations, 1)
            }
            Call::HostToDevice(b) => (&self.h2d_bytes, b as u64),
            Call::DeviceToHost(b) => (&self.d2h_bytes, b as u64),
            Call::DeviceToDevice(b) => (&self.d2d_bytes, b as u64),
            Call::Peer(b) => (&self.peer_bytes, b as u64),
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

thread_local! {
    /// The counters entered on this thread, innermost last.
    static SCOPES: RefCell<Vec<Arc<Counters>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `counters` as the innermost scope on this thread: calls `f` makes are counted
/// there too (and not in an outer scope).
pub fn in_scope<T>(counters: &Arc<Counters>, f: impl FnOnce() -> T) -> T {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            SCOPES.with(|s| s.borrow_mut().pop());
        }
    }
    SCOPES.with(|s| s.borrow_mut().push(Arc::clone(counters)));
    let _leave = Leave;
    f()
}

/// Counts `call` in the device's totals and in the innermost scope.
pub(crate) fn count(totals: &Counters, call: Call) {
    totals.add(call);
    SCOPES.with(|s| {
        if let Some(scope) = s.borrow().last() {
            scope.add(call);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_counts_in_the_totals_and_the_innermost_scope_only() {
        let totals = Counters::default();
        let outer = Counters::new();
        let inner = Counters::new();
        count(&totals, Call::Launch);
        in_scope(&outer, || {
            count(&totals, Call::HostToDevice(100));
            in_scope(&inner, || {
                count(&totals, Call::Launch);
                count(&totals, Call::HostSync);
            });
            count(&totals, Call::Allocation(64));
        });
        count(&totals, Call::DeviceToHost(8));
        let t = totals.snapshot();
        assert_eq!((t.launches, t.host_syncs, t.allocations), (2, 1, 1));
        assert_eq!((t.h2d_bytes, t.d2h_bytes, t.bus_bytes()), (100, 8, 108));
        let o = outer.snapshot();
        assert_eq!((o.launches, o.allocations, o.h2d_bytes), (0, 1, 100));
        assert_eq!((o.peak_device_bytes, t.peak_device_bytes), (64, 64));
        let i = inner.take();
        assert_eq!((i.launches, i.host_syncs), (1, 1));
        assert_eq!(inner.snapshot(), CounterSnapshot::default());
        assert_eq!(
            t - o - i,
            CounterSnapshot {
                launches: 1,
                d2h_bytes: 8,
                // A peak: the difference keeps the first reading's.
                peak_device_bytes: 64,
                ..i - i
            }
        );
    }

    #[test]
    fn a_panic_inside_a_scope_leaves_it() {
        let scope = Counters::new();
        let totals = Counters::default();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_scope(&scope, || panic!("inside"))
        }));
        assert!(caught.is_err());
        count(&totals, Call::Launch);
        assert_eq!(scope.snapshot().launches, 0);
    }
}
