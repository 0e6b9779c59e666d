//! Row selection on device columns: `out[i] = column[indices[i]]`, for every layout.
//!
//! Used by filters (after compaction), joins, sorts and aggregations. Validity is gathered with
//! the values; the output's bitmaps start at bit 0. A string gather must learn its byte total
//! before it can allocate; [`gather_columns`] reads the totals of all its string columns back
//! in one transfer.
//!
//! [`gather_batch`] gathers by indices whose count is on the device (a filter's kept rows):
//! the kernels stop at the count, and the batch keeps it there unless it has string columns,
//! whose totals come back anyway; the count then comes back in the same transfer.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use spate_kernels::gather::{self as kg, DeviceStrings};
use spate_kernels::{DeviceBitmap, DeviceSlice, Stream};

use super::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceCount, DeviceValidity, DeviceValues, RowCount,
    UsedBytes,
};
use crate::error::{Result, SpateError};

/// One column of a [`gather_columns`] call: `out[i] = column[indices[i]]`.
#[derive(Debug, Clone, Copy)]
pub struct Gather<'a> {
    column: &'a DeviceColumn,
    indices: DeviceSlice<'a, u32>,
    /// Indices may be `NULL_INDEX`, which gives NULL.
    may_be_null: bool,
    /// No source row is taken twice (a filter's kept rows, the probe side of a probe of
    /// unique keys): a string column's output then holds no more bytes than its source.
    once: bool,
}

impl<'a> Gather<'a> {
    /// Rows `indices` of `column`, all valid rows.
    pub fn rows(column: &'a DeviceColumn, indices: DeviceSlice<'a, u32>) -> Self {
        Gather {
            column,
            indices,
            may_be_null: false,
            once: false,
        }
    }

    /// Rows `indices` of `column`, where `NULL_INDEX` gives NULL.
    pub fn rows_or_null(column: &'a DeviceColumn, indices: DeviceSlice<'a, u32>) -> Self {
        Gather {
            column,
            indices,
            may_be_null: true,
            once: false,
        }
    }

    /// The same gather, whose indices the caller knows to be distinct.
    pub fn each_row_once(self) -> Self {
        Gather { once: true, ..self }
    }

    /// The most bytes a string gather can write, when known without the device: the
    /// source's bytes when no row is taken twice, and the indices times the longest string
    /// when the column knows it; `None` when neither is known, or the bound is past what
    /// offsets of `max` bytes address.
    fn byte_bound(&self, source_bytes: usize, max: u64) -> Option<u64> {
        let once = self.once.then_some(source_bytes as u64);
        let by_longest = self
            .column
            .longest_string()
            .map(|l| (l as u64).saturating_mul(self.indices.len() as u64));
        once.into_iter()
            .chain(by_longest)
            .min()
            .filter(|&b| b <= max)
    }
}

/// A column's values, gathered or still waiting for their string byte total.
enum Values {
    Done(DeviceValues),
    Utf8(kg::StringGather, usize),
    LargeUtf8(kg::StringGather, usize),
}

/// The byte bounds of `gathers`' string columns, in order, when every one has one
/// ([`Gather::byte_bound`]); `None` when one does not.
fn string_bounds(gathers: &[Gather<'_>]) -> Option<Vec<u64>> {
    gathers
        .iter()
        .filter_map(|g| match g.column.values() {
            DeviceValues::Utf8 { bytes, .. } => {
                Some(g.byte_bound(bytes.len(), <i32 as kg::OffsetElem>::MAX_BYTES))
            }
            DeviceValues::LargeUtf8 { bytes, .. } => {
                Some(g.byte_bound(bytes.len(), <i64 as kg::OffsetElem>::MAX_BYTES))
            }
            _ => None,
        })
        .collect()
}

/// Gathers several columns. The string columns' byte totals (which size their outputs) come
/// back to the host together, in one transfer: a batch with k string columns costs one host
/// synchronisation, not k.
pub fn gather_columns(stream: &Stream, gathers: &[Gather<'_>]) -> Result<Vec<DeviceColumn>> {
    Ok(gather_up_to(stream, gathers, None)?.0)
}

/// Gathers a batch of `schema` whose row count is `rows`: see [`gather_counted`].
pub fn gather_batch(
    stream: &Stream,
    schema: SchemaRef,
    gathers: &[Gather<'_>],
    rows: &RowCount,
) -> Result<DeviceBatch> {
    let (columns, rows) = gather_counted(stream, gathers, rows)?;
    DeviceBatch::try_new_counted(schema, columns, rows)
}

/// Gathers columns whose row count is `rows`: every gather's indices are `rows.bound()` long,
/// and only the first `rows` of them are rows. A device count stays on the device, unless
/// string columns make the gather read their byte totals back: the count comes back in the
/// same transfer, and the columns are cut to it. Returns the columns and their count.
pub fn gather_counted(
    stream: &Stream,
    gathers: &[Gather<'_>],
    rows: &RowCount,
) -> Result<(Vec<DeviceColumn>, RowCount)> {
    let live = match rows {
        RowCount::Host(_) => None,
        RowCount::Device { word, .. } => Some(word),
    };
    let (columns, read) = gather_up_to(stream, gathers, live)?;
    Ok(match read {
        Some(n) => (
            columns
                .iter()
                .map(|c| c.prefix(n))
                .collect::<Result<Vec<_>>>()?,
            RowCount::Host(n),
        ),
        None => (columns, rows.clone()),
    })
}

/// The gather, up to `live` when the count is on the device. Returns the columns (as long as
/// the indices) and the count, when it was read back with the string totals.
fn gather_up_to(
    stream: &Stream,
    gathers: &[Gather<'_>],
    live: Option<&DeviceCount>,
) -> Result<(Vec<DeviceColumn>, Option<usize>)> {
    let live_slice = live.map(DeviceCount::as_slice);
    let strings = gathers
        .iter()
        .filter(|g| {
            matches!(
                g.column.values(),
                DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. }
            )
        })
        .count();
    // Only a gather with string columns allocates their totals. It waits for them, unless
    // the row count stays on the device and every string column's bytes have a bound: then
    // each is allocated for its bound, and its total stays on the device as its used bytes.
    let totals = match strings {
        0 => None,
        k => Some(Arc::new(stream.alloc::<u64>(k)?)),
    };
    let bounds = match live {
        Some(_) if strings > 0 => string_bounds(gathers),
        _ => None,
    };
    let total_at = |at: usize| -> Result<DeviceSlice<'_, u64>> {
        let totals = totals.as_ref().ok_or_else(|| SpateError::Internal {
            message: "a string gather without room for its total".into(),
        })?;
        Ok(totals.slice(at..at + 1)?)
    };
    let mut started = Vec::with_capacity(gathers.len());
    let mut slot = 0;
    for g in gathers {
        let validity = gather_validity(stream, g, live_slice)?;
        let values = match g.column.values() {
            DeviceValues::Utf8 { offsets, bytes } => {
                let strings = DeviceStrings {
                    offsets: offsets.typed::<i32>()?,
                    bytes: bytes.as_slice(),
                };
                let at = slot;
                slot += 1;
                let total = total_at(at)?;
                Values::Utf8(
                    kg::start_string_gather(stream, strings, g.indices, live_slice, total)?,
                    at,
                )
            }
            DeviceValues::LargeUtf8 { offsets, bytes } => {
                let strings = DeviceStrings {
                    offsets: offsets.typed::<i64>()?,
                    bytes: bytes.as_slice(),
                };
                let at = slot;
                slot += 1;
                let total = total_at(at)?;
                Values::LargeUtf8(
                    kg::start_string_gather(stream, strings, g.indices, live_slice, total)?,
                    at,
                )
            }
            values => Values::Done(gather_fixed(stream, values, g.indices, live_slice)?),
        };
        started.push((validity, values));
    }
    // The one wait: every string column's byte total, and the row count with them when it is
    // on the device. None with bounds: the totals stay where they are.
    let (capacities, read) = match (&totals, live, &bounds) {
        (Some(_), Some(_), Some(bounds)) => (bounds.clone(), None),
        (Some(totals), None, _) => (stream.to_vec(totals.as_ref())?, None),
        (Some(totals), Some(live), None) => {
            let (totals, count) = read_totals_and_count(stream, totals, live)?;
            (totals, Some(count))
        }
        (None, _, _) => (Vec::new(), None),
    };
    let used_at = |slot: usize| -> Result<Option<UsedBytes>> {
        match (&totals, &bounds, live) {
            (Some(totals), Some(_), Some(live)) => {
                let used = UsedBytes::new(totals, slot)?;
                live.accompany(&used);
                Ok(Some(used))
            }
            _ => Ok(None),
        }
    };
    let mut out = Vec::with_capacity(gathers.len());
    for (g, (validity, values)) in gathers.iter().zip(started) {
        let mut used = None;
        let values = match (values, g.column.values()) {
            (Values::Done(values), _) => values,
            (Values::Utf8(start, slot), DeviceValues::Utf8 { offsets, bytes }) => {
                let strings = DeviceStrings {
                    offsets: offsets.typed::<i32>()?,
                    bytes: bytes.as_slice(),
                };
                used = used_at(slot)?;
                // SAFETY: `capacities[slot]` is what this start wrote, read back above, or a
                // bound of it (`Gather::byte_bound`).
                let out = unsafe {
                    kg::finish_string_gather(
                        stream,
                        start,
                        strings,
                        g.indices,
                        live_slice,
                        capacities[slot],
                    )?
                };
                DeviceValues::Utf8 {
                    offsets: DeviceBytes::new(out.offsets.into_bytes()),
                    bytes: DeviceBytes::new(out.bytes),
                }
            }
            (Values::LargeUtf8(start, slot), DeviceValues::LargeUtf8 { offsets, bytes }) => {
                let strings = DeviceStrings {
                    offsets: offsets.typed::<i64>()?,
                    bytes: bytes.as_slice(),
                };
                used = used_at(slot)?;
                // SAFETY: as above.
                let out = unsafe {
                    kg::finish_string_gather(
                        stream,
                        start,
                        strings,
                        g.indices,
                        live_slice,
                        capacities[slot],
                    )?
                };
                DeviceValues::LargeUtf8 {
                    offsets: DeviceBytes::new(out.offsets.into_bytes()),
                    bytes: DeviceBytes::new(out.bytes),
                }
            }
            _ => {
                return Err(SpateError::Internal {
                    message: "a string gather finished on a column of another layout".into(),
                });
            }
        };
        let column = DeviceColumn::with_uncounted_nulls(
            g.column.data_type().clone(),
            g.indices.len(),
            validity,
            values,
        )
        .with_longest_string(g.column.longest_string());
        out.push(match used {
            Some(used) => column.with_used_bytes(used),
            None => column,
        });
    }
    Ok((out, read))
}

/// The string totals and the device row count, read back in one transfer.
fn read_totals_and_count(
    stream: &Stream,
    totals: &spate_kernels::DeviceBuffer<u64>,
    live: &DeviceCount,
) -> Result<(Vec<u64>, usize)> {
    let at = totals.len() * 8;
    let mut staging = stream.device().pinned(at + 4)?;
    stream.download_pinned_at(totals.as_slice(), &mut staging, 0)?;
    stream.download_pinned_at(live.as_slice(), &mut staging, at)?;
    let host = staging.as_bytes()?;
    let word = |c: &[u8]| c.iter().rev().fold(0u64, |v, &b| (v << 8) | u64::from(b));
    let totals = host[..at].chunks_exact(8).map(word).collect();
    let rows = word(&host[at..at + 4]) as usize;
    live.credit(rows);
    Ok((totals, rows))
}

/// The gathered validity: a bitmap when the column has one, or when an index may be
/// `NULL_INDEX` ("no row"). Its nulls are not counted: that would cost a readback per column
/// (`count_nulls` does it where a consumer needs the number).
fn gather_validity(
    stream: &Stream,
    g: &Gather<'_>,
    live: Option<DeviceSlice<'_, u32>>,
) -> Result<Option<DeviceValidity>> {
    let n = g.indices.len();
    let validity = g.column.validity().map(|v| v.bitmap());
    if n == 0 || (validity.is_none() && !g.may_be_null) {
        return Ok(None);
    }
    let bits = kg::gather_bitmap_live(stream, validity, g.indices, live)?;
    Ok(Some(DeviceValidity {
        bytes: DeviceBytes::new(bits),
        offset: 0,
    }))
}

/// Gathers fixed-width values and bits (no wait).
fn gather_fixed(
    stream: &Stream,
    values: &DeviceValues,
    indices: DeviceSlice<'_, u32>,
    live: Option<DeviceSlice<'_, u32>>,
) -> Result<DeviceValues> {
    Ok(match values {
        DeviceValues::Fixed { bytes, width } => {
            let out = match width {
                1 => kg::gather_live(stream, bytes.typed::<u8>()?, indices, live)?.into_bytes(),
                2 => kg::gather_live(stream, bytes.typed::<u16>()?, indices, live)?.into_bytes(),
                4 => kg::gather_live(stream, bytes.typed::<u32>()?, indices, live)?.into_bytes(),
                8 => kg::gather_live(stream, bytes.typed::<u64>()?, indices, live)?.into_bytes(),
                16 => kg::gather_live(stream, bytes.typed::<u128>()?, indices, live)?.into_bytes(),
                // Wider rows (embeddings): the widest words that divide the row and that the
                // bytes are aligned to.
                w if w.is_multiple_of(16) && bytes.typed::<u128>().is_ok() => {
                    kg::gather_rows_live(stream, bytes.typed::<u128>()?, w / 16, indices, live)?
                        .into_bytes()
                }
                w if w.is_multiple_of(8) && bytes.typed::<u64>().is_ok() => {
                    kg::gather_rows_live(stream, bytes.typed::<u64>()?, w / 8, indices, live)?
                        .into_bytes()
                }
                w if w.is_multiple_of(4) && bytes.typed::<u32>().is_ok() => {
                    kg::gather_rows_live(stream, bytes.typed::<u32>()?, w / 4, indices, live)?
                        .into_bytes()
                }
                w if w.is_multiple_of(2) => {
                    kg::gather_rows_live(stream, bytes.typed::<u16>()?, w / 2, indices, live)?
                        .into_bytes()
                }
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
                bytes: DeviceBytes::new(kg::gather_bitmap_live(
                    stream,
                    Some(bitmap),
                    indices,
                    live,
                )?),
                offset: 0,
            }
        }
        DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. } => {
            return Err(SpateError::Internal {
                message: "a string column in the fixed-width gather".into(),
            });
        }
    })
}
