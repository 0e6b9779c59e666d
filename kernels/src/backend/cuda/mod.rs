//! The `cuda` backend: a GPU through cudarc's driver API, kernels compiled by NVRTC.
//!
//! Contract: nothing here panics when the driver, the GPU or NVRTC is missing or old.
//! Discovery goes through [`crate::probe`] first (which checks the library can be loaded), and
//! driver calls that could still hit cudarc's panicking loader run inside `catch_unwind` or
//! look the symbol up first.
//!
//! Files: this one opens the device and implements [`DeviceBackend`]; `stream.rs` holds
//! streams, allocations and events; `kernel.rs` loads modules and entry points.

mod kernel;
mod stream;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule, result as cu, sys};

use crate::backend::{DeviceBackend, DeviceLimits, StreamBackend};
use crate::compile;
use crate::device::{BackendKind, DeviceDescription};
use crate::error::{KernelError, Result};
use crate::health::{Health, driver_error};
use crate::launch::Kernel;

/// The oldest driver Spate runs on: CUDA 12.0. Calls that arrived later (parameter
/// introspection in 12.4, `cuEventElapsedTime_v2` in 12.8) are looked up before use.
pub(crate) const MIN_DRIVER_VERSION: i32 = 12000;

pub(crate) struct CudaDevice {
    description: DeviceDescription,
    limits: DeviceLimits,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) arch: String,
    pub(crate) driver_version: i32,
    pub(crate) health: Arc<Health>,
    /// Loaded fixed programs, by path.
    pub(crate) modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

/// Makes `ctx` current on this thread.
///
/// cudarc's `bind_to_thread` first returns any error that its `Drop` impls stored in the
/// context. Such an error belongs to an earlier call, not to this one: it is recorded in the
/// device's health (a sticky one marks the device unhealthy) and the context is bound anyway,
/// so that, for example, a free in `Drop` is still attempted.
pub(crate) fn bind(ctx: &CudaContext, health: &Health) -> Result<()> {
    if let Err(e) = ctx.check_err() {
        health.record_driver_error("an earlier asynchronous CUDA call", &e);
    }
    let current = cu::ctx::get_current().map_err(|e| health.driver("cuCtxGetCurrent", e))?;
    if current != Some(ctx.cu_ctx()) {
        // SAFETY: a live context handle owned by `ctx`.
        unsafe { cu::ctx::set_current(ctx.cu_ctx()) }
            .map_err(|e| health.driver("cuCtxSetCurrent", e))?;
    }
    Ok(())
}

fn attribute(ctx: &CudaContext, a: sys::CUdevice_attribute, fallback: i32) -> i32 {
    ctx.attribute(a).unwrap_or(fallback)
}

impl CudaDevice {
    pub(crate) fn open(ordinal: usize, health: Arc<Health>) -> Result<CudaDevice> {
        let devices = crate::probe::discover()?;
        let info = devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .ok_or_else(|| KernelError::NoDevice {
                reason: format!(
                    "CUDA device {ordinal} does not exist or could not be used ({} usable \
                     device(s) found)",
                    devices.len()
                ),
            })?
            .clone();
        let nvrtc_version = compile::nvrtc_version()?;
        let opened = catch_unwind(AssertUnwindSafe(|| {
            open_checked(ordinal, &info, nvrtc_version)
        }));
        let (ctx, description, driver_version, limits) = opened.unwrap_or_else(|_| {
            Err(KernelError::NoDevice {
                reason: "the CUDA driver library could not be used (missing symbols)".into(),
            })
        })?;
        Ok(CudaDevice {
            arch: info.arch(),
            description,
            limits,
            ctx,
            driver_version,
            health,
            modules: Mutex::new(HashMap::new()),
        })
    }
}

type Opened = (Arc<CudaContext>, DeviceDescription, i32, DeviceLimits);

fn open_checked(
    ordinal: usize,
    info: &crate::probe::DeviceInfo,
    nvrtc_version: (i32, i32),
) -> Result<Opened> {
    let no_device = |what: &str, e: cudarc::driver::DriverError| KernelError::NoDevice {
        reason: format!("CUDA device {ordinal}: {what} failed: {e}"),
    };
    let mut driver_version = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(|e| no_device("cuDriverGetVersion", e))?;
    if driver_version < MIN_DRIVER_VERSION {
        return Err(KernelError::NoDevice {
            reason: format!(
                "the CUDA driver supports CUDA {}.{}; Spate needs a CUDA 12 or 13 driver",
                driver_version / 1000,
                (driver_version % 1000) / 10
            ),
        });
    }
    // Code from a newer NVRTC major than the driver's does not load (PTX ISA too new, and
    // CUBINs outside minor-version compatibility); say so before anything is compiled.
    if nvrtc_version.0 > driver_version / 1000 {
        return Err(KernelError::NoDevice {
            reason: format!(
                "NVRTC {}.{} generates code for CUDA {} drivers, but this driver supports \
                 CUDA {}.{}; set {} to the folder of a CUDA {} libnvrtc",
                nvrtc_version.0,
                nvrtc_version.1,
                nvrtc_version.0,
                driver_version / 1000,
                (driver_version % 1000) / 10,
                compile::NVRTC_DIR_ENV,
                driver_version / 1000
            ),
        });
    }
    // A host wait (stream, event or context synchronisation) sleeps on the driver instead of
    // spinning a core that DataFusion's other partitions need. Set before the primary context
    // is retained; a driver that refuses (the context is already active elsewhere in the
    // process) keeps its flags, which only costs CPU time.
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device handle.
    if unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) }
        .result()
        .is_ok()
    {
        let flags = sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32;
        // SAFETY: a valid device handle and flags.
        if let Err(e) = unsafe { sys::cuDevicePrimaryCtxSetFlags_v2(dev, flags) }.result() {
            log::warn!("CUDA device {ordinal}: cannot set blocking synchronisation: {e}");
        }
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| no_device("creating a context", e))?;
    // Spate orders its own work with streams and events; cudarc's per-allocation event
    // tracking would only add driver calls (see docs/dev/kernels.md).
    // SAFETY: called before any allocation or stream exists on this context.
    unsafe { ctx.disable_event_tracking() };
    if !ctx.has_async_alloc() {
        return Err(KernelError::NoDevice {
            reason: format!(
                "CUDA device {ordinal} has no stream-ordered memory pool (cuMemAllocAsync)"
            ),
        });
    }
    // Keep freed memory in the stream-ordered pool instead of returning it to the driver at
    // every synchronisation: allocation then costs no driver round trip.
    // SAFETY: the default pool of a live device; the attribute takes a u64.
    unsafe {
        let pool = cu::device::get_default_mem_pool(ctx.cu_device())
            .map_err(|e| no_device("cuDeviceGetDefaultMemPool", e))?;
        let mut threshold = u64::MAX;
        cu::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .map_err(|e| no_device("cuMemPoolSetAttribute", e))?;
    }
    use sys::CUdevice_attribute::*;
    let multiprocessors = ctx
        .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| no_device("reading the SM count", e))?;
    let (free_memory_bytes, total_memory_bytes) = ctx
        .mem_get_info()
        .map_err(|e| no_device("cuMemGetInfo", e))?;
    let hopper = DeviceLimits::HOPPER;
    let limits = DeviceLimits {
        max_threads_per_block: attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024)
            as u32,
        max_grid: (
            attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, i32::MAX) as u32,
            attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65_535) as u32,
            attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65_535) as u32,
        ),
        max_block: (
            attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024) as u32,
            attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024) as u32,
            attribute(&ctx, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64) as u32,
        ),
        default_shared_bytes: hopper.default_shared_bytes,
        max_shared_opt_in_bytes: attribute(
            &ctx,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            hopper.default_shared_bytes as i32,
        ) as u32,
    };
    let description = DeviceDescription {
        backend: BackendKind::Cuda,
        name: info.name.clone(),
        arch: info.arch(),
        compute_capability: Some(info.compute_capability),
        multiprocessors: multiprocessors.max(1) as u32,
        total_memory_bytes,
        free_memory_bytes,
        driver_version: Some(driver_version),
        nvrtc_version: Some(nvrtc_version),
    };
    Ok((ctx, description, driver_version, limits))
}

impl DeviceBackend for CudaDevice {
    fn description(&self) -> &DeviceDescription {
        &self.description
    }

    fn limits(&self) -> DeviceLimits {
        self.limits
    }

    fn new_stream(&self) -> Result<Arc<dyn StreamBackend>> {
        bind(&self.ctx, &self.health)?;
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| self.health.driver("cuStreamCreate", e))?;
        Ok(Arc::new(stream::CudaStreamBackend::new(
            stream,
            Arc::clone(&self.ctx),
            Arc::clone(&self.health),
        )))
    }

    fn load_fixed(&self, entry: &str) -> Result<Kernel> {
        kernel::load_fixed(self, entry)
    }

    fn load_generated(&self, name: &str, source: &str, entries: &[&str]) -> Result<Vec<Kernel>> {
        kernel::load_generated(self, name, source, entries)
    }

    fn synchronize(&self) -> Result<()> {
        bind(&self.ctx, &self.health)?;
        cu::ctx::synchronize().map_err(|e| self.health.driver("cuCtxSynchronize", e))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        bind(&self.ctx, &self.health)?;
        // SAFETY: a plain page-locked allocation, freed by `free_pinned`. PORTABLE: usable
        // from every context, for multi-GPU staging.
        let ptr = unsafe { cu::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }.map_err(
            |e| match e.0 {
                sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => KernelError::OutOfMemory {
                    requested_bytes: bytes,
                    free_bytes: 0,
                },
                _ => driver_error("cuMemHostAlloc", &e),
            },
        )?;
        Ok(ptr.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) {
        // The free is attempted even when binding reports an earlier error.
        let _ = bind(&self.ctx, &self.health);
        // SAFETY: allocated by cuMemHostAlloc in `alloc_pinned`, freed once.
        if let Err(e) = unsafe { cu::free_host(ptr.cast()) } {
            self.health.record_driver_error("cuMemFreeHost", &e);
        }
    }

    fn peer_access(&self, other: &dyn DeviceBackend) -> bool {
        let Some(other) = other.as_any().downcast_ref::<CudaDevice>() else {
            return false;
        };
        if self.ctx.cu_ctx() == other.ctx.cu_ctx() {
            // Logical devices on one GPU share its primary context: the same memory.
            return true;
        }
        let mut can = 0i32;
        // SAFETY: both are devices of open contexts; `can` is a valid out-pointer.
        let asked = unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), other.ctx.cu_device())
        };
        if asked != sys::CUresult::CUDA_SUCCESS
            || can != 1
            || bind(&self.ctx, &self.health).is_err()
        {
            return false;
        }
        // SAFETY: this context is current; enabling twice reports an error we ignore.
        let enabled = unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) };
        matches!(
            enabled,
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
