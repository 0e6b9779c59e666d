//! Device memory: the budgeted pool every allocation is charged to, typed device buffers and
//! slices, and reservations. Pinned host staging buffers are in [`crate::pinned`].
//!
//! Contracts:
//! - Every device allocation is charged to its device's [`MemoryPool`] before it is made. An
//!   allocation over budget, or one the driver refuses for lack of memory, returns
//!   [`KernelError::OutOfMemory`]; nothing panics or aborts.
//! - On `cuda`, memory comes from the device's stream-ordered pool (`cuMemAllocAsync`) and is
//!   freed on the stream it was allocated on, so freeing never synchronises. On `emulated` it is
//!   checked host memory (guard pages, poison, quarantine: see `backend/emulated/memory.rs`),
//!   freed in stream order too.
//! - Buffers are uninitialised unless created with a `zeroed`/`from_host` constructor.

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::backend::{DeviceMemory, StreamBackend};
use crate::error::{KernelError, Result};

/// Alignment of every device allocation, matching what `cuMemAlloc` guarantees.
pub const DEVICE_ALIGNMENT: usize = 256;

/// Plain-old-data element types that may live in device memory.
///
/// # Safety
/// Every bit pattern must be a valid value, and the type must have no padding, so that kernels
/// may write arbitrary bytes into it.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => { $(
        // SAFETY: primitive integers and floats accept every bit pattern and have no padding.
        unsafe impl DeviceCopy for $t {}
    )* };
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, f32, f64);

/// Byte accounting for one device: a budget, what is allocated and reserved, and the peak.
#[derive(Debug)]
pub struct MemoryPool {
    budget_bytes: usize,
    /// allocated + reserved: the number the budget is checked against.
    used: AtomicUsize,
    allocated: AtomicUsize,
    reserved: AtomicUsize,
    peak: AtomicUsize,
}

/// A snapshot of a [`MemoryPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// The most the pool lets allocations and reservations use together.
    pub budget_bytes: usize,
    /// Bytes held by live device buffers.
    pub allocated_bytes: usize,
    /// Bytes held by live reservations.
    pub reserved_bytes: usize,
    /// The largest `allocated + reserved` seen so far.
    pub peak_bytes: usize,
}

impl MemoryStats {
    /// Bytes still free in the budget.
    pub fn free_bytes(&self) -> usize {
        self.budget_bytes
            .saturating_sub(self.allocated_bytes + self.reserved_bytes)
    }
}

impl MemoryPool {
    /// A pool that lets at most `budget_bytes` be in use.
    pub fn new(budget_bytes: usize) -> Self {
        MemoryPool {
            budget_bytes,
            used: AtomicUsize::new(0),
            allocated: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Current accounting.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            budget_bytes: self.budget_bytes,
            allocated_bytes: self.allocated.load(Ordering::Relaxed),
            reserved_bytes: self.reserved.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
        }
    }

    /// Bytes allocated and reserved now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Charges `bytes` to the budget and then to `counter`, if the budget allows it.
    fn charge(&self, counter: &AtomicUsize, bytes: usize) -> Result<()> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let total = used.saturating_add(bytes);
            if total > self.budget_bytes {
                return Err(KernelError::OutOfMemory {
                    requested_bytes: bytes,
                    free_bytes: self.budget_bytes.saturating_sub(used),
                });
            }
            match self
                .used
                .compare_exchange_weak(used, total, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    counter.fetch_add(bytes, Ordering::AcqRel);
                    self.peak.fetch_max(total, Ordering::Relaxed);
                    return Ok(());
                }
                Err(actual) => used = actual,
            }
        }
    }

    fn uncharge(&self, counter: &AtomicUsize, bytes: usize) {
        counter.fetch_sub(bytes, Ordering::AcqRel);
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Starts a new peak at the bytes in use now; returns the peak before.
    pub(crate) fn reset_peak(&self) -> usize {
        self.peak
            .swap(self.used.load(Ordering::Relaxed), Ordering::Relaxed)
    }

    pub(crate) fn charge_allocation(&self, bytes: usize) -> Result<()> {
        self.charge(&self.allocated, bytes)
    }

    pub(crate) fn release_allocation(&self, bytes: usize) {
        self.uncharge(&self.allocated, bytes);
    }
}

/// A claim on part of the memory budget, for memory an operator will need later (a hash
/// table's build side, a sort's scratch). Released when dropped.
#[derive(Debug)]
pub struct Reservation {
    pool: Arc<MemoryPool>,
    bytes: usize,
}

impl Reservation {
    pub(crate) fn new(pool: Arc<MemoryPool>, bytes: usize) -> Result<Self> {
        pool.charge(&pool.reserved, bytes)?;
        Ok(Reservation { pool, bytes })
    }

    /// Bytes currently reserved.
    pub fn size(&self) -> usize {
        self.bytes
    }

    /// Reserves `bytes` more, or fails with `OutOfMemory` and keeps the current size.
    pub fn grow(&mut self, bytes: usize) -> Result<()> {
        self.pool.charge(&self.pool.reserved, bytes)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Gives back up to `bytes` of the reservation.
    pub fn shrink(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.pool.uncharge(&self.pool.reserved, bytes);
        self.bytes -= bytes;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.uncharge(&self.pool.reserved, self.bytes);
    }
}

/// One device allocation, charged to a pool until dropped.
pub(crate) struct RawAllocation {
    pub(crate) bytes: usize,
    pub(crate) pool: Arc<MemoryPool>,
    /// The query pool it is also charged to, if any.
    pub(crate) query: Option<Arc<MemoryPool>>,
    /// The backend's memory; `None` for zero bytes.
    pub(crate) mem: Option<Box<dyn DeviceMemory>>,
    /// Set by [`DeviceBuffer::share_across_streams`]: the memory may be read by work on any
    /// stream, so freeing it waits for the whole device instead of just its own stream.
    pub(crate) shared: AtomicBool,
    /// Set by [`DeviceBuffer::free_on`]: the stream its free is ordered on instead of the one
    /// that allocated it.
    pub(crate) free_on: OnceLock<Arc<dyn StreamBackend>>,
}

impl RawAllocation {
    pub(crate) fn address(&self) -> u64 {
        self.mem.as_ref().map_or(0, |m| m.address())
    }
}

impl Drop for RawAllocation {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            // Errors cannot propagate out of drop; the backend records a failed free in the
            // device's health, which the next call on the device reports.
            let on = self.free_on.get().map(|s| s.as_ref());
            mem.free(self.shared.load(Ordering::Acquire), on);
        }
        self.pool.release_allocation(self.bytes);
        if let Some(query) = &self.query {
            query.release_allocation(self.bytes);
        }
    }
}

/// A typed buffer in device memory (host memory on the emulated backend).
pub struct DeviceBuffer<T: DeviceCopy> {
    raw: RawAllocation,
    len: usize,
    _marker: PhantomData<T>,
}

impl<T: DeviceCopy> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("address", &format_args!("{:#x}", self.raw.address()))
            .finish()
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    pub(crate) fn from_raw(raw: RawAllocation, len: usize) -> Self {
        debug_assert!(raw.bytes >= len * size_of::<T>());
        DeviceBuffer {
            raw,
            len,
            _marker: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes of the elements.
    pub fn num_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device address of element 0 (a host address on the emulated backend).
    pub fn address(&self) -> u64 {
        self.raw.address()
    }

    /// The whole buffer as a slice.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            address: self.address(),
            len: self.len,
            _marker: PhantomData,
        }
    }

    /// A sub-range of the buffer; fails (never panics) when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        self.as_slice().slice(range)
    }

    /// Marks the buffer as read by work on several streams (a table cached in device memory,
    /// read by every query). Dropping it then first waits for all work on the device, so no
    /// kernel on another stream can read memory the pool has handed out again. Freeing an
    /// ordinary buffer is ordered only on the stream that allocated it.
    pub fn share_across_streams(&self) {
        self.raw.shared.store(true, Ordering::Release);
    }

    /// Hands the buffer over to `stream`: dropping it frees it in `stream`'s order instead of
    /// the allocating stream's. For memory filled on one stream (a copy stream) and used on
    /// another: the caller has made `stream` wait for an event recorded after the last work
    /// on the buffer's own stream, so the free cannot overtake that work, and this stream's
    /// later reads come before the free. The first hand-over counts; later ones are ignored.
    pub fn free_on(&self, stream: &crate::stream::Stream) -> Result<()> {
        if !Arc::ptr_eq(&self.raw.pool, stream.device_pool()) {
            return Err(KernelError::InvalidArgument {
                message: "a device buffer handed over to a stream of another device".into(),
            });
        }
        let _ = self.raw.free_on.set(Arc::clone(stream.backend()));
        Ok(())
    }

    /// The same memory as raw bytes (columns store values untyped, by width).
    pub fn into_bytes(self) -> DeviceBuffer<u8> {
        let len = self.num_bytes();
        DeviceBuffer::from_raw(self.raw, len)
    }
}

impl DeviceBuffer<u8> {
    /// The bytes as elements of `T`; fails when the length is not a whole number of elements.
    pub fn into_typed<T: DeviceCopy>(self) -> Result<DeviceBuffer<T>> {
        if !self.len.is_multiple_of(size_of::<T>()) {
            return Err(KernelError::InvalidArgument {
                message: format!(
                    "{} bytes are not a whole number of {}-byte elements",
                    self.len,
                    size_of::<T>()
                ),
            });
        }
        let len = self.len / size_of::<T>();
        Ok(DeviceBuffer::from_raw(self.raw, len))
    }
}

impl<'a> DeviceSlice<'a, u8> {
    /// The bytes viewed as elements of `T` (any bit pattern is a valid `T`); fails when the
    /// address is misaligned for `T` or the length is not a whole number of elements.
    pub fn cast<T: DeviceCopy>(self) -> Result<DeviceSlice<'a, T>> {
        let size = size_of::<T>();
        if !self.len.is_multiple_of(size) || !self.address.is_multiple_of(align_of::<T>() as u64) {
            return Err(KernelError::InvalidArgument {
                message: format!(
                    "{} bytes at {:#x} cannot be viewed as {}",
                    self.len,
                    self.address,
                    std::any::type_name::<T>()
                ),
            });
        }
        Ok(DeviceSlice {
            address: self.address,
            len: self.len / size,
            _marker: PhantomData,
        })
    }
}

/// A borrowed, typed range of device memory: what launchers take as input.
#[derive(Debug)]
pub struct DeviceSlice<'a, T> {
    address: u64,
    len: usize,
    _marker: PhantomData<&'a T>,
}

impl<T> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<'_, T> {}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for DeviceSlice<'a, T> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        b.as_slice()
    }
}

impl<'a, T> DeviceSlice<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the slice holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the first element.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// A sub-range; fails (never panics) when out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'a, T>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if start > end || end > self.len {
            return Err(KernelError::InvalidArgument {
                message: format!(
                    "device slice range {start}..{end} is out of bounds for length {}",
                    self.len
                ),
            });
        }
        Ok(DeviceSlice {
            address: self.address + (start * size_of::<T>()) as u64,
            len: end - start,
            _marker: PhantomData,
        })
    }
}

/// An Arrow bitmap (validity or booleans) in device memory: LSB-first bits starting at a bit
/// offset, as Arrow's sliced arrays need.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBitmap<'a> {
    /// The bitmap bytes.
    pub bytes: DeviceSlice<'a, u8>,
    /// Bit index of row 0.
    pub offset: usize,
}

impl<'a> DeviceBitmap<'a> {
    /// A bitmap starting at bit 0 of `bytes`.
    pub fn new(bytes: impl Into<DeviceSlice<'a, u8>>) -> Self {
        DeviceBitmap {
            bytes: bytes.into(),
            offset: 0,
        }
    }

    /// The same bitmap starting at bit `offset`.
    pub fn with_offset(self, offset: usize) -> Self {
        DeviceBitmap { offset, ..self }
    }

    /// Checks the bitmap covers `rows` rows.
    pub(crate) fn check_covers(&self, rows: usize, what: &str) -> Result<()> {
        let bits = self.bytes.len().saturating_mul(8);
        if self.offset.saturating_add(rows) > bits {
            return Err(KernelError::InvalidArgument {
                message: format!(
                    "{what} bitmap has {bits} bits from offset {}, fewer than the {rows} rows",
                    self.offset
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_enforced_and_released() {
        let pool = MemoryPool::new(1000);
        pool.charge_allocation(600).unwrap();
        match pool.charge_allocation(600).expect_err("over budget") {
            KernelError::OutOfMemory {
                requested_bytes,
                free_bytes,
            } => {
                assert_eq!(requested_bytes, 600);
                assert_eq!(free_bytes, 400);
            }
            other => panic!("expected OutOfMemory, got {other}"),
        }
        pool.release_allocation(600);
        let stats = pool.stats();
        assert_eq!(stats.allocated_bytes, 0);
        assert_eq!(stats.peak_bytes, 600);
        pool.charge_allocation(1000).unwrap();
    }

    #[test]
    fn reservations_count_against_the_budget() {
        let pool = Arc::new(MemoryPool::new(1000));
        let mut r = Reservation::new(Arc::clone(&pool), 700).unwrap();
        assert!(pool.charge_allocation(400).is_err());
        assert!(r.grow(400).unwrap_err().is_out_of_memory());
        assert_eq!(r.size(), 700);
        r.shrink(500);
        assert_eq!(pool.stats().reserved_bytes, 200);
        pool.charge_allocation(800).unwrap();
        drop(r);
        assert_eq!(pool.stats().reserved_bytes, 0);
        assert_eq!(pool.stats().free_bytes(), 200);
    }
}
