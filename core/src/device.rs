//! Backend selection: which backend a session runs on, and why.
//!
//! Contract: selection never panics. `auto` always resolves to something that works and says
//! why it chose it; an explicit `cuda` or `emulated` that cannot run fails with
//! [`SpateError::BackendUnavailable`].

use std::fmt;

pub use spate_kernels::probe::DeviceInfo;

use crate::config::Backend;
use crate::error::{Result, SpateError};

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
                    format!(
                        "GPU {}: {} ({}), {:.1} GiB total, {:.1} GiB free",
                        d.ordinal,
                        d.name,
                        d.arch(),
                        d.total_memory_bytes as f64 / (1u64 << 30) as f64,
                        d.free_memory_bytes as f64 / (1u64 << 30) as f64,
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
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
                let reason = match &inventory.absent_reason {
                    Some(why) => format!("{why}; use --backend cpu or --backend auto"),
                    None => format!(
                        "found {} and its kernels can be checked with `spate selftest --backend \
                         cuda`, but the GPU SQL operators are not part of this build yet; use \
                         --backend cpu or --backend auto",
                        device_summary(&inventory.devices)
                    ),
                };
                Err(SpateError::BackendUnavailable {
                    backend: requested.to_string(),
                    reason,
                })
            }
            Backend::Emulated => Err(SpateError::BackendUnavailable {
                backend: requested.to_string(),
                reason: "the emulated kernels can be checked with `spate selftest --backend \
                         emulated`, but the GPU SQL operators are not part of this build yet; \
                         use --backend cpu or --backend auto"
                    .to_string(),
            }),
            Backend::Auto => {
                let inventory = discover();
                // Until the GPU operators land, `auto` runs on the CPU even with a device
                // present, and says so.
                let reason = match &inventory.absent_reason {
                    Some(why) => format!("{why}: running on CPU"),
                    None => format!(
                        "found {}, but GPU operators are not part of this build yet: \
                         running on CPU",
                        device_summary(&inventory.devices)
                    ),
                };
                Ok(BackendSelection {
                    requested,
                    resolved: Backend::Cpu,
                    reason,
                    inventory: Some(inventory),
                })
            }
        }
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

fn device_summary(devices: &[DeviceInfo]) -> String {
    match devices {
        [one] => format!("{} ({})", one.name, one.arch()),
        many => format!("{} CUDA devices", many.len()),
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
                free_memory_bytes: 140 << 30,
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
    fn auto_with_gpu_names_the_device() {
        let s = BackendSelection::resolve_with(Backend::Auto, one_gpu).unwrap();
        assert_eq!(s.resolved, Backend::Cpu);
        assert!(s.reason.contains("NVIDIA H200 (sm_90)"), "{}", s.reason);
    }

    #[test]
    fn explicit_gpu_backends_fail_clearly() {
        for b in [Backend::Cuda, Backend::Emulated] {
            let err = BackendSelection::resolve_with(b, one_gpu).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("backend '{b}' is not available")),
                "{msg}"
            );
            assert!(err.is_user_error());
        }
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
        assert!(s.reason.ends_with("running on CPU"), "{}", s.reason);
        assert!(!GpuInventory::discover().describe().is_empty());
    }
}
