//! Joins whose build keys are known unique before they run (`plan::unique`): from columns a
//! cached table proved unique at load (`exec::column_facts`), through filters, projections and
//! aggregations. Such a join probes unique keys from its first batch, so its output keeps its
//! count on the device and reads nothing back (issue 16). Every query here must also give the
//! CPU's rows: a join that wrongly took its keys for unique would drop matches.

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

/// `dim`: 50 rows with a key in order (`d_k`), a unique key out of order (`d_u`), a repeated
/// one (`d_g`) and names of several lengths. `fact`: 3,000 rows whose `f_k` matches keys
/// 0..60 (some match nothing).
fn tables() -> (RecordBatch, RecordBatch) {
    let dim = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("d_k", DataType::Int64, false),
            Field::new("d_u", DataType::Int64, false),
            Field::new("d_g", DataType::Int64, false),
            Field::new("d_name", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(Int64Array::from_iter_values(0..50)) as ArrayRef,
            Arc::new(Int64Array::from_iter_values((0..50).map(|k| (k * 7) % 50))),
            Arc::new(Int64Array::from_iter_values((0..50).map(|k| k % 5))),
            Arc::new(StringArray::from_iter_values(
                (0..50).map(|k| format!("name {}", "x".repeat(k % 13))),
            )),
        ],
    )
    .unwrap();
    let fact = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("f_k", DataType::Int64, false),
            Field::new("f_v", DataType::Int64, false),
        ])),
        vec![
            Arc::new(Int64Array::from_iter_values((0..3000).map(|i| i % 60))) as ArrayRef,
            Arc::new(Int64Array::from_iter_values(0..3000)),
        ],
    )
    .unwrap();
    (dim, fact)
}

/// An engine over `dim` and `fact`, cached in device memory when `cached`.
async fn engine(backend: Backend, cached: bool) -> Engine {
    let e = Engine::builder()
        .backend(backend)
        .target_partitions(1)
        .build()
        .unwrap();
    let (dim, fact) = tables();
    e.register_batches("dim", vec![dim]).unwrap();
    e.register_batches("fact", vec![fact]).unwrap();
    if cached {
        e.collect("CACHE TABLE dim").await.unwrap();
        e.collect("CACHE TABLE fact").await.unwrap();
    }
    if backend != Backend::Cpu {
        e.collect("SET spate.gpu.fallback = 'error'").await.unwrap();
    }
    e
}

fn sorted(mut rows: Vec<String>) -> Vec<String> {
    rows.sort();
    rows
}

/// The GPU plan's join line, after checking that `sql` gives the CPU's rows.
async fn join_line(gpu: &Engine, cpu: &Engine, sql: &str) -> String {
    assert_eq!(
        sorted(ordered(&gpu.collect(sql).await.unwrap())),
        sorted(ordered(&cpu.collect(sql).await.unwrap())),
        "{sql}"
    );
    let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
    plan.lines()
        .find(|l| l.contains("GpuHashJoinExec"))
        .unwrap_or_else(|| panic!("a GPU join: {plan}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_unique_keys_reach_the_join_through_filters_projections_and_aggregations() {
    let gpu = engine(Backend::Emulated, true).await;
    let cpu = engine(Backend::Cpu, false).await;
    let cases = [
        // In order, and unique but out of order (the hash check).
        ("SELECT d_name, f_v FROM dim JOIN fact ON d_k = f_k", true),
        ("SELECT d_name, f_v FROM dim JOIN fact ON d_u = f_k", true),
        // Repeated keys.
        ("SELECT d_name, f_v FROM dim JOIN fact ON d_g = f_k", false),
        // Through a filter and a projection of columns.
        (
            "SELECT n, f_v FROM (SELECT d_k AS k, d_name AS n FROM dim WHERE d_g <> 2) d \
             JOIN fact ON d.k = f_k",
            true,
        ),
        // A computed key is not known unique, even from a unique column.
        (
            "SELECT n, f_v FROM (SELECT d_k % 7 AS k, d_name AS n FROM dim) d \
             JOIN fact ON d.k = f_k",
            false,
        ),
        // An aggregation's group keys are unique in its output.
        (
            "SELECT g, c, f_v FROM (SELECT d_g AS g, count(*) AS c FROM dim GROUP BY d_g) a \
             JOIN fact ON a.g = f_k",
            true,
        ),
        // A unique build key stays unique above a join whose other side's keys are unique.
        (
            "SELECT d1.d_name, f_v FROM \
             (SELECT a.d_k AS k, a.d_name FROM dim a JOIN dim b ON a.d_k = b.d_u) d1 \
             JOIN fact ON d1.k = f_k",
            true,
        ),
    ];
    for (sql, unique) in cases {
        let line = join_line(&gpu, &cpu, sql).await;
        assert_eq!(line.contains("build_keys=unique"), unique, "{sql}: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_that_are_not_cached_prove_nothing() {
    let gpu = engine(Backend::Emulated, false).await;
    let cpu = engine(Backend::Cpu, false).await;
    let line = join_line(
        &gpu,
        &cpu,
        "SELECT d_name, f_v FROM dim JOIN fact ON d_k = f_k",
    )
    .await;
    assert!(!line.contains("build_keys=unique"), "{line}");
}

/// With its build keys known unique, a probe batch of filtered rows keeps its output count on
/// the device, and the build side's strings (sized by their longest value) do not wait for
/// their byte totals either: the join reads nothing back. The ungrouped aggregation above
/// folds the join's output up to its count, and reads nothing back either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_on_cached_unique_keys_reads_nothing_back() {
    let gpu = engine(Backend::Emulated, true).await;
    let cpu = engine(Backend::Cpu, false).await;
    let sql = "SELECT count(*), sum(f_v), max(length(d_name)) FROM dim JOIN fact \
               ON d_k = f_k WHERE f_v < 2000 AND d_name LIKE 'name x%'";
    assert_eq!(
        ordered(&gpu.collect(sql).await.unwrap()),
        ordered(&cpu.collect(sql).await.unwrap())
    );
    let plan = ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    )
    .join("\n");
    for operator in ["GpuHashJoinExec", "GpuAggregateExec"] {
        let line = plan
            .lines()
            .find(|l| l.contains(operator))
            .unwrap_or_else(|| panic!("{operator}: {plan}"));
        assert!(line.contains("d2h_bytes=0,"), "{operator}: {plan}");
        assert!(line.contains("host_syncs=0,"), "{operator}: {plan}");
    }
}

/// A join filter over both sides runs on a unique probe's candidate pairs, on the device: the
/// join still reads nothing back (the build side's strings are sized by their longest value,
/// the probe side's are taken once). Inner, left, semi and anti joins give the CPU's rows,
/// whichever side the planner builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_filter_on_unique_keys_runs_on_the_device() {
    let gpu = engine(Backend::Emulated, true).await;
    let cpu = engine(Backend::Cpu, false).await;
    // (Arithmetic that can fail would read its error word back: comparisons only.)
    let inner = "SELECT count(*), sum(f_v), max(length(d_name)) FROM dim JOIN fact \
                 ON d_k = f_k AND (f_v > 2500 OR d_name LIKE 'name xx%')";
    let line = join_line(&gpu, &cpu, inner).await;
    assert!(line.contains("build_keys=unique"), "{line}");
    assert!(line.contains("filter="), "{line}");
    let plan = ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {inner}"))
            .await
            .unwrap(),
    )
    .join("\n");
    let line = plan
        .lines()
        .find(|l| l.contains("GpuHashJoinExec"))
        .unwrap_or_else(|| panic!("a GPU join: {plan}"));
    assert!(line.contains("d2h_bytes=0,"), "{plan}");
    assert!(line.contains("host_syncs=0,"), "{plan}");
    let others = [
        "SELECT d_name, f_v FROM dim JOIN fact ON d_k = f_k AND f_v > d_u * 40",
        "SELECT d_name, f_v FROM dim LEFT JOIN fact ON d_k = f_k AND f_v > d_u * 40",
        "SELECT d_name, f_v FROM fact RIGHT JOIN dim ON d_k = f_k AND f_v > d_u * 40",
        "SELECT d_name FROM dim WHERE EXISTS \
         (SELECT 1 FROM fact WHERE f_k = d_k AND f_v > d_u * 40)",
        "SELECT d_name FROM dim WHERE NOT EXISTS \
         (SELECT 1 FROM fact WHERE f_k = d_k AND f_v > d_u * 40)",
        "SELECT f_v FROM fact WHERE EXISTS \
         (SELECT 1 FROM dim WHERE d_k = f_k AND d_name LIKE 'name xxx%' AND f_v % 2 = 1)",
        "SELECT f_v FROM fact WHERE NOT EXISTS \
         (SELECT 1 FROM dim WHERE d_k = f_k AND d_name LIKE 'name xxx%' AND f_v % 2 = 1)",
        // Nothing passes the filter.
        "SELECT d_name, f_v FROM dim JOIN fact ON d_k = f_k AND f_v < 0",
    ];
    for sql in others {
        join_line(&gpu, &cpu, sql).await;
    }
}

/// With the probe keys known unique (the larger table built, join reordering off), a build
/// row pairs with one probe row at most: a probe batch's pairs fit the build side, are listed
/// for that bound and keep their count on the device, so the join reads nothing back, with or
/// without a filter. Inner, left, semi and anti joins give the CPU's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_probe_keys_pair_within_the_build_side() {
    let gpu = engine(Backend::Emulated, true).await;
    let cpu = engine(Backend::Cpu, false).await;
    for e in [&gpu, &cpu] {
        e.collect("SET datafusion.optimizer.join_reordering = false")
            .await
            .unwrap();
    }
    let counted = [
        "SELECT count(*), sum(f_v), max(length(d_name)) FROM fact JOIN dim ON f_k = d_k",
        "SELECT count(*), sum(f_v), max(length(d_name)) FROM fact JOIN dim \
         ON f_k = d_u AND (f_v > 2500 OR d_name LIKE 'name xx%')",
    ];
    for sql in counted {
        let line = join_line(&gpu, &cpu, sql).await;
        assert!(line.contains("probe_keys=unique"), "{sql}: {line}");
        let plan = ordered(
            &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
                .await
                .unwrap(),
        )
        .join("\n");
        let line = plan
            .lines()
            .find(|l| l.contains("GpuHashJoinExec"))
            .unwrap_or_else(|| panic!("a GPU join: {plan}"));
        assert!(line.contains("d2h_bytes=0,"), "{sql}: {plan}");
        assert!(line.contains("host_syncs=0,"), "{sql}: {plan}");
    }
    let others = [
        "SELECT f_v, d_name FROM fact JOIN dim ON f_k = d_k",
        "SELECT f_v, d_name FROM fact LEFT JOIN dim ON f_k = d_k",
        "SELECT f_v, d_name FROM fact LEFT JOIN dim ON f_k = d_k AND f_v > d_u * 40",
        "SELECT f_v FROM fact WHERE EXISTS \
         (SELECT 1 FROM dim WHERE d_k = f_k AND d_name LIKE 'name xxx%' AND f_v % 2 = 1)",
        "SELECT f_v FROM fact WHERE NOT EXISTS \
         (SELECT 1 FROM dim WHERE d_k = f_k AND d_name LIKE 'name xxx%' AND f_v % 2 = 1)",
        // Repeated probe keys pair as before.
        "SELECT f_v, d_name FROM fact JOIN dim ON f_k = d_g",
        "SELECT f_v, d_name FROM fact JOIN dim ON f_k = d_k AND f_v < 0",
    ];
    for sql in others {
        join_line(&gpu, &cpu, sql).await;
    }
}
