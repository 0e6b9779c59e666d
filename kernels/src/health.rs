//! Whether a device can still run work, and if not, why.
//!
//! A sticky CUDA error (an illegal address, a kernel trap, a launch failure) poisons a CUDA
//! context. The first one marks the device unhealthy, and every later call returns
//! [`KernelError::DeviceUnhealthy`] with the original fault. The process keeps running, so the
//! engine can fall back to the CPU. A failed kernel on the emulator is treated the same way.

use std::sync::Mutex;

use cudarc::driver::{DriverError, sys};

use crate::error::KernelError;

/// The health of one device, shared by its streams, buffers and events.
#[derive(Debug, Default)]
pub(crate) struct Health {
    fault: Mutex<Option<String>>,
}

/// CUDA errors after which the context is unusable. `CUDA_ERROR_UNKNOWN` (999) is among them:
/// the driver reports it for faults it cannot classify, and the context does not recover.
pub(crate) fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_UNKNOWN
            | CUDA_ERROR_NVLINK_UNCORRECTABLE
            | CUDA_ERROR_EXTERNAL_DEVICE
    )
}

impl Health {
    /// `DeviceUnhealthy` once a fault has been recorded.
    pub(crate) fn check(&self) -> Result<(), KernelError> {
        match &*self.fault.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(reason) => Err(KernelError::DeviceUnhealthy {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Records the first fault; later ones are only logged.
    pub(crate) fn mark(&self, reason: String) {
        let mut fault = self.fault.lock().unwrap_or_else(|p| p.into_inner());
        if fault.is_none() {
            log::error!("GPU device marked unhealthy: {reason}");
            *fault = Some(reason);
        } else {
            log::warn!("GPU device already unhealthy; also: {reason}");
        }
    }

    /// Records a driver error; a sticky one marks the device unhealthy.
    pub(crate) fn record_driver_error(&self, call: &'static str, e: &DriverError) {
        if is_sticky(e.0) {
            self.mark(format!("`{call}` failed: {e}"));
        }
    }

    /// Converts a driver error, recording it; a sticky one becomes `DeviceUnhealthy`.
    pub(crate) fn driver(&self, call: &'static str, e: DriverError) -> KernelError {
        self.record_driver_error(call, &e);
        if is_sticky(e.0) {
            return KernelError::DeviceUnhealthy {
                reason: format!("`{call}` failed: {e}"),
            };
        }
        driver_error(call, &e)
    }
}

/// A driver error as a `KernelError::Driver`.
pub(crate) fn driver_error(call: &'static str, e: &DriverError) -> KernelError {
    KernelError::Driver {
        call,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_hardware_faults_are_sticky() {
        use sys::CUresult::*;
        assert!(is_sticky(CUDA_ERROR_UNKNOWN));
        assert!(is_sticky(CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(!is_sticky(CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!is_sticky(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn the_first_fault_is_kept() {
        let h = Health::default();
        assert!(h.check().is_ok());
        h.mark("first".into());
        h.mark("second".into());
        match h.check() {
            Err(KernelError::DeviceUnhealthy { reason }) => assert_eq!(reason, "first"),
            other => panic!("expected DeviceUnhealthy, got {other:?}"),
        }
    }
}
