//! `spate bench vector --rows N --dim D --queries Q --k K [--dtype f16|bf16|f32]
//! [--metric cosine|ip|l2] [--filter F] [--batched] [--backend B] [--verify]`:
//! nearest-neighbour queries in SQL (`ORDER BY <distance>(emb, [...]) LIMIT k`, one statement
//! per query, or with `--batched` one `vector_topk` statement for all of them) on one backend
//! and on the CPU backend, with numpy and faiss-cpu as peers over the same vectors
//! (`spate_bench::vector`).
//!
//! It prints each engine's queries per second and its ratio to faiss, and, on a GPU, the bytes
//! a query must scan and the time an H200 takes to read them. With `--verify` the last line is
//! `verified: N/Q queries equal the exact top-k`, and the exit code is non-zero when any
//! differs.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use spate::Backend;
use spate_bench::vector::{
    Data, Dtype, EngineRun, Metric, Peer, Spec, peer_agreement, run_engine, run_engine_batched,
    run_peers, verify,
};

#[derive(Debug, Args)]
pub struct VectorArgs {
    /// Items (embeddings) in the table.
    #[arg(long, default_value_t = 200_000)]
    rows: usize,
    /// Elements per embedding.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Queries, each one SQL statement.
    #[arg(long, default_value_t = 64)]
    queries: usize,
    /// Nearest items per query, 1 to 4096.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=4096))]
    k: u32,
    /// Element type of the embeddings: f16, bf16 or f32.
    #[arg(long, default_value = "f16", value_parser = Dtype::parse)]
    dtype: Dtype,
    /// Distance: cosine, ip (inner product) or l2.
    #[arg(long, default_value = "cosine", value_parser = Metric::parse)]
    metric: Metric,
    /// Fraction of the items a WHERE keeps before the search (e.g. 0.01).
    #[arg(long)]
    filter: Option<f64>,
    /// Backend under test.
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    backend: Backend,
    /// Check every query's answer against the exact top-k.
    #[arg(long)]
    verify: bool,
    /// Run every query as one `vector_topk` statement instead of one statement each.
    #[arg(long)]
    batched: bool,
    /// Skip the numpy and faiss peers.
    #[arg(long)]
    no_peers: bool,
    /// Seed of the generated vectors.
    #[arg(long, default_value_t = 21)]
    seed: u64,
}

fn qps(run: &EngineRun) -> f64 {
    let total: Duration = run.times.iter().sum();
    run.times.len() as f64 / total.as_secs_f64().max(1e-9)
}

fn report(run: &EngineRun, faiss: Option<f64>, batched: bool) {
    let mut times = run.times.clone();
    times.sort();
    let p50 = times.get(times.len() / 2).copied().unwrap_or_default();
    let ratio = faiss.map_or(String::new(), |f| format!(", {:.3}x faiss", qps(run) / f));
    let time = if batched {
        let all: Duration = run.times.iter().sum();
        format!("{:.2} ms for all, one vector_topk", all.as_secs_f64() * 1e3)
    } else {
        format!("p50 {:.2} ms", p50.as_secs_f64() * 1e3)
    };
    println!(
        "  spate {}: {:.1} queries/s ({time}{ratio}){}",
        format!("{:?}", run.backend).to_lowercase(),
        qps(run),
        if run.gpu_top_k { ", GPU top-k" } else { "" }
    );
}

pub fn run(args: VectorArgs) -> Result<ExitCode, String> {
    if args.rows == 0 || args.dim == 0 || args.queries == 0 {
        return Err("--rows, --dim and --queries must be at least 1".into());
    }
    if let Some(f) = args.filter
        && !(f > 0.0 && f <= 1.0)
    {
        return Err(format!("--filter {f} is not a fraction in (0, 1]"));
    }
    let spec = Spec {
        rows: args.rows,
        dim: args.dim,
        queries: args.queries,
        k: args.k as usize,
        dtype: args.dtype,
        metric: args.metric,
        filter: args.filter,
        seed: args.seed,
    };
    let data = Data::generate(&spec);
    println!(
        "vector bench: {} items x {} {}, {} queries, k = {}, metric {}{}",
        spec.rows,
        spec.dim,
        spec.dtype.name(),
        spec.queries,
        spec.k,
        spec.metric.name(),
        spec.filter
            .map_or(String::new(), |f| format!(", filter keeps {f}"))
    );
    let runtime = crate::runtime()?;
    let run = |backend| {
        if args.batched {
            runtime.block_on(run_engine_batched(backend, &data))
        } else {
            runtime.block_on(run_engine(backend, &data))
        }
    };
    let under_test = run(args.backend)?;
    println!("{}", under_test.selection);
    let cpu = match under_test.backend {
        Backend::Cpu => None,
        _ => Some(run(Backend::Cpu)?),
    };
    let mut faiss = None;
    if args.no_peers {
        println!("  peers: skipped (--no-peers)");
    } else {
        let root = crate::bench::workspace_root();
        let python = std::env::var_os(spate_bench::duckdb::PYTHON_ENV)
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| root.join(".venv/bin/python"));
        let dir = std::env::temp_dir().join(format!("spate-bench-vector-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let peers = run_peers(&python, &root, &dir, &data);
        let _ = std::fs::remove_dir_all(&dir);
        match peers {
            Err(e) => println!("  peers: skipped ({e})"),
            Ok(peers) => {
                for (name, peer) in peers {
                    match peer {
                        Peer::Skipped(why) => println!("  {name}: skipped ({why})"),
                        Peer::Ran { qps, ids } => {
                            if name == "faiss" {
                                faiss = Some(qps);
                            }
                            println!(
                                "  {name}: {qps:.1} queries/s (same ids as the exact top-k in \
                                 {}/{} queries)",
                                peer_agreement(&data, &ids),
                                spec.queries
                            );
                        }
                    }
                }
            }
        }
    }
    report(&under_test, faiss, args.batched);
    if let Some(cpu) = &cpu {
        report(cpu, faiss, args.batched);
    }
    if under_test.backend == Backend::Cuda {
        let bytes = data.scan_bytes();
        println!(
            "  a query scans {:.1} MB of embeddings: {:.3} ms at the H200's 4.8 TB/s",
            bytes as f64 / 1e6,
            bytes as f64 / 4.8e12 * 1e3
        );
    }
    if !args.verify {
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(cpu) = &cpu {
        println!(
            "  spate cpu: {}/{} queries equal the exact top-k",
            verify(&data, cpu),
            spec.queries
        );
    }
    let matched = verify(&data, &under_test);
    println!(
        "verified: {matched}/{} queries equal the exact top-k",
        spec.queries
    );
    Ok(if matched == spec.queries {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
