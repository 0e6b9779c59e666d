"""The same operations on the GPU backends (``emulated``: the kernels on a host emulator;
``cuda``: a real GPU, skipped with the reason when there is none) give the CPU backend's
results. The data is small: the emulator is slow and compiles each kernel on first use."""

from __future__ import annotations

import time
from typing import Callable

import pandas as pd
import pytest

import spate
from conftest import assert_same, random_frame

ROWS = 400

#: Operations over a frame ``d`` built from random_frame(31, ROWS), each returning a frame.
OPERATIONS: dict[str, Callable[[spate.DataFrame], spate.DataFrame]] = {
    "filter": lambda d: d[(d.i > 0) & d.f.notnull() | (d.k == "a")][["id", "i", "f", "k"]],
    "expressions": lambda d: d.assign(x=d.i * 2 + d.j, y=d.i / d.j, z=d.f.fillna(0) - 1.5)[
        ["id", "x", "y", "z"]
    ],
    "groupby": lambda d: d.groupby("k", dropna=False).agg(
        {"i": ["sum", "min", "max"], "f": ["mean", "count"]}
    ),
    "groupby_nunique": lambda d: d.groupby("g").agg({"j": "nunique"}),
    "sort": lambda d: d.sort_values(["f", "id"], ascending=[False, True], na_position="first")[
        ["id", "f"]
    ].head(50),
    "merge": lambda d: d[["id", "k", "i"]].merge(
        d[["k", "j"]].drop_duplicates(), on="k", how="left"
    ),
    "strings": lambda d: d[d.s.str.startswith("a")].assign(u=d.s.str.upper())[["id", "u"]],
}


def run_on(session: spate.Session, name: str) -> pd.DataFrame:
    frame = session.from_pandas(random_frame(31, ROWS))
    return OPERATIONS[name](frame).to_pandas()


@pytest.fixture(scope="module")
def emulated() -> spate.Session:
    return spate.Session(backend="emulated")


@pytest.fixture(scope="module")
def cuda() -> spate.Session:
    found = spate.devices()
    if not found:
        pytest.skip(f"no GPU: {found.reason}")
    return spate.Session(backend="cuda")


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_emulated_matches_cpu(emulated, cpu, name):
    started = time.perf_counter()
    got = run_on(emulated, name)
    elapsed = time.perf_counter() - started
    expected = run_on(cpu, name)
    ordered = name == "sort"
    assert_same(got, expected, sort=not ordered, check_index=ordered or name.startswith("groupby"))
    # Kernel compilation is cached per session; one operation should never take long.
    assert elapsed < 30, f"{name} took {elapsed:.1f} s on the emulator"


def test_emulated_runs_on_the_gpu_operators(emulated):
    assert emulated.backend == "emulated"
    frame = emulated.from_pandas(random_frame(31, ROWS))
    plan = frame[frame.i > 0].groupby("k").agg({"i": "sum"}).explain()
    assert "Gpu" in plan


def test_emulated_fallback_error_policy():
    # fallback="error" fails a query with an operator the GPU does not run, naming it and
    # why, instead of quietly running it on the CPU (the default, fallback="cpu").
    query = "select lag(a, 1, 0) over (order by a) as r from (values (1), (2)) t(a)"
    strict = spate.Session(backend="emulated", fallback="error")
    with pytest.raises(spate.UnsupportedError, match="cannot run on the GPU"):
        strict.sql(query).to_arrow()
    relaxed = spate.Session(backend="emulated")
    assert sorted(relaxed.sql(query).to_pandas()["r"]) == [0, 1]


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_cuda_matches_cpu(cuda, cpu, name):
    got = run_on(cuda, name)
    expected = run_on(cpu, name)
    ordered = name == "sort"
    assert_same(got, expected, sort=not ordered, check_index=ordered or name.startswith("groupby"))


def test_devices():
    found = spate.devices()
    assert isinstance(found, list)
    if found:
        assert found.reason is None
        assert all(d.total_memory > 0 and d.arch.startswith("sm_") for d in found)
    else:
        assert found.reason, "an empty device list must say why"
        assert "no GPU" in repr(found)


def test_auto_backend_says_why():
    s = spate.Session(backend="auto")
    assert s.backend in ("cuda", "cpu")
    assert s.backend_reason
    if not spate.devices():
        assert s.backend == "cpu"
