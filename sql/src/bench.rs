//! `spate bench tpch` in two forms, and `spate bench tpcds`.
//!
//! The placement report runs the TPC-H queries on one backend, shows where each query's
//! operators ran, and with `--verify` checks every result against the CPU backend:
//!
//! ```text
//! spate bench tpch --sf 0.01 --backend emulated --verify
//! ```
//!
//! `--set KEY=VALUE` (repeatable) gives every Spate engine a session option, so a run with
//! small device batches is one command:
//!
//! ```text
//! SPATE_EMU_STRICT=7 spate bench tpch --sf 0.01 --backend emulated --verify \
//!     --set spate.gpu.batch_bytes=65536
//! ```
//!
//! On a GPU backend each query also prints its data path (launches, host syncs, allocations,
//! bytes over the bus and in device memory, its host exchanges and the modeled H200 time).
//! The report's last line is `verified: N/Q matched, G/Q fully on GPU` (with `--verify`) or
//! `ran: Q queries, G/Q fully on GPU`, where fully on GPU means every compute operator on the
//! GPU and no host exchange (`Placement::fully_on_device`); the exit code is non-zero when a
//! query fails or, with `--verify`, when any result differs from the CPU's.
//!
//! `spate bench tpcds --sf 1 --backend emulated --verify` is the same placement report over the
//! 99 TPC-DS queries (103 statements: q14, q23, q24 and q39 hold two each), whose Parquet files
//! are generated once per scale factor under `target/spate-bench/tpcds-sf<SF>`. A query that
//! fails on both backends with the same error counts as matched (q90 divides by zero at SF 0.1).
//!
//! The benchmark (`--engines`) times engines side by side over the same Parquet files and
//! writes the result files (JSON, markdown and a PNG chart) to `--out`; see
//! `spate_bench::suite`:
//!
//! ```text
//! spate bench tpch --sf 10 --engines spate-gpu,spate-cpu,duckdb --runs 5 --mode hot
//! spate bench tpcds --sf 1 --engines spate-cpu,duckdb --runs 1
//! ```
//!
//! Its last line is `benchmark: N/R runs matched` (engine × query runs that ran; a run that
//! fails with the error the CPU backend fails with counts as matched); the exit
//! code is non-zero when any run failed or differed from the CPU backend's result.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use spate::placement::Placement;
use spate::{Backend, Engine};
use spate_bench::datapath::DataPath;
use spate_bench::runner::{Outcome, QueryRun, run_query, verify_query};
use spate_bench::suite::{EngineKind, Mode, SuiteOptions, run_suite};
use spate_bench::workload::Workload;

#[derive(Debug, Subcommand)]
pub enum Suite {
    /// The 22 TPC-H queries over data generated in memory.
    Tpch(TpchArgs),
    /// The 99 TPC-DS queries (103 statements) over Parquet files generated once per scale
    /// factor.
    Tpcds(TpcdsArgs),
    /// Streaming: a scenario's events pushed through continuous views (`--scenario fraud`).
    Stream(crate::bench_stream::StreamArgs),
    /// Vector search: `ORDER BY <distance>(emb, [...]) LIMIT k` against the exact top-k, with
    /// numpy and faiss-cpu as peers.
    Vector(crate::bench_vector::VectorArgs),
}

#[derive(Debug, Args)]
pub struct TpcdsArgs {
    /// Scale factor of the generated data (e.g. 0.1, 1).
    #[arg(long, value_parser = crate::parse_scale_factor)]
    sf: f64,
    /// Backend under test.
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    backend: Backend,
    /// Also run every query on the CPU backend and compare the results.
    #[arg(long)]
    verify: bool,
    /// Run only these queries: a template number (`14`, both of its statements) or a label
    /// (`q14a`). May be repeated.
    #[arg(long = "query", short = 'q', value_name = "Q", value_parser = parse_tpcds_query)]
    queries: Vec<Vec<spate_bench::tpcds::Query>>,
    /// A session option for every Spate engine, e.g. `--set spate.gpu.batch_bytes=65536`.
    /// May be repeated.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    settings: Vec<(String, String)>,
    /// Partitions (parallel streams) per query; defaults to the number of cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: Option<u32>,
    /// Folder of the TPC-DS Parquet files, generated there when missing
    /// [default: target/spate-bench/tpcds-sf<SF>].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Cap on the GPU engine's device memory (its pool), e.g. 16M; operators spill to the
    /// host beyond it.
    #[arg(long, value_name = "SIZE", value_parser = crate::parse_size)]
    gpu_memory_limit: Option<usize>,
    /// Devices the GPU engine runs on, each with --gpu-memory-limit: one count, or several
    /// (1,2,4) to run the report once per count and print the modeled scaling efficiency.
    #[arg(long, value_name = "N,…", value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    devices: Vec<u32>,
    #[command(flatten)]
    benchmark: BenchmarkArgs,
}

/// `14`, `q14` (a template: its statements) or `q14a` (one statement).
fn parse_tpcds_query(text: &str) -> Result<Vec<spate_bench::tpcds::Query>, String> {
    let text = text.trim().to_ascii_lowercase();
    let number = text.strip_prefix('q').unwrap_or(&text);
    if let Ok(n) = number.parse::<usize>()
        && (1..=99).contains(&n)
    {
        return Ok(spate_bench::tpcds::template(n));
    }
    spate_bench::tpcds::query(&text)
        .map(|q| vec![q])
        .ok_or_else(|| format!("no TPC-DS query '{text}': use 1–99, q01–q99, or q14a/q14b"))
}

#[derive(Debug, Args)]
pub struct TpchArgs {
    /// Scale factor of the generated data (e.g. 0.01, 1).
    #[arg(long, value_parser = crate::parse_scale_factor)]
    sf: f64,
    /// Backend under test.
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    backend: Backend,
    /// Also run every query on the CPU backend and compare the results.
    #[arg(long)]
    verify: bool,
    /// Run only these queries (1–22). May be repeated.
    #[arg(long = "query", short = 'q', value_name = "N",
          value_parser = clap::value_parser!(u8).range(1..=22))]
    queries: Vec<u8>,
    /// A session option for every Spate engine, e.g. `--set spate.gpu.batch_bytes=65536`.
    /// May be repeated.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    settings: Vec<(String, String)>,
    /// Partitions (parallel streams) per query; defaults to the number of cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: Option<u32>,
    /// With --engines: folder of the TPC-H Parquet files, generated there when missing
    /// [default: target/spate-bench/tpch-sf<SF>].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Cap on the GPU engine's device memory (its pool), e.g. 16M; operators spill to the
    /// host beyond it.
    #[arg(long, value_name = "SIZE", value_parser = crate::parse_size)]
    gpu_memory_limit: Option<usize>,
    /// Devices the GPU engine runs on, each with --gpu-memory-limit: one count, or several
    /// (1,2,4) to run the report once per count and print the modeled scaling efficiency.
    #[arg(long, value_name = "N,…", value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    devices: Vec<u32>,
    #[command(flatten)]
    benchmark: BenchmarkArgs,
}

/// The benchmark across engines (`--engines`), for either suite.
#[derive(Debug, Args)]
pub struct BenchmarkArgs {
    /// Time these engines side by side (comma-separated: spate-gpu, spate-cpu, duckdb) and
    /// write result files; `--backend` is spate-gpu's backend.
    #[arg(long, value_delimiter = ',', value_parser = EngineKind::parse)]
    engines: Vec<EngineKind>,
    /// With --engines: timed runs per query and engine (after one untimed run).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// With --engines: `hot` (tables loaded into each engine's memory first: GPU memory for
    /// spate-gpu) or `cold` (every run reads the Parquet files).
    #[arg(long, default_value = "hot", value_parser = Mode::parse)]
    mode: Mode,
    /// With --engines: folder the result files are written to.
    #[arg(long, value_name = "DIR", default_value = "benches/results")]
    out: PathBuf,
    /// With --engines: the Python that has DuckDB [default: $SPATE_PYTHON, then .venv/bin/python].
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
}

pub fn run(suite: Suite) -> Result<ExitCode, String> {
    match suite {
        Suite::Tpch(args) if !args.benchmark.engines.is_empty() => benchmark(Benchmark {
            workload: Workload::Tpch,
            sf: args.sf,
            backend: args.backend,
            queries: args.queries.iter().map(|q| format!("q{q}")).collect(),
            settings: args.settings,
            partitions: args.partitions,
            gpu_memory_limit: args.gpu_memory_limit,
            data: args.data,
            args: args.benchmark,
        }),
        Suite::Tpch(args) => tpch(args),
        Suite::Tpcds(args) if !args.benchmark.engines.is_empty() => benchmark(Benchmark {
            workload: Workload::Tpcds,
            sf: args.sf,
            backend: args.backend,
            queries: args
                .queries
                .iter()
                .flatten()
                .map(|q| q.label.to_string())
                .collect(),
            settings: args.settings,
            partitions: args.partitions,
            gpu_memory_limit: args.gpu_memory_limit,
            data: args.data,
            args: args.benchmark,
        }),
        Suite::Tpcds(args) => tpcds(args),
        Suite::Stream(args) => crate::bench_stream::run(args),
        Suite::Vector(args) => crate::bench_vector::run(args),
    }
}

/// The repository checkout the binary runs in (the scripts and the virtual environment are
/// found there): the first folder upwards from the current one that holds the TPC-H queries,
/// else the source tree the binary was built from.
pub(crate) fn workspace_root() -> PathBuf {
    let marker = Path::new("benches/queries/tpch/q01.sql");
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            if dir.join(marker).is_file() {
                return dir.to_path_buf();
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What `--engines` runs, from either suite's arguments.
struct Benchmark {
    workload: Workload,
    sf: f64,
    backend: Backend,
    /// Labels (`q6`, `q14a`); empty: every query.
    queries: Vec<String>,
    settings: Vec<(String, String)>,
    partitions: Option<u32>,
    gpu_memory_limit: Option<usize>,
    data: Option<PathBuf>,
    args: BenchmarkArgs,
}

fn benchmark(bench: Benchmark) -> Result<ExitCode, String> {
    let runtime = crate::runtime()?;
    let root = workspace_root();
    let args = &bench.args;
    let data_dir = bench.data.clone().unwrap_or_else(|| {
        root.join("target/spate-bench")
            .join(format!("{}-sf{}", bench.workload.name(), bench.sf))
    });
    let options = SuiteOptions {
        workload: bench.workload,
        scale_factor: bench.sf,
        engines: args.engines.clone(),
        runs: args.runs as usize,
        mode: args.mode,
        queries: bench.queries.clone(),
        partitions: bench.partitions.map(|p| p as usize),
        gpu_memory_limit: bench.gpu_memory_limit,
        gpu_backend: bench.backend,
        settings: bench.settings.clone(),
        data_dir,
        python: args.python.clone(),
        workspace_root: root,
    };
    let mut log = |line: &str| println!("{line}");
    // Files are rewritten after each engine, so a run stopped early keeps what finished.
    let out = args.out.clone();
    let mut on_engine = |partial: &spate_bench::report::TpchReport| {
        if let Err(e) = partial.write_files(&out) {
            eprintln!("warning: cannot write the result files so far: {e}");
        }
    };
    let report = runtime.block_on(run_suite(&options, &mut log, &mut on_engine))?;
    let written = report.write_files(&args.out)?;
    println!();
    for summary in report.summaries() {
        let speedup = summary
            .geomean_speedup
            .map(|s| {
                format!(
                    ", geomean speedup {s:.2}× over {} queries",
                    summary.speedup_queries
                )
            })
            .unwrap_or_default();
        println!(
            "{}: {} matched, sum of medians {:.1} ms{speedup}",
            summary.engine, summary.matched, summary.total_median_ms
        );
    }
    println!(
        "wrote {}, {} and {}",
        written.json.display(),
        written.markdown.display(),
        written.png.display()
    );
    let runs: Vec<_> = report.queries.iter().flat_map(|q| &q.engines).collect();
    let matched = runs.iter().filter(|r| r.is_correct()).count();
    println!("benchmark: {matched}/{} runs matched", runs.len());
    Ok(if matched == runs.len() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `KEY=VALUE`, as `--set` takes it.
fn parse_setting(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!(
            "expected KEY=VALUE, e.g. spate.gpu.batch_bytes=65536, not '{text}'"
        )),
    }
}

fn engine(
    backend: Backend,
    partitions: Option<u32>,
    settings: &[(String, String)],
    gpu_memory_limit: Option<usize>,
    devices: u32,
) -> Result<Engine, String> {
    let mut builder = Engine::builder()
        .backend(backend)
        .devices(spate::Devices::Count(devices as usize));
    if let Some(p) = partitions {
        builder = builder.target_partitions(p as usize);
    }
    if let Some(bytes) = gpu_memory_limit {
        builder = builder.gpu_memory_limit(bytes);
    }
    for (key, value) in settings {
        builder = builder.option(key, value);
    }
    builder.build().map_err(|e| e.to_string())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// `GpuFilterExec ×2, GpuSortExec` from operator names in plan order.
fn counted(names: &[String]) -> String {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for name in names {
        match seen.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => *count += 1,
            None => seen.push((name, 1)),
        }
    }
    if seen.is_empty() {
        return "none".into();
    }
    seen.iter()
        .map(|(n, c)| {
            if *c > 1 {
                format!("{n} ×{c}")
            } else {
                (*n).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a plan's operators run, and its host exchanges.
fn print_operators(placement: &Placement) {
    println!("      GPU: {}", counted(&placement.gpu));
    if placement.cpu.is_empty() {
        println!("      CPU: none");
    }
    for (name, reason) in &placement.cpu {
        println!("      CPU: {name}: {reason}");
    }
    if !placement.gpu.is_empty() && !placement.host_exchanges.is_empty() {
        println!(
            "      host exchanges: {}",
            counted(&placement.host_exchanges)
        );
    }
}

/// Prints where `run`'s operators ran and its data path; the data path of a GPU run, for the
/// report's totals.
fn print_placement(run: &QueryRun) -> Option<DataPath> {
    print_operators(&run.placement);
    if run.placement.gpu.is_empty() {
        return None;
    }
    let p = DataPath::of(run);
    let upload = match p.upload_hidden() {
        Some(hidden) => format!(
            "; uploads {:.1} ms, {:.0}% hidden",
            p.upload_copy_ms,
            hidden * 100.0
        ),
        None => String::new(),
    };
    println!(
        "      data path: {} launches, {} host syncs, {} allocs, {} B to GPU, {} B from GPU \
         (result {} B), {} B in device memory, peak {} B; modeled H200 {:.3} ms{upload}",
        p.launches,
        p.host_syncs,
        p.dev_allocs,
        p.h2d_bytes,
        p.d2h_bytes,
        p.result_bytes,
        p.device_bytes,
        p.peak_device_bytes,
        p.modeled_h200_ms
    );
    if p.devices > 1 {
        let each: Vec<String> = p
            .device_modeled_ms
            .iter()
            .map(|ms| format!("{ms:.3}"))
            .collect();
        println!(
            "      {} devices: exchanged {} B between devices ({} B by peer copies), {} B back \
             to their own; modeled per device [{}] ms",
            p.devices,
            p.exchange_bytes,
            p.peer_bytes,
            p.exchange_local_bytes,
            each.join(", ")
        );
    }
    Some(p)
}

/// The line that sums up how much of the queries' upload copy time compute hid.
fn print_upload_overlap(paths: &[DataPath]) {
    let copy: f64 = paths.iter().map(|p| p.upload_copy_ms).sum();
    let wait: f64 = paths.iter().map(|p| p.upload_wait_ms).sum();
    if let Some(hidden) = spate_bench::datapath::hidden(copy, wait) {
        println!(
            "upload overlap: {:.1}% of {copy:.1} ms of upload copies hidden under compute \
             ({wait:.1} ms waited for)",
            hidden * 100.0
        );
    }
}

fn tpch(args: TpchArgs) -> Result<ExitCode, String> {
    let runtime = crate::runtime()?;
    let reference = args
        .verify
        .then(|| engine(Backend::Cpu, args.partitions, &args.settings, None, 1))
        .transpose()?;
    let started = Instant::now();
    if let Some(reference) = &reference {
        spate::tpch::register_tpch(reference, args.sf).map_err(|e| e.to_string())?;
    }
    let queries: Vec<(String, &str)> = spate_bench::tpch::QUERIES
        .iter()
        .filter(|(n, _)| args.queries.is_empty() || args.queries.iter().any(|q| *q as usize == *n))
        .map(|(n, sql)| (format!("q{n:02}"), *sql))
        .collect();
    per_device_count(&args.devices, |devices| {
        let under_test = engine(
            args.backend,
            args.partitions,
            &args.settings,
            args.gpu_memory_limit,
            devices,
        )?;
        announce(&under_test, &args.settings);
        spate::tpch::register_tpch(&under_test, args.sf).map_err(|e| e.to_string())?;
        println!(
            "TPC-H SF {}: generated in {:.1} s",
            args.sf,
            started.elapsed().as_secs_f64()
        );
        Ok(placement_report(
            &runtime,
            &under_test,
            reference.as_ref(),
            &queries,
        ))
    })
}

fn tpcds(args: TpcdsArgs) -> Result<ExitCode, String> {
    let runtime = crate::runtime()?;
    let reference = args
        .verify
        .then(|| engine(Backend::Cpu, args.partitions, &args.settings, None, 1))
        .transpose()?;
    let dir = args.data.clone().unwrap_or_else(|| {
        workspace_root()
            .join("target/spate-bench")
            .join(format!("tpcds-sf{}", args.sf))
    });
    spate_bench::tpcds::ensure_data(args.sf, &dir, &mut |line| println!("{line}"))?;
    if let Some(reference) = &reference {
        runtime.block_on(spate_bench::tpcds::register_parquet_dir(reference, &dir))?;
    }
    let queries: Vec<(String, &str)> = if args.queries.is_empty() {
        spate_bench::tpcds::queries()
    } else {
        let mut chosen: Vec<_> = args.queries.iter().flatten().copied().collect();
        chosen.dedup();
        chosen
    }
    .into_iter()
    .map(|q| (q.label.to_string(), q.sql))
    .collect();
    per_device_count(&args.devices, |devices| {
        let under_test = engine(
            args.backend,
            args.partitions,
            &args.settings,
            args.gpu_memory_limit,
            devices,
        )?;
        announce(&under_test, &args.settings);
        runtime.block_on(spate_bench::tpcds::register_parquet_dir(&under_test, &dir))?;
        Ok(placement_report(
            &runtime,
            &under_test,
            reference.as_ref(),
            &queries,
        ))
    })
}

/// Runs `report` once per device count; with several counts, ends with the modeled scaling
/// efficiency from the first count to each other (the sum of the queries' modeled H200 times:
/// `T(first) × first / (T(n) × n)`). Fails when any report fails.
fn per_device_count(
    counts: &[u32],
    mut report: impl FnMut(u32) -> Result<Report, String>,
) -> Result<ExitCode, String> {
    let mut totals = Vec::with_capacity(counts.len());
    let mut ok = true;
    for &devices in counts {
        if counts.len() > 1 {
            println!("== {devices} device{}", if devices == 1 { "" } else { "s" });
        }
        let done = report(devices)?;
        ok &= done.ok;
        let modeled: f64 = done.paths.iter().map(|p| p.modeled_h200_ms).sum();
        totals.push((devices, modeled, done.paths.len()));
    }
    if let [(first, base, _), rest @ ..] = totals.as_slice()
        && !rest.is_empty()
    {
        let mut line = format!(
            "scaling (modeled H200, sum over the GPU runs): {first} device{} {base:.3} ms",
            if *first == 1 { "" } else { "s" }
        );
        for (devices, total, _) in rest {
            let efficiency = if *total > 0.0 {
                base * f64::from(*first) / (total * f64::from(*devices))
            } else {
                0.0
            };
            line.push_str(&format!(
                "; {devices} devices {total:.3} ms (efficiency {efficiency:.3})"
            ));
        }
        println!("{line}");
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What one placement report found: whether every query passed, and the GPU runs' data paths.
struct Report {
    ok: bool,
    paths: Vec<DataPath>,
}

/// The backend, and the options every engine runs with.
fn announce(engine: &Engine, settings: &[(String, String)]) {
    println!("{}", engine.backend());
    for (key, value) in settings {
        println!("set {key} = {value}");
    }
}

/// Runs `queries` (label, SQL) on `engine`, each checked against `reference` when there is
/// one, printing where each query's operators ran; the last line is the tally.
fn placement_report(
    runtime: &tokio::runtime::Runtime,
    engine: &Engine,
    reference: Option<&Engine>,
    queries: &[(String, &str)],
) -> Report {
    let total = queries.len();
    let (mut matched, mut on_gpu, mut failed) = (0usize, 0usize, 0usize);
    let mut paths = Vec::new();
    for (label, sql) in queries {
        match reference {
            Some(reference) => {
                let verified = runtime.block_on(verify_query(engine, reference, sql));
                let timing = match (&verified.run, verified.reference_time) {
                    (Some(run), Some(cpu)) => format!(
                        "  plan {}, execute {}, cpu {}",
                        ms(run.plan_time),
                        ms(run.execute_time),
                        ms(cpu)
                    ),
                    _ => String::new(),
                };
                let verdict = match &verified.outcome {
                    Outcome::Matched(rows) => format!("matched ({rows} rows)"),
                    Outcome::SameError(e) => format!("matched (the same error as the CPU: {e})"),
                    Outcome::Mismatch(difference) => format!("MISMATCH: {difference}"),
                    Outcome::Failed(e) => format!("FAILED: {e}"),
                    Outcome::ReferenceFailed(e) => format!("FAILED on the CPU backend: {e}"),
                };
                println!("{label}  {verdict}{timing}");
                matched += usize::from(verified.outcome.matched());
                if let Some(placement) = &verified.placement {
                    on_gpu += usize::from(placement.fully_on_device());
                }
                match (&verified.run, &verified.placement) {
                    (Some(run), _) => paths.extend(print_placement(run)),
                    // A query that failed: where its plan's operators would have run.
                    (None, Some(placement)) => print_operators(placement),
                    (None, None) => {}
                }
            }
            None => match runtime.block_on(run_query(engine, sql)) {
                Ok(run) => {
                    println!(
                        "{label}  {} rows  plan {}, execute {}",
                        run.rows(),
                        ms(run.plan_time),
                        ms(run.execute_time)
                    );
                    on_gpu += usize::from(run.placement.fully_on_device());
                    paths.extend(print_placement(&run));
                }
                Err(e) => {
                    failed += 1;
                    println!("{label}  FAILED: {e}");
                }
            },
        }
    }
    print_upload_overlap(&paths);
    let ok = if reference.is_some() {
        println!("verified: {matched}/{total} matched, {on_gpu}/{total} fully on GPU");
        matched == total
    } else {
        println!("ran: {total} queries, {failed} failed, {on_gpu}/{total} fully on GPU");
        failed == 0
    };
    Report { ok, paths }
}
