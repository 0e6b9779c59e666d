//! Arrow → device (one pinned staging buffer and one asynchronous copy per batch) and device →
//! Arrow (asynchronous copies into one pinned buffer, one wait).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, BooleanArray, GenericStringArray, LargeStringArray,
    OffsetSizeTrait, StringArray, StringViewArray, make_array,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use spate_kernels::{DeviceSlice, Stream};

use super::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, Layout, device_layout,
};
use crate::error::{Result, SpateError};

/// Alignment of each segment in a batch's arena: enough for any value type (Decimal128 is 16)
/// and a cache line, so kernels read aligned data.
const SEGMENT_ALIGN: usize = 64;

/// Host data for one segment of the arena.
enum Source<'a> {
    Bytes(&'a [u8]),
    /// A shared Arrow buffer (a cheap reference-counted clone) and a byte range of it.
    Buffer(Buffer, usize, usize),
    /// String offsets rebased so the first is 0.
    Offsets32(&'a [i32]),
    Offsets64(&'a [i64]),
    /// Utf8View rows turned into offsets (i32 or i64) and bytes.
    ViewOffsets(&'a StringViewArray, bool),
    ViewBytes(&'a StringViewArray),
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Source::Bytes(b) => b.len(),
            Source::Buffer(_, _, len) => *len,
            Source::Offsets32(o) => o.len() * 4,
            Source::Offsets64(o) => o.len() * 8,
            Source::ViewOffsets(a, wide) => (a.len() + 1) * if *wide { 8 } else { 4 },
            Source::ViewBytes(a) => view_bytes(a),
        }
    }

    fn write(&self, out: &mut [u8]) {
        match self {
            Source::Bytes(b) => out.copy_from_slice(b),
            Source::Buffer(b, start, len) => {
                out.copy_from_slice(&b.as_slice()[*start..start + len])
            }
            Source::Offsets32(o) => {
                let base = o.first().copied().unwrap_or(0);
                for (chunk, v) in out.chunks_exact_mut(4).zip(o.iter()) {
                    chunk.copy_from_slice(&(v - base).to_le_bytes());
                }
            }
            Source::Offsets64(o) => {
                let base = o.first().copied().unwrap_or(0);
                for (chunk, v) in out.chunks_exact_mut(8).zip(o.iter()) {
                    chunk.copy_from_slice(&(v - base).to_le_bytes());
                }
            }
            Source::ViewOffsets(a, wide) => {
                let mut at = 0u64;
                let width = if *wide { 8 } else { 4 };
                let mut chunks = out.chunks_exact_mut(width);
                for i in 0..=a.len() {
                    if let Some(chunk) = chunks.next() {
                        if *wide {
                            chunk.copy_from_slice(&(at as i64).to_le_bytes());
                        } else {
                            chunk.copy_from_slice(&(at as i32).to_le_bytes());
                        }
                    }
                    if i < a.len() && a.is_valid(i) {
                        at += a.value(i).len() as u64;
                    }
                }
            }
            Source::ViewBytes(a) => {
                let mut at = 0;
                for i in 0..a.len() {
                    if a.is_valid(i) {
                        let v = a.value(i).as_bytes();
                        out[at..at + v.len()].copy_from_slice(v);
                        at += v.len();
                    }
                }
            }
        }
    }
}

fn view_bytes(a: &StringViewArray) -> usize {
    (0..a.len())
        .filter(|i| a.is_valid(*i))
        .map(|i| a.value(i).len())
        .sum()
}

/// The bytes covering `len` bits from bit `offset` of `bytes`, and the bit offset within them.
fn bit_range(bytes: &[u8], offset: usize, len: usize) -> (&[u8], usize) {
    let start = offset / 8;
    let end = (offset + len).div_ceil(8);
    (&bytes[start..end], offset % 8)
}

/// What one column needs uploaded, and how to assemble it from the arena.
struct ColumnPlan<'a> {
    data_type: DataType,
    len: usize,
    null_count: usize,
    validity: Option<(Source<'a>, usize)>,
    shape: Shape<'a>,
}

enum Shape<'a> {
    Fixed(Source<'a>, usize),
    Bits(Source<'a>, usize),
    Strings {
        offsets: Source<'a>,
        bytes: Source<'a>,
        wide: bool,
    },
}

fn unsupported(name: &str, data_type: &DataType) -> SpateError {
    SpateError::Unsupported {
        message: format!(
            "column `{name}` has type {data_type}, which the GPU backend does not support yet; \
             supported: integers, floats, booleans, dates, times, timestamps, durations, \
             Decimal128 and strings"
        ),
    }
}

fn plan_column<'a>(name: &str, array: &'a dyn Array) -> Result<ColumnPlan<'a>> {
    let data_type = array.data_type().clone();
    let layout = device_layout(&data_type).ok_or_else(|| unsupported(name, &data_type))?;
    let len = array.len();
    let validity = array.nulls().filter(|n| n.null_count() > 0).map(|n| {
        let bits = n.inner();
        let (bytes, offset) = bit_range(bits.values(), bits.offset(), len);
        (Source::Bytes(bytes), offset)
    });
    let shape = match layout {
        Layout::Fixed(width) => {
            let data = array.to_data();
            let buffer = data.buffers().first().ok_or_else(|| SpateError::Internal {
                message: format!("column `{name}` ({data_type}) has no value buffer"),
            })?;
            let start = data.offset() * width;
            if buffer.len() < start + len * width {
                return Err(SpateError::Internal {
                    message: format!("column `{name}` value buffer is shorter than its rows"),
                });
            }
            Shape::Fixed(Source::Buffer(buffer.clone(), start, len * width), width)
        }
        Layout::Bits => {
            let values = array
                .as_any()
                .downcast_ref::<BooleanArray>()
                .ok_or_else(|| unsupported(name, &data_type))?
                .values();
            let (bytes, offset) = bit_range(values.values(), values.offset(), len);
            Shape::Bits(Source::Bytes(bytes), offset)
        }
        Layout::Strings | Layout::LargeStrings => {
            if let Some(a) = array.as_any().downcast_ref::<StringArray>() {
                let offsets = a.value_offsets();
                let (first, last) = (offsets[0] as usize, offsets[len] as usize);
                Shape::Strings {
                    offsets: Source::Offsets32(offsets),
                    bytes: Source::Bytes(&a.value_data()[first..last]),
                    wide: false,
                }
            } else if let Some(a) = array.as_any().downcast_ref::<LargeStringArray>() {
                let offsets = a.value_offsets();
                let (first, last) = (offsets[0] as usize, offsets[len] as usize);
                Shape::Strings {
                    offsets: Source::Offsets64(offsets),
                    bytes: Source::Bytes(&a.value_data()[first..last]),
                    wide: true,
                }
            } else if let Some(a) = array.as_any().downcast_ref::<StringViewArray>() {
                let wide = view_bytes(a) > i32::MAX as usize;
                Shape::Strings {
                    offsets: Source::ViewOffsets(a, wide),
                    bytes: Source::ViewBytes(a),
                    wide,
                }
            } else {
                return Err(unsupported(name, &data_type));
            }
        }
    };
    Ok(ColumnPlan {
        data_type,
        len,
        null_count: array.null_count(),
        validity,
        shape,
    })
}

/// Uploads a record batch: one pinned staging buffer, one asynchronous copy, one allocation.
pub fn upload_batch(stream: &Stream, batch: &RecordBatch) -> Result<DeviceBatch> {
    let schema = batch.schema();
    let plans = schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, a)| plan_column(f.name(), a.as_ref()))
        .collect::<Result<Vec<_>>>()?;

    // Lay the segments out in the arena.
    let mut total = 0usize;
    let mut place = |s: &Source<'_>| {
        let at = total.next_multiple_of(SEGMENT_ALIGN);
        total = at + s.len();
        (at, s.len())
    };
    struct Placed {
        validity: Option<(usize, usize)>,
        first: (usize, usize),
        second: Option<(usize, usize)>,
    }
    let mut placed = Vec::with_capacity(plans.len());
    for p in &plans {
        let validity = p.validity.as_ref().map(|(s, _)| place(s));
        let (first, second) = match &p.shape {
            Shape::Fixed(s, _) | Shape::Bits(s, _) => (place(s), None),
            Shape::Strings { offsets, bytes, .. } => (place(offsets), Some(place(bytes))),
        };
        placed.push(Placed {
            validity,
            first,
            second,
        });
    }

    let device = stream.device();
    let mut staging = device.pinned(total)?;
    {
        let out = staging.as_bytes_mut()?;
        for (p, at) in plans.iter().zip(&placed) {
            if let (Some((s, _)), Some((o, n))) = (&p.validity, at.validity) {
                s.write(&mut out[o..o + n]);
            }
            let (o, n) = at.first;
            match &p.shape {
                Shape::Fixed(s, _) | Shape::Bits(s, _) => s.write(&mut out[o..o + n]),
                Shape::Strings { offsets, bytes, .. } => {
                    offsets.write(&mut out[o..o + n]);
                    if let Some((o2, n2)) = at.second {
                        bytes.write(&mut out[o2..o2 + n2]);
                    }
                }
            }
        }
    }
    let mut arena = stream.alloc::<u8>(total)?;
    stream.upload_pinned(&mut staging, &mut arena)?;
    // Dropping the staging buffer does not wait: it is retired until the copy completes.
    drop(staging);
    let arena = Arc::new(arena);
    let range = |(o, n): (usize, usize)| DeviceBytes::range(&arena, o, n);

    let columns = plans
        .into_iter()
        .zip(placed)
        .map(|(p, at)| {
            let validity = p
                .validity
                .as_ref()
                .zip(at.validity)
                .map(|((_, bit_offset), r)| DeviceValidity {
                    bytes: range(r),
                    offset: *bit_offset,
                });
            let values = match p.shape {
                Shape::Fixed(_, width) => DeviceValues::Fixed {
                    bytes: range(at.first),
                    width,
                },
                Shape::Bits(_, offset) => DeviceValues::Bits {
                    bytes: range(at.first),
                    offset,
                },
                Shape::Strings { wide, .. } => {
                    let offsets = range(at.first);
                    let bytes = range(at.second.unwrap_or((at.first.0, 0)));
                    if wide {
                        DeviceValues::LargeUtf8 { offsets, bytes }
                    } else {
                        DeviceValues::Utf8 { offsets, bytes }
                    }
                }
            };
            DeviceColumn::new(p.data_type, p.len, p.null_count, validity, values)
        })
        .collect();
    DeviceBatch::try_new(schema, columns, batch.num_rows())
}

/// Uploads one array as a column.
pub fn upload_column(stream: &Stream, array: &ArrayRef) -> Result<DeviceColumn> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "c",
        array.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema, vec![Arc::clone(array)])?;
    let mut uploaded = upload_batch(stream, &batch)?;
    Ok(uploaded.columns.swap_remove(0))
}

/// Device slices of one column to copy back, in order. A validity bitmap comes back only up to
/// the byte holding the column's last row: kernels round their bitmaps up to whole words, and a
/// one-row result should not pay for them on the bus.
fn segments(column: &DeviceColumn) -> Result<Vec<DeviceSlice<'_, u8>>> {
    let mut out = Vec::with_capacity(3);
    if let Some(v) = column.validity() {
        let bitmap = v.bytes.as_slice();
        let used = (v.offset + column.len()).div_ceil(8).min(bitmap.len());
        out.push(bitmap.slice(..used)?);
    }
    match column.values() {
        DeviceValues::Fixed { bytes, .. } => out.push(bytes.as_slice()),
        // Booleans, like validity, only up to the byte of the last row: a column cut to a
        // device count keeps its whole bitmap.
        DeviceValues::Bits { bytes, offset } => {
            let bits = bytes.as_slice();
            let used = (offset + column.len()).div_ceil(8).min(bits.len());
            out.push(bits.slice(..used)?)
        }
        DeviceValues::Utf8 { offsets, bytes } | DeviceValues::LargeUtf8 { offsets, bytes } => {
            out.push(offsets.as_slice());
            out.push(bytes.as_slice());
        }
    }
    Ok(out)
}

/// Downloads a device batch into a record batch of its schema. A row count on the device is
/// read back first (4 bytes), so that only the rows come over the bus.
pub fn download_batch(stream: &Stream, batch: &DeviceBatch) -> Result<RecordBatch> {
    let batch = &batch.resolve(stream)?;
    let mut layout = Vec::new();
    let mut total = 0usize;
    for column in batch.columns() {
        let mut ranges = Vec::new();
        for s in segments(column)? {
            let at = total.next_multiple_of(SEGMENT_ALIGN);
            ranges.push((at, s.len()));
            total = at + s.len();
        }
        layout.push(ranges);
    }
    let mut staging = stream.device().pinned(total)?;
    for (column, ranges) in batch.columns().iter().zip(&layout) {
        for (s, (at, _)) in segments(column)?.into_iter().zip(ranges) {
            stream.download_pinned_at(s, &mut staging, *at)?;
        }
    }
    let host = staging.as_bytes()?;
    let arrays = batch
        .columns()
        .iter()
        .zip(&layout)
        .map(|(c, ranges)| {
            let parts: Vec<&[u8]> = ranges.iter().map(|(o, n)| &host[*o..*o + *n]).collect();
            build_array(c, &parts)
        })
        .collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.bound()));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(batch.schema()),
        arrays,
        &options,
    )?)
}

/// Downloads one column as an array of its type.
pub fn download_column(stream: &Stream, column: &DeviceColumn) -> Result<ArrayRef> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "c",
        column.data_type().clone(),
        true,
    )]));
    let batch = DeviceBatch::try_new(schema, vec![column.clone()], column.len())?;
    Ok(Arc::clone(download_batch(stream, &batch)?.column(0)))
}

fn build_array(column: &DeviceColumn, parts: &[&[u8]]) -> Result<ArrayRef> {
    let len = column.len();
    let (nulls, rest) = match column.validity() {
        Some(v) => {
            let bits = BooleanBuffer::new(Buffer::from_slice_ref(parts[0]), v.offset, len);
            // Kernels that do not count their nulls on the device always write a bitmap; one
            // with every bit set is dropped, so the array looks as an upload's would.
            let nulls = NullBuffer::new(bits);
            ((nulls.null_count() > 0).then_some(nulls), &parts[1..])
        }
        None => (None, parts),
    };
    let data_type = column.data_type();
    let array: ArrayRef = match column.values() {
        DeviceValues::Fixed { .. } => {
            let data = ArrayData::builder(data_type.clone())
                .len(len)
                .add_buffer(Buffer::from_slice_ref(rest[0]))
                .nulls(nulls)
                .build()?;
            make_array(data)
        }
        DeviceValues::Bits { offset, .. } => {
            let values = BooleanBuffer::new(Buffer::from_slice_ref(rest[0]), *offset, len);
            Arc::new(BooleanArray::new(values, nulls))
        }
        DeviceValues::Utf8 { .. } => {
            let offsets: Vec<i32> = rest[0]
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
            Arc::new(unchecked_strings::<i32>(
                offsets,
                Buffer::from_slice_ref(rest[1]),
                nulls,
            )?)
        }
        DeviceValues::LargeUtf8 { .. } => {
            let offsets: Vec<i64> = rest[0]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
            Arc::new(unchecked_strings::<i64>(
                offsets,
                Buffer::from_slice_ref(rest[1]),
                nulls,
            )?)
        }
    };
    if array.data_type() == data_type {
        Ok(array)
    } else {
        // Strings stored as offsets + bytes, downloaded as the planned type (e.g. Utf8View).
        Ok(arrow::compute::cast(&array, data_type)?)
    }
}

/// A string array from offsets and bytes the engine wrote itself, without validating them
/// again: the bytes are whole UTF-8 strings (uploaded from arrays Arrow validated, then copied,
/// or cut at character boundaries, by the kernels) and the offsets rise within them. Debug
/// builds, and so every test, still validate them, as an error rather than a panic.
fn unchecked_strings<O: OffsetSizeTrait>(
    offsets: OffsetBuffer<O>,
    values: Buffer,
    nulls: Option<NullBuffer>,
) -> Result<GenericStringArray<O>> {
    if cfg!(debug_assertions) {
        GenericStringArray::<O>::try_new(offsets.clone(), values.clone(), nulls.clone())?;
    }
    // SAFETY: as documented above; offsets and bytes come from the engine's own kernels.
    Ok(unsafe { GenericStringArray::<O>::new_unchecked(offsets, values, nulls) })
}
