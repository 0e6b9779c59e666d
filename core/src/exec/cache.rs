//! `CACHE TABLE` on a GPU backend: a table's columns held in device memory, and
//! `GpuCachedScanExec`, the scan that reads them there.
//!
//! [`DeviceTable::load`] reads every partition of a table once, coalesces each partition into
//! device batches of about `spate.gpu.batch_bytes`, uploads them and waits for the copies.
//! [`CachedTableProvider`] then stands in for the table: its scans hand the cached batches to
//! the GPU operators above without any host transfer, so a query over cached tables moves only
//! its result across the bus. Projection picks columns without copying (device columns share
//! their allocation).
//!
//! The batches are read by queries on many streams at once and never written. Their
//! allocations are marked with `share_across_streams`, so freeing them (`UNCACHE TABLE`, or
//! the last running query that still holds one) first waits for every stream on the device.
//! The allocations are charged to the device's memory pool like any other, so the GPU memory
//! budget sees the cache and a cache that does not fit fails with an out-of-memory error.
//!
//! The spill coordinator (`exec/coordinator.rs`) may move a cached table to the host when an
//! operator runs out of device memory, least recently scanned first: its batches are
//! downloaded and the table lets go of their device memory (freed once no running query
//! holds them). The next scan uploads them again, as they were.
//!
//! While the rows are still on the host, the load also learns what the planner may rely on
//! later: which columns are unique and how long each string column's longest value is
//! (`column_facts`).
//!
//! With several devices the table is sharded: one partition per device, partition `d` on
//! device `d`. By default the load's batches go to the devices in turn (round robin); with
//! `SHARDED BY (columns)` each row goes to the device an exchange between devices would send
//! it to (`exchange::split_by_device`, the same hash), and the scan says its output is
//! hash-partitioned by those columns, so a join or an aggregation by them needs no exchange.
//! A scan asked for a shard on another device's stream (a plan kept on one device) copies it
//! there through the host.

use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Statistics, project_schema};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions,
};
use spate_kernels::{Device, Stream as DeviceStream};

use super::column_facts::{ColumnFacts, column_facts};
use super::coordinator::Spillable;
use super::{DeviceBatchStream, GpuExec};
use crate::column::{DeviceBatch, download_batch, upload_batches};
use crate::device::GpuContext;
use crate::error::{Result, SpateError};

/// Metric of a cached scan that uploaded its table again after the spill coordinator had moved
/// it to the host.
pub const CACHE_RELOADS: &str = "cache_reloads";

/// A table's rows in device memory, partition by partition.
pub struct DeviceTable {
    schema: SchemaRef,
    /// Where the rows are now (see [`Residence`]).
    rows: RwLock<Residence>,
    partition_count: usize,
    num_rows: usize,
    device_bytes: usize,
    /// What was learnt of each column at load (see [`column_facts`]).
    facts: Vec<ColumnFacts>,
    /// The device each partition is on.
    devices: Vec<Device>,
    /// The columns its rows are sharded by (empty: round robin, or one device).
    sharded_by: Vec<usize>,
    /// When a scan last read it, for the spill coordinator's least-recently-used order.
    last_used: Mutex<Instant>,
    /// Held by every running scan's stream: a table in use is not moved to the host (its
    /// memory would not be freed until the scan ends, and the next scan would upload it
    /// again).
    scans: Arc<()>,
}

/// Where a cached table's rows are.
enum Residence {
    /// In device memory, as device batches per partition.
    Device(Vec<Vec<DeviceBatch>>),
    /// Moved to the host by the spill coordinator (one record batch per device batch),
    /// uploaded again by the next scan.
    Host(Vec<Vec<RecordBatch>>),
}

impl fmt::Debug for DeviceTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceTable")
            .field("partitions", &self.partition_count)
            .field("num_rows", &self.num_rows)
            .field("device_bytes", &self.device_bytes)
            .finish()
    }
}

/// Uploads `group` as one device batch of a cached table: its string columns carry their
/// longest value, and its memory is read by many streams.
fn resident_batch(
    stream: &DeviceStream,
    schema: &SchemaRef,
    group: &[RecordBatch],
    facts: &[ColumnFacts],
) -> Result<DeviceBatch> {
    // The group's batches are staged end to end and arrive as one: nothing is concatenated
    // on the host.
    let batch = upload_batches(stream, schema, group)?;
    // Gathers of its string columns size their bytes by the longest value.
    let columns = batch
        .columns()
        .iter()
        .zip(facts)
        .map(|(c, f)| c.clone().with_longest_string(f.longest_string))
        .collect();
    let batch = DeviceBatch::try_new(Arc::clone(batch.schema()), columns, batch.bound())?;
    batch.share_across_streams();
    Ok(batch)
}

impl DeviceTable {
    /// Uploads `partitions` (host batches of `schema`), coalescing each partition into device
    /// batches of about `batch_bytes`, and waits until the data is on the device. With several
    /// devices the rows are sharded over them (see the module docs): by the hash of the
    /// `sharded_by` columns, or round robin when there are none.
    pub fn load(
        gpu: &GpuContext,
        schema: SchemaRef,
        partitions: Vec<Vec<RecordBatch>>,
        batch_bytes: usize,
        sharded_by: Vec<usize>,
    ) -> Result<Self> {
        if let Err(unsupported) = super::check_input_types(&schema) {
            return Err(SpateError::Unsupported {
                message: format!("cannot cache the table in GPU memory: {}", unsupported.0),
            });
        }
        if let Some(&bad) = sharded_by.iter().find(|&&c| c >= schema.fields().len()) {
            return Err(SpateError::Internal {
                message: format!("a shard column {bad} out of the table's columns"),
            });
        }
        let facts = column_facts(
            schema.fields().len(),
            &partitions.iter().flatten().collect::<Vec<_>>(),
        );
        let devices = gpu.devices().to_vec();
        let streams = devices
            .iter()
            .map(Device::new_stream)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let target = batch_bytes.max(1);
        let (device_partitions, sharded_by) = if devices.len() == 1 {
            let mut out = Vec::with_capacity(partitions.len().max(1));
            for batches in partitions {
                let mut device_batches = Vec::new();
                for group in coalesce(batches, target) {
                    device_batches.push(resident_batch(&streams[0], &schema, &group, &facts)?);
                }
                out.push(device_batches);
            }
            (out, Vec::new())
        } else if sharded_by.is_empty() {
            // Round robin: the coalesced groups to the devices in turn.
            let mut out: Vec<Vec<DeviceBatch>> = vec![Vec::new(); devices.len()];
            let groups = coalesce(partitions.into_iter().flatten().collect(), target);
            for (i, group) in groups.into_iter().enumerate() {
                let d = i % devices.len();
                out[d].push(resident_batch(&streams[d], &schema, &group, &facts)?);
            }
            (out, Vec::new())
        } else {
            // By key: each group hashed on the first device, its rows sent where the exchange
            // between devices would send them.
            let mut out: Vec<Vec<DeviceBatch>> = vec![Vec::new(); devices.len()];
            let groups = coalesce(partitions.into_iter().flatten().collect(), target);
            for group in groups {
                let staged = upload_batches(&streams[0], &schema, &group)?;
                let parts = super::exchange::split_by_device(
                    &streams[0],
                    &staged,
                    &sharded_by,
                    devices.len(),
                )?;
                drop(staged);
                for (d, rows) in parts {
                    out[d].push(resident_batch(
                        &streams[d],
                        &schema,
                        std::slice::from_ref(&rows),
                        &facts,
                    )?);
                }
            }
            (out, sharded_by)
        };
        let mut device_partitions = device_partitions;
        if device_partitions.is_empty() {
            device_partitions.push(Vec::new());
        }
        let num_rows = device_partitions
            .iter()
            .flatten()
            .map(DeviceBatch::bound)
            .sum();
        let device_bytes = device_partitions
            .iter()
            .flatten()
            .map(DeviceBatch::device_bytes)
            .sum();
        // Queries read the batches on their own streams: the uploads must be complete first.
        for stream in &streams {
            stream.synchronize()?;
        }
        let partition_devices = (0..device_partitions.len())
            .map(|p| devices[p % devices.len()].clone())
            .collect();
        Ok(DeviceTable {
            schema,
            partition_count: device_partitions.len(),
            rows: RwLock::new(Residence::Device(device_partitions)),
            num_rows,
            device_bytes,
            facts,
            devices: partition_devices,
            sharded_by,
            last_used: Mutex::new(Instant::now()),
            scans: Arc::new(()),
        })
    }

    /// One table of the rows of `parts` (single-device tables, a stream's micro-batches), in
    /// order, in one partition on the first device: their device batches are shared, not
    /// copied. A part the spill coordinator moved to the host is uploaded again first.
    pub fn merged(gpu: &GpuContext, schema: SchemaRef, parts: &[Arc<DeviceTable>]) -> Result<Self> {
        let home = gpu.devices()[0].clone();
        let mut batches = Vec::new();
        let mut facts = vec![ColumnFacts::default(); schema.fields().len()];
        for part in parts {
            if part.devices.iter().any(|d| d.ordinal() != home.ordinal()) {
                return Err(SpateError::Internal {
                    message: "merging tables held on different devices".into(),
                });
            }
            for p in 0..part.partition_count {
                batches.extend(part.partition(p)?.0);
            }
            for (merged, f) in facts.iter_mut().zip(&part.facts) {
                merged.longest_string = merged.longest_string.max(f.longest_string);
            }
        }
        Ok(DeviceTable {
            num_rows: batches.iter().map(DeviceBatch::bound).sum(),
            device_bytes: batches.iter().map(DeviceBatch::device_bytes).sum(),
            schema,
            partition_count: 1,
            rows: RwLock::new(Residence::Device(vec![batches])),
            facts,
            devices: vec![home],
            sharded_by: Vec::new(),
            last_used: Mutex::new(Instant::now()),
            scans: Arc::new(()),
        })
    }

    /// A table of `batches`, computed on `device` and complete there (a query's output kept
    /// in device memory: a stream's window state, `stream/panes.rs`), in one partition. What
    /// the load of host rows learns of the columns is not known.
    pub(crate) fn from_device_batches(
        schema: SchemaRef,
        device: Device,
        batches: Vec<DeviceBatch>,
    ) -> Self {
        for batch in &batches {
            batch.share_across_streams();
        }
        DeviceTable {
            num_rows: batches.iter().map(DeviceBatch::bound).sum(),
            device_bytes: batches.iter().map(DeviceBatch::device_bytes).sum(),
            facts: vec![ColumnFacts::default(); schema.fields().len()],
            schema,
            partition_count: 1,
            rows: RwLock::new(Residence::Device(vec![batches])),
            devices: vec![device],
            sharded_by: Vec::new(),
            last_used: Mutex::new(Instant::now()),
            scans: Arc::new(()),
        }
    }

    /// The table's rows on the host, partition by partition (downloaded from the device, or
    /// as the spill coordinator left them).
    pub fn to_host(&self) -> Result<Vec<RecordBatch>> {
        let partitions = match &*self.read_rows() {
            Residence::Host(partitions) => partitions.clone(),
            Residence::Device(partitions) => download_partitions(partitions, &self.devices)?,
        };
        Ok(partitions.into_iter().flatten().collect())
    }

    /// Rows and device bytes of each partition (each shard, with several devices), while the
    /// rows are in device memory (none after the coordinator moved them to the host).
    pub fn shards(&self) -> Vec<(usize, usize)> {
        match &*self.read_rows() {
            Residence::Device(partitions) => partitions
                .iter()
                .map(|p| {
                    (
                        p.iter().map(DeviceBatch::bound).sum(),
                        p.iter().map(DeviceBatch::device_bytes).sum(),
                    )
                })
                .collect(),
            Residence::Host(_) => Vec::new(),
        }
    }

    /// Fails with a device's fault once any device holding a shard is unhealthy.
    fn check_health(&self) -> Result<()> {
        for d in &self.devices {
            d.check_health()?;
        }
        Ok(())
    }

    /// What is known of column `column` (none of it for a column out of range).
    pub fn column_facts(&self, column: usize) -> ColumnFacts {
        self.facts.get(column).copied().unwrap_or_default()
    }

    /// The cached table's schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows cached.
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// Device memory the cached columns take (when they are in device memory).
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    /// True while the rows are in device memory, false after the spill coordinator moved
    /// them to the host and before a scan brought them back.
    pub fn is_resident(&self) -> bool {
        matches!(*self.read_rows(), Residence::Device(_))
    }

    fn read_rows(&self) -> std::sync::RwLockReadGuard<'_, Residence> {
        self.rows.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_rows(&self) -> std::sync::RwLockWriteGuard<'_, Residence> {
        self.rows.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Partition `partition`'s device batches, uploaded again first if the table was moved to
    /// the host; true when this call uploaded them.
    fn partition(&self, partition: usize) -> Result<(Vec<DeviceBatch>, bool)> {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        if let Residence::Device(partitions) = &*self.read_rows() {
            return Ok((
                partitions.get(partition).cloned().unwrap_or_default(),
                false,
            ));
        }
        let mut rows = self.write_rows();
        let mut reloaded = false;
        if let Residence::Host(host) = &*rows {
            let mut device = Vec::with_capacity(host.len());
            for (batches, home) in host.iter().zip(&self.devices) {
                let stream = home.new_stream()?;
                device.push(
                    batches
                        .iter()
                        .map(|b| {
                            resident_batch(
                                &stream,
                                &self.schema,
                                std::slice::from_ref(b),
                                &self.facts,
                            )
                        })
                        .collect::<Result<Vec<_>>>()?,
                );
                stream.synchronize()?;
            }
            *rows = Residence::Device(device);
            reloaded = true;
        }
        match &*rows {
            Residence::Device(partitions) => Ok((
                partitions.get(partition).cloned().unwrap_or_default(),
                reloaded,
            )),
            Residence::Host(_) => Err(SpateError::Internal {
                message: "a cached table still on the host after its upload".into(),
            }),
        }
    }
}

impl Spillable for DeviceTable {
    fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resident_bytes(&self) -> usize {
        let scanned = Arc::strong_count(&self.scans) > 1;
        if self.is_resident() && !scanned {
            self.device_bytes
        } else {
            0
        }
    }

    /// Downloads the batches and drops the table's hold on their device memory, which is
    /// freed once no running query holds them either.
    fn spill(&self) -> Result<usize> {
        let mut rows = self.write_rows();
        let Residence::Device(partitions) = &*rows else {
            return Ok(0);
        };
        // A scan that started since the coordinator looked holds it now.
        if Arc::strong_count(&self.scans) > 1 {
            return Ok(0);
        }
        let host = download_partitions(partitions, &self.devices)?;
        *rows = Residence::Host(host);
        Ok(self.device_bytes)
    }
}

/// Each partition's device batches downloaded, on a stream of the device it is on.
fn download_partitions(
    partitions: &[Vec<DeviceBatch>],
    devices: &[Device],
) -> Result<Vec<Vec<RecordBatch>>> {
    partitions
        .iter()
        .zip(devices)
        .map(|(batches, home)| {
            let stream = home.new_stream()?;
            batches
                .iter()
                .map(|b| download_batch(&stream, b))
                .collect::<Result<Vec<_>>>()
        })
        .collect()
}

/// Groups `batches` into runs of about `target_bytes` each, in order.
fn coalesce(batches: Vec<RecordBatch>, target_bytes: usize) -> Vec<Vec<RecordBatch>> {
    let mut groups = Vec::new();
    let (mut current, mut bytes) = (Vec::new(), 0);
    for batch in batches {
        if batch.num_rows() == 0 {
            continue;
        }
        bytes += batch.get_array_memory_size();
        current.push(batch);
        if bytes >= target_bytes {
            groups.push(std::mem::take(&mut current));
            bytes = 0;
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// The table provider of a table cached in device memory: scans read the cached batches.
#[derive(Debug)]
pub struct CachedTableProvider {
    table: Arc<DeviceTable>,
    /// The provider it replaced, which `UNCACHE TABLE` puts back.
    original: Arc<dyn TableProvider>,
}

impl CachedTableProvider {
    /// A provider over `table`, remembering the `original` provider.
    pub fn new(table: Arc<DeviceTable>, original: Arc<dyn TableProvider>) -> Self {
        CachedTableProvider { table, original }
    }

    /// The provider the cache replaced.
    pub fn original(&self) -> &Arc<dyn TableProvider> {
        &self.original
    }
}

#[async_trait]
impl TableProvider for CachedTableProvider {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.table.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        // After a device fault its memory cannot be read: the query (planned on the CPU, as
        // `spate.gpu.on_device_error` allows) reads the table's source instead.
        if self.table.check_health().is_err() {
            return self.original.scan(state, projection, filters, limit).await;
        }
        // Filters and limits are applied by the operators above (no filter is pushed in, so
        // DataFusion keeps them all).
        Ok(Arc::new(GpuCachedScanExec::new(
            Arc::clone(&self.table),
            projection.cloned(),
        )?))
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(table_statistics(&self.table, &self.table.schema))
    }
}

/// Exact row count and byte size; no column statistics.
fn table_statistics(table: &DeviceTable, schema: &SchemaRef) -> Statistics {
    Statistics::new_unknown(schema)
        .with_num_rows(Precision::Exact(table.num_rows))
        .with_total_byte_size(Precision::Inexact(table.device_bytes))
}

/// Scans a table cached in device memory: hands its batches (the chosen columns) to the GPU
/// operator above, or downloads them for a CPU one.
#[derive(Debug)]
pub struct GpuCachedScanExec {
    table: Arc<DeviceTable>,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuCachedScanExec {
    /// A scan of `table`'s `projection` columns (all when `None`).
    pub fn new(table: Arc<DeviceTable>, projection: Option<Vec<usize>>) -> DFResult<Self> {
        Self::partitioned(table, projection, false)
    }

    /// The scan saying its rows are hash-partitioned by the columns its table is sharded by
    /// (when it keeps them all), for a plan spread over the devices (`plan/devices.rs`):
    /// partition `d` holds the rows the exchange between devices sends to device `d`. It is
    /// Spate's hash, not DataFusion's, so only plans placed by that pass are told.
    pub fn with_shard_partitioning(&self) -> DFResult<Self> {
        Self::partitioned(Arc::clone(&self.table), self.projection.clone(), true)
    }

    fn partitioned(
        table: Arc<DeviceTable>,
        projection: Option<Vec<usize>>,
        by_shard_keys: bool,
    ) -> DFResult<Self> {
        let schema = project_schema(&table.schema, projection.as_ref())?;
        // Sharded by columns the scan keeps: hash-partitioned by them, as the exchange between
        // devices would partition its rows.
        let at = |column: usize| match &projection {
            Some(p) => p.iter().position(|&c| c == column),
            None => Some(column),
        };
        let keys: Option<Vec<Arc<dyn PhysicalExpr>>> = table
            .sharded_by
            .iter()
            .map(|&c| {
                at(c).map(|i| {
                    Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>
                })
            })
            .collect();
        let partitioning = match keys {
            Some(keys) if by_shard_keys && !keys.is_empty() => {
                Partitioning::Hash(keys, table.partition_count)
            }
            _ => Partitioning::UnknownPartitioning(table.partition_count),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            partitioning,
            EmissionType::Incremental,
            Boundedness::Bounded,
        )
        .with_scheduling_type(SchedulingType::Cooperative);
        Ok(GpuCachedScanExec {
            table,
            projection,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// What is known of output column `column` (see [`column_facts`]).
    pub fn column_facts(&self, column: usize) -> ColumnFacts {
        let at = match &self.projection {
            Some(p) => p.get(column).copied().unwrap_or(usize::MAX),
            None => column,
        };
        self.table.column_facts(at)
    }

    fn project(&self, batch: &DeviceBatch) -> DFResult<DeviceBatch> {
        let Some(projection) = &self.projection else {
            return Ok(batch.clone());
        };
        let columns = projection
            .iter()
            .map(|&i| batch.columns()[i].clone())
            .collect();
        DeviceBatch::try_new_counted(Arc::clone(&self.schema), columns, batch.row_count().clone())
            .map_err(DataFusionError::from)
    }
}

impl DisplayAs for GpuCachedScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        match t {
            DisplayFormatType::TreeRender => write!(
                f,
                "rows={}\ndevice_bytes={}",
                self.table.num_rows, self.table.device_bytes
            ),
            _ => {
                write!(
                    f,
                    "GpuCachedScanExec: partitions={}, rows={}, columns=[{}]",
                    self.table.partition_count,
                    self.table.num_rows,
                    columns.join(", ")
                )?;
                if let Partitioning::Hash(keys, _) = self.properties.output_partitioning() {
                    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                    write!(f, ", sharded_by=[{}]", keys.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

impl ExecutionPlan for GpuCachedScanExec {
    fn name(&self) -> &str {
        "GpuCachedScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    crate::exec::gpu_plan_methods!();

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DFResult<Arc<Statistics>> {
        Ok(Arc::new(match args.partition() {
            None => table_statistics(&self.table, &self.schema),
            Some(_) => Statistics::new_unknown(&self.schema),
        }))
    }
}

impl GpuExec for GpuCachedScanExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        // The batches are already in device memory; the scan itself moves nothing.
        None
    }

    fn execute_device(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        if partition >= self.table.partition_count {
            return Err(DataFusionError::Internal(format!(
                "GpuCachedScanExec: partition {partition} of {} (this is a bug)",
                self.table.partition_count
            )));
        }
        // The stream holds the table in use until it is dropped: taken before the batches, so
        // that the coordinator never moves a table a scan is about to read.
        let scan = Arc::clone(&self.table.scans);
        let (batches, reloaded) = self.table.partition(partition).map_err(|e| {
            super::counted::name_operator(DataFusionError::from(e), "GpuCachedScanExec")
        })?;
        if reloaded {
            MetricBuilder::new(&self.metrics)
                .counter(CACHE_RELOADS, partition)
                .add(1);
        }
        let home = &self.table.devices[partition];
        let projected: Vec<DFResult<DeviceBatch>> = if home.id() == stream.device().id() {
            batches.iter().map(|b| self.project(b)).collect()
        } else {
            // A shard asked for on another device (a plan kept on one device): copied there
            // through the host, counted as an exchange between devices.
            let moved = MetricBuilder::new(&self.metrics)
                .counter(super::exchange::EXCHANGE_BYTES, partition);
            let from = home
                .new_stream()
                .map_err(|e| DataFusionError::from(SpateError::from(e)))?;
            batches
                .iter()
                .map(|b| {
                    let b = self.project(b)?;
                    let host = download_batch(&from, &b)?;
                    moved.add(b.device_bytes());
                    Ok(upload_batches(
                        &stream,
                        &self.schema,
                        std::slice::from_ref(&host),
                    )?)
                })
                .collect()
        };
        Ok(Box::pin(futures::StreamExt::map(
            futures::stream::iter(projected),
            move |b| {
                let _in_use = &scan;
                b
            },
        )))
    }
}
