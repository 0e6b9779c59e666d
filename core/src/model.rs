//! The modeled H200 time of a query: what its data movement and runtime calls would cost on the
//! GPU the project is measured on, computed from counts the emulator gives exactly.
//!
//! `device bytes / 3.0 TB/s + bus bytes / 50 GB/s + peer bytes / 400 GB/s
//!  + synchronisations × 10 µs + launches × 2 µs`
//!
//! It is a model, and labelled "modeled" wherever it is shown; a run on the GPU shows the
//! measured time beside it. The constants, and where they come from:
//! - [`DEVICE_BYTES_PER_S`]: a device-to-device copy on an H200 moves about 4.3 TB/s, reads plus
//!   writes (`../shared/GPU.md`, measured on the project's machine); a good streaming kernel
//!   reaches about 70% of that.
//! - [`BUS_BYTES_PER_S`]: PCIe 5 moves about 55 GB/s host to device from pinned memory
//!   (`../shared/GPU.md`); 50 GB/s allows for the smaller copies a query makes.
//! - [`PEER_BYTES_PER_S`]: a copy between two GPUs over NVLink; 400 GB/s, the figure the
//!   project plans with for one direction between two H200s of an HGX board (NVLink 4 gives
//!   900 GB/s both ways in all; a copy reaches less). A query over several devices is modeled
//!   device by device, each device's own counts, and takes as long as the slowest.
//! - [`SYNC_SECONDS`]: a host synchronisation (`cudaStreamSynchronize` on a stream with work,
//!   or a readback's round trip) costs about 10 µs of latency, by published measurements of
//!   CUDA's host-device round trip.
//! - [`LAUNCH_SECONDS`]: a kernel launch costs about 2 µs of host-side overhead and issue latency
//!   (NVIDIA's published launch latencies are 2–5 µs).
//!
//! Device bytes are the roofline's: what the GPU operators' kernels must read and write (see
//! [`crate::exec::roofline`]).

use std::time::Duration;

/// Device memory bandwidth a good kernel reaches on an H200, bytes per second.
pub const DEVICE_BYTES_PER_S: f64 = 3.0e12;
/// Host↔device bandwidth over PCIe 5 from pinned memory, bytes per second.
pub const BUS_BYTES_PER_S: f64 = 50.0e9;
/// Device↔device bandwidth over NVLink, one direction, bytes per second.
pub const PEER_BYTES_PER_S: f64 = 400.0e9;
/// Latency of one host synchronisation, seconds.
pub const SYNC_SECONDS: f64 = 10.0e-6;
/// Cost of one kernel launch, seconds.
pub const LAUNCH_SECONDS: f64 = 2.0e-6;

/// What a query moved and called, the inputs of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelInputs {
    /// Bytes the GPU operators read and wrote in device memory.
    pub device_bytes: u64,
    /// Bytes over the bus, both ways.
    pub bus_bytes: u64,
    /// Bytes copied in from other devices (peer copies).
    pub peer_bytes: u64,
    /// Host synchronisations.
    pub host_syncs: u64,
    /// Kernel launches.
    pub launches: u64,
}

impl ModelInputs {
    /// The modeled H200 time (see the module docs).
    pub fn modeled_h200(&self) -> Duration {
        let seconds = self.device_bytes as f64 / DEVICE_BYTES_PER_S
            + self.bus_bytes as f64 / BUS_BYTES_PER_S
            + self.peer_bytes as f64 / PEER_BYTES_PER_S
            + self.host_syncs as f64 * SYNC_SECONDS
            + self.launches as f64 * LAUNCH_SECONDS;
        Duration::from_secs_f64(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_term_costs_what_the_constants_say() {
        let ms = |inputs: ModelInputs| inputs.modeled_h200().as_secs_f64() * 1e3;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(ms(ModelInputs::default()), 0.0));
        // 3 GB in device memory: 1 ms.
        assert!(close(
            ms(ModelInputs {
                device_bytes: 3_000_000_000,
                ..Default::default()
            }),
            1.0
        ));
        // 50 MB over the bus: 1 ms.
        assert!(close(
            ms(ModelInputs {
                bus_bytes: 50_000_000,
                ..Default::default()
            }),
            1.0
        ));
        // 400 MB from another device: 1 ms.
        assert!(close(
            ms(ModelInputs {
                peer_bytes: 400_000_000,
                ..Default::default()
            }),
            1.0
        ));
        // 100 synchronisations and 500 launches: 1 ms each.
        assert!(close(
            ms(ModelInputs {
                host_syncs: 100,
                launches: 500,
                ..Default::default()
            }),
            2.0
        ));
    }
}
