#!/usr/bin/env python3
"""Time SQL files on DuckDB over a folder of Parquet tables and print results and times as JSON.

Usage: duckdb_bench.py DATA_DIR --mode hot|cold --runs N [--threads T] QUERY.sql [QUERY.sql ...]

Every `<name>.parquet` in DATA_DIR becomes a table `<name>` of an in-memory database:
- cold: a VIEW over read_parquet, so every run reads (and decodes) the Parquet files. DuckDB's
  own file and metadata caches are switched off; the operating system's page cache is not
  dropped (that needs root), so "cold" means "from Parquet", not "from the disk platters".
- hot: a TABLE loaded with CREATE TABLE ... AS SELECT * FROM read_parquet(...) before any query
  (the load is timed and reported as load_ms), so the timed runs read DuckDB's own memory.
In both modes each query runs once untimed before its timed runs, as in Spate's runner.

The session takes the SQL semantics the benchmark queries are written for, which DataFusion
(and PostgreSQL) follow and DuckDB by default does not: `/` between integers truncates
(integer_division), and NULLs sort last ascending and first descending (default_null_order).
Without them TPC-DS q21 and q78 (integer ratios) and q71 (NULLs under ORDER BY ... DESC)
answer differently.

Each timed run is time.perf_counter() around execute + fetchall, in milliseconds. The output is
one JSON object:
{"duckdb_version": "...", "threads": T, "mode": "hot"|"cold", "load_ms": float|null,
 "queries": {"<query file stem>": {"columns": [...], "rows": [[cell, ...], ...],
                                   "times_ms": [...]} or {"error": "..."}}}
Cells are tagged as in duckdb_queries.py (the rows are those of the last timed run); a
non-finite float, which JSON cannot hold, is ["f", "NaN"], ["f", "inf"] or ["f", "-inf"].
Spate's benchmark runner (`spate bench tpch --engines ...,duckdb`) reads this format.
"""

import argparse
import json
import math
import os
import pathlib
import sys
import time

# The tagged-cell format is defined once, in duckdb_queries.py beside this file.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import duckdb  # noqa: E402
from duckdb_queries import cell  # noqa: E402


def bench_cell(value):
    """duckdb_queries.cell, plus non-finite floats (json.dump would write invalid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ["f", "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")]
    return cell(value)


def quote_identifier(name):
    return '"' + name.replace('"', '""') + '"'


def quote_string(text):
    return "'" + text.replace("'", "''") + "'"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time SQL files on DuckDB over a folder of Parquet tables."
    )
    parser.add_argument("data_dir", type=pathlib.Path, help="folder of <table>.parquet files")
    parser.add_argument("--mode", choices=["hot", "cold"], required=True)
    parser.add_argument("--runs", type=int, required=True, help="timed runs per query (>= 1)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("queries", nargs="+", type=pathlib.Path, metavar="QUERY.sql")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, not {args.runs}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, not {args.threads}")
    return args


def disable_caches(con):
    """Makes every cold run read the Parquet files again instead of DuckDB's block cache."""
    for setting in ("enable_external_file_cache", "parquet_metadata_cache"):
        try:
            con.execute(f"SET {setting} = false")
        except duckdb.Error:
            # Older DuckDB versions lack the setting, and with it the cache.
            pass


def register_tables(con, data_dir, mode):
    """Creates one view (cold) or table (hot) per Parquet file; returns the load time or None."""
    tables = sorted(data_dir.glob("*.parquet"))
    if mode == "cold":
        disable_caches(con)
        for path in tables:
            con.execute(
                f"CREATE VIEW {quote_identifier(path.stem)} AS "
                f"SELECT * FROM read_parquet({quote_string(str(path))})"
            )
        return None
    started = time.perf_counter()
    for path in tables:
        con.execute(
            f"CREATE TABLE {quote_identifier(path.stem)} AS "
            f"SELECT * FROM read_parquet({quote_string(str(path))})"
        )
    return (time.perf_counter() - started) * 1000.0


def run_query(con, sql, runs):
    # One untimed run first, in both modes, as Spate's engines get (theirs compiles kernels):
    # the timed runs then all see the same warm operating-system file cache.
    con.execute(sql).fetchall()
    times_ms = []
    for _ in range(runs):
        started = time.perf_counter()
        cursor = con.execute(sql)
        rows = cursor.fetchall()
        times_ms.append((time.perf_counter() - started) * 1000.0)
    columns = [d[0] for d in cursor.description]
    return {
        "columns": columns,
        "rows": [[bench_cell(v) for v in row] for row in rows],
        "times_ms": times_ms,
    }


def main(argv):
    args = parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"duckdb_bench.py: {args.data_dir} is not a folder", file=sys.stderr)
        return 2
    con = duckdb.connect()
    con.execute(f"SET threads TO {args.threads}")
    con.execute("SET integer_division = true")
    con.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    load_ms = register_tables(con, args.data_dir, args.mode)
    results = {}
    for query_path in args.queries:
        try:
            results[query_path.stem] = run_query(con, query_path.read_text(), args.runs)
        except (duckdb.Error, OSError) as e:
            results[query_path.stem] = {"error": str(e)}
    output = {
        "duckdb_version": duckdb.__version__,
        "threads": int(threads),
        "mode": args.mode,
        "load_ms": load_ms,
        "queries": results,
    }
    json.dump(output, sys.stdout, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
