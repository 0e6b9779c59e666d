//! Arrow → device. The host batches of one upload (one batch, or a group the uploader
//! coalesces) are written into one pinned staging buffer, each column's parts end to end, and
//! cross the bus in one asynchronous copy into one allocation, the batch's arena. Nothing is
//! concatenated on the host first: a part's values are copied once, into the staging buffer,
//! which is where the concatenation happens.
//!
//! Utf8View columns travel as they are, their 16-byte views and their data buffers, in a second
//! staging buffer and allocation that lives only until kernels have turned them into the
//! offsets + bytes every other kernel reads (`spate_kernels::views`). The host sums the views'
//! lengths while it stages them, so the conversion needs no readback; it never copies a string
//! row by row.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, AsArray, BooleanArray, LargeStringArray, StringArray,
    StringViewArray,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::util::bit_mask::set_bits;
use spate_kernels::gather::StringBuffers;
use spate_kernels::views::{DeviceViews, VIEW_BYTES, views_to_strings};
use spate_kernels::{DeviceBitmap, DeviceBuffer, Stream};

use super::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, Layout, device_layout,
};
use crate::error::{Result, SpateError};
use crate::vector::Elem;

/// Alignment of each segment in an arena: enough for any value type (Decimal128 is 16) and a
/// cache line, so kernels read aligned data.
pub(super) const SEGMENT_ALIGN: usize = 64;

/// A view holds its string inline up to this many bytes; longer ones point into a buffer.
const VIEW_INLINE: u32 = 12;

/// Uploads a record batch: one pinned staging buffer, one asynchronous copy, one allocation
/// (and a second of each for Utf8View columns, freed once converted).
pub fn upload_batch(stream: &Stream, batch: &RecordBatch) -> Result<DeviceBatch> {
    upload_batches(stream, &batch.schema(), std::slice::from_ref(batch))
}

/// Uploads `batches`, all of `schema`, as one device batch holding their rows in order. Each
/// column's parts are staged end to end, so they arrive concatenated with the one copy.
pub fn upload_batches(
    stream: &Stream,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<DeviceBatch> {
    upload_batches_marked(stream, schema, batches, |_| Ok(()))
}

/// [`upload_batches`], calling `staged` once every byte is staged in pinned memory and before
/// the first copy is queued: an event it records on `stream` times the copies alone, not the
/// host's staging (`exec/upload.rs`).
pub fn upload_batches_marked(
    stream: &Stream,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    staged: impl FnOnce(&Stream) -> Result<()>,
) -> Result<DeviceBatch> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let parts = (0..schema.fields().len())
        .map(|c| {
            batches
                .iter()
                .map(|b| {
                    let array = b.columns().get(c).ok_or_else(|| SpateError::Internal {
                        message: format!("an upload's batch lacks column {c}"),
                    })?;
                    Ok(compact_views(array))
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let plans = schema
        .fields()
        .iter()
        .zip(&parts)
        .map(|(f, p)| plan_column(f, p, rows))
        .collect::<Result<Vec<_>>>()?;

    // Where each segment lands: in the arena, or (views) in the scratch arena.
    let (mut main, mut scratch) = (Arena::default(), Arena::default());
    let placed: Vec<Placed> = plans
        .iter()
        .map(|p| Placed {
            validity: p.validity.as_ref().map(|s| main.place(s)),
            values: match &p.values {
                Values::Fixed(s, _) | Values::Bits(s) => vec![main.place(s)],
                Values::Strings { offsets, bytes, .. } => {
                    vec![main.place(offsets), main.place(bytes)]
                }
                Values::Views {
                    views,
                    data,
                    buffer_starts,
                    ..
                } => vec![
                    scratch.place(views),
                    scratch.place(data),
                    scratch.place(buffer_starts),
                ],
            },
        })
        .collect();
    let main = main.fill(stream, |out| {
        for (p, at) in plans.iter().zip(&placed) {
            if let (Some(s), Some(r)) = (&p.validity, at.validity) {
                s.write(&mut out[r.0..r.0 + r.1]);
            }
            if let Values::Fixed(s, _) | Values::Bits(s) = &p.values {
                s.write(&mut out[at.values[0].0..at.values[0].0 + at.values[0].1]);
            }
            if let Values::Strings { offsets, bytes, .. } = &p.values {
                for (s, r) in [offsets, bytes].into_iter().zip(&at.values) {
                    s.write(&mut out[r.0..r.0 + r.1]);
                }
            }
        }
    })?;
    let scratch = scratch.fill(stream, |out| {
        for (p, at) in plans.iter().zip(&placed) {
            if let Values::Views {
                views,
                data,
                buffer_starts,
                ..
            } = &p.values
            {
                for (s, r) in [views, data, buffer_starts].into_iter().zip(&at.values) {
                    s.write(&mut out[r.0..r.0 + r.1]);
                }
            }
        }
    })?;
    staged(stream)?;
    let arena = Arc::new(main.send(stream)?);
    let scratch = scratch.send(stream)?;
    let range = |(o, n): (usize, usize)| DeviceBytes::range(&arena, o, n);

    let mut columns = Vec::with_capacity(plans.len());
    for (p, at) in plans.into_iter().zip(placed) {
        let validity = at.validity.map(|r| DeviceValidity {
            bytes: range(r),
            offset: 0,
        });
        let values = match p.values {
            Values::Fixed(_, width) => DeviceValues::Fixed {
                bytes: range(at.values[0]),
                width,
            },
            Values::Bits(_) => DeviceValues::Bits {
                bytes: range(at.values[0]),
                offset: 0,
            },
            Values::Strings { wide, .. } => {
                let (offsets, bytes) = (range(at.values[0]), range(at.values[1]));
                if wide {
                    DeviceValues::LargeUtf8 { offsets, bytes }
                } else {
                    DeviceValues::Utf8 { offsets, bytes }
                }
            }
            Values::Views { total, wide, .. } => {
                let slice = |(o, n): (usize, usize)| scratch.slice(o..o + n);
                let views = DeviceViews {
                    views: slice(at.values[0])?,
                    validity: validity
                        .as_ref()
                        .map(|v| DeviceBitmap::new(v.bytes.as_slice())),
                    data: slice(at.values[1])?,
                    buffer_starts: slice(at.values[2])?.cast::<u64>()?,
                };
                if wide {
                    let s = strings_of_views::<i64>(stream, views, total)?;
                    DeviceValues::LargeUtf8 {
                        offsets: DeviceBytes::new(s.offsets.into_bytes()),
                        bytes: DeviceBytes::new(s.bytes),
                    }
                } else {
                    let s = strings_of_views::<i32>(stream, views, total)?;
                    DeviceValues::Utf8 {
                        offsets: DeviceBytes::new(s.offsets.into_bytes()),
                        bytes: DeviceBytes::new(s.bytes),
                    }
                }
            }
        };
        columns.push(DeviceColumn::new(
            p.data_type,
            p.len,
            p.null_count,
            validity,
            values,
        ));
    }
    // The conversions are queued behind the scratch copy; its memory is freed in stream order.
    drop(scratch);
    DeviceBatch::try_new(Arc::clone(schema), columns, rows)
}

/// Uploads one array as a column.
#[cfg(test)]
pub fn upload_column(stream: &Stream, array: &ArrayRef) -> Result<DeviceColumn> {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![Field::new(
        "c",
        array.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema, vec![Arc::clone(array)])?;
    let mut uploaded = upload_batch(stream, &batch)?;
    Ok(uploaded.columns.swap_remove(0))
}

fn strings_of_views<O: spate_kernels::gather::OffsetElem>(
    stream: &Stream,
    views: DeviceViews<'_>,
    total: u64,
) -> Result<StringBuffers<O>> {
    if views.rows() == 0 {
        return Ok(StringBuffers {
            offsets: stream.alloc_zeroed::<O>(1)?,
            bytes: stream.alloc::<u8>(0)?,
        });
    }
    // SAFETY: `total` is the sum of the valid rows' lengths (`ViewStats`), and the views are
    // those of arrays Arrow validated, their buffer indices shifted to the staged buffers.
    Ok(unsafe { views_to_strings::<O>(stream, views, total)? })
}

/// A Utf8View array whose data buffers hold much more than its long strings (a slice of a
/// larger array, or a page's dictionary) is compacted first, so that only what its rows use
/// crosses the bus (Arrow's `gc` copies the used strings; the bus would carry the rest for
/// nothing). Any other array is uploaded as it is.
fn compact_views(array: &ArrayRef) -> ArrayRef {
    if let Some(a) = array.as_string_view_opt() {
        let stats = ViewStats::of(a);
        let buffers: usize = a.data_buffers().iter().map(Buffer::len).sum();
        if buffers > 2 * stats.long_bytes + (64 << 10) {
            return Arc::new(a.gc());
        }
    }
    Arc::clone(array)
}

/// Lengths summed over a Utf8View array's valid rows (one pass over the views, no strings).
#[derive(Debug, Default, Clone, Copy)]
struct ViewStats {
    /// Every valid row's bytes.
    bytes: usize,
    /// The bytes of valid rows too long to sit in their views.
    long_bytes: usize,
}

impl ViewStats {
    fn of(a: &StringViewArray) -> Self {
        let mut stats = ViewStats::default();
        let mut add = |view: u128| {
            let len = view as u32;
            stats.bytes += len as usize;
            if len > VIEW_INLINE {
                stats.long_bytes += len as usize;
            }
        };
        match a.nulls().filter(|n| n.null_count() > 0) {
            None => a.views().iter().for_each(|v| add(*v)),
            Some(nulls) => a
                .views()
                .iter()
                .zip(nulls.iter())
                .filter(|(_, valid)| *valid)
                .for_each(|(v, _)| add(*v)),
        }
        stats
    }
}

/// Segments laid out in one allocation.
#[derive(Default)]
struct Arena {
    total: usize,
}

impl Arena {
    /// Places a segment: its byte offset and length.
    fn place(&mut self, s: &Segment<'_>) -> (usize, usize) {
        let at = self.total.next_multiple_of(SEGMENT_ALIGN);
        self.total = at + s.len();
        (at, s.len())
    }

    /// Stages the arena's bytes with `write` in pinned memory.
    fn fill(self, stream: &Stream, write: impl FnOnce(&mut [u8])) -> Result<Filled> {
        if self.total == 0 {
            return Ok(Filled {
                total: 0,
                staging: None,
            });
        }
        let mut staging = stream.device().pinned(self.total)?;
        write(staging.as_bytes_mut()?);
        Ok(Filled {
            total: self.total,
            staging: Some(staging),
        })
    }
}

/// An arena's bytes staged in pinned memory, not yet copied.
struct Filled {
    total: usize,
    staging: Option<spate_kernels::PinnedBuffer>,
}

impl Filled {
    /// Copies the staged bytes to a new allocation.
    fn send(self, stream: &Stream) -> Result<DeviceBuffer<u8>> {
        let mut arena = stream.alloc::<u8>(self.total)?;
        if let Some(mut staging) = self.staging {
            stream.upload_pinned(&mut staging, &mut arena)?;
            // Dropping the staging buffer does not wait: it is retired until the copy
            // completes.
        }
        Ok(arena)
    }
}

/// Where a column's segments landed.
struct Placed {
    validity: Option<(usize, usize)>,
    values: Vec<(usize, usize)>,
}

/// What one column needs staged.
struct ColumnPlan<'a> {
    data_type: DataType,
    len: usize,
    null_count: usize,
    /// A bitmap from bit 0, when some row is null.
    validity: Option<Segment<'a>>,
    values: Values<'a>,
}

enum Values<'a> {
    /// Packed values of this many bytes.
    Fixed(Segment<'a>, usize),
    /// Booleans, a bitmap from bit 0.
    Bits(Segment<'a>),
    /// Offsets (i64 when `wide`), rebased to start at 0 and run on across the parts, and bytes.
    Strings {
        offsets: Segment<'a>,
        bytes: Segment<'a>,
        wide: bool,
    },
    /// Utf8View views and data buffers, for the scratch arena; `total` bytes of strings.
    Views {
        views: Segment<'a>,
        data: Segment<'a>,
        buffer_starts: Segment<'a>,
        total: u64,
        wide: bool,
    },
}

/// Bytes to stage: pieces end to end, or a bitmap built from parts.
enum Segment<'a> {
    Pieces(Vec<Piece<'a>>),
    /// `rows` bits from bit 0: each part's bits after the parts' before it; a part without a
    /// bitmap (`None`) is all set.
    Bitmap {
        parts: Vec<BitmapPart<'a>>,
        rows: usize,
    },
}

/// A part of a bitmap segment: its bytes and the bit of its row 0 (`None`: all set), and its
/// rows.
type BitmapPart<'a> = (Option<(&'a [u8], usize)>, usize);

enum Piece<'a> {
    Bytes(&'a [u8]),
    /// A shared Arrow buffer (a cheap reference-counted clone) and a byte range of it.
    Buffer(Buffer, usize, usize),
    /// String offsets rebased from their first to `delta`, written as i64 when `wide`.
    Offsets32(&'a [i32], u64, bool),
    Offsets64(&'a [i64], u64, bool),
    /// One offset (the bytes' total that ends a string column).
    End(u64, bool),
    /// Views whose buffer indices move up by the number of data buffers of the parts before.
    Views(&'a [u128], u32),
    /// u64 words (where each data buffer of a view column starts).
    Words(Vec<u64>),
}

impl Piece<'_> {
    fn len(&self) -> usize {
        let width = |wide: bool| if wide { 8 } else { 4 };
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Buffer(_, _, len) => *len,
            Piece::Offsets32(o, _, wide) => o.len() * width(*wide),
            Piece::Offsets64(o, _, wide) => o.len() * width(*wide),
            Piece::End(_, wide) => width(*wide),
            Piece::Views(v, _) => v.len() * VIEW_BYTES,
            Piece::Words(w) => w.len() * 8,
        }
    }

    fn write(&self, out: &mut [u8]) {
        fn offsets<T: Copy>(
            out: &mut [u8],
            o: &[T],
            delta: u64,
            wide: bool,
            at: impl Fn(T) -> i64,
        ) {
            let base = o.first().map_or(0, |v| at(*v));
            let rebased = o.iter().map(|v| (at(*v) - base) as u64 + delta);
            if wide {
                for (chunk, v) in out.chunks_exact_mut(8).zip(rebased) {
                    chunk.copy_from_slice(&(v as i64).to_le_bytes());
                }
            } else {
                for (chunk, v) in out.chunks_exact_mut(4).zip(rebased) {
                    chunk.copy_from_slice(&(v as i32).to_le_bytes());
                }
            }
        }
        match self {
            Piece::Bytes(b) => out.copy_from_slice(b),
            Piece::Buffer(b, start, len) => out.copy_from_slice(&b.as_slice()[*start..start + len]),
            Piece::Offsets32(o, delta, wide) => offsets(out, o, *delta, *wide, i64::from),
            Piece::Offsets64(o, delta, wide) => offsets(out, o, *delta, *wide, |v| v),
            Piece::End(total, wide) => {
                if *wide {
                    out.copy_from_slice(&(*total as i64).to_le_bytes());
                } else {
                    out.copy_from_slice(&(*total as i32).to_le_bytes());
                }
            }
            Piece::Views(views, base) => {
                let bytes = views_as_bytes(views);
                out.copy_from_slice(bytes);
                if *base > 0 {
                    let shift = u128::from(*base) << 64;
                    for (chunk, v) in out.chunks_exact_mut(VIEW_BYTES).zip(views.iter()) {
                        if (*v as u32) > VIEW_INLINE {
                            chunk.copy_from_slice(&v.wrapping_add(shift).to_le_bytes());
                        }
                    }
                }
            }
            Piece::Words(w) => {
                for (chunk, v) in out.chunks_exact_mut(8).zip(w) {
                    chunk.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

fn views_as_bytes(views: &[u128]) -> &[u8] {
    // SAFETY: u128 is plain data; its bytes may be read as u8 (little-endian, as Arrow stores
    // views and as the kernels read them).
    unsafe { std::slice::from_raw_parts(views.as_ptr().cast::<u8>(), size_of_val(views)) }
}

impl Segment<'_> {
    fn len(&self) -> usize {
        match self {
            Segment::Pieces(p) => p.iter().map(Piece::len).sum(),
            Segment::Bitmap { rows, .. } => rows.div_ceil(8),
        }
    }

    fn write(&self, out: &mut [u8]) {
        match self {
            Segment::Pieces(pieces) => {
                let mut at = 0;
                for p in pieces {
                    let n = p.len();
                    p.write(&mut out[at..at + n]);
                    at += n;
                }
            }
            Segment::Bitmap { parts, .. } => {
                // set_bits ORs partial bytes in, so the bitmap starts zeroed.
                out.fill(0);
                let mut at = 0;
                for (bits, len) in parts {
                    match bits {
                        Some((bytes, offset)) => {
                            set_bits(out, bytes, at, *offset, *len);
                        }
                        None => set_range(out, at, *len),
                    }
                    at += len;
                }
            }
        }
    }
}

/// Sets bits `start..start + len` of `out`.
fn set_range(out: &mut [u8], start: usize, len: usize) {
    let end = start + len;
    let mut i = start;
    while i < end {
        if i.is_multiple_of(8) && i + 8 <= end {
            let full = (end - i) / 8;
            out[i / 8..i / 8 + full].fill(0xFF);
            i += full * 8;
        } else {
            out[i / 8] |= 1 << (i % 8);
            i += 1;
        }
    }
}

fn unsupported(name: &str, data_type: &DataType) -> SpateError {
    SpateError::Unsupported {
        message: format!(
            "column `{name}` has type {data_type}, which the GPU backend does not support yet; \
             supported: integers, floats, booleans, dates, times, timestamps, durations, \
             Decimal128, strings and embeddings (FixedSizeList of Float16, Float32 or UInt16)"
        ),
    }
}

fn mismatch(name: &str, data_type: &DataType, array: &dyn Array) -> SpateError {
    SpateError::Internal {
        message: format!(
            "column `{name}` is declared {data_type} but an uploaded batch holds {}",
            array.data_type()
        ),
    }
}

/// A bitmap segment over `parts`, each part's bits taken by `bits` (`None`: all set).
fn bitmap<'a>(
    parts: &'a [ArrayRef],
    rows: usize,
    bits: impl Fn(&'a dyn Array) -> Option<(&'a [u8], usize)>,
) -> Segment<'a> {
    Segment::Bitmap {
        parts: parts.iter().map(|a| (bits(a.as_ref()), a.len())).collect(),
        rows,
    }
}

fn plan_column<'a>(field: &Field, parts: &'a [ArrayRef], rows: usize) -> Result<ColumnPlan<'a>> {
    let (name, data_type) = (field.name(), field.data_type());
    let layout = device_layout(data_type).ok_or_else(|| unsupported(name, data_type))?;
    if let Some(a) = parts.iter().find(|a| a.data_type() != data_type) {
        return Err(mismatch(name, data_type, a.as_ref()));
    }
    let null_count: usize = parts.iter().map(|a| a.null_count()).sum();
    let validity = (null_count > 0).then(|| {
        bitmap(parts, rows, |a| {
            a.nulls()
                .filter(|n| n.null_count() > 0)
                .map(|n| (n.validity(), n.offset()))
        })
    });
    let values = match layout {
        Layout::Fixed(width) => {
            let mut pieces = Vec::with_capacity(parts.len());
            for a in parts {
                let data = a.to_data();
                let (buffer, start) = match data_type {
                    // An embedding: its elements' buffer, from the list's first row on.
                    DataType::FixedSizeList(_, d) => embedding_elements(name, &data, *d as usize)?,
                    _ => {
                        let buffer =
                            data.buffers().first().ok_or_else(|| SpateError::Internal {
                                message: format!(
                                    "column `{name}` ({data_type}) has no value buffer"
                                ),
                            })?;
                        (buffer.clone(), data.offset() * width)
                    }
                };
                let len = a.len() * width;
                if buffer.len() < start + len {
                    return Err(SpateError::Internal {
                        message: format!("column `{name}` value buffer is shorter than its rows"),
                    });
                }
                pieces.push(Piece::Buffer(buffer, start, len));
            }
            Values::Fixed(Segment::Pieces(pieces), width)
        }
        Layout::Bits => {
            for a in parts {
                if a.as_any().downcast_ref::<BooleanArray>().is_none() {
                    return Err(mismatch(name, data_type, a.as_ref()));
                }
            }
            Values::Bits(bitmap(parts, rows, |a| {
                let values = a.as_boolean().values();
                Some((values.values(), values.offset()))
            }))
        }
        Layout::Strings | Layout::LargeStrings if *data_type == DataType::Utf8View => {
            plan_views(name, parts)?
        }
        Layout::Strings | Layout::LargeStrings => plan_strings(name, data_type, parts)?,
    };
    Ok(ColumnPlan {
        data_type: data_type.clone(),
        len: rows,
        null_count,
        validity,
        values,
    })
}

/// The elements of an embedding column's `data` (`d` per row) as the device holds them: a
/// buffer and the byte where the list's first row starts. A NULL element in a set row is
/// replaced by its type's [`Elem::null_bits`], in a copy of the rows' elements (without such
/// elements, the column's own buffer is used). A set element that has those bits already is
/// `Unsupported`: on the device it would read as NULL.
fn embedding_elements(name: &str, data: &ArrayData, d: usize) -> Result<(Buffer, usize)> {
    let elements = data
        .child_data()
        .first()
        .ok_or_else(|| SpateError::Internal {
            message: format!("embedding column `{name}` has no elements"),
        })?;
    let Some((elem, _)) = Elem::of(data.data_type()) else {
        return Err(SpateError::Internal {
            message: format!("column `{name}` ({}) is not an embedding", data.data_type()),
        });
    };
    let buffer = elements
        .buffers()
        .first()
        .ok_or_else(|| SpateError::Internal {
            message: format!("embedding column `{name}` has no element buffer"),
        })?;
    // Row `r` of the list is elements `first + r * d ..` of the child.
    let first = elements.offset() + data.offset() * d;
    let count = data.len() * d;
    let width = elem.width();
    let start = first * width;
    if buffer.len() < start + count * width {
        return Err(SpateError::Internal {
            message: format!("embedding column `{name}` element buffer is shorter than its rows"),
        });
    }
    // Element `j` of the rows is logical element `child_first + j` of the child.
    let child_first = data.offset() * d;
    let set = |j: usize| data.is_valid(j / d) && elements.is_valid(child_first + j);
    // Read as bytes: no alignment is assumed of the buffer.
    let elements_bytes = &buffer.as_slice()[start..start + count * width];
    let taken = elements_bytes
        .chunks_exact(width)
        .enumerate()
        .find(|&(j, e)| elem.is_null_element(e) && set(j));
    if let Some((j, _)) = taken {
        return Err(SpateError::Unsupported {
            message: format!(
                "embedding column `{name}` holds, in row {}, a NaN with the bits the GPU \
                 backend keeps for a NULL element ({:#x})",
                j / d,
                elem.null_bits()
            ),
        });
    }
    let Some(nulls) = elements.nulls().filter(|n| n.null_count() > 0) else {
        return Ok((buffer.clone(), start));
    };
    // Set rows whose elements are not all set (counted a word at a time: Parquet leaves `d`
    // null elements under every null row, which are not looked at).
    let holed: Vec<usize> = (0..data.len())
        .filter(|&row| {
            data.is_valid(row)
                && nulls
                    .inner()
                    .slice(child_first + row * d, d)
                    .count_set_bits()
                    != d
        })
        .collect();
    if holed.is_empty() {
        return Ok((buffer.clone(), start));
    }
    let mut copy = elements_bytes.to_vec();
    let null = elem.null_bits().to_le_bytes();
    for row in holed {
        for j in row * d..(row + 1) * d {
            if nulls.is_null(child_first + j) {
                copy[j * width..(j + 1) * width].copy_from_slice(&null[..width]);
            }
        }
    }
    Ok((Buffer::from_vec(copy), 0))
}

/// Utf8 and LargeUtf8: each part's offsets rebased to run on from the parts before, then the
/// total; the parts' bytes end to end.
fn plan_strings<'a>(name: &str, data_type: &DataType, parts: &'a [ArrayRef]) -> Result<Values<'a>> {
    enum Part<'a> {
        Narrow(&'a StringArray),
        Large(&'a LargeStringArray),
    }
    let parts = parts
        .iter()
        .map(|a| {
            if let Some(s) = a.as_string_opt::<i32>() {
                Ok(Part::Narrow(s))
            } else if let Some(s) = a.as_string_opt::<i64>() {
                Ok(Part::Large(s))
            } else {
                Err(mismatch(name, data_type, a.as_ref()))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let range = |p: &Part<'a>| match p {
        Part::Narrow(s) => {
            let o = s.value_offsets();
            (o[0] as usize, o[s.len()] as usize)
        }
        Part::Large(s) => {
            let o = s.value_offsets();
            (o[0] as usize, o[s.len()] as usize)
        }
    };
    let total: usize = parts.iter().map(|p| range(p).1 - range(p).0).sum();
    // A Utf8 column whose parts together pass i32 offsets is stored with i64 ones.
    let wide = *data_type == DataType::LargeUtf8 || total > i32::MAX as usize;
    let (mut offsets, mut bytes, mut delta) = (Vec::new(), Vec::new(), 0u64);
    for p in &parts {
        let (first, last) = range(p);
        match p {
            Part::Narrow(s) => {
                offsets.push(Piece::Offsets32(&s.value_offsets()[..s.len()], delta, wide));
                bytes.push(Piece::Bytes(&s.value_data()[first..last]));
            }
            Part::Large(s) => {
                offsets.push(Piece::Offsets64(&s.value_offsets()[..s.len()], delta, wide));
                bytes.push(Piece::Bytes(&s.value_data()[first..last]));
            }
        }
        delta += (last - first) as u64;
    }
    offsets.push(Piece::End(delta, wide));
    Ok(Values::Strings {
        offsets: Segment::Pieces(offsets),
        bytes: Segment::Pieces(bytes),
        wide,
    })
}

/// Utf8View: the parts' views end to end (buffer indices shifted past the parts before), their
/// data buffers end to end, and where each buffer starts.
fn plan_views<'a>(name: &str, parts: &'a [ArrayRef]) -> Result<Values<'a>> {
    let (mut views, mut data, mut starts) = (Vec::new(), Vec::new(), Vec::new());
    let (mut total, mut at, mut buffers) = (0usize, 0u64, 0u32);
    for a in parts {
        let a = a
            .as_string_view_opt()
            .ok_or_else(|| mismatch(name, &DataType::Utf8View, a.as_ref()))?;
        total += ViewStats::of(a).bytes;
        views.push(Piece::Views(a.views(), buffers));
        for b in a.data_buffers() {
            starts.push(at);
            at += b.len() as u64;
            data.push(Piece::Bytes(b.as_slice()));
        }
        buffers = u32::try_from(starts.len()).map_err(|_| SpateError::Internal {
            message: format!("column `{name}` has more than 2^32 view buffers"),
        })?;
    }
    Ok(Values::Views {
        views: Segment::Pieces(views),
        data: Segment::Pieces(data),
        buffer_starts: Segment::Pieces(vec![Piece::Words(starts)]),
        total: total as u64,
        wide: total > i32::MAX as usize,
    })
}
