//! The `emulated` backend: kernels compiled as host C++ and run by the fiber emulator.
//!
//! The fixed kernels are compiled by the build script and linked in; generated kernels are
//! compiled at run time to a shared object (cached on disk) and loaded with `dlopen`.

use std::sync::Arc;

use crate::compile;
use crate::device::{BackendKind, DeviceDescription};
use crate::error::{KernelError, Result};
use crate::launch::{Kernel, KernelImpl, LaunchConfig};
use crate::source::{self, EmuLaunchFn, EmuParamsFn};

/// Host threads the emulator runs blocks on (`SPATE_EMU_THREADS` overrides).
pub(crate) fn worker_threads() -> u32 {
    std::env::var("SPATE_EMU_THREADS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|v| *v > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        })
}

/// Host memory from /proc/meminfo: (total, available).
fn host_memory() -> (usize, usize) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<usize>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").unwrap_or(8 << 30);
    let available = field("MemAvailable:").unwrap_or(total / 2);
    (total, available)
}

pub(crate) fn describe() -> DeviceDescription {
    let threads = worker_threads();
    let (total, available) = host_memory();
    DeviceDescription {
        backend: BackendKind::Emulated,
        name: format!("emulator ({threads} host threads)"),
        arch: "host".into(),
        compute_capability: None,
        multiprocessors: threads,
        total_memory_bytes: total,
        free_memory_bytes: available,
        driver_version: None,
        nvrtc_version: None,
    }
}

fn sizes_of(params: EmuParamsFn) -> Arc<[usize]> {
    let mut sizes = [0u32; 512];
    // SAFETY: the function writes at most `max` entries.
    let n = unsafe { params(sizes.as_mut_ptr(), sizes.len() as u32) } as usize;
    sizes[..n.min(sizes.len())]
        .iter()
        .map(|s| *s as usize)
        .collect()
}

pub(crate) fn load_fixed(entry: &str) -> Result<Kernel> {
    let e = source::emu_entry(entry).ok_or_else(|| KernelError::Internal {
        message: format!("no emulated kernel named `{entry}` is linked into this binary"),
    })?;
    Ok(Kernel {
        name: Arc::from(entry),
        imp: KernelImpl::Emulated {
            launch: e.launch,
            param_sizes: sizes_of(e.params),
            _library: None,
        },
    })
}

pub(crate) fn load_generated(
    name: &str,
    source_text: &str,
    entries: &[&str],
) -> Result<Vec<Kernel>> {
    let resolved = source::resolve(name, source_text, true)?;
    let so = compile::host_compile(name, &resolved)?;
    // SAFETY: the object was just compiled from our own source; its initialisers only set up
    // the emulator's thread-local state.
    let library = unsafe { libloading::Library::new(&so) }.map_err(|e| KernelError::Compile {
        entry: name.to_string(),
        arch: "host".into(),
        log: format!("cannot load {}: {e}", so.display()),
    })?;
    let library = Arc::new(library);
    entries
        .iter()
        .map(|entry| {
            let missing = |e: libloading::Error| KernelError::Compile {
                entry: entry.to_string(),
                arch: "host".into(),
                log: format!("{name} does not export `{entry}` (missing SPATE_EXPORT?): {e}"),
            };
            // SAFETY: the symbols are the C functions SPATE_EXPORT defines, with these types.
            let launch: EmuLaunchFn = unsafe {
                *library
                    .get::<EmuLaunchFn>(format!("spate_emu_launch_{entry}").as_bytes())
                    .map_err(missing)?
            };
            let params: EmuParamsFn = unsafe {
                *library
                    .get::<EmuParamsFn>(format!("spate_emu_params_{entry}").as_bytes())
                    .map_err(missing)?
            };
            Ok(Kernel {
                name: Arc::from(*entry),
                imp: KernelImpl::Emulated {
                    launch,
                    param_sizes: sizes_of(params),
                    _library: Some(Arc::clone(&library)),
                },
            })
        })
        .collect()
}

/// Runs one grid on the emulator; returns the emulator's message on a kernel error.
///
/// # Safety
/// `params` must match the kernel's signature (checked by size before this is called) and
/// point at memory the kernel may access.
pub(crate) unsafe fn run(
    launch: EmuLaunchFn,
    cfg: LaunchConfig,
    params: &mut [*mut std::ffi::c_void],
) -> std::result::Result<(), String> {
    let dims = [
        cfg.grid.0,
        cfg.grid.1,
        cfg.grid.2,
        cfg.block.0,
        cfg.block.1,
        cfg.block.2,
        cfg.shared_mem_bytes,
    ];
    let mut err = [0 as std::ffi::c_char; 1024];
    // SAFETY: the caller guarantees the parameters; `dims` and `err` outlive the call.
    let rc = unsafe {
        launch(
            dims.as_ptr(),
            params.as_mut_ptr(),
            err.as_mut_ptr(),
            err.len() as _,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let bytes: Vec<u8> = err
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    Err(String::from_utf8_lossy(&bytes).into_owned())
}
