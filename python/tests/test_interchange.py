"""Round trips through pyarrow, Polars and pandas keep types and values; the Arrow PyCapsule
stream protocol; zero-copy import."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal as assert_polars_equal

from conftest import assert_same


def arrow_table() -> pa.Table:
    """One column per Arrow type the engine should carry unchanged, each with a null."""
    return pa.table(
        {
            "i8": pa.array([1, None, -3], pa.int8()),
            "i32": pa.array([1, None, 3], pa.int32()),
            "i64": pa.array([1, None, -(2**62)], pa.int64()),
            "u64": pa.array([1, None, 2**63], pa.uint64()),
            "f32": pa.array([1.5, None, -0.25], pa.float32()),
            "f64": pa.array([1.5, None, float("inf")], pa.float64()),
            "dec": pa.array(
                [decimal.Decimal("1.23"), None, decimal.Decimal("-99999.99")], pa.decimal128(10, 2)
            ),
            "dec38": pa.array(
                [decimal.Decimal("12345678901234567890.123456"), None, decimal.Decimal("0")],
                pa.decimal128(38, 6),
            ),
            "date": pa.array([dt.date(2024, 1, 1), None, dt.date(1969, 12, 31)], pa.date32()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 12), None, dt.datetime(1900, 1, 1)], pa.timestamp("us")
            ),
            "ts_tz": pa.array(
                [dt.datetime(2024, 1, 1, 12), None, dt.datetime(2000, 1, 1)],
                pa.timestamp("ns", tz="UTC"),
            ),
            "str": pa.array(["a", None, "ünïcode"], pa.string()),
            "large_str": pa.array(["a", None, ""], pa.large_string()),
            "str_view": pa.array(
                ["a", None, "a longer string than twelve bytes"], pa.string_view()
            ),
            "bool": pa.array([True, None, False]),
            "bin": pa.array([b"x", None, b"\x00"], pa.binary()),
            "null": pa.array([None, None, None], pa.null()),
            "list": pa.array([[1, 2], None, []], pa.list_(pa.int64())),
            "struct": pa.array([{"x": 1}, None, {"x": 2}], pa.struct([("x", pa.int64())])),
            "duration": pa.array([1, None, 3], pa.duration("ms")),
            "time": pa.array([1, None, 3], pa.time64("us")),
            "dict": pa.array(["a", None, "a"]).dictionary_encode(),
        }
    )


def test_arrow_round_trip_keeps_types_and_values(cpu):
    table = arrow_table()
    out = cpu.from_arrow(table).to_arrow()
    assert out.schema == table.schema
    assert out.equals(table)


def test_arrow_round_trip_through_sql(cpu):
    table = arrow_table()
    df = cpu.from_arrow(table, name="typed")
    out = cpu.sql("select * from typed").to_arrow()
    assert out.schema == table.schema and out.equals(table)
    assert df.table_name == "typed"


def test_arrow_record_batch_and_reader(cpu):
    table = arrow_table()
    batch = table.to_batches()[0]
    assert cpu.from_arrow(batch).to_arrow().equals(table)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    assert cpu.from_arrow(reader).to_arrow().equals(table)


def test_arrow_types_survive_operations(cpu):
    table = arrow_table()
    df = cpu.from_arrow(table)
    out = df[df.i32.notnull()][["dec", "date", "ts_tz", "str"]].to_arrow()
    assert out.schema == pa.schema([table.schema.field(n) for n in ["dec", "date", "ts_tz", "str"]])
    assert out.to_pylist() == [
        {"dec": decimal.Decimal("1.23"), "date": dt.date(2024, 1, 1),
         "ts_tz": pd.Timestamp("2024-01-01 12:00", tz="UTC"), "str": "a"},
        {"dec": decimal.Decimal("-99999.99"), "date": dt.date(1969, 12, 31),
         "ts_tz": pd.Timestamp("2000-01-01", tz="UTC"), "str": "ünïcode"},
    ]
    total = df.groupby("bool").agg({"dec": "sum"}).to_arrow()
    assert total.schema.field("dec").type == pa.decimal128(20, 2)


def test_pycapsule_stream_protocol(cpu):
    table = arrow_table()
    df = cpu.from_arrow(table)
    assert pa.table(df).equals(table)
    assert pa.RecordBatchReader.from_stream(df).read_all().equals(table)
    small = cpu.from_arrow(table.select(["i64", "str", "dec", "date"]))
    # polars.DataFrame reads the stream as a frame; polars.from_arrow returns a Series of
    # structs for any stream exporter that is not a pyarrow object (Polars' own rule).
    expected = pl.from_arrow(table.select(["i64", "str", "dec", "date"]))
    assert_polars_equal(pl.DataFrame(small), expected)
    assert_polars_equal(pl.from_arrow(small).struct.unnest(), expected)


def test_zero_copy_import(cpu):
    # A table registered with from_arrow is not copied: a plain SELECT * hands back slices of
    # the very buffers pyarrow allocated (the engine partitions it into batch-size slices).
    values = np.arange(50_000, dtype=np.int64)
    table = pa.table({"a": values})
    buffer = table.column(0).chunks[0].buffers()[1]
    start, end = buffer.address, buffer.address + buffer.size
    cpu.from_arrow(table, name="zero_copy")
    out = cpu.sql("select * from zero_copy").to_arrow()
    chunks = out.column(0).chunks
    assert len(chunks) > 1
    for chunk in chunks:
        address = chunk.buffers()[1].address + chunk.offset * 8
        assert start <= address and address + len(chunk) * 8 <= end
    # The slices together are the whole table, each row once.
    assert sorted(out.column(0).to_numpy()) == list(values)
    small = pa.table({"a": values[:10]})
    out = cpu.from_arrow(small).to_arrow()
    small_address = small.column(0).chunks[0].buffers()[1].address
    assert out.column(0).chunks[0].buffers()[1].address == small_address


def test_zero_copy_export(cpu):
    # The result stream moves Spate's buffers to pyarrow: reading the same frame twice runs it
    # twice, but each read sees the imported buffers, not copies.
    table = pa.table({"a": np.arange(100, dtype=np.int64)})
    df = cpu.from_arrow(table)
    address = table.column(0).chunks[0].buffers()[1].address
    assert pa.table(df).column(0).chunks[0].buffers()[1].address == address
    assert df.to_polars()["a"].to_arrow().buffers()[1].address == address


def test_zero_copy_from_pandas_and_polars(cpu):
    # NumPy int64 data reaches the result without a copy: pyarrow wraps the array, Spate
    # slices it, and pyarrow / Polars wrap Spate's output again.
    values = np.arange(1000, dtype=np.int64)
    frame = pd.DataFrame({"a": values})
    out = cpu.from_pandas(frame).to_arrow()
    assert out.column(0).chunks[0].buffers()[1].address == frame["a"].to_numpy().ctypes.data
    polars_frame = pl.DataFrame({"a": values})
    address = polars_frame["a"].to_arrow().buffers()[1].address
    assert cpu.from_polars(polars_frame).to_arrow().column(0).chunks[0].buffers()[1].address == (
        address
    )
    assert cpu.from_polars(polars_frame).to_polars()["a"].to_arrow().buffers()[1].address == (
        address
    )


def test_polars_round_trip(cpu):
    frame = pl.DataFrame(
        {
            "i": pl.Series([1, None, 3], dtype=pl.Int64),
            "i16": pl.Series([1, None, 3], dtype=pl.Int16),
            "u32": pl.Series([1, None, 3], dtype=pl.UInt32),
            "f": pl.Series([1.5, None, float("nan")], dtype=pl.Float64),
            "s": pl.Series(["a", None, "ü"], dtype=pl.String),
            "b": pl.Series([True, None, False]),
            "d": pl.Series([dt.date(2024, 1, 1), None, dt.date(1900, 1, 1)]),
            "ts": pl.Series(
                [dt.datetime(2024, 1, 1, 1), None, dt.datetime(1900, 1, 1)], dtype=pl.Datetime("us")
            ),
            "tsz": pl.Series(
                [dt.datetime(2024, 1, 1, 1), None, dt.datetime(1900, 1, 1)],
                dtype=pl.Datetime("ns", "Europe/Paris"),
            ),
            "dec": pl.Series(
                [decimal.Decimal("1.10"), None, decimal.Decimal("-2.25")], dtype=pl.Decimal(10, 2)
            ),
            "cat": pl.Series(["a", None, "b"], dtype=pl.Categorical),
            "lst": pl.Series([[1], None, []], dtype=pl.List(pl.Int64)),
            "dur": pl.Series([dt.timedelta(seconds=1), None, dt.timedelta(0)]),
        }
    )
    out = cpu.from_polars(frame).to_polars()
    assert out.schema == frame.schema
    assert_polars_equal(out, frame)


def test_polars_strings_work_in_operations(cpu, pdf):
    # Polars exports strings as Arrow string views: filters, string functions, grouping and
    # joins must handle them.
    frame = pl.from_pandas(pdf[["id", "k", "s", "i"]])
    df = cpu.from_polars(frame)
    assert pa.types.is_string_view(df.dtypes["s"])
    got = df[df.s.str.contains("an", case=False) & (df.k != "a")]
    expected = pdf[pdf.s.str.contains("an", case=False, na=False) & (pdf.k != "a") & pdf.k.notna()]
    assert_same(got, expected[["id", "k", "s", "i"]])
    pd.testing.assert_frame_equal(
        df.groupby("k").agg({"i": "sum", "s": "max"}).to_pandas(),
        pdf.groupby("k").agg({"i": "sum", "s": "max"}),
        check_dtype=False,
    )
    assert len(df.merge(cpu.from_pandas(pdf[["k", "j"]]), on="k")) == len(
        pdf[["id", "k"]].merge(pdf[["k", "j"]], on="k")
    )


def test_pandas_round_trip_numpy_types(cpu):
    frame = pd.DataFrame(
        {
            "i": np.array([1, 2, 3], dtype="int64"),
            "i32": np.array([1, 2, 3], dtype="int32"),
            "u8": np.array([1, 2, 255], dtype="uint8"),
            "f": [1.5, np.nan, 3.0],
            "f32": np.array([1.5, np.nan, 3.0], dtype="float32"),
            "b": [True, False, True],
            "s": pd.array(["a", None, "c"], dtype="str"),
            "ts": pd.to_datetime(["2024-01-01 00:00", None, "2024-03-01 12:00"]),
            "ts_tz": pd.to_datetime(["2024-01-01 00:00", None, "2024-03-01 12:00"]).tz_localize(
                "UTC"
            ),
            "date": [dt.date(2024, 1, 1), None, dt.date(2020, 2, 29)],
            "dec": [decimal.Decimal("1.10"), None, decimal.Decimal("-2.25")],
            "cat": pd.Categorical(["a", None, "a"]),
            "td": pd.to_timedelta([1, None, 3], unit="s"),
        }
    )
    df = cpu.from_pandas(frame)
    assert df.dtypes["dec"] == pa.decimal128(3, 2)
    assert df.dtypes["date"] == pa.date32()
    pd.testing.assert_frame_equal(df.to_pandas(), frame)


def test_pandas_round_trip_nullable_types(cpu):
    frame = pd.DataFrame(
        {
            "I": pd.array([1, None, 3], dtype="Int64"),
            "I8": pd.array([1, None, -3], dtype="Int8"),
            "U": pd.array([1, None, 3], dtype="UInt32"),
            "B": pd.array([True, None, False], dtype="boolean"),
            "S": pd.array(["a", None, "c"], dtype="string"),
            "F": pd.array([1.5, None, 2.0], dtype="Float64"),
        }
    )
    df = cpu.from_pandas(frame)
    pd.testing.assert_frame_equal(df.to_pandas(dtype_backend="numpy_nullable"), frame)
    arrow_backed = df.to_pandas(dtype_backend="pyarrow")
    assert all(isinstance(t, pd.ArrowDtype) for t in arrow_backed.dtypes)
    assert arrow_backed["I"].tolist() == [1, None, 3] or arrow_backed["I"].isna().tolist() == [
        False,
        True,
        False,
    ]
    # Without dtype_backend, NumPy types: nulls in integers become NaN, as pyarrow does.
    plain = df.to_pandas()
    assert plain["I"].dtype == np.float64 and np.isnan(plain["I"][1])
    with pytest.raises(ValueError):
        df.to_pandas(dtype_backend="nope")


def test_pandas_index(cpu):
    frame = pd.DataFrame({"v": [1, 2, 3]}, index=pd.Index(["x", "y", "z"], name="key"))
    assert cpu.from_pandas(frame).columns == ["v"]
    kept = cpu.from_pandas(frame, preserve_index=True)
    assert sorted(kept.columns) == ["key", "v"]  # pyarrow appends the index columns
    pd.testing.assert_frame_equal(kept.set_index("key").to_pandas(), frame)


def test_pandas_metadata_is_dropped(cpu):
    # pyarrow's "pandas" schema metadata describes the input frame; results computed from it
    # must not be rebuilt with its index or dtypes.
    frame = pd.DataFrame({"v": [1, 2, 3]}, index=pd.Index([10, 20, 30], name="r"))
    df = cpu.from_pandas(frame, preserve_index=True)
    assert df.schema.metadata is None or b"pandas" not in df.schema.metadata
    out = df[["v"]].to_pandas()
    pd.testing.assert_frame_equal(out, pd.DataFrame({"v": [1, 2, 3]}))


def test_column_to_polars_and_arrow(sdf, pdf):
    assert sdf.i.to_polars().to_list() == pdf.i.tolist()
    assert sdf.s.to_arrow().to_pylist() == [None if pd.isna(v) else v for v in pdf.s]


def test_from_arrow_rejects_non_arrow(cpu):
    with pytest.raises(TypeError, match="Arrow data"):
        cpu.from_arrow([1, 2, 3])


def test_large_round_trip_is_complete(cpu):
    # More rows than one batch: several partitions, all rows back (order is only defined after
    # sort_values).
    frame = pd.DataFrame({"a": np.arange(100_000), "b": np.arange(100_000) % 7 == 0})
    out = cpu.from_pandas(frame).sort_values("a").to_pandas()
    pd.testing.assert_frame_equal(out, frame)
