//! `spate scheduler` and `spate executor`: a Ballista cluster whose executors run Spate's GPU
//! operators (see `spate_distributed`). Both run until Ctrl-C, and print where they listen on
//! their first line of output:
//!
//! ```text
//! spate scheduler --bind 127.0.0.1:50050
//! spate executor --scheduler 127.0.0.1:50050 --backend emulated --devices 2
//! spate --remote df://127.0.0.1:50050 --table lineitem=lineitem.parquet -c "SELECT count(*) FROM lineitem"
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use spate::{Backend, Engine};
use spate_distributed::{ExecutorOptions, SchedulerOptions};

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Where to listen, HOST:PORT (port 0 picks a free one; the address is printed).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    bind: String,
    /// Seconds after which an executor not heard from is lost: its tasks, and the shuffle
    /// output it held, are computed again on the others.
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(6..))]
    executor_timeout: u64,
}

#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// The scheduler to poll for tasks: HOST:PORT or df://HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    scheduler: String,
    /// Where its Arrow Flight service listens for shuffle reads and results (port 0 picks one).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:0")]
    bind: String,
    /// The host other executors and clients reach it at, when not the bind address's (in a
    /// container bound to 0.0.0.0: the pod's IP).
    #[arg(long, value_name = "HOST")]
    advertise: Option<String>,
    /// Where its tasks' operators run: auto picks a GPU when one is usable, else the CPU.
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    backend: Backend,
    /// GPU devices its tasks run on: a count (4) or CUDA ordinals (cuda:0,1,3).
    #[arg(long, value_name = "N|cuda:LIST", default_value = "1", value_parser = crate::parse_devices)]
    devices: spate::Devices,
    /// Cap on each device's memory pool, e.g. 8G.
    #[arg(long, value_name = "SIZE", value_parser = crate::parse_size)]
    gpu_memory_limit: Option<usize>,
    /// Tasks it runs at once [default: the number of cores].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    tasks: Option<u32>,
}

fn announce(line: &str) {
    // The first line says where it listens: scripts and tests read it.
    println!("{line}");
    let _ = std::io::stdout().flush();
}

pub fn scheduler(args: SchedulerArgs) -> Result<ExitCode, String> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let options = SchedulerOptions {
            executor_timeout: Duration::from_secs(args.executor_timeout),
            expire_interval: Duration::from_secs((args.executor_timeout / 6).max(1)),
            no_executors_grace: Duration::from_secs(args.executor_timeout.saturating_mul(2)),
        };
        let mut scheduler = spate_distributed::start_scheduler(&args.bind, &options)
            .await
            .map_err(|e| e.to_string())?;
        announce(&format!("scheduler listening on {}", scheduler.url()));
        tokio::select! {
            stopped = scheduler.wait() => stopped.map_err(|e| e.to_string())?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn executor(args: ExecutorArgs) -> Result<ExitCode, String> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let mut builder = Engine::builder()
            .backend(args.backend)
            .devices(args.devices);
        if let Some(bytes) = args.gpu_memory_limit {
            builder = builder.gpu_memory_limit(bytes);
        }
        let engine = builder.build().map_err(|e| e.to_string())?;
        let backend = engine.backend().to_string();
        let tasks = args.tasks.map_or_else(
            || std::thread::available_parallelism().map_or(1, usize::from),
            |t| t as usize,
        );
        let mut executor = spate_distributed::start_executor(ExecutorOptions {
            scheduler: args.scheduler,
            bind: args.bind,
            advertise: args.advertise,
            engine,
            tasks,
        })
        .await
        .map_err(|e| e.to_string())?;
        announce(&format!(
            "executor {} listening on {}",
            executor.id(),
            executor.address()
        ));
        eprintln!("{backend}");
        tokio::select! {
            stopped = executor.wait() => stopped.map_err(|e| e.to_string())?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(ExitCode::SUCCESS)
    })
}
