//! `spate-kernels`: Spate's CUDA kernels and the runtime that compiles and launches them.
//!
//! ```text
//!   spate (core) ── GPU operators ──▶ spate-kernels ── Device / Stream / DeviceBuffer / launch
//!                                        │
//!                                        ├─▶ cuda:     NVRTC → CUBIN (cached) → cudarc driver API
//!                                        └─▶ emulated: the same .cu as host C++ → fiber emulator
//! ```
//!
//! The kernel sources live in `kernels/cuda/` and are embedded in the binary. Typed launchers
//! ([`scan`], [`compact`], [`gather`], [`hash`], [`sort`], [`reduce`]) are what operators call;
//! they run unchanged on a GPU and on the emulator, which is how CI tests every kernel.
//!
//! ```
//! use spate_kernels::{Device, DeviceOptions, scan};
//!
//! let device = Device::emulated(DeviceOptions::default())?;
//! let stream = device.new_stream()?;
//! let input = stream.from_host(&[3u32, 1, 4, 1, 5])?;
//! let sums = scan::exclusive_sum(&stream, input.as_slice())?;
//! assert_eq!(stream.to_vec(&sums)?, vec![0, 3, 4, 8, 9]);
//! # Ok::<(), spate_kernels::KernelError>(())
//! ```

pub mod backend;
pub mod compact;
pub mod compile;
pub mod counters;
pub mod cross;
pub mod device;
pub mod error;
pub mod event;
pub mod faults;
pub mod gather;
pub mod hash;
pub(crate) mod health;
pub mod launch;
pub(crate) mod launch_bounds;
pub mod memory;
pub mod partition;
pub mod pinned;
pub mod probe;
pub mod reduce;
pub mod reference;
pub mod scan;
pub mod selftest;
pub mod sort;
pub mod source;
pub mod stream;
pub mod throughput;
pub mod top_k;
pub mod vector_topk;
pub mod views;
pub mod wait;

pub use backend::DeviceLimits;
pub use counters::{CounterSnapshot, Counters};
pub use device::{
    BackendKind, Device, DeviceDescription, DeviceOptions, EmulatorOptions, MemoryBudget,
};
pub use error::{KernelError, Result};
pub use event::Event;
pub use launch::{Kernel, KernelArg, LaunchConfig};
pub use memory::{
    DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice, MemoryPool, MemoryStats, Reservation,
};
pub use pinned::{PinnedBuffer, PinnedPool};
pub use stream::Stream;

#[cfg(test)]
mod tests {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_cross_threads() {
        // Operators run on tokio worker threads; every handle must move and be shared.
        assert_send_sync::<crate::Device>();
        assert_send_sync::<crate::Stream>();
        assert_send_sync::<crate::DeviceBuffer<u64>>();
        assert_send_sync::<crate::Kernel>();
        assert_send_sync::<crate::Event>();
        assert_send_sync::<crate::Reservation>();
        fn assert_send<T: Send>() {}
        assert_send::<crate::PinnedBuffer>();
    }
}
