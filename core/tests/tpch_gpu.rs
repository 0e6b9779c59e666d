//! TPC-H on GPU operators (emulated backend): all 22 queries at SF 0.01, and Q1 and Q6 (with
//! their expected GPU operators) also at SF 0.1, run whole on the GPU and equal the CPU's
//! results exactly.
//!
//! "Whole" is checked by running with `spate.gpu.fallback = 'error'`: any operator left on the
//! CPU fails the query.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate::{Backend, Engine};

mod common;
use common::ordered as lines;

fn query(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/queries/tpch/");
    std::fs::read_to_string(format!("{path}{name}.sql")).unwrap()
}

/// A GPU engine that fails on any CPU operator and a CPU engine, both over TPC-H at `sf`.
async fn engines(sf: f64) -> (Engine, Engine) {
    engines_with(sf, None).await
}

/// [`engines`], the GPU's device budget `gpu_budget` bytes when given.
async fn engines_with(sf: f64, gpu_budget: Option<usize>) -> (Engine, Engine) {
    let mut gpu = Engine::builder()
        .backend(Backend::Emulated)
        .target_partitions(2);
    if let Some(bytes) = gpu_budget {
        gpu = gpu.gpu_memory_limit(bytes);
    }
    let gpu = gpu.build().unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q1_and_q6_run_fully_on_the_gpu_and_match_the_cpu() {
    for sf in [0.01, 0.1] {
        let (gpu, cpu) = engines(sf).await;
        for name in ["q01", "q06"] {
            let sql = query(name);
            let want = lines(&cpu.collect(&sql).await.unwrap());
            let got = lines(
                &gpu.collect(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{name} at SF {sf} on the GPU: {e}")),
            );
            assert!(!want.is_empty(), "{name}");
            assert_eq!(got, want, "{name} at SF {sf}");
            let plan = lines(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
            for operator in ["GpuFilterExec", "GpuAggregateExec"] {
                assert!(plan.contains(operator), "{name}: {plan}");
            }
            if name == "q01" {
                assert!(plan.contains("GpuSortExec"), "{plan}");
            }
        }
    }
}

/// Device batch sizes the queries take turns with: 1 KiB and 64 KiB cut every table into many
/// device batches, so limits, join chunks and partial aggregates meet batch edges; the
/// default (128 MiB) gives one batch per partition.
const BATCH_BYTES: [Option<usize>; 3] = [Some(1 << 10), Some(64 << 10), None];

/// All 22 queries at SF 0.01: every operator on the GPU (`spate.gpu.fallback = 'error'`) and
/// the CPU's result, each query with one of [`BATCH_BYTES`]. (`spate bench tpch --verify`, run
/// by `scripts/test` at SF 0.01 and 0.1, reports the same with floats compared to a tolerance.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tpch_query_runs_fully_on_the_gpu() {
    let (gpu, cpu) = engines(0.01).await;
    for n in 1..=22 {
        let name = format!("q{n:02}");
        let sql = query(&name);
        let bytes = BATCH_BYTES[n % BATCH_BYTES.len()].unwrap_or(128 << 20);
        gpu.collect(&format!("SET spate.gpu.batch_bytes = {bytes}"))
            .await
            .unwrap();
        let got = gpu
            .collect(&sql)
            .await
            .unwrap_or_else(|e| panic!("{name} on the GPU: {e}"));
        let want = cpu.collect(&sql).await.unwrap();
        assert_eq!(
            lines(&got),
            lines(&want),
            "{name} with spate.gpu.batch_bytes = {bytes}"
        );
    }
}

/// Q18 joins lineitem (600,000 rows at SF 0.1) three ways and groups it by order: under a 2 MiB
/// device budget its aggregations and joins spill to the host, and it still equals the CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q18_under_a_2_mib_budget_matches_the_cpu() {
    let (gpu, cpu) = engines_with(0.1, Some(2 << 20)).await;
    let sql = query("q18");
    let want = lines(&cpu.collect(&sql).await.unwrap());
    let got = lines(&gpu.collect(&sql).await.unwrap());
    assert!(!want.is_empty());
    assert_eq!(got, want);
    let peak = gpu.gpu().unwrap().device().memory_stats().peak_bytes;
    assert!(peak <= 2 << 20, "peak {peak} bytes");
}
