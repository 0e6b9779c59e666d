//! Concatenation of device batches into one, on the device (what a sort or a hash build needs
//! before it can look at all of a partition's rows).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use spate_kernels::gather::{self as kg, bitmap_bytes};
use spate_kernels::{DeviceBitmap, Stream};

use super::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceCount, DeviceValidity, DeviceValues, RowCount,
    upload_batch,
};
use crate::error::{Result, SpateError};

/// One device batch holding every row of `batches`, in order. One batch is returned as it is
/// (its count may be on the device); several have their device counts read back first, all
/// in one transfer.
pub fn concat_device_batches(
    stream: &Stream,
    schema: &SchemaRef,
    mut batches: Vec<DeviceBatch>,
) -> Result<DeviceBatch> {
    match batches.len() {
        0 => return upload_batch(stream, &RecordBatch::new_empty(Arc::clone(schema))),
        1 => return Ok(batches.remove(0)),
        _ => {}
    }
    let batches = DeviceBatch::resolve_all(stream, batches)?;
    let rows: usize = batches.iter().map(DeviceBatch::bound).sum();
    let columns = (0..schema.fields().len())
        .map(|c| {
            let parts: Vec<&DeviceColumn> = batches.iter().map(|b| &b.columns()[c]).collect();
            concat_column(stream, &parts, rows)
        })
        .collect::<Result<Vec<_>>>()?;
    DeviceBatch::try_new(Arc::clone(schema), columns, rows)
}

/// A copy of `batch` (whose count is on the host) in allocations of its own, sized to its rows:
/// a small view no longer holds the large allocation it was cut from.
pub fn copy_device_batch(stream: &Stream, batch: &DeviceBatch) -> Result<DeviceBatch> {
    let batch = batch.resolve(stream)?;
    let rows = batch.bound();
    let columns = batch
        .columns()
        .iter()
        .map(|c| concat_column(stream, &[c], rows))
        .collect::<Result<Vec<_>>>()?;
    DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows)
}

/// One device batch holding every row of `batches`, in order, without reading any count
/// back: each column's parts are appended with one launch (`append_parts` in `gather.cu`),
/// part k after the live rows of the parts before it, and the merged batch's count stays on
/// the device, its bound the sum of the parts' bounds. For at most
/// [`kg::APPEND_PARTS`] parts of fixed-width and boolean columns; `None` when a column holds
/// strings (a string column's bytes past a device count would have no end the host knows:
/// see `DeviceColumn::prefix`), the parts store a column differently, or there are too many
/// parts or rows, and the caller reads the counts instead.
pub fn append_device_batches(
    stream: &Stream,
    schema: &SchemaRef,
    batches: &[DeviceBatch],
) -> Result<Option<DeviceBatch>> {
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    let appendable = (0..schema.fields().len()).all(|c| {
        let kind = std::mem::discriminant(first.columns()[c].values());
        batches.iter().all(|b| {
            let v = b.columns()[c].values();
            std::mem::discriminant(v) == kind
                && matches!(v, DeviceValues::Fixed { .. } | DeviceValues::Bits { .. })
        })
    });
    if !appendable || batches.len() > kg::APPEND_PARTS {
        return Ok(None);
    }
    let bound: usize = batches.iter().map(DeviceBatch::bound).sum();
    if bound >= u32::MAX as usize {
        // Past what a u32 count holds.
        return Ok(None);
    }
    let count = DeviceCount::new(stream.alloc::<u32>(1)?)?;
    // The first launch writes the merged count (a batch of no columns launches for it alone).
    let mut count_to = Some(count.as_slice());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (c, field) in schema.fields().iter().enumerate() {
        let validity = if batches.iter().any(|b| b.columns()[c].validity().is_some()) {
            let mut bits = stream.alloc_zeroed::<u8>(bitmap_bytes(bound))?;
            let parts: Vec<kg::AppendPart<'_>> = batches
                .iter()
                .map(|b| {
                    let v = b.columns()[c].validity();
                    part(b, v.map(|v| v.bytes.as_slice()), v.map_or(0, |v| v.offset))
                })
                .collect();
            kg::append_parts(stream, None, &parts, Some(&mut bits), count_to.take())?;
            Some(DeviceValidity {
                bytes: DeviceBytes::new(bits),
                offset: 0,
            })
        } else {
            None
        };
        let values = match first.columns()[c].values() {
            DeviceValues::Fixed { width, .. } => {
                let width = *width;
                let mut out = stream.alloc::<u8>((bound * width).max(1))?;
                let parts = batches
                    .iter()
                    .map(|b| match b.columns()[c].values() {
                        DeviceValues::Fixed { bytes, .. } => Ok(part(b, Some(bytes.as_slice()), 0)),
                        _ => Err(mixed()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                kg::append_parts(stream, Some(width), &parts, Some(&mut out), count_to.take())?;
                DeviceValues::Fixed {
                    bytes: DeviceBytes::new(out),
                    width,
                }
            }
            _ => {
                let mut out = stream.alloc_zeroed::<u8>(bitmap_bytes(bound))?;
                let parts = batches
                    .iter()
                    .map(|b| match b.columns()[c].values() {
                        DeviceValues::Bits { bytes, offset } => {
                            Ok(part(b, Some(bytes.as_slice()), *offset))
                        }
                        _ => Err(mixed()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                kg::append_parts(stream, None, &parts, Some(&mut out), count_to.take())?;
                DeviceValues::Bits {
                    bytes: DeviceBytes::new(out),
                    offset: 0,
                }
            }
        };
        columns.push(match validity {
            Some(v) => DeviceColumn::with_uncounted_nulls(
                field.data_type().clone(),
                bound,
                Some(v),
                values,
            ),
            None => DeviceColumn::new(field.data_type().clone(), bound, 0, None, values),
        });
    }
    if let Some(count_to) = count_to {
        let parts: Vec<kg::AppendPart<'_>> = batches.iter().map(|b| part(b, None, 0)).collect();
        kg::append_parts(stream, None, &parts, None, Some(count_to))?;
    }
    Ok(Some(DeviceBatch::try_new_counted(
        Arc::clone(schema),
        columns,
        RowCount::Device { bound, word: count },
    )?))
}

/// Part `b` of an append: `src` (values or a bitmap at bit `src_offset`), up to its count.
fn part<'a>(
    b: &'a DeviceBatch,
    src: Option<spate_kernels::DeviceSlice<'a, u8>>,
    src_offset: usize,
) -> kg::AppendPart<'a> {
    kg::AppendPart {
        src,
        src_offset,
        live: b.row_count().live(),
        n: b.bound(),
    }
}

/// The kernel launches [`append_device_batches`] makes for `batches`: one per column, one
/// per column with a validity bitmap in any part, and one for the count alone when there are
/// no columns.
#[cfg(test)]
pub fn append_launches(batches: &[DeviceBatch]) -> usize {
    let Some(first) = batches.first() else {
        return 0;
    };
    let columns = first.columns().len();
    let bitmaps = (0..columns)
        .filter(|&c| batches.iter().any(|b| b.columns()[c].validity().is_some()))
        .count();
    (columns + bitmaps).max(1)
}

fn concat_column(stream: &Stream, parts: &[&DeviceColumn], rows: usize) -> Result<DeviceColumn> {
    let first = parts[0];
    // Known when every part's is; a part without a bitmap has no nulls.
    let null_count: Option<usize> = parts.iter().map(|p| p.null_count()).sum();
    let validity = if parts.iter().any(|p| p.validity().is_some()) {
        let mut bits = stream.alloc_zeroed::<u8>(bitmap_bytes(rows))?;
        let mut at = 0;
        for p in parts {
            kg::copy_bitmap(
                stream,
                p.validity().map(DeviceValidity::bitmap),
                p.len(),
                &mut bits,
                at,
            )?;
            at += p.len();
        }
        Some(DeviceValidity {
            bytes: DeviceBytes::new(bits),
            offset: 0,
        })
    } else {
        None
    };
    let values = match first.values() {
        DeviceValues::Fixed { width, .. } => {
            let width = *width;
            let mut out = stream.alloc::<u8>(rows * width)?;
            let mut at = 0;
            for p in parts {
                let DeviceValues::Fixed { bytes, .. } = p.values() else {
                    return Err(mixed());
                };
                stream.copy_device(bytes.as_slice(), &mut out, at)?;
                at += bytes.len();
            }
            DeviceValues::Fixed {
                bytes: DeviceBytes::new(out),
                width,
            }
        }
        DeviceValues::Bits { .. } => {
            let mut out = stream.alloc_zeroed::<u8>(bitmap_bytes(rows))?;
            let mut at = 0;
            for p in parts {
                let DeviceValues::Bits { bytes, offset } = p.values() else {
                    return Err(mixed());
                };
                let src = DeviceBitmap::new(bytes.as_slice()).with_offset(*offset);
                kg::copy_bitmap(stream, Some(src), p.len(), &mut out, at)?;
                at += p.len();
            }
            DeviceValues::Bits {
                bytes: DeviceBytes::new(out),
                offset: 0,
            }
        }
        // Parts may store their offsets at either width (an operator that outgrew 32-bit
        // offsets, a batch that came back from the host): any 64-bit part makes the whole
        // column 64-bit, its 32-bit parts widened.
        DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. }
            if parts
                .iter()
                .any(|p| matches!(p.values(), DeviceValues::LargeUtf8 { .. })) =>
        {
            let (offsets, bytes) = concat_strings::<i64>(stream, parts, rows)?;
            DeviceValues::LargeUtf8 { offsets, bytes }
        }
        DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. } => {
            let (offsets, bytes) = concat_strings::<i32>(stream, parts, rows)?;
            DeviceValues::Utf8 { offsets, bytes }
        }
    };
    let data_type = first.data_type().clone();
    // Known when every part's is.
    let longest = parts
        .iter()
        .map(|p| p.longest_string())
        .collect::<Option<Vec<_>>>()
        .and_then(|l| l.into_iter().max());
    Ok(match null_count {
        Some(nulls) => DeviceColumn::new(data_type, rows, nulls, validity, values),
        None => DeviceColumn::with_uncounted_nulls(data_type, rows, validity, values),
    }
    .with_longest_string(longest))
}

fn mixed() -> SpateError {
    SpateError::Internal {
        message: "device batches of one schema store a column differently".into(),
    }
}

trait Offset: kg::OffsetElem + Into<spate_kernels::KernelArg> {
    /// 64-bit offsets.
    const WIDE: bool;
    fn from_len(len: usize) -> Result<Self>;
    /// Copies 32-bit offsets into these (64-bit) ones at `at`, adding `delta`.
    fn widen(
        stream: &Stream,
        src: spate_kernels::DeviceSlice<'_, i32>,
        delta: usize,
        dst: &mut spate_kernels::DeviceBuffer<Self>,
        at: usize,
    ) -> Result<()>;
}

impl Offset for i32 {
    const WIDE: bool = false;

    fn widen(
        _: &Stream,
        _: spate_kernels::DeviceSlice<'_, i32>,
        _: usize,
        _: &mut spate_kernels::DeviceBuffer<Self>,
        _: usize,
    ) -> Result<()> {
        Err(mixed())
    }

    fn from_len(len: usize) -> Result<Self> {
        i32::try_from(len).map_err(|_| SpateError::ResourcesExhausted {
            message: format!(
                "{len} bytes of strings exceed what 32-bit offsets address; use LargeUtf8"
            ),
        })
    }
}

impl Offset for i64 {
    const WIDE: bool = true;

    fn widen(
        stream: &Stream,
        src: spate_kernels::DeviceSlice<'_, i32>,
        delta: usize,
        dst: &mut spate_kernels::DeviceBuffer<Self>,
        at: usize,
    ) -> Result<()> {
        Ok(kg::widen_offsets(stream, src, delta as i64, dst, at)?)
    }

    fn from_len(len: usize) -> Result<Self> {
        Ok(len as i64)
    }
}

fn concat_strings<O: Offset>(
    stream: &Stream,
    parts: &[&DeviceColumn],
    rows: usize,
) -> Result<(DeviceBytes, DeviceBytes)> {
    let total: usize = parts
        .iter()
        .map(|p| match p.values() {
            DeviceValues::Utf8 { bytes, .. } | DeviceValues::LargeUtf8 { bytes, .. } => bytes.len(),
            _ => 0,
        })
        .sum();
    O::from_len(total)?;
    let mut offsets = stream.alloc::<O>(rows + 1)?;
    let mut data = stream.alloc::<u8>(total)?;
    let (mut row, mut byte) = (0usize, 0usize);
    for p in parts {
        let (DeviceValues::Utf8 {
            offsets: src,
            bytes,
        }
        | DeviceValues::LargeUtf8 {
            offsets: src,
            bytes,
        }) = p.values()
        else {
            return Err(mixed());
        };
        // Each part's offsets start at 0; shifting them by the bytes before it makes its first
        // offset equal the previous part's last, which it overwrites with the same value.
        let narrow = matches!(p.values(), DeviceValues::Utf8 { .. });
        if narrow && O::WIDE {
            O::widen(stream, src.typed::<i32>()?, byte, &mut offsets, row)?;
        } else if !narrow && !O::WIDE {
            return Err(mixed());
        } else {
            kg::add_offsets(
                stream,
                src.typed::<O>()?,
                O::from_len(byte)?,
                &mut offsets,
                row,
            )?;
        }
        stream.copy_device(bytes.as_slice(), &mut data, byte)?;
        row += p.len();
        byte += bytes.len();
    }
    Ok((
        DeviceBytes::new(offsets.into_bytes()),
        DeviceBytes::new(data),
    ))
}
