//! Devices: the one API operators use on both backends, over [`crate::backend`].
//!
//! A [`Device`] is a CUDA GPU (through cudarc's driver API) or the emulator (host memory, the
//! kernels compiled as C++). Work is issued on [`Stream`]s: copies, kernel launches and events.
//! On both backends that work is asynchronous and stream-ordered: a launch or a copy may run
//! after the call returns, and streams are ordered against each other only by events. The
//! emulator runs each stream on its own host thread, so a missing event or synchronisation
//! shows up there as it would on a GPU (see `backend/emulated`).
//!
//! Health: a sticky CUDA error (illegal address, kernel trap, launch failure) poisons a CUDA
//! context. The first one marks the device unhealthy, and every later call returns
//! [`KernelError::DeviceUnhealthy`] with the original fault (see [`crate::health`]). The
//! process keeps running, so the engine can fall back to the CPU. A kernel error on the
//! emulator is treated the same way.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::backend::{DeviceBackend, DeviceLimits, cuda as cuda_backend, emulated};
use crate::counters::{Call, CounterSnapshot, Counters, count};
use crate::error::{KernelError, Result};
use crate::faults::Faults;
use crate::health::Health;
use crate::launch::Kernel;
use crate::memory::{MemoryPool, MemoryStats, Reservation};
use crate::pinned::{PinnedBuffer, PinnedPool};
use crate::stream::Stream;

pub use crate::backend::emulated::EmulatorOptions;

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
    /// CUDA device ordinal; the emulator only records it, to name the device.
    pub ordinal: usize,
    /// The memory budget of the device's pool.
    pub memory_budget: MemoryBudget,
    /// How strict the emulator is (ignored by `cuda`).
    pub emulator: EmulatorOptions,
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

pub(crate) struct DeviceInner {
    pub(crate) kind: BackendKind,
    pub(crate) backend: Arc<dyn DeviceBackend>,
    pub(crate) limits: DeviceLimits,
    pub(crate) memory: Arc<MemoryPool>,
    pub(crate) pinned: Arc<PinnedPool>,
    pub(crate) health: Arc<Health>,
    /// Running totals of the runtime calls made on the device (see [`crate::counters`]).
    pub(crate) counters: Arc<Counters>,
    pub(crate) kernels: Mutex<HashMap<String, Kernel>>,
    /// Blocks for grid-stride kernels: enough to fill the device a few times over.
    pub(crate) grid_blocks: u32,
    /// Injected faults (tests, and the emulator's environment).
    pub(crate) faults: Faults,
    /// The ordinal it was opened with ([`DeviceOptions::ordinal`]).
    pub(crate) ordinal: usize,
    /// [`Device::peer_access`] to other devices, by their id, once asked.
    pub(crate) peers: Mutex<HashMap<usize, bool>>,
}

/// A device: a CUDA GPU or the emulator. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("description", self.description())
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
        let health = Arc::new(Health::default());
        let backend: Arc<dyn DeviceBackend> = Arc::new(cuda_backend::CudaDevice::open(
            options.ordinal,
            Arc::clone(&health),
        )?);
        // Grid-stride kernels: 8 blocks of 256 threads per SM keep every SM busy.
        Device::with_backend(BackendKind::Cuda, backend, health, &options, 8)
    }

    /// Opens the emulator. Always available where the binary runs.
    pub fn emulated(options: DeviceOptions) -> Result<Device> {
        let health = Arc::new(Health::default());
        let backend: Arc<dyn DeviceBackend> = Arc::new(emulated::EmuDevice::open(
            options.emulator.clone(),
            Arc::clone(&health),
        ));
        Device::with_backend(BackendKind::Emulated, backend, health, &options, 4)
    }

    fn with_backend(
        kind: BackendKind,
        backend: Arc<dyn DeviceBackend>,
        health: Arc<Health>,
        options: &DeviceOptions,
        blocks_per_sm: u32,
    ) -> Result<Device> {
        let description = backend.description();
        let memory = Arc::new(MemoryPool::new(budget_bytes(
            options.memory_budget,
            description.free_memory_bytes,
        )?));
        let grid_blocks = description.multiprocessors.max(1) * blocks_per_sm;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                kind,
                limits: backend.limits(),
                pinned: Arc::new(PinnedPool::new(Arc::clone(&backend))),
                backend,
                memory,
                health,
                counters: Counters::new(),
                kernels: Mutex::new(HashMap::new()),
                grid_blocks,
                faults: match kind {
                    BackendKind::Emulated => Faults::from_env(),
                    BackendKind::Cuda => Faults::default(),
                },
                ordinal: options.ordinal,
                peers: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// A number that tells this device apart from every other one open in the process (two
    /// handles to one device have the same).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The ordinal it was opened with: the CUDA device's, or the emulated device's number
    /// among a session's devices. Logical devices on one GPU share its ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The backend.
    pub fn kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// What the device is.
    pub fn description(&self) -> &DeviceDescription {
        self.inner.backend.description()
    }

    /// The launch limits every launch is checked against.
    pub fn limits(&self) -> DeviceLimits {
        self.inner.limits
    }

    /// Makes the `nth` device allocation from now fail with `OutOfMemory`; 0 disarms (a test
    /// hook; see [`crate::faults`]).
    #[doc(hidden)]
    pub fn inject_alloc_failure(&self, nth: u64) {
        self.inner.faults.arm_alloc(nth, 1);
    }

    /// Makes `count` device allocations fail in a row, from the `nth` from now; `nth` 0
    /// disarms (a test hook; see [`crate::faults`]).
    #[doc(hidden)]
    pub fn inject_alloc_failures(&self, nth: u64, count: u64) {
        self.inner.faults.arm_alloc(nth, count);
    }

    /// Makes the `nth` kernel launch from now fault, leaving the device unhealthy; 0 disarms (a
    /// test hook; see [`crate::faults`]).
    #[doc(hidden)]
    pub fn inject_launch_fault(&self, nth: u64) {
        self.inner.faults.arm_launch(nth);
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
        self.check_health()?;
        self.inner.pinned.take(bytes)
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
        Ok(Stream::new(
            self.clone(),
            self.inner.backend.new_stream()?,
            None,
        ))
    }

    /// A new stream whose allocations are charged to `pool` (a query's budget) as well as to
    /// the device's: an allocation fails with `OutOfMemory` when either is full.
    pub fn new_stream_in(&self, pool: Arc<MemoryPool>) -> Result<Stream> {
        self.check_health()?;
        Ok(Stream::new(
            self.clone(),
            self.inner.backend.new_stream()?,
            Some(pool),
        ))
    }

    /// The running totals of launches, host synchronisations, allocations and copies made on
    /// the device since it was opened (see [`crate::counters`]).
    pub fn counters(&self) -> CounterSnapshot {
        self.inner.counters.snapshot()
    }

    /// Whether streams of this device copy `other`'s memory directly ([`Stream::copy_peer`]):
    /// always for the same device or logical devices on one GPU; on `cuda` where the GPUs have
    /// peer access (NVLink or PCIe P2P), which this enables; on the emulator unless
    /// `SPATE_EMU_NO_PEER` is set. Without it, rows between devices go through host memory.
    pub fn peer_access(&self, other: &Device) -> bool {
        if self.id() == other.id() {
            return true;
        }
        let mut peers = self.inner.peers.lock().unwrap_or_else(|p| p.into_inner());
        *peers.entry(other.id()).or_insert_with(|| {
            self.kind() == other.kind()
                && self.inner.backend.peer_access(other.inner.backend.as_ref())
        })
    }

    /// Starts a new peak of device memory use at what is in use now, returning the peak
    /// before (so that one query's peak can be read on its own).
    pub fn reset_memory_peak(&self) -> usize {
        self.inner.memory.reset_peak()
    }

    /// Waits for all work on every stream of the device.
    pub fn synchronize(&self) -> Result<()> {
        self.check_health()?;
        count(&self.inner.counters, Call::HostSync);
        crate::wait::blocking(|| self.inner.backend.synchronize())?;
        self.check_health()
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
        let kernel = self.inner.backend.load_fixed(entry)?.owned_by(self.id());
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
        let kernels: Vec<Kernel> = self
            .inner
            .backend
            .load_generated(name, source, entries)?
            .into_iter()
            .map(|k| k.owned_by(self.id()))
            .collect();
        // Only programs that compiled are recorded: the NVRTC pass over the recording checks
        // that what the host compiler accepted, NVRTC accepts too.
        crate::compile::record_generated(name, source);
        Ok(kernels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_fractions_or_bytes() {
        assert_eq!(budget_bytes(MemoryBudget::Bytes(7), 100).unwrap(), 7);
        assert_eq!(
            budget_bytes(MemoryBudget::FractionOfFree(0.5), 100).unwrap(),
            50
        );
        assert!(budget_bytes(MemoryBudget::FractionOfFree(0.0), 100).is_err());
    }
}
