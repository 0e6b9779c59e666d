//! Device discovery: which CUDA devices exist, or why there are none.
//!
//! Contract: [`discover`] never panics, whatever the machine has. cudarc's dynamic loader panics
//! on the first driver call when `libcuda.so` is missing, so we ask it whether the library can be
//! loaded before making any call, and additionally contain any panic that a broken driver
//! installation (a library with missing symbols) could still cause.
//!
//! Discovery creates no context: names, compute capabilities and total memory come from device
//! queries (`cuDeviceGet*`), so listing eight GPUs does not initialise eight contexts (each
//! costs hundreds of milliseconds and some memory on its GPU). Free memory needs a context and
//! is measured when a device is opened. A device that cannot be queried is skipped with a
//! warning; the others are still listed.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaContext, sys};

use crate::error::{KernelError, Result};

/// What discovery learned about one CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal, as CUDA numbers it.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_memory_bytes: usize,
    /// Free device memory in bytes, when known: discovery creates no context, so it is `None`
    /// there, and [`crate::DeviceDescription::free_memory_bytes`] has it once the device opens.
    pub free_memory_bytes: Option<usize>,
}

impl DeviceInfo {
    /// The architecture name NVRTC compiles for, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// Environment variable that makes discovery behave as if no driver were installed. Tests and
/// users who want to force the CPU path without touching `--backend` use it.
pub const DISABLE_ENV: &str = "SPATE_DISABLE_CUDA";

/// Lists the CUDA devices on this machine.
///
/// Returns [`KernelError::NoDevice`] with a reason when there is no driver library, the driver
/// cannot initialise, or it reports no devices.
pub fn discover() -> Result<Vec<DeviceInfo>> {
    if std::env::var_os(DISABLE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return Err(KernelError::NoDevice {
            reason: format!("CUDA disabled by {DISABLE_ENV}"),
        });
    }
    // SAFETY: `is_culib_present` only tries to dlopen the driver library under its known names
    // and drops the handle; it runs no driver code.
    if !unsafe { sys::is_culib_present() } {
        return Err(KernelError::NoDevice {
            reason: "no CUDA driver found (libcuda.so is not installed)".to_string(),
        });
    }
    match catch_unwind(AssertUnwindSafe(discover_with_driver)) {
        Ok(result) => result,
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown failure");
            Err(KernelError::NoDevice {
                reason: format!("the CUDA driver library could not be used: {detail}"),
            })
        }
    }
}

fn discover_with_driver() -> Result<Vec<DeviceInfo>> {
    let count = CudaContext::device_count().map_err(|e| KernelError::NoDevice {
        reason: format!("the CUDA driver is installed but did not initialise: {e}"),
    })?;
    if count <= 0 {
        return Err(KernelError::NoDevice {
            reason: "the CUDA driver is installed but reports no devices".to_string(),
        });
    }
    let mut devices = Vec::with_capacity(count as usize);
    let mut skipped = Vec::new();
    for ordinal in 0..count as usize {
        match query(ordinal) {
            Ok(d) => devices.push(d),
            Err(e) => {
                log::warn!("CUDA device {ordinal} skipped: {e}");
                skipped.push(format!("device {ordinal}: {e}"));
            }
        }
    }
    if devices.is_empty() {
        return Err(KernelError::NoDevice {
            reason: format!(
                "the CUDA driver reports {count} device(s), but none could be queried: {}",
                skipped.join("; ")
            ),
        });
    }
    Ok(devices)
}

/// One device's name, compute capability and total memory, without a context.
fn query(ordinal: usize) -> std::result::Result<DeviceInfo, String> {
    let call = |name: &str, r: sys::CUresult| r.result().map_err(|e| format!("{name} failed: {e}"));
    let mut dev: sys::CUdevice = 0;
    // SAFETY: the driver is initialised (device_count called cuInit); writes one handle.
    call("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: writes at most `len` bytes, NUL-terminated.
    call("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
    })?;
    let name: Vec<u8> = name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    let attribute = |a: sys::CUdevice_attribute| {
        let mut v = 0;
        // SAFETY: writes one int.
        call("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut v, a, dev)
        })
        .map(|()| v)
    };
    use sys::CUdevice_attribute::*;
    let major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let mut total = 0usize;
    // SAFETY: writes one size.
    call("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&mut total, dev)
    })?;
    Ok(DeviceInfo {
        ordinal,
        name: String::from_utf8_lossy(&name).into_owned(),
        compute_capability: (major, minor),
        total_memory_bytes: total,
        free_memory_bytes: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discover_never_panics_and_explains_absence() {
        // On CI there is no driver; on a GPU machine there are devices. Either way, no panic,
        // and an absence always carries a reason.
        match discover() {
            Ok(devices) => {
                assert!(!devices.is_empty());
                for d in &devices {
                    assert!(d.arch().starts_with("sm_"));
                    assert!(d.total_memory_bytes > 0);
                    assert!(d.free_memory_bytes.is_none(), "discovery opens no context");
                }
            }
            Err(KernelError::NoDevice { reason }) => assert!(!reason.is_empty()),
            Err(other) => panic!("unexpected discovery error: {other}"),
        }
    }

    #[test]
    fn arch_name_follows_nvrtc_convention() {
        let d = DeviceInfo {
            ordinal: 0,
            name: "test".into(),
            compute_capability: (9, 0),
            total_memory_bytes: 2,
            free_memory_bytes: None,
        };
        assert_eq!(d.arch(), "sm_90");
    }
}
