//! The result of one `spate bench tpch` run, and the files it is written to.
//!
//! A run is described by [`TpchReport`]: where and when it ran (machine, date, commit, data
//! scale), which engines took part, and per query and engine the timings of every run, the
//! verification outcome and, for GPU engines, the roofline accounting. It is written as JSON
//! (the record), a markdown table (for reading and for `benches/README.md`) and a PNG chart.

use serde::{Deserialize, Serialize};

/// One `spate bench tpch` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TpchReport {
    /// `"tpch"`.
    pub suite: String,
    /// TPC-H scale factor.
    pub scale_factor: f64,
    /// `"hot"` (tables in engine memory: GPU memory for Spate's GPU backends, host memory for
    /// the others) or `"cold"` (read from Parquet on local disk on every run).
    pub mode: String,
    /// Timed runs per query and engine (after the first, untimed run in hot mode).
    pub runs: usize,
    /// UTC date of the run, `YYYY-MM-DD`.
    pub date: String,
    /// `git rev-parse HEAD` of the build measured, with `-dirty` when the tree had changes.
    pub commit: String,
    /// The machine it ran on.
    pub machine: Machine,
    /// Device memory bandwidth measured at start (a large device-to-device copy), when a GPU
    /// engine took part.
    pub bandwidth: Option<Bandwidth>,
    /// The engines, in the order they were given.
    pub engines: Vec<EngineInfo>,
    /// Per query, in query order.
    pub queries: Vec<QueryResult>,
}

/// Where a run happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// Short label used in file names, e.g. `h200` or `cpu2`.
    pub label: String,
    /// CPU model name.
    pub cpu: String,
    /// Logical cores.
    pub cores: usize,
    /// Host memory in bytes (0 when unknown).
    pub memory_bytes: u64,
    /// GPU name and memory, or why there is none.
    pub gpu: String,
    /// Operating system and kernel.
    pub os: String,
}

/// Measured device memory bandwidth.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Backend it was measured on (`cuda` or `emulated`; emulated numbers describe the host).
    pub backend: String,
    /// Bytes read plus bytes written by the copy.
    pub bytes: u64,
    /// Median time of the copy, milliseconds.
    pub median_ms: f64,
    /// `bytes / median_ms`, in GB/s (10^9 bytes per second).
    pub gb_per_s: f64,
}

/// One engine taking part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineInfo {
    /// `spate-gpu`, `spate-cpu` or `duckdb`.
    pub name: String,
    /// What it is: backend and version, e.g. `spate 0.1.0, emulated backend`, `duckdb 1.4.2, 16 threads`.
    pub description: String,
    /// Why it did not run, when it did not (e.g. DuckDB is not installed); its queries are absent.
    pub skipped: Option<String>,
}

/// One query's results across engines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryResult {
    /// Query number, 1–22.
    pub query: usize,
    /// One entry per engine that ran, in engine order.
    pub engines: Vec<EngineRun>,
}

/// One engine's runs of one query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineRun {
    /// Engine name, as in [`EngineInfo::name`].
    pub engine: String,
    /// `matched`, or what went wrong: `mismatch: …`, `failed: …`. Only matched runs count in
    /// sums and speedups.
    pub status: String,
    /// Result rows.
    pub rows: usize,
    /// Planning time of the last run, milliseconds (0 where the engine does not say).
    pub plan_ms: f64,
    /// Kernel compile time during the first run (cold in-process kernel cache), milliseconds.
    pub compile_ms_first: f64,
    /// Kernel compile time summed over the timed runs; 0 unless something recompiled.
    pub compile_ms_timed: f64,
    /// Execution time of each timed run, milliseconds (plan and compile time excluded).
    pub execute_ms: Vec<f64>,
    /// Median of `execute_ms`.
    pub median_ms: f64,
    /// Minimum of `execute_ms`.
    pub min_ms: f64,
    /// Maximum of `execute_ms`.
    pub max_ms: f64,
    /// GPU engines: device memory traffic against the measured bandwidth.
    pub roofline: Option<Roofline>,
}

/// Device memory traffic of one query's GPU operators.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Roofline {
    /// Bytes the GPU operators read from device memory.
    pub read_bytes: u64,
    /// Bytes the GPU operators wrote to device memory.
    pub write_bytes: u64,
    /// The time those bytes take at the measured bandwidth, milliseconds.
    pub floor_ms: f64,
    /// Median execution time divided by `floor_ms`.
    pub achieved_over_floor: f64,
}
