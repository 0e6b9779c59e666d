//! `spate scheduler`, `spate executor` and `spate --remote` as separate processes on loopback:
//! a query sent to the cluster prints what the same query prints locally.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A child process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `spate <args>` and returns it with the first line it printed (where it listens).
fn start(args: &[&str]) -> (Running, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(!line.is_empty(), "spate {args:?} printed nothing");
    (running, line.trim().to_string())
}

fn spate(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "spate {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn a_query_on_a_scheduler_and_two_executors_prints_what_it_prints_locally() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    spate(&["gen", "tpch", "--sf", "0.01", "--out", data]);
    let (_scheduler, line) = start(&["scheduler", "--bind", "127.0.0.1:0"]);
    let url = line
        .strip_prefix("scheduler listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();
    assert!(url.starts_with("df://127.0.0.1:"), "{url}");
    let executors: Vec<Running> = (0..2)
        .map(|_| {
            let (executor, line) = start(&[
                "executor",
                "--scheduler",
                &url,
                "--backend",
                "emulated",
                "--tasks",
                "2",
            ]);
            assert!(line.starts_with("executor "), "{line}");
            executor
        })
        .collect();
    let tables = ["lineitem", "orders"].map(|t| format!("{t}={data}/{t}.parquet"));
    let sql = "SELECT o_orderpriority, count(*) AS orders, sum(l_quantity) AS quantity \
               FROM orders JOIN lineitem ON o_orderkey = l_orderkey \
               WHERE l_shipdate > DATE '1995-01-01' \
               GROUP BY o_orderpriority ORDER BY o_orderpriority";
    let query = |target: &[&str]| {
        let mut args: Vec<&str> = target.to_vec();
        for t in &tables {
            args.extend(["--table", t]);
        }
        args.extend(["--format", "csv", "-c", sql]);
        spate(&args)
    };
    let remote = query(&["--remote", &url]);
    let local = query(&["--backend", "cpu"]);
    assert_eq!(remote, local);
    assert_eq!(local.lines().count(), 6, "{local}");
    drop(executors);
}
