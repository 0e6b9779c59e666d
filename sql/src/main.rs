//! `spate`: the Spate SQL shell.
//!
//! ```text
//! spate [--tpch SF] [--table NAME=PATH]... [-c SQL | -f FILE]   run SQL, or open the shell
//! spate gen tpch --sf SF --out DIR                             write TPC-H as Parquet
//! spate selftest [--backend cuda|emulated] [--bench]          check every kernel on a device
//! spate bench tpch --sf SF [--backend B] [--verify]            run TPC-H, check it against the CPU
//! spate scheduler --bind HOST:PORT                             a Ballista scheduler
//! spate executor --scheduler HOST:PORT [--backend B]            a Ballista executor on Spate
//! spate --remote df://HOST:PORT [--table NAME=PATH]... -c SQL  run SQL on a cluster
//! spate -f pipeline.sql --stdin-into STREAM [--stdin-format F]  feed a stream from stdin
//! ```

mod bench;
mod bench_stream;
mod bench_vector;
mod cluster;
mod format;
mod script;
mod selftest;
mod session;
mod shell;
mod streams;

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use spate::{Backend, Engine, SpateError};

use crate::format::OutputFormat;
use crate::session::{Flow, Origin, Session};

/// Spate: SQL on GPUs (and CPUs), powered by Apache DataFusion.
#[derive(Debug, Parser)]
#[command(name = "spate", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Run these SQL statements (and shell commands) and exit. May be repeated.
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    commands: Vec<String>,
    /// Run the statements in this file and exit. May be repeated.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// How results are printed.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    format: OutputFormat,
    /// Where operators run: auto picks a GPU when one is usable, else the CPU.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    backend: Backend,
    /// Register the eight TPC-H tables, generated in memory at this scale factor (e.g. 1, 0.01).
    #[arg(long, value_name = "SF", value_parser = parse_scale_factor)]
    tpch: Option<f64>,
    /// Register a Parquet/CSV/NDJSON/Arrow file or folder as a table. May be repeated.
    #[arg(long = "table", value_name = "NAME=PATH", value_parser = parse_table)]
    tables: Vec<(String, PathBuf)>,
    /// Cap on host memory for sorts, aggregations and joins, e.g. 4G or 512M.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_limit: Option<usize>,
    /// Cap on GPU memory (the device pool), e.g. 8G; defaults to 80% of the free memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    gpu_memory_limit: Option<usize>,
    /// Partitions (parallel streams) per query; defaults to the number of cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: Option<u32>,
    /// Send queries to a Ballista scheduler (df://HOST:PORT) whose executors run them; tables
    /// must be files the executors can read (--table).
    #[arg(long, value_name = "df://HOST:PORT", conflicts_with_all = ["tpch", "devices", "gpu_memory_limit"])]
    remote: Option<String>,
    /// GPU devices to run on: a count (4) or CUDA ordinals (cuda:0,1,3); each device gets
    /// --gpu-memory-limit. The emulator opens that many emulated devices.
    #[arg(long, value_name = "N|cuda:LIST", default_value = "1", value_parser = parse_devices)]
    devices: spate::Devices,
    /// Rows shown by the table format (0 shows all); defaults to 100 in the shell, all otherwise.
    #[arg(long, value_name = "N")]
    max_rows: Option<usize>,
    /// Read standard input into this stream, as lines of --stdin-format, from the moment the
    /// statements run so far (the -c texts first, then the -f files) have declared it until
    /// input ends; the statements after run meanwhile (SUBSCRIBE …). Needs -c or -f.
    #[arg(long, value_name = "STREAM")]
    stdin_into: Option<String>,
    /// The lines --stdin-into reads: csv (a header row first) or ndjson.
    #[arg(long, value_name = "FORMAT", default_value = "csv", value_parser = parse_line_format)]
    stdin_format: spate::FileFormat,
    /// Do not print the startup banner.
    #[arg(short, long)]
    quiet: bool,
}

fn parse_line_format(text: &str) -> Result<spate::FileFormat, String> {
    match text.to_ascii_lowercase().as_str() {
        "csv" => Ok(spate::FileFormat::Csv),
        "ndjson" | "json" | "jsonl" => Ok(spate::FileFormat::NdJson),
        _ => Err(format!("'{text}': lines are csv or ndjson")),
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate benchmark data.
    Gen {
        #[command(subcommand)]
        dataset: Dataset,
    },
    /// Check every primitive kernel against its CPU reference on a GPU or the emulator.
    Selftest(selftest::SelftestArgs),
    /// Run a benchmark suite, show where each query's operators ran, optionally verify results.
    Bench {
        #[command(subcommand)]
        suite: bench::Suite,
    },
    /// Run a Ballista scheduler: clients connect with --remote, executors poll it for tasks.
    Scheduler(cluster::SchedulerArgs),
    /// Run a Ballista executor whose tasks run on Spate's operators (on a GPU where there is one).
    Executor(cluster::ExecutorArgs),
}

#[derive(Debug, Subcommand)]
enum Dataset {
    /// Write the eight TPC-H tables as Parquet files, one per table.
    Tpch {
        /// Scale factor: 1 is about 1 GB of raw data; fractions like 0.01 work.
        #[arg(long, value_parser = parse_scale_factor)]
        sf: f64,
        /// Output folder; created if missing.
        #[arg(long)]
        out: PathBuf,
    },
}

fn parse_devices(text: &str) -> Result<spate::Devices, String> {
    text.parse::<spate::Devices>().map_err(|e| e.to_string())
}

fn parse_backend(text: &str) -> Result<Backend, String> {
    text.parse().map_err(|e: SpateError| e.to_string())
}

fn parse_scale_factor(text: &str) -> Result<f64, String> {
    let sf: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    spate::tpch::check_scale_factor(sf).map_err(|e| e.to_string())?;
    Ok(sf)
}

fn parse_size(text: &str) -> Result<usize, String> {
    spate::parse_byte_size(text).map_err(|e| e.to_string())
}

fn parse_table(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(path.trim())))
        }
        _ => Err(format!("expected NAME=PATH, got '{text}'")),
    }
}

fn main() -> ExitCode {
    install_panic_hook();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Gen {
            dataset: Dataset::Tpch { sf, out },
        }) => generate_tpch(sf, &out),
        Some(Command::Selftest(args)) => selftest::run(args),
        Some(Command::Bench { suite }) => bench::run(suite),
        Some(Command::Scheduler(args)) => cluster::scheduler(args),
        Some(Command::Executor(args)) => cluster::executor(args),
        None => run(cli.run),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("Error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A panic is a bug; report it as one, in one line, instead of Rust's default dump.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("unknown cause");
        eprintln!("Error: internal error (this is a bug, please report it): {payload}{location}");
    }));
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

fn generate_tpch(sf: f64, out: &std::path::Path) -> Result<ExitCode, String> {
    let started = std::time::Instant::now();
    eprintln!("Writing TPC-H SF {sf} to {}", out.display());
    spate::tpch::write_parquet(sf, out, |table| {
        eprintln!(
            "  {:<9} {:>12} rows  {}",
            table.table.name(),
            table.num_rows,
            table.path.display()
        );
    })
    .map_err(|e| e.to_string())?;
    eprintln!("Done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

fn run(args: RunArgs) -> Result<ExitCode, String> {
    let scripted = !args.commands.is_empty() || !args.files.is_empty();
    let interactive = !scripted && std::io::stdin().is_terminal();
    if args.stdin_into.is_some() && !scripted {
        return Err(
            "--stdin-into reads data from standard input: give the statements with -c \
                    or -f"
                .into(),
        );
    }

    let mut builder = Engine::builder().backend(args.backend);
    if let Some(bytes) = args.memory_limit {
        builder = builder.memory_limit(bytes);
    }
    if let Some(bytes) = args.gpu_memory_limit {
        builder = builder.gpu_memory_limit(bytes);
    }
    if let Some(partitions) = args.partitions {
        builder = builder.target_partitions(partitions as usize);
    }
    builder = builder.devices(args.devices);
    if let Some(url) = args.remote {
        builder = builder.remote(url);
    }
    let engine = builder.build().map_err(|e| e.to_string())?;
    if !args.quiet {
        if interactive {
            println!("{}", shell::banner(&engine));
        } else if std::io::stderr().is_terminal() {
            eprintln!("{}", engine.backend());
        }
    }

    let runtime = runtime()?;
    if let Some(sf) = args.tpch {
        let started = std::time::Instant::now();
        spate::tpch::register_tpch(&engine, sf).map_err(|e| e.to_string())?;
        if interactive {
            eprintln!(
                "TPC-H SF {sf}: 8 tables generated in memory in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    for (name, path) in &args.tables {
        runtime
            .block_on(engine.register(name, path))
            .map_err(|e| format!("--table {name}: {e}"))?;
    }

    let max_rows = match args.max_rows {
        Some(0) => None,
        Some(n) => Some(n),
        None if interactive => Some(100),
        None => None,
    };
    let mut session = Session::new(engine, runtime, args.format, max_rows, interactive);

    if interactive {
        shell::run(&mut session).map_err(|e| format!("line editor failed: {e}"))?;
        return Ok(ExitCode::SUCCESS);
    }

    // Inputs in order: `-c` texts, then `-f` files (each read only when its turn comes), or
    // piped standard input when neither was given.
    let mut inputs: Vec<Input> = args.commands.into_iter().map(Input::Text).collect();
    inputs.extend(args.files.into_iter().map(Input::File));
    if !scripted {
        inputs.push(Input::Stdin);
    }
    let mut feed = None;
    let start_feed = |session: &Session, feed: &mut Option<spate::Feed>| {
        if let (Some(stream), None) = (&args.stdin_into, &feed) {
            *feed = session.start_feed(stream, args.stdin_format)?;
        }
        Ok::<_, String>(())
    };
    for input in inputs {
        start_feed(&session, &mut feed)?;
        let (text, origin) = input.read()?;
        // The session has already reported any failure on stderr.
        match session.run(&text, &origin) {
            Ok(Flow::Continue) => {}
            Ok(Flow::Quit) => break,
            Err(_) => return Ok(ExitCode::FAILURE),
        }
    }
    start_feed(&session, &mut feed)?;
    match (feed, &args.stdin_into) {
        (Some(feed), _) => {
            let rows = session.wait_feed(feed)?;
            if !args.quiet {
                eprintln!("stdin: {rows} rows read");
            }
        }
        (None, Some(stream)) => {
            return Err(format!(
                "--stdin-into {stream}: the statements declared no stream '{stream}'"
            ));
        }
        (None, None) => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// One piece of non-interactive input.
enum Input {
    Text(String),
    File(PathBuf),
    Stdin,
}

impl Input {
    fn read(self) -> Result<(String, Origin), String> {
        match self {
            Input::Text(text) => Ok((text, Origin::Inline)),
            Input::File(path) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: cannot read script: {e}", path.display()))?;
                Ok((text, Origin::File(path.display().to_string())))
            }
            Input::Stdin => {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .map_err(|e| format!("cannot read standard input: {e}"))?;
                Ok((text, Origin::Inline))
            }
        }
    }
}
