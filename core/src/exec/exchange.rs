//! `GpuExchangeExec`: moving a GPU subtree's rows between devices.
//!
//! With several devices (`EngineBuilder::devices`), a GPU subtree runs one partition per device:
//! partition `p` on device `p % devices` (`plan/devices.rs`). Where an operator needs its rows
//! placed differently, one of these exchanges sits below it:
//! - **Shuffle**: each row to the device its key hash picks (`N` partitions, hash-partitioned
//!   by the keys), under a final aggregation, a partitioned join or a window. The hash is the
//!   one spilling uses (`spill::hash_keys`), so both sides of a join agree; the device is
//!   picked by bits 32..36 of it, which neither a grace split (the top bits) nor a hash table's
//!   slot (the low bits) looks at first.
//! - **Gather**: every partition onto the consumer's device (one partition), under an
//!   operator that needs all rows in one place: a global sort, a final limit, an ungrouped
//!   aggregation's final stage, the result. Partitions already on that device run on the
//!   consumer's stream and are not copied.
//! - **Broadcast**: every input partition onto each consumer's device, once per device that
//!   executes it (one partition, executed by every probe partition): a join's build side,
//!   each device's share sent to every device.
//! - **Spread**: a CPU input's partitions uploaded to the devices, partition `k` to device
//!   `k % N`: the first upload of a multi-device subtree.
//!
//! A kernel never reads another device's memory (the emulator refuses it, as a GPU without
//! peer access would fault). Between devices with peer access (`Device::peer_access`: NVLink or
//! PCIe P2P on `cuda`, emulated devices unless `SPATE_EMU_NO_PEER` is set) the receiving side
//! copies each batch into its own device's memory (`column::copy_batch_across`, counted as peer
//! bytes); rows that stay on their device are copied within it. Without peer access rows cross
//! through pinned host memory: one download on the sending device, one upload on the receiving
//! one. Either way `exchange_bytes` counts the payload that changed devices and
//! `exchange_local_bytes` the payload that stayed.
//!
//! The sending side runs in tasks of its own (one per input partition, on that partition's
//! device), so every device works at once. Channels between them are unbounded: rows sent to a
//! partition that consumes slowly wait in the sending device's memory (host memory without
//! peer access), and a broadcast keeps its input until the plan is dropped. Neither is
//! charged to a budget yet.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::{FutureExt, StreamExt};
use spate_kernels::Stream as DeviceStream;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::counted::RuntimeScope;
use super::spill::{SPLIT_BITS, group_by_hash};
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, batch_target, device_input, gpu_context,
    region_stream, to_df,
};
use crate::column::upload_batches;
use crate::column::{DeviceBatch, copy_batch_across, download_batch};

/// Bytes of payload an exchange moved to another device (see the module docs).
pub const EXCHANGE_BYTES: &str = "exchange_bytes";
/// Bytes of payload an exchange moved back to the device it was on (a copy within the device,
/// or through the host without peer access).
pub const EXCHANGE_LOCAL_BYTES: &str = "exchange_local_bytes";

/// The lowest of the hash bits that pick a shuffled row's device.
const SHUFFLE_SHIFT: u32 = 32;

/// Which exchange (see the module docs).
#[derive(Debug, Clone)]
pub enum ExchangeKind {
    /// Rows to the device their hash over `keys` (column indices) picks.
    Shuffle {
        /// The key columns' indices in the input.
        keys: Vec<usize>,
    },
    /// Every partition onto the consumer's device.
    Gather,
    /// Every input partition onto every consumer's device.
    Broadcast,
    /// A CPU input's partitions uploaded, partition `k` to device `k % devices`.
    Spread,
}

impl ExchangeKind {
    fn name(&self) -> &'static str {
        match self {
            ExchangeKind::Shuffle { .. } => "shuffle",
            ExchangeKind::Gather => "gather",
            ExchangeKind::Broadcast => "broadcast",
            ExchangeKind::Spread => "spread",
        }
    }
}

/// Rows on their way from a sending task to an output partition.
enum Payload {
    /// Downloaded (no peer access between the devices).
    Host(RecordBatch),
    /// Still on the sending device, its work ordered on that stream: the receiver copies it.
    Device(DeviceBatch, Arc<DeviceStream>),
}

/// What one output partition receives from the sending tasks: rows, and whether they change
/// devices.
type Message = DFResult<(Payload, bool)>;

/// Moves a GPU subtree's rows between devices (see the module docs).
pub struct GpuExchangeExec {
    input: Arc<dyn ExecutionPlan>,
    kind: ExchangeKind,
    devices: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// A shuffle's receivers, made with its sending tasks when the first partition executes.
    shuffle: Mutex<Option<ShuffleState>>,
    /// A broadcast's input, run once: each batch kept on its device (or downloaded, without
    /// peer access), with the device it came from.
    broadcast: Arc<BroadcastCell>,
}

/// A broadcast's input, each batch with the device it came from (downloaded, or kept there
/// when every device copies from it directly).
type BroadcastCell =
    tokio::sync::OnceCell<Result<Arc<Vec<(usize, Payload)>>, Arc<DataFusionError>>>;

struct ShuffleState {
    receivers: Vec<Option<UnboundedReceiver<Message>>>,
    tasks: Arc<Vec<SpawnedTask<()>>>,
}

impl fmt::Debug for GpuExchangeExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuExchangeExec")
            .field("kind", &self.kind)
            .field("devices", &self.devices)
            .finish()
    }
}

impl GpuExchangeExec {
    /// A shuffle of `input` by `keys` to `devices` devices, when every key is a column of the
    /// input; `None` otherwise (the caller keeps its plan on one device).
    pub fn shuffle(
        input: Arc<dyn ExecutionPlan>,
        keys: &[Arc<dyn PhysicalExpr>],
        devices: usize,
    ) -> Option<Self> {
        let columns = keys
            .iter()
            .map(|k| k.downcast_ref::<Column>().map(Column::index))
            .collect::<Option<Vec<_>>>()?;
        if columns.is_empty() {
            return None;
        }
        let partitioning = Partitioning::Hash(keys.to_vec(), devices);
        Some(Self::new(
            input,
            ExchangeKind::Shuffle { keys: columns },
            devices,
            partitioning,
            false,
        ))
    }

    /// Every partition of `input` onto the consumer's device, as one partition.
    pub fn gather(input: Arc<dyn ExecutionPlan>, devices: usize) -> Self {
        let keeps_order = input.output_partitioning().partition_count() == 1;
        Self::new(
            input,
            ExchangeKind::Gather,
            devices,
            Partitioning::UnknownPartitioning(1),
            keeps_order,
        )
    }

    /// Every partition of `input` onto the device of every consumer that executes it, as one
    /// partition.
    pub fn broadcast(input: Arc<dyn ExecutionPlan>, devices: usize) -> Self {
        let keeps_order = input.output_partitioning().partition_count() == 1;
        Self::new(
            input,
            ExchangeKind::Broadcast,
            devices,
            Partitioning::UnknownPartitioning(1),
            keeps_order,
        )
    }

    /// A CPU `input`'s partitions uploaded to `devices` devices, in `devices` partitions.
    pub fn spread(input: Arc<dyn ExecutionPlan>, devices: usize) -> Self {
        let keeps_order = devices == 1 && input.output_partitioning().partition_count() == 1;
        Self::new(
            input,
            ExchangeKind::Spread,
            devices,
            Partitioning::UnknownPartitioning(devices),
            keeps_order,
        )
    }

    fn new(
        input: Arc<dyn ExecutionPlan>,
        kind: ExchangeKind,
        devices: usize,
        partitioning: Partitioning,
        keeps_order: bool,
    ) -> Self {
        let mut eq = input.equivalence_properties().clone();
        if !keeps_order {
            eq.clear_orderings();
        }
        let properties = PlanProperties::new(
            eq,
            partitioning,
            input.pipeline_behavior(),
            input.boundedness(),
        );
        GpuExchangeExec {
            input,
            kind,
            devices,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            shuffle: Mutex::new(None),
            broadcast: Arc::new(tokio::sync::OnceCell::new()),
        }
    }

    /// The same exchange over a new input.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> DFResult<Self> {
        Ok(match &self.kind {
            ExchangeKind::Shuffle { .. } => {
                let Partitioning::Hash(keys, _) = self.properties.output_partitioning() else {
                    return Err(DataFusionError::Internal(
                        "a shuffle without hash partitioning (this is a bug)".into(),
                    ));
                };
                Self::shuffle(input, keys, self.devices).ok_or_else(|| {
                    DataFusionError::Internal(
                        "a shuffle's keys are no longer columns (this is a bug)".into(),
                    )
                })?
            }
            ExchangeKind::Gather => Self::gather(input, self.devices),
            ExchangeKind::Broadcast => Self::broadcast(input, self.devices),
            ExchangeKind::Spread => Self::spread(input, self.devices),
        })
    }

    fn counters(&self, partition: usize) -> (Count, Count) {
        (
            MetricBuilder::new(&self.metrics).counter(EXCHANGE_BYTES, partition),
            MetricBuilder::new(&self.metrics).counter(EXCHANGE_LOCAL_BYTES, partition),
        )
    }

    /// A task that runs input partition `partition` on its own device and hands each device
    /// batch to `send` there (in this exchange's runtime scope for that partition).
    fn sender(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        mut send: impl FnMut(&Arc<DeviceStream>, DeviceBatch) -> DFResult<()> + Send + 'static,
        mut fail: impl FnMut(DataFusionError) + Send + 'static,
    ) -> SpawnedTask<()> {
        let input = Arc::clone(&self.input);
        let context = Arc::clone(context);
        let scope = RuntimeScope::new(&self.metrics, partition);
        let transfer = TransferMetrics::passing_through(&self.metrics, partition);
        SpawnedTask::spawn(async move {
            let run = async {
                let gpu = gpu_context(&context)?;
                let stream = region_stream(gpu.device_for(partition), &context)?;
                let mut batches = device_input(&input, partition, &context, &stream, &transfer)?;
                while let Some(batch) = batches.next().await {
                    let batch = batch?;
                    scope.run(|| send(&stream, batch))?;
                }
                DFResult::Ok(())
            };
            // A panic must not end the receivers' streams early as if the rows were all sent.
            match std::panic::AssertUnwindSafe(run).catch_unwind().await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => fail(e),
                Err(_) => fail(DataFusionError::Execution(format!(
                    "an exchange between devices stopped: its sending task for partition \
                     {partition} panicked"
                ))),
            }
        })
    }

    /// A shuffle's output partition `partition`: its sending tasks start with the first one.
    fn shuffled(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        stream: Arc<DeviceStream>,
        keys: &[usize],
    ) -> DFResult<DeviceBatchStream> {
        let gpu = gpu_context(context)?;
        let mut state = self.shuffle.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..self.devices).map(|_| unbounded_channel()).unzip();
            let inputs = self.input.output_partitioning().partition_count();
            let tasks = (0..inputs)
                .map(|i| {
                    let to = senders.clone();
                    let on_error = senders.clone();
                    let keys = keys.to_vec();
                    let devices = self.devices;
                    let home = i % devices;
                    // Whether this sender's device copies to every device directly.
                    let from = gpu.device_for(i);
                    let peers = (0..devices).all(|d| from.peer_access(gpu.device_for(d)));
                    self.sender(
                        i,
                        context,
                        move |stream, batch| {
                            let parts: Vec<(usize, Payload)> = if peers {
                                split_on_device(stream, &batch, &keys, devices)
                                    .map_err(to_df)?
                                    .into_iter()
                                    .map(|(d, rows)| (d, Payload::Device(rows, Arc::clone(stream))))
                                    .collect()
                            } else {
                                split_by_device(stream, &batch, &keys, devices)
                                    .map_err(to_df)?
                                    .into_iter()
                                    .map(|(d, rows)| (d, Payload::Host(rows)))
                                    .collect()
                            };
                            for (device, rows) in parts {
                                // A closed receiver's output partition is no longer read.
                                let _ = to[device].send(Ok((rows, device != home)));
                            }
                            Ok(())
                        },
                        move |e| send_error(&on_error, e),
                    )
                })
                .collect();
            *state = Some(ShuffleState {
                receivers: receivers.into_iter().map(Some).collect(),
                tasks: Arc::new(tasks),
            });
        }
        let Some(ShuffleState { receivers, tasks }) = state.as_mut() else {
            unreachable!("initialised above");
        };
        let receiver = receivers
            .get_mut(partition)
            .and_then(Option::take)
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "GpuExchangeExec (shuffle) partition {partition} executed twice or out of \
                     range (this is a bug)"
                ))
            })?;
        Ok(receiving(
            receiver,
            self.schema(),
            stream,
            batch_target(context)?,
            self.counters(partition),
            Arc::clone(tasks),
        ))
    }

    /// A gather's one output partition, onto `stream`'s device.
    fn gathered(
        &self,
        context: &Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let gpu = gpu_context(context)?;
        let here = stream.device().id();
        let inputs = self.input.output_partitioning().partition_count();
        let mut parts: Vec<DeviceBatchStream> = Vec::new();
        let (sender, receiver) = unbounded_channel();
        let mut tasks = Vec::new();
        for i in 0..inputs {
            if gpu.device_for(i).id() == here {
                // Already on the consumer's device: its kernels run on the consumer's stream.
                let transfer = TransferMetrics::passing_through(&self.metrics, i);
                parts.push(device_input(&self.input, i, context, &stream, &transfer)?);
                continue;
            }
            let to = sender.clone();
            let on_error = sender.clone();
            let peer = gpu.device_for(i).peer_access(stream.device());
            tasks.push(self.sender(
                i,
                context,
                move |from, batch| {
                    let rows = if peer {
                        Payload::Device(batch, Arc::clone(from))
                    } else {
                        let rows = download_batch(from, &batch).map_err(to_df)?;
                        if rows.num_rows() == 0 {
                            return Ok(());
                        }
                        Payload::Host(rows)
                    };
                    let _ = to.send(Ok((rows, true)));
                    Ok(())
                },
                move |e| {
                    let _ = on_error.send(Err(e));
                },
            ));
        }
        drop(sender);
        if !tasks.is_empty() {
            parts.push(receiving(
                receiver,
                self.schema(),
                stream,
                batch_target(context)?,
                self.counters(0),
                Arc::new(tasks),
            ));
        }
        Ok(Box::pin(futures::stream::select_all(parts)))
    }

    /// A broadcast's partition on `stream`'s device: the input, every partition run once on
    /// its own device, copied (or uploaded) there.
    fn broadcasted(
        &self,
        context: &Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let cell = Arc::clone(&self.broadcast);
        let input = Arc::clone(&self.input);
        let context = Arc::clone(context);
        let metrics = self.metrics.clone();
        let target = batch_target(&context)?;
        let schema = self.schema();
        let (crossed, local) = self.counters(0);
        let rows = async move {
            let held = cell
                .get_or_init(|| async {
                    let gpu = gpu_context(&context).map_err(Arc::new)?;
                    let partitions = input.output_partitioning().partition_count();
                    // Each partition on its own device, all at once.
                    let downloads = (0..partitions).map(|i| {
                        let input = Arc::clone(&input);
                        let context = Arc::clone(&context);
                        let device = gpu.device_for(i).clone();
                        let scope = RuntimeScope::new(&metrics, i);
                        let transfer = TransferMetrics::passing_through(&metrics, i);
                        // Kept on the device when every device copies from it directly.
                        let peer = gpu.devices().iter().all(|d| device.peer_access(d));
                        SpawnedTask::spawn(async move {
                            let home = region_stream(&device, &context)?;
                            let mut batches = device_input(&input, i, &context, &home, &transfer)?;
                            let mut held = Vec::new();
                            while let Some(batch) = batches.next().await {
                                let batch = batch?;
                                let rows = scope
                                    .run(|| {
                                        if peer {
                                            batch
                                                .resolve(&home)
                                                .map(|b| Payload::Device(b, Arc::clone(&home)))
                                        } else {
                                            download_batch(&home, &batch).map(Payload::Host)
                                        }
                                    })
                                    .map_err(to_df)?;
                                let empty = match &rows {
                                    Payload::Device(b, _) => b.bound() == 0,
                                    Payload::Host(b) => b.num_rows() == 0,
                                };
                                if !empty {
                                    held.push((device.id(), rows));
                                }
                            }
                            DFResult::Ok(held)
                        })
                    });
                    let mut held = Vec::new();
                    for part in futures::future::join_all(downloads).await {
                        let part = part
                            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))
                            .and_then(|p| p)
                            .map_err(Arc::new)?;
                        held.extend(part);
                    }
                    Ok(Arc::new(held))
                })
                .await;
            let held: Arc<Vec<(usize, Payload)>> = match held {
                Ok(h) => Arc::clone(h),
                Err(e) => return Err(DataFusionError::Shared(Arc::clone(e))),
            };
            let here = stream.device().id();
            // Uploaded in groups of about a batch target each.
            let mut out = Vec::new();
            let mut group: Vec<RecordBatch> = Vec::new();
            let mut bytes = 0;
            for (from, rows) in held.iter() {
                let counter = if *from == here { &local } else { &crossed };
                let rows = match rows {
                    Payload::Device(batch, home) => {
                        counter.add(batch.device_bytes());
                        out.push(copy_batch_across(batch, home, &stream).map_err(to_df));
                        continue;
                    }
                    Payload::Host(rows) => rows,
                };
                let size = payload_bytes(rows);
                if bytes + size > target && !group.is_empty() {
                    out.push(upload_batches(&stream, &schema, &group).map_err(to_df));
                    group.clear();
                    bytes = 0;
                }
                counter.add(size);
                group.push(rows.clone());
                bytes += size;
            }
            if !group.is_empty() {
                out.push(upload_batches(&stream, &schema, &group).map_err(to_df));
            }
            DFResult::Ok(out)
        };
        Ok(Box::pin(
            futures::stream::once(rows)
                .map(|r| match r {
                    Ok(batches) => futures::stream::iter(batches).left_stream(),
                    Err(e) => futures::stream::iter(vec![Err(e)]).right_stream(),
                })
                .flatten(),
        ))
    }

    /// A spread's partition `partition`: input partitions `partition`, `partition + devices`, …
    /// uploaded onto `stream`.
    fn spread_to(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let inputs = self.input.output_partitioning().partition_count();
        let parts = (partition..inputs)
            .step_by(self.devices)
            .map(|k| {
                let transfer = TransferMetrics::passing_through(&self.metrics, partition);
                device_input(&self.input, k, context, &stream, &transfer)
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Box::pin(futures::stream::select_all(parts)))
    }
}

fn send_error(senders: &[UnboundedSender<Message>], error: DataFusionError) {
    let shared = Arc::new(error);
    for s in senders {
        let _ = s.send(Err(DataFusionError::Shared(Arc::clone(&shared))));
    }
}

/// Bytes of a host batch's rows: the slices' share of their buffers.
fn payload_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

/// An output partition's device batches: what the sending tasks send, onto `stream`'s device.
/// A batch still on a device is copied across (a peer copy, or a copy within the device);
/// host batches are uploaded in groups of up to about `target` bytes (whatever has arrived
/// when the consumer asks).
fn receiving(
    receiver: UnboundedReceiver<Message>,
    schema: SchemaRef,
    stream: Arc<DeviceStream>,
    target: usize,
    (crossed, local): (Count, Count),
    tasks: Arc<Vec<SpawnedTask<()>>>,
) -> DeviceBatchStream {
    let state = Receiving {
        receiver,
        held: None,
        _tasks: tasks,
    };
    Box::pin(futures::stream::unfold(state, move |mut state| {
        let schema = Arc::clone(&schema);
        let stream = Arc::clone(&stream);
        let (crossed, local) = (crossed.clone(), local.clone());
        async move {
            let first = match state.held.take() {
                Some(m) => m,
                None => state.receiver.recv().await?,
            };
            let mut group: Vec<RecordBatch> = Vec::new();
            let mut bytes = 0;
            let mut next = Some(first);
            while let Some(message) = next.take() {
                let (payload, changed) = match message {
                    Ok(m) => m,
                    Err(e) => return Some((Err(e), state)),
                };
                let counter = if changed { &crossed } else { &local };
                match payload {
                    Payload::Device(rows, from) => {
                        counter.add(rows.device_bytes());
                        let copied = copy_batch_across(&rows, &from, &stream).map_err(to_df);
                        return Some((copied, state));
                    }
                    Payload::Host(rows) => {
                        let size = payload_bytes(&rows);
                        counter.add(size);
                        bytes += size;
                        group.push(rows);
                    }
                }
                if bytes >= target {
                    break;
                }
                match state.receiver.try_recv() {
                    // More host rows join the group.
                    Ok(Ok((Payload::Host(rows), changed))) => {
                        next = Some(Ok((Payload::Host(rows), changed)));
                    }
                    // A device batch or an error waits for the next call.
                    Ok(other) => state.held = Some(other),
                    Err(_) => {}
                }
            }
            let batch = upload_batches(&stream, &schema, &group).map_err(to_df);
            Some((batch, state))
        }
    }))
}

/// A receiving partition's state: its channel, a message taken from it that waits for the
/// next call, and the sending tasks (which run until they are done or the plan is dropped:
/// the exchange holds them too, for partitions not executed yet).
struct Receiving {
    receiver: UnboundedReceiver<Message>,
    held: Option<Message>,
    _tasks: Arc<Vec<SpawnedTask<()>>>,
}

/// `batch`'s rows grouped by the device their key hash picks, as views of one gathered batch
/// on the sending device: one per device that gets rows (see [`split_by_device`]).
fn split_on_device(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    keys: &[usize],
    devices: usize,
) -> crate::error::Result<Vec<(usize, DeviceBatch)>> {
    let Some((grouped, counts)) = grouped_by_device(stream, batch, keys, devices)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut start = 0;
    for (device, len) in counts.into_iter().enumerate() {
        if len > 0 {
            out.push((device, grouped.slice(stream, start, len)?));
        }
        start += len;
    }
    Ok(out)
}

/// `batch`'s rows gathered in device order, with each device's row count; `None` for no rows.
fn grouped_by_device(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    keys: &[usize],
    devices: usize,
) -> crate::error::Result<Option<(DeviceBatch, Vec<usize>)>> {
    let batch = batch.resolve(stream)?;
    let rows = batch.bound();
    if rows == 0 {
        return Ok(None);
    }
    if devices == 1 {
        return Ok(Some((batch, vec![rows])));
    }
    let (grouped, split) = group_by_hash(stream, &batch, keys, SHUFFLE_SHIFT)?;
    let groups = 1usize << SPLIT_BITS;
    let counts = (0..devices)
        .map(|d| {
            let (lo, hi) = (d * groups / devices, (d + 1) * groups / devices);
            split.counts[lo..hi].iter().sum()
        })
        .collect();
    Ok(Some((grouped, counts)))
}

/// `batch`'s rows grouped by the device their key hash picks, downloaded once: one host batch
/// per device that gets rows. Device `d` takes hash groups `d * 16 / devices ..` up to the
/// next device's, so the groups split as evenly as 16 allows.
pub(crate) fn split_by_device(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    keys: &[usize],
    devices: usize,
) -> crate::error::Result<Vec<(usize, RecordBatch)>> {
    let Some((grouped, counts)) = grouped_by_device(stream, batch, keys, devices)? else {
        return Ok(Vec::new());
    };
    let host = download_batch(stream, &grouped)?;
    let mut out = Vec::new();
    let mut start = 0;
    for (device, len) in counts.into_iter().enumerate() {
        if len > 0 {
            out.push((device, host.slice(start, len)));
        }
        start += len;
    }
    Ok(out)
}

impl DisplayAs for GpuExchangeExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "{}", self.kind.name()),
            _ => {
                write!(f, "GpuExchangeExec: {}", self.kind.name())?;
                if let Partitioning::Hash(keys, _) = self.properties.output_partitioning() {
                    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                    write!(f, " by [{}]", keys.join(", "))?;
                }
                write!(f, ", devices={}", self.devices)
            }
        }
    }
}

impl ExecutionPlan for GpuExchangeExec {
    fn name(&self) -> &str {
        "GpuExchangeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        if let Partitioning::Hash(keys, _) = self.properties.output_partitioning() {
            for key in keys {
                if f(key)? == TreeNodeRecursion::Stop {
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: datafusion::physical_plan::ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(self.with_input(input)?)),
            _ => Err(DataFusionError::Internal(
                "GpuExchangeExec takes one child (this is a bug)".into(),
            )),
        }
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![
            matches!(self.kind, ExchangeKind::Broadcast | ExchangeKind::Gather)
                && self.input.output_partitioning().partition_count() == 1,
        ]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    crate::exec::gpu_plan_methods!();
}

impl GpuExec for GpuExchangeExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        // Its traffic is over the bus, counted by the runtime in its scope.
        None
    }

    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let partitions = self.properties.output_partitioning().partition_count();
        if partition >= partitions {
            return Err(DataFusionError::Internal(format!(
                "GpuExchangeExec has {partitions} output partitions, asked for {partition} \
                 (this is a bug)"
            )));
        }
        match &self.kind {
            ExchangeKind::Shuffle { keys } => {
                let keys = keys.clone();
                self.shuffled(partition, &context, stream, &keys)
            }
            ExchangeKind::Gather => self.gathered(&context, stream),
            ExchangeKind::Broadcast => self.broadcasted(&context, stream),
            ExchangeKind::Spread => self.spread_to(partition, &context, stream),
        }
    }
}
