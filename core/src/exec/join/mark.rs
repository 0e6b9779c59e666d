//! The output of mark joins. DataFusion plans `EXISTS` and `IN` under OR as a `LeftMark` or
//! `RightMark` join: every row of one side (the build side for `LeftMark`, the probe side for
//! `RightMark`) comes out once, followed by a non-nullable boolean `mark` column that is true
//! where the row matched a row of the other side (and passed the residual filter).
//!
//! The matches are decided as for the semi join of the same side: a `LeftMark` join marks the
//! build rows while probing and emits them all after the last probe batch; a `RightMark` join
//! emits each probe batch's rows with their marks. A NULL key matches nothing (unless the join
//! treats NULLs as equal), so its mark is false, as DataFusion's is: a mark join is never
//! null-aware.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::JoinType;
use spate_kernels::{DeviceSlice, KernelArg, Stream as DeviceStream};

use crate::column::{DeviceBatch, DeviceBytes, DeviceColumn, DeviceValues, Gather, RowCount};
use crate::error::Result;
use crate::exec::hash_table::{Kernels, launch};

/// Join types whose probe only marks build rows, emitted after the last probe batch.
pub(super) fn marks_build_rows(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark
    )
}

/// Join types that keep the build rows (or probe rows) that matched: semi and mark joins (a
/// mark join keeps them all, and says which matched).
pub(super) fn wants_matches(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::LeftSemi | JoinType::LeftMark | JoinType::RightSemi | JoinType::RightMark
    )
}

/// A mark join's output batch: `columns` (one side's, `rows` of them, every column
/// `rows.bound()` long), then the `mark` column packed from `matched` (a byte per row, nonzero
/// where it matched; rows past a device count have 0), through the join's `projection`.
pub(super) fn marked_batch(
    s: &DeviceStream,
    kernels: &Kernels,
    schema: &SchemaRef,
    projection: Option<&[usize]>,
    columns: Vec<DeviceColumn>,
    matched: DeviceSlice<'_, u8>,
    rows: RowCount,
) -> Result<DeviceBatch> {
    let n = rows.bound();
    let words = s.alloc::<u32>(n.div_ceil(32).max(1))?;
    launch(
        s,
        kernels.get("bits")?,
        n.div_ceil(32),
        &[matched.into(), KernelArg::U64(n as u64), (&words).into()],
    )?;
    let mark = DeviceColumn::new(
        DataType::Boolean,
        n,
        0,
        None,
        DeviceValues::Bits {
            bytes: DeviceBytes::new(words.into_bytes()),
            offset: 0,
        },
    );
    let mut all = columns;
    all.push(mark);
    let columns = match projection {
        Some(p) => p.iter().map(|&c| all[c].clone()).collect(),
        None => all,
    };
    DeviceBatch::try_new_counted(Arc::clone(schema), columns, rows)
}

/// The probe rows `from..from + rows` of `batch` as columns of their own (each row taken once).
pub(super) fn probe_range(
    s: &DeviceStream,
    kernels: &Kernels,
    batch: &DeviceBatch,
    from: usize,
    rows: usize,
) -> Result<Vec<DeviceColumn>> {
    if from == 0 && rows == batch.bound() {
        return Ok(batch.columns().to_vec());
    }
    let indices = s.alloc::<u32>(rows.max(1))?;
    launch(
        s,
        kernels.get("iota")?,
        rows,
        &[
            (&indices).into(),
            KernelArg::U64(rows as u64),
            KernelArg::U32(from as u32),
        ],
    )?;
    let indices = indices.slice(..rows)?;
    let gathers: Vec<Gather<'_>> = batch
        .columns()
        .iter()
        .map(|c| Gather::rows(c, indices).each_row_once())
        .collect();
    crate::column::gather_columns(s, &gathers)
}
