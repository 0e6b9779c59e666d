//! GPU physical operators, one per file, and the device-batch interface between them.
//!
//! Every GPU operator implements DataFusion's `ExecutionPlan` (host record batches, for CPU
//! parents) and [`GpuExec::execute_device`] (device batches, for GPU parents). A GPU operator
//! asks its child for device batches with [`device_input`]: a GPU child hands them over
//! directly, a CPU child's host batches are coalesced (to `spate.gpu.batch_bytes`) and uploaded.
//! Data therefore crosses between host and device only at the edges of a GPU subtree, and the
//! plan keeps DataFusion's shape (no transfer nodes).
//!
//! One device stream serves one partition of a GPU subtree: the topmost GPU operator creates
//! it and passes it down, so every kernel and copy of that partition is ordered on it.

/// The `ExecutionPlan` methods every GPU operator implements alike: `with_new_children` through
/// its `replace_children`, `execute` as its device batches downloaded for a CPU parent, and
/// `metrics`. For use inside `impl ExecutionPlan for …` of an operator with a
/// `metrics: ExecutionPlanMetricsSet` field.
macro_rules! gpu_plan_methods {
    () => {
        #[allow(deprecated)]
        fn with_new_children(
            self: ::std::sync::Arc<Self>,
            children: Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
        ) -> ::datafusion::error::Result<
            ::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>,
        > {
            self.replace_children(
                children,
                ::datafusion::physical_plan::ReplaceChildrenOptions::new(
                    ::datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
                ),
            )
        }

        fn execute(
            &self,
            partition: usize,
            context: ::std::sync::Arc<::datafusion::execution::TaskContext>,
        ) -> ::datafusion::error::Result<::datafusion::execution::SendableRecordBatchStream> {
            $crate::exec::execute_for_host(self, partition, context, &self.metrics)
        }

        fn metrics(&self) -> Option<::datafusion::physical_plan::metrics::MetricsSet> {
            // Metrics that wait on counts left on the device are paid first.
            $crate::exec::device_counts::settle(&self.metrics);
            $crate::exec::roofline::refresh(&self.metrics);
            Some(self.metrics.clone_inner())
        }
    };
    // Operators that replace a CPU node `self.cpu` with the same children report its
    // statistics: the GPU computes the same rows, so the planner's estimates (join order,
    // build sides, EXPLAIN's `statistics`) stay what they are on the CPU.
    (cpu) => {
        $crate::exec::gpu_plan_methods!();

        fn statistics_from_inputs(
            &self,
            input_stats: &[::std::sync::Arc<::datafusion::common::Statistics>],
            args: &::datafusion::physical_plan::statistics::StatisticsArgs,
        ) -> ::datafusion::error::Result<::std::sync::Arc<::datafusion::common::Statistics>> {
            self.cpu.statistics_from_inputs(input_stats, args)
        }

        fn child_stats_requests(
            &self,
            partition: Option<usize>,
        ) -> Vec<::datafusion::physical_plan::statistics::ChildStats> {
            self.cpu.child_stats_requests(partition)
        }
    };
}
pub(crate) use gpu_plan_methods;

pub mod aggregate;
mod appended;
mod batching;
pub mod cache;
pub mod coalesce;
pub mod column_facts;
pub(crate) mod coordinator;
pub mod counted;
mod cpu_twin;
pub mod cross_join;
pub(crate) mod device_counts;
mod disk_spill;
pub mod exchange;
mod external_sort;
pub mod filter;
pub(crate) mod hash_table;
mod held;
pub mod join;
pub mod limit;
pub(crate) mod memory;
pub mod nearest;
pub mod projection;
mod retry;
pub mod sort;
pub(crate) mod spill;
mod top_k;
pub mod union;
mod upload;
pub mod vector_topk;
pub mod window;

pub use cache::CACHE_RELOADS;
pub use retry::{CPU_FALLBACKS, EVICTED_BYTES, OOM_SPLITS};
pub use spill::DISK_SPILLED_BYTES;
pub use upload::{UPLOAD_COPY_TIME, UPLOAD_WAIT_TIME};

use std::pin::Pin;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricValue, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{Stream, StreamExt, TryStreamExt};
use spate_kernels::Stream as DeviceStream;

use crate::column::{DeviceBatch, download_batch};
use crate::config::SpateOptions;
use crate::device::GpuContext;

pub use aggregate::GpuAggregateExec;
pub use cache::GpuCachedScanExec;
pub use coalesce::GpuCoalescePartitionsExec;
pub use cross_join::GpuCrossJoinExec;
pub use exchange::GpuExchangeExec;
pub use filter::GpuFilterExec;
pub use join::GpuHashJoinExec;
pub use limit::GpuLimitExec;
pub use projection::GpuProjectionExec;
pub use sort::GpuSortExec;
pub use union::GpuUnionExec;
pub use vector_topk::GpuVectorTopKExec;
pub use window::GpuWindowExec;

/// A GPU operator's EXPLAIN text: its CPU twin's, with `Gpu` before the operator name (the
/// tree format prints names itself, from `ExecutionPlan::name`).
pub(crate) fn display_gpu<T: datafusion::physical_plan::DisplayAs + ?Sized>(
    cpu: &T,
    t: datafusion::physical_plan::DisplayFormatType,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    if !matches!(t, datafusion::physical_plan::DisplayFormatType::TreeRender) {
        f.write_str("Gpu")?;
    }
    cpu.fmt_as(t, f)
}

/// A stream of device batches.
pub type DeviceBatchStream = Pin<Box<dyn Stream<Item = DFResult<DeviceBatch>> + Send>>;

/// What every GPU operator adds to DataFusion's `ExecutionPlan`.
pub trait GpuExec: ExecutionPlan {
    /// The output of `partition` as device batches, with all work ordered on `stream`.
    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream>;

    /// The operator's metrics, where its device memory traffic is recorded; `None` for an
    /// operator that moves no data itself (a scan of a table cached in device memory hands
    /// out batches that are already there).
    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet>;

    /// The operator's metrics set, where its runtime calls are counted (see [`counted`]).
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet;

    /// The CPU node whose rows this operator computes, over the same children, when it
    /// replaced one: what the planner knows of that node's output holds for this one.
    fn replaces(&self) -> Option<&dyn ExecutionPlan> {
        None
    }

    /// Whether the operator reads its inputs' partitions itself, one after the other in
    /// partition order (row positions are part of its result): the region pass then leaves
    /// them unmerged (a merge on the device interleaves them).
    fn reads_partitions_in_order(&self) -> bool {
        false
    }
}

/// The GPU operator behind a plan node, if it is one.
pub fn as_gpu_exec(plan: &dyn ExecutionPlan) -> Option<&dyn GpuExec> {
    if let Some(f) = plan.downcast_ref::<GpuFilterExec>() {
        return Some(f);
    }
    if let Some(p) = plan.downcast_ref::<GpuProjectionExec>() {
        return Some(p);
    }
    if let Some(s) = plan.downcast_ref::<GpuSortExec>() {
        return Some(s);
    }
    if let Some(a) = plan.downcast_ref::<GpuAggregateExec>() {
        return Some(a);
    }
    if let Some(j) = plan.downcast_ref::<GpuHashJoinExec>() {
        return Some(j);
    }
    if let Some(c) = plan.downcast_ref::<GpuCachedScanExec>() {
        return Some(c);
    }
    if let Some(c) = plan.downcast_ref::<GpuCoalescePartitionsExec>() {
        return Some(c);
    }
    if let Some(u) = plan.downcast_ref::<GpuUnionExec>() {
        return Some(u);
    }
    if let Some(c) = plan.downcast_ref::<GpuCrossJoinExec>() {
        return Some(c);
    }
    if let Some(l) = plan.downcast_ref::<GpuLimitExec>() {
        return Some(l);
    }
    if let Some(x) = plan.downcast_ref::<GpuExchangeExec>() {
        return Some(x);
    }
    if let Some(w) = plan.downcast_ref::<GpuWindowExec>() {
        return Some(w);
    }
    if let Some(v) = plan.downcast_ref::<GpuVectorTopKExec>() {
        return Some(v);
    }
    if let Some(n) = plan.downcast_ref::<nearest::GpuNearestExec>() {
        return Some(n);
    }
    None
}

/// `gpu`'s device batches for `partition`, with the bytes of each batch it produces counted as
/// its device memory writes (`dev_write_bytes`), and its runtime calls counted in its scope
/// (see [`counted`]), which is returned for a download to be counted there too. Every GPU
/// operator's output is taken through here, by a GPU parent ([`device_input`]) or a CPU one
/// ([`execute_for_host`]).
fn execute_device_counted(
    gpu: &dyn GpuExec,
    partition: usize,
    context: Arc<TaskContext>,
    stream: Arc<DeviceStream>,
) -> DFResult<(DeviceBatchStream, counted::RuntimeScope)> {
    let gpu_ctx = gpu_context(&context)?;
    gpu_ctx.count_operator_run();
    let bandwidth = gpu_ctx.bandwidth();
    let scope = counted::RuntimeScope::new(gpu.plan_metrics(), partition);
    let batches = scope.run(|| gpu.execute_device(partition, context, Arc::clone(&stream)))?;
    let batches = scope.clone().wrap(batches, gpu.name());
    let Some(metrics) = gpu.device_metrics() else {
        return Ok((batches, scope));
    };
    let written = MetricBuilder::new(metrics).counter(DEV_WRITE_BYTES, partition);
    let settlement = device_counts::Settlement::of(metrics, partition);
    if partition == 0
        && let Some(bandwidth) = bandwidth
    {
        // One roofline entry per operator: it reads the operator's totals over all partitions.
        MetricBuilder::new(metrics).build(MetricValue::Custom {
            name: "roofline".into(),
            value: Arc::new(roofline::Roofline::new(bandwidth)),
        });
    }
    let batches: DeviceBatchStream = Box::pin(batches.map(move |batch| {
        if let Ok(b) = &batch {
            settlement.count_bytes(b, &written, &stream);
        }
        batch
    }));
    Ok((batches, scope))
}

/// Metric names of the roofline accounting (see [`roofline`]).
pub const DEV_READ_BYTES: &str = "dev_read_bytes";
/// See [`DEV_READ_BYTES`].
pub const DEV_WRITE_BYTES: &str = "dev_write_bytes";

pub mod roofline {
    //! Roofline accounting: each GPU operator's device memory traffic against the device's
    //! measured bandwidth.
    //!
    //! An operator counts the bytes of the device batches it consumes (`dev_read_bytes`) and
    //! produces (`dev_write_bytes`). That is the traffic it cannot avoid: every input column
    //! read once and every output column written once; hash tables, sort passes and other
    //! scratch traffic come on top and are what a fused, well-tuned operator minimises. The
    //! floor is those bytes at the bandwidth a device-to-device copy reaches
    //! ([`GpuContext::measure_bandwidth`](crate::device::GpuContext::measure_bandwidth)), and
    //! `EXPLAIN ANALYZE` shows `roofline=floor T, achieved X× floor`, where achieved is the
    //! operator's `elapsed_compute` summed over its partitions (partitions that overlap on the
    //! device make this an upper bound). On `emulated` the bandwidth is the host's, labelled so.

    use std::any::Any;
    use std::fmt;
    use std::sync::{Arc, Mutex, PoisonError};

    use datafusion::physical_plan::metrics::{
        CustomMetricValue, ExecutionPlanMetricsSet, MetricValue,
    };

    use crate::device::Bandwidth;

    /// The `roofline` metric: its operator's byte counters and compute time, as of the last
    /// time its metrics were read ([`refresh`]). It holds numbers, not the operator's metrics
    /// set: a metric inside the set that held the set would keep it, and all it refers to,
    /// alive forever.
    #[derive(Debug)]
    pub struct Roofline {
        totals: Mutex<Totals>,
        bandwidth: Bandwidth,
    }

    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    struct Totals {
        bytes: u64,
        compute_ns: u64,
    }

    impl Roofline {
        pub(crate) fn new(bandwidth: Bandwidth) -> Self {
            Roofline {
                totals: Mutex::new(Totals::default()),
                bandwidth,
            }
        }

        fn totals(&self) -> Totals {
            *self.totals.lock().unwrap_or_else(PoisonError::into_inner)
        }

        /// Bytes read and written by the operator.
        pub fn bytes(&self) -> u64 {
            self.totals().bytes
        }

        /// The time the bytes take at the measured bandwidth.
        pub fn floor(&self) -> std::time::Duration {
            self.bandwidth.floor(self.bytes())
        }
    }

    /// Brings the `roofline` metric of `metrics` up to date with its operator's counters.
    pub(crate) fn refresh(metrics: &ExecutionPlanMetricsSet) {
        let set = metrics.clone_inner();
        let count = |name| match set.sum_by_name(name) {
            Some(MetricValue::Count { count, .. }) => count.value() as u64,
            _ => 0,
        };
        let totals = Totals {
            bytes: count(super::DEV_READ_BYTES) + count(super::DEV_WRITE_BYTES),
            compute_ns: set.elapsed_compute().unwrap_or(0) as u64,
        };
        for m in set.iter() {
            if let MetricValue::Custom { name, value } = m.value()
                && name == "roofline"
                && let Some(r) = value.as_any().downcast_ref::<Roofline>()
            {
                *r.totals.lock().unwrap_or_else(PoisonError::into_inner) = totals;
            }
        }
    }

    impl fmt::Display for Roofline {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let floor = self.floor();
            let achieved = self.totals().compute_ns as f64;
            write!(f, "floor {floor:.2?}")?;
            if floor.as_nanos() > 0 {
                write!(
                    f,
                    ", achieved {:.1}× floor",
                    achieved / floor.as_nanos() as f64
                )?;
            }
            write!(
                f,
                " at {:.1} GB/s ({})",
                self.bandwidth.gb_per_s(),
                self.bandwidth.backend
            )
        }
    }

    impl CustomMetricValue for Roofline {
        fn new_empty(&self) -> Arc<dyn CustomMetricValue> {
            // The value is the operator's totals, so an aggregate of it is itself.
            let copy = Roofline::new(self.bandwidth.clone());
            *copy.totals.lock().unwrap_or_else(PoisonError::into_inner) = self.totals();
            Arc::new(copy)
        }

        fn aggregate(&self, _other: Arc<dyn CustomMetricValue + 'static>) {}

        fn as_any(&self) -> &dyn Any {
            self
        }

        fn as_usize(&self) -> usize {
            usize::try_from(self.floor().as_nanos()).unwrap_or(usize::MAX)
        }

        fn is_eq(&self, other: &Arc<dyn CustomMetricValue>) -> bool {
            other
                .as_any()
                .downcast_ref::<Roofline>()
                .is_some_and(|o| o.bytes() == self.bytes() && o.bandwidth == self.bandwidth)
        }
    }
}

/// Fails with the first column of `schema` the device cannot hold (every GPU operator uploads
/// whole input batches).
pub(crate) fn check_input_types(
    schema: &arrow::datatypes::Schema,
) -> Result<(), crate::expr::Unsupported> {
    match schema
        .fields()
        .iter()
        .find(|f| crate::column::device_layout(f.data_type()).is_none())
    {
        Some(field) => Err(crate::expr::Unsupported(format!(
            "input column `{}` has type {}, which the GPU backend does not support yet",
            field.name(),
            field.data_type()
        ))),
        None => Ok(()),
    }
}

/// After DataFusion rebuilt a GPU operator's CPU twin (new children, a new fetch): the GPU
/// operator again if it still applies, else the CPU node, which is always correct.
pub(crate) fn rebuild_gpu<C, G>(
    cpu: Arc<dyn ExecutionPlan>,
    make: impl FnOnce(Arc<C>) -> Result<G, crate::expr::Unsupported>,
) -> DFResult<Arc<dyn ExecutionPlan>>
where
    C: ExecutionPlan + Clone + 'static,
    G: ExecutionPlan + 'static,
{
    let Some(node) = cpu.downcast_ref::<C>() else {
        return Ok(cpu);
    };
    match make(Arc::new(node.clone())) {
        Ok(gpu) => Ok(Arc::new(gpu)),
        Err(_) => Ok(cpu),
    }
}

/// [`rebuild_gpu`] for GPU operators that keep their CPU node as an `Arc<dyn ExecutionPlan>`:
/// the GPU operator again if `make` still accepts `cpu`, else `cpu`, which is always correct.
pub(crate) fn rebuild_gpu_dyn<G: ExecutionPlan + 'static>(
    cpu: Arc<dyn ExecutionPlan>,
    make: impl FnOnce(Arc<dyn ExecutionPlan>) -> Result<G, crate::expr::Unsupported>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    match make(Arc::clone(&cpu)) {
        Ok(gpu) => Ok(Arc::new(gpu)),
        Err(_) => Ok(cpu),
    }
}

/// The session's GPU, which the engine stores in the session config.
pub(crate) fn gpu_context(context: &TaskContext) -> DFResult<Arc<GpuContext>> {
    context
        .session_config()
        .get_extension::<GpuContext>()
        .ok_or_else(|| {
            DataFusionError::Internal(
                "a GPU operator ran in a session without a GPU context (this is a bug)".into(),
            )
        })
}

/// The bytes device batches are coalesced or merged to: `spate.gpu.batch_bytes`, but at most
/// a [`memory::BATCH_SHARE`]th of the query's device budget, so that an operator holding a
/// few batches beside its state still fits a small budget.
pub(crate) fn batch_target(context: &TaskContext) -> DFResult<usize> {
    let gpu = gpu_context(context)?;
    let options = context.session_config().options();
    let budget = memory::query_budget(&gpu, options);
    Ok(SpateOptions::gpu_batch_bytes(options)
        .min(budget / memory::BATCH_SHARE)
        .max(memory::MIN_BATCH_BYTES))
}

/// The time one operator spends on host↔device transfers, and the device bytes it reads, shown
/// by `EXPLAIN ANALYZE` (the bytes it moves over the bus are counted with its other runtime
/// calls, see [`counted`]).
#[derive(Debug, Clone)]
pub(crate) struct TransferMetrics {
    pub(crate) transfer_time: Time,
    /// Bytes of the device batches the operator consumed (see [`roofline`]), and where they
    /// wait for counts left on the device; `None` for an operator that only passes batches
    /// through.
    pub(crate) dev_read_bytes: Option<(Count, device_counts::Settlement)>,
    /// The operator's metrics and partition, for those only some of its runs register (an
    /// upload's timings).
    pub(crate) plan_metrics: (ExecutionPlanMetricsSet, usize),
}

impl TransferMetrics {
    pub(crate) fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        TransferMetrics {
            dev_read_bytes: Some((
                MetricBuilder::new(metrics).counter(DEV_READ_BYTES, partition),
                device_counts::Settlement::of(metrics, partition),
            )),
            ..TransferMetrics::passing_through(metrics, partition)
        }
    }

    /// For an operator that passes device batches through (they are not read by it).
    pub(crate) fn passing_through(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        TransferMetrics {
            transfer_time: MetricBuilder::new(metrics).subset_time("transfer_time", partition),
            dev_read_bytes: None,
            plan_metrics: (metrics.clone(), partition),
        }
    }
}

fn to_df(e: crate::error::SpateError) -> DataFusionError {
    DataFusionError::from(e)
}

/// Device batches of `input`'s `partition`: directly from a GPU operator, or uploaded from a
/// CPU one after coalescing its batches to about `spate.gpu.batch_bytes`.
pub(crate) fn device_input(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    stream: &Arc<DeviceStream>,
    metrics: &TransferMetrics,
) -> DFResult<DeviceBatchStream> {
    let read = metrics.dev_read_bytes.clone();
    let counting = Arc::clone(stream);
    let count_read = move |batches: DeviceBatchStream| -> DeviceBatchStream {
        let Some((read, settlement)) = read else {
            return batches;
        };
        Box::pin(batches.map(move |batch| {
            if let Ok(b) = &batch {
                settlement.count_bytes(b, &read, &counting);
            }
            batch
        }))
    };
    if let Some(gpu) = as_gpu_exec(input.as_ref()) {
        let (batches, _) =
            execute_device_counted(gpu, partition, Arc::clone(context), Arc::clone(stream))?;
        return Ok(count_read(batches));
    }
    let target = batch_target(context)?;
    let host = upload::decoded_ahead(input, partition, context);
    // The host batches waiting to be uploaded are host memory DataFusion's memory limit
    // governs, as the batches a CPU operator buffers are.
    let reservation =
        MemoryConsumer::new(format!("GpuUpload[{partition}]")).register(context.memory_pool());
    let staging = MemoryConsumer::new(format!("GpuUpload[{partition}] staging"))
        .register(context.memory_pool());
    let (plan_metrics, partition) = &metrics.plan_metrics;
    Ok(count_read(upload::upload_stream(
        host,
        input.schema(),
        target,
        Arc::clone(stream),
        metrics.clone(),
        reservation,
        staging,
        (plan_metrics, *partition),
        gpu_context(context)?,
    )))
}

/// [`device_input`] for an operator that works batch by batch (a filter, a projection, a join's
/// probe, a partial aggregation): a GPU child's small batches are merged on the device first
/// (`batching.rs`), as a CPU child's are coalesced before their upload.
pub(crate) fn per_batch_input(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    stream: &Arc<DeviceStream>,
    metrics: &TransferMetrics,
    keeps_counts: batching::KeepsCounts,
) -> DFResult<DeviceBatchStream> {
    merged_input(
        input,
        partition,
        context,
        stream,
        metrics,
        |input, schema, target, stream| {
            batching::merge_small_batches(input, schema, target, stream, keeps_counts)
        },
    )
}

/// [`device_input`] for an operator that collects its whole input before it works (a sort, a
/// join build, a final aggregation): a GPU child's batches whose row count is on the device
/// are merged (`batching::compact_device_counted`), so that the operator does not hold a
/// filter's outputs at the size of the filter's input. `keeps_counts`: whether the operator
/// takes a row count on the device (a join build does), so that the merge need not read it.
pub(crate) fn collected_input(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    stream: &Arc<DeviceStream>,
    metrics: &TransferMetrics,
    keeps_counts: batching::KeepsCounts,
) -> DFResult<DeviceBatchStream> {
    merged_input(
        input,
        partition,
        context,
        stream,
        metrics,
        |input, schema, target, stream| {
            batching::compact_device_counted(input, schema, target, stream, keeps_counts)
        },
    )
}

/// [`device_input`], with a GPU child's batches passed through `merge` (one of `batching`'s
/// merges) at `spate.gpu.batch_bytes`.
fn merged_input(
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    stream: &Arc<DeviceStream>,
    metrics: &TransferMetrics,
    merge: impl FnOnce(DeviceBatchStream, SchemaRef, usize, Arc<DeviceStream>) -> DeviceBatchStream,
) -> DFResult<DeviceBatchStream> {
    let batches = device_input(input, partition, context, stream, metrics)?;
    if as_gpu_exec(input.as_ref()).is_none() {
        return Ok(batches);
    }
    let target = batch_target(context)?;
    Ok(merge(batches, input.schema(), target, Arc::clone(stream)))
}

/// `ExecutionPlan::execute` of every GPU operator: its device batches on a new stream,
/// downloaded for a CPU parent.
pub(crate) fn execute_for_host<P: GpuExec>(
    plan: &P,
    partition: usize,
    context: Arc<TaskContext>,
    metrics: &ExecutionPlanMetricsSet,
) -> DFResult<SendableRecordBatchStream> {
    let gpu = gpu_context(&context)?;
    // Partition `p` of a GPU subtree runs on device `p % devices` where the plan was spread
    // over the devices (`plan/devices.rs`: its regions exchange between devices); any other
    // subtree runs on one device, so that the partitions of a collect-left join share its
    // build side (`SpateOptions::device_for`).
    let device = SpateOptions::device_for(
        context.session_config().options(),
        partition,
        gpu.devices().len(),
        gpu.devices().len() > 1 && spread_over_devices(plan),
    );
    let stream = region_stream(&gpu.devices()[device], &context)?;
    let (batches, scope) = execute_device_counted(plan, partition, context, Arc::clone(&stream))?;
    let transfer = TransferMetrics::new(metrics, partition);
    Ok(download_stream(
        plan.schema(),
        batches,
        stream,
        transfer,
        scope,
    ))
}

/// Runs `plan`, a GPU operator, on `device` and keeps its output there: no download. Returns
/// its device batches once they are complete (a stream's window state, `stream/panes.rs`).
/// They outlive the query, so they are allocated on a stream of their own, outside any
/// query's memory pool, as a cached table's load is.
pub(crate) async fn collect_on_device(
    plan: &Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
    device: &spate_kernels::Device,
) -> DFResult<Vec<DeviceBatch>> {
    let Some(gpu) = as_gpu_exec(plan.as_ref()) else {
        return Err(DataFusionError::Internal(format!(
            "collect_on_device: {} is not a GPU operator",
            plan.name()
        )));
    };
    let stream = Arc::new(device.new_stream().map_err(|e| to_df(e.into()))?);
    let mut out = Vec::new();
    let partitions = datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(plan)
        .partition_count();
    for partition in 0..partitions {
        let (mut batches, _scope) =
            execute_device_counted(gpu, partition, Arc::clone(&context), Arc::clone(&stream))?;
        while let Some(batch) = batches.next().await {
            out.push(batch?);
        }
    }
    stream.synchronize().map_err(|e| to_df(e.into()))?;
    Ok(out)
}

/// Whether the GPU subtree under `plan` was spread over several devices: it holds an exchange
/// between devices (`plan/devices.rs` places one at every region's inputs but a cached
/// table's).
fn spread_over_devices(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<GpuExchangeExec>().is_some()
        || (as_gpu_exec(plan).is_some()
            && plan
                .children()
                .iter()
                .any(|c| spread_over_devices(c.as_ref())))
}

/// A new stream on `device` for a GPU subtree (or an exchange's side of one). A session that
/// caps a query's device memory (`spate.gpu.memory_limit`) charges the subtree's allocations
/// to a pool of that size too: one per query and device (`GpuContext::query_pool`), shared by
/// every subtree and exchange task of the query on that device.
pub(crate) fn region_stream(
    device: &spate_kernels::Device,
    context: &Arc<TaskContext>,
) -> DFResult<Arc<DeviceStream>> {
    let stream = match SpateOptions::gpu_memory_limit(context.session_config().options()) {
        Some(limit) => {
            let pool = gpu_context(context)?.query_pool(context, device, limit);
            device.new_stream_in(pool)
        }
        None => device.new_stream(),
    };
    Ok(Arc::new(stream.map_err(|e| to_df(e.into()))?))
}

/// Downloads a GPU operator's device batches for a CPU parent, counting the download in the
/// operator's scope. Empty batches are dropped.
fn download_stream(
    schema: SchemaRef,
    batches: DeviceBatchStream,
    stream: Arc<DeviceStream>,
    metrics: TransferMetrics,
    scope: counted::RuntimeScope,
) -> SendableRecordBatchStream {
    let host = batches
        .map(move |batch| {
            let batch = batch?;
            let _timer = metrics.transfer_time.timer();
            scope.run(|| download_batch(&stream, &batch).map_err(to_df))
        })
        // A batch whose count was on the device may turn out empty (a filter that kept
        // nothing): CPU operators get no empty batches, as from a CPU filter.
        .try_filter(|b| futures::future::ready(b.num_rows() > 0));
    Box::pin(RecordBatchStreamAdapter::new(schema, host))
}
