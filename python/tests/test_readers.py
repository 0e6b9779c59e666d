"""Readers (Parquet, CSV, NDJSON, Arrow IPC files and folders) and Session.register with every
kind of data, each then visible to SQL."""

from __future__ import annotations

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import spate
from conftest import assert_same, random_frame


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    return random_frame(21, rows=500)[["id", "k", "i", "f", "s", "b"]]


def test_read_parquet(session, data, tmp_path):
    path = tmp_path / "Trips-2024.parquet"
    pq.write_table(pa.Table.from_pandas(data, preserve_index=False), path)
    df = session.read_parquet(path)
    assert df.table_name == "trips_2024"
    assert_same(df, data)
    got = session.sql("select k, sum(i) as i from trips_2024 group by k").to_pandas()
    assert_same(got, data.groupby("k", as_index=False, dropna=False).agg({"i": "sum"}))
    named = session.read_parquet(str(path), name="again")
    assert named.table_name == "again" and len(session.table("again")) == len(data)
    # A second file of the same stem gets a fresh name instead of replacing the first.
    assert session.read_parquet(path).table_name == "trips_2024_1"


def test_read_parquet_folder(session, data, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    half = len(data) // 2
    for part, rows in [("a", data.iloc[:half]), ("b", data.iloc[half:])]:
        pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), folder / f"{part}.parquet")
    session.read_parquet(folder, name="parts")
    assert_same(session.sql("select * from parts"), data)


def test_read_csv(session, data, tmp_path):
    path = tmp_path / "data.csv"
    data.to_csv(path, index=False)
    df = session.read_csv(path, name="csv_data")
    # CSV has no types: the reader infers int64, float64, bool and string.
    assert df.dtypes["i"] == pa.int64() and df.dtypes["f"] == pa.float64()
    assert df.dtypes["b"] == pa.bool_()
    got = session.sql("select id, k, i, f, s, b from csv_data where i > 0")
    expected = data[data.i > 0]
    # pandas writes a null string and an empty one the same way; read back, both are null.
    expected = expected.assign(s=expected.s.replace("", np.nan))
    assert_same(got, expected)


def test_read_csv_written_by_pyarrow(session, tmp_path):
    table = pa.table({"x": [1, 2, None], "y": ["a", None, "c"]})
    path = tmp_path / "arrow.csv"
    pa_csv.write_csv(table, path)
    got = session.read_csv(path).sort_values("y").to_arrow()
    assert got.column("x").to_pylist() == [1, None, 2]


def test_read_json_and_ipc(session, data, tmp_path):
    json_path = tmp_path / "rows.json"
    data.to_json(json_path, orient="records", lines=True)
    assert_same(session.read_json(json_path, name="j")[["id", "i"]], data[["id", "i"]])
    ipc_path = tmp_path / "rows.arrow"
    feather.write_feather(pa.Table.from_pandas(data, preserve_index=False), ipc_path)
    assert_same(session.read_ipc(ipc_path, name="ipc"), data)
    assert session.sql("select count(*) as n from ipc").to_pandas()["n"][0] == len(data)


def test_module_level_readers(data, tmp_path):
    path = tmp_path / "module.parquet"
    pq.write_table(pa.Table.from_pandas(data, preserve_index=False), path)
    df = spate.read_parquet(path, name="module_level")
    assert spate.table("module_level").columns == df.columns
    assert spate.sql("select count(*) as n from module_level").to_pandas()["n"][0] == len(data)


def test_register_every_kind(session, data, tmp_path):
    path = tmp_path / "reg.parquet"
    pq.write_table(pa.Table.from_pandas(data, preserve_index=False), path)
    sources = {
        "from_pandas": data,
        "from_polars": pl.from_pandas(data),
        "from_table": pa.Table.from_pandas(data, preserve_index=False),
        "from_batch": pa.RecordBatch.from_pandas(data, preserve_index=False),
        "from_path": path,
        "from_str_path": str(path),
    }
    for name, source in sources.items():
        df = session.register(name, source)
        assert df.table_name == name
        got = session.sql(f"select id, k, i, f, s, b from {name}")
        assert_same(got, data)
    base = session.register("base", data)
    view = session.register("positive", base[base.i > 0][["id", "i"]])
    assert view.table_name == "positive"
    assert_same(session.sql("select * from positive"), data[data.i > 0][["id", "i"]])
    assert set(sources) | {"base", "positive"} <= set(session.tables())


def test_register_replaces_by_name(session, tmp_path):
    session.register("r", pd.DataFrame({"a": [1]}))
    session.register("R", pd.DataFrame({"a": [2, 3]}))
    assert sorted(session.sql("select a from r").to_pandas()["a"]) == [2, 3]
    # A view of the table it replaces keeps reading the old table.
    old = session.table("r")
    session.register("r", old[old.a > 2])
    assert session.sql("select a from r").to_pandas()["a"].tolist() == [3]
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"a": [7]}), path)
    session.register("r", path)
    assert session.sql("select a from r").to_pandas()["a"].tolist() == [7]
    # A file that cannot be registered leaves the old table in place.
    with pytest.raises(spate.SourceError):
        session.register("r", tmp_path / "missing.parquet")
    assert session.sql("select a from r").to_pandas()["a"].tolist() == [7]
    with pytest.raises(spate.ConfigError, match="invalid table name"):
        session.register("not valid", path)
    assert session.tables() == ["r"]


def test_replacing_a_cached_table(session):
    session.register("c2", pd.DataFrame({"a": [1]}))
    assert session.sql("CACHE TABLE c2").to_pandas()["rows"].tolist() == [1]
    session.register("c2", pd.DataFrame({"a": [5, 6]}))
    # The new table is cached, not the old one's stale copy.
    assert session.sql("CACHE TABLE c2").to_pandas()["rows"].tolist() == [2]
    assert sorted(session.sql("select a from c2").to_pandas()["a"]) == [5, 6]
    session.uncache("c2")
    assert session.deregister("c2") is True


def test_register_rejects_other_objects(session):
    with pytest.raises(TypeError):
        session.register("bad", {"a": [1, 2]})


def test_from_arrow_names(session):
    a = session.from_arrow(pa.table({"x": [1]}))
    b = session.from_arrow(pa.table({"x": [2]}))
    assert a.table_name != b.table_name
    assert session.sql(f"select x from {b.table_name}").to_pandas()["x"][0] == 2


def test_cache_and_uncache(session, data):
    session.register("c", data)
    session.cache("c")
    assert_same(session.sql("select * from c"), data)
    session.uncache("c")
    session.sql("CACHE TABLE c")
    assert len(session.table("c")) == len(data)
    session.sql("UNCACHE TABLE c")


def test_unnamed_frames_release_their_names_when_collected(session):
    import gc

    before = set(session.tables())
    kept = None
    for i in range(20):
        frame = session.from_pandas(pd.DataFrame({"k": [i % 3, 1, 2], "v": [1.0, 2.0, float(i)]}))
        name = frame.table_name
        assert name in session.tables()
        # SQL sees the automatic name while the frame is alive.
        assert session.sql(f"select count(*) as n from {name}").to_pandas()["n"][0] == 3
        derived = frame[frame.v > 1.5].groupby("k").agg({"v": "sum"})
        if i == 19:
            kept = derived
        del frame, derived
    gc.collect()
    assert set(session.tables()) == before
    # A frame derived from a collected one still has its data.
    got = kept.to_pandas()
    expected = pd.DataFrame({"k": [0, 1, 2], "v": [0.0, 2.0, 19.0]})
    expected = expected[expected.v > 1.5].groupby("k").agg({"v": "sum"})
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_named_frames_stay_registered(session):
    import gc

    frame = session.from_pandas(pd.DataFrame({"a": [1, 2]}), name="kept_table")
    del frame
    gc.collect()
    assert "kept_table" in session.tables()
    assert session.sql("select sum(a) as s from kept_table").to_pandas()["s"][0] == 3
