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
