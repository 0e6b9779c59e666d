//! The `emulated` backend: the kernels compiled as host C++, run as strictly as a GPU runs
//! them.
//!
//! - **Asynchronous streams** (`stream.rs`): each stream is a queue run by its own host thread.
//!   Launches and copies return before they run; events and stream waits order them. A host
//!   read that skips its synchronisation, or a stream that reads another's output without an
//!   event, sees poison or stale bytes.
//! - **Checked memory** (`memory.rs`): guard pages and canaries around every allocation,
//!   poison on allocation, frees in stream order into a quarantine; a fault names the kernel,
//!   the buffer and the index (`grid.rs`).
//! - **Perturbed schedules**, in strict mode: random block order and random thread resumption
//!   at barriers (the C++ side, `kernels/emu/spate_emu.h`), several blocks at once on host
//!   threads, random delays before stream operations, and freed memory handed to the next
//!   allocation of its size at once, from any stream, as the CUDA pool does.
//! - **A watchdog** turns a hang inside a kernel into an error naming the kernel.
//!
//! Strict mode is on when [`EmulatorOptions::strict`] holds a seed, by default from
//! `SPATE_EMU_STRICT=SEED`; the same seed gives the same schedule decisions (timing between
//! host threads still varies). Fixed kernels are compiled by the build script and linked in;
//! generated kernels are compiled at run time to a shared object (cached on disk) and loaded
//! with `dlopen`.

mod grid;
mod memory;
mod stream;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub(crate) use grid::LaunchArgs;

use crate::backend::{DeviceBackend, DeviceLimits, KernelBackend, StreamBackend};
use crate::compile;
use crate::device::{BackendKind, DeviceDescription};
use crate::error::{KernelError, Result};
use crate::health::Health;
use crate::launch::Kernel;
use crate::source::{self, EmuLaunchFn, EmuParamsFn};

/// `SPATE_EMU_STRICT=SEED`: strict mode with this seed (a non-zero integer).
pub const STRICT_ENV: &str = "SPATE_EMU_STRICT";
/// `SPATE_EMU_WATCHDOG_MS`: how long one launch may run before the watchdog stops it.
pub const WATCHDOG_ENV: &str = "SPATE_EMU_WATCHDOG_MS";
/// `SPATE_EMU_THREADS`: host threads that run the blocks of one launch.
pub const THREADS_ENV: &str = "SPATE_EMU_THREADS";
/// `SPATE_EMU_NO_PEER=1`: emulated devices have no peer access (see
/// [`EmulatorOptions::peer_access`]).
pub const NO_PEER_ENV: &str = "SPATE_EMU_NO_PEER";

/// How strict the emulator is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatorOptions {
    /// `Some(seed)` turns on strict mode: random block order and thread resumption, random
    /// delays before stream operations, immediate reuse of freed memory across streams, and
    /// at least four host threads per launch. `None` runs blocks in order, without delays.
    pub strict: Option<u64>,
    /// How long one launch may run before the watchdog stops it with an error.
    pub watchdog: Duration,
    /// Host threads that run the blocks of one launch (default: the machine's cores).
    pub threads: Option<u32>,
    /// Whether emulated devices copy each other's memory directly (peer copies), as GPUs on
    /// NVLink do: on by default; `SPATE_EMU_NO_PEER=1` turns it off, and exchanges between
    /// devices then go through pinned host memory.
    pub peer_access: bool,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

impl Default for EmulatorOptions {
    /// From the environment: [`STRICT_ENV`], [`WATCHDOG_ENV`] (default two minutes),
    /// [`THREADS_ENV`] and [`NO_PEER_ENV`].
    fn default() -> Self {
        EmulatorOptions {
            strict: env_u64(STRICT_ENV).filter(|s| *s != 0),
            watchdog: Duration::from_millis(env_u64(WATCHDOG_ENV).unwrap_or(120_000).max(1)),
            threads: env_u64(THREADS_ENV)
                .filter(|t| *t > 0)
                .map(|t| t.min(256) as u32),
            peer_access: env_u64(NO_PEER_ENV).is_none_or(|v| v == 0),
        }
    }
}

/// A seeded stream of random numbers (splitmix64), safe to share between threads.
#[derive(Debug)]
pub(crate) struct Rng {
    seed: u64,
    counter: AtomicU64,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng {
            seed,
            counter: AtomicU64::new(0),
        }
    }

    pub(crate) fn next(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        mix(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the device's streams share.
pub(crate) struct Shared {
    pub(crate) options: EmulatorOptions,
    pub(crate) health: Arc<Health>,
    /// Host threads per launch.
    pub(crate) workers: u32,
    streams: Mutex<Vec<Weak<stream::Queue>>>,
    next_stream: AtomicU64,
    /// The device's number among every emulated device the process opened: what its buffers
    /// are tagged with, so that one device's kernels and copies cannot use another's memory.
    pub(crate) device: u32,
}

/// Emulated devices opened so far in the process.
static NEXT_DEVICE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub(crate) struct EmuDevice {
    description: DeviceDescription,
    shared: Arc<Shared>,
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

impl EmuDevice {
    pub(crate) fn open(options: EmulatorOptions, health: Arc<Health>) -> EmuDevice {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let mut workers = options.threads.unwrap_or(cores);
        if options.strict.is_some() {
            // More blocks in flight than cores: more interleavings to find races in.
            workers = workers.max(4);
        }
        let (total, available) = host_memory();
        let mode = match options.strict {
            Some(seed) => format!(", strict, seed {seed}"),
            None => String::new(),
        };
        let description = DeviceDescription {
            backend: BackendKind::Emulated,
            name: format!("emulator ({workers} host threads{mode})"),
            arch: "host".into(),
            compute_capability: None,
            multiprocessors: workers,
            total_memory_bytes: total,
            free_memory_bytes: available,
            driver_version: None,
            nvrtc_version: None,
        };
        EmuDevice {
            description,
            shared: Arc::new(Shared {
                options,
                health,
                workers,
                streams: Mutex::new(Vec::new()),
                next_stream: AtomicU64::new(1),
                device: NEXT_DEVICE.fetch_add(1, Ordering::Relaxed),
            }),
        }
    }
}

impl DeviceBackend for EmuDevice {
    fn description(&self) -> &DeviceDescription {
        &self.description
    }

    fn limits(&self) -> DeviceLimits {
        DeviceLimits::HOPPER
    }

    fn new_stream(&self) -> Result<Arc<dyn StreamBackend>> {
        let id = self.shared.next_stream.fetch_add(1, Ordering::Relaxed);
        let (backend, queue) = stream::EmuStream::start(id, Arc::clone(&self.shared))?;
        let mut streams = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        streams.retain(|w| w.strong_count() > 0);
        streams.push(queue);
        Ok(Arc::new(backend))
    }

    fn load_fixed(&self, entry: &str) -> Result<Kernel> {
        let e = source::emu_entry(entry).ok_or_else(|| KernelError::Internal {
            message: format!("no emulated kernel named `{entry}` is linked into this binary"),
        })?;
        Ok(emu_kernel(entry, e.launch, e.params, e.max_threads, None))
    }

    fn load_generated(
        &self,
        name: &str,
        source_text: &str,
        entries: &[&str],
    ) -> Result<Vec<Kernel>> {
        let resolved = source::resolve(name, source_text, true)?;
        let bounds = crate::launch_bounds::launch_bounds_in(&resolved);
        let so = compile::host_compile(name, &resolved)?;
        // SAFETY: the object was just compiled from our own source; its initialisers only set
        // up the emulator's thread-local state.
        let library =
            unsafe { libloading::Library::new(&so) }.map_err(|e| KernelError::Compile {
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
                let max_threads = bounds
                    .iter()
                    .find(|(n, _)| n == entry)
                    .map_or(1024, |(_, b)| *b);
                Ok(emu_kernel(
                    entry,
                    launch,
                    params,
                    max_threads,
                    Some(Arc::clone(&library)),
                ))
            })
            .collect()
    }

    fn synchronize(&self) -> Result<()> {
        let queues: Vec<Arc<stream::Queue>> = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for q in queues {
            q.wait_idle();
        }
        Ok(())
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 4096).map_err(|_| {
            KernelError::InvalidArgument {
                message: format!("pinned buffer of {bytes} bytes is too large"),
            }
        })?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(KernelError::OutOfMemory {
                requested_bytes: bytes,
                free_bytes: 0,
            });
        }
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1), 4096) {
            // SAFETY: allocated with this layout in `alloc_pinned`.
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
    }

    fn peer_access(&self, other: &dyn DeviceBackend) -> bool {
        other
            .as_any()
            .downcast_ref::<EmuDevice>()
            .is_some_and(|o| self.shared.options.peer_access && o.shared.options.peer_access)
    }

    fn as_any(&self) -> &dyn Any {
        self
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

fn emu_kernel(
    entry: &str,
    launch: EmuLaunchFn,
    params: EmuParamsFn,
    max_threads: u32,
    library: Option<Arc<libloading::Library>>,
) -> Kernel {
    Kernel::new(
        entry,
        BackendKind::Emulated,
        Arc::new(EmuKernel {
            launch,
            param_sizes: sizes_of(params),
            max_threads,
            _library: library,
        }),
    )
}

pub(crate) struct EmuKernel {
    pub(crate) launch: EmuLaunchFn,
    param_sizes: Arc<[usize]>,
    max_threads: u32,
    /// Keeps a run-time compiled shared object loaded while the kernel lives.
    _library: Option<Arc<libloading::Library>>,
}

impl KernelBackend for EmuKernel {
    fn param_sizes(&self) -> Option<&[usize]> {
        Some(&self.param_sizes)
    }

    fn max_threads_per_block(&self) -> u32 {
        self.max_threads
    }

    fn resource_usage(&self) -> Option<(i32, i32)> {
        None
    }

    fn set_max_dynamic_shared_bytes(&self, bytes: u32) -> Result<()> {
        let max = DeviceLimits::HOPPER.max_shared_opt_in_bytes;
        if bytes > max {
            return Err(KernelError::InvalidArgument {
                message: format!(
                    "opting in to {bytes} bytes of dynamic shared memory: the most is {max}"
                ),
            });
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
