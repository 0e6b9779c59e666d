//! `ORDER BY … LIMIT k` on the GPU without sorting every row.
//!
//! A radix select on the first sort key (`spate_kernels::top_k`) finds a bound: the rows whose
//! key is at most the bound hold the first `k` rows, and every row tied with them on that key.
//! [`TopK`] narrows what the sort holds to those rows once it holds more than [`NARROW_ROWS`]
//! (and four times `k`); from then on, each arriving batch keeps only its rows within the bound
//! (a mask and a compaction, one readback for the kept count), and the held rows are narrowed
//! again when they grow past twice what the last narrowing kept. The bound stays valid: at
//! least `k` held rows have a key at most the bound, and each of them sorts strictly before any
//! row with a larger key.
//!
//! The keys: a column's radix keys (those of the sort); a string's first eight bytes; a
//! decimal's high word, or its value clamped to the i64 range when the high words all tie (the
//! choice is made at the first narrowing and kept). NULL rows take the end they sort at. When
//! the select cannot narrow (all keys tie, or the ties keep most rows) the sort sorts them all.

use std::sync::Arc;

use spate_kernels::compact::{self, Mask};
use spate_kernels::sort as ks;
use spate_kernels::top_k::{self, SortKeys, TopKKey};
use spate_kernels::{DeviceBuffer, Stream as DeviceStream, gather};

use super::sort::{KeyKind, RadixKeys, SortKey, fixed_radix_keys};
use crate::column::{DeviceBatch, DeviceColumn, DeviceValues, Gather, gather_columns};
use crate::error::{Result, SpateError};

/// A top-k holding more rows than this (and more than four times `k`) narrows them to its
/// candidates. Below it the select's readbacks (one per key digit) would cost more than the
/// sort they save.
pub(super) const NARROW_ROWS: usize = 1 << 16;

/// How the first key's select keys are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyForm {
    /// The column's own radix keys (a string: its first eight bytes).
    Radix,
    /// A decimal's high word.
    DecimalHigh,
    /// A decimal clamped to the i64 range.
    DecimalClamped,
}

/// The state of one top-k sort: its first key, `k`, and the bound once it has narrowed.
#[derive(Debug)]
pub(super) struct TopK {
    first: SortKey,
    k: usize,
    /// The key form and the largest key kept, after the first narrowing that narrowed.
    bound: Option<(KeyForm, u64)>,
    /// Rows the last narrowing kept (0 before any).
    last_kept: usize,
}

impl TopK {
    /// The top-k of a sort by `keys` keeping `k` rows; `None` when there is nothing to select
    /// (no key, or `k` is 0).
    pub(super) fn new(keys: &[SortKey], k: usize) -> Option<Self> {
        let first = *keys.first()?;
        (k > 0).then_some(TopK {
            first,
            k,
            bound: None,
            last_kept: 0,
        })
    }

    /// Whether holding `rows` rows calls for narrowing them.
    pub(super) fn should_narrow(&self, rows: usize) -> bool {
        rows > NARROW_ROWS.max(self.k.saturating_mul(4)) && rows > 2 * self.last_kept
    }

    /// The rows of an arriving batch that can still be among the first `k`: those within the
    /// bound, once there is one (the batch as it is before).
    pub(super) fn admit(&self, stream: &DeviceStream, batch: DeviceBatch) -> Result<DeviceBatch> {
        let Some((form, bound)) = self.bound else {
            return Ok(batch);
        };
        let batch = batch.resolve(stream)?;
        if batch.bound() == 0 {
            return Ok(batch);
        }
        let column = &batch.columns()[self.first.column];
        let keys = select_keys(stream, column, &self.first, form)?;
        let mask = with_sort_keys(&keys, column, &self.first, |k| match k {
            AnyKeys::U32(k) => top_k::mask(stream, k, bound),
            AnyKeys::U64(k) => top_k::mask(stream, k, bound),
        })?;
        let indices =
            compact::select_indices(stream, Mask::Bytes(mask.as_slice()), None, batch.bound())?;
        let rows = indices.len();
        gather_rows(stream, &batch, indices.as_slice(), rows)
    }

    /// The rows of `all` (every row held) that can be among the first `k`, and the bound that
    /// keeps them; `all` itself when the select cannot narrow it.
    pub(super) fn narrow(
        &mut self,
        stream: &DeviceStream,
        all: DeviceBatch,
    ) -> Result<DeviceBatch> {
        let all = all.resolve(stream)?;
        let column = &all.columns()[self.first.column];
        let forms = match (self.bound, self.first.kind) {
            (Some((form, _)), _) => vec![form],
            (None, KeyKind::Dec) => vec![KeyForm::DecimalHigh, KeyForm::DecimalClamped],
            (None, _) => vec![KeyForm::Radix],
        };
        let (k, n) = (self.k, all.bound());
        // Enough rows to stop refining: sorting that many costs little.
        let enough = (2 * k).max(4096);
        for form in forms {
            let keys = select_keys(stream, column, &self.first, form)?;
            let selected = with_sort_keys(&keys, column, &self.first, |keys| {
                let selection = match keys {
                    AnyKeys::U32(keys) => top_k::select(stream, keys, k, enough)?,
                    AnyKeys::U64(keys) => top_k::select(stream, keys, k, enough)?,
                };
                // Ties that keep most rows (strings that share their first eight bytes, say)
                // are not worth the gather.
                let Some(selection) = selection.filter(|s| s.rows <= n / 2) else {
                    return Ok(None);
                };
                let mask = match keys {
                    AnyKeys::U32(keys) => top_k::mask(stream, keys, selection.bound)?,
                    AnyKeys::U64(keys) => top_k::mask(stream, keys, selection.bound)?,
                };
                Ok(Some((selection, mask)))
            })?;
            let Some((selection, mask)) = selected else {
                continue;
            };
            let count = stream.alloc::<u32>(1)?;
            let indices = compact::select_indices_on_device(
                stream,
                Mask::Bytes(mask.as_slice()),
                None,
                n,
                count.as_slice(),
            )?;
            // The select counted the kept rows already: no readback.
            let kept = gather_rows(
                stream,
                &all,
                indices.slice(..selection.rows)?,
                selection.rows,
            )?;
            self.bound = Some((form, selection.bound));
            self.last_kept = selection.rows;
            return Ok(kept);
        }
        self.last_kept = n;
        Ok(all)
    }
}

/// The first `rows` of `indices` gathered from `batch`.
fn gather_rows(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    indices: spate_kernels::DeviceSlice<'_, u32>,
    rows: usize,
) -> Result<DeviceBatch> {
    let gathers: Vec<Gather<'_>> = batch
        .columns()
        .iter()
        .map(|c| Gather::rows(c, indices))
        .collect();
    let columns = gather_columns(stream, &gathers)?;
    DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows)
}

/// Select keys of either width, with the key column's NULLs.
enum AnyKeys<'a> {
    U32(SortKeys<'a, u32>),
    U64(SortKeys<'a, u64>),
}

fn with_sort_keys<T>(
    keys: &RadixKeys,
    column: &DeviceColumn,
    first: &SortKey,
    f: impl FnOnce(AnyKeys<'_>) -> std::result::Result<T, spate_kernels::KernelError>,
) -> Result<T> {
    fn wrap<'a, K: TopKKey>(
        keys: &'a DeviceBuffer<K>,
        column: &'a DeviceColumn,
        first: &SortKey,
    ) -> SortKeys<'a, K> {
        SortKeys {
            keys: keys.as_slice(),
            validity: column.validity().map(|v| v.bitmap()),
            nulls_first: first.nulls_first,
        }
    }
    Ok(match keys {
        RadixKeys::U32(k) => f(AnyKeys::U32(wrap(k, column, first)))?,
        RadixKeys::U64(k) => f(AnyKeys::U64(wrap(k, column, first)))?,
    })
}

/// The first key's select keys in `form`.
fn select_keys(
    stream: &DeviceStream,
    column: &DeviceColumn,
    key: &SortKey,
    form: KeyForm,
) -> Result<RadixKeys> {
    let d = key.descending;
    Ok(match (form, key.kind, column.values()) {
        (KeyForm::DecimalHigh, KeyKind::Dec, DeviceValues::Fixed { bytes, .. }) => {
            RadixKeys::U64(ks::decimal_sort_keys(stream, bytes.typed()?, d, true)?)
        }
        (KeyForm::DecimalClamped, KeyKind::Dec, DeviceValues::Fixed { bytes, .. }) => {
            RadixKeys::U64(top_k::decimal_keys(stream, bytes.typed()?, d)?)
        }
        (KeyForm::Radix, KeyKind::Str, DeviceValues::Utf8 { offsets, bytes }) => {
            RadixKeys::U64(ks::string_sort_keys(
                stream,
                gather::DeviceStrings::<i32> {
                    offsets: offsets.typed()?,
                    bytes: bytes.as_slice(),
                },
                Some(0),
                d,
            )?)
        }
        (KeyForm::Radix, KeyKind::Str, DeviceValues::LargeUtf8 { offsets, bytes }) => {
            RadixKeys::U64(ks::string_sort_keys(
                stream,
                gather::DeviceStrings::<i64> {
                    offsets: offsets.typed()?,
                    bytes: bytes.as_slice(),
                },
                Some(0),
                d,
            )?)
        }
        (KeyForm::Radix, kind, DeviceValues::Fixed { bytes, .. }) => {
            fixed_radix_keys(stream, kind, bytes, d)?.ok_or_else(|| layout_error(key))?
        }
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
