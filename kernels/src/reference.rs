//! CPU reference implementations of every primitive, and seeded test data.
//!
//! Each function here is the plain, obviously-correct Rust version of a kernel family. The
//! kernel tests and `spate selftest` run a kernel and its reference on the same random data and
//! require identical results (floats: see [`close_f64`]). The hash is checked against an
//! independent XXH64 (the `twox-hash` crate), not against a port of our own kernel code.

use std::hash::Hasher;

/// Mixes 64-bit values (SplitMix64): a tiny, seeded, reproducible generator for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with a fixed seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (bound > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
}

/// `n` u32 values below `bound`.
pub fn random_u32(n: usize, seed: u64, bound: u32) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.below(u64::from(bound)) as u32).collect()
}

/// `n` u64 values over the full range (so sums wrap).
pub fn random_u64(n: usize, seed: u64) -> Vec<u64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_u64()).collect()
}

/// `n` i32 values with extremes mixed in.
pub fn random_i32(n: usize, seed: u64) -> Vec<i32> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| match r.below(16) {
            0 => i32::MIN,
            1 => i32::MAX,
            2 => 0,
            3 => -1,
            _ => r.next_u64() as i32 >> r.below(31),
        })
        .collect()
}

/// `n` i64 values with extremes mixed in.
pub fn random_i64(n: usize, seed: u64) -> Vec<i64> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| match r.below(16) {
            0 => i64::MIN,
            1 => i64::MAX,
            2 => 0,
            3 => -1,
            _ => r.next_u64() as i64 >> r.below(63),
        })
        .collect()
}

/// `n` f64 values with NaN, both zeros and infinities mixed in.
pub fn random_f64(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| match r.below(24) {
            0 => f64::NAN,
            1 => -f64::NAN,
            2 => 0.0,
            3 => -0.0,
            4 => f64::INFINITY,
            5 => f64::NEG_INFINITY,
            _ => (r.next_u64() as i64 as f64) / (1u64 << r.below(60)) as f64,
        })
        .collect()
}

/// `n` f32 values with NaN, both zeros and infinities mixed in.
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    random_f64(n, seed).into_iter().map(|v| v as f32).collect()
}

/// An Arrow bitmap with `offset + n` bits where each of the `n` rows is set with probability
/// `p_set` (bits before `offset` are random too, to catch offset bugs).
pub fn random_bitmap(n: usize, offset: usize, seed: u64, p_set: f64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut bytes = vec![0u8; (offset + n).div_ceil(8).max(1)];
    for i in 0..offset + n {
        let set = if i < offset {
            r.chance(0.5)
        } else {
            r.chance(p_set)
        };
        if set {
            bytes[i / 8] |= 1 << (i % 8);
        }
    }
    bytes
}

/// `n` random strings of 0 to `max_len` bytes (some longer than 32, to reach every hash path),
/// as Arrow offsets and bytes.
pub fn random_strings(n: usize, seed: u64, max_len: usize) -> (Vec<i32>, Vec<u8>) {
    let mut r = Rng::new(seed);
    let mut offsets = vec![0i32];
    let mut bytes = Vec::new();
    for _ in 0..n {
        let len = r.below(max_len as u64 + 1) as usize;
        bytes.extend((0..len).map(|_| b'a' + r.below(26) as u8));
        offsets.push(bytes.len() as i32);
    }
    (offsets, bytes)
}

/// Bit `i` of an Arrow bitmap starting at bit `offset`; `None` means all set.
pub fn bit(bits: Option<&[u8]>, offset: usize, i: usize) -> bool {
    bits.is_none_or(|b| (b[(offset + i) / 8] >> ((offset + i) % 8)) & 1 == 1)
}

/// Packs booleans into an Arrow bitmap.
pub fn pack_bits(values: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; values.len().div_ceil(8)];
    for (i, v) in values.iter().enumerate() {
        if *v {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

/// Prefix sums with wrapping u32 arithmetic.
pub fn prefix_sum_u32(values: &[u32], inclusive: bool) -> Vec<u32> {
    let mut acc = 0u32;
    values
        .iter()
        .map(|v| {
            let before = acc;
            acc = acc.wrapping_add(*v);
            if inclusive { acc } else { before }
        })
        .collect()
}

/// Prefix sums with wrapping u64 arithmetic.
pub fn prefix_sum_u64(values: &[u64], inclusive: bool) -> Vec<u64> {
    let mut acc = 0u64;
    values
        .iter()
        .map(|v| {
            let before = acc;
            acc = acc.wrapping_add(*v);
            if inclusive { acc } else { before }
        })
        .collect()
}

/// Indices of the rows a compaction keeps: mask true and mask not null.
pub fn compact_indices(n: usize, keep: impl Fn(usize) -> bool) -> Vec<u32> {
    (0..n).filter(|i| keep(*i)).map(|i| i as u32).collect()
}

/// [`crate::partition::partition_rows`]: the row indices grouped by partition
/// `(hash >> shift) & (2^bits - 1)`, in row order within each, and the rows per partition.
pub fn partition_rows(hashes: &[u64], shift: u32, bits: u32) -> (Vec<u32>, Vec<usize>) {
    let mask = (1u64 << bits) - 1;
    let pid = |h: u64| ((h >> shift) & mask) as usize;
    let mut counts = vec![0usize; 1 << bits];
    for &h in hashes {
        counts[pid(h)] += 1;
    }
    let mut order: Vec<u32> = (0..hashes.len() as u32).collect();
    order.sort_by_key(|&i| pid(hashes[i as usize]));
    (order, counts)
}

/// `out[i] = values[indices[i]]`, zero for the null index.
pub fn gather<T: Copy + Default>(values: &[T], indices: &[u32]) -> Vec<T> {
    indices
        .iter()
        .map(|i| {
            if *i == u32::MAX {
                T::default()
            } else {
                values[*i as usize]
            }
        })
        .collect()
}

/// Rows of `words` values: row `i` is row `indices[i]` of `values`, zeros for the null index.
pub fn gather_rows<T: Copy + Default>(values: &[T], words: usize, indices: &[u32]) -> Vec<T> {
    indices
        .iter()
        .flat_map(|i| {
            if *i == u32::MAX {
                vec![T::default(); words]
            } else {
                values[*i as usize * words..(*i as usize + 1) * words].to_vec()
            }
        })
        .collect()
}

/// The gathered validity as booleans.
pub fn gather_validity(bits: Option<&[u8]>, offset: usize, indices: &[u32]) -> Vec<bool> {
    indices
        .iter()
        .map(|i| *i != u32::MAX && bit(bits, offset, *i as usize))
        .collect()
}

/// Hash of a NULL (`SPATE_NULL_HASH`).
pub const NULL_HASH: u64 = 0x9ae1_6a3b_2f90_404f;

/// XXH64 with seed 0, from the independent `twox-hash` implementation.
pub fn xxh64(bytes: &[u8]) -> u64 {
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(bytes);
    h.finish()
}

/// Folds a column's hash into a row's running hash (`hash_combine` in `common/hash.cuh`).
pub fn hash_combine(seed: u64, h: u64) -> u64 {
    seed ^ (h
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(seed << 6)
        .wrapping_add(seed >> 2))
}

/// Unsigned key whose order is `f32::total_cmp`'s.
pub fn order_key_f32(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Unsigned key whose order is `f64::total_cmp`'s.
pub fn order_key_f64(v: f64) -> u64 {
    let b = v.to_bits();
    if b & (1 << 63) != 0 {
        !b
    } else {
        b | (1 << 63)
    }
}

/// One query's nearest item, as `vector_topk` reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NearestRow {
    pub query: u64,
    pub item: u64,
    pub rank: u64,
    pub distance: f64,
}

/// The distance `metric` (`0` cosine distance, `1` inner product, `2` Euclidean) between two
/// f32 vectors, as `vector.cuh` computes it: accumulated in f32 in element order, finished in
/// f64; `None` for a cosine against a zero vector. A NaN result is the positive quiet NaN
/// (`f64::NAN`), as on the device.
pub fn vector_distance(metric: u32, a: &[f32], b: &[f32]) -> Option<f64> {
    raw_vector_distance(metric, a, b).map(|d| if d.is_nan() { f64::NAN } else { d })
}

fn raw_vector_distance(metric: u32, a: &[f32], b: &[f32]) -> Option<f64> {
    let (mut dot, mut sa, mut sb, mut sum) = (0f32, 0f32, 0f32, 0f32);
    for (&x, &y) in a.iter().zip(b) {
        dot += x * y;
        sa += x * x;
        sb += y * y;
        sum += (x - y) * (x - y);
    }
    match metric {
        0 if sa == 0.0 || sb == 0.0 => None,
        0 => Some(1.0 - f64::from(dot) / (f64::from(sa).sqrt() * f64::from(sb).sqrt())),
        1 => Some(f64::from(dot)),
        _ => Some(f64::from(sum).sqrt()),
    }
}

/// The `k` nearest items to each query by `metric` (see [`vector_distance`]): nearest first
/// (the largest inner product first), ties by item; `None` rows and NULL or NaN distances
/// left out.
pub fn nearest_items(
    items: &[Option<Vec<f32>>],
    queries: &[Option<Vec<f32>>],
    metric: u32,
    k: usize,
) -> Vec<NearestRow> {
    let mut out = Vec::new();
    for (q, query) in queries.iter().enumerate() {
        let Some(query) = query else { continue };
        let mut scored: Vec<(u64, u64, f64)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let d = vector_distance(metric, item.as_ref()?, query)?;
                let key = if metric == 1 {
                    !order_key_f64(d)
                } else {
                    order_key_f64(d)
                };
                (!d.is_nan()).then_some((key, i as u64, d))
            })
            .collect();
        scored.sort_by_key(|&(key, item, _)| (key, item));
        out.extend(
            scored
                .iter()
                .take(k)
                .enumerate()
                .map(|(r, &(_, item, distance))| NearestRow {
                    query: q as u64,
                    item,
                    rank: r as u64 + 1,
                    distance,
                }),
        );
    }
    out
}

/// Relative closeness for float sums whose order of addition differs from the CPU's:
/// `|a - b| <= 1e-9 * max(1, |a|, |b|) + ulp slack`, NaN equal to NaN, infinities exact.
pub fn close_f64(a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh64_known_answers() {
        // From the XXH64 specification's reference vectors (seed 0).
        assert_eq!(xxh64(b""), 0xef46_db37_51d8_e999);
        assert_eq!(xxh64(b"a"), 0xd24e_c4f1_a98c_6e5b);
    }

    #[test]
    fn total_order_keys_sort_like_total_cmp() {
        let mut v = random_f64(2000, 9);
        let mut by_key = v.clone();
        v.sort_by(f64::total_cmp);
        by_key.sort_by_key(|x| order_key_f64(*x));
        assert_eq!(
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            by_key.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert!(order_key_f32(-0.0) < order_key_f32(0.0));
        assert!(order_key_f32(f32::INFINITY) < order_key_f32(f32::NAN));
    }

    #[test]
    fn random_data_is_seeded_and_not_trivial() {
        assert_eq!(random_u64(10, 1), random_u64(10, 1));
        assert_ne!(random_u64(10, 1), random_u64(10, 2));
        assert!(random_u32(100, 1, 1000).iter().any(|v| *v != 0));
        let bits = random_bitmap(1000, 3, 4, 0.5);
        let set = (0..1000).filter(|i| bit(Some(&bits), 3, *i)).count();
        assert!((300..700).contains(&set), "{set}");
    }
}
