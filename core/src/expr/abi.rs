//! The parameter layout of generated kernels, documented once here for every kernel that reads
//! columns: expression kernels (predicates and values), aggregation and joins.
//!
//! **A column** is five parameters, `(const u8* d, const u8* e, u64 b, const u8* v, u64 o)`
//! (named with the column's slot `k`, and a prefix where a kernel reads several lists):
//! - `d`: the values; for strings the offsets;
//! - `e`: for strings the bytes, else null;
//! - `b`: for strings the offset width in bytes (4 or 8), for booleans the bit offset of row 0,
//!   else 0;
//! - `v`, `o`: the validity bitmap and the bit offset of row 0 in it; `v` is null when no row is
//!   NULL.
//!
//! **A runtime scalar** ([`super::RuntimeScalar`]) is three, `(u64 sa, u64 sb, u32 sn)`: the
//! value's bits (low and high word; a Decimal128 uses both) and 1 for NULL.
//!
//! **A query vector** (a distance's constant vector) is one, `const f32* qv{k}`: its elements
//! in device memory, copied there at each launch ([`input_args`]). An embedding column is a
//! column like any other: `d` holds its rows of elements end to end.
//!
//! **An expression kernel** takes its columns, then its runtime scalars, then its query
//! vectors, in the order its builder returns them, then its outputs:
//! - a predicate: `(const u32* live, u64 n, u8* out)`: a byte per row, 1 where the predicate is
//!   TRUE;
//! - values: `(const u32* live, u64 n, const u32* rows, u32 pass)` and, per output,
//!   `(T* values, u32* validity_words)`, or for a string output
//!   `(u64* offsets, u8* bytes, u32* validity_words)` (see [`super::ValueKernel`]);
//!
//! and last, when it can fail, `u32* err`: the error word, a bit per kind of error
//! ([`ErrorBits`]). `live` is a device row count the rows stop at, or null for `n` (see
//! `spate::live_rows`).

use std::fmt::Write as _;
use std::sync::Arc;

use arrow::datatypes::DataType;

use super::scalars::RuntimeScalar;
use crate::column::{DeviceBatch, DeviceColumn, DeviceValues};
use crate::error::{Result, SpateError};
use spate_kernels::{DeviceBuffer, KernelArg};

/// A column the generated kernel reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInput {
    /// Index in the operator's input schema.
    pub index: usize,
    /// The column's Arrow type.
    pub data_type: DataType,
}

/// The bits of a kernel's error word.
pub(crate) struct ErrorBits;

impl ErrorBits {
    /// An arithmetic overflow.
    pub(crate) const OVERFLOW: u32 = 1;
    /// An integer division (or remainder) by zero.
    pub(crate) const DIVIDE_BY_ZERO: u32 = 2;
    /// A value a cast cannot represent in the target type.
    pub(crate) const CAST: u32 = 4;
    /// A decimal too large for its target precision.
    pub(crate) const PRECISION: u32 = 8;
    /// Another failure Arrow reports as a compute error (`abs` of a signed integer's MIN).
    pub(crate) const COMPUTE: u32 = 16;
}

/// The C parameters of `count` columns named with `prefix`, each followed by `, `.
pub(crate) fn column_params(prefix: &str, count: usize) -> String {
    let mut params = String::new();
    for k in 0..count {
        let _ = write!(
            params,
            "const u8* {prefix}d{k}, const u8* {prefix}e{k}, u64 {prefix}b{k}, const u8* {prefix}v{k}, u64 {prefix}o{k}, "
        );
    }
    params
}

/// The C parameters of `count` runtime scalars, each followed by `, `.
pub(crate) fn scalar_params(count: usize) -> String {
    let mut params = String::new();
    for k in 0..count {
        let _ = write!(params, "u64 sa{k}, u64 sb{k}, u32 sn{k}, ");
    }
    params
}

/// The C parameters of `count` query vectors, each followed by `, `.
pub(crate) fn vector_params(count: usize) -> String {
    (0..count).map(|k| format!("const f32* qv{k}, ")).collect()
}

/// The launch arguments of a kernel's input columns, runtime scalars and query vectors, from
/// `batch`; the query vectors are copied to the device on `stream`, into the buffers returned
/// (to be kept until the kernel has been launched: they are freed in stream order).
pub(crate) fn input_args(
    inputs: &[KernelInput],
    scalars: &[RuntimeScalar],
    vectors: &[Arc<[f32]>],
    batch: &DeviceBatch,
    stream: &spate_kernels::Stream,
) -> Result<(Vec<KernelArg>, Vec<DeviceBuffer<f32>>)> {
    let mut args = Vec::with_capacity(inputs.len() * 5 + scalars.len() * 3 + vectors.len() + 8);
    for input in inputs {
        let column = batch
            .columns()
            .get(input.index)
            .ok_or_else(|| SpateError::Internal {
                message: format!("a kernel reads column {} of a narrower batch", input.index),
            })?;
        column_args(column, &mut args);
    }
    for scalar in scalars {
        args.extend(scalar.launch_args()?);
    }
    let mut held = Vec::with_capacity(vectors.len());
    for vector in vectors {
        let buffer = stream.from_host(vector)?;
        args.push((&buffer).into());
        held.push(buffer);
    }
    Ok((args, held))
}

/// The five launch arguments of one column.
pub(crate) fn column_args(column: &DeviceColumn, args: &mut Vec<KernelArg>) {
    let (data, extra, aux) = match column.values() {
        DeviceValues::Fixed { bytes, .. } => (bytes.as_slice().address(), 0, 0),
        DeviceValues::Bits { bytes, offset } => (bytes.as_slice().address(), 0, *offset),
        DeviceValues::Utf8 { offsets, bytes } => {
            (offsets.as_slice().address(), bytes.as_slice().address(), 4)
        }
        DeviceValues::LargeUtf8 { offsets, bytes } => {
            (offsets.as_slice().address(), bytes.as_slice().address(), 8)
        }
    };
    args.push(KernelArg::Ptr(data));
    args.push(KernelArg::Ptr(extra));
    args.push(KernelArg::U64(aux as u64));
    match column.validity() {
        Some(v) => {
            args.push(KernelArg::Ptr(v.bytes.as_slice().address()));
            args.push(KernelArg::U64(v.offset as u64));
        }
        None => {
            args.push(KernelArg::null());
            args.push(KernelArg::U64(0));
        }
    }
}
