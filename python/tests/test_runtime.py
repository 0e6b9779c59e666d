"""Running queries: the GIL is released while a query runs, Ctrl-C interrupts a long query
(and stops it), and sessions can be used from several threads."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import spate
from conftest import deadline

#: About 1-2 s on one core: long enough to watch, short enough for CI.
SLOW_QUERY = "select sum(value) as s from generate_series(1, 200000000)"
SLOW_RESULT = 200000000 * 200000001 // 2

#: 2e10 rows: about two minutes on two cores if the interrupt failed (never hours).
LONG_QUERY = "select count(*) from generate_series(1, 20000000000)"


def test_query_releases_the_gil(cpu):
    result: dict[str, object] = {}

    def run() -> None:
        started = time.perf_counter()
        result["value"] = cpu.sql(SLOW_QUERY).to_pandas()["s"][0]
        result["seconds"] = time.perf_counter() - started

    worker = threading.Thread(target=run)
    with deadline(60, "the slow query"):
        worker.start()
        # Meanwhile the main thread keeps running Python code; record the longest pause.
        iterations, longest_gap = 0, 0.0
        last = time.perf_counter()
        while worker.is_alive():
            now = time.perf_counter()
            longest_gap = max(longest_gap, now - last)
            last = now
            iterations += 1
        worker.join()
    assert result["value"] == SLOW_RESULT
    assert result["seconds"] > 0.3, "the query was too fast to show anything"
    # Had the query held the GIL, the loop would have stalled for the whole query.
    assert iterations > 10_000
    assert longest_gap < result["seconds"] / 2, (longest_gap, result["seconds"])


def test_ctrl_c_interrupts_a_long_query(cpu):
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    started = time.perf_counter()
    timer.start()
    try:
        with deadline(60, "the interrupted query"):
            with pytest.raises(KeyboardInterrupt):
                cpu.sql(LONG_QUERY).to_arrow()
    finally:
        timer.cancel()
    elapsed = time.perf_counter() - started
    assert elapsed < 3, f"KeyboardInterrupt came {elapsed:.1f} s after the query started"
    # The aborted query stops: the engine's threads go idle (they would keep two cores busy
    # for about two minutes otherwise).
    time.sleep(0.3)
    cpu_before = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - cpu_before < 0.5
    # ... and the session still works.
    assert cpu.sql("select 1 as x").to_pandas()["x"][0] == 1


def test_ctrl_c_interrupts_explain_analyze(cpu):
    frame = cpu.sql(LONG_QUERY)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.perf_counter()
    try:
        with deadline(60, "the interrupted EXPLAIN ANALYZE"), pytest.raises(KeyboardInterrupt):
            frame.explain(analyze=True)
    finally:
        timer.cancel()
    assert time.perf_counter() - started < 3


def test_concurrent_queries_from_threads(cpu):
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            value = cpu.sql(f"select sum(value) as s from generate_series(1, {n})")
            results[n] = int(value.to_pandas()["s"][0])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    sizes = [10_000 * (i + 1) for i in range(8)]
    threads = [threading.Thread(target=run, args=(n,)) for n in sizes]
    with deadline(60, "the concurrent queries"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert results == {n: n * (n + 1) // 2 for n in sizes}


def test_sessions_are_independent():
    a, b = spate.Session(backend="cpu"), spate.Session(backend="cpu")
    a.sql("create table only_a as select 1 as x")
    assert "only_a" in a.tables() and "only_a" not in b.tables()
