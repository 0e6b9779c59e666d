//! DuckDB as a timed engine: runs `scripts/duckdb_bench.py` in a Python that has DuckDB and
//! reads back its results (as [`Cell`]s, comparable with Spate's) and its per-run times.
//!
//! DuckDB runs through its Python package rather than a Rust binding: the package is the same
//! one the TPC-H cross-check uses (`scripts/test` installs it, pinned, in `.venv`), and it keeps
//! a C++ build of DuckDB out of the workspace. [`find_python`] picks the interpreter and checks
//! that it can `import duckdb`; [`run_duckdb`] runs one benchmark pass over a folder of Parquet
//! tables in one of two modes:
//! - `cold`: every table is a view over `read_parquet`, so every run reads the Parquet files
//!   (DuckDB's own caches are off; the operating system's page cache is not dropped);
//! - `hot`: every table is loaded into DuckDB's memory first ([`DuckDbRun::load_ms`] times the
//!   load), and each query runs once untimed before its timed runs.
//!
//! Times are wall-clock around execute + fetch of all rows, measured inside Python, so they
//! exclude the interpreter's start and the JSON transfer. The rows returned are those of the
//! last timed run.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cells::{Cell, rows_from_json};

/// Environment variable naming the Python interpreter to use when none is given explicitly.
pub const PYTHON_ENV: &str = "SPATE_PYTHON";

/// The modes [`run_duckdb`] accepts (see the module docs).
pub const MODES: [&str; 2] = ["hot", "cold"];

/// One benchmark pass of DuckDB over a set of queries.
#[derive(Debug, Clone, PartialEq)]
pub struct DuckDbRun {
    /// DuckDB's version, as its Python package reports it.
    pub version: String,
    /// The worker threads DuckDB ran with.
    pub threads: usize,
    /// Time to load every table into memory (hot mode); `None` in cold mode.
    pub load_ms: Option<f64>,
    /// One entry per query, in the order they were given.
    pub queries: Vec<DuckDbQuery>,
}

/// One query's outcome in a [`DuckDbRun`].
#[derive(Debug, Clone, PartialEq)]
pub struct DuckDbQuery {
    /// The query's number, as given to [`run_duckdb`].
    pub query: usize,
    /// The result, or DuckDB's error message (a query DuckDB rejects does not stop the others).
    pub result: Result<DuckDbResult, String>,
}

/// The result and timings of a query DuckDB ran.
#[derive(Debug, Clone, PartialEq)]
pub struct DuckDbResult {
    pub columns: Vec<String>,
    /// The rows of the last timed run, in DuckDB's order.
    pub rows: Vec<Vec<Cell>>,
    /// One wall-clock time per timed run, in milliseconds.
    pub times_ms: Vec<f64>,
}

/// The Python interpreter to run DuckDB with: `explicit`, else `$SPATE_PYTHON`, else
/// `<workspace_root>/.venv/bin/python`. Fails with advice unless it can `import duckdb`.
pub fn find_python(explicit: Option<PathBuf>, workspace_root: &Path) -> Result<PathBuf, String> {
    let python = explicit
        .or_else(|| std::env::var_os(PYTHON_ENV).map(PathBuf::from))
        .unwrap_or_else(|| workspace_root.join(".venv/bin/python"));
    let why = match Command::new(&python).args(["-c", "import duckdb"]).output() {
        Ok(output) if output.status.success() => return Ok(python),
        Ok(output) => last_line(&output.stderr),
        Err(e) => e.to_string(),
    };
    Err(format!(
        "DuckDB's Python package is not available: `{} -c 'import duckdb'` failed \
         (scripts/test installs it in .venv): {why}",
        python.display()
    ))
}

/// The last non-empty line of a process's stderr: for Python, the exception.
fn last_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no error message")
        .trim()
        .to_string()
}

/// Runs `script` (`scripts/duckdb_bench.py`) with `python` over the Parquet tables in
/// `data_dir`: every query in `queries` (`(number, path of its .sql file)`; the file stems must
/// differ) `runs` times in `mode` (`"hot"` or `"cold"`), on `threads` threads (default: all
/// cores). A query that DuckDB rejects is an `Err` in its [`DuckDbQuery`]; a script that cannot
/// run at all is an `Err` here, with its stderr.
pub fn run_duckdb(
    python: &Path,
    script: &Path,
    data_dir: &Path,
    queries: &[(usize, PathBuf)],
    mode: &str,
    runs: usize,
    threads: Option<usize>,
) -> Result<DuckDbRun, String> {
    if !MODES.contains(&mode) {
        return Err(format!("unknown DuckDB mode {mode:?}: use hot or cold"));
    }
    if runs == 0 {
        return Err("DuckDB needs at least one timed run per query (runs = 0)".into());
    }
    if threads == Some(0) {
        return Err("DuckDB needs at least one thread (threads = 0)".into());
    }
    if queries.is_empty() {
        return Err("no queries to run on DuckDB".into());
    }
    // The script keys its results by file stem, so two files with one stem would collide.
    let mut stems = HashSet::new();
    for (_, path) in queries {
        let stem = stem(path)?;
        if !stems.insert(stem) {
            return Err(format!(
                "two query files are named {stem:?}; DuckDB's results are keyed by file name"
            ));
        }
    }

    let mut command = Command::new(python);
    command
        .arg(script)
        .args(["--mode", mode, "--runs", &runs.to_string()]);
    if let Some(threads) = threads {
        command.args(["--threads", &threads.to_string()]);
    }
    // After `--` a data folder or query path that starts with '-' is not read as an option.
    command
        .arg("--")
        .arg(data_dir)
        .args(queries.iter().map(|(_, p)| p));
    let output = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "DuckDB's benchmark script {} failed ({}): {}",
            script.display(),
            output.status,
            stderr.trim()
        ));
    }
    parse_output(&output.stdout, queries, runs).map_err(|e| {
        format!(
            "cannot read the output of {}: {e}; its stderr: {}",
            script.display(),
            stderr.trim()
        )
    })
}

fn stem(path: &Path) -> Result<&str, String> {
    path.file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| format!("query file {} has no UTF-8 name", path.display()))
}

/// The script's output (see `scripts/duckdb_bench.py`); cells stay JSON until [`rows_from_json`].
#[derive(Deserialize)]
struct Output {
    duckdb_version: String,
    threads: usize,
    load_ms: Option<f64>,
    queries: Map<String, Value>,
}

/// One query's entry: `error`, or the other three.
#[derive(Deserialize)]
struct QueryOutput {
    error: Option<String>,
    columns: Option<Vec<String>>,
    rows: Option<Value>,
    times_ms: Option<Vec<f64>>,
}

fn parse_output(
    stdout: &[u8],
    queries: &[(usize, PathBuf)],
    runs: usize,
) -> Result<DuckDbRun, String> {
    let output: Output = serde_json::from_slice(stdout).map_err(|e| e.to_string())?;
    let queries = queries
        .iter()
        .map(|(number, path)| {
            let stem = stem(path)?;
            let entry = output
                .queries
                .get(stem)
                .ok_or_else(|| format!("no entry for query {stem}"))?;
            let entry: QueryOutput =
                serde_json::from_value(entry.clone()).map_err(|e| format!("query {stem}: {e}"))?;
            Ok(DuckDbQuery {
                query: *number,
                result: parse_query(stem, entry, runs)?,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(DuckDbRun {
        version: output.duckdb_version,
        threads: output.threads,
        load_ms: output.load_ms,
        queries,
    })
}

/// The outer `Result` is malformed output; the inner one DuckDB's verdict on the query.
fn parse_query(
    stem: &str,
    entry: QueryOutput,
    runs: usize,
) -> Result<Result<DuckDbResult, String>, String> {
    if let Some(error) = entry.error {
        return Ok(Err(error));
    }
    let missing = |field: &str| format!("query {stem} has neither an error nor {field}");
    let columns = entry.columns.ok_or_else(|| missing("columns"))?;
    let rows = rows_from_json(&entry.rows.ok_or_else(|| missing("rows"))?)
        .map_err(|e| format!("query {stem}: {e}"))?;
    let times_ms = entry.times_ms.ok_or_else(|| missing("times_ms"))?;
    if times_ms.len() != runs {
        return Err(format!(
            "query {stem} has {} times for {runs} runs",
            times_ms.len()
        ));
    }
    if let Some((i, row)) = rows
        .iter()
        .enumerate()
        .find(|(_, r)| r.len() != columns.len())
    {
        return Err(format!(
            "query {stem}: row {i} has {} cells for {} columns",
            row.len(),
            columns.len()
        ));
    }
    Ok(Ok(DuckDbResult {
        columns,
        rows,
        times_ms,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn three_queries() -> Vec<(usize, PathBuf)> {
        vec![
            (1, PathBuf::from("queries/q01.sql")),
            (6, PathBuf::from("q06.sql")),
            (22, PathBuf::from("/elsewhere/q22.sql")),
        ]
    }

    #[test]
    fn output_parses_into_results_errors_and_every_cell_tag() {
        let stdout = r#"{
            "duckdb_version": "2.0.1", "threads": 4, "mode": "hot", "load_ms": 12.5,
            "queries": {
                "q22": {"error": "Catalog Error: Table with name nope does not exist!"},
                "q01": {"columns": ["a", "b", "c", "d", "e", "f", "g"],
                        "rows": [[["i", "-3"], ["d", "1.50"], ["f", 0.25], ["s", "x"],
                                  ["t", "1995-01-01"], ["b", false], null],
                                 [["i", "4"], ["d", "-0.05"], ["f", "NaN"], ["s", ""],
                                  ["t", "12:00:00"], ["b", true], ["f", "-inf"]]],
                        "times_ms": [3.5, 2.25]},
                "q06": {"columns": ["revenue"], "rows": [], "times_ms": [1.0, 1.5]}
            }
        }"#;
        let run = parse_output(stdout.as_bytes(), &three_queries(), 2).unwrap();
        assert_eq!(run.version, "2.0.1");
        assert_eq!(run.threads, 4);
        assert_eq!(run.load_ms, Some(12.5));
        let numbers: Vec<usize> = run.queries.iter().map(|q| q.query).collect();
        assert_eq!(numbers, [1, 6, 22]);

        let q01 = run.queries[0].result.as_ref().unwrap();
        assert_eq!(q01.columns, ["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(q01.times_ms, [3.5, 2.25]);
        assert_eq!(
            q01.rows[0],
            [
                Cell::Int(-3),
                Cell::Decimal(150, 2),
                Cell::Float(0.25),
                Cell::Text("x".into()),
                Cell::Text("1995-01-01".into()),
                Cell::Bool(false),
                Cell::Null,
            ]
        );
        assert_eq!(q01.rows[1][1], Cell::Decimal(-5, 2));
        assert!(matches!(q01.rows[1][2], Cell::Float(v) if v.is_nan()));
        assert_eq!(q01.rows[1][4], Cell::Text("12:00:00".into()));
        assert_eq!(q01.rows[1][6], Cell::Float(f64::NEG_INFINITY));

        let q06 = run.queries[1].result.as_ref().unwrap();
        assert!(q06.rows.is_empty());
        assert_eq!(q06.times_ms, [1.0, 1.5]);
        assert_eq!(
            run.queries[2].result,
            Err("Catalog Error: Table with name nope does not exist!".into())
        );

        let cold = stdout.replace(r#""load_ms": 12.5"#, r#""load_ms": null"#);
        assert_eq!(
            parse_output(cold.as_bytes(), &three_queries(), 2)
                .unwrap()
                .load_ms,
            None
        );
    }

    #[test]
    fn malformed_output_is_an_error() {
        let queries = [(1, PathBuf::from("q01.sql"))];
        let wrap = |entry: &str| {
            format!(
                r#"{{"duckdb_version": "2.0.1", "threads": 1, "mode": "cold", "load_ms": null,
                    "queries": {{"q01": {entry}}}}}"#
            )
        };
        let good = wrap(r#"{"columns": ["a"], "rows": [[["i", "1"]]], "times_ms": [1.0]}"#);
        assert!(parse_output(good.as_bytes(), &queries, 1).is_ok());
        for (stdout, runs, why) in [
            ("not json".to_string(), 1, "expected"),
            (good.clone(), 2, "1 times for 2 runs"),
            (
                wrap(r#"{"columns": ["a"], "times_ms": [1.0]}"#),
                1,
                "neither an error nor rows",
            ),
            (
                wrap(r#"{"columns": ["a", "b"], "rows": [[null]], "times_ms": [1.0]}"#),
                1,
                "row 0 has 1 cells for 2 columns",
            ),
            (
                wrap(r#"{"columns": ["a"], "rows": [[["q", "1"]]], "times_ms": [1.0]}"#),
                1,
                "bad cell",
            ),
        ] {
            let err = parse_output(stdout.as_bytes(), &queries, runs).unwrap_err();
            assert!(err.contains(why), "{err:?} should mention {why:?}");
        }
        let err = parse_output(good.as_bytes(), &[(2, PathBuf::from("q02.sql"))], 1).unwrap_err();
        assert_eq!(err, "no entry for query q02");
    }

    #[test]
    fn bad_arguments_are_rejected_before_running() {
        // A Python that does not exist: each check must fire before it would be run.
        let python = Path::new("no-such-python");
        let run = |queries: &[(usize, PathBuf)], mode, runs, threads| {
            run_duckdb(
                python,
                Path::new("duckdb_bench.py"),
                Path::new("data"),
                queries,
                mode,
                runs,
                threads,
            )
            .unwrap_err()
        };
        let queries = three_queries();
        assert!(run(&queries, "warm", 1, None).contains("use hot or cold"));
        assert!(run(&queries, "hot", 0, None).contains("runs = 0"));
        assert!(run(&queries, "cold", 1, Some(0)).contains("threads = 0"));
        assert!(run(&[], "cold", 1, None).contains("no queries"));
        let twins = [
            (1, PathBuf::from("a/q01.sql")),
            (2, PathBuf::from("b/q01.sql")),
        ];
        assert!(run(&twins, "hot", 1, None).contains("two query files are named \"q01\""));
        assert!(run(&queries, "hot", 1, None).starts_with("cannot run no-such-python"));
    }

    #[test]
    fn a_python_without_duckdb_is_reported_with_advice() {
        let err =
            find_python(Some(PathBuf::from("no-such-python")), &workspace_root()).unwrap_err();
        assert!(
            err.starts_with(
                "DuckDB's Python package is not available: `no-such-python -c 'import duckdb'` \
                 failed (scripts/test installs it in .venv)"
            ),
            "{err}"
        );
    }

    /// Writes two tiny Parquet tables with DuckDB itself (spate-bench has no Parquet writer).
    fn write_tables(python: &Path, dir: &Path) {
        let program = r#"
import sys, duckdb
out = sys.argv[1].replace("'", "''")
duckdb.sql(f"""COPY (SELECT * FROM (VALUES
    (1, 'a', 1.50::DECIMAL(10, 2), 0.5::DOUBLE, DATE '1995-01-01', true),
    (2, NULL, -2.25::DECIMAL(10, 2), 2.0::DOUBLE, DATE '1996-02-29', false),
    (3, 'c', 0.00::DECIMAL(10, 2), NULL::DOUBLE, DATE '2000-12-31', NULL::BOOLEAN)
) v(id, name, price, ratio, day, flag)) TO '{out}/t.parquet' (FORMAT parquet)""")
duckdb.sql(f"""COPY (SELECT * FROM (VALUES (1, 10::BIGINT), (1, 5::BIGINT), (2, 7::BIGINT))
    v(id, qty)) TO '{out}/u.parquet' (FORMAT parquet)""")
"#;
        let output = Command::new(python)
            .args(["-c", program])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn duckdb_runs_queries_hot_and_cold() {
        let python = match find_python(None, &workspace_root()) {
            Ok(python) => python,
            Err(why) => {
                let required = std::env::var_os("SPATE_REQUIRE_DUCKDB").is_some_and(|v| v == "1");
                assert!(!required, "SPATE_REQUIRE_DUCKDB=1: {why}");
                println!("SKIPPED: {why}");
                return;
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        write_tables(&python, &data);
        let sql = [
            (
                1,
                "SELECT id, name, price, ratio, day, flag FROM t ORDER BY id;",
            ),
            (
                2,
                "SELECT t.id, sum(u.qty) AS total, avg(u.qty) AS mean \
                 FROM t JOIN u ON t.id = u.id GROUP BY t.id ORDER BY t.id;",
            ),
            (3, "SELECT * FROM missing_table;"),
        ];
        let queries: Vec<(usize, PathBuf)> = sql
            .iter()
            .map(|(n, text)| {
                let path = dir.path().join(format!("q{n:02}.sql"));
                std::fs::write(&path, text).unwrap();
                (*n, path)
            })
            .collect();
        let script = workspace_root().join("scripts/duckdb_bench.py");

        let t = |s: &str| Cell::Text(s.into());
        let want_q1 = vec![
            vec![
                Cell::Int(1),
                t("a"),
                Cell::Decimal(150, 2),
                Cell::Float(0.5),
                t("1995-01-01"),
                Cell::Bool(true),
            ],
            vec![
                Cell::Int(2),
                Cell::Null,
                Cell::Decimal(-225, 2),
                Cell::Float(2.0),
                t("1996-02-29"),
                Cell::Bool(false),
            ],
            vec![
                Cell::Int(3),
                t("c"),
                Cell::Decimal(0, 2),
                Cell::Null,
                t("2000-12-31"),
                Cell::Null,
            ],
        ];
        let want_q2 = vec![
            vec![Cell::Int(1), Cell::Int(15), Cell::Float(7.5)],
            vec![Cell::Int(2), Cell::Int(7), Cell::Float(7.0)],
        ];

        for (mode, threads) in [("hot", Some(1)), ("cold", None)] {
            let run = run_duckdb(&python, &script, &data, &queries, mode, 2, threads)
                .unwrap_or_else(|e| panic!("{mode}: {e}"));
            assert!(!run.version.is_empty());
            match threads {
                Some(n) => assert_eq!(run.threads, n),
                None => assert!(run.threads >= 1),
            }
            assert_eq!(run.load_ms.is_some(), mode == "hot", "{mode}");
            assert!(run.load_ms.is_none_or(|ms| ms >= 0.0));
            assert_eq!(run.queries.len(), 3);

            let q1 = run.queries[0].result.as_ref().unwrap();
            assert_eq!(run.queries[0].query, 1);
            assert_eq!(q1.columns, ["id", "name", "price", "ratio", "day", "flag"]);
            assert_eq!(q1.rows, want_q1, "{mode}");
            let q2 = run.queries[1].result.as_ref().unwrap();
            assert_eq!(q2.columns, ["id", "total", "mean"]);
            assert_eq!(q2.rows, want_q2, "{mode}");
            for q in [q1, q2] {
                assert_eq!(q.times_ms.len(), 2, "{mode}");
                assert!(q.times_ms.iter().all(|ms| *ms >= 0.0), "{mode}");
            }
            let err = run.queries[2].result.as_ref().unwrap_err();
            assert!(err.contains("missing_table"), "{mode}: {err}");
        }
    }
}
