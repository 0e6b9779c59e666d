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
- Row order is only defined after ``sort_values``, and kept by the operations that keep rows
  (filters, limits, column selections, new or changed columns; ``docs/python.md``). A frame
  that spans several batches (more
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

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from spate import _spate
from spate._frame_windows import WindowMixin
from spate._host import HostMixin
from spate._inspect import InspectMixin
from spate._missing import MissingMixin
from spate._select import SelectMixin
from spate._util import Operand, Order, lit, names, pandas_dtype_mapper
from spate.column import Column
from spate.errors import ConfigError, PlanError, UnsupportedError
from spate.groupby import GroupBy
from spate.reshape import ReshapeMixin

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import polars

    from spate.session import Session

__all__ = ["DataFrame"]

#: Rows ``repr(df)`` shows.
REPR_ROWS = 10

#: The temporary column a mask with a window function is computed into.
_MASK = "__spate_mask"


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
            raise ConfigError(
                "nearest: a query vector holds something that is not a number"
            ) from None
    if len({len(v) for v in out}) > 1:
        raise ConfigError("nearest: the query vectors have different lengths")
    return out, single


def _fresh_name(base: str, taken: Sequence[str]) -> str:
    """``base``, or ``base`` with a number, whichever is not in ``taken``."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


class DataFrame(MissingMixin, InspectMixin, SelectMixin, WindowMixin, ReshapeMixin, HostMixin):
    """A lazy, pandas-like table: a query plan in a :class:`spate.Session`.

    Build one with :meth:`Session.sql`, the readers (:func:`spate.read_parquet`,
    :func:`spate.from_pandas`, ...) or from another DataFrame's methods. Nothing runs until a
    result is asked for. The methods are grouped by concern: missing data (``_missing.py``),
    inspection (``_inspect.py``), selection (``_select.py``), order-dependent windows
    (``_frame_windows.py``), reshaping (``reshape.py``) and crossing to the host
    (``_host.py``).
    """

    __slots__ = (
        "_frame",
        "_session",
        "_index",
        "_table_name",
        "_levels",
        "_order",
        "_keyed",
        "_hidden",
        "__weakref__",
    )

    def __init__(
        self,
        frame: _spate.Frame,
        session: Session,
        index: Sequence[str] = (),
        table_name: str | None = None,
        levels: Mapping[str, tuple[str, str]] | None = None,
        order: Order = (),
        keyed: _spate.Frame | None = None,
        hidden: Sequence[str] = (),
    ) -> None:
        self._frame = frame
        self._session = session
        self._index: tuple[str, ...] = tuple(index)
        self._table_name = table_name
        # pandas' two-level header, (column, function), of the columns `agg` made from a list:
        # Arrow has one level, so they are named `column_function`, and to_pandas restores it.
        self._levels: dict[str, tuple[str, str]] = dict(levels or {})
        # The row order sort_values gave the plan, kept through the operations that keep
        # rows (filters, limits, selections, new columns); the order-dependent methods read it.
        self._order: Order = tuple(order)
        # Sort keys a column selection left out (`df.sort_values("t")[["v"]]`) stay in the
        # keyed plan: the same rows as `_frame`, with the `_hidden` keys as extra columns, so
        # the order-dependent methods still have them. Only selections, filters, limits and
        # new columns carry it; any other operation returns a frame without it.
        self._hidden: tuple[str, ...] = tuple(hidden) if keyed is not None else ()
        self._keyed: _spate.Frame | None = keyed if self._hidden else None
        have = set(frame.columns()) | set(self._hidden)
        if not all(k in have for k, _, _ in self._order):
            self._order = ()

    def _derive(
        self,
        frame: _spate.Frame,
        index: Sequence[str] | None = None,
        order: Order | None = None,
    ) -> DataFrame:
        """A frame for ``frame``, derived from this one: the index, two-level headers and
        row order carry over while their columns remain (``order=()`` when the operation
        does not keep the order)."""
        have = set(frame.columns())
        if index is None:
            index = tuple(i for i in self._index if i in have)
        levels = {c: level for c, level in self._levels.items() if c in have}
        if order is None:
            order = self._order if all(k in have for k, _, _ in self._order) else ()
        return DataFrame(frame, self._session, index, levels=levels, order=order)

    def _keyed_plan(self) -> _spate.Frame:
        """The plan with every sort key among its columns (hidden ones included)."""
        return self._keyed if self._keyed is not None else self._frame

    def _from_keyed(
        self,
        plan: _spate.Frame,
        hidden: Sequence[str],
        order: Order | None = None,
        index: Sequence[str] | None = None,
    ) -> DataFrame:
        """A frame derived from the keyed plan ``plan``, whose ``hidden`` columns are sort
        keys the user does not see."""
        hidden = tuple(h for h in hidden if h in plan.columns())
        if not hidden:
            return self._derive(plan, index=index, order=order)
        visible = [c for c in plan.columns() if c not in hidden]
        frame = plan.select([_spate.Expr.col(c) for c in visible])
        levels = {c: level for c, level in self._levels.items() if c in visible}
        if index is None:
            index = tuple(i for i in self._index if i in visible)
        return DataFrame(
            frame,
            self._session,
            index,
            levels=levels,
            order=self._order if order is None else order,
            keyed=plan,
            hidden=hidden,
        )

    def _sorted_keyed_plan(self) -> _spate.Frame:
        """The keyed plan, sorted by the frame's order when it has one. DataFusion keeps a
        sort's order through filters and plain column selections, but a projection that
        computes something may be spread over partitions and merged back in any order, so
        results and limits sort again (a sort its input already satisfies costs nothing)."""
        plan = self._keyed_plan()
        if not self._order:
            return plan
        keys = [_spate.Expr.col(k) for k, _, _ in self._order]
        return plan.sort(keys, [a for _, a, _ in self._order], [n for _, _, n in self._order])

    def _ordered_plan(self) -> _spate.Frame:
        """The plan of the result: the visible columns, in the frame's order."""
        plan = self._sorted_keyed_plan()
        if self._hidden:
            plan = plan.select([_spate.Expr.col(c) for c in self._frame.columns()])
        return plan

    def _protect_order(self, replaced: Iterable[str]) -> DataFrame:
        """This frame, with the sort keys among ``replaced`` (columns an operation is about
        to overwrite) copied into hidden columns that the order then refers to: pandas keeps
        the row order when values change, so the order must not follow the new values."""
        replaced = set(replaced)
        keys = [k for k, _, _ in self._order if k in replaced]
        if not keys:
            return self
        plan = self._keyed_plan()
        copies = {k: _fresh_name(f"__spate_order_{k}", plan.columns()) for k in keys}
        plan = plan.select(
            [_spate.Expr.col(c) for c in plan.columns()]
            + [_spate.Expr.col(k).alias(copies[k]) for k in keys]
        )
        order = tuple((copies.get(k, k), a, n) for k, a, n in self._order)
        return self._from_keyed(plan, [*self._hidden, *copies.values()], order)

    def _rename_hidden(self, names: Iterable[str]) -> DataFrame:
        """This frame with the hidden columns ``names`` under fresh names (so that a visible
        column may take theirs)."""
        plan = self._keyed_plan()
        fresh = {h: _fresh_name(f"__spate_order_{h}", plan.columns()) for h in names}
        if not fresh:
            return self
        plan = plan.rename(fresh)
        order = tuple((fresh.get(k, k), a, n) for k, a, n in self._order)
        hidden = [fresh.get(h, h) for h in self._hidden]
        return self._from_keyed(plan, hidden, order)

    def _select_columns(self, keep: Sequence[str]) -> DataFrame:
        """The columns ``keep``; sort keys left out stay in the keyed plan, hidden."""
        hidden = [k for k, _, _ in self._order if k not in keep]
        if not hidden:
            return self._derive(self._frame.select([_spate.Expr.col(c) for c in keep]))
        plan = self._keyed_plan().select([_spate.Expr.col(c) for c in [*keep, *hidden]])
        return self._from_keyed(plan, hidden)

    def _as_column(self, name: str, expr: _spate.Expr) -> tuple[DataFrame, _spate.Expr]:
        """``expr`` ready for a filter, an aggregate or a CASE: a window function cannot sit
        there, so it is computed into column ``name`` first, in the frame's row order."""
        if not expr.has_window():
            return self, expr
        return self._with_columns({name: expr}), _spate.Expr.col(name)

    def _require_order(self, what: str) -> None:
        """Raises the error for an order-dependent method on a frame without row order."""
        if not self._order:
            raise UnsupportedError(
                f"{what} depends on row order, which a Spate frame only has after sort_values "
                "(merges, groupby, concat and reshaping start without one): sort the frame "
                "first"
            )

    def _with_columns(self, columns: Mapping[str, _spate.Expr]) -> DataFrame:
        """All columns, with ``columns`` added or replaced in place. Window expressions are
        computed under temporary names, the rows re-sorted by the frame's order, and then
        renamed, so the result keeps the order even where a window replaces a sort key."""
        if any(k in columns for k, _, _ in self._order):
            return self._protect_order(columns)._with_columns(columns)
        windowed = any(e.has_window() for e in columns.values())
        plan = self._keyed_plan()
        existing = plan.columns()
        # A new column named like a hidden key replaces it, visibly.
        hidden = [h for h in self._hidden if h not in columns]
        order = self._order
        if not windowed or not self._order:
            exprs = [columns[c].alias(c) if c in columns else _spate.Expr.col(c) for c in existing]
            exprs += [e.alias(n) for n, e in columns.items() if n not in existing]
            return self._from_keyed(plan.select(exprs), hidden, order)
        temporary = {name: f"__spate_window_{i}" for i, name in enumerate(columns)}
        frame = plan.select(
            [_spate.Expr.col(c) for c in existing]
            + [expr.alias(temporary[name]) for name, expr in columns.items()]
        )
        keys = [_spate.Expr.col(k) for k, _, _ in self._order]
        frame = frame.sort(keys, [a for _, a, _ in self._order], [n for _, _, n in self._order])
        output = []
        for name in existing:
            if name in temporary:
                output.append(_spate.Expr.col(temporary[name]).alias(name))
            else:
                output.append(_spate.Expr.col(name))
        output += [_spate.Expr.col(t).alias(n) for n, t in temporary.items() if n not in existing]
        return self._from_keyed(frame.select(output), hidden, order)

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
            if (
                key.step not in (None, 1)
                or (key.start or 0) < 0
                or (key.stop is not None and key.stop < 0)
            ):
                raise UnsupportedError("only df[start:stop] with non-negative bounds is supported")
            start = key.start or 0
            count = None if key.stop is None else max(key.stop - start, 0)
            return self._from_keyed(self._sorted_keyed_plan().limit(count, start), self._hidden)
        selected = names(key)
        missing = [n for n in selected if n not in self._frame.columns()]
        if missing:
            raise PlanError(
                f"no column {', '.join(repr(m) for m in missing)}; the columns are: "
                f"{', '.join(self._frame.columns())}"
            )
        return self._select_columns(list(dict.fromkeys([*self._index, *selected])))

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
        expr = lit(value)
        if isinstance(value, Column):
            # A window Column may order by sort keys this frame keeps hidden.
            have = set(self._frame.columns())
            if expr.has_window():
                have |= set(self._hidden)
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
        result = self._with_columns({name: self._operand(value)})
        self._frame, self._order = result._frame, result._order
        self._keyed, self._hidden = result._keyed, result._hidden

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
        frame, mask = self._as_column(_MASK, expr)
        kept = frame._keyed_plan().filter(mask)
        if frame is not self:
            kept = kept.select([_spate.Expr.col(c) for c in kept.columns() if c != _MASK])
        return frame._from_keyed(kept, frame._hidden)

    def assign(self, **columns: Operand | Callable[[DataFrame], Operand]) -> DataFrame:
        """A frame with the given columns added or replaced. Values are Columns, scalars, or
        callables taking the frame (evaluated in order, so later ones see earlier ones)."""
        frame = self
        pending: dict[str, _spate.Expr] = {}
        for name, value in columns.items():
            if callable(value) and not isinstance(value, Column):
                # A callable sees the frame with every column assigned before it.
                if pending:
                    frame, pending = frame._with_columns(pending), {}
                value = value(frame)
            # Values built before the call read the frame as it was, as pandas' do: they are
            # computed together, in one projection (one sort for all window columns).
            pending[name] = frame._operand(value)
        return frame._with_columns(pending) if pending else frame

    def drop(self, columns: str | Sequence[str]) -> DataFrame:
        """A frame without ``columns``."""
        drop = set(names(columns))
        missing = drop - set(self._frame.columns())
        if missing:
            raise PlanError(f"cannot drop missing column(s): {', '.join(sorted(missing))}")
        return self._select_columns([c for c in self._frame.columns() if c not in drop])

    def rename(self, columns: Mapping[str, str] | Callable[[str], str]) -> DataFrame:
        """A frame with columns renamed by a mapping (unknown names are ignored, as in pandas)
        or a function of the old name."""
        if callable(columns):
            mapping = {c: columns(c) for c in self._frame.columns()}
        else:
            mapping = dict(columns)
        # Hidden keys are not the user's columns: a mapping cannot name them, and a visible
        # column taking a hidden key's name moves the key aside first.
        mapping = {old: new for old, new in mapping.items() if old not in self._hidden}
        frame = self._rename_hidden(h for h in self._hidden if h in mapping.values())
        index = [mapping.get(i, i) for i in frame._index]
        order = tuple((mapping.get(k, k), a, n) for k, a, n in frame._order)
        plan = frame._keyed_plan().rename(mapping)
        return frame._from_keyed(plan, frame._hidden, order, index)

    def set_index(self, keys: str | Sequence[str]) -> DataFrame:
        """Marks ``keys`` as the index :meth:`to_pandas` builds (the columns stay in the
        plan)."""
        keys = names(keys)
        missing = [n for n in keys if n not in self._frame.columns()]
        if missing:
            raise PlanError(f"no column(s) {', '.join(missing)} to use as the index")
        return DataFrame(
            self._frame,
            self._session,
            keys,
            order=self._order,
            keyed=self._keyed,
            hidden=self._hidden,
        )

    def reset_index(self, drop: bool = False) -> DataFrame:
        """Turns the index columns back into ordinary columns, or removes them with
        ``drop=True``."""
        if drop and self._index:
            keep = [c for c in self._frame.columns() if c not in self._index]
            return self._select_columns(keep)
        return DataFrame(
            self._frame, self._session, order=self._order, keyed=self._keyed, hidden=self._hidden
        )

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
        keys = names(by)
        missing = [k for k in keys if k not in self._frame.columns()]
        if missing:
            raise PlanError(f"cannot group by missing column(s): {', '.join(missing)}")
        if not keys:
            raise PlanError("groupby needs at least one key column")
        return GroupBy(self, keys, sort=sort, dropna=dropna, as_index=as_index)

    def pipe(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(self, *args, **kwargs)``, for chaining."""
        return func(self, *args, **kwargs)

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
            lkeys = rkeys = names(on)
        elif left_on is not None or right_on is not None:
            lkeys, rkeys = names(left_on), names(right_on)
            if len(lkeys) != len(rkeys):
                raise PlanError(f"merge: {len(lkeys)} left_on keys but {len(rkeys)} right_on keys")
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
        keys = names(by)
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
        missing = [k for k in keys if k not in self._frame.columns()]
        if missing:
            raise PlanError(f"sort_values: no column(s) {', '.join(map(repr, missing))}")
        exprs = [_spate.Expr.col(k) for k in keys]
        frame = self._frame.sort(exprs, directions, [first] * len(keys))
        order = tuple((k, a, first) for k, a in zip(keys, directions))
        return self._derive(frame, order=order)

    def head(self, n: int = 5) -> DataFrame:
        """The first ``n`` rows (in the frame's order, which only ``sort_values`` fixes)."""
        if n < 0:
            raise UnsupportedError("head with a negative n is not supported")
        return self._from_keyed(self._sorted_keyed_plan().limit(n, 0), self._hidden)

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
                frame = frame.with_column("query", lit(position))
            frames.append(frame)
        result = frames[0]
        for frame in frames[1:]:
            result = result.union(frame)
        if not single:
            ordered = ["query"] + [c for c in result.columns() if c != "query"]
            result = result.select([_spate.Expr.col(n) for n in ordered])
            result = result.sort(
                [_spate.Expr.col("query"), _spate.Expr.col("distance")],
                [True, not larger_is_nearer],
                [False, False],
            )
        return self._derive(result, order=())

    def drop_duplicates(
        self, subset: str | Sequence[str] | None = None, keep: str = "first"
    ) -> DataFrame:
        """One row per distinct row, or per distinct value of ``subset``. Which of several
        duplicates is kept is unspecified (Spate frames have no row order before a sort);
        ``keep=False`` is not supported."""
        if keep not in ("first", "last"):
            raise UnsupportedError("drop_duplicates supports keep='first' or 'last' only")
        if subset is None:
            return self._derive(self._frame.distinct(), order=())
        keys = names(subset)
        return self._derive(
            self._frame.distinct_on([_spate.Expr.col(n) for n in keys], [], []), order=()
        )

    # ----- running the plan -------------------------------------------------------------

    def explain(self, analyze: bool = False, verbose: bool = False) -> str:
        """The plan: logical, then physical with where each operator runs (GPU or CPU, and
        why). ``analyze=True`` runs it and adds each operator's metrics."""
        return self._ordered_plan().explain(verbose, analyze)

    def to_arrow(self) -> pa.Table:
        """Runs the plan and returns the result as a ``pyarrow.Table`` (no copy)."""
        return pa.table(self._ordered_plan())

    def to_pandas(self, dtype_backend: str | None = None) -> pandas.DataFrame:
        """Runs the plan and returns a ``pandas.DataFrame``, with the index columns as its
        index. ``dtype_backend`` is as in ``pandas.read_parquet``: None (NumPy types, nulls
        as NaN/None), ``"numpy_nullable"`` or ``"pyarrow"``."""
        table = self.to_arrow()
        mapper = pandas_dtype_mapper(dtype_backend)
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
        return self._ordered_plan().__arrow_c_stream__(requested_schema)

    def register(self, name: str) -> DataFrame:
        """Registers this frame's plan as the view ``name`` in its session, for SQL, replacing
        any table of that name."""
        self._session._inner.register_frame(name, self._frame)
        return DataFrame(
            self._frame,
            self._session,
            self._index,
            name.lower(),
            order=self._order,
            keyed=self._keyed,
            hidden=self._hidden,
        )

    def __repr__(self) -> str:
        head = self._ordered_plan().limit(REPR_ROWS + 1, 0)
        table = pa.table(head)
        shown = table.slice(0, REPR_ROWS)
        try:
            text = (
                DataFrame(head, self._session, self._index).to_pandas().head(REPR_ROWS).to_string()
            )
        except ImportError:
            text = shown.to_string(preview_cols=0)
        if table.num_rows > REPR_ROWS:
            text += f"\n...\n\n[{len(self)} rows x {len(self.columns)} columns]"
        elif table.num_rows == 0:
            text = f"Empty DataFrame\nColumns: [{', '.join(self.columns)}]"
        return text

    def _repr_html_(self) -> str:
        head = DataFrame(self._ordered_plan().limit(REPR_ROWS, 0), self._session, self._index)
        try:
            return head.to_pandas().to_html()
        except ImportError:
            return "<pre>" + repr(self) + "</pre>"
