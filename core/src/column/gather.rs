//! Row selection on device columns: `out[i] = column[indices[i]]`, for every layout.
//!
//! Used by filters (after compaction) and, later, joins and sorts. Validity is gathered with
//! the values; the output's bitmaps start at bit 0.

use spate_kernels::gather::{self as kg, DeviceStrings};
use spate_kernels::{DeviceBitmap, DeviceSlice, Stream};

use super::{DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues};
use crate::error::{Result, SpateError};

/// Gathers `indices` (which must all be valid rows of `column`) into a new column.
pub fn gather_column(
    stream: &Stream,
    column: &DeviceColumn,
    indices: DeviceSlice<'_, u32>,
) -> Result<DeviceColumn> {
    gather_rows(stream, column, indices, false)
}

/// [`gather_column`] where indices may also be `NULL_INDEX` ("no row", as outer joins
/// produce), which gives NULL.
pub fn gather_column_or_null(
    stream: &Stream,
    column: &DeviceColumn,
    indices: DeviceSlice<'_, u32>,
) -> Result<DeviceColumn> {
    gather_rows(stream, column, indices, true)
}

fn gather_rows(
    stream: &Stream,
    column: &DeviceColumn,
    indices: DeviceSlice<'_, u32>,
    may_be_null: bool,
) -> Result<DeviceColumn> {
    let n = indices.len();
    let validity = column.validity().map(|v| v.bitmap());
    // A bitmap when the column has one, or when an index may be NULL_INDEX ("no row"). Its
    // nulls are not counted: that would cost a readback per column (`count_nulls` does it
    // where a consumer needs the number).
    let validity = if n > 0 && (validity.is_some() || may_be_null) {
        let bits = kg::gather_bitmap(stream, validity, indices)?;
        Some(DeviceValidity {
            bytes: DeviceBytes::new(bits),
            offset: 0,
        })
    } else {
        None
    };
    let values = match column.values() {
        DeviceValues::Fixed { bytes, width } => {
            let out = match width {
                1 => kg::gather(stream, bytes.typed::<u8>()?, indices)?.into_bytes(),
                2 => kg::gather(stream, bytes.typed::<u16>()?, indices)?.into_bytes(),
                4 => kg::gather(stream, bytes.typed::<u32>()?, indices)?.into_bytes(),
                8 => kg::gather(stream, bytes.typed::<u64>()?, indices)?.into_bytes(),
                16 => kg::gather(stream, bytes.typed::<u128>()?, indices)?.into_bytes(),
                other => {
                    return Err(SpateError::Internal {
                        message: format!("no gather for {other}-byte values"),
                    });
                }
            };
            DeviceValues::Fixed {
                bytes: DeviceBytes::new(out),
                width: *width,
            }
        }
        DeviceValues::Bits { bytes, offset } => {
            let bitmap = DeviceBitmap::new(bytes.as_slice()).with_offset(*offset);
            DeviceValues::Bits {
                bytes: DeviceBytes::new(kg::gather_bitmap(stream, Some(bitmap), indices)?),
                offset: 0,
            }
        }
        DeviceValues::Utf8 { offsets, bytes } => {
            let strings = DeviceStrings {
                offsets: offsets.typed::<i32>()?,
                bytes: bytes.as_slice(),
            };
            let out = kg::gather_strings(stream, strings, indices)?;
            DeviceValues::Utf8 {
                offsets: DeviceBytes::new(out.offsets.into_bytes()),
                bytes: DeviceBytes::new(out.bytes),
            }
        }
        DeviceValues::LargeUtf8 { offsets, bytes } => {
            let strings = DeviceStrings {
                offsets: offsets.typed::<i64>()?,
                bytes: bytes.as_slice(),
            };
            let out = kg::gather_strings(stream, strings, indices)?;
            DeviceValues::LargeUtf8 {
                offsets: DeviceBytes::new(out.offsets.into_bytes()),
                bytes: DeviceBytes::new(out.bytes),
            }
        }
    };
    Ok(DeviceColumn::with_uncounted_nulls(
        column.data_type().clone(),
        n,
        validity,
        values,
    ))
}
