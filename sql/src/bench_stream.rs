//! `spate bench stream --scenario fraud --events N --batch ROWS [--backend B] [--verify]`: the
//! fraud pipeline (`spate_bench::stream`) on one backend, and on the CPU backend for the ratio.
//!
//! It prints events per second, each micro-batch's time, the latency from an event's push to
//! its features being emitted (which waits for the watermark to pass the event), the largest
//! watermark lag and the late rows. With `--verify` the last line is
//! `verified: N/N windows equal batch replay` (every row every view emitted against the batch
//! query over the replayed events), and the exit code is non-zero when any differs.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use spate::Backend;
use spate_bench::stream::{PipelineRun, quantile, run_pipeline, verify};

#[derive(Debug, Args)]
pub struct StreamArgs {
    /// The scenario: `fraud` (card transactions; see docs/streaming.md).
    #[arg(long, default_value = "fraud")]
    scenario: String,
    /// Events to push.
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// Rows per push, each one micro-batch (4096 is the low-latency setting).
    #[arg(long, default_value_t = 65_536)]
    batch: usize,
    /// Backend under test.
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    backend: Backend,
    /// Check every emitted row against the batch query over the replayed events.
    #[arg(long)]
    verify: bool,
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn report(run: &mut PipelineRun) {
    let seconds = run.wall.as_secs_f64().max(1e-9);
    println!(
        "{}: {} events ({} late) in {} micro-batches, {:.2} s: {:.0} events/s",
        run.backend,
        run.events,
        run.late_rows,
        run.micro_batches,
        seconds,
        run.events as f64 / seconds
    );
    let q = |v: &mut Vec<Duration>, p: f64| quantile(v, p).map_or("-".to_string(), ms);
    println!(
        "  micro-batch, push to views advanced: p50 {}, p99 {}, max {}",
        q(&mut run.batch_times, 0.5),
        q(&mut run.batch_times, 0.99),
        q(&mut run.batch_times, 1.0)
    );
    println!(
        "  event pushed to its features emitted (waits for the watermark): p50 {}, p99 {}, \
         p99.9 {} over {} events",
        q(&mut run.latencies, 0.5),
        q(&mut run.latencies, 0.99),
        q(&mut run.latencies, 0.999),
        run.latencies.len()
    );
    println!(
        "  watermark lag: at most {:.3} s of event time behind the latest event",
        run.max_lag_micros as f64 / 1e6
    );
}

pub fn run(args: StreamArgs) -> Result<ExitCode, String> {
    if args.scenario != "fraud" {
        return Err(format!(
            "unknown scenario '{}': the scenario is fraud",
            args.scenario
        ));
    }
    if args.events == 0 || args.batch == 0 {
        return Err("--events and --batch must be at least 1".into());
    }
    let runtime = crate::runtime()?;
    let events = spate_bench::stream::fraud_events(args.events, args.batch);
    println!(
        "stream bench: scenario fraud, {} events in pushes of {} rows, views {}",
        args.events,
        args.batch,
        spate_bench::stream::VIEWS
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut under_test = runtime.block_on(run_pipeline(args.backend, &events))?;
    println!("{}", under_test.selection);
    report(&mut under_test);
    if args.backend != Backend::Cpu {
        let mut cpu = runtime.block_on(run_pipeline(Backend::Cpu, &events))?;
        report(&mut cpu);
        println!(
            "  {} / cpu throughput: {:.2}x",
            under_test.backend,
            cpu.wall.as_secs_f64() / under_test.wall.as_secs_f64().max(1e-9)
        );
    }
    if !args.verify {
        return Ok(ExitCode::SUCCESS);
    }
    let checks = runtime.block_on(verify(&events, &under_test))?;
    let (mut matched, mut total) = (0, 0);
    for c in &checks {
        println!(
            "  {}: {}/{} rows equal the replay ({} emitted){}",
            c.view,
            c.matched,
            c.expected,
            c.emitted,
            if c.equal() { "" } else { "  DIFFERS" }
        );
        matched += c.matched;
        total += c.expected.max(c.emitted);
    }
    println!("verified: {matched}/{total} windows equal batch replay");
    Ok(if total > 0 && checks.iter().all(|c| c.equal()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
