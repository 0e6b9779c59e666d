"""Missing data and inspection against pandas, on ``cpu`` and ``emulated``: isna/notna,
dropna, fillna, ffill/bfill, describe, info, memory_usage, value_counts, unique, duplicated,
nlargest/nsmallest, tail, sample."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

import spate
from conftest import assert_same, random_frame, timed_frame


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    return random_frame(7, 600)


@pytest.fixture(scope="module")
def sdf(backend, pdf):
    return backend.from_pandas(pdf)


def test_isna_notna(sdf, pdf):
    got = sdf.sort_values("id").isna().to_pandas()
    assert_same(got, pdf.sort_values("id").isna().reset_index(drop=True), sort=False)
    got = sdf.sort_values("id").notna().to_pandas()
    assert_same(got, pdf.sort_values("id").notna().reset_index(drop=True), sort=False)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"how": "all"}, {"subset": ["f", "s"]}, {"thresh": 8}, {"subset": "n", "how": "any"}],
)
def test_dropna(sdf, pdf, kwargs):
    assert_same(sdf.dropna(**kwargs), pdf.dropna(**kwargs))


def test_dropna_refuses_what_it_does_not_support(sdf):
    with pytest.raises(spate.UnsupportedError, match="axis"):
        sdf.dropna(axis=1)
    with pytest.raises(spate.ConfigError):
        sdf.dropna(how="any", thresh=2)


def test_fillna_scalar_and_dict(sdf, pdf):
    assert_same(
        sdf.fillna({"f": -1.0, "s": "none", "n": 0}), pdf.fillna({"f": -1.0, "s": "none", "n": 0})
    )
    numeric = ["g", "i", "j", "n", "f"]
    assert_same(sdf[numeric].fillna(0), pdf[numeric].fillna(0))
    # A string fills only the string columns (pandas would put it in every column).
    got = sdf.fillna("x").to_pandas()
    assert got["s"].isna().sum() == 0 and got["f"].isna().sum() == pdf["f"].isna().sum()


def test_ffill_bfill_follow_the_sort(backend):
    pdf = timed_frame(3)
    sdf = backend.from_pandas(pdf).sort_values("id")
    for method in ("ffill", "bfill"):
        got = getattr(sdf[["id", "f", "s", "n"]], method)()
        expected = getattr(pdf[["id", "f", "s", "n"]], method)()
        assert_same(got, expected, sort=False)
    assert_same(sdf[["id", "f"]].ffill(limit=1), pdf[["id", "f"]].ffill(limit=1), sort=False)


def test_order_dependent_methods_need_a_sort(sdf):
    for call in (
        lambda: sdf.ffill(),
        lambda: sdf.tail(3),
        lambda: sdf.f.cumsum(),
        lambda: sdf.iloc[-1],
    ):
        with pytest.raises(spate.UnsupportedError, match="sort_values"):
            call()


def test_describe(sdf, pdf):
    got = sdf.describe().to_pandas()
    expected = pdf.describe()
    assert list(got.columns) == list(expected.columns)
    assert list(got.index) == list(expected.index)
    np.testing.assert_allclose(
        got.to_numpy(float), expected.to_numpy(float), rtol=1e-9, equal_nan=True
    )


def test_info_and_memory_usage(sdf, pdf):
    buffer = io.StringIO()
    sdf.info(buf=buffer)
    text = buffer.getvalue()
    assert f"{len(pdf)} rows" in text
    assert f"{pdf['f'].notna().sum()} non-null" in text
    usage = sdf.memory_usage()
    assert list(usage.index) == list(pdf.columns) and (usage > 0).all()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dropna", [True, False])
def test_value_counts(sdf, pdf, normalize, dropna):
    got = sdf.k.value_counts(normalize=normalize, dropna=dropna).to_pandas()
    expected = pdf.k.value_counts(normalize=normalize, dropna=dropna)
    pd.testing.assert_series_equal(
        got.iloc[:, 0].sort_index(), expected.sort_index(), check_dtype=False, check_names=False
    )
    assert list(got.iloc[:, 0]) == sorted(got.iloc[:, 0], reverse=True)
    frame = sdf.value_counts(["k", "b"], normalize=normalize, dropna=dropna).to_pandas()
    frame_expected = pdf.value_counts(["k", "b"], normalize=normalize, dropna=dropna)
    pd.testing.assert_series_equal(
        frame.iloc[:, 0].sort_index(),
        frame_expected.sort_index(),
        check_dtype=False,
        check_names=False,
    )


def test_unique(sdf, pdf):
    got = sdf.k.unique().to_pandas()["k"]
    assert sorted(got.dropna()) == sorted(pdf.k.dropna().unique())
    assert got.isna().sum() == 1


def test_duplicated(backend):
    pdf = timed_frame(5)
    sdf = backend.from_pandas(pdf).sort_values("id")
    for keep in ("first", "last", False):
        got = sdf.assign(d=sdf.duplicated(["k", "b"], keep=keep))[["id", "d"]]
        expected = pdf.assign(d=pdf.duplicated(["k", "b"], keep=keep))[["id", "d"]]
        assert_same(got, expected, sort=False)
        got = sdf.assign(d=sdf.k.duplicated(keep=keep))[["id", "d"]]
        expected = pdf.assign(d=pdf.k.duplicated(keep=keep))[["id", "d"]]
        assert_same(got, expected, sort=False)


def test_nlargest_nsmallest(sdf, pdf):
    assert_same(sdf.nlargest(7, ["i", "id"]), pdf.nlargest(7, ["i", "id"]), sort=False)
    assert_same(sdf.nsmallest(7, ["f", "id"]), pdf.nsmallest(7, ["f", "id"]), sort=False)
    got = sdf.f.nlargest(5).to_pandas()["f"].tolist()
    assert got == pdf.f.nlargest(5).tolist()
    got = sdf.i.nsmallest(4).to_pandas()["i"].tolist()
    assert got == pdf.i.nsmallest(4).tolist()


def test_head_tail(sdf, pdf):
    ordered = sdf.sort_values("id")
    expected = pdf.sort_values("id")
    assert_same(ordered.tail(6), expected.tail(6), sort=False)
    assert_same(ordered.head(4), expected.head(4), sort=False)
    assert_same(ordered[ordered.i > 0].tail(3), expected[expected.i > 0].tail(3), sort=False)


def test_sample_is_seeded_and_a_subset(sdf, pdf):
    first = sdf.sample(n=25, random_state=3).to_pandas()
    again = sdf.sample(n=25, random_state=3).to_pandas()
    other = sdf.sample(n=25, random_state=4).to_pandas()
    assert len(first) == 25
    pd.testing.assert_frame_equal(first, again)
    assert set(first["id"]) != set(other["id"])
    assert set(first["id"]) <= set(pdf["id"])
    assert len(first["id"].unique()) == 25
    assert len(sdf.sample(frac=0.1, random_state=1)) == round(0.1 * len(pdf))
    with pytest.raises(spate.UnsupportedError, match="replace"):
        sdf.sample(n=3, replace=True)
