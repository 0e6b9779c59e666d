//! Device memory: the budgeted pool every allocation is charged to, typed device buffers and
//! slices, reservations, and pooled pinned host staging buffers.
//!
//! Contracts:
//! - Every device allocation is charged to its device's [`MemoryPool`] before it is made. An
//!   allocation over budget, or one the driver refuses for lack of memory, returns
//!   [`KernelError::OutOfMemory`]; nothing panics or aborts.
//! - On `cuda`, memory comes from the device's stream-ordered pool (`cuMemAllocAsync`) and is
//!   freed on the stream it was allocated on, so freeing never synchronises. On `emulated` it is
//!   host memory aligned like device memory (256 bytes).
//! - Buffers are uninitialised unless created with a `zeroed`/`from_host` constructor.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream, result as cu};

use crate::device::{Event, Health};
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

/// Where an allocation's bytes live and how to give them back.
pub(crate) enum RawKind {
    /// Zero bytes: nothing to free.
    Empty,
    /// Host memory standing in for device memory (the emulated backend).
    Host { ptr: *mut u8, layout: Layout },
    /// CUDA device memory from the stream-ordered pool.
    Cuda {
        ptr: cudarc::driver::sys::CUdeviceptr,
        stream: Arc<CudaStream>,
        ctx: Arc<CudaContext>,
        health: Arc<Health>,
    },
}

/// One device allocation, charged to a pool until dropped.
pub(crate) struct RawAllocation {
    pub(crate) bytes: usize,
    pub(crate) pool: Arc<MemoryPool>,
    pub(crate) kind: RawKind,
    /// Set by [`DeviceBuffer::share_across_streams`]: the memory may be read by work on any
    /// stream, so freeing it waits for the whole device instead of just its own stream.
    pub(crate) shared: std::sync::atomic::AtomicBool,
}

// SAFETY: the allocation owns its memory exclusively; the raw host pointer is only an address.
unsafe impl Send for RawAllocation {}
// SAFETY: shared access only reads the address; kernels and copies synchronise through streams.
unsafe impl Sync for RawAllocation {}

impl RawAllocation {
    pub(crate) fn address(&self) -> u64 {
        match &self.kind {
            RawKind::Empty => 0,
            RawKind::Host { ptr, .. } => *ptr as u64,
            RawKind::Cuda { ptr, .. } => *ptr,
        }
    }

    /// Allocates host memory that stands in for device memory.
    pub(crate) fn host(pool: &Arc<MemoryPool>, bytes: usize, zeroed: bool) -> Result<Self> {
        pool.charge_allocation(bytes)?;
        let kind = if bytes == 0 {
            RawKind::Empty
        } else {
            let layout = Layout::from_size_align(bytes, DEVICE_ALIGNMENT).map_err(|_| {
                KernelError::InvalidArgument {
                    message: format!("allocation of {bytes} bytes is too large"),
                }
            });
            let layout = match layout {
                Ok(l) => l,
                Err(e) => {
                    pool.release_allocation(bytes);
                    return Err(e);
                }
            };
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe {
                if zeroed {
                    std::alloc::alloc_zeroed(layout)
                } else {
                    std::alloc::alloc(layout)
                }
            };
            if ptr.is_null() {
                pool.release_allocation(bytes);
                return Err(KernelError::OutOfMemory {
                    requested_bytes: bytes,
                    free_bytes: pool.stats().free_bytes(),
                });
            }
            RawKind::Host { ptr, layout }
        };
        Ok(RawAllocation {
            bytes,
            pool: Arc::clone(pool),
            kind,
            shared: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl Drop for RawAllocation {
    fn drop(&mut self) {
        match &self.kind {
            RawKind::Empty => {}
            // SAFETY: allocated with exactly this layout in `host`.
            RawKind::Host { ptr, layout } => unsafe { std::alloc::dealloc(*ptr, *layout) },
            RawKind::Cuda {
                ptr,
                stream,
                ctx,
                health,
            } => {
                // Errors cannot propagate out of drop; a failure here is recorded in the
                // device's health, which the next call on the device reports.
                let shared = self.shared.load(Ordering::Acquire);
                let freed = ctx.bind_to_thread().and_then(|()| {
                    if shared {
                        // Kernels on other streams may still read it: a stream-ordered free
                        // on its own stream would not wait for them.
                        ctx.synchronize()?;
                    }
                    // SAFETY: `ptr` came from cuMemAllocAsync on this stream and is freed once.
                    unsafe { cu::free_async(*ptr, stream.cu_stream()) }
                });
                if let Err(e) = freed {
                    health.record_driver_error("cuMemFreeAsync", &e);
                }
            }
        }
        self.pool.release_allocation(self.bytes);
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

/// Size classes of pinned staging buffers: powers of two from 64 KiB.
const PINNED_MIN_BYTES: usize = 64 << 10;

/// Pooled page-locked host buffers for asynchronous host↔device copies.
///
/// Buffers are kept by size class and reused; a buffer returned while a copy may still read or
/// write it waits for that copy's event before anyone else gets it.
#[derive(Debug, Default)]
pub struct PinnedPool {
    free: Mutex<Vec<PinnedBlock>>,
    /// Blocks dropped while a copy still used them, with that copy's event.
    retired: Mutex<Vec<(PinnedBlock, Event)>>,
    cached_bytes: AtomicUsize,
}

#[derive(Debug)]
pub(crate) struct PinnedBlock {
    ptr: *mut u8,
    capacity: usize,
    cuda: Option<Arc<CudaContext>>,
}

// SAFETY: a block is owned by exactly one PinnedBuffer or by the pool's free list.
unsafe impl Send for PinnedBlock {}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        match &self.cuda {
            Some(ctx) => {
                if ctx.bind_to_thread().is_ok() {
                    // SAFETY: allocated by cuMemHostAlloc in `PinnedPool::take`, freed once.
                    let _ = unsafe { cu::free_host(self.ptr.cast()) };
                }
            }
            None => {
                if let Ok(layout) = Layout::from_size_align(self.capacity, DEVICE_ALIGNMENT) {
                    // SAFETY: allocated with this layout in `PinnedPool::take`.
                    unsafe { std::alloc::dealloc(self.ptr, layout) };
                }
            }
        }
    }
}

impl PinnedPool {
    /// Bytes held by buffers waiting in the pool for reuse.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn take(
        self: &Arc<Self>,
        bytes: usize,
        cuda: Option<&Arc<CudaContext>>,
    ) -> Result<PinnedBuffer> {
        let capacity = bytes.max(1).next_power_of_two().max(PINNED_MIN_BYTES);
        self.reclaim();
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            free.iter()
                .position(|b| b.capacity == capacity)
                .map(|i| free.swap_remove(i))
        };
        let block = match reused {
            Some(b) => {
                self.cached_bytes.fetch_sub(b.capacity, Ordering::Relaxed);
                b
            }
            None => match cuda {
                Some(ctx) => {
                    ctx.bind_to_thread()
                        .map_err(|e| driver_error("cuCtxSetCurrent", &e))?;
                    // SAFETY: a plain page-locked allocation; freed in PinnedBlock::drop.
                    // PORTABLE: usable from every context, for multi-GPU staging.
                    let ptr = unsafe {
                        cu::malloc_host(capacity, cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE)
                    }
                    .map_err(|e| match e.0 {
                        cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                            KernelError::OutOfMemory {
                                requested_bytes: capacity,
                                free_bytes: 0,
                            }
                        }
                        _ => driver_error("cuMemHostAlloc", &e),
                    })?;
                    PinnedBlock {
                        ptr: ptr.cast(),
                        capacity,
                        cuda: Some(Arc::clone(ctx)),
                    }
                }
                None => {
                    let layout =
                        Layout::from_size_align(capacity, DEVICE_ALIGNMENT).map_err(|_| {
                            KernelError::InvalidArgument {
                                message: format!("pinned buffer of {bytes} bytes is too large"),
                            }
                        })?;
                    // SAFETY: non-zero size.
                    let ptr = unsafe { std::alloc::alloc(layout) };
                    if ptr.is_null() {
                        return Err(KernelError::OutOfMemory {
                            requested_bytes: capacity,
                            free_bytes: 0,
                        });
                    }
                    PinnedBlock {
                        ptr,
                        capacity,
                        cuda: None,
                    }
                }
            },
        };
        Ok(PinnedBuffer {
            block: Some(block),
            len: bytes,
            pending: None,
            pool: Arc::clone(self),
        })
    }

    /// Moves retired blocks whose copies have finished back to the free list.
    fn reclaim(&self) {
        let done: Vec<PinnedBlock> = {
            let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            let (done, pending): (Vec<_>, Vec<_>) =
                retired.drain(..).partition(|(_, e)| e.is_complete());
            *retired = pending;
            done.into_iter().map(|(b, _)| b).collect()
        };
        for b in done {
            self.give_back(b);
        }
    }

    fn give_back(&self, block: PinnedBlock) {
        self.cached_bytes
            .fetch_add(block.capacity, Ordering::Relaxed);
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(block);
    }

    /// Frees every cached buffer.
    pub fn trim(&self) {
        let drained: Vec<_> = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for b in drained {
            self.cached_bytes.fetch_sub(b.capacity, Ordering::Relaxed);
        }
    }
}

/// A pinned host staging buffer of `len` bytes. Copies from or into it are truly asynchronous;
/// the buffer remembers the last copy's event, and every host access waits for it first.
#[derive(Debug)]
pub struct PinnedBuffer {
    block: Option<PinnedBlock>,
    len: usize,
    pending: Option<Event>,
    pool: Arc<PinnedPool>,
}

impl PinnedBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ptr(&self) -> *mut u8 {
        self.block.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr)
    }

    /// Waits for the last copy that uses this buffer.
    pub fn wait(&mut self) -> Result<()> {
        if let Some(e) = self.pending.take() {
            e.synchronize()?;
        }
        Ok(())
    }

    /// The bytes, after any pending copy completes.
    pub fn as_bytes(&mut self) -> Result<&[u8]> {
        self.wait()?;
        // SAFETY: the block holds at least `len` bytes and no copy is in flight.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr(), self.len) })
    }

    /// The bytes for writing, after any pending copy completes.
    pub fn as_bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.wait()?;
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) })
    }

    pub(crate) fn raw_ptr(&self) -> *mut u8 {
        self.ptr()
    }

    pub(crate) fn set_pending(&mut self, e: Event) {
        self.pending = Some(e);
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        // A block still used by an in-flight copy must not be handed out again: it waits in
        // the retired list (without blocking this thread) until its copy's event completes.
        match self.pending.take() {
            Some(e) if !e.is_complete() => self
                .pool
                .retired
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((block, e)),
            _ => self.pool.give_back(block),
        }
    }
}

pub(crate) fn driver_error(call: &'static str, e: &cudarc::driver::DriverError) -> KernelError {
    KernelError::Driver {
        call,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_enforced_and_released() {
        let pool = Arc::new(MemoryPool::new(1000));
        let a = RawAllocation::host(&pool, 600, false).unwrap();
        let err = RawAllocation::host(&pool, 600, false)
            .err()
            .expect("over budget");
        match err {
            KernelError::OutOfMemory {
                requested_bytes,
                free_bytes,
            } => {
                assert_eq!(requested_bytes, 600);
                assert_eq!(free_bytes, 400);
            }
            other => panic!("expected OutOfMemory, got {other}"),
        }
        drop(a);
        let stats = pool.stats();
        assert_eq!(stats.allocated_bytes, 0);
        assert_eq!(stats.peak_bytes, 600);
        RawAllocation::host(&pool, 1000, true).unwrap();
    }

    #[test]
    fn reservations_count_against_the_budget() {
        let pool = Arc::new(MemoryPool::new(1000));
        let mut r = Reservation::new(Arc::clone(&pool), 700).unwrap();
        assert!(RawAllocation::host(&pool, 400, false).is_err());
        assert!(r.grow(400).unwrap_err().is_out_of_memory());
        assert_eq!(r.size(), 700);
        r.shrink(500);
        assert_eq!(pool.stats().reserved_bytes, 200);
        let _a = RawAllocation::host(&pool, 800, false).unwrap();
        drop(r);
        assert_eq!(pool.stats().reserved_bytes, 0);
        assert_eq!(pool.stats().free_bytes(), 200);
    }

    #[test]
    fn zero_byte_allocations_are_fine() {
        let pool = Arc::new(MemoryPool::new(0));
        let a = RawAllocation::host(&pool, 0, false).unwrap();
        assert_eq!(a.address(), 0);
    }

    #[test]
    fn pinned_buffers_are_reused_by_size_class() {
        let pool = Arc::new(PinnedPool::default());
        let mut b = pool.take(1000, None).unwrap();
        b.as_bytes_mut().unwrap().fill(7);
        let first = b.raw_ptr();
        drop(b);
        assert_eq!(pool.cached_bytes(), PINNED_MIN_BYTES);
        let mut c = pool.take(2000, None).unwrap();
        assert_eq!(c.raw_ptr(), first);
        assert_eq!(c.as_bytes().unwrap().len(), 2000);
        drop(c);
        pool.trim();
        assert_eq!(pool.cached_bytes(), 0);
    }
}
