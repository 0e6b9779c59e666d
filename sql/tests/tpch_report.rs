//! The TPC-H GPU report in the test output: `spate bench tpch --backend emulated --verify` at
//! SF 0.01 and 0.1, printed as it runs. Every query must match the CPU backend and run with
//! every compute operator on the GPU (`verified: 22/22 matched, 22/22 fully on GPU`).
//!
//! harness = false, so that the report reaches the test output. It runs the `spate` binary
//! cargo built for the tests (a `cargo run` from a test script would rebuild the workspace
//! with other features).

use std::process::{Command, ExitCode};

const SCALE_FACTORS: [&str; 2] = ["0.01", "0.1"];
const EXPECTED: &str = "verified: 22/22 matched, 22/22 fully on GPU";

fn main() -> ExitCode {
    println!("\nrunning 1 test");
    let mut ok = true;
    for sf in SCALE_FACTORS {
        println!("\n==> spate bench tpch --sf {sf} --backend emulated --verify");
        let output = Command::new(env!("CARGO_BIN_EXE_spate"))
            .args([
                "bench",
                "tpch",
                "--sf",
                sf,
                "--backend",
                "emulated",
                "--verify",
            ])
            .env_remove("RUST_LOG")
            .output();
        let output = match output {
            Ok(o) => o,
            Err(e) => {
                println!("cannot run spate: {e}");
                ok = false;
                continue;
            }
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        let last = stdout.lines().last().unwrap_or_default();
        if !output.status.success() || last != EXPECTED {
            println!("SF {sf}: expected a successful run ending with `{EXPECTED}`");
            ok = false;
        }
    }
    if ok {
        println!("test tpch_report ... ok\n\ntest result: ok. 1 passed; 0 failed\n");
        ExitCode::SUCCESS
    } else {
        println!("test tpch_report ... FAILED\n\ntest result: FAILED. 0 passed; 1 failed\n");
        ExitCode::FAILURE
    }
}
