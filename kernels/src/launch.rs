//! Launch configuration, kernel arguments and loaded kernels, the same on both backends.
//!
//! Arguments are passed the way `cuLaunchKernel` takes them: an array of pointers to each
//! argument's bytes. The emulated backend unpacks that array into the kernel's C++ signature,
//! and checks every argument's size against the signature first; on `cuda` the check uses
//! `cuFuncGetParamInfo` where the driver has it (12.4+). Launch limits (block and grid
//! dimensions, `__launch_bounds__`, dynamic shared memory above 48 KiB without an opt-in) are
//! checked alike on both backends, before anything is queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::backend::{DeviceLimits, KernelBackend};
use crate::device::BackendKind;
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice};

/// Threads per block of every fixed kernel (`SPATE_BLOCK_THREADS` in `common/prelude.cuh`).
pub const BLOCK_THREADS: u32 = 256;
/// Items per thread in tile-based kernels (`SPATE_ITEMS_PER_THREAD`).
pub const ITEMS_PER_THREAD: u32 = 8;
/// Rows per tile: one block processes one tile (`SPATE_TILE`).
pub const TILE: usize = (BLOCK_THREADS * ITEMS_PER_THREAD) as usize;
/// Index meaning "no row" (`SPATE_NULL_INDEX`): gathers write zero and a null.
pub const NULL_INDEX: u32 = u32::MAX;

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One block of [`BLOCK_THREADS`] per tile.
    pub fn tiles(num_tiles: usize) -> crate::Result<Self> {
        let grid = u32::try_from(num_tiles)
            .ok()
            .filter(|g| *g < i32::MAX as u32)
            .ok_or_else(|| crate::KernelError::InvalidArgument {
                message: format!("{num_tiles} tiles exceed the grid limit of 2^31 - 1 blocks"),
            })?;
        Ok(LaunchConfig {
            grid: (grid, 1, 1),
            block: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    /// `blocks` blocks of [`BLOCK_THREADS`], for grid-stride kernels.
    pub fn blocks(blocks: u32) -> Self {
        LaunchConfig {
            grid: (blocks.max(1), 1, 1),
            block: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        u64::from(self.block.0) * u64::from(self.block.1) * u64::from(self.block.2)
    }

    /// Blocks in the grid.
    pub fn num_blocks(&self) -> u64 {
        u64::from(self.grid.0) * u64::from(self.grid.1) * u64::from(self.grid.2)
    }
}

/// One kernel argument, by value. Pointers are device addresses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A device pointer (0 for null).
    Ptr(u64),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f32`
    F32(f32),
    /// `f64`
    F64(f64),
}

impl KernelArg {
    /// Size of the argument in the kernel's signature.
    pub fn size(&self) -> usize {
        match self {
            KernelArg::U32(_) | KernelArg::I32(_) | KernelArg::F32(_) => 4,
            _ => 8,
        }
    }

    /// The argument's bytes, little-endian, in a 64-bit slot (what `cuLaunchKernel` reads).
    pub(crate) fn slot(&self) -> u64 {
        match *self {
            KernelArg::Ptr(p) => p,
            KernelArg::U32(v) => u64::from(v),
            KernelArg::I32(v) => u64::from(v as u32),
            KernelArg::U64(v) => v,
            KernelArg::I64(v) => v as u64,
            KernelArg::F32(v) => u64::from(v.to_bits()),
            KernelArg::F64(v) => v.to_bits(),
        }
    }

    /// A null pointer argument.
    pub fn null() -> Self {
        KernelArg::Ptr(0)
    }
}

impl<T: DeviceCopy> From<&DeviceBuffer<T>> for KernelArg {
    fn from(b: &DeviceBuffer<T>) -> Self {
        KernelArg::Ptr(b.address())
    }
}

impl<T: DeviceCopy> From<&mut DeviceBuffer<T>> for KernelArg {
    fn from(b: &mut DeviceBuffer<T>) -> Self {
        KernelArg::Ptr(b.address())
    }
}

impl<T> From<DeviceSlice<'_, T>> for KernelArg {
    fn from(s: DeviceSlice<'_, T>) -> Self {
        KernelArg::Ptr(s.address())
    }
}

impl<T: DeviceCopy> From<Option<&DeviceBuffer<T>>> for KernelArg {
    fn from(b: Option<&DeviceBuffer<T>>) -> Self {
        KernelArg::Ptr(b.map_or(0, DeviceBuffer::address))
    }
}

/// The bitmap's bytes pointer (null when absent); the offset is a separate argument.
impl From<Option<DeviceBitmap<'_>>> for KernelArg {
    fn from(b: Option<DeviceBitmap<'_>>) -> Self {
        KernelArg::Ptr(b.map_or(0, |b| b.bytes.address()))
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $v:ident),*) => { $(
        impl From<$t> for KernelArg {
            fn from(v: $t) -> Self {
                KernelArg::$v(v)
            }
        }
    )* };
}
scalar_arg!(u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);

/// A loaded kernel entry point, ready to launch on its device's streams.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) name: Arc<str>,
    pub(crate) backend: BackendKind,
    pub(crate) imp: Arc<dyn KernelBackend>,
    /// Dynamic shared memory launches may use beyond the default, once opted in.
    opt_in_shared_bytes: Arc<AtomicU32>,
    /// The device that loaded it ([`crate::Device::id`]); 0 until a device claims it. A CUDA
    /// module belongs to one context, so a kernel launches only on its own device's streams.
    pub(crate) device: usize,
    /// The same entry point loaded by other devices (see [`Kernel::on_devices`]).
    peers: Arc<[Kernel]>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .finish()
    }
}

impl Kernel {
    pub(crate) fn new(name: &str, backend: BackendKind, imp: Arc<dyn KernelBackend>) -> Self {
        Kernel {
            name: Arc::from(name),
            backend,
            imp,
            opt_in_shared_bytes: Arc::new(AtomicU32::new(0)),
            device: 0,
            peers: Arc::from(Vec::new()),
        }
    }

    /// One kernel for several devices: `loaded[i]` is the entry point as device `i` loaded it.
    /// A launch picks the one of the stream's device. `None` when `loaded` is empty.
    pub fn on_devices(mut loaded: Vec<Kernel>) -> Option<Kernel> {
        if loaded.is_empty() {
            return None;
        }
        let mut first = loaded.remove(0);
        first.peers = Arc::from(loaded);
        Some(first)
    }

    /// The kernel as device `device` ([`crate::Device::id`]) loaded it, if it did.
    pub(crate) fn for_device(&self, device: usize) -> Option<&Kernel> {
        if self.device == 0 || self.device == device {
            return Some(self);
        }
        self.peers.iter().find(|k| k.device == device)
    }

    /// The kernel, as loaded by device `device` ([`crate::Device::id`]).
    pub(crate) fn owned_by(mut self, device: usize) -> Self {
        self.device = device;
        self
    }

    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Parameter sizes in bytes, where the backend can tell them.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.imp.param_sizes()
    }

    /// Registers used per thread and local (spill) bytes, on `cuda`.
    pub fn resource_usage(&self) -> Option<(i32, i32)> {
        self.imp.resource_usage()
    }

    /// The most threads per block a launch may use: the kernel's `__launch_bounds__` (or, on
    /// `cuda`, what its register use allows), else 1024.
    pub fn max_threads_per_block(&self) -> u32 {
        self.imp.max_threads_per_block()
    }

    /// Opts the kernel in to `bytes` of dynamic shared memory per block. A launch with more
    /// than 48 KiB fails unless its kernel opted in to at least that much, as on a GPU
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub fn set_max_dynamic_shared_bytes(&self, bytes: u32) -> crate::Result<()> {
        self.imp.set_max_dynamic_shared_bytes(bytes)?;
        self.opt_in_shared_bytes.store(bytes, Ordering::Release);
        for peer in self.peers.iter() {
            peer.set_max_dynamic_shared_bytes(bytes)?;
        }
        Ok(())
    }

    /// Checks a launch configuration against the kernel and the device limits; what a GPU
    /// would refuse is refused on both backends, before anything is queued.
    pub(crate) fn check_launch(
        &self,
        cfg: &LaunchConfig,
        limits: &DeviceLimits,
    ) -> crate::Result<()> {
        let refuse = |why: String| {
            Err(crate::KernelError::Launch {
                entry: self.name.to_string(),
                grid: cfg.grid,
                block: cfg.block,
                message: why,
            })
        };
        let (bx, by, bz) = cfg.block;
        let (mx, my, mz) = limits.max_block;
        if bx == 0 || by == 0 || bz == 0 || bx > mx || by > my || bz > mz {
            return refuse(format!(
                "block dimensions must be 1..={mx} x 1..={my} x 1..={mz}"
            ));
        }
        let threads = cfg.threads_per_block();
        let bound = u64::from(
            self.max_threads_per_block()
                .min(limits.max_threads_per_block),
        );
        if threads > bound {
            return refuse(format!(
                "{threads} threads per block, more than the kernel's limit of {bound} \
                 (its __launch_bounds__, or what its registers allow)"
            ));
        }
        let (gx, gy, gz) = cfg.grid;
        let (mx, my, mz) = limits.max_grid;
        if gx > mx || gy > my || gz > mz {
            return refuse(format!(
                "grid dimensions must be at most {mx} x {my} x {mz}"
            ));
        }
        let allowed = limits
            .default_shared_bytes
            .max(self.opt_in_shared_bytes.load(Ordering::Acquire));
        if cfg.shared_mem_bytes > allowed {
            return refuse(format!(
                "{} bytes of dynamic shared memory, above the {allowed} bytes allowed; more \
                 than {} bytes needs Kernel::set_max_dynamic_shared_bytes first (at most {})",
                cfg.shared_mem_bytes, limits.default_shared_bytes, limits.max_shared_opt_in_bytes
            ));
        }
        Ok(())
    }
}

/// Checks arguments against the kernel's signature; a mismatch is a bug in a launcher.
pub(crate) fn check_args(kernel: &Kernel, args: &[KernelArg]) -> crate::Result<()> {
    let Some(expected) = kernel.param_sizes() else {
        return Ok(());
    };
    let given: Vec<usize> = args.iter().map(KernelArg::size).collect();
    if expected != given.as_slice() {
        return Err(crate::KernelError::Internal {
            message: format!(
                "kernel `{}` takes parameters of sizes {expected:?} but was launched with {given:?}",
                kernel.name
            ),
        });
    }
    Ok(())
}
