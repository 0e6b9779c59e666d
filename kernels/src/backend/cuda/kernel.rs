//! Loading CUDA kernels: NVRTC output (CUBIN first, PTX if the CUBIN does not load) into
//! modules, entry points out of them, and what the driver says about each entry.

use std::any::Any;
use std::panic::catch_unwind;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, sys};
use cudarc::nvrtc::Ptx;

use super::{CudaDevice, bind};
use crate::backend::KernelBackend;
use crate::compile;
use crate::device::BackendKind;
use crate::error::{KernelError, Result};
use crate::launch::Kernel;
use crate::source;

pub(crate) struct CudaKernel {
    pub(crate) function: CudaFunction,
    _module: Arc<CudaModule>,
    /// Parameter sizes, when the driver can report them.
    param_sizes: Option<Arc<[usize]>>,
    max_threads: u32,
}

impl KernelBackend for CudaKernel {
    fn param_sizes(&self) -> Option<&[usize]> {
        self.param_sizes.as_deref()
    }

    fn max_threads_per_block(&self) -> u32 {
        self.max_threads
    }

    fn resource_usage(&self) -> Option<(i32, i32)> {
        Some((
            self.function.num_regs().ok()?,
            self.function.local_size_bytes().ok()?,
        ))
    }

    fn set_max_dynamic_shared_bytes(&self, bytes: u32) -> Result<()> {
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: a live function handle; the attribute takes an int.
        unsafe { sys::cuFuncSetAttribute(self.function.cu_function(), attr, bytes as i32) }
            .result()
            .map_err(|e| KernelError::InvalidArgument {
                message: format!("opting in to {bytes} bytes of dynamic shared memory: {e}"),
            })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Compiles (or takes from the cache) and loads a program: the CUBIN first, the PTX if the
/// CUBIN does not load on this GPU.
fn load_module(device: &CudaDevice, name: &str, resolved: &str) -> Result<Arc<CudaModule>> {
    let out = compile::nvrtc_cached(name, resolved, &device.arch)?;
    match device.ctx.load_module(Ptx::from_binary(out.cubin)) {
        Ok(m) => Ok(m),
        Err(cubin_err) => {
            log::warn!(
                "{name}: CUBIN for {} did not load ({cubin_err}); trying PTX",
                device.arch
            );
            device
                .ctx
                .load_module(Ptx::from_src(out.ptx))
                .map_err(|e| device.health.driver("cuModuleLoadData", e))
        }
    }
}

/// The entry's parameter sizes from `cuFuncGetParamInfo` (driver 12.4+).
///
/// The driver answers `CUDA_ERROR_INVALID_VALUE` for the first index past the last parameter;
/// that, and only that, ends the list. Any other error means the driver cannot tell, and the
/// check is skipped (`None`) rather than run against a truncated list.
fn param_sizes(device: &CudaDevice, function: &CudaFunction) -> Option<Arc<[usize]>> {
    if device.driver_version < 12040 {
        return None;
    }
    catch_unwind(|| {
        let mut sizes = Vec::new();
        for index in 0..4096 {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a live function handle; the driver writes two usizes.
            let r = unsafe {
                sys::cuFuncGetParamInfo(function.cu_function(), index, &mut offset, &mut size)
            };
            match r {
                sys::CUresult::CUDA_SUCCESS => sizes.push(size),
                sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Some(Arc::from(sizes)),
                other => {
                    log::warn!("cuFuncGetParamInfo({index}) failed with {other:?}; not checking");
                    return None;
                }
            }
        }
        None
    })
    .ok()
    .flatten()
}

fn kernel_from(device: &CudaDevice, module: &Arc<CudaModule>, entry: &str) -> Result<Kernel> {
    // The module may come from the cache, loaded on another thread: this thread needs the
    // context before cuModuleGetFunction.
    bind(&device.ctx, &device.health)?;
    let function = module
        .load_function(entry)
        .map_err(|e| device.health.driver("cuModuleGetFunction", e))?;
    let param_sizes = param_sizes(device, &function);
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
    let mut max_threads = 0i32;
    // SAFETY: a live function handle; writes one int.
    let max_threads =
        match unsafe { sys::cuFuncGetAttribute(&mut max_threads, attr, function.cu_function()) }
            .result()
        {
            Ok(()) if max_threads > 0 => max_threads as u32,
            _ => 1024,
        };
    Ok(Kernel::new(
        entry,
        BackendKind::Cuda,
        Arc::new(CudaKernel {
            function,
            _module: Arc::clone(module),
            param_sizes,
            max_threads,
        }),
    ))
}

pub(super) fn load_fixed(device: &CudaDevice, entry: &str) -> Result<Kernel> {
    let program = source::program_of(entry)?;
    let cached = device
        .modules
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(program.path)
        .cloned();
    let module = match cached {
        Some(m) => m,
        None => {
            bind(&device.ctx, &device.health)?;
            let resolved = source::resolve(program.path, program.text, false)?;
            let m = load_module(device, program.path, &resolved)?;
            device
                .modules
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(program.path, Arc::clone(&m));
            m
        }
    };
    kernel_from(device, &module, entry)
}

pub(super) fn load_generated(
    device: &CudaDevice,
    name: &str,
    source_text: &str,
    entries: &[&str],
) -> Result<Vec<Kernel>> {
    bind(&device.ctx, &device.health)?;
    let resolved = source::resolve(name, source_text, false)?;
    let module = load_module(device, name, &resolved)?;
    entries
        .iter()
        .map(|e| kernel_from(device, &module, e))
        .collect()
}
