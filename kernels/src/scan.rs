//! Prefix sums of u32 and u64 columns: `kernels/cuda/scan/prefix_sum.cu`.
//!
//! Reduce-then-scan over tiles of [`TILE`] values: sum each tile, scan the tile sums (with this
//! same routine, recursively), then scan each tile from its offset. Sums wrap like unsigned
//! integer arithmetic. Output order is input order; no nulls.

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig, TILE};
use crate::memory::{DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::stream::Stream;

/// Element types the scan kernels support.
pub trait ScanElem: DeviceCopy + Default + sealed::Sealed {
    #[doc(hidden)]
    const TILE_SUMS: &'static str;
    #[doc(hidden)]
    const SCAN_TILES: &'static str;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

impl ScanElem for u32 {
    const TILE_SUMS: &'static str = "scan_tile_sums_u32";
    const SCAN_TILES: &'static str = "scan_tiles_u32";
}

impl ScanElem for u64 {
    const TILE_SUMS: &'static str = "scan_tile_sums_u64";
    const SCAN_TILES: &'static str = "scan_tiles_u64";
}

/// Exclusive prefix sum: `out[i] = in[0] + ... + in[i - 1]`, `out[0] = 0`.
pub fn exclusive_sum<T: ScanElem>(
    stream: &Stream,
    input: DeviceSlice<'_, T>,
) -> Result<DeviceBuffer<T>> {
    let out = stream.alloc::<T>(input.len())?;
    scan_raw::<T>(
        stream,
        input.address(),
        input.len(),
        out.address(),
        false,
        None,
    )?;
    Ok(out)
}

/// Inclusive prefix sum: `out[i] = in[0] + ... + in[i]`.
pub fn inclusive_sum<T: ScanElem>(
    stream: &Stream,
    input: DeviceSlice<'_, T>,
) -> Result<DeviceBuffer<T>> {
    let out = stream.alloc::<T>(input.len())?;
    scan_raw::<T>(
        stream,
        input.address(),
        input.len(),
        out.address(),
        true,
        None,
    )?;
    Ok(out)
}

/// Exclusive prefix sum in place.
pub fn exclusive_sum_in_place<T: ScanElem>(
    stream: &Stream,
    data: &mut DeviceBuffer<T>,
) -> Result<()> {
    scan_raw::<T>(
        stream,
        data.address(),
        data.len(),
        data.address(),
        false,
        None,
    )
}

/// Exclusive prefix sum of `input`, plus the total: the scan writes it to the device, and one
/// readback brings it to the host (so this waits for the stream). Compaction and string
/// gathers use the total to size their output.
pub fn exclusive_sum_with_total<T: ScanElem>(
    stream: &Stream,
    input: DeviceSlice<'_, T>,
) -> Result<(DeviceBuffer<T>, T)> {
    let out = stream.alloc::<T>(input.len())?;
    if input.is_empty() {
        return Ok((out, T::default()));
    }
    let total = stream.alloc::<T>(1)?;
    scan_raw::<T>(
        stream,
        input.address(),
        input.len(),
        out.address(),
        false,
        Some(total.as_slice()),
    )?;
    let total = stream.to_vec(&total)?[0];
    Ok((out, total))
}

/// Exclusive prefix sum of `input`, its total written to `total` (one value) on the device:
/// nothing waits. For callers that read several totals back in one transfer.
pub fn exclusive_sum_total_on_device<T: ScanElem>(
    stream: &Stream,
    input: DeviceSlice<'_, T>,
    total: DeviceSlice<'_, T>,
) -> Result<DeviceBuffer<T>> {
    ensure_arg!(
        total.len() == 1,
        "a scan total of {} values, not one",
        total.len()
    );
    // An empty scan launches nothing, so it would leave `total` unwritten.
    ensure_arg!(
        !input.is_empty(),
        "a scan of no values with its total on the device"
    );
    let out = stream.alloc::<T>(input.len())?;
    scan_raw::<T>(
        stream,
        input.address(),
        input.len(),
        out.address(),
        false,
        Some(total),
    )?;
    Ok(out)
}

/// Scans `n` values at `input` into `output` (which may equal `input`), and writes the sum of
/// all of them to `total` when given.
pub(crate) fn scan_raw<T: ScanElem>(
    stream: &Stream,
    input: u64,
    n: usize,
    output: u64,
    inclusive: bool,
    total: Option<DeviceSlice<'_, T>>,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let device = stream.device();
    let tiles = n.div_ceil(TILE);
    let scan_tiles = device.kernel(T::SCAN_TILES)?;
    let offsets = if tiles > 1 {
        let sums = stream.alloc::<T>(tiles)?;
        let tile_sums = device.kernel(T::TILE_SUMS)?;
        // SAFETY: `input` holds `n` values of T; `sums` holds one value per tile.
        unsafe {
            stream.launch(
                &tile_sums,
                LaunchConfig::tiles(tiles)?,
                &[
                    KernelArg::Ptr(input),
                    KernelArg::U64(n as u64),
                    (&sums).into(),
                ],
            )?;
        }
        scan_raw::<T>(stream, sums.address(), tiles, sums.address(), false, None)?;
        Some(sums)
    } else {
        None
    };
    // SAFETY: `input` and `output` hold `n` values; `offsets` one per tile (or null for one tile);
    // `total` one value (or null).
    unsafe {
        stream.launch(
            &scan_tiles,
            LaunchConfig::tiles(tiles)?,
            &[
                KernelArg::Ptr(input),
                KernelArg::U64(n as u64),
                offsets.as_ref().into(),
                KernelArg::Ptr(output),
                KernelArg::U32(u32::from(inclusive)),
                total.map_or_else(KernelArg::null, KernelArg::from),
            ],
        )?;
    }
    // `offsets` is freed on the stream after the launch that reads it (stream-ordered).
    drop(offsets);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::selftest::{SIZES, test_device};

    fn check<T: ScanElem + std::fmt::Debug + PartialEq>(
        values: &dyn Fn(usize) -> Vec<T>,
        cpu: &dyn Fn(&[T], bool) -> Vec<T>,
    ) {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let host = values(n);
            let input = stream.from_host(&host).unwrap();
            let ex = stream
                .to_vec(&exclusive_sum(&stream, input.as_slice()).unwrap())
                .unwrap();
            assert_eq!(ex, cpu(&host, false), "exclusive n={n}");
            let inc = stream
                .to_vec(&inclusive_sum(&stream, input.as_slice()).unwrap())
                .unwrap();
            assert_eq!(inc, cpu(&host, true), "inclusive n={n}");
        }
    }

    #[test]
    fn u32_matches_cpu_at_edge_sizes() {
        check::<u32>(
            &|n| reference::random_u32(n, 1, 1 << 20),
            &reference::prefix_sum_u32,
        );
    }

    #[test]
    fn u64_matches_cpu_at_edge_sizes_and_wraps() {
        check::<u64>(&|n| reference::random_u64(n, 2), &reference::prefix_sum_u64);
    }

    #[test]
    fn in_place_and_total() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let host = reference::random_u32(5000, 3, 1000);
        let mut buf = stream.from_host(&host).unwrap();
        exclusive_sum_in_place(&stream, &mut buf).unwrap();
        assert_eq!(
            stream.to_vec(&buf).unwrap(),
            reference::prefix_sum_u32(&host, false)
        );
        for &n in SIZES {
            let host = reference::random_u64(n, 4);
            let input = stream.from_host(&host).unwrap();
            let scope = std::sync::Arc::new(crate::Counters::default());
            let (out, total) = crate::counters::in_scope(&scope, || {
                exclusive_sum_with_total(&stream, input.as_slice()).unwrap()
            });
            assert_eq!(
                total,
                host.iter().fold(0u64, |a, &b| a.wrapping_add(b)),
                "n={n}"
            );
            // The total comes back in one readback.
            assert_eq!(scope.snapshot().host_syncs, u64::from(n > 0), "n={n}");
            assert_eq!(
                stream.to_vec(&out).unwrap(),
                reference::prefix_sum_u64(&host, false),
                "n={n}"
            );
        }
    }

    #[test]
    fn totals_stay_on_the_device_until_read_together() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let totals = stream.alloc::<u64>(3).unwrap();
        let inputs: Vec<Vec<u64>> = [1, 4097, 70_000]
            .iter()
            .enumerate()
            .map(|(i, &n)| reference::random_u64(n, i as u64 + 5))
            .collect();
        let scope = std::sync::Arc::new(crate::Counters::default());
        let outs: Vec<_> = crate::counters::in_scope(&scope, || {
            inputs
                .iter()
                .enumerate()
                .map(|(i, host)| {
                    let input = stream.from_host(host).unwrap();
                    let total = totals.slice(i..i + 1).unwrap();
                    exclusive_sum_total_on_device(&stream, input.as_slice(), total).unwrap()
                })
                .collect()
        });
        assert_eq!(scope.snapshot().host_syncs, 0, "nothing waits");
        let got = stream.to_vec(&totals).unwrap();
        for ((host, out), total) in inputs.iter().zip(&outs).zip(got) {
            assert_eq!(total, host.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
            assert_eq!(
                stream.to_vec(out).unwrap(),
                reference::prefix_sum_u64(host, false)
            );
        }
        // No values would leave the total unwritten, and the total is one value.
        let empty = stream.alloc::<u64>(0).unwrap();
        assert!(
            exclusive_sum_total_on_device(&stream, empty.as_slice(), totals.slice(..1).unwrap())
                .is_err()
        );
        let one = stream.from_host(&[1u64]).unwrap();
        assert!(exclusive_sum_total_on_device(&stream, one.as_slice(), totals.as_slice()).is_err());
    }

    #[test]
    fn slices_scan_only_their_range() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let host: Vec<u64> = (1..=100).collect();
        let buf = stream.from_host(&host).unwrap();
        let out = exclusive_sum(&stream, buf.slice(10..20).unwrap()).unwrap();
        assert_eq!(
            stream.to_vec(&out).unwrap(),
            reference::prefix_sum_u64(&host[10..20], false)
        );
    }
}
