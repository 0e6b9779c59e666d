//! Device batches an operator holds while its input still runs (a sort's input, a hash join's
//! build side, a final aggregation's or a window's collected input), registered with the spill
//! coordinator (`coordinator.rs`): an operator that runs out of device memory meanwhile may
//! have them moved to host memory (split-and-retry, `retry.rs`), and the holder uploads them
//! again when it needs them, one at a time where it uses them one at a time.
//!
//! A move takes the batches in the order they came, downloads each on the holder's stream and
//! charges its host bytes to DataFusion's memory pool; it stops at the first the pool will not
//! take, and passes over batches whose allocations something else views too (a cached table's
//! batches): moving those would free nothing. The holder's stream is synchronized after a move,
//! so the memory let go of is free for any stream. A holder busy with its batches (pushing or
//! taking them) is passed over: the coordinator never waits for one. `EXPLAIN ANALYZE` shows
//! `held_evicted_bytes` on a holder that was moved.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrow::array::RecordBatch;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::metrics::Count;
use spate_kernels::Stream as DeviceStream;

use super::coordinator::Spillable;
use super::spill::SpillOptions;
use crate::column::{DeviceBatch, download_batch, upload_batches};
use crate::device::GpuContext;
use crate::error::Result;

/// Metric of the device bytes of an operator's held batches the coordinator moved to the host.
pub(crate) const HELD_EVICTED_BYTES: &str = "held_evicted_bytes";

/// One held batch, where it is now.
enum Slot {
    Device(DeviceBatch),
    /// Moved to the host; its bytes charged to the holder's reservation.
    Host(RecordBatch),
}

/// The batches, in the order they came, and the charge of those on the host.
struct Slots {
    slots: Vec<Slot>,
    reservation: MemoryReservation,
}

/// Device batches held for the coordinator to move (see the module docs).
pub(crate) struct HeldBatches {
    slots: Mutex<Slots>,
    /// The holder's stream: batches move on it.
    stream: Arc<DeviceStream>,
    last_used: Mutex<Instant>,
    evicted: Count,
}

impl HeldBatches {
    /// An empty holder whose batches move on `stream`, registered with `gpu`'s coordinator
    /// for as long as it lives; host bytes are charged to `spill`'s memory pool.
    pub(crate) fn register(
        gpu: &GpuContext,
        stream: Arc<DeviceStream>,
        spill: &SpillOptions,
    ) -> Arc<Self> {
        let held = Arc::new(HeldBatches {
            slots: Mutex::new(Slots {
                slots: Vec::new(),
                reservation: MemoryConsumer::new(format!("{} (held)", spill.name))
                    .register(spill.context.memory_pool()),
            }),
            stream,
            last_used: Mutex::new(Instant::now()),
            evicted: spill.counter(HELD_EVICTED_BYTES),
        });
        let weak: std::sync::Weak<dyn Spillable> =
            Arc::downgrade(&held) as std::sync::Weak<dyn Spillable>;
        gpu.register_spillable(weak);
        held
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `batch`, after those held before.
    pub(crate) fn push(&self, batch: DeviceBatch) {
        self.lock().slots.push(Slot::Device(batch));
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Every held batch, in order, those on the host uploaded again; the holder is empty after.
    pub(crate) fn take(&self) -> Result<Vec<DeviceBatch>> {
        let mut batches = Vec::new();
        self.drain(|batch| {
            batches.push(batch);
            Ok(())
        })?;
        Ok(batches)
    }

    /// Hands every held batch to `f`, in order, each on the host uploaded again just before;
    /// the holder is empty after, whatever `f` returns.
    pub(crate) fn drain(&self, mut f: impl FnMut(DeviceBatch) -> Result<()>) -> Result<()> {
        let taken = std::mem::take(&mut self.lock().slots);
        let mut outcome = Ok(());
        for slot in taken {
            let batch = match slot {
                Slot::Device(batch) => batch,
                Slot::Host(host) => {
                    let size = host.get_array_memory_size();
                    let uploaded = upload_batches(&self.stream, &host.schema(), &[host]);
                    self.lock().reservation.shrink(size);
                    match uploaded {
                        Ok(batch) => batch,
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                }
            };
            if let Err(e) = f(batch) {
                outcome = Err(e);
                break;
            }
        }
        // Those not handed over are dropped: nothing stays charged.
        self.lock().reservation.free();
        outcome
    }
}

impl Spillable for HeldBatches {
    fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resident_bytes(&self) -> usize {
        let Ok(slots) = self.slots.try_lock() else {
            return 0;
        };
        slots
            .slots
            .iter()
            .map(|slot| match slot {
                Slot::Device(batch) => batch.unshared_bytes(),
                Slot::Host(_) => 0,
            })
            .sum()
    }

    /// Downloads the device batches only they view, in order, until the memory pool refuses
    /// one; the device bytes let go of.
    fn spill(&self) -> Result<usize> {
        let Ok(mut slots) = self.slots.try_lock() else {
            return Ok(0);
        };
        let Slots { slots, reservation } = &mut *slots;
        let mut freed = 0;
        let mut failed = None;
        for slot in slots.iter_mut() {
            let Slot::Device(batch) = slot else {
                continue;
            };
            let bytes = batch.unshared_bytes();
            if bytes == 0 {
                continue;
            }
            let host = match download_batch(&self.stream, batch) {
                Ok(host) => host,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if reservation.try_grow(host.get_array_memory_size()).is_err() {
                break;
            }
            freed += bytes;
            *slot = Slot::Host(host);
        }
        if freed > 0 {
            self.evicted.add(freed);
            // The frees are ordered on this stream: done, the memory is free for any.
            self.stream.synchronize()?;
        }
        match failed {
            Some(e) if freed == 0 => Err(e),
            _ => Ok(freed),
        }
    }
}
