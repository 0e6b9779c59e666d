//! GROUPING SETS, ROLLUP and CUBE on the device: each row once per set, and the grand-total
//! groups of a partition that saw no rows.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use spate_kernels::{KernelArg, Stream as DeviceStream};

use super::{Accumulators, AggPlan, finish_outputs};
use crate::column::{DeviceBatch, DeviceBytes, DeviceColumn, DeviceValues, Gather, gather_columns};
use crate::error::{Result, SpateError};
use crate::exec::hash_table::{Kernels, launch};
use crate::expr::DevType;

/// The key and argument columns of `n` rows expanded for grouping sets: `n * sets` rows, set
/// by set, each set's left-out keys NULL, and its `__grouping_id` as one more key.
pub(super) fn expand_sets(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    keys: Vec<DeviceColumn>,
    args: Vec<DeviceColumn>,
    n: usize,
) -> Result<(Vec<DeviceColumn>, Vec<DeviceColumn>, usize)> {
    let total = n * plan.spec.sets.len();
    if total >= u32::MAX as usize {
        return Err(SpateError::Unsupported {
            message: format!(
                "a GPU aggregation over grouping sets of {total} rows (the limit is 2^32 - 2)"
            ),
        });
    }
    let id_type = match plan.spec.keys.last() {
        Some(DevType::Int { bits, .. }) => match bits {
            8 => DataType::UInt8,
            16 => DataType::UInt16,
            32 => DataType::UInt32,
            _ => DataType::UInt64,
        },
        _ => {
            return Err(SpateError::Internal {
                message: "grouping sets without an integer `__grouping_id` key".into(),
            });
        }
    };
    let width = id_type.primitive_width().unwrap_or(8);
    let rows = stream.alloc::<u32>(total.max(1))?;
    let key_rows = stream.alloc::<u32>((total * keys.len()).max(1))?;
    let ids = stream.alloc::<u8>((total * width).max(16))?;
    launch(
        stream,
        kernels.get("expand")?,
        total,
        &[
            KernelArg::U64(n as u64),
            (&rows).into(),
            (&key_rows).into(),
            (&ids).into(),
        ],
    )?;
    let mut gathers = Vec::with_capacity(keys.len() + args.len());
    for (k, key) in keys.iter().enumerate() {
        let indices = key_rows.slice(k * total..(k + 1) * total)?;
        gathers.push(Gather::rows_or_null(key, indices));
    }
    let indices = rows.slice(..total)?;
    gathers.extend(args.iter().map(|a| Gather::rows(a, indices)));
    let mut columns = gather_columns(stream, &gathers)?;
    let expanded_args = columns.split_off(keys.len());
    columns.push(DeviceColumn::new(
        id_type,
        total,
        0,
        None,
        DeviceValues::Fixed {
            bytes: DeviceBytes::new(ids),
            width,
        },
    ));
    Ok((columns, expanded_args, total))
}

/// The groups a partition that saw no rows still produces, as DataFusion's: one per grouping
/// set that leaves every key NULL (its "grand total"), with the accumulators' values over no
/// rows (COUNT 0, SUM NULL). `None` without such a set.
pub(super) fn empty_sets_batch(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    schema: &SchemaRef,
) -> Result<Option<DeviceBatch>> {
    let keys = plan.keys.len();
    let all = if keys >= 64 {
        u64::MAX
    } else {
        (1u64 << keys) - 1
    };
    let ids: Vec<u64> = plan
        .spec
        .sets
        .iter()
        .filter(|(mask, _)| *mask == all)
        .map(|(_, id)| *id)
        .collect();
    if ids.is_empty() {
        return Ok(None);
    }
    let m = ids.len();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in &schema.fields()[..keys] {
        columns.push(DeviceColumn::nulls(stream, field.data_type(), m)?);
    }
    // The ids, `width` little-endian bytes each: a few bytes cross the bus.
    let id_field = schema.field(keys);
    let width = id_field.data_type().primitive_width().unwrap_or(8);
    let mut padded: Vec<u8> = ids
        .iter()
        .flat_map(|id| id.to_le_bytes()[..width].to_vec())
        .collect();
    padded.resize(padded.len().max(16), 0);
    columns.push(DeviceColumn::new(
        id_field.data_type().clone(),
        m,
        0,
        None,
        DeviceValues::Fixed {
            bytes: DeviceBytes::new(stream.from_host(&padded)?),
            width,
        },
    ));
    let acc = Accumulators::new(stream, plan, m)?;
    columns.extend(finish_outputs(
        stream, kernels, plan, schema, m, &acc.acc, &acc.seen,
    )?);
    Ok(Some(DeviceBatch::try_new(Arc::clone(schema), columns, m)?))
}
