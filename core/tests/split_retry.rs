//! Split-and-retry (`exec/retry.rs`): a GPU filter, projection, join probe or partial
//! aggregation that runs out of device memory on a batch asks the spill coordinator to move
//! cached tables and operators' held input to the host, retries on the batch's halves, and
//! after three splits computes the piece on the CPU (a probe's piece fails instead). Each run's rows
//! equal the CPU engine's, and `EXPLAIN ANALYZE` counts what happened.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use spate::datafusion;
use spate::{Backend, Engine};

mod common;
use common::ordered;

/// `rows` rows: `k` (NULL every 11th), `s` from `k` (NULL every 5th key), `v`.
fn table(rows: i64, seed: i64) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, false),
    ]));
    let k: Vec<Option<i64>> = (0..rows)
        .map(|i| (i % 11 != 0).then_some((i * 7919 + seed) % 613))
        .collect();
    let s: Vec<Option<String>> = k
        .iter()
        .map(|k| k.and_then(|k| (k % 5 != 0).then(|| format!("value-{k}"))))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(k)),
        Arc::new(StringArray::from(s)),
        Arc::new(Int64Array::from_iter_values(
            (0..rows).map(|i| (i * 31 + seed) % 1009),
        )),
    ];
    vec![RecordBatch::try_new(schema, columns).unwrap()]
}

/// An emulated engine and a CPU one, with tables `a` and `b` cached (in device memory on the
/// emulated engine), so that a query's first device allocation is its own operators'.
async fn engines() -> (Engine, Engine) {
    engines_in(1).await
}

/// [`engines`], with `partitions` target partitions.
async fn engines_in(partitions: usize) -> (Engine, Engine) {
    let build = |backend| {
        let engine = Engine::builder()
            .backend(backend)
            .target_partitions(partitions)
            .build()
            .unwrap();
        engine.register_batches("a", table(6000, 0)).unwrap();
        engine.register_batches("b", table(4000, 17)).unwrap();
        engine
    };
    let (gpu, cpu) = (build(Backend::Emulated), build(Backend::Cpu));
    for t in ["a", "b"] {
        gpu.cache_table(t).await.unwrap();
    }
    (gpu, cpu)
}

fn sorted(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = ordered(batches);
    rows.sort();
    rows
}

/// Runs `sql` on the GPU engine: its rows, and the executed plan with its metrics.
async fn execute(gpu: &Engine, sql: &str) -> datafusion::error::Result<(Vec<RecordBatch>, String)> {
    let frame = gpu.sql(sql).await.unwrap();
    let context = Arc::new(frame.task_ctx());
    let plan = frame.create_physical_plan().await.unwrap();
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), context).await?;
    let shown = DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(true)
        .to_string();
    Ok((batches, shown))
}

/// Runs `sql` on the GPU engine, checks its rows against the CPU's, and returns the executed
/// plan with its metrics.
async fn run(gpu: &Engine, cpu: &Engine, sql: &str) -> String {
    let want = sorted(&cpu.collect(sql).await.unwrap());
    let (got, shown) = execute(gpu, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert!(!want.is_empty(), "{sql}: no rows to compare");
    assert_eq!(sorted(&got), want, "{sql}");
    shown
}

/// Fails each of `sql`'s device allocations in turn: every run returns the CPU's rows or a
/// typed out-of-memory error. Returns how many runs counted `counted` on `operator` (a line of
/// the plan naming it) and still returned the rows.
async fn walk(gpu: &Engine, cpu: &Engine, sql: &str, operator: &str, counted: &str) -> usize {
    walk_until(gpu, cpu, sql, (operator, counted), 1, usize::MAX).await
}

/// [`walk`] with `in_a_row` allocations failing from each, stopping once `enough` runs counted
/// `counted` on `operator`.
async fn walk_until(
    gpu: &Engine,
    cpu: &Engine,
    sql: &str,
    (operator, counted): (&str, &str),
    in_a_row: u64,
    enough: usize,
) -> usize {
    let device = gpu.gpu().unwrap().device().clone();
    let want = sorted(&cpu.collect(sql).await.unwrap());
    let before = device.counters().allocations;
    run(gpu, cpu, sql).await;
    let total = device.counters().allocations - before;
    let mut retried = 0;
    for n in 1..=total {
        device.inject_alloc_failures(n, in_a_row);
        let outcome = execute(gpu, sql).await;
        device.inject_alloc_failure(0);
        match outcome {
            Ok((batches, shown)) => {
                assert_eq!(sorted(&batches), want, "allocation {n}");
                if metric(&shown, operator, counted) > 0 {
                    retried += 1;
                    if retried >= enough {
                        break;
                    }
                }
            }
            Err(e) => assert!(e.to_string().contains("GPU out of memory"), "{e}"),
        }
    }
    retried
}

/// The sum of `metric=N` over the lines naming `operator`.
fn metric(plan: &str, operator: &str, metric: &str) -> usize {
    plan.lines()
        .filter(|l| l.contains(operator))
        .filter_map(|l| {
            let at = l.find(&format!("{metric}="))? + metric.len() + 1;
            l[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<usize>()
                .ok()
        })
        .sum()
}

const FILTER: &str = "SELECT k, s, v FROM b WHERE v % 7 = 1 AND s IS NOT NULL";
const PROJECTION: &str = "SELECT k + v AS kv, upper(s) AS u, v * 2 AS w FROM b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_that_runs_out_retries_on_the_halves_of_its_batch() {
    let (gpu, cpu) = engines().await;
    let device = gpu.gpu().unwrap().device().clone();
    for sql in [FILTER, PROJECTION] {
        // Not retried: a plain run splits nothing.
        let plan = run(&gpu, &cpu, sql).await;
        assert_eq!(metric(&plan, "Gpu", "oom_splits"), 0, "{plan}");
        // The query's first device allocation fails once: its batch is split in two, and both
        // halves go through on the GPU.
        device.inject_alloc_failure(1);
        let plan = run(&gpu, &cpu, sql).await;
        device.inject_alloc_failure(0);
        assert_eq!(metric(&plan, "Gpu", "oom_splits"), 1, "{sql}\n{plan}");
        assert_eq!(metric(&plan, "Gpu", "cpu_fallbacks"), 0, "{sql}\n{plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_three_splits_a_piece_runs_on_the_cpu() {
    let (gpu, cpu) = engines().await;
    let device = gpu.gpu().unwrap().device().clone();
    for sql in [
        "SELECT k, v FROM b WHERE v % 7 = 1",
        "SELECT k + v AS kv, v * 2 AS w, k FROM b",
    ] {
        // Four allocations fail in a row: the batch's, its first half's, quarter's and
        // eighth's. The first eighth runs on the CPU; the other pieces on the GPU.
        device.inject_alloc_failures(1, 4);
        let plan = run(&gpu, &cpu, sql).await;
        device.inject_alloc_failure(0);
        assert_eq!(metric(&plan, "Gpu", "oom_splits"), 3, "{sql}\n{plan}");
        assert_eq!(metric(&plan, "Gpu", "cpu_fallbacks"), 1, "{sql}\n{plan}");
    }
    // A string column's halves need new offsets: when even those do not fit, the batch goes
    // to the CPU whole.
    device.inject_alloc_failures(1, 2);
    let plan = run(&gpu, &cpu, FILTER).await;
    device.inject_alloc_failure(0);
    assert_eq!(metric(&plan, "Gpu", "oom_splits"), 0, "{plan}");
    assert_eq!(metric(&plan, "Gpu", "cpu_fallbacks"), 1, "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_moves_the_least_recently_used_cached_table_to_the_host() {
    let (gpu, cpu) = engines().await;
    let device = gpu.gpu().unwrap().device().clone();
    // `a` was scanned before `b`: it goes first.
    run(&gpu, &cpu, "SELECT count(*), sum(v) FROM a WHERE k > 3").await;
    device.inject_alloc_failure(1);
    let plan = run(&gpu, &cpu, FILTER).await;
    device.inject_alloc_failure(0);
    assert!(metric(&plan, "Gpu", "evicted_bytes") > 0, "{plan}");
    // `a`'s next scan uploads it again; `b` stayed.
    let plan = run(&gpu, &cpu, "SELECT k, v FROM a WHERE v < 100").await;
    assert_eq!(
        metric(&plan, "GpuCachedScanExec", "cache_reloads"),
        1,
        "{plan}"
    );
    let plan = run(&gpu, &cpu, "SELECT k, v FROM b WHERE v < 100").await;
    assert_eq!(
        metric(&plan, "GpuCachedScanExec", "cache_reloads"),
        0,
        "{plan}"
    );
    // And again: `a` stays on the device now.
    let plan = run(&gpu, &cpu, "SELECT k, v FROM a WHERE v < 100").await;
    assert_eq!(
        metric(&plan, "GpuCachedScanExec", "cache_reloads"),
        0,
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_probe_that_runs_out_retries_on_halves() {
    let (gpu, cpu) = engines().await;
    let sql = "SELECT a.k, a.s, b.v FROM a JOIN b ON a.k = b.k AND a.v < b.v";
    // Every allocation fails in turn: the probe's are retried on halves.
    let retried = walk(&gpu, &cpu, sql, "GpuHashJoinExec", "oom_splits").await;
    assert!(retried > 0, "no probe allocation was retried");
    // Two failures in a row: a probe batch that runs out, and then so do its halves' string
    // offsets, is joined by DataFusion's hash join, for joins that decide on probe rows alone.
    // Output batches of 64 KiB: a piece's CPU output goes up in several.
    gpu.collect("SET spate.gpu.batch_bytes = 65536")
        .await
        .unwrap();
    let join = ("GpuHashJoinExec", "cpu_fallbacks");
    for sql in [
        sql,
        // A right join on the GPU: `b`, the smaller, is built.
        "SELECT a.k, a.s, b.v FROM a LEFT JOIN b ON a.k = b.k AND a.v < b.v",
        "SELECT b.k, b.s FROM b WHERE b.k IN (SELECT k FROM a WHERE v < 500)",
    ] {
        let fell_back = walk_until(&gpu, &cpu, sql, join, 2, 1).await;
        assert!(fell_back > 0, "{sql}: no probe piece ran on the CPU");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_runs_out_asks_the_coordinator_for_room() {
    let (gpu, cpu) = engines().await;
    for e in [&gpu, &cpu] {
        e.register_batches("c", table(3000, 5)).unwrap();
    }
    let device = gpu.gpu().unwrap().device().clone();
    let sql = "SELECT k, v FROM c WHERE v % 3 = 0";
    // The cached tables are idle: the upload's first allocation fails once, the coordinator
    // moves one to the host, and the upload goes through.
    device.inject_alloc_failure(1);
    let plan = run(&gpu, &cpu, sql).await;
    device.inject_alloc_failure(0);
    assert!(metric(&plan, "Gpu", "evicted_bytes") > 0, "{plan}");
    // With nothing to move, the same failure fails the query, typed.
    for t in ["a", "b"] {
        gpu.uncache_table(t).unwrap();
    }
    device.inject_alloc_failure(1);
    let outcome = gpu.collect(sql).await;
    device.inject_alloc_failure(0);
    match outcome {
        Err(spate::SpateError::ResourcesExhausted { message }) => {
            assert!(message.contains("GPU out of memory"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_aggregation_that_runs_out_retries_on_halves() {
    // Two partitions: the aggregation runs as partial states per batch, then a final merge.
    let (gpu, cpu) = engines_in(2).await;
    gpu.collect("SET spate.gpu.one_partition = false")
        .await
        .unwrap();
    let sql = "SELECT k, count(*), sum(v), min(v) FROM a GROUP BY k";
    let plan = run(&gpu, &cpu, sql).await;
    let partial = "GpuAggregateExec: mode=Partial,";
    assert!(plan.contains(partial), "{plan}");
    let retried = walk(&gpu, &cpu, sql, partial, "oom_splits").await;
    assert!(retried > 0, "no partial aggregation allocation was retried");
    // Four failures in a row: a piece that still runs out after three splits gets its states
    // from DataFusion's partial aggregation.
    let fell_back = walk_until(&gpu, &cpu, sql, (partial, "cpu_fallbacks"), 4, 1).await;
    assert!(fell_back > 0, "no partial aggregation piece ran on the CPU");
}

/// A GPU engine whose uploads go up in batches of 16 KiB, and a CPU engine, with `c` and `d`
/// registered in both (not cached).
async fn small_batch_engines() -> (Engine, Engine) {
    let build = |backend| {
        let engine = Engine::builder()
            .backend(backend)
            .target_partitions(1)
            .build()
            .unwrap();
        let batches = (0..12).flat_map(|i| table(250, 3 + i)).collect();
        engine.register_batches("c", batches).unwrap();
        engine.register_batches("d", table(6000, 17)).unwrap();
        engine
    };
    let (gpu, cpu) = (build(Backend::Emulated), build(Backend::Cpu));
    gpu.collect("SET spate.gpu.batch_bytes = 16384")
        .await
        .unwrap();
    (gpu, cpu)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_moves_the_input_a_sort_or_join_build_holds_to_the_host() {
    let (gpu, cpu) = small_batch_engines().await;
    // A filter (or its upload) below a sort runs out while the sort holds the batches before:
    // the coordinator moves those to the host, and the sort uploads them again.
    let sort = "SELECT k, s, v FROM c WHERE v % 3 = 0 ORDER BY v, k";
    let held = "held_evicted_bytes";
    let plan = run(&gpu, &cpu, sort).await;
    assert!(plan.contains("GpuSortExec"), "{plan}");
    let moved = walk_until(&gpu, &cpu, sort, ("GpuSortExec", held), 1, 1).await;
    assert!(moved > 0, "no run moved the sort's input");
    // The same for a join's build side (`c`'s rows, the smaller side).
    let join = "SELECT c.k, c.v, d.v FROM c JOIN d ON c.k = d.k AND c.v < d.v WHERE c.v % 3 = 0";
    let plan = run(&gpu, &cpu, join).await;
    let build = plan
        .lines()
        .skip_while(|l| !l.contains("GpuHashJoinExec"))
        .nth(1);
    assert!(build.is_some_and(|l| l.contains("GpuFilterExec")), "{plan}");
    let moved = walk_until(&gpu, &cpu, join, ("GpuHashJoinExec", held), 1, 1).await;
    assert!(moved > 0, "no run moved the join's build input\n{plan}");
}
