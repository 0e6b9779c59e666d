"""The pandas-like DataFrame API: lazy plans over a Spate session.

A :class:`DataFrame` is a query plan, not data. Selecting, filtering, grouping, merging and
sorting build a bigger plan; :meth:`DataFrame.to_arrow`, :meth:`DataFrame.to_pandas`,
:meth:`DataFrame.to_polars`, ``len(df)`` and ``repr(df)`` run it, on the session's backend (the
GPU when there is one).

Where pandas and SQL disagree, Spate follows pandas:

- ``/`` is true division (the result is float64 even for integers);
- ``groupby`` drops rows whose keys are null (``dropna=True``), sorts by the keys
  (``sort=True``) and puts them in the index (``as_index=True``);
- ``sum`` of a group with no values is 0, ``count`` counts non-null values;
- ``merge`` matches null keys with each other and suffixes clashing columns with ``_x`` /
  ``_y``;
- ``%`` takes the divisor's sign (``-7 % 3`` is 2), and a zero divisor gives null (pandas:
  NaN) instead of failing;
- ``round`` rounds floats half to even (``2.5`` to 2);
- ``isin`` is never null: a null is in ``values`` only when None or NaN is among them;
- ``+`` on strings concatenates.

Where Spate deliberately differs from pandas:

- Comparisons with null give null, and filtering drops rows where the mask is null (as cuDF
  does). pandas gives False, so ``df[df.a > 0]`` keeps the same rows, but ``~(df.a > 0)``
  keeps rows where ``a`` is null in pandas and drops them in Spate. String predicates
  (``str.contains``, ``str.startswith``, ``str.endswith``) are null for null values too;
  ``str.contains`` takes ``na=`` as pandas does.
- There is no row index, so rows are not aligned by label: a Column can only be used with a
  frame that has the columns it reads (``df[["a"]].assign(x=df.b)`` is a ``PlanError``;
  write ``df.assign(x=df.b)[["a", "x"]]``). The index after ``groupby`` (or
  ``set_index``) is a set of key columns that :meth:`DataFrame.to_pandas` turns into the
  pandas index.
- Row order is only defined after ``sort_values``. A frame that spans several batches (more
  than ``batch_size`` rows, 8192 by default) comes back from a plain ``to_pandas`` in an
  order of its partitions, not necessarily the input's; ``groupby(sort=False)`` and
  ``drop_duplicates`` do not keep first-appearance order, and which duplicate
  ``drop_duplicates`` keeps is unspecified.
- ``groupby(...).agg(["sum", "max"])`` names its columns ``v_sum``, ``v_max`` in Arrow
  (``to_arrow``, ``to_polars``, SQL), which has no two-level header; ``to_pandas`` shows
  pandas' ``(v, sum)`` header. An aggregate cannot take the name of a group key (use a
  named aggregation); ``size()`` and aggregations of one selected column return a frame
  (``size`` is a column named ``size``), not a Series.
- Nulls are nulls: pandas' NaN, None, NA and NaT all become null on the way in, while a NaN
  computed by Spate (``0.0 / 0.0``) is a float value, not null (``isnull()`` is False for
  it). ``astype`` of a null to an integer gives null (pandas raises).
- :attr:`DataFrame.dtypes` maps names to Arrow types (a dict), not NumPy dtypes.
"""

from __future__ import annotations

import itertools
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    NamedTuple,
    Sequence,
    Union,
)

import pyarrow as pa

from spate import _spate
from spate.errors import ConfigError, PlanError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import polars

    from spate.session import Session

__all__ = ["DataFrame", "Column", "GroupBy", "StringMethods"]

#: A value a Column can be combined with: another Column or a Python/pyarrow scalar.
Operand = Union["Column", Any]

#: Rows ``repr(df)`` shows.
REPR_ROWS = 10


def _lit(value: Operand) -> _spate.Expr:
    """The expression for ``value``: a Column's own, or a literal of pyarrow's inferred type."""
    if isinstance(value, Column):
        return value._expr
    if isinstance(value, pa.Scalar):
        array = pa.array([value.as_py()], type=value.type)
    else:
        if isinstance(value, (list, tuple, set, frozenset, dict)) or (
            hasattr(value, "__len__") and not isinstance(value, (str, bytes))
        ):
            # pandas would take a sequence as one value per row, aligned by position or
            # index; a Spate frame has neither, and a list literal would be a silent mistake.
            raise TypeError(
                f"expected a Column or a scalar, got {type(value).__name__}: Spate cannot "
                "align a sequence with a frame's rows; register it as a table and merge it, "
                "or wrap a list value in pyarrow.scalar"
            )
        try:
            array = pa.array([value])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise TypeError(f"cannot use {value!r} as a value in an expression: {e}") from None
    return _spate.Expr.lit(array)


#: ``DataFrame.nearest``'s metrics, by the SQL function each calls.
_DISTANCES = {
    "cosine": "cosine_distance",
    "ip": "inner_product",
    "inner_product": "inner_product",
    "l2": "array_distance",
    "euclidean": "array_distance",
}


def _query_vectors(queries: Any) -> tuple[list[list[float]], bool]:
    """``nearest``'s queries as lists of floats, and whether there was a single vector."""
    def as_list(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else value

    queries = as_list(queries)
    if not isinstance(queries, (list, tuple)) or not queries:
        raise ConfigError("nearest: queries must be a non-empty vector or list of vectors")
    queries = [as_list(q) for q in queries]
    single = not isinstance(queries[0], (list, tuple))
    vectors = [queries] if single else list(queries)
    out = []
    for v in vectors:
        if not isinstance(v, (list, tuple)) or not v:
            raise ConfigError("nearest: every query must be a non-empty vector")
        try:
            out.append([float(x) for x in v])
        except (TypeError, ValueError):
            raise ConfigError("nearest: a query vector holds something that is not a number") from None
    if len({len(v) for v in out}) > 1:
        raise ConfigError("nearest: the query vectors have different lengths")
    return out, single


def _is_missing(value: Any) -> bool:
    """Whether ``value`` is a null marker: None, NaN, or pandas' NA/NaT."""
    if value is None:
        return True
    if isinstance(value, float):
        return value != value
    try:
        import pandas as pd

        return value is pd.NA or value is pd.NaT
    except ImportError:  # pragma: no cover - pandas is optional
        return False


def _python_mod(left: _spate.Expr, right: _spate.Expr) -> _spate.Expr:
    """``left % right`` as Python and pandas compute it: the remainder has the sign of the
    divisor (SQL's ``%`` gives it the dividend's: ``-7 % 3`` is 2, not -1), and a zero divisor
    gives null where pandas gives NaN (SQL fails the query on integers)."""
    zero = _lit(0)
    divisor = _spate.Expr.function("nullif", [right, zero])
    remainder = left.binary("%", divisor)
    signs_differ = remainder.binary("<", zero).binary("!=", divisor.binary("<", zero))
    needs_fix = remainder.binary("!=", zero).binary("&", signs_differ)
    return _spate.Expr.case([(needs_fix, remainder.binary("+", divisor))], remainder)


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _pandas_dtype_mapper(backend: str | None) -> Callable[[pa.DataType], Any] | None:
    """A pyarrow ``types_mapper`` for pandas' ``dtype_backend`` argument."""
    if backend is None:
        return None
    import pandas as pd

    if backend == "pyarrow":
        return pd.ArrowDtype
    if backend != "numpy_nullable":
        raise ConfigError(
            f"dtype_backend must be None, 'numpy_nullable' or 'pyarrow', got {backend!r}"
        )
    mapping = {
        pa.int8(): pd.Int8Dtype(),
        pa.int16(): pd.Int16Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
        pa.uint8(): pd.UInt8Dtype(),
        pa.uint16(): pd.UInt16Dtype(),
        pa.uint32(): pd.UInt32Dtype(),
        pa.uint64(): pd.UInt64Dtype(),
        pa.bool_(): pd.BooleanDtype(),
        pa.float32(): pd.Float32Dtype(),
        pa.float64(): pd.Float64Dtype(),
        pa.string(): pd.StringDtype(),
        pa.large_string(): pd.StringDtype(),
        pa.string_view(): pd.StringDtype(),
    }
    return mapping.get


class DataFrame:
    """A lazy, pandas-like table: a query plan in a :class:`spate.Session`.

    Build one with :meth:`Session.sql`, the readers (:func:`spate.read_parquet`,
    :func:`spate.from_pandas`, ...) or from another DataFrame's methods. Nothing runs until a
    result is asked for.
    """

    __slots__ = ("_frame", "_session", "_index", "_table_name", "_levels", "__weakref__")

    def __init__(
        self,
        frame: _spate.Frame,
        session: Session,
        index: Sequence[str] = (),
        table_name: str | None = None,
        levels: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        self._frame = frame
        self._session = session
        self._index: tuple[str, ...] = tuple(index)
        self._table_name = table_name
        # pandas' two-level header, (column, function), of the columns `agg` made from a list:
        # Arrow has one level, so they are named `column_function`, and to_pandas restores it.
        self._levels: dict[str, tuple[str, str]] = dict(levels or {})

    def _derive(self, frame: _spate.Frame, index: Sequence[str] | None = None) -> DataFrame:
        names = set(frame.columns())
        if index is None:
            index = tuple(i for i in self._index if i in names)
        levels = {c: level for c, level in self._levels.items() if c in names}
        return DataFrame(frame, self._session, index, levels=levels)

    # ----- shape and schema ------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The session this frame's plan runs in."""
        return self._session

    @property
    def table_name(self) -> str | None:
        """The name this frame is registered under in its session (usable from SQL), or None
        for a derived frame."""
        return self._table_name

    @property
    def columns(self) -> list[str]:
        """The column names, in order, without the index columns."""
        return [c for c in self._frame.columns() if c not in self._index]

    @property
    def index_columns(self) -> list[str]:
        """The columns :meth:`to_pandas` turns into the index (after ``groupby`` or
        :meth:`set_index`)."""
        return list(self._index)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the result, index columns included."""
        return self._frame.schema()

    @property
    def dtypes(self) -> dict[str, pa.DataType]:
        """Each column's Arrow type, without the index columns."""
        schema = self.schema
        return {name: schema.field(name).type for name in self.columns}

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, columns)``; counting the rows runs the plan."""
        return (len(self), len(self.columns))

    def __len__(self) -> int:
        """The number of rows (runs the plan)."""
        return self._frame.count()

    def __iter__(self) -> Iterator[str]:
        """Iterates over the column names, as pandas does."""
        return iter(self.columns)

    def __contains__(self, name: object) -> bool:
        return name in self._frame.columns()

    # ----- selection ---------------------------------------------------------------------

    def __getitem__(self, key: str | Sequence[str] | Column | slice) -> Any:
        """``df["a"]`` is a :class:`Column`; ``df[["a", "b"]]`` selects columns;
        ``df[mask]`` keeps the rows where a boolean Column is true; ``df[:n]`` the first n
        rows."""
        if isinstance(key, str):
            if key not in self._frame.columns():
                raise PlanError(
                    f"no column '{key}'; the columns are: {', '.join(self._frame.columns())}"
                )
            return Column(_spate.Expr.col(key), self, key)
        if isinstance(key, Column):
            return self.filter(key)
        if isinstance(key, slice):
            if key.step not in (None, 1) or (key.start or 0) < 0 or (
                key.stop is not None and key.stop < 0
            ):
                raise UnsupportedError("only df[start:stop] with non-negative bounds is supported")
            start = key.start or 0
            count = None if key.stop is None else max(key.stop - start, 0)
            return self._derive(self._frame.limit(count, start))
        names = _names(key)
        missing = [n for n in names if n not in self._frame.columns()]
        if missing:
            raise PlanError(
                f"no column {', '.join(repr(m) for m in missing)}; the columns are: "
                f"{', '.join(self._frame.columns())}"
            )
        keep = list(dict.fromkeys([*self._index, *names]))
        return self._derive(self._frame.select([_spate.Expr.col(n) for n in keep]))

    def __getattr__(self, name: str) -> Column:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._frame.columns():
            return Column(_spate.Expr.col(name), self, name)
        raise AttributeError(f"'DataFrame' has no attribute or column '{name}'")

    def _operand(self, value: Operand) -> _spate.Expr:
        """The expression for ``value`` in this frame. A Column may come from another frame
        (``df[df2.a > 0]``), but it can only read columns this frame has: Spate frames have
        no index to align rows of different frames on, as pandas does."""
        expr = _lit(value)
        if isinstance(value, Column):
            have = set(self._frame.columns())
            missing = [c for c in expr.column_names() if c not in have]
            if missing:
                raise PlanError(
                    f"the expression {value.name!r} reads column(s) "
                    f"{', '.join(repr(m) for m in missing)} that this DataFrame does not have "
                    f"(its columns: {', '.join(self._frame.columns())}). Spate does not align "
                    "rows of different frames by index: compute the column on the frame it "
                    "comes from (e.g. df.assign(x=...)[['id', 'x']])"
                )
        return expr

    def __setitem__(self, name: str, value: Operand) -> None:
        """``df["c"] = df.a * 2`` adds or replaces column ``c`` (this frame's plan changes)."""
        self._frame = self._frame.with_column(name, self._operand(value))

    def filter(self, predicate: Column | str) -> DataFrame:
        """The rows where ``predicate`` is true: a boolean Column (``df.a > 2``) or a SQL
        expression (``"a > 2 AND b IS NOT NULL"``). Rows where it is null are dropped."""
        if isinstance(predicate, str):
            expr = self._frame.parse_expr(predicate)
        elif isinstance(predicate, Column):
            expr = self._operand(predicate)
        else:
            raise TypeError(
                f"filter expects a boolean Column or a SQL expression string, got "
                f"{type(predicate).__name__}"
            )
        return self._derive(self._frame.filter(expr))

    def query(self, expr: str) -> DataFrame:
        """The rows where the SQL expression ``expr`` is true (like :meth:`filter`)."""
        return self.filter(expr)

    def assign(self, **columns: Operand | Callable[[DataFrame], Operand]) -> DataFrame:
        """A frame with the given columns added or replaced. Values are Columns, scalars, or
        callables taking the frame (evaluated in order, so later ones see earlier ones)."""
        frame = self
        for name, value in columns.items():
            if callable(value) and not isinstance(value, Column):
                value = value(frame)
            frame = frame._derive(frame._frame.with_column(name, frame._operand(value)))
        return frame

    def drop(self, columns: str | Sequence[str]) -> DataFrame:
        """A frame without ``columns``."""
        drop = set(_names(columns))
        missing = drop - set(self._frame.columns())
        if missing:
            raise PlanError(f"cannot drop missing column(s): {', '.join(sorted(missing))}")
        keep = [c for c in self._frame.columns() if c not in drop]
        return self._derive(self._frame.select([_spate.Expr.col(c) for c in keep]))

    def rename(self, columns: Mapping[str, str] | Callable[[str], str]) -> DataFrame:
        """A frame with columns renamed by a mapping (unknown names are ignored, as in pandas)
        or a function of the old name."""
        if callable(columns):
            mapping = {c: columns(c) for c in self._frame.columns()}
        else:
            mapping = dict(columns)
        index = [mapping.get(i, i) for i in self._index]
        return self._derive(self._frame.rename(mapping), index=index)

    def set_index(self, keys: str | Sequence[str]) -> DataFrame:
        """Marks ``keys`` as the index :meth:`to_pandas` builds (the columns stay in the
        plan)."""
        names = _names(keys)
        missing = [n for n in names if n not in self._frame.columns()]
        if missing:
            raise PlanError(f"no column(s) {', '.join(missing)} to use as the index")
        return DataFrame(self._frame, self._session, names)

    def reset_index(self, drop: bool = False) -> DataFrame:
        """Turns the index columns back into ordinary columns, or removes them with
        ``drop=True``."""
        if drop and self._index:
            keep = [c for c in self._frame.columns() if c not in self._index]
            return DataFrame(
                self._frame.select([_spate.Expr.col(c) for c in keep]), self._session
            )
        return DataFrame(self._frame, self._session)

    # ----- relational operations ---------------------------------------------------------

    def groupby(
        self,
        by: str | Sequence[str],
        sort: bool = True,
        dropna: bool = True,
        as_index: bool = True,
    ) -> GroupBy:
        """Groups rows by the columns ``by``; aggregate with :meth:`GroupBy.agg` or
        ``.sum()``, ``.mean()``, ``.count()``, ``.min()``, ``.max()``."""
        keys = _names(by)
        missing = [k for k in keys if k not in self._frame.columns()]
        if missing:
            raise PlanError(f"cannot group by missing column(s): {', '.join(missing)}")
        if not keys:
            raise PlanError("groupby needs at least one key column")
        return GroupBy(self, keys, sort=sort, dropna=dropna, as_index=as_index)

    def merge(
        self,
        right: DataFrame,
        how: str = "inner",
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        suffixes: tuple[str, str] = ("_x", "_y"),
        nulls_equal: bool = True,
    ) -> DataFrame:
        """Joins with ``right`` as ``pandas.merge`` does: ``how`` is inner, left, right,
        outer, cross, leftsemi or leftanti; keys are ``on`` (same names on both sides) or
        ``left_on`` / ``right_on``. Without keys, the columns both frames have are the keys.
        Null keys match each other unless ``nulls_equal=False``."""
        if not isinstance(right, DataFrame):
            raise TypeError(f"merge expects a spate DataFrame, got {type(right).__name__}")
        if right._session is not self._session:
            raise PlanError("merge needs both frames in the same session")
        left_frame = self.reset_index()._frame
        right_frame = right.reset_index()._frame
        if how == "cross":
            if on is not None or left_on is not None or right_on is not None:
                raise PlanError("a cross merge takes no keys")
            pair = (suffixes[0], suffixes[1])
            return DataFrame(left_frame.merge(right_frame, "inner", [], [], pair), self._session)
        if on is not None:
            if left_on is not None or right_on is not None:
                raise PlanError("merge takes either on= or left_on=/right_on=, not both")
            lkeys = rkeys = _names(on)
        elif left_on is not None or right_on is not None:
            lkeys, rkeys = _names(left_on), _names(right_on)
            if len(lkeys) != len(rkeys):
                raise PlanError(
                    f"merge: {len(lkeys)} left_on keys but {len(rkeys)} right_on keys"
                )
        else:
            common = [c for c in left_frame.columns() if c in set(right_frame.columns())]
            if not common:
                raise PlanError("merge: no common columns to merge on; pass on= or left_on=")
            lkeys = rkeys = common
        frame = left_frame.merge(
            right_frame, how, lkeys, rkeys, (suffixes[0], suffixes[1]), nulls_equal
        )
        return DataFrame(frame, self._session)

    def sort_values(
        self,
        by: str | Sequence[str],
        ascending: bool | Sequence[bool] = True,
        na_position: str = "last",
    ) -> DataFrame:
        """Sorts by the columns ``by``; ``ascending`` is one bool or one per key, and nulls go
        ``last`` (default) or ``first``."""
        keys = _names(by)
        if isinstance(ascending, bool):
            directions = [ascending] * len(keys)
        else:
            directions = list(ascending)
            if len(directions) != len(keys):
                raise ConfigError(
                    f"sort_values: {len(keys)} keys but {len(directions)} ascending flags"
                )
        if na_position not in ("last", "first"):
            raise ConfigError(f"na_position must be 'last' or 'first', got {na_position!r}")
        first = na_position == "first"
        exprs = [_spate.Expr.col(k) for k in keys]
        return self._derive(self._frame.sort(exprs, directions, [first] * len(keys)))

    def head(self, n: int = 5) -> DataFrame:
        """The first ``n`` rows (in the frame's order, which only ``sort_values`` fixes)."""
        if n < 0:
            raise UnsupportedError("head with a negative n is not supported")
        return self._derive(self._frame.limit(n, 0))

    def nearest(
        self,
        column: str,
        queries: Any,
        k: int = 10,
        metric: str = "cosine",
    ) -> DataFrame:
        """The ``k`` rows whose embedding ``column`` is nearest each query vector, with their
        ``distance``; lazy, like every frame method.

        ``queries`` is one vector (a 1-D numpy array or a list of numbers) or several (a 2-D
        array or a list of lists). ``metric`` is ``"cosine"`` (``cosine_distance``),
        ``"ip"`` (``inner_product``: larger is nearer) or ``"l2"`` (``array_distance``);
        ``k`` goes up to 4096. With one query the result is the rows nearest first; with
        several it has a ``query`` column (the query's position, from 0) and is sorted by it,
        then nearest first. Rows with no distance (a NULL embedding, one holding a NULL
        element, or a zero vector for the cosine) are never returned. It is the plan of
        ``ORDER BY <distance> LIMIT k`` in SQL: on a GPU backend, the GPU top-k. Distances
        accumulate in fp32 (see ``docs/vector.md``).
        """
        function = _DISTANCES.get(metric)
        if function is None:
            raise ConfigError(
                f"nearest: unknown metric {metric!r}; use one of {', '.join(sorted(_DISTANCES))}"
            )
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 4096:
            raise ConfigError(f"nearest: k must be an integer from 1 to 4096, got {k!r}")
        if column not in self.columns:
            raise PlanError(f"nearest: no column {column!r} in {self.columns}")
        for taken in ("distance", "query"):
            if taken in self._frame.columns():
                raise PlanError(
                    f"nearest: the frame already has a column {taken!r}; rename it first"
                )
        vectors, single = _query_vectors(queries)
        larger_is_nearer = function == "inner_product"
        frames = []
        for position, vector in enumerate(vectors):
            literal = _spate.Expr.lit(pa.array([vector], type=pa.list_(pa.float64())))
            distance = _spate.Expr.function(function, [_spate.Expr.col(column), literal])
            frame = self._frame.with_column("distance", distance)
            # NULL distances sort last, so dropping them after the limit leaves the same rows;
            # the sort then keeps the distance as its one key, which the GPU pre-selects by.
            frame = frame.sort([_spate.Expr.col("distance")], [not larger_is_nearer], [False])
            frame = frame.limit(k, 0)
            frame = frame.filter(_spate.Expr.col("distance").is_not_null())
            if not single:
                frame = frame.with_column("query", _lit(position))
            frames.append(frame)
        result = frames[0]
        for frame in frames[1:]:
            result = result.union(frame)
        if not single:
            names = ["query"] + [c for c in result.columns() if c != "query"]
            result = result.select([_spate.Expr.col(n) for n in names])
            result = result.sort(
                [_spate.Expr.col("query"), _spate.Expr.col("distance")],
                [True, not larger_is_nearer],
                [False, False],
            )
        return self._derive(result)

    def drop_duplicates(
        self, subset: str | Sequence[str] | None = None, keep: str = "first"
    ) -> DataFrame:
        """One row per distinct row, or per distinct value of ``subset``. Which of several
        duplicates is kept is unspecified (Spate frames have no row order before a sort);
        ``keep=False`` is not supported."""
        if keep not in ("first", "last"):
            raise UnsupportedError("drop_duplicates supports keep='first' or 'last' only")
        if subset is None:
            return self._derive(self._frame.distinct())
        names = _names(subset)
        return self._derive(
            self._frame.distinct_on([_spate.Expr.col(n) for n in names], [], [])
        )

    # ----- running the plan -------------------------------------------------------------

    def explain(self, analyze: bool = False, verbose: bool = False) -> str:
        """The plan: logical, then physical with where each operator runs (GPU or CPU, and
        why). ``analyze=True`` runs it and adds each operator's metrics."""
        return self._frame.explain(verbose, analyze)

    def to_arrow(self) -> pa.Table:
        """Runs the plan and returns the result as a ``pyarrow.Table`` (no copy)."""
        return pa.table(self._frame)

    def to_pandas(self, dtype_backend: str | None = None) -> pandas.DataFrame:
        """Runs the plan and returns a ``pandas.DataFrame``, with the index columns as its
        index. ``dtype_backend`` is as in ``pandas.read_parquet``: None (NumPy types, nulls
        as NaN/None), ``"numpy_nullable"`` or ``"pyarrow"``."""
        table = self.to_arrow()
        mapper = _pandas_dtype_mapper(dtype_backend)
        frame = table.to_pandas(types_mapper=mapper) if mapper else table.to_pandas()
        if self._index:
            frame = frame.set_index(list(self._index))
        columns = list(frame.columns)
        if self._levels and columns and all(c in self._levels for c in columns):
            import pandas as pd

            frame.columns = pd.MultiIndex.from_tuples([self._levels[c] for c in columns])
        return frame

    def to_polars(self) -> polars.DataFrame:
        """Runs the plan and returns a ``polars.DataFrame`` (index columns included)."""
        import polars as pl

        return pl.DataFrame(self.to_arrow())

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The Arrow PyCapsule stream protocol: ``pyarrow.table(df)`` and
        ``polars.DataFrame(df)`` read the result without copying it (``polars.from_arrow``
        makes any non-pyarrow stream one Series of structs)."""
        return self._frame.__arrow_c_stream__(requested_schema)

    def register(self, name: str) -> DataFrame:
        """Registers this frame's plan as the view ``name`` in its session, for SQL, replacing
        any table of that name."""
        self._session._inner.register_frame(name, self._frame)
        return DataFrame(self._frame, self._session, self._index, name.lower())

    def __repr__(self) -> str:
        head = self._frame.limit(REPR_ROWS + 1, 0)
        table = pa.table(head)
        shown = table.slice(0, REPR_ROWS)
        try:
            text = DataFrame(head, self._session, self._index).to_pandas().head(
                REPR_ROWS
            ).to_string()
        except ImportError:
            text = shown.to_string(preview_cols=0)
        if table.num_rows > REPR_ROWS:
            text += f"\n...\n\n[{len(self)} rows x {len(self.columns)} columns]"
        elif table.num_rows == 0:
            text = f"Empty DataFrame\nColumns: [{', '.join(self.columns)}]"
        return text

    def _repr_html_(self) -> str:
        head = DataFrame(self._frame.limit(REPR_ROWS, 0), self._session, self._index)
        try:
            return head.to_pandas().to_html()
        except ImportError:
            return "<pre>" + repr(self) + "</pre>"


# ----- columns ---------------------------------------------------------------------------


class Column:
    """A column expression of a :class:`DataFrame`: ``df.a``, ``df["a"]``, or computed from
    them (``df.a * 2 > df.b``). Use it to filter (``df[mask]``), in ``assign``, or run it on
    its own (:meth:`to_pandas`, :meth:`sum`, ...)."""

    __slots__ = ("_expr", "_frame", "_name")
    __hash__ = None  # type: ignore[assignment]  # == builds an expression

    def __init__(self, expr: _spate.Expr, frame: DataFrame | None, name: str | None = None):
        self._expr = expr
        self._frame = frame
        self._name = name

    @property
    def name(self) -> str:
        """The output column name."""
        return self._name if self._name is not None else self._expr.output_name()

    def _new(self, expr: _spate.Expr, other: Operand = None) -> Column:
        frame = self._frame
        if frame is None and isinstance(other, Column):
            frame = other._frame
        return Column(expr, frame)

    def _binary(self, op: str, other: Operand) -> Column:
        return self._new(self._expr.binary(op, _lit(other)), other)

    def _rbinary(self, op: str, other: Operand) -> Column:
        return self._new(_lit(other).binary(op, self._expr), other)

    def _is_string(self) -> bool:
        kind = self._type()
        return kind is not None and (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
        )

    def _concatenates(self, other: Operand) -> bool:
        """Whether ``+`` with ``other`` joins strings (pandas' ``"a" + "b"``)."""
        if isinstance(other, str):
            return True
        return self._is_string() or (isinstance(other, Column) and other._is_string())

    def __add__(self, other: Operand) -> Column:
        # On strings, + concatenates; a null on either side gives null, as in pandas.
        return self._binary("||" if self._concatenates(other) else "+", other)

    def __radd__(self, other: Operand) -> Column:
        return self._rbinary("||" if self._concatenates(other) else "+", other)

    def __sub__(self, other: Operand) -> Column:
        return self._binary("-", other)

    def __rsub__(self, other: Operand) -> Column:
        return self._rbinary("-", other)

    def __mul__(self, other: Operand) -> Column:
        return self._binary("*", other)

    def __rmul__(self, other: Operand) -> Column:
        return self._rbinary("*", other)

    def __truediv__(self, other: Operand) -> Column:
        # pandas' true division: float64 even for integers.
        left = self._expr.cast(pa.float64())
        return self._new(left.binary("/", _lit(other)), other)

    def __rtruediv__(self, other: Operand) -> Column:
        left = _lit(other).cast(pa.float64())
        return self._new(left.binary("/", self._expr), other)

    def __mod__(self, other: Operand) -> Column:
        # pandas' (Python's) modulo: the result takes the divisor's sign.
        return self._new(_python_mod(self._expr, _lit(other)), other)

    def __rmod__(self, other: Operand) -> Column:
        return self._new(_python_mod(_lit(other), self._expr), other)

    def __pow__(self, other: Operand) -> Column:
        left = self._expr.cast(pa.float64())
        return self._new(_spate.Expr.function("power", [left, _lit(other)]), other)

    def __eq__(self, other: Operand) -> Column:  # type: ignore[override]
        return self._binary("==", other)

    def __ne__(self, other: Operand) -> Column:  # type: ignore[override]
        return self._binary("!=", other)

    def __lt__(self, other: Operand) -> Column:
        return self._binary("<", other)

    def __le__(self, other: Operand) -> Column:
        return self._binary("<=", other)

    def __gt__(self, other: Operand) -> Column:
        return self._binary(">", other)

    def __ge__(self, other: Operand) -> Column:
        return self._binary(">=", other)

    def __and__(self, other: Operand) -> Column:
        return self._binary("&", other)

    def __rand__(self, other: Operand) -> Column:
        return self._rbinary("&", other)

    def __or__(self, other: Operand) -> Column:
        return self._binary("|", other)

    def __ror__(self, other: Operand) -> Column:
        return self._rbinary("|", other)

    def __invert__(self) -> Column:
        return self._new(self._expr.invert())

    def __neg__(self) -> Column:
        return self._new(self._expr.negate())

    def __abs__(self) -> Column:
        return self.abs()

    def __bool__(self) -> bool:
        raise TypeError(
            "the truth value of a Column is ambiguous: combine masks with & | ~, not "
            "and/or/not"
        )

    def abs(self) -> Column:
        """The absolute value."""
        return self._new(_spate.Expr.function("abs", [self._expr]))

    def _type(self) -> pa.DataType | None:
        """The Arrow type of this expression in its frame (planning only, nothing runs), or
        None for a column not attached to a frame."""
        if self._frame is None:
            return None
        return self._frame._frame.select([self._expr]).schema().field(0).type

    def round(self, decimals: int = 0) -> Column:
        """Rounded to ``decimals`` places. Floats round half to even, as in pandas and NumPy
        (``2.5`` becomes 2, SQL's ``round`` gives 3); integers are unchanged for
        ``decimals >= 0``."""
        kind = self._type()
        if kind is not None and pa.types.is_integer(kind) and decimals >= 0:
            return self
        if kind is None or not pa.types.is_floating(kind):
            return self._new(_spate.Expr.function("round", [self._expr, _lit(decimals)]))
        # As NumPy does: multiply by 10**decimals, or divide by 10**-decimals when negative.
        scale = _lit(10.0 ** abs(decimals))
        scale_up, scale_down = ("*", "/") if decimals >= 0 else ("/", "*")
        scaled = self._expr.binary(scale_up, scale)
        fraction = _spate.Expr.function(
            "abs", [scaled.binary("-", _spate.Expr.function("trunc", [scaled]))]
        )
        # A tie (exactly .5 after scaling) goes to the even neighbour: 2 * round(y / 2).
        even = _lit(2.0).binary(
            "*", _spate.Expr.function("round", [scaled.binary("/", _lit(2.0))])
        )
        nearest = _spate.Expr.function("round", [scaled])
        rounded = _spate.Expr.case([(fraction.binary("==", _lit(0.5)), even)], nearest)
        return self._new(rounded.binary(scale_down, scale))

    def isin(self, values: Iterable[Any]) -> Column:
        """True where the value is one of ``values``, else False, never null: as in pandas, a
        null is not in ``values`` unless a null marker (None, NaN, ``pd.NA``) is among them.
        (pandas' rule depends on the dtype, e.g. an ``Int64`` NA only matches ``pd.NA`` and a
        float NaN only ``NaN``; Spate has one null, which any of them matches.)"""
        values = list(values)
        present = [v for v in values if not _is_missing(v)]
        if not present:
            return self._new(self._expr.is_null() if values else _lit(False))
        matches = self._expr.isin([_lit(v) for v in present])
        if len(present) < len(values):
            return self._new(matches.binary("|", self._expr.is_null()))
        return self._new(_spate.Expr.function("coalesce", [matches, _lit(False)]))

    def between(self, left: Operand, right: Operand, inclusive: str = "both") -> Column:
        """True where ``left <= value <= right`` (``inclusive``: both, neither, left,
        right)."""
        lower = self >= left if inclusive in ("both", "left") else self > left
        upper = self <= right if inclusive in ("both", "right") else self < right
        return lower & upper

    def isnull(self) -> Column:
        """True where the value is null (NaN in pandas input becomes null)."""
        return self._new(self._expr.is_null())

    isna = isnull

    def notnull(self) -> Column:
        """True where the value is not null."""
        return self._new(self._expr.is_not_null())

    notna = notnull

    def fillna(self, value: Operand) -> Column:
        """Nulls replaced by ``value``."""
        return self._new(_spate.Expr.function("coalesce", [self._expr, _lit(value)]), value)

    def astype(self, dtype: Any) -> Column:
        """Cast to ``dtype``: a pyarrow type, a NumPy dtype or its name (``"int32"``,
        ``"float64"``), or ``"str"``. Booleans become ``"True"`` / ``"False"`` as in pandas;
        other values are formatted as Arrow formats them (floats with exponents differ from
        Python's: ``1e20`` rather than ``1e+20``)."""
        target = _arrow_type(dtype)
        if pa.types.is_string(target) and pa.types.is_boolean(self._type()):
            text = _spate.Expr.case(
                [(self._expr, _lit("True")), (self._expr.invert(), _lit("False"))]
            )
            return self._new(text)
        return self._new(self._expr.cast(target))

    def alias(self, name: str) -> Column:
        """The same values under the column name ``name``."""
        return Column(self._expr.alias(name), self._frame, name)

    rename = alias

    # ----- running a column on its own -----------------------------------------------------

    def _owner(self) -> DataFrame:
        if self._frame is None:
            raise PlanError("this column is not attached to a DataFrame")
        return self._frame

    def _aggregate(self, name: str, distinct: bool = False) -> Any:
        owner = self._owner()
        value = self._expr
        if name in ("sum", "avg") and pa.types.is_boolean(self._type()):
            # pandas counts True as 1: the sum of a mask is its number of True values.
            value = value.cast(pa.int64() if name == "sum" else pa.float64())
        agg = _spate.Expr.aggregate(name, [value], distinct).alias("value")
        frame = owner._frame.aggregate([], [agg])
        return pa.table(frame).column(0)[0].as_py()

    def sum(self) -> Any:
        """The sum of the non-null values (0 when there are none, as in pandas)."""
        result = self._aggregate("sum")
        return 0 if result is None else result

    def mean(self) -> Any:
        """The mean of the non-null values (None when there are none)."""
        return self._aggregate("avg")

    def min(self) -> Any:
        """The smallest non-null value."""
        return self._aggregate("min")

    def max(self) -> Any:
        """The largest non-null value."""
        return self._aggregate("max")

    def count(self) -> int:
        """The number of non-null values."""
        return int(self._aggregate("count"))

    def nunique(self) -> int:
        """The number of distinct non-null values."""
        return int(self._aggregate("count", distinct=True))

    def to_arrow(self) -> pa.ChunkedArray:
        """Runs the column's plan and returns its values."""
        frame = self._owner()._frame.select([self._expr.alias(self.name)])
        return pa.table(frame).column(0)

    def to_pandas(self) -> pandas.Series:
        """Runs the column's plan and returns a ``pandas.Series``."""
        return self.to_arrow().to_pandas().rename(self.name)

    def to_polars(self) -> polars.Series:
        """Runs the column's plan and returns a ``polars.Series``."""
        import polars as pl

        return pl.Series(self.name, self.to_arrow())

    def __len__(self) -> int:
        return len(self._owner())

    def __repr__(self) -> str:
        return f"Column({self.name}: {self._expr!r})"

    # Last in the class: from here on, `str` in annotations would mean this property.
    @property
    def str(self) -> StringMethods:
        """String methods: ``contains``, ``startswith``, ``endswith``, ``lower``, ...."""
        return StringMethods(self)


def _arrow_type(dtype: Any) -> pa.DataType:
    if isinstance(dtype, pa.DataType):
        return dtype
    if dtype in (str, "str", "string", "object"):
        return pa.string()
    if dtype in (bool, "bool", "boolean"):
        return pa.bool_()
    if dtype is int:
        return pa.int64()
    if dtype is float:
        return pa.float64()
    try:
        import numpy as np

        return pa.from_numpy_dtype(np.dtype(dtype))
    except Exception as e:
        raise ConfigError(f"cannot cast to {dtype!r}: not a type Spate knows ({e})") from None


class StringMethods:
    """String functions of a Column (``df.name.str.contains("x")``), as in pandas."""

    __slots__ = ("_column",)

    def __init__(self, column: Column) -> None:
        self._column = column

    def _call(self, function: str, *args: Operand) -> Column:
        exprs = [self._column._expr, *(_lit(a) for a in args)]
        return self._column._new(_spate.Expr.function(function, exprs))

    def contains(
        self, pat: str, case: bool = True, regex: bool = True, na: bool | None = None
    ) -> Column:
        """True where the value contains ``pat``: a regular expression unless
        ``regex=False``; ``case=False`` ignores case; ``na`` replaces the result for nulls."""
        if regex:
            args: list[Operand] = [pat] if case else [pat, "i"]
            result = self._call("regexp_like", *args)
        elif case:
            result = self._call("contains", pat)
        else:
            lowered = self.lower()
            result = lowered._new(
                _spate.Expr.function("contains", [lowered._expr, _lit(pat.lower())])
            )
        return result if na is None else result.fillna(na)

    def startswith(self, prefix: str) -> Column:
        """True where the value starts with ``prefix``."""
        return self._call("starts_with", prefix)

    def endswith(self, suffix: str) -> Column:
        """True where the value ends with ``suffix``."""
        return self._call("ends_with", suffix)

    def lower(self) -> Column:
        """Lower-cased."""
        return self._call("lower")

    def upper(self) -> Column:
        """Upper-cased."""
        return self._call("upper")

    def len(self) -> Column:
        """The length in characters."""
        return self._call("character_length")

    def strip(self) -> Column:
        """Without leading and trailing whitespace."""
        return self._call("btrim")

    def replace(self, pat: str, repl: str, regex: bool = False) -> Column:
        """Every occurrence of ``pat`` replaced by ``repl`` (a regular expression with
        ``regex=True``)."""
        if regex:
            return self._call("regexp_replace", pat, repl, "g")
        return self._call("replace", pat, repl)


# ----- groupby ---------------------------------------------------------------------------

#: pandas aggregation names and the DataFusion functions that compute them.
_AGGREGATES = {
    "sum": "sum",
    "mean": "avg",
    "count": "count",
    "min": "min",
    "max": "max",
    "median": "median",
    "std": "stddev",
    "var": "var_samp",
    "nunique": "count",
    "size": "count",
}


class _Aggregate(NamedTuple):
    """One output column of a grouped aggregation."""

    #: The aggregate expression, aliased to ``name``.
    expr: _spate.Expr
    #: The output column name.
    name: str
    #: Whether a null result becomes 0 (``sum``).
    zero_fill: bool


class GroupBy:
    """Rows grouped by key columns; aggregate them with :meth:`agg` or a shortcut such as
    :meth:`sum`. Follows pandas: null keys are dropped (``dropna``), the result is sorted by
    the keys (``sort``) and the keys become the index (``as_index``)."""

    __slots__ = ("_df", "_keys", "_sort", "_dropna", "_as_index", "_selection")

    def __init__(
        self,
        df: DataFrame,
        keys: list[str],
        sort: bool,
        dropna: bool,
        as_index: bool,
        selection: list[str] | None = None,
    ) -> None:
        self._df = df
        self._keys = keys
        self._sort = sort
        self._dropna = dropna
        self._as_index = as_index
        self._selection = selection

    def __getitem__(self, columns: str | Sequence[str]) -> GroupBy:
        """The same grouping, aggregating only ``columns``."""
        names = _names(columns)
        missing = [n for n in names if n not in self._df._frame.columns()]
        if missing:
            raise PlanError(f"no column(s) {', '.join(missing)} to aggregate")
        return GroupBy(self._df, self._keys, self._sort, self._dropna, self._as_index, names)

    def _values(self) -> list[str]:
        if self._selection is not None:
            return self._selection
        return [c for c in self._df._frame.columns() if c not in self._keys]

    def _aggregate_expr(self, column: str, how: str, output: str) -> _Aggregate:
        """The aggregate ``how`` of ``column`` named ``output``, and whether a null result
        (a group with no values) becomes 0, as pandas' ``sum`` does."""
        if how not in _AGGREGATES:
            raise UnsupportedError(
                f"unknown aggregation '{how}': expected one of {', '.join(_AGGREGATES)}"
            )
        schema = self._df.schema
        if column not in schema.names:
            raise PlanError(
                f"cannot aggregate missing column '{column}'; the columns are: "
                f"{', '.join(schema.names)}"
            )
        value = _spate.Expr.col(column)
        field_type = schema.field(column).type
        if pa.types.is_boolean(field_type) and how in ("sum", "mean", "std", "var", "median"):
            value = value.cast(pa.int64() if how == "sum" else pa.float64())
        if how == "size":
            expr = _spate.Expr.aggregate("count", [_lit(1)])
        else:
            expr = _spate.Expr.aggregate(_AGGREGATES[how], [value], how == "nunique")
        # pandas: the sum of no values is 0 (min_count=0), not null.
        return _Aggregate(expr.alias(output), output, how == "sum")

    def agg(
        self,
        spec: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
        **named: tuple[str, str],
    ) -> DataFrame:
        """Aggregates each group.

        - ``agg("sum")`` applies one function to every value column;
        - ``agg(["sum", "max"])`` applies several: the columns are named ``v_sum``, ``v_max``
          (Arrow has no two-level header), and :meth:`DataFrame.to_pandas` shows them under
          pandas' ``(v, sum)`` header;
        - ``agg({"v": "sum", "w": ["min", "max"]})`` picks functions per column (with a list
          among them, every column gets the two-level header, as in pandas);
        - ``agg(total=("v", "sum"))`` names the outputs (pandas' named aggregation).

        Functions: sum, mean, count, min, max, median, std, var, nunique, size.
        """
        outputs: list[_Aggregate] = []
        levels: dict[str, tuple[str, str]] = {}
        if spec is not None and named:
            raise PlanError("agg takes either a spec or named aggregations, not both")
        if named:
            for output, pair in named.items():
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise PlanError(
                        f"named aggregation {output}= must be a (column, function) pair"
                    )
                column, how = pair
                outputs.append(self._aggregate_expr(column, how, output))
        elif isinstance(spec, str):
            outputs = [self._aggregate_expr(c, spec, c) for c in self._values()]
        elif isinstance(spec, Mapping):
            two_levels = any(not isinstance(hows, str) for hows in spec.values())
            for column, hows in spec.items():
                if isinstance(hows, str):
                    outputs.append(self._aggregate_expr(column, hows, column))
                    if two_levels:
                        levels[column] = (column, hows)
                else:
                    for h in hows:
                        outputs.append(self._aggregate_expr(column, h, f"{column}_{h}"))
                        levels[f"{column}_{h}"] = (column, h)
        elif spec is not None:
            for c, h in itertools.product(self._values(), list(spec)):
                outputs.append(self._aggregate_expr(c, h, f"{c}_{h}"))
                levels[f"{c}_{h}"] = (c, h)
        else:
            raise PlanError("agg needs a function, a list, a dict or named aggregations")
        if not outputs:
            raise PlanError("nothing to aggregate: the frame has no columns besides the keys")
        return self._run(outputs, levels)

    def _run(
        self, outputs: list[_Aggregate], levels: Mapping[str, tuple[str, str]] | None = None
    ) -> DataFrame:
        clash = [o.name for o in outputs if o.name in self._keys]
        if clash:
            raise PlanError(
                f"the aggregate column(s) {', '.join(repr(c) for c in clash)} would have the "
                "name of a group key (a Spate frame holds its index as columns, so names must "
                f"differ); name them with a named aggregation, e.g. "
                f"agg({clash[0]}_count=({clash[0]!r}, 'count'))"
            )
        frame = self._df.reset_index()._frame
        keys = [_spate.Expr.col(k) for k in self._keys]
        if self._dropna:
            mask = keys[0].is_not_null()
            for key in keys[1:]:
                mask = mask.binary("&", key.is_not_null())
            frame = frame.filter(mask)
        frame = frame.aggregate(keys, [o.expr for o in outputs])
        zero_fill = [o.name for o in outputs if o.zero_fill]
        if zero_fill:
            # 0 of the aggregate's own type (SUM of decimal(10, 2) is decimal(20, 2)): an int
            # literal would widen it.
            schema = frame.schema()
            for name in zero_fill:
                zero = _lit(0).cast(schema.field(name).type)
                frame = frame.with_column(
                    name, _spate.Expr.function("coalesce", [_spate.Expr.col(name), zero])
                )
        if self._sort:
            n = len(keys)
            frame = frame.sort([_spate.Expr.col(k) for k in self._keys], [True] * n, [False] * n)
        index = self._keys if self._as_index else ()
        return DataFrame(frame, self._df._session, index, levels=levels)

    def _numeric(self) -> list[str]:
        schema = self._df.schema
        return [
            c
            for c in self._values()
            if pa.types.is_integer(schema.field(c).type)
            or pa.types.is_floating(schema.field(c).type)
            or pa.types.is_decimal(schema.field(c).type)
            or pa.types.is_boolean(schema.field(c).type)
        ]

    def _each(self, how: str, columns: list[str]) -> DataFrame:
        if not columns:
            raise PlanError(f"no columns to {how}")
        return self._run([self._aggregate_expr(c, how, c) for c in columns])

    def sum(self) -> DataFrame:
        """The sum of each numeric column per group (0 for a group with no values)."""
        return self._each("sum", self._numeric())

    def mean(self) -> DataFrame:
        """The mean of each numeric column per group."""
        return self._each("mean", self._numeric())

    def median(self) -> DataFrame:
        """The median of each numeric column per group."""
        return self._each("median", self._numeric())

    def std(self) -> DataFrame:
        """The sample standard deviation of each numeric column per group."""
        return self._each("std", self._numeric())

    def var(self) -> DataFrame:
        """The sample variance of each numeric column per group."""
        return self._each("var", self._numeric())

    def count(self) -> DataFrame:
        """The number of non-null values of each column per group."""
        return self._each("count", self._values())

    def nunique(self) -> DataFrame:
        """The number of distinct non-null values of each column per group."""
        return self._each("nunique", self._values())

    def min(self) -> DataFrame:
        """The smallest value of each column per group."""
        return self._each("min", self._values())

    def max(self) -> DataFrame:
        """The largest value of each column per group."""
        return self._each("max", self._values())

    def size(self) -> DataFrame:
        """The number of rows per group, as column ``size``."""
        return self._run([self._aggregate_expr(self._keys[0], "size", "size")])
