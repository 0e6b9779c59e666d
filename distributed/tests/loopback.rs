//! A Ballista cluster on loopback, in this process: a scheduler and two executors whose tasks
//! run on Spate's GPU operators (the emulator), and a remote session. Every TPC-H query equals
//! the same query run locally on the CPU; losing an executor in the middle of a query is
//! survived through Ballista's task retry, within a bounded time.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use spate::arrow::record_batch::RecordBatch;
use spate::arrow::util::display::{ArrayFormatter, FormatOptions};
use spate::{Backend, Devices, Engine};
use spate_distributed::{
    Executor, ExecutorOptions, Scheduler, SchedulerOptions, start_executor, start_scheduler,
};

const TABLES: [&str; 8] = [
    "customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier",
];

fn query(n: usize) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/queries/tpch/");
    std::fs::read_to_string(format!("{path}q{n:02}.sql")).unwrap()
}

/// Rows as `|`-separated text, in output order.
fn lines(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for i in 0..b.num_rows() {
            let row: Vec<String> = formatters.iter().map(|f| f.value(i).to_string()).collect();
            out.push(row.join("|"));
        }
    }
    out
}

async fn register(engine: &Engine, dir: &Path) {
    for table in TABLES {
        engine
            .register_parquet(table, dir.join(format!("{table}.parquet")))
            .await
            .unwrap();
    }
}

/// An executor on the emulator with `devices` devices, polling `scheduler`.
async fn executor(scheduler: &Scheduler, devices: usize) -> Executor {
    let engine = Engine::builder()
        .backend(Backend::Emulated)
        .devices(Devices::Count(devices))
        .build()
        .unwrap();
    start_executor(ExecutorOptions {
        scheduler: scheduler.url(),
        bind: "127.0.0.1:0".into(),
        advertise: None,
        engine,
        tasks: 2,
    })
    .await
    .unwrap()
}

/// A remote session on `scheduler` and a local CPU one, both over the Parquet files in `dir`.
async fn sessions(scheduler: &Scheduler, dir: &Path) -> (Engine, Engine) {
    let remote = Engine::builder().remote(scheduler.url()).build().unwrap();
    assert_eq!(remote.remote(), Some(scheduler.url().as_str()));
    assert!(remote.gpu().is_none());
    let local = Engine::builder().backend(Backend::Cpu).build().unwrap();
    register(&remote, dir).await;
    register(&local, dir).await;
    (remote, local)
}

#[tokio::test]
async fn a_remote_session_without_its_scheduler_says_it_cannot_reach_it() {
    // Nothing listens on port 9 (discard) on loopback here.
    let remote = Engine::builder()
        .remote("df://127.0.0.1:9")
        .build()
        .unwrap();
    let err = remote.collect("SELECT 1").await.unwrap_err();
    assert!(matches!(err, spate::SpateError::Execution { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("cannot reach the Ballista scheduler"),
        "{err}"
    );
}

fn gpu_runs(executor: &Executor) -> u64 {
    executor.engine().gpu().unwrap().operator_runs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_22_tpch_queries_on_two_gpu_executors_equal_a_local_run() {
    let dir = tempfile::tempdir().unwrap();
    spate::tpch::write_parquet(0.01, dir.path(), |_| {}).unwrap();
    let scheduler = start_scheduler("127.0.0.1:0", &SchedulerOptions::default())
        .await
        .unwrap();
    // One executor with one device, one with two.
    let executors = [executor(&scheduler, 1).await, executor(&scheduler, 2).await];
    let (remote, local) = sessions(&scheduler, dir.path()).await;
    for n in 1..=22 {
        let sql = query(n);
        let got = remote
            .collect(&sql)
            .await
            .unwrap_or_else(|e| panic!("q{n:02} on the cluster: {e}"));
        let want = local.collect(&sql).await.unwrap();
        let (mut got, mut want) = (lines(&got), lines(&want));
        assert!(!want.is_empty() || n == 0, "q{n:02}");
        // Rows tied on the ORDER BY columns may come in any order.
        got.sort();
        want.sort();
        assert_eq!(got, want, "q{n:02}");
    }
    for (i, e) in executors.iter().enumerate() {
        assert!(gpu_runs(e) > 0, "executor {i} ran no GPU operator");
    }
    // In-memory tables cannot travel to the executors: a clear error, not a wrong result.
    let err = remote.cache_table("nation").await.unwrap_err();
    assert!(err.to_string().contains("remote session"), "{err}");
    remote
        .collect("CREATE TABLE t AS VALUES (1)")
        .await
        .unwrap();
    let err = remote.collect("SELECT * FROM t").await.unwrap_err();
    assert!(
        matches!(err, spate::SpateError::Unsupported { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("cannot be sent"), "{err}");
}

/// One of two executors is killed while a query runs on both. The scheduler finds it lost
/// after its executor timeout, runs its tasks (and the shuffle output it held) again on the
/// other, and the query returns the right result, within the timeout and a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_an_executor_mid_query_is_survived_by_task_retry() {
    let dir = tempfile::tempdir().unwrap();
    spate::tpch::write_parquet(0.05, dir.path(), |_| {}).unwrap();
    let options = SchedulerOptions {
        executor_timeout: Duration::from_secs(8),
        expire_interval: Duration::from_secs(1),
        no_executors_grace: Duration::from_secs(30),
    };
    let scheduler = start_scheduler("127.0.0.1:0", &options).await.unwrap();
    let doomed = executor(&scheduler, 1).await;
    let survivor = executor(&scheduler, 1).await;
    let (remote, local) = sessions(&scheduler, dir.path()).await;
    let sql = query(18);
    let want = lines(&local.collect(&sql).await.unwrap());

    let started = Instant::now();
    let running = tokio::spawn(async move { remote.collect(&sql).await });
    // Killed once it has started on the query's tasks.
    let waited = Instant::now();
    while gpu_runs(&doomed) == 0 && !running.is_finished() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "no task reached the executor"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at = started.elapsed();
    doomed.kill();
    let outcome = tokio::time::timeout(Duration::from_secs(180), running)
        .await
        .expect("the query neither finished nor failed within 180 s")
        .unwrap();
    let took = started.elapsed();
    // Measured (docs/deploy.md): the right result, about the executor timeout later.
    let batches = outcome.unwrap_or_else(|e| {
        panic!(
            "the query failed {:.1} s after an executor was killed {:.1} s into it: {e}",
            took.as_secs_f64(),
            killed_at.as_secs_f64()
        )
    });
    let mut got = lines(&batches);
    let mut want = want;
    got.sort();
    want.sort();
    assert_eq!(got, want);
    println!(
        "executor killed {:.1} s into the query; the query returned the right result after \
         {:.1} s",
        killed_at.as_secs_f64(),
        took.as_secs_f64()
    );
    assert!(took < options.executor_timeout + Duration::from_secs(60));
    assert!(gpu_runs(&survivor) > 0);
}
