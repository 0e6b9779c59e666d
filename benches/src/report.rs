//! The result of one `spate bench tpch` run, and the files it is written to.
//!
//! A run is described by [`TpchReport`]: where and when it ran (machine, date, commit, data
//! scale), which engines took part, and per query and engine the timings of every run, the
//! verification outcome and, for GPU engines, the roofline accounting. It is written as JSON
//! (the record), a markdown table (for reading and for `benches/README.md`) and a PNG chart,
//! all named by [`TpchReport::file_stem`]: `<date>-<machine>-tpch-sf<scale>-<mode>`.
//!
//! Contracts: only runs whose status is `matched` count in totals, speedups and the chart. A
//! speedup is the baseline engine's median over the engine's median (baseline: `duckdb` when it
//! ran, else `spate-cpu`, else the first engine), taken per query where both matched; engines
//! are summarised by the geometric mean of those. Describing the machine, the commit and the
//! date never fails: what cannot be found reads `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::datapath::DataPath;

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
    /// Template number (TPC-H 1–22, TPC-DS 1–99).
    pub query: usize,
    /// How the report names it (`q14a`); empty in files written before TPC-DS, which name it
    /// `q<number>`.
    #[serde(default)]
    pub label: String,
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
    /// GPU engines: runtime calls, bus traffic, host exchanges and the modeled H200 time.
    #[serde(default)]
    pub data_path: Option<DataPath>,
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
    /// Bytes the plan's GPU operators copied host to device, every copy counted (in hot mode
    /// these are round trips inside the query).
    #[serde(default)]
    pub h2d_bytes: u64,
    /// Bytes the plan moved over the bus, device to host.
    #[serde(default)]
    pub d2h_bytes: u64,
}

/// Status of a run whose result agreed with the reference; the only runs that count.
pub const MATCHED: &str = "matched";

/// Host memory in GiB, as the markdown header shows it.
const GIB: f64 = (1u64 << 30) as f64;

/// Width and height of the chart, pixels: wide enough for 22 groups of three bars.
pub const CHART_SIZE: (u32, u32) = (1600, 700);

/// Font family the chart registers (the embedded DejaVu Sans) and draws every text with:
/// plotters is built without system fonts, so an unregistered family would fail to draw.
const CHART_FONT: &str = "sans-serif";

/// Smallest time the log-scale chart draws, milliseconds: a zero or negative time has no
/// logarithm, so it is drawn as this.
const CHART_MIN_MS: f64 = 1e-3;

/// A status longer than this is cut in the markdown table; the JSON keeps all of it.
const STATUS_CELL_CHARS: usize = 60;

/// The longest machine label, so that file names stay short.
const LABEL_CHARS: usize = 24;

impl Machine {
    /// Describes this machine from `/proc` and the standard library; `gpu` is the GPU's name
    /// and memory as the caller found it (e.g. `NVIDIA H200, 141 GB`), or `None` for none.
    ///
    /// Nothing here fails: what cannot be read is `unknown` (or 0), so that a benchmark never
    /// dies on describing where it ran.
    pub fn detect(gpu: Option<String>) -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| cpu_model(&text))
            .unwrap_or_else(|| "unknown".to_string());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| mem_total_bytes(&text))
            .unwrap_or(0);
        let gpu = gpu
            .map(|name| name.trim().to_string())
            .filter(|name| !name.is_empty() && !name.eq_ignore_ascii_case("none"));
        let label = match &gpu {
            Some(name) => gpu_label(name),
            None => format!("cpu{cores}"),
        };
        Machine {
            label,
            cpu,
            cores,
            memory_bytes,
            gpu: gpu.unwrap_or_else(|| "none".to_string()),
            os: detect_os(),
        }
    }
}

/// The first `model name` of `/proc/cpuinfo`, with runs of spaces collapsed.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        (key.trim() == "model name" && !value.is_empty()).then_some(value)
    })
}

/// `MemTotal` of `/proc/meminfo` in bytes (the file counts in KiB, whatever its unit says).
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `Linux 6.8.0-51-generic`: kernel type and release, from `/proc` rather than `uname` so
/// that nothing is spawned.
fn detect_os() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|text| text.trim().to_string())
            .filter(|text| !text.is_empty())
    };
    if let (Some(kind), Some(release)) = (
        read("/proc/sys/kernel/ostype"),
        read("/proc/sys/kernel/osrelease"),
    ) {
        return format!("{kind} {release}");
    }
    // `/proc/version` reads `Linux version 6.8.0-51-generic (builder@host) ...`.
    if let Some(version) = read("/proc/version") {
        let words: Vec<&str> = version.split_whitespace().take(3).collect();
        if let [kind, "version", release] = words.as_slice() {
            return format!("{kind} {release}");
        }
    }
    std::env::consts::OS.to_string()
}

/// A short, file-name-safe label for a GPU name: its model, lowercase and alphanumeric.
///
/// `NVIDIA H200, 141 GB` → `h200`, `NVIDIA GeForce RTX 4090` → `rtx4090`,
/// `NVIDIA A100-SXM4-80GB` → `a100`. Brand words and memory sizes are dropped; the model is
/// the first token with a digit, with the series before it when the model is only digits
/// (`RTX 4090`) and a `Ti`/`Super` after it.
fn gpu_label(gpu: &str) -> String {
    const BRANDS: [&str; 10] = [
        "nvidia",
        "geforce",
        "tesla",
        "quadro",
        "amd",
        "radeon",
        "intel",
        "corporation",
        "graphics",
        "tm",
    ];
    // Memory follows a comma in what callers pass (`NVIDIA H200, 141 GB`).
    let name = gpu.split(',').next().unwrap_or(gpu);
    let tokens: Vec<String> = name
        .split_whitespace()
        // `A100-SXM4-80GB`: the form factor and memory after the model are not the model.
        .map(|token| token.split('-').next().unwrap_or(token))
        .map(|token| {
            token
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
                .to_ascii_lowercase()
        })
        .filter(|token| !token.is_empty() && !BRANDS.contains(&token.as_str()))
        .filter(|token| !is_memory_size(token))
        .collect();
    let has_digit = |token: &String| token.chars().any(|c| c.is_ascii_digit());
    let label = match tokens.iter().position(has_digit) {
        Some(at) => {
            let mut label = String::new();
            if at > 0 && tokens[at].chars().all(|c| c.is_ascii_digit()) {
                label.push_str(&tokens[at - 1]);
            }
            label.push_str(&tokens[at]);
            if let Some(next) = tokens.get(at + 1)
                && (next == "ti" || next == "super")
            {
                label.push_str(next);
            }
            label
        }
        None => tokens.concat(),
    };
    if label.is_empty() {
        "gpu".to_string()
    } else {
        label.chars().take(LABEL_CHARS).collect()
    }
}

/// `80gb`, `24g`, `512mb`: a memory size, not a model name.
fn is_memory_size(token: &str) -> bool {
    let digits = token.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &token[digits.len()..];
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && matches!(unit, "g" | "gb" | "gib" | "m" | "mb" | "mib" | "t" | "tb")
}

/// `git rev-parse HEAD` of the repository at `repo_dir`, with `-dirty` when tracked files have
/// changes; `unknown` when git cannot say (not installed, not a repository).
pub fn git_commit(repo_dir: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(repo_dir)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "HEAD"]).filter(|head| !head.is_empty()) else {
        return "unknown".to_string();
    };
    // Untracked files are left out: result files and scratch data do not change what was built.
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if !changes.is_empty() => format!("{head}-dirty"),
        _ => head,
    }
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub fn today_utc() -> String {
    let seconds = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        // A clock before 1970 is wrong, but still names a date.
        Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |s| -s),
    };
    date_from_unix_seconds(seconds)
}

/// The UTC date `seconds` after 1970-01-01T00:00:00Z, `YYYY-MM-DD`.
fn date_from_unix_seconds(seconds: i64) -> String {
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    format!("{year:04}-{month:02}-{day:02}")
}

/// Year, month and day of the day `days` after 1970-01-01 in the proleptic Gregorian calendar.
///
/// Howard Hinnant's `civil_from_days`: count in 400-year eras (146,097 days each) of years that
/// start on 1 March, so that the leap day is the last day of its year.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01; saturate so absurd clocks give absurd dates, not overflow.
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097); // [0, 146096]
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365; // [0, 399]
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // [0, 365]
    let month_from_march = (5 * day_of_year + 2) / 153; // [0, 11]
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1; // [1, 31]
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    }; // [1, 12]
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// Totals and speedups of one engine over a report.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSummary {
    /// Engine name.
    pub engine: String,
    /// Queries whose run matched.
    pub matched: usize,
    /// Sum of `median_ms` over the matched queries. Engines that matched different queries
    /// have sums over different sets.
    pub total_median_ms: f64,
    /// Geometric mean of the per-query speedups against the baseline, over the queries both
    /// matched; `None` when there is no such query (or no baseline).
    pub geomean_speedup: Option<f64>,
    /// Queries the geometric mean is over.
    pub speedup_queries: usize,
}

/// The files [`TpchReport::write_files`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFiles {
    /// `<stem>.json`: the record.
    pub json: PathBuf,
    /// `<stem>.md`: the tables.
    pub markdown: PathBuf,
    /// `<stem>.png`: the chart.
    pub png: PathBuf,
}

impl EngineRun {
    /// Whether the result agreed with the reference (the run counts in sums and speedups).
    pub fn is_matched(&self) -> bool {
        self.status == MATCHED
    }

    /// Whether the engine answered as the reference did: the same result, or the same error
    /// (TPC-DS q90 divides by zero at SF 0.1; such a run has no times).
    pub fn is_correct(&self) -> bool {
        self.is_matched() || self.status.starts_with(SAME_ERROR)
    }
}

/// The status of a run that failed as the reference did, before the error.
pub const SAME_ERROR: &str = "same error as the reference: ";

impl QueryResult {
    /// The query's name in the report: its label, or `q<number>`.
    pub fn label(&self) -> String {
        if self.label.is_empty() {
            format!("q{}", self.query)
        } else {
            self.label.clone()
        }
    }

    /// The run of `engine`, whatever its status.
    pub fn run(&self, engine: &str) -> Option<&EngineRun> {
        self.engines.iter().find(|run| run.engine == engine)
    }

    /// The run of `engine` when it matched.
    pub fn matched_run(&self, engine: &str) -> Option<&EngineRun> {
        self.run(engine).filter(|run| run.is_matched())
    }

    /// `baseline`'s median over `engine`'s, when both matched and both medians are positive
    /// (a zero median has no meaningful ratio and would make the geometric mean infinite).
    pub fn speedup(&self, engine: &str, baseline: &str) -> Option<f64> {
        let usable = |run: &EngineRun| run.median_ms.is_finite() && run.median_ms > 0.0;
        let run = self.matched_run(engine).filter(|run| usable(run))?;
        let base = self.matched_run(baseline).filter(|run| usable(run))?;
        Some(base.median_ms / run.median_ms)
    }
}

impl TpchReport {
    /// The engines that ran (were not skipped), in engine order.
    pub fn ran_engines(&self) -> impl Iterator<Item = &EngineInfo> {
        self.engines
            .iter()
            .filter(|engine| engine.skipped.is_none())
    }

    /// The engine speedups are measured against: `duckdb` if it ran, else `spate-cpu`, else
    /// the first engine that ran; `None` when none ran.
    pub fn baseline(&self) -> Option<&str> {
        let ran = |name: &str| self.ran_engines().any(|engine| engine.name == name);
        ["duckdb", "spate-cpu"]
            .into_iter()
            .find(|name| ran(name))
            .or_else(|| self.ran_engines().next().map(|engine| engine.name.as_str()))
    }

    /// Totals and the geometric-mean speedup of `engine`.
    pub fn summary(&self, engine: &str) -> EngineSummary {
        let matched: Vec<&EngineRun> = self
            .queries
            .iter()
            .filter_map(|query| query.matched_run(engine))
            .collect();
        let speedups: Vec<f64> = match self.baseline() {
            Some(baseline) => self
                .queries
                .iter()
                .filter_map(|query| query.speedup(engine, baseline))
                .collect(),
            None => Vec::new(),
        };
        // Mean of logarithms: a product of 22 ratios could overflow, their logs cannot.
        let geomean_speedup = (!speedups.is_empty())
            .then(|| (speedups.iter().map(|s| s.ln()).sum::<f64>() / speedups.len() as f64).exp());
        EngineSummary {
            engine: engine.to_string(),
            matched: matched.len(),
            // Summed from +0.0: an empty sum of floats is -0.0.
            total_median_ms: matched
                .iter()
                .map(|run| run.median_ms)
                .fold(0.0, |a, b| a + b),
            geomean_speedup,
            speedup_queries: speedups.len(),
        }
    }

    /// [`Self::summary`] of every engine that ran, in engine order.
    pub fn summaries(&self) -> Vec<EngineSummary> {
        self.ran_engines()
            .map(|engine| self.summary(&engine.name))
            .collect()
    }

    /// `<date>-<machine label>-tpch-sf<scale factor>-<mode>`, e.g.
    /// `2025-06-15-h200-tpch-sf10-hot`; the scale factor has no trailing zeros (`sf0.01`, `sf1`).
    pub fn file_stem(&self) -> String {
        // f64's Display is the shortest text that reads back the same: 1.0 is `1`, 0.01 `0.01`.
        format!(
            "{}-{}-{}-sf{}-{}",
            file_safe(&self.date),
            file_safe(&self.machine.label),
            file_safe(&self.suite),
            file_safe(&self.scale_factor.to_string()),
            file_safe(&self.mode)
        )
    }

    /// Title used by the markdown and the chart: `TPC-H SF 1, hot, h200, 2025-06-15`.
    fn title(&self) -> String {
        let suite = match self.suite.as_str() {
            "tpch" => "TPC-H",
            "tpcds" => "TPC-DS",
            other => other,
        };
        format!(
            "{suite} SF {}, {}, {}, {}",
            self.scale_factor, self.mode, self.machine.label, self.date
        )
    }

    /// The report as markdown: a header naming machine, build, data and engines, the timing
    /// table with speedups, then roofline and kernel compile tables when there is data for them.
    pub fn to_markdown(&self) -> String {
        let mut md = vec![format!("# {}", self.title()), String::new()];
        md.extend(self.markdown_header());
        md.push(String::new());
        md.extend(self.markdown_times());
        let roofline = self.markdown_roofline();
        if !roofline.is_empty() {
            md.push(String::new());
            md.extend(roofline);
        }
        let data_path = self.markdown_data_path();
        if !data_path.is_empty() {
            md.push(String::new());
            md.extend(data_path);
        }
        let compile = self.markdown_compile();
        if !compile.is_empty() {
            md.push(String::new());
            md.extend(compile);
        }
        md.push(String::new());
        md.join("\n")
    }

    fn markdown_header(&self) -> Vec<String> {
        let machine = &self.machine;
        let memory = if machine.memory_bytes == 0 {
            "unknown memory".to_string()
        } else {
            format!("{:.1} GiB memory", machine.memory_bytes as f64 / GIB)
        };
        let mode = match self.mode.as_str() {
            "hot" => {
                "hot (tables in engine memory: GPU memory for Spate's GPU engine, host memory for the others)"
            }
            "cold" => "cold (tables read from Parquet on local disk on every run)",
            other => other,
        };
        let mut lines = vec![
            format!(
                "- Machine: `{}`: {}, {} logical cores, {memory}; GPU: {}; OS: {}",
                machine.label, machine.cpu, machine.cores, machine.gpu, machine.os
            ),
            format!("- Date: {} (UTC)", self.date),
            format!("- Commit: `{}`", self.commit),
            format!("- Scale factor: {}", self.scale_factor),
            format!("- Mode: {mode}"),
            format!(
                "- Runs: {} timed runs per query and engine; times are execute time (planning and \
                 kernel compile excluded), median (min–max), in ms",
                self.runs
            ),
        ];
        if let Some(bandwidth) = &self.bandwidth {
            let mut line = format!(
                "- Device memory bandwidth: {} GB/s on the `{}` backend ({} GB read and written \
                 by a device-to-device copy, median {} ms)",
                fmt_sig(bandwidth.gb_per_s, 3),
                bandwidth.backend,
                fmt_sig(bandwidth.bytes as f64 / 1e9, 3),
                fmt_sig(bandwidth.median_ms, 3)
            );
            if bandwidth.backend == "emulated" {
                line.push_str(
                    ". Measured on the `emulated` backend, so it describes the host emulator's \
                     memory copy, not a GPU; the roofline floors below are against it too",
                );
            }
            lines.push(line);
        }
        lines.push("- Engines:".to_string());
        for engine in &self.engines {
            lines.push(match &engine.skipped {
                None => format!("  - `{}`: {}", engine.name, engine.description),
                Some(reason) if engine.description.is_empty() => {
                    format!("  - `{}`: skipped: {reason}", engine.name)
                }
                Some(reason) => format!(
                    "  - `{}`: {} (skipped: {reason})",
                    engine.name, engine.description
                ),
            });
        }
        match self.baseline() {
            Some(baseline) => lines.push(format!(
                "- Speedup: `{baseline}` median / engine median, per query where both matched; \
                 the last row sums the medians of each engine's matched queries and gives the \
                 geometric mean of the speedups"
            )),
            None => lines.push("- No engine ran.".to_string()),
        }
        lines
    }

    fn markdown_times(&self) -> Vec<String> {
        let engines: Vec<&str> = self.ran_engines().map(|e| e.name.as_str()).collect();
        let baseline = self.baseline();
        let speedup_column = |engine: &str| baseline.is_some_and(|b| b != engine);
        let mut header = vec!["Query".to_string()];
        for engine in &engines {
            header.push(format!("{engine} ms"));
            if let (true, Some(baseline)) = (speedup_column(engine), baseline) {
                header.push(format!("{engine} vs {baseline}"));
            }
        }
        let mut rows = Vec::new();
        for query in &self.queries {
            let mut row = vec![query.label()];
            for engine in &engines {
                row.push(match query.run(engine) {
                    Some(run) if run.is_matched() => format!(
                        "{} ({}–{})",
                        fmt_ms(run.median_ms),
                        fmt_ms(run.min_ms),
                        fmt_ms(run.max_ms)
                    ),
                    Some(run) => status_cell(&run.status),
                    None => "—".to_string(),
                });
                if let (true, Some(baseline)) = (speedup_column(engine), baseline) {
                    row.push(
                        query
                            .speedup(engine, baseline)
                            .map_or_else(|| "—".to_string(), fmt_speedup),
                    );
                }
            }
            rows.push(row);
        }
        let mut total = vec!["**total · geomean**".to_string()];
        for engine in &engines {
            let summary = self.summary(engine);
            total.push(format!(
                "**{}** ({} of {} matched)",
                fmt_ms(summary.total_median_ms),
                summary.matched,
                self.queries.len()
            ));
            if speedup_column(engine) {
                total.push(match summary.geomean_speedup {
                    Some(geomean) => format!(
                        "**{}** (over {})",
                        fmt_speedup(geomean),
                        summary.speedup_queries
                    ),
                    None => "—".to_string(),
                });
            }
        }
        rows.push(total);
        markdown_table(&header, &rows, 1)
    }

    fn markdown_roofline(&self) -> Vec<String> {
        let mut rows = Vec::new();
        for query in &self.queries {
            for run in &query.engines {
                let Some(roofline) = &run.roofline else {
                    continue;
                };
                // A failed run's time is not a time the query takes: no ratio for it.
                let (median, achieved) = if run.is_matched() {
                    (
                        fmt_ms(run.median_ms),
                        fmt_speedup(roofline.achieved_over_floor),
                    )
                } else {
                    (status_cell(&run.status), "—".to_string())
                };
                rows.push(vec![
                    query.label(),
                    run.engine.clone(),
                    fmt_sig(roofline.read_bytes as f64 / 1e6, 3),
                    fmt_sig(roofline.write_bytes as f64 / 1e6, 3),
                    fmt_sig(roofline.h2d_bytes as f64 / 1e6, 3),
                    fmt_sig(roofline.d2h_bytes as f64 / 1e6, 3),
                    fmt_ms(roofline.floor_ms),
                    median,
                    achieved,
                ]);
            }
        }
        if rows.is_empty() {
            return Vec::new();
        }
        let header = [
            "Query",
            "GPU engine",
            "read MB",
            "written MB",
            "to GPU MB",
            "from GPU MB",
            "floor ms",
            "median ms",
            "achieved / floor",
        ]
        .map(String::from);
        let mut lines = vec![
            "## Roofline".to_string(),
            String::new(),
            "Device memory traffic of the GPU operators (MB = 10^6 bytes). The floor is the time \
             that traffic takes at the measured bandwidth; achieved / floor is the median over the \
             floor, so 1× would be a query bound only by memory bandwidth. To/from GPU is what \
             crossed the bus, every copy counted (uploads of CPU operators' output, downloads \
             for CPU operators and the result, small readbacks of sizes and totals)."
                .to_string(),
            String::new(),
        ];
        lines.extend(markdown_table(&header, &rows, 2));
        lines
    }

    fn markdown_data_path(&self) -> Vec<String> {
        let mut rows = Vec::new();
        for query in &self.queries {
            for run in &query.engines {
                if let Some(path) = &run.data_path {
                    let mut row = vec![query.label(), run.engine.clone()];
                    row.extend(path.cells());
                    rows.push(row);
                }
            }
        }
        if rows.is_empty() {
            return Vec::new();
        }
        let mut header = vec!["Query".to_string(), "GPU engine".to_string()];
        header.extend(crate::datapath::HEADER.map(String::from));
        let mut lines = vec![
            "## Data path (modeled H200 time)".to_string(),
            String::new(),
            crate::datapath::ABOUT.to_string(),
            String::new(),
        ];
        lines.extend(markdown_table(&header, &rows, 2));
        lines
    }

    /// Every run of `engine`, whatever its status, in query order.
    fn runs_of<'a>(&'a self, engine: &'a str) -> impl Iterator<Item = &'a EngineRun> {
        self.queries
            .iter()
            .filter_map(move |query| query.run(engine))
    }

    fn markdown_compile(&self) -> Vec<String> {
        // (engine, whether it has a timed-runs column): engines that never compiled are left out.
        let engines: Vec<(&str, bool)> = self
            .ran_engines()
            .map(|engine| engine.name.as_str())
            .filter(|engine| {
                self.runs_of(engine)
                    .any(|run| run.compile_ms_first != 0.0 || run.compile_ms_timed != 0.0)
            })
            .map(|engine| {
                (
                    engine,
                    self.runs_of(engine).any(|run| run.compile_ms_timed != 0.0),
                )
            })
            .collect();
        if engines.is_empty() {
            return Vec::new();
        }
        let mut header = vec!["Query".to_string()];
        for (engine, timed) in &engines {
            header.push(format!("{engine} first run"));
            if *timed {
                header.push(format!("{engine} timed runs"));
            }
        }
        let mut rows = Vec::new();
        for query in &self.queries {
            let mut row = vec![query.label()];
            for (engine, timed) in &engines {
                let run = query.run(engine);
                row.push(run.map_or_else(|| "—".to_string(), |run| fmt_ms(run.compile_ms_first)));
                if *timed {
                    row.push(
                        run.map_or_else(|| "—".to_string(), |run| fmt_ms(run.compile_ms_timed)),
                    );
                }
            }
            rows.push(row);
        }
        let mut total = vec!["**total**".to_string()];
        for (engine, timed) in &engines {
            total.push(format!(
                "**{}**",
                fmt_ms(self.runs_of(engine).map(|run| run.compile_ms_first).sum())
            ));
            if *timed {
                total.push(format!(
                    "**{}**",
                    fmt_ms(self.runs_of(engine).map(|run| run.compile_ms_timed).sum())
                ));
            }
        }
        rows.push(total);
        let mut lines = vec![
            "## Kernel compile time, ms".to_string(),
            String::new(),
            "First run: compile time with a cold in-process kernel cache. Timed runs: compile time \
             summed over the timed runs, which is 0 unless something recompiled."
                .to_string(),
            String::new(),
        ];
        lines.extend(markdown_table(&header, &rows, 1));
        lines
    }

    /// Draws the chart of median execute times as a PNG at `path` ([`CHART_SIZE`]): per query a
    /// group of bars, one per engine, on a log-scale time axis. Only matched runs are drawn; a
    /// report without any still gets its axes and a note saying so.
    pub fn draw_chart(&self, path: &Path) -> Result<(), String> {
        let failed =
            |e: &dyn std::fmt::Display| format!("drawing the chart {}: {e}", path.display());
        register_chart_font()?;
        let engines: Vec<&str> = self.ran_engines().map(|e| e.name.as_str()).collect();
        // (query index, engine index, median ms) of every bar.
        let mut bars = Vec::new();
        for (at, query) in self.queries.iter().enumerate() {
            for (slot, engine) in engines.iter().enumerate() {
                if let Some(run) = query.matched_run(engine)
                    && !run.median_ms.is_nan()
                    && run.median_ms != f64::INFINITY
                {
                    bars.push((at, slot, run.median_ms.max(CHART_MIN_MS)));
                }
            }
        }
        // Whole decades, so that the axis starts and ends on a labelled power of ten; the top
        // gets headroom so the tallest bar does not touch the frame.
        let (low, high) = bars
            .iter()
            .fold(None, |range: Option<(f64, f64)>, &(_, _, ms)| {
                Some(range.map_or((ms, ms), |(low, high)| (low.min(ms), high.max(ms))))
            })
            .map_or((0.1, 100.0), |(low, high)| {
                let low = 10f64.powf(low.log10().floor());
                let high = 10f64.powf((high * 2.0).log10().ceil());
                (low, high.max(low * 10.0))
            });
        let groups = self.queries.len().max(1);

        let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| failed(&e))?;
        let area = root
            .margin(8, 0, 8, 8)
            .titled(&self.title(), (CHART_FONT, 28))
            .map_err(|e| failed(&e))?;
        // The legend gets its own strip above the plot, where no bar can hide it.
        let (legend, plot) = area.split_vertically(40);
        for (slot, engine) in engines.iter().enumerate() {
            let x = 90 + 240 * slot as i32;
            let colour = engine_colour(engine, slot);
            legend
                .draw(&Rectangle::new([(x, 10), (x + 24, 30)], colour.filled()))
                .map_err(|e| failed(&e))?;
            legend
                .draw(&Text::new(
                    engine.to_string(),
                    (x + 32, 10),
                    (CHART_FONT, 20),
                ))
                .map_err(|e| failed(&e))?;
        }

        let mut chart = ChartBuilder::on(&plot)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(90)
            // Just under `low`: plotters places the first labelled power of ten at
            // 10^ceil(log10(start)), and log10(0.1) computes to a hair above -1.
            .build_cartesian_2d(
                -0.5..groups as f64 - 0.5,
                (low * (1.0 - 1e-9)..high).log_scale(),
            )
            .map_err(|e| failed(&e))?;
        // Key points fall on whole numbers (one per group); anything else gets no label.
        let query_label = |x: &f64| {
            let nearest = x.round();
            match self.queries.get(nearest as usize) {
                Some(query) if (x - nearest).abs() < 1e-6 && nearest >= 0.0 => query.label(),
                _ => String::new(),
            }
        };
        // Axis labels sit on powers of ten and their multiples: `0.1`, `20`, not `0.100`, `20.0`.
        let time_label = |ms: &f64| {
            let text = fmt_ms(*ms);
            if text.contains('.') {
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                text
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups)
            .x_label_formatter(&query_label)
            .y_label_formatter(&time_label)
            .y_desc("median execute time, ms (log scale)")
            .label_style((CHART_FONT, 18))
            .axis_desc_style((CHART_FONT, 18))
            .draw()
            .map_err(|e| failed(&e))?;

        let width = 0.8 / engines.len().max(1) as f64;
        chart
            .draw_series(bars.iter().map(|&(at, slot, ms)| {
                let left = at as f64 - 0.4 + slot as f64 * width;
                let colour = engine_colour(engines[slot], slot);
                // A sliver between neighbours keeps same-height bars apart.
                Rectangle::new(
                    [(left + width * 0.05, low), (left + width * 0.95, ms)],
                    colour.filled(),
                )
            }))
            .map_err(|e| failed(&e))?;
        if bars.is_empty() {
            let note = if self.queries.is_empty() {
                "no queries in this report"
            } else {
                "no matched runs to draw"
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    note,
                    (-0.4, (low * high).sqrt()),
                    (CHART_FONT, 24),
                )))
                .map_err(|e| failed(&e))?;
        }
        root.present().map_err(|e| failed(&e))
    }

    /// Writes `<stem>.json`, `<stem>.md` and `<stem>.png` ([`Self::file_stem`]) into `dir`,
    /// creating it if needed.
    pub fn write_files(&self, dir: &Path) -> Result<WrittenFiles, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let stem = self.file_stem();
        let files = WrittenFiles {
            json: dir.join(format!("{stem}.json")),
            markdown: dir.join(format!("{stem}.md")),
            png: dir.join(format!("{stem}.png")),
        };
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| format!("encoding the report as JSON: {e}"))?;
        let write = |path: &Path, text: String| {
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
        };
        write(&files.json, json + "\n")?;
        write(&files.markdown, self.to_markdown())?;
        self.draw_chart(&files.png)?;
        Ok(files)
    }
}

/// Reads a report written by [`TpchReport::write_files`].
pub fn read_json(path: &Path) -> Result<TpchReport, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a TPC-H report: {e}", path.display()))
}

/// Registers the embedded DejaVu Sans as [`CHART_FONT`], once per process.
fn register_chart_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(CHART_FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| {
                    "the embedded DejaVu Sans font did not load; this is a bug".to_string()
                })
        })
        .clone()
}

/// The bar colour of an engine: fixed for the known engines so charts compare at a glance.
fn engine_colour(engine: &str, slot: usize) -> RGBColor {
    use plotters::style::full_palette::{
        BLUE_700, GREEN_700, GREY_600, ORANGE_800, PINK_400, PURPLE_500, RED_700, TEAL_600,
    };
    const OTHERS: [RGBColor; 5] = [PURPLE_500, TEAL_600, RED_700, PINK_400, GREY_600];
    match engine {
        "spate-gpu" => GREEN_700,
        "spate-cpu" => BLUE_700,
        "duckdb" => ORANGE_800,
        _ => OTHERS[slot % OTHERS.len()],
    }
}

/// `text` with anything but letters, digits, `.`, `_` and `-` replaced by `-`.
fn file_safe(text: &str) -> String {
    let safe: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if safe.is_empty() {
        "unknown".to_string()
    } else {
        safe
    }
}

/// A run's status as a table cell: pipes escaped, one line, cut when long.
fn status_cell(status: &str) -> String {
    let line = status.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut cell: String = line.chars().take(STATUS_CELL_CHARS).collect();
    if line.chars().count() > STATUS_CELL_CHARS {
        cell.push('…');
    }
    cell.replace('|', "\\|")
}

/// A markdown table, header row first; the first `text_columns` columns are left-aligned, the
/// others hold numbers and are right-aligned so that they line up.
fn markdown_table(header: &[String], rows: &[Vec<String>], text_columns: usize) -> Vec<String> {
    let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
    let mut lines = vec![line(header)];
    let rule: Vec<String> = (0..header.len())
        .map(|column| if column < text_columns { "---" } else { "---:" }.to_string())
        .collect();
    lines.push(line(&rule));
    lines.extend(rows.iter().map(|row| line(row)));
    lines
}

/// Milliseconds to three significant digits.
fn fmt_ms(ms: f64) -> String {
    fmt_sig(ms, 3)
}

/// A ratio to two significant digits with a `×`.
fn fmt_speedup(ratio: f64) -> String {
    format!("{}×", fmt_sig(ratio, 2))
}

/// `value` to `digits` significant digits, without exponent: 12.34 → `12.3`, 1234.4 → `1234`,
/// 0.012345 → `0.0123`.
fn fmt_sig(value: f64, digits: i32) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    if value == 0.0 {
        return "0".to_string();
    }
    let magnitude = value.abs().log10().floor() as i32;
    let mut decimals = (digits - 1 - magnitude).clamp(0, 9);
    // 9.996 to three digits rounds up to 10.0: one decade more, one decimal fewer.
    let scale = 10f64.powi(decimals);
    if decimals > 0 && (value.abs() * scale).round() / scale >= 10f64.powi(magnitude + 1) {
        decimals -= 1;
    }
    format!("{value:.*}", decimals as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &str, median_ms: f64, min_ms: f64, max_ms: f64) -> EngineRun {
        EngineRun {
            engine: engine.to_string(),
            status: MATCHED.to_string(),
            rows: 4,
            plan_ms: 0.5,
            compile_ms_first: 0.0,
            compile_ms_timed: 0.0,
            execute_ms: vec![min_ms, median_ms, max_ms],
            median_ms,
            min_ms,
            max_ms,
            roofline: None,
            data_path: None,
        }
    }

    fn gpu_run(median_ms: f64, min_ms: f64, max_ms: f64, read_bytes: u64) -> EngineRun {
        let floor_ms = read_bytes as f64 / 1e9 / 100.0 * 1e3;
        EngineRun {
            compile_ms_first: 150.0,
            roofline: Some(Roofline {
                read_bytes,
                write_bytes: read_bytes / 10,
                floor_ms,
                achieved_over_floor: median_ms / floor_ms,
                h2d_bytes: 0,
                d2h_bytes: read_bytes / 100,
            }),
            data_path: Some(DataPath {
                launches: 40,
                host_syncs: 6,
                d2h_bytes: 512,
                result_bytes: 256,
                modeled_h200_ms: 0.5,
                ..DataPath::default()
            }),
            ..run("spate-gpu", median_ms, min_ms, max_ms)
        }
    }

    fn engine(name: &str, skipped: Option<&str>) -> EngineInfo {
        EngineInfo {
            name: name.to_string(),
            description: format!("{name} 1.0"),
            skipped: skipped.map(str::to_string),
        }
    }

    /// Three engines that ran and one skipped; q9 failed on the GPU.
    ///
    /// Speedups against duckdb: spate-gpu 5, 2, 0.5 (q9 failed); spate-cpu 0.5, 2/3, 1/6, 0.5.
    fn sample() -> TpchReport {
        let mut failed = gpu_run(1.0, 1.0, 1.0, 1_000_000);
        failed.status = "failed: out of memory | on device\nretry".to_string();
        TpchReport {
            suite: "tpch".to_string(),
            scale_factor: 1.0,
            mode: "hot".to_string(),
            runs: 3,
            date: "2025-06-15".to_string(),
            commit: "0123456789abcdef-dirty".to_string(),
            machine: Machine {
                label: "h200".to_string(),
                cpu: "Test CPU".to_string(),
                cores: 16,
                memory_bytes: 64 << 30,
                gpu: "NVIDIA H200, 141 GB".to_string(),
                os: "Linux 6.8.0".to_string(),
            },
            bandwidth: Some(Bandwidth {
                backend: "emulated".to_string(),
                bytes: 2_000_000_000,
                median_ms: 20.0,
                gb_per_s: 100.0,
            }),
            engines: vec![
                engine("spate-gpu", None),
                engine("spate-cpu", None),
                engine("duckdb", None),
                engine("velox", Some("not installed")),
            ],
            queries: vec![
                QueryResult {
                    query: 1,
                    label: String::new(),
                    engines: vec![
                        gpu_run(2.0, 1.9, 2.2, 1_500_000),
                        run("spate-cpu", 20.0, 19.0, 21.0),
                        run("duckdb", 10.0, 9.5, 11.0),
                    ],
                },
                QueryResult {
                    query: 3,
                    label: String::new(),
                    engines: vec![
                        gpu_run(4.0, 3.9, 4.4, 3_000_000),
                        run("spate-cpu", 12.0, 11.0, 13.0),
                        run("duckdb", 8.0, 7.5, 8.5),
                    ],
                },
                QueryResult {
                    query: 6,
                    label: String::new(),
                    engines: vec![
                        gpu_run(1.0, 0.9, 1.1, 500_000),
                        run("spate-cpu", 3.0, 2.9, 3.1),
                        run("duckdb", 0.5, 0.45, 0.55),
                    ],
                },
                QueryResult {
                    query: 9,
                    label: String::new(),
                    engines: vec![
                        failed,
                        run("spate-cpu", 40.0, 39.0, 41.0),
                        run("duckdb", 20.0, 19.0, 21.0),
                    ],
                },
            ],
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn file_stem_names_date_machine_scale_and_mode() {
        let mut report = sample();
        assert_eq!(report.file_stem(), "2025-06-15-h200-tpch-sf1-hot");
        report.scale_factor = 0.01;
        report.mode = "cold".to_string();
        assert_eq!(report.file_stem(), "2025-06-15-h200-tpch-sf0.01-cold");
        report.scale_factor = 10.0;
        assert_eq!(report.file_stem(), "2025-06-15-h200-tpch-sf10-cold");
        report.machine.label = "a b/c".to_string();
        assert_eq!(report.file_stem(), "2025-06-15-a-b-c-tpch-sf10-cold");
    }

    #[test]
    fn summaries_sum_matched_medians_and_take_the_geomean_against_duckdb() {
        let report = sample();
        assert_eq!(report.baseline(), Some("duckdb"));
        let summaries = report.summaries();
        let names: Vec<&str> = summaries.iter().map(|s| s.engine.as_str()).collect();
        assert_eq!(
            names,
            ["spate-gpu", "spate-cpu", "duckdb"],
            "skipped engines have no summary"
        );

        let gpu = &summaries[0];
        assert_eq!((gpu.matched, gpu.speedup_queries), (3, 3));
        assert!(close(gpu.total_median_ms, 7.0), "{gpu:?}");
        // (5 · 2 · 0.5)^(1/3)
        assert!(
            close(gpu.geomean_speedup.unwrap(), 5f64.powf(1.0 / 3.0)),
            "{gpu:?}"
        );

        let cpu = &summaries[1];
        assert_eq!((cpu.matched, cpu.speedup_queries), (4, 4));
        assert!(close(cpu.total_median_ms, 75.0), "{cpu:?}");
        // (1/2 · 2/3 · 1/6 · 1/2)^(1/4) = (1/36)^(1/4)
        assert!(
            close(cpu.geomean_speedup.unwrap(), 1.0 / 6f64.sqrt()),
            "{cpu:?}"
        );

        let duckdb = &summaries[2];
        assert_eq!((duckdb.matched, duckdb.speedup_queries), (4, 4));
        assert!(close(duckdb.total_median_ms, 38.5), "{duckdb:?}");
        assert!(close(duckdb.geomean_speedup.unwrap(), 1.0), "{duckdb:?}");

        let q9 = &report.queries[3];
        assert_eq!(
            q9.speedup("spate-gpu", "duckdb"),
            None,
            "a failed run has no speedup"
        );
        assert!(close(q9.speedup("spate-cpu", "duckdb").unwrap(), 0.5));
        assert_eq!(report.summary("absent").matched, 0);
        assert_eq!(report.summary("absent").geomean_speedup, None);
    }

    #[test]
    fn baseline_falls_back_from_duckdb_to_spate_cpu_to_the_first_engine() {
        let mut report = sample();
        report.engines[2].skipped = Some("not installed".to_string());
        assert_eq!(report.baseline(), Some("spate-cpu"));
        report.engines[1].skipped = Some("not asked for".to_string());
        assert_eq!(report.baseline(), Some("spate-gpu"));
        report.engines[0].skipped = Some("no GPU".to_string());
        assert_eq!(report.baseline(), None);
        assert!(report.summaries().is_empty());
        assert!(report.to_markdown().contains("No engine ran"));
    }

    #[test]
    fn zero_medians_give_no_speedup_rather_than_an_infinite_one() {
        let mut report = sample();
        report.queries[0].engines[0].median_ms = 0.0;
        assert_eq!(report.queries[0].speedup("spate-gpu", "duckdb"), None);
        let gpu = report.summary("spate-gpu");
        assert_eq!(gpu.speedup_queries, 2);
        assert!(gpu.geomean_speedup.unwrap().is_finite());
    }

    #[test]
    fn markdown_holds_the_header_times_speedups_totals_roofline_and_compile_tables() {
        let md = sample().to_markdown();
        for expected in [
            "# TPC-H SF 1, hot, h200, 2025-06-15",
            "`h200`: Test CPU, 16 logical cores, 64.0 GiB memory; GPU: NVIDIA H200, 141 GB",
            "- Commit: `0123456789abcdef-dirty`",
            "- Scale factor: 1",
            "3 timed runs",
            "100 GB/s on the `emulated` backend",
            "describes the host emulator's memory copy, not a GPU",
            "`spate-gpu`: spate-gpu 1.0",
            "`velox`: velox 1.0 (skipped: not installed)",
            "| Query | spate-gpu ms | spate-gpu vs duckdb | spate-cpu ms | spate-cpu vs duckdb | duckdb ms |",
            "| q1 | 2.00 (1.90–2.20) | 5.0× | 20.0 (19.0–21.0) | 0.50× | 10.0 (9.50–11.0) |",
            "| q6 | 1.00 (0.900–1.10) | 0.50× | 3.00 (2.90–3.10) | 0.17× | 0.500 (0.450–0.550) |",
            // The status replaces the times, escaped and on one line; the speedup is absent.
            "| q9 | failed: out of memory \\| on device retry | — | 40.0 (39.0–41.0) | 0.50× |",
            "**7.00** (3 of 4 matched) | **1.7×** (over 3)",
            "**75.0** (4 of 4 matched) | **0.41×** (over 4)",
            "**38.5** (4 of 4 matched) |",
            "## Roofline",
            // 1.5 MB at 100 GB/s is 0.015 ms; 2 ms over it is 133×.
            "| q1 | spate-gpu | 1.50 | 0.150 | 0 | 0.0150 | 0.0150 | 2.00 | 133× |",
            "| q9 | spate-gpu | 1.00 | 0.100 | 0 | 0.0100 | 0.0100 | failed: out of memory \\| on device retry | — |",
            "| Query | GPU engine | read MB | written MB | to GPU MB | from GPU MB | floor ms | median ms | achieved / floor |\n| --- | --- | ---: |",
            "## Data path (modeled H200 time)",
            "| Query | GPU engine | launches | host syncs | allocs | to GPU MB | from GPU MB | result MB | device MB | peak MB | host exchanges | modeled H200 ms |",
            "| q1 | spate-gpu | 40 | 6 | 0 | 0.000 | 0.001 | 0.000 | 0.000 | 0.000 | 0 | 0.500 |",
            "## Kernel compile time, ms",
            "| Query | spate-gpu first run |",
            "| q3 | 150 |",
            "| **total** | **600** |",
        ] {
            assert!(md.contains(expected), "missing {expected:?} in\n{md}");
        }
        assert!(
            !md.contains("timed runs |"),
            "no recompiles, so no timed-runs column:\n{md}"
        );
        assert!(
            !md.contains("| velox"),
            "a skipped engine has no column:\n{md}"
        );
    }

    #[test]
    fn markdown_leaves_out_empty_roofline_and_compile_tables_and_the_emulator_note_on_cuda() {
        let mut report = sample();
        for query in &mut report.queries {
            for run in &mut query.engines {
                run.roofline = None;
                run.data_path = None;
                run.compile_ms_first = 0.0;
            }
        }
        if let Some(bandwidth) = &mut report.bandwidth {
            bandwidth.backend = "cuda".to_string();
        }
        let md = report.to_markdown();
        assert!(md.contains("on the `cuda` backend"), "{md}");
        assert!(!md.contains("emulator"), "{md}");
        assert!(!md.contains("## Roofline"), "{md}");
        assert!(!md.contains("## Data path"), "{md}");
        assert!(!md.contains("## Kernel compile"), "{md}");
    }

    /// Equal JSON, with numbers equal to a few ulps: serde_json without its `float_roundtrip`
    /// feature may read the last digit of a float back one off (0.015000000000000001 → 0.015).
    fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (a, b) {
            (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) => (a - b).abs() <= 4.0 * f64::EPSILON * a.abs().max(b.abs()),
                _ => a == b,
            },
            (Value::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_json(a, b))
            }
            (Value::Object(a), Value::Object(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(key, a)| b.get(key).is_some_and(|b| same_json(a, b)))
            }
            _ => a == b,
        }
    }

    /// `(width, height)` from a PNG's IHDR chunk, after checking the signature.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        (be(16), be(20))
    }

    #[test]
    fn write_files_writes_json_that_reads_back_markdown_and_a_chart() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("results").join("nested");
        let report = sample();
        let files = report.write_files(&out).unwrap();
        let stem = "2025-06-15-h200-tpch-sf1-hot";
        assert_eq!(files.json, out.join(format!("{stem}.json")));
        assert_eq!(files.markdown, out.join(format!("{stem}.md")));
        assert_eq!(files.png, out.join(format!("{stem}.png")));

        let back = read_json(&files.json).unwrap();
        let (back, report_value) = (
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&report).unwrap(),
        );
        assert!(
            same_json(&back, &report_value),
            "{back}\n!=\n{report_value}"
        );
        assert_eq!(
            std::fs::read_to_string(&files.markdown).unwrap(),
            report.to_markdown()
        );

        let png = std::fs::read(&files.png).unwrap();
        assert_eq!(png_size(&png), CHART_SIZE);
        // A blank 1600×700 image compresses to a few KB; bars, labels and the title make more.
        assert!(png.len() > 12_000, "the chart is only {} bytes", png.len());

        assert!(
            read_json(&out.join("absent.json"))
                .unwrap_err()
                .contains("absent.json")
        );
        assert!(
            read_json(&files.markdown)
                .unwrap_err()
                .contains("not a TPC-H report")
        );
    }

    #[test]
    fn charts_without_matched_runs_or_with_zero_times_still_draw() {
        let dir = tempfile::tempdir().unwrap();

        let mut empty = sample();
        empty.queries.clear();
        let path = dir.path().join("empty.png");
        empty.draw_chart(&path).unwrap();
        assert_eq!(png_size(&std::fs::read(&path).unwrap()), CHART_SIZE);
        assert!(empty.to_markdown().contains("(0 of 0 matched)"));

        let mut failed = sample();
        for query in &mut failed.queries {
            for run in &mut query.engines {
                run.status = "failed: no".to_string();
            }
        }
        failed.engines.iter_mut().for_each(|e| e.skipped = None);
        failed.draw_chart(&dir.path().join("failed.png")).unwrap();

        let mut odd = sample();
        odd.queries[0].engines[0].median_ms = 0.0;
        odd.queries[1].engines[0].median_ms = -3.0;
        odd.queries[2].engines[0].median_ms = f64::NAN;
        odd.queries[2].engines[1].median_ms = f64::INFINITY;
        odd.draw_chart(&dir.path().join("odd.png")).unwrap();

        let mut nobody = sample();
        nobody
            .engines
            .iter_mut()
            .for_each(|e| e.skipped = Some("off".to_string()));
        nobody.draw_chart(&dir.path().join("nobody.png")).unwrap();
    }

    #[test]
    fn civil_dates_match_known_days() {
        for (seconds, date) in [
            (0, "1970-01-01"),
            (86_399, "1970-01-01"),
            (-1, "1969-12-31"),
            (-86_400, "1969-12-31"),
            (951_782_400, "2000-02-29"),
            (951_868_800, "2000-03-01"),
            (1_735_603_200, "2024-12-31"),
            (1_749_945_600, "2025-06-15"),
            (4_107_542_400, "2100-03-01"),
            (-2_208_988_800, "1900-01-01"),
        ] {
            assert_eq!(date_from_unix_seconds(seconds), date, "{seconds} s");
        }
        // The day after 28 February 2100 is 1 March: 2100 is not a leap year.
        assert_eq!(date_from_unix_seconds(4_107_542_400 - 86_400), "2100-02-28");
        let today = today_utc();
        assert_eq!(today.len(), 10, "{today}");
        assert!(today.as_str() >= "2025-01-01", "{today}");
    }

    #[test]
    fn gpu_labels_are_short_model_names() {
        for (gpu, label) in [
            ("NVIDIA H200, 141 GB", "h200"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA GeForce RTX 4090", "rtx4090"),
            ("NVIDIA GeForce RTX 3090 Ti, 24 GB", "rtx3090ti"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("Tesla T4", "t4"),
            ("NVIDIA RTX A6000", "a6000"),
            ("NVIDIA TITAN Xp", "titanxp"),
            ("NVIDIA", "gpu"),
        ] {
            assert_eq!(gpu_label(gpu), label, "{gpu}");
        }
        assert!(is_memory_size("80gb") && is_memory_size("24g") && !is_memory_size("h200"));
        assert!(!is_memory_size("gb") && !is_memory_size("4090"));
    }

    #[test]
    fn machine_detection_never_fails_and_labels_are_file_safe() {
        let host = Machine::detect(None);
        assert_eq!(host.gpu, "none");
        assert_eq!(host.label, format!("cpu{}", host.cores));
        assert!(!host.cpu.is_empty() && !host.os.is_empty());
        let gpu = Machine::detect(Some(" NVIDIA H200, 141 GB ".to_string()));
        assert_eq!(
            (gpu.label.as_str(), gpu.gpu.as_str()),
            ("h200", "NVIDIA H200, 141 GB")
        );
        for machine in [host, gpu, Machine::detect(Some("none".to_string()))] {
            assert!(!machine.label.is_empty());
            assert!(
                machine
                    .label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{machine:?}"
            );
        }
    }

    #[test]
    fn proc_files_parse() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)  Xeon(R) CPU @ 2.20GHz\nmodel name\t: other\n";
        assert_eq!(
            cpu_model(cpuinfo).as_deref(),
            Some("Intel(R) Xeon(R) CPU @ 2.20GHz")
        );
        assert_eq!(cpu_model("processor : 0\n"), None);
        let meminfo = "MemTotal:       16318004 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total_bytes(meminfo), Some(16_318_004 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn git_commit_names_head_or_says_unknown() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(git_commit(dir.path()), "unknown");
        assert_eq!(git_commit(&dir.path().join("absent")), "unknown");
        // This crate's own checkout, when built from one with git installed.
        let commit = git_commit(Path::new(env!("CARGO_MANIFEST_DIR")));
        let head = commit.strip_suffix("-dirty").unwrap_or(&commit);
        assert!(
            commit == "unknown"
                || (head.len() == 40 && head.chars().all(|c| c.is_ascii_hexdigit())),
            "{commit}"
        );
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        for (value, text) in [
            (12.34, "12.3"),
            (1234.5, "1234"),
            (0.012345, "0.0123"),
            (9.996, "10.0"),
            (0.0, "0"),
            (13.0, "13.0"),
            (-2.5, "-2.50"),
        ] {
            assert_eq!(fmt_ms(value), text, "{value}");
        }
        assert_eq!(fmt_speedup(4.12), "4.1×");
        assert_eq!(fmt_speedup(133.3), "133×");
        assert_eq!(
            status_cell(&"x".repeat(100)).chars().count(),
            STATUS_CELL_CHARS + 1
        );
    }
}
