//! GPU operators against the CPU engine on the emulated backend: random tables with nulls,
//! NaN, ±0.0 and extremes, batch sizes 1, 7 and 8192, EXPLAIN markings and the fallback policy.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array,
    Int32Array, Int64Array, StringArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray, UInt16Array,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use spate::kernels::reference::Rng;
use spate::{Backend, Engine, SpateError};

mod common;
use common::ordered;

fn table(rows: usize, seed: u64) -> Vec<RecordBatch> {
    let mut r = Rng::new(seed);
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("g", DataType::Float32, true),
        Field::new("p", DataType::Boolean, true),
        Field::new("dt", DataType::Date32, true),
        Field::new("m", DataType::Decimal128(12, 2), true),
        Field::new("t", DataType::Int8, true),
        Field::new("u", DataType::UInt16, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let null_rate = [0.0, 0.1, 0.5][seed as usize % 3];
    let mut batches = Vec::new();
    let mut left = rows;
    while left > 0 || batches.is_empty() {
        let n = left.min(1 + r.below(700) as usize);
        left -= n;
        let opt = |r: &mut Rng| !r.chance(null_rate);
        let a: Vec<Option<i32>> = (0..n)
            .map(|_| opt(&mut r).then(|| r.below(41) as i32 - 20))
            .collect();
        let b: Vec<Option<i64>> = (0..n)
            .map(|k| {
                opt(&mut r).then(|| match k % 13 {
                    0 => i64::MAX,
                    1 => i64::MIN,
                    _ => r.below(10_000) as i64 - 5_000,
                })
            })
            .collect();
        let f: Vec<Option<f64>> = (0..n)
            .map(|k| {
                opt(&mut r).then(|| match k % 17 {
                    0 => f64::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f64::NEG_INFINITY,
                    4 => f64::INFINITY,
                    _ => (r.below(400) as f64 - 200.0) / 16.0,
                })
            })
            .collect();
        let g: Vec<Option<f32>> = f.iter().map(|v| v.map(|x| x as f32)).collect();
        let p: Vec<Option<bool>> = (0..n).map(|_| opt(&mut r).then(|| r.chance(0.5))).collect();
        let dt: Vec<Option<i32>> = (0..n)
            .map(|_| opt(&mut r).then(|| 9_000 + r.below(60) as i32))
            .collect();
        let m: Vec<Option<i128>> = (0..n)
            .map(|_| opt(&mut r).then(|| r.below(2_000) as i128 - 1_000))
            .collect();
        let t: Vec<Option<i8>> = (0..n)
            .map(|_| opt(&mut r).then(|| r.next_u64() as i8))
            .collect();
        let u: Vec<Option<u16>> = (0..n)
            .map(|_| opt(&mut r).then(|| r.next_u64() as u16))
            .collect();
        let s: Vec<Option<String>> = (0..n)
            .map(|_| {
                opt(&mut r).then(|| match r.below(10) {
                    // Ties on the first 8 bytes, a NUL byte, and a multi-byte character.
                    0 => "xyzxyzxy\0".to_string(),
                    1 => "xyzxyzxyzA".to_string(),
                    2 => "é".to_string(),
                    _ => "xyz".repeat(r.below(4) as usize),
                })
            })
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(a)),
            Arc::new(Int64Array::from(b)),
            Arc::new(Float64Array::from(f)),
            Arc::new(Float32Array::from(g)),
            Arc::new(BooleanArray::from(p)),
            Arc::new(Date32Array::from(dt)),
            Arc::new(
                Decimal128Array::from(m)
                    .with_precision_and_scale(12, 2)
                    .unwrap(),
            ),
            Arc::new(Int8Array::from(t)),
            Arc::new(UInt16Array::from(u)),
            Arc::new(StringArray::from(s)),
        ];
        batches.push(RecordBatch::try_new(Arc::clone(&schema), columns).unwrap());
    }
    batches
}

const PREDICATES: &[&str] = &[
    "a > 3",
    "a >= 0 AND b < 100",
    "a < -5 OR p",
    "NOT (p OR a = 1)",
    "p IS NULL AND a IS NOT NULL",
    "f > 1.5",
    "f = 0.0",
    "f <> f",
    "f >= 'NaN'::DOUBLE",
    "g < 0",
    "b * 3 > b",
    "b + 1 < b",
    "a - 7 = -20",
    "dt BETWEEN DATE '1994-09-01' AND DATE '1994-10-01'",
    "m < 1.50 AND m > -1.50",
    "t < 0 AND u > 30000",
    "s IS NULL",
    "p",
    "NOT p",
    "a IN (1, 2, 3)",
    "a NOT IN (1, 2, NULL)",
    "f IN (0.0, 'NaN'::DOUBLE)",
    "coalesce(a, 0) > 2",
    "CASE WHEN a > 0 THEN b WHEN p THEN -1 ELSE 7 END < 100",
    "s = 'xyz'",
    "s <> 'xyz' AND s < 'xyzxyzx'",
    "s > ''",
    "s LIKE 'xy%'",
    "s LIKE '%yz'",
    "s NOT LIKE '%zx%'",
    "s LIKE '%'",
    "s LIKE 'x%z%z'",
    "s LIKE 'xyz'",
    "s IN ('', 'xyzxyz')",
    "extract(year FROM dt) = 1994 AND extract(month FROM dt) >= 10",
    "a / 3 > 1",
    "a % 7 = -2",
    "b / (a * a + 1) > 10",
    "b % 1000 = 5",
    "t / 5 = u % 3",
    "f / g > 1.0",
    "f % 1.5 > 0.5",
    "CASE WHEN a <> 0 THEN 100 / a ELSE 0 END > 5",
    "coalesce(b / NULLIF(a * a, 0), 0) > 100",
    "CASE a WHEN 1 THEN 10 WHEN 2 THEN 20 ELSE 0 END = 10",
    "CASE s WHEN 'xyz' THEN true WHEN 'é' THEN p ELSE false END",
    "length(s) > 3 AND char_length(s) < 9",
    "octet_length(s) = 2",
    "dt + INTERVAL '1 month' > DATE '1994-10-15'",
    "dt - INTERVAL '1 year 2 days' < DATE '1993-09-01'",
    "dt + INTERVAL '3 days' = DATE '1994-09-05'",
    "s LIKE 'x_z%'",
    "s LIKE '_'",
    "s NOT LIKE '%y_x%'",
    "s LIKE 'xyzxyzxy_'",
    "s LIKE '%\\_%' OR s LIKE '_yz%z'",
    "substr(s, 2, 3) = 'yzx'",
    "substr(s, 0, 2) IN ('x', 'é')",
    "substring(s FROM 4) LIKE 'xyz%'",
    "length(substr(s, -1, 5)) = 3",
    "substr(s, 10, 1) = 'A' OR substr(s, 9) = ''",
    "m / 0.25 > 2",
    "m % 1.5 = 0.5",
    "a IS DISTINCT FROM 3",
    "a IS NOT DISTINCT FROM NULL",
    "s IS NOT DISTINCT FROM 'xyz'",
    "s IS DISTINCT FROM NULL",
    "f IS DISTINCT FROM 0.0",
    "f IS NOT DISTINCT FROM 'NaN'::DOUBLE",
    "dt IS NOT DISTINCT FROM DATE '1994-09-02'",
    "(m IS DISTINCT FROM 1.50) AND (p IS NOT DISTINCT FROM true)",
];

/// Rows as strings, sorted (for results whose order is not fixed).
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = ordered(batches);
    out.sort();
    out
}

/// A GPU engine and a CPU engine with `data` registered as `t` in both.
fn engines_over(data: Vec<RecordBatch>, batch_size: usize, partitions: usize) -> (Engine, Engine) {
    let gpu = engine_with(Backend::Emulated, batch_size, partitions);
    let cpu = engine_with(Backend::Cpu, batch_size, partitions);
    gpu.register_batches("t", data.clone()).unwrap();
    cpu.register_batches("t", data).unwrap();
    (gpu, cpu)
}

fn engine(backend: Backend, batch_size: usize) -> Engine {
    engine_with(backend, batch_size, 2)
}

/// GPU engines take turns with these device batch sizes (`spate.gpu.batch_bytes`): 1 KiB and
/// 64 KiB cut every table into many device batches, so each operator meets batch edges (a
/// filter's limit, join chunks, partial aggregates emitting many batches); the default gives
/// one batch per partition.
const BATCH_BYTES: [&str; 3] = ["1024", "65536", "134217728"];

fn engine_with(backend: Backend, batch_size: usize, partitions: usize) -> Engine {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let mut builder = Engine::builder()
        .backend(backend)
        .batch_size(batch_size)
        .target_partitions(partitions);
    if backend == Backend::Emulated {
        let bytes = BATCH_BYTES[NEXT.fetch_add(1, Ordering::Relaxed) % BATCH_BYTES.len()];
        builder = builder.option("spate.gpu.batch_bytes", bytes);
    }
    builder.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_match_the_cpu_at_every_batch_size() {
    for (seed, rows_in_table, batch_size) in [
        (1u64, 3000usize, 8192usize),
        (2, 500, 7),
        (3, 60, 1),
        (4, 0, 8192),
    ] {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, 2);
        for predicate in PREDICATES {
            let sql = format!("SELECT * FROM t WHERE {predicate}");
            let want = rows(&cpu.collect(&sql).await.unwrap());
            let got = rows(&gpu.collect(&sql).await.unwrap());
            assert_eq!(
                got, want,
                "`{predicate}` seed={seed} batch_size={batch_size}"
            );
            if seed == 1 {
                let plan = explain(&gpu, &sql).await;
                assert!(plan.contains("GpuFilterExec"), "`{predicate}`: {plan}");
            }
            let sql = format!("SELECT s, a FROM t WHERE {predicate} LIMIT 5");
            let got = gpu.collect(&sql).await.unwrap();
            let n: usize = got.iter().map(RecordBatch::num_rows).sum();
            assert_eq!(n, want.len().min(5), "LIMIT under `{predicate}`");
        }
    }
}

const PROJECTIONS: &[&str] = &[
    "a + 1, b * 2, f - 0.5, g * g",
    "m * m, m + 1.005, m - m, m * (1 - m)",
    "CAST(a AS BIGINT) * 3, CAST(t AS DOUBLE), CAST(u AS INT) + a",
    "a > 3 AS big, p AND a < 0 AS both, s, dt",
    "b + 9223372036854775807, t * t",
    "coalesce(b, a, 0), CASE WHEN p THEN a END, CASE WHEN f > 0 THEN m ELSE -m END",
    "extract(year FROM dt), extract(month FROM dt) * 100 + extract(day FROM dt)",
    "dt + INTERVAL '1 month', dt - INTERVAL '1 year 3 days', dt + INTERVAL '40 days'",
    "length(s), octet_length(s), CASE a WHEN 1 THEN b WHEN -1 THEN -b END, b / 7, b % 7",
    "CAST(m AS DECIMAL(6,1)) AS c1, CAST(m AS SMALLINT) AS c2, CAST(a AS TINYINT) AS c3, \
     CAST(m AS DECIMAL(20,5)) AS c4",
    "CAST(a * 0.5 AS INT) AS c1, CAST(m * 3 AS BIGINT) AS c2",
    "m / (m * m + 1) AS q1, m % 0.7 AS q2, m / 3 AS q3, a / 2.5 AS q4, m / -0.03 AS q5",
    "abs(a), abs(CAST(t AS INT)), abs(f), abs(g), abs(m), abs(u), abs(-m)",
    "round(f, 2), round(f), round(g, 1), round(m, 1), round(m), round(a, 2), round(f * 1e300, -2)",
    "a & 3, b | 5, b << 3, a >> 2, t << 9, u & 255, a >> -1, b << 70",
    "s || 'x', s || '-' || s, CASE WHEN a > 0 THEN s ELSE '' END || ','",
    "CASE f WHEN 0 THEN 'zero' WHEN 1.5 THEN 'x' ELSE 'other' END, CASE g WHEN -0.0 THEN 1 END",
    "floor(f), ceil(f), floor(g), ceil(g * 2.5), nullif(a, 3), nullif(s, 'abc'), \
     nullif(f, -0.0), nullif(m, 1.50), nullif(dt, DATE '1994-09-02')",
    "btrim(s), btrim(s, 'xz'), ltrim(s, 'x'), rtrim(s, 'zA'), starts_with(s, 'xyzx'), \
     ends_with(s, 'yz'), starts_with(s, s), length(btrim(s, 'xyz'))",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_over_gpu_filters_match_the_cpu() {
    for (seed, rows_in_table, batch_size) in
        [(7u64, 2500usize, 8192usize), (8, 300, 7), (9, 0, 8192)]
    {
        let data = table(rows_in_table, seed);
        // One partition: a round-robin repartition between the filter and the projection would
        // send the data through the host (see the offload rule's ping-pong check).
        let gpu = engine_with(Backend::Emulated, batch_size, 1);
        let cpu = engine_with(Backend::Cpu, batch_size, 1);
        gpu.register_batches("t", data.clone()).unwrap();
        cpu.register_batches("t", data).unwrap();
        // Filters keeping most rows, some, and all: the projection is fused with the filter
        // (it reads the kept rows through their indices, or all rows without them).
        for filter in ["a IS NULL OR a > -15", "a > 5", "true"] {
            for projection in PROJECTIONS {
                let sql = format!("SELECT {projection} FROM t WHERE {filter}");
                let want = rows(&cpu.collect(&sql).await.unwrap());
                let got = rows(&gpu.collect(&sql).await.unwrap());
                assert_eq!(
                    got, want,
                    "`{projection}` WHERE {filter} seed={seed} batch_size={batch_size}"
                );
                if filter != "true" {
                    let plan = explain(&gpu, &sql).await;
                    assert!(plan.contains("GpuProjectionExec"), "{plan}");
                    assert!(plan.contains("fused_with_filter=true"), "{plan}");
                }
            }
        }
    }
}

const ORDERS: &[&str] = &[
    "a",
    "a DESC",
    "a NULLS FIRST, b DESC NULLS LAST",
    "f",
    "f DESC NULLS FIRST",
    "g, dt DESC",
    "b, a, f",
    "dt NULLS FIRST",
    "m DESC, t",
    "u NULLS FIRST, m",
    "s",
    "s DESC NULLS FIRST, a",
    "p, s NULLS FIRST",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorts_match_the_cpu_order() {
    for (seed, rows_in_table, batch_size) in [
        (11u64, 3000usize, 8192usize),
        (12, 400, 7),
        (13, 1, 8192),
        (14, 0, 8192),
    ] {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, 2);
        for order in ORDERS {
            let keys: Vec<&str> = order
                .split(',')
                .map(|k| k.split_whitespace().next().unwrap())
                .collect();
            // The key columns alone fix the order exactly (ties have equal keys).
            let sql = format!("SELECT {} FROM t ORDER BY {order}", keys.join(", "));
            let want = ordered(&cpu.collect(&sql).await.unwrap());
            let got = ordered(&gpu.collect(&sql).await.unwrap());
            assert_eq!(
                got, want,
                "ORDER BY {order} seed={seed} batch_size={batch_size}"
            );
            // Whole rows come along with their keys.
            let sql = format!("SELECT * FROM t ORDER BY {order}");
            let got = rows(&gpu.collect(&sql).await.unwrap());
            assert_eq!(
                got,
                rows(&cpu.collect(&sql).await.unwrap()),
                "rows of ORDER BY {order}"
            );
            // Top-k.
            let sql = format!("SELECT {} FROM t ORDER BY {order} LIMIT 7", keys.join(", "));
            let want = ordered(&cpu.collect(&sql).await.unwrap());
            assert_eq!(
                ordered(&gpu.collect(&sql).await.unwrap()),
                want,
                "top-k {order}"
            );
        }
        let plan = explain(&gpu, "SELECT a FROM t ORDER BY a DESC, f").await;
        assert!(plan.contains("GpuSortExec"), "{plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorts_by_expressions_match_the_cpu_order() {
    // Each ORDER BY is followed by the selected columns, which fix the order of the rows the
    // expression ties.
    const QUERIES: [&str; 5] = [
        "SELECT a, t FROM t ORDER BY a - t, a, t",
        "SELECT a, t FROM t ORDER BY a - t DESC NULLS LAST, a, t LIMIT 7",
        "SELECT a, s FROM t ORDER BY CASE WHEN a > 0 THEN s END NULLS FIRST, a, s",
        "SELECT f FROM t ORDER BY f * 2 DESC, f LIMIT 11",
        "SELECT m, b FROM t ORDER BY m + 1, b",
    ];
    for (seed, rows_in_table, batch_size) in
        [(21u64, 3000usize, 8192usize), (22, 300, 7), (23, 0, 8192)]
    {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, 2);
        for sql in QUERIES {
            let want = ordered(&cpu.collect(sql).await.unwrap());
            let got = ordered(&gpu.collect(sql).await.unwrap());
            assert_eq!(got, want, "{sql} seed={seed} batch_size={batch_size}");
            let plan = explain(&gpu, sql).await;
            assert!(
                plan.contains("GpuSortExec") && !plan.contains(" SortExec"),
                "{sql}: {plan}"
            );
        }
    }
}

async fn explain(engine: &Engine, sql: &str) -> String {
    let batches = engine.collect(&format!("EXPLAIN {sql}")).await.unwrap();
    rows(&batches).join("\n")
}

/// Where the operators of `sql`'s physical plan run.
async fn placement(engine: &Engine, sql: &str) -> spate::placement::Placement {
    let physical = engine
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    spate::placement::placement(&physical)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_gpu_filters_and_the_cpu_keeps_the_rest() {
    let gpu = engine(Backend::Emulated, 8192);
    gpu.register_batches("t", table(100, 5)).unwrap();
    let plan = explain(&gpu, "SELECT a FROM t WHERE a > 1 AND f < 2.0").await;
    assert!(
        plan.contains("GpuFilterExec: a@0 > 1 AND f@1 < 2"),
        "{plan}"
    );
    let plan = explain(
        &gpu,
        "SELECT a FROM t WHERE s LIKE 'x%z' OR s IN ('a', 'b')",
    )
    .await;
    assert!(plan.contains("GpuFilterExec"), "{plan}");
    // Every physical node says where it runs, and CPU nodes say why.
    let plan = explain(&gpu, "SELECT sum(a) FROM t WHERE a > 1").await;
    let physical: Vec<&str> = plan
        .lines()
        .skip_while(|l| !l.starts_with("physical_plan"))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        physical
            .iter()
            .all(|l| l.contains("  [GPU]") || l.contains("  [CPU: ")),
        "{plan}"
    );
    assert!(
        plan.contains("GpuFilterExec") && plan.contains("[GPU]"),
        "{plan}"
    );
    assert!(plan.contains("GpuAggregateExec: mode="), "{plan}");
    // One GPU partition per device: the aggregation is one single-stage GPU operator, with no
    // exchange around it.
    let sql = "SELECT s, count(*) FROM t GROUP BY s";
    let plan = explain(&gpu, sql).await;
    assert!(
        plan.contains("GpuAggregateExec: mode=Single") && !plan.contains("RepartitionExec"),
        "{plan}"
    );
    let placed = placement(&gpu, sql).await;
    assert!(placed.fully_on_device(), "{placed:?}");
    // With DataFusion's CPU partitions kept, a repartition between two GPU aggregates moves
    // their data through the host: it says so, and the plan is fully on the GPU (no CPU
    // compute) but not fully on the device.
    let gpu = Engine::builder()
        .backend(Backend::Emulated)
        .target_partitions(2)
        .option("spate.gpu.one_partition", "false")
        .build()
        .unwrap();
    gpu.register_batches("t", table(100, 5)).unwrap();
    let plan = explain(&gpu, sql).await;
    let repartition = plan
        .lines()
        .find(|l| l.contains("RepartitionExec: partitioning=Hash"))
        .unwrap_or_else(|| panic!("no hash repartition in\n{plan}"));
    assert!(
        repartition.contains(
            "[CPU: host exchange: a GPU operator's output is downloaded and moved on the host]"
        ),
        "{plan}"
    );
    let placed = placement(&gpu, sql).await;
    assert!(placed.fully_on_gpu(), "{placed:?}");
    assert!(!placed.fully_on_device(), "{placed:?}");
    assert!(
        placed.host_exchanges.iter().any(|n| n == "RepartitionExec"),
        "{placed:?}"
    );
    // nth_value has no GPU version yet.
    let plan = explain(&gpu, "SELECT a, nth_value(a, 2) OVER (ORDER BY a) FROM t").await;
    assert!(
        plan.contains("[CPU: window function `nth_value` does not run on the GPU yet]"),
        "{plan}"
    );
    let plan = explain(&gpu, "SELECT a FROM t WHERE cos(a) = 1").await;
    assert!(
        plan.contains("[CPU: expression `cos(CAST(a@0 AS Float64))` is not supported"),
        "{plan}"
    );
    // cos() is not supported yet: the filter stays on the CPU.
    let plan = explain(&gpu, "SELECT a FROM t WHERE cos(a) = 1").await;
    assert!(
        plan.contains("FilterExec") && !plan.contains("GpuFilterExec"),
        "{plan}"
    );
    let cpu = engine(Backend::Cpu, 8192);
    cpu.register_batches("t", table(100, 5)).unwrap();
    let plan = explain(&cpu, "SELECT a FROM t WHERE a > 1").await;
    assert!(!plan.contains("Gpu"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_policy_decides_what_happens_to_cpu_operators() {
    let gpu = engine(Backend::Emulated, 8192);
    gpu.register_batches("t", table(100, 6)).unwrap();
    let context = gpu.gpu().unwrap();

    let before = context.fallbacks();
    gpu.collect("SELECT a, nth_value(a, 2) OVER (ORDER BY a) FROM t")
        .await
        .unwrap();
    assert!(
        context.fallbacks() > before,
        "window functions are counted as fallbacks"
    );
    let before = context.fallbacks();
    gpu.collect("SELECT a, sum(b) FROM t WHERE a > 0 GROUP BY a ORDER BY a")
        .await
        .unwrap();
    assert_eq!(
        context.fallbacks(),
        before,
        "a filter, aggregation and sort run fully on the GPU"
    );

    gpu.collect("SET spate.gpu.fallback = 'warn'")
        .await
        .unwrap();
    gpu.collect("SELECT a FROM t WHERE cos(a) = 1")
        .await
        .unwrap();

    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    let err = gpu
        .collect("SELECT a FROM t WHERE cos(a) = 1")
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("FilterExec cannot run on the GPU"),
        "{message}"
    );
    assert!(
        message.contains("is not supported on the GPU yet"),
        "{message}"
    );
    assert!(matches!(err, SpateError::Unsupported { .. }), "{err:?}");
    let err = gpu
        .collect("SELECT a, nth_value(a, 2) OVER (ORDER BY a) FROM t")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot run on the GPU"), "{err}");
    let err = gpu
        .collect("SELECT a, max(f) FROM t GROUP BY a")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("depends on row order"), "{err}");
    // Fully supported plans still run.
    let ok = gpu.collect("SELECT a FROM t WHERE a > 10").await.unwrap();
    assert!(ok.iter().map(RecordBatch::num_rows).sum::<usize>() > 0);

    let bad = gpu
        .collect("SET spate.gpu.fallback = 'sometimes'")
        .await
        .unwrap_err();
    assert!(
        bad.to_string().contains("expected one of cpu, warn, error"),
        "{bad}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_fields_match_the_cpu_over_a_wide_range_of_dates() {
    let mut r = Rng::new(77);
    let days: Vec<Option<i32>> = (0..5000)
        .map(|k| match k % 50 {
            0 => None,
            1 => Some(-719_162), // 0001-01-01
            2 => Some(0),
            3 => Some(-1),
            4 => Some(11_016), // 2000-02-29
            // Past chrono's years -262143 to 262142 a date part is NULL.
            5 => Some(95_026_236),
            6 => Some(95_026_237),
            7 => Some(-96_465_292),
            8 => Some(-96_465_293),
            _ => Some(r.below(1_600_000) as i32 - 800_000),
        })
        .collect();
    // Timestamps in every unit, as far from 1970 as the dates (seconds), and their units' edges
    // (a second before the epoch, a unit before midnight).
    let seconds: Vec<Option<i64>> = days
        .iter()
        .enumerate()
        .map(|(k, d)| match k % 50 {
            5 => Some(-1),
            6 => Some(86_399),
            _ => d.map(|d| i64::from(d) * 86_400 + r.below(86_400) as i64),
        })
        .collect();
    let scaled = |per: i64| -> Vec<Option<i64>> {
        seconds
            .iter()
            .map(|s| s.map(|s| s * per + (s.rem_euclid(997)) * per / 1000))
            .collect()
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("d", DataType::Date32, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Second, None), true),
        Field::new("tm", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("tu", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("tn", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Date32Array::from(days)) as ArrayRef,
            Arc::new(TimestampSecondArray::from(seconds.clone())),
            Arc::new(TimestampMillisecondArray::from(scaled(1_000))),
            Arc::new(TimestampMicrosecondArray::from(scaled(1_000_000))),
            // Nanoseconds reach only about ±292 years from 1970.
            Arc::new(TimestampNanosecondArray::from(
                seconds
                    .iter()
                    .map(|s| {
                        s.map(|s| (s % (200 * 365 * 86_400)) * 1_000_000_000 + s.rem_euclid(7))
                    })
                    .collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap();
    let gpu = engine_with(Backend::Emulated, 8192, 1);
    let cpu = engine_with(Backend::Cpu, 8192, 1);
    gpu.register_batches("dates", vec![batch.clone()]).unwrap();
    cpu.register_batches("dates", vec![batch]).unwrap();
    let fields = [
        "year", "quarter", "month", "week", "day", "doy", "dow", "isodow",
    ];
    let time_fields = ["hour", "minute", "second"];
    let mut columns = vec!["d".to_string()];
    for f in fields {
        columns.push(format!("date_part('{f}', d)"));
    }
    for t in ["ts", "tm", "tu", "tn"] {
        for f in fields.iter().chain(&time_fields) {
            columns.push(format!("date_part('{f}', {t})"));
        }
    }
    let sql = format!(
        "SELECT {} FROM dates WHERE d IS NULL OR d > -100000000",
        columns.join(", ")
    );
    assert_eq!(
        rows(&gpu.collect(&sql).await.unwrap()),
        rows(&cpu.collect(&sql).await.unwrap())
    );
    let plan = explain(&gpu, &sql).await;
    assert!(plan.contains("GpuProjectionExec"), "{plan}");
    // A time of day on a date stays on the CPU.
    let plan = explain(&gpu, "SELECT date_part('hour', d) FROM dates WHERE d > 0").await;
    assert!(plan.contains("is not supported on the GPU"), "{plan}");
}

/// Float math functions, over NaN, ±0, ±inf, negatives and integers cast to Float64, equal
/// within 1e-9 relative (1e-6 on Float32): the emulator calls the host's libm, and Rust's own cbrt (and a GPU's
/// ln, exp and pow) may differ in the last place. DataFusion's sqrt fails on a negative number
/// and power on zero to a negative power; both fail alike on the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn float_math_matches_the_cpu() {
    let (gpu, cpu) = engines_over(table(800, 91), 8192, 1);
    for column in ["f", "g"] {
        let sql = format!(
            "SELECT {column}, cbrt({column}), ln({column}), log10({column}), log2({column}), \
             log({column}), exp({column}), signum({column}), trunc({column}), \
             sqrt(abs({column})) FROM t WHERE a IS NULL OR a > -100"
        );
        let (got, want) = (
            rows(&gpu.collect(&sql).await.unwrap()),
            rows(&cpu.collect(&sql).await.unwrap()),
        );
        assert_eq!(got.len(), want.len(), "{sql}");
        // Float32 results within 1e-6 (a few units in its last place), Float64 within 1e-9.
        let tolerance = if column == "g" { 1e-6 } else { 1e-9 };
        for (g, w) in got.iter().zip(&want) {
            assert!(cells_within(g, w, tolerance), "{sql}: {g} vs {w}");
        }
        let plan = explain(&gpu, &sql).await;
        assert!(plan.contains("GpuProjectionExec"), "{plan}");
        assert!(!plan.contains("not supported"), "{plan}");
    }
    for sql in [
        // Integers are cast to Float64 first.
        "SELECT a, sqrt(a), power(a, 3), exp(b) FROM t WHERE a > 0",
        "SELECT f, power(f, 0.5), power(abs(f) + 1, f) FROM t WHERE a > -100",
        // Failing where a negative number (or zero to a negative power) is evaluated.
        "SELECT sqrt(f) FROM t WHERE a > -100",
        "SELECT power(f, -1.0) FROM t WHERE a > -100",
        "SELECT CASE WHEN f >= 0 THEN sqrt(f) END FROM t WHERE a > -100",
    ] {
        assert_same_outcome(&cpu, &gpu, sql).await;
        let plan = explain(&gpu, sql).await;
        assert!(!plan.contains("not supported"), "{sql}\n{plan}");
    }
}

const GROUP_KEYS: &[&str] = &[
    "",
    "a",
    "p",
    "s",
    "a, s",
    "dt, t",
    "f",
    "g, p",
    "m",
    "u",
    "b",
    "t * 2",
    "a, b, f",
    // Computed string keys.
    "substr(s, 1, 2)",
    "s || 'x', t",
];

/// Every aggregate the GPU runs. The float columns hold small multiples of 1/16 (plus NaN,
/// ±0.0 and ±inf), so their sums are exact in any order and compare as text.
const AGGREGATES: &str = "count(*), count(a), count(s), count(p), sum(a), sum(b), sum(m), \
     sum(f), sum(g), sum(t), sum(u), min(a), max(b), min(dt), max(dt), min(m), max(m), min(t), \
     max(u), avg(f), avg(m), avg(a), avg(u), sum(a * 2 + t), min(p), max(p), bool_and(p), \
     bool_or(p), bool_and(a > 0)";

/// Float MIN/MAX run on the GPU only without GROUP BY (see `GpuAggregateExec`).
const FLOAT_MIN_MAX: &str = "min(f), max(f), min(g), max(g)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variance_and_stddev_match_the_cpu() {
    // The GPU computes m2 in two passes, DataFusion by Welford's updates: equal up to
    // rounding, so floats compare within 1e-9 relative.
    const QUERIES: [&str; 4] = [
        "SELECT a, stddev(g), var(m), stddev_pop(t), var_pop(u), count(*) FROM t GROUP BY a",
        "SELECT stddev(a), var_pop(m), var(b) FROM t",
        "SELECT p, stddev(f), var_samp(a) FROM t WHERE a > 0 GROUP BY p",
        "SELECT s, stddev_samp(a), var_pop(a) FROM t GROUP BY s",
    ];
    for (seed, rows_in_table, batch_size, partitions) in [
        (51u64, 3000usize, 8192usize, 2usize),
        (52, 400, 7, 2),
        (53, 1, 8192, 1),
        (54, 0, 8192, 2),
    ] {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, partitions);
        for sql in QUERIES {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(
                &gpu.collect(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql} seed={seed}: {e}")),
            );
            assert_eq!(got.len(), want.len(), "{sql} seed={seed}");
            for (g, w) in got.iter().zip(&want) {
                assert!(cells_close(g, w), "{sql} seed={seed}: {g} vs {w}");
            }
            let plan = explain(&gpu, sql).await;
            assert!(plan.contains("GpuAggregateExec"), "{plan}");
            assert!(!plan.contains("  AggregateExec"), "{sql}: {plan}");
        }
    }
}

/// Whether two rows (`|`-separated cells) are equal, floats within 1e-9 relative.
fn cells_close(a: &str, b: &str) -> bool {
    cells_within(a, b, 1e-9)
}

/// Whether two rows (`|`-separated cells) are equal, floats within `tolerance` relative.
fn cells_within(a: &str, b: &str, tolerance: f64) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('|').collect(), b.split('|').collect());
    a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| {
            x == y
                || match (x.parse::<f64>(), y.parse::<f64>()) {
                    (Ok(x), Ok(y)) => (x - y).abs() <= tolerance * x.abs().max(y.abs()),
                    _ => false,
                }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_functions_match_the_cpu() {
    // Each query selects the partition and ORDER BY keys, which fix every value a tie could
    // move (two tied rows swap only identical output rows).
    const QUERIES: [&str; 23] = [
        "SELECT a, b, row_number() OVER (PARTITION BY a ORDER BY b) FROM t",
        // Running aggregates: ROWS frames, and RANGE frames whose peers share a value.
        "SELECT a, b, sum(b) OVER (PARTITION BY a ORDER BY b \
         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) FROM t",
        "SELECT a, m, sum(m) OVER (PARTITION BY a ORDER BY m), count(*) OVER (PARTITION BY a ORDER BY m), \
         max(dt) OVER (PARTITION BY a ORDER BY m), min(t) OVER (PARTITION BY a ORDER BY m) FROM t",
        "SELECT s, t, count(t) OVER (PARTITION BY s ORDER BY t ROWS UNBOUNDED PRECEDING), \
         max(u) OVER (PARTITION BY s ORDER BY t NULLS FIRST) FROM t",
        "SELECT g, f, sum(f) OVER (PARTITION BY g ORDER BY f ROWS UNBOUNDED PRECEDING) FROM t",
        // Sliding ROWS frames (pandas' rolling): integer, decimal and float sums, counts,
        // minima and maxima; a float sum adds and subtracts as DataFusion does, so even an
        // infinity leaving the frame gives the same NaN.
        "SELECT a, b, sum(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 2 PRECEDING AND \
         CURRENT ROW), count(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 2 PRECEDING AND \
         CURRENT ROW), min(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 2 PRECEDING AND \
         CURRENT ROW), max(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 2 PRECEDING AND \
         CURRENT ROW) FROM t",
        "SELECT b, f, sum(f) OVER (ORDER BY b, f ROWS BETWEEN 4 PRECEDING AND CURRENT ROW), \
         count(*) OVER (ORDER BY b, f ROWS BETWEEN 4 PRECEDING AND CURRENT ROW), sum(f) OVER \
         (ORDER BY b, f ROWS UNBOUNDED PRECEDING) FROM t",
        "SELECT a, m, sum(m) OVER (PARTITION BY a ORDER BY m ROWS BETWEEN 3 PRECEDING AND \
         CURRENT ROW), min(dt) OVER (PARTITION BY a ORDER BY m, dt ROWS BETWEEN 3 PRECEDING AND \
         CURRENT ROW) FROM t",
        "SELECT a, b, sum(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 0 PRECEDING AND \
         CURRENT ROW), sum(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 700 PRECEDING AND \
         CURRENT ROW) FROM t",
        // Keys that are expressions.
        "SELECT a % 3, b, rank() OVER (PARTITION BY a % 3 ORDER BY b * 2) FROM t",
        // GROUPS frames end at the current row's last peer.
        "SELECT a, b, sum(b) OVER (PARTITION BY a ORDER BY b \
         GROUPS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) FROM t",
        "SELECT s, f, rank() OVER (PARTITION BY s ORDER BY f DESC), \
         dense_rank() OVER (PARTITION BY s ORDER BY f DESC) FROM t",
        "SELECT a, m, dt, sum(m) OVER (PARTITION BY a), count(*) OVER (PARTITION BY a), \
         avg(a) OVER (PARTITION BY a), min(dt) OVER (PARTITION BY a) FROM t",
        "SELECT a, rank() OVER (ORDER BY a NULLS FIRST), row_number() OVER (ORDER BY a NULLS FIRST) FROM t",
        "SELECT t, u, max(u) OVER (), count(a) OVER () FROM t",
        "SELECT a, b, sum(b) OVER (PARTITION BY a ORDER BY b \
         ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM t",
        "SELECT g, dt, dense_rank() OVER (PARTITION BY g ORDER BY dt), sum(u) OVER (PARTITION BY g) FROM t",
        // Booleans over a whole partition (bits out of the aggregation).
        "SELECT a, p, bool_and(p) OVER (PARTITION BY a), max(p) OVER (PARTITION BY a) FROM t",
        // lag and lead: NULL past the partition's edges, any type.
        "SELECT a, b, lag(b) OVER (PARTITION BY a ORDER BY b), lead(b, 2) OVER (PARTITION BY a \
         ORDER BY b), lag(b, 0) OVER (PARTITION BY a ORDER BY b) FROM t",
        "SELECT a, b, s, lag(s) OVER (PARTITION BY a ORDER BY b, s), \
         lead(s, 1, NULL) OVER (PARTITION BY a ORDER BY b, s) FROM t",
        "SELECT m, lag(m, 3) OVER (ORDER BY m), lead(m, 5) OVER (ORDER BY m) FROM t",
        // Distribution functions; tied rows differ in no selected column.
        "SELECT a, b, percent_rank() OVER (PARTITION BY a ORDER BY b), cume_dist() OVER \
         (PARTITION BY a ORDER BY b), ntile(3) OVER (PARTITION BY a ORDER BY b), ntile(100) \
         OVER (PARTITION BY a ORDER BY b) FROM t",
        // First and last values at the frame's edges.
        "SELECT a, b, s, first_value(b) OVER (PARTITION BY a ORDER BY b), last_value(b) OVER \
         (PARTITION BY a ORDER BY b), last_value(b) OVER (PARTITION BY a ORDER BY b ROWS \
         BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW), last_value(s) OVER (PARTITION BY a ORDER \
         BY b, s ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING), first_value(s) \
         OVER (PARTITION BY a ORDER BY b, s) FROM t",
    ];
    for (seed, rows_in_table, batch_size, partitions) in [
        (61u64, 3000usize, 8192usize, 2usize),
        (62, 400, 7, 1),
        (63, 1, 8192, 2),
        (64, 0, 8192, 2),
    ] {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, partitions);
        for sql in QUERIES {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(
                &gpu.collect(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql} seed={seed}: {e}")),
            );
            assert_eq!(got, want, "{sql} seed={seed} rows={rows_in_table}");
            let plan = explain(&gpu, sql).await;
            assert!(
                !plan.contains(" WindowAggExec") && !plan.contains(" BoundedWindowAggExec"),
                "{sql}: {plan}"
            );
            let placed = placement(&gpu, sql).await;
            assert!(
                placed.gpu.iter().any(|n| n == "GpuWindowExec") && placed.cpu.is_empty(),
                "{sql}: {placed:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_functions_the_gpu_cannot_match_stay_on_the_cpu() {
    let (gpu, cpu) = engines_over(table(500, 65), 8192, 1);
    for (sql, reason) in [
        (
            "SELECT a, sum(b) FILTER (WHERE b > 0) OVER (PARTITION BY a) FROM t",
            "FILTER",
        ),
        (
            "SELECT a, count(DISTINCT b) OVER (PARTITION BY a) FROM t",
            "DISTINCT window aggregate",
        ),
        (
            "SELECT a, sum(b) OVER (PARTITION BY a ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) \
             FROM t",
            "without ORDER BY",
        ),
        (
            "SELECT a, nth_value(a, 2) OVER (ORDER BY a) FROM t",
            "`nth_value`",
        ),
        (
            "SELECT a, first_value(b) OVER (PARTITION BY a) FROM t",
            "without ORDER BY",
        ),
        // Empty frames for the first rows: DataFusion's value is NULL there.
        (
            "SELECT a, b, first_value(b) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN \
             UNBOUNDED PRECEDING AND 1 PRECEDING) FROM t",
            "this frame",
        ),
        (
            "SELECT a, lag(a, 1, 0) OVER (ORDER BY a) FROM t",
            "a default value",
        ),
        (
            "SELECT a, sum(b) OVER (ORDER BY a RANGE BETWEEN 2 PRECEDING AND CURRENT ROW) FROM t",
            "sliding RANGE",
        ),
        (
            "SELECT a, b, sum(b) OVER (ORDER BY a, b ROWS BETWEEN 2 PRECEDING AND 1 FOLLOWING) \
             FROM t",
            "this frame does not run on the GPU yet",
        ),
        (
            "SELECT a, b, sum(b) OVER (ORDER BY a, b ROWS BETWEEN 100000 PRECEDING AND CURRENT \
             ROW) FROM t",
            "run on the CPU",
        ),
        (
            "SELECT a, b, lead(b) IGNORE NULLS OVER (ORDER BY a, b) FROM t",
            "IGNORE NULLS",
        ),
    ] {
        let placed = placement(&gpu, sql).await;
        assert!(
            placed.cpu.iter().any(|(_, why)| why.contains(reason)),
            "{sql}: {placed:?}"
        );
    }
    for sql in [
        "SELECT a, sum(b) FILTER (WHERE b > 0) OVER (PARTITION BY a) FROM t",
        "SELECT a, count(DISTINCT b) OVER (PARTITION BY a) FROM t",
    ] {
        let want = rows(&cpu.collect(sql).await.unwrap());
        assert_eq!(rows(&gpu.collect(sql).await.unwrap()), want, "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouping_sets_match_the_cpu() {
    const QUERIES: [&str; 6] = [
        "SELECT a, p, sum(b), count(*), min(m) FROM t GROUP BY ROLLUP(a, p)",
        "SELECT s, t, count(a), avg(f) FROM t GROUP BY CUBE(s, t)",
        "SELECT a, p, dt, sum(m) FROM t GROUP BY GROUPING SETS ((a), (p, dt), ())",
        "SELECT a, count(*) FROM t GROUP BY GROUPING SETS ((a), (a), ())",
        "SELECT a, p, grouping(a), grouping(p), sum(b) FROM t GROUP BY ROLLUP(a, p)",
        "SELECT substr(s, 1, 1) AS k, t, max(a) FROM t GROUP BY ROLLUP(substr(s, 1, 1), t)",
    ];
    for (seed, rows_in_table, batch_size, partitions) in [
        (41u64, 2000usize, 8192usize, 2usize),
        (42, 300, 7, 1),
        (43, 0, 8192, 2),
    ] {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, partitions);
        for sql in QUERIES {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(
                &gpu.collect(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql} seed={seed}: {e}")),
            );
            assert_eq!(got, want, "{sql} seed={seed} rows={rows_in_table}");
            let plan = explain(&gpu, sql).await;
            assert!(plan.contains("GpuAggregateExec"), "{plan}");
            assert!(!plan.contains("  AggregateExec"), "{sql}: {plan}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregations_match_the_cpu() {
    for (seed, rows_in_table, batch_size, partitions) in [
        (21u64, 3000usize, 8192usize, 2usize),
        (22, 500, 7, 2),
        (23, 80, 1, 1),
        (24, 1, 8192, 2),
        (25, 0, 8192, 2),
        (26, 2500, 8192, 1),
    ] {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, partitions);
        for keys in GROUP_KEYS {
            let sql = if keys.is_empty() {
                format!("SELECT {AGGREGATES}, {FLOAT_MIN_MAX} FROM t")
            } else {
                format!("SELECT {keys}, {AGGREGATES} FROM t GROUP BY {keys}")
            };
            let want = rows(&cpu.collect(&sql).await.unwrap());
            let got = rows(
                &gpu.collect(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql} seed={seed}: {e}")),
            );
            assert_eq!(
                got, want,
                "GROUP BY [{keys}] seed={seed} rows={rows_in_table} batch_size={batch_size}"
            );
            let plan = explain(&gpu, &sql).await;
            assert!(plan.contains("GpuAggregateExec"), "{plan}");
            assert!(!plan.contains("  AggregateExec"), "{plan}");
        }
        // A GROUP BY without aggregates (SELECT DISTINCT), and filters under an aggregate.
        for sql in [
            "SELECT DISTINCT s, p FROM t",
            "SELECT a, count(*) FROM t WHERE f > 0 GROUP BY a",
            "SELECT sum(m * m), avg(m) FROM t WHERE m > 0",
        ] {
            let want = rows(&cpu.collect(sql).await.unwrap());
            assert_eq!(rows(&gpu.collect(sql).await.unwrap()), want, "{sql}");
        }
        // FILTER (WHERE …) on aggregates: only the rows where it is TRUE count (a NULL
        // predicate drops the row), in both phases and through the second pass.
        for sql in [
            "SELECT a, count(*) FILTER (WHERE b > 0), sum(m) FILTER (WHERE p), \
             avg(f) FILTER (WHERE s = 'xyz'), min(b) FILTER (WHERE a > 5), \
             var_pop(f) FILTER (WHERE f > 0), max(m) FILTER (WHERE m < 0), count(s) \
             FROM t GROUP BY a",
            "SELECT count(*) FILTER (WHERE p IS NULL), sum(b) FILTER (WHERE false), \
             bool_or(p) FILTER (WHERE a < 0) FROM t",
            "SELECT a, p, sum(b) FILTER (WHERE b > 0), count(*) FILTER (WHERE f < 0) FROM t \
             GROUP BY ROLLUP(a, p)",
        ] {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(&gpu.collect(sql).await.unwrap());
            assert_eq!(got.len(), want.len(), "{sql} seed={seed}");
            // var_pop sums in another order on the GPU: equal within 1e-9.
            for (g, w) in got.iter().zip(&want) {
                assert!(cells_close(g, w), "{sql} seed={seed}: {g} vs {w}");
            }
            let plan = explain(&gpu, sql).await;
            assert!(plan.contains("GpuAggregateExec"), "{plan}");
            assert!(!plan.contains("  AggregateExec"), "{plan}");
        }
        // A GROUP BY with a pushed-down LIMIT keeps any k groups.
        let all = rows(&cpu.collect("SELECT DISTINCT a FROM t").await.unwrap());
        let sql = "SELECT DISTINCT a FROM t LIMIT 5";
        let mut got = rows(&gpu.collect(sql).await.unwrap());
        assert_eq!(got.len(), all.len().min(5), "{sql}");
        assert!(got.iter().all(|r| all.contains(r)), "{sql}: {got:?}");
        got.dedup();
        assert_eq!(got.len(), all.len().min(5), "{sql}: {got:?}");
        let plan = explain(&gpu, sql).await;
        assert!(
            plan.contains("GpuAggregateExec") && !plan.contains("  AggregateExec"),
            "{plan}"
        );
        // DataFusion's grouped float MIN/MAX depends on row order (NaN, -0.0): CPU, said why.
        let plan = explain(&gpu, "SELECT a, max(f) FROM t GROUP BY a").await;
        assert!(plan.contains("depends on row order"), "{plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_division_errors_match_the_cpu() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int32, true),
    ]));
    let gpu = engine(Backend::Emulated, 8192);
    let cpu = engine(Backend::Cpu, 8192);
    for (name, a, b) in [
        (
            "fine",
            vec![Some(7), None, Some(-9)],
            vec![Some(2), Some(0), Some(-3)],
        ),
        ("zero", vec![Some(7), Some(1)], vec![Some(2), Some(0)]),
        (
            "min",
            vec![Some(i32::MIN), Some(1)],
            vec![Some(-1), Some(1)],
        ),
    ] {
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int32Array::from(a)) as ArrayRef,
                Arc::new(Int32Array::from(b)) as ArrayRef,
            ],
        )
        .unwrap();
        gpu.register_batches(name, vec![batch.clone()]).unwrap();
        cpu.register_batches(name, vec![batch]).unwrap();
        for sql in [
            format!("SELECT a FROM {name} WHERE a / b <> 0"),
            format!("SELECT a FROM {name} WHERE a % b = 0"),
            // Branches the CPU skips for a row never fail it.
            format!("SELECT a FROM {name} WHERE CASE WHEN b = 0 THEN 0 ELSE a % b END = 1"),
            // A WHEN that rules zero out makes the division infallible, so it may sit on the
            // right of AND.
            format!("SELECT a FROM {name} WHERE a > 0 AND CASE WHEN b > 0 THEN a / b END >= 1"),
            format!("SELECT a FROM {name} WHERE a > 0 OR CASE WHEN 0 <> b THEN a % b END = 1"),
            format!("SELECT sum(a / b) FROM {name}"),
        ] {
            let plan = explain(&gpu, &sql).await;
            assert!(
                plan.contains("GpuFilterExec") || plan.contains("GpuAggregateExec"),
                "{plan}"
            );
            assert_same_outcome(&cpu, &gpu, &sql).await;
        }
    }
    // Under a LIMIT the CPU may never evaluate the rows that would fail: CPU, said why.
    let plan = explain(&gpu, "SELECT a FROM fine WHERE a / b <> 0 LIMIT 1").await;
    assert!(plan.contains("under a LIMIT"), "{plan}");
}

/// Runs `sql` on both engines: the same rows (in any order), or errors of the same kind.
async fn assert_same_outcome(cpu: &Engine, gpu: &Engine, sql: &str) {
    match (cpu.collect(sql).await, gpu.collect(sql).await) {
        (Ok(want), Ok(got)) => assert_eq!(rows(&got), rows(&want), "{sql}"),
        (Err(want), Err(got)) => assert_eq!(
            error_kind(sql, &got),
            error_kind(sql, &want),
            "{sql}: {got} vs {want}"
        ),
        (want, got) => panic!("{sql}: the CPU gave {want:?}, the GPU {got:?}"),
    }
}

/// The kind of a query error, for comparing the GPU's with the CPU's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abs_of_the_smallest_integer_fails_on_the_gpu_as_on_the_cpu() {
    // Every 13th row's b is i64::MIN.
    let (gpu, cpu) = engines_over(table(500, 31), 8192, 1);
    for sql in [
        "SELECT abs(b) FROM t WHERE a IS NULL OR a > -15",
        "SELECT abs(b) FROM t WHERE b > 0",
    ] {
        let plan = explain(&gpu, sql).await;
        assert!(plan.contains("GpuProjectionExec"), "{plan}");
        assert_same_outcome(&cpu, &gpu, sql).await;
    }
    assert!(
        gpu.collect("SELECT abs(b) FROM t WHERE a IS NULL OR a > -15")
            .await
            .is_err()
    );
}

fn error_kind(sql: &str, e: &SpateError) -> &'static str {
    let m = e.to_string();
    for (needle, kind) in [
        ("Divide by zero error", "zero"),
        ("Arithmetic overflow", "overflow"),
        ("Cast error", "cast"),
        ("to store in a Decimal128", "precision"),
        ("overflow on abs", "abs"),
        ("square root of a negative number", "sqrt"),
        ("zero raised to a negative power", "power"),
    ] {
        if m.contains(needle) {
            return kind;
        }
    }
    panic!("{sql}: unexpected error {m}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn casts_fail_on_the_gpu_as_on_the_cpu() {
    // One partition: no repartition between the filter and the projection, so both run on
    // the GPU.
    let gpu = engine_with(Backend::Emulated, 8192, 1);
    let cpu = engine_with(Backend::Cpu, 8192, 1);
    for (name, values) in [
        (
            "fine",
            "(1, 7, 2.5, 1.25), (2, -3, -2.5, -2.75), (3, NULL, 0.45, 2.45), (4, 0, NULL, NULL)",
        ),
        ("wide", "(1, 3000000000, 1.0, 1.0)"),
        ("nan", "(1, 1, 'NaN'::DOUBLE, 1.0)"),
        ("huge", "(1, 1, 1e10, 1.0)"),
        ("big", "(1, 1, 1.0, 12345.67)"),
    ] {
        let create = format!(
            "CREATE TABLE {name} (i INT, b BIGINT, d DOUBLE, m DECIMAL(12,2)) AS VALUES {values}"
        );
        gpu.collect(&create).await.unwrap();
        cpu.collect(&create).await.unwrap();
        for sql in [
            format!("SELECT i FROM {name} WHERE CAST(b AS INT) >= 0"),
            format!("SELECT i FROM {name} WHERE CAST(d AS INT) >= 0"),
            format!("SELECT i FROM {name} WHERE CAST(m AS DECIMAL(4,1)) <> 0"),
            format!("SELECT i FROM {name} WHERE CAST(d AS DECIMAL(6,2)) <> 0"),
            format!(
                "SELECT i, CAST(m AS DECIMAL(5,1)) AS c1, CAST(m AS INT) AS c2, \
                 CAST(d AS SMALLINT) AS c3, CAST(b AS TINYINT UNSIGNED) AS c4, \
                 CAST(d AS DECIMAL(20,3)) AS c5, CAST(d * 1e20 AS DECIMAL(38,1)) AS c6 \
                 FROM {name} WHERE i > 0 AND b >= 0 AND b < 256"
            ),
        ] {
            let plan = explain(&gpu, &sql).await;
            assert!(plan.contains("GpuFilterExec"), "{plan}");
            assert!(
                !sql.contains("AS c1") || plan.contains("GpuProjectionExec"),
                "{plan}"
            );
            assert_same_outcome(&cpu, &gpu, &sql).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_overflow_fails_on_the_gpu_as_on_the_cpu() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Decimal128(38, 0), true),
        Field::new("b", DataType::Decimal128(38, 0), true),
    ]));
    let big = 10i128.pow(20);
    let batch = |a: Vec<Option<i128>>, b: Vec<Option<i128>>| {
        let column = |v: Vec<Option<i128>>| -> ArrayRef {
            Arc::new(
                Decimal128Array::from(v)
                    .with_precision_and_scale(38, 0)
                    .unwrap(),
            )
        };
        RecordBatch::try_new(Arc::clone(&schema), vec![column(a), column(b)]).unwrap()
    };
    // NULL rows never overflow, and products that fit i128 are exact.
    let fits = batch(
        vec![Some(3), None, Some(big), Some(-big)],
        vec![
            Some(-7),
            Some(10i128.pow(37)),
            Some(10i128.pow(17)),
            Some(-(10i128.pow(17) / 7)),
        ],
    );
    let overflows = batch(vec![Some(2), Some(big * 10)], vec![Some(5), Some(big * 10)]);
    let queries = [
        "SELECT a * b FROM t WHERE a <> 0",
        "SELECT a + b, a - b FROM t WHERE a <> 0",
        "SELECT a FROM t WHERE a * b > 0",
        "SELECT sum(a * b) FROM t",
    ];
    for (data, fails) in [(fits, false), (overflows, true)] {
        let gpu = engine(Backend::Emulated, 8192);
        let cpu = engine(Backend::Cpu, 8192);
        gpu.register_batches("t", vec![data.clone()]).unwrap();
        cpu.register_batches("t", vec![data]).unwrap();
        for sql in queries {
            let plan = explain(&gpu, sql).await;
            assert!(plan.contains("Gpu"), "{plan}");
            let want = cpu.collect(sql).await;
            let got = gpu.collect(sql).await;
            match (want, got) {
                (Ok(want), Ok(got)) => assert_eq!(rows(&got), rows(&want), "{sql}"),
                (Err(want), Err(got)) => {
                    assert!(fails, "{sql}: {got}");
                    assert!(want.to_string().contains("Arithmetic overflow"), "{want}");
                    assert!(
                        got.to_string().contains("Arithmetic overflow"),
                        "{sql}: {got}"
                    );
                }
                (want, got) => panic!("{sql}: the CPU gave {want:?}, the GPU {got:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregation_handles_many_groups_and_hot_groups() {
    // 200k rows: ~50k integer groups (hash collisions, the global-atomics path), ~1k string
    // groups, and 3 hot groups (the shared-memory path).
    let n = 200_000usize;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
        Field::new("h", DataType::Int32, true),
        Field::new("v", DataType::Int64, true),
        Field::new("m", DataType::Decimal128(15, 2), true),
    ]));
    let mut batches = Vec::new();
    for start in (0..n).step_by(65_536) {
        let rows = (start..n.min(start + 65_536)).collect::<Vec<_>>();
        let k: Vec<i64> = rows.iter().map(|i| (*i as i64 * 7919) % 50_021).collect();
        let s: Vec<Option<String>> = rows
            .iter()
            .map(|i| (i % 13 != 0).then(|| format!("key-{}", i % 997)))
            .collect();
        let h: Vec<Option<i32>> = rows
            .iter()
            .map(|i| (i % 11 != 0).then_some((i % 3) as i32))
            .collect();
        let v: Vec<Option<i64>> = rows
            .iter()
            .map(|i| (i % 5 != 0).then_some(*i as i64 - 77_777))
            .collect();
        let m: Vec<Option<i128>> = rows
            .iter()
            .map(|i| (i % 7 != 0).then_some((*i as i128 % 100_000) - 50_000))
            .collect();
        batches.push(
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(k)) as ArrayRef,
                    Arc::new(StringArray::from(s)),
                    Arc::new(Int32Array::from(h)),
                    Arc::new(Int64Array::from(v)),
                    Arc::new(
                        Decimal128Array::from(m)
                            .with_precision_and_scale(15, 2)
                            .unwrap(),
                    ),
                ],
            )
            .unwrap(),
        );
    }
    let gpu = engine(Backend::Emulated, 8192);
    let cpu = engine(Backend::Cpu, 8192);
    gpu.register_batches("big", batches.clone()).unwrap();
    cpu.register_batches("big", batches).unwrap();
    for keys in ["k", "s", "h", "s, h", "k, s"] {
        let sql = format!(
            "SELECT {keys}, count(*), count(v), sum(v), min(v), max(v), sum(m), avg(m) \
             FROM big GROUP BY {keys}"
        );
        let want = rows(&cpu.collect(&sql).await.unwrap());
        let got = rows(&gpu.collect(&sql).await.unwrap());
        assert_eq!(got.len(), want.len(), "groups of [{keys}]");
        assert_eq!(got, want, "GROUP BY [{keys}]");
        let plan = explain(&gpu, &sql).await;
        assert!(!plan.contains("  AggregateExec"), "{plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_distinct_matches_the_cpu() {
    // Several DISTINCT aggregates are not rewritten into GROUP BYs; with one input partition
    // DataFusion aggregates in a single stage, which runs on the GPU.
    for (seed, rows_in_table, batch_size) in
        [(31u64, 3000usize, 8192usize), (32, 300, 7), (33, 0, 8192)]
    {
        let (gpu, cpu) = engines_over(table(rows_in_table, seed), batch_size, 1);
        for keys in ["", "a", "s", "p, dt"] {
            let aggregates = "count(DISTINCT b), count(DISTINCT s), count(DISTINCT m), \
                              count(DISTINCT dt), count(DISTINCT p), count(*), sum(a)";
            let sql = if keys.is_empty() {
                format!("SELECT {aggregates} FROM t")
            } else {
                format!("SELECT {keys}, {aggregates} FROM t GROUP BY {keys}")
            };
            let want = rows(&cpu.collect(&sql).await.unwrap());
            assert_eq!(
                rows(&gpu.collect(&sql).await.unwrap()),
                want,
                "{sql} seed={seed}"
            );
            let plan = explain(&gpu, &sql).await;
            assert!(plan.contains("GpuAggregateExec"), "{plan}");
            assert!(!plan.contains("  AggregateExec"), "{plan}");
        }
        // With several partitions DataFusion plans two stages, the partial state a list: over
        // a GPU input with one final partition, the pair becomes one GPU aggregation.
        let gpu = engine_with(Backend::Emulated, batch_size, 2);
        gpu.register_batches("t", table(rows_in_table, seed))
            .unwrap();
        for sql in [
            "SELECT count(DISTINCT b), count(DISTINCT s), sum(a) FROM t WHERE a > -15",
            "SELECT count(DISTINCT m), avg(a) FROM t WHERE b > 0",
        ] {
            let want = rows(&cpu.collect(sql).await.unwrap());
            assert_eq!(rows(&gpu.collect(sql).await.unwrap()), want, "{sql}");
            let placed = placement(&gpu, sql).await;
            assert!(placed.fully_on_gpu(), "{sql}: {placed:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_division_matches_the_cpu_and_fails_on_zero() {
    let gpu = engine(Backend::Emulated, 8192);
    let cpu = engine(Backend::Cpu, 8192);
    for (name, values) in [
        (
            "fine",
            "(10.00, 3.00), (-10.00, 3.00), (2.00, -3.00), (1.00, 0.07), (NULL, 0.00)",
        ),
        ("zero", "(10.00, 3.00), (1.00, 0.00)"),
    ] {
        let create =
            format!("CREATE TABLE {name} (a DECIMAL(15,2), b DECIMAL(15,2)) AS VALUES {values}");
        gpu.collect(&create).await.unwrap();
        cpu.collect(&create).await.unwrap();
        for sql in [
            format!("SELECT a FROM {name} WHERE a / b > 0.5"),
            format!("SELECT a FROM {name} WHERE a % b <> 0"),
            format!("SELECT sum(a / b), sum(a % b) FROM {name}"),
        ] {
            let plan = explain(&gpu, &sql).await;
            assert!(
                plan.contains("GpuFilterExec") || plan.contains("GpuAggregateExec"),
                "{plan}"
            );
            assert_same_outcome(&cpu, &gpu, &sql).await;
        }
    }
}

/// An expression that can fail on the right of AND/OR runs on the GPU. DataFusion evaluates it
/// for all rows, or where the left is TRUE (FALSE for OR), or for none when the left decides
/// the whole batch: whatever its batches, it evaluates the rows where the left is not FALSE
/// (not TRUE), and there alone the GPU fails. So the GPU fails when the CPU fails whatever its
/// batches, and as the CPU does one row at a time when the CPU's outcome depends on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallible_expressions_under_and_or_fail_where_the_cpu_always_does() {
    for (seed, batch_size) in [(61u64, 8192usize), (62, 7), (63, 100)] {
        let (gpu, cpu) = engines_over(table(600, seed), batch_size, 2);
        let row_at_a_time = engine_with(Backend::Cpu, 1, 2);
        row_at_a_time
            .register_batches("t", table(600, seed))
            .unwrap();
        let lt = table(300, seed + 1);
        let rt = table(200, seed + 2);
        for e in [&gpu, &cpu] {
            e.register_batches("lt", lt.clone()).unwrap();
            e.register_batches("rt", rt.clone()).unwrap();
        }
        // The same outcome at any batch size: the failures (if any) are where the left side
        // is not FALSE.
        for sql in [
            // A CASE whose WHEN is the left side (as DataFusion's common subexpressions leave
            // TPC-DS q47): the THEN runs only where it holds.
            "SELECT a, m FROM t WHERE m <> 0 AND CASE WHEN m <> 0 THEN 100 / m END > 20",
            "SELECT count(*) FROM t WHERE m < 0 \
             AND CASE WHEN m < 0 THEN abs(m - 1) / m END < -2",
            // Fails where a = 5, and the left is TRUE there.
            "SELECT a FROM t WHERE a > 0 AND 100 / (a - 5) > 0",
            // The left is FALSE everywhere: nothing fails.
            "SELECT a FROM t WHERE coalesce(a > 100, false) AND 100 / (a - a) > 0",
            "SELECT a FROM t WHERE (a < 100 OR a IS NULL) OR 100 / (a - a) > 0",
            // A join filter: a cast that may overflow but never does, and one that does.
            "SELECT lt.a, rt.m FROM lt JOIN rt ON lt.a = rt.a \
             AND lt.m > 0 AND CAST(rt.a AS DECIMAL(4, 0)) < lt.m",
            "SELECT lt.a, rt.m FROM lt JOIN rt ON lt.a = rt.a \
             AND lt.m > 0 AND CAST(rt.b AS DECIMAL(10, 0)) > lt.m",
        ] {
            assert_same_outcome(&cpu, &gpu, sql).await;
            let plan = explain(&gpu, sql).await;
            assert!(
                plan.contains("GpuFilterExec") || plan.contains("GpuHashJoinExec"),
                "{sql}\n{plan}"
            );
            assert!(
                !plan.lines().any(|l| {
                    let l = l.trim_start();
                    l.starts_with("FilterExec") || l.starts_with("HashJoinExec")
                }),
                "{sql}\n{plan}"
            );
        }
        // Failures only where the left is FALSE (TRUE for OR): the CPU fails or not as its
        // batches fall; one row at a time it does not, nor does the GPU.
        for sql in [
            "SELECT a FROM t WHERE a <> 5 AND 100 / (a - 5) > 1",
            // A NULL on the left makes DataFusion evaluate the right for the whole batch.
            "SELECT a FROM t WHERE a > 100 AND 100 / (a - a) > 0",
            "SELECT a FROM t WHERE a = 5 OR 100 / (a - 5) > 1",
            "SELECT a, m FROM t WHERE m > 0 AND CASE WHEN m <> 0 THEN 100 / m END > 20",
        ] {
            assert_same_outcome(&row_at_a_time, &gpu, sql).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_joins_match_the_cpu() {
    const KEYS: &[&str] = &["a", "s", "dt, a", "m", "p, a", "b"];
    // The last column bounds the GPU's output batches (`spate.gpu.batch_bytes`, also the
    // upload size; `None` takes the engine's draw): 1 KiB cuts each probe batch's output into
    // many chunks of whole probe rows. The largest tables keep the default, which 1 KiB would
    // make a minute slower.
    for (seed, rows_in_table, batch_size, partitioned, batch_bytes) in [
        (41u64, 1000usize, 8192usize, false, Some(128 << 20)),
        (42, 400, 7, true, None),
        (44, 0, 8192, false, None),
        (45, 500, 8192, false, Some(1024)),
        (46, 400, 8192, true, Some(65536)),
    ] {
        let gpu = engine(Backend::Emulated, batch_size);
        let cpu = engine(Backend::Cpu, batch_size);
        if let Some(bytes) = batch_bytes {
            gpu.collect(&format!("SET spate.gpu.batch_bytes = {bytes}"))
                .await
                .unwrap();
        }
        for e in [&gpu, &cpu] {
            e.register_batches("lt", table(rows_in_table, seed))
                .unwrap();
            e.register_batches("rt", table(rows_in_table / 2 + 1, seed + 100))
                .unwrap();
            if partitioned {
                // Hash-partition both sides instead of collecting the build side.
                for setting in [
                    "SET datafusion.optimizer.hash_join_single_partition_threshold = 0",
                    "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
                ] {
                    e.collect(setting).await.unwrap();
                }
            }
        }
        for keys in KEYS {
            let on: Vec<String> = keys
                .split(", ")
                .map(|k| format!("lt.{k} = rt.{k}"))
                .collect();
            let on = on.join(" AND ");
            let mut queries: Vec<String> = ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]
                .iter()
                .map(|j| {
                    format!("SELECT lt.a, lt.b, lt.s, rt.m, rt.s, rt.dt FROM lt {j} rt ON {on}")
                })
                .collect();
            if *keys == "a" {
                queries.push(
                    "SELECT lt.a, rt.b FROM lt JOIN rt ON lt.a IS NOT DISTINCT FROM rt.a".into(),
                );
                // Residual join filters, over both sides' columns.
                for j in ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"] {
                    queries.push(format!(
                        "SELECT lt.a, lt.m, rt.m, rt.s FROM lt {j} rt ON {on} AND lt.m < rt.m"
                    ));
                }
                for exists in ["EXISTS", "NOT EXISTS"] {
                    for side in [("lt", "rt"), ("rt", "lt")] {
                        queries.push(format!(
                            "SELECT {o}.a, {o}.dt FROM {o} WHERE {exists} (SELECT 1 FROM {i} \
                             WHERE {on} AND {i}.dt > {o}.dt AND {i}.s <> {o}.s)",
                            o = side.0,
                            i = side.1
                        ));
                        // Under OR: a mark join, with a residual filter.
                        queries.push(format!(
                            "SELECT {o}.a, {o}.dt, {o}.s FROM {o} WHERE {exists} (SELECT 1 FROM \
                             {i} WHERE {on} AND {i}.dt > {o}.dt) OR {o}.s IS NULL",
                            o = side.0,
                            i = side.1
                        ));
                    }
                }
                // IN under OR: a mark join on the subquery's column (NULLs never match).
                for side in [("lt", "rt"), ("rt", "lt")] {
                    queries.push(format!(
                        "SELECT {o}.a, {o}.m FROM {o} WHERE {o}.a IN (SELECT a FROM {i}) \
                         OR {o}.m IS NULL",
                        o = side.0,
                        i = side.1
                    ));
                }
            }
            for exists in ["EXISTS", "NOT EXISTS"] {
                queries.push(format!(
                    "SELECT lt.a, lt.f, lt.s FROM lt WHERE {exists} (SELECT 1 FROM rt WHERE {on})"
                ));
                queries.push(format!(
                    "SELECT rt.a, rt.m FROM rt WHERE {exists} (SELECT 1 FROM lt WHERE {on})"
                ));
                // Under OR: a mark join (left or right, as the planner puts the sides).
                queries.push(format!(
                    "SELECT lt.a, lt.f, lt.s FROM lt WHERE {exists} (SELECT 1 FROM rt WHERE {on}) \
                     OR lt.s IS NULL"
                ));
                queries.push(format!(
                    "SELECT rt.a, rt.m FROM rt WHERE {exists} (SELECT 1 FROM lt WHERE {on}) \
                     OR rt.m IS NULL"
                ));
            }
            for sql in queries {
                let want = rows(&cpu.collect(&sql).await.unwrap());
                let got = rows(&gpu.collect(&sql).await.unwrap());
                assert_eq!(
                    got, want,
                    "{sql} seed={seed} batch_size={batch_size} partitioned={partitioned}"
                );
                let plan = explain(&gpu, &sql).await;
                assert!(plan.contains("GpuHashJoinExec"), "{sql}\n{plan}");
                assert!(
                    !plan
                        .lines()
                        .any(|l| l.trim_start().starts_with("HashJoinExec")),
                    "a join stayed on the CPU: {sql}\n{plan}"
                );
            }
        }
    }
}

/// One partition of a streaming table: its one batch says whether, while it was being made,
/// every partition of the table was being made at the same time.
#[derive(Debug)]
struct Simultaneous {
    schema: arrow::datatypes::SchemaRef,
    started: Arc<std::sync::atomic::AtomicUsize>,
    partitions: usize,
}

impl datafusion::physical_plan::streaming::PartitionStream for Simultaneous {
    fn schema(&self) -> &arrow::datatypes::SchemaRef {
        &self.schema
    }

    fn execute(
        &self,
        _ctx: Arc<datafusion::execution::TaskContext>,
    ) -> datafusion::execution::SendableRecordBatchStream {
        let (schema, started, partitions) = (
            Arc::clone(&self.schema),
            Arc::clone(&self.started),
            self.partitions,
        );
        let decode = futures::stream::once(async move {
            // Decoding is CPU work that holds its thread: it waits here, blocking, until every
            // partition has started, or gives up after ten seconds.
            started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while started.load(std::sync::atomic::Ordering::SeqCst) < partitions
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let together = started.load(std::sync::atomic::Ordering::SeqCst) >= partitions;
            Ok(RecordBatch::try_new(
                schema,
                vec![Arc::new(Int64Array::from(vec![i64::from(together); 100])) as ArrayRef],
            )?)
        });
        Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                decode,
            ),
        )
    }
}

/// The partitions of a CPU input under a GPU operator decode in parallel, each in a task of its
/// own, and not one after another in the one task that merges them into the device stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_below_the_first_upload_decode_in_parallel() {
    let partitions = 3;
    let schema = Arc::new(Schema::new(vec![Field::new(
        "together",
        DataType::Int64,
        false,
    )]));
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let streams = (0..partitions)
        .map(|_| {
            Arc::new(Simultaneous {
                schema: Arc::clone(&schema),
                started: Arc::clone(&started),
                partitions,
            }) as Arc<dyn datafusion::physical_plan::streaming::PartitionStream>
        })
        .collect();
    let table = datafusion::catalog::streaming::StreamingTable::try_new(schema, streams).unwrap();
    let engine = Engine::builder()
        .backend(Backend::Emulated)
        .target_partitions(partitions)
        .build()
        .unwrap();
    engine
        .context()
        .register_table("t", Arc::new(table))
        .unwrap();
    engine
        .collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    let sql = "SELECT min(together) AS together, count(*) AS n FROM t WHERE together >= 0";
    let plan = ordered(&engine.collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
    assert!(plan.contains("GpuCoalescePartitionsExec"), "{plan}");
    let got = ordered(&engine.collect(sql).await.unwrap());
    assert_eq!(got, vec!["1|300".to_string()], "{plan}");
}

/// `n` rows of every kind of sort key: integers with NULLs and many ties, floats with NaN,
/// decimals, strings that share long prefixes, and a row number that breaks every tie.
fn top_k_table(n: i64) -> RecordBatch {
    let mut r = Rng::new(77);
    let ints: Vec<Option<i64>> = (0..n)
        .map(|_| (!r.chance(0.05)).then(|| (r.next_u64() % 5000) as i64 - 2500))
        .collect();
    let floats: Vec<Option<f64>> = (0..n)
        .map(|i| match i % 97 {
            0 => None,
            1 => Some(f64::NAN),
            _ => Some((r.next_u64() % 100_000) as f64 / 7.0 - 5000.0),
        })
        .collect();
    let decimals: Vec<Option<i128>> = (0..n)
        .map(|_| (!r.chance(0.03)).then(|| i128::from(r.next_u64() as i64) * 1000))
        .collect();
    let strings: Vec<Option<String>> = (0..n)
        .map(|i| (i % 50 != 7).then(|| format!("{:07}-item", r.next_u64() % 1_000_000)))
        .collect();
    // Every value shares its first eight bytes: the select cannot narrow on them.
    let names: Vec<String> = (0..n)
        .map(|_| format!("customer#{:09}", r.next_u64() % 1_000_000))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("d", DataType::Decimal128(38, 2), true),
        Field::new("s", DataType::Utf8, true),
        Field::new("c", DataType::Utf8, false),
        Field::new("row", DataType::Int64, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ints)) as ArrayRef,
            Arc::new(Float64Array::from(floats)),
            Arc::new(
                Decimal128Array::from(decimals)
                    .with_precision_and_scale(38, 2)
                    .unwrap(),
            ),
            Arc::new(StringArray::from(strings)),
            Arc::new(StringArray::from(names)),
            Arc::new(Int64Array::from_iter_values(0..n)),
        ],
    )
    .unwrap()
}

/// `ORDER BY … LIMIT k` sorts only its candidates on the GPU, and answers as the CPU does, for
/// every key type, both directions and both NULL placements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_k_sorts_only_its_candidates() {
    let n = 150_000;
    let table = top_k_table(n);
    let engines: Vec<Engine> = [Backend::Emulated, Backend::Cpu]
        .into_iter()
        .map(|backend| {
            let e = Engine::builder()
                .backend(backend)
                .target_partitions(2)
                .build()
                .unwrap();
            e.register_batches("t", vec![table.clone()]).unwrap();
            e
        })
        .collect();
    engines[0]
        .collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    for order in [
        "i, row",
        "i DESC NULLS LAST, row",
        "i NULLS FIRST, row DESC",
        "f, row",
        "f DESC, row",
        "d DESC NULLS FIRST, row",
        "s, row",
        "s DESC NULLS LAST, row",
        "c DESC, row",
        "row DESC",
    ] {
        for k in [1, 10, 1000] {
            let sql = format!("SELECT i, f, d, s, c, row FROM t ORDER BY {order} LIMIT {k}");
            let gpu = engines[0].collect(&sql).await.unwrap();
            let cpu = engines[1].collect(&sql).await.unwrap();
            // ORDER BY fixes every row's place (`row` breaks ties): compare in order.
            assert_eq!(ordered(&gpu), ordered(&cpu), "{sql}");
            if order.starts_with('c') {
                // Sorted whole: the first eight bytes of `c` tie everywhere.
                continue;
            }
            let plan = ordered(
                &engines[0]
                    .collect(&format!("EXPLAIN ANALYZE {sql}"))
                    .await
                    .unwrap(),
            )
            .join("\n");
            // Counts show as `3.94 K`.
            let kept = plan
                .split("topk_kept_rows=")
                .nth(1)
                .and_then(|m| m.split(',').next())
                .and_then(|m| {
                    let (number, unit) = m.split_once(' ').unwrap_or((m, ""));
                    let scale = match unit.trim() {
                        "K" => 1e3,
                        "M" => 1e6,
                        _ => 1.0,
                    };
                    number.parse::<f64>().ok().map(|v| (v * scale) as usize)
                })
                .unwrap_or_else(|| panic!("{sql}: no top-k narrowing in\n{plan}"));
            assert!(kept >= k && kept < 20_000, "{sql}: kept {kept}\n{plan}");
        }
    }
}

/// A union of GPU subtrees passes their device batches through (`GpuUnionExec`), and so does an
/// interleave under a GPU consumer, which becomes such a union: no host exchange either way,
/// and the results are the CPU's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unions_of_gpu_subtrees_stay_on_the_device() {
    let n = 5000i64;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]));
    let table = |seed: i64| {
        RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| (i * seed) % 97),
                )) as ArrayRef,
                Arc::new(Int64Array::from_iter(
                    (0..n).map(|i| (i % 11 != 0).then_some(i * seed)),
                )),
            ],
        )
        .unwrap()
    };
    let engines: Vec<Engine> = [Backend::Emulated, Backend::Cpu]
        .into_iter()
        .map(|backend| {
            let e = Engine::builder()
                .backend(backend)
                .target_partitions(2)
                .build()
                .unwrap();
            for (name, seed) in [("a", 3), ("b", 5), ("c", 7)] {
                e.register_partitions(
                    name,
                    Arc::clone(&schema),
                    vec![
                        vec![table(seed).slice(0, 2000)],
                        vec![table(seed).slice(2000, 3000)],
                    ],
                )
                .unwrap();
            }
            e
        })
        .collect();
    engines[0]
        .collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    // The CPU plans: a union with a scan among its inputs, and an interleave of aggregations.
    for (sql, cpu_node) in [
        (
            "SELECT k, sum(v) AS s, count(*) AS c FROM (SELECT k, v FROM a WHERE v > 10 \
             UNION ALL SELECT k, v * 2 FROM b WHERE k < 50 UNION ALL SELECT k, v FROM c) t \
             GROUP BY k ORDER BY k",
            "UnionExec",
        ),
        (
            "SELECT k, sum(s) AS s FROM (SELECT k, sum(v) AS s FROM a GROUP BY k \
             UNION ALL SELECT k, sum(v) AS s FROM b GROUP BY k \
             UNION ALL SELECT k, sum(v) AS s FROM c GROUP BY k) t GROUP BY k ORDER BY s, k",
            "InterleaveExec",
        ),
    ] {
        let cpu_plan =
            ordered(&engines[1].collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
        assert!(cpu_plan.contains(cpu_node), "{sql}\n{cpu_plan}");
        let node = "GpuUnionExec";
        let gpu = engines[0].collect(sql).await.unwrap();
        let cpu = engines[1].collect(sql).await.unwrap();
        assert_eq!(ordered(&gpu), ordered(&cpu), "{sql}");
        let plan =
            ordered(&engines[0].collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
        assert!(plan.contains(node), "{sql}\n{plan}");
        assert!(!plan.contains("host exchange"), "{sql}\n{plan}");
        assert!(!plan.contains("InterleaveExec"), "{sql}\n{plan}");
    }
}

/// An aggregation over input sorted on its group keys streams its groups out in that order on
/// the CPU, and the plan above relies on it (no sort for the ORDER BY). On the GPU it
/// aggregates by hash and sorts its groups, so the order holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregations_over_sorted_input_keep_its_order() {
    use datafusion::datasource::MemTable;
    use datafusion::logical_expr::{SortExpr, col};
    let n = 20_000i64;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
    ]));
    // Sorted on (k, s), NULL keys first; three partitions of it.
    let keys: Vec<Option<i64>> = (0..n)
        .map(|i| (i >= 100).then_some((i - 100) / 37))
        .collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(keys)) as ArrayRef,
            Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                let within = if i < 100 { i } else { (i - 100) % 37 };
                format!("{}", within / 10)
            }))),
            Arc::new(Int64Array::from_iter(
                (0..n).map(|i| (i % 7 != 0).then_some(i)),
            )),
        ],
    )
    .unwrap();
    let parts = vec![
        vec![batch.slice(0, 7000)],
        vec![batch.slice(7000, 7000)],
        vec![batch.slice(14000, 6000)],
    ];
    let engines: Vec<Engine> = [Backend::Emulated, Backend::Cpu]
        .into_iter()
        .map(|backend| {
            let e = Engine::builder()
                .backend(backend)
                .target_partitions(1)
                .build()
                .unwrap();
            let table = MemTable::try_new(Arc::clone(&schema), parts.clone())
                .unwrap()
                .with_sort_order(vec![vec![
                    SortExpr::new(col("k"), true, true),
                    SortExpr::new(col("s"), true, true),
                ]]);
            e.context().register_table("t", Arc::new(table)).unwrap();
            e
        })
        .collect();
    engines[0]
        .collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    for sql in [
        "SELECT k, sum(v) AS s, count(*) AS c FROM t GROUP BY k ORDER BY k NULLS FIRST",
        "SELECT k, s, min(v) AS lo, count(v) AS c FROM t GROUP BY k, s \
         ORDER BY k NULLS FIRST, s NULLS FIRST",
    ] {
        let cpu_plan =
            ordered(&engines[1].collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
        assert!(
            cpu_plan.contains("ordering_mode=Sorted"),
            "{sql}\n{cpu_plan}"
        );
        assert!(!cpu_plan.contains("SortExec"), "{sql}\n{cpu_plan}");
        let plan =
            ordered(&engines[0].collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
        assert!(plan.contains("GpuAggregateExec"), "{sql}\n{plan}");
        let gpu = ordered(&engines[0].collect(sql).await.unwrap());
        let cpu = ordered(&engines[1].collect(sql).await.unwrap());
        let first_difference = gpu.iter().zip(&cpu).position(|(g, c)| g != c);
        assert!(
            gpu.len() == cpu.len() && first_difference.is_none(),
            "{sql}: {} rows against {}; first difference at {first_difference:?}: {:?}\n{plan}",
            gpu.len(),
            cpu.len(),
            first_difference.map(|i| (&gpu[i], &cpu[i])),
        );
    }
}

/// Cross joins run on the GPU (`GpuCrossJoinExec`): every left row with every right row, NULLs
/// and strings included, as the CPU gives them; an empty side gives no rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_joins_pair_every_row() {
    let left_schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let right_schema = Arc::new(Schema::new(vec![Field::new("b", DataType::Int64, true)]));
    let left = RecordBatch::try_new(
        Arc::clone(&left_schema),
        vec![
            Arc::new(Int32Array::from_iter(
                (0..40).map(|i| (i % 9 != 0).then_some(i)),
            )) as ArrayRef,
            Arc::new(StringArray::from_iter(
                (0..40).map(|i| (i % 7 != 0).then(|| "x".repeat(i % 5))),
            )),
        ],
    )
    .unwrap();
    let right = RecordBatch::try_new(
        Arc::clone(&right_schema),
        vec![Arc::new(Int64Array::from_iter(
            (0..300).map(|i| (i % 13 != 0).then_some(i * 3)),
        )) as ArrayRef],
    )
    .unwrap();
    let engines: Vec<Engine> = [Backend::Emulated, Backend::Cpu]
        .into_iter()
        .map(|backend| {
            let e = Engine::builder()
                .backend(backend)
                .target_partitions(2)
                .build()
                .unwrap();
            e.register_batches("l", vec![left.clone()]).unwrap();
            e.register_batches("r", vec![right.slice(0, 120), right.slice(120, 180)])
                .unwrap();
            e
        })
        .collect();
    engines[0]
        .collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    for sql in [
        "SELECT a, s, b FROM l CROSS JOIN r ORDER BY a, s, b",
        "SELECT count(*) AS n, sum(a) AS sa, sum(b) AS sb, count(s) AS cs FROM l, r",
        "SELECT a, b FROM l CROSS JOIN (SELECT b FROM r WHERE b < 0) e ORDER BY a, b",
    ] {
        let plan =
            ordered(&engines[0].collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
        assert!(plan.contains("GpuCrossJoinExec"), "{sql}\n{plan}");
        let gpu = ordered(&engines[0].collect(sql).await.unwrap());
        let cpu = ordered(&engines[1].collect(sql).await.unwrap());
        assert_eq!(gpu.len(), cpu.len(), "{sql}");
        assert!(gpu == cpu, "{sql}: results differ\n{plan}");
    }
}

/// A limit between GPU operators passes device batches through (`GpuLimitExec`) until it has
/// its rows, skipping an offset first, and gives the CPU's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_between_gpu_operators_stay_on_the_device() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let batch = |from: i64| {
        RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter(
                    (from..from + 700).map(|i| (i % 10 != 3).then_some(i)),
                )) as ArrayRef,
                Arc::new(StringArray::from_iter_values(
                    (from..from + 700).map(|i| format!("s{}", i % 17)),
                )),
            ],
        )
        .unwrap()
    };
    let engines: Vec<Engine> = [Backend::Emulated, Backend::Cpu]
        .into_iter()
        .map(|backend| {
            let e = Engine::builder()
                .backend(backend)
                .target_partitions(1)
                .batch_size(256)
                .build()
                .unwrap();
            e.register_batches("t", vec![batch(0), batch(700), batch(1400)])
                .unwrap();
            e
        })
        .collect();
    engines[0]
        .collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    let union = "SELECT v, s FROM t WHERE v > 5 UNION ALL SELECT v, s FROM t WHERE v < 100";
    for (sql, on_gpu) in [
        (
            format!("SELECT count(*) AS n, count(v) AS c FROM ({union} LIMIT 1000) x"),
            true,
        ),
        (
            format!("SELECT count(*) AS n, count(s) AS c FROM ({union} LIMIT 3) x"),
            true,
        ),
        (
            format!("SELECT count(*) AS n FROM ({union} LIMIT 50 OFFSET 10) x"),
            true,
        ),
    ] {
        let plan =
            ordered(&engines[0].collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
        let gpu_limit = plan.contains("GpuGlobalLimitExec") || plan.contains("GpuLocalLimitExec");
        assert_eq!(gpu_limit, on_gpu, "{sql}\n{plan}");
        assert_eq!(plan.contains("host exchange"), !on_gpu, "{sql}\n{plan}");
        let gpu = ordered(&engines[0].collect(&sql).await.unwrap());
        let cpu = ordered(&engines[1].collect(&sql).await.unwrap());
        assert_eq!(gpu, cpu, "{sql}\n{plan}");
    }
}

/// A sorted merge between GPU operators (a window without PARTITION BY over a sort, a join over
/// a top-k) leaves the plan: its input is one sorted partition on the device, which it would
/// only download and pass through on the host. Its fetch becomes a GPU limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_merges_between_gpu_operators_stay_on_the_device() {
    for (seed, batch_size, partitions) in [(71u64, 8192usize, 2usize), (72, 50, 3)] {
        let (gpu, cpu) = engines_over(table(900, seed), batch_size, partitions);
        for sql in [
            "SELECT a, av, rank() OVER (ORDER BY av DESC NULLS FIRST) AS r FROM \
             (SELECT a, avg(m) AS av FROM t GROUP BY a) x ORDER BY r, a",
            "SELECT t.a, t.b, k.b AS kb FROM t JOIN \
             (SELECT a, b FROM t WHERE b IS NOT NULL ORDER BY b, a LIMIT 7) k ON t.a = k.a \
             ORDER BY t.a, t.b, kb",
        ] {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(&gpu.collect(sql).await.unwrap());
            assert_eq!(got, want, "{sql}");
            let placed = placement(&gpu, sql).await;
            assert!(placed.fully_on_device(), "{sql}: {placed:?}");
        }
    }
}

/// `upper` with Rust's full Unicode case mapping (`ß` to `SS`, ligatures to several letters),
/// compared (in filters and join filters, as TPC-DS q24's `c_birth_country <> upper(ca_country)`)
/// or stored (a projection's output, a group key). Elsewhere it stays on the CPU, saying why.
/// And `strpos`, counting characters, and `replace` of literals (streamed as `upper` is), over
/// the same words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upper_and_strpos_match_the_cpu() {
    const WORDS: &[Option<&str>] = &[
        Some("straße"),
        Some("STRASSE"),
        Some("Straße"),
        Some("ǅungla"),
        Some("ǄUNGLA"),
        Some("ﬁsh"),
        Some("FISH"),
        Some("café"),
        Some("CAFÉ"),
        Some(""),
        None,
        Some("abc"),
        Some("ABC"),
        Some("日本"),
        Some("ΐ"),
    ];
    let table = |n: usize, shift: usize| {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let k = Int32Array::from_iter((0..n).map(|i| Some((i % 7) as i32)));
        let s = StringArray::from_iter((0..n).map(|i| WORDS[(i * 5 + shift) % WORDS.len()]));
        vec![RecordBatch::try_new(schema, vec![Arc::new(k) as ArrayRef, Arc::new(s)]).unwrap()]
    };
    // One partition: a round-robin repartition under a projection would keep it on the CPU.
    for batch_size in [8192usize, 5] {
        let (gpu, cpu) = engines_over(table(60, 0), batch_size, 1);
        for e in [&gpu, &cpu] {
            e.register_batches("w", table(45, 3)).unwrap();
        }
        for sql in [
            "SELECT k, s FROM t WHERE upper(s) = 'STRASSE'",
            "SELECT k, s FROM t WHERE upper(s) > s",
            "SELECT k, s FROM t WHERE upper(s) IS NOT DISTINCT FROM 'FISH'",
            "SELECT k, upper(s) AS u FROM t WHERE k > 1",
            "SELECT upper(s) AS u, count(*) AS n FROM t GROUP BY upper(s)",
            "SELECT t.k, t.s, w.s AS ws FROM t JOIN w ON t.k = w.k AND t.s <> upper(w.s)",
            "SELECT t.k, t.s, w.s AS ws FROM t JOIN w ON t.k = w.k AND upper(t.s) = upper(w.s)",
            "SELECT k, s, strpos(s, 'ß'), strpos(s, 'S'), strpos(s, ''), strpos(s, s), \
             instr(s, 'a'), strpos(s, 'ﬁ') FROM t WHERE k >= 0",
            "SELECT t.k, t.s, w.s AS ws FROM t JOIN w ON t.k = w.k AND strpos(t.s, w.s) > 1",
            // replace of a literal by a literal: compared and stored, as upper.
            "SELECT k, s, replace(s, 'ß', 'ss'), replace(s, 'S', '') FROM t WHERE k >= 0",
            "SELECT k, s FROM t WHERE replace(s, 'ß', 'SS') = upper(s)",
            "SELECT replace(s, 'a', 'AA') AS r, count(*) AS n FROM t GROUP BY replace(s, 'a', 'AA')",
            "SELECT t.k, t.s, w.s AS ws FROM t JOIN w ON t.k = w.k \
             AND replace(t.s, 'ß', 'SS') = upper(w.s)",
        ] {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(&gpu.collect(sql).await.unwrap());
            assert_eq!(got, want, "{sql}");
            let placed = placement(&gpu, sql).await;
            assert!(placed.fully_on_gpu(), "{sql}: {placed:?}");
        }
        // Its bytes would have to be stored inside the row: the CPU runs it.
        for sql in [
            "SELECT k FROM t WHERE upper(s) LIKE 'ST%'",
            "SELECT k, length(upper(s)) AS n FROM t WHERE k > 1",
            "SELECT k, length(replace(s, 'a', 'bb')) AS n FROM t WHERE k > 1",
            "SELECT k, upper(replace(s, 'a', 'b')) AS u FROM t WHERE k > 1",
        ] {
            let want = rows(&cpu.collect(sql).await.unwrap());
            let got = rows(&gpu.collect(sql).await.unwrap());
            assert_eq!(got, want, "{sql}");
            let plan = explain(&gpu, sql).await;
            assert!(
                plan.contains("`upper` or `replace` feeding anything but"),
                "{sql}\n{plan}"
            );
        }
    }
}
