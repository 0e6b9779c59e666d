//! GPU operators over more data than their device budget: aggregations spill their groups and
//! joins their sides to the host in hash partitions (`exec/spill.rs`), sorts their sorted runs
//! (`exec/external_sort.rs`), and their results still equal the CPU's. Each query also shows
//! in `EXPLAIN ANALYZE` that it spilled.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Decimal128Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use spate::kernels::reference::Rng;
use spate::{Backend, Engine};

mod common;
use common::ordered;

/// `rows` rows over `keys` distinct keys (about one in twelve NULL), in batches of 4096:
/// `k` Int64, `s` Utf8 derived from `k`, `v` Int64, `d` Decimal128(15, 2).
fn table(rows: usize, keys: u64, seed: u64) -> Vec<RecordBatch> {
    let mut r = Rng::new(seed);
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("d", DataType::Decimal128(15, 2), true),
    ]));
    let mut batches = Vec::new();
    let mut left = rows;
    while left > 0 {
        let n = left.min(4096);
        left -= n;
        let k: Vec<Option<i64>> = (0..n)
            .map(|_| (!r.next_u64().is_multiple_of(12)).then(|| (r.next_u64() % keys) as i64))
            .collect();
        let s: Vec<Option<String>> = k
            .iter()
            .map(|k| k.and_then(|k| (k % 5 != 0).then(|| format!("key-{:x}", k * 7919))))
            .collect();
        let v: Vec<Option<i64>> = (0..n)
            .map(|_| (!r.next_u64().is_multiple_of(9)).then(|| r.next_u64() as i64 % 1_000_000))
            .collect();
        let d: Decimal128Array = (0..n)
            .map(|_| (!r.next_u64().is_multiple_of(7)).then(|| (r.next_u64() % 10_000_000) as i128))
            .collect::<Decimal128Array>()
            .with_precision_and_scale(15, 2)
            .unwrap();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(k)),
            Arc::new(StringArray::from(s)),
            Arc::new(Int64Array::from(v)),
            Arc::new(d),
        ];
        batches.push(RecordBatch::try_new(Arc::clone(&schema), columns).unwrap());
    }
    batches
}

/// A GPU engine with a 1 MiB device budget (operators keep 256 KiB of state) that fails on
/// any CPU operator, and a CPU engine, with `l` and `r` registered in both.
async fn engines() -> (Engine, Engine) {
    engines_with(Some(1 << 20)).await
}

/// [`engines`], the GPU's device budget `gpu_budget` bytes (`None`: the default).
async fn engines_with(gpu_budget: Option<usize>) -> (Engine, Engine) {
    engines_limited(gpu_budget, None).await
}

/// [`engines_with`], the GPU engine's host memory limited to `host_limit` bytes too.
async fn engines_limited(gpu_budget: Option<usize>, host_limit: Option<usize>) -> (Engine, Engine) {
    let mut gpu = Engine::builder()
        .backend(Backend::Emulated)
        .target_partitions(2);
    if let Some(bytes) = gpu_budget {
        gpu = gpu.gpu_memory_limit(bytes);
    }
    if let Some(bytes) = host_limit {
        gpu = gpu.memory_limit(bytes);
    }
    let gpu = gpu.build().unwrap();
    let cpu = Engine::builder()
        .backend(Backend::Cpu)
        .target_partitions(2)
        .build()
        .unwrap();
    for e in [&gpu, &cpu] {
        e.register_batches("l", table(30_000, 6_000, 1)).unwrap();
        e.register_batches("r", table(20_000, 8_000, 2)).unwrap();
    }
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    (gpu, cpu)
}

fn sorted(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = ordered(batches);
    rows.sort();
    rows
}

/// Runs `sql` on both engines and compares the rows; returns the GPU's `EXPLAIN ANALYZE`.
async fn check(gpu: &Engine, cpu: &Engine, sql: &str) -> String {
    let want = sorted(&cpu.collect(sql).await.unwrap());
    let got = sorted(
        &gpu.collect(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql} on the GPU: {e}")),
    );
    assert!(!want.is_empty(), "{sql}: no rows to compare");
    assert_eq!(got.len(), want.len(), "{sql}");
    assert!(got == want, "{sql}: the GPU's rows differ from the CPU's");
    ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    )
    .join("\n")
}

/// The largest `metric` a line naming `operator` in an `EXPLAIN ANALYZE` shows, read as the
/// display writes counts (`859`, `859.0 K`, `1.20 M`); 0 when none does.
fn count(explain: &str, operator: &str, metric: &str) -> f64 {
    explain
        .lines()
        .filter(|l| l.contains(operator))
        .filter_map(|l| {
            let at = l.find(&format!("{metric}="))? + metric.len() + 1;
            let shown = l[at..].split([',', ']']).next()?.trim();
            let (number, scale) = match shown.split_once(' ') {
                Some((n, "K")) => (n, 1e3),
                Some((n, "M")) => (n, 1e6),
                _ => (shown, 1.0),
            };
            Some(number.parse::<f64>().ok()? * scale)
        })
        .fold(0.0, f64::max)
}

/// The `spilled_rows` of `operator` (see [`count`]).
fn spilled_rows(explain: &str, operator: &str) -> usize {
    count(explain, operator, "spilled_rows") as usize
}

/// Creates tables on both engines with `statements`, the GPU engine allowed CPU operators
/// for it.
async fn create(gpu: &Engine, cpu: &Engine, statements: &[String]) {
    gpu.collect("SET spate.gpu.fallback = 'cpu'").await.unwrap();
    for e in [gpu, cpu] {
        for sql in statements {
            e.collect(sql).await.unwrap();
        }
    }
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregations_past_their_budget_spill_and_match_the_cpu() {
    let (gpu, cpu) = engines().await;
    for sql in [
        "SELECT k, count(*), count(v), sum(v), min(v), max(v), sum(d), avg(d) FROM l GROUP BY k",
        "SELECT s, k, count(*), sum(d), max(d) FROM l GROUP BY s, k",
        "SELECT k % 7 AS m, s, sum(v), count(*) FROM l GROUP BY ROLLUP(k % 7, s)",
    ] {
        let explain = check(&gpu, &cpu, sql).await;
        assert!(
            spilled_rows(&explain, "GpuAggregateExec") > 0,
            "{sql}: did not spill\n{explain}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_past_their_budget_spill_and_match_the_cpu() {
    let (gpu, cpu) = engines().await;
    let mut queries: Vec<String> = Vec::new();
    for on in ["l.k = r.k", "l.s = r.s", "l.k = r.k AND l.s = r.s"] {
        for join in ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"] {
            queries.push(format!(
                "SELECT l.k, l.v, r.v, r.d FROM l {join} r ON {on} AND l.v < r.v + 500000"
            ));
        }
    }
    queries.extend([
        "SELECT l.k, l.s, r.d FROM l JOIN r ON l.k = r.k".to_string(),
        "SELECT l.k, r.k FROM l JOIN r ON (l.s IS NOT DISTINCT FROM r.s) AND l.k = r.k".into(),
        "SELECT k, v FROM l WHERE EXISTS (SELECT 1 FROM r WHERE r.k = l.k AND r.v > l.v)".into(),
        "SELECT k, v FROM l WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.k = l.k)".into(),
        "SELECT k, d FROM r WHERE k IN (SELECT k FROM l) OR v < 1000".into(),
    ]);
    for sql in &queries {
        let explain = check(&gpu, &cpu, sql).await;
        assert!(
            spilled_rows(&explain, "GpuHashJoinExec") > 0,
            "{sql}: did not spill\n{explain}"
        );
    }
}

/// Runs `sql` on both engines, checks the GPU's rows come out in the CPU's order, and returns
/// the GPU's `EXPLAIN ANALYZE`.
async fn check_ordered(gpu: &Engine, cpu: &Engine, sql: &str) -> String {
    let want = ordered(&cpu.collect(sql).await.unwrap());
    let got = ordered(
        &gpu.collect(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql} on the GPU: {e}")),
    );
    assert_eq!(got.len(), want.len(), "{sql}");
    assert!(got == want, "{sql}: the GPU's order differs from the CPU's");
    ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {sql}"))
            .await
            .unwrap(),
    )
    .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorts_past_their_budget_merge_runs_and_match_the_cpu() {
    let (gpu, cpu) = engines().await;
    for sql in [
        "SELECT k, s, v, d FROM l ORDER BY s DESC NULLS LAST, k, v, d",
        "SELECT k, s, v, d FROM l ORDER BY d NULLS FIRST, v DESC, k, s",
        "SELECT k, v, d FROM l ORDER BY v + k, k, v, d",
    ] {
        let explain = check_ordered(&gpu, &cpu, sql).await;
        assert!(
            spilled_rows(&explain, "GpuSortExec") > 0,
            "{sql}: did not spill\n{explain}"
        );
    }
}

/// A sort's runs that host memory will not take go to disk, and are merged from there a window
/// at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_runs_go_to_disk_when_host_memory_is_short_too() {
    let (gpu, cpu) = engines_limited(Some(1 << 20), Some(256 << 10)).await;
    for sql in [
        "SELECT k, s, v, d FROM l ORDER BY s DESC NULLS LAST, k, v, d",
        "SELECT k, v, d FROM l ORDER BY d NULLS FIRST, v DESC, k",
    ] {
        let explain = check_ordered(&gpu, &cpu, sql).await;
        let number = count(&explain, "GpuSortExec", "disk_spilled_bytes");
        assert!(number > 0.0, "{sql}: nothing went to disk\n{explain}");
    }
}

/// `SET spate.gpu.memory_limit` caps a query's device memory under a larger device budget:
/// its operators size themselves to it and spill, and its allocations are charged to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_memory_limit_caps_each_query() {
    let (gpu, cpu) = engines_with(None).await;
    let sql = "SELECT l.k, l.v, r.d FROM l JOIN r ON l.k = r.k";
    gpu.collect("SET spate.gpu.memory_limit = '1M'")
        .await
        .unwrap();
    let explain = check(&gpu, &cpu, sql).await;
    assert!(
        spilled_rows(&explain, "GpuHashJoinExec") > 0,
        "did not spill under the session's limit\n{explain}"
    );
    gpu.collect("SET spate.gpu.memory_limit = '8K'")
        .await
        .unwrap();
    match gpu.collect(sql).await {
        Err(spate::SpateError::ResourcesExhausted { message }) => {
            assert!(message.contains("GPU out of memory in Gpu"), "{message}");
        }
        other => panic!("8 KiB should not hold a batch: {other:?}"),
    }
    // The device has lost nothing to the queries that failed.
    assert_eq!(
        gpu.gpu().unwrap().device().memory_stats().allocated_bytes,
        0
    );
}

/// The `metric=` value on the first line naming `operator` in an `EXPLAIN ANALYZE`.
fn metric<'a>(explain: &'a str, operator: &str, metric: &str) -> Option<&'a str> {
    let line = explain.lines().find(|l| l.contains(operator))?;
    let at = line.find(&format!("{metric}="))? + metric.len() + 1;
    line[at..].split([',', ']']).next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_streams_up_in_small_batches_on_a_copy_stream() {
    let (gpu, cpu) = engines().await;
    let sql = "SELECT count(*), sum(v), max(d) FROM l WHERE v > 1000";
    // While the upload runs, its staged copies are charged to DataFusion's memory pool.
    let pool = Arc::clone(&gpu.context().runtime_env().memory_pool);
    let mut stream = gpu
        .sql_stream("SELECT k, v FROM l WHERE v > 1000")
        .await
        .unwrap();
    futures::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    assert!(pool.reserved() > 0, "nothing charged while uploading");
    drop(stream);
    assert_eq!(pool.reserved(), 0, "charges left after the query");
    let explain = check(&gpu, &cpu, sql).await;
    // 1 MiB of budget: the table goes up in batches of 32 KiB, each copied on the upload's copy
    // stream and waited for by the compute stream, both timed.
    let allocs: usize = metric(&explain, "GpuCoalescePartitionsExec", "dev_allocs")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no upload allocations\n{explain}"));
    assert!(allocs > 20, "{allocs} batches\n{explain}");
    for timing in ["upload_copy_time", "upload_wait_time"] {
        let value = metric(&explain, "GpuCoalescePartitionsExec", timing)
            .unwrap_or_else(|| panic!("no {timing}\n{explain}"));
        assert!(!value.is_empty(), "{timing}\n{explain}");
    }
    assert_ne!(
        metric(&explain, "GpuCoalescePartitionsExec", "upload_copy_time"),
        Some("0ns"),
        "{explain}"
    );
    assert_eq!(
        gpu.gpu().unwrap().device().memory_stats().allocated_bytes,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spills_go_to_disk_when_host_memory_is_short_too() {
    // 1 MiB of device memory and 256 KiB of host memory: the partitions go to DataFusion's
    // temporary files.
    let (gpu, cpu) = engines_limited(Some(1 << 20), Some(256 << 10)).await;
    for (sql, operator) in [
        (
            "SELECT l.k, l.s, r.d FROM l JOIN r ON l.k = r.k",
            "GpuHashJoinExec",
        ),
        (
            "SELECT s, k, count(*), sum(d), max(d) FROM l GROUP BY s, k",
            "GpuAggregateExec",
        ),
    ] {
        let explain = check(&gpu, &cpu, sql).await;
        let number = count(&explain, operator, "disk_spilled_bytes");
        assert!(number > 0.0, "{sql}: nothing went to disk\n{explain}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_key_holding_a_fifth_of_the_build_side_completes() {
    let (gpu, cpu) = engines().await;
    // `h`: every fifth row of `r` on one key, a fifth of the build side: with its hash table,
    // more than the join's 256 KiB share of the budget, and no split can spread it.
    let h = "CREATE TABLE h AS SELECT CASE WHEN v % 5 = 0 THEN 42 ELSE k END AS k, v, d FROM r";
    create(&gpu, &cpu, &[h.to_string()]).await;
    let mut chunked = 0;
    for join in [
        "JOIN",
        "LEFT JOIN",
        "RIGHT JOIN",
        "FULL JOIN",
        "LEFT SEMI JOIN",
        "LEFT ANTI JOIN",
    ] {
        let sql = format!("SELECT h.k, h.v FROM h {join} l ON h.k = l.k AND h.v < l.v + 1000");
        let explain = check(&gpu, &cpu, &sql).await;
        assert!(
            spilled_rows(&explain, "GpuHashJoinExec") > 0,
            "{sql}: did not spill\n{explain}"
        );
        // The hot key's partition is joined in chunks where the join allows it (the build
        // side decides: joins that emit probe rows only with a match).
        let chunks = metric(&explain, "GpuHashJoinExec", "join_chunks");
        let joined_in_chunks = chunks.is_some_and(|c| c != "0");
        let join_type = explain
            .lines()
            .find(|l| l.contains("GpuHashJoinExec"))
            .and_then(|l| l.split("join_type=").nth(1))
            .and_then(|t| t.split(',').next())
            .unwrap_or("");
        let chunkable = ["Inner", "Left", "LeftSemi", "LeftAnti", "LeftMark"].contains(&join_type);
        assert_eq!(joined_in_chunks, chunkable, "{sql}: {join_type}\n{explain}");
        chunked += usize::from(joined_in_chunks);
    }
    assert!(
        chunked >= 4,
        "inner, left, semi and anti joins go in chunks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_aggregations_on_float_keys_spill_and_match_the_cpu() {
    let (gpu, cpu) = engines().await;
    // Float keys with -0.0 beside 0.0, NaNs and NULLs; `g` beside them, so that the row hashes
    // of -0.0 and 0.0 fall in different partitions unless -0.0 is folded.
    let float = |t: &str| {
        format!(
            "CREATE TABLE f{t} AS SELECT CASE WHEN k % 1000 = 7 THEN -0.0 \
             WHEN k % 1000 = 8 THEN 0.0 WHEN k % 1000 = 9 THEN CAST('NaN' AS DOUBLE) \
             ELSE k * 1.5 END AS f, CAST(1 AS BIGINT) AS g, v, d FROM {t}"
        )
    };
    create(&gpu, &cpu, &[float("l"), float("r")]).await;
    // -0.0 joins 0.0: rows of both (there are some) must meet in one partition.
    for sql in [
        "SELECT count(*) FROM fl WHERE 1 / f < 0",
        "SELECT count(*) FROM fr WHERE 1 / f > 0",
    ] {
        assert_ne!(
            ordered(&cpu.collect(sql).await.unwrap()),
            vec!["0".to_string()]
        );
    }
    for (sql, operator) in [
        (
            "SELECT fl.f, fl.v, fr.d FROM fl JOIN fr ON fl.f = fr.f AND fl.g = fr.g",
            "GpuHashJoinExec",
        ),
        (
            "SELECT fl.f, fr.v FROM fl LEFT JOIN fr ON fl.f = fr.f AND fl.g = fr.g",
            "GpuHashJoinExec",
        ),
        (
            "SELECT f, g, count(*), sum(v), max(d) FROM fl GROUP BY f, g",
            "GpuAggregateExec",
        ),
    ] {
        let explain = check(&gpu, &cpu, sql).await;
        assert!(
            spilled_rows(&explain, operator) > 0,
            "{sql}: did not spill\n{explain}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_aggregations_on_boolean_keys_spill_and_match_the_cpu() {
    let (gpu, cpu) = engines().await;
    let boolean = |t: &str, m: u32| {
        format!(
            "CREATE TABLE b{t} AS SELECT k, CASE WHEN v % 13 = 0 THEN NULL \
             ELSE v % {m} = 0 END AS b, v, d FROM {t}"
        )
    };
    create(&gpu, &cpu, &[boolean("l", 2), boolean("r", 3)]).await;
    for (sql, operator) in [
        (
            "SELECT bl.k, bl.v, br.d FROM bl JOIN br ON bl.k = br.k AND bl.b = br.b",
            "GpuHashJoinExec",
        ),
        (
            "SELECT b, k, count(*), sum(d) FROM bl GROUP BY b, k",
            "GpuAggregateExec",
        ),
    ] {
        let explain = check(&gpu, &cpu, sql).await;
        assert!(
            spilled_rows(&explain, operator) > 0,
            "{sql}: did not spill\n{explain}"
        );
    }
}

/// COUNT(DISTINCT), whose partial state is a list, cannot run in stages: past its budget the
/// aggregation's rows spill by group key and each partition is aggregated whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_distinct_past_its_budget_spills_rows_by_group() {
    let (gpu, cpu) = engines().await;
    // One partition: single-stage aggregations, where COUNT(DISTINCT) runs on the GPU.
    for e in [&gpu, &cpu] {
        e.collect("SET datafusion.execution.target_partitions = 1")
            .await
            .unwrap();
    }
    for sql in [
        "SELECT k, count(DISTINCT v), count(*), sum(d) FROM l GROUP BY k",
        "SELECT s, count(DISTINCT k) FROM l GROUP BY s",
    ] {
        let explain = check(&gpu, &cpu, sql).await;
        assert!(
            spilled_rows(&explain, "GpuAggregateExec") > 0,
            "{sql}: did not spill\n{explain}"
        );
    }
}

/// A window whose input passes its budget is windowed in chunks of whole partitions, as its
/// input comes sorted on the partition keys; without PARTITION BY it is held whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_past_their_budget_run_in_chunks_of_whole_partitions() {
    let (gpu, cpu) = engines().await;
    let partitioned = "SELECT k, s, v, d, \
         rank() OVER (PARTITION BY k ORDER BY v) AS r, \
         sum(v) OVER (PARTITION BY k) AS total, \
         count(d) OVER (PARTITION BY k ORDER BY v) AS running \
         FROM l";
    let explain = check(&gpu, &cpu, partitioned).await;
    assert!(
        count(&explain, "WindowAggExec", "window_chunks") > 0.0,
        "not windowed in chunks\n{explain}"
    );
    let whole = "SELECT k, v, rank() OVER (ORDER BY v) AS r FROM l WHERE k < 100";
    check(&gpu, &cpu, whole).await;
    // In the window's order: rows equal on (k, v) are equal in every column shown, so the
    // order is fixed.
    let in_order = "SELECT k, v, rank() OVER (PARTITION BY k ORDER BY v) AS r, \
         sum(v) OVER (PARTITION BY k) AS total FROM l ORDER BY k, v";
    check_ordered(&gpu, &cpu, in_order).await;
    // No rows at all.
    check_ordered(
        &gpu,
        &cpu,
        "SELECT k, rank() OVER (PARTITION BY k ORDER BY v) AS r FROM l WHERE v > 1000000000 \
         ORDER BY k",
    )
    .await;
}
