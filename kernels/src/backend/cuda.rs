//! The `cuda` backend: opening a device, and compiling (NVRTC → CUBIN, PTX fallback) and
//! loading kernels.
//!
//! Contract: nothing here panics when the driver, the GPU or NVRTC is missing. Discovery goes
//! through [`crate::probe`] first (which checks the library can be loaded), and driver calls
//! that could still hit cudarc's panicking loader run inside `catch_unwind`.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule, result as cu, sys};
use cudarc::nvrtc::Ptx;

use crate::compile;
use crate::device::{BackendKind, CudaState, DeviceDescription, Health};
use crate::error::{KernelError, Result};
use crate::launch::{Kernel, KernelImpl};
use crate::source;

pub(crate) struct Opened {
    pub(crate) description: DeviceDescription,
    pub(crate) state: CudaState,
}

pub(crate) fn open(ordinal: usize) -> Result<Opened> {
    let devices = crate::probe::discover()?;
    let info = devices
        .iter()
        .find(|d| d.ordinal == ordinal)
        .ok_or_else(|| KernelError::NoDevice {
            reason: format!(
                "CUDA device {ordinal} does not exist ({} device(s) found)",
                devices.len()
            ),
        })?
        .clone();
    let nvrtc_version = compile::nvrtc_version()?;
    let opened = catch_unwind(AssertUnwindSafe(|| -> Result<Opened> {
        let no_device = |what: &str, e: cudarc::driver::DriverError| KernelError::NoDevice {
            reason: format!("CUDA device {ordinal}: {what} failed: {e}"),
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| no_device("creating a context", e))?;
        // Spate orders its own work with streams and events; cudarc's per-allocation event
        // tracking would only add driver calls (see docs/dev/kernels.md).
        // SAFETY: called before any allocation or stream exists on this context.
        unsafe { ctx.disable_event_tracking() };
        let mut driver_version = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| no_device("cuDriverGetVersion", e))?;
        if driver_version < 12000 {
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
        if ctx.has_async_alloc() {
            // Keep freed memory in the stream-ordered pool instead of returning it to the
            // driver at every synchronisation: allocation then costs no driver round trip.
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
        } else {
            return Err(KernelError::NoDevice {
                reason: format!(
                    "CUDA device {ordinal} has no stream-ordered memory pool (cuMemAllocAsync)"
                ),
            });
        }
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| no_device("reading the SM count", e))?;
        let arch = info.arch();
        Ok(Opened {
            description: DeviceDescription {
                backend: BackendKind::Cuda,
                name: info.name.clone(),
                arch: arch.clone(),
                compute_capability: Some(info.compute_capability),
                multiprocessors: multiprocessors.max(1) as u32,
                total_memory_bytes: info.total_memory_bytes,
                free_memory_bytes: info.free_memory_bytes,
                driver_version: Some(driver_version),
                nvrtc_version: Some(nvrtc_version),
            },
            state: CudaState {
                ctx,
                arch,
                driver_version,
                modules: Mutex::new(HashMap::new()),
            },
        })
    }));
    opened.unwrap_or_else(|_| {
        Err(KernelError::NoDevice {
            reason: "the CUDA driver library could not be used (missing symbols)".into(),
        })
    })
}

/// Compiles (or takes from the cache) and loads a program: the CUBIN first, the PTX if the
/// CUBIN does not load on this GPU.
fn load_module(
    state: &CudaState,
    health: &Health,
    name: &str,
    resolved: &str,
) -> Result<Arc<CudaModule>> {
    let out = compile::nvrtc_cached(name, resolved, &state.arch)?;
    match state.ctx.load_module(Ptx::from_binary(out.cubin)) {
        Ok(m) => Ok(m),
        Err(cubin_err) => {
            log::warn!(
                "{name}: CUBIN for {} did not load ({cubin_err}); trying PTX",
                state.arch
            );
            state
                .ctx
                .load_module(Ptx::from_src(out.ptx))
                .map_err(|e| health.driver("cuModuleLoadData", e))
        }
    }
}

fn param_sizes(state: &CudaState, function: &cudarc::driver::CudaFunction) -> Option<Arc<[usize]>> {
    // cuFuncGetParamInfo arrived with CUDA 12.4; older drivers lack the symbol.
    if state.driver_version < 12040 {
        return None;
    }
    catch_unwind(|| {
        let mut sizes = Vec::new();
        for index in 0..512 {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a live function handle; the driver writes two usizes.
            let r = unsafe {
                sys::cuFuncGetParamInfo(function.cu_function(), index, &mut offset, &mut size)
            };
            if r != sys::CUresult::CUDA_SUCCESS {
                break;
            }
            sizes.push(size);
        }
        Arc::from(sizes)
    })
    .ok()
}

fn kernel_from(
    state: &CudaState,
    health: &Health,
    module: &Arc<CudaModule>,
    entry: &str,
) -> Result<Kernel> {
    let function = module
        .load_function(entry)
        .map_err(|e| health.driver("cuModuleGetFunction", e))?;
    let param_sizes = param_sizes(state, &function);
    Ok(Kernel {
        name: Arc::from(entry),
        imp: KernelImpl::Cuda {
            function,
            _module: Arc::clone(module),
            param_sizes,
        },
    })
}

pub(crate) fn load_fixed(state: &CudaState, health: &Health, entry: &str) -> Result<Kernel> {
    let program = source::program_of(entry)?;
    let cached = state
        .modules
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(program.path)
        .cloned();
    let module = match cached {
        Some(m) => m,
        None => {
            state
                .ctx
                .bind_to_thread()
                .map_err(|e| health.driver("cuCtxSetCurrent", e))?;
            let resolved = source::resolve(program.path, program.text, false)?;
            let m = load_module(state, health, program.path, &resolved)?;
            state
                .modules
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(program.path, Arc::clone(&m));
            m
        }
    };
    kernel_from(state, health, &module, entry)
}

pub(crate) fn load_generated(
    state: &CudaState,
    health: &Health,
    name: &str,
    source_text: &str,
    entries: &[&str],
) -> Result<Vec<Kernel>> {
    state
        .ctx
        .bind_to_thread()
        .map_err(|e| health.driver("cuCtxSetCurrent", e))?;
    let resolved = source::resolve(name, source_text, false)?;
    let module = load_module(state, health, name, &resolved)?;
    entries
        .iter()
        .map(|e| kernel_from(state, health, &module, e))
        .collect()
}
