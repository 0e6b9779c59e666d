"""Selection, accessors, reshaping, I/O, host crossings and Python functions against
pandas, on ``cpu`` and ``emulated``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import spate
from conftest import assert_same, random_frame, timed_frame


@pytest.fixture(scope="module")
def pdf() -> pd.DataFrame:
    return timed_frame(21, 400)


@pytest.fixture(scope="module")
def sdf(backend, pdf):
    return backend.from_pandas(pdf)


# ----- selection ---------------------------------------------------------------------------


def test_iloc(sdf, pdf):
    ordered = sdf.sort_values("id")
    assert_same(ordered.iloc[5], pdf.iloc[[5]], sort=False)
    assert_same(ordered.iloc[-3:], pdf.iloc[-3:], sort=False)
    assert_same(ordered.iloc[10:40:7], pdf.iloc[10:40:7], sort=False)
    assert_same(ordered.iloc[[0, 7, -1]], pdf.iloc[[0, 7, -1]], sort=False)
    assert_same(ordered.iloc[2:6, 1:4], pdf.iloc[2:6, 1:4], sort=False)
    assert ordered.iloc[:, 3].name == pdf.columns[3]


def test_loc(sdf, pdf):
    assert_same(sdf.loc[sdf.i > 10, ["id", "f"]], pdf.loc[pdf.i > 10, ["id", "f"]])
    indexed = sdf.set_index("id")
    expected = pdf.set_index("id")
    got = indexed.loc[5:20].to_pandas().sort_index()
    pd.testing.assert_frame_equal(
        got.reset_index(), expected.loc[5:20].sort_index().reset_index(), check_dtype=False
    )
    assert indexed.loc[[3, 9]].to_pandas().sort_index().index.tolist() == [3, 9]
    with pytest.raises(spate.PlanError, match="index"):
        sdf.loc[3]


def test_where_mask_clip(sdf, pdf):
    cols = ["id", "i", "f"]
    assert_same(sdf[cols].where(sdf.i > 0), pdf[cols].where(pdf.i > 0, axis=0))
    assert_same(sdf[cols].mask(sdf.f > 0, 0), pdf[cols].mask(pdf.f > 0, 0, axis=0))
    assert_same(sdf[cols].clip(-5, 5), pdf[cols].clip(-5, 5))
    got = sdf.assign(c=sdf.f.clip(lower=0), w=sdf.i.where(sdf.b, -1), m=sdf.f.mask(sdf.i < 0))
    expected = pdf.assign(c=pdf.f.clip(lower=0), w=pdf.i.where(pdf.b, -1), m=pdf.f.mask(pdf.i < 0))
    assert_same(got[["id", "c", "w", "m"]], expected[["id", "c", "w", "m"]])
    assert_same(
        sdf[sdf.i.between(-3, 3, inclusive="left")], pdf[pdf.i.between(-3, 3, inclusive="left")]
    )


def test_query_and_eval(sdf, pdf):
    limit = 7
    keys = ["a", "c"]
    assert_same(sdf.query("i > @limit and k in @keys"), pdf.query("i > @limit and k in @keys"))
    assert_same(sdf.query("not b or -3 < i <= 2"), pdf.query("not b or -3 < i <= 2"))
    assert_same(sdf.query("k == 'a' | i % 4 == 1"), pdf.query("k == 'a' | i % 4 == 1"))
    got = sdf.eval("r = i / 4 + f\nq = r * 2")[["id", "r", "q"]]
    expected = pdf.eval("r = i / 4 + f\nq = r * 2")[["id", "r", "q"]]
    assert_same(got, expected)
    got = sdf.assign(e=sdf.eval("2 ** (i / 10) - `f`"))[["id", "e"]]
    assert_same(got, pdf.assign(e=pdf.eval("2 ** (i / 10) - `f`"))[["id", "e"]])
    with pytest.raises(spate.PlanError, match="@nowhere"):
        sdf.query("i > @nowhere")


# ----- accessors ---------------------------------------------------------------------------


def test_dt_fields(sdf, pdf):
    fields = [
        "year",
        "month",
        "day",
        "hour",
        "minute",
        "second",
        "day_of_week",
        "day_of_year",
        "quarter",
    ]
    got = sdf.assign(**{f: getattr(sdf.ts.dt, f) for f in fields})[["id", *fields]]
    expected = pdf.assign(**{f: getattr(pdf.ts.dt, f) for f in fields})[["id", *fields]]
    assert_same(got, expected)
    got = sdf.assign(d=sdf.ts.dt.date)[["id", "d"]].to_pandas()
    assert list(got.sort_values("id")["d"]) == list(pdf.sort_values("id").ts.dt.date)


@pytest.mark.parametrize("freq", ["h", "15min", "D"])
def test_dt_rounding(sdf, pdf, freq):
    got = sdf.assign(a=sdf.ts.dt.floor(freq), b=sdf.ts.dt.ceil(freq), c=sdf.ts.dt.round(freq))
    expected = pdf.assign(a=pdf.ts.dt.floor(freq), b=pdf.ts.dt.ceil(freq), c=pdf.ts.dt.round(freq))
    assert_same(got[["id", "a", "b", "c"]], expected[["id", "a", "b", "c"]])


def test_dt_strftime_and_zones(sdf, pdf):
    got = sdf.assign(s=sdf.ts.dt.strftime("%Y-%m-%d %H:%M"))[["id", "s"]]
    expected = pdf.assign(s=pdf.ts.dt.strftime("%Y-%m-%d %H:%M"))[["id", "s"]]
    assert_same(got, expected)
    got = sdf.assign(z=sdf.tz.dt.tz_convert("Europe/Berlin").dt.hour, n=sdf.tz.dt.tz_localize(None))
    expected = pdf.assign(
        z=pdf.tz.dt.tz_convert("Europe/Berlin").dt.hour, n=pdf.tz.dt.tz_localize(None)
    )
    assert_same(got[["id", "z", "n"]], expected[["id", "z", "n"]])
    got = sdf.assign(l=sdf.ts.dt.tz_localize("UTC"))[["id", "l"]].to_pandas()
    assert (
        got.sort_values("id")["l"].reset_index(drop=True)
        == pdf.sort_values("id").ts.dt.tz_localize("UTC").reset_index(drop=True)
    ).all()


def test_str_methods(sdf, pdf):
    s, p = sdf.s.str, pdf.s.str
    got = sdf.assign(
        a=s.slice(1, 4),
        b=s.slice(-3),
        c=s.pad(9, fillchar="*"),
        d=s.zfill(8),
        e=s.count("a"),
        f2=s.find("e"),
        g=s.contains("^[a-c]", regex=True, na=False),
        h=s.replace(r"(\w)(\d)", r"\2\1", regex=True),
        i2=s.center(12, "-"),
        j2=s.cat(sdf.k, sep="/"),
    )
    expected = pdf.assign(
        a=p.slice(1, 4),
        b=p.slice(-3),
        c=p.pad(9, fillchar="*"),
        d=p.zfill(8),
        e=p.count("a"),
        f2=p.find("e"),
        g=p.contains("^[a-c]", regex=True, na=False),
        h=p.replace(r"(\w)(\d)", r"\2\1", regex=True),
        i2=p.center(12, "-"),
        j2=p.cat(pdf.k, sep="/"),
    )
    columns = ["id", "a", "b", "c", "d", "e", "f2", "g", "h", "i2", "j2"]
    assert_same(got[columns], expected[columns])


def test_str_split_and_extract(sdf, pdf):
    got = sdf.s.str.split(" ", expand=True).to_pandas()
    expected = pdf.s.str.split(" ", expand=True)
    expected.columns = [str(c) for c in expected.columns]
    assert_same(got, expected)
    got = sdf.s.str.split("a", n=1, expand=True).to_pandas()
    expected = pdf.s.str.split("a", n=1, expand=True)
    expected.columns = [str(c) for c in expected.columns]
    assert_same(got, expected)
    lists = sdf.s.str.split("a").to_pandas()
    assert sorted(map(str, (list(v) if v is not None else None for v in lists))) == sorted(
        map(str, (v if isinstance(v, list) else None for v in pdf.s.str.split("a")))
    )
    got = sdf.s.str.extract(r"(?P<word>[a-z]+)(\d+)").to_pandas()
    expected = pdf.s.str.extract(r"(?P<word>[a-z]+)(\d+)")
    expected.columns = [str(c) for c in expected.columns]
    assert_same(got, expected)


# ----- reshaping ---------------------------------------------------------------------------


def test_concat_rows_and_columns(backend, pdf):
    a, b = pdf.iloc[:50][["id", "i", "s"]], pdf.iloc[50:90][["id", "f", "s"]]
    sa, sb = backend.from_pandas(a), backend.from_pandas(b)
    assert_same(spate.concat([sa, sb]), pd.concat([a, b]))
    assert_same(spate.concat([sa, sb], join="inner"), pd.concat([a, b], join="inner"))
    b2 = b.rename(columns={"id": "id2", "s": "s2"})
    left = backend.from_pandas(a).sort_values("id")
    right = backend.from_pandas(b2).sort_values("id2")
    got = spate.concat([left, right], axis=1)
    expected = pd.concat(
        [a.sort_values("id").reset_index(drop=True), b2.sort_values("id2").reset_index(drop=True)],
        axis=1,
    )
    assert_same(got, expected, sort=False)


def test_melt_pivot_explode(backend, pdf):
    sdf = backend.from_pandas(pdf)
    assert_same(
        sdf.melt(id_vars=["id"], value_vars=["i", "f"]),
        pdf.melt(id_vars=["id"], value_vars=["i", "f"]),
    )
    got = sdf.pivot_table(values="f", index="k", columns="b", aggfunc="sum").to_pandas()
    expected = pdf.pivot_table(values="f", index="k", columns="b", aggfunc="sum")
    expected.columns = [str(c) for c in expected.columns]
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_names=False)
    lists = pd.DataFrame({"id": [1, 2, 3, 4], "v": [[1, 2], None, [], [3]]})
    got = backend.from_pandas(lists).explode("v")
    assert_same(got, lists.explode("v").astype({"v": "float64"}))


@pytest.mark.parametrize("direction", ["backward", "forward"])
@pytest.mark.parametrize("exact", [True, False])
def test_merge_asof(backend, direction, exact):
    rng = np.random.default_rng(4)
    trades = pd.DataFrame(
        {
            "t": np.sort(rng.choice(1000, 120, replace=False)),
            "k": rng.choice(["a", "b", "c"], 120),
            "q": rng.integers(1, 9, 120),
        }
    )
    quotes = pd.DataFrame(
        {
            "t": np.sort(rng.choice(1000, 80, replace=False)),
            "k": rng.choice(["a", "b", "c"], 80),
            "price": rng.normal(100, 5, 80),
        }
    )
    quotes.loc[3, "price"] = np.nan
    got = spate.merge_asof(
        backend.from_pandas(trades),
        backend.from_pandas(quotes),
        on="t",
        by="k",
        direction=direction,
        allow_exact_matches=exact,
    )
    expected = pd.merge_asof(
        trades, quotes, on="t", by="k", direction=direction, allow_exact_matches=exact
    )
    assert_same(got, expected, sort=["t"])


# ----- I/O, host crossings and Python functions --------------------------------------------


def test_writers_round_trip(sdf, pdf, tmp_path):
    frame = sdf[["id", "i", "f", "s"]]
    frame.to_parquet(tmp_path / "out.parquet")
    assert_same(pd.read_parquet(tmp_path / "out.parquet"), pdf[["id", "i", "f", "s"]])
    frame.to_csv(tmp_path / "out.csv")
    back = pd.read_csv(tmp_path / "out.csv")
    assert_same(back[["id", "i"]], pdf[["id", "i"]])
    frame.to_json(tmp_path / "out.json")
    rows = [json.loads(line) for line in (tmp_path / "out.json").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(pdf["id"])
    assert frame.to_csv().splitlines()[0].replace('"', "") == "id,i,f,s"


def test_readers_take_globs_and_lists(backend, pdf, tmp_path):
    for part in range(3):
        pdf.iloc[part * 100 : (part + 1) * 100].to_parquet(tmp_path / f"part{part}.parquet")
    got = backend.read_parquet(str(tmp_path / "part*.parquet"))
    assert len(got) == 300
    got = backend.read_parquet([tmp_path / "part0.parquet", tmp_path / "part2.parquet"])
    assert sorted(got.to_pandas()["id"]) == sorted(
        pd.concat([pdf.iloc[:100], pdf.iloc[200:300]])["id"]
    )


def test_to_numpy_array_and_dlpack(sdf, pdf):
    ordered = sdf.sort_values("id")
    expected = pdf.sort_values("id")
    np.testing.assert_array_equal(ordered.i.to_numpy(), expected.i.to_numpy())
    np.testing.assert_array_equal(
        np.asarray(ordered[["id", "i"]]), expected[["id", "i"]].to_numpy()
    )
    np.testing.assert_array_equal(np.from_dlpack(ordered.i), expected.i.to_numpy())
    with pytest.raises(spate.UnsupportedError, match="nulls"):
        np.from_dlpack(ordered.f)
    np.testing.assert_array_equal(ordered.values[:, 0], expected["id"].to_numpy())


def test_map_apply_pipe(sdf, pdf):
    got = sdf.assign(
        m=sdf.k.map({"a": 1, "b": 2}),
        f2=sdf.i.map(lambda v: v * 2 + 1),
        g=sdf.f.apply(np.abs),
        r=sdf.apply(
            lambda row: f"{row['k'] if isinstance(row['k'], str) else None}:{row['i']}", axis=1
        ),
    )
    expected = pdf.assign(
        m=pdf.k.map({"a": 1, "b": 2}),
        f2=pdf.i.map(lambda v: v * 2 + 1),
        g=pdf.f.apply(np.abs),
        r=pdf.apply(
            lambda row: f"{row['k'] if isinstance(row['k'], str) else None}:{row['i']}", axis=1
        ),
    )
    assert_same(got[["id", "m", "f2", "g", "r"]], expected[["id", "m", "f2", "g", "r"]])
    assert "python:<lambda>" in sdf.assign(x=sdf.i.map(lambda v: v)).explain()
    assert sdf.pipe(lambda d, n: d.head(n), 3).shape == (3, len(pdf.columns))


def test_assign_reads_the_frame_as_it_was(sdf, pdf):
    # pandas evaluates the values before assigning; a callable sees the earlier assignments.
    got = sdf.assign(i=sdf.i + 1, j=sdf.i * 2, k2=lambda d: d.i * 10)[["id", "i", "j", "k2"]]
    expected = pdf.assign(i=pdf.i + 1, j=pdf.i * 2, k2=lambda d: d.i * 10)[["id", "i", "j", "k2"]]
    assert_same(got, expected)


def test_column_reductions(sdf, pdf):
    s = sdf.sort_values("id").head(12)
    small = pdf.sort_values("id").head(12)
    assert s.i.prod() == small.i.prod()
    assert s.f.prod() == pytest.approx(small.f.prod())
    assert s.f.median() == pytest.approx(small.f.median())
    assert s.f.std() == pytest.approx(small.f.std())
    assert s.f.var(ddof=0) == pytest.approx(small.f.var(ddof=0))
    for q in (0.1, 0.5, 0.9):
        assert s.f.quantile(q) == pytest.approx(small.f.quantile(q))


def test_more_string_and_time_methods(sdf, pdf):
    s, p = sdf.s.str, pdf.s.str
    got = sdf.assign(
        a=s.get(1),
        b=s.title(),
        c=sdf.k.str.lstrip("a"),
        d=s.rstrip("0123456789"),
        e=s.ljust(8, "."),
        f2=s.rsplit(" ", expand=False),
        n=sdf.ts.dt.normalize(),
    )
    expected = pdf.assign(
        a=p.get(1),
        b=p.title(),
        c=pdf.k.str.lstrip("a"),
        d=p.rstrip("0123456789"),
        e=p.ljust(8, "."),
        f2=p.rsplit(" ", expand=False),
        n=pdf.ts.dt.normalize(),
    )
    columns = ["id", "a", "b", "c", "d", "e", "n"]
    assert_same(got[columns], expected[columns])
    with pytest.raises(spate.UnsupportedError, match="n="):
        s.rsplit(" ", n=1, expand=True)


def test_frame_map_and_na_action(sdf, pdf):
    got = sdf[["id", "i", "n"]].map(lambda v: v * 3, na_action="ignore")
    assert_same(got, pdf[["id", "i", "n"]].map(lambda v: v * 3, na_action="ignore"))
    got = sdf.assign(m=sdf.s.map(len, na_action="ignore"))[["id", "m"]]
    expected = pdf.assign(m=pdf.s.map(len, na_action="ignore"))[["id", "m"]]
    assert_same(got, expected)
    with pytest.raises(spate.UnsupportedError, match="axis"):
        sdf.apply(sum, axis=0)


def test_to_cupy_needs_cupy(sdf):
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(spate.UnsupportedError, match="CuPy"):
            sdf.i.to_cupy()
    else:  # pragma: no cover - only with CuPy and a GPU
        assert sdf.i.to_cupy().shape == (len(sdf),)


def test_python_functions_run_on_the_cpu(backend, pdf):
    sdf = backend.from_pandas(pdf)
    plan = sdf.assign(x=sdf.i.map(lambda v: v + 1)).explain()
    assert "python:<lambda>" in plan
    if backend.backend != "cpu":
        line = next(
            line for line in plan.splitlines() if "python:<lambda>" in line and "Exec" in line
        )
        assert "[CPU" in line, line


# ----- edges found in review ---------------------------------------------------------------


def test_window_columns_in_masks_reductions_and_results(backend, pdf):
    sdf = backend.from_pandas(pdf).sort_values("id")
    got = sdf[~sdf.duplicated(["k", "b"])]
    assert_same(got, pdf[~pdf.duplicated(["k", "b"])], sort=False)
    got = sdf[sdf.i.shift(1) > sdf.i]
    assert_same(got, pdf[pdf.i.shift(1) > pdf.i], sort=False)
    assert sdf.i.diff().mean() == pytest.approx(pdf.i.diff().mean())
    ranks = sdf.i.rank(method="first").to_pandas().tolist()
    assert ranks == pdf.i.rank(method="first").tolist()
    got = sdf[["id", "i"]].where(sdf.i.shift(1) > 0, -1)
    expected = pdf[["id", "i"]].where(pdf.i.shift(1) > 0, -1, axis=0)
    assert_same(got, expected, sort=False)
    counts = sdf.assign(c=sdf.groupby("k").cumcount()).to_arrow()
    assert counts.schema.field("c").type == pa.int64()


def test_iloc_lists_keep_their_order(backend, pdf):
    sdf = backend.from_pandas(pdf).sort_values("id")
    assert_same(sdf.iloc[[7, 0, 7, -1]], pdf.iloc[[7, 0, 7, -1]], sort=False)
    with pytest.raises(IndexError):
        sdf.iloc[[0, len(pdf)]]


def test_query_eval_edges(sdf, pdf):
    frame = pdf.assign(mail=pdf.k + "@x.com")
    s = sdf.assign(mail=sdf.k + "@x.com")
    assert_same(s.query("mail == 'a@x.com'"), frame.query("mail == 'a@x.com'"))
    values = np.array([1, 2, 3])
    assert_same(sdf.query("i in @values"), pdf.query("i in @values"))
    assert_same(
        sdf.assign(e=sdf.eval("i <= 3"))[["id", "e"]], pdf.assign(e=pdf.eval("i <= 3"))[["id", "e"]]
    )
    with pytest.raises(spate.UnsupportedError, match="right"):
        sdf.query("i in n")


def test_tz_aware_rounding_keeps_the_instant(backend, pdf):
    local = pdf.assign(tz=pdf.tz.dt.tz_convert("America/New_York"))
    sdf = backend.from_pandas(local)
    for how in ("floor", "ceil", "round"):
        got = sdf.assign(r=getattr(sdf.tz.dt, how)("h"))[["id", "r"]]
        expected = local.assign(r=getattr(local.tz.dt, how)("h"))[["id", "r"]]
        assert_same(got, expected)


def test_merge_asof_null_on_and_concat_types(backend):
    left = pd.DataFrame({"t": [1.0, 5.0, None], "x": [1, 2, 3]})
    right = pd.DataFrame({"t": [0.0, None, 4.0], "y": [10, 20, 30]})
    got = spate.merge_asof(backend.from_pandas(left), backend.from_pandas(right), on="t")
    rows = got.to_pandas().sort_values("x")
    assert rows["y"].tolist()[:2] == [10, 30] and pd.isna(rows["y"].tolist()[2])
    a = backend.from_pandas(pd.DataFrame({"v": [None, None]}, dtype=object))
    b = backend.from_pandas(pd.DataFrame({"v": [1.5, 2.5]}))
    assert sorted(spate.concat([a, b]).to_pandas()["v"].dropna()) == [1.5, 2.5]
    c = backend.from_pandas(pd.DataFrame({"v": ["x"]}))
    with pytest.raises(spate.PlanError, match="do not combine"):
        spate.concat([b, c])


def test_split_refuses_what_pandas_reads_as_a_regex(sdf):
    with pytest.raises(spate.UnsupportedError, match="regular expression"):
        sdf.s.str.split(r"\s+")
    assert sdf.s.str.split(r"\s+", regex=False) is not None


def test_text_writers_match_the_files(sdf, tmp_path):
    frame = sdf[["id", "i", "ts"]].sort_values("id").head(5)
    frame.to_csv(tmp_path / "a.csv")
    assert frame.to_csv() == (tmp_path / "a.csv").read_text()
    frame.to_json(tmp_path / "a.json")
    assert frame.to_json() == (tmp_path / "a.json").read_text()
