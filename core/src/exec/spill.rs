//! Device rows spilled to host memory in hash partitions, for operators whose state outgrows
//! their share of the device budget (see [`super::memory`]).
//!
//! [`HostPartitions::spill`] hashes a device batch's key columns, groups its rows by bits of the
//! hash (`spate_kernels::partition`), gathers them in that order and downloads them once; each
//! partition keeps its slice of the download. Equal keys hash alike, so every row of a key (an
//! aggregation's group, a join key's build and probe rows) lands in the same partition, and the
//! partitions can be processed one at a time. The host bytes are charged to DataFusion's memory
//! pool, as the batches a CPU operator buffers are: a query over the host memory limit fails
//! with DataFusion's resources-exhausted error.
//!
//! Partitions take hash bits from the top down ([`TOP_SHIFT`]): the device hash tables index by
//! low bits, so a partition's rows still spread over a table built from them. A partition that
//! is still too large is split again with the next bits down.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use spate_kernels::hash::{DEFAULT_SEED, HashColumn, hash_columns};
use spate_kernels::partition::partition_rows;
use spate_kernels::{DeviceBitmap, DeviceBuffer, Stream as DeviceStream};

use super::disk_spill::DiskPart;
use crate::column::{
    DeviceBatch, DeviceColumn, DeviceValues, Gather, download_batch, gather_columns, upload_batches,
};
use crate::error::{Result, SpateError};

/// Hash bits per split: 16 partitions.
pub(crate) const SPLIT_BITS: u32 = 4;

/// The shift of the first split's bits: the top [`SPLIT_BITS`] of the 64-bit hash.
pub(crate) const TOP_SHIFT: u32 = 64 - SPLIT_BITS;

/// Whether rows can be partitioned by these key columns: any, but not none.
fn can_partition_by(columns: &[&DeviceColumn]) -> bool {
    !columns.is_empty()
}

/// Row hashes over `keys` (NULL keys hash alike, floats with -0.0 folded into +0.0 as the
/// hash tables fold them), or `None` when a key cannot be hashed ([`can_partition_by`]).
fn hash_keys(stream: &DeviceStream, keys: &[&DeviceColumn]) -> Result<Option<DeviceBuffer<u64>>> {
    if !can_partition_by(keys) {
        return Ok(None);
    }
    let mut columns = Vec::with_capacity(keys.len());
    for key in keys {
        let validity = key
            .validity()
            .map(|v| DeviceBitmap::new(v.bytes.as_slice()).with_offset(v.offset));
        let rows = key.len();
        columns.push(match key.values() {
            DeviceValues::Fixed { bytes, width } => {
                let slice = bytes.as_slice().slice(..rows * width)?;
                // Floats as the hash tables compare them: -0.0 is +0.0.
                match (key.data_type(), width) {
                    (arrow::datatypes::DataType::Float32, _) => {
                        HashColumn::folded::<f32>(slice.cast()?, validity)
                    }
                    (arrow::datatypes::DataType::Float64, _) => {
                        HashColumn::folded::<f64>(slice.cast()?, validity)
                    }
                    (_, width) => match width {
                        1 => HashColumn::fixed::<u8>(slice.cast()?, validity),
                        2 => HashColumn::fixed::<u16>(slice.cast()?, validity),
                        4 => HashColumn::fixed::<u32>(slice.cast()?, validity),
                        8 => HashColumn::fixed::<u64>(slice.cast()?, validity),
                        16 => HashColumn::fixed::<u128>(slice.cast()?, validity),
                        w => {
                            return Err(SpateError::Internal {
                                message: format!("a {w}-byte key column cannot be hashed"),
                            });
                        }
                    },
                }
            }
            DeviceValues::Utf8 { offsets, bytes } => HashColumn::Utf8(
                spate_kernels::gather::DeviceStrings {
                    offsets: offsets.typed::<i32>()?.slice(..=rows)?,
                    bytes: bytes.as_slice(),
                },
                validity,
            ),
            DeviceValues::LargeUtf8 { offsets, bytes } => HashColumn::LargeUtf8(
                spate_kernels::gather::DeviceStrings {
                    offsets: offsets.typed::<i64>()?.slice(..=rows)?,
                    bytes: bytes.as_slice(),
                },
                validity,
            ),
            DeviceValues::Bits { bytes, offset } => HashColumn::Bits {
                values: DeviceBitmap::new(bytes.as_slice()).with_offset(*offset),
                rows,
                validity,
            },
        });
    }
    Ok(Some(hash_columns(stream, &columns, DEFAULT_SEED)?))
}

/// `batch`'s rows (its count on the host) gathered in the order of their partition by bits
/// `shift..shift + SPLIT_BITS` of their hash over the `keys` columns, with the partitions'
/// row counts: one hash, one stable split and one gather. Spilling and the exchange between
/// devices both split rows this way.
pub(crate) fn group_by_hash(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    keys: &[usize],
    shift: u32,
) -> Result<(DeviceBatch, spate_kernels::partition::Partitioned)> {
    let key_columns: Vec<&DeviceColumn> = keys.iter().map(|&k| &batch.columns()[k]).collect();
    let hashes = hash_keys(stream, &key_columns)?.ok_or_else(|| SpateError::Internal {
        message: "rows split by keys that cannot be hashed".into(),
    })?;
    let split = partition_rows(stream, hashes.as_slice(), shift, SPLIT_BITS)?;
    drop(hashes);
    let gathers: Vec<Gather<'_>> = batch
        .columns()
        .iter()
        .map(|c| Gather::rows(c, split.order.as_slice()).each_row_once())
        .collect();
    let columns = gather_columns(stream, &gathers)?;
    let grouped = DeviceBatch::try_new(Arc::clone(batch.schema()), columns, batch.bound())?;
    Ok((grouped, split))
}

/// Where an operator's partition spills: its query's memory pool, the name it is charged under,
/// the batch size rows go back up in, and the metrics `EXPLAIN ANALYZE` shows (`spill_count`:
/// device batches spilled, `spilled_bytes`, `spilled_rows`).
#[derive(Debug, Clone)]
pub(crate) struct SpillOptions {
    pub(crate) context: Arc<TaskContext>,
    /// The consumer's name in DataFusion's memory pool.
    pub(crate) name: String,
    /// Rows go back to the device in batches of about this many bytes.
    pub(crate) batch_bytes: usize,
    spill_count: Count,
    spilled_bytes: Count,
    spilled_rows: Count,
    /// Host bytes written to disk (`disk_spilled_bytes`), registered at the first.
    disk_bytes: Arc<std::sync::OnceLock<Count>>,
    metrics: ExecutionPlanMetricsSet,
    partition: usize,
}

impl SpillOptions {
    /// Counts one batch of `rows` rows and `bytes` host bytes moved to the host.
    pub(crate) fn record(&self, bytes: usize, rows: usize) {
        self.spill_count.add(1);
        self.spilled_bytes.add(bytes);
        self.spilled_rows.add(rows);
    }

    /// A counter `name` of the operator's partition, registered now.
    pub(crate) fn counter(&self, name: &'static str) -> Count {
        MetricBuilder::new(&self.metrics).counter(name, self.partition)
    }

    /// Counts `bytes` of host batches written to disk.
    pub(crate) fn record_disk(&self, bytes: usize) {
        self.disk_bytes
            .get_or_init(|| {
                MetricBuilder::new(&self.metrics).counter(DISK_SPILLED_BYTES, self.partition)
            })
            .add(bytes);
    }

    /// For `operator`'s `partition`, with its metrics in `metrics`.
    pub(crate) fn new(
        context: &Arc<TaskContext>,
        operator: &str,
        metrics: &ExecutionPlanMetricsSet,
        partition: usize,
    ) -> DFResult<Self> {
        Ok(SpillOptions {
            context: Arc::clone(context),
            name: format!("{operator}[{partition}] spill"),
            batch_bytes: super::batch_target(context)?,
            spill_count: MetricBuilder::new(metrics).spill_count(partition),
            spilled_bytes: MetricBuilder::new(metrics).spilled_bytes(partition),
            spilled_rows: MetricBuilder::new(metrics).spilled_rows(partition),
            disk_bytes: Arc::new(std::sync::OnceLock::new()),
            metrics: metrics.clone(),
            partition,
        })
    }
}

/// What spilled host batches taken out of their partitions are charged to DataFusion's memory
/// pool: their downloads' charges, released with the last holder of each.
#[derive(Default)]
pub(crate) struct Charges {
    _held: Vec<Arc<MemoryReservation>>,
}

/// Metric of the host bytes an operator's spill wrote to disk.
pub const DISK_SPILLED_BYTES: &str = "disk_spilled_bytes";

/// Rows of one schema held in host memory (or on disk) in `2^SPLIT_BITS` partitions by key
/// hash.
pub(crate) struct HostPartitions {
    schema: SchemaRef,
    /// Key column indices.
    keys: Vec<usize>,
    /// The hash bits this level splits by start here.
    shift: u32,
    parts: Vec<Vec<RecordBatch>>,
    /// Rows the memory pool would not take, on disk.
    disk: Vec<Option<DiskPart>>,
    /// Host bytes of each partition, in memory and on disk.
    bytes: Vec<usize>,
    /// The charges of the downloads each partition holds slices of: a download's bytes stay
    /// charged until every partition with a slice of it has let go.
    charges: Vec<Vec<Arc<MemoryReservation>>>,
    rows: Vec<usize>,
    reservation: MemoryReservation,
    options: SpillOptions,
}

impl std::fmt::Debug for HostPartitions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPartitions")
            .field("shift", &self.shift)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl HostPartitions {
    /// Empty partitions of `schema`'s rows split by the hash of columns `keys`, at the level
    /// whose bits start at `shift`.
    pub(crate) fn new(
        schema: SchemaRef,
        keys: Vec<usize>,
        shift: u32,
        options: &SpillOptions,
    ) -> Self {
        let n = 1usize << SPLIT_BITS;
        HostPartitions {
            schema,
            keys,
            shift,
            parts: vec![Vec::new(); n],
            disk: (0..n).map(|_| None).collect(),
            bytes: vec![0; n],
            charges: vec![Vec::new(); n],
            rows: vec![0; n],
            // Not spillable to disk (yet): a spillable consumer under DataFusion's fair pool
            // would be asked to give memory back that it cannot.
            reservation: MemoryConsumer::new(options.name.clone())
                .register(options.context.memory_pool()),
            options: options.clone(),
        }
    }

    /// Partition `p`'s rows split again by the next hash bits: one upload and one spill per
    /// host batch. `None` at the hash's last bits.
    pub(crate) fn split(&mut self, stream: &DeviceStream, p: usize) -> Result<Option<Self>> {
        let Some(shift) = self.next_shift() else {
            return Ok(None);
        };
        let mut child = HostPartitions::new(
            Arc::clone(&self.schema),
            self.keys.clone(),
            shift,
            &self.options,
        );
        let (groups, _charges) = self.take_host_grouped(p)?;
        for group in groups {
            let batch = upload_batches(stream, &self.schema, &group)?;
            drop(group);
            child.spill(stream, &batch)?;
        }
        Ok(Some(child))
    }

    /// Whether the rows are all in one partition (or none): splitting it again would not
    /// spread them (one hot key, or NULL keys, hold them all).
    pub(crate) fn is_degenerate(&self) -> bool {
        self.rows.iter().filter(|&&r| r > 0).count() <= 1
    }

    /// How many partitions there are.
    pub(crate) fn len(&self) -> usize {
        self.parts.len()
    }

    /// The shift of the level below this one, or `None` at the hash's last bits.
    pub(crate) fn next_shift(&self) -> Option<u32> {
        self.shift.checked_sub(SPLIT_BITS)
    }

    /// The device bytes partition `p` takes once uploaded with a hash table over it.
    pub(crate) fn with_table(&self, p: usize) -> usize {
        self.bytes[p] + self.rows[p] * super::memory::TABLE_BYTES_PER_ROW
    }

    /// Moves `batch`'s rows to the host, each into its partition: one hash, one stable split,
    /// one gather, one download.
    pub(crate) fn spill(&mut self, stream: &DeviceStream, batch: &DeviceBatch) -> Result<()> {
        let batch = batch.resolve(stream)?;
        let rows = batch.bound();
        if rows == 0 {
            return Ok(());
        }
        let (grouped, split) = group_by_hash(stream, &batch, &self.keys, self.shift)?;
        drop(batch);
        let host = download_batch(stream, &grouped)?;
        drop(grouped);
        let size = host.get_array_memory_size();
        // Host memory short too: the download goes to disk.
        let charge = match self.reservation.try_grow(size) {
            Ok(()) => Some(Arc::new(self.reservation.split(size))),
            Err(_) => None,
        };
        let to_disk = charge.is_none();
        self.options.record(size, rows);
        if to_disk {
            self.options.record_disk(size);
        }
        for (p, &count) in split.counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let part = host.slice(split.range(p).start, count);
            // Charged by their share of the download; the slices share its buffers.
            let share = size * count / rows;
            self.bytes[p] += share;
            self.rows[p] += count;
            match &charge {
                Some(charge) => {
                    self.charges[p].push(Arc::clone(charge));
                    self.parts[p].push(part);
                }
                None => self.append_to_disk(p, &part)?,
            }
        }
        Ok(())
    }

    fn append_to_disk(&mut self, p: usize, batch: &RecordBatch) -> Result<()> {
        let part = match &mut self.disk[p] {
            Some(part) => part,
            None => self.disk[p].insert(DiskPart::create(
                &self.options.context,
                &self.schema,
                &self.options.name,
            )?),
        };
        part.append(batch)
    }

    /// Partition `p`'s host batches, those on disk read back, with their charges.
    fn take_batches(&mut self, p: usize) -> Result<(Vec<RecordBatch>, Charges)> {
        self.bytes[p] = 0;
        self.rows[p] = 0;
        let mut held = std::mem::take(&mut self.charges[p]);
        let mut batches = std::mem::take(&mut self.parts[p]);
        if let Some(part) = self.disk[p].take() {
            let read = part.read_all()?;
            // Back in host memory: charged while held (the pool may go over its limit by
            // them; the partition cannot be processed without them).
            let charge = self.reservation.new_empty();
            charge.grow(read.iter().map(RecordBatch::get_array_memory_size).sum());
            held.push(Arc::new(charge));
            batches.extend(read);
        }
        Ok((batches, Charges { _held: held }))
    }

    /// Partition `p`'s rows uploaded as one device batch (`None` when it has none); the host
    /// copy is released.
    pub(crate) fn take(&mut self, stream: &DeviceStream, p: usize) -> Result<Option<DeviceBatch>> {
        let (batches, _charges) = self.take_batches(p)?;
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(None);
        }
        Ok(Some(upload_batches(stream, &self.schema, &batches)?))
    }

    /// Partition `p`'s host batches, taken out in groups of about the batch size, each group
    /// to be uploaded as one device batch.
    /// They stay charged to the memory pool while the [`Charges`] are held.
    pub(crate) fn take_host_grouped(
        &mut self,
        p: usize,
    ) -> Result<(Vec<Vec<RecordBatch>>, Charges)> {
        let mut groups: Vec<Vec<RecordBatch>> = Vec::new();
        let mut group_bytes = 0;
        let (batches, charges) = self.take_batches(p)?;
        for batch in batches {
            // Slices share their download's buffers: count the rows' share of them.
            let size = super::upload::sliced_bytes(&batch);
            match groups.last_mut() {
                Some(group) if group_bytes + size <= self.options.batch_bytes => {
                    group_bytes += size;
                    group.push(batch);
                }
                _ => {
                    group_bytes = size;
                    groups.push(vec![batch]);
                }
            }
        }
        Ok((groups, charges))
    }

    /// The schema of the rows.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use spate_kernels::{Device, DeviceOptions};

    use super::*;
    use crate::column::upload_batch;

    #[test]
    fn a_download_stays_charged_until_every_partition_holding_it_lets_go() -> Result<()> {
        let device = Device::emulated(DeviceOptions::default())?;
        let stream = device.new_stream()?;
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(1 << 30, 1.0)
            .build_arc()?;
        let context = Arc::new(TaskContext::default().with_runtime(Arc::clone(&runtime)));
        let metrics = ExecutionPlanMetricsSet::new();
        let options = SpillOptions {
            context,
            name: "test".into(),
            batch_bytes: 1 << 20,
            spill_count: Count::new(),
            spilled_bytes: Count::new(),
            spilled_rows: Count::new(),
            disk_bytes: Arc::new(std::sync::OnceLock::new()),
            metrics,
            partition: 0,
        };
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let keys = Int64Array::from_iter_values(0..4096);
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys)])?;
        let mut parts = HostPartitions::new(schema, vec![0], TOP_SHIFT, &options);
        parts.spill(&stream, &upload_batch(&stream, &batch)?)?;
        let charged = runtime.memory_pool.reserved();
        assert!(charged > 0);
        for p in 0..parts.len() {
            let (groups, charges) = parts.take_host_grouped(p)?;
            drop(groups);
            drop(charges);
            // The partitions left still hold slices of the one download.
            if p + 1 < parts.len() {
                assert_eq!(runtime.memory_pool.reserved(), charged, "partition {p}");
            }
        }
        assert_eq!(runtime.memory_pool.reserved(), 0);
        Ok(())
    }
}
