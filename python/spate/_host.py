"""Crossing to the host on request (``to_numpy``, ``__array__``, ``__dlpack__``,
``to_cupy``), writing files by the engine (``to_parquet``, ``to_csv``, ``to_json``), and
Python functions over Arrow batches (``apply``, ``map``)."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from spate import _spate
from spate._util import col, unsupported
from spate.errors import UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    import numpy

    from spate.column import Column
    from spate.frame import DataFrame

#: Rows run on the host to find the type a Python function returns.
_SAMPLE_ROWS = 16


def _infer_type(results: list[Any]) -> pa.DataType:
    """The Arrow type of a Python function's results (string when they are all None)."""
    present = [r for r in results if r is not None]
    if not present:
        return pa.string()
    try:
        kind = pa.array(present).type
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise UnsupportedError(f"the function returns values Arrow cannot hold: {e}") from None
    return pa.float64() if pa.types.is_null(kind) else kind


def python_column(column: Column, func: Callable[[Any], Any], skip_nulls: bool) -> Column:
    """``func`` of each value of ``column``, on the CPU: its result type comes from running
    it on the first rows (one small query)."""
    import numpy as np

    ufunc = isinstance(func, np.ufunc)

    def apply_values(values: pa.Array) -> list[Any]:
        items = values.to_pylist()
        return [None if skip_nulls and v is None else func(v) for v in items]

    def run_ufunc(values: pa.Array, kind: pa.DataType | None) -> pa.Array:
        # NumPy has no nulls: compute on the values with nulls filled, then null them again.
        filled = values.fill_null(0) if values.null_count else values
        result = func(filled.to_numpy(zero_copy_only=False))
        mask = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
        return pa.array(result, type=kind, mask=mask)

    plan, expr = column._computed()
    sample = pa.table(plan.select([expr.alias("v")]).limit(_SAMPLE_ROWS, 0)).column(0)
    sample = sample.combine_chunks()
    if ufunc:
        kind = run_ufunc(sample, None).type if len(sample) else pa.float64()
    else:
        kind = _infer_type(apply_values(sample))

    def call(arrays: list[pa.Array]) -> pa.Array:
        if ufunc:
            return run_ufunc(arrays[0], kind)
        return pa.array(apply_values(arrays[0]), type=kind)

    name = getattr(func, "__name__", "function")
    expr = _spate.Expr.python_function(f"python:{name}", call, [column._expr], kind)
    return column._new(expr)


def dlpack_array(column: Column) -> numpy.ndarray:
    """The column's values as a NumPy array sharing the result's Arrow buffer: numeric and
    without nulls (DLPack has no validity mask)."""
    values = column.to_arrow().combine_chunks()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        raise UnsupportedError(
            f"__dlpack__ needs a numeric column; {column.name!r} is {values.type}"
        )
    if values.null_count:
        raise UnsupportedError(
            f"__dlpack__: {column.name!r} has {values.null_count} nulls, which DLPack cannot "
            "represent; fillna first"
        )
    return values.to_numpy(zero_copy_only=True)


def to_cupy(values: numpy.ndarray) -> Any:
    """``values`` copied to the GPU as a CuPy array."""
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError:
        raise UnsupportedError("to_cupy needs CuPy installed (pip install cupy-cuda12x)") from None
    return cupy.asarray(values)


class HostMixin:
    """The host-crossing, writing and Python-function methods of :class:`spate.DataFrame`."""

    __slots__ = ()

    def to_numpy(
        self: Any, dtype: Any = None, copy: bool = False, na_value: Any = None
    ) -> numpy.ndarray:
        """Runs the plan and returns the values as a 2-D NumPy array (index columns left
        out, as pandas keeps the index apart)."""
        frame = self.to_pandas()
        if na_value is not None:
            return frame.to_numpy(dtype=dtype, na_value=na_value)
        return frame.to_numpy(dtype=dtype)

    @property
    def values(self: Any) -> numpy.ndarray:
        """:meth:`to_numpy`."""
        return self.to_numpy()

    def __array__(self: Any, dtype: Any = None, copy: bool | None = None) -> numpy.ndarray:
        import numpy as np

        return np.asarray(self.to_numpy(), dtype=dtype)

    def to_cupy(self: Any) -> Any:
        """The values as a 2-D CuPy array (CuPy must be installed)."""
        return to_cupy(self.to_numpy())

    def _write(self: Any, path: Any, fmt: str, index: bool | None) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise UnsupportedError(
                f"to_{fmt}: the engine writes to a path; got {type(path).__name__}"
            )
        frame = self
        if index is False and self._index:
            frame = self.reset_index(drop=True)
        frame._ordered_plan().write(os.fspath(path), fmt)

    def _written_text(self: Any, fmt: str, index: bool | None) -> str:
        """What the engine writes as ``fmt``, as a string (the same text as a file gets)."""
        with tempfile.TemporaryDirectory(prefix="spate-") as folder:
            path = os.path.join(folder, f"out.{fmt}")
            self._write(path, fmt, index)
            with open(path, encoding="utf-8") as text:
                return text.read()

    def to_parquet(
        self: Any,
        path: Any,
        engine: str = "auto",
        compression: str | None = "snappy",
        index: bool | None = None,
        partition_cols: Any = None,
        **kwargs: Any,
    ) -> None:
        """Runs the plan and writes the result to one Parquet file by the engine (with its
        own compression settings: ``compression`` is not passed on). Index columns are
        written as columns."""
        if engine != "auto":
            unsupported("to_parquet", "engine", engine, "'auto' (the engine writes)")
        if partition_cols is not None:
            unsupported("to_parquet", "partition_cols", partition_cols)
        if kwargs:
            unsupported("to_parquet", next(iter(kwargs)), kwargs[next(iter(kwargs))])
        self._write(path, "parquet", index)

    def to_csv(
        self: Any,
        path_or_buf: Any = None,
        sep: str = ",",
        na_rep: str = "",
        header: bool = True,
        index: bool = True,
        **kwargs: Any,
    ) -> str | None:
        """Runs the plan and writes CSV with a header: to a file by the engine, or, with no
        path, returns it as a string. A frame has no row index to write; index columns are
        written unless ``index=False``."""
        if sep != ",":
            unsupported("to_csv", "sep", sep, "','")
        if na_rep != "":
            unsupported("to_csv", "na_rep", na_rep, "''")
        if not header:
            unsupported("to_csv", "header", header, "True")
        if kwargs:
            unsupported("to_csv", next(iter(kwargs)), kwargs[next(iter(kwargs))])
        if path_or_buf is None:
            return self._written_text("csv", index)
        self._write(path_or_buf, "csv", index)
        return None

    def to_json(
        self: Any,
        path_or_buf: Any = None,
        orient: str | None = "records",
        lines: bool = True,
        **kwargs: Any,
    ) -> str | None:
        """Runs the plan and writes newline-delimited JSON (``orient="records"``,
        ``lines=True``; pandas' defaults differ, and its other layouts are not supported):
        to a file by the engine, or, with no path, returns it as a string."""
        if orient != "records":
            unsupported("to_json", "orient", orient, "'records'")
        if not lines:
            unsupported("to_json", "lines", lines, "True")
        if kwargs:
            unsupported("to_json", next(iter(kwargs)), kwargs[next(iter(kwargs))])
        if path_or_buf is None:
            return self._written_text("json", None)
        self._write(path_or_buf, "json", None)
        return None

    def apply(
        self: Any,
        func: Callable[..., Any],
        axis: int | str = 0,
        raw: bool = False,
        result_type: Any = None,
        args: tuple[Any, ...] = (),
        **kwargs: Any,
    ) -> Column:
        """``func`` of each row (``axis=1``): a column computed on the CPU, one pandas frame
        per Arrow batch (``batch.apply(func, axis=1)``, so the function sees a pandas
        Series per row). The result type comes from running it on the first rows."""
        if axis not in (1, "columns"):
            unsupported("apply", "axis", axis, "1 (a function of each row)")
        if raw:
            unsupported("apply", "raw", raw, "False")
        if result_type is not None:
            unsupported("apply", "result_type", result_type)
        from spate.column import Column

        names = self.columns

        def run(batch: Any) -> list[Any]:
            if len(batch) == 0:
                return []
            return list(batch.apply(func, axis=1, args=args, **kwargs))

        sample = self._frame.select([col(c) for c in names]).limit(_SAMPLE_ROWS, 0)
        kind = _infer_type(run(pa.table(sample).to_pandas()))

        def call(arrays: list[pa.Array]) -> pa.Array:
            batch = pa.Table.from_arrays(arrays, names=names).to_pandas()
            return pa.array(run(batch), type=kind)

        name = getattr(func, "__name__", "function")
        expr = _spate.Expr.python_function(f"python:{name}", call, [col(c) for c in names], kind)
        return Column(expr, self, name)

    def map(self: Any, func: Callable[[Any], Any], na_action: str | None = None) -> DataFrame:
        """``func`` of each value of every column (pandas' ``DataFrame.map``), on the CPU."""
        if na_action not in (None, "ignore"):
            unsupported("map", "na_action", na_action, "None and 'ignore'")
        exprs = {c: self[c].map(func, na_action=na_action)._expr for c in self.columns}
        return self._with_columns(exprs)
