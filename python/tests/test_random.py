"""Pipelines of operations on random frames of random sizes (0, 1, a few, hundreds, more than
one batch), each compared with pandas: the edges (empty groups, all-null groups, single rows,
several partitions) that one fixed frame does not reach."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import assert_same, random_frame

SEEDS = range(8)
SIZES = [0, 1, 7, 300, 9000]


def frame_for(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(1000 + seed)
    return random_frame(2000 + seed, rows=int(rng.choice(SIZES)))


@pytest.mark.parametrize("seed", SEEDS)
def test_filter_groupby_pipeline(session, seed):
    pdf = frame_for(seed)
    df = session.from_pandas(pdf)
    rng = np.random.default_rng(seed)
    threshold = int(rng.integers(-30, 30))
    dropna = bool(rng.integers(0, 2))
    keys = [["k"], ["g"], ["k", "b"], ["b"]][seed % 4]
    spec = {"i": ["sum", "min", "max"], "f": ["mean", "count", "sum"], "s": ["max", "nunique"]}
    got = df[df.i > threshold].groupby(keys, dropna=dropna).agg(spec).to_pandas()
    expected = pdf[pdf.i > threshold].groupby(keys, dropna=dropna).agg(spec)
    if len(expected):
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    else:
        assert len(got) == 0 and list(got.columns) == list(expected.columns)


@pytest.mark.parametrize("seed", SEEDS)
def test_sort_head_pipeline(session, seed):
    pdf = frame_for(seed)
    df = session.from_pandas(pdf)
    rng = np.random.default_rng(seed)
    by = [["f", "id"], ["s", "id"], ["k", "g", "id"], ["b", "n", "id"]][seed % 4]
    ascending = [bool(a) for a in rng.integers(0, 2, len(by))]
    na_position = ["first", "last"][seed % 2]
    n = int(rng.integers(0, 50))
    got = df.sort_values(by, ascending=ascending, na_position=na_position).head(n)
    expected = pdf.sort_values(by, ascending=ascending, na_position=na_position).head(n)
    assert_same(got, expected, sort=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_pipeline(session, seed):
    pdf = frame_for(seed)
    rng = np.random.default_rng(seed)
    right = frame_for(seed + 100).head(40)[["k", "g", "j", "s"]]
    how = ["inner", "left", "right", "outer"][seed % 4]
    on = [["k"], ["g"], ["k", "g"]][seed % 3]
    left = pdf[["id", "k", "g", "i"]].head(int(rng.integers(0, 400)))
    got = session.from_pandas(left).merge(session.from_pandas(right), on=on, how=how)
    expected = left.merge(right, on=on, how=how)
    assert got.columns == list(expected.columns)
    assert_same(got, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_expression_pipeline(session, seed):
    pdf = frame_for(seed)
    df = session.from_pandas(pdf)
    got = df.assign(
        a=(df.i * df.j - 3) % 7,
        c=df.s.str.upper() + "/" + df.k,
        d=df.f.fillna(-1).round(1),
        e=df.n.isin([1, 2, pd.NA]),
    )
    got = got[(got.a > 2) | got.e][["id", "a", "c", "d", "e"]]
    expected = pdf.assign(
        a=(pdf.i * pdf.j - 3) % 7,
        c=pdf.s.str.upper() + "/" + pdf.k,
        d=pdf.f.fillna(-1).round(1),
        e=pdf.n.isin([1, 2, pd.NA]),
    )
    expected = expected[(expected.a > 2) | expected.e][["id", "a", "c", "d", "e"]]
    assert_same(got, expected)


#: Steps of the random pipeline of the pandas surface: each takes (spate frame, pandas frame)
#: sorted by id, and returns both after one method.
SURFACE_STEPS = {
    "dropna": lambda s, p: (s.dropna(subset=["f"]), p.dropna(subset=["f"])),
    "fillna": lambda s, p: (s.fillna({"f": 0.5, "s": "?"}), p.fillna({"f": 0.5, "s": "?"})),
    "cumsum": lambda s, p: (s.assign(c=s.i.cumsum()), p.assign(c=p.i.cumsum())),
    "shift": lambda s, p: (s.assign(c=s.f.shift(2)), p.assign(c=p.f.shift(2))),
    "rank": lambda s, p: (s.assign(c=s.i.rank(method="min")), p.assign(c=p.i.rank(method="min"))),
    "rolling": lambda s, p: (
        s.assign(c=s.f.rolling(4, min_periods=1).mean()),
        p.assign(c=p.f.rolling(4, min_periods=1).mean()),
    ),
    "clip": lambda s, p: (s.assign(i=s.i.clip(-10, 10)), p.assign(i=p.i.clip(-10, 10))),
    "query": lambda s, p: (s.query("i > -20"), p.query("i > -20")),
    "ffill": lambda s, p: (s.assign(f=s.f.ffill()), p.assign(f=p.f.ffill())),
    "transform": lambda s, p: (
        s.assign(c=s.groupby("k")["i"].transform("sum")),
        p.assign(c=p.groupby("k")["i"].transform("sum")),
    ),
}


@pytest.mark.parametrize("seed", SEEDS)
def test_surface_pipeline(session, seed):
    """Three random steps of the pandas surface, each followed by a comparison in order
    (every step keeps the sort by ``id``)."""
    pdf = frame_for(seed).sort_values("id").reset_index(drop=True)
    pdf = pdf.drop(columns=["g"])
    df = session.from_pandas(pdf).sort_values("id")
    rng = np.random.default_rng(seed)
    names = sorted(SURFACE_STEPS)
    for step in rng.choice(names, 3, replace=False):
        df, pdf = SURFACE_STEPS[step](df, pdf)
        pdf = pdf.reset_index(drop=True)
        columns = [c for c in pdf.columns if c != "c"] + (["c"] if "c" in pdf.columns else [])
        assert_same(df[columns], pdf[columns], sort=False, rtol=1e-9)
