//! Launch configuration, kernel arguments and loaded kernels, the same on both backends.
//!
//! Arguments are passed the way `cuLaunchKernel` takes them: an array of pointers to each
//! argument's bytes. The emulated backend unpacks that array into the kernel's C++ signature,
//! and checks every argument's size against the signature first; on `cuda` the check uses
//! `cuFuncGetParamInfo` where the driver has it (12.4+).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::source::EmuLaunchFn;

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
    pub(crate) imp: KernelImpl,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.imp {
            KernelImpl::Cuda { .. } => "cuda",
            KernelImpl::Emulated { .. } => "emulated",
        };
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("backend", &backend)
            .finish()
    }
}

#[derive(Clone)]
pub(crate) enum KernelImpl {
    Cuda {
        function: CudaFunction,
        _module: Arc<CudaModule>,
        /// Parameter sizes, when the driver can report them.
        param_sizes: Option<Arc<[usize]>>,
    },
    Emulated {
        launch: EmuLaunchFn,
        param_sizes: Arc<[usize]>,
        /// Keeps a run-time compiled shared object loaded while the kernel lives.
        _library: Option<Arc<libloading::Library>>,
    },
}

impl Kernel {
    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Parameter sizes in bytes, where the backend can tell them.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        match &self.imp {
            KernelImpl::Cuda { param_sizes, .. } => param_sizes.as_deref(),
            KernelImpl::Emulated { param_sizes, .. } => Some(param_sizes),
        }
    }

    /// Registers used per thread and local (spill) bytes, on `cuda`.
    pub fn resource_usage(&self) -> Option<(i32, i32)> {
        match &self.imp {
            KernelImpl::Cuda { function, .. } => {
                Some((function.num_regs().ok()?, function.local_size_bytes().ok()?))
            }
            KernelImpl::Emulated { .. } => None,
        }
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
