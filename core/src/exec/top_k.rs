//! `ORDER BY … LIMIT k` on the GPU without sorting every row: the sort's candidates.
//!
//! A radix select on the first sort key (`spate_kernels::top_k`) finds a bound that keeps the
//! first `k` rows, and every row tied with them on that key; only those rows are gathered and
//! sorted. The sort narrows what it holds this way as its input arrives, whenever it holds
//! more than [`NARROW_ROWS`] rows, so a top-k over a large input keeps few rows in memory.
//! Below that, or when the select cannot narrow (all keys equal), rows are sorted as they are.

use spate_kernels::compact::{self, Mask};
use spate_kernels::sort::{self as ks, SortKeySource};
use spate_kernels::top_k::{self, SortKeys, TopKKey};
use spate_kernels::{DeviceBuffer, DeviceSlice, Stream as DeviceStream, gather};

use super::sort::{KeyKind, SortKey};
use crate::column::{DeviceBatch, DeviceValues, Gather, gather_columns};
use crate::error::{Result, SpateError};

/// A top-k holding more rows than this (and more than four times `k`) narrows them to its
/// candidates. Below it the select's readbacks (one per key digit) would cost more than the
/// sort they save.
pub(super) const NARROW_ROWS: usize = 1 << 16;

/// Whether a top-k of `k` holding `rows` rows should narrow them.
pub(super) fn should_narrow(rows: usize, k: usize) -> bool {
    rows > NARROW_ROWS.max(k.saturating_mul(4))
}

/// The rows of `batch` that can be among the first `k` of the sort by `keys` (in row order),
/// or `None` when the select would keep every row.
pub(super) fn candidates(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    keys: &[SortKey],
    k: usize,
) -> Result<Option<DeviceBatch>> {
    let Some(first) = keys.first() else {
        return Ok(None);
    };
    if k == 0 {
        return Ok(None);
    }
    let batch = &batch.resolve(stream)?;
    let column = &batch.columns()[first.column];
    let keys = first_keys(stream, column.values(), first)?;
    let validity = column.validity().map(|v| v.bitmap());
    // Enough rows to stop narrowing: the sort of that many costs little.
    let enough = (2 * k).max(4096);
    let (selection, mask) = match &keys {
        FirstKeys::U32(k32) => narrow::<u32>(stream, k32.as_slice(), validity, first, k, enough)?,
        FirstKeys::U64(k64) => narrow::<u64>(stream, k64.as_slice(), validity, first, k, enough)?,
    };
    let (Some(selection), Some(mask)) = (selection, mask) else {
        return Ok(None);
    };

    let count = stream.alloc::<u32>(1)?;
    let indices = compact::select_indices_on_device(
        stream,
        Mask::Bytes(mask.as_slice()),
        None,
        batch.bound(),
        count.as_slice(),
    )?;
    // The select counted the kept rows already: no readback.
    let indices = indices.slice(..selection.rows)?;
    let gathers: Vec<Gather<'_>> = batch
        .columns()
        .iter()
        .map(|c| Gather::rows(c, indices))
        .collect();
    let columns = gather_columns(stream, &gathers)?;
    Ok(Some(DeviceBatch::try_new(
        std::sync::Arc::clone(batch.schema()),
        columns,
        selection.rows,
    )?))
}

fn narrow<K: TopKKey>(
    stream: &DeviceStream,
    keys: DeviceSlice<'_, K>,
    validity: Option<spate_kernels::DeviceBitmap<'_>>,
    first: &SortKey,
    k: usize,
    enough: usize,
) -> Result<(Option<top_k::Selection>, Option<DeviceBuffer<u8>>)> {
    let keys = SortKeys {
        keys,
        validity,
        nulls_first: first.nulls_first,
    };
    let Some(selection) = top_k::select(stream, keys, k, enough)? else {
        return Ok((None, None));
    };
    if selection.rows > keys.keys.len() / 2 {
        // Ties on the first key (strings that share their first eight bytes, say) keep most
        // rows: gathering them would cost more than it saves.
        return Ok((None, None));
    }
    let mask = top_k::mask(stream, keys, selection.bound)?;
    Ok((Some(selection), Some(mask)))
}

/// The first sort key's radix keys, whose order is the sort's on that key alone: a decimal by
/// its high word, a string by its first eight bytes. Rows these keys tie are all kept, and the
/// full sort of the candidates orders them.
enum FirstKeys {
    U32(DeviceBuffer<u32>),
    U64(DeviceBuffer<u64>),
}

fn first_keys(stream: &DeviceStream, values: &DeviceValues, key: &SortKey) -> Result<FirstKeys> {
    fn fixed<T: SortKeySource>(
        stream: &DeviceStream,
        bytes: &crate::column::DeviceBytes,
        descending: bool,
    ) -> Result<DeviceBuffer<T::Key>> {
        Ok(ks::sort_keys(stream, bytes.typed::<T>()?, descending)?)
    }
    let d = key.descending;
    Ok(match (key.kind, values) {
        (KeyKind::Str, DeviceValues::Utf8 { offsets, bytes }) => {
            FirstKeys::U64(ks::string_sort_keys(
                stream,
                gather::DeviceStrings::<i32> {
                    offsets: offsets.typed()?,
                    bytes: bytes.as_slice(),
                },
                Some(0),
                d,
            )?)
        }
        (KeyKind::Str, DeviceValues::LargeUtf8 { offsets, bytes }) => {
            FirstKeys::U64(ks::string_sort_keys(
                stream,
                gather::DeviceStrings::<i64> {
                    offsets: offsets.typed()?,
                    bytes: bytes.as_slice(),
                },
                Some(0),
                d,
            )?)
        }
        (KeyKind::Dec, DeviceValues::Fixed { bytes, .. }) => {
            FirstKeys::U64(ks::decimal_sort_keys(stream, bytes.typed()?, d, true)?)
        }
        (kind, DeviceValues::Fixed { bytes, .. }) => match kind {
            KeyKind::I8 => FirstKeys::U32(fixed::<i8>(stream, bytes, d)?),
            KeyKind::I16 => FirstKeys::U32(fixed::<i16>(stream, bytes, d)?),
            KeyKind::U8 => FirstKeys::U32(fixed::<u8>(stream, bytes, d)?),
            KeyKind::U16 => FirstKeys::U32(fixed::<u16>(stream, bytes, d)?),
            KeyKind::I32 => FirstKeys::U32(fixed::<i32>(stream, bytes, d)?),
            KeyKind::U32 => FirstKeys::U32(fixed::<u32>(stream, bytes, d)?),
            KeyKind::F32 => FirstKeys::U32(fixed::<f32>(stream, bytes, d)?),
            KeyKind::I64 => FirstKeys::U64(fixed::<i64>(stream, bytes, d)?),
            KeyKind::U64 => FirstKeys::U64(fixed::<u64>(stream, bytes, d)?),
            KeyKind::F64 => FirstKeys::U64(fixed::<f64>(stream, bytes, d)?),
            KeyKind::Dec | KeyKind::Str => return Err(layout_error(key)),
        },
        _ => return Err(layout_error(key)),
    })
}

fn layout_error(key: &SortKey) -> SpateError {
    SpateError::Internal {
        message: format!(
            "GPU sort key column {} does not have the layout of its type",
            key.column
        ),
    }
}
