//! `spate selftest`: every primitive kernel checked against its CPU reference on a device, and
//! optionally the primitives' bandwidth.
//!
//! Exit status 0 only when every check passed. The last line is always
//! `selftest: N passed, M failed`.

use std::process::ExitCode;
use std::time::Instant;

use comfy_table::{Table, presets};
use spate::kernels::{BackendKind, Device, DeviceOptions, probe, selftest, throughput};

/// Which backend `spate selftest` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SelftestBackend {
    /// A real GPU through CUDA.
    Cuda,
    /// The kernels compiled for the host and run by the emulator.
    Emulated,
}

/// Options of `spate selftest`.
#[derive(Debug, clap::Args)]
pub struct SelftestArgs {
    /// Backend to check; defaults to cuda when a GPU is usable, else emulated.
    #[arg(long, value_enum)]
    backend: Option<SelftestBackend>,
    /// Also measure bandwidth of copy, compaction, hashing and sorting.
    #[arg(long)]
    bench: bool,
    /// Rows for the bandwidth measurements (default: 64M on cuda, 1M on emulated).
    #[arg(long, value_name = "N")]
    bench_rows: Option<usize>,
    /// Print tables as Markdown (for reports).
    #[arg(long)]
    markdown: bool,
}

fn table(markdown: bool) -> Table {
    let mut t = Table::new();
    t.load_preset(if markdown {
        presets::ASCII_MARKDOWN
    } else {
        presets::UTF8_FULL_CONDENSED
    });
    t
}

pub fn run(args: SelftestArgs) -> Result<ExitCode, String> {
    let kind = match args.backend {
        Some(SelftestBackend::Cuda) => BackendKind::Cuda,
        Some(SelftestBackend::Emulated) => BackendKind::Emulated,
        None => match probe::discover() {
            Ok(_) => BackendKind::Cuda,
            Err(e) => {
                println!("no GPU ({e}): checking the emulated backend");
                BackendKind::Emulated
            }
        },
    };
    let opened = Instant::now();
    let device = Device::open(kind, DeviceOptions::default())
        .map_err(|e| format!("cannot open the {kind} backend: {e}"))?;
    println!("device: {}", device.description());
    println!(
        "opened in {:.1} ms",
        opened.elapsed().as_secs_f64() * 1000.0
    );

    let mut sizes = selftest::SIZES.to_vec();
    sizes.extend([100_000, 1 << 20]);
    if kind == BackendKind::Cuda {
        sizes.push(1 << 24);
    }
    let started = Instant::now();
    let results = selftest::run(&device, &sizes).map_err(|e| e.to_string())?;
    let mut passed = 0;
    let mut failed = 0;
    for (name, _) in selftest::CHECKS {
        let rows: Vec<_> = results.iter().filter(|r| r.check == *name).collect();
        if rows.is_empty() {
            continue;
        }
        let mut t = table(args.markdown);
        t.set_header(vec!["rows", "time (ms)", "result"]);
        for r in rows {
            let result = match &r.failure {
                None => {
                    passed += 1;
                    "OK".to_string()
                }
                Some(why) => {
                    failed += 1;
                    format!("FAIL: {why}")
                }
            };
            t.add_row(vec![r.rows.to_string(), format!("{:.3}", r.millis), result]);
        }
        println!("\n{name}\n{t}");
    }
    // Checks skipped after a device fault count as failures.
    let expected = selftest::CHECKS.len() * sizes.len();
    failed += expected.saturating_sub(passed + failed);
    println!(
        "\nchecks took {:.1} s; memory peak {:.1} MiB",
        started.elapsed().as_secs_f64(),
        device.memory_stats().peak_bytes as f64 / f64::from(1u32 << 20)
    );

    if args.bench && failed == 0 {
        let rows = args.bench_rows.unwrap_or(match kind {
            BackendKind::Cuda => 64 << 20,
            BackendKind::Emulated => 1 << 20,
        });
        match throughput::measure(&device, rows, 5) {
            Ok(measurements) => {
                let mut t = table(args.markdown);
                t.set_header(vec![
                    "operation",
                    "rows",
                    "MB moved",
                    "median ms",
                    "GB/s",
                    "G rows/s",
                ]);
                for m in &measurements {
                    t.add_row(vec![
                        m.name.clone(),
                        m.rows.to_string(),
                        format!("{:.1}", m.bytes as f64 / 1e6),
                        format!("{:.3}", m.median_ms),
                        format!("{:.1}", m.gb_per_s()),
                        format!("{:.2}", m.g_rows_per_s()),
                    ]);
                }
                println!("\nbandwidth on {kind} ({rows} rows, median of 5 after a warm-up)\n{t}");
            }
            Err(e) => {
                println!("\nbandwidth measurement failed: {e}");
                failed += 1;
            }
        }
    }
    println!("selftest: {passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
