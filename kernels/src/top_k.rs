//! Radix select for `ORDER BY … LIMIT k`: `kernels/cuda/sort/top_k.cu`.
//!
//! [`select`] finds a bound on a sort's first key such that the rows whose key is at most the
//! bound hold the first `k` rows of the sort, and are few: it reads the keys' range, then one
//! 256-bin histogram per 8-bit digit, from the highest digit where the keys differ, until the
//! rows up to the chosen digit are at most `enough` (or the digits run out). Each step reads
//! back one small transfer (two keys, or 256 counts); the keys themselves never leave the
//! device. [`mask`] then marks those rows, for a compaction, and only they are sorted.
//!
//! NULL rows take the smallest key when NULLs sort first and the largest when they sort last,
//! so the mapped keys never order two rows against the sort; rows that tie are all kept.

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceSlice};
use crate::sort::RadixKey;
use crate::stream::Stream;

/// Key types the select takes: the radix keys of [`crate::sort`].
pub trait TopKKey: RadixKey + Into<u64> {
    #[doc(hidden)]
    const SUFFIX: &'static str;
    #[doc(hidden)]
    fn arg(value: u64) -> KernelArg;
}

impl TopKKey for u32 {
    const SUFFIX: &'static str = "u32";
    fn arg(value: u64) -> KernelArg {
        KernelArg::U32(value as u32)
    }
}

impl TopKKey for u64 {
    const SUFFIX: &'static str = "u64";
    fn arg(value: u64) -> KernelArg {
        KernelArg::U64(value)
    }
}

/// A sort's first key, one per row.
#[derive(Debug, Clone, Copy)]
pub struct SortKeys<'a, K> {
    /// Radix keys: their unsigned order is the sort's order.
    pub keys: DeviceSlice<'a, K>,
    /// The key column's validity, or `None` when no row is NULL.
    pub validity: Option<DeviceBitmap<'a>>,
    /// Whether NULLs sort first.
    pub nulls_first: bool,
}

impl<K: TopKKey> SortKeys<'_, K> {
    fn args(&self) -> [KernelArg; 5] {
        [
            self.keys.into(),
            self.validity.into(),
            KernelArg::U64(self.validity.map_or(0, |v| v.offset as u64)),
            KernelArg::U32(u32::from(self.nulls_first)),
            KernelArg::U64(self.keys.len() as u64),
        ]
    }

    fn grid(&self, stream: &Stream) -> LaunchConfig {
        LaunchConfig::blocks(stream.device().grid_stride_blocks(self.keys.len()))
    }

    fn check(&self) -> Result<()> {
        if let Some(v) = &self.validity {
            v.check_covers(self.keys.len(), "a top-k key's validity")?;
        }
        Ok(())
    }
}

/// The rows [`select`] keeps: those whose key is at most `bound`, `rows` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// The largest key kept.
    pub bound: u64,
    /// How many rows have a key at most `bound`.
    pub rows: usize,
}

/// A bound that keeps the first `k` rows of the sort by `keys` (and every row tied with them
/// on the key), and at most `enough` rows unless the ties need more. `None` when it would keep
/// every row: `k` is at least the row count, or the keys are all equal.
pub fn select<K: TopKKey>(
    stream: &Stream,
    keys: SortKeys<'_, K>,
    k: usize,
    enough: usize,
) -> Result<Option<Selection>> {
    ensure_arg!(k > 0, "a top-k select of no rows");
    keys.check()?;
    let n = keys.keys.len();
    if n <= k {
        return Ok(None);
    }
    let device = stream.device();
    let range = stream.alloc_zeroed::<K>(2)?;
    let kernel = device.kernel(&format!("top_k_range_{}", K::SUFFIX))?;
    let mut args = keys.args().to_vec();
    args.push((&range).into());
    // SAFETY: `keys` holds n keys, the validity covers them (checked), `range` two zeroed keys.
    unsafe { stream.launch(&kernel, keys.grid(stream), &args)? };
    let range: Vec<u64> = stream.to_vec(&range)?.into_iter().map(Into::into).collect();
    let bits = K::BITS;
    let all_ones = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let (low, high) = (!range[0] & all_ones, range[1]);
    if low >= high {
        return Ok(None);
    }
    // Digits are whole bytes; the first holds the highest bit where the keys differ (every
    // key shares the bits above it with `low`).
    let top = 63 - (low ^ high).leading_zeros();
    let mut shift = top / 8 * 8;
    let mut prefix = low;
    let mut below = 0usize;
    let histogram = device.kernel(&format!("top_k_histogram_{}", K::SUFFIX))?;
    loop {
        let hist = stream.alloc_zeroed::<u32>(256)?;
        let mut args = keys.args().to_vec();
        args.extend([K::arg(prefix), KernelArg::U32(shift), (&hist).into()]);
        // SAFETY: as for the range; `hist` holds 256 zeroed counts.
        unsafe { stream.launch(&histogram, keys.grid(stream), &args)? };
        let hist = stream.to_vec(&hist)?;
        let mut cumulative = below;
        let mut digit = 0u64;
        for (b, count) in hist.iter().enumerate() {
            digit = b as u64;
            if cumulative + *count as usize >= k {
                break;
            }
            cumulative += *count as usize;
        }
        let above = shift + 8;
        let kept_above = if above >= bits {
            0
        } else {
            (prefix >> above) << above
        };
        let start = kept_above | (digit << shift);
        let bound = start | ((1u64 << shift) - 1);
        let rows = cumulative + hist[digit as usize] as usize;
        if rows <= enough || shift == 0 {
            return Ok((rows < n).then_some(Selection { bound, rows }));
        }
        below = cumulative;
        prefix = start;
        shift -= 8;
    }
}

/// One byte per row: 1 where the row's key is at most `bound`.
pub fn mask<K: TopKKey>(
    stream: &Stream,
    keys: SortKeys<'_, K>,
    bound: u64,
) -> Result<DeviceBuffer<u8>> {
    keys.check()?;
    let mask = stream.alloc::<u8>(keys.keys.len())?;
    if keys.keys.is_empty() {
        return Ok(mask);
    }
    let kernel = stream
        .device()
        .kernel(&format!("top_k_mask_{}", K::SUFFIX))?;
    let mut args = keys.args().to_vec();
    args.extend([K::arg(bound), (&mask).into()]);
    // SAFETY: `keys` holds n keys and the validity covers them (checked); `mask` n bytes.
    unsafe { stream.launch(&kernel, keys.grid(stream), &args)? };
    Ok(mask)
}

/// A Decimal128 column's keys for [`select`]: each value clamped to the i64 range, in radix
/// order (reversed when `descending`). Monotone in the value, so the rows the select keeps
/// hold the first of the full 128-bit order; the sort's own decimal keys need two words.
pub fn decimal_keys(
    stream: &Stream,
    values: DeviceSlice<'_, i128>,
    descending: bool,
) -> Result<DeviceBuffer<u64>> {
    let n = values.len();
    let out = stream.alloc::<u64>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel("top_k_decimal_keys")?;
    // SAFETY: `values` holds n 16-byte values and `out` n keys.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::Rng;
    use crate::selftest::{SIZES, test_device};

    /// The CPU's view: each row's mapped key.
    fn mapped<K: Copy + Into<u64>>(
        keys: &[K],
        valid: &[bool],
        nulls_first: bool,
        max: u64,
    ) -> Vec<u64> {
        keys.iter()
            .zip(valid)
            .map(|(k, v)| match (v, nulls_first) {
                (true, _) => (*k).into(),
                (false, true) => 0,
                (false, false) => max,
            })
            .collect()
    }

    fn check<K: TopKKey + Copy>(make: &dyn Fn(&mut Rng) -> K, max: u64) {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let mut rng = Rng::new(11);
        for &n in SIZES {
            for k in [1usize, 3, 100, 5000] {
                for nulls_first in [true, false] {
                    let keys: Vec<K> = (0..n).map(|_| make(&mut rng)).collect();
                    let valid: Vec<bool> = (0..n).map(|_| !rng.chance(0.1)).collect();
                    let bits: Vec<u8> = valid
                        .chunks(8)
                        .map(|c| c.iter().enumerate().map(|(j, v)| u8::from(*v) << j).sum())
                        .collect();
                    let (d_keys, d_bits) = (
                        stream.from_host(&keys).unwrap(),
                        stream.from_host(&bits).unwrap(),
                    );
                    let sort_keys = SortKeys {
                        keys: d_keys.as_slice(),
                        validity: (n > 0).then(|| DeviceBitmap::new(d_bits.as_slice())),
                        nulls_first,
                    };
                    let want = mapped(&keys, &valid, nulls_first, max);
                    let got = select(&stream, sort_keys, k, 64).unwrap();
                    let mut sorted = want.clone();
                    sorted.sort_unstable();
                    let Some(s) = got else {
                        assert!(
                            n <= k || sorted.first() == sorted.last(),
                            "n={n} k={k}: no selection"
                        );
                        continue;
                    };
                    // The bound keeps the k-th key, so the first k rows, and counts right.
                    assert!(sorted[k - 1] <= s.bound, "n={n} k={k}");
                    let kept = want.iter().filter(|v| **v <= s.bound).count();
                    assert_eq!(kept, s.rows, "n={n} k={k}");
                    assert!(s.rows < n);
                    // Few rows, unless the last digit's ties need more.
                    if s.rows > 64.max(k) {
                        let ties = want.iter().filter(|v| **v == sorted[k - 1]).count();
                        assert!(s.rows < k + ties, "n={n} k={k}: {} rows", s.rows);
                    }
                    let m = stream
                        .to_vec(&mask(&stream, sort_keys, s.bound).unwrap())
                        .unwrap();
                    let marked: Vec<bool> = m.iter().map(|b| *b == 1).collect();
                    let expected: Vec<bool> = want.iter().map(|v| *v <= s.bound).collect();
                    assert_eq!(marked, expected, "n={n} k={k}");
                }
            }
        }
    }

    #[test]
    fn selects_bound_the_first_k_keys_u64() {
        check::<u64>(
            &|r| match r.below(4) {
                0 => r.below(16),
                1 => u64::MAX - r.below(3),
                _ => r.next_u64(),
            },
            u64::MAX,
        );
    }

    #[test]
    fn decimal_keys_are_monotone_in_the_value() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let mut rng = Rng::new(5);
        let mut values: Vec<i128> = vec![
            0,
            -1,
            1,
            i128::MAX,
            i128::MIN,
            i64::MAX.into(),
            i64::MIN.into(),
        ];
        values.extend((0..2000).map(|k| match k % 3 {
            0 => i128::from(rng.next_u64() as i64),
            1 => (i128::from(rng.next_u64() as i64) << 40) + i128::from(rng.next_u64() as u32),
            _ => i128::from(rng.below(1000)) - 500,
        }));
        for descending in [false, true] {
            let d = stream.from_host(&values).unwrap();
            let keys = stream
                .to_vec(&decimal_keys(&stream, d.as_slice(), descending).unwrap())
                .unwrap();
            for (i, a) in values.iter().enumerate() {
                for (j, b) in values.iter().enumerate().step_by(7) {
                    let (a_first, b_first) = if descending {
                        (a > b, b > a)
                    } else {
                        (a < b, b < a)
                    };
                    if a_first {
                        assert!(
                            keys[i] <= keys[j],
                            "{a} before {b} (descending {descending})"
                        );
                    }
                    if b_first {
                        assert!(keys[j] <= keys[i]);
                    }
                    if i64::try_from(*a).is_ok() && i64::try_from(*b).is_ok() && a != b {
                        assert_ne!(keys[i], keys[j], "{a} and {b} within i64 tie");
                    }
                }
            }
        }
    }

    #[test]
    fn selects_bound_the_first_k_keys_u32() {
        check::<u32>(
            &|r| {
                if r.chance(0.5) {
                    r.below(1000) as u32
                } else {
                    r.next_u64() as u32
                }
            },
            u32::MAX as u64,
        );
    }
}
