"""groupby against pandas on random data with null keys and null values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import spate
from conftest import assert_same, random_frame

NUMERIC = ["id", "g", "i", "j", "n", "f", "b"]


def test_headline_groupby_sum():
    # The API's promise, verbatim: the module-level functions, pandas' own comparison.
    df = random_frame(7).rename(columns={"i": "v"})
    pd.testing.assert_frame_equal(
        spate.from_pandas(df).groupby("k").agg({"v": "sum"}).to_pandas(),
        df.groupby("k").agg({"v": "sum"}),
    )
    df = pd.DataFrame({"k": ["b", "a", None, "a", "b", "c"], "v": [1, 2, 3, 4, 5, 6]})
    pd.testing.assert_frame_equal(
        spate.from_pandas(df).groupby("k").agg({"v": "sum"}).to_pandas(),
        df.groupby("k").agg({"v": "sum"}),
    )


@pytest.mark.parametrize("how", ["sum", "mean", "count", "min", "max", "nunique", "median"])
def test_agg_dict_one_function(sdf, pdf, how):
    spec = {"i": how, "f": how, "n": how}
    got = sdf.groupby("k").agg(spec).to_pandas()
    expected = pdf.groupby("k").agg(spec)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_agg_std_var(sdf, pdf):
    spec = {"i": "std", "f": "var"}
    got = sdf.groupby("k").agg(spec).to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k").agg(spec), check_dtype=False)


def test_agg_strings_and_bools(sdf, pdf):
    spec = {"s": "min", "b": "sum"}
    got = sdf.groupby("k").agg(spec).to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k").agg(spec), check_dtype=False)
    spec = {"s": "max", "b": "mean"}
    got = sdf.groupby("g").agg(spec).to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("g").agg(spec), check_dtype=False)


def test_agg_string_function(sdf, pdf):
    got = sdf.groupby("k")[["i", "f"]].agg("sum").to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k")[["i", "f"]].agg("sum"), check_dtype=False)
    got = sdf.groupby("k")["i"].agg("max").to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k")[["i"]].agg("max"), check_dtype=False)


def test_agg_list(sdf, pdf):
    # Arrow has one header level: the columns are column_function; to_pandas shows pandas'
    # two-level (column, function) header.
    frame = sdf.groupby("k")[["i", "f"]].agg(["sum", "max", "count"])
    assert frame.columns == ["i_sum", "i_max", "i_count", "f_sum", "f_max", "f_count"]
    assert frame.to_arrow().column_names == ["k", *frame.columns]
    expected = pdf.groupby("k")[["i", "f"]].agg(["sum", "max", "count"])
    pd.testing.assert_frame_equal(frame.to_pandas(), expected, check_dtype=False)
    # The header survives a sort and a head, and goes with a renamed column.
    got = frame.sort_values("i_sum").head(3).to_pandas()
    pd.testing.assert_frame_equal(
        got, expected.sort_values(("i", "sum")).head(3), check_dtype=False
    )
    flat = frame.rename({"i_sum": "total"}).to_pandas()
    assert list(flat.columns) == ["total", "i_max", "i_count", "f_sum", "f_max", "f_count"]


def test_agg_dict_of_lists(sdf, pdf):
    spec = {"i": ["min", "max"], "f": ["mean"], "s": ["count", "nunique"]}
    got = sdf.groupby("k").agg(spec).to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k").agg(spec), check_dtype=False)
    # A list among the functions gives every column the two-level header, as in pandas.
    spec = {"i": "sum", "f": ["min", "max"]}
    got = sdf.groupby("k").agg(spec).to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k").agg(spec), check_dtype=False)


def test_named_aggregation(sdf, pdf):
    named = {
        "total": ("i", "sum"),
        "avg_f": ("f", "mean"),
        "rows": ("id", "size"),
        "hi": ("s", "max"),
    }
    got = sdf.groupby("k").agg(**named).to_pandas()
    expected = pdf.groupby("k").agg(**named)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


@pytest.mark.parametrize("method", ["sum", "mean", "median", "std", "var"])
def test_numeric_shortcuts(sdf, pdf, method):
    got = getattr(sdf.groupby("k"), method)().to_pandas()
    expected = getattr(pdf[["k", *NUMERIC]].groupby("k"), method)()
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


@pytest.mark.parametrize("method", ["count", "min", "max", "nunique"])
def test_all_column_shortcuts(sdf, pdf, method):
    got = getattr(sdf.groupby("k"), method)().to_pandas()
    expected = getattr(pdf.groupby("k"), method)()
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_size(sdf, pdf):
    # pandas returns a Series named by nothing; Spate a frame with one column, "size".
    got = sdf.groupby("k").size().to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k").size().to_frame("size"), check_dtype=False)
    got = sdf.groupby("k", as_index=False).size().to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k", as_index=False).size(), check_dtype=False)


def test_sum_of_all_null_group_is_zero(session):
    pdf = pd.DataFrame({"k": ["a", "a", "b"], "f": [np.nan, np.nan, 1.0]})
    got = session.from_pandas(pdf).groupby("k").sum().to_pandas()
    pd.testing.assert_frame_equal(got, pdf.groupby("k").sum(), check_dtype=False)
    got = session.from_pandas(pdf).groupby("k").agg({"f": ["sum", "mean", "count"]}).to_pandas()
    expected = pdf.groupby("k").agg({"f": ["sum", "mean", "count"]})
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_multiple_keys(sdf, pdf):
    spec = {"i": "sum", "f": "max", "s": "count"}
    got = sdf.groupby(["k", "g"]).agg(spec).to_pandas()
    expected = pdf.groupby(["k", "g"]).agg(spec)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    got = sdf.groupby(["b", "j"]).agg(spec).to_pandas()
    expected = pdf.groupby(["b", "j"]).agg(spec)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_as_index_false(sdf, pdf):
    spec = {"i": "sum", "f": "mean"}
    got = sdf.groupby("k", as_index=False).agg(spec).to_pandas()
    expected = pdf.groupby("k", as_index=False).agg(spec)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    got = sdf.groupby(["k", "b"], as_index=False).sum().to_pandas()
    expected = pdf[["k", *NUMERIC]].groupby(["k", "b"], as_index=False).sum()
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_dropna_false(sdf, pdf):
    spec = {"i": "sum", "f": "count"}
    got = sdf.groupby("k", dropna=False).agg(spec).to_pandas()
    expected = pdf.groupby("k", dropna=False).agg(spec)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    got = sdf.groupby(["k", "g"], dropna=False).agg(spec).to_pandas()
    expected = pdf.groupby(["k", "g"], dropna=False).agg(spec)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_sort_false(sdf, pdf):
    # pandas keeps first-appearance order; Spate leaves the order undefined: compare sorted.
    spec = {"i": "sum", "s": "max"}
    got = sdf.groupby("k", sort=False, as_index=False).agg(spec)
    expected = pdf.groupby("k", sort=False, as_index=False).agg(spec)
    assert_same(got, expected)
    got = sdf.groupby("g", sort=False).agg(spec)
    assert got.index_columns == ["g"]
    assert_same(got, pdf.groupby("g", sort=False).agg(spec))


def test_groupby_then_filter_sort_head(sdf, pdf):
    got = (
        sdf.groupby("g", as_index=False)
        .agg(total=("i", "sum"), m=("f", "max"))
        .filter("total > 0")
        .sort_values("total", ascending=False)
        .head(3)
        .to_pandas()
    )
    expected = (
        pdf.groupby("g", as_index=False)
        .agg(total=("i", "sum"), m=("f", "max"))
        .query("total > 0")
        .sort_values("total", ascending=False)
        .head(3)
        .reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_groupby_of_empty_frame(session, pdf):
    empty = session.from_pandas(pdf.iloc[:0])
    got = empty.groupby("k").agg({"i": "sum", "s": "max"}).to_pandas()
    expected = pdf.iloc[:0].groupby("k").agg({"i": "sum", "s": "max"})
    assert list(got.columns) == list(expected.columns) and len(got) == 0
    assert got.index.name == "k"
    assert len(empty.groupby(["k", "g"], as_index=False).size().to_pandas()) == 0


def test_groupby_errors(sdf):
    with pytest.raises(spate.PlanError):
        sdf.groupby("nope")
    with pytest.raises(spate.PlanError):
        sdf.groupby("k")["nope"]
    with pytest.raises(spate.UnsupportedError):
        sdf.groupby("k").agg({"i": "mode"})
    with pytest.raises(spate.PlanError):
        sdf.groupby("k").agg({"nope": "sum"})
    with pytest.raises(spate.PlanError):
        sdf.groupby("k").agg({"s": "sum"}).to_pandas()
    # pandas can hold "k" as both the index and a column; a Spate frame cannot.
    with pytest.raises(spate.PlanError, match="named aggregation"):
        sdf.groupby("k").agg({"k": "count"})


def test_aggregating_the_key_by_name(sdf, pdf):
    got = sdf.groupby("k").agg(k_count=("k", "count"), n=("id", "size")).to_pandas()
    expected = pdf.groupby("k").agg(k_count=("k", "count"), n=("id", "size"))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
