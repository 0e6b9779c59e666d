//! Bandwidth measurements of the primitives, for `spate selftest --bench` and the GPU check.
//!
//! Each measurement times one operation with stream events after a warm-up run, takes the
//! median of several runs, and reports the bytes the operation must move at least, so that
//! GB/s can be compared with the device's copy bandwidth (the first measurement). On the
//! emulator the numbers only describe the emulator; they are labelled with the backend.

use crate::compact::{self, Mask};
use crate::device::Device;
use crate::error::Result;
use crate::hash::{self, HashColumn};
use crate::memory::DeviceBitmap;
use crate::reference;
use crate::sort;
use crate::stream::Stream;

/// One measured operation.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// What ran, e.g. `compact i64 keep=50%`.
    pub name: String,
    /// Input rows.
    pub rows: usize,
    /// Bytes the operation reads and writes at least.
    pub bytes: u64,
    /// Median time over the runs, in milliseconds.
    pub median_ms: f64,
}

impl Measurement {
    /// Achieved bandwidth in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / (self.median_ms / 1000.0) / 1e9
    }

    /// Rows (keys) per second, in billions.
    pub fn g_rows_per_s(&self) -> f64 {
        self.rows as f64 / (self.median_ms / 1000.0) / 1e9
    }
}

fn time(stream: &Stream, runs: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    op()?; // warm-up: kernel loading, pool growth
    stream.synchronize()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let start = stream.record_event()?;
        op()?;
        let end = stream.record_event()?;
        times.push(f64::from(start.elapsed_ms(&end)?));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The device's memory bandwidth: the median of `runs` device-to-device copies of `bytes`
/// bytes (rounded down to whole u64 values), counting each byte read and each byte written.
///
/// This is the "measured bandwidth" that roofline floors are computed against: a copy is the
/// fastest any kernel can stream memory, so `bytes touched / bandwidth` is a lower bound on a
/// memory-bound operator's time.
pub fn copy_bandwidth(device: &Device, bytes: usize, runs: usize) -> Result<Measurement> {
    let stream = device.new_stream()?;
    let rows = (bytes / 8).max(1);
    // The values do not matter to a copy; zeroed memory avoids generating them on the host.
    let values = stream.alloc_zeroed::<u64>(rows)?;
    copy_u64(&stream, &values, runs)
}

fn copy_u64(
    stream: &Stream,
    values: &crate::memory::DeviceBuffer<u64>,
    runs: usize,
) -> Result<Measurement> {
    let rows = values.len();
    let mut copy = stream.alloc::<u64>(rows)?;
    let ms = time(stream, runs, || {
        stream.copy_device(values.as_slice(), &mut copy, 0)
    })?;
    Ok(Measurement {
        name: "device copy u64".into(),
        rows,
        bytes: 2 * 8 * rows as u64,
        median_ms: ms,
    })
}

/// Measures copy, compaction, hashing and sorting over `rows` rows, `runs` times each.
pub fn measure(device: &Device, rows: usize, runs: usize) -> Result<Vec<Measurement>> {
    let stream = device.new_stream()?;
    let mut out = Vec::new();
    let n = rows as u64;

    let values = stream.from_host(&reference::random_u64(rows, 1))?;
    out.push(copy_u64(&stream, &values, runs)?);

    let mask_bits = stream.from_host(&reference::random_bitmap(rows, 0, 2, 0.5))?;
    let ms = time(&stream, runs, || {
        let mask = Mask::Bits(DeviceBitmap::new(&mask_bits));
        compact::compact_values(&stream, values.as_slice(), mask, None).map(drop)
    })?;
    out.push(Measurement {
        name: "compact u64 by bitmap keep=50%".into(),
        rows,
        // Read the values and the mask twice (count, then write), write half the values.
        bytes: 8 * n + 2 * n / 8 + 4 * n,
        median_ms: ms,
    });

    let ms = time(&stream, runs, || {
        hash::hash_columns(&stream, &[HashColumn::fixed(values.as_slice(), None)], 0).map(drop)
    })?;
    out.push(Measurement {
        name: "hash u64".into(),
        rows,
        bytes: 16 * n,
        median_ms: ms,
    });

    let keys = stream.from_host(&reference::random_u32(rows, 3, u32::MAX))?;
    let ms = time(&stream, runs, || {
        sort::sort_pairs(&stream, keys.as_slice(), None, 32).map(drop)
    })?;
    out.push(Measurement {
        name: "radix sort u32 keys + u32 indices".into(),
        rows,
        // Four passes, each reading keys twice and indices once, writing both.
        bytes: 4 * (3 * 4 * n + 2 * 4 * n),
        median_ms: ms,
    });
    Ok(out)
}
