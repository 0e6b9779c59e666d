//! The TPC-DS GPU report in the test output: `spate bench tpcds --sf 0.1 --backend emulated
//! --verify`, printed as it runs. Every statement must match the CPU backend (q90 by failing
//! with the same division by zero), and all [`FULLY_ON_GPU`] of the 103 must run with every
//! compute operator on the GPU and no host exchange: a change that sends one back to the CPU
//! fails here.
//!
//! SF 0.1 is the scale CI's time allows (the data is generated once, in process, into
//! `target/spate-bench/tpcds-sf0.1`). harness = false, so that the report reaches the test
//! output; it runs the `spate` binary cargo built for the tests.

use std::process::{Command, ExitCode};

/// Statements that must run fully on the GPU at SF 0.1.
const FULLY_ON_GPU: usize = 103;

/// `(matched, fully on GPU, statements)` from the report's last line.
fn verdict(last: &str) -> Option<(usize, usize, usize)> {
    // verified: 103/103 matched, 90/103 fully on GPU
    let rest = last.strip_prefix("verified: ")?;
    let (matched, rest) = rest.split_once(" matched, ")?;
    let (matched, total) = matched.split_once('/')?;
    let (gpu, _) = rest.strip_suffix(" fully on GPU")?.split_once('/')?;
    Some((
        matched.parse().ok()?,
        gpu.parse().ok()?,
        total.parse().ok()?,
    ))
}

fn main() -> ExitCode {
    println!("\nrunning 1 test");
    println!("\n==> spate bench tpcds --sf 0.1 --backend emulated --verify");
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args([
            "bench",
            "tpcds",
            "--sf",
            "0.1",
            "--backend",
            "emulated",
            "--verify",
        ])
        .env_remove("RUST_LOG")
        .output();
    let ok = match output {
        Ok(output) => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            print!("{stdout}");
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
            let last = stdout.lines().last().unwrap_or_default();
            match verdict(last) {
                Some((matched, gpu, total))
                    if output.status.success()
                        && total == 103
                        && matched == total
                        && gpu >= FULLY_ON_GPU =>
                {
                    true
                }
                _ => {
                    println!(
                        "expected a successful run ending with `verified: 103/103 matched, \
                         N/103 fully on GPU` with N >= {FULLY_ON_GPU}; it ended with `{last}`"
                    );
                    false
                }
            }
        }
        Err(e) => {
            println!("cannot run spate: {e}");
            false
        }
    };
    if ok {
        println!("test tpcds_report ... ok\n\ntest result: ok. 1 passed; 0 failed\n");
        ExitCode::SUCCESS
    } else {
        println!("test tpcds_report ... FAILED\n\ntest result: FAILED. 0 passed; 1 failed\n");
        ExitCode::FAILURE
    }
}
