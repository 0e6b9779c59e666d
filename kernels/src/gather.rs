//! Gather and scatter: `kernels/cuda/gather/gather.cu`.
//!
//! Gather: `out[i] = in[indices[i]]`; scatter: `out[indices[i]] = in[i]`. The index
//! [`NULL_INDEX`](crate::launch::NULL_INDEX) means "no row": a gather writes a zero value and a NULL bit for it (what outer
//! joins need), a scatter skips it. Fixed-width values move by their width, so every type of a
//! width shares one kernel. Strings are Arrow offsets + bytes, with i32 (Utf8) or i64
//! (LargeUtf8) offsets; the launcher checks the gathered bytes fit the offset type.

use crate::error::{KernelError, Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::{DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceSlice};
use crate::scan;
use crate::stream::Stream;

/// Element types gathered and scattered by width.
pub trait GatherElem: DeviceCopy {
    #[doc(hidden)]
    const GATHER: &'static str;
    #[doc(hidden)]
    const SCATTER: &'static str;
}

macro_rules! gather_elem {
    ($g:literal, $s:literal: $($t:ty),*) => { $(
        impl GatherElem for $t {
            const GATHER: &'static str = $g;
            const SCATTER: &'static str = $s;
        }
    )* };
}
gather_elem!("gather_u8", "scatter_u8": u8, i8);
gather_elem!("gather_u16", "scatter_u16": u16, i16);
gather_elem!("gather_u32", "scatter_u32": u32, i32, f32);
gather_elem!("gather_u64", "scatter_u64": u64, i64, f64);
gather_elem!("gather_u128", "scatter_u128": u128, i128);

fn grid(stream: &Stream, n: usize) -> LaunchConfig {
    LaunchConfig::blocks(stream.device().grid_stride_blocks(n))
}

/// A device row count as kernels take it (`const u32* live`): null when there is none.
fn live_arg(live: Option<DeviceSlice<'_, u32>>) -> KernelArg {
    live.map_or_else(KernelArg::null, Into::into)
}

/// `out[i] = values[indices[i]]` (zero for [`NULL_INDEX`](crate::launch::NULL_INDEX)). Every other index must be less
/// than `values.len()`; that is the caller's contract, as on a GPU nothing checks it cheaply.
pub fn gather<T: GatherElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    indices: DeviceSlice<'_, u32>,
) -> Result<DeviceBuffer<T>> {
    gather_live(stream, values, indices, None)
}

/// [`gather`] of a batch whose row count may be on the device: with `live` (one u32), only
/// the first `*live` indices are read and their outputs written; the rest of the `n` outputs
/// are left as allocated.
pub fn gather_live<T: GatherElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
) -> Result<DeviceBuffer<T>> {
    let n = indices.len();
    let out = stream.alloc::<T>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel(T::GATHER)?;
    // SAFETY: `out` and `indices` hold `n` elements; indices address `values` (contract above)
    // below the live count, and the kernel reads no others.
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, n),
            &[
                values.into(),
                indices.into(),
                live_arg(live),
                KernelArg::U64(n as u64),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// Words of a row gather ([`gather_rows_live`]).
pub trait RowWord: DeviceCopy {
    #[doc(hidden)]
    const GATHER_ROWS: &'static str;
}

macro_rules! row_word {
    ($g:literal: $t:ty) => {
        impl RowWord for $t {
            const GATHER_ROWS: &'static str = $g;
        }
    };
}

row_word!("gather_rows_u16": u16);
row_word!("gather_rows_u32": u32);
row_word!("gather_rows_u64": u64);
row_word!("gather_rows_u128": u128);

/// Gathers rows of `words` values each (values wider than 16 bytes, such as embeddings): row
/// `i` of the result is row `indices[i]` of `values`, zeros for
/// [`NULL_INDEX`](crate::launch::NULL_INDEX). With `live` (one u32), only the first `*live`
/// rows are read and written. Every other index must be less than `values.len() / words`.
pub fn gather_rows_live<T: RowWord>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    words: usize,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
) -> Result<DeviceBuffer<T>> {
    ensure_arg!(
        words > 0 && values.len().is_multiple_of(words),
        "gather of rows of {words} values from {} values",
        values.len()
    );
    let n = indices.len();
    let total = n
        .checked_mul(words)
        .ok_or_else(|| KernelError::InvalidArgument {
            message: format!("a gather of {n} rows of {words} values"),
        })?;
    let out = stream.alloc::<T>(total)?;
    if total == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel(T::GATHER_ROWS)?;
    // SAFETY: `out` holds `n * words` values and `indices` `n`; indices address rows of
    // `values` (contract above) below the live count, and the kernel reads no others.
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, total),
            &[
                values.into(),
                KernelArg::U64(words as u64),
                indices.into(),
                live_arg(live),
                KernelArg::U64(n as u64),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// `out[indices[i]] = values[i]`, skipping [`NULL_INDEX`](crate::launch::NULL_INDEX). Indices must be distinct and less
/// than `out.len()`.
pub fn scatter<T: GatherElem>(
    stream: &Stream,
    values: DeviceSlice<'_, T>,
    indices: DeviceSlice<'_, u32>,
    out: &mut DeviceBuffer<T>,
) -> Result<()> {
    let n = values.len();
    ensure_arg!(
        indices.len() == n,
        "scatter of {n} values with {} indices",
        indices.len()
    );
    if n == 0 {
        return Ok(());
    }
    let kernel = stream.device().kernel(T::SCATTER)?;
    // SAFETY: `values` and `indices` hold `n` elements; indices address `out` (contract above).
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, n),
            &[
                values.into(),
                indices.into(),
                KernelArg::U64(n as u64),
                out.into(),
            ],
        )?;
    }
    Ok(())
}

/// Bytes of a bitmap for `rows` rows as the kernels write it: whole 32-bit words.
pub fn bitmap_bytes(rows: usize) -> usize {
    rows.div_ceil(32) * 4
}

/// Gathers validity: bit `i` of the result is the validity of row `indices[i]` (`None` means
/// every source row is valid); [`NULL_INDEX`](crate::launch::NULL_INDEX) gives NULL. The result starts at bit 0 and has
/// [`bitmap_bytes`] bytes, bits past the last row zero.
pub fn gather_bitmap(
    stream: &Stream,
    validity: Option<DeviceBitmap<'_>>,
    indices: DeviceSlice<'_, u32>,
) -> Result<DeviceBuffer<u8>> {
    gather_bitmap_live(stream, validity, indices, None)
}

/// [`gather_bitmap`] up to a device row count (see [`gather_live`]): words past the count are
/// not written, and the bits past it in its last word are zero.
pub fn gather_bitmap_live(
    stream: &Stream,
    validity: Option<DeviceBitmap<'_>>,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
) -> Result<DeviceBuffer<u8>> {
    let n = indices.len();
    let out = stream.alloc::<u8>(bitmap_bytes(n))?;
    if n == 0 {
        return Ok(out);
    }
    let kernel = stream.device().kernel("gather_bitmap")?;
    // SAFETY: `out` has a word per 32 rows; indices address rows of `validity`.
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, n.div_ceil(32)),
            &[
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                indices.into(),
                live_arg(live),
                KernelArg::U64(n as u64),
                (&out).into(),
            ],
        )?;
    }
    Ok(out)
}

/// Scatters validity into `out`, a zeroed (all NULL) bitmap of whole words: bit `indices[i]`
/// becomes the validity of row `i`. Rows nobody scatters to stay NULL.
pub fn scatter_bitmap(
    stream: &Stream,
    validity: Option<DeviceBitmap<'_>>,
    indices: DeviceSlice<'_, u32>,
    out: &mut DeviceBuffer<u8>,
) -> Result<()> {
    let n = indices.len();
    ensure_arg!(
        out.len().is_multiple_of(4),
        "scatter_bitmap needs whole 32-bit words, got {} bytes",
        out.len()
    );
    if let Some(v) = validity {
        v.check_covers(n, "source validity")?;
    }
    if n == 0 {
        return Ok(());
    }
    let kernel = stream.device().kernel("scatter_bitmap")?;
    // SAFETY: `validity` covers `n` rows; indices address bits of `out` (caller's contract).
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, n),
            &[
                validity.into(),
                KernelArg::U64(validity.map_or(0, |v| v.offset as u64)),
                indices.into(),
                KernelArg::U64(n as u64),
                out.into(),
            ],
        )?;
    }
    Ok(())
}

/// Copies `n` bits of `src` (`None`: all set) into `dst` at bit `dst_offset`. `dst` must be
/// zeroed where the bits land; copies into one bitmap may touch neighbouring ranges.
pub fn copy_bitmap(
    stream: &Stream,
    src: Option<DeviceBitmap<'_>>,
    n: usize,
    dst: &mut DeviceBuffer<u8>,
    dst_offset: usize,
) -> Result<()> {
    ensure_arg!(
        dst.len().is_multiple_of(4),
        "copy_bitmap needs whole 32-bit words"
    );
    ensure_arg!(
        dst_offset + n <= dst.len() * 8,
        "copy of {n} bits at {dst_offset} overflows a bitmap of {} bits",
        dst.len() * 8
    );
    if let Some(s) = src {
        s.check_covers(n, "source")?;
    }
    if n == 0 {
        return Ok(());
    }
    let kernel = stream.device().kernel("copy_bitmap")?;
    // SAFETY: `src` covers `n` bits and `dst` holds `dst_offset + n` bits (checked).
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, n),
            &[
                src.into(),
                KernelArg::U64(src.map_or(0, |s| s.offset as u64)),
                KernelArg::U64(n as u64),
                dst.into(),
                KernelArg::U64(dst_offset as u64),
            ],
        )
    }
}

/// The most parts one [`append_parts`] launch takes (`SPATE_APPEND_PARTS` in `gather.cu`).
pub const APPEND_PARTS: usize = 16;

/// One part of an [`append_parts`] launch: a column's rows in one batch.
#[derive(Debug, Clone, Copy)]
pub struct AppendPart<'a> {
    /// The part's values (`width` bytes a row), or, for a bitmap, its bitmap (`None`: every
    /// row set).
    pub src: Option<DeviceSlice<'a, u8>>,
    /// For a bitmap, the bit offset of row 0 in `src`.
    pub src_offset: usize,
    /// The part's device row count, or `None` when all `n` rows are rows.
    pub live: Option<DeviceSlice<'a, u32>>,
    /// The part's bound: the rows `src` holds.
    pub n: usize,
}

/// Appends the live rows of `parts` (at most [`APPEND_PARTS`]), in order, to `dst` with one
/// launch: part k lands after the live rows of the parts before it, which the kernel sums from
/// their count words, so no count comes to the host. `width` is the bytes a row (`None`: the
/// parts are bitmaps, and `dst` must start zeroed). `dst`, when given, must hold the sum of the
/// parts' bounds; `count`, when given, gets the merged row count (one u32). Nothing waits.
pub fn append_parts(
    stream: &Stream,
    width: Option<usize>,
    parts: &[AppendPart<'_>],
    dst: Option<&mut DeviceBuffer<u8>>,
    count: Option<DeviceSlice<'_, u32>>,
) -> Result<()> {
    ensure_arg!(
        parts.len() <= APPEND_PARTS,
        "an append of {} parts (at most {APPEND_PARTS} a launch)",
        parts.len()
    );
    let bound: usize = parts.iter().map(|p| p.n).sum();
    for p in parts {
        match (width, p.src) {
            (Some(w), Some(src)) => ensure_arg!(
                src.len() >= p.n * w,
                "an append part of {} rows of {w} bytes from {} bytes",
                p.n,
                src.len()
            ),
            (Some(_), None) if dst.is_some() => ensure_arg!(false, "an append part without values"),
            (None, Some(src)) => DeviceBitmap::new(src)
                .with_offset(p.src_offset)
                .check_covers(p.n, "append part")?,
            _ => {}
        }
        if let Some(live) = p.live {
            ensure_arg!(
                live.len() == 1,
                "an append part's count of {} words",
                live.len()
            );
        }
    }
    if let Some(d) = &dst {
        match width {
            Some(w) => ensure_arg!(
                bound * w <= d.len(),
                "an append of {bound} rows of {w} bytes into {} bytes",
                d.len()
            ),
            None => ensure_arg!(
                d.len().is_multiple_of(4) && bound <= d.len() * 8,
                "an append of {bound} bits into {} bytes (whole 32-bit words needed)",
                d.len()
            ),
        }
    }
    if let Some(c) = count {
        ensure_arg!(c.len() == 1, "an append count of {} words", c.len());
    }
    if dst.is_none() && count.is_none() {
        return Ok(());
    }
    let kernel = stream.device().kernel("append_parts")?;
    let mut args = Vec::with_capacity(4 + 4 * APPEND_PARTS);
    args.push(KernelArg::U64(width.unwrap_or(0) as u64));
    args.push(KernelArg::U32(parts.len() as u32));
    for k in 0..APPEND_PARTS {
        match parts.get(k) {
            Some(p) => args.extend([
                p.src.map_or_else(KernelArg::null, Into::into),
                KernelArg::U64(p.src_offset as u64),
                live_arg(p.live),
                KernelArg::U64(p.n as u64),
            ]),
            None => args.extend([
                KernelArg::null(),
                KernelArg::U64(0),
                KernelArg::null(),
                KernelArg::U64(0),
            ]),
        }
    }
    args.push(dst.as_deref().map_or_else(KernelArg::null, Into::into));
    args.push(count.map_or_else(KernelArg::null, Into::into));
    let largest = parts
        .iter()
        .map(|p| p.n * width.unwrap_or(1))
        .max()
        .unwrap_or(0);
    // SAFETY: every part's source covers its bound (checked), and `dst` holds the sum of the
    // bounds (checked), past which no live count reaches.
    unsafe { stream.launch(&kernel, grid(stream, largest.max(1)), &args) }
}

/// Copies string offsets into `dst` at `dst_offset`, adding `delta` to each.
pub fn add_offsets<O: OffsetElem + Into<KernelArg>>(
    stream: &Stream,
    src: DeviceSlice<'_, O>,
    delta: O,
    dst: &mut DeviceBuffer<O>,
    dst_offset: usize,
) -> Result<()> {
    let entry = string_entry::<O>("add_offsets");
    launch_offsets(stream, &entry, src, delta.into(), dst, dst_offset)
}

/// Copies 32-bit string offsets into 64-bit `dst` at `dst_offset`, adding `delta` to each.
pub fn widen_offsets(
    stream: &Stream,
    src: DeviceSlice<'_, i32>,
    delta: i64,
    dst: &mut DeviceBuffer<i64>,
    dst_offset: usize,
) -> Result<()> {
    launch_offsets(
        stream,
        "widen_offsets_i32",
        src,
        KernelArg::I64(delta),
        dst,
        dst_offset,
    )
}

/// Launches `entry(src, n, delta, dst + dst_offset)` over the `n` offsets of `src`.
fn launch_offsets<S: DeviceCopy, D: DeviceCopy>(
    stream: &Stream,
    entry: &str,
    src: DeviceSlice<'_, S>,
    delta: KernelArg,
    dst: &mut DeviceBuffer<D>,
    dst_offset: usize,
) -> Result<()> {
    let n = src.len();
    ensure_arg!(
        dst_offset + n <= dst.len(),
        "copy of {n} offsets at {dst_offset} overflows {} offsets",
        dst.len()
    );
    if n == 0 {
        return Ok(());
    }
    let kernel = stream.device().kernel(entry)?;
    let out = dst.slice(dst_offset..dst_offset + n)?;
    // SAFETY: `src` and the destination range hold `n` offsets of the entry's source and
    // destination types; `delta` is the entry's offset type.
    unsafe {
        stream.launch(
            &kernel,
            grid(stream, n),
            &[src.into(), KernelArg::U64(n as u64), delta, out.into()],
        )
    }
}

/// Offset types of string columns.
pub trait OffsetElem: DeviceCopy + Default + TryFrom<u64> {
    #[doc(hidden)]
    const SUFFIX: &'static str;
    /// The largest byte length the offset type can address.
    const MAX_BYTES: u64;
}

impl OffsetElem for i32 {
    const SUFFIX: &'static str = "i32";
    const MAX_BYTES: u64 = i32::MAX as u64;
}

impl OffsetElem for i64 {
    const SUFFIX: &'static str = "i64";
    const MAX_BYTES: u64 = i64::MAX as u64;
}

/// A string column in device memory: `rows + 1` offsets into `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceStrings<'a, O> {
    /// Arrow offsets, one more than the rows.
    pub offsets: DeviceSlice<'a, O>,
    /// The UTF-8 data.
    pub bytes: DeviceSlice<'a, u8>,
}

impl<O> DeviceStrings<'_, O> {
    /// Number of strings.
    pub fn rows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
}

/// An owned string column in device memory.
#[derive(Debug)]
pub struct StringBuffers<O: DeviceCopy> {
    /// `rows + 1` offsets.
    pub offsets: DeviceBuffer<O>,
    /// The bytes.
    pub bytes: DeviceBuffer<u8>,
}

impl<O: DeviceCopy> StringBuffers<O> {
    /// A borrowed view.
    pub fn as_strings(&self) -> DeviceStrings<'_, O> {
        DeviceStrings {
            offsets: self.offsets.as_slice(),
            bytes: self.bytes.as_slice(),
        }
    }
}

fn string_entry<O: OffsetElem>(what: &str) -> String {
    format!("{what}_{}", O::SUFFIX)
}

/// Checks `total` bytes fit offsets of type `O`.
pub(crate) fn fits<O: OffsetElem>(total: u64) -> Result<()> {
    if total > O::MAX_BYTES {
        return Err(KernelError::OutputTooLarge {
            bytes: total,
            offset_bits: (size_of::<O>() * 8) as u32,
        });
    }
    Ok(())
}

/// Gathers strings: row `i` of the result is row `indices[i]` of `strings` (empty for
/// [`NULL_INDEX`](crate::launch::NULL_INDEX)). Three steps: lengths, a u64 scan into output starts, then the copy.
pub fn gather_strings<O: OffsetElem>(
    stream: &Stream,
    strings: DeviceStrings<'_, O>,
    indices: DeviceSlice<'_, u32>,
) -> Result<StringBuffers<O>> {
    let total = stream.alloc::<u64>(1)?;
    let gather = start_string_gather(stream, strings, indices, None, total.as_slice())?;
    let total = stream.to_vec(&total)?[0];
    // SAFETY: `total` is what the start wrote, read back after it.
    unsafe { finish_string_gather(stream, gather, strings, indices, None, total) }
}

/// A string gather whose byte total is still on the device: the first half of
/// [`gather_strings`], for callers that gather several string columns and read all their
/// totals back in one transfer ([`finish_string_gather`] is the second half).
#[derive(Debug)]
#[must_use = "a started string gather is finished by `finish_string_gather`"]
pub struct StringGather {
    /// Per output row its first byte, then the total (n + 1 values).
    starts: DeviceBuffer<u64>,
}

/// Starts gathering `indices` of `strings`: each output row's start, and the byte total
/// written to `total` (one u64) on the device. Nothing waits for the device. With `live` (a
/// device row count, see [`gather_live`]) the rows at or past the count are empty strings.
pub fn start_string_gather<O: OffsetElem>(
    stream: &Stream,
    strings: DeviceStrings<'_, O>,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
    total: DeviceSlice<'_, u64>,
) -> Result<StringGather> {
    let n = indices.len();
    let lengths = stream.alloc::<u64>(n + 1)?;
    let lengths_kernel = stream
        .device()
        .kernel(&string_entry::<O>("gather_string_lengths"))?;
    // SAFETY: `lengths` holds n + 1 values; indices below the live count address rows of
    // `strings`, and the kernel reads no others.
    unsafe {
        stream.launch(
            &lengths_kernel,
            grid(stream, n + 1),
            &[
                strings.offsets.into(),
                indices.into(),
                live_arg(live),
                KernelArg::U64(n as u64),
                (&lengths).into(),
            ],
        )?;
    }
    let starts = scan::exclusive_sum_total_on_device(stream, lengths.as_slice(), total)?;
    Ok(StringGather { starts })
}

/// Finishes a string gather started with the same `strings` and `indices`.
///
/// # Safety
///
/// - `strings`, `indices` and `live` must be the ones `gather` was started with, unchanged
///   since: the copy reads each row's bytes at lengths the start computed from them.
/// - `total` must be the value [`start_string_gather`] wrote to its `total`, read back after
///   the stream got there, or a bound of it known otherwise: the bytes are allocated for
///   `total`, and the copy writes the value the start wrote (the rest is never written).
pub unsafe fn finish_string_gather<O: OffsetElem>(
    stream: &Stream,
    gather: StringGather,
    strings: DeviceStrings<'_, O>,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
    total: u64,
) -> Result<StringBuffers<O>> {
    ensure_arg!(
        gather.starts.len() == indices.len() + 1,
        "a string gather started for {} rows finished for {}",
        gather.starts.len() - 1,
        indices.len()
    );
    // SAFETY: the caller passes the total of these starts.
    unsafe { copy_strings(stream, strings, indices, live, &gather.starts, total) }
}

/// The copy of a string gather: offsets from `starts`, and `total` bytes.
///
/// # Safety
///
/// `starts` holds `indices.len() + 1` values, the scan of the gathered rows' lengths (up to
/// the same `live` count), and `total` is their sum.
unsafe fn copy_strings<O: OffsetElem>(
    stream: &Stream,
    strings: DeviceStrings<'_, O>,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
    starts: &DeviceBuffer<u64>,
    total: u64,
) -> Result<StringBuffers<O>> {
    fits::<O>(total)?;
    let n = indices.len();
    let offsets = stream.alloc::<O>(n + 1)?;
    let bytes = stream.alloc::<u8>(total as usize)?;
    let copy = stream
        .device()
        .kernel(&string_entry::<O>("gather_string_bytes"))?;
    // SAFETY: `starts` has n + 1 entries whose last is `total`, the size of `bytes`.
    unsafe {
        stream.launch(
            &copy,
            grid(stream, n + 1),
            &[
                strings.offsets.into(),
                strings.bytes.into(),
                indices.into(),
                starts.into(),
                live_arg(live),
                KernelArg::U64(n as u64),
                (&offsets).into(),
                (&bytes).into(),
            ],
        )?;
    }
    Ok(StringBuffers { offsets, bytes })
}

/// Scatters strings into a new column of `out_rows` rows: row `indices[i]` of the result is
/// row `i` of `strings`; rows nobody scatters to are empty. Indices must be distinct.
pub fn scatter_strings<O: OffsetElem>(
    stream: &Stream,
    strings: DeviceStrings<'_, O>,
    indices: DeviceSlice<'_, u32>,
    out_rows: usize,
) -> Result<StringBuffers<O>> {
    let n = strings.rows();
    ensure_arg!(
        indices.len() == n,
        "scatter of {n} strings with {} indices",
        indices.len()
    );
    let device = stream.device();
    let in_lengths = stream.alloc::<u64>(n + 1)?;
    let lengths_kernel = device.kernel(&string_entry::<O>("gather_string_lengths"))?;
    // SAFETY: null indices make row i read itself; `in_lengths` holds n + 1 values.
    unsafe {
        stream.launch(
            &lengths_kernel,
            grid(stream, n + 1),
            &[
                strings.offsets.into(),
                KernelArg::null(),
                KernelArg::null(),
                KernelArg::U64(n as u64),
                (&in_lengths).into(),
            ],
        )?;
    }
    let mut out_lengths = stream.alloc_zeroed::<u64>(out_rows + 1)?;
    scatter(stream, in_lengths.slice(..n)?, indices, &mut out_lengths)?;
    let (starts, total) = scan::exclusive_sum_with_total(stream, out_lengths.as_slice())?;
    fits::<O>(total)?;
    let offsets = stream.alloc::<O>(out_rows + 1)?;
    let bytes = stream.alloc::<u8>(total as usize)?;
    let copy = device.kernel(&string_entry::<O>("scatter_string_bytes"))?;
    // SAFETY: `starts` has out_rows + 1 entries ending at `total`; indices address output rows.
    unsafe {
        stream.launch(
            &copy,
            grid(stream, n.max(out_rows + 1)),
            &[
                strings.offsets.into(),
                strings.bytes.into(),
                indices.into(),
                (&starts).into(),
                KernelArg::U64(n as u64),
                KernelArg::U64(out_rows as u64),
                (&offsets).into(),
                (&bytes).into(),
            ],
        )?;
    }
    Ok(StringBuffers { offsets, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::NULL_INDEX;
    use crate::reference::{self, bit};
    use crate::selftest::{SIZES, test_device};

    fn random_indices(n: usize, source: usize, seed: u64) -> Vec<u32> {
        let mut r = reference::Rng::new(seed);
        (0..n)
            .map(|_| {
                if source == 0 || r.chance(0.1) {
                    NULL_INDEX
                } else {
                    r.below(source as u64) as u32
                }
            })
            .collect()
    }

    fn permutation(n: usize, seed: u64) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        let mut r = reference::Rng::new(seed);
        for i in (1..n).rev() {
            p.swap(i, r.below(i as u64 + 1) as usize);
        }
        p
    }

    #[test]
    fn rows_of_words_gather_whole_below_the_live_count() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            for words in [1_usize, 3, 192] {
                let rows = n.max(1);
                let src: Vec<u16> = (0..rows * words).map(|v| (v * 7 + 1) as u16).collect();
                let idx = random_indices(n, rows, 5);
                let d_src = stream.from_host(&src).unwrap();
                let d_idx = stream.from_host(&idx).unwrap();
                let got =
                    gather_rows_live(&stream, d_src.as_slice(), words, d_idx.as_slice(), None)
                        .unwrap();
                assert_eq!(
                    stream.to_vec(&got).unwrap(),
                    reference::gather_rows(&src, words, &idx),
                    "n={n} words={words}"
                );
                // With a live count, the rows past it stay as allocated: only the first are
                // compared.
                let live = (n / 2) as u32;
                let d_live = stream.from_host(&[live]).unwrap();
                let got = gather_rows_live(
                    &stream,
                    d_src.as_slice(),
                    words,
                    d_idx.as_slice(),
                    Some(d_live.as_slice()),
                )
                .unwrap();
                let got = stream.to_vec(&got).unwrap();
                let want = reference::gather_rows(&src, words, &idx[..live as usize]);
                assert_eq!(&got[..want.len()], &want[..], "n={n} words={words} live");
            }
        }
        let d = stream.from_host(&[1_u32, 2, 3]).unwrap();
        let i = stream.from_host(&[0_u32]).unwrap();
        assert!(gather_rows_live(&stream, d.as_slice(), 2, i.as_slice(), None).is_err());
        assert!(gather_rows_live(&stream, d.as_slice(), 0, i.as_slice(), None).is_err());
    }

    #[test]
    fn fixed_width_gather_and_scatter() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let src = reference::random_i64(n.max(1), n as u64);
            let idx = random_indices(n, src.len(), 3);
            let d_src = stream.from_host(&src).unwrap();
            let d_idx = stream.from_host(&idx).unwrap();
            let got = gather(&stream, d_src.as_slice(), d_idx.as_slice()).unwrap();
            assert_eq!(
                stream.to_vec(&got).unwrap(),
                reference::gather(&src, &idx),
                "n={n}"
            );

            let src16: Vec<u128> = src.iter().map(|v| (*v as u128) << 64 | 7).collect();
            let d16 = stream.from_host(&src16).unwrap();
            let got = gather(&stream, d16.as_slice(), d_idx.as_slice()).unwrap();
            assert_eq!(
                stream.to_vec(&got).unwrap(),
                reference::gather(&src16, &idx)
            );

            let perm = permutation(n, 4);
            let vals: Vec<u16> = (0..n).map(|i| i as u16 ^ 0x5a5a).collect();
            let d_vals = stream.from_host(&vals).unwrap();
            let d_perm = stream.from_host(&perm).unwrap();
            let mut out = stream.alloc_zeroed::<u16>(n).unwrap();
            scatter(&stream, d_vals.as_slice(), d_perm.as_slice(), &mut out).unwrap();
            let mut want = vec![0u16; n];
            for (i, p) in perm.iter().enumerate() {
                want[*p as usize] = vals[i];
            }
            assert_eq!(stream.to_vec(&out).unwrap(), want);
        }
    }

    #[test]
    fn bitmaps_gather_and_scatter_with_offsets() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let rows = n.max(1);
            let offset = 5;
            let valid = reference::random_bitmap(rows, offset, n as u64, 0.7);
            let d_valid = stream.from_host(&valid).unwrap();
            let bitmap = DeviceBitmap::new(&d_valid).with_offset(offset);
            let idx = random_indices(n, rows, 8);
            let d_idx = stream.from_host(&idx).unwrap();
            let got = gather_bitmap(&stream, Some(bitmap), d_idx.as_slice()).unwrap();
            let got = stream.to_vec(&got).unwrap();
            let want = reference::gather_validity(Some(&valid), offset, &idx);
            let got_bits: Vec<bool> = (0..n).map(|i| bit(Some(&got), 0, i)).collect();
            assert_eq!(got_bits, want, "n={n}");
            assert!(
                (n..got.len() * 8).all(|i| !bit(Some(&got), 0, i)),
                "padding bits set"
            );

            let perm = permutation(rows, 9);
            let d_perm = stream.from_host(&perm).unwrap();
            let mut out = stream.alloc_zeroed::<u8>(bitmap_bytes(rows)).unwrap();
            scatter_bitmap(&stream, Some(bitmap), d_perm.as_slice(), &mut out).unwrap();
            let out = stream.to_vec(&out).unwrap();
            for (i, p) in perm.iter().enumerate() {
                assert_eq!(
                    bit(Some(&out), 0, *p as usize),
                    bit(Some(&valid), offset, i)
                );
            }
        }
    }

    #[test]
    fn strings_gather_and_scatter() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let (offsets, bytes) = reference::random_strings(n.max(1), n as u64, 40);
            let rows = offsets.len() - 1;
            let d_off = stream.from_host(&offsets).unwrap();
            let d_bytes = stream.from_host(&bytes).unwrap();
            let strings = DeviceStrings {
                offsets: d_off.as_slice(),
                bytes: d_bytes.as_slice(),
            };
            let string = |i: usize| &bytes[offsets[i] as usize..offsets[i + 1] as usize];
            let idx = random_indices(n, rows, 10);
            let d_idx = stream.from_host(&idx).unwrap();
            let got = gather_strings(&stream, strings, d_idx.as_slice()).unwrap();
            let got_off = stream.to_vec(&got.offsets).unwrap();
            let got_bytes = stream.to_vec(&got.bytes).unwrap();
            assert_eq!(got_off.len(), n + 1);
            for (i, ix) in idx.iter().enumerate() {
                let want: &[u8] = if *ix == NULL_INDEX {
                    b""
                } else {
                    string(*ix as usize)
                };
                assert_eq!(
                    &got_bytes[got_off[i] as usize..got_off[i + 1] as usize],
                    want
                );
            }

            let perm = permutation(rows, 11);
            let d_perm = stream.from_host(&perm).unwrap();
            let out = scatter_strings(&stream, strings, d_perm.as_slice(), rows + 2).unwrap();
            let o_off = stream.to_vec(&out.offsets).unwrap();
            let o_bytes = stream.to_vec(&out.bytes).unwrap();
            for (i, p) in perm.iter().enumerate() {
                let p = *p as usize;
                assert_eq!(
                    &o_bytes[o_off[p] as usize..o_off[p + 1] as usize],
                    string(i)
                );
            }
            assert_eq!(o_off[rows], o_off[rows + 2], "unwritten rows are empty");
        }
    }

    /// With a device row count, the kernels read only the indices below it: the rest are out
    /// of range here, and reading one would fault.
    #[test]
    fn gathers_stop_at_a_device_count() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES.iter().filter(|&&n| n > 0) {
            let rows = n.max(2);
            let kept = n / 3;
            let mut idx = random_indices(kept, rows, 12);
            idx.resize(n, 0x7fff_fff0);
            let d_idx = stream.from_host(&idx).unwrap();
            let live = stream.from_host(&[kept as u32]).unwrap();
            let live = Some(live.as_slice());

            let src = reference::random_i64(rows, n as u64);
            let d_src = stream.from_host(&src).unwrap();
            let got = gather_live(&stream, d_src.as_slice(), d_idx.as_slice(), live).unwrap();
            assert_eq!(got.len(), n);
            assert_eq!(
                stream.to_vec(got.slice(..kept).unwrap()).unwrap(),
                reference::gather(&src, &idx[..kept]),
                "n={n}"
            );

            let valid = reference::random_bitmap(rows, 3, n as u64, 0.6);
            let d_valid = stream.from_host(&valid).unwrap();
            let bitmap = DeviceBitmap::new(&d_valid).with_offset(3);
            let bits = gather_bitmap_live(&stream, Some(bitmap), d_idx.as_slice(), live).unwrap();
            let bits = stream.to_vec(&bits).unwrap();
            let want = reference::gather_validity(Some(&valid), 3, &idx[..kept]);
            let got_bits: Vec<bool> = (0..kept).map(|i| bit(Some(&bits), 0, i)).collect();
            assert_eq!(got_bits, want, "n={n}");
            // The bits past the count in its word are zero; later words are not written.
            assert!((kept..kept.div_ceil(32) * 32).all(|i| !bit(Some(&bits), 0, i)));

            let (offsets, bytes) = reference::random_strings(rows, n as u64, 20);
            let d_off = stream.from_host(&offsets).unwrap();
            let d_bytes = stream.from_host(&bytes).unwrap();
            let strings = DeviceStrings {
                offsets: d_off.as_slice(),
                bytes: d_bytes.as_slice(),
            };
            let total = stream.alloc::<u64>(1).unwrap();
            let started =
                start_string_gather(&stream, strings, d_idx.as_slice(), live, total.as_slice())
                    .unwrap();
            let total = stream.to_vec(&total).unwrap()[0];
            let want: Vec<u8> = idx[..kept]
                .iter()
                .filter(|&&i| i != NULL_INDEX)
                .flat_map(|&i| {
                    let i = i as usize;
                    bytes[offsets[i] as usize..offsets[i + 1] as usize].to_vec()
                })
                .collect();
            assert_eq!(total as usize, want.len(), "n={n}");
            // SAFETY: the same strings, indices and count, and the total the start wrote.
            let out = unsafe {
                finish_string_gather(&stream, started, strings, d_idx.as_slice(), live, total)
            }
            .unwrap();
            assert_eq!(stream.to_vec(&out.bytes).unwrap(), want);
            let out_off = stream.to_vec(&out.offsets).unwrap();
            assert_eq!(out_off.len(), n + 1);
            // The rows past the count are empty: every offset from the count on is the total.
            assert!(out_off[kept..].iter().all(|&o| o as u64 == total), "n={n}");
        }
    }

    #[test]
    fn bitmaps_and_offsets_concatenate() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let parts = [(37usize, 5usize), (1, 0), (100, 7), (0, 2), (64, 1)];
        let total: usize = parts.iter().map(|(n, _)| n).sum();
        let mut dst = stream.alloc_zeroed::<u8>(bitmap_bytes(total)).unwrap();
        let mut want = Vec::new();
        let mut at = 0;
        for (k, (n, offset)) in parts.iter().enumerate() {
            let bits = reference::random_bitmap(*n, *offset, k as u64, 0.5);
            let d = stream.from_host(&bits).unwrap();
            let src = (k != 3).then(|| DeviceBitmap::new(&d).with_offset(*offset));
            copy_bitmap(&stream, src, *n, &mut dst, at).unwrap();
            want.extend((0..*n).map(|i| k == 3 || bit(Some(&bits), *offset, i)));
            at += n;
        }
        let got = stream.to_vec(&dst).unwrap();
        assert_eq!(
            (0..total)
                .map(|i| bit(Some(&got), 0, i))
                .collect::<Vec<_>>(),
            want
        );

        let src = stream.from_host(&[0i64, 3, 3, 10]).unwrap();
        let mut out = stream.alloc_zeroed::<i64>(6).unwrap();
        add_offsets(&stream, src.as_slice(), 100, &mut out, 2).unwrap();
        assert_eq!(stream.to_vec(&out).unwrap(), vec![0, 0, 100, 103, 103, 110]);
    }

    #[test]
    fn offsets_widen_to_64_bits_with_their_shift() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            let (offsets, _) = reference::random_strings(n, 5 + n as u64, 40);
            let src = stream.from_host(&offsets).unwrap();
            let delta = i64::from(i32::MAX) + 7;
            let mut out = stream.alloc_zeroed::<i64>(offsets.len() + 3).unwrap();
            widen_offsets(&stream, src.as_slice(), delta, &mut out, 3).unwrap();
            let want: Vec<i64> = [0, 0, 0]
                .into_iter()
                .chain(offsets.iter().map(|&o| i64::from(o) + delta))
                .collect();
            assert_eq!(stream.to_vec(&out).unwrap(), want, "n={n}");
            assert!(widen_offsets(&stream, src.as_slice(), 0, &mut out, 4).is_err());
        }
    }

    #[test]
    fn large_offsets_gather_with_i64() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        let (offsets, bytes) = reference::random_strings(300, 1, 70);
        let offsets: Vec<i64> = offsets.iter().map(|o| i64::from(*o)).collect();
        let d_off = stream.from_host(&offsets).unwrap();
        let d_bytes = stream.from_host(&bytes).unwrap();
        let idx: Vec<u32> = (0..300).rev().collect();
        let d_idx = stream.from_host(&idx).unwrap();
        let strings = DeviceStrings {
            offsets: d_off.as_slice(),
            bytes: d_bytes.as_slice(),
        };
        let got = gather_strings(&stream, strings, d_idx.as_slice()).unwrap();
        assert_eq!(stream.to_vec(&got.bytes).unwrap().len(), bytes.len());
        assert_eq!(
            *stream.to_vec(&got.offsets).unwrap().last().unwrap(),
            bytes.len() as i64
        );
    }
}
