//! Device columns and batches: Arrow data held in device memory, and the transfers both ways.
//!
//! Contracts:
//! - Every supported type round-trips exactly, nulls included: Int8–64, UInt8–64,
//!   Float16/32/64, Boolean, Date32/64, Time, Duration, Timestamp (any unit and zone),
//!   Decimal128 (full 128-bit), Utf8, LargeUtf8 and Utf8View, and embeddings:
//!   `FixedSizeList<Float16 | Float32 | UInt16, d>` (UInt16 for bf16, marked by the element
//!   field's `spate.bfloat16` metadata, which the type carries), held as rows of `d` elements
//!   end to end, gathered by `gather_rows` when wider than 16 bytes. A NULL element is stored
//!   as a NaN with a payload of its own (`vector::Elem::null_bits`) and turned back into a
//!   NULL on download; an upload refuses a set element with those bits (`Unsupported`), so
//!   they always mean NULL. Anything else is `SpateError::Unsupported`, naming the column and
//!   its type.
//! - Sliced arrays upload only their rows; uploaded bitmaps start at bit 0, and string offsets
//!   at 0.
//! - Utf8View is stored as offsets + bytes on the device (what the kernels read). It crosses
//!   the bus as its views and data buffers and is converted by kernels (`upload.rs`), and it
//!   is built back as Utf8View on download, so the schema DataFusion planned with holds.
//! - An upload stages a group of batches in one pinned buffer, each column's parts end to end
//!   (no host concatenation), and copies it with one asynchronous transfer into one device
//!   allocation (the batch's arena); columns are views into it. Many small transfers are what
//!   makes GPU engines slow, so batches are coalesced (in bytes) into one upload.

mod concat;
mod download;
mod gather;
mod peer;
mod slice;
mod upload;

use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::physical_plan::metrics::Count;
use spate_kernels::{DeviceBitmap, DeviceBuffer, DeviceSlice};

use crate::error::{Result, SpateError};

#[cfg(test)]
pub use concat::append_launches;
pub use concat::{append_device_batches, concat_device_batches, copy_device_batch};
pub use download::download_batch;
#[cfg(test)]
pub use download::download_column;
pub use gather::{Gather, gather_batch, gather_columns, gather_counted};
pub use peer::copy_batch_across;
#[cfg(test)]
pub use upload::upload_column;
pub use upload::{upload_batch, upload_batches, upload_batches_marked};

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

    /// See [`DeviceBuffer::free_on`]: the allocation is freed in `stream`'s order.
    pub fn free_on(&self, stream: &spate_kernels::Stream) -> Result<()> {
        Ok(self.buffer.free_on(stream)?)
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
    /// For strings whose bytes were allocated for a bound: the bytes the rows use, on the
    /// device (see [`UsedBytes`]). `None`: the bytes are exactly the rows'.
    used_bytes: Option<UsedBytes>,
    /// For strings: no value is longer than this many bytes, when known (see
    /// [`DeviceColumn::longest_string`]).
    longest_string: Option<usize>,
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

    /// `len` NULLs of `data_type` (zeroed values, an all-zero validity bitmap).
    pub fn nulls(stream: &spate_kernels::Stream, data_type: &DataType, len: usize) -> Result<Self> {
        let bitmap = |len: usize| spate_kernels::gather::bitmap_bytes(len).max(4);
        let values = match device_layout(data_type) {
            Some(Layout::Fixed(width)) => DeviceValues::Fixed {
                bytes: DeviceBytes::new(stream.alloc_zeroed::<u8>((len * width).max(16))?),
                width,
            },
            Some(Layout::Bits) => DeviceValues::Bits {
                bytes: DeviceBytes::new(stream.alloc_zeroed::<u8>(bitmap(len))?),
                offset: 0,
            },
            Some(Layout::Strings) => DeviceValues::Utf8 {
                offsets: DeviceBytes::new(stream.alloc_zeroed::<u8>((len + 1) * 4)?),
                bytes: DeviceBytes::new(stream.alloc::<u8>(0)?),
            },
            Some(Layout::LargeStrings) => DeviceValues::LargeUtf8 {
                offsets: DeviceBytes::new(stream.alloc_zeroed::<u8>((len + 1) * 8)?),
                bytes: DeviceBytes::new(stream.alloc::<u8>(0)?),
            },
            None => {
                return Err(SpateError::Internal {
                    message: format!("no device layout for a column of NULL {data_type}"),
                });
            }
        };
        let validity = DeviceValidity {
            bytes: DeviceBytes::new(stream.alloc_zeroed::<u8>(bitmap(len))?),
            offset: 0,
        };
        Ok(DeviceColumn::new(
            data_type.clone(),
            len,
            len,
            Some(validity),
            values,
        ))
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
            used_bytes: None,
            longest_string: None,
        }
    }

    /// The column, its string bytes allocated for a bound and the bytes its rows use in
    /// `used`, on the device (a gather that did not wait for its byte total).
    pub fn with_used_bytes(mut self, used: UsedBytes) -> Self {
        self.used_bytes = Some(used);
        self
    }

    /// The bytes the rows of a string column use, when they are on the device: the column's
    /// bytes were allocated for a bound, and only this many are the rows'. `None` when the
    /// bytes are exactly the rows' (or the column holds no strings). Such a column is only in
    /// a batch whose row count is on the device, and resolving the batch cuts its bytes.
    pub fn used_bytes(&self) -> Option<&UsedBytes> {
        self.used_bytes.as_ref()
    }

    /// The column, its strings known to be at most `longest` bytes each (`None`: not known).
    pub fn with_longest_string(mut self, longest: Option<usize>) -> Self {
        self.longest_string = longest;
        self
    }

    /// The most bytes one value of this string column holds, when known: a cached table's
    /// columns know it (`exec::column_facts`), and gathers of them keep it. A gather that may
    /// take a row many times sizes its bytes by it, without waiting for their total.
    pub fn longest_string(&self) -> Option<usize> {
        self.longest_string
    }

    /// The column with its bytes cut to the `used` its rows use (a view, no copy), when its
    /// used bytes were on the device.
    fn cut_to_used(&self, used: usize) -> Result<DeviceColumn> {
        let cut = |bytes: &DeviceBytes| -> Result<DeviceBytes> {
            if used > bytes.len() {
                return Err(SpateError::Internal {
                    message: format!(
                        "a string column using {used} bytes of the {} allocated",
                        bytes.len()
                    ),
                });
            }
            Ok(DeviceBytes::range(&bytes.buffer, bytes.offset, used))
        };
        let values = match &self.values {
            DeviceValues::Utf8 { offsets, bytes } => DeviceValues::Utf8 {
                offsets: offsets.clone(),
                bytes: cut(bytes)?,
            },
            DeviceValues::LargeUtf8 { offsets, bytes } => DeviceValues::LargeUtf8 {
                offsets: offsets.clone(),
                bytes: cut(bytes)?,
            },
            other => other.clone(),
        };
        Ok(DeviceColumn {
            values,
            used_bytes: None,
            ..self.clone()
        })
    }

    /// The Arrow type the column downloads as.
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.len
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

    /// Every allocation the column references, each as often as the column does.
    fn buffers(&self) -> impl Iterator<Item = &DeviceBytes> {
        let (first, second) = match &self.values {
            DeviceValues::Fixed { bytes, .. } | DeviceValues::Bits { bytes, .. } => (bytes, None),
            DeviceValues::Utf8 { offsets, bytes } | DeviceValues::LargeUtf8 { offsets, bytes } => {
                (offsets, Some(bytes))
            }
        };
        std::iter::once(first)
            .chain(second)
            .chain(self.validity.as_ref().map(|v| &v.bytes))
    }

    /// Marks every allocation the column references as read by many streams (see
    /// [`DeviceBuffer::share_across_streams`]).
    pub fn share_across_streams(&self) {
        self.buffers().for_each(DeviceBytes::share_across_streams);
    }

    /// Hands every allocation the column references over to `stream` (see
    /// [`DeviceBuffer::free_on`]).
    pub fn free_on(&self, stream: &spate_kernels::Stream) -> Result<()> {
        self.buffers().try_for_each(|b| b.free_on(stream))
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
        column.used_bytes = self.used_bytes.clone();
        column.longest_string = self.longest_string;
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
/// Nobody on the host knows the number until someone reads it back, so the metrics that need
/// it (an operator's `output_rows`, the bytes of the batches it made and took) wait on the
/// word ([`DeviceCount::when_counted`]) and are added when the count is first read, by
/// whichever reader.
#[derive(Debug, Clone)]
pub struct DeviceCount(Arc<CountWord>);

#[derive(Debug)]
struct CountWord {
    word: DeviceBuffer<u32>,
    credits: Mutex<Credits>,
    /// The used-bytes words of string columns gathered under this count: read back with it.
    companions: Mutex<Vec<UsedBytes>>,
}

/// The count once read, and the metrics waiting for it.
#[derive(Debug, Default)]
struct Credits {
    rows: Option<usize>,
    waiting: Vec<(Count, RowBytes)>,
}

/// What a batch of `r` rows adds to a metric: `per_row * r + bitmaps * ceil(r / 8) + fixed`
/// (its fixed-width values, its bitmaps, and its string offsets and bytes), plus the bytes of
/// its strings whose use is on the device (read back with the count, or else their
/// allocation), or, for a row count, just `r` ([`RowBytes::ROWS`]).
#[derive(Debug, Clone)]
pub struct RowBytes {
    per_row: usize,
    bitmaps: usize,
    fixed: usize,
    /// String bytes whose use is on the device, with their allocation.
    used: Vec<(UsedBytes, usize)>,
}

impl RowBytes {
    /// One per row: a row count.
    pub const ROWS: RowBytes = RowBytes {
        per_row: 1,
        bitmaps: 0,
        fixed: 0,
        used: Vec::new(),
    };

    /// The amount for `rows` rows.
    pub fn at(&self, rows: usize) -> usize {
        let used: usize = self
            .used
            .iter()
            .map(|(u, allocated)| u.known().map_or(*allocated, |b| b as usize))
            .sum();
        self.per_row * rows + self.bitmaps * rows.div_ceil(8) + self.fixed + used
    }
}

impl DeviceCount {
    /// `word` must hold one u32 (checked).
    pub fn new(word: DeviceBuffer<u32>) -> Result<Self> {
        if word.len() != 1 {
            return Err(SpateError::Internal {
                message: format!("a device row count of {} words, not one", word.len()),
            });
        }
        Ok(DeviceCount(Arc::new(CountWord {
            word,
            credits: Mutex::new(Credits::default()),
            companions: Mutex::new(Vec::new()),
        })))
    }

    /// The word, as kernels take it (`const u32* live`).
    pub fn as_slice(&self) -> DeviceSlice<'_, u32> {
        self.0.word.as_slice()
    }

    /// Reads the count back (one host synchronisation, 4 bytes), with the used bytes of the
    /// string columns gathered under it (8 bytes each) in the same transfer.
    pub fn read(&self, stream: &spate_kernels::Stream) -> Result<usize> {
        if let Some(rows) = self.known() {
            return Ok(rows);
        }
        read_words(stream, std::slice::from_ref(self), &[])?;
        self.known().ok_or_else(|| SpateError::Internal {
            message: "a device row count read back without a value".into(),
        })
    }

    /// Reads `used` back whenever this count is (see [`DeviceCount::read`]).
    pub(crate) fn accompany(&self, used: &UsedBytes) {
        lock(&self.0.companions).push(used.clone());
    }

    /// The companions not read yet.
    fn unread_companions(&self) -> Vec<UsedBytes> {
        lock(&self.0.companions)
            .iter()
            .filter(|u| u.known().is_none())
            .cloned()
            .collect()
    }

    /// The count, when it was read back already.
    pub fn known(&self) -> Option<usize> {
        self.credits().rows
    }

    /// Adds `amount.at(count)` to `metric` once the count is known: at once when it is.
    pub fn when_counted(&self, metric: Count, amount: RowBytes) {
        let mut credits = self.credits();
        match credits.rows {
            Some(rows) => metric.add(amount.at(rows)),
            None => credits.waiting.push((metric, amount)),
        }
    }

    /// A handle that names this word without keeping it (or its stream's memory) alive.
    pub fn weak(&self) -> WeakCount {
        WeakCount(Arc::downgrade(&self.0))
    }

    /// Records the count, `rows`, read back by another transfer, and pays the metrics
    /// waiting for it (the first time).
    pub(crate) fn credit(&self, rows: usize) {
        let mut credits = self.credits();
        if credits.rows.is_some() {
            return;
        }
        credits.rows = Some(rows);
        for (metric, amount) in credits.waiting.drain(..) {
            metric.add(amount.at(rows));
        }
    }

    fn credits(&self) -> std::sync::MutexGuard<'_, Credits> {
        // A panic while holding the lock leaves plain numbers behind: still usable.
        self.0
            .credits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain values behind: still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bytes a string column's rows use, as a u64 on the device: a gather that knows a bound
/// for its bytes (each source row taken at most once, or a longest string) allocates for it
/// and leaves the exact total where its scan wrote it, so nothing waits. Read back when the
/// batch's row count is (the count's companions), and then the bytes are cut to it.
#[derive(Debug, Clone)]
pub struct UsedBytes(Arc<UsedWord>);

#[derive(Debug)]
struct UsedWord {
    words: Arc<DeviceBuffer<u64>>,
    at: usize,
    known: std::sync::OnceLock<u64>,
}

impl UsedBytes {
    /// Word `at` of `words` (checked).
    pub fn new(words: &Arc<DeviceBuffer<u64>>, at: usize) -> Result<Self> {
        if at >= words.len() {
            return Err(SpateError::Internal {
                message: format!("used-bytes word {at} of {}", words.len()),
            });
        }
        Ok(UsedBytes(Arc::new(UsedWord {
            words: Arc::clone(words),
            at,
            known: std::sync::OnceLock::new(),
        })))
    }

    /// The word, as kernels and copies take it.
    pub fn as_slice(&self) -> DeviceSlice<'_, u64> {
        // In range: checked when made.
        self.0
            .words
            .slice(self.0.at..self.0.at + 1)
            .unwrap_or_else(|_| self.0.words.as_slice())
    }

    /// The bytes, once read back.
    pub fn known(&self) -> Option<u64> {
        self.0.known.get().copied()
    }

    fn record(&self, bytes: u64) {
        let _ = self.0.known.set(bytes);
    }

    fn same(&self, other: &UsedBytes) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Reads `counts` and `used` back in one transfer (with the counts' unread companions), and
/// records them: used bytes first, so that metrics paid when a count is credited see them.
/// Words read already are skipped; nothing is read when none is left.
pub(crate) fn read_words(
    stream: &spate_kernels::Stream,
    counts: &[DeviceCount],
    used: &[UsedBytes],
) -> Result<()> {
    let counts: Vec<&DeviceCount> = counts.iter().filter(|c| c.known().is_none()).collect();
    let mut words: Vec<UsedBytes> = Vec::new();
    for u in used
        .iter()
        .cloned()
        .chain(counts.iter().flat_map(|c| c.unread_companions()))
    {
        if u.known().is_none() && !words.iter().any(|w| w.same(&u)) {
            words.push(u);
        }
    }
    if counts.is_empty() && words.is_empty() {
        return Ok(());
    }
    // u64s first (aligned), then the u32 counts.
    let at = 8 * words.len();
    let mut staging = stream.device().pinned(at + 4 * counts.len())?;
    for (k, w) in words.iter().enumerate() {
        stream.download_pinned_at(w.as_slice(), &mut staging, 8 * k)?;
    }
    for (k, c) in counts.iter().enumerate() {
        stream.download_pinned_at(c.as_slice(), &mut staging, at + 4 * k)?;
    }
    let host = staging.as_bytes()?;
    let word = |c: &[u8]| c.iter().rev().fold(0u64, |v, &b| (v << 8) | u64::from(b));
    for (c, w) in host[..at].chunks_exact(8).zip(&words) {
        w.record(word(c));
    }
    for (c, count) in host[at..].chunks_exact(4).zip(&counts) {
        count.credit(word(c) as usize);
    }
    Ok(())
}

/// A [`DeviceCount`] named but not kept alive (see [`DeviceCount::weak`]).
#[derive(Debug, Clone)]
pub struct WeakCount(std::sync::Weak<CountWord>);

impl WeakCount {
    /// True when this names `word`.
    pub fn is(&self, word: &DeviceCount) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&word.0))
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
        if matches!(rows, RowCount::Host(_))
            && columns
                .iter()
                .any(|c| c.used_bytes().is_some_and(|u| u.known().is_none()))
        {
            return Err(SpateError::Internal {
                message: "a host-counted device batch with string bytes of unknown use".into(),
            });
        }
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
    /// count read back (one readback of 4 bytes, and 8 for each string column whose used bytes
    /// are on the device) and every column cut to it (a view, no copy).
    pub fn resolve(&self, stream: &spate_kernels::Stream) -> Result<DeviceBatch> {
        Ok(Self::resolve_all(stream, vec![self.clone()])?.remove(0))
    }

    /// [`DeviceBatch::resolve`] for many batches, with one readback for all the device counts
    /// and used bytes not read yet (none when there are none).
    pub fn resolve_all(
        stream: &spate_kernels::Stream,
        batches: Vec<DeviceBatch>,
    ) -> Result<Vec<DeviceBatch>> {
        let counts: Vec<DeviceCount> = batches
            .iter()
            .filter_map(|b| match &b.rows {
                RowCount::Device { word, .. } => Some(word.clone()),
                RowCount::Host(_) => None,
            })
            .collect();
        let used: Vec<UsedBytes> = batches
            .iter()
            .flat_map(|b| b.columns.iter().filter_map(|c| c.used_bytes.clone()))
            .collect();
        read_words(stream, &counts, &used)?;
        batches.iter().map(DeviceBatch::with_counts_read).collect()
    }

    /// The batch with its count on the host, once every word it needs was read back: the
    /// columns cut to the count, and string bytes to what the rows use.
    fn with_counts_read(&self) -> Result<DeviceBatch> {
        let rows = match &self.rows {
            RowCount::Host(_) => return Ok(self.clone()),
            RowCount::Device { word, .. } => word.known(),
        };
        let unread = || SpateError::Internal {
            message: "a device batch resolved before its words were read back".into(),
        };
        let rows = rows.ok_or_else(unread)?;
        let bound = self.bound();
        if rows > bound {
            return Err(SpateError::Internal {
                message: format!("a device row count of {rows} over its bound of {bound}"),
            });
        }
        let columns = self
            .columns
            .iter()
            .map(|c| {
                let c = c.prefix(rows)?;
                match c.used_bytes() {
                    None => Ok(c),
                    Some(u) => c.cut_to_used(u.known().ok_or_else(unread)? as usize),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        DeviceBatch::try_new(Arc::clone(&self.schema), columns, rows)
    }

    /// Marks the batch's allocations as read by many streams (a cached table's batches).
    pub fn share_across_streams(&self) {
        self.columns
            .iter()
            .for_each(DeviceColumn::share_across_streams);
    }

    /// Hands the batch's allocations over to `stream`, which waits for the stream that filled
    /// them (see [`DeviceBuffer::free_on`]).
    pub fn free_on(&self, stream: &spate_kernels::Stream) -> Result<()> {
        self.columns.iter().try_for_each(|c| c.free_on(stream))
    }

    /// Device bytes the batch references.
    pub fn device_bytes(&self) -> usize {
        self.columns.iter().map(DeviceColumn::device_bytes).sum()
    }

    /// Device bytes the batch keeps allocated: the whole of every allocation its columns are
    /// views of (a filter's output cut to its count, an uploaded batch's arena), each once.
    pub fn held_bytes(&self) -> usize {
        self.allocations().iter().map(|(b, _)| b.len()).sum()
    }

    /// The part of [`DeviceBatch::held_bytes`] only this batch views: what dropping it frees.
    /// An allocation something else views too (a cached table's batch, an operator's other
    /// output) is left out.
    pub fn unshared_bytes(&self) -> usize {
        self.allocations()
            .iter()
            .filter(|(b, views)| Arc::strong_count(b) == *views)
            .map(|(b, _)| b.len())
            .sum()
    }

    /// Each allocation the batch's columns are views of, once, with the number of its views
    /// the batch holds.
    fn allocations(&self) -> Vec<(&Arc<DeviceBuffer<u8>>, usize)> {
        let mut seen: Vec<(&Arc<DeviceBuffer<u8>>, usize)> = Vec::new();
        for c in &self.columns {
            let mut views: Vec<&DeviceBytes> = Vec::with_capacity(3);
            match &c.values {
                DeviceValues::Fixed { bytes, .. } | DeviceValues::Bits { bytes, .. } => {
                    views.push(bytes);
                }
                DeviceValues::Utf8 { offsets, bytes }
                | DeviceValues::LargeUtf8 { offsets, bytes } => {
                    views.push(offsets);
                    views.push(bytes);
                }
            }
            if let Some(v) = &c.validity {
                views.push(&v.bytes);
            }
            for view in views {
                match seen.iter_mut().find(|(b, _)| Arc::ptr_eq(b, &view.buffer)) {
                    Some((_, n)) => *n += 1,
                    None => seen.push((&view.buffer, 1)),
                }
            }
        }
        seen
    }

    /// The device bytes of the batch's rows as a function of their count: what its first `r`
    /// rows hold (for a batch whose count is on the device, what the kernels wrote).
    pub fn row_bytes(&self) -> RowBytes {
        let mut bytes = RowBytes {
            per_row: 0,
            bitmaps: 0,
            fixed: 0,
            used: Vec::new(),
        };
        for c in &self.columns {
            // A producer that keeps its count on the device writes no bytes for the rows past
            // it: the bytes are all rows' bytes, or, allocated for a bound, what the used-bytes
            // word says.
            let mut strings = |b: &DeviceBytes| match c.used_bytes() {
                Some(u) => bytes.used.push((u.clone(), b.len())),
                None => bytes.fixed += b.len(),
            };
            match c.values() {
                DeviceValues::Fixed { width, .. } => bytes.per_row += width,
                DeviceValues::Bits { .. } => bytes.bitmaps += 1,
                DeviceValues::Utf8 { bytes: b, .. } => {
                    strings(b);
                    bytes.per_row += 4;
                    bytes.fixed += 4;
                }
                DeviceValues::LargeUtf8 { bytes: b, .. } => {
                    strings(b);
                    bytes.per_row += 8;
                    bytes.fixed += 8;
                }
            }
            if c.validity().is_some() {
                bytes.bitmaps += 1;
            }
        }
        bytes
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
        // An embedding: each row its `d` elements end to end (bf16 is UInt16 with the field
        // metadata `spate.bfloat16`); a NULL element is stored as its type's
        // `Elem::null_bits`.
        FixedSizeList(child, d) => {
            let elem = crate::vector::Elem::of_field(child).filter(|_| *d > 0)?;
            Layout::Fixed(*d as usize * elem.width())
        }
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
