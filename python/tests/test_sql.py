"""Session.sql against pandas on the random frame registered as ``t``."""

from __future__ import annotations

import pandas as pd
import pytest

import spate
from conftest import assert_same


def test_select_literal_on_cpu():
    got = spate.Session(backend="cpu").sql("select 1 as x").to_pandas()
    pd.testing.assert_frame_equal(got, pd.DataFrame({"x": [1]}))


def test_module_level_sql():
    assert spate.sql("select 2 as y").to_pandas()["y"].tolist() == [2]


def test_select_star(cpu, sdf, pdf):
    assert_same(cpu.sql("select * from t"), pdf)


def test_where(cpu, sdf, pdf):
    got = cpu.sql("select id, i, f from t where i > 5 and f is not null and s like 'a%'")
    expected = pdf[(pdf.i > 5) & pdf.f.notna() & pdf.s.str.startswith("a", na=False)]
    assert_same(got, expected[["id", "i", "f"]])


def test_group_by(cpu, sdf, pdf):
    got = cpu.sql(
        "select k, sum(i) as i, avg(f) as f, count(s) as s, count(*) as n "
        "from t where k is not null group by k order by k"
    ).to_pandas()
    expected = (
        pdf.groupby("k")
        .agg(i=("i", "sum"), f=("f", "mean"), s=("s", "count"), n=("id", "size"))
        .reset_index()
    )
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_order_by_limit(cpu, sdf, pdf):
    got = cpu.sql("select id, f from t order by f desc nulls last, id limit 20").to_pandas()
    expected = pdf.sort_values(["f", "id"], ascending=[False, True]).head(20)[["id", "f"]]
    assert_same(got, expected, sort=False)


def test_join(cpu, sdf, pdf):
    cpu.from_pandas(pdf[["k", "j"]].drop_duplicates("k").dropna(), name="dim")
    got = cpu.sql("select t.id, t.k, dim.j as dj from t join dim on t.k = dim.k")
    expected = pdf[["id", "k"]].merge(
        pdf[["k", "j"]].drop_duplicates("k").dropna().rename(columns={"j": "dj"}), on="k"
    )
    assert_same(got, expected)


def test_expressions(cpu, sdf, pdf):
    got = cpu.sql(
        "select id, i * 2 + j as a, cast(i as double) / j as d, upper(s) as u, "
        "coalesce(f, 0) as c, case when b then 'yes' else 'no' end as y from t"
    )
    expected = pd.DataFrame(
        {
            "id": pdf.id,
            "a": pdf.i * 2 + pdf.j,
            "d": pdf.i / pdf.j,
            "u": pdf.s.str.upper(),
            "c": pdf.f.fillna(0),
            "y": pdf.b.map({True: "yes", False: "no"}),
        }
    )
    assert_same(got, expected)


def test_sql_over_frame_view(cpu, sdf, pdf):
    sdf[sdf.i > 0].register("positive")
    got = cpu.sql("select count(*) as n, min(i) as lo from positive").to_pandas()
    assert got.n[0] == (pdf.i > 0).sum() and got.lo[0] == pdf.i[pdf.i > 0].min()


def test_sql_result_is_a_frame(cpu, sdf, pdf):
    df = cpu.sql("select k, i, f from t")
    got = df[df.i > 0].groupby("k").agg({"f": "max"}).to_pandas()
    expected = pdf[pdf.i > 0].groupby("k").agg({"f": "max"})
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_ddl_takes_effect_at_once(session):
    session.sql("create table made as select 1 as a union all select 2")
    assert "made" in session.tables()
    assert session.table("made").to_pandas()["a"].sort_values().tolist() == [1, 2]
    session.sql("create view v2 as select a * 10 as b from made")
    assert sorted(session.sql("select b from v2").to_pandas()["b"]) == [10, 20]


def test_tables_and_deregister(session, pdf):
    session.from_pandas(pdf, name="t1")
    assert "t1" in session.tables()
    assert session.deregister("t1") is True
    assert session.deregister("t1") is False
    with pytest.raises(spate.SqlError):
        session.sql("select * from t1")


def test_session_properties():
    s = spate.Session(backend="cpu")
    assert s.backend == "cpu"
    assert s.backend_reason
    assert "cpu" in repr(s)
