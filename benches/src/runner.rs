//! Running one benchmark query: plan it, see where its operators landed, execute it, and
//! optionally check its result against a reference engine (Spate on the CPU backend).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayData, RecordBatch};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::{ExecutionPlan, collect};
use spate::CompileStats;
use spate::placement::{Placement, placement};
use spate::{Engine, SpateError};
use spate_kernels::CounterSnapshot;

use crate::compare::{Ordering, compare_ordered};

/// One execution of a query.
#[derive(Debug)]
pub struct QueryRun {
    /// Where each compute operator of the executed plan ran.
    pub placement: Placement,
    /// SQL to physical plan, the offload rule included.
    pub plan_time: Duration,
    /// Executing the physical plan and collecting its result (generated kernels compile here).
    pub execute_time: Duration,
    /// The result.
    pub batches: Vec<RecordBatch>,
    /// Generated kernels compiled during the execution (GPU backends; zero on `cpu`).
    pub compile: CompileStats,
    /// The executed plan, with its metrics.
    pub plan: Arc<dyn ExecutionPlan>,
    /// The devices' runtime calls during the execution, counted by the kernel runtime, summed
    /// over the devices (zero on `cpu`). Another query running on the engine at the same time
    /// would be counted too.
    pub runtime: CounterSnapshot,
    /// The same, per device, in the engine's device order (empty on `cpu`).
    pub per_device: Vec<CounterSnapshot>,
    /// The most device memory in use during the execution, the largest of the devices' (zero on
    /// `cpu`).
    pub peak_device_bytes: u64,
}

impl QueryRun {
    /// Rows in the result.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The Arrow size of the result: the bytes of its buffers (values, offsets, validity),
    /// not the capacity allocated for them.
    pub fn result_bytes(&self) -> u64 {
        fn data_bytes(data: &ArrayData) -> u64 {
            let buffers: usize = data.buffers().iter().map(|b| b.len()).sum();
            let nulls = data.nulls().map_or(0, |n| n.buffer().len());
            (buffers + nulls) as u64 + data.child_data().iter().map(data_bytes).sum::<u64>()
        }
        self.batches
            .iter()
            .flat_map(|b| b.columns())
            .map(|c| data_bytes(&c.to_data()))
            .sum()
    }

    /// Execution time without kernel compilation.
    pub fn execute_time_without_compile(&self) -> Duration {
        self.execute_time.saturating_sub(self.compile.time)
    }

    /// Device memory bytes the plan's GPU operators read and wrote, summed over the plan (the
    /// roofline accounting of `spate::exec::roofline`).
    pub fn device_traffic(&self) -> DeviceTraffic {
        let mut traffic = DeviceTraffic::default();
        add_traffic(self.plan.as_ref(), &mut traffic);
        traffic
    }

    /// [`QueryRun::device_traffic`]'s read and written bytes per device, for `devices`
    /// devices: an operator partition `p` ran on device `p % devices` (`spate::plan::devices`).
    pub fn device_bytes_per_device(&self, devices: usize) -> Vec<u64> {
        let mut bytes = vec![0u64; devices.max(1)];
        add_device_bytes(self.plan.as_ref(), &mut bytes);
        bytes
    }

    /// Bytes the exchanges between devices moved to another device, and through the host back
    /// to the device they were on (`exchange_bytes`, `exchange_local_bytes`).
    pub fn exchange_bytes(&self) -> (u64, u64) {
        let mut moved = (0, 0);
        add_exchange_bytes(self.plan.as_ref(), &mut moved);
        moved
    }
}

fn add_device_bytes(plan: &dyn ExecutionPlan, bytes: &mut [u64]) {
    if let Some(metrics) = plan.metrics() {
        for metric in metrics.iter() {
            let name = metric.value().name();
            if name != spate::metrics::DEV_READ_BYTES && name != spate::metrics::DEV_WRITE_BYTES {
                continue;
            }
            let device = metric.partition().unwrap_or(0) % bytes.len();
            bytes[device] += metric.value().as_usize() as u64;
        }
    }
    for child in plan.children() {
        add_device_bytes(child.as_ref(), bytes);
    }
}

fn add_exchange_bytes(plan: &dyn ExecutionPlan, moved: &mut (u64, u64)) {
    if let Some(metrics) = plan.metrics() {
        let count = |name| match metrics.sum_by_name(name) {
            Some(MetricValue::Count { count, .. }) => count.value() as u64,
            _ => 0,
        };
        moved.0 += count(spate::metrics::EXCHANGE_BYTES);
        moved.1 += count(spate::metrics::EXCHANGE_LOCAL_BYTES);
    }
    for child in plan.children() {
        add_exchange_bytes(child.as_ref(), moved);
    }
}

/// Device memory traffic of a plan's GPU operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTraffic {
    /// Bytes of device batches consumed.
    pub read_bytes: u64,
    /// Bytes of device batches produced.
    pub write_bytes: u64,
    /// Bytes the GPU operators copied host to device: uploads of CPU operators' output and
    /// small copies alike (their `h2d_bytes` metrics, see `spate::exec::counted`).
    pub h2d_bytes: u64,
    /// Bytes the GPU operators copied device to host: downloads for CPU operators and the
    /// result, and the small readbacks of sizes and totals (`d2h_bytes`).
    pub d2h_bytes: u64,
    /// Time the copy streams spent uploading CPU operators' output (`upload_copy_time`).
    pub upload_copy: Duration,
    /// Time the compute streams spent waiting for those copies (`upload_wait_time`): the part
    /// of the copy time not hidden under compute.
    pub upload_wait: Duration,
}

fn add_traffic(plan: &dyn ExecutionPlan, traffic: &mut DeviceTraffic) {
    if let Some(metrics) = plan.metrics() {
        let count = |name| match metrics.sum_by_name(name) {
            Some(MetricValue::Count { count, .. }) => count.value() as u64,
            _ => 0,
        };
        traffic.read_bytes += count(spate::metrics::DEV_READ_BYTES);
        traffic.write_bytes += count(spate::metrics::DEV_WRITE_BYTES);
        traffic.h2d_bytes += count("h2d_bytes");
        traffic.d2h_bytes += count("d2h_bytes");
        let time = |name| match metrics.sum_by_name(name) {
            Some(MetricValue::Time { time, .. }) => Duration::from_nanos(time.value() as u64),
            _ => Duration::ZERO,
        };
        traffic.upload_copy += time(spate::metrics::UPLOAD_COPY_TIME);
        traffic.upload_wait += time(spate::metrics::UPLOAD_WAIT_TIME);
    }
    for child in plan.children() {
        add_traffic(child.as_ref(), traffic);
    }
}

/// Plans and runs `sql` (one statement) on `engine`, classifying the very plan it executes.
pub async fn run_query(engine: &Engine, sql: &str) -> Result<QueryRun, SpateError> {
    let started = Instant::now();
    let plan: Arc<dyn ExecutionPlan> = engine.sql(sql).await?.create_physical_plan().await?;
    let plan_time = started.elapsed();
    let placement = placement(&plan);
    let compiled_before = engine.gpu().map(|g| g.compile_stats()).unwrap_or_default();
    let devices: Vec<_> = engine
        .gpu()
        .map(|g| g.devices().to_vec())
        .unwrap_or_default();
    let counted_before: Vec<CounterSnapshot> = devices
        .iter()
        .map(|d| {
            d.reset_memory_peak();
            d.counters()
        })
        .collect();
    let started = Instant::now();
    let batches = collect(Arc::clone(&plan), engine.context().task_ctx()).await?;
    let execute_time = started.elapsed();
    let per_device: Vec<CounterSnapshot> = devices
        .iter()
        .zip(counted_before)
        .map(|(d, before)| d.counters() - before)
        .collect();
    let runtime = per_device
        .iter()
        .fold(CounterSnapshot::default(), |sum, d| sum + *d);
    let peak_device_bytes = devices
        .iter()
        .map(|d| d.memory_stats().peak_bytes as u64)
        .max()
        .unwrap_or(0);
    let compile = engine
        .gpu()
        .map(|g| g.compile_stats().since(&compiled_before))
        .unwrap_or_default();
    Ok(QueryRun {
        placement,
        plan_time,
        execute_time,
        batches,
        compile,
        plan,
        runtime,
        per_device,
        peak_device_bytes,
    })
}

/// What checking a query against the reference found.
#[derive(Debug)]
pub enum Outcome {
    /// Same result; the row count.
    Matched(usize),
    /// Both ran, with different results: the first difference.
    Mismatch(String),
    /// The query failed on the engine under test (the reference ran).
    Failed(String),
    /// The reference engine failed, so nothing could be checked.
    ReferenceFailed(String),
    /// Both failed with the same error (the engine under test's message): a correct answer
    /// when the query itself is in error, as TPC-DS q90 at SF 0.1 divides by zero.
    SameError(String),
}

impl Outcome {
    /// True for [`Outcome::Matched`] and [`Outcome::SameError`].
    pub fn matched(&self) -> bool {
        matches!(self, Outcome::Matched(_) | Outcome::SameError(_))
    }
}

/// The order a plan's result has: the output columns its ordering sorts by (up to the first
/// that is not a column), and whether a LIMIT near the root cut it.
pub fn result_ordering(plan: &Arc<dyn ExecutionPlan>) -> Ordering {
    let keys = plan
        .properties()
        .output_ordering()
        .map(|ordering| {
            ordering
                .iter()
                .map_while(|e| e.expr.downcast_ref::<Column>().map(Column::index))
                .collect()
        })
        .unwrap_or_default();
    // The LIMIT that cuts the result sits among the root's row-preserving nodes, down to the
    // sort that orders it (a fetch below that belongs to a subquery).
    let mut limited = false;
    let mut node = Arc::clone(plan);
    loop {
        limited |= node.fetch().is_some();
        let name = node.name();
        if name.contains("Sort") && !name.contains("Merge") {
            break;
        }
        let passes = ["Projection", "Limit", "Coalesce", "Merge"]
            .iter()
            .any(|p| name.contains(p));
        let next = match node.children().as_slice() {
            [child] if passes => Arc::clone(child),
            _ => break,
        };
        node = next;
    }
    Ordering { keys, limited }
}

/// What kind of error a message reports, for errors that engines word differently.
fn error_kind(message: &str) -> Option<&'static str> {
    let m = message.to_ascii_lowercase();
    (m.contains("divide by zero") || m.contains("division by zero")).then_some("division by zero")
}

/// Whether two error messages report the same error: the same text, or the same kind.
pub fn same_error(a: &str, b: &str) -> bool {
    a == b || error_kind(a).is_some_and(|k| error_kind(b) == Some(k))
}

/// A query run on the engine under test and on the reference, and what the comparison found.
#[derive(Debug)]
pub struct Verified {
    /// The run on the engine under test (`None` when it failed).
    pub run: Option<QueryRun>,
    /// Where the operators of the plan the engine under test ran would run: the run's, or
    /// when it failed, its plan's, planned again (`None` when that fails too).
    pub placement: Option<Placement>,
    /// Execute time on the reference engine (`None` when it failed).
    pub reference_time: Option<Duration>,
    /// The verdict.
    pub outcome: Outcome,
}

/// Where `sql`'s operators would run on `engine`, from its physical plan alone.
async fn planned_placement(engine: &Engine, sql: &str) -> Option<Placement> {
    let plan = engine
        .sql(sql)
        .await
        .ok()?
        .create_physical_plan()
        .await
        .ok()?;
    Some(placement(&plan))
}

/// Runs `sql` on `engine` and on `reference` and compares the results (see
/// [`crate::compare`]).
pub async fn verify_query(engine: &Engine, reference: &Engine, sql: &str) -> Verified {
    let want = run_query(reference, sql).await;
    let got = run_query(engine, sql).await;
    let reference_time = want.as_ref().ok().map(|r| r.execute_time);
    let placement = match &got {
        Ok(run) => Some(run.placement.clone()),
        Err(_) => planned_placement(engine, sql).await,
    };
    let (run, outcome) = match (want, got) {
        (Err(want), Err(got)) if same_error(&want.to_string(), &got.to_string()) => {
            (None, Outcome::SameError(got.to_string()))
        }
        (Err(e), got) => (got.ok(), Outcome::ReferenceFailed(e.to_string())),
        (Ok(_), Err(e)) => (None, Outcome::Failed(e.to_string())),
        (Ok(want), Ok(got)) => {
            let order = result_ordering(&want.plan);
            let outcome = match compare_ordered(&want.batches, &got.batches, &order) {
                Ok(rows) => Outcome::Matched(rows),
                Err(difference) => Outcome::Mismatch(difference),
            };
            (Some(got), outcome)
        }
    };
    Verified {
        run,
        placement,
        reference_time,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use spate::Backend;

    use super::*;

    #[tokio::test]
    async fn a_query_is_classified_run_and_verified() {
        let gpu = Engine::builder()
            .backend(Backend::Emulated)
            .target_partitions(1)
            .build()
            .unwrap();
        let cpu = Engine::builder()
            .backend(Backend::Cpu)
            .target_partitions(1)
            .build()
            .unwrap();
        for engine in [&gpu, &cpu] {
            spate::tpch::register_tpch(engine, 0.001).unwrap();
        }
        let sql = "SELECT n_regionkey, count(*) AS n FROM nation WHERE n_nationkey > 3 \
                   GROUP BY n_regionkey ORDER BY n_regionkey";
        let verified = verify_query(&gpu, &cpu, sql).await;
        assert!(verified.outcome.matched(), "{:?}", verified.outcome);
        let run = verified.run.unwrap();
        assert_eq!(run.rows(), 5);
        let traffic = run.device_traffic();
        assert!(
            traffic.read_bytes > 0 && traffic.write_bytes > 0,
            "{traffic:?}"
        );
        assert!(run.compile.programs > 0, "{:?}", run.compile);
        // Run again: the session's kernels are compiled, so nothing compiles now.
        let again = run_query(&gpu, sql).await.unwrap();
        assert_eq!(again.compile.programs, 0, "{:?}", again.compile);
        assert!(again.execute_time_without_compile() <= again.execute_time);
        assert!(run.placement.fully_on_gpu(), "{:?}", run.placement);
        assert!(
            run.placement.gpu.iter().any(|n| n == "GpuAggregateExec"),
            "{:?}",
            run.placement
        );

        // The device's runtime calls were counted, and the per-operator counts add up to them:
        // every call of this query is made while some GPU operator is polled.
        let r = again.runtime;
        assert!(
            r.launches > 0 && r.host_syncs > 0 && r.allocations > 0,
            "{r:?}"
        );
        assert!(r.h2d_bytes > 0, "the tables are uploaded: {r:?}");
        assert!(r.d2h_bytes > 0, "the result comes down: {r:?}");
        // 5 rows of two Int64 columns, without nulls: 80 bytes of values.
        assert_eq!(again.result_bytes(), 80);
        assert!(again.peak_device_bytes > 0);
        let mut per_operator = [0u64; 3];
        fn sum(plan: &dyn ExecutionPlan, out: &mut [u64; 3]) {
            if let Some(m) = plan.metrics() {
                for (i, name) in ["launches", "host_syncs", "dev_allocs"].iter().enumerate() {
                    if let Some(MetricValue::Count { count, .. }) = m.sum_by_name(name) {
                        out[i] += count.value() as u64;
                    }
                }
            }
            for child in plan.children() {
                sum(child.as_ref(), out);
            }
        }
        sum(again.plan.as_ref(), &mut per_operator);
        assert_eq!(per_operator, [r.launches, r.host_syncs, r.allocations]);
        let path = crate::datapath::DataPath::of(&again);
        assert_eq!(path.launches, r.launches);
        assert!(path.modeled_h200_ms > 0.0, "{path:?}");

        let on_cpu = run_query(&cpu, sql).await.unwrap();
        assert_eq!(on_cpu.runtime, CounterSnapshot::default());
        assert!(on_cpu.placement.gpu.is_empty());
        assert!(
            on_cpu
                .placement
                .cpu
                .iter()
                .any(|(name, _)| name == "AggregateExec"),
            "{:?}",
            on_cpu.placement
        );

        // A query in error fails the same way on both: that is the right answer.
        let failed = verify_query(&gpu, &cpu, "SELECT * FROM no_such_table").await;
        assert!(
            matches!(failed.outcome, Outcome::SameError(_)),
            "{:?}",
            failed.outcome
        );
        assert!(same_error(
            "Arrow error: Divide by zero error",
            "GPU kernel error: division by zero in column 2"
        ));
        assert!(!same_error(
            "Arrow error: Divide by zero error",
            "out of memory"
        ));
    }
}
