//! Injected device faults (`spate_kernels::faults`).
//!
//! - Every allocation of a join, an aggregation, a sort and a filtered projection is made to
//!   fail in turn, in memory and spilling to the host: each run either returns the CPU's
//!   rows or fails with a typed out-of-memory error, never panics, and leaves no device or
//!   pinned memory behind.
//! - A sticky fault in a kernel fails the running query with a clear error and marks the
//!   device unhealthy; later queries then run on the CPU or are refused, as
//!   `spate.gpu.on_device_error` says.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use spate::{Backend, Engine, SpateError};

mod common;
use common::ordered;

/// `rows` rows: `k` (NULL every 11th), `s` from `k`, `v` distinct.
fn table(rows: i64, keys: i64) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, false),
    ]));
    let k: Vec<Option<i64>> = (0..rows)
        .map(|i| (i % 11 != 0).then_some((i * 7919) % keys))
        .collect();
    let s: Vec<Option<String>> = k.iter().map(|k| k.map(|k| format!("s{k}"))).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(k)),
        Arc::new(StringArray::from(s)),
        Arc::new(Int64Array::from_iter_values(
            (0..rows).map(|i| i * 31 % 1009),
        )),
    ];
    vec![RecordBatch::try_new(schema, columns).unwrap()]
}

fn engine(backend: Backend, gpu_budget: Option<usize>) -> Engine {
    let mut builder = Engine::builder().backend(backend).target_partitions(2);
    if let Some(bytes) = gpu_budget {
        builder = builder.gpu_memory_limit(bytes);
    }
    let engine = builder.build().unwrap();
    engine.register_batches("l", table(3000, 700)).unwrap();
    engine.register_batches("r", table(2000, 900)).unwrap();
    engine
}

fn sorted(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = ordered(batches);
    rows.sort();
    rows
}

const QUERIES: [&str; 4] = [
    "SELECT l.k, l.s, r.v FROM l JOIN r ON l.k = r.k",
    "SELECT k, s, sum(v), count(*) FROM l GROUP BY k, s",
    "SELECT k, v, s FROM l ORDER BY v DESC, k",
    // A failure in the filter or the projection is retried on halves (`exec/retry.rs`); one
    // in the upload below them fails the query.
    "SELECT k + v AS kv, upper(s) FROM l WHERE v % 3 = 0",
];

/// The device's memory and the pinned bytes in use once the query's tasks are gone. A failed
/// query returns as soon as one partition fails; DataFusion aborts the tasks that ran the
/// others (a CPU merge of GPU partitions) without waiting, so their memory comes back a moment
/// later. A leak never does: this waits up to 5 seconds.
async fn settled(device: &spate::kernels::Device) -> (spate::kernels::MemoryStats, usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (memory, pinned) = (device.memory_stats(), device.pinned_pool().in_use_bytes());
        let clean = memory.allocated_bytes == 0 && memory.reserved_bytes == 0 && pinned == 0;
        if clean || std::time::Instant::now() > deadline {
            return (memory, pinned);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Walks a failure over every device allocation of each of `queries` on `gpu`.
async fn walk(gpu: &Engine, cpu: &Engine, queries: &[&str]) {
    let device = gpu.gpu().unwrap().device().clone();
    for &sql in queries {
        let want = sorted(&cpu.collect(sql).await.unwrap());
        let before = device.counters().allocations;
        assert_eq!(sorted(&gpu.collect(sql).await.unwrap()), want, "{sql}");
        let total = device.counters().allocations - before;
        assert!(total > 0, "{sql}: no device allocation to fail");
        let mut failed = 0;
        for n in 1..=total + 2 {
            device.inject_alloc_failure(n);
            let outcome = gpu.collect(sql).await;
            device.inject_alloc_failure(0);
            match outcome {
                Ok(batches) => assert_eq!(sorted(&batches), want, "{sql}, allocation {n}"),
                Err(SpateError::ResourcesExhausted { message }) => {
                    assert!(message.contains("GPU out of memory"), "{message}");
                    failed += 1;
                }
                Err(other) => panic!("{sql}, allocation {n} of {total}: {other:?}"),
            }
            let (memory, pinned) = settled(&device).await;
            assert_eq!(
                (memory.allocated_bytes, memory.reserved_bytes),
                (0, 0),
                "{sql}: device memory left behind after allocation {n} failed"
            );
            assert_eq!(
                pinned, 0,
                "{sql}: pinned memory left behind after allocation {n} failed"
            );
        }
        assert!(failed > 0, "{sql}: no injected failure reached the query");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_allocation_failure_is_a_typed_error_and_leaks_nothing() {
    let cpu = engine(Backend::Cpu, None);
    walk(&engine(Backend::Emulated, None), &cpu, &QUERIES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_failures_while_spilling_are_typed_errors_and_leak_nothing() {
    let cpu = engine(Backend::Cpu, None);
    // 192 KiB: the join and the aggregation spill to the host (sorts do not spill yet).
    walk(
        &engine(Backend::Emulated, Some(192 << 10)),
        &cpu,
        &QUERIES[..2],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_fault_fails_the_query_then_the_policy_decides() {
    let cpu = engine(Backend::Cpu, None);
    let sql = QUERIES[1];
    let want = sorted(&cpu.collect(sql).await.unwrap());
    for policy in ["cpu", "error"] {
        let gpu = engine(Backend::Emulated, None);
        gpu.collect(&format!("SET spate.gpu.on_device_error = '{policy}'"))
            .await
            .unwrap();
        let device = gpu.gpu().unwrap().device().clone();
        device.inject_launch_fault(1);
        let err = gpu.collect(sql).await.unwrap_err().to_string();
        assert!(
            err.contains("unhealthy") && err.contains("injected fault"),
            "{err}"
        );
        assert!(device.check_health().is_err());
        let later = gpu.collect(sql).await;
        match policy {
            "cpu" => {
                assert_eq!(sorted(&later.unwrap()), want);
                let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap());
                assert!(!plan.join("\n").contains("GpuAggregateExec"), "{plan:?}");
            }
            _ => {
                let err = later.unwrap_err().to_string();
                assert!(
                    err.contains("refused") && err.contains("unhealthy"),
                    "{err}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_device_fault_a_cached_table_is_read_from_its_source() {
    let cpu = engine(Backend::Cpu, None);
    let sql = QUERIES[1];
    let want = sorted(&cpu.collect(sql).await.unwrap());
    let gpu = engine(Backend::Emulated, None);
    gpu.cache_table("l").await.unwrap();
    let device = gpu.gpu().unwrap().device().clone();
    device.inject_launch_fault(1);
    assert!(gpu.collect(sql).await.is_err());
    assert!(device.check_health().is_err());
    // The device's memory cannot be read any more: the table's original source is.
    assert_eq!(sorted(&gpu.collect(sql).await.unwrap()), want);
    let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap());
    assert!(!plan.join("\n").contains("GpuCachedScanExec"), "{plan:?}");
}
