//! TPC-H cross-check: all 22 queries at SF 0.1 on Spate (on the `cpu` and the `emulated`
//! backends) and on DuckDB, over the same Parquet files written by `spate gen tpch`, must agree.
//!
//! Integers, strings and dates compare exactly; two decimals compare exactly at the smaller of
//! their scales; floats, and decimal-vs-float pairs, to 1e-6 relative (a decimal-vs-float pair
//! also matches within one unit of the decimal's last place). Rows compare in order
//! (every multi-row TPC-H query has an ORDER BY). The comparison is `spate_bench::cells`, which
//! the benchmark runner shares.
//!
//! DuckDB runs through its Python package. `scripts/test` installs it in `.venv` and sets
//! `SPATE_REQUIRE_DUCKDB=1`, which turns a missing DuckDB into a failure; without it the check
//! reports itself as skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde_json::Value;
use spate::{Backend, Engine};
use spate_bench::cells::{cells_from_batches, compare_cells, rows_from_json};

const SCALE_FACTOR: &str = "0.1";

fn main() -> ExitCode {
    match run() {
        Ok(Outcome::Passed(n)) => {
            println!("tpch_duckdb: {n} passed, 0 failed");
            ExitCode::SUCCESS
        }
        Ok(Outcome::Skipped(why)) => {
            println!("tpch_duckdb: SKIPPED: {why}");
            println!("tpch_duckdb: 0 passed, 0 failed, 22 skipped");
            ExitCode::SUCCESS
        }
        Ok(Outcome::Failed { passed, failed }) => {
            println!("tpch_duckdb: {passed} passed, {failed} failed");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("tpch_duckdb: error: {e}");
            println!("tpch_duckdb: 0 passed, 22 failed");
            ExitCode::FAILURE
        }
    }
}

enum Outcome {
    Passed(usize),
    Skipped(String),
    Failed { passed: usize, failed: usize },
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> Result<Option<PathBuf>, String> {
    match spate_bench::duckdb::find_python(None, &workspace_root()) {
        Ok(python) => Ok(Some(python)),
        Err(why) if std::env::var_os("SPATE_REQUIRE_DUCKDB").is_some_and(|v| v == "1") => Err(
            format!("DuckDB is required (SPATE_REQUIRE_DUCKDB=1): {why}"),
        ),
        Err(_) => Ok(None),
    }
}

/// Writes the data once per target folder with the `spate` binary itself.
fn data_dir() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tpch-sf{SCALE_FACTOR}"));
    let done = dir.join(".complete");
    if done.exists() {
        return Ok(dir);
    }
    let status = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["gen", "tpch", "--sf", SCALE_FACTOR, "--out"])
        .arg(&dir)
        .status()
        .map_err(|e| format!("cannot run spate gen: {e}"))?;
    if !status.success() {
        return Err(format!("spate gen tpch failed: {status}"));
    }
    std::fs::write(&done, b"").map_err(|e| e.to_string())?;
    Ok(dir)
}

fn run() -> Result<Outcome, String> {
    let Some(python) = python()? else {
        return Ok(Outcome::Skipped(
            "DuckDB's Python package is not installed (scripts/test installs it in .venv)".into(),
        ));
    };
    let dir = data_dir()?;
    let query_dir = workspace_root().join("benches/queries/tpch");
    let files: Vec<PathBuf> = (1..=22)
        .map(|n| query_dir.join(format!("q{n:02}.sql")))
        .collect();
    let output = Command::new(&python)
        .arg(workspace_root().join("scripts/duckdb_queries.py"))
        .arg(&dir)
        .args(&files)
        .output()
        .map_err(|e| format!("cannot run DuckDB: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "DuckDB failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let duckdb: Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("bad DuckDB output: {e}"))?;

    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let (mut passed, mut failed) = (0, 0);
    // Every query runs on the CPU and on the emulated GPU backend (GPU operators where they
    // exist, their kernels run by the emulator): both must match DuckDB.
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = Engine::builder()
            .backend(backend)
            .build()
            .map_err(|e| e.to_string())?;
        runtime
            .block_on(spate::tpch::register_parquet_dir(&engine, &dir))
            .map_err(|e| e.to_string())?;
        for (number, sql) in spate_bench::tpch::QUERIES {
            let name = format!("q{number:02}");
            let started = std::time::Instant::now();
            let expected = &duckdb[&name];
            let verdict = match runtime.block_on(engine.collect(sql)) {
                Err(e) => Err(format!("Spate failed: {e}")),
                Ok(batches) => match expected.get("error") {
                    Some(err) => Err(format!("DuckDB failed: {err}")),
                    None => {
                        let spate = cells_from_batches(&batches)?;
                        compare_cells(&rows_from_json(&expected["rows"])?, &spate)
                            .map(|()| spate.len())
                            .map_err(|e| format!("Spate differs from DuckDB: {e}"))
                    }
                },
            };
            let ms = started.elapsed().as_millis();
            match verdict {
                Ok(rows) => {
                    passed += 1;
                    println!("{name} [{backend}] ... ok ({rows} rows, {ms} ms)");
                }
                Err(why) => {
                    failed += 1;
                    println!("{name} [{backend}] ... FAILED: {why}");
                }
            }
        }
    }
    Ok(if failed == 0 {
        Outcome::Passed(passed)
    } else {
        Outcome::Failed { passed, failed }
    })
}
