//! Streams: ordered queues of copies, launches and events on one device, the same API on both
//! backends.
//!
//! Contracts:
//! - Every call checks its arguments (lengths, bounds, launch limits, parameter sizes) and the
//!   device's health before anything is queued; what it queues then runs asynchronously, in
//!   stream order, on `cuda` and on `emulated` alike.
//! - Host reads wait: [`Stream::copy_to_host`] and [`Stream::to_vec`] return once the bytes are
//!   on the host, and pinned buffers wait for their copy's event before the host touches them.
//!   Nothing else orders the host or another stream behind this stream's work: use events.
//! - An error in queued work (a faulting kernel) marks the device unhealthy and surfaces at the
//!   next call that waits, as a sticky CUDA error does.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::backend::{ElemInfo, HostPtr, StreamBackend};
use crate::counters::{Call, count};
use crate::device::Device;
use crate::error::{KernelError, Result, ensure_arg};
use crate::event::Event;
use crate::launch::{Kernel, KernelArg, LaunchConfig, check_args};
use crate::memory::{DeviceBuffer, DeviceCopy, DeviceSlice, MemoryPool, RawAllocation};
use crate::pinned::PinnedBuffer;

/// An ordered queue of work on one device.
pub struct Stream {
    device: Device,
    imp: Arc<dyn StreamBackend>,
    /// A query's pool its allocations are charged to, beside the device's.
    query: Option<Arc<MemoryPool>>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("backend", &self.device.kind())
            .finish()
    }
}

fn checked_bytes<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>())
        .ok_or_else(|| KernelError::InvalidArgument {
            message: format!("a buffer of {len} elements overflows the address space"),
        })
}

impl Stream {
    pub(crate) fn new(
        device: Device,
        imp: Arc<dyn StreamBackend>,
        query: Option<Arc<MemoryPool>>,
    ) -> Self {
        Stream { device, imp, query }
    }

    /// A new stream on the same device whose allocations are charged to the same pools.
    pub fn sibling(&self) -> Result<Stream> {
        match &self.query {
            Some(pool) => self.device.new_stream_in(Arc::clone(pool)),
            None => self.device.new_stream(),
        }
    }

    /// The query pool this stream's allocations are charged to, when it has one.
    pub fn query_pool(&self) -> Option<&Arc<MemoryPool>> {
        self.query.as_ref()
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn backend(&self) -> &Arc<dyn StreamBackend> {
        &self.imp
    }

    /// The device's pool, which every allocation on the device is charged to.
    pub(crate) fn device_pool(&self) -> &Arc<MemoryPool> {
        &self.device.inner.memory
    }

    fn check(&self) -> Result<()> {
        self.device.check_health()
    }

    fn count(&self, call: Call) {
        count(&self.device.inner.counters, call);
    }

    fn alloc_raw<T: DeviceCopy>(&self, len: usize, zeroed: bool) -> Result<RawAllocation> {
        let bytes = checked_bytes::<T>(len)?;
        self.check()?;
        let pool = &self.device.inner.memory;
        if bytes > 0 && self.device.inner.faults.alloc_fails() {
            return Err(KernelError::OutOfMemory {
                requested_bytes: bytes,
                free_bytes: 0,
            });
        }
        if let Some(query) = &self.query {
            query.charge_allocation(bytes)?;
        }
        if let Err(e) = pool.charge_allocation(bytes) {
            if let Some(query) = &self.query {
                query.release_allocation(bytes);
            }
            return Err(e);
        }
        let mem = if bytes == 0 {
            None
        } else {
            let elem = ElemInfo {
                name: std::any::type_name::<T>(),
                size: size_of::<T>(),
            };
            match self.imp.alloc(bytes, zeroed, elem) {
                Ok(m) => {
                    self.count(Call::Allocation(pool.in_use()));
                    Some(m)
                }
                Err(e) => {
                    pool.release_allocation(bytes);
                    if let Some(query) = &self.query {
                        query.release_allocation(bytes);
                    }
                    return Err(e);
                }
            }
        };
        Ok(RawAllocation {
            bytes,
            pool: Arc::clone(pool),
            query: self.query.clone(),
            mem,
            shared: AtomicBool::new(false),
            free_on: std::sync::OnceLock::new(),
        })
    }

    /// An uninitialised buffer of `len` elements (on the emulator it reads as poison, 0xCD
    /// bytes, until written).
    pub fn alloc<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        Ok(DeviceBuffer::from_raw(
            self.alloc_raw::<T>(len, false)?,
            len,
        ))
    }

    /// A buffer of `len` zeroed elements (zeroed in stream order).
    pub fn alloc_zeroed<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        Ok(DeviceBuffer::from_raw(self.alloc_raw::<T>(len, true)?, len))
    }

    /// A new buffer holding a copy of `data`. The copy is ordered on this stream; `data` is
    /// pageable memory, so the call returns once the bytes have been staged.
    pub fn from_host<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buf = self.alloc::<T>(data.len())?;
        self.copy_from_host(data, &mut buf, 0)?;
        Ok(buf)
    }

    /// Copies `data` into `dst` starting at element `dst_offset`, in stream order; `data` may
    /// be reused when this returns.
    pub fn copy_from_host<T: DeviceCopy>(
        &self,
        data: &[T],
        dst: &mut DeviceBuffer<T>,
        dst_offset: usize,
    ) -> Result<()> {
        ensure_arg!(
            dst_offset
                .checked_add(data.len())
                .is_some_and(|end| end <= dst.len()),
            "copy of {} elements at offset {dst_offset} overflows a buffer of {}",
            data.len(),
            dst.len()
        );
        if data.is_empty() {
            return Ok(());
        }
        self.check()?;
        let address = dst.address() + (dst_offset * size_of::<T>()) as u64;
        // SAFETY: `T` is plain data, so its bytes may be read as `u8`.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), size_of_val(data)) };
        self.count(Call::HostToDevice(bytes.len()));
        // SAFETY: bounds checked above; `dst` is borrowed mutably and freed in stream order.
        unsafe { self.imp.copy_from_host(bytes, address) }
    }

    /// Copies a device slice into `out`, waiting for the copy (and all earlier work on the
    /// stream) to finish.
    pub fn copy_to_host<T: DeviceCopy>(
        &self,
        src: DeviceSlice<'_, T>,
        out: &mut [T],
    ) -> Result<()> {
        ensure_arg!(
            src.len() == out.len(),
            "copy of {} device elements into a host slice of {}",
            src.len(),
            out.len()
        );
        if out.is_empty() {
            return Ok(());
        }
        self.check()?;
        let len = size_of_val(out);
        // SAFETY: any bytes are a valid `T`; the slice is exclusively borrowed.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), len) };
        self.count(Call::DeviceToHost(len));
        self.count(Call::HostSync);
        // SAFETY: lengths match; the slice borrows a live buffer.
        crate::wait::blocking(|| unsafe { self.imp.copy_to_host(src.address(), bytes) })?;
        // A fault elsewhere on the device may have stopped the copy: `out` is then not data.
        self.check()
    }

    /// Copies a device slice to a new vector (synchronising).
    pub fn to_vec<'a, T: DeviceCopy + Default>(
        &self,
        src: impl Into<DeviceSlice<'a, T>>,
    ) -> Result<Vec<T>> {
        let src = src.into();
        let mut out = vec![T::default(); src.len()];
        self.copy_to_host(src, &mut out)?;
        Ok(out)
    }

    /// Copies `src` into `dst` at element `dst_offset`, on the device, in stream order.
    pub fn copy_device<T: DeviceCopy>(
        &self,
        src: DeviceSlice<'_, T>,
        dst: &mut DeviceBuffer<T>,
        dst_offset: usize,
    ) -> Result<()> {
        ensure_arg!(
            dst_offset
                .checked_add(src.len())
                .is_some_and(|end| end <= dst.len()),
            "device copy of {} elements at offset {dst_offset} overflows a buffer of {}",
            src.len(),
            dst.len()
        );
        if src.is_empty() {
            return Ok(());
        }
        self.check()?;
        let to = dst.address() + (dst_offset * size_of::<T>()) as u64;
        self.count(Call::DeviceToDevice(src.len() * size_of::<T>()));
        // SAFETY: bounds checked; both are live buffers of this device.
        unsafe {
            self.imp
                .copy_device(src.address(), to, src.len() * size_of::<T>())
        }
    }

    /// Copies `src`, memory of `from`'s device, into `dst[dst_offset..]` on this stream's
    /// device, in this stream's order: a peer copy between devices with peer access (see
    /// [`Device::peer_access`]), counted as peer bytes on this device. The copy waits on this
    /// stream for what `from` queued before it (an event), and `from` waits for the copy before
    /// anything it queues later (so `src` may be freed on `from` once this returns). Many
    /// copies at once: [`Stream::order_after`], [`Stream::copy_peer_unordered`] for each, then
    /// [`Stream::order_after`] the other way round.
    pub fn copy_peer<T: DeviceCopy>(
        &self,
        src: DeviceSlice<'_, T>,
        from: &Stream,
        dst: &mut DeviceBuffer<T>,
        dst_offset: usize,
    ) -> Result<()> {
        self.order_after(from)?;
        self.copy_peer_unordered(src, from, dst, dst_offset)?;
        from.order_after(self)
    }

    /// Work queued on this stream from now on runs after what `other` queued so far (an event
    /// of `other` waited for here).
    pub fn order_after(&self, other: &Stream) -> Result<()> {
        let event = other.record_event()?;
        self.wait_event(&event)
    }

    /// [`Stream::copy_peer`] without its ordering: the caller has ordered this stream after
    /// `src`'s writes on `from`, and orders `from` after this stream before `src` is freed.
    pub fn copy_peer_unordered<T: DeviceCopy>(
        &self,
        src: DeviceSlice<'_, T>,
        from: &Stream,
        dst: &mut DeviceBuffer<T>,
        dst_offset: usize,
    ) -> Result<()> {
        ensure_arg!(
            dst_offset
                .checked_add(src.len())
                .is_some_and(|end| end <= dst.len()),
            "peer copy of {} elements at offset {dst_offset} into a buffer of {}",
            src.len(),
            dst.len()
        );
        self.check()?;
        from.check()?;
        if !from.device.peer_access(&self.device) {
            return Err(KernelError::Internal {
                message: "a peer copy between devices without peer access (copy through the \
                          host instead)"
                    .into(),
            });
        }
        let bytes = checked_bytes::<T>(src.len())?;
        if bytes == 0 {
            return Ok(());
        }
        let dst_addr = dst.address() + (dst_offset * size_of::<T>()) as u64;
        // SAFETY: `src` is `bytes` of `from`'s device memory and `dst` has room (checked).
        unsafe {
            self.imp
                .copy_peer(src.address(), from.backend().as_ref(), dst_addr, bytes)?;
        }
        if from.device.id() == self.device.id() {
            self.count(Call::DeviceToDevice(bytes));
        } else {
            self.count(Call::Peer(bytes));
        }
        Ok(())
    }

    /// Asynchronously copies a pinned staging buffer into `dst` (whose byte size must be at
    /// least the buffer's). The buffer is busy until the copy completes; touching it from the
    /// host waits for that.
    pub fn upload_pinned<T: DeviceCopy>(
        &self,
        src: &mut PinnedBuffer,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        ensure_arg!(
            src.len() <= dst.num_bytes(),
            "pinned upload of {} bytes into a device buffer of {} bytes",
            src.len(),
            dst.num_bytes()
        );
        src.wait()?;
        self.check()?;
        if src.is_empty() {
            return Ok(());
        }
        self.count(Call::HostToDevice(src.len()));
        // SAFETY: bounds checked; the pinned block stays alive and untouched until the event
        // recorded below completes (PinnedBuffer waits for it).
        unsafe {
            self.imp
                .copy_from_pinned(HostPtr(src.raw_ptr()), dst.address(), src.len())?
        };
        src.set_upload_pending(self.record_event()?);
        Ok(())
    }

    /// Asynchronously copies `src` into a pinned staging buffer of exactly its byte size.
    /// Reading the buffer waits for the copy.
    pub fn download_pinned<T: DeviceCopy>(
        &self,
        src: DeviceSlice<'_, T>,
        dst: &mut PinnedBuffer,
    ) -> Result<()> {
        let bytes = src.len() * size_of::<T>();
        ensure_arg!(
            bytes == dst.len(),
            "pinned download of {bytes} bytes into a staging buffer of {} bytes",
            dst.len()
        );
        dst.wait()?;
        self.download_pinned_at(src, dst, 0)
    }

    /// Asynchronously copies `src` into a pinned staging buffer at byte `dst_offset`. Several
    /// such copies may be in flight into one buffer; reading it waits for the last one (stream
    /// order makes that cover the earlier ones).
    pub fn download_pinned_at<T: DeviceCopy>(
        &self,
        src: DeviceSlice<'_, T>,
        dst: &mut PinnedBuffer,
        dst_offset: usize,
    ) -> Result<()> {
        let bytes = src.len() * size_of::<T>();
        ensure_arg!(
            dst_offset
                .checked_add(bytes)
                .is_some_and(|end| end <= dst.len()),
            "pinned download of {bytes} bytes at {dst_offset} overflows a staging buffer of {}",
            dst.len()
        );
        self.check()?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: bounds checked; the block outlives the copy (reads wait for the event).
        let out = unsafe { dst.raw_ptr().add(dst_offset) };
        let idle = dst.is_idle();
        self.count(Call::DeviceToHost(bytes));
        // SAFETY: as above; the host reads only after the recorded event.
        unsafe {
            self.imp
                .copy_to_pinned(src.address(), HostPtr(out), bytes, idle)?
        };
        dst.set_pending(self.record_event()?);
        Ok(())
    }

    /// Records an event after all work issued so far.
    pub fn record_event(&self) -> Result<Event> {
        self.check()?;
        Ok(Event::new(
            self.imp.record_event()?,
            Arc::clone(&self.device.inner.health),
            Arc::clone(&self.device.inner.counters),
        ))
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.check()?;
        self.imp.wait_event(event.backend())
    }

    /// Waits until all work issued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // No health check first: a kernel of this stream that faulted after its launch may
        // already have marked the device unhealthy, and the wait must still report that fault
        // itself (as `cudaStreamSynchronize` returns the kernel's error), not "unhealthy". A
        // device made unhealthy by an earlier, already reported fault says so afterwards.
        self.count(Call::HostSync);
        crate::wait::blocking(|| self.imp.synchronize())?;
        self.check()
    }

    /// Launches `kernel` with `args`, asynchronously.
    ///
    /// The launch is checked first, as a GPU checks it: parameter sizes (where the backend can
    /// tell them), block and grid dimensions, the kernel's `__launch_bounds__`, and dynamic
    /// shared memory. A kernel that faults while it runs makes the device unhealthy; the next
    /// call that waits reports it.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in type and meaning: pointers must
    /// address device memory of the sizes the kernel reads and writes, and that memory must
    /// stay alive until the stream has run the kernel (freeing it on this stream is enough).
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        self.check()?;
        if kernel.backend != self.device.kind() {
            return Err(KernelError::Internal {
                message: format!(
                    "kernel `{}` of the {} backend launched on a {} stream",
                    kernel.name(),
                    kernel.backend,
                    self.device.kind()
                ),
            });
        }
        let Some(kernel) = kernel.for_device(self.device.id()) else {
            return Err(KernelError::Internal {
                message: format!(
                    "kernel `{}` was loaded by another device than the stream's: a module \
                     belongs to one device's context",
                    kernel.name()
                ),
            });
        };
        check_args(kernel, args)?;
        kernel.check_launch(&cfg, &self.device.inner.limits)?;
        if cfg.num_blocks() == 0 {
            return Ok(());
        }
        if self.device.inner.faults.launch_faults() {
            let reason = format!("an injected fault in kernel `{}`", kernel.name());
            self.device.inner.health.mark(reason.clone());
            return Err(KernelError::DeviceUnhealthy { reason });
        }
        self.count(Call::Launch);
        // SAFETY: the caller guarantees the arguments.
        unsafe { self.imp.launch(kernel, cfg, args) }
    }
}
