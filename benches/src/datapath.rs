//! A GPU query's data path in the result files: what it launched, synchronised, allocated and
//! moved over the bus, its peak device memory, its host exchanges, and the modeled H200 time
//! those add up to ([`spate::ModelInputs`]).

use serde::{Deserialize, Serialize};
use spate::ModelInputs;

use crate::runner::QueryRun;

/// One run's data path (the last timed run's; the counts are the same run to run).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DataPath {
    /// Kernel launches.
    pub launches: u64,
    /// Host synchronisations (readbacks, synchronizes, event waits).
    pub host_syncs: u64,
    /// Device buffers allocated.
    pub dev_allocs: u64,
    /// Bytes copied host to device, every copy counted (batch uploads and small ones).
    pub h2d_bytes: u64,
    /// Bytes copied device to host, every copy counted (the result and small readbacks).
    pub d2h_bytes: u64,
    /// Bytes the GPU operators read and wrote in device memory (the roofline's).
    pub device_bytes: u64,
    /// The most device memory in use during the run (the engine's resident tables included);
    /// `gpu_peak_bytes` in the JSON.
    #[serde(rename = "gpu_peak_bytes", alias = "peak_device_bytes")]
    pub peak_device_bytes: u64,
    /// Exchanges that moved a GPU operator's output through the host.
    pub host_exchanges: u64,
    /// The Arrow size of the result, bytes.
    pub result_bytes: u64,
    /// The modeled H200 time, milliseconds ([`spate::ModelInputs`]): a model, not a measurement.
    /// With several devices, the slowest device's (each device's own launches, syncs, bus
    /// bytes, the exchanges' included, and device bytes; see [`DataPath::of`]).
    pub modeled_h200_ms: f64,
    /// Devices the run used.
    #[serde(default = "one")]
    pub devices: usize,
    /// Each device's modeled H200 time, milliseconds (one entry per device).
    #[serde(default)]
    pub device_modeled_ms: Vec<f64>,
    /// Bytes the exchanges between devices moved to another device.
    #[serde(default)]
    pub exchange_bytes: u64,
    /// Bytes the exchanges moved back to the device they were on.
    #[serde(default)]
    pub exchange_local_bytes: u64,
    /// Bytes copied between devices directly (peer copies), over all devices.
    #[serde(default)]
    pub peer_bytes: u64,
    /// Milliseconds the copy streams spent uploading CPU operators' output (measured: device
    /// time on `cuda`, host time on the emulator).
    #[serde(default)]
    pub upload_copy_ms: f64,
    /// Milliseconds the compute streams waited for those copies: the copy time not hidden
    /// under compute.
    #[serde(default)]
    pub upload_wait_ms: f64,
}

fn one() -> usize {
    1
}

impl DataPath {
    /// The data path of `run`, which ran on a GPU backend.
    ///
    /// With several devices each one's time is modeled from its own counts (launches, syncs,
    /// bus bytes, device bytes of the operator partitions it ran), and the query's is the
    /// slowest device's: the devices work at once. An exchange between devices with peer
    /// access copies over NVLink, at 400 GB/s into the receiving device (its `peer_bytes`);
    /// without peer access it goes through the host, and its bytes are in the two devices'
    /// bus bytes, at PCIe's 50 GB/s each way.
    pub fn of(run: &QueryRun) -> DataPath {
        let traffic = run.device_traffic();
        let device_bytes = traffic.read_bytes + traffic.write_bytes;
        let r = run.runtime;
        let devices = run.per_device.len().max(1);
        let per_device_bytes = run.device_bytes_per_device(devices);
        let device_modeled_ms: Vec<f64> = if run.per_device.is_empty() {
            vec![
                ModelInputs {
                    device_bytes,
                    bus_bytes: r.bus_bytes(),
                    peer_bytes: r.peer_bytes,
                    host_syncs: r.host_syncs,
                    launches: r.launches,
                }
                .modeled_h200()
                .as_secs_f64()
                    * 1e3,
            ]
        } else {
            run.per_device
                .iter()
                .zip(&per_device_bytes)
                .map(|(c, &bytes)| {
                    ModelInputs {
                        device_bytes: bytes,
                        bus_bytes: c.bus_bytes(),
                        peer_bytes: c.peer_bytes,
                        host_syncs: c.host_syncs,
                        launches: c.launches,
                    }
                    .modeled_h200()
                    .as_secs_f64()
                        * 1e3
                })
                .collect()
        };
        let modeled_ms = device_modeled_ms.iter().copied().fold(0.0, f64::max);
        let (exchange_bytes, exchange_local_bytes) = run.exchange_bytes();
        DataPath {
            launches: r.launches,
            host_syncs: r.host_syncs,
            dev_allocs: r.allocations,
            h2d_bytes: r.h2d_bytes,
            d2h_bytes: r.d2h_bytes,
            device_bytes,
            peak_device_bytes: run.peak_device_bytes,
            host_exchanges: run.placement.host_exchanges.len() as u64,
            result_bytes: run.result_bytes(),
            modeled_h200_ms: modeled_ms,
            devices,
            device_modeled_ms,
            exchange_bytes,
            exchange_local_bytes,
            peer_bytes: r.peer_bytes,
            upload_copy_ms: traffic.upload_copy.as_secs_f64() * 1e3,
            upload_wait_ms: traffic.upload_wait.as_secs_f64() * 1e3,
        }
    }

    /// The share of the upload copy time hidden under compute, when there were uploads.
    pub fn upload_hidden(&self) -> Option<f64> {
        hidden(self.upload_copy_ms, self.upload_wait_ms)
    }

    /// The markdown table's cells after the query and engine columns (see [`HEADER`]).
    pub fn cells(&self) -> Vec<String> {
        let mb = |b: u64| format!("{:.3}", b as f64 / 1e6);
        vec![
            self.launches.to_string(),
            self.host_syncs.to_string(),
            self.dev_allocs.to_string(),
            mb(self.h2d_bytes),
            mb(self.d2h_bytes),
            mb(self.result_bytes),
            mb(self.device_bytes),
            mb(self.peak_device_bytes),
            self.host_exchanges.to_string(),
            format!("{:.3}", self.modeled_h200_ms),
        ]
    }
}

/// Column names of [`DataPath::cells`].
pub const HEADER: [&str; 10] = [
    "launches",
    "host syncs",
    "allocs",
    "to GPU MB",
    "from GPU MB",
    "result MB",
    "device MB",
    "peak MB",
    "host exchanges",
    "modeled H200 ms",
];

/// The section's explanation, above its table.
pub const ABOUT: &str = "Runtime calls and data movement of each GPU run (MB = 10^6 bytes), \
    counted by the kernel runtime on every call. To/from GPU counts every copy over the bus, the \
    small readbacks of sizes and totals included; device MB is what the GPU operators read and \
    wrote; host exchanges are exchanges that moved a GPU operator's output through host memory. \
    The modeled H200 time is `device bytes / 3.0 TB/s + bus bytes / 50 GB/s + host syncs × 10 µs \
    + launches × 2 µs` (constants and sources in `spate::model`): a model, not a measurement.";

/// The share of `copy_ms` of copies that compute did not wait `wait_ms` for; `None` without
/// copies.
pub fn hidden(copy_ms: f64, wait_ms: f64) -> Option<f64> {
    (copy_ms > 0.0).then(|| (1.0 - wait_ms / copy_ms).clamp(0.0, 1.0))
}
