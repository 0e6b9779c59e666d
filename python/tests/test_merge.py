"""merge against pandas: every join type, key spellings, suffixes and null keys."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import spate
from conftest import assert_same, random_frame


def dimension(seed: int, rows: int = 40) -> pd.DataFrame:
    """A small right-hand table: keys with duplicates, keys the left side lacks, null keys,
    and a value column ``f`` whose name clashes with the left side's."""
    rng = np.random.default_rng(seed)
    keys = np.array(["a", "b", "c", "x", "y", None], dtype=object)
    k = keys[rng.integers(0, len(keys), rows)]
    g = rng.integers(0, 9, rows).astype("float64")
    g[rng.random(rows) < 0.15] = np.nan
    f = rng.normal(0, 1, rows).round(2)
    f[rng.random(rows) < 0.2] = np.nan
    return pd.DataFrame(
        {
            "rid": np.arange(rows, dtype="int64"),
            "k": pd.array(k, dtype="str"),
            "g": g,
            "f": f,
            "w": pd.array(rng.choice(["p", "q", None], rows), dtype="str"),
        }
    )


@pytest.fixture(scope="module")
def left_pd() -> pd.DataFrame:
    return random_frame(11, rows=300)[["id", "k", "g", "i", "f", "s"]]


@pytest.fixture(scope="module")
def right_pd() -> pd.DataFrame:
    return dimension(12)


@pytest.fixture(scope="module")
def frames(cpu, left_pd, right_pd):
    return cpu.from_pandas(left_pd), cpu.from_pandas(right_pd)


@pytest.mark.parametrize("how", ["inner", "left", "right", "outer"])
def test_merge_on_one_key(frames, left_pd, right_pd, how):
    left, right = frames
    got = left.merge(right, on="k", how=how)
    expected = left_pd.merge(right_pd, on="k", how=how)
    assert got.columns == list(expected.columns)
    assert len(got) == len(expected)
    assert_same(got, expected)


@pytest.mark.parametrize("how", ["inner", "left", "right", "outer"])
def test_merge_on_two_keys(frames, left_pd, right_pd, how):
    left, right = frames
    got = left.merge(right, on=["k", "g"], how=how)
    expected = left_pd.merge(right_pd, on=["k", "g"], how=how)
    assert got.columns == list(expected.columns)
    assert_same(got, expected)


@pytest.mark.parametrize("how", ["inner", "left", "right", "outer"])
def test_merge_left_on_right_on(frames, left_pd, right_pd, how):
    left, right = frames
    right = right.rename({"g": "gg"})
    right_pd = right_pd.rename(columns={"g": "gg"})
    got = left.merge(right, left_on="g", right_on="gg", how=how, suffixes=("_l", "_r"))
    expected = left_pd.merge(right_pd, left_on="g", right_on="gg", how=how, suffixes=("_l", "_r"))
    assert got.columns == list(expected.columns)
    assert_same(got, expected)


def test_merge_default_keys_are_common_columns(session):
    a = pd.DataFrame({"x": [1, 2, 2, None], "y": ["p", "q", "r", "s"]})
    b = pd.DataFrame({"x": [2, None, 3], "z": [0.5, 1.5, 2.5]})
    got = session.from_pandas(a).merge(session.from_pandas(b))
    assert_same(got, a.merge(b))


def test_null_keys_match_like_pandas(session):
    a = pd.DataFrame(
        {"k": ["a", None, None, "b"], "g": [1.0, np.nan, 2.0, np.nan], "v": [1, 2, 3, 4]}
    )
    b = pd.DataFrame({"k": [None, "a", "c"], "g": [np.nan, 1.0, 3.0], "w": [10, 20, 30]})
    sa, sb = session.from_pandas(a), session.from_pandas(b)
    for how in ["inner", "left", "right", "outer"]:
        assert_same(sa.merge(sb, on="k", how=how), a.merge(b, on="k", how=how))
        assert_same(sa.merge(sb, on="g", how=how), a.merge(b, on="g", how=how))
        assert_same(sa.merge(sb, on=["k", "g"], how=how), a.merge(b, on=["k", "g"], how=how))


def test_nulls_equal_false_is_sql_equality(session):
    a = pd.DataFrame({"k": ["a", None, "b"], "v": [1, 2, 3]})
    b = pd.DataFrame({"k": [None, "a"], "w": [10, 20]})
    got = session.from_pandas(a).merge(session.from_pandas(b), on="k", nulls_equal=False)
    assert_same(got, a.dropna().merge(b.dropna(), on="k"))


def test_merge_cross(session):
    a = pd.DataFrame({"x": [1, 2, 3]})
    b = pd.DataFrame({"y": ["p", None]})
    got = session.from_pandas(a).merge(session.from_pandas(b), how="cross")
    assert_same(got, a.merge(b, how="cross"))


def test_semi_and_anti(frames, left_pd, right_pd):
    left, right = frames
    keys = set(right_pd.k.dropna())
    has_null = right_pd.k.isna().any()
    in_right = left_pd.k.isin(keys) | (left_pd.k.isna() & has_null)
    assert_same(left.merge(right, on="k", how="leftsemi"), left_pd[in_right])
    assert_same(left.merge(right, on="k", how="leftanti"), left_pd[~in_right])


def test_merge_then_groupby(frames, left_pd, right_pd):
    left, right = frames
    got = left.merge(right, on="k").groupby("w", dropna=False).agg({"i": "sum", "rid": "nunique"})
    expected = left_pd.merge(right_pd, on="k").groupby("w", dropna=False).agg(
        {"i": "sum", "rid": "nunique"}
    )
    pd.testing.assert_frame_equal(got.to_pandas(), expected, check_dtype=False)


def test_merge_after_groupby_uses_index_as_column(session, left_pd, right_pd):
    left = session.from_pandas(left_pd)
    totals = left.groupby("k").agg({"i": "sum"})
    right = session.from_pandas(right_pd)
    got = right.merge(totals, on="k")
    expected = right_pd.merge(left_pd.groupby("k").agg({"i": "sum"}).reset_index(), on="k")
    assert_same(got, expected)


def test_merge_errors(frames):
    left, right = frames
    with pytest.raises(spate.PlanError, match="nope"):
        left.merge(right, on="nope")
    with pytest.raises(spate.PlanError, match="rid"):
        left.merge(right, left_on="rid", right_on="rid")
    with pytest.raises(spate.PlanError):
        left.merge(right, left_on=["k", "g"], right_on="k")
    with pytest.raises(spate.ConfigError):
        left.merge(right, on="k", how="sideways")
    with pytest.raises(TypeError):
        left.merge(pd.DataFrame({"k": ["a"]}), on="k")
    other = spate.Session(backend="cpu").from_pandas(pd.DataFrame({"k": ["a"]}))
    with pytest.raises(spate.PlanError):
        left.merge(other, on="k")
