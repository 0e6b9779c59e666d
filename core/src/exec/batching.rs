//! Small device batches merged on the device before an operator that works batch by batch.
//!
//! A filter or a join hands on one batch per input batch, however few rows it kept: a selective
//! filter over a cached table of fourteen 70 MB batches gives fourteen batches of a few
//! hundred kilobytes. Every batch costs its consumer the same launches and readbacks, whatever
//! its size, so a join probing them pays fourteen times for one batch's worth of rows. On the
//! CPU, DataFusion coalesces such batches on the host; here they are concatenated in device
//! memory (device-to-device copies, no transfer over the bus) up to `spate.gpu.batch_bytes`.
//!
//! A batch whose row count is on the device (a filter's output) may hold anything from no row
//! to its bound, so its size is known only once its count is read back. Such batches wait,
//! up to the target's worth of their bounds (or 64 of them), and their counts come back in one
//! transfer: one host synchronisation for the group, not one per batch. Then they merge as
//! the others do. Before an operator that keeps counts on the device ([`KeepsCounts`]) nothing
//! need come back: a lone one passes as it is, and a group (of at most 16, what one launch
//! takes) is appended on the device into room for all their bounds
//! (`column::append_device_batches`: one launch per column), its count left there. (The
//! bound is the price: such a merged batch is allocated for its parts' bounds, at most the
//! target's worth, until its consumer drops it.)
//!
//! Batches of at least a quarter of the target pass through as they are (a device-counted one
//! as a view of its first rows), since they are worth a launch, and copying them would cost
//! more than it saves. So does the order of rows:
//! a merged batch holds its parts in stream order, so an operator that keeps its input order
//! still does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::datatypes::SchemaRef;
use datafusion::error::Result as DFResult;
use futures::StreamExt;
use spate_kernels::Stream as DeviceStream;

use super::{DeviceBatchStream, to_df};
use spate_kernels::gather::APPEND_PARTS;

use crate::column::{
    DeviceBatch, DeviceValues, append_device_batches, concat_device_batches, copy_device_batch,
};

/// The most rows a merged batch holds: operators index rows with `u32`.
const MAX_ROWS: usize = 1 << 31;

/// The most batches whose counts are read back together.
const MAX_UNCOUNTED: usize = 64;

/// Whether the operator after a merge keeps a batch's row count on the device (a filter, a
/// projection, a probe of unique keys). Then device-counted batches
/// are appended on the device, and nothing is read back. An operator that reads something back
/// for every batch anyway (a probe that sums its matches) is better served by fewer, fuller
/// batches: their counts are read back, and they merge exactly. A join knows which it is only
/// once it has learnt whether its build keys are unique, after a probe batch or two, so this
/// is a flag it can set then; the merge reads it at each group.
#[derive(Debug, Clone)]
pub(crate) struct KeepsCounts(Arc<AtomicBool>);

impl KeepsCounts {
    /// For an operator that always keeps counts on the device.
    pub(crate) fn always() -> Self {
        KeepsCounts(Arc::new(AtomicBool::new(true)))
    }

    /// For an operator that decides later ([`KeepsCounts::set`]); until then, it does not.
    pub(crate) fn later() -> Self {
        KeepsCounts(Arc::new(AtomicBool::new(false)))
    }

    /// For an operator that reads every batch's count back (a partial aggregation sizes its
    /// table by it): the merge reads a group's counts together instead.
    pub(crate) fn never() -> Self {
        Self::later()
    }

    pub(crate) fn set(&self, keeps: bool) {
        self.0.store(keeps, Ordering::Relaxed);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `input` with its small batches merged on `stream` into batches of up to `target_bytes`
/// (see the module docs). Empty batches are dropped.
pub(crate) fn merge_small_batches(
    input: DeviceBatchStream,
    schema: SchemaRef,
    target_bytes: usize,
    stream: Arc<DeviceStream>,
    keeps_counts: KeepsCounts,
) -> DeviceBatchStream {
    merging(input, schema, target_bytes, stream, true, keeps_counts)
}

/// `input` with only its device-counted batches merged, as [`merge_small_batches`] merges
/// them; the others pass through. For an operator that collects its whole input (a sort, a
/// join build, a final aggregation): a filter's output is allocated for all its input rows,
/// and holding those allocations until the end would hold the unfiltered input. `keeps_counts`
/// as for [`merge_small_batches`]: a join build keeps them on the device.
pub(crate) fn compact_device_counted(
    input: DeviceBatchStream,
    schema: SchemaRef,
    target_bytes: usize,
    stream: Arc<DeviceStream>,
    keeps_counts: KeepsCounts,
) -> DeviceBatchStream {
    merging(input, schema, target_bytes, stream, false, keeps_counts)
}

fn merging(
    input: DeviceBatchStream,
    schema: SchemaRef,
    target_bytes: usize,
    stream: Arc<DeviceStream>,
    merge_host_counted: bool,
    keeps_counts: KeepsCounts,
) -> DeviceBatchStream {
    let state = Merging {
        merge_host_counted,
        keeps_counts,
        input,
        schema,
        target_bytes: target_bytes.max(1),
        stream,
        pending: Vec::new(),
        pending_bytes: 0,
        pending_rows: 0,
        big: None,
        uncounted: Vec::new(),
        uncounted_bytes: 0,
        counted: VecDeque::new(),
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        let next = state.next().await?;
        Some((next, state))
    }))
}

struct Merging {
    /// False: batches that came with their count on the host pass through unmerged.
    merge_host_counted: bool,
    /// Whether device-counted batches are appended on the device, their counts left there.
    keeps_counts: KeepsCounts,
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
    /// Batches whose count is on the device, waiting to have it read back, in order, and the
    /// device bytes their columns hold (at their bounds).
    uncounted: Vec<DeviceBatch>,
    uncounted_bytes: usize,
    /// Batches whose counts came back, not merged yet, in order, each with whether it may be
    /// merged (a batch that came host-counted after them may not, when `merge_host_counted`
    /// is false).
    counted: VecDeque<(DeviceBatch, bool)>,
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
            // Batches whose counts came back go through the merge first, in order.
            if let Some((batch, merge)) = self.counted.pop_front() {
                if let Some(out) = self.take(batch, merge) {
                    return Some(out);
                }
                continue;
            }
            if self.done {
                if !self.uncounted.is_empty() {
                    if let Err(e) = self.count() {
                        return Some(Err(e));
                    }
                    continue;
                }
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
                    self.uncounted.clear();
                    self.counted.clear();
                    return Some(Err(e));
                }
                Some(Ok(batch)) => batch,
            };
            if batch.bound() == 0 {
                continue;
            }
            if batch.host_rows().is_none() {
                // Its size is not known yet: it waits with others for one readback of all
                // their counts.
                self.uncounted_bytes += batch.device_bytes();
                self.uncounted.push(batch);
                let group_full = self.uncounted_bytes >= self.target_bytes
                    || self.uncounted.len() >= self.group_limit();
                if group_full && let Err(e) = self.count() {
                    return Some(Err(e));
                }
                continue;
            }
            if !self.uncounted.is_empty() {
                // The batches before it go first.
                if let Err(e) = self.count() {
                    return Some(Err(e));
                }
                self.counted.push_back((batch, self.merge_host_counted));
                continue;
            }
            if let Some(out) = self.take(batch, self.merge_host_counted) {
                return Some(out);
            }
        }
    }

    /// The most device-counted batches that wait together: as many as one append launch
    /// takes before an operator that keeps counts, else as many as one readback reads.
    fn group_limit(&self) -> usize {
        if self.keeps_counts.get() {
            APPEND_PARTS
        } else {
            MAX_UNCOUNTED
        }
    }

    /// Merges the batches waiting for their counts. Before an operator that keeps counts on
    /// the device they are appended there, and the merged batch keeps its count there; one
    /// alone passes as it is. Otherwise (or where a column holds strings) their counts are
    /// read back, in one transfer, and they merge as host-counted batches do.
    ///
    /// The append makes one launch per column and bitmap (`column::append_launches`); the
    /// readback it saves would cost a synchronisation and then a copy per column and part to
    /// merge them, so it pays whenever there are parts to merge.
    fn count(&mut self) -> DFResult<()> {
        let group = std::mem::take(&mut self.uncounted);
        self.uncounted_bytes = 0;
        if self.keeps_counts.get() {
            let appended = match group.as_slice() {
                [one] => Some(one.clone()),
                parts if parts.iter().map(DeviceBatch::bound).sum::<usize>() <= MAX_ROWS => {
                    append_device_batches(&self.stream, &self.schema, parts).map_err(|e| {
                        self.fail();
                        to_df(e)
                    })?
                }
                _ => None,
            };
            if let Some(batch) = appended {
                // Merged as far as it goes: it passes through.
                self.counted.push_back((batch, false));
                return Ok(());
            }
        }
        match DeviceBatch::resolve_all(&self.stream, group) {
            Ok(counted) => {
                self.counted.extend(counted.into_iter().map(|b| (b, true)));
                Ok(())
            }
            Err(e) => {
                self.fail();
                Err(to_df(e))
            }
        }
    }

    /// The query fails: what is pending goes with it.
    fn fail(&mut self) {
        self.done = true;
        self.pending.clear();
        self.uncounted.clear();
        self.counted.clear();
    }

    /// Takes one batch whose count is on the host: merged with the pending ones (when `merge`
    /// and it is small), or passed through after them. Returns what is ready to hand on.
    fn take(&mut self, batch: DeviceBatch, merge: bool) -> Option<DFResult<DeviceBatch>> {
        let (bytes, rows) = (batch.device_bytes(), batch.bound());
        if rows == 0 {
            return None;
        }
        if !merge || bytes >= self.target_bytes / 4 {
            self.big = Some(batch);
            return self.flush();
        }
        // A small view of a large allocation (a selective filter's output, cut to its count)
        // would hold the allocation while it waits: it waits as a copy of its own instead.
        let batch = if batch.held_bytes() > 2 * bytes.max(self.target_bytes / 64) {
            match copy_device_batch(&self.stream, &batch) {
                Ok(copy) => copy,
                Err(e) => {
                    self.fail();
                    return Some(Err(to_df(e)));
                }
            }
        } else {
            batch
        };
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
        merged
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
        let out: Vec<DeviceBatch> = merge_small_batches(
            input,
            Arc::clone(&schema),
            target,
            Arc::clone(&stream),
            KeepsCounts::always(),
        )
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

    /// A filter's output over `values`: the rows where `keep` is 1, the count left on the
    /// device.
    fn device_counted(
        stream: &DeviceStream,
        schema: &SchemaRef,
        values: Vec<Option<i64>>,
        keep: &[u8],
    ) -> DeviceBatch {
        use crate::column::{DeviceCount, Gather, RowCount, gather_batch};
        use spate_kernels::compact::{self, Mask};
        let n = values.len();
        let host = RecordBatch::try_new(
            Arc::clone(schema),
            vec![Arc::new(Int64Array::from(values)) as ArrayRef],
        )
        .unwrap();
        let up = upload_batch(stream, &host).unwrap();
        let mask = stream.from_host(keep).unwrap();
        let word = DeviceCount::new(stream.alloc::<u32>(1).unwrap()).unwrap();
        let kept = compact::select_indices_on_device(
            stream,
            Mask::Bytes(mask.as_slice()),
            None,
            n,
            word.as_slice(),
        )
        .unwrap();
        let rows = RowCount::Device { bound: n, word };
        let gathers = [Gather::rows(&up.columns()[0], kept.as_slice())];
        let batch = gather_batch(stream, Arc::clone(schema), &gathers, &rows).unwrap();
        assert!(batch.host_rows().is_none());
        batch
    }

    fn int_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("i", DataType::Int64, true)]))
    }

    fn ints(stream: &DeviceStream, batches: &[DeviceBatch]) -> Vec<Option<i64>> {
        batches
            .iter()
            .flat_map(|b| {
                let back = download_batch(stream, b).unwrap();
                let col = back
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                col.iter().collect::<Vec<_>>()
            })
            .collect()
    }

    /// Batches whose counts are on the device (a filter's outputs: every third row kept) wait
    /// for one readback of all their counts, then merge as the others; the rows come out in
    /// order, and an empty one disappears.
    #[tokio::test]
    async fn device_counted_batches_are_counted_together_and_merged() {
        let device = Device::emulated(DeviceOptions::default()).unwrap();
        let stream = Arc::new(device.new_stream().unwrap());
        let schema = int_schema();
        let (mut inputs, mut want) = (Vec::new(), Vec::new());
        for (k, n) in [40i64, 30, 50, 20].into_iter().enumerate() {
            let values: Vec<Option<i64>> = (0..n).map(|i| (i % 4 != 1).then_some(i)).collect();
            // The third batch keeps nothing.
            let keep: Vec<u8> = (0..n).map(|i| u8::from(k != 2 && i % 3 == 0)).collect();
            want.extend(
                values
                    .iter()
                    .zip(&keep)
                    .filter(|(_, k)| **k == 1)
                    .map(|(v, _)| *v),
            );
            inputs.push(Ok(device_counted(&stream, &schema, values, &keep)));
        }
        let input: DeviceBatchStream = Box::pin(futures::stream::iter(inputs));
        let before = device.counters();
        let out: Vec<DeviceBatch> = merge_small_batches(
            input,
            Arc::clone(&schema),
            64 * 1024,
            Arc::clone(&stream),
            KeepsCounts::later(),
        )
        .try_collect()
        .await
        .unwrap();
        assert_eq!(
            (device.counters() - before).host_syncs,
            1,
            "one readback of 4 counts"
        );
        assert_eq!(out.len(), 1);
        assert_eq!(ints(&stream, &out), want);
    }

    /// Before an operator that keeps counts on the device, device-counted batches are
    /// appended there when that costs fewer launches than the readback it saves: nothing is
    /// read back, and the merged batch's count stays on the device. One alone passes as it
    /// is; where appending costs more, the counts are read back as before.
    #[tokio::test]
    async fn device_counted_batches_are_appended_on_the_device() {
        let device = Device::emulated(DeviceOptions::default()).unwrap();
        let stream = Arc::new(device.new_stream().unwrap());
        let schema = int_schema();
        let run = |parts: usize| {
            let (device, stream, schema) = (device.clone(), Arc::clone(&stream), &schema);
            async move {
                let (mut inputs, mut want) = (Vec::new(), Vec::new());
                for k in 0..parts as i64 {
                    let values: Vec<Option<i64>> = (0..40).map(|i| Some(100 * k + i)).collect();
                    let keep: Vec<u8> = (0..40).map(|i| u8::from(i % (k + 2) == 0)).collect();
                    want.extend(
                        values
                            .iter()
                            .zip(&keep)
                            .filter(|(_, k)| **k == 1)
                            .map(|(v, _)| *v),
                    );
                    inputs.push(Ok(device_counted(&stream, schema, values, &keep)));
                }
                let input: DeviceBatchStream = Box::pin(futures::stream::iter(inputs));
                let before = device.counters();
                let out: Vec<DeviceBatch> = merge_small_batches(
                    input,
                    Arc::clone(schema),
                    64 * 1024,
                    Arc::clone(&stream),
                    KeepsCounts::always(),
                )
                .try_collect()
                .await
                .unwrap();
                let spent = device.counters() - before;
                let on_device = out.iter().all(|b| b.host_rows().is_none());
                assert_eq!(ints(&stream, &out), want, "{parts} parts");
                (out.len(), spent.host_syncs, spent.launches, on_device)
            }
        };
        // One part passes as it is; a group appends with one launch for its one column (no
        // NULLs), however many parts it has, and reads nothing back.
        assert_eq!(run(1).await, (1, 0, 0, true));
        assert_eq!(run(2).await, (1, 0, 1, true));
        assert_eq!(run(APPEND_PARTS).await, (1, 0, 1, true));
        // Past what one launch takes, a second group.
        assert_eq!(run(APPEND_PARTS + 3).await, (2, 0, 2, true));
    }

    /// For an operator that collects its input, only the device-counted batches merge: the
    /// small host-counted ones around them pass as they are, in order.
    #[tokio::test]
    async fn only_device_counted_batches_are_compacted_for_collectors() {
        let device = Device::emulated(DeviceOptions::default()).unwrap();
        let stream = Arc::new(device.new_stream().unwrap());
        let schema = int_schema();
        let host = |from: i64| {
            let values: Vec<Option<i64>> = (from..from + 10).map(Some).collect();
            let b = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from(values)) as ArrayRef],
            )
            .unwrap();
            upload_batch(&stream, &b).unwrap()
        };
        let keep: Vec<u8> = (0..30).map(|i| u8::from(i % 2 == 0)).collect();
        let values = |from: i64| (from..from + 30).map(Some).collect::<Vec<_>>();
        let inputs = vec![
            Ok(host(0)),
            Ok(device_counted(&stream, &schema, values(100), &keep)),
            Ok(device_counted(&stream, &schema, values(200), &keep)),
            Ok(host(300)),
            Ok(host(400)),
        ];
        let mut want: Vec<Option<i64>> = (0..10).map(Some).collect();
        want.extend((100..130).step_by(2).map(Some));
        want.extend((200..230).step_by(2).map(Some));
        want.extend((300..310).chain(400..410).map(Some));
        let input: DeviceBatchStream = Box::pin(futures::stream::iter(inputs));
        let out: Vec<DeviceBatch> = compact_device_counted(
            input,
            Arc::clone(&schema),
            64 * 1024,
            Arc::clone(&stream),
            KeepsCounts::never(),
        )
        .try_collect()
        .await
        .unwrap();
        let rows: Vec<usize> = out.iter().map(DeviceBatch::bound).collect();
        assert_eq!(rows, vec![10, 30, 10, 10]);
        assert_eq!(ints(&stream, &out), want);
    }
}
