//! Cutting a device batch into row ranges, for an operator that retries a batch in halves when
//! the device runs out of memory (`exec/retry.rs`).
//!
//! Fixed-width values and bitmaps are views at an offset: no copy. A string column's offsets
//! must start at 0 and its bytes end at its last offset (see [`DeviceValues::Utf8`]; a
//! concatenation relies on both), so a range reads back where its offsets start and end (one
//! readback per string column), its bytes are a view of exactly that span, and its offsets
//! are a view too when they start at 0, else copied and rebased by a small kernel.

use std::sync::Arc;

use spate_kernels::Stream;
use spate_kernels::gather::{OffsetElem, add_offsets};

use super::{DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues};
use crate::error::{Result, SpateError};

impl DeviceColumn {
    /// Rows `start..start + rows`: a view, but for a string column's offsets that do not start
    /// at 0 (see the module docs). The nulls are counted again when needed.
    pub fn slice(&self, stream: &Stream, start: usize, rows: usize) -> Result<DeviceColumn> {
        if start.checked_add(rows).is_none_or(|end| end > self.len) {
            return Err(SpateError::Internal {
                message: format!("rows {start}..+{rows} of a {}-row device column", self.len),
            });
        }
        let strings = matches!(
            self.values,
            DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. }
        );
        if start == 0 && !strings {
            return self.prefix(rows);
        }
        let values = match &self.values {
            DeviceValues::Fixed { bytes, width } => DeviceValues::Fixed {
                bytes: DeviceBytes::range(
                    &bytes.buffer,
                    bytes.offset + start * width,
                    rows * width,
                ),
                width: *width,
            },
            DeviceValues::Bits { bytes, offset } => DeviceValues::Bits {
                bytes: bytes.clone(),
                offset: offset + start,
            },
            DeviceValues::Utf8 { offsets, bytes } => {
                let (offsets, bytes) = rebased::<i32>(stream, offsets, bytes, start, rows)?;
                DeviceValues::Utf8 { offsets, bytes }
            }
            DeviceValues::LargeUtf8 { offsets, bytes } => {
                let (offsets, bytes) = rebased::<i64>(stream, offsets, bytes, start, rows)?;
                DeviceValues::LargeUtf8 { offsets, bytes }
            }
        };
        let validity = self.validity.as_ref().map(|v| DeviceValidity {
            bytes: v.bytes.clone(),
            offset: v.offset + start,
        });
        let mut column =
            DeviceColumn::with_uncounted_nulls(self.data_type.clone(), rows, validity, values);
        if self.null_count == Some(0) {
            column.null_count = Some(0);
        }
        column.longest_string = self.longest_string;
        Ok(column)
    }
}

/// Offsets `start..=start + rows` rebased to start at 0, and exactly the bytes they span.
fn rebased<O>(
    stream: &Stream,
    offsets: &DeviceBytes,
    bytes: &DeviceBytes,
    start: usize,
    rows: usize,
) -> Result<(DeviceBytes, DeviceBytes)>
where
    O: OffsetElem
        + Into<spate_kernels::KernelArg>
        + TryInto<usize>
        + TryFrom<usize>
        + std::ops::Neg<Output = O>,
{
    if rows == 0 {
        // No bytes, and the one offset 0.
        let zero = stream.alloc_zeroed::<O>(1)?;
        let none = DeviceBytes::new(stream.alloc::<u8>(0)?);
        return Ok((DeviceBytes::new(zero.into_bytes()), none));
    }
    let all = offsets.typed::<O>()?;
    let own = all.slice(start..start + rows + 1)?;
    // Where the rows' bytes start and end, in one readback.
    let mut ends = stream.alloc::<O>(2)?;
    stream.copy_device(own.slice(0..1)?, &mut ends, 0)?;
    stream.copy_device(own.slice(rows..rows + 1)?, &mut ends, 1)?;
    let ends = stream.to_vec(ends.as_slice())?;
    let offset = |o: O| -> Result<usize> {
        o.try_into().map_err(|_| SpateError::Internal {
            message: "a negative string offset on the device".into(),
        })
    };
    let (base, end) = (offset(ends[0])?, offset(ends[1])?);
    if base > end || end > bytes.len() {
        return Err(SpateError::Internal {
            message: format!("string offsets {base}..{end} into {} bytes", bytes.len()),
        });
    }
    let width = size_of::<O>();
    let offsets = if base == 0 {
        DeviceBytes::range(
            &offsets.buffer,
            offsets.offset + start * width,
            (rows + 1) * width,
        )
    } else {
        let delta = O::try_from(base).map_err(|_| SpateError::Internal {
            message: "a string offset past its type".into(),
        })?;
        let mut out = stream.alloc::<O>(rows + 1)?;
        add_offsets(stream, own, -delta, &mut out, 0)?;
        DeviceBytes::new(out.into_bytes())
    };
    let bytes = DeviceBytes::range(&bytes.buffer, bytes.offset + base, end - base);
    Ok((offsets, bytes))
}

impl DeviceBatch {
    /// Rows `start..start + rows` of a batch whose row count is on the host (see
    /// [`DeviceColumn::slice`]).
    pub fn slice(&self, stream: &Stream, start: usize, rows: usize) -> Result<DeviceBatch> {
        let Some(total) = self.host_rows() else {
            return Err(SpateError::Internal {
                message: "a slice of a device batch whose row count is on the device".into(),
            });
        };
        if start + rows > total {
            return Err(SpateError::Internal {
                message: format!("rows {start}..+{rows} of a {total}-row device batch"),
            });
        }
        let columns = self
            .columns()
            .iter()
            .map(|c| c.slice(stream, start, rows))
            .collect::<Result<Vec<_>>>()?;
        DeviceBatch::try_new(Arc::clone(self.schema()), columns, rows)
    }
}
