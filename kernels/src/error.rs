//! The error type of `spate-kernels`.

/// Errors raised by the kernel runtime.
///
/// `NoDevice` is the normal outcome on a machine without an NVIDIA driver or GPU; callers use it
/// to choose another backend, so its `reason` is written for users. `OutOfMemory` is what
/// operators react to (by spilling or splitting work); it never aborts anything.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No usable CUDA device: no driver library, no GPU, or the driver refused to start.
    #[error("{reason}")]
    NoDevice {
        /// Why there is no device, in words a user can act on.
        reason: String,
    },
    /// A CUDA driver call failed. The device may be unhealthy afterwards.
    #[error("CUDA driver call `{call}` failed: {message}")]
    Driver {
        /// The driver call or operation that failed.
        call: &'static str,
        /// The driver's description of the failure.
        message: String,
    },
    /// A kernel source did not compile (NVRTC or the host compiler for the emulator).
    #[error("kernel `{entry}` failed to compile for {arch}:\n{log}")]
    Compile {
        /// The program or entry point being compiled.
        entry: String,
        /// The target, e.g. `sm_90`, or `host` for the emulated backend.
        arch: String,
        /// The compiler's log.
        log: String,
    },
    /// A kernel launch failed or the kernel faulted.
    #[error("kernel `{entry}` (grid {grid:?}, block {block:?}) failed: {message}")]
    Launch {
        /// The entry point.
        entry: String,
        /// Grid dimensions of the launch.
        grid: (u32, u32, u32),
        /// Block dimensions of the launch.
        block: (u32, u32, u32),
        /// What went wrong.
        message: String,
    },
    /// An allocation did not fit the device's memory budget, or the device itself is full.
    #[error(
        "GPU out of memory: {requested_bytes} bytes requested, {free_bytes} bytes free in the \
         budget; lower the batch size, or raise the GPU memory budget"
    )]
    OutOfMemory {
        /// Bytes the failed allocation asked for.
        requested_bytes: usize,
        /// Bytes still free in the budget (or on the device) when it failed.
        free_bytes: usize,
    },
    /// A sticky CUDA error (an illegal address, a kernel trap) poisoned the device context.
    /// Every later call on the device fails with this error; the process keeps running.
    #[error(
        "the GPU device is unhealthy after an earlier fault and cannot run more work: {reason}"
    )]
    DeviceUnhealthy {
        /// The fault that made it unhealthy.
        reason: String,
    },
    /// A result would not fit its representation: more string bytes than its offsets can
    /// address. The caller can split its input and try again.
    #[error(
        "the result holds {bytes} bytes of strings, more than {offset_bits}-bit offsets address"
    )]
    OutputTooLarge {
        /// Bytes the result needs.
        bytes: u64,
        /// Width of its offsets.
        offset_bits: u32,
    },
    /// A caller passed arguments a launcher cannot accept (lengths, sizes, limits).
    #[error("invalid kernel argument: {message}")]
    InvalidArgument {
        /// What was wrong.
        message: String,
    },
    /// A broken invariant inside the runtime: this is a bug.
    #[error("internal error in the kernel runtime (this is a bug): {message}")]
    Internal {
        /// What was found broken.
        message: String,
    },
}

impl KernelError {
    /// True for `OutOfMemory`, which callers may recover from by using less memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, KernelError::OutOfMemory { .. })
    }
}

/// Result alias for `spate-kernels`.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// Returns `InvalidArgument` from the enclosing function when `cond` is false.
macro_rules! ensure_arg {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::KernelError::InvalidArgument { message: format!($($fmt)+) });
        }
    };
}
pub(crate) use ensure_arg;
