//! End-to-end tests of the `spate` binary: output, errors, exit codes, and bad input that must
//! never make it panic.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn spate(args: &[&str]) -> Output {
    spate_in(Path::new(env!("CARGO_TARGET_TMPDIR")), args, None)
}

fn spate_in(dir: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spate");
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().expect("wait for spate")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failure must be a clean error: exit code 1 (or 2 for bad flags), an `Error:` line, and no
/// panic.
fn assert_clean_failure(o: &Output, expected_code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(expected_code), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(!err.contains("internal error"), "internal error: {err}");
    assert!(err.contains(needle), "expected {needle:?} in stderr: {err}");
}

#[test]
fn the_readme_example_prints_the_lineitem_count() {
    let o = spate(&[
        "--tpch",
        "0.01",
        "-c",
        "SELECT count(*) FROM lineitem",
        "--format",
        "csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "count(*)\n60175\n");
    // No progress bar or banner leaks into piped output.
    assert_eq!(stderr(&o), "");
}

#[test]
fn output_formats() {
    let sql = "SELECT 1 AS a, 'x' AS b UNION ALL SELECT 2, NULL ORDER BY a";
    let json = stdout(&spate(&["-c", sql, "--format", "json"]));
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value, serde_json::json!([{"a": 1, "b": "x"}, {"a": 2}]));

    let ndjson = stdout(&spate(&["-c", sql, "--format", "ndjson"]));
    assert_eq!(ndjson, "{\"a\":1,\"b\":\"x\"}\n{\"a\":2}\n");

    let table = stdout(&spate(&["-c", sql]));
    assert!(table.contains("| a | b    |"), "{table}");
    assert!(table.contains("| 2 | NULL |"), "{table}");
    assert!(table.trim_end().ends_with("2 rows"), "{table}");
}

#[test]
fn several_statements_run_in_order_and_stop_at_the_first_error() {
    let o = spate(&[
        "-c",
        "CREATE TABLE t AS VALUES (1), (2); SELECT sum(column1) AS s FROM t;",
        "--format",
        "csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).ends_with("s\n3\n"), "{}", stdout(&o));

    let o = spate(&[
        "-c",
        "SELECT 1 AS one; SELEC 2; SELECT 3 AS three",
        "--format",
        "csv",
    ]);
    assert_clean_failure(&o, 1, "Error: syntax error");
    assert!(stdout(&o).contains("one"));
    assert!(!stdout(&o).contains("three"), "ran past the error");
}

#[test]
fn sql_errors_point_at_the_problem() {
    let o = spate(&["-c", "SELECT 1 FROM"]);
    assert_clean_failure(&o, 1, "Error: syntax error");
    assert!(stderr(&o).contains("--> line 1, column"), "{}", stderr(&o));

    let o = spate(&["-c", "SELECT nope FROM (SELECT 1 AS a)"]);
    assert_clean_failure(&o, 1, "nope");
    let err = stderr(&o);
    assert!(err.contains("--> line 1, column 8"), "{err}");
    assert!(err.contains("   |        ^"), "{err}");

    let o = spate(&["-c", "SELECT * FROM missing_table"]);
    assert_clean_failure(&o, 1, "missing_table");

    let o = spate(&["-c", "SELECT 1/0"]);
    assert_clean_failure(&o, 1, "Divide by zero");
}

#[test]
fn script_files_report_file_positions() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bad.sql");
    std::fs::write(
        &script,
        "SELECT 1;\n\nSELECT nope\n  FROM (SELECT 1 AS a);\n",
    )
    .unwrap();
    let o = spate_in(dir.path(), &["-f", "bad.sql"], None);
    assert_clean_failure(&o, 1, "bad.sql:3:8");

    let o = spate_in(dir.path(), &["-f", "absent.sql"], None);
    assert_clean_failure(&o, 1, "absent.sql: cannot read script");

    let non_utf8 = dir.path().join("binary.sql");
    std::fs::write(&non_utf8, [0xff, 0xfe, 0x00, 0x41]).unwrap();
    let o = spate_in(dir.path(), &["-f", "binary.sql"], None);
    assert_clean_failure(&o, 1, "cannot read script");
}

#[test]
fn piped_input_runs_as_a_script() {
    let dir = tempfile::tempdir().unwrap();
    let o = spate_in(
        dir.path(),
        &["--format", "csv"],
        Some(b"SELECT 40 + 2 AS answer;\nSELECT 'done' AS s\n"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "answer\n42\ns\ndone\n");
}

#[test]
fn missing_and_corrupt_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let o = spate_in(
        dir.path(),
        &["--table", "t=nowhere/data.parquet", "-c", "SELECT 1"],
        None,
    );
    assert_clean_failure(
        &o,
        1,
        "--table t: nowhere/data.parquet: no such file or directory",
    );

    std::fs::write(
        dir.path().join("broken.parquet"),
        b"PAR1 this is not parquet",
    )
    .unwrap();
    let o = spate_in(
        dir.path(),
        &["--table", "t=broken.parquet", "-c", "SELECT 1"],
        None,
    );
    assert_clean_failure(&o, 1, "broken.parquet");
    assert!(stderr(&o).contains("Parquet"), "{}", stderr(&o));

    std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    let o = spate_in(
        dir.path(),
        &["--table", "t=notes.txt", "-c", "SELECT 1"],
        None,
    );
    assert_clean_failure(&o, 1, "unknown file extension '.txt'");

    std::fs::write(
        dir.path().join("bad.csv"),
        b"a,b\n1,2,3,4\n\"unterminated\n",
    )
    .unwrap();
    let o = spate_in(
        dir.path(),
        &["--table", "t=bad.csv", "-c", "SELECT * FROM t"],
        None,
    );
    assert_clean_failure(&o, 1, "Error:");
}

#[test]
fn registered_files_and_folders_are_queryable() {
    let dir = tempfile::tempdir().unwrap();
    let o = spate_in(
        dir.path(),
        &["gen", "tpch", "--sf", "0.01", "--out", "data"],
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("lineitem"), "{}", stderr(&o));
    // A folder of same-format part files is one table.
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    for part in ["part-0.parquet", "part-1.parquet"] {
        std::fs::copy(dir.path().join("data/nation.parquet"), parts.join(part)).unwrap();
    }
    let o = spate_in(
        dir.path(),
        &[
            "--table",
            "li=data/lineitem.parquet",
            "--table",
            "nations=parts",
            "-c",
            "SELECT (SELECT count(*) FROM li) AS l, (SELECT count(*) FROM nations) AS n",
            "--format",
            "csv",
        ],
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "l,n\n60175,50\n");
}

#[test]
fn shell_commands_work_in_scripts() {
    let o = spate(&["--tpch", "0.001", "-c", "\\d"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for table in [
        "customer", "lineitem", "nation", "orders", "part", "partsupp", "region",
    ] {
        assert!(stdout(&o).contains(table), "{}", stdout(&o));
    }
    let o = spate(&["--tpch", "0.001", "-c", "\\d nation"]);
    assert!(stdout(&o).contains("n_nationkey"), "{}", stdout(&o));

    let o = spate(&["-c", "\\gpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("backend:"), "{}", stdout(&o));

    let o = spate(&["-c", "\\timing on\nSELECT 1;"]);
    assert!(stdout(&o).contains("Time: "), "{}", stdout(&o));

    let o = spate(&["-c", "\\q\nSELECT 1 AS never", "--format", "csv"]);
    assert!(o.status.success());
    assert_eq!(stdout(&o), "");

    let o = spate(&["-c", "\\frobnicate"]);
    assert_clean_failure(&o, 1, "unknown command");
    let o = spate(&["-c", "\\d no_such_table"]);
    assert_clean_failure(&o, 1, "no_such_table");
}

#[test]
fn bad_flags_are_rejected_without_panicking() {
    for (args, needle) in [
        (vec!["--backend", "gpu"], "unknown backend 'gpu'"),
        (vec!["--tpch=-1"], "invalid TPC-H scale factor"),
        (vec!["--tpch", "lots"], "not a number"),
        (vec!["--memory-limit", "12Q"], "invalid size"),
        (vec!["--table", "noequals"], "expected NAME=PATH"),
        (vec!["--format", "xml"], "invalid value 'xml'"),
        (vec!["--partitions", "0"], "--partitions"),
        (
            vec!["gen", "tpch", "--sf", "0"],
            "invalid TPC-H scale factor",
        ),
    ] {
        let o = spate(&args);
        assert_clean_failure(&o, 2, needle);
    }
}

#[test]
fn gpu_backends_run_or_fail_clearly() {
    let o = spate(&[
        "--backend",
        "emulated",
        "-c",
        "SELECT 1 AS x",
        "--format",
        "csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "x\n1\n");
    if !spate_kernels_probe_finds_a_gpu() {
        let o = spate(&["--backend", "cuda", "-c", "SELECT 1"]);
        assert_clean_failure(&o, 1, "backend 'cuda' is not available");
    }
    let o = spate(&[
        "--backend",
        "auto",
        "-c",
        "SELECT 1 AS x",
        "--format",
        "csv",
    ]);
    assert!(o.status.success());
    assert_eq!(stdout(&o), "x\n1\n");
}

#[test]
fn emulated_filters_match_the_cpu_on_tpch() {
    let query = "SELECT l_orderkey, l_linenumber, l_shipmode FROM lineitem \
                 WHERE l_quantity < 5 AND l_discount BETWEEN 0.05 AND 0.07 \
                 ORDER BY l_orderkey, l_linenumber";
    let run = |backend: &str| {
        let o = spate(&[
            "--backend",
            backend,
            "--tpch",
            "0.01",
            "-q",
            "--format",
            "csv",
            "-c",
            query,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let gpu = run("emulated");
    assert_eq!(gpu, run("cpu"));
    assert!(gpu.lines().count() > 20, "{gpu}");
    let o = spate(&[
        "--backend",
        "emulated",
        "--tpch",
        "0.01",
        "-c",
        &format!("EXPLAIN {query}"),
    ]);
    assert!(stdout(&o).contains("GpuFilterExec"), "{}", stdout(&o));
}

/// `spate bench tpch --verify` of Q6 and Q11 at SF 0.01 on the emulator, with `extra` arguments.
fn verify_q6_q11(extra: &[&str]) -> Output {
    let mut args = vec![
        "bench",
        "tpch",
        "--sf",
        "0.01",
        "--backend",
        "emulated",
        "--verify",
        "-q",
        "6",
        "-q",
        "11",
    ];
    args.extend_from_slice(extra);
    spate(&args)
}

#[test]
fn the_tpch_report_names_where_operators_ran_and_verifies_results() {
    let o = verify_q6_q11(&[]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.starts_with("backend: emulated"), "{out}");
    assert!(out.contains("q06  matched (1 rows)"), "{out}");
    assert!(out.contains("GpuAggregateExec"), "{out}");
    // Q11's scalar subquery feeds a GPU filter: every compute operator is on the GPU.
    assert!(out.contains("q11  matched"), "{out}");
    assert!(out.contains("CPU: none"), "{out}");
    // Every GPU query's data path is counted.
    let paths: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("data path: ") && l.contains(" launches, "))
        .collect();
    assert_eq!(paths.len(), 2, "{out}");
    assert!(paths.iter().all(|l| l.contains("modeled H200")), "{out}");
    assert_eq!(
        out.lines().last().unwrap(),
        "verified: 2/2 matched, 2/2 fully on GPU",
        "{out}"
    );
    // With DataFusion's CPU partitions kept, Q11's exchanges between GPU operators go through
    // the host: it is no longer fully on the GPU (Q6 has none).
    let o = verify_q6_q11(&["--set", "spate.gpu.one_partition=false"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("      host exchanges: "), "{out}");
    assert_eq!(
        out.lines().last().unwrap(),
        "verified: 2/2 matched, 1/2 fully on GPU",
        "{out}"
    );

    let o = spate(&[
        "bench",
        "tpch",
        "--sf",
        "0.01",
        "--backend",
        "cpu",
        "-q",
        "1",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("q01  4 rows"), "{out}");
    assert!(out.contains("CPU: AggregateExec"), "{out}");
    assert!(!out.contains("data path"), "no GPU, no data path: {out}");
    assert_eq!(
        out.lines().last().unwrap(),
        "ran: 1 queries, 0 failed, 0/1 fully on GPU"
    );

    let o = spate(&["bench", "tpch", "--sf", "0.01", "-q", "23"]);
    assert_clean_failure(&o, 2, "23");
}

#[test]
fn bench_vector_verifies_the_top_k_and_runs_its_peers() {
    for extra in [
        &["--dtype", "f16"][..],
        &["--dtype", "bf16", "--metric", "ip"],
        &["--dtype", "f32", "--metric", "l2", "--filter", "0.2"],
        // One vector_topk statement for all the queries.
        &["--dtype", "f16", "--batched"],
        &[
            "--dtype",
            "bf16",
            "--metric",
            "ip",
            "--filter",
            "0.2",
            "--batched",
        ],
    ] {
        let mut args = vec![
            "bench",
            "vector",
            "--rows",
            "3000",
            "--dim",
            "16",
            "--queries",
            "4",
            "--k",
            "10",
            "--backend",
            "emulated",
            "--verify",
        ];
        args.extend_from_slice(extra);
        let o = spate(&args);
        let out = stdout(&o);
        assert!(o.status.success(), "{extra:?}: {out}\n{}", stderr(&o));
        assert!(out.contains("spate emulated: "), "{out}");
        assert!(out.contains(", GPU top-k"), "{out}");
        assert!(
            out.contains("spate cpu: 4/4 queries equal the exact top-k"),
            "{out}"
        );
        // The peers ran (scripts/test installs numpy and faiss-cpu) or say why not.
        for peer in ["numpy: ", "faiss: "] {
            assert!(
                out.lines().any(|l| {
                    let l = l.trim_start();
                    l.starts_with(peer) || l.starts_with("peers: skipped")
                }),
                "{peer}{out}"
            );
        }
        assert_eq!(
            out.lines().last().unwrap(),
            "verified: 4/4 queries equal the exact top-k",
            "{out}"
        );
    }
    let o = spate(&["bench", "vector", "--k", "5000"]);
    assert_clean_failure(&o, 2, "4096");
}

#[test]
fn selftest_checks_every_kernel_on_the_emulator() {
    let o = spate(&["selftest", "--backend", "emulated"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.starts_with("device: emulator"), "{out}");
    for check in [
        "scan exclusive u32",
        "radix sort u64 pairs",
        "gather strings",
        "vector top-k f32 L2",
    ] {
        assert!(out.contains(check), "{check} missing from:\n{out}");
    }
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("selftest: ") && last.ends_with(" passed, 0 failed"),
        "{last}"
    );
    assert!(!out.contains("FAIL"), "{out}");
}

#[test]
fn selftest_on_cuda_without_a_gpu_is_a_clean_error() {
    if spate_kernels_probe_finds_a_gpu() {
        println!("SKIPPED: a GPU is present, so there is no missing-GPU error to check");
        return;
    }
    let o = spate(&["selftest", "--backend", "cuda"]);
    assert_clean_failure(&o, 1, "cannot open the cuda backend");
}

fn spate_kernels_probe_finds_a_gpu() -> bool {
    spate::kernels::probe::discover().is_ok()
}

#[test]
fn memory_limits_are_enforced_cleanly() {
    let o = spate(&[
        "--memory-limit",
        "1K",
        "-c",
        "SELECT v FROM generate_series(1, 200000) AS g(v) ORDER BY v DESC",
        "--format",
        "csv",
    ]);
    assert_clean_failure(&o, 1, "Error:");

    // A GPU join whose build side does not fit the GPU memory budget spills to the host and
    // finishes; under a budget too small for one batch it fails cleanly, naming the operator.
    let join = |budget: &str| {
        spate(&[
            "--backend",
            "emulated",
            "--gpu-memory-limit",
            budget,
            "--format",
            "csv",
            "-c",
            "CREATE TABLE big AS SELECT v AS k, CAST(v AS VARCHAR) AS s \
             FROM generate_series(1, 300000) AS g(v)",
            "-c",
            "SELECT count(*) AS n FROM big a JOIN big b ON a.k = b.k",
        ])
    };
    let o = join("2M");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("n\n300000\n"), "{}", stdout(&o));
    let o = join("64K");
    assert_clean_failure(&o, 1, "GPU out of memory in Gpu");
    assert!(stderr(&o).contains("--gpu-memory-limit"), "{}", stderr(&o));
}

#[test]
fn gen_reports_unwritable_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let o = spate_in(
        dir.path(),
        &["gen", "tpch", "--sf", "0.001", "--out", "file/sub"],
        None,
    );
    assert_clean_failure(&o, 1, "file/sub");
}

#[test]
fn closing_stdout_early_is_not_a_crash() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args([
            "-c",
            "SELECT v FROM generate_series(1, 2000000) AS g(v)",
            "--format",
            "csv",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    out.read_exact(&mut first).unwrap();
    drop(out);
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{err}"
    );
    assert!(
        o.status.code().is_some(),
        "killed by a signal: {:?}",
        o.status
    );
}

#[test]
fn odd_input_never_panics() {
    let inputs: [&[u8]; 14] = [
        b"",
        b";;;",
        b"'unterminated",
        b"/* unterminated",
        b"\\",
        b".",
        b"SELECT",
        b"SELECT 1 +",
        b"SELECT * FROM (((((((((((((((((((((((((((((((((((((",
        b"SELECT '\xc3\x28'",
        b"\x00\x01\x02",
        b"CREATE TABLE x AS SELECT 1; DROP TABLE x; DROP TABLE x;",
        b"SELECT CAST('2024-13-45' AS DATE)",
        b"SELECT repeat('x', -1), substr('abc', -5, -2)",
    ];
    let dir = tempfile::tempdir().unwrap();
    for input in inputs {
        // Arguments cannot carry NUL bytes; such input only arrives on stdin.
        let flag_ok = !input.contains(&0);
        for via_flag in [false, true].into_iter().filter(|&f| !f || flag_ok) {
            let o = if via_flag {
                let text = String::from_utf8_lossy(input).into_owned();
                spate_in(dir.path(), &["-c", &text], None)
            } else {
                spate_in(dir.path(), &[], Some(input))
            };
            let err = stderr(&o);
            assert!(
                matches!(o.status.code(), Some(0 | 1)),
                "input {input:?}: status {:?}, stderr {err}",
                o.status
            );
            assert!(!err.contains("panicked"), "input {input:?}: {err}");
            assert!(!err.contains("internal error"), "input {input:?}: {err}");
        }
    }
}

#[test]
fn stdin_feeds_a_stream_whose_view_is_subscribed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pipeline.sql"),
        "CREATE STREAM tx (card BIGINT, amount DOUBLE, ts TIMESTAMP, WATERMARK FOR ts AS ts) \
         WITH (flush_rows = 2);\n\
         CREATE CONTINUOUS VIEW per_card AS SELECT card, window_end, count(*) AS n \
         FROM TUMBLE(tx, ts, INTERVAL '1' SECOND) GROUP BY card, window_end;\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("watch.sql"), "SUBSCRIBE per_card;\n").unwrap();
    let lines = "card,amount,ts\n7,2.5,2026-01-01T00:00:00\n7,3.5,2026-01-01T00:00:00.5\n\
                 8,1,2026-01-01T00:00:01.2\n7,1,2026-01-01T00:00:02.2\n";
    let args = [
        "-f",
        "pipeline.sql",
        "-f",
        "watch.sql",
        "--stdin-into",
        "tx",
        "--format",
        "csv",
    ];
    let o = spate_in(dir.path(), &args, Some(lines.as_bytes()));
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    // Every window, once the input ended (the stream's only writer finished).
    for row in [
        "7,2026-01-01T00:00:01,2",
        "8,2026-01-01T00:00:02,1",
        "7,2026-01-01T00:00:03,1",
    ] {
        assert!(out.contains(row), "{row} missing from: {out}");
    }
    assert!(stderr(&o).contains("stdin: 4 rows read"), "{}", stderr(&o));
    // A line that does not parse: a clean failure that says where.
    let o = spate_in(
        dir.path(),
        &args,
        Some(b"card,amount,ts\n7,abc,2026-01-01T00:00:00\n"),
    );
    assert_clean_failure(&o, 1, "line 2");
    // No statements, or no such stream.
    let o = spate_in(dir.path(), &["--stdin-into", "tx"], Some(b""));
    assert_clean_failure(&o, 1, "give the statements with -c or -f");
    let o = spate_in(
        dir.path(),
        &["-c", "SELECT 1", "--stdin-into", "tx"],
        Some(b""),
    );
    assert_clean_failure(&o, 1, "declared no stream 'tx'");
}
