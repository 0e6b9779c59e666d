//! The one interface both backends implement, and the two implementations: `cuda` (cudarc, the
//! driver API, NVRTC) and `emulated` (the kernels compiled as host C++, run by
//! `kernels/emu/spate_emu.h` on asynchronous host streams with checked memory).
//!
//! ```text
//!   Device / Stream / Event / Kernel / DeviceBuffer      (device.rs, stream.rs, …: validation,
//!        │                                               accounting, health; no backend branches)
//!        ▼
//!   DeviceBackend ─ StreamBackend ─ EventBackend ─ KernelBackend ─ DeviceMemory   (this file)
//!        │                                    │
//!        ├─ cuda::CudaDevice …                └─ emulated::EmuDevice …
//! ```
//!
//! The runtime above checks every argument (lengths, launch limits, parameter sizes) before it
//! calls a backend, so a backend only does the work. Everything a backend does on a stream is
//! asynchronous unless its documentation says otherwise: a copy or a launch may run after the
//! call returns, and its errors surface at the next synchronisation.

use std::any::Any;
use std::sync::Arc;

use crate::device::DeviceDescription;
use crate::error::Result;
use crate::launch::{Kernel, KernelArg, LaunchConfig};

pub(crate) mod cuda;
pub(crate) mod emulated;

/// What the launch checks need to know of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most blocks along x, y and z.
    pub max_grid: (u32, u32, u32),
    /// Most threads along x, y and z of a block.
    pub max_block: (u32, u32, u32),
    /// Dynamic shared memory a kernel may use without opting in (48 KiB on every GPU since
    /// Volta).
    pub default_shared_bytes: u32,
    /// The most dynamic shared memory a kernel can opt in to (227 KiB on an H200).
    pub max_shared_opt_in_bytes: u32,
}

impl DeviceLimits {
    /// The limits of compute capability 9.0 (H100, H200), which the emulator enforces.
    pub const HOPPER: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_grid: (i32::MAX as u32, 65_535, 65_535),
        max_block: (1024, 1024, 64),
        default_shared_bytes: 48 << 10,
        max_shared_opt_in_bytes: 227 << 10,
    };
}

/// A device: opens streams, loads kernels, allocates pinned host memory.
pub(crate) trait DeviceBackend: Send + Sync {
    /// What the device is.
    fn description(&self) -> &DeviceDescription;
    /// Its launch limits.
    fn limits(&self) -> DeviceLimits;
    /// A new stream.
    fn new_stream(&self) -> Result<Arc<dyn StreamBackend>>;
    /// A fixed kernel (an entry point under `kernels/cuda/`), loaded.
    fn load_fixed(&self, entry: &str) -> Result<Kernel>;
    /// Generated kernel source, compiled (or taken from the disk cache) and loaded.
    fn load_generated(&self, name: &str, source: &str, entries: &[&str]) -> Result<Vec<Kernel>>;
    /// Waits for all work on every stream of the device.
    fn synchronize(&self) -> Result<()>;
    /// Page-locked host memory for asynchronous copies (plain host memory on the emulator).
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees what [`DeviceBackend::alloc_pinned`] returned.
    ///
    /// # Safety
    /// `ptr` came from `alloc_pinned(bytes)` on this device and no copy uses it any more.
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize);
    /// Whether this device's streams can copy `other`'s memory directly (peer access, which
    /// this may enable), so that an exchange need not stage rows in host memory.
    fn peer_access(&self, other: &dyn DeviceBackend) -> bool;
    /// For downcasts between a backend's own devices.
    fn as_any(&self) -> &dyn Any;
}

/// What a device allocation is, for the emulator's error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ElemInfo {
    /// The element type, e.g. `u32`.
    pub(crate) name: &'static str,
    /// Its size in bytes.
    pub(crate) size: usize,
}

/// A host pointer that an asynchronous copy reads or writes later. The caller keeps the memory
/// alive and untouched until the copy has run (pinned buffers carry an event for that).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostPtr(pub(crate) *mut u8);

// SAFETY: only an address; the contract above says who may touch the memory and when.
unsafe impl Send for HostPtr {}
// SAFETY: as above.
unsafe impl Sync for HostPtr {}

/// An ordered queue of work on one device.
pub(crate) trait StreamBackend: Send + Sync {
    /// Allocates `bytes` (> 0) ordered on this stream; zeroed when asked, else uninitialised.
    fn alloc(&self, bytes: usize, zeroed: bool, elem: ElemInfo) -> Result<Box<dyn DeviceMemory>>;
    /// Copies pageable host bytes to `dst`; `src` may be reused as soon as this returns.
    ///
    /// # Safety
    /// `dst..dst + src.len()` is device memory of this device that stays alive until the copy
    /// has run.
    unsafe fn copy_from_host(&self, src: &[u8], dst: u64) -> Result<()>;
    /// Copies `len` bytes of pinned host memory at `src` to `dst`, asynchronously.
    ///
    /// # Safety
    /// Both ranges stay alive, and `src` unmodified, until the copy has run.
    unsafe fn copy_from_pinned(&self, src: HostPtr, dst: u64, len: usize) -> Result<()>;
    /// Copies `len` device bytes at `src` into pinned host memory at `dst`, asynchronously.
    /// `idle`: no earlier copy still uses the pinned buffer, so its bytes are the host's to
    /// poison until this one lands (the emulator does, so that a read too early shows).
    ///
    /// # Safety
    /// Both ranges stay alive, and `dst` unread, until the copy has run.
    unsafe fn copy_to_pinned(&self, src: u64, dst: HostPtr, len: usize, idle: bool) -> Result<()>;
    /// Copies device bytes into pageable host memory and waits for the copy (and everything
    /// before it on the stream).
    ///
    /// # Safety
    /// `src..src + dst.len()` is live device memory of this device.
    unsafe fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<()>;
    /// Copies `len` bytes between device ranges (which may overlap), asynchronously.
    ///
    /// # Safety
    /// Both ranges are device memory of this device that stays alive until the copy has run.
    unsafe fn copy_device(&self, src: u64, dst: u64, len: usize) -> Result<()>;
    /// Copies `len` bytes from `src`, memory of the device `from` belongs to (another device),
    /// to `dst` on this stream's device, in this stream's order. The caller orders the copy
    /// after the writes of `src` (an event of `from`) and keeps `src` alive until it ran.
    ///
    /// # Safety
    /// `src` must be `len` bytes of `from`'s device memory and `dst` `len` bytes of this
    /// device's.
    unsafe fn copy_peer(
        &self,
        src: u64,
        from: &dyn StreamBackend,
        dst: u64,
        len: usize,
    ) -> Result<()>;
    /// Launches a kernel of this backend, asynchronously. The arguments are checked already.
    ///
    /// # Safety
    /// Pointer arguments address memory the kernel may use until it has run.
    unsafe fn launch(&self, kernel: &Kernel, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()>;
    /// Records an event after all work issued so far.
    fn record_event(&self) -> Result<Arc<dyn EventBackend>>;
    /// Makes later work on this stream wait for `event` (of this backend).
    fn wait_event(&self, event: &dyn EventBackend) -> Result<()>;
    /// Waits for all work issued on the stream.
    fn synchronize(&self) -> Result<()>;
    /// For downcasting to the backend's own type.
    fn as_any(&self) -> &dyn Any;
}

/// A point in a stream's work.
pub(crate) trait EventBackend: Send + Sync + std::fmt::Debug {
    /// Waits until the work before the event has finished.
    fn synchronize(&self) -> Result<()>;
    /// True once the work before the event has finished.
    fn is_complete(&self) -> bool;
    /// Milliseconds from this event to `end` (of this backend), waiting for `end`.
    fn elapsed_ms(&self, end: &dyn EventBackend) -> Result<f32>;
    /// For downcasting to the backend's own type.
    fn as_any(&self) -> &dyn Any;
}

/// A loaded kernel entry point.
pub(crate) trait KernelBackend: Send + Sync {
    /// Parameter sizes in bytes, where the backend can tell them.
    fn param_sizes(&self) -> Option<&[usize]>;
    /// The most threads per block the kernel can be launched with (its `__launch_bounds__`,
    /// or what its registers allow).
    fn max_threads_per_block(&self) -> u32;
    /// Registers per thread and local (spill) bytes, on `cuda`.
    fn resource_usage(&self) -> Option<(i32, i32)>;
    /// Lets launches use up to `bytes` of dynamic shared memory (above the default 48 KiB).
    fn set_max_dynamic_shared_bytes(&self, bytes: u32) -> Result<()>;
    /// For downcasting to the backend's own type.
    fn as_any(&self) -> &dyn Any;
}

/// One device allocation of a backend. Dropping it without [`DeviceMemory::free`] leaks it.
pub(crate) trait DeviceMemory: Send + Sync {
    /// The device address of its first byte.
    fn address(&self) -> u64;
    /// Frees it, ordered after the work issued so far on the stream it was allocated on, or on
    /// `on` (a stream of this backend, ordered behind every use of the memory by events), or
    /// after all work on the device when `after_all_streams` (memory read by many streams).
    fn free(self: Box<Self>, after_all_streams: bool, on: Option<&dyn StreamBackend>);
}
