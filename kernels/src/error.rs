//! The error type of `spate-kernels`.

/// Errors raised by the kernel runtime.
///
/// `NoDevice` is the normal outcome on a machine without an NVIDIA driver or GPU; callers use it
/// to choose another backend, so its `reason` is written for users.
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
}

/// Result alias for `spate-kernels`.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
