//! The differential self-test: every primitive run on a device and checked against its CPU
//! reference ([`crate::reference`]) at sizes that straddle warp, block and tile edges.
//!
//! `spate selftest --backend cuda|emulated` prints these results; the unit tests use
//! [`test_device`] and [`SIZES`] so that CI runs the same kernels on the emulator, and a GPU
//! machine runs them on CUDA (`SPATE_TEST_BACKEND=cuda`).

use std::time::Instant;

use crate::device::{BackendKind, Device, DeviceOptions};
use crate::error::{KernelError, Result};
use crate::memory::DeviceBitmap;
use crate::reference::{self, bit};
use crate::stream::Stream;
use crate::{compact, gather, hash, partition, reduce, scan, sort, vector_topk};

/// Sizes every kernel test covers: empty, single, around a warp (32), around a block (1024
/// with 256 threads x 4), and several tiles (2048 rows each).
pub const SIZES: &[usize] = &[0, 1, 31, 32, 33, 1023, 1024, 1025, 2047, 2049, 9000];

/// Environment variable choosing the backend of kernel unit tests (`emulated` by default).
pub const TEST_BACKEND_ENV: &str = "SPATE_TEST_BACKEND";

/// The device kernel unit tests run on: the emulator, or CUDA when `SPATE_TEST_BACKEND=cuda`.
pub fn test_device() -> Device {
    let kind = match std::env::var(TEST_BACKEND_ENV).as_deref() {
        Ok("cuda") => BackendKind::Cuda,
        _ => BackendKind::Emulated,
    };
    match Device::open(kind, DeviceOptions::default()) {
        Ok(d) => d,
        Err(e) => panic!("{TEST_BACKEND_ENV}={kind}: cannot open the device: {e}"),
    }
}

/// One check at one size.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// The primitive and variant, e.g. `scan exclusive u32`.
    pub check: &'static str,
    /// Input rows.
    pub rows: usize,
    /// Wall time of the device run (including transfers and synchronisation).
    pub millis: f64,
    /// `None` when the device matched the reference, else what differed.
    pub failure: Option<String>,
}

type Check = fn(&Stream, usize) -> Result<Option<String>>;

fn mismatch<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("length {} != expected {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .map(|i| format!("row {i}: {:?} != expected {:?}", got[i], want[i]))
}

fn scan_u32(s: &Stream, n: usize) -> Result<Option<String>> {
    let host = reference::random_u32(n, 11, 1 << 30);
    let d = s.from_host(&host)?;
    let got = s.to_vec(&scan::exclusive_sum(s, d.as_slice())?)?;
    Ok(mismatch(&got, &reference::prefix_sum_u32(&host, false)))
}

fn scan_u64(s: &Stream, n: usize) -> Result<Option<String>> {
    let host = reference::random_u64(n, 12);
    let d = s.from_host(&host)?;
    let got = s.to_vec(&scan::inclusive_sum(s, d.as_slice())?)?;
    Ok(mismatch(&got, &reference::prefix_sum_u64(&host, true)))
}

fn compact_bitmap(s: &Stream, n: usize) -> Result<Option<String>> {
    let bits = reference::random_bitmap(n, 3, 13, 0.5);
    let valid = reference::random_bitmap(n, 0, 14, 0.9);
    let values = reference::random_i64(n, 15);
    let (db, dv, dx) = (
        s.from_host(&bits)?,
        s.from_host(&valid)?,
        s.from_host(&values)?,
    );
    let mask = compact::Mask::Bits(DeviceBitmap::new(&db).with_offset(3));
    let got = s.to_vec(&compact::compact_values(
        s,
        dx.as_slice(),
        mask,
        Some(DeviceBitmap::new(&dv)),
    )?)?;
    let keep = reference::compact_indices(n, |i| bit(Some(&bits), 3, i) && bit(Some(&valid), 0, i));
    Ok(mismatch(&got, &reference::gather(&values, &keep)))
}

fn compact_bytes(s: &Stream, n: usize) -> Result<Option<String>> {
    let mut r = reference::Rng::new(16);
    let mask: Vec<u8> = (0..n).map(|_| r.below(2) as u8).collect();
    let d = s.from_host(&mask)?;
    let got = s.to_vec(&compact::select_indices(
        s,
        compact::Mask::Bytes(d.as_slice()),
        None,
        n,
    )?)?;
    Ok(mismatch(
        &got,
        &reference::compact_indices(n, |i| mask[i] != 0),
    ))
}

fn gather_fixed(s: &Stream, n: usize) -> Result<Option<String>> {
    let src = reference::random_u64(n.max(1), 17);
    let idx: Vec<u32> = reference::random_u32(n, 18, src.len() as u32);
    let (ds, di) = (s.from_host(&src)?, s.from_host(&idx)?);
    let got = s.to_vec(&gather::gather(s, ds.as_slice(), di.as_slice())?)?;
    Ok(mismatch(&got, &reference::gather(&src, &idx)))
}

fn gather_rows(s: &Stream, n: usize) -> Result<Option<String>> {
    // Rows of 3 and 96 u32 words (a 768-dimension fp32 embedding is 192 of them), a null
    // index among the indices.
    for words in [3_usize, 96] {
        let rows = n.max(1);
        let src: Vec<u32> = reference::random_u32(rows * words, 19, u32::MAX);
        let mut idx: Vec<u32> = reference::random_u32(n, 20, rows as u32);
        if let Some(first) = idx.first_mut() {
            *first = u32::MAX;
        }
        let (ds, di) = (s.from_host(&src)?, s.from_host(&idx)?);
        let got = s.to_vec(&gather::gather_rows_live(
            s,
            ds.as_slice(),
            words,
            di.as_slice(),
            None,
        )?)?;
        if let Some(m) = mismatch(&got, &reference::gather_rows(&src, words, &idx)) {
            return Ok(Some(format!("{words} words: {m}")));
        }
    }
    Ok(None)
}

fn gather_validity(s: &Stream, n: usize) -> Result<Option<String>> {
    let rows = n.max(1);
    let valid = reference::random_bitmap(rows, 7, 19, 0.6);
    let idx: Vec<u32> = reference::random_u32(n, 20, rows as u32);
    let (dv, di) = (s.from_host(&valid)?, s.from_host(&idx)?);
    let got = s.to_vec(&gather::gather_bitmap(
        s,
        Some(DeviceBitmap::new(&dv).with_offset(7)),
        di.as_slice(),
    )?)?;
    let got: Vec<bool> = (0..n).map(|i| bit(Some(&got), 0, i)).collect();
    Ok(mismatch(
        &got,
        &reference::gather_validity(Some(&valid), 7, &idx),
    ))
}

fn gather_strings(s: &Stream, n: usize) -> Result<Option<String>> {
    let (offsets, bytes) = reference::random_strings(n.max(1), 21, 48);
    let rows = offsets.len() - 1;
    let idx: Vec<u32> = reference::random_u32(n, 22, rows as u32);
    let (doff, dbytes, di) = (
        s.from_host(&offsets)?,
        s.from_host(&bytes)?,
        s.from_host(&idx)?,
    );
    let strings = gather::DeviceStrings {
        offsets: doff.as_slice(),
        bytes: dbytes.as_slice(),
    };
    let out = gather::gather_strings(s, strings, di.as_slice())?;
    let (go, gb) = (s.to_vec(&out.offsets)?, s.to_vec(&out.bytes)?);
    for (i, ix) in idx.iter().enumerate() {
        let want = &bytes[offsets[*ix as usize] as usize..offsets[*ix as usize + 1] as usize];
        if &gb[go[i] as usize..go[i + 1] as usize] != want {
            return Ok(Some(format!("row {i}: wrong string")));
        }
    }
    Ok(None)
}

fn hash_keys(s: &Stream, n: usize) -> Result<Option<String>> {
    let a = reference::random_i64(n, 23);
    let (offsets, bytes) = reference::random_strings(n, 24, 40);
    let valid = reference::random_bitmap(n, 0, 25, 0.8);
    let (da, doff, db, dv) = (
        s.from_host(&a)?,
        s.from_host(&offsets)?,
        s.from_host(&bytes)?,
        s.from_host(&valid)?,
    );
    let cols = [
        hash::HashColumn::fixed(da.as_slice(), Some(DeviceBitmap::new(&dv))),
        hash::HashColumn::Utf8(
            gather::DeviceStrings {
                offsets: doff.as_slice(),
                bytes: db.as_slice(),
            },
            None,
        ),
    ];
    let got = s.to_vec(&hash::hash_columns(s, &cols, 0)?)?;
    let want: Vec<u64> = (0..n)
        .map(|i| {
            let ha = if bit(Some(&valid), 0, i) {
                reference::xxh64(&a[i].to_le_bytes())
            } else {
                reference::NULL_HASH
            };
            let hs = reference::xxh64(&bytes[offsets[i] as usize..offsets[i + 1] as usize]);
            reference::hash_combine(reference::hash_combine(0, ha), hs)
        })
        .collect();
    Ok(mismatch(&got, &want))
}

fn stable_order(n: usize, key: impl Fn(usize) -> u64) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..n as u32).collect();
    idx.sort_by_key(|i| key(*i as usize));
    idx
}

fn sort_u32(s: &Stream, n: usize) -> Result<Option<String>> {
    let keys = reference::random_u32(n, 26, 1000);
    let d = s.from_host(&keys)?;
    let got = s.to_vec(&sort::sort_pairs(s, d.as_slice(), None, 32)?.values)?;
    Ok(mismatch(&got, &stable_order(n, |i| u64::from(keys[i]))))
}

fn sort_u64(s: &Stream, n: usize) -> Result<Option<String>> {
    let keys = reference::random_u64(n, 27);
    let d = s.from_host(&keys)?;
    let got = s.to_vec(&sort::sort_pairs(s, d.as_slice(), None, 64)?.values)?;
    Ok(mismatch(&got, &stable_order(n, |i| keys[i])))
}

fn sort_f64_desc(s: &Stream, n: usize) -> Result<Option<String>> {
    let v = reference::random_f64(n, 28);
    let d = s.from_host(&v)?;
    let got = s.to_vec(&sort::argsort(s, d.as_slice(), true)?)?;
    Ok(mismatch(
        &got,
        &stable_order(n, |i| !reference::order_key_f64(v[i])),
    ))
}

fn reduce_sum_i64(s: &Stream, n: usize) -> Result<Option<String>> {
    let v = reference::random_i64(n, 29);
    let valid = reference::random_bitmap(n, 0, 30, 0.7);
    let (d, dv) = (s.from_host(&v)?, s.from_host(&valid)?);
    let got = reduce::sum(s, d.as_slice(), Some(DeviceBitmap::new(&dv)))?;
    let kept = (0..n).filter(|i| bit(Some(&valid), 0, *i));
    let (want, count) = kept.fold((0i64, 0u64), |(a, c), i| (a.wrapping_add(v[i]), c + 1));
    Ok(mismatch(
        &[got.value, got.count as i64],
        &[want, count as i64],
    ))
}

fn reduce_min_max_f64(s: &Stream, n: usize) -> Result<Option<String>> {
    let v = reference::random_f64(n, 31);
    let d = s.from_host(&v)?;
    let lo = reduce::min(s, d.as_slice(), None)?;
    let hi = reduce::max(s, d.as_slice(), None)?;
    if n == 0 {
        return Ok(mismatch(&[lo.count, hi.count], &[0, 0]));
    }
    let key = |x: f64| reference::order_key_f64(x);
    let want_lo = v.iter().copied().min_by(f64::total_cmp).map(key);
    let want_hi = v.iter().copied().max_by(f64::total_cmp).map(key);
    Ok(mismatch(
        &[Some(key(lo.value)), Some(key(hi.value))],
        &[want_lo, want_hi],
    ))
}

fn reduce_segments(s: &Stream, n: usize) -> Result<Option<String>> {
    let v = reference::random_i32(n, 32);
    let mut r = reference::Rng::new(33);
    let mut offsets = vec![0u32];
    while (*offsets.last().unwrap_or(&0) as usize) < n {
        let next = offsets.last().copied().unwrap_or(0) + r.below(100) as u32;
        offsets.push(next.min(n as u32));
    }
    let (d, doff) = (s.from_host(&v)?, s.from_host(&offsets)?);
    let out = reduce::segmented::<i32, i64>(
        s,
        reduce::ReduceOp::Sum,
        d.as_slice(),
        None,
        doff.as_slice(),
    )?;
    let got = s.to_vec(&out.values)?;
    let want: Vec<i64> = offsets
        .windows(2)
        .map(|w| {
            v[w[0] as usize..w[1] as usize]
                .iter()
                .map(|x| i64::from(*x))
                .sum()
        })
        .collect();
    Ok(mismatch(&got, &want))
}

fn partition_by_hash(s: &Stream, n: usize) -> Result<Option<String>> {
    let hashes = reference::random_u64(n, 17);
    let d = s.from_host(&hashes)?;
    let p = partition::partition_rows(s, d.as_slice(), 58, 6)?;
    let got = (s.to_vec(&p.order)?, p.counts);
    let want = reference::partition_rows(&hashes, 58, 6);
    Ok(if got.1 != want.1 {
        Some(format!(
            "partition counts {:?} != expected {:?}",
            got.1, want.1
        ))
    } else {
        mismatch(&got.0, &want.0)
    })
}

fn nearest_f32(s: &Stream, n: usize) -> Result<Option<String>> {
    const DIM: usize = 8;
    let values = reference::random_f32(n * DIM, 18);
    let queries = reference::random_f32(3 * DIM, 19);
    let rows = |v: &[f32]| -> Vec<Option<Vec<f32>>> {
        v.chunks_exact(DIM).map(|r| Some(r.to_vec())).collect()
    };
    let bytes = |v: &[f32]| -> Vec<u8> {
        let mut b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        b.push(0);
        b
    };
    let (di, dq) = (
        s.from_host(&bytes(&values))?,
        s.from_host(&bytes(&queries))?,
    );
    fn vectors(d: &crate::memory::DeviceBuffer<u8>, rows: usize) -> vector_topk::Vectors<'_> {
        vector_topk::Vectors {
            bytes: d.as_slice(),
            validity: None,
            rows,
            dim: DIM,
            elem: 0,
        }
    }
    let mut top = vector_topk::NearestItems::new(s, 3, 10, 2)?;
    top.add_items(s, vectors(&di, n), vectors(&dq, 3), 1 << 24)?;
    let out = top.finish(s, 0)?;
    let count = s.to_vec(&out.count)?[0] as usize;
    let got: Vec<(u64, u64, u64, u64)> = (0..count)
        .zip(s.to_vec(&out.query)?)
        .zip(s.to_vec(&out.item)?)
        .zip(s.to_vec(&out.rank)?)
        .zip(s.to_vec(&out.distance)?)
        .map(|((((_, q), i), r), d)| (q, i, r, d.to_bits()))
        .collect();
    let want: Vec<(u64, u64, u64, u64)> =
        reference::nearest_items(&rows(&values), &rows(&queries), 2, 10)
            .into_iter()
            .map(|r| (r.query, r.item, r.rank, r.distance.to_bits()))
            .collect();
    Ok(mismatch(&got, &want))
}

/// Every check, by name.
pub const CHECKS: &[(&str, Check)] = &[
    ("scan exclusive u32", scan_u32),
    ("scan inclusive u64", scan_u64),
    ("compact i64 by bitmap+nulls", compact_bitmap),
    ("compact indices by bytes", compact_bytes),
    ("gather u64", gather_fixed),
    ("gather rows of u32 words", gather_rows),
    ("gather validity bitmap", gather_validity),
    ("gather strings", gather_strings),
    ("hash i64+utf8 with nulls", hash_keys),
    ("radix sort u32 pairs", sort_u32),
    ("radix sort u64 pairs", sort_u64),
    ("partition rows by hash bits", partition_by_hash),
    ("argsort f64 descending", sort_f64_desc),
    ("sum i64 with nulls", reduce_sum_i64),
    ("min/max f64 total order", reduce_min_max_f64),
    ("segmented sum i32", reduce_segments),
    ("vector top-k f32 L2", nearest_f32),
];

/// Runs every check at every size in `sizes` on `device`.
pub fn run(device: &Device, sizes: &[usize]) -> Result<Vec<CheckResult>> {
    let stream = device.new_stream()?;
    let mut results = Vec::new();
    for (name, check) in CHECKS {
        for &rows in sizes {
            let start = Instant::now();
            let outcome = check(&stream, rows).and_then(|r| stream.synchronize().map(|()| r));
            let millis = start.elapsed().as_secs_f64() * 1000.0;
            let failure = match outcome {
                Ok(f) => f,
                // A broken device fails every later check the same way; stop early.
                Err(e @ KernelError::DeviceUnhealthy { .. }) => {
                    results.push(CheckResult {
                        check: name,
                        rows,
                        millis,
                        failure: Some(e.to_string()),
                    });
                    return Ok(results);
                }
                Err(e) => Some(e.to_string()),
            };
            results.push(CheckResult {
                check: name,
                rows,
                millis,
                failure,
            });
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_passes_on_the_test_device() {
        let device = test_device();
        let results = run(&device, &[0, 1, 33, 1025, 5000]).unwrap();
        assert_eq!(results.len(), CHECKS.len() * 5);
        let failed: Vec<_> = results.iter().filter(|r| r.failure.is_some()).collect();
        assert!(failed.is_empty(), "{failed:#?}");
    }
}
