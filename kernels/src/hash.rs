//! Row hashing over one or more columns: `kernels/cuda/hash/hash_columns.cu`.
//!
//! A value hashes as XXH64 (seed 0) of its little-endian bytes; floats hash by bit pattern,
//! matching Arrow's total-order equality (NaN equals NaN, -0.0 differs from 0.0), or with -0.0
//! folded into +0.0 ([`HashColumn::folded`]) as the engine's hash tables compare them. Columns fold
//! left to right with `hash_combine`, starting from a seed; a NULL contributes
//! [`crate::reference::NULL_HASH`], so NULL keys group together.

use crate::error::{Result, ensure_arg};
use crate::gather::DeviceStrings;
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::stream::Stream;

/// The seed row hashes start from.
pub const DEFAULT_SEED: u64 = 0;

/// Fixed-width types, hashed by their bytes.
pub trait HashElem: DeviceCopy {
    #[doc(hidden)]
    const ENTRY: &'static str;
}

macro_rules! hash_elem {
    ($entry:literal: $($t:ty),*) => { $(
        impl HashElem for $t {
            const ENTRY: &'static str = $entry;
        }
    )* };
}
hash_elem!("hash_u8": u8, i8);
hash_elem!("hash_u16": u16, i16);
hash_elem!("hash_u32": u32, i32, f32);
hash_elem!("hash_u64": u64, i64, f64);
hash_elem!("hash_u128": u128, i128);

/// Floats hashed with -0.0 folded into +0.0 ([`HashColumn::folded`]).
pub trait FoldedFloat: DeviceCopy {
    #[doc(hidden)]
    const FOLDED_ENTRY: &'static str;
}

impl FoldedFloat for f32 {
    const FOLDED_ENTRY: &'static str = "hash_f32_folded";
}

impl FoldedFloat for f64 {
    const FOLDED_ENTRY: &'static str = "hash_f64_folded";
}

/// One key column to hash.
#[derive(Debug, Clone, Copy)]
pub enum HashColumn<'a> {
    /// Fixed-width values of `width` bytes, by entry point.
    Fixed {
        /// Entry point for the width.
        entry: &'static str,
        /// Device address of the values.
        address: u64,
        /// Rows.
        rows: usize,
        /// Validity.
        validity: Option<DeviceBitmap<'a>>,
    },
    /// Booleans: `rows` bits of `values`, each hashed as the byte 0 or 1.
    Bits {
        /// The values.
        values: DeviceBitmap<'a>,
        /// Rows.
        rows: usize,
        /// Validity.
        validity: Option<DeviceBitmap<'a>>,
    },
    /// Strings with i32 offsets.
    Utf8(DeviceStrings<'a, i32>, Option<DeviceBitmap<'a>>),
    /// Strings with i64 offsets.
    LargeUtf8(DeviceStrings<'a, i64>, Option<DeviceBitmap<'a>>),
}

impl<'a> HashColumn<'a> {
    /// A fixed-width column.
    pub fn fixed<T: HashElem>(
        values: DeviceSlice<'a, T>,
        validity: Option<DeviceBitmap<'a>>,
    ) -> Self {
        HashColumn::Fixed {
            entry: T::ENTRY,
            address: values.address(),
            rows: values.len(),
            validity,
        }
    }

    /// A float column hashed as equality in the engine's hash tables folds it: -0.0 as +0.0
    /// (NaNs by their bits).
    pub fn folded<T: FoldedFloat>(
        values: DeviceSlice<'a, T>,
        validity: Option<DeviceBitmap<'a>>,
    ) -> Self {
        HashColumn::Fixed {
            entry: T::FOLDED_ENTRY,
            address: values.address(),
            rows: values.len(),
            validity,
        }
    }

    fn rows(&self) -> usize {
        match self {
            HashColumn::Fixed { rows, .. } | HashColumn::Bits { rows, .. } => *rows,
            HashColumn::Utf8(s, _) => s.rows(),
            HashColumn::LargeUtf8(s, _) => s.rows(),
        }
    }
}

/// Hashes rows over `columns` (all of the same length), left to right, from `seed`.
pub fn hash_columns(
    stream: &Stream,
    columns: &[HashColumn<'_>],
    seed: u64,
) -> Result<DeviceBuffer<u64>> {
    ensure_arg!(!columns.is_empty(), "hashing needs at least one column");
    let n = columns[0].rows();
    for c in columns {
        ensure_arg!(
            c.rows() == n,
            "hash key columns have {} and {n} rows",
            c.rows()
        );
    }
    let out = stream.alloc::<u64>(n)?;
    if n == 0 {
        return Ok(out);
    }
    for (i, c) in columns.iter().enumerate() {
        // The first column starts from the seed; later ones fold into `out` in place.
        let previous = (i > 0).then_some(&out);
        // The kernels differ only in their leading arguments: the values.
        let (entry, mut args, validity) = match *c {
            HashColumn::Fixed {
                entry,
                address,
                validity,
                ..
            } => (entry, vec![KernelArg::Ptr(address)], validity),
            HashColumn::Bits {
                values, validity, ..
            } => {
                values.check_covers(n, "boolean key")?;
                let leading = vec![Some(values).into(), KernelArg::U64(values.offset as u64)];
                ("hash_bits", leading, validity)
            }
            HashColumn::Utf8(s, v) => (
                "hash_strings_i32",
                vec![s.offsets.into(), s.bytes.into()],
                v,
            ),
            HashColumn::LargeUtf8(s, v) => (
                "hash_strings_i64",
                vec![s.offsets.into(), s.bytes.into()],
                v,
            ),
        };
        if let Some(v) = validity {
            v.check_covers(n, "key validity")?;
        }
        args.extend([
            validity.into(),
            KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
            KernelArg::U64(n as u64),
            previous.into(),
            KernelArg::U64(seed),
            (&out).into(),
        ]);
        let kernel = stream.device().kernel(entry)?;
        // SAFETY: a fixed-width column's address holds n values of its entry's width, a
        // boolean column's bitmap covers n bits (checked), and a string column has n + 1
        // offsets into its bytes; the validity covers n bits (checked); `out` holds n hashes
        // and may alias `previous` (the kernel reads a row's hash before writing it).
        unsafe {
            stream.launch(
                &kernel,
                LaunchConfig::blocks(stream.device().grid_stride_blocks(n)),
                &args,
            )?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self, NULL_HASH, bit, hash_combine, xxh64};
    use crate::selftest::{SIZES, test_device};

    #[test]
    fn matches_independent_xxh64_over_three_columns_with_nulls() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let a = reference::random_i64(n, 1);
            let b = reference::random_u32(n, 2, 7);
            let (offs, bytes) = reference::random_strings(n, 3, 70);
            let va = reference::random_bitmap(n, 2, 4, 0.8);
            let vs = reference::random_bitmap(n, 0, 5, 0.7);
            let d_a = stream.from_host(&a).unwrap();
            let d_b = stream.from_host(&b).unwrap();
            let d_off = stream.from_host(&offs).unwrap();
            let d_bytes = stream.from_host(&bytes).unwrap();
            let d_va = stream.from_host(&va).unwrap();
            let d_vs = stream.from_host(&vs).unwrap();
            let cols = [
                HashColumn::fixed(
                    d_a.as_slice(),
                    Some(DeviceBitmap::new(&d_va).with_offset(2)),
                ),
                HashColumn::fixed(d_b.as_slice(), None),
                HashColumn::Utf8(
                    DeviceStrings {
                        offsets: d_off.as_slice(),
                        bytes: d_bytes.as_slice(),
                    },
                    Some(DeviceBitmap::new(&d_vs)),
                ),
            ];
            let got = stream
                .to_vec(&hash_columns(&stream, &cols, 42).unwrap())
                .unwrap();
            for i in 0..n {
                let ha = if bit(Some(&va), 2, i) {
                    xxh64(&a[i].to_le_bytes())
                } else {
                    NULL_HASH
                };
                let hb = xxh64(&b[i].to_le_bytes());
                let hs = if bit(Some(&vs), 0, i) {
                    xxh64(&bytes[offs[i] as usize..offs[i + 1] as usize])
                } else {
                    NULL_HASH
                };
                let want = hash_combine(hash_combine(hash_combine(42, ha), hb), hs);
                assert_eq!(got[i], want, "row {i} of {n}");
            }
        }
    }

    #[test]
    fn folded_floats_hash_negative_zero_as_zero_and_nans_by_their_bits() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let f32s = [0.0f32, -0.0, 1.5, -1.5, f32::NAN, -f32::NAN, f32::INFINITY];
        let f64s = [
            0.0f64,
            -0.0,
            1.5,
            -1.5,
            f64::NAN,
            -f64::NAN,
            f64::NEG_INFINITY,
        ];
        let d32 = stream.from_host(&f32s).unwrap();
        let d64 = stream.from_host(&f64s).unwrap();
        let hash = |c: HashColumn<'_>| stream.to_vec(&hash_columns(&stream, &[c], 0).unwrap());
        let h32 = hash(HashColumn::folded(d32.as_slice(), None)).unwrap();
        let h64 = hash(HashColumn::folded(d64.as_slice(), None)).unwrap();
        for i in 0..f32s.len() {
            let (a, b) = (f32s[i], f64s[i]);
            let (a, b) = (
                if a == 0.0 { 0.0 } else { a },
                if b == 0.0 { 0.0 } else { b },
            );
            assert_eq!(
                h32[i],
                hash_combine(0, xxh64(&a.to_bits().to_le_bytes())),
                "{a}"
            );
            assert_eq!(
                h64[i],
                hash_combine(0, xxh64(&b.to_bits().to_le_bytes())),
                "{b}"
            );
        }
        assert_eq!(h32[0], h32[1]);
        assert_ne!(h32[4], h32[5]);
    }

    #[test]
    fn booleans_hash_as_the_bytes_zero_and_one() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        // Rows from bit 3: 1, 0, 1, 1, 0, NULL.
        let bits = stream.from_host(&[0b0110_1000u8, 0b0000_0001]).unwrap();
        let valid = stream.from_host(&[0b0001_1111u8]).unwrap();
        let column = HashColumn::Bits {
            values: DeviceBitmap::new(&bits).with_offset(3),
            rows: 6,
            validity: Some(DeviceBitmap::new(&valid)),
        };
        let got = stream
            .to_vec(&hash_columns(&stream, &[column], 0).unwrap())
            .unwrap();
        let h = |v: u8| hash_combine(0, xxh64(&[v]));
        assert_eq!(
            got,
            [h(1), h(0), h(1), h(1), h(0), hash_combine(0, NULL_HASH)]
        );
    }

    #[test]
    fn every_width_hashes_its_bytes() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let v8: Vec<u8> = (0..100).collect();
        let v16: Vec<i16> = (0..100).map(|i| i * -300).collect();
        let v128: Vec<u128> = (0..100).map(|i| u128::MAX / (i + 1)).collect();
        let d8 = stream.from_host(&v8).unwrap();
        let d16 = stream.from_host(&v16).unwrap();
        let d128 = stream.from_host(&v128).unwrap();
        let h8 = stream
            .to_vec(&hash_columns(&stream, &[HashColumn::fixed(d8.as_slice(), None)], 0).unwrap())
            .unwrap();
        let h16 = stream
            .to_vec(&hash_columns(&stream, &[HashColumn::fixed(d16.as_slice(), None)], 0).unwrap())
            .unwrap();
        let h128 = stream
            .to_vec(&hash_columns(&stream, &[HashColumn::fixed(d128.as_slice(), None)], 0).unwrap())
            .unwrap();
        for i in 0..100 {
            assert_eq!(h8[i], hash_combine(0, xxh64(&v8[i].to_le_bytes())));
            assert_eq!(h16[i], hash_combine(0, xxh64(&v16[i].to_le_bytes())));
            assert_eq!(h128[i], hash_combine(0, xxh64(&v128[i].to_le_bytes())));
        }
    }

    #[test]
    fn mismatched_lengths_are_rejected() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let a = stream.from_host(&[1u32, 2]).unwrap();
        let b = stream.from_host(&[1u64]).unwrap();
        let cols = [
            HashColumn::fixed(a.as_slice(), None),
            HashColumn::fixed(b.as_slice(), None),
        ];
        assert!(hash_columns(&stream, &cols, 0).is_err());
    }
}
