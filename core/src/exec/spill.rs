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

/// Whether rows can be partitioned by these key columns: fixed-width and string keys can;
/// booleans (bitmaps) cannot.
fn can_partition_by(columns: &[&DeviceColumn]) -> bool {
    !columns.is_empty()
        && columns
            .iter()
            .all(|c| !matches!(c.values(), DeviceValues::Bits { .. }))
}

/// Row hashes over `keys` (NULL keys hash alike), or `None` when a key cannot be hashed
/// ([`can_partition_by`]).
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
                match width {
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
            DeviceValues::Bits { .. } => return Ok(None),
        });
    }
    Ok(Some(hash_columns(stream, &columns, DEFAULT_SEED)?))
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
    fn record_disk(&self, bytes: usize) {
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
    /// The part of `bytes` in memory, charged to the reservation.
    held: Vec<usize>,
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
            held: vec![0; n],
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
        for group in self.take_host_grouped(p)? {
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
        let keys: Vec<&DeviceColumn> = self.keys.iter().map(|&k| &batch.columns()[k]).collect();
        let hashes = hash_keys(stream, &keys)?.ok_or_else(|| SpateError::Internal {
            message: "rows spilled by keys that cannot be hashed".into(),
        })?;
        let split = partition_rows(stream, hashes.as_slice(), self.shift, SPLIT_BITS)?;
        drop(hashes);
        let gathers: Vec<Gather<'_>> = batch
            .columns()
            .iter()
            .map(|c| Gather::rows(c, split.order.as_slice()).each_row_once())
            .collect();
        let columns = gather_columns(stream, &gathers)?;
        let grouped = DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows)?;
        drop(batch);
        let host = download_batch(stream, &grouped)?;
        drop(grouped);
        let size = host.get_array_memory_size();
        // Host memory short too: the download goes to disk.
        let to_disk = self.reservation.try_grow(size).is_err();
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
            if to_disk {
                self.append_to_disk(p, &part)?;
            } else {
                self.held[p] += share;
                self.parts[p].push(part);
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

    /// Partition `p`'s host batches, those on disk read back, and its charge released.
    fn take_batches(&mut self, p: usize) -> Result<Vec<RecordBatch>> {
        let held = std::mem::take(&mut self.held[p]);
        self.bytes[p] = 0;
        self.rows[p] = 0;
        self.reservation.shrink(held.min(self.reservation.size()));
        let mut batches = std::mem::take(&mut self.parts[p]);
        if let Some(part) = self.disk[p].take() {
            batches.extend(part.read_all()?);
        }
        Ok(batches)
    }

    /// Partition `p`'s rows uploaded as one device batch (`None` when it has none); the host
    /// copy is released.
    pub(crate) fn take(&mut self, stream: &DeviceStream, p: usize) -> Result<Option<DeviceBatch>> {
        let batches = self.take_batches(p)?;
        if batches.iter().all(|b| b.num_rows() == 0) {
            return Ok(None);
        }
        Ok(Some(upload_batches(stream, &self.schema, &batches)?))
    }

    /// Partition `p`'s host batches, taken out in groups of about the batch size, each group
    /// to be uploaded as one device batch.
    pub(crate) fn take_host_grouped(&mut self, p: usize) -> Result<Vec<Vec<RecordBatch>>> {
        let mut groups: Vec<Vec<RecordBatch>> = Vec::new();
        let mut group_bytes = 0;
        for batch in self.take_batches(p)? {
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
        Ok(groups)
    }

    /// The schema of the rows.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }
}
