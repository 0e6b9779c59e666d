//! SUM, MIN, MAX and COUNT over whole columns and segments: `kernels/cuda/reduce/reduce.cu`.
//!
//! NULLs are skipped; every result comes with the number of non-null values seen, and a count
//! of 0 means the SQL result is NULL. Sums of i32/i64 accumulate in i64 and of u32/u64 in u64,
//! wrapping; sums of f32/f64 accumulate in f64. MIN/MAX order floats by IEEE total order.
//! Whole-column reductions run per-block partials and then one block over them, so float sums
//! are deterministic from run to run (but may differ from a sequential CPU sum in the last
//! bits; compare with [`crate::reference::close_f64`]).

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::stream::Stream;

/// The reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl ReduceOp {
    fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }
}

/// Column types the reductions accept, with their SUM accumulator.
pub trait ReduceElem: DeviceCopy + Default {
    /// SUM's accumulator type.
    type SumAcc: ReduceElem;
    #[doc(hidden)]
    const SUFFIX: &'static str;
}

macro_rules! reduce_elem {
    ($($t:ty => $acc:ty),*) => { $(
        impl ReduceElem for $t {
            type SumAcc = $acc;
            const SUFFIX: &'static str = stringify!($t);
        }
    )* };
}
reduce_elem!(i32 => i64, i64 => i64, u32 => u64, u64 => u64, f32 => f64, f64 => f64);

/// A reduction result: `value` is meaningful only when `count > 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduced<A> {
    /// The sum, minimum or maximum.
    pub value: A,
    /// Non-null values seen.
    pub count: u64,
}

fn launch_partials<T: ReduceElem, A: DeviceCopy>(
    stream: &Stream,
    entry: &str,
    values: DeviceSlice<'_, T>,
    validity: Option<DeviceBitmap<'_>>,
    blocks: u32,
) -> Result<(DeviceBuffer<A>, DeviceBuffer<u64>)> {
    let n = values.len();
    let partials = stream.alloc::<A>(blocks as usize)?;
    let counts = stream.alloc::<u64>(blocks as usize)?;
    let kernel = stream.device().kernel(entry)?;
    // SAFETY: `values` (and `validity`, checked by the caller) cover n rows; the outputs hold
    // one entry per block.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(blocks),
            &[
                values.into(),
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                KernelArg::U64(n as u64),
                (&partials).into(),
                (&counts).into(),
            ],
        )?;
    }
    Ok((partials, counts))
}

fn accumulate<T: ReduceElem, A: ReduceElem>(
    stream: &Stream,
    op: ReduceOp,
    values: DeviceSlice<'_, T>,
    validity: Option<DeviceBitmap<'_>>,
) -> Result<Reduced<A>> {
    if let Some(v) = validity {
        v.check_covers(values.len(), "validity")?;
    }
    let entry = format!("reduce_{}_{}", op.name(), T::SUFFIX);
    let blocks = stream.device().grid_stride_blocks(values.len());
    let (partials, counts) = launch_partials::<T, A>(stream, &entry, values, validity, blocks)?;
    // Step 2: one block folds the partials (with the accumulator type's kernel) and the counts.
    let final_entry = format!("reduce_{}_{}", op.name(), A::SUFFIX);
    let (value, _) = launch_partials::<A, A>(stream, &final_entry, partials.as_slice(), None, 1)?;
    let (count, _) =
        launch_partials::<u64, u64>(stream, "reduce_sum_u64", counts.as_slice(), None, 1)?;
    Ok(Reduced {
        value: stream.to_vec(&value)?[0],
        count: stream.to_vec(&count)?[0],
    })
}

/// SUM of the non-null values (wrapping for integers).
pub fn sum<T: ReduceElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    validity: Option<DeviceBitmap<'_>>,
) -> Result<Reduced<T::SumAcc>> {
    accumulate::<T, T::SumAcc>(stream, ReduceOp::Sum, values, validity)
}

/// MIN of the non-null values (floats by total order).
pub fn min<T: ReduceElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    validity: Option<DeviceBitmap<'_>>,
) -> Result<Reduced<T>> {
    accumulate::<T, T>(stream, ReduceOp::Min, values, validity)
}

/// MAX of the non-null values (floats by total order).
pub fn max<T: ReduceElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    validity: Option<DeviceBitmap<'_>>,
) -> Result<Reduced<T>> {
    accumulate::<T, T>(stream, ReduceOp::Max, values, validity)
}

/// COUNT of the set bits of a bitmap over `rows` rows: the non-null rows of a column.
pub fn count_valid(stream: &Stream, validity: DeviceBitmap<'_>, rows: usize) -> Result<u64> {
    validity.check_covers(rows, "validity")?;
    if rows == 0 {
        return Ok(0);
    }
    let blocks = stream.device().grid_stride_blocks(rows);
    let partials = stream.alloc::<u64>(blocks as usize)?;
    let kernel = stream.device().kernel("count_set_bits")?;
    // SAFETY: the bitmap covers `rows` bits (checked); one partial per block.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(blocks),
            &[
                validity.bytes.into(),
                KernelArg::U64(validity.offset as u64),
                KernelArg::U64(rows as u64),
                (&partials).into(),
            ],
        )?;
    }
    let (total, _) =
        launch_partials::<u64, u64>(stream, "reduce_sum_u64", partials.as_slice(), None, 1)?;
    Ok(stream.to_vec(&total)?[0])
}

/// Per-segment results: `values[s]` is meaningful only when `counts[s] > 0`.
#[derive(Debug)]
pub struct SegmentResults<A: DeviceCopy> {
    /// One result per segment.
    pub values: DeviceBuffer<A>,
    /// Non-null values per segment.
    pub counts: DeviceBuffer<u64>,
}

/// Reduces each segment `[offsets[s], offsets[s + 1])` of `values`. For SUM the result type is
/// the accumulator (`T::SumAcc`), for MIN/MAX it is `T`; `A` must match (checked).
pub fn segmented<T: ReduceElem, A: ReduceElem>(
    stream: &Stream,
    op: ReduceOp,
    values: DeviceSlice<'_, T>,
    validity: Option<DeviceBitmap<'_>>,
    offsets: DeviceSlice<'_, u32>,
) -> Result<SegmentResults<A>> {
    let expected = match op {
        ReduceOp::Sum => std::any::type_name::<T::SumAcc>(),
        _ => std::any::type_name::<T>(),
    };
    ensure_arg!(
        expected == std::any::type_name::<A>(),
        "{} of {} yields {expected}, not {}",
        op.name(),
        std::any::type_name::<T>(),
        std::any::type_name::<A>()
    );
    ensure_arg!(
        !offsets.is_empty(),
        "segment offsets need at least one entry"
    );
    if let Some(v) = validity {
        v.check_covers(values.len(), "validity")?;
    }
    let segments = offsets.len() - 1;
    let out = stream.alloc::<A>(segments)?;
    let counts = stream.alloc::<u64>(segments)?;
    if segments == 0 {
        return Ok(SegmentResults {
            values: out,
            counts,
        });
    }
    let kernel = stream
        .device()
        .kernel(&format!("reduce_segments_{}_{}", op.name(), T::SUFFIX))?;
    // One warp per segment: 8 segments per block of 256 threads.
    let blocks = stream
        .device()
        .grid_stride_blocks(segments.saturating_mul(32));
    // SAFETY: offsets index rows of `values` (caller's contract: ascending, <= len); outputs
    // hold one entry per segment.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(blocks),
            &[
                values.into(),
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                offsets.into(),
                KernelArg::U64(segments as u64),
                (&out).into(),
                (&counts).into(),
            ],
        )?;
    }
    Ok(SegmentResults {
        values: out,
        counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self, bit, close_f64, order_key_f64};
    use crate::selftest::{SIZES, test_device};

    #[test]
    fn integer_sums_wrap_and_skip_nulls() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let v = reference::random_i64(n, n as u64);
            let valid = reference::random_bitmap(n, 1, 2, 0.7);
            let d = stream.from_host(&v).unwrap();
            let dv = stream.from_host(&valid).unwrap();
            let bm = DeviceBitmap::new(&dv).with_offset(1);
            let got = sum(&stream, d.as_slice(), Some(bm)).unwrap();
            let kept: Vec<i64> = (0..n)
                .filter(|i| bit(Some(&valid), 1, *i))
                .map(|i| v[i])
                .collect();
            assert_eq!(got.count, kept.len() as u64);
            assert_eq!(
                got.value,
                kept.iter().fold(0i64, |a, b| a.wrapping_add(*b)),
                "n={n}"
            );

            let small: Vec<i32> = v.iter().map(|x| *x as i32).collect();
            let d = stream.from_host(&small).unwrap();
            let got = sum(&stream, d.as_slice(), None).unwrap();
            assert_eq!(got.value, small.iter().map(|x| i64::from(*x)).sum::<i64>());
            let got_min = min(&stream, d.as_slice(), None).unwrap();
            let got_max = max(&stream, d.as_slice(), None).unwrap();
            if n > 0 {
                assert_eq!(got_min.value, *small.iter().min().unwrap());
                assert_eq!(got_max.value, *small.iter().max().unwrap());
            } else {
                assert_eq!(got_min.count, 0);
            }
            assert_eq!(count_valid(&stream, bm, n).unwrap(), kept.len() as u64);
        }
    }

    #[test]
    fn float_min_max_follow_total_order_and_sums_are_close() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let v: Vec<f64> = reference::random_f64(n, 7);
            let d = stream.from_host(&v).unwrap();
            if n > 0 {
                let lo = min(&stream, d.as_slice(), None).unwrap().value;
                let hi = max(&stream, d.as_slice(), None).unwrap().value;
                let want_lo = v.iter().copied().min_by(f64::total_cmp).unwrap();
                let want_hi = v.iter().copied().max_by(f64::total_cmp).unwrap();
                assert_eq!(order_key_f64(lo), order_key_f64(want_lo), "n={n}");
                assert_eq!(order_key_f64(hi), order_key_f64(want_hi), "n={n}");
            }
            // Finite values only for the sum: NaN/inf make it trivially NaN.
            let finite: Vec<f32> = reference::random_f32(n, 8)
                .into_iter()
                .map(|x| if x.is_finite() { x } else { 1.5 })
                .collect();
            let d = stream.from_host(&finite).unwrap();
            let got = sum(&stream, d.as_slice(), None).unwrap();
            let want: f64 = finite.iter().map(|x| f64::from(*x)).sum();
            let scale: f64 = finite.iter().map(|x| f64::from(*x).abs()).sum();
            assert!(
                (got.value - want).abs() <= 1e-12 * scale.max(1.0) || close_f64(got.value, want),
                "n={n}: {} vs {want}",
                got.value
            );
        }
    }

    #[test]
    fn segments_with_empty_and_all_null_segments() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let n = 5000;
        let v: Vec<u32> = reference::random_u32(n, 1, u32::MAX);
        let valid = reference::random_bitmap(n, 0, 2, 0.6);
        let mut r = reference::Rng::new(3);
        let mut offsets = vec![0u32];
        while (*offsets.last().unwrap() as usize) < n {
            let step = r.below(80) as u32;
            offsets.push((offsets.last().unwrap() + step).min(n as u32));
        }
        let d = stream.from_host(&v).unwrap();
        let dv = stream.from_host(&valid).unwrap();
        let doff = stream.from_host(&offsets).unwrap();
        let bm = Some(DeviceBitmap::new(&dv));
        let sums = segmented::<u32, u64>(&stream, ReduceOp::Sum, d.as_slice(), bm, doff.as_slice())
            .unwrap();
        let maxes =
            segmented::<u32, u32>(&stream, ReduceOp::Max, d.as_slice(), bm, doff.as_slice())
                .unwrap();
        let (s_vals, s_counts) = (
            stream.to_vec(&sums.values).unwrap(),
            stream.to_vec(&sums.counts).unwrap(),
        );
        let m_vals = stream.to_vec(&maxes.values).unwrap();
        for s in 0..offsets.len() - 1 {
            let rows: Vec<u32> = (offsets[s] as usize..offsets[s + 1] as usize)
                .filter(|i| bit(Some(&valid), 0, *i))
                .map(|i| v[i])
                .collect();
            assert_eq!(s_counts[s], rows.len() as u64, "segment {s}");
            assert_eq!(s_vals[s], rows.iter().map(|x| u64::from(*x)).sum::<u64>());
            if let Some(m) = rows.iter().max() {
                assert_eq!(m_vals[s], *m);
            }
        }
        let wrong =
            segmented::<u32, u32>(&stream, ReduceOp::Sum, d.as_slice(), bm, doff.as_slice());
        assert!(wrong.is_err());
    }
}
