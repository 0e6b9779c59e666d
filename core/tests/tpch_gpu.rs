//! TPC-H Q1 and Q6 run whole on GPU operators (emulated backend) at SF 0.01 and 0.1, and equal
//! the CPU's results exactly (both are decimal-only queries).
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q1_and_q6_run_fully_on_the_gpu_and_match_the_cpu() {
    for sf in [0.01, 0.1] {
        let gpu = Engine::builder()
            .backend(Backend::Emulated)
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
