//! Backend selection (which backend a session runs on, and why) and the session's GPU state.
//!
//! Contract: selection never panics. `auto` always resolves to something that works and says
//! why it chose it; an explicit `cuda` or `emulated` that cannot run fails with
//! [`SpateError::BackendUnavailable`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use spate_kernels::probe::DeviceInfo;
use spate_kernels::{BackendKind, Device, DeviceOptions, Kernel, KernelArg, LaunchConfig};

use crate::config::{Backend, Devices};
use crate::error::{Result, SpateError};
use crate::exec::coordinator::{SpillCoordinator, Spillable};

/// What the machine offers: the CUDA devices, or why there are none.
#[derive(Debug, Clone)]
pub struct GpuInventory {
    /// The devices found, in ordinal order. Empty when `absent_reason` is set.
    pub devices: Vec<DeviceInfo>,
    /// Why no device is usable, when none is.
    pub absent_reason: Option<String>,
}

impl GpuInventory {
    /// Probes the machine. Never panics; a missing driver is reported as a reason.
    pub fn discover() -> Self {
        match spate_kernels::probe::discover() {
            Ok(devices) => GpuInventory {
                devices,
                absent_reason: None,
            },
            Err(e) => GpuInventory {
                devices: Vec::new(),
                absent_reason: Some(e.to_string()),
            },
        }
    }

    /// A multi-line, human-readable listing, as the shell's `\gpu` prints it.
    pub fn describe(&self) -> String {
        match &self.absent_reason {
            Some(reason) => format!("no GPU: {reason}"),
            None => self
                .devices
                .iter()
                .map(|d| {
                    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
                    let free = d
                        .free_memory_bytes
                        .map(|f| format!(", {:.1} GiB free", gib(f)))
                        .unwrap_or_default();
                    format!(
                        "GPU {}: {} ({}), {:.1} GiB total{free}",
                        d.ordinal,
                        d.name,
                        d.arch(),
                        gib(d.total_memory_bytes),
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// Runs a host wait for the device (a readback, a stream synchronisation) so that it does not
/// hold up the other tasks of the tokio worker it runs on: on a multi-threaded runtime they
/// move to another worker first (`block_in_place`). Elsewhere the wait just runs.
fn wait_off_the_runtime(wait: &mut dyn FnMut()) {
    use std::cell::Cell;
    use tokio::runtime::{Handle, RuntimeFlavor};
    thread_local! {
        /// This thread's runtime context refused `block_in_place` once: it always will.
        static REFUSED: Cell<bool> = const { Cell::new(false) };
    }
    let multi_thread =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    if !multi_thread || REFUSED.with(Cell::get) {
        return wait();
    }
    // Some contexts of a multi-threaded runtime still refuse (a `LocalSet`, a current-thread
    // `block_on` that entered a multi-threaded handle): tokio says so by panicking before it
    // runs the closure, and tells no other way. The wait then runs here.
    let mut ran = false;
    let moved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio::task::block_in_place(|| {
            ran = true;
            wait();
        })
    }));
    match moved {
        Ok(()) => {}
        Err(_) if !ran => {
            REFUSED.with(|r| r.set(true));
            wait();
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The backend a session resolved to, with the reason for the choice.
#[derive(Debug, Clone)]
pub struct BackendSelection {
    /// What the user asked for.
    pub requested: Backend,
    /// What operators run on: never `Auto`.
    pub resolved: Backend,
    /// Why, in one line, e.g. "no CUDA driver found: running on CPU".
    pub reason: String,
    /// What discovery found, when it ran.
    pub inventory: Option<GpuInventory>,
}

impl BackendSelection {
    /// Resolves `requested` against what this machine and build can do.
    pub fn resolve(requested: Backend) -> Result<Self> {
        Self::resolve_with(requested, GpuInventory::discover)
    }

    /// As [`BackendSelection::resolve`], with discovery supplied by the caller (for tests).
    pub fn resolve_with(
        requested: Backend,
        discover: impl FnOnce() -> GpuInventory,
    ) -> Result<Self> {
        match requested {
            Backend::Cpu => Ok(BackendSelection {
                requested,
                resolved: Backend::Cpu,
                reason: "CPU backend requested: running on CPU".to_string(),
                inventory: None,
            }),
            Backend::Cuda => {
                let inventory = discover();
                match &inventory.absent_reason {
                    Some(why) => Err(SpateError::BackendUnavailable {
                        backend: requested.to_string(),
                        reason: format!("{why}; use --backend cpu or --backend auto"),
                    }),
                    None => Ok(BackendSelection {
                        requested,
                        resolved: Backend::Cuda,
                        reason: format!(
                            "running on {}; {GPU_SCOPE}",
                            device_summary(&inventory.devices)
                        ),
                        inventory: Some(inventory),
                    }),
                }
            }
            Backend::Emulated => Ok(BackendSelection {
                requested,
                resolved: Backend::Emulated,
                reason: format!(
                    "GPU kernels on the host emulator, for testing, not speed; {GPU_SCOPE}"
                ),
                inventory: None,
            }),
            Backend::Auto => {
                let inventory = discover();
                Ok(match &inventory.absent_reason {
                    Some(why) => BackendSelection {
                        requested,
                        resolved: Backend::Cpu,
                        reason: format!("{why}: running on CPU"),
                        inventory: Some(inventory),
                    },
                    None => BackendSelection {
                        requested,
                        resolved: Backend::Cuda,
                        reason: format!(
                            "found {}; {GPU_SCOPE}",
                            device_summary(&inventory.devices)
                        ),
                        inventory: Some(inventory),
                    },
                })
            }
        }
    }

    /// A remote session's: the executors of the scheduler at `url` run the operators, so this
    /// session opens no device.
    pub fn remote(requested: Backend, url: &str) -> Self {
        BackendSelection {
            requested,
            resolved: Backend::Cpu,
            reason: format!(
                "remote: queries run on the executors of the scheduler at {url}, on their \
                 backends"
            ),
            inventory: None,
        }
    }

    /// After the chosen GPU failed to start: `auto` falls back to the CPU with the reason, an
    /// explicit GPU backend fails.
    pub fn after_gpu_failure(mut self, error: SpateError) -> Result<Self> {
        if self.requested != Backend::Auto {
            return Err(error);
        }
        self.reason = format!("the GPU could not run kernels ({error}): running on CPU");
        self.resolved = Backend::Cpu;
        Ok(self)
    }

    /// True when operators may run on a GPU backend (real or emulated).
    pub fn uses_gpu(&self) -> bool {
        matches!(self.resolved, Backend::Cuda | Backend::Emulated)
    }
}

impl fmt::Display for BackendSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend: {} ({})", self.resolved, self.reason)
    }
}

/// What runs where with a GPU backend, for the selection's reason line.
const GPU_SCOPE: &str = "filters, projections, joins, aggregations, sorts, limits, unions, \
                         window functions and vector top-k run on the GPU, other operators on \
                         the CPU";

fn device_summary(devices: &[DeviceInfo]) -> String {
    match devices {
        [one] => format!("{} ({})", one.name, one.arch()),
        many => format!("{} CUDA devices", many.len()),
    }
}

/// A generated kernel for `GpuContext::smoke_test`.
const SMOKE_SOURCE: &str = r#"#include "common/prelude.cuh"
extern "C" __global__ void spate_smoke(u64 n, u32* out) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) out[i] = (u32)i * 2u;
}
SPATE_EXPORT(spate_smoke)
"#;

/// A session's GPUs: the devices operators run on, the generated kernels compiled for each,
/// and counters. Stored in the session config (`SessionConfig::with_extension`) and read by GPU
/// operators in `execute`; the offload rule holds it too, to count fallbacks.
pub struct GpuContext {
    /// At least one. A GPU subtree's partition `p` runs on device `p % len` (see
    /// `plan/devices.rs`); one partition runs on the first.
    devices: Vec<Device>,
    /// Generated kernels by entry, each loaded by every device.
    generated: Mutex<HashMap<String, Kernel>>,
    /// `(name, source)` of every generated program compiled, in order.
    sources: Mutex<Vec<(String, String)>>,
    fallbacks: AtomicU64,
    /// GPU operator partitions executed (see [`GpuContext::operator_runs`]).
    operator_runs: AtomicU64,
    /// Generated programs compiled (or loaded from the disk cache) and the time it took.
    compiles: AtomicU64,
    compile_nanos: AtomicU64,
    /// The measured copy bandwidth, once measured (see [`GpuContext::measure_bandwidth`]).
    bandwidth: Mutex<Option<Bandwidth>>,
    /// Device memory outside the running operators that may move to the host.
    spill: SpillCoordinator,
    /// The pools of `spate.gpu.memory_limit`: one per query (its task context) and device.
    query_pools: Mutex<Vec<QueryPool>>,
}

/// A query's memory pool on one device (see [`GpuContext::query_pool`]).
struct QueryPool {
    query: std::sync::Weak<datafusion::execution::TaskContext>,
    device: usize,
    pool: std::sync::Weak<spate_kernels::MemoryPool>,
}

/// Kernel compilation so far in a session: generated programs compiled by NVRTC (or the host
/// compiler on `emulated`) or loaded from the on-disk cache, and the time that took.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompileStats {
    /// Programs compiled or loaded.
    pub programs: u64,
    /// Time spent, in total.
    pub time: std::time::Duration,
}

impl CompileStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &CompileStats) -> CompileStats {
        CompileStats {
            programs: self.programs.saturating_sub(earlier.programs),
            time: self.time.saturating_sub(earlier.time),
        }
    }
}

/// A device's measured memory bandwidth: the median of several large device-to-device copies.
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidth {
    /// Backend measured (`cuda`, or `emulated`, where it is the host's memory bandwidth).
    pub backend: String,
    /// Bytes read plus bytes written by one copy.
    pub bytes: u64,
    /// Median time of one copy, milliseconds.
    pub median_ms: f64,
}

impl Bandwidth {
    /// Bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes as f64 / (self.median_ms.max(1e-9) / 1e3)
    }

    /// GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes_per_second() / 1e9
    }

    /// The time `bytes` take at this bandwidth: a memory-bound operator's floor.
    pub fn floor(&self, bytes: u64) -> std::time::Duration {
        std::time::Duration::from_secs_f64(bytes as f64 / self.bytes_per_second())
    }
}

/// Bytes per copy when measuring bandwidth: large enough to stream well past every cache
/// (the H200's L2 is 60 MB), small enough to be quick. The emulator copies with host memcpy,
/// which reaches its steady state sooner.
const BANDWIDTH_BYTES_CUDA: usize = 1 << 30;
const BANDWIDTH_BYTES_EMULATED: usize = 64 << 20;
const BANDWIDTH_RUNS: usize = 5;

impl fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuContext")
            .field("device", self.device().description())
            .field("devices", &self.devices.len())
            .field("fallbacks", &self.fallbacks())
            .finish()
    }
}

impl GpuContext {
    /// Opens the devices of a GPU backend (`Cuda` or `Emulated`), each with a memory pool of
    /// `budget`: `devices` resolved against the `available` devices the machine has (see
    /// [`Devices::ordinals`]).
    pub fn open(
        backend: Backend,
        budget: spate_kernels::MemoryBudget,
        devices: &Devices,
        available: usize,
    ) -> Result<Arc<Self>> {
        spate_kernels::wait::set_blocking_hook(wait_off_the_runtime);
        let kind = match backend {
            Backend::Cuda => BackendKind::Cuda,
            Backend::Emulated => BackendKind::Emulated,
            other => {
                return Err(SpateError::Internal {
                    message: format!("GpuContext::open called for the {other} backend"),
                });
            }
        };
        let ordinals = match kind {
            BackendKind::Emulated => match devices {
                Devices::Count(n) => (0..*n).collect(),
                Devices::Ordinals(o) => o.clone(),
            },
            BackendKind::Cuda => devices.ordinals(available),
        };
        if kind == BackendKind::Cuda
            && let Some(missing) = ordinals.iter().find(|&&o| o >= available)
        {
            return Err(SpateError::Config {
                message: format!(
                    "devices {devices}: there is no CUDA device {missing} (this machine has \
                     {available})"
                ),
            });
        }
        let devices = ordinals
            .into_iter()
            .map(|ordinal| {
                Device::open(
                    kind,
                    DeviceOptions {
                        ordinal,
                        memory_budget: budget,
                        ..DeviceOptions::default()
                    },
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Arc::new(GpuContext {
            devices,
            generated: Mutex::new(HashMap::new()),
            sources: Mutex::new(Vec::new()),
            fallbacks: AtomicU64::new(0),
            operator_runs: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
            bandwidth: Mutex::new(None),
            spill: SpillCoordinator::default(),
            query_pools: Mutex::new(Vec::new()),
        }))
    }

    /// Lets the spill coordinator move `entry`'s device memory to the host when an operator
    /// runs out (see `exec/coordinator.rs`).
    pub(crate) fn register_spillable(&self, entry: std::sync::Weak<dyn Spillable>) {
        self.spill.register(entry);
    }

    /// Moves spillable device memory (cached tables, operators' held input) to the host, least
    /// recently used first, until about `want` bytes are let go of; the bytes let go of.
    pub(crate) fn relieve_memory(&self, want: usize) -> usize {
        self.spill.relieve(want)
    }

    /// The first device: the one a single-partition GPU subtree runs on.
    pub fn device(&self) -> &Device {
        &self.devices[0]
    }

    /// Every device, in the order partitions are placed on them.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The pool of `limit` bytes every stream of `query` on `device` charges its allocations
    /// to (`spate.gpu.memory_limit`), made by the first to ask; it lives while a stream of the
    /// query holds it.
    pub(crate) fn query_pool(
        &self,
        query: &Arc<datafusion::execution::TaskContext>,
        device: &Device,
        limit: usize,
    ) -> Arc<spate_kernels::MemoryPool> {
        let mut pools = self.query_pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|p| p.query.strong_count() > 0 && p.pool.strong_count() > 0);
        let found = pools.iter().find_map(|p| {
            let same = p.device == device.id()
                && p.query.upgrade().is_some_and(|q| Arc::ptr_eq(&q, query));
            same.then(|| p.pool.upgrade()).flatten()
        });
        found.unwrap_or_else(|| {
            let pool = Arc::new(spate_kernels::MemoryPool::new(limit));
            pools.push(QueryPool {
                query: Arc::downgrade(query),
                device: device.id(),
                pool: Arc::downgrade(&pool),
            });
            pool
        })
    }

    /// Fails with the first device's fault once any device is unhealthy.
    pub fn check_health(&self) -> spate_kernels::Result<()> {
        self.devices.iter().try_for_each(Device::check_health)
    }

    /// The device partition `partition` of a GPU subtree runs on.
    pub fn device_for(&self, partition: usize) -> &Device {
        &self.devices[partition % self.devices.len()]
    }

    /// A generated kernel, compiled once per session for every device (and cached on disk
    /// across sessions): a launch picks the one its stream's device loaded.
    pub fn generated_kernel(&self, source: &str, entry: &str) -> Result<Kernel> {
        let mut kernels = self.generated_kernels(source, &[entry])?;
        kernels.pop().ok_or_else(|| SpateError::Internal {
            message: format!("compiling {entry} returned no kernel"),
        })
    }

    /// The kernels `entries` of one generated program, compiled once per session for every
    /// device (and cached on disk across sessions).
    pub fn generated_kernels(&self, source: &str, entries: &[&str]) -> Result<Vec<Kernel>> {
        let Some(first) = entries.first() else {
            return Ok(Vec::new());
        };
        let mut cache = self.generated.lock().unwrap_or_else(|p| p.into_inner());
        if entries.iter().all(|e| cache.contains_key(*e)) {
            return Ok(entries
                .iter()
                .filter_map(|e| cache.get(*e).cloned())
                .collect());
        }
        let started = std::time::Instant::now();
        // Per device, the entry points in `entries`' order.
        let mut loaded: Vec<std::vec::IntoIter<Kernel>> = Vec::with_capacity(self.devices.len());
        for device in &self.devices {
            let compiled = device.compile_generated(first, source, entries);
            if compiled.is_err() {
                self.record_compile(started);
            }
            let kernels = compiled?;
            if kernels.len() != entries.len() {
                return Err(SpateError::Internal {
                    message: format!(
                        "compiling {first} returned {} of {} kernels",
                        kernels.len(),
                        entries.len()
                    ),
                });
            }
            loaded.push(kernels.into_iter());
        }
        self.record_compile(started);
        let mut kernels = Vec::with_capacity(entries.len());
        for entry in entries {
            let per_device: Vec<Kernel> = loaded.iter_mut().filter_map(Iterator::next).collect();
            let kernel = Kernel::on_devices(per_device).ok_or_else(|| SpateError::Internal {
                message: format!("compiling {entry} returned no kernel"),
            })?;
            cache.insert((*entry).to_string(), kernel.clone());
            kernels.push(kernel);
        }
        self.record_source(first, source);
        Ok(kernels)
    }

    fn record_compile(&self, started: std::time::Instant) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        self.compile_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// GPU operator partitions this session has executed: how a test tells that a statement
    /// ran on the GPU at all.
    pub fn operator_runs(&self) -> u64 {
        self.operator_runs.load(Ordering::Relaxed)
    }

    pub(crate) fn count_operator_run(&self) {
        self.operator_runs.fetch_add(1, Ordering::Relaxed);
    }

    /// Generated programs compiled (or loaded from the disk cache) so far, and the time taken.
    /// A program is compiled once per session: a query run a second time compiles nothing.
    pub fn compile_stats(&self) -> CompileStats {
        CompileStats {
            programs: self.compiles.load(Ordering::Relaxed),
            time: std::time::Duration::from_nanos(self.compile_nanos.load(Ordering::Relaxed)),
        }
    }

    /// Measures the device's copy bandwidth (once per session; later calls return the first
    /// measurement). Roofline floors in `EXPLAIN ANALYZE` and `spate bench` are computed
    /// against it.
    pub fn measure_bandwidth(&self) -> Result<Bandwidth> {
        let mut cached = self.bandwidth.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = cached.as_ref() {
            return Ok(b.clone());
        }
        let most = match self.device().kind() {
            BackendKind::Cuda => BANDWIDTH_BYTES_CUDA,
            BackendKind::Emulated => BANDWIDTH_BYTES_EMULATED,
        };
        // A quarter of what is free at most (the copy needs twice its bytes), so a nearly full
        // device or a small budget still measures.
        let free = self.device().memory_stats().free_bytes();
        let bytes = most.min(free / 4).max(64 << 10);
        let m = spate_kernels::throughput::copy_bandwidth(self.device(), bytes, BANDWIDTH_RUNS)?;
        let measured = Bandwidth {
            backend: self.device().kind().to_string(),
            bytes: m.bytes,
            median_ms: m.median_ms,
        };
        *cached = Some(measured.clone());
        Ok(measured)
    }

    /// The bandwidth measured by [`GpuContext::measure_bandwidth`], if it ran.
    pub fn bandwidth(&self) -> Option<Bandwidth> {
        self.bandwidth
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn record_source(&self, name: &str, source: &str) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.to_string(), source.to_string()));
    }

    /// `(name, source)` of every program generated and compiled in this session, in order.
    /// Tests compile them with NVRTC, so generated code is checked for the CUDA backend even
    /// where there is no GPU.
    pub fn generated_sources(&self) -> Vec<(String, String)> {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Counts one operator or expression left on the CPU.
    pub fn record_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Operators and expressions left on the CPU so far in this session.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// Runs one small kernel on each device and checks its result: a device that opens but
    /// cannot run kernels (a broken driver, a missing NVRTC) is caught when the session starts,
    /// not mid-query.
    pub fn smoke_test(&self) -> Result<()> {
        self.devices.iter().try_for_each(|d| self.smoke_test_on(d))
    }

    fn smoke_test_on(&self, device: &Device) -> Result<()> {
        let stream = device.new_stream()?;
        let input = stream.from_host(&[3u32, 1, 4, 1, 5])?;
        let sums = spate_kernels::scan::exclusive_sum(&stream, input.as_slice())?;
        let got = stream.to_vec(&sums)?;
        let wrong = |what: String| SpateError::BackendUnavailable {
            backend: device.kind().to_string(),
            reason: format!("device {}: {what}", device.ordinal()),
        };
        if got != [0, 3, 4, 8, 9] {
            return Err(wrong(format!(
                "the device computed a wrong prefix sum: {got:?}"
            )));
        }
        // The run-time compile path (NVRTC, or the host compiler on the emulator) too.
        let kernel = self.generated_kernel(SMOKE_SOURCE, "spate_smoke")?;
        let out = stream.alloc::<u32>(1000)?;
        let cfg = LaunchConfig::blocks(device.grid_stride_blocks(1000));
        // SAFETY: spate_smoke takes (u64 n, u32* out) and writes n values into `out`.
        unsafe { stream.launch(&kernel, cfg, &[KernelArg::U64(1000), (&out).into()])? };
        let got = stream.to_vec(&out)?;
        if got.iter().enumerate().any(|(i, v)| *v != 2 * i as u32) {
            return Err(wrong("a generated kernel computed wrong results".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_driver() -> GpuInventory {
        GpuInventory {
            devices: vec![],
            absent_reason: Some("no CUDA driver found".into()),
        }
    }

    fn one_gpu() -> GpuInventory {
        GpuInventory {
            devices: vec![DeviceInfo {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                total_memory_bytes: 141 << 30,
                free_memory_bytes: Some(140 << 30),
            }],
            absent_reason: None,
        }
    }

    #[test]
    fn auto_without_driver_says_why_it_runs_on_cpu() {
        let s = BackendSelection::resolve_with(Backend::Auto, no_driver).unwrap();
        assert_eq!(s.resolved, Backend::Cpu);
        assert_eq!(s.reason, "no CUDA driver found: running on CPU");
        assert!(!s.uses_gpu());
    }

    #[test]
    fn auto_with_gpu_picks_cuda_and_names_the_device() {
        let s = BackendSelection::resolve_with(Backend::Auto, one_gpu).unwrap();
        assert_eq!(s.resolved, Backend::Cuda);
        assert!(s.reason.contains("NVIDIA H200 (sm_90)"), "{}", s.reason);
        let err = SpateError::BackendUnavailable {
            backend: "cuda".into(),
            reason: "broken".into(),
        };
        let s = s.after_gpu_failure(err).unwrap();
        assert_eq!(s.resolved, Backend::Cpu);
        assert!(s.reason.ends_with("running on CPU"), "{}", s.reason);
    }

    #[test]
    fn explicit_gpu_backends_resolve_or_fail_clearly() {
        let s = BackendSelection::resolve_with(Backend::Emulated, no_driver).unwrap();
        assert_eq!(s.resolved, Backend::Emulated);
        assert!(s.uses_gpu());
        let s = BackendSelection::resolve_with(Backend::Cuda, one_gpu).unwrap();
        assert_eq!(s.resolved, Backend::Cuda);
        let err = s
            .after_gpu_failure(SpateError::Config {
                message: "x".into(),
            })
            .unwrap_err();
        assert!(err.is_user_error());
    }

    #[test]
    fn cuda_without_a_device_gives_the_reason() {
        let err = BackendSelection::resolve_with(Backend::Cuda, no_driver).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("no CUDA driver found"), "{msg}");
        assert!(msg.contains("--backend cpu"), "{msg}");
    }

    #[test]
    fn cpu_never_probes() {
        let s = BackendSelection::resolve_with(Backend::Cpu, || panic!("must not probe")).unwrap();
        assert_eq!(s.resolved, Backend::Cpu);
        assert!(s.inventory.is_none());
    }

    #[test]
    fn real_discovery_does_not_panic() {
        let s = BackendSelection::resolve(Backend::Auto).unwrap();
        assert!(!s.reason.is_empty());
        assert!(!GpuInventory::discover().describe().is_empty());
    }
}
