//! Several devices in one process (emulated): every GPU subtree runs one partition per device,
//! with exchanges between devices, and every TPC-H query equals the CPU's result.
//!
//! The emulated devices are as strict as GPUs without peer access: a kernel or a copy on one
//! device handed another device's buffer is refused (see `kernels/tests/device.rs`), so a
//! batch that crossed devices without an exchange fails the query here.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate::{Backend, Devices, Engine};

mod common;
use common::ordered as lines;

fn query(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/queries/tpch/");
    std::fs::read_to_string(format!("{path}{name}.sql")).unwrap()
}

/// A GPU engine on `devices` emulated devices that fails on any CPU operator, and a CPU engine,
/// both over TPC-H at `sf`.
async fn engines(sf: f64, devices: usize) -> (Engine, Engine) {
    let gpu = Engine::builder()
        .backend(Backend::Emulated)
        .devices(Devices::Count(devices))
        .target_partitions(2)
        .build()
        .unwrap();
    let cpu = Engine::builder()
        .backend(Backend::Cpu)
        .target_partitions(2)
        .build()
        .unwrap();
    spate::tpch::register_tpch(&gpu, sf).unwrap();
    spate::tpch::register_tpch(&cpu, sf).unwrap();
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    (gpu, cpu)
}

async fn explain(engine: &Engine, sql: &str) -> String {
    lines(&engine.collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n")
}

/// All 22 queries on four devices, each with small or default device batches: the CPU's
/// result, and every device did work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tpch_query_on_four_devices_matches_the_cpu() {
    let (gpu, cpu) = engines(0.01, 4).await;
    let context = gpu.gpu().unwrap();
    assert_eq!(context.devices().len(), 4);
    let before: Vec<_> = context.devices().iter().map(|d| d.counters()).collect();
    for n in 1..=22 {
        let name = format!("q{n:02}");
        let sql = query(&name);
        let bytes = if n % 2 == 0 { 64 << 10 } else { 128 << 20 };
        gpu.collect(&format!("SET spate.gpu.batch_bytes = {bytes}"))
            .await
            .unwrap();
        let got = gpu
            .collect(&sql)
            .await
            .unwrap_or_else(|e| panic!("{name} on four devices: {e}"));
        let want = cpu.collect(&sql).await.unwrap();
        assert_eq!(
            lines(&got),
            lines(&want),
            "{name} with spate.gpu.batch_bytes = {bytes}"
        );
    }
    for (i, (device, before)) in context.devices().iter().zip(before).enumerate() {
        let ran = device.counters() - before;
        assert!(ran.launches > 0, "device {i} launched nothing");
        assert_eq!(device.memory_stats().allocated_bytes, 0, "device {i}");
    }
}

/// The exchanges a plan over several devices gets: a shuffle between an aggregation's two
/// stages, a broadcast build side, a gather under a global sort, a spread of the scans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_over_several_devices_exchange_between_them() {
    let (gpu, _) = engines(0.01, 2).await;
    let q1 = explain(&gpu, &query("q01")).await;
    assert!(q1.contains("GpuExchangeExec: spread, devices=2"), "{q1}");
    assert!(
        q1.contains("GpuExchangeExec: shuffle by [l_returnflag"),
        "{q1}"
    );
    assert!(!q1.contains("RepartitionExec: partitioning=Hash"), "{q1}");
    // A small dimension table joined to a large one: broadcast to both devices.
    let sql = "SELECT n_name, count(*) FROM supplier JOIN nation ON s_nationkey = n_nationkey \
               GROUP BY n_name ORDER BY n_name";
    let plan = explain(&gpu, sql).await;
    assert!(plan.contains("GpuExchangeExec: broadcast"), "{plan}");
    assert!(plan.contains("GpuExchangeExec: gather"), "{plan}");
    // A global aggregate gathers its partial states onto one device.
    let plan = explain(&gpu, "SELECT sum(l_quantity) FROM lineitem").await;
    assert!(plan.contains("GpuExchangeExec: gather"), "{plan}");
}

/// One device is the plan of `plan/regions.rs`: no exchange between devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_device_has_no_exchanges() {
    let (gpu, _) = engines(0.01, 1).await;
    let plan = explain(&gpu, &query("q03")).await;
    assert!(!plan.contains("GpuExchangeExec"), "{plan}");
}

/// A session of four devices opens four, each with its own memory budget; a bad list is a
/// typed configuration error.
#[test]
fn devices_open_each_with_its_own_budget() {
    let engine = Engine::builder()
        .backend(Backend::Emulated)
        .devices("cuda:0,2,5".parse().unwrap())
        .gpu_memory_limit(8 << 20)
        .build()
        .unwrap();
    let devices = engine.gpu().unwrap().devices();
    let ordinals: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
    assert_eq!(ordinals, [0, 2, 5]);
    for d in devices {
        assert_eq!(d.memory_stats().budget_bytes, 8 << 20);
    }
    let err = "cuda:1,1".parse::<Devices>().unwrap_err();
    assert!(matches!(err, spate::SpateError::Config { .. }), "{err}");
}

/// `CACHE TABLE … SHARDED BY` places each row on the device the exchange would send it to: a
/// join of two tables sharded by its keys needs no exchange, and equals the CPU. A table
/// cached round robin is spread over the devices too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_sharded_by_their_join_keys_join_without_an_exchange() {
    let (gpu, cpu) = engines(0.01, 4).await;
    for engine in [&gpu, &cpu] {
        // Partitioned joins (not a broadcast of the smaller side).
        engine
            .collect("SET datafusion.optimizer.hash_join_single_partition_threshold = 0")
            .await
            .unwrap();
        engine
            .collect("SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0")
            .await
            .unwrap();
    }
    gpu.collect("CACHE TABLE lineitem SHARDED BY (l_orderkey)")
        .await
        .unwrap();
    gpu.collect("cache table orders sharded by (o_orderkey)")
        .await
        .unwrap();
    gpu.collect("CACHE TABLE customer").await.unwrap();
    let tables = gpu.cached_tables();
    let lineitem = tables.iter().find(|t| t.name == "lineitem").unwrap();
    assert_eq!(lineitem.sharded_by, ["l_orderkey"]);
    assert_eq!(lineitem.shards.len(), 4);
    assert_eq!(
        lineitem.shards.iter().map(|s| s.rows).sum::<usize>(),
        lineitem.rows
    );
    assert!(lineitem.shards.iter().all(|s| s.rows > 0), "{lineitem:?}");
    let customer = tables.iter().find(|t| t.name == "customer").unwrap();
    assert!(customer.sharded_by.is_empty());
    assert_eq!(customer.shards.len(), 4);

    let sql = "SELECT o_orderpriority, count(*) AS n, sum(l_quantity) AS q \
               FROM orders JOIN lineitem ON o_orderkey = l_orderkey \
               GROUP BY o_orderpriority ORDER BY o_orderpriority";
    let plan = explain(&gpu, sql).await;
    assert!(plan.contains("mode=Partitioned"), "{plan}");
    assert!(
        plan.contains("GpuExchangeExec: shuffle by [o_orderpriority"),
        "{plan}"
    );
    assert!(plan.contains("sharded_by=[l_orderkey"), "{plan}");
    let join_to_scans = &plan[plan.find("GpuHashJoinExec").unwrap()..];
    assert!(
        !join_to_scans.contains("shuffle by [o_orderkey")
            && !join_to_scans.contains("shuffle by [l_orderkey"),
        "{plan}"
    );
    assert_eq!(
        lines(&gpu.collect(sql).await.unwrap()),
        lines(&cpu.collect(sql).await.unwrap())
    );
    // A cached table round robin, and the same table scanned through a plan on one device.
    let sql = "SELECT c_mktsegment, count(*) FROM customer GROUP BY c_mktsegment ORDER BY 1";
    assert_eq!(
        lines(&gpu.collect(sql).await.unwrap()),
        lines(&cpu.collect(sql).await.unwrap())
    );
    gpu.collect("SET spate.gpu.one_partition = false")
        .await
        .unwrap();
    assert_eq!(
        lines(&gpu.collect(sql).await.unwrap()),
        lines(&cpu.collect(sql).await.unwrap())
    );
    let err = gpu
        .collect("CACHE TABLE nation SHARDED BY (no_such_column)")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no column 'no_such_column'"),
        "{err}"
    );
    // Only the clause is rewritten: the rest of the text keeps its quotes and escapes.
    let statements = gpu
        .parse("SELECT 'it''s SHARDED BY (x)' AS x; CACHE TABLE nation SHARDED BY (n_regionkey)")
        .unwrap();
    assert_eq!(statements.len(), 2);
    assert!(
        statements[0].to_string().contains("'it''s SHARDED BY (x)'"),
        "{}",
        statements[0]
    );
    assert!(
        statements[1]
            .to_string()
            .contains("'spate.sharded_by' = 'n_regionkey'"),
        "{}",
        statements[1]
    );
}

/// A plan kept in the partitions DataFusion planned (`spate.gpu.one_partition = false`, as a
/// Ballista executor runs its stages) runs on one device: the partitions of a collect-left
/// join share one build side. (Spread over two devices, each built its own by scanning the
/// build side's Parquet file again, and a file scan hands its file out once: every row after
/// the first device's came back without its match.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_not_spread_over_the_devices_joins_on_one() {
    let dir = tempfile::tempdir().unwrap();
    spate::tpch::write_parquet(0.01, dir.path(), |_| {}).unwrap();
    let gpu = Engine::builder()
        .backend(Backend::Emulated)
        .devices(Devices::Count(2))
        .target_partitions(2)
        .build()
        .unwrap();
    let cpu = Engine::builder()
        .backend(Backend::Cpu)
        .target_partitions(2)
        .build()
        .unwrap();
    for engine in [&gpu, &cpu] {
        for table in ["orders", "lineitem"] {
            engine
                .register_parquet(table, dir.path().join(format!("{table}.parquet")))
                .await
                .unwrap();
        }
    }
    gpu.collect("SET spate.gpu.one_partition = false")
        .await
        .unwrap();
    let sql =
        "SELECT o_orderkey, l_linenumber FROM orders JOIN lineitem ON o_orderkey = l_orderkey";
    let mut got = lines(&gpu.collect(sql).await.unwrap());
    let mut want = lines(&cpu.collect(sql).await.unwrap());
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
}
