//! The TPC-H and TPC-DS benchmarks across engines: `spate bench tpch --engines
//! spate-gpu,spate-cpu,duckdb` (and `spate bench tpcds …`), over the queries of a
//! [`Workload`].
//!
//! Every engine reads the same Parquet files (generated once per scale factor and reused).
//! Each query's result on every engine is checked against Spate's CPU backend (rows that tie
//! on the ORDER BY in any order, see [`crate::compare::compare_ordered`]); only matched runs
//! count in sums and speedups. Per engine and query there is one untimed first run
//! (which compiles the generated kernels and warms the file cache) and then `runs` timed runs.
//!
//! - `hot`: tables are loaded into the engine's memory first: `CACHE TABLE` (GPU memory on a
//!   GPU backend, host memory on `cpu`) and `CREATE TABLE … AS` in DuckDB. The runs measure
//!   query processing, not I/O.
//! - `cold`: each run reads and decodes the Parquet files.
//!
//! Plan time, kernel compile time and execution time are reported apart: execution time
//! excludes compilation, and a timed run that compiled anything is reported as such (it
//! should never happen: generated kernels are compiled once per session). For GPU engines,
//! the device bandwidth is measured once at the start and each query's device traffic is set
//! against it (the roofline floor).

use std::path::{Path, PathBuf};
use std::time::Instant;

use arrow::array::RecordBatch;
use spate::{Backend, Engine};

use crate::compare::{Ordering, compare_ordered};
use crate::datapath::DataPath;
use crate::report::{
    Bandwidth, EngineInfo, EngineRun, Machine, QueryResult, Roofline, SAME_ERROR, TpchReport,
    git_commit, today_utc,
};
use crate::runner::{result_ordering, run_query};
use crate::workload::{SuiteQuery, Workload};

/// An engine the suite can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Spate on a GPU backend (`cuda`, or `emulated` when asked for).
    SpateGpu,
    /// Spate on DataFusion's CPU operators.
    SpateCpu,
    /// DuckDB through its Python package.
    DuckDb,
}

impl EngineKind {
    /// The engine's name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::SpateGpu => "spate-gpu",
            EngineKind::SpateCpu => "spate-cpu",
            EngineKind::DuckDb => "duckdb",
        }
    }

    /// Parses `spate-gpu`, `spate-cpu` or `duckdb`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "spate-gpu" => Ok(EngineKind::SpateGpu),
            "spate-cpu" => Ok(EngineKind::SpateCpu),
            "duckdb" => Ok(EngineKind::DuckDb),
            other => Err(format!(
                "unknown engine '{other}': use spate-gpu, spate-cpu or duckdb"
            )),
        }
    }
}

/// Hot (tables in engine memory) or cold (read from Parquet on every run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Tables loaded into engine memory before the runs.
    Hot,
    /// Every run reads the Parquet files.
    Cold,
}

impl Mode {
    /// `hot` or `cold`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Hot => "hot",
            Mode::Cold => "cold",
        }
    }

    /// Parses `hot` or `cold`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "hot" => Ok(Mode::Hot),
            "cold" => Ok(Mode::Cold),
            other => Err(format!("unknown mode '{other}': use hot or cold")),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// TPC-H or TPC-DS.
    pub workload: Workload,
    /// Scale factor.
    pub scale_factor: f64,
    /// Engines, in report order.
    pub engines: Vec<EngineKind>,
    /// Timed runs per query and engine.
    pub runs: usize,
    /// Hot or cold.
    pub mode: Mode,
    /// Query labels (`q6` for TPC-H, `q14a` for TPC-DS; empty: all of them).
    pub queries: Vec<String>,
    /// Partitions per Spate query (default: the machine's cores).
    pub partitions: Option<usize>,
    /// The backend of `spate-gpu` (`auto` picks `cuda` when there is a GPU).
    pub gpu_backend: Backend,
    /// Cap on `spate-gpu`'s device memory (default: 80% of the free memory).
    pub gpu_memory_limit: Option<usize>,
    /// Session options (`spate.gpu.batch_bytes`, `datafusion.execution.batch_size`, …) for
    /// every Spate engine, the CPU reference included; DuckDB has no such options.
    pub settings: Vec<(String, String)>,
    /// Where the Parquet files are (generated there when missing).
    pub data_dir: PathBuf,
    /// The Python with DuckDB (default: `SPATE_PYTHON`, then `.venv/bin/python`).
    pub python: Option<PathBuf>,
    /// The repository root: scripts, the virtual environment and the commit are found there.
    pub workspace_root: PathBuf,
}

/// `dir` as the logs show it: relative to the current directory when it is under it, so that
/// result files name no path of the machine they ran on.
pub fn shown_dir(dir: &Path) -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| dir.to_path_buf())
}

/// Generates the TPC-H Parquet files in `dir` unless a complete set for `sf` is there.
pub fn ensure_data(sf: f64, dir: &Path, log: &mut dyn FnMut(&str)) -> Result<(), String> {
    let marker = dir.join(".complete");
    let want = format!("tpch sf {sf}\n");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        log(&format!(
            "reusing TPC-H SF {sf} Parquet in {}",
            shown_dir(dir).display()
        ));
        return Ok(());
    }
    log(&format!(
        "generating TPC-H SF {sf} Parquet in {}",
        shown_dir(dir).display()
    ));
    let started = Instant::now();
    spate::tpch::write_parquet(sf, dir, |_| {}).map_err(|e| e.to_string())?;
    std::fs::write(&marker, want).map_err(|e| format!("{}: {e}", marker.display()))?;
    log(&format!(
        "generated in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A query's result on the reference (Spate's CPU backend), with the order its plan fixes
/// (rows that tie on its ORDER BY may come in any order on another engine).
type Reference = Result<(Vec<RecordBatch>, Ordering), String>;

/// An engine's runs of one query from its execution times.
fn timed(engine: &str, status: String, rows: usize, execute_ms: Vec<f64>) -> EngineRun {
    EngineRun {
        engine: engine.to_string(),
        status,
        rows,
        plan_ms: 0.0,
        compile_ms_first: 0.0,
        compile_ms_timed: 0.0,
        median_ms: median(&execute_ms),
        min_ms: execute_ms.iter().copied().fold(f64::INFINITY, f64::min),
        max_ms: execute_ms.iter().copied().fold(0.0, f64::max),
        execute_ms,
        roofline: None,
        data_path: None,
    }
}

/// The status of a run that failed with `error`: the same error as the reference's, or a
/// failure.
fn failure(reference: &Reference, error: &str) -> String {
    match reference {
        Err(want) if crate::runner::same_error(want, error) => format!("{SAME_ERROR}{error}"),
        _ => format!("failed: {error}"),
    }
}

fn failed(engine: &str, status: String) -> EngineRun {
    EngineRun {
        min_ms: 0.0,
        ..timed(engine, status, 0, Vec::new())
    }
}

fn spate_engine(backend: Backend, options: &SuiteOptions) -> Result<Engine, String> {
    let mut builder = Engine::builder().backend(backend);
    if let Some(p) = options.partitions {
        builder = builder.target_partitions(p);
    }
    if let (Some(bytes), Backend::Cuda | Backend::Emulated | Backend::Auto) =
        (options.gpu_memory_limit, backend)
    {
        builder = builder.gpu_memory_limit(bytes);
    }
    for (key, value) in &options.settings {
        builder = builder.option(key, value);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Runs the suite and returns its report (not yet written to files). `on_engine` is given the
/// report so far after each engine finishes, so a run cut short (a time limit on a lent GPU
/// machine) still leaves the engines that finished.
pub async fn run_suite(
    options: &SuiteOptions,
    log: &mut dyn FnMut(&str),
    on_engine: &mut dyn FnMut(&TpchReport),
) -> Result<TpchReport, String> {
    let sf = options.scale_factor;
    let workload = options.workload;
    workload.ensure_data(sf, &options.data_dir, log)?;
    let queries = workload.queries(&options.queries);
    let runs = options.runs.max(1);

    // The reference: Spate on the CPU over the same files, one run per query.
    log("reference results: spate on the cpu backend");
    let reference_engine = spate_engine(Backend::Cpu, options)?;
    workload
        .register(&reference_engine, &options.data_dir)
        .await?;
    let mut reference: Vec<Reference> = Vec::new();
    for query in &queries {
        reference.push(
            run_query(&reference_engine, &query.sql)
                .await
                .map(|r| {
                    let order = result_ordering(&r.plan);
                    (r.batches, order)
                })
                .map_err(|e| e.to_string()),
        );
    }
    drop(reference_engine);

    let mut report = TpchReport {
        suite: workload.name().into(),
        scale_factor: sf,
        mode: options.mode.name().into(),
        runs,
        date: today_utc(),
        // A copy of the tree without its .git (the GPU machine gets one) names the commit it
        // was built from in SPATE_COMMIT.
        commit: std::env::var("SPATE_COMMIT")
            .ok()
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| git_commit(&options.workspace_root)),
        machine: Machine::detect(None),
        bandwidth: None,
        engines: Vec::new(),
        queries: queries
            .iter()
            .map(|q| QueryResult {
                query: q.number,
                label: q.label.clone(),
                engines: Vec::new(),
            })
            .collect(),
    };
    let mut gpu_name = None;

    for kind in &options.engines {
        let name = kind.name();
        let outcome = match kind {
            EngineKind::SpateGpu | EngineKind::SpateCpu => {
                let backend = match kind {
                    EngineKind::SpateGpu => options.gpu_backend,
                    _ => Backend::Cpu,
                };
                run_spate(
                    *kind,
                    backend,
                    options,
                    &queries,
                    &reference,
                    runs,
                    &mut report.bandwidth,
                    &mut gpu_name,
                    log,
                )
                .await
            }
            EngineKind::DuckDb => run_duckdb(options, &queries, &reference, runs, log),
        };
        match outcome {
            Ok((info, per_query)) => {
                for (result, run) in report.queries.iter_mut().zip(per_query) {
                    result.engines.push(run);
                }
                report.engines.push(info);
            }
            Err(skipped) => {
                log(&format!("{name}: SKIPPED: {skipped}"));
                report.engines.push(EngineInfo {
                    name: name.to_string(),
                    description: String::new(),
                    skipped: Some(skipped),
                });
            }
        }
        if gpu_name.is_some() {
            report.machine = Machine::detect(gpu_name.clone());
        }
        on_engine(&report);
    }
    Ok(report)
}

/// Runs every query on one Spate backend. `Err` means the engine could not run at all (it is
/// reported as skipped); a query that fails is a failed run in the report.
#[allow(clippy::too_many_arguments)]
async fn run_spate(
    kind: EngineKind,
    backend: Backend,
    options: &SuiteOptions,
    queries: &[SuiteQuery],
    reference: &[Reference],
    runs: usize,
    bandwidth: &mut Option<Bandwidth>,
    gpu_name: &mut Option<String>,
    log: &mut dyn FnMut(&str),
) -> Result<(EngineInfo, Vec<EngineRun>), String> {
    let name = kind.name();
    let engine = spate_engine(backend, options)?;
    if kind == EngineKind::SpateGpu && engine.gpu().is_none() {
        return Err(format!("no GPU backend: {}", engine.backend()));
    }
    options
        .workload
        .register(&engine, &options.data_dir)
        .await?;
    let mut description = format!(
        "spate {}, {}{}",
        env!("CARGO_PKG_VERSION"),
        engine.backend(),
        // A debug build's times say nothing about speed.
        if cfg!(debug_assertions) {
            ", debug build"
        } else {
            ""
        }
    );
    if !options.settings.is_empty() {
        let set: Vec<String> = options
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        description.push_str(&format!(", with {}", set.join(", ")));
    }
    if let Some(gpu) = engine.gpu() {
        let measured = gpu.measure_bandwidth().map_err(|e| e.to_string())?;
        log(&format!(
            "{name}: device copy bandwidth {:.1} GB/s ({})",
            measured.gb_per_s(),
            measured.backend
        ));
        *bandwidth = Some(Bandwidth {
            backend: measured.backend.clone(),
            bytes: measured.bytes,
            median_ms: measured.median_ms,
            gb_per_s: measured.gb_per_s(),
        });
        if gpu.device().kind() == spate::kernels::BackendKind::Cuda {
            let d = gpu.device().description();
            *gpu_name = Some(format!("{d}"));
        }
    }
    if options.mode == Mode::Hot {
        let started = Instant::now();
        let mut bytes = 0;
        let tables = options.workload.tables();
        for table in &tables {
            let cached = engine
                .cache_table(table)
                .await
                .map_err(|e| format!("CACHE TABLE {table}: {e}"))?;
            bytes += cached.bytes;
        }
        let where_ = if engine.gpu().is_some() {
            "GPU"
        } else {
            "host"
        };
        let took = started.elapsed().as_secs_f64();
        log(&format!(
            "{name}: cached {} tables in {where_} memory ({:.1} MB) in {took:.1} s",
            tables.len(),
            bytes as f64 / 1e6
        ));
        description.push_str(&format!(
            "; tables cached in {where_} memory ({:.1} MB, loaded in {took:.1} s)",
            bytes as f64 / 1e6
        ));
    }
    let measured_bandwidth = engine.gpu().and_then(|g| g.bandwidth());

    let mut out = Vec::with_capacity(queries.len());
    for (query, want) in queries.iter().zip(reference) {
        let (label, sql) = (&query.label, &query.sql);
        let first = match run_query(&engine, sql).await {
            Ok(run) => run,
            Err(e) => {
                let status = failure(want, &e.to_string());
                log(&format!("{name} {label}: {status}"));
                out.push(failed(name, status));
                continue;
            }
        };
        let status = match want {
            Err(e) => format!("failed: reference failed: {e}"),
            Ok((want, order)) => match compare_ordered(want, &first.batches, order) {
                Ok(_) => "matched".to_string(),
                Err(difference) => format!("mismatch: {difference}"),
            },
        };
        let mut execute_ms = Vec::with_capacity(runs);
        let mut compile_ms_timed = 0.0;
        let mut last = None;
        for _ in 0..runs {
            match run_query(&engine, sql).await {
                Ok(run) => {
                    execute_ms.push(ms(run.execute_time_without_compile()));
                    compile_ms_timed += ms(run.compile.time);
                    last = Some(run);
                }
                Err(e) => {
                    last = None;
                    log(&format!("{name} {label}: FAILED on a timed run: {e}"));
                    break;
                }
            }
        }
        let Some(last) = last else {
            out.push(failed(name, "failed: a timed run failed".into()));
            continue;
        };
        let mut run = timed(name, status, last.rows(), execute_ms);
        run.plan_ms = ms(last.plan_time);
        run.compile_ms_first = ms(first.compile.time);
        run.compile_ms_timed = compile_ms_timed;
        if let Some(bw) = &measured_bandwidth {
            let traffic = last.device_traffic();
            let floor_ms = ms(bw.floor(traffic.read_bytes + traffic.write_bytes));
            run.roofline = Some(Roofline {
                read_bytes: traffic.read_bytes,
                write_bytes: traffic.write_bytes,
                floor_ms,
                achieved_over_floor: if floor_ms > 0.0 {
                    run.median_ms / floor_ms
                } else {
                    0.0
                },
                h2d_bytes: traffic.h2d_bytes,
                d2h_bytes: traffic.d2h_bytes,
            });
        }
        if engine.gpu().is_some() {
            run.data_path = Some(DataPath::of(&last));
        }
        log(&format!(
            "{name} {label}: {} ({} rows), median {:.2} ms (min {:.2}, max {:.2}), plan {:.2} ms, compile {:.1} ms first / {:.1} ms timed",
            run.status,
            run.rows,
            run.median_ms,
            run.min_ms,
            run.max_ms,
            run.plan_ms,
            run.compile_ms_first,
            run.compile_ms_timed
        ));
        out.push(run);
    }
    Ok((
        EngineInfo {
            name: name.to_string(),
            description,
            skipped: None,
        },
        out,
    ))
}

/// Runs every query on DuckDB. `Err` means DuckDB could not run at all.
fn run_duckdb(
    options: &SuiteOptions,
    queries: &[SuiteQuery],
    reference: &[Reference],
    runs: usize,
    log: &mut dyn FnMut(&str),
) -> Result<(EngineInfo, Vec<EngineRun>), String> {
    let python = crate::duckdb::find_python(options.python.clone(), &options.workspace_root)?;
    // One file per statement (DuckDB keys its results by file name), numbered by position.
    let query_dir = options.data_dir.join(".duckdb-queries");
    let files: Vec<(usize, PathBuf)> = options
        .workload
        .query_files(queries, &query_dir)?
        .into_iter()
        .enumerate()
        .collect();
    let script = options.workspace_root.join("scripts/duckdb_bench.py");
    log("duckdb: running");
    let run = crate::duckdb::run_duckdb(
        &python,
        &script,
        &options.data_dir,
        &files,
        options.mode.name(),
        runs,
        None,
    )?;
    let mut out = Vec::with_capacity(queries.len());
    for (k, (query, want)) in queries.iter().zip(reference).enumerate() {
        let label = &query.label;
        let Some(got) = run.queries.iter().find(|q| q.query == k) else {
            out.push(failed("duckdb", "failed: no result from DuckDB".into()));
            continue;
        };
        let result = match &got.result {
            Ok(r) => r,
            Err(e) => {
                let status = failure(want, e);
                log(&format!("duckdb {label}: {status}"));
                out.push(failed("duckdb", status));
                continue;
            }
        };
        let status = match want {
            Err(e) => format!("failed: reference failed: {e}"),
            Ok((want, order)) => match crate::cells::cells_from_batches(want)
                .and_then(|want| crate::cells::compare_cells_ordered(&want, &result.rows, order))
            {
                Ok(()) => "matched".to_string(),
                Err(difference) => format!("mismatch: {difference}"),
            },
        };
        let run = timed("duckdb", status, result.rows.len(), result.times_ms.clone());
        log(&format!(
            "duckdb {label}: {} ({} rows), median {:.2} ms (min {:.2}, max {:.2})",
            run.status, run.rows, run.median_ms, run.min_ms, run.max_ms
        ));
        out.push(run);
    }
    let mut description = format!("duckdb {}, {} threads", run.version, run.threads);
    if let Some(load) = run.load_ms {
        description.push_str(&format!(
            "; tables loaded into DuckDB memory in {:.1} s",
            load / 1e3
        ));
    }
    Ok((
        EngineInfo {
            name: "duckdb".into(),
            description,
            skipped: None,
        },
        out,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_folders_under_the_current_directory_show_relative() {
        let cwd = std::env::current_dir().unwrap_or_default();
        assert_eq!(
            shown_dir(&cwd.join("target/spate-bench/tpch-sf1")),
            PathBuf::from("target/spate-bench/tpch-sf1")
        );
        let elsewhere = Path::new("/elsewhere/tpch-sf1");
        assert_eq!(shown_dir(elsewhere), elsewhere.to_path_buf());
    }
}
