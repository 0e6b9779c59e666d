#!/usr/bin/env python3
"""Run SQL files on DuckDB over a folder of Parquet tables and print the results as JSON.

Usage: duckdb_queries.py DATA_DIR QUERY.sql [QUERY.sql ...]

Every `<name>.parquet` in DATA_DIR becomes a view `<name>`. The output is one JSON object:
{"<query file stem>": {"columns": [...], "rows": [[cell, ...], ...]} or {"error": "..."}}.
Cells are tagged so that exactness survives JSON: ["i", "123"] integer, ["d", "1.50"] decimal,
["f", 1.5] float, ["s", "text"] string, ["t", "1995-01-01"] date/time, ["b", true] boolean,
and null. Spate's DuckDB cross-check test reads this format.
"""

import datetime
import decimal
import json
import os
import pathlib
import sys

import duckdb


def cell(value):
    if value is None:
        return None
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", str(value)]
    if isinstance(value, decimal.Decimal):
        return ["d", format(value, "f")]
    if isinstance(value, float):
        return ["f", value]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return ["t", value.isoformat()]
    return ["s", str(value)]


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    data_dir = pathlib.Path(argv[1])
    con = duckdb.connect()
    con.execute(f"SET threads TO {os.cpu_count() or 1}")
    for path in sorted(data_dir.glob("*.parquet")):
        quoted = str(path).replace("'", "''")
        con.execute(f"CREATE VIEW {path.stem} AS SELECT * FROM read_parquet('{quoted}')")
    results = {}
    for query_path in argv[2:]:
        query_path = pathlib.Path(query_path)
        try:
            cursor = con.execute(query_path.read_text())
            columns = [d[0] for d in cursor.description]
            rows = [[cell(v) for v in row] for row in cursor.fetchall()]
            results[query_path.stem] = {"columns": columns, "rows": rows}
        except duckdb.Error as e:
            results[query_path.stem] = {"error": str(e)}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
