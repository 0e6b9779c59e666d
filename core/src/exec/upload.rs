//! The upload of a CPU operator's batches to the device: decoded ahead in a task of their own,
//! coalesced (or sliced) to about a device batch, and copied on a copy stream of their own
//! while the compute stream works on the batch before.
//!
//! The pipeline, for each device batch:
//! 1. the host batches are decoded ahead ([`decoded_ahead`]) and grouped to about the batch
//!    target ([`Upload::next_group`]);
//! 2. the group is staged in pinned memory and copied on the copy stream, between two events
//!    ([`Upload::stage`]). When a batch goes to the consumer, the next group is staged already
//!    if its host batches are ready: double buffering, so that its copy runs under the compute
//!    on the batch before;
//! 3. the compute stream waits for the copy's event, between two events of its own, and takes
//!    over the batch's memory, so that its free is ordered after the compute
//!    ([`Upload::admit`]).
//!
//! The pinned staging of a copy not known to be done is charged to DataFusion's memory pool
//! (`GpuUpload[p] staging`), as the host batches waiting to go up are (`GpuUpload[p]`).
//!
//! The events time both sides: `upload_copy_time` is the copy stream's time on the copies (from
//! the moment the host has staged their bytes) and
//! `upload_wait_time` the compute stream's time waiting for them; the copy time not waited
//! for was hidden under compute. The timings are read once their events have completed,
//! without a host synchronisation.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::Result as DFResult;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, Time};
use datafusion::physical_plan::stream::{RecordBatchReceiverStream, RecordBatchStreamAdapter};
use futures::{FutureExt, StreamExt};
use spate_kernels::{Event, Stream as DeviceStream};

use super::retry::{Retry, runs_out_of_device};
use super::{DeviceBatchStream, TransferMetrics, to_df};
use crate::column::{DeviceBatch, upload_batches_marked};
use crate::error::SpateError;

/// Metric names of the upload's timings (see the module docs).
pub const UPLOAD_COPY_TIME: &str = "upload_copy_time";
/// See [`UPLOAD_COPY_TIME`].
pub const UPLOAD_WAIT_TIME: &str = "upload_wait_time";

/// How many host batches a CPU input may produce ahead of the upload that consumes them.
const HOST_BATCHES_AHEAD: usize = 2;

/// `input`'s `partition`, run in a task of its own that keeps up to [`HOST_BATCHES_AHEAD`]
/// batches ready, so that the CPU work below the first upload (decoding a scan, say) goes on
/// while the batch before it is uploaded and computed on, and so that the partitions a
/// [`GpuCoalescePartitionsExec`] merges are decoded in parallel rather than by the one task
/// that polls them all. The task starts at the first poll, inside the runtime.
pub(super) fn decoded_ahead(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
) -> SendableRecordBatchStream {
    let schema = input.schema();
    let (input, context) = (Arc::clone(input), Arc::clone(context));
    let started = futures::stream::once(async move {
        let mut builder = RecordBatchReceiverStream::builder(input.schema(), HOST_BATCHES_AHEAD);
        let tx = builder.tx();
        // Aborted when the stream is dropped; a failed send means the consumer is gone.
        builder.spawn(async move {
            let mut batches = match input.execute(partition, context) {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return Ok(());
                }
            };
            drop(input);
            while let Some(batch) = batches.next().await {
                let failed = batch.is_err();
                if tx.send(batch).await.is_err() || failed {
                    break;
                }
            }
            Ok(())
        });
        builder.build()
    })
    .flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, started))
}

struct Upload {
    host: SendableRecordBatchStream,
    schema: SchemaRef,
    pending: Vec<RecordBatch>,
    pending_bytes: usize,
    target_bytes: usize,
    /// The compute stream, which the consumer's kernels run on.
    stream: Arc<DeviceStream>,
    /// The copy stream, a sibling of `stream` opened at the first upload.
    copies: Option<DeviceStream>,
    metrics: TransferMetrics,
    /// The bytes of the batches pending and of the groups taken but not staged yet, charged to
    /// DataFusion's memory pool.
    reservation: MemoryReservation,
    /// A batch that did not fit the memory limit beside the pending ones: the next group's.
    carry: Option<RecordBatch>,
    /// The slices of a host batch larger than a device batch, not yet taken.
    split: VecDeque<RecordBatch>,
    done: bool,
    /// The next batch, staged while the consumer works on the one before.
    ahead: Option<Staged>,
    /// A group whose staging ahead ran out of device memory: staged again when it is due,
    /// after the batch before it is freed.
    unstaged: Option<Vec<RecordBatch>>,
    /// An error from staging ahead, returned after the batch before it.
    failed: Option<datafusion::error::DataFusionError>,
    timing: Timing,
    /// Asks the spill coordinator for room when a group that is due does not fit.
    retry: Retry,
}

/// A batch whose copy is queued on the copy stream.
struct Staged {
    batch: DeviceBatch,
    /// Recorded on the copy stream before and after the copy.
    copy: (Event, Event),
    /// The bytes of its pinned staging, charged until the copy is done.
    staged_bytes: usize,
}

/// The events that time the uploads, until they complete, and the metrics they go to; and
/// the pinned staging of the copies not known to be done, charged to DataFusion's memory pool.
struct Timing {
    /// Per batch: the copy's events, the compute stream's before and after its wait, and the
    /// bytes of its staging.
    pending: VecDeque<([Event; 4], usize)>,
    copy_time: Time,
    wait_time: Time,
    staging: MemoryReservation,
}

impl Timing {
    fn new(
        metrics: &ExecutionPlanMetricsSet,
        partition: usize,
        staging: MemoryReservation,
    ) -> Self {
        Timing {
            staging,
            pending: VecDeque::new(),
            copy_time: MetricBuilder::new(metrics).subset_time(UPLOAD_COPY_TIME, partition),
            wait_time: MetricBuilder::new(metrics).subset_time(UPLOAD_WAIT_TIME, partition),
        }
    }

    /// Moves the timings whose events have completed into the metrics, in order, without
    /// waiting for the others.
    fn harvest(&mut self) {
        while let Some(([c0, c1, w0, w1], staged_bytes)) = self.pending.front() {
            let (Ok(Some(copy)), Ok(Some(wait))) = (c0.try_elapsed_ms(c1), w0.try_elapsed_ms(w1))
            else {
                return;
            };
            let ms = |m: f32| std::time::Duration::from_secs_f64(f64::from(m.max(0.0)) / 1e3);
            self.copy_time.add_duration(ms(copy));
            self.wait_time.add_duration(ms(wait));
            // The copy is done: its staging buffer is back in the pinned pool.
            self.staging
                .shrink((*staged_bytes).min(self.staging.size()));
            self.pending.pop_front();
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        // The consumer is done; what has completed by now is still counted.
        self.timing.harvest();
    }
}

impl Upload {
    /// Takes the pending batches as the next group to upload. They stay charged to the memory
    /// pool until they are staged ([`Upload::stage`]).
    fn take_group(&mut self) -> Vec<RecordBatch> {
        self.pending_bytes = 0;
        std::mem::take(&mut self.pending)
    }

    /// The next group of host batches to go up as one device batch, about `target_bytes`;
    /// `None` at the end of the input.
    ///
    /// Cancel-safe: what it has taken from the input is kept in `self`, so a caller may drop
    /// the future while it waits for the input (staging ahead does).
    async fn next_group(&mut self) -> Option<DFResult<Vec<RecordBatch>>> {
        if let Some(group) = self.unstaged.take() {
            return Some(Ok(group));
        }
        loop {
            if self.done && self.carry.is_none() && self.split.is_empty() {
                if self.pending.is_empty() {
                    return None;
                }
                return Some(Ok(self.take_group()));
            }
            let next = match self.carry.take() {
                Some(batch) => Some(Ok(batch)),
                None => match self.split.pop_front() {
                    Some(slice) => Some(Ok(slice)),
                    None => self.host.next().await,
                },
            };
            match next {
                Some(Ok(batch)) => {
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    let batch = match conform(&self.schema, batch) {
                        Ok(b) => b,
                        Err(e) => return Some(Err(e)),
                    };
                    let size = sliced_bytes(&batch);
                    if size > self.target_bytes && batch.num_rows() > 1 {
                        // Larger than a device batch may be: it goes up in slices (views, no
                        // copy), so that no device batch is larger than its target.
                        let pieces = size.div_ceil(self.target_bytes).min(batch.num_rows());
                        let rows = batch.num_rows().div_ceil(pieces);
                        let mut slices: Vec<RecordBatch> = (0..batch.num_rows())
                            .step_by(rows)
                            .map(|at| batch.slice(at, rows.min(batch.num_rows() - at)))
                            .collect();
                        // Ahead of the slices of an earlier batch still waiting: rows stay in
                        // order when a slice is cut again.
                        let first = slices.remove(0);
                        for slice in slices.into_iter().rev() {
                            self.split.push_front(slice);
                        }
                        self.carry = Some(first);
                        continue;
                    }
                    if !self.pending.is_empty() && self.pending_bytes + size > self.target_bytes {
                        // It would take the group past its target: the group goes up first.
                        self.carry = Some(batch);
                        return Some(Ok(self.take_group()));
                    }
                    if self.reservation.try_grow(size).is_err() {
                        // The memory limit stops the coalescing early: what is pending goes
                        // up now, and this batch starts the next group. A batch alone goes
                        // up at once: it is in host memory already, and holding only it is
                        // the least an upload can hold.
                        if !self.pending.is_empty() {
                            self.carry = Some(batch);
                        } else {
                            self.pending_bytes += size;
                            self.pending.push(batch);
                        }
                        return Some(Ok(self.take_group()));
                    }
                    self.pending_bytes += size;
                    self.pending.push(batch);
                    if self.pending_bytes >= self.target_bytes {
                        return Some(Ok(self.take_group()));
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    self.pending.clear();
                    self.reservation.free();
                    return Some(Err(e));
                }
                None => self.done = true,
            }
        }
    }

    /// Stages `group` in pinned memory and queues its copy on the copy stream. The batches
    /// are staged end to end and arrive as one: no host concatenation.
    fn stage(&mut self, group: &[RecordBatch]) -> crate::error::Result<Staged> {
        let _timer = self.metrics.transfer_time.timer();
        let copies = match &mut self.copies {
            Some(copies) => copies,
            None => self.copies.insert(self.stream.sibling()?),
        };
        let schema = group
            .first()
            .map_or_else(|| Arc::clone(&self.schema), RecordBatch::schema);
        // The pinned staging is host memory the query holds until the copy is done: charged
        // (it cannot wait for room, the copy needs it now).
        let staged_bytes: usize = group.iter().map(sliced_bytes).sum();
        // The copy time starts once the host has staged the bytes: the event goes in then.
        let mut before = None;
        let batch = upload_batches_marked(copies, &schema, group, |s| {
            before = Some(s.record_event()?);
            Ok(())
        })?;
        let after = copies.record_event()?;
        let before = before.ok_or_else(|| SpateError::Internal {
            message: "an upload staged nothing".into(),
        })?;
        // The host batches' bytes are in the pinned staging now: their charge moves there.
        self.timing.staging.grow(staged_bytes);
        self.reservation
            .shrink(staged_bytes.min(self.reservation.size()));
        Ok(Staged {
            batch,
            copy: (before, after),
            staged_bytes,
        })
    }

    /// [`Upload::stage`]; out of device memory, once more after the spill coordinator has
    /// freed what it can (`exec/coordinator.rs`).
    fn stage_relieved(&mut self, group: &[RecordBatch]) -> crate::error::Result<Staged> {
        match self.stage(group) {
            Err(e) if runs_out_of_device(&e) => {
                let want = group.iter().map(sliced_bytes).sum::<usize>().max(1);
                if self.retry.relieve(want) == 0 {
                    return Err(e);
                }
                self.stage(group)
            }
            other => other,
        }
    }

    /// Stages the next group while the batch before it is computed on, when its host
    /// batches are ready now: it does not wait for the input. Out of device memory, the
    /// group waits as host batches until it is due; another error waits for the next poll.
    fn stage_ahead(&mut self) {
        let Some(Some(next)) = self.next_group().now_or_never() else {
            return;
        };
        match next {
            Ok(group) => match self.stage(&group) {
                Ok(staged) => self.ahead = Some(staged),
                Err(SpateError::ResourcesExhausted { .. }) => self.unstaged = Some(group),
                Err(e) => self.failed = Some(to_df(e)),
            },
            Err(e) => self.failed = Some(e),
        }
    }

    /// Orders the compute stream behind `staged`'s copy and hands it its memory.
    fn admit(&mut self, staged: Staged) -> crate::error::Result<DeviceBatch> {
        let before = self.stream.record_event()?;
        self.stream.wait_event(&staged.copy.1)?;
        let after = self.stream.record_event()?;
        staged.batch.free_on(&self.stream)?;
        let (c0, c1) = staged.copy;
        self.timing
            .pending
            .push_back(([c0, c1, before, after], staged.staged_bytes));
        self.timing.harvest();
        Ok(staged.batch)
    }

    /// The next device batch: the one staged ahead, or the next group staged now.
    async fn next_batch(&mut self) -> Option<DFResult<DeviceBatch>> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        let current = match self.ahead.take() {
            Some(staged) => staged,
            None => {
                let group = match self.next_group().await? {
                    Ok(group) => group,
                    Err(e) => return Some(Err(e)),
                };
                match self.stage_relieved(&group) {
                    Ok(staged) => staged,
                    Err(e) => return Some(Err(to_df(e))),
                }
            }
        };
        self.stage_ahead();
        Some(self.admit(current).map_err(to_df))
    }
}

/// `batch` with the input plan's declared column types. `PlaceholderRowExec` declares its
/// parent's column types but produces Null-typed placeholder columns (its rows carry no values):
/// those become all-NULL columns of the declared types (nullable, whatever was declared).
fn conform(schema: &SchemaRef, batch: RecordBatch) -> DFResult<RecordBatch> {
    let placeholder = |(column, field): (&arrow::array::ArrayRef, &arrow::datatypes::FieldRef)| {
        column.data_type() == &arrow::datatypes::DataType::Null
            && field.data_type() != &arrow::datatypes::DataType::Null
    };
    if batch.num_columns() != schema.fields().len()
        || !batch.columns().iter().zip(schema.fields()).any(placeholder)
    {
        return Ok(batch);
    }
    let rows = batch.num_rows();
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if placeholder((column, field)) {
                arrow::array::new_null_array(field.data_type(), rows)
            } else {
                Arc::clone(column)
            }
        })
        .collect();
    // The placeholder rows are NULL even where the declared column is not nullable.
    let relaxed: arrow::datatypes::Fields = schema
        .fields()
        .iter()
        .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
        .collect();
    let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(arrow::datatypes::Schema::new(relaxed)),
        columns,
        &options,
    )?)
}

/// The bytes of `batch`'s rows: of its slice of its buffers when it is a slice (which
/// `get_array_memory_size` would count whole), a Utf8View column's strings included.
pub(crate) fn sliced_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            let own = c
                .to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size());
            // A view column's slice size counts its views, not the strings they point to.
            let strings = c
                .as_any()
                .downcast_ref::<arrow::array::StringViewArray>()
                .map_or(0, arrow::array::StringViewArray::total_buffer_bytes_used);
            own + strings
        })
        .sum()
}

/// Coalesces host batches to about `target_bytes` and uploads each group as one device batch,
/// copied on a copy stream of its own while `stream` computes on the batch before (see the
/// module docs).
///
/// `schema` is the input plan's declared schema, which batches are made to match first (see
/// [`conform`]).
pub(super) fn upload_stream(
    host: SendableRecordBatchStream,
    schema: SchemaRef,
    target_bytes: usize,
    stream: Arc<DeviceStream>,
    metrics: TransferMetrics,
    reservation: MemoryReservation,
    staging: MemoryReservation,
    timed: (&ExecutionPlanMetricsSet, usize),
    gpu: Arc<crate::device::GpuContext>,
) -> DeviceBatchStream {
    let retry = Retry::new(gpu, Arc::clone(&stream), timed.0, timed.1);
    let state = Upload {
        schema,
        host,
        pending: Vec::new(),
        pending_bytes: 0,
        target_bytes,
        stream,
        copies: None,
        metrics,
        reservation,
        carry: None,
        split: VecDeque::new(),
        done: false,
        ahead: None,
        unstaged: None,
        failed: None,
        timing: Timing::new(timed.0, timed.1, staging),
        retry,
    };
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        let batch = s.next_batch().await?;
        Some((batch, s))
    }))
}
