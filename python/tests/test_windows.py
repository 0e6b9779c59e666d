"""Order-dependent methods against pandas, on ``cpu`` and ``emulated``: cumulative
aggregates, shift/diff/pct_change, rank, rolling (rows and time spans), expanding, and the
groupby row-wise methods (transform, cumsum, cumcount, shift, rank, rolling)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pandas as pd
import pytest

import spate
from conftest import assert_same, timed_frame

NUMERIC = ["id", "i", "f", "n"]


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    return timed_frame(11, 500)


@pytest.fixture(scope="module")
def ordered(backend, pdf):
    return backend.from_pandas(pdf.sample(frac=1, random_state=2)).sort_values("id")


@pytest.mark.parametrize("method", ["cumsum", "cummin", "cummax"])
def test_cumulative_frame(ordered, pdf, method):
    got = getattr(ordered[NUMERIC], method)()
    expected = getattr(pdf[NUMERIC], method)()
    assert_same(got, expected, sort=False)


def test_cumprod_and_columns(ordered, pdf):
    small = pdf.assign(x=(pdf.i % 3).astype("int64"), y=pdf.f / 10)
    sdf = ordered.assign(x=ordered.i % 3, y=ordered.f / 10)
    assert_same(
        sdf[["id", "x", "y"]].cumprod(), small[["id", "x", "y"]].cumprod(), sort=False, rtol=1e-9
    )
    got = sdf.assign(c=sdf.f.cumsum(), m=sdf.i.cummax(), s=sdf.n.cumsum())[["id", "c", "m", "s"]]
    expected = small.assign(c=small.f.cumsum(), m=small.i.cummax(), s=small.n.cumsum())[
        ["id", "c", "m", "s"]
    ]
    assert_same(got, expected, sort=False)


@pytest.mark.parametrize("periods", [1, 3, -2])
def test_shift_diff_pct_change(ordered, pdf, periods):
    got = ordered[["id", "i", "f", "s"]].shift(periods)[["i", "f", "s"]]
    assert_same(got, pdf[["i", "f", "s"]].shift(periods), sort=False)
    got = ordered.assign(d=ordered.i.diff(periods), p=ordered.f.pct_change(periods))[
        ["id", "d", "p"]
    ]
    expected = pdf.assign(d=pdf.i.diff(periods), p=pdf.f.pct_change(periods))[["id", "d", "p"]]
    assert_same(got, expected, sort=False)
    assert_same(
        ordered[["id", "i", "f"]].diff(periods), pdf[["id", "i", "f"]].diff(periods), sort=False
    )


@pytest.mark.parametrize("method", ["average", "min", "max", "first", "dense"])
@pytest.mark.parametrize("ascending", [True, False])
def test_rank(ordered, pdf, method, ascending):
    got = ordered.assign(r=ordered.i.rank(method=method, ascending=ascending))[["id", "r"]]
    expected = pdf.assign(r=pdf.i.rank(method=method, ascending=ascending))[["id", "r"]]
    assert_same(got, expected, sort=False)
    got = ordered.assign(r=ordered.f.rank(method=method, pct=True))[["id", "r"]]
    expected = pdf.assign(r=pdf.f.rank(method=method, pct=True))[["id", "r"]]
    assert_same(got, expected, sort=False, rtol=1e-12)


@pytest.mark.parametrize("how", ["sum", "mean", "min", "max", "std", "count"])
@pytest.mark.parametrize("window,min_periods", [(3, None), (5, 2)])
def test_rolling_rows(ordered, pdf, how, window, min_periods):
    got = getattr(ordered[["id", "i", "f"]].rolling(window, min_periods=min_periods), how)()
    expected = getattr(pdf[["id", "i", "f"]].rolling(window, min_periods=min_periods), how)()
    assert_same(got, expected, sort=False, rtol=1e-9)


@pytest.mark.parametrize("how", ["sum", "mean", "max", "count"])
def test_rolling_time_span(backend, pdf, how):
    sdf = backend.from_pandas(pdf).sort_values("ts")
    got = getattr(sdf[["ts", "i", "f"]].rolling("2h", on="ts"), how)()
    expected = getattr(pdf[["ts", "i", "f"]].rolling("2h", on="ts"), how)()
    assert_same(got, expected, sort=False, rtol=1e-9)


def test_expanding(ordered, pdf):
    for how in ("sum", "mean", "std"):
        got = getattr(ordered[["id", "i", "f"]].expanding(), how)()
        expected = getattr(pdf[["id", "i", "f"]].expanding(), how)()
        assert_same(got, expected, sort=False, rtol=1e-9)


@pytest.mark.parametrize("func", ["sum", "mean", "count", "min", "max", "std", "size"])
def test_groupby_transform(ordered, pdf, func):
    got = ordered.assign(t=ordered.groupby("k")["f"].transform(func))[["id", "t"]]
    expected = pdf.assign(t=pdf.groupby("k")["f"].transform(func))[["id", "t"]]
    assert_same(got, expected, sort=False, rtol=1e-9)


def test_groupby_row_methods(ordered, pdf):
    g, pg = ordered.groupby("k"), pdf.groupby("k")
    got = ordered.assign(
        c=g["i"].cumsum(),
        n=g.cumcount(),
        s=g["f"].shift(1),
        r=g["i"].rank(method="min"),
        m=g["f"].cummax(),
        d=g["i"].diff(),
    )[["id", "c", "n", "s", "r", "m", "d"]]
    expected = pdf.assign(
        c=pg["i"].cumsum(),
        n=pg.cumcount(),
        s=pg["f"].shift(1),
        r=pg["i"].rank(method="min"),
        m=pg["f"].cummax(),
        d=pg["i"].diff(),
    )[["id", "c", "n", "s", "r", "m", "d"]]
    assert_same(got, expected, sort=False)
    assert_same(g[["i", "f"]].cumsum(), pg[["i", "f"]].cumsum(), sort=False)


def test_groupby_rolling(ordered, pdf):
    got = ordered.groupby("k")[["i"]].rolling(3).sum().to_pandas()
    expected = pdf.groupby("k")[["i"]].rolling(3).sum()
    expected.index = expected.index.droplevel(1)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_windows_keep_the_order_and_explain(ordered, pdf):
    got = ordered.assign(c=ordered.i.cumsum())
    assert got._order == (("id", True, False),)
    assert "WindowAggExec" in got.explain() or "Window" in got.explain()
    assert_same(
        got.head(5)[["id", "c"]], pdf.assign(c=pdf.i.cumsum()).head(5)[["id", "c"]], sort=False
    )


def test_sort_index(backend, pdf):
    sdf = backend.from_pandas(pdf).set_index("id")
    got = sdf.sort_index(ascending=False).head(5).to_pandas()
    expected = pdf.set_index("id").sort_index(ascending=False).head(5)
    assert list(got.index) == list(expected.index)
    with pytest.raises(spate.PlanError, match="index"):
        backend.from_pandas(pdf).sort_index()


def test_groupby_fills_and_expanding(ordered, pdf):
    g, pg = ordered.groupby("k"), pdf.groupby("k")
    got = ordered.assign(a=g["f"].ffill(), b=g["f"].bfill())[["id", "a", "b"]]
    expected = pdf.assign(a=pg["f"].ffill(), b=pg["f"].bfill())[["id", "a", "b"]]
    assert_same(got, expected, sort=False)
    got = g[["f"]].expanding().mean().to_pandas()
    expected = pg[["f"]].expanding().mean()
    expected.index = expected.index.droplevel(1)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_rolling_edges(ordered, pdf):
    with pytest.raises(spate.ConfigError, match="min_periods"):
        ordered.f.rolling(3, min_periods=4)
    got = ordered.assign(r=ordered.f.rolling(2, min_periods=0).sum())[["id", "r"]]
    expected = pdf.assign(r=pdf.f.rolling(2, min_periods=0).sum())[["id", "r"]]
    assert_same(got, expected, sort=False)


def test_rolling_span_not_a_whole_number_of_units(backend):
    times = pd.to_datetime([0, 1, 2, 3, 5, 6], unit="s").astype("datetime64[s]")
    pdf = pd.DataFrame({"ts": times, "v": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]})
    sdf = backend.from_pandas(pdf).sort_values("ts")
    got = sdf.rolling("1500ms", on="ts").sum()
    assert_same(got, pdf.rolling("1500ms", on="ts").sum(), sort=False)


def test_rolling_runs_on_the_gpu_window_operator(backend, ordered):
    if backend.backend == "cpu":
        pytest.skip("placement is a GPU-backend question")
    frame = ordered.assign(
        m=ordered.f.rolling(3).mean(),
        s=ordered.i.rolling(5, min_periods=1).sum(),
        x=ordered.i.rolling(4).max(),
        c=ordered.f.rolling(3).count(),
        u=ordered.i.cumsum(),
    )
    windows = [line for line in frame.explain().splitlines() if "WindowAggExec" in line]
    assert windows and all("[GPU]" in line for line in windows), windows


def test_selections_keep_the_sort_keys_hidden(ordered, pdf):
    # pandas' habit: sort, pick the columns, then the order-dependent method.
    picked = ordered[["i", "f"]]
    assert picked.columns == ["i", "f"] and picked.schema.names == ["i", "f"]
    assert_same(picked.cumsum(), pdf[["i", "f"]].cumsum(), sort=False)
    assert_same(picked.rolling(3).mean(), pdf[["i", "f"]].rolling(3).mean(), sort=False, rtol=1e-9)
    assert_same(picked[picked.i > 0].shift(1), pdf[["i", "f"]][pdf.i > 0].shift(1), sort=False)
    assert_same(picked.tail(4), pdf[["i", "f"]].tail(4), sort=False)
    assert_same(picked.head(10).ffill(), pdf[["i", "f"]].head(10).ffill(), sort=False)
    assert_same(
        ordered.drop(["id", "ts", "tz"]).iloc[-2:],
        pdf.drop(columns=["id", "ts", "tz"]).iloc[-2:],
        sort=False,
    )
    assert_same(
        picked.assign(c=picked.i.cumsum())[["c"]], pdf.assign(c=pdf.i.cumsum())[["c"]], sort=False
    )
    assert pa.table(picked).column_names == ["i", "f"]


def test_hidden_keys_through_reset_index_rename_melt_iloc(ordered, pdf):
    picked = ordered[["i", "f"]]
    assert_same(picked.reset_index().cumsum(), pdf[["i", "f"]].cumsum(), sort=False)
    renamed = picked.rename(columns={"i": "id"})
    assert renamed.columns == ["id", "f"]
    expected = pdf[["i", "f"]].rename(columns={"i": "id"})
    assert_same(renamed.cumsum(), expected.cumsum(), sort=False)
    assert_same(picked.iloc[3:9:2], pdf[["i", "f"]].iloc[3:9:2], sort=False)
    assert_same(picked.iloc[[4, 1]].reset_index(), pdf[["i", "f"]].iloc[[4, 1]], sort=False)
    melted = ordered[["i", "n"]].fillna(0).melt()
    assert_same(melted, pdf[["i", "n"]].fillna(0).melt(), sort=False)
    rolled = ordered[["k", "id", "i"]].groupby("k").rolling(2).sum().to_pandas()
    expected = pdf[["k", "id", "i"]].groupby("k").rolling(2).sum()
    expected.index = expected.index.droplevel(1)
    pd.testing.assert_frame_equal(rolled, expected, check_dtype=False)
