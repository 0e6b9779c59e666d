"""Every failure is a typed spate.Error (several also the matching built-in), never a panic."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

import spate
from conftest import deadline
from spate import _spate

ERROR_CLASSES = [
    spate.SqlError,
    spate.PlanError,
    spate.OutOfMemoryError,
    spate.UnsupportedError,
    spate.SourceError,
    spate.ConfigError,
    spate.BackendError,
    spate.ExecutionError,
    spate.InternalError,
]


@pytest.mark.parametrize("cls", ERROR_CLASSES)
def test_hierarchy(cls):
    assert issubclass(cls, spate.Error)
    assert cls.__doc__


def test_builtin_bases():
    assert issubclass(spate.OutOfMemoryError, MemoryError)
    assert issubclass(spate.SourceError, OSError)
    assert issubclass(spate.ConfigError, ValueError)
    assert issubclass(spate.UnsupportedError, NotImplementedError)


# ----- SqlError ----------------------------------------------------------------------------


def test_syntax_error_has_position(cpu):
    with pytest.raises(spate.SqlError) as info:
        cpu.sql("select 1\nfrom (select 1) t where )")
    assert (info.value.line, info.value.column) == (2, 25)
    assert "Line: 2, Column: 25" in str(info.value)


def test_planning_error_has_position(cpu):
    with pytest.raises(spate.SqlError) as info:
        cpu.sql("select\n   nope\nfrom (select 1 as a)")
    assert info.value.line == 2 and info.value.column == 4
    assert "nope" in str(info.value) and "(at line 2, column 4)" in str(info.value)


def test_unknown_table(cpu):
    with pytest.raises(spate.SqlError, match="not_there"):
        cpu.sql("select * from not_there")


def test_statement_count(cpu):
    with pytest.raises(spate.SqlError):
        cpu.sql("")
    with pytest.raises(spate.SqlError, match="one statement"):
        cpu.sql("select 1; select 2")


def test_bad_filter_string(sdf):
    with pytest.raises(spate.SqlError):
        sdf.filter("i >>> 2")
    with pytest.raises(spate.SqlError, match="nope"):
        sdf.filter("nope > 2")


# ----- PlanError ---------------------------------------------------------------------------


def test_unknown_column(sdf):
    with pytest.raises(spate.PlanError, match="no column 'x'"):
        sdf["x"]
    with pytest.raises(spate.PlanError, match="'x'"):
        sdf[["i", "x"]]
    with pytest.raises(AttributeError):
        sdf.x


def test_merge_on_missing_key(sdf):
    other = sdf[["id", "k"]]
    with pytest.raises(spate.PlanError, match="right frame has no column 'i'"):
        sdf.merge(other, on="i")
    with pytest.raises(spate.PlanError, match="left frame has no column 'q'"):
        sdf.merge(other, left_on="q", right_on="k")


def test_bad_expression_types(sdf):
    with pytest.raises(spate.PlanError, match="Cannot coerce"):
        sdf.assign(x=sdf.s * 2)
    with pytest.raises(spate.PlanError, match="non-boolean"):
        sdf.filter(sdf.i + 1)
    with pytest.raises(spate.PlanError):
        sdf.assign(x=sdf.i.str.upper())
    # Some signature checks run when the plan is optimized, i.e. when it first runs.
    with pytest.raises(spate.PlanError, match="regexp_like"):
        sdf[sdf.i.str.contains("a")].to_arrow()


def test_table_errors(session):
    with pytest.raises(spate.PlanError, match="nope"):
        session.table("nope")
    other = spate.Session(backend="cpu").sql("select 1 as a")
    with pytest.raises(spate.PlanError, match="another session"):
        session.register("x", other)


# ----- OutOfMemoryError --------------------------------------------------------------------


def test_gpu_memory_limit_cache_table():
    s = spate.Session(backend="emulated", gpu_memory_limit="1M")
    s.from_arrow(pa.table({"a": pa.array(range(400_000), pa.int64())}), name="big")  # 3.2 MB
    with pytest.raises(spate.OutOfMemoryError, match="GPU out of memory") as info:
        s.sql("CACHE TABLE big")
    assert isinstance(info.value, MemoryError)
    with pytest.raises(spate.OutOfMemoryError):
        s.cache("big")
    # The session is still usable, and a table that fits can be cached.
    s.from_arrow(pa.table({"a": pa.array(range(1000), pa.int64())}), name="small")
    s.cache("small")
    assert s.sql("select sum(a) as s from small").to_pandas()["s"][0] == sum(range(1000))
    s.uncache("small")


def test_host_memory_limit_sort():
    # One partition: no repartitioning, so the sort itself must fail (its merge cannot spill).
    s = spate.Session(backend="cpu", memory_limit="1M", target_partitions=1)
    s.from_arrow(pa.table({"a": pa.array(range(2_000_000, 0, -1), pa.float64())}), name="big")
    with deadline(60, "an out-of-memory sort"):
        with pytest.raises(spate.OutOfMemoryError, match="out of memory"):
            s.sql("select a from big order by a").to_arrow()


# ----- UnsupportedError, SourceError, ConfigError, BackendError, ExecutionError ---------------


def test_unsupported(cpu):
    with pytest.raises(spate.UnsupportedError, match="CACHE TABLE"):
        cpu.sql("CACHE TABLE t AS SELECT 1")


def test_source_errors(session, tmp_path):
    with pytest.raises(spate.SourceError, match="no such file") as info:
        session.read_parquet(tmp_path / "missing.parquet")
    assert isinstance(info.value, OSError)
    with pytest.raises(spate.SourceError):
        session.read_csv(str(tmp_path / "missing.csv"))
    with pytest.raises(spate.SourceError):
        session.register("x", tmp_path / "missing.arrow")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"this is not parquet")
    with pytest.raises(spate.Error) as info:
        session.read_parquet(corrupt).to_arrow()
    assert isinstance(info.value, (spate.SourceError, spate.ExecutionError))


def test_config_errors():
    with pytest.raises(spate.ConfigError, match="nope") as info:
        spate.Session(backend="nope")
    assert isinstance(info.value, ValueError)
    for kwargs in [
        {"memory_limit": "lots"},
        {"memory_limit": 0},
        {"gpu_memory_limit": -1},
        {"fallback": "sometimes"},
        {"target_partitions": 0},
        {"options": {"datafusion.execution.batch_size": "x"}},
        {"options": {"no.such.option": "1"}},
    ]:
        with pytest.raises(spate.ConfigError):
            spate.Session(backend="cpu", **kwargs)


def test_argument_errors_are_config_errors(sdf):
    with pytest.raises(spate.ConfigError):
        sdf.i.astype("no-such-type")
    with pytest.raises(spate.ConfigError):
        sdf.to_pandas(dtype_backend="nope")
    with pytest.raises(spate.ConfigError):
        sdf.merge(sdf, on="id", how="sideways")
    with pytest.raises(spate.ConfigError):
        _spate.Expr.lit(pa.array([1, 2]))
    with pytest.raises(spate.ConfigError):
        _spate.Expr.function("no_such_function", [])
    with pytest.raises(spate.ConfigError):
        _spate.Expr.aggregate("no_such_aggregate", [])


def test_backend_error_without_gpu():
    found = spate.devices()
    if found:
        pytest.skip(f"this machine has a GPU ({found[0]}): cuda is available")
    with pytest.raises(spate.BackendError, match="not available"):
        spate.Session(backend="cuda")


def test_execution_errors(cpu):
    with pytest.raises(spate.ExecutionError, match="Divide by zero"):
        cpu.sql("select 1 / 0").to_arrow()
    with pytest.raises(spate.ExecutionError, match="abc"):
        cpu.sql("select cast(x as int) from (values ('1'), ('abc')) v(x)").to_arrow()


def test_errors_leave_the_session_usable(cpu):
    for bad in ["selec 1", "select 1 / 0", "select * from nowhere"]:
        with pytest.raises(spate.Error):
            cpu.sql(bad).to_arrow()
    assert cpu.sql("select 41 + 1 as x").to_pandas()["x"][0] == 42


def test_no_call_panics(sdf, session):
    """A sweep of malformed calls: each raises an ordinary exception (a spate.Error or
    TypeError/ValueError/OverflowError from argument conversion), never pyo3's
    PanicException (which is a BaseException, not an Exception)."""
    frame = sdf._frame
    calls = [
        lambda: frame.sort([_spate.Expr.col("i")], [True, False], [True]),
        lambda: frame.limit(2**70, 0),
        lambda: frame.limit(-1, 0),
        lambda: pa.table(frame.select([])),
        lambda: frame.aggregate([], []).count(),
        lambda: frame.merge(frame, "inner", ["i"], [], ("_x", "_y")),
        lambda: frame.merge(frame, "left", [], [], ("_x", "_y")),
        lambda: frame.with_column("", _spate.Expr.col("nope")),
        lambda: frame.rename({"i": "j"}).columns(),
        lambda: frame.parse_expr(""),
        lambda: frame.distinct_on([], [], []),
        lambda: frame.distinct_on([_spate.Expr.col("i")], [_spate.Expr.col("i")], []),
        lambda: _spate.Expr.lit(pa.array([], pa.int64())),
        lambda: _spate.Expr.case([]),
        lambda: _spate.Expr.col("i").cast(pa.list_(pa.int64())).alias("x"),
        lambda: pa.table(frame.select([_spate.Expr.col("s").cast(pa.int64())])),
        lambda: pa.table(frame.select([_spate.Expr.col("i").cast(pa.timestamp("s"))])),
        lambda: pa.table(frame.select([_spate.Expr.col("i").binary("/", _spate.Expr.col("i"))])),
        lambda: session.sql("select " + "(" * 500 + "1" + ")" * 500),
        lambda: session.sql("select a from (values (1)) t(a) where a = 'x'").to_arrow(),
        lambda: session.register("bad name!", pd.DataFrame({"a": [1]})),
        lambda: session.cache("nope"),
        lambda: session.uncache("nope"),
        lambda: session.from_arrow(pa.table({"a": [1]}), name=""),
        lambda: session.sql("set datafusion.execution.batch_size = 'abc'"),
        lambda: session.sql("explain analyze select 1 / 0").to_arrow(),
    ]
    for call in calls:
        try:
            call()
        except (spate.Error, TypeError, ValueError, OverflowError):
            pass
    # Still alive and well.
    assert len(sdf) > 0
