//! Devices, streams and events: the one API operators use on both backends.
//!
//! A [`Device`] is a CUDA GPU (through cudarc's driver API) or the emulator (host memory, the
//! kernels compiled as C++). Work is issued on [`Stream`]s: copies, kernel launches and events.
//! On `cuda` everything is asynchronous and stream-ordered; on `emulated` every call completes
//! before it returns, which trivially respects stream order.
//!
//! Health: a sticky CUDA error (illegal address, kernel trap, launch failure) poisons a CUDA
//! context. The first one marks the device unhealthy, and every later call returns
//! [`KernelError::DeviceUnhealthy`] with the original fault. The process keeps running, so the
//! engine can fall back to the CPU. A kernel error on the emulator is treated the same way.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result as cu, sys};

use crate::backend::{cuda as cuda_backend, emulated};
use crate::error::{KernelError, Result, ensure_arg};
use crate::launch::{Kernel, KernelArg, LaunchConfig, check_args};
use crate::memory::{
    DeviceBuffer, DeviceCopy, DeviceSlice, MemoryPool, MemoryStats, PinnedBuffer, PinnedPool,
    RawAllocation, RawKind, Reservation, driver_error,
};

/// Which implementation runs the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// A real NVIDIA GPU: NVRTC-compiled CUBINs launched through the CUDA driver.
    Cuda,
    /// The same kernel sources compiled as host C++ and run by the emulator.
    Emulated,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Emulated => "emulated",
        })
    }
}

/// How much memory a device lets its pool use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryBudget {
    /// This fraction of the memory free when the device opens (the default is 0.8).
    FractionOfFree(f64),
    /// Exactly this many bytes.
    Bytes(usize),
}

impl Default for MemoryBudget {
    fn default() -> Self {
        MemoryBudget::FractionOfFree(0.8)
    }
}

/// Options for opening a device.
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// CUDA device ordinal (ignored by the emulator).
    pub ordinal: usize,
    /// The memory budget of the device's pool.
    pub memory_budget: MemoryBudget,
}

/// What a device is, for `\gpu`, `spate selftest` and benchmark reports.
#[derive(Debug, Clone)]
pub struct DeviceDescription {
    /// The backend.
    pub backend: BackendKind,
    /// Device name, e.g. "NVIDIA H200", or "emulator (2 host threads)".
    pub name: String,
    /// Compile target: `sm_90`, or `host` for the emulator.
    pub arch: String,
    /// Compute capability on `cuda`.
    pub compute_capability: Option<(i32, i32)>,
    /// Streaming multiprocessors (host threads on the emulator).
    pub multiprocessors: u32,
    /// Total memory in bytes.
    pub total_memory_bytes: usize,
    /// Free memory in bytes when the device opened.
    pub free_memory_bytes: usize,
    /// CUDA driver version, e.g. 13000, on `cuda`.
    pub driver_version: Option<i32>,
    /// NVRTC version, on `cuda`.
    pub nvrtc_version: Option<(i32, i32)>,
}

impl fmt::Display for DeviceDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: usize| b as f64 / f64::from(1u32 << 30);
        write!(
            f,
            "{} [{}], {}, {} SMs, {:.1} GiB total, {:.1} GiB free",
            self.name,
            self.backend,
            self.arch,
            self.multiprocessors,
            gib(self.total_memory_bytes),
            gib(self.free_memory_bytes)
        )?;
        if let Some(v) = self.driver_version {
            write!(f, ", driver {}.{}", v / 1000, (v % 1000) / 10)?;
        }
        if let Some((major, minor)) = self.nvrtc_version {
            write!(f, ", NVRTC {major}.{minor}")?;
        }
        Ok(())
    }
}

/// Whether a device can still run work, and if not, why.
#[derive(Debug, Default)]
pub(crate) struct Health {
    fault: Mutex<Option<String>>,
}

/// CUDA errors after which the context is unusable.
fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

impl Health {
    pub(crate) fn check(&self) -> Result<()> {
        match &*self.fault.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(reason) => Err(KernelError::DeviceUnhealthy {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn mark(&self, reason: String) {
        let mut fault = self.fault.lock().unwrap_or_else(|p| p.into_inner());
        if fault.is_none() {
            log::error!("GPU device marked unhealthy: {reason}");
            *fault = Some(reason);
        }
    }

    /// Records a driver error; a sticky one marks the device unhealthy.
    pub(crate) fn record_driver_error(&self, call: &'static str, e: &DriverError) {
        if is_sticky(e.0) {
            self.mark(format!("`{call}` failed: {e}"));
        }
    }

    /// Converts a driver error, recording it; out-of-memory becomes `OutOfMemory`.
    pub(crate) fn driver(&self, call: &'static str, e: DriverError) -> KernelError {
        self.record_driver_error(call, &e);
        if is_sticky(e.0) {
            return KernelError::DeviceUnhealthy {
                reason: format!("`{call}` failed: {e}"),
            };
        }
        driver_error(call, &e)
    }
}

pub(crate) struct CudaState {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) arch: String,
    pub(crate) driver_version: i32,
    pub(crate) modules: Mutex<HashMap<&'static str, Arc<cudarc::driver::CudaModule>>>,
}

pub(crate) struct DeviceInner {
    pub(crate) kind: BackendKind,
    pub(crate) description: DeviceDescription,
    pub(crate) memory: Arc<MemoryPool>,
    pub(crate) pinned: Arc<PinnedPool>,
    pub(crate) health: Arc<Health>,
    pub(crate) cuda: Option<CudaState>,
    pub(crate) kernels: Mutex<HashMap<String, Kernel>>,
    /// Blocks for grid-stride kernels: enough to fill the device a few times over.
    pub(crate) grid_blocks: u32,
}

/// A device: a CUDA GPU or the emulator. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("description", &self.inner.description)
            .field("memory", &self.inner.memory.stats())
            .finish()
    }
}

fn budget_bytes(budget: MemoryBudget, free: usize) -> Result<usize> {
    match budget {
        MemoryBudget::Bytes(b) => Ok(b),
        MemoryBudget::FractionOfFree(f) if f > 0.0 && f <= 1.0 => Ok((free as f64 * f) as usize),
        MemoryBudget::FractionOfFree(f) => Err(KernelError::InvalidArgument {
            message: format!("memory budget fraction {f} must be in (0, 1]"),
        }),
    }
}

impl Device {
    /// Opens a device of the given backend.
    pub fn open(kind: BackendKind, options: DeviceOptions) -> Result<Device> {
        match kind {
            BackendKind::Cuda => Device::cuda(options),
            BackendKind::Emulated => Device::emulated(options),
        }
    }

    /// Opens CUDA device `options.ordinal`. Returns `NoDevice` (never panics) when there is no
    /// driver, no GPU, or no NVRTC to compile kernels with.
    pub fn cuda(options: DeviceOptions) -> Result<Device> {
        let opened = cuda_backend::open(options.ordinal)?;
        let memory = Arc::new(MemoryPool::new(budget_bytes(
            options.memory_budget,
            opened.description.free_memory_bytes,
        )?));
        let grid_blocks = opened.description.multiprocessors.max(1) * 8;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                kind: BackendKind::Cuda,
                description: opened.description,
                memory,
                pinned: Arc::new(PinnedPool::default()),
                health: Arc::new(Health::default()),
                cuda: Some(opened.state),
                kernels: Mutex::new(HashMap::new()),
                grid_blocks,
            }),
        })
    }

    /// Opens the emulator. Always available where the binary runs.
    pub fn emulated(options: DeviceOptions) -> Result<Device> {
        let description = emulated::describe();
        let memory = Arc::new(MemoryPool::new(budget_bytes(
            options.memory_budget,
            description.free_memory_bytes,
        )?));
        let grid_blocks = description.multiprocessors.max(1) * 4;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                kind: BackendKind::Emulated,
                description,
                memory,
                pinned: Arc::new(PinnedPool::default()),
                health: Arc::new(Health::default()),
                cuda: None,
                kernels: Mutex::new(HashMap::new()),
                grid_blocks,
            }),
        })
    }

    /// The backend.
    pub fn kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// What the device is.
    pub fn description(&self) -> &DeviceDescription {
        &self.inner.description
    }

    /// Memory accounting of the device's pool.
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.memory.stats()
    }

    /// Reserves `bytes` of the memory budget (see [`Reservation`]).
    pub fn reserve(&self, bytes: usize) -> Result<Reservation> {
        Reservation::new(Arc::clone(&self.inner.memory), bytes)
    }

    /// The pool of pinned host staging buffers.
    pub fn pinned_pool(&self) -> &Arc<PinnedPool> {
        &self.inner.pinned
    }

    /// A pinned host staging buffer of `bytes` bytes, from the pool.
    pub fn pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        self.inner
            .pinned
            .take(bytes, self.inner.cuda.as_ref().map(|c| &c.ctx))
    }

    /// Fails with `DeviceUnhealthy` once a sticky error has poisoned the device.
    pub fn check_health(&self) -> Result<()> {
        self.inner.health.check()
    }

    /// Blocks to launch for a grid-stride kernel over `n` items.
    pub fn grid_stride_blocks(&self, n: usize) -> u32 {
        let needed = n.div_ceil(crate::launch::BLOCK_THREADS as usize).max(1);
        needed.min(self.inner.grid_blocks as usize) as u32
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        self.check_health()?;
        let imp = match &self.inner.cuda {
            Some(c) => StreamImpl::Cuda(
                c.ctx
                    .new_stream()
                    .map_err(|e| self.inner.health.driver("cuStreamCreate", e))?,
            ),
            None => StreamImpl::Emulated,
        };
        Ok(Stream {
            device: self.clone(),
            imp,
        })
    }

    /// The fixed kernel `entry` (an `extern "C"` entry point under `kernels/cuda/`), compiled
    /// and loaded on first use and cached afterwards.
    pub fn kernel(&self, entry: &str) -> Result<Kernel> {
        self.check_health()?;
        if let Some(k) = self
            .inner
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(entry)
        {
            return Ok(k.clone());
        }
        let kernel = match &self.inner.cuda {
            Some(c) => cuda_backend::load_fixed(c, &self.inner.health, entry)?,
            None => emulated::load_fixed(entry)?,
        };
        self.inner
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(entry.to_string(), kernel.clone());
        Ok(kernel)
    }

    /// Compiles generated kernel source (from the expression JIT) and returns its entry points.
    ///
    /// The source includes headers as fixed kernels do (`#include "common/prelude.cuh"`) and
    /// exports each entry with `SPATE_EXPORT(name)`. Compiled code is cached on disk by a hash
    /// of the source, so the same expression compiles once per machine.
    pub fn compile_generated(
        &self,
        name: &str,
        source: &str,
        entries: &[&str],
    ) -> Result<Vec<Kernel>> {
        self.check_health()?;
        match &self.inner.cuda {
            Some(c) => cuda_backend::load_generated(c, &self.inner.health, name, source, entries),
            None => emulated::load_generated(name, source, entries),
        }
    }
}

/// An ordered queue of work on one device.
pub struct Stream {
    device: Device,
    imp: StreamImpl,
}

enum StreamImpl {
    Cuda(Arc<CudaStream>),
    Emulated,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("backend", &self.device.kind())
            .finish()
    }
}

impl Stream {
    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn health(&self) -> &Health {
        &self.device.inner.health
    }

    fn bind(&self) -> Result<()> {
        self.device.check_health()?;
        if let Some(c) = &self.device.inner.cuda {
            c.ctx
                .bind_to_thread()
                .map_err(|e| self.health().driver("cuCtxSetCurrent", e))?;
        }
        Ok(())
    }

    fn alloc_raw(&self, bytes: usize, zeroed: bool) -> Result<RawAllocation> {
        self.bind()?;
        let pool = &self.device.inner.memory;
        match &self.imp {
            StreamImpl::Emulated => RawAllocation::host(pool, bytes, zeroed),
            StreamImpl::Cuda(stream) => {
                pool.charge_allocation(bytes)?;
                if bytes == 0 {
                    return Ok(RawAllocation {
                        bytes,
                        pool: Arc::clone(pool),
                        kind: RawKind::Empty,
                        shared: AtomicBool::new(false),
                    });
                }
                // SAFETY: a stream-ordered allocation on a live stream; the memory is only used
                // on this stream (or after events that order other streams behind it).
                let ptr = match unsafe { cu::malloc_async(stream.cu_stream(), bytes) } {
                    Ok(p) => p,
                    Err(e) => {
                        pool.release_allocation(bytes);
                        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                            let free = cu::mem_get_info().map(|(f, _)| f).unwrap_or(0);
                            return Err(KernelError::OutOfMemory {
                                requested_bytes: bytes,
                                free_bytes: free,
                            });
                        }
                        return Err(self.health().driver("cuMemAllocAsync", e));
                    }
                };
                let ctx = self.device.inner.cuda.as_ref().map(|c| Arc::clone(&c.ctx));
                let Some(ctx) = ctx else {
                    return Err(KernelError::Internal {
                        message: "CUDA stream on a device without a CUDA context".into(),
                    });
                };
                let raw = RawAllocation {
                    bytes,
                    pool: Arc::clone(pool),
                    kind: RawKind::Cuda {
                        ptr,
                        stream: Arc::clone(stream),
                        ctx,
                        health: Arc::clone(&self.device.inner.health),
                    },
                    shared: AtomicBool::new(false),
                };
                if zeroed {
                    // SAFETY: `ptr` holds `bytes` bytes allocated above on this stream.
                    unsafe { cu::memset_d8_async(ptr, 0, bytes, stream.cu_stream()) }
                        .map_err(|e| self.health().driver("cuMemsetD8Async", e))?;
                }
                Ok(raw)
            }
        }
    }

    /// An uninitialised buffer of `len` elements.
    pub fn alloc<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = checked_bytes::<T>(len)?;
        Ok(DeviceBuffer::from_raw(self.alloc_raw(bytes, false)?, len))
    }

    /// A buffer of `len` zeroed elements.
    pub fn alloc_zeroed<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = checked_bytes::<T>(len)?;
        Ok(DeviceBuffer::from_raw(self.alloc_raw(bytes, true)?, len))
    }

    /// A new buffer holding a copy of `data`. The copy is ordered on this stream; `data` is
    /// pageable memory, so the call returns once the driver has staged it.
    pub fn from_host<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buf = self.alloc::<T>(data.len())?;
        self.copy_from_host(data, &mut buf, 0)?;
        Ok(buf)
    }

    /// Copies `data` into `dst` starting at element `dst_offset`.
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
        self.bind()?;
        let address = dst.address() + (dst_offset * size_of::<T>()) as u64;
        match &self.imp {
            // SAFETY: bounds checked above; the emulated buffer is host memory we own.
            StreamImpl::Emulated => unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr().cast::<u8>(),
                    address as *mut u8,
                    size_of_val(data),
                );
            },
            // SAFETY: bounds checked; pageable source memory is staged by the driver before
            // cuMemcpyHtoDAsync returns, so `data` may be dropped afterwards.
            StreamImpl::Cuda(s) => unsafe { cu::memcpy_htod_async(address, data, s.cu_stream()) }
                .map_err(|e| self.health().driver("cuMemcpyHtoDAsync", e))?,
        }
        Ok(())
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
        self.bind()?;
        match &self.imp {
            // SAFETY: lengths match; the slice borrows a live buffer.
            StreamImpl::Emulated => unsafe {
                std::ptr::copy_nonoverlapping(
                    src.address() as *const u8,
                    out.as_mut_ptr().cast::<u8>(),
                    size_of_val(out),
                );
            },
            StreamImpl::Cuda(s) => {
                // SAFETY: lengths match; we synchronise before `out` is read.
                unsafe { cu::memcpy_dtoh_async(out, src.address(), s.cu_stream()) }
                    .map_err(|e| self.health().driver("cuMemcpyDtoHAsync", e))?;
                s.synchronize()
                    .map_err(|e| self.health().driver("cuStreamSynchronize", e))?;
            }
        }
        Ok(())
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

    /// Copies `src` into `dst` at element `dst_offset`, on the device.
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
        self.bind()?;
        let to = dst.address() + (dst_offset * size_of::<T>()) as u64;
        let bytes = src.len() * size_of::<T>();
        match &self.imp {
            // SAFETY: bounds checked; `copy` tolerates overlap.
            StreamImpl::Emulated => unsafe {
                std::ptr::copy(src.address() as *const u8, to as *mut u8, bytes)
            },
            // SAFETY: bounds checked; both ranges are device memory of this context.
            StreamImpl::Cuda(s) => {
                unsafe { cu::memcpy_dtod_async(to, src.address(), bytes, s.cu_stream()) }
                    .map_err(|e| self.health().driver("cuMemcpyDtoDAsync", e))?
            }
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
        self.bind()?;
        if src.is_empty() {
            return Ok(());
        }
        match &self.imp {
            // SAFETY: bounds checked above; both are host memory.
            StreamImpl::Emulated => unsafe {
                std::ptr::copy_nonoverlapping(src.raw_ptr(), dst.address() as *mut u8, src.len())
            },
            StreamImpl::Cuda(s) => {
                // SAFETY: bounds checked; the pinned block stays alive and untouched until the
                // event recorded below completes (PinnedBuffer waits for it).
                let bytes = unsafe { std::slice::from_raw_parts(src.raw_ptr(), src.len()) };
                unsafe { cu::memcpy_htod_async(dst.address(), bytes, s.cu_stream()) }
                    .map_err(|e| self.health().driver("cuMemcpyHtoDAsync", e))?;
            }
        }
        src.set_pending(self.record_event()?);
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
        self.bind()?;
        if bytes == 0 {
            return Ok(());
        }
        match &self.imp {
            // SAFETY: sizes match; both are host memory.
            StreamImpl::Emulated => unsafe {
                std::ptr::copy_nonoverlapping(src.address() as *const u8, dst.raw_ptr(), bytes)
            },
            StreamImpl::Cuda(s) => {
                // SAFETY: sizes match; the host reads only after the recorded event.
                let out = unsafe { std::slice::from_raw_parts_mut(dst.raw_ptr(), bytes) };
                unsafe { cu::memcpy_dtoh_async(out, src.address(), s.cu_stream()) }
                    .map_err(|e| self.health().driver("cuMemcpyDtoHAsync", e))?;
            }
        }
        dst.set_pending(self.record_event()?);
        Ok(())
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
        self.bind()?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: bounds checked; the block outlives the copy (reads wait for the event).
        let out = unsafe { dst.raw_ptr().add(dst_offset) };
        match &self.imp {
            // SAFETY: bounds checked; both are host memory.
            StreamImpl::Emulated => unsafe {
                std::ptr::copy_nonoverlapping(src.address() as *const u8, out, bytes)
            },
            StreamImpl::Cuda(s) => {
                // SAFETY: as above; the host reads only after the recorded event.
                let out = unsafe { std::slice::from_raw_parts_mut(out, bytes) };
                unsafe { cu::memcpy_dtoh_async(out, src.address(), s.cu_stream()) }
                    .map_err(|e| self.health().driver("cuMemcpyDtoHAsync", e))?;
            }
        }
        dst.set_pending(self.record_event()?);
        Ok(())
    }

    /// Records an event after all work issued so far.
    pub fn record_event(&self) -> Result<Event> {
        self.bind()?;
        let imp = match &self.imp {
            StreamImpl::Emulated => EventImpl::Emulated { at: Instant::now() },
            StreamImpl::Cuda(s) => EventImpl::Cuda {
                event: s
                    .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| self.health().driver("cuEventRecord", e))?,
                health: Arc::clone(&self.device.inner.health),
            },
        };
        Ok(Event { imp })
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.bind()?;
        match (&self.imp, &event.imp) {
            (StreamImpl::Cuda(s), EventImpl::Cuda { event, .. }) => s
                .wait(event)
                .map_err(|e| self.health().driver("cuStreamWaitEvent", e)),
            (StreamImpl::Emulated, EventImpl::Emulated { .. }) => Ok(()),
            _ => Err(KernelError::Internal {
                message: "an event of one backend waited on by a stream of another".into(),
            }),
        }
    }

    /// Waits until all work issued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        match &self.imp {
            StreamImpl::Emulated => Ok(()),
            StreamImpl::Cuda(s) => s
                .synchronize()
                .map_err(|e| self.health().driver("cuStreamSynchronize", e)),
        }
    }

    /// Launches `kernel` with `args`.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in type and meaning: pointers must
    /// address device memory of the sizes the kernel reads and writes, and that memory must
    /// stay alive until the stream has run the kernel. Sizes are checked where the backend can
    /// report them (always on `emulated`), but types and lengths are the caller's contract.
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        self.bind()?;
        check_args(kernel, args)?;
        let threads = cfg.threads_per_block();
        if threads == 0 || threads > 1024 {
            return Err(KernelError::InvalidArgument {
                message: format!("kernel `{}`: {threads} threads per block", kernel.name()),
            });
        }
        if cfg.num_blocks() == 0 {
            return Ok(());
        }
        let mut slots: Vec<u64> = args.iter().map(KernelArg::slot).collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| std::ptr::from_mut(s).cast())
            .collect();
        match (&kernel.imp, &self.imp) {
            (crate::launch::KernelImpl::Cuda { function, .. }, StreamImpl::Cuda(s)) => {
                // SAFETY: the caller guarantees the arguments; `params` points at slots that
                // live until cuLaunchKernel has copied them (it does so before returning).
                unsafe {
                    cu::launch_kernel(
                        function.cu_function(),
                        cfg.grid,
                        cfg.block,
                        cfg.shared_mem_bytes,
                        s.cu_stream(),
                        &mut params,
                    )
                }
                .map_err(|e| {
                    let err = self.health().driver("cuLaunchKernel", e);
                    match err {
                        KernelError::Driver { message, .. } => KernelError::Launch {
                            entry: kernel.name().to_string(),
                            grid: cfg.grid,
                            block: cfg.block,
                            message,
                        },
                        other => other,
                    }
                })
            }
            (crate::launch::KernelImpl::Emulated { launch, .. }, StreamImpl::Emulated) => {
                // SAFETY: as above; the emulator runs the grid before returning.
                let outcome = unsafe { emulated::run(*launch, cfg, &mut params) };
                outcome.map_err(|message| {
                    // A failed kernel on a GPU (trap, fault) poisons the context; the emulator
                    // mirrors that so callers see the same behaviour in CI.
                    self.device
                        .inner
                        .health
                        .mark(format!("kernel `{}` failed: {message}", kernel.name()));
                    KernelError::Launch {
                        entry: kernel.name().to_string(),
                        grid: cfg.grid,
                        block: cfg.block,
                        message,
                    }
                })
            }
            _ => Err(KernelError::Internal {
                message: format!(
                    "kernel `{}` launched on a stream of another backend",
                    kernel.name()
                ),
            }),
        }
    }
}

fn checked_bytes<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>())
        .ok_or_else(|| KernelError::InvalidArgument {
            message: format!("a buffer of {len} elements overflows the address space"),
        })
}

/// A point in a stream's work, for ordering and timing.
#[derive(Debug)]
pub struct Event {
    imp: EventImpl,
}

#[derive(Debug)]
enum EventImpl {
    Cuda {
        event: CudaEvent,
        health: Arc<Health>,
    },
    Emulated {
        at: Instant,
    },
}

impl Event {
    /// Waits for the work before the event.
    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            EventImpl::Emulated { .. } => Ok(()),
            EventImpl::Cuda { event, health } => {
                health.check()?;
                event
                    .synchronize()
                    .map_err(|e| health.driver("cuEventSynchronize", e))
            }
        }
    }

    /// True once the work before the event has finished.
    pub fn is_complete(&self) -> bool {
        match &self.imp {
            EventImpl::Emulated { .. } => true,
            EventImpl::Cuda { event, .. } => event.is_complete(),
        }
    }

    /// Milliseconds between this event and `end` (device time on `cuda`, host time on the
    /// emulator). Waits for `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        match (&self.imp, &end.imp) {
            (EventImpl::Emulated { at: a }, EventImpl::Emulated { at: b }) => {
                Ok(b.saturating_duration_since(*a).as_secs_f32() * 1000.0)
            }
            (EventImpl::Cuda { event: a, health }, EventImpl::Cuda { event: b, .. }) => {
                b.synchronize()
                    .map_err(|e| health.driver("cuEventSynchronize", e))?;
                a.elapsed_ms(b)
                    .map_err(|e| health.driver("cuEventElapsedTime", e))
            }
            _ => Err(KernelError::Internal {
                message: "timing events of two different backends".into(),
            }),
        }
    }
}
