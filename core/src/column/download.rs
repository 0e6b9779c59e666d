//! Device → Arrow: asynchronous copies of a batch's columns into one pinned buffer, one wait,
//! and arrays built as the planned types directly (Utf8View included), without a host cast and
//! without validating again the strings the engine wrote itself.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, BooleanArray, GenericStringArray, OffsetSizeTrait, StringViewArray,
    make_array, make_view,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::DataType;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use spate_kernels::{DeviceSlice, Stream};

use super::upload::SEGMENT_ALIGN;
use super::{DeviceBatch, DeviceColumn, DeviceValues};
use crate::error::Result;

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
#[cfg(test)]
pub fn download_column(stream: &Stream, column: &DeviceColumn) -> Result<ArrayRef> {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("c", column.data_type().clone(), true),
    ]));
    let batch = DeviceBatch::try_new(schema, vec![column.clone()], column.len())?;
    Ok(Arc::clone(download_batch(stream, &batch)?.column(0)))
}

/// The validity of an embedding's `count` elements held in `bytes`: NULL where an element has
/// its type's null bits (`None` when none has).
fn element_nulls(data_type: &DataType, bytes: &[u8], count: usize) -> Option<NullBuffer> {
    let (elem, _) = crate::vector::Elem::of(data_type)?;
    let width = elem.width();
    let elements = bytes.get(..count * width)?.chunks_exact(width);
    if !elements.clone().any(|e| elem.is_null_element(e)) {
        return None;
    }
    Some(NullBuffer::from_iter(
        elements.map(|e| !elem.is_null_element(e)),
    ))
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
        // An embedding: its elements end to end, those with the null bits NULL.
        DeviceValues::Fixed { .. } if let DataType::FixedSizeList(field, d) = data_type => {
            let count = len * *d as usize;
            let elements = ArrayData::builder(field.data_type().clone())
                .len(count)
                .add_buffer(Buffer::from_slice_ref(rest[0]))
                .nulls(element_nulls(data_type, rest[0], count))
                .build()?;
            let data = ArrayData::builder(data_type.clone())
                .len(len)
                .child_data(vec![elements])
                .nulls(nulls)
                .build()?;
            make_array(data)
        }
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
            strings_as(data_type, offsets, Buffer::from_slice_ref(rest[1]), nulls)?
        }
        DeviceValues::LargeUtf8 { .. } => {
            let offsets: Vec<i64> = rest[0]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            strings_as(data_type, offsets, Buffer::from_slice_ref(rest[1]), nulls)?
        }
    };
    if array.data_type() == data_type {
        Ok(array)
    } else {
        // A Utf8 column stored with i64 offsets (its bytes passed i32 ones on the device).
        Ok(arrow::compute::cast(&array, data_type)?)
    }
}

/// Strings downloaded as offsets + bytes, built as `data_type`: Utf8View gets its views made
/// from the offsets over the same bytes; anything else is an offsets + bytes array.
fn strings_as<O: OffsetSizeTrait>(
    data_type: &DataType,
    offsets: Vec<O>,
    values: Buffer,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    if *data_type == DataType::Utf8View {
        return Ok(Arc::new(unchecked_views(&offsets, values, nulls)?));
    }
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok(Arc::new(unchecked_strings::<O>(offsets, values, nulls)?))
}

/// A Utf8View array whose views point into `values` at `offsets`: strings of up to 12 bytes
/// inline, longer ones by buffer and offset. The bytes stay one buffer unless they pass what a
/// view's u32 offset reaches; then they are cut into slices of it at string boundaries. Not
/// validated again, for the reason [`unchecked_strings`] gives.
fn unchecked_views<O: OffsetSizeTrait>(
    offsets: &[O],
    values: Buffer,
    nulls: Option<NullBuffer>,
) -> Result<StringViewArray> {
    let rows = offsets.len().saturating_sub(1);
    let bytes = values.as_slice();
    let mut views = Vec::with_capacity(rows);
    let mut blocks = vec![0usize];
    let mut block = 0usize;
    for w in offsets.windows(2) {
        let (start, end) = (w[0].as_usize(), w[1].as_usize());
        if end - block > u32::MAX as usize {
            block = start;
            blocks.push(block);
        }
        views.push(make_view(
            &bytes[start..end],
            (blocks.len() - 1) as u32,
            (start - block) as u32,
        ));
    }
    let buffers: Vec<Buffer> = blocks
        .iter()
        .zip(blocks.iter().skip(1).chain([&bytes.len()]))
        .map(|(s, e)| values.slice_with_length(*s, e - s))
        .collect();
    let views = ScalarBuffer::from(views);
    if cfg!(debug_assertions) {
        StringViewArray::try_new(views.clone(), buffers.clone(), nulls.clone())?;
    }
    // SAFETY: every view was made from a range of its buffer, at string boundaries of bytes
    // that are whole UTF-8 strings (see `unchecked_strings`).
    Ok(unsafe { StringViewArray::new_unchecked(views, buffers, nulls) })
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
