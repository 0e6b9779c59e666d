//! Stable LSD radix sort of (key, row index) pairs: `kernels/cuda/sort/radix_sort.cu`.
//!
//! Keys are u32 or u64; [`sort_keys`] turns a column of signed integers or floats (or unsigned,
//! optionally descending) into keys whose unsigned order is the column's SQL order. Floats use
//! IEEE total order (`-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN`), which is how
//! Arrow's sort kernels, and so DataFusion, order them. Nulls are not keys: the sort operator
//! places them first or last by partitioning the rows before sorting.
//!
//! Multi-column sorts are successive stable sorts from the least significant column to the
//! most significant, passing each pass's row indices (gathered keys) to the next.

use crate::error::{Result, ensure_arg};
use crate::gather::{DeviceStrings, OffsetElem};
use crate::launch::{KernelArg, LaunchConfig, TILE};
use crate::memory::{DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::scan;
use crate::stream::Stream;

/// Radix key types.
pub trait RadixKey: DeviceCopy + Default {
    /// Bits in the key (passes = BITS / 8).
    const BITS: u32;
    #[doc(hidden)]
    const HISTOGRAM: &'static str;
    #[doc(hidden)]
    const SCATTER: &'static str;
}

impl RadixKey for u32 {
    const BITS: u32 = 32;
    const HISTOGRAM: &'static str = "radix_histogram_u32";
    const SCATTER: &'static str = "radix_scatter_u32";
}

impl RadixKey for u64 {
    const BITS: u32 = 64;
    const HISTOGRAM: &'static str = "radix_histogram_u64";
    const SCATTER: &'static str = "radix_scatter_u64";
}

/// Column types with a key transform, and the key type each maps to.
pub trait SortKeySource: DeviceCopy {
    /// The radix key type.
    type Key: RadixKey;
    #[doc(hidden)]
    const ENTRY: &'static str;
}

macro_rules! key_source {
    ($($t:ty => $k:ty, $entry:literal);*) => { $(
        impl SortKeySource for $t {
            type Key = $k;
            const ENTRY: &'static str = $entry;
        }
    )* };
}
key_source!(
    i8 => u32, "radix_key_i8";
    i16 => u32, "radix_key_i16";
    u8 => u32, "radix_key_u8";
    u16 => u32, "radix_key_u16";
    i32 => u32, "radix_key_i32";
    u32 => u32, "radix_key_u32";
    f32 => u32, "radix_key_f32";
    i64 => u64, "radix_key_i64";
    u64 => u64, "radix_key_u64";
    f64 => u64, "radix_key_f64"
);

/// Radix keys for `values` in ascending or descending order.
pub fn sort_keys<T: SortKeySource>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    descending: bool,
) -> Result<DeviceBuffer<T::Key>> {
    let n = values.len();
    let out = stream.alloc::<T::Key>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel(T::ENTRY)?;
    // SAFETY: `values` and `out` hold n elements of the kernel's types.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(stream.device().grid_stride_blocks(n)),
            &[
                values.into(),
                KernelArg::U64(n as u64),
                KernelArg::U32(u32::from(descending)),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// Ranks that place NULL rows first (`nulls_first`) or last when sorted on, stably, after the
/// column's values: 0 for the rows that go first.
pub fn null_ranks(
    stream: &Stream,
    validity: crate::memory::DeviceBitmap<'_>,
    n: usize,
    nulls_first: bool,
) -> Result<DeviceBuffer<u32>> {
    validity.check_covers(n, "validity")?;
    let out = stream.alloc::<u32>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel("null_ranks")?;
    // SAFETY: the bitmap covers `n` rows (checked); `out` holds `n` ranks.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(stream.device().grid_stride_blocks(n)),
            &[
                validity.bytes.into(),
                KernelArg::U64(validity.offset as u64),
                KernelArg::U64(n as u64),
                KernelArg::U32(u32::from(nulls_first)),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// Radix keys of one 64-bit word of Decimal128 (i128) values: sort stably by the low word's
/// keys (`high = false`), then by the high word's (`high = true`), for 128-bit signed order.
pub fn decimal_sort_keys(
    stream: &Stream,
    values: DeviceSlice<'_, i128>,
    descending: bool,
    high: bool,
) -> Result<DeviceBuffer<u64>> {
    let n = values.len();
    let out = stream.alloc::<u64>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel("radix_key_i128")?;
    // SAFETY: `values` holds n 16-byte values and `out` n keys.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(stream.device().grid_stride_blocks(n)),
            &[
                values.into(),
                KernelArg::U64(n as u64),
                KernelArg::U32(u32::from(descending)),
                KernelArg::U32(u32::from(high)),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// Sorted keys and the row indices that moved with them.
#[derive(Debug)]
pub struct SortedPairs<K: DeviceCopy> {
    /// Keys in ascending unsigned order.
    pub keys: DeviceBuffer<K>,
    /// `values[i]`: the row index that came with `keys[i]`.
    pub values: DeviceBuffer<u32>,
}

/// Stable sort of `keys` with their row indices. `values` gives the indices (e.g. the previous
/// pass of a multi-column sort); `None` uses `0..n`. Only the low `key_bits` bits are sorted
/// (rounded up to whole 8-bit digits); pass `K::BITS` for all.
pub fn sort_pairs<K: RadixKey>(
    stream: &Stream,
    keys: DeviceSlice<'_, K>,
    values: Option<DeviceSlice<'_, u32>>,
    key_bits: u32,
) -> Result<SortedPairs<K>> {
    let n = keys.len();
    ensure_arg!(
        n < u32::MAX as usize,
        "{n} rows exceed a device batch's limit of 2^32 - 1"
    );
    if let Some(v) = values {
        ensure_arg!(
            v.len() == n,
            "sort of {n} keys with {} row indices",
            v.len()
        );
    }
    ensure_arg!(
        key_bits <= K::BITS,
        "{key_bits} key bits for a {}-bit key",
        K::BITS
    );
    let device = stream.device();
    let tiles = n.div_ceil(TILE).max(1);
    let passes = key_bits.div_ceil(8);
    let mut keys_a = stream.alloc::<K>(n)?;
    let mut vals_a = stream.alloc::<u32>(n)?;
    if n == 0 {
        return Ok(SortedPairs {
            keys: keys_a,
            values: vals_a,
        });
    }
    let mut keys_b = stream.alloc::<K>(n)?;
    let mut vals_b = stream.alloc::<u32>(n)?;
    let mut hist = stream.alloc::<u32>(256 * tiles)?;
    let histogram = device.kernel(K::HISTOGRAM)?;
    let scatter = device.kernel(K::SCATTER)?;
    // The first pass reads the caller's buffers; later passes ping-pong between a and b.
    let mut src_keys = keys.address();
    let mut src_vals = values.map_or(0, |v| v.address());
    if passes == 0 {
        stream.copy_device(keys, &mut keys_a, 0)?;
        match values {
            Some(v) => stream.copy_device(v, &mut vals_a, 0)?,
            None => {
                let iota: Vec<u32> = (0..n as u32).collect();
                stream.copy_from_host(&iota, &mut vals_a, 0)?;
            }
        }
        return Ok(SortedPairs {
            keys: keys_a,
            values: vals_a,
        });
    }
    for pass in 0..passes {
        let shift = pass * 8;
        let (dst_keys, dst_vals) = if pass % 2 == 0 {
            (&mut keys_a, &mut vals_a)
        } else {
            (&mut keys_b, &mut vals_b)
        };
        // SAFETY: the source holds n keys (and n indices, or null for 0..n); `hist` holds
        // 256 counts per tile; the destination holds n of each and does not alias the source.
        unsafe {
            stream.launch(
                &histogram,
                LaunchConfig::tiles(tiles)?,
                &[
                    KernelArg::Ptr(src_keys),
                    KernelArg::U64(n as u64),
                    KernelArg::U32(shift),
                    KernelArg::U32(tiles as u32),
                    (&hist).into(),
                ],
            )?;
        }
        scan::exclusive_sum_in_place(stream, &mut hist)?;
        unsafe {
            stream.launch(
                &scatter,
                LaunchConfig::tiles(tiles)?,
                &[
                    KernelArg::Ptr(src_keys),
                    KernelArg::Ptr(src_vals),
                    KernelArg::U64(n as u64),
                    KernelArg::U32(shift),
                    KernelArg::U32(tiles as u32),
                    (&hist).into(),
                    (&*dst_keys).into(),
                    (&*dst_vals).into(),
                ],
            )?;
        }
        src_keys = dst_keys.address();
        src_vals = dst_vals.address();
    }
    Ok(if passes % 2 == 1 {
        SortedPairs {
            keys: keys_a,
            values: vals_a,
        }
    } else {
        SortedPairs {
            keys: keys_b,
            values: vals_b,
        }
    })
}

/// The permutation that sorts `values` (stable): `result[i]` is the row at position `i`.
pub fn argsort<T: SortKeySource>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    descending: bool,
) -> Result<DeviceBuffer<u32>> {
    let keys = sort_keys(stream, values, descending)?;
    Ok(sort_pairs(stream, keys.as_slice(), None, T::Key::BITS)?.values)
}

/// Radix keys of strings (`radix_key_string_*`) in byte-wise order: the length key when
/// `chunk` is `None`, else the key of bytes `[8 * chunk, 8 * chunk + 8)`. Sorting stably on the
/// length key and then on chunks from the last to the first orders the strings.
pub fn string_sort_keys<O: OffsetElem>(
    stream: &Stream,
    strings: DeviceStrings<'_, O>,
    chunk: Option<usize>,
    descending: bool,
) -> Result<DeviceBuffer<u64>> {
    let n = strings.rows();
    let out = stream.alloc::<u64>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream
        .device()
        .kernel(&format!("radix_key_string_{}", O::SUFFIX))?;
    // SAFETY: `strings` has n + 1 offsets into its bytes and `out` holds n keys.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(stream.device().grid_stride_blocks(n)),
            &[
                strings.offsets.into(),
                strings.bytes.into(),
                KernelArg::U64(n as u64),
                KernelArg::U64(chunk.unwrap_or(0) as u64),
                KernelArg::U32(u32::from(chunk.is_none())),
                KernelArg::U32(u32::from(descending)),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// The longest string's length in bytes (0 for no rows). Waits for the stream.
pub fn string_max_len<O: OffsetElem>(
    stream: &Stream,
    strings: DeviceStrings<'_, O>,
) -> Result<u64> {
    let lengths = string_sort_keys(stream, strings, None, false)?;
    let max = crate::reduce::max(stream, lengths.as_slice(), None)?;
    Ok(if max.count == 0 { 0 } else { max.value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self, order_key_f32, order_key_f64};
    use crate::selftest::{SIZES, test_device};

    fn expect_stable<T: Copy>(values: &[T], key: impl Fn(T) -> u64) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..values.len() as u32).collect();
        idx.sort_by_key(|i| key(values[*i as usize])); // stable
        idx
    }

    #[test]
    fn string_keys_give_byte_order() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let mut r = reference::Rng::new(91);
        for &n in SIZES {
            // Short strings over a tiny alphabet (with NUL and a byte above 0x7f): many ties
            // on the first 8 bytes and strings that are prefixes of others.
            let strings: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    (0..r.below(20))
                        .map(|_| [0u8, b'a', b'b', 0xc3][r.below(4) as usize])
                        .collect()
                })
                .collect();
            let mut offsets = vec![0i32];
            let mut bytes: Vec<u8> = Vec::new();
            for s in &strings {
                bytes.extend_from_slice(s);
                offsets.push(bytes.len() as i32);
            }
            let offsets = stream.from_host(&offsets).unwrap();
            // A device buffer of at least one byte, even when every string is empty.
            bytes.push(0);
            let bytes_dev = stream.from_host(&bytes).unwrap();
            let view = DeviceStrings {
                offsets: offsets.as_slice(),
                bytes: bytes_dev.as_slice(),
            };
            let max = string_max_len(&stream, view).unwrap();
            assert_eq!(max, strings.iter().map(Vec::len).max().unwrap_or(0) as u64);
            for descending in [false, true] {
                let mut perm: Option<DeviceBuffer<u32>> = None;
                let chunks = (max as usize).div_ceil(8);
                for chunk in std::iter::once(None).chain((0..chunks).rev().map(Some)) {
                    let keys = string_sort_keys(&stream, view, chunk, descending).unwrap();
                    let keys = match &perm {
                        Some(p) => {
                            crate::gather::gather(&stream, keys.as_slice(), p.as_slice()).unwrap()
                        }
                        None => keys,
                    };
                    let sorted = sort_pairs(
                        &stream,
                        keys.as_slice(),
                        perm.as_ref().map(|p| p.as_slice()),
                        64,
                    )
                    .unwrap();
                    perm = Some(sorted.values);
                }
                let got: Vec<u32> = match &perm {
                    Some(p) => stream.to_vec(p).unwrap(),
                    None => (0..n as u32).collect(),
                };
                let mut want: Vec<u32> = (0..n as u32).collect();
                want.sort_by(|a, b| {
                    let o = strings[*a as usize].cmp(&strings[*b as usize]);
                    if descending { o.reverse() } else { o }
                });
                let as_strings = |idx: &[u32]| -> Vec<&[u8]> {
                    idx.iter()
                        .map(|i| strings[*i as usize].as_slice())
                        .collect()
                };
                assert_eq!(
                    as_strings(&got),
                    as_strings(&want),
                    "n={n} desc={descending}"
                );
            }
        }
    }

    #[test]
    fn u32_pairs_sort_stably_with_many_duplicates() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let keys = reference::random_u32(n, n as u64, 50);
            let d = stream.from_host(&keys).unwrap();
            let sorted = sort_pairs(&stream, d.as_slice(), None, 32).unwrap();
            let got = stream.to_vec(&sorted.values).unwrap();
            assert_eq!(got, expect_stable(&keys, u64::from), "n={n}");
            let mut want_keys = keys.clone();
            want_keys.sort();
            assert_eq!(stream.to_vec(&sorted.keys).unwrap(), want_keys);
        }
    }

    #[test]
    fn u64_pairs_with_given_indices() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let n = 7000;
        let keys = reference::random_u64(n, 3);
        let vals: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
        let dk = stream.from_host(&keys).unwrap();
        let dv = stream.from_host(&vals).unwrap();
        let sorted = sort_pairs(&stream, dk.as_slice(), Some(dv.as_slice()), 64).unwrap();
        let order = expect_stable(&keys, |k| k);
        let want: Vec<u32> = order.iter().map(|i| vals[*i as usize]).collect();
        assert_eq!(stream.to_vec(&sorted.values).unwrap(), want);
    }

    #[test]
    fn signed_float_and_descending_orders() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let i = reference::random_i32(n, 1);
            let d = stream.from_host(&i).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), false).unwrap())
                .unwrap();
            assert_eq!(
                got,
                expect_stable(&i, |v| (v as i64 - i64::from(i32::MIN)) as u64)
            );
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), true).unwrap())
                .unwrap();
            assert_eq!(
                got,
                expect_stable(&i, |v| (i64::from(i32::MAX) - v as i64) as u64)
            );

            let l = reference::random_i64(n, 2);
            let d = stream.from_host(&l).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), false).unwrap())
                .unwrap();
            assert_eq!(got, expect_stable(&l, |v| (v as u64) ^ (1 << 63)));

            let f = reference::random_f64(n, 3);
            let d = stream.from_host(&f).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), false).unwrap())
                .unwrap();
            assert_eq!(got, expect_stable(&f, order_key_f64));
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), true).unwrap())
                .unwrap();
            assert_eq!(got, expect_stable(&f, |v| !order_key_f64(v)));

            let g = reference::random_f32(n, 4);
            let d = stream.from_host(&g).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), false).unwrap())
                .unwrap();
            assert_eq!(got, expect_stable(&g, |v| u64::from(order_key_f32(v))));

            let u = reference::random_u64(n, 5);
            let d = stream.from_host(&u).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), true).unwrap())
                .unwrap();
            assert_eq!(got, expect_stable(&u, |v| !v));
        }
    }

    #[test]
    fn small_integer_and_decimal_orders() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let wide = reference::random_i64(n, 21);
            let small: Vec<i16> = wide.iter().map(|v| *v as i16).collect();
            let d = stream.from_host(&small).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), true).unwrap())
                .unwrap();
            assert_eq!(
                got,
                expect_stable(&small, |v| (i64::from(i16::MAX) - i64::from(v)) as u64)
            );
            let bytes: Vec<u8> = wide.iter().map(|v| *v as u8).collect();
            let d = stream.from_host(&bytes).unwrap();
            let got = stream
                .to_vec(&argsort(&stream, d.as_slice(), false).unwrap())
                .unwrap();
            assert_eq!(got, expect_stable(&bytes, u64::from));

            let decimals: Vec<i128> = wide
                .iter()
                .enumerate()
                .map(|(i, v)| i128::from(*v).wrapping_mul(if i % 3 == 0 { 1 << 50 } else { 1 }))
                .collect();
            let d = stream.from_host(&decimals).unwrap();
            for descending in [false, true] {
                let lo = decimal_sort_keys(&stream, d.as_slice(), descending, false).unwrap();
                let by_lo = sort_pairs(&stream, lo.as_slice(), None, 64).unwrap();
                let hi = decimal_sort_keys(&stream, d.as_slice(), descending, true).unwrap();
                let hi =
                    crate::gather::gather(&stream, hi.as_slice(), by_lo.values.as_slice()).unwrap();
                let order =
                    sort_pairs(&stream, hi.as_slice(), Some(by_lo.values.as_slice()), 64).unwrap();
                let got = stream.to_vec(&order.values).unwrap();
                let mut want: Vec<u32> = (0..n as u32).collect();
                want.sort_by(|a, b| {
                    let (x, y) = (decimals[*a as usize], decimals[*b as usize]);
                    if descending { y.cmp(&x) } else { x.cmp(&y) }
                });
                assert_eq!(got, want, "n={n} descending={descending}");
            }
        }
    }

    #[test]
    fn null_ranks_place_nulls_first_or_last() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let valid = reference::random_bitmap(n, 3, n as u64, 0.6);
            let d = stream.from_host(&valid).unwrap();
            let bitmap = crate::memory::DeviceBitmap::new(&d).with_offset(3);
            for nulls_first in [true, false] {
                let ranks = stream
                    .to_vec(&null_ranks(&stream, bitmap, n, nulls_first).unwrap())
                    .unwrap();
                for (i, r) in ranks.iter().enumerate() {
                    let is_null = !reference::bit(Some(&valid), 3, i);
                    assert_eq!(*r == 0, is_null == nulls_first, "row {i}");
                }
            }
        }
    }

    #[test]
    fn fewer_key_bits_sort_only_low_digits() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let keys: Vec<u32> = (0..3000u32)
            .map(|i| ((i * 7919) % 256) | (i << 8))
            .collect();
        let d = stream.from_host(&keys).unwrap();
        let got = sort_pairs(&stream, d.as_slice(), None, 8).unwrap();
        assert_eq!(
            stream.to_vec(&got.values).unwrap(),
            expect_stable(&keys, |k| u64::from(k & 0xff))
        );
    }
}
