//! Copying a device batch to another device (or another stream of its own) without the host.
//!
//! Between devices with peer access (`spate_kernels::Device::peer_access`: NVLink or PCIe P2P
//! on `cuda`, every emulated device unless `SPATE_EMU_NO_PEER` is set) each buffer the batch
//! views is copied into an allocation of the receiving stream's device, one `copy_peer` per
//! buffer, ordered after the sending stream's work by an event and before anything the sender
//! queues next (so the sender may drop its batch at once). The copy holds exactly the rows:
//! a string column's bytes are cut to what its rows use.

use std::sync::Arc;

use spate_kernels::{DeviceBuffer, Stream};

use super::{DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues};
use crate::error::Result;

/// `batch` (on `from`'s device, its work ordered on `from`) copied onto `to`'s device, its
/// work ordered on `to`. The row count is read back on `from` first if it is on the device.
pub fn copy_batch_across(batch: &DeviceBatch, from: &Stream, to: &Stream) -> Result<DeviceBatch> {
    let batch = batch.resolve(from)?;
    let rows = batch.bound();
    to.order_after(from)?;
    let columns = batch
        .columns()
        .iter()
        .map(|c| copy_column(c, from, to))
        .collect::<Result<Vec<_>>>()?;
    // The sender's later work (freeing `batch`) waits for the copies.
    from.order_after(to)?;
    DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows)
}

fn copy_bytes(bytes: &DeviceBytes, len: usize, from: &Stream, to: &Stream) -> Result<DeviceBytes> {
    let len = len.min(bytes.len());
    let mut out: DeviceBuffer<u8> = to.alloc(len)?;
    to.copy_peer_unordered(bytes.as_slice().slice(..len)?, from, &mut out, 0)?;
    Ok(DeviceBytes::new(out))
}

fn copy_column(column: &DeviceColumn, from: &Stream, to: &Stream) -> Result<DeviceColumn> {
    let validity = match &column.validity {
        Some(v) => Some(DeviceValidity {
            bytes: copy_bytes(&v.bytes, v.bytes.len(), from, to)?,
            offset: v.offset,
        }),
        None => None,
    };
    // String bytes cut to what the rows use (known once the batch is resolved).
    let used = |bytes: &DeviceBytes| {
        column
            .used_bytes
            .as_ref()
            .and_then(super::UsedBytes::known)
            .map_or(bytes.len(), |n| usize::try_from(n).unwrap_or(usize::MAX))
    };
    let values = match &column.values {
        DeviceValues::Fixed { bytes, width } => DeviceValues::Fixed {
            bytes: copy_bytes(bytes, column.len * width, from, to)?,
            width: *width,
        },
        DeviceValues::Bits { bytes, offset } => DeviceValues::Bits {
            bytes: copy_bytes(bytes, bytes.len(), from, to)?,
            offset: *offset,
        },
        DeviceValues::Utf8 { offsets, bytes } => DeviceValues::Utf8 {
            offsets: copy_bytes(offsets, (column.len + 1) * 4, from, to)?,
            bytes: copy_bytes(bytes, used(bytes), from, to)?,
        },
        DeviceValues::LargeUtf8 { offsets, bytes } => DeviceValues::LargeUtf8 {
            offsets: copy_bytes(offsets, (column.len + 1) * 8, from, to)?,
            bytes: copy_bytes(bytes, used(bytes), from, to)?,
        },
    };
    let mut copy =
        DeviceColumn::with_uncounted_nulls(column.data_type.clone(), column.len, validity, values);
    copy.null_count = column.null_count;
    copy.longest_string = column.longest_string;
    Ok(copy)
}
