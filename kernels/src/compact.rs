//! Stream compaction: `kernels/cuda/compact/compact.cu`.
//!
//! Keeps the rows whose mask is true, in input order (stable). The mask is a byte per row or an
//! Arrow boolean bitmap (with a bit offset); rows whose mask is NULL are dropped, as SQL's
//! `WHERE` drops them. Batches hold at most `u32::MAX - 1` rows (indices are u32).

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig, TILE};
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::scan;
use crate::stream::Stream;

/// A compaction mask.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// One byte per row; non-zero keeps the row.
    Bytes(DeviceSlice<'a, u8>),
    /// An Arrow boolean bitmap.
    Bits(DeviceBitmap<'a>),
}

impl Mask<'_> {
    fn args(&self) -> [KernelArg; 3] {
        match self {
            Mask::Bytes(b) => [
                KernelArg::Ptr(b.address()),
                KernelArg::U64(0),
                KernelArg::U32(0),
            ],
            Mask::Bits(b) => [
                KernelArg::Ptr(b.bytes.address()),
                KernelArg::U64(b.offset as u64),
                KernelArg::U32(1),
            ],
        }
    }

    fn check(&self, n: usize) -> Result<()> {
        match self {
            Mask::Bytes(b) => {
                ensure_arg!(b.len() >= n, "byte mask of {} rows for {n} rows", b.len());
                Ok(())
            }
            Mask::Bits(b) => b.check_covers(n, "mask"),
        }
    }
}

/// Element widths `compact_values` moves: values are moved by their bytes, so every
/// fixed-width type of a width shares a kernel (i64, u64, f64, Date64 and Timestamp all use 8).
pub trait CompactElem: DeviceCopy {
    #[doc(hidden)]
    const ENTRY: &'static str;
}

macro_rules! compact_elem {
    ($entry:literal: $($t:ty),*) => { $(
        impl CompactElem for $t {
            const ENTRY: &'static str = $entry;
        }
    )* };
}
compact_elem!("compact_values_u8": u8, i8);
compact_elem!("compact_values_u16": u16, i16);
compact_elem!("compact_values_u32": u32, i32, f32);
compact_elem!("compact_values_u64": u64, i64, f64);
compact_elem!("compact_values_u128": u128, i128);

/// The per-tile offsets of the kept rows and their total.
struct Plan {
    tile_offsets: DeviceBuffer<u32>,
    kept: usize,
    tiles: usize,
}

fn plan(
    stream: &Stream,
    mask: Mask<'_>,
    validity: Option<DeviceBitmap<'_>>,
    n: usize,
) -> Result<Plan> {
    let (counts, tiles) = count_tiles(stream, mask, validity, n)?;
    let (tile_offsets, kept) = scan::exclusive_sum_with_total(stream, counts.as_slice())?;
    Ok(Plan {
        tile_offsets,
        kept: kept as usize,
        tiles,
    })
}

/// Per tile of `n` rows, how many it keeps; and the number of tiles.
fn count_tiles(
    stream: &Stream,
    mask: Mask<'_>,
    validity: Option<DeviceBitmap<'_>>,
    n: usize,
) -> Result<(DeviceBuffer<u32>, usize)> {
    mask.check(n)?;
    if let Some(v) = validity {
        v.check_covers(n, "mask validity")?;
    }
    ensure_arg!(
        n < u32::MAX as usize,
        "{n} rows exceed a device batch's limit of 2^32 - 1"
    );
    let tiles = n.div_ceil(TILE);
    let counts = stream.alloc::<u32>(tiles)?;
    let count = stream.device().kernel("compact_count")?;
    let [m, mo, mk] = mask.args();
    // SAFETY: the mask and validity cover `n` rows (checked); `counts` has one slot per tile.
    unsafe {
        stream.launch(
            &count,
            LaunchConfig::tiles(tiles)?,
            &[
                m,
                mo,
                mk,
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                KernelArg::U64(n as u64),
                (&counts).into(),
            ],
        )?;
    }
    Ok((counts, tiles))
}

/// Indices (ascending) of the `n` rows whose mask is true and not NULL.
pub fn select_indices(
    stream: &Stream,
    mask: Mask<'_>,
    validity: Option<DeviceBitmap<'_>>,
    n: usize,
) -> Result<DeviceBuffer<u32>> {
    if n == 0 {
        return stream.alloc(0);
    }
    let p = plan(stream, mask, validity, n)?;
    let out = stream.alloc::<u32>(p.kept)?;
    write_indices(stream, mask, validity, n, p.tiles, &p.tile_offsets, &out)?;
    Ok(out)
}

/// [`select_indices`] without waiting for the kept count: the output has room for all `n`
/// rows, its first `count` elements are the kept indices, and `count` (one u32) receives the
/// kept count on the device. Nothing reads it back, so nothing waits. The elements past the
/// count are not written: a consumer stops at the count (`n` must be at least 1, so that the
/// count is written).
pub fn select_indices_on_device(
    stream: &Stream,
    mask: Mask<'_>,
    validity: Option<DeviceBitmap<'_>>,
    n: usize,
    count: DeviceSlice<'_, u32>,
) -> Result<DeviceBuffer<u32>> {
    ensure_arg!(
        n > 0,
        "an on-device compaction of no rows leaves its count unwritten"
    );
    let (counts, tiles) = count_tiles(stream, mask, validity, n)?;
    let tile_offsets = scan::exclusive_sum_total_on_device(stream, counts.as_slice(), count)?;
    let out = stream.alloc::<u32>(n)?;
    write_indices(stream, mask, validity, n, tiles, &tile_offsets, &out)?;
    Ok(out)
}

/// Writes the kept rows' indices: tile `t`'s from `tile_offsets[t]` on. `out` must hold at
/// least the kept count (checked by the caller's sizing).
fn write_indices(
    stream: &Stream,
    mask: Mask<'_>,
    validity: Option<DeviceBitmap<'_>>,
    n: usize,
    tiles: usize,
    tile_offsets: &DeviceBuffer<u32>,
    out: &DeviceBuffer<u32>,
) -> Result<()> {
    let kernel = stream.device().kernel("compact_indices")?;
    let [m, mo, mk] = mask.args();
    // SAFETY: the mask and validity cover `n` rows (checked by `count_tiles`), the offsets
    // are its scan, and `out` holds the kept count: the scan's total (`select_indices`) or
    // `n` (`select_indices_on_device`).
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::tiles(tiles)?,
            &[
                m,
                mo,
                mk,
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                KernelArg::U64(n as u64),
                tile_offsets.into(),
                out.into(),
            ],
        )?;
    }
    Ok(())
}

/// The values of the rows whose mask is true and not NULL, in order. The values' own validity
/// is compacted with [`crate::gather::gather_bitmap`] and the [`select_indices`] output.
pub fn compact_values<T: CompactElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    mask: Mask<'_>,
    validity: Option<DeviceBitmap<'_>>,
) -> Result<DeviceBuffer<T>> {
    let n = values.len();
    if n == 0 {
        return stream.alloc(0);
    }
    let p = plan(stream, mask, validity, n)?;
    let out = stream.alloc::<T>(p.kept)?;
    let kernel = stream.device().kernel(T::ENTRY)?;
    let [m, mo, mk] = mask.args();
    // SAFETY: as in `select_indices`; `values` holds `n` elements of the kernel's width.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::tiles(p.tiles)?,
            &[
                m,
                mo,
                mk,
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                KernelArg::U64(n as u64),
                (&p.tile_offsets).into(),
                values.into(),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self, bit};
    use crate::selftest::{SIZES, test_device};

    #[test]
    fn indices_by_bitmap_with_offsets_and_nulls() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            for (offset, voffset) in [(0, 0), (3, 5)] {
                let bits = reference::random_bitmap(n, offset, n as u64, 0.5);
                let valid = reference::random_bitmap(n, voffset, n as u64 + 7, 0.8);
                let d_bits = stream.from_host(&bits).unwrap();
                let d_valid = stream.from_host(&valid).unwrap();
                let mask = Mask::Bits(DeviceBitmap::new(&d_bits).with_offset(offset));
                let v = DeviceBitmap::new(&d_valid).with_offset(voffset);
                let got = stream
                    .to_vec(&select_indices(&stream, mask, Some(v), n).unwrap())
                    .unwrap();
                let want = reference::compact_indices(n, |i| {
                    bit(Some(&bits), offset, i) && bit(Some(&valid), voffset, i)
                });
                assert_eq!(got, want, "n={n} offset={offset}");
            }
        }
    }

    #[test]
    fn indices_on_device_leave_the_count_there() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES.iter().filter(|&&n| n > 0) {
            let mut r = reference::Rng::new(n as u64 + 1);
            let mask: Vec<u8> = (0..n).map(|_| u8::from(r.below(4) == 0)).collect();
            let d_mask = stream.from_host(&mask).unwrap();
            let count = stream.alloc::<u32>(1).unwrap();
            let calls = device.counters();
            let out = select_indices_on_device(
                &stream,
                Mask::Bytes(d_mask.as_slice()),
                None,
                n,
                count.as_slice(),
            )
            .unwrap();
            // Nothing waited for the device.
            assert_eq!((device.counters() - calls).host_syncs, 0, "n={n}");
            assert_eq!(out.len(), n);
            let want = reference::compact_indices(n, |i| mask[i] != 0);
            let kept = stream.to_vec(&count).unwrap()[0] as usize;
            assert_eq!(kept, want.len(), "n={n}");
            assert_eq!(stream.to_vec(out.slice(..kept).unwrap()).unwrap(), want);
        }
        let count = stream.alloc::<u32>(1).unwrap();
        let empty = stream.alloc::<u8>(0).unwrap();
        // No rows: the count would never be written.
        assert!(
            select_indices_on_device(
                &stream,
                Mask::Bytes(empty.as_slice()),
                None,
                0,
                count.as_slice()
            )
            .is_err()
        );
    }

    #[test]
    fn values_by_byte_mask_for_every_width() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let mut r = reference::Rng::new(n as u64);
            let mask: Vec<u8> = (0..n).map(|_| (r.below(3) as u8) * 7).collect();
            let d_mask = stream.from_host(&mask).unwrap();
            let keep = |i: usize| mask[i] != 0;
            let want_idx = reference::compact_indices(n, keep);

            let v64 = reference::random_i64(n, 5);
            let d = stream.from_host(&v64).unwrap();
            let got = compact_values(&stream, d.as_slice(), Mask::Bytes(d_mask.as_slice()), None)
                .unwrap();
            assert_eq!(
                stream.to_vec(&got).unwrap(),
                reference::gather(&v64, &want_idx)
            );

            let v8: Vec<i8> = v64.iter().map(|v| *v as i8).collect();
            let d = stream.from_host(&v8).unwrap();
            let got = compact_values(&stream, d.as_slice(), Mask::Bytes(d_mask.as_slice()), None)
                .unwrap();
            assert_eq!(
                stream.to_vec(&got).unwrap(),
                reference::gather(&v8, &want_idx)
            );

            let v16: Vec<u16> = v64.iter().map(|v| *v as u16).collect();
            let d = stream.from_host(&v16).unwrap();
            let got = compact_values(&stream, d.as_slice(), Mask::Bytes(d_mask.as_slice()), None)
                .unwrap();
            assert_eq!(
                stream.to_vec(&got).unwrap(),
                reference::gather(&v16, &want_idx)
            );

            let v32 = reference::random_f32(n, 6);
            let d = stream.from_host(&v32).unwrap();
            let got = compact_values(&stream, d.as_slice(), Mask::Bytes(d_mask.as_slice()), None)
                .unwrap();
            let want: Vec<u32> = reference::gather(&v32, &want_idx)
                .iter()
                .map(|f| f.to_bits())
                .collect();
            let got: Vec<u32> = stream
                .to_vec(&got)
                .unwrap()
                .iter()
                .map(|f| f.to_bits())
                .collect();
            assert_eq!(got, want);

            let v128: Vec<i128> = v64.iter().map(|v| i128::from(*v) << 40 | 0x55).collect();
            let d = stream.from_host(&v128).unwrap();
            let got = compact_values(&stream, d.as_slice(), Mask::Bytes(d_mask.as_slice()), None)
                .unwrap();
            assert_eq!(
                stream.to_vec(&got).unwrap(),
                reference::gather(&v128, &want_idx)
            );
        }
    }

    #[test]
    fn all_kept_and_none_kept() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let n = 5000;
        let ones = stream.from_host(&vec![1u8; n]).unwrap();
        let zeros = stream.alloc_zeroed::<u8>(n).unwrap();
        let all = select_indices(&stream, Mask::Bytes(ones.as_slice()), None, n).unwrap();
        assert_eq!(
            stream.to_vec(&all).unwrap(),
            (0..n as u32).collect::<Vec<_>>()
        );
        let none = select_indices(&stream, Mask::Bytes(zeros.as_slice()), None, n).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn short_mask_is_rejected() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let bits = stream.from_host(&[0xffu8]).unwrap();
        let err =
            select_indices(&stream, Mask::Bits(DeviceBitmap::new(&bits)), None, 9).unwrap_err();
        assert!(err.to_string().contains("fewer than the 9 rows"), "{err}");
    }
}
