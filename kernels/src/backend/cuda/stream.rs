//! CUDA streams, stream-ordered allocations and events.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result as cu, sys};

use super::bind;
use super::kernel::CudaKernel;
use crate::backend::{DeviceMemory, ElemInfo, EventBackend, HostPtr, StreamBackend};
use crate::error::{KernelError, Result};
use crate::health::Health;
use crate::launch::{Kernel, KernelArg, LaunchConfig};

pub(crate) struct CudaStreamBackend {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    health: Arc<Health>,
}

impl CudaStreamBackend {
    pub(crate) fn new(stream: Arc<CudaStream>, ctx: Arc<CudaContext>, health: Arc<Health>) -> Self {
        CudaStreamBackend {
            stream,
            ctx,
            health,
        }
    }

    fn bind(&self) -> Result<()> {
        bind(&self.ctx, &self.health)
    }

    fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }
}

/// Memory from the stream-ordered pool, freed on the stream it was allocated on.
struct CudaMemory {
    ptr: sys::CUdeviceptr,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    health: Arc<Health>,
}

impl DeviceMemory for CudaMemory {
    fn address(&self) -> u64 {
        self.ptr
    }

    fn free(self: Box<Self>, after_all_streams: bool, on: Option<&dyn StreamBackend>) {
        // A failed bind (an error stored by an earlier call) must not skip the free: the pool
        // has already been credited with these bytes.
        let _ = bind(&self.ctx, &self.health);
        if after_all_streams {
            // Kernels on other streams may still read it: a stream-ordered free on its own
            // stream would not wait for them.
            if let Err(e) = cu::ctx::synchronize() {
                self.health.record_driver_error("cuCtxSynchronize", &e);
            }
        }
        // Handed over to another stream, which events order behind this memory's own work:
        // a stream-ordered free there is legal and waits for that stream's reads.
        let stream = match on.and_then(|s| s.as_any().downcast_ref::<CudaStreamBackend>()) {
            Some(other) => other.raw(),
            None => self.stream.cu_stream(),
        };
        // SAFETY: `ptr` came from cuMemAllocAsync and is freed once, on a stream ordered
        // after every use of it.
        if let Err(e) = unsafe { cu::free_async(self.ptr, stream) } {
            self.health.record_driver_error("cuMemFreeAsync", &e);
        }
    }
}

impl StreamBackend for CudaStreamBackend {
    fn alloc(&self, bytes: usize, zeroed: bool, _elem: ElemInfo) -> Result<Box<dyn DeviceMemory>> {
        self.bind()?;
        // SAFETY: a stream-ordered allocation on a live stream; the memory is only used on this
        // stream or after events that order other streams behind it.
        let ptr = match unsafe { cu::malloc_async(self.raw(), bytes) } {
            Ok(p) => p,
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let free = cu::mem_get_info().map(|(f, _)| f).unwrap_or(0);
                return Err(KernelError::OutOfMemory {
                    requested_bytes: bytes,
                    free_bytes: free,
                });
            }
            Err(e) => return Err(self.health.driver("cuMemAllocAsync", e)),
        };
        let mem = Box::new(CudaMemory {
            ptr,
            stream: Arc::clone(&self.stream),
            ctx: Arc::clone(&self.ctx),
            health: Arc::clone(&self.health),
        });
        if zeroed {
            // SAFETY: `ptr` holds `bytes` bytes allocated above on this stream.
            unsafe { cu::memset_d8_async(ptr, 0, bytes, self.raw()) }
                .map_err(|e| self.health.driver("cuMemsetD8Async", e))?;
        }
        Ok(mem)
    }

    unsafe fn copy_from_host(&self, src: &[u8], dst: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees `dst`; pageable source memory is staged by the driver
        // before cuMemcpyHtoDAsync returns, so `src` may be reused afterwards.
        unsafe { cu::memcpy_htod_async(dst, src, self.raw()) }
            .map_err(|e| self.health.driver("cuMemcpyHtoDAsync", e))
    }

    unsafe fn copy_from_pinned(&self, src: HostPtr, dst: u64, len: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller keeps the pinned block alive and untouched until the copy ran.
        let bytes = unsafe { std::slice::from_raw_parts(src.0.cast_const(), len) };
        unsafe { cu::memcpy_htod_async(dst, bytes, self.raw()) }
            .map_err(|e| self.health.driver("cuMemcpyHtoDAsync", e))
    }

    unsafe fn copy_to_pinned(&self, src: u64, dst: HostPtr, len: usize, _idle: bool) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller keeps the block alive and unread until the copy ran.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.0, len) };
        unsafe { cu::memcpy_dtoh_async(out, src, self.raw()) }
            .map_err(|e| self.health.driver("cuMemcpyDtoHAsync", e))
    }

    unsafe fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: lengths are the caller's; we synchronise before `dst` is read.
        unsafe { cu::memcpy_dtoh_async(dst, src, self.raw()) }
            .map_err(|e| self.health.driver("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }

    unsafe fn copy_device(&self, src: u64, dst: u64, len: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges are device memory of this context (the caller's contract).
        unsafe { cu::memcpy_dtod_async(dst, src, len, self.raw()) }
            .map_err(|e| self.health.driver("cuMemcpyDtoDAsync", e))
    }

    unsafe fn copy_peer(
        &self,
        src: u64,
        from: &dyn StreamBackend,
        dst: u64,
        len: usize,
    ) -> Result<()> {
        let Some(from) = from.as_any().downcast_ref::<CudaStreamBackend>() else {
            return Err(KernelError::Internal {
                message: "a peer copy from a stream of another backend".into(),
            });
        };
        self.bind()?;
        if self.ctx.cu_ctx() == from.ctx.cu_ctx() {
            // Logical devices on one GPU share its context: an ordinary device copy.
            // SAFETY: both ranges are device memory of this context (the caller's contract).
            return unsafe { cu::memcpy_dtod_async(dst, src, len, self.raw()) }
                .map_err(|e| self.health.driver("cuMemcpyDtoDAsync", e));
        }
        // SAFETY: `src` is `len` bytes of `from`'s context, `dst` of this one (the caller's
        // contract); the driver stages the copy itself where peer access is not enabled.
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                self.ctx.cu_ctx(),
                src,
                from.ctx.cu_ctx(),
                len,
                self.raw(),
            )
        }
        .result()
        .map_err(|e| self.health.driver("cuMemcpyPeerAsync", e))
    }

    unsafe fn launch(&self, kernel: &Kernel, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
        let Some(k) = kernel.imp.as_any().downcast_ref::<CudaKernel>() else {
            return Err(KernelError::Internal {
                message: format!("kernel `{}` is not a CUDA kernel", kernel.name()),
            });
        };
        self.bind()?;
        let mut slots: Vec<u64> = args.iter().map(KernelArg::slot).collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| std::ptr::from_mut(s).cast())
            .collect();
        // SAFETY: the caller guarantees the arguments; `params` points at slots that live
        // until cuLaunchKernel has copied them (it does so before returning).
        unsafe {
            cu::launch_kernel(
                k.function.cu_function(),
                cfg.grid,
                cfg.block,
                cfg.shared_mem_bytes,
                self.raw(),
                &mut params,
            )
        }
        .map_err(|e| match self.health.driver("cuLaunchKernel", e) {
            KernelError::Driver { message, .. } => KernelError::Launch {
                entry: kernel.name().to_string(),
                grid: cfg.grid,
                block: cfg.block,
                message,
            },
            other => other,
        })
    }

    fn record_event(&self) -> Result<Arc<dyn EventBackend>> {
        self.bind()?;
        // Blocking sync: a host wait on the event sleeps instead of spinning a core. Timing
        // stays enabled (only CU_EVENT_DISABLE_TIMING turns it off).
        let event = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(|e| self.health.driver("cuEventRecord", e))?;
        Ok(Arc::new(CudaEventBackend {
            event,
            ctx: Arc::clone(&self.ctx),
            health: Arc::clone(&self.health),
        }))
    }

    fn wait_event(&self, event: &dyn EventBackend) -> Result<()> {
        let Some(e) = event.as_any().downcast_ref::<CudaEventBackend>() else {
            return Err(KernelError::Internal {
                message: "an event of another backend waited on by a CUDA stream".into(),
            });
        };
        self.bind()?;
        self.stream
            .wait(&e.event)
            .map_err(|err| self.health.driver("cuStreamWaitEvent", err))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream.
        unsafe { cu::stream::synchronize(self.raw()) }
            .map_err(|e| self.health.driver("cuStreamSynchronize", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Debug)]
struct CudaEventBackend {
    event: CudaEvent,
    ctx: Arc<CudaContext>,
    health: Arc<Health>,
}

/// `cuEventElapsedTime_v2` arrived with the 12.8 driver, and cudarc's CUDA 13 bindings call only
/// it (its loader panics where the symbol is missing); older drivers have `cuEventElapsedTime`.
fn elapsed(start: sys::CUevent, end: sys::CUevent) -> std::result::Result<f32, KernelError> {
    type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
    // SAFETY: the driver library is loaded (a device is open); looking symbols up runs nothing.
    let lib = unsafe { sys::culib() };
    let call = ["cuEventElapsedTime_v2\0", "cuEventElapsedTime\0"]
        .iter()
        // SAFETY: both symbols have this signature.
        .find_map(|name| {
            unsafe { lib.get::<ElapsedFn>(name.as_bytes()) }
                .ok()
                .map(|f| *f)
        })
        .ok_or_else(|| KernelError::Driver {
            call: "cuEventElapsedTime",
            message: "the driver exports neither cuEventElapsedTime_v2 nor cuEventElapsedTime"
                .into(),
        })?;
    let mut ms = 0f32;
    // SAFETY: two live events of one context; writes one float.
    unsafe { call(&mut ms, start, end) }
        .result()
        .map(|()| ms)
        .map_err(|e| crate::health::driver_error("cuEventElapsedTime", &e))
}

impl EventBackend for CudaEventBackend {
    fn synchronize(&self) -> Result<()> {
        bind(&self.ctx, &self.health)?;
        // SAFETY: a live event of this context.
        unsafe { cu::event::synchronize(self.event.cu_event()) }
            .map_err(|e| self.health.driver("cuEventSynchronize", e))
    }

    fn is_complete(&self) -> bool {
        self.event.is_complete()
    }

    fn elapsed_ms(&self, end: &dyn EventBackend) -> Result<f32> {
        let Some(end) = end.as_any().downcast_ref::<CudaEventBackend>() else {
            return Err(KernelError::Internal {
                message: "timing events of two different backends".into(),
            });
        };
        end.synchronize()?;
        elapsed(self.event.cu_event(), end.event.cu_event())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
