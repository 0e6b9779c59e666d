//! Small device batches merged on the device before an operator that works batch by batch.
//!
//! A filter or a join hands on one batch per input batch, however few rows it kept: a selective
//! filter over a cached table of fourteen 70 MB batches gives fourteen batches of a few
//! hundred kilobytes. Every batch costs its consumer the same launches and readbacks, whatever
//! its size, so a join probing them pays fourteen times for one batch's worth of rows. On the
//! CPU, DataFusion coalesces such batches on the host; here they are concatenated in device
//! memory (device-to-device copies, no transfer over the bus) up to `spate.gpu.batch_bytes`.
//!
//! Batches of at least a quarter of the target pass through as they are (they are worth a
//! launch, and copying them would cost more than it saves), as do batches whose row count is
//! on the device (a filter's output), and so does the order of rows:
//! a merged batch holds its parts in stream order, so an operator that keeps its input order
//! still does.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::error::Result as DFResult;
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;

use super::{DeviceBatchStream, to_df};
use crate::column::{DeviceBatch, DeviceValues, concat_device_batches};

/// The most rows a merged batch holds: operators index rows with `u32`.
const MAX_ROWS: usize = 1 << 31;

/// `input` with its small batches merged on `stream` into batches of up to `target_bytes`
/// (see the module docs). Empty batches are dropped.
pub(crate) fn merge_small_batches(
    input: DeviceBatchStream,
    schema: SchemaRef,
    target_bytes: usize,
    stream: Arc<DeviceStream>,
) -> DeviceBatchStream {
    let state = Merging {
        input,
        schema,
        target_bytes: target_bytes.max(1),
        stream,
        pending: Vec::new(),
        pending_bytes: 0,
        pending_rows: 0,
        big: None,
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        let next = state.next().await?;
        Some((next, state))
    }))
}

struct Merging {
    input: DeviceBatchStream,
    schema: SchemaRef,
    target_bytes: usize,
    stream: Arc<DeviceStream>,
    /// Small batches not handed on yet, in order.
    pending: Vec<DeviceBatch>,
    pending_bytes: usize,
    pending_rows: usize,
    /// A batch that passes through, after the pending ones.
    big: Option<DeviceBatch>,
    done: bool,
}

/// How each column of `batch` is stored (its `DeviceValues` variant).
fn layout(batch: &DeviceBatch) -> impl Iterator<Item = std::mem::Discriminant<DeviceValues>> + '_ {
    batch
        .columns()
        .iter()
        .map(|c| std::mem::discriminant(c.values()))
}

impl Merging {
    async fn next(&mut self) -> Option<DFResult<DeviceBatch>> {
        loop {
            if let Some(big) = self.big.take() {
                return Some(Ok(big));
            }
            if self.done {
                return self.flush();
            }
            let batch = match self.input.next().await {
                None => {
                    self.done = true;
                    continue;
                }
                Some(Err(e)) => {
                    // The query fails: what is pending goes with it.
                    self.done = true;
                    self.pending.clear();
                    return Some(Err(e));
                }
                Some(Ok(batch)) => batch,
            };
            if batch.bound() == 0 {
                continue;
            }
            let (bytes, rows) = (batch.device_bytes(), batch.bound());
            // A batch whose count is on the device passes through too: merging it would read
            // the count back, and its consumer stops at the count anyway.
            if bytes >= self.target_bytes / 4 || batch.host_rows().is_none() {
                self.big = Some(batch);
                if let Some(merged) = self.flush() {
                    return Some(merged);
                }
                continue;
            }
            // Operators may store a string column with 32-bit offsets in one batch and 64-bit
            // in the next (a left join's unmatched rows, say); such batches are not merged.
            let same_layout = self
                .pending
                .first()
                .is_none_or(|p| layout(p).eq(layout(&batch)));
            let full = self.pending_bytes + bytes > self.target_bytes
                || self.pending_rows + rows > MAX_ROWS
                || !same_layout;
            let merged = if full { self.flush() } else { None };
            self.pending.push(batch);
            self.pending_bytes += bytes;
            self.pending_rows += rows;
            if merged.is_some() {
                return merged;
            }
        }
    }

    /// The pending batches as one, or `None` when there are none.
    fn flush(&mut self) -> Option<DFResult<DeviceBatch>> {
        if self.pending.is_empty() {
            return None;
        }
        let parts = std::mem::take(&mut self.pending);
        (self.pending_bytes, self.pending_rows) = (0, 0);
        Some(concat_device_batches(&self.stream, &self.schema, parts).map_err(to_df))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use futures::TryStreamExt;
    use spate_kernels::{Device, DeviceOptions};

    use super::*;
    use crate::column::{download_batch, upload_batch};

    fn batch(schema: &SchemaRef, from: i64, rows: i64) -> RecordBatch {
        let ints: ArrayRef = Arc::new(Int64Array::from_iter(
            (from..from + rows).map(|i| (i % 3 != 0).then_some(i)),
        ));
        let strings: ArrayRef = Arc::new(StringArray::from_iter(
            (from..from + rows).map(|i| (i % 5 != 0).then(|| format!("s{i:05}"))),
        ));
        RecordBatch::try_new(Arc::clone(schema), vec![ints, strings]).unwrap()
    }

    /// Merges device batches of `rows` each and returns the row counts of what comes out, and
    /// whether the rows are the input's, in order.
    async fn merged(rows: &[i64], target: usize) -> (Vec<usize>, bool) {
        let device = Device::emulated(DeviceOptions::default()).unwrap();
        let stream = Arc::new(device.new_stream().unwrap());
        let schema = schema();
        let mut host = Vec::new();
        let mut from = 0;
        for &n in rows {
            host.push(batch(&schema, from, n));
            from += n;
        }
        let on_device: Vec<DFResult<DeviceBatch>> = host
            .iter()
            .map(|b| Ok(upload_batch(&stream, b).unwrap()))
            .collect();
        let input: DeviceBatchStream = Box::pin(futures::stream::iter(on_device));
        let out: Vec<DeviceBatch> =
            merge_small_batches(input, Arc::clone(&schema), target, Arc::clone(&stream))
                .try_collect()
                .await
                .unwrap();
        let back: Vec<RecordBatch> = out
            .iter()
            .map(|b| download_batch(&stream, b).unwrap())
            .collect();
        let want = arrow::compute::concat_batches(&schema, &host).unwrap();
        let got = arrow::compute::concat_batches(&schema, &back).unwrap();
        (out.iter().map(DeviceBatch::bound).collect(), got == want)
    }

    /// The device bytes of one batch of 10 rows.
    fn ten_rows_bytes() -> usize {
        let device = Device::emulated(DeviceOptions::default()).unwrap();
        let stream = device.new_stream().unwrap();
        let schema = schema();
        upload_batch(&stream, &batch(&schema, 0, 10))
            .unwrap()
            .device_bytes()
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]))
    }

    #[tokio::test]
    async fn small_batches_merge_up_to_the_target_in_order() {
        // About 30 bytes a row: ten batches of 10 rows fit one 64 KiB target.
        let (rows, same) = merged(&[10; 10], 64 * 1024).await;
        assert_eq!(rows, vec![100]);
        assert!(same);
        // A target of four such batches (and a little) holds four at a time.
        let (rows, same) = merged(&[10; 10], 4 * ten_rows_bytes() + 4).await;
        assert_eq!(rows, vec![40, 40, 20]);
        assert!(same);
    }

    #[tokio::test]
    async fn big_batches_pass_through_and_empty_ones_go() {
        // 1,000 rows pass a quarter of a 16 KiB target: they pass through, between the merged
        // small ones.
        let (rows, same) = merged(&[10, 0, 10, 1000, 10, 10, 0], 16 * 1024).await;
        assert_eq!(rows, vec![20, 1000, 20]);
        assert!(same);
        let (rows, same) = merged(&[0, 0], 1024).await;
        assert!(rows.is_empty());
        assert!(same);
        let (rows, _) = merged(&[], 1024).await;
        assert!(rows.is_empty());
    }
}
