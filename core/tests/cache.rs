//! `CACHE TABLE` / `UNCACHE TABLE` on the `cpu` and `emulated` backends: results do not
//! change, cached GPU scans move no data over the bus, memory accounting sees the cache, a
//! cache that does not fit fails cleanly, and `EXPLAIN ANALYZE` reports the roofline.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate::{Backend, CacheLocation, Engine, SpateError};

mod common;
use common::ordered as lines;

const QUERY: &str = "SELECT l_returnflag, count(*), sum(l_quantity), min(l_shipdate) \
                     FROM lineitem WHERE l_discount > 0.02 GROUP BY l_returnflag \
                     ORDER BY l_returnflag";

fn engine(backend: Backend) -> Engine {
    let engine = Engine::builder()
        .backend(backend)
        .target_partitions(2)
        .build()
        .unwrap();
    spate::tpch::register_tpch(&engine, 0.01).unwrap();
    engine
}

fn text(batches: &[arrow::record_batch::RecordBatch]) -> String {
    lines(batches).join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_cache_keeps_results_and_is_accounted() {
    let engine = engine(Backend::Cpu);
    let want = text(&engine.collect(QUERY).await.unwrap());

    let report = text(&engine.collect("CACHE TABLE lineitem").await.unwrap());
    assert!(report.starts_with("lineitem|60175|"), "{report}");
    assert!(report.ends_with("|host"), "{report}");
    let cached = engine.cached_tables();
    assert_eq!(cached.len(), 1);
    assert_eq!(cached[0].location, CacheLocation::Host);
    assert_eq!(cached[0].rows, 60175);
    assert!(cached[0].bytes > 1_000_000, "{cached:?}");
    assert_eq!(text(&engine.collect(QUERY).await.unwrap()), want);

    // Caching again is a no-op.
    assert_eq!(engine.cache_table("LINEITEM").await.unwrap(), cached[0]);

    let freed = text(&engine.collect("UNCACHE TABLE lineitem").await.unwrap());
    assert!(freed.starts_with("lineitem|60175|"), "{freed}");
    assert!(engine.cached_tables().is_empty());
    assert_eq!(text(&engine.collect(QUERY).await.unwrap()), want);

    let err = engine.collect("UNCACHE TABLE lineitem").await.unwrap_err();
    assert!(
        matches!(err, SpateError::Config { .. }) && err.to_string().contains("not cached"),
        "{err}"
    );
    assert!(
        engine
            .collect("UNCACHE TABLE IF EXISTS lineitem")
            .await
            .unwrap()
            .iter()
            .all(|b| b.num_rows() == 0)
    );
    let err = engine
        .collect("CACHE TABLE no_such_table")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_such_table"), "{err}");
    let err = engine
        .collect("CACHE TABLE x AS SELECT 1")
        .await
        .unwrap_err();
    assert!(matches!(err, SpateError::Unsupported { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_cache_over_the_memory_limit_fails_and_leaves_the_table() {
    let engine = Engine::builder()
        .backend(Backend::Cpu)
        .target_partitions(2)
        .memory_limit(1 << 20)
        .build()
        .unwrap();
    spate::tpch::register_tpch(&engine, 0.01).unwrap();
    let err = engine.collect("CACHE TABLE lineitem").await.unwrap_err();
    assert!(
        matches!(err, SpateError::ResourcesExhausted { .. }),
        "{err:?}"
    );
    assert!(engine.cached_tables().is_empty());
    let rows = text(
        &engine
            .collect("SELECT count(*) FROM lineitem")
            .await
            .unwrap(),
    );
    assert_eq!(rows, "60175");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_cache_reads_device_memory_and_matches_the_cpu() {
    let cpu = engine(Backend::Cpu);
    let want = text(&cpu.collect(QUERY).await.unwrap());
    let gpu = engine(Backend::Emulated);
    let device = gpu.gpu().unwrap().device().clone();
    let before = device.memory_stats().allocated_bytes;

    let cached = gpu.cache_table("lineitem").await.unwrap();
    assert_eq!(cached.location, CacheLocation::Gpu);
    assert_eq!(cached.rows, 60175);
    let during = device.memory_stats().allocated_bytes;
    assert!(
        during >= before + cached.bytes,
        "allocated {before} → {during}, cached {}",
        cached.bytes
    );

    assert_eq!(text(&gpu.collect(QUERY).await.unwrap()), want);
    // Twice: the cached batches are shared, never consumed.
    assert_eq!(text(&gpu.collect(QUERY).await.unwrap()), want);
    // A query that joins a cached table with an uncached one.
    let join = "SELECT o_orderpriority, count(*) FROM orders JOIN lineitem ON l_orderkey = \
                o_orderkey WHERE l_quantity < 10 GROUP BY o_orderpriority ORDER BY 1";
    assert_eq!(
        text(&gpu.collect(join).await.unwrap()),
        text(&cpu.collect(join).await.unwrap())
    );

    let plan = text(
        &gpu.collect(&format!("EXPLAIN ANALYZE {QUERY}"))
            .await
            .unwrap(),
    );
    assert!(plan.contains("GpuCachedScanExec"), "{plan}");
    // The scan uploads nothing: no operator reads lineitem from the host.
    let scan_line = plan
        .lines()
        .find(|l| l.contains("GpuCachedScanExec"))
        .unwrap();
    assert!(!scan_line.contains("h2d_bytes=1"), "{scan_line}");
    let filter_line = plan.lines().find(|l| l.contains("GpuFilterExec")).unwrap();
    assert!(filter_line.contains("h2d_bytes=0"), "{filter_line}");
    assert!(filter_line.contains("dev_read_bytes="), "{filter_line}");
    assert!(filter_line.contains("dev_write_bytes="), "{filter_line}");
    assert!(
        filter_line.contains("roofline=floor ") && filter_line.contains("(emulated)"),
        "{filter_line}"
    );

    gpu.uncache_table("lineitem").unwrap();
    assert_eq!(device.memory_stats().allocated_bytes, before);
    assert_eq!(text(&gpu.collect(QUERY).await.unwrap()), want);
}

/// TPC-H Q3 over cached tables: the join build sides are merged from their partitions on the
/// device (`GpuCoalescePartitionsExec`), so no join uploads anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_merge_on_the_device_under_a_join() {
    let sql = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../benches/queries/tpch/q03.sql"
    ))
    .unwrap();
    let cpu = engine(Backend::Cpu);
    let gpu = engine(Backend::Emulated);
    for table in ["lineitem", "orders", "customer"] {
        gpu.cache_table(table).await.unwrap();
    }
    assert_eq!(
        text(&gpu.collect(&sql).await.unwrap()),
        text(&cpu.collect(&sql).await.unwrap())
    );
    let plan = text(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    );
    assert!(plan.contains("GpuCoalescePartitionsExec"), "{plan}");
    assert!(!plan.contains(" CoalescePartitionsExec"), "{plan}");
    for line in plan.lines().filter(|l| l.contains("GpuHashJoinExec")) {
        assert!(line.contains("h2d_bytes=0"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_cache_over_the_device_budget_fails_cleanly() {
    let gpu = Engine::builder()
        .backend(Backend::Emulated)
        .target_partitions(2)
        .gpu_memory_limit(1 << 20)
        .build()
        .unwrap();
    spate::tpch::register_tpch(&gpu, 0.01).unwrap();
    let err = gpu.collect("CACHE TABLE lineitem").await.unwrap_err();
    assert!(
        matches!(err, SpateError::ResourcesExhausted { .. }),
        "{err:?}"
    );
    assert!(gpu.cached_tables().is_empty());
    assert_eq!(
        gpu.gpu().unwrap().device().memory_stats().allocated_bytes,
        0,
        "a failed cache frees what it had uploaded"
    );
    let rows = text(&gpu.collect("SELECT count(*) FROM lineitem").await.unwrap());
    assert_eq!(rows, "60175");
}

/// A cache belongs to the table it was made from: dropping or replacing that table (through
/// the API or SQL DDL) ends it, and caching the new table of that name caches the new data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_or_replacing_a_table_ends_its_cache() {
    let engine = Engine::builder()
        .backend(Backend::Cpu)
        .target_partitions(2)
        .build()
        .unwrap();
    let rows = |engine: &Engine| -> Vec<(String, usize)> {
        engine
            .cached_tables()
            .into_iter()
            .map(|t| (t.name, t.rows))
            .collect()
    };

    // Through the API.
    engine
        .collect("CREATE TABLE t AS VALUES (1), (2), (3)")
        .await
        .unwrap();
    assert_eq!(engine.cache_table("t").await.unwrap().rows, 3);
    assert!(engine.deregister("t").unwrap());
    assert_eq!(rows(&engine), vec![]);
    engine
        .collect("CREATE TABLE t AS VALUES (1), (2), (3), (4), (5)")
        .await
        .unwrap();
    assert_eq!(rows(&engine), vec![]);
    assert_eq!(engine.cache_table("t").await.unwrap().rows, 5);
    assert_eq!(rows(&engine), vec![("t".to_string(), 5)]);

    // Through SQL: DROP TABLE, then CREATE OR REPLACE.
    engine.collect("DROP TABLE t").await.unwrap();
    assert_eq!(rows(&engine), vec![]);
    engine
        .collect("CREATE TABLE t AS VALUES (7)")
        .await
        .unwrap();
    assert_eq!(engine.cache_table("t").await.unwrap().rows, 1);
    engine
        .collect("CREATE OR REPLACE TABLE t AS VALUES (8), (9)")
        .await
        .unwrap();
    assert_eq!(rows(&engine), vec![]);
    let cached = text(&engine.collect("CACHE TABLE t").await.unwrap());
    assert!(cached.starts_with("t|2|"), "{cached}");
    let sum = text(&engine.collect("SELECT sum(column1) FROM t").await.unwrap());
    assert_eq!(sum, "17");
}
