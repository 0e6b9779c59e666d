"""DataFrame operations against pandas on random data with nulls: selection, filtering,
assign, sorting, head, drop_duplicates, rename, shape and schema, explain, repr and empty
frames."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import spate
from conftest import assert_same, random_frame


# ----- selection ---------------------------------------------------------------------------


def test_column_selection(sdf, pdf):
    for name in ["i", "f", "s", "k", "b", "n"]:
        got = sdf[name].to_pandas()
        assert got.name == name
        assert_same(got.to_frame(), pdf[[name]], sort=False)


def test_attribute_access_is_the_column(sdf, pdf):
    assert_same(sdf.i.to_pandas().to_frame(), pdf[["i"]], sort=False)


def test_select_columns(sdf, pdf):
    got = sdf[["s", "i", "f"]]
    assert got.columns == ["s", "i", "f"]
    assert_same(got, pdf[["s", "i", "f"]], sort=False)


def test_mask(sdf, pdf):
    assert_same(sdf[sdf.i > 10], pdf[pdf.i > 10])
    assert_same(sdf[sdf["f"] <= 0], pdf[pdf["f"] <= 0])
    assert_same(sdf[sdf.b], pdf[pdf.b])
    assert_same(sdf[~sdf.b], pdf[~pdf.b])


def test_mask_with_nulls_drops_them_like_pandas(sdf, pdf):
    # pandas: NaN > 0 is False; Spate: null > 0 is null. Both drop the row.
    assert_same(sdf[sdf.f > 0], pdf[pdf.f > 0])
    assert_same(sdf[sdf.k == "a"], pdf[pdf.k == "a"])
    assert_same(sdf[sdf.n > 0], pdf[(pdf.n > 0).fillna(False)])


def test_combined_masks(sdf, pdf):
    assert_same(
        sdf[(sdf.i > 0) & (sdf.f < 5) | (sdf.k == "b")],
        pdf[(pdf.i > 0) & (pdf.f < 5) | (pdf.k == "b")],
    )
    assert_same(sdf[~(sdf.i > 0) & sdf.b], pdf[~(pdf.i > 0) & pdf.b])


def test_filter_column_and_sql_string(sdf, pdf):
    expected = pdf[(pdf.i > 0) & pdf.f.notna() & (pdf.f < 3)]
    assert_same(sdf.filter((sdf.i > 0) & sdf.f.notnull() & (sdf.f < 3)), expected)
    assert_same(sdf.filter("i > 0 AND f IS NOT NULL AND f < 3"), expected)
    assert_same(sdf.query("k = 'c' OR j >= 8"), pdf[(pdf.k == "c") | (pdf.j >= 8)])


def test_filter_rejects_other_types(sdf):
    with pytest.raises(TypeError):
        sdf.filter(3)


def test_slice(sdf, pdf):
    assert len(sdf[:7]) == 7
    assert len(sdf[5:12]) == 7
    assert len(sdf[len(pdf) - 3 :]) == 3
    with pytest.raises(spate.UnsupportedError):
        sdf[::2]


# ----- assign ------------------------------------------------------------------------------


def test_assign_column_scalar_callable(sdf, pdf):
    got = sdf.assign(x=sdf.i * 2 + sdf.j, y=7, z=lambda d: d.x - d.i, k=sdf.s)
    expected = pdf.assign(x=pdf.i * 2 + pdf.j, y=7, z=lambda d: d.x - d.i, k=pdf.s)
    assert got.columns == list(expected.columns)
    assert_same(got, expected)


def test_assign_string_and_float_scalars(sdf, pdf):
    got = sdf[["id"]].assign(label="x", ratio=0.5, flag=True)
    expected = pdf[["id"]].assign(label="x", ratio=0.5, flag=True)
    assert_same(got, expected)


def test_setitem(session, pdf):
    df = session.from_pandas(pdf)
    df["x"] = df.i + 1
    df["i"] = df.i * 10
    expected = pdf.copy()
    expected["x"] = expected.i + 1
    expected["i"] = expected.i * 10
    assert df.columns == list(expected.columns)
    assert_same(df, expected)


def test_drop(sdf, pdf):
    assert_same(sdf.drop(["s", "b"]), pdf.drop(columns=["s", "b"]))
    with pytest.raises(spate.PlanError):
        sdf.drop("nope")


# ----- sorting and head --------------------------------------------------------------------


@pytest.mark.parametrize(
    "by, ascending, na_position",
    [
        ("id", True, "last"),
        (["f", "id"], True, "last"),
        (["f", "id"], False, "first"),
        (["k", "i", "id"], [True, False, True], "last"),
        (["s", "id"], True, "first"),
        (["n", "g", "id"], [False, True, False], "last"),
        (["b", "id"], False, "last"),
    ],
)
def test_sort_values(sdf, pdf, by, ascending, na_position):
    got = sdf.sort_values(by, ascending=ascending, na_position=na_position)
    expected = pdf.sort_values(by, ascending=ascending, na_position=na_position)
    assert_same(got, expected, sort=False)


def test_head_after_sort(sdf, pdf):
    got = sdf.sort_values(["f", "id"], ascending=[False, True]).head(25)
    expected = pdf.sort_values(["f", "id"], ascending=[False, True]).head(25)
    assert_same(got, expected, sort=False)
    assert len(sdf.head()) == 5
    assert len(sdf.head(0)) == 0


def test_sort_values_rejects_bad_arguments(sdf):
    with pytest.raises(ValueError):
        sdf.sort_values("i", na_position="middle")
    with pytest.raises(ValueError):
        sdf.sort_values(["i", "j"], ascending=[True])
    with pytest.raises(spate.PlanError):
        sdf.sort_values("nope")


# ----- distinct and rename -----------------------------------------------------------------


def test_drop_duplicates(sdf, pdf):
    cols = ["k", "g", "b"]
    assert_same(sdf[cols].drop_duplicates(), pdf[cols].drop_duplicates())


def test_drop_duplicates_subset(sdf, pdf):
    got = sdf.drop_duplicates(subset=["k", "b"]).to_pandas()
    expected = pdf.drop_duplicates(subset=["k", "b"])
    # Which row of each group is kept is unspecified in Spate; the keys must match, and each
    # kept row must be a row of the input.
    assert_same(got[["k", "b"]], expected[["k", "b"]])
    assert set(got["id"]) <= set(pdf["id"])
    merged = got.merge(pdf, on="id", suffixes=("", "_src"))
    assert len(merged) == len(got)
    assert (merged["i"] == merged["i_src"]).all()


def test_rename(sdf, pdf):
    got = sdf.rename({"i": "eye", "nope": "ignored"})
    expected = pdf.rename(columns={"i": "eye", "nope": "ignored"})
    assert got.columns == list(expected.columns)
    assert_same(got, expected)
    assert sdf.rename(str.upper).columns == [c.upper() for c in pdf.columns]


# ----- shape, schema, explain --------------------------------------------------------------


def test_len_columns_dtypes(sdf, pdf):
    assert len(sdf) == len(pdf)
    assert sdf.shape == pdf.shape
    assert sdf.columns == list(pdf.columns)
    assert list(sdf) == list(pdf.columns)
    assert "i" in sdf and "nope" not in sdf
    dtypes = sdf.dtypes
    assert dtypes["id"] == pa.int64()
    assert dtypes["f"] == pa.float64()
    assert dtypes["b"] == pa.bool_()
    assert pa.types.is_string(dtypes["s"]) or pa.types.is_large_string(dtypes["s"])
    assert dtypes["n"] == pa.int64()


def test_explain(sdf):
    text = sdf[sdf.i > 3][["i", "f"]].explain()
    assert "logical_plan" in text and "physical_plan" in text
    assert "Filter" in text
    analyzed = sdf.groupby("k").agg({"i": "sum"}).explain(analyze=True)
    assert "output_rows" in analyzed


# ----- column expressions ------------------------------------------------------------------


def test_arithmetic(sdf, pdf):
    got = sdf.assign(
        add=sdf.i + sdf.j,
        sub=sdf.i - 3,
        mul=sdf.i * sdf.f,
        div=sdf.i / sdf.j,
        div_int=sdf.i / 4,
        rdiv=100 / sdf.j,
        radd=1 + sdf.i,
        rsub=1 - sdf.i,
        neg=-sdf.i,
        fadd=sdf.f + 0.5,
    )
    expected = pdf.assign(
        add=pdf.i + pdf.j,
        sub=pdf.i - 3,
        mul=pdf.i * pdf.f,
        div=pdf.i / pdf.j,
        div_int=pdf.i / 4,
        rdiv=100 / pdf.j,
        radd=1 + pdf.i,
        rsub=1 - pdf.i,
        neg=-pdf.i,
        fadd=pdf.f + 0.5,
    )
    assert_same(got, expected)
    assert sdf.assign(d=sdf.i / sdf.j).dtypes["d"] == pa.float64()


def test_modulo_follows_python_sign(sdf, pdf):
    got = sdf.assign(
        m=sdf.i % sdf.j, m3=sdf.i % 3, mneg=sdf.i % -7, fm=sdf.f % 2.5, rm=100 % sdf.j
    )
    expected = pdf.assign(
        m=pdf.i % pdf.j, m3=pdf.i % 3, mneg=pdf.i % -7, fm=pdf.f % 2.5, rm=100 % pdf.j
    )
    assert_same(got, expected, atol=1e-9)


def test_division_and_modulo_by_zero(session):
    pdf = pd.DataFrame({"a": [7, -7, 0, 3], "z": [0, 0, 0, 1]})
    df = session.from_pandas(pdf)
    got = df.assign(d=df.a / df.z, m=df.a % df.z)
    expected = pdf.assign(d=pdf.a / pdf.z, m=pdf.a % pdf.z)
    assert_same(got, expected, sort=["a"])


def test_comparison_expression(sdf, pdf):
    got = sdf[sdf.i * 2 > sdf.j][["id"]]
    expected = pdf[pdf.i * 2 > pdf.j][["id"]]
    assert_same(got, expected)
    for op in ["__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"]:
        assert_same(
            sdf[getattr(sdf.i, op)(sdf.j)][["id"]], pdf[getattr(pdf.i, op)(pdf.j)][["id"]]
        )


def test_comparison_values_where_defined(sdf, pdf):
    # Where no operand is null, a comparison gives the same booleans as in pandas.
    got = sdf[["id", "f", "i"]].assign(c=sdf.f > sdf.i).to_pandas()
    expected = pdf[["id", "f", "i"]].assign(c=pdf.f > pdf.i)
    defined = expected.f.notna()
    assert_same(got[got.f.notna()], expected[defined])
    # ... and null where pandas gives False (documented in spate.frame).
    assert got[got.f.isna()].c.isna().all()


@pytest.mark.parametrize(
    "column, values",
    [
        ("i", [1, 2, 3, -50]),
        ("k", ["a", "c"]),
        ("k", ["a", None]),
        ("k", [None]),
        ("k", []),
        ("g", [1.0, np.nan]),
        ("f", [0.0]),
        ("n", [1, 2]),
    ],
)
def test_isin(sdf, pdf, column, values):
    # isin is never null: a null is only "in" values holding None or NaN, as in pandas, so
    # negating it keeps the null rows too.
    assert_same(sdf[sdf[column].isin(values)], pdf[pdf[column].isin(values)])
    assert_same(sdf[~sdf[column].isin(values)], pdf[~pdf[column].isin(values)])
    got = sdf.assign(m=sdf[column].isin(values))[["id", "m"]]
    expected = pdf.assign(m=pdf[column].isin(values))[["id", "m"]]
    assert_same(got, expected, check_dtype=True)


def test_string_concatenation(sdf, pdf):
    got = sdf.assign(c=sdf.s + "_" + sdf.k, p="<" + sdf.s, kk=sdf.k + sdf.k)
    expected = pdf.assign(c=pdf.s + "_" + pdf.k, p="<" + pdf.s, kk=pdf.k + pdf.k)
    assert_same(got, expected)


def test_isnull_notnull(sdf, pdf):
    for name in ["k", "f", "s", "n", "g"]:
        assert_same(sdf[sdf[name].isnull()], pdf[pdf[name].isnull()])
        assert_same(sdf[sdf[name].notnull()], pdf[pdf[name].notnull()])
        assert_same(sdf[sdf[name].isna()][["id"]], pdf[pdf[name].isna()][["id"]])
    got = sdf.assign(x=sdf.f.isnull(), y=sdf.s.notna())[["id", "x", "y"]]
    expected = pdf.assign(x=pdf.f.isnull(), y=pdf.s.notna())[["id", "x", "y"]]
    assert_same(got, expected, check_dtype=True)


def test_fillna(sdf, pdf):
    got = sdf.assign(f=sdf.f.fillna(0.25), s=sdf.s.fillna("?"), n=sdf.n.fillna(-1))
    expected = pdf.assign(f=pdf.f.fillna(0.25), s=pdf.s.fillna("?"), n=pdf.n.fillna(-1))
    assert_same(got, expected)


def test_astype(sdf, pdf):
    got = sdf.assign(
        fi=sdf.i.astype("float64"),
        si=sdf.i.astype(str),
        i32=sdf.j.astype("int32"),
        bi=sdf.b.astype("int64"),
        ib=sdf.i.astype(bool),
        ft=sdf.f.fillna(1.5).astype("int64"),
        bs=sdf.b.astype(str),
    )
    expected = pdf.assign(
        fi=pdf.i.astype("float64"),
        si=pdf.i.astype(str),
        i32=pdf.j.astype("int32"),
        bi=pdf.b.astype("int64"),
        ib=pdf.i.astype(bool),
        ft=pdf.f.fillna(1.5).astype("int64"),
        bs=pdf.b.astype(str),
    )
    assert_same(got, expected)
    assert got.dtypes["i32"] == pa.int32()


def test_between_abs_round(sdf, pdf):
    assert_same(sdf[sdf.i.between(-3, 7)], pdf[pdf.i.between(-3, 7)])
    got = sdf.assign(a=sdf.i.abs(), r=sdf.f.round(1), r0=sdf.f.round(), rm=sdf.f.round(-1))
    expected = pdf.assign(a=pdf.i.abs(), r=pdf.f.round(1), r0=pdf.f.round(), rm=pdf.f.round(-1))
    assert_same(got, expected)
    # Half to even, as pandas (SQL's round goes half away from zero).
    halves = pd.DataFrame({"x": [0.5, 1.5, 2.5, -0.5, -2.5, 0.25, 0.35]})
    got = sdf.session.from_pandas(halves).assign(r=lambda d: d.x.round(), r1=lambda d: d.x.round(1))
    assert_same(got, halves.assign(r=halves.x.round(), r1=halves.x.round(1)), sort=["x"])
    assert_same(sdf.assign(r=sdf.i.round())[["i", "r"]], pdf.assign(r=pdf.i.round())[["i", "r"]])


def test_column_reductions(sdf, pdf):
    assert sdf.i.sum() == pdf.i.sum()
    assert sdf.f.sum() == pytest.approx(pdf.f.sum())
    assert sdf.f.mean() == pytest.approx(pdf.f.mean())
    assert sdf.i.min() == pdf.i.min() and sdf.i.max() == pdf.i.max()
    assert sdf.s.min() == pdf.s.min() and sdf.s.max() == pdf.s.max()
    assert sdf.f.count() == pdf.f.count()
    assert sdf.k.nunique() == pdf.k.nunique()
    assert len(sdf.f) == len(pdf)
    assert sdf[sdf.i > 1000].i.sum() == 0
    assert sdf.b.sum() == pdf.b.sum() and sdf.b.mean() == pytest.approx(pdf.b.mean())
    assert (sdf.i > 0).sum() == (pdf.i > 0).sum()
    assert sdf.f.isnull().sum() == pdf.f.isnull().sum()


def test_sequences_are_not_values(sdf):
    # pandas assigns a list or Series row by row (aligned by position or index); Spate has
    # no row positions, so it refuses instead of making a list-valued column.
    for value in [[1, 2], (1, 2), np.arange(2), pd.Series([1, 2]), pa.array([1, 2])]:
        with pytest.raises(TypeError, match="align"):
            sdf.assign(x=value)
    with pytest.raises(TypeError, match="cannot use"):
        sdf.assign(x=object())
    # NumPy and pyarrow scalars are values.
    got = sdf.assign(x=np.int64(3), y=np.float32(2.5), z=np.bool_(True), w=pa.scalar([1, 2]))
    row = got[["x", "y", "z", "w"]].head(1).to_arrow().to_pylist()[0]
    assert row == {"x": 3, "y": 2.5, "z": True, "w": [1, 2]}


def test_column_of_another_frame(sdf, pdf):
    # A mask built on the parent frame works on a projection that keeps its columns ...
    assert_same(sdf[["id", "i"]][sdf.i > 0], pdf[["id", "i"]][pdf.i > 0])
    # ... but Spate cannot align rows by index as pandas does, so reading a column the frame
    # lacks is a PlanError that says so (pandas would align on the index).
    with pytest.raises(spate.PlanError, match="does not align"):
        sdf[["id"]].assign(x=sdf.f.isnull())
    with pytest.raises(spate.PlanError, match="'f'"):
        sdf[["id"]][sdf.f > 0]


def test_column_not_attached(sdf):
    lonely = spate.Column(sdf.i._expr, None)
    with pytest.raises(spate.PlanError):
        lonely.to_pandas()


def test_column_truth_value_is_an_error(sdf):
    with pytest.raises(TypeError):
        bool(sdf.i > 0)


# ----- string methods ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "pat, case, regex",
    [
        ("an", True, True),
        ("^[a-c]", True, True),
        ("e\\d$", True, True),
        ("APPLE", False, True),
        ("b.na", True, False),
        ("b.na", True, True),
        ("BaNaNa", False, False),
        ("pie", True, False),
    ],
)
def test_str_contains(sdf, pdf, pat, case, regex):
    got = sdf[sdf.s.str.contains(pat, case=case, regex=regex)]
    expected = pdf[pdf.s.str.contains(pat, case=case, regex=regex, na=False)]
    assert_same(got, expected)
    # na= fills the result for nulls, as in pandas.
    got_na = sdf[sdf.s.str.contains(pat, case=case, regex=regex, na=True)]
    expected_na = pdf[pdf.s.str.contains(pat, case=case, regex=regex, na=True)]
    assert_same(got_na, expected_na)


def test_str_methods(sdf, pdf):
    got = sdf.assign(
        lo=sdf.s.str.lower(),
        up=sdf.s.str.upper(),
        ln=sdf.s.str.len(),
        st=sdf.s.str.startswith("ap"),
        en=sdf.s.str.endswith("1"),
    )
    expected = pdf.assign(
        lo=pdf.s.str.lower(),
        up=pdf.s.str.upper(),
        ln=pdf.s.str.len(),
        st=pdf.s.str.startswith("ap"),
        en=pdf.s.str.endswith("1"),
    )
    # pandas gives False for a null in startswith/endswith; Spate gives null.
    expected["st"] = expected["st"].where(pdf.s.notna(), None)
    expected["en"] = expected["en"].where(pdf.s.notna(), None)
    assert_same(got, expected)
    assert_same(sdf[sdf.s.str.startswith("ap")], pdf[pdf.s.str.startswith("ap", na=False)])


def test_str_strip_replace(session):
    pdf = pd.DataFrame({"s": ["  a b ", None, "xax", "a.a"]})
    df = session.from_pandas(pdf)
    got = df.assign(
        st=df.s.str.strip(),
        r=df.s.str.replace("a", "-"),
        rr=df.s.str.replace("a.", "#", regex=True),
    )
    expected = pdf.assign(
        st=pdf.s.str.strip(),
        r=pdf.s.str.replace("a", "-", regex=False),
        rr=pdf.s.str.replace("a.", "#", regex=True),
    )
    assert_same(got, expected)


# ----- repr and empty frames ---------------------------------------------------------------


def test_repr_truncated(sdf, pdf):
    text = repr(sdf)
    assert f"[{len(pdf)} rows x {len(pdf.columns)} columns]" in text
    header = text.splitlines()[0].split()
    assert header == list(pdf.columns)
    assert len([line for line in text.splitlines() if line[:1].isdigit()]) == 10


def test_repr_small(session):
    pdf = pd.DataFrame({"x": [1, 2, 3], "y": ["a", None, "c"]})
    df = session.from_pandas(pdf)
    text = repr(df)
    assert "rows x" not in text
    assert text == repr(df.to_pandas())
    assert "_repr_html_" in dir(df) and "<table" in df._repr_html_()


def test_repr_empty(session):
    df = session.from_pandas(pd.DataFrame({"x": pd.Series([], dtype="int64")}))
    assert repr(df) == "Empty DataFrame\nColumns: [x]"


def test_repr_groupby_shows_index(sdf, pdf):
    text = repr(sdf.groupby("k").agg({"i": "sum"}))
    assert text == repr(pdf.groupby("k").agg({"i": "sum"}))


def test_empty_from_pandas(session):
    pdf = random_frame(3).iloc[:0]
    df = session.from_pandas(pdf)
    assert len(df) == 0
    assert df.columns == list(pdf.columns)
    assert_same(df, pdf)
    assert_same(df[df.i > 0], pdf[pdf.i > 0])
    assert_same(df.sort_values("i"), pdf.sort_values("i"), sort=False)
    got = df.groupby("k").agg({"i": "sum", "f": "mean"}).to_pandas()
    assert len(got) == 0 and list(got.columns) == ["i", "f"] and got.index.name == "k"
    assert len(df.merge(df, on="id")) == 0


def test_filter_that_keeps_nothing(sdf, pdf):
    empty = sdf[sdf.i > 1000]
    assert len(empty) == 0
    got = empty.to_pandas()
    assert list(got.columns) == list(pdf.columns) and len(got) == 0
    numeric = ["k", "id", "g", "i", "j", "n", "f", "b"]
    assert_same(empty.groupby("k").sum(), pdf[pdf.i > 1000][numeric].groupby("k").sum())
    assert len(empty.groupby("k").size().to_pandas()) == 0
    assert empty.i.sum() == 0
    assert repr(empty).startswith("Empty DataFrame")


def test_documented_differences_from_pandas(session):
    """The deliberate differences listed in spate.frame's docstring, checked so the list stays
    true."""
    pdf = pd.DataFrame({"a": [1.0, np.nan, -2.0], "z": [0.0, 1.0, 0.0]})
    df = session.from_pandas(pdf)
    # Comparisons with null are null: negating a mask drops the null rows.
    assert len(df[~(df.a > 0)]) == 1 and len(pdf[~(pdf.a > 0)]) == 2
    # A NaN computed by Spate is a value, not null.
    nan = df.assign(q=df.z / df.z)[["q"]].to_pandas()
    assert np.isnan(nan.q[0]) and df.assign(q=df.z / df.z)[df.z == 0]["q"].isnull().sum() == 0
    # astype of a null to an integer is null.
    as_int = df.assign(i=df.a.astype("int64"))["i"].to_pandas()
    assert as_int.isna().tolist() == [False, True, False]
    # String predicates are null for nulls; na= fills them.
    s = session.from_pandas(pd.DataFrame({"s": ["ab", None]}))
    assert s.assign(c=s.s.str.contains("a"))["c"].to_pandas().tolist() == [True, None]
    assert s.assign(c=s.s.str.contains("a", na=False))["c"].to_pandas().tolist() == [True, False]
