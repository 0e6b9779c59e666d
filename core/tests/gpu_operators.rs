//! GPU operators against the CPU engine on the emulated backend: random tables with nulls,
//! NaN, ±0.0 and extremes, batch sizes 1, 7 and 8192, EXPLAIN markings and the fallback policy.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array,
    Int32Array, Int64Array, StringArray, UInt16Array,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use spate::kernels::reference::Rng;
use spate::{Backend, Engine, SpateError};

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
            .map(|_| opt(&mut r).then(|| "xyz".repeat(r.below(4) as usize)))
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
];

/// Rows as strings, sorted (for results whose order is not fixed).
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = ordered(batches);
    out.sort();
    out
}

fn engine(backend: Backend, batch_size: usize) -> Engine {
    engine_with(backend, batch_size, 2)
}

fn engine_with(backend: Backend, batch_size: usize, partitions: usize) -> Engine {
    Engine::builder()
        .backend(backend)
        .batch_size(batch_size)
        .target_partitions(partitions)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_match_the_cpu_at_every_batch_size() {
    for (seed, rows_in_table, batch_size) in [
        (1u64, 3000usize, 8192usize),
        (2, 500, 7),
        (3, 60, 1),
        (4, 0, 8192),
    ] {
        let data = table(rows_in_table, seed);
        let gpu = engine(Backend::Emulated, batch_size);
        let cpu = engine(Backend::Cpu, batch_size);
        gpu.register_batches("t", data.clone()).unwrap();
        cpu.register_batches("t", data).unwrap();
        for predicate in PREDICATES {
            let sql = format!("SELECT * FROM t WHERE {predicate}");
            let want = rows(&cpu.collect(&sql).await.unwrap());
            let got = rows(&gpu.collect(&sql).await.unwrap());
            assert_eq!(
                got, want,
                "`{predicate}` seed={seed} batch_size={batch_size}"
            );
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
        for projection in PROJECTIONS {
            let sql = format!("SELECT {projection} FROM t WHERE a IS NULL OR a > -15");
            let want = rows(&cpu.collect(&sql).await.unwrap());
            let got = rows(&gpu.collect(&sql).await.unwrap());
            assert_eq!(
                got, want,
                "`{projection}` seed={seed} batch_size={batch_size}"
            );
            let plan = explain(&gpu, &sql).await;
            assert!(plan.contains("GpuProjectionExec"), "{plan}");
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
];

/// Rows in output order (not sorted), as strings.
fn ordered(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for i in 0..b.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(i).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorts_match_the_cpu_order() {
    for (seed, rows_in_table, batch_size) in [
        (11u64, 3000usize, 8192usize),
        (12, 400, 7),
        (13, 1, 8192),
        (14, 0, 8192),
    ] {
        let data = table(rows_in_table, seed);
        let gpu = engine(Backend::Emulated, batch_size);
        let cpu = engine(Backend::Cpu, batch_size);
        gpu.register_batches("t", data.clone()).unwrap();
        cpu.register_batches("t", data).unwrap();
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

async fn explain(engine: &Engine, sql: &str) -> String {
    let batches = engine.collect(&format!("EXPLAIN {sql}")).await.unwrap();
    rows(&batches).join("\n")
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
    assert!(
        plan.contains("AggregateExec: mode=")
            && plan.contains("[CPU: there is no GPU operator for it yet]"),
        "{plan}"
    );
    let plan = explain(&gpu, "SELECT a FROM t WHERE a % 2 = 0").await;
    assert!(plan.contains("[CPU: operator % in `"), "{plan}");
    // Modulo is not supported yet: the filter stays on the CPU.
    let plan = explain(&gpu, "SELECT a FROM t WHERE a % 2 = 0").await;
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
    gpu.collect("SELECT sum(a) FROM t WHERE a > 0")
        .await
        .unwrap();
    assert!(
        context.fallbacks() > before,
        "aggregates are counted as fallbacks"
    );

    gpu.collect("SET spate.gpu.fallback = 'warn'")
        .await
        .unwrap();
    gpu.collect("SELECT a FROM t WHERE a % 2 = 0")
        .await
        .unwrap();

    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    let err = gpu
        .collect("SELECT a FROM t WHERE a % 2 = 0")
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
    let err = gpu.collect("SELECT count(*) FROM t").await.unwrap_err();
    assert!(err.to_string().contains("cannot run on the GPU"), "{err}");
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
            _ => Some(r.below(1_600_000) as i32 - 800_000),
        })
        .collect();
    let schema = Arc::new(Schema::new(vec![Field::new("d", DataType::Date32, true)]));
    let batch =
        RecordBatch::try_new(schema, vec![Arc::new(Date32Array::from(days)) as ArrayRef]).unwrap();
    let gpu = engine_with(Backend::Emulated, 8192, 1);
    let cpu = engine_with(Backend::Cpu, 8192, 1);
    gpu.register_batches("dates", vec![batch.clone()]).unwrap();
    cpu.register_batches("dates", vec![batch]).unwrap();
    let sql = "SELECT d, extract(year FROM d), extract(month FROM d), extract(day FROM d) \
               FROM dates WHERE d IS NULL OR d > -1000000";
    assert_eq!(
        rows(&gpu.collect(sql).await.unwrap()),
        rows(&cpu.collect(sql).await.unwrap())
    );
    let plan = explain(&gpu, sql).await;
    assert!(plan.contains("GpuProjectionExec"), "{plan}");
}
