//! What GPU operators read back to the host: each readback is a host synchronisation and a
//! small transfer, and the data path wants at most one per operator per batch (issue 16).
//! `EXPLAIN ANALYZE` shows every operator's counts; these tests pin the ones the design fixes
//! (`docs/dev/device-row-counts.md`).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use spate::{Backend, Engine};

mod common;
use common::ordered;

/// `rows` rows of `(k, v, s, t)`: keys `0..keys` in turn, values their row numbers, and two
/// strings (one with NULLs) that depend on the key.
fn table(prefix: &str, rows: i64, keys: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new(format!("{prefix}_k"), DataType::Int64, false),
        Field::new(format!("{prefix}_v"), DataType::Int64, false),
        Field::new(format!("{prefix}_s"), DataType::Utf8, false),
        Field::new(format!("{prefix}_t"), DataType::Utf8, true),
    ]));
    let key = |i: i64| i % keys;
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values((0..rows).map(key))) as ArrayRef,
            Arc::new(Int64Array::from_iter_values(0..rows)),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("{prefix} {}", key(i) % 7)),
            )),
            Arc::new(StringArray::from_iter((0..rows).map(|i| {
                (key(i) % 5 != 0).then(|| "x".repeat((key(i) % 9) as usize))
            }))),
        ],
    )
    .unwrap()
}

fn engine(backend: Backend, partitions: usize) -> Engine {
    let e = Engine::builder()
        .backend(backend)
        .target_partitions(partitions)
        .build()
        .unwrap();
    // A build side of 300 rows over 100 keys (groups of 3), a probe side of 2000 rows.
    e.register_batches("b", vec![table("b", 300, 100)]).unwrap();
    e.register_batches("p", vec![table("p", 2000, 250)])
        .unwrap();
    e
}

/// Runs `sql` on the GPU (every operator on it) and the CPU, checks the results are equal, and
/// returns the GPU's `EXPLAIN ANALYZE`.
async fn gpu_plan(sql: &str, partitions: usize) -> String {
    let gpu = engine(Backend::Emulated, partitions);
    let cpu = engine(Backend::Cpu, partitions);
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    assert_eq!(
        ordered(&gpu.collect(sql).await.unwrap()),
        ordered(&cpu.collect(sql).await.unwrap()),
        "{sql} ({partitions} partitions)"
    );
    ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    )
    .join("\n")
}

/// The named metric of the first plan line naming `operator` (`EXPLAIN ANALYZE` sums it over
/// the operator's partitions).
fn metric(plan: &str, operator: &str, name: &str) -> usize {
    let line = plan
        .lines()
        .find(|l| l.contains(operator))
        .unwrap_or_else(|| panic!("{operator} runs on the GPU: {plan}"));
    let at = line
        .find(&format!(" {name}="))
        .or_else(|| line.find(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} in {line}"));
    let digits: String = line[at..]
        .chars()
        .skip_while(|c| *c != '=')
        .skip(1)
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// A join's build side reads nothing back: its group count stays on the device, and probe
/// streams wait for a shared build side on the device. What the join reads back is its
/// probe's: per probe batch, the total of its pairs (8 bytes). (The aggregation above keeps
/// the result's download out of the join's counts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_build_reads_nothing_back() {
    let sql = "SELECT count(*), sum(b_v + p_v) FROM b JOIN p ON b_k = p_k";
    for partitions in [1, 2] {
        let plan = gpu_plan(sql, partitions).await;
        // One output batch per probe batch: its pairs fit one chunk.
        let probes = metric(&plan, "GpuHashJoinExec", "output_batches");
        assert!(probes >= 1, "{plan}");
        assert_eq!(
            metric(&plan, "GpuHashJoinExec", "d2h_bytes"),
            8 * probes,
            "{partitions} partitions: {plan}"
        );
        assert_eq!(
            metric(&plan, "GpuHashJoinExec", "host_syncs"),
            probes,
            "{partitions} partitions: {plan}"
        );
    }
}

/// A left join emits its unmatched build rows after the last probe batch. The partition that
/// does waits for the other probe partitions' marks on the device, not the host: beyond the
/// probe's pair totals the join reads back only the count of the build rows it emits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_left_join_waits_for_its_marks_on_the_device() {
    // Build keys 0..100, probe keys the multiples of 3 below 250: two thirds of the build
    // rows match nothing.
    let sql = "SELECT count(*), count(p_v), sum(b_v) FROM b LEFT JOIN p ON b_k = p_k * 3";
    for partitions in [1, 2] {
        let plan = gpu_plan(sql, partitions).await;
        let join = plan
            .lines()
            .find(|l| l.contains("GpuHashJoinExec"))
            .unwrap_or_else(|| panic!("the join runs on the GPU: {plan}"));
        assert!(join.contains("join_type=Left"), "{join}");
        // Every output batch but the last (the unmatched build rows) is a probe batch's.
        let probes = metric(&plan, "GpuHashJoinExec", "output_batches") - 1;
        assert!(probes >= 1, "{plan}");
        assert_eq!(
            metric(&plan, "GpuHashJoinExec", "host_syncs"),
            probes + 1,
            "{partitions} partitions: {plan}"
        );
        assert_eq!(
            metric(&plan, "GpuHashJoinExec", "d2h_bytes"),
            8 * probes + 4,
            "{partitions} partitions: {plan}"
        );
    }
}

/// Gathering a batch's string columns reads all their byte totals back in one transfer: a
/// join emitting three string columns, and an aggregation with two string keys, wait once
/// for them, not once per column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_columns_are_gathered_with_one_readback() {
    let sql = "SELECT b_s, p_t, count(*), max(length(p_s)) FROM b JOIN p ON b_k = p_k \
               GROUP BY b_s, p_t ORDER BY b_s, p_t";
    let plan = gpu_plan(sql, 1).await;
    let probes = metric(&plan, "GpuHashJoinExec", "output_batches");
    assert!(probes >= 1, "{plan}");
    // Per probe batch: the pair total (8 bytes), then the three strings' totals (3 × 8).
    assert_eq!(
        metric(&plan, "GpuHashJoinExec", "d2h_bytes"),
        32 * probes,
        "{plan}"
    );
    assert_eq!(
        metric(&plan, "GpuHashJoinExec", "host_syncs"),
        2 * probes,
        "{plan}"
    );
    // The group count (4 bytes), then the two keys' totals (2 × 8).
    assert_eq!(metric(&plan, "GpuAggregateExec", "d2h_bytes"), 20, "{plan}");
    assert_eq!(metric(&plan, "GpuAggregateExec", "host_syncs"), 2, "{plan}");
}

/// A projection over a filter gathers the kept rows of its input columns itself (the filter
/// hands over its indices). The filter keeps each row at most once, so its string columns'
/// bytes fit their source's: they are allocated for that, and their totals stay on the
/// device with the kept count, read back together by the aggregation above, which needs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_over_a_filter_gathers_its_strings_without_waiting() {
    let sql = "SELECT b_s, b_t, max(w) FROM \
               (SELECT b_s, b_t, b_v * 2 AS w FROM b WHERE b_v % 3 = 0) GROUP BY b_s, b_t \
               ORDER BY b_s, b_t";
    let plan = gpu_plan(sql, 1).await;
    let projection = plan
        .lines()
        .position(|l| l.contains("GpuProjectionExec") && l.contains("as w"))
        .unwrap_or_else(|| panic!("a GPU projection computes w: {plan}"));
    assert!(
        plan.lines()
            .nth(projection + 1)
            .is_some_and(|l| l.contains("GpuFilterExec")),
        "the projection reads a GPU filter: {plan}"
    );
    let line = plan.lines().nth(projection).unwrap();
    // One input batch: the value kernel's error word (4 bytes), and nothing for the strings.
    assert_eq!(metric(line, "GpuProjectionExec", "d2h_bytes"), 4, "{plan}");
    assert_eq!(metric(line, "GpuProjectionExec", "host_syncs"), 1, "{plan}");
    assert_eq!(
        metric(line, "GpuProjectionExec", "counted_on_device"),
        1,
        "{plan}"
    );
}

/// A filter leaves its kept count on the device, and nothing waits for it. The join's input,
/// where small batches are merged, reads the counts of all the filter's batches back in one
/// transfer (4 bytes each), and the probe then reads its pair totals (8 bytes a batch). The
/// filter's `output_rows` is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_below_a_join_waits_for_nothing_itself() {
    let sql = "SELECT count(*), sum(b_v + p_v) FROM b JOIN p ON b_k = p_k WHERE p_v < 900";
    for partitions in [1, 2] {
        let plan = gpu_plan(sql, partitions).await;
        let filter = plan
            .lines()
            .find(|l| l.contains("GpuFilterExec"))
            .unwrap_or_else(|| panic!("the filter runs on the GPU: {plan}"));
        assert!(
            filter.contains("p_v"),
            "the filter is the probe side's: {plan}"
        );
        assert_eq!(metric(&plan, "GpuFilterExec", "d2h_bytes"), 0, "{plan}");
        assert_eq!(metric(&plan, "GpuFilterExec", "host_syncs"), 0, "{plan}");
        let counted = metric(&plan, "GpuFilterExec", "counted_on_device");
        assert!(counted >= 1, "{plan}");
        assert_eq!(metric(&plan, "GpuFilterExec", "output_rows"), 900, "{plan}");
        let probes = metric(&plan, "GpuHashJoinExec", "output_batches");
        assert!(probes >= 1, "{plan}");
        assert_eq!(
            metric(&plan, "GpuHashJoinExec", "d2h_bytes"),
            8 * probes + 4 * counted,
            "{partitions} partitions: {plan}"
        );
        assert_eq!(
            metric(&plan, "GpuHashJoinExec", "host_syncs"),
            probes + 1,
            "{partitions} partitions: {plan}"
        );
    }
}

/// Operators that need a filter's count on the host read it back, and get the same rows as
/// the CPU: a projection, the build side of a join, outer and
/// semi joins whose probe rows are the filter's, a sort, grouped and ungrouped aggregations,
/// a LIMIT and the final download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_counts_are_resolved_where_the_host_needs_them() {
    let queries = [
        "SELECT p_k, p_s FROM p WHERE p_v < 1200 AND p_k > 100",
        "SELECT p_v * 2, p_t FROM p WHERE p_k = 3",
        "SELECT count(*), sum(p_v + b_v) FROM b JOIN p ON b_k = p_k WHERE b_v > 100",
        "SELECT b_k, p_v FROM b RIGHT JOIN p ON b_k = p_k WHERE p_v < 40",
        "SELECT b_k, p_v FROM b FULL JOIN (SELECT p_k, p_v FROM p WHERE p_v < 40) q ON b_k = p_k",
        "SELECT p_v FROM p WHERE p_v < 600 AND p_k IN (SELECT b_k FROM b WHERE b_v < 50)",
        "SELECT p_v FROM p WHERE p_v < 600 AND p_k NOT IN (SELECT b_k FROM b WHERE b_v < 50)",
        "SELECT p_v, p_s FROM p WHERE p_k > 200 ORDER BY p_v DESC",
        "SELECT p_s, count(*), sum(p_v) FROM p WHERE p_k < 20 GROUP BY p_s",
        "SELECT count(*), min(p_v), count(p_t) FROM p WHERE p_k < 20",
        "SELECT count(*) FROM p WHERE p_k > 1000",
        "SELECT count(*) FROM (SELECT p_v FROM p WHERE p_k = 5 LIMIT 3)",
    ];
    // One partition: with two, a round-robin repartition keeps a top-level projection on the
    // CPU, and every operator here must run on the GPU.
    let gpu = engine(Backend::Emulated, 1);
    let cpu = engine(Backend::Cpu, 1);
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    for sql in queries {
        // No ORDER BY fixes the row order of most of these: compare the rows as sets.
        let rows = |batches: &[RecordBatch]| {
            let mut rows = ordered(batches);
            rows.sort();
            rows
        };
        assert_eq!(
            rows(&gpu.collect(sql).await.unwrap()),
            rows(&cpu.collect(sql).await.unwrap()),
            "{sql}"
        );
    }
}

/// A query's device memory is freed when it ends: nothing a finished plan's metrics hold (the
/// count words they wait on, and the streams that wrote them) stays allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_queries_hold_no_device_memory() {
    let gpu = engine(Backend::Emulated, 1);
    let sql = "SELECT count(*), sum(b_v + p_v) FROM b JOIN p ON b_k = p_k WHERE p_v < 900";
    let allocated = |e: &Engine| {
        e.gpu()
            .map(|g| g.device().memory_stats().allocated_bytes)
            .unwrap()
    };
    gpu.collect(sql).await.unwrap();
    let after_one = allocated(&gpu);
    for _ in 0..3 {
        gpu.collect(sql).await.unwrap();
        gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap();
    }
    assert_eq!(allocated(&gpu), after_one);
}

/// An inner join on unique build keys, without a filter, makes at most one output row per
/// probe row: once the build side is known to be unique (its largest group comes back with the
/// second probe batch's pair total), each probe batch leaves its output's count on the device
/// and reads nothing back. So the join's readbacks do not grow with its probe batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_of_unique_keys_reads_nothing_back_per_batch() {
    for partitions in [1, 2] {
        let (probes, syncs) = unique_probe(12, partitions).await;
        let (more_probes, same_syncs) = unique_probe(36, partitions).await;
        assert!(
            probes >= 4 && more_probes > probes,
            "{probes} then {more_probes}"
        );
        assert_eq!(syncs, same_syncs, "{partitions} partitions");
    }
}

/// Joins 250 unique keys with `batches` probe batches of 400 rows (keys 0..400: 250 match), all
/// in device memory and in small batches, checks the result against the CPU's, and returns
/// the join's output batches and host synchronisations.
async fn unique_probe(batches: usize, partitions: usize) -> (usize, usize) {
    let sql = "SELECT count(*), sum(u_v + q_v) FROM u JOIN q ON u_k = q_k";
    let setup = |backend| {
        let e = engine(backend, partitions);
        e.register_batches("u", vec![table("u", 250, 250)]).unwrap();
        let probe: Vec<RecordBatch> = (0..batches).map(|_| table("q", 400, 500)).collect();
        e.register_batches("q", probe).unwrap();
        e
    };
    let (gpu, cpu) = (setup(Backend::Emulated), setup(Backend::Cpu));
    for e in [&gpu, &cpu] {
        // Small batches: the probe batches are not merged into one.
        e.collect("SET spate.gpu.batch_bytes = 16384")
            .await
            .unwrap();
    }
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    // In device memory, so that no upload counts as the join's.
    for t in ["u", "q"] {
        gpu.collect(&format!("CACHE TABLE {t}")).await.unwrap();
    }
    assert_eq!(
        ordered(&gpu.collect(sql).await.unwrap()),
        ordered(&cpu.collect(sql).await.unwrap()),
        "{sql} ({partitions} partitions)"
    );
    let plan = ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    )
    .join("\n");
    (
        metric(&plan, "GpuHashJoinExec", "output_batches"),
        metric(&plan, "GpuHashJoinExec", "host_syncs"),
    )
}

/// A join whose probe keeps its output's count on the device counts that output's rows once,
/// also under a LIMIT, which reads the count back to stop at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_probe_under_a_limit_counts_its_rows_once() {
    let setup = |backend| {
        let e = engine(backend, 1);
        e.register_batches("u", vec![table("u", 250, 250)]).unwrap();
        // The first three probe batches match nothing, so the limit is not reached before the
        // join knows its keys are unique; each later one matches 250 rows.
        let probe: Vec<RecordBatch> = (0..8)
            .map(|b| {
                let t = table("q", 400, 500);
                let offset = if b < 3 { 10_000 } else { 0 };
                let keys = Int64Array::from_iter_values((0..400).map(|i| i + offset));
                let mut columns = t.columns().to_vec();
                columns[0] = Arc::new(keys);
                RecordBatch::try_new(t.schema(), columns).unwrap()
            })
            .collect();
        e.register_batches("q", probe).unwrap();
        e
    };
    let gpu = setup(Backend::Emulated);
    for sql in [
        "SET spate.gpu.batch_bytes = 16384",
        "SET spate.gpu.fallback = 'error'",
        "CACHE TABLE u",
        "CACHE TABLE q",
    ] {
        gpu.collect(sql).await.unwrap();
    }
    let sql = "SELECT u_v, q_v FROM u JOIN q ON u_k = q_k LIMIT 600";
    let rows: usize = gpu
        .collect(sql)
        .await
        .unwrap()
        .iter()
        .map(RecordBatch::num_rows)
        .sum();
    assert_eq!(rows, 600);
    let plan = ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    )
    .join("\n");
    assert!(
        plan.contains("fetch=600"),
        "the limit is the join's: {plan}"
    );
    assert_eq!(
        metric(&plan, "GpuHashJoinExec", "output_rows"),
        600,
        "{plan}"
    );
}
