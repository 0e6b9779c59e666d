//! Device columns and batches: Arrow data held in device memory, and the transfers both ways.
//!
//! Contracts:
//! - Every supported type round-trips exactly, nulls included: Int8–64, UInt8–64,
//!   Float16/32/64, Boolean, Date32/64, Time, Duration, Timestamp (any unit and zone),
//!   Decimal128 (full 128-bit), Utf8, LargeUtf8 and Utf8View. Anything else is
//!   `SpateError::Unsupported`, naming the column and its type.
//! - Sliced arrays upload only their rows. Validity keeps its bit offset on the device (kernels
//!   take bitmaps with offsets); string offsets are rebased to start at 0.
//! - Utf8View is stored as offsets + bytes on the device (what the kernels read) and turned
//!   back into Utf8View on download, so the schema DataFusion planned with holds.
//! - An upload stages the whole batch in one pinned buffer and copies it with one asynchronous
//!   transfer into one device allocation (the batch's arena); columns are views into it. Many
//!   small transfers are what makes GPU engines slow, so batches should be coalesced (in bytes)
//!   before they are uploaded.

mod concat;
mod gather;
mod transfer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::physical_plan::metrics::Count;
use spate_kernels::{DeviceBitmap, DeviceBuffer, DeviceSlice};

use crate::error::{Result, SpateError};

pub use concat::concat_device_batches;
pub use gather::{
    Gather, gather_batch, gather_column, gather_column_or_null, gather_columns, gather_counted,
};
pub use transfer::{download_batch, download_column, upload_batch, upload_column};

/// A range of bytes in a shared device allocation (a batch's arena, or an operator's output).
#[derive(Debug, Clone)]
pub struct DeviceBytes {
    buffer: Arc<DeviceBuffer<u8>>,
    offset: usize,
    len: usize,
}

impl DeviceBytes {
    /// All of `buffer`.
    pub fn new(buffer: DeviceBuffer<u8>) -> Self {
        let len = buffer.len();
        DeviceBytes {
            buffer: Arc::new(buffer),
            offset: 0,
            len,
        }
    }

    pub(crate) fn range(buffer: &Arc<DeviceBuffer<u8>>, offset: usize, len: usize) -> Self {
        DeviceBytes {
            buffer: Arc::clone(buffer),
            offset,
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as a device slice.
    pub fn as_slice(&self) -> DeviceSlice<'_, u8> {
        // The range was checked when the DeviceBytes was made.
        self.buffer
            .slice(self.offset..self.offset + self.len)
            .unwrap_or_else(|_| self.buffer.as_slice())
    }

    /// See [`DeviceBuffer::share_across_streams`]: the allocation is read by many streams.
    pub fn share_across_streams(&self) {
        self.buffer.share_across_streams();
    }

    /// The bytes viewed as elements of `T`.
    pub fn typed<T: spate_kernels::DeviceCopy>(&self) -> Result<DeviceSlice<'_, T>> {
        Ok(self.as_slice().cast::<T>()?)
    }
}

/// A validity bitmap on the device, with the bit offset of row 0.
#[derive(Debug, Clone)]
pub struct DeviceValidity {
    /// The bitmap bytes.
    pub bytes: DeviceBytes,
    /// Bit index of row 0.
    pub offset: usize,
}

impl DeviceValidity {
    /// The bitmap as kernels take it.
    pub fn bitmap(&self) -> DeviceBitmap<'_> {
        DeviceBitmap::new(self.bytes.as_slice()).with_offset(self.offset)
    }
}

/// How a column's values are laid out on the device.
#[derive(Debug, Clone)]
pub enum DeviceValues {
    /// Fixed-width values, `width` bytes each, packed from row 0.
    Fixed {
        /// The values.
        bytes: DeviceBytes,
        /// Bytes per value.
        width: usize,
    },
    /// Booleans as an Arrow bitmap starting at bit `offset`.
    Bits {
        /// The bitmap.
        bytes: DeviceBytes,
        /// Bit index of row 0.
        offset: usize,
    },
    /// Strings with 32-bit offsets (`rows + 1` of them, starting at 0) into `bytes`.
    Utf8 {
        /// Offsets, as i32.
        offsets: DeviceBytes,
        /// The UTF-8 data.
        bytes: DeviceBytes,
    },
    /// Strings with 64-bit offsets.
    LargeUtf8 {
        /// Offsets, as i64.
        offsets: DeviceBytes,
        /// The UTF-8 data.
        bytes: DeviceBytes,
    },
}

/// One column in device memory.
#[derive(Debug, Clone)]
pub struct DeviceColumn {
    data_type: DataType,
    len: usize,
    /// `None`: the validity bitmap's count was not read back (see [`DeviceColumn::null_count`]).
    null_count: Option<usize>,
    validity: Option<DeviceValidity>,
    values: DeviceValues,
}

impl DeviceColumn {
    /// A column from its parts, with its `null_count` known. `validity` is `None` when no row
    /// is null.
    pub fn new(
        data_type: DataType,
        len: usize,
        null_count: usize,
        validity: Option<DeviceValidity>,
        values: DeviceValues,
    ) -> Self {
        let mut column = DeviceColumn::with_uncounted_nulls(data_type, len, validity, values);
        column.null_count = Some(null_count);
        column
    }

    /// A column from its parts whose null rows have not been counted: the bitmap's count stays
    /// on the device until something needs it ([`DeviceColumn::count_nulls`]), which saves a
    /// readback per column for every gather. `validity` is `None` when no row is null.
    pub fn with_uncounted_nulls(
        data_type: DataType,
        len: usize,
        validity: Option<DeviceValidity>,
        values: DeviceValues,
    ) -> Self {
        // Operators may allocate more than their rows need (at least one 16-byte value); the
        // column views exactly its rows, so consumers can size their work by the view.
        let values = match values {
            DeviceValues::Fixed { bytes, width } if bytes.len() > len * width => {
                DeviceValues::Fixed {
                    bytes: DeviceBytes::range(&bytes.buffer, bytes.offset, len * width),
                    width,
                }
            }
            other => other,
        };
        DeviceColumn {
            data_type,
            len,
            null_count: validity.is_none().then_some(0),
            validity,
            values,
        }
    }

    /// The Arrow type the column downloads as.
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Null rows, when the host knows them: uploads do; gathers, value kernels and aggregate
    /// outputs do not (see [`DeviceColumn::with_uncounted_nulls`]). A column with no validity
    /// bitmap has none.
    pub fn null_count(&self) -> Option<usize> {
        self.null_count
    }

    /// Null rows, counted on the device (one readback) when the host does not know them.
    pub fn count_nulls(&self, stream: &spate_kernels::Stream) -> Result<usize> {
        match (self.null_count, &self.validity) {
            (Some(n), _) => Ok(n),
            (None, None) => Ok(0),
            (None, Some(v)) => {
                let valid = spate_kernels::reduce::count_valid(stream, v.bitmap(), self.len)?;
                Ok(self.len - valid as usize)
            }
        }
    }

    /// The validity bitmap, when some row may be null (a column whose nulls were not counted
    /// may have a bitmap with every bit set).
    pub fn validity(&self) -> Option<&DeviceValidity> {
        self.validity.as_ref()
    }

    /// The values.
    pub fn values(&self) -> &DeviceValues {
        &self.values
    }

    /// Marks every allocation the column references as read by many streams (see
    /// [`DeviceBuffer::share_across_streams`]).
    pub fn share_across_streams(&self) {
        match &self.values {
            DeviceValues::Fixed { bytes, .. } | DeviceValues::Bits { bytes, .. } => {
                bytes.share_across_streams()
            }
            DeviceValues::Utf8 { offsets, bytes } | DeviceValues::LargeUtf8 { offsets, bytes } => {
                offsets.share_across_streams();
                bytes.share_across_streams();
            }
        }
        if let Some(v) = &self.validity {
            v.bytes.share_across_streams();
        }
    }

    /// The first `rows` rows, as a view (no copy). The nulls are counted again when needed,
    /// unless the column has none.
    pub fn prefix(&self, rows: usize) -> Result<DeviceColumn> {
        if rows > self.len {
            return Err(SpateError::Internal {
                message: format!("a prefix of {rows} rows of a {}-row column", self.len),
            });
        }
        if rows == self.len {
            return Ok(self.clone());
        }
        let offsets = |o: &DeviceBytes, width: usize| {
            DeviceBytes::range(&o.buffer, o.offset, ((rows + 1) * width).min(o.len))
        };
        let values = match &self.values {
            DeviceValues::Fixed { bytes, width } => DeviceValues::Fixed {
                bytes: DeviceBytes::range(&bytes.buffer, bytes.offset, rows * width),
                width: *width,
            },
            DeviceValues::Bits { .. } => self.values.clone(),
            // The bytes stay whole: a producer that leaves its count on the device writes no
            // bytes for the rows past it, so the last offset kept is the bytes' end.
            DeviceValues::Utf8 { offsets: o, bytes } => DeviceValues::Utf8 {
                offsets: offsets(o, 4),
                bytes: bytes.clone(),
            },
            DeviceValues::LargeUtf8 { offsets: o, bytes } => DeviceValues::LargeUtf8 {
                offsets: offsets(o, 8),
                bytes: bytes.clone(),
            },
        };
        let mut column = DeviceColumn::with_uncounted_nulls(
            self.data_type.clone(),
            rows,
            self.validity.clone(),
            values,
        );
        if self.null_count == Some(0) {
            column.null_count = Some(0);
        }
        Ok(column)
    }

    /// Device bytes the column references (values, offsets and validity).
    pub fn device_bytes(&self) -> usize {
        let values = match &self.values {
            DeviceValues::Fixed { bytes, .. } | DeviceValues::Bits { bytes, .. } => bytes.len(),
            DeviceValues::Utf8 { offsets, bytes } | DeviceValues::LargeUtf8 { offsets, bytes } => {
                offsets.len() + bytes.len()
            }
        };
        values + self.validity.as_ref().map_or(0, |v| v.bytes.len())
    }
}

/// How many rows a device batch holds.
///
/// A producer that only drops rows (a filter's compaction) need not wait to learn how many it
/// kept: it allocates for the rows it could keep (`bound`) and leaves the exact count on the
/// device. Kernels that consume such a batch take the count's address (`live`) and stop there;
/// an operator that needs the number on the host resolves it with one 4-byte readback
/// ([`DeviceBatch::resolve`]). See `docs/dev/device-row-counts.md`.
#[derive(Debug, Clone)]
pub enum RowCount {
    /// Known on the host: every column holds exactly this many rows.
    Host(usize),
    /// At most `bound` rows. The exact count is the u32 in `word`, written by a kernel queued
    /// earlier on the batch's stream. Every column is `bound` rows long; the rows at or past
    /// the count hold whatever their producer left there (poison, on the emulator), and
    /// nothing may read them.
    Device {
        /// Rows the columns are allocated for: the count is at most this.
        bound: usize,
        /// The count.
        word: DeviceCount,
    },
}

/// A row count in device memory: one u32, shared by the batches that view the same rows.
///
/// The operator that wrote it does not learn the number, so it cannot count its output rows.
/// It can hand its `output_rows` metric over with the word: whoever reads the count back adds
/// it there, once.
#[derive(Debug, Clone)]
pub struct DeviceCount(Arc<CountWord>);

#[derive(Debug)]
struct CountWord {
    word: DeviceBuffer<u32>,
    /// The producer's `output_rows`, credited when the count is first read back.
    producer: Option<Count>,
    credited: AtomicBool,
}

impl DeviceCount {
    /// `word` must hold one u32 (checked). `producer` is the writing operator's
    /// `output_rows` metric, if it wants the count.
    pub fn new(word: DeviceBuffer<u32>, producer: Option<Count>) -> Result<Self> {
        if word.len() != 1 {
            return Err(SpateError::Internal {
                message: format!("a device row count of {} words, not one", word.len()),
            });
        }
        Ok(DeviceCount(Arc::new(CountWord {
            word,
            producer,
            credited: AtomicBool::new(false),
        })))
    }

    /// The word, as kernels take it (`const u32* live`).
    pub fn as_slice(&self) -> DeviceSlice<'_, u32> {
        self.0.word.as_slice()
    }

    /// Reads the count back (one host synchronisation, 4 bytes).
    pub fn read(&self, stream: &spate_kernels::Stream) -> Result<usize> {
        let host = stream.to_vec(&self.0.word)?;
        let rows = host.first().copied().unwrap_or(0) as usize;
        self.credit(rows);
        Ok(rows)
    }

    /// Tells the producer the count, `rows`, read back by another transfer (the first time).
    pub(crate) fn credit(&self, rows: usize) {
        if let Some(producer) = &self.0.producer
            && !self.0.credited.swap(true, Ordering::Relaxed)
        {
            producer.add(rows);
        }
    }
}

impl RowCount {
    /// The most rows there can be: the columns' length.
    pub fn bound(&self) -> usize {
        match self {
            RowCount::Host(n) => *n,
            RowCount::Device { bound, .. } => *bound,
        }
    }

    /// The count, when the host knows it.
    pub fn host(&self) -> Option<usize> {
        match self {
            RowCount::Host(n) => Some(*n),
            RowCount::Device { .. } => None,
        }
    }

    /// The device word kernels stop at, or `None` when the count is on the host (kernels then
    /// take a null `live` and run to `bound`).
    pub fn live(&self) -> Option<DeviceSlice<'_, u32>> {
        match self {
            RowCount::Host(_) => None,
            RowCount::Device { word, .. } => Some(word.as_slice()),
        }
    }

    /// The `live` kernel argument: the count's address, or null.
    pub fn live_arg(&self) -> spate_kernels::KernelArg {
        self.live()
            .map_or_else(spate_kernels::KernelArg::null, Into::into)
    }
}

/// A batch of device columns with the Arrow schema it downloads as.
#[derive(Debug, Clone)]
pub struct DeviceBatch {
    schema: SchemaRef,
    columns: Vec<DeviceColumn>,
    rows: RowCount,
}

impl DeviceBatch {
    /// A batch from columns that match `schema` (types and row counts are checked).
    pub fn try_new(schema: SchemaRef, columns: Vec<DeviceColumn>, num_rows: usize) -> Result<Self> {
        Self::try_new_counted(schema, columns, RowCount::Host(num_rows))
    }

    /// A batch whose row count may be on the device: every column is `rows.bound()` long.
    pub fn try_new_counted(
        schema: SchemaRef,
        columns: Vec<DeviceColumn>,
        rows: RowCount,
    ) -> Result<Self> {
        if schema.fields().len() != columns.len() {
            return Err(SpateError::Internal {
                message: format!(
                    "device batch has {} columns for a schema of {}",
                    columns.len(),
                    schema.fields().len()
                ),
            });
        }
        let bound = rows.bound();
        for (field, column) in schema.fields().iter().zip(&columns) {
            if field.data_type() != column.data_type() || column.len() != bound {
                return Err(SpateError::Internal {
                    message: format!(
                        "device column `{}` is {} x {} rows, the schema wants {} x {bound}",
                        field.name(),
                        column.data_type(),
                        column.len(),
                        field.data_type()
                    ),
                });
            }
        }
        Ok(DeviceBatch {
            schema,
            columns,
            rows,
        })
    }

    /// The schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The columns, in schema order. With a device row count they are
    /// [`DeviceBatch::bound`] rows long, and only the rows below the count are defined.
    pub fn columns(&self) -> &[DeviceColumn] {
        &self.columns
    }

    /// The row count, on the host or on the device.
    pub fn row_count(&self) -> &RowCount {
        &self.rows
    }

    /// The most rows the batch can hold (its columns' length): its row count when the host
    /// knows it.
    pub fn bound(&self) -> usize {
        self.rows.bound()
    }

    /// The row count, when the host knows it.
    pub fn host_rows(&self) -> Option<usize> {
        self.rows.host()
    }

    /// True when the batch certainly has no rows (its bound is 0).
    pub fn is_certainly_empty(&self) -> bool {
        self.bound() == 0
    }

    /// The same rows with their count on the host: the batch itself when it is, otherwise the
    /// count read back (one 4-byte readback) and every column cut to it (a view, no copy).
    pub fn resolve(&self, stream: &spate_kernels::Stream) -> Result<DeviceBatch> {
        let RowCount::Device { word, .. } = &self.rows else {
            return Ok(self.clone());
        };
        let rows = word.read(stream)?;
        self.with_host_rows(rows)
    }

    /// [`DeviceBatch::resolve`] for many batches, with one readback for all their device
    /// counts (none when every count is on the host).
    pub fn resolve_all(
        stream: &spate_kernels::Stream,
        batches: Vec<DeviceBatch>,
    ) -> Result<Vec<DeviceBatch>> {
        let words: Vec<DeviceCount> = batches
            .iter()
            .filter_map(|b| match &b.rows {
                RowCount::Device { word, .. } => Some(word.clone()),
                RowCount::Host(_) => None,
            })
            .collect();
        if words.is_empty() {
            return Ok(batches);
        }
        if words.len() == 1 {
            return batches.iter().map(|b| b.resolve(stream)).collect();
        }
        let mut staging = stream.device().pinned(4 * words.len())?;
        for (k, word) in words.iter().enumerate() {
            stream.download_pinned_at(word.as_slice(), &mut staging, 4 * k)?;
        }
        let host = staging.as_bytes()?;
        let mut counts = host.chunks_exact(4).zip(&words).map(|(c, word)| {
            let rows = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
            word.credit(rows);
            rows
        });
        batches
            .into_iter()
            .map(|b| match &b.rows {
                RowCount::Host(_) => Ok(b),
                RowCount::Device { .. } => {
                    let rows = counts.next().ok_or_else(|| SpateError::Internal {
                        message: "a device row count missing from its readback".into(),
                    })?;
                    b.with_host_rows(rows)
                }
            })
            .collect()
    }

    /// The batch with its count on the host, `rows` (at most the bound): the columns cut to it.
    fn with_host_rows(&self, rows: usize) -> Result<DeviceBatch> {
        let bound = self.bound();
        if rows > bound {
            return Err(SpateError::Internal {
                message: format!("a device row count of {rows} over its bound of {bound}"),
            });
        }
        let columns = self
            .columns
            .iter()
            .map(|c| c.prefix(rows))
            .collect::<Result<Vec<_>>>()?;
        DeviceBatch::try_new(Arc::clone(&self.schema), columns, rows)
    }

    /// Marks the batch's allocations as read by many streams (a cached table's batches).
    pub fn share_across_streams(&self) {
        self.columns
            .iter()
            .for_each(DeviceColumn::share_across_streams);
    }

    /// Device bytes the batch references.
    pub fn device_bytes(&self) -> usize {
        self.columns.iter().map(DeviceColumn::device_bytes).sum()
    }
}

/// How a type is stored on the device, or `None` when it is not supported.
pub fn device_layout(data_type: &DataType) -> Option<Layout> {
    use DataType::*;
    Some(match data_type {
        Boolean => Layout::Bits,
        Int8 | UInt8 => Layout::Fixed(1),
        Int16 | UInt16 | Float16 => Layout::Fixed(2),
        Int32 | UInt32 | Float32 | Date32 | Time32(_) => Layout::Fixed(4),
        Int64 | UInt64 | Float64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => {
            Layout::Fixed(8)
        }
        Decimal128(_, _) => Layout::Fixed(16),
        Utf8 | Utf8View => Layout::Strings,
        LargeUtf8 => Layout::LargeStrings,
        _ => return None,
    })
}

/// Device storage classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Packed values of this many bytes.
    Fixed(usize),
    /// A bitmap.
    Bits,
    /// Offsets (i32, or i64 when the bytes need it) and bytes.
    Strings,
    /// i64 offsets and bytes.
    LargeStrings,
}

#[cfg(test)]
mod tests;
