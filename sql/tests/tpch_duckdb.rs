//! TPC-H cross-check: all 22 queries at SF 0.1 on Spate (on the `cpu` and the `emulated`
//! backends) and on DuckDB, over the same Parquet files written by `spate gen tpch`, must agree.
//!
//! Integers, strings and dates compare exactly; two decimals compare exactly at the smaller of
//! their scales; floats, and decimal-vs-float pairs, to 1e-6 relative (a decimal-vs-float pair
//! also matches within one unit of the decimal's last place). Rows compare in order
//! (every multi-row TPC-H query has an ORDER BY).
//!
//! DuckDB runs through its Python package. `scripts/test` installs it in `.venv` and sets
//! `SPATE_REQUIRE_DUCKDB=1`, which turns a missing DuckDB into a failure; without it the check
//! reports itself as skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Decimal128Type, Float32Type, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use serde_json::Value;
use spate::{Backend, Engine};

const SCALE_FACTOR: &str = "0.1";
const FLOAT_TOLERANCE: f64 = 1e-6;

/// One result cell in a form both engines can be reduced to.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i128),
    /// Unscaled value and scale.
    Decimal(i128, u32),
    Float(f64),
    Text(String),
    Bool(bool),
}

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
    let candidate = match std::env::var_os("SPATE_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".venv/bin/python"),
    };
    let has_duckdb = Command::new(&candidate)
        .args(["-c", "import duckdb"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_duckdb {
        return Ok(Some(candidate));
    }
    if std::env::var_os("SPATE_REQUIRE_DUCKDB").is_some_and(|v| v == "1") {
        return Err(format!(
            "DuckDB is required but `{} -c 'import duckdb'` failed",
            candidate.display()
        ));
    }
    Ok(None)
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
                    None => compare(&to_cells(&batches)?, &from_json(expected)?),
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

fn to_cells(batches: &[RecordBatch]) -> Result<Vec<Vec<Cell>>, String> {
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<Vec<Cell>> = batch
            .columns()
            .iter()
            .map(|c| column_cells(c.as_ref()))
            .collect::<Result<_, _>>()?;
        for r in 0..batch.num_rows() {
            rows.push(columns.iter().map(|c| c[r].clone()).collect());
        }
    }
    Ok(rows)
}

fn column_cells(array: &dyn Array) -> Result<Vec<Cell>, String> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(array, &options).map_err(|e| e.to_string())?;
    (0..array.len())
        .map(|i| {
            if array.is_null(i) {
                return Ok(Cell::Null);
            }
            Ok(match array.data_type() {
                DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64 => Cell::Int(
                    formatter
                        .value(i)
                        .to_string()
                        .parse()
                        .map_err(|e| format!("{e}"))?,
                ),
                DataType::Decimal128(_, scale) => Cell::Decimal(
                    array.as_primitive::<Decimal128Type>().value(i),
                    u32::try_from(*scale).map_err(|_| "negative decimal scale".to_string())?,
                ),
                DataType::Float64 => Cell::Float(array.as_primitive::<Float64Type>().value(i)),
                DataType::Float32 => {
                    Cell::Float(f64::from(array.as_primitive::<Float32Type>().value(i)))
                }
                DataType::Boolean => Cell::Bool(array.as_boolean().value(i)),
                _ => Cell::Text(formatter.value(i).to_string()),
            })
        })
        .collect()
}

fn from_json(result: &Value) -> Result<Vec<Vec<Cell>>, String> {
    let rows = result["rows"]
        .as_array()
        .ok_or("DuckDB result has no rows")?;
    rows.iter()
        .map(|row| {
            row.as_array()
                .ok_or_else(|| "row is not an array".to_string())?
                .iter()
                .map(json_cell)
                .collect()
        })
        .collect()
}

fn json_cell(value: &Value) -> Result<Cell, String> {
    if value.is_null() {
        return Ok(Cell::Null);
    }
    let bad = || format!("bad cell {value}");
    let tag = value[0].as_str().ok_or_else(bad)?;
    let body = &value[1];
    Ok(match tag {
        "i" => Cell::Int(body.as_str().ok_or_else(bad)?.parse().map_err(|_| bad())?),
        "d" => parse_decimal(body.as_str().ok_or_else(bad)?).ok_or_else(bad)?,
        "f" => Cell::Float(body.as_f64().ok_or_else(bad)?),
        "b" => Cell::Bool(body.as_bool().ok_or_else(bad)?),
        "s" | "t" => Cell::Text(body.as_str().ok_or_else(bad)?.to_string()),
        _ => return Err(bad()),
    })
}

fn parse_decimal(text: &str) -> Option<Cell> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = format!("{int}{frac}");
    Some(Cell::Decimal(
        digits.parse().ok()?,
        u32::try_from(frac.len()).ok()?,
    ))
}

/// Rounds a scaled value to a smaller scale, half away from zero.
fn rescale(value: i128, from: u32, to: u32) -> i128 {
    let divisor = 10i128.pow(from - to);
    let (q, r) = (value / divisor, value % divisor);
    if r.abs() * 2 >= divisor {
        q + value.signum()
    } else {
        q
    }
}

fn as_float(cell: &Cell) -> Option<f64> {
    match cell {
        Cell::Int(v) => Some(*v as f64),
        Cell::Decimal(v, s) => Some(*v as f64 / 10f64.powi(*s as i32)),
        Cell::Float(v) => Some(*v),
        _ => None,
    }
}

fn cells_match(spate: &Cell, duckdb: &Cell) -> bool {
    match (spate, duckdb) {
        (Cell::Decimal(a, sa), Cell::Decimal(b, sb)) => {
            let scale = (*sa).min(*sb);
            rescale(*a, *sa, scale) == rescale(*b, *sb, scale)
        }
        (Cell::Decimal(a, s), Cell::Int(b)) | (Cell::Int(b), Cell::Decimal(a, s)) => {
            rescale(*a, *s, 0) == *b && *a % 10i128.pow(*s) == 0
        }
        (Cell::Float(_), _) | (_, Cell::Float(_)) => match (as_float(spate), as_float(duckdb)) {
            (Some(a), Some(b)) => {
                let magnitude = a.abs().max(b.abs());
                let diff = (a - b).abs();
                // A decimal is only as precise as its scale (DataFusion's AVG over decimals
                // truncates to scale 6, DuckDB's returns a double): within one unit of the
                // last decimal place counts as equal.
                let decimal_unit = [spate, duckdb]
                    .iter()
                    .find_map(|c| match c {
                        Cell::Decimal(_, s) => Some(10f64.powi(-(*s as i32))),
                        _ => None,
                    })
                    .unwrap_or(0.0);
                diff <= FLOAT_TOLERANCE * magnitude || diff < 1e-12 || diff < decimal_unit
            }
            _ => false,
        },
        (a, b) => a == b,
    }
}

fn compare(spate: &[Vec<Cell>], duckdb: &[Vec<Cell>]) -> Result<usize, String> {
    if spate.len() != duckdb.len() {
        return Err(format!(
            "{} rows from Spate, {} from DuckDB",
            spate.len(),
            duckdb.len()
        ));
    }
    for (i, (a, b)) in spate.iter().zip(duckdb).enumerate() {
        if a.len() != b.len() {
            return Err(format!(
                "row {i}: {} columns from Spate, {} from DuckDB",
                a.len(),
                b.len()
            ));
        }
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            if !cells_match(x, y) {
                return Err(format!("row {i}, column {j}: Spate {x:?}, DuckDB {y:?}"));
            }
        }
    }
    Ok(spate.len())
}
