"""``DataFrame.groupby``: pandas' grouped aggregations (``agg``, ``sum``, ...) and its
row-wise group methods (``transform``, ``cumsum``, ``cumcount``, ``shift``, ``rank``,
``rolling``), the latter as window functions partitioned by the keys."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

import pyarrow as pa

from spate import _spate
from spate import _windows as windows
from spate._util import (
    RUNNING,
    WHOLE,
    WindowOrder,
    col,
    fn,
    is_numeric,
    lit,
    names,
    order_exprs,
    over,
    typed_null,
    unsupported,
)
from spate.column import Column
from spate.errors import PlanError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    from spate.frame import DataFrame

__all__ = ["GroupBy"]


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

    __slots__ = ("_df", "_keys", "_sort", "_dropna", "_as_index", "_selection", "_single")

    def __init__(
        self,
        df: DataFrame,
        keys: list[str],
        sort: bool,
        dropna: bool,
        as_index: bool,
        selection: list[str] | None = None,
        single: bool = False,
    ) -> None:
        self._df = df
        self._keys = keys
        self._sort = sort
        self._dropna = dropna
        self._as_index = as_index
        self._selection = selection
        # `groupby(k)["v"]` (one name, not a list): the row-wise methods return a Column.
        self._single = single

    def __getitem__(self, columns: str | Sequence[str]) -> GroupBy:
        """The same grouping, aggregating only ``columns``. With one name (not a list), the
        row-wise methods (``transform``, ``cumsum``, ``rank``, ``shift``, ...) return a
        :class:`Column` of the frame, to assign back: ``df.assign(m=g["v"].transform("mean"))``."""
        selected = names(columns)
        missing = [n for n in selected if n not in self._df._frame.columns()]
        if missing:
            raise PlanError(f"no column(s) {', '.join(missing)} to aggregate")
        single = isinstance(columns, str)
        return GroupBy(
            self._df, self._keys, self._sort, self._dropna, self._as_index, selected, single
        )

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
            expr = _spate.Expr.aggregate("count", [lit(1)])
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
                zero = lit(0).cast(schema.field(name).type)
                frame = frame.with_column(
                    name, _spate.Expr.function("coalesce", [_spate.Expr.col(name), zero])
                )
        if self._sort:
            n = len(keys)
            frame = frame.sort([_spate.Expr.col(k) for k in self._keys], [True] * n, [False] * n)
        index = self._keys if self._as_index else ()
        from spate.frame import DataFrame

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

    # ----- row-wise methods: one value per row, computed over each group ------------------

    def _window_apply(
        self,
        build: Callable[..., _spate.Expr],
        numeric: bool = False,
        what: str = "this method",
        needs_order: bool = True,
        order: WindowOrder | None = None,
        layout: str = "rows",
    ) -> Column | DataFrame:
        """``build(value, type, order, partition)`` for each value column, over the groups.
        Rows whose key is null get null (``dropna=True``). The result is a Column after
        ``groupby(k)["v"]``, else a frame of the value columns in the frame's row order
        (``layout="rows"``), or indexed by the keys and sorted by them (``"groups"``, as
        pandas' ``groupby().rolling()``)."""
        df = self._df
        if needs_order and order is None:
            df._require_order(what)
        window_order = order if order is not None else order_exprs(df._order)
        partition = [col(k) for k in self._keys]
        schema = df.schema
        values = self._values()
        if numeric:
            values = [
                v
                for v in values
                if is_numeric(schema.field(v).type) or pa.types.is_boolean(schema.field(v).type)
            ]
            if not values:
                raise PlanError(f"{what}: no numeric columns to compute")
        null_key = None
        if self._dropna:
            for key in partition:
                null_key = (
                    key.is_null() if null_key is None else null_key.binary("|", key.is_null())
                )
        exprs = {}
        for v in values:
            expr = build(col(v), schema.field(v).type, window_order, partition)
            if null_key is not None:
                expr = _spate.Expr.case([(null_key, typed_null(pa.null()))], expr)
            exprs[v] = expr
        if self._single and layout == "rows":
            ((name, expr),) = exprs.items()
            return Column(expr.alias(name), df, name)
        frame = df._with_columns(exprs)
        if layout == "groups":
            keys = [col(k) for k in self._keys]
            # The result's order (a key the windows replaced lives on under a copy).
            sort_keys = keys + [col(k) for k, _, _ in frame._order]
            ascending = [True] * len(keys) + [a for _, a, _ in frame._order]
            nulls_first = [False] * len(keys) + [n for _, _, n in frame._order]
            if self._dropna:
                mask = keys[0].is_not_null()
                for key in keys[1:]:
                    mask = mask.binary("&", key.is_not_null())
                plan = frame._keyed_plan().filter(mask)
            else:
                plan = frame._keyed_plan()
            plan = plan.sort(sort_keys, ascending, nulls_first)
            plan = plan.select([*keys, *(col(v) for v in values)])
            from spate.frame import DataFrame

            return DataFrame(plan, df._session, self._keys)
        keep = [*df._index, *(v for v in values if v not in df._index)]
        return frame._select_columns(keep)

    def transform(self, func: str) -> Column | DataFrame:
        """Each row gets its group's aggregate ``func`` (sum, mean, count, min, max, median,
        std, var, size): no row order needed."""
        if not isinstance(func, str):
            unsupported("transform", "func", func, "the name of an aggregation")
        if func not in _AGGREGATES or func == "nunique":
            raise UnsupportedError(
                f"transform({func!r}) is not supported; Spate supports "
                f"{', '.join(a for a in _AGGREGATES if a != 'nunique')}"
            )

        def build(value: _spate.Expr, kind: pa.DataType, order: Any, partition: Any) -> _spate.Expr:
            arg = value
            if pa.types.is_boolean(kind) and func in ("sum", "mean", "std", "var", "median"):
                arg = value.cast(pa.int64() if func == "sum" else pa.float64())
            if func == "size":
                return over("count", [lit(1)], (), partition, WHOLE)
            result = over(_AGGREGATES[func], [arg], (), partition, WHOLE)
            if func == "sum":
                result = fn("coalesce", result, lit(0))
            return result

        return self._window_apply(build, what="transform", needs_order=False, order=[])

    def _cumulative(self, how: str) -> Column | DataFrame:
        build = windows.cumulative_of(how)
        return self._window_apply(build, numeric=True, what=f"groupby().{how}")

    def cumsum(self) -> Column | DataFrame:
        """The running sum within each group, in the frame's order."""
        return self._cumulative("cumsum")

    def cumprod(self) -> Column | DataFrame:
        """The running product within each group."""
        return self._cumulative("cumprod")

    def cummin(self) -> Column | DataFrame:
        """The running minimum within each group."""
        return self._cumulative("cummin")

    def cummax(self) -> Column | DataFrame:
        """The running maximum within each group."""
        return self._cumulative("cummax")

    def cumcount(self, ascending: bool = True) -> Column:
        """Each row's position within its group (from 0), in the frame's order."""
        df = self._df
        df._require_order("groupby().cumcount")
        order = order_exprs(df._order)
        if not ascending:
            order = [(e, not a, not n) for e, a, n in order]
        partition = [col(k) for k in self._keys]
        expr = over("row_number", [], order, partition).cast(pa.int64()).binary("-", lit(1))
        if self._dropna:
            null_key = partition[0].is_null()
            for key in partition[1:]:
                null_key = null_key.binary("|", key.is_null())
            expr = _spate.Expr.case([(null_key, typed_null(pa.null()))], expr)
        return Column(expr.alias("cumcount"), df, "cumcount")

    def shift(self, periods: int = 1, fill_value: Any = None) -> Column | DataFrame:
        """The value ``periods`` rows earlier within the group."""

        build = windows.shift_of(periods, fill_value)
        return self._window_apply(build, what="groupby().shift")

    def diff(self, periods: int = 1) -> Column | DataFrame:
        """The value minus the one ``periods`` rows earlier within the group."""

        build = windows.diff_of(periods)
        return self._window_apply(build, numeric=True, what="groupby().diff")

    def ffill(self, limit: int | None = None) -> Column | DataFrame:
        """Nulls replaced by the last non-null value before them in the group."""

        build = windows.fill_of(True, limit)
        return self._window_apply(build, what="groupby().ffill")

    def bfill(self, limit: int | None = None) -> Column | DataFrame:
        """Nulls replaced by the next non-null value after them in the group."""

        build = windows.fill_of(False, limit)
        return self._window_apply(build, what="groupby().bfill")

    def rank(
        self,
        method: str = "average",
        ascending: bool = True,
        na_option: str = "keep",
        pct: bool = False,
    ) -> Column | DataFrame:
        """Each value's rank within its group (float64)."""

        build = windows.rank_of(method, ascending, na_option, pct)
        needs = method == "first"
        return self._window_apply(
            build, what="groupby().rank", needs_order=needs, order=None if needs else []
        )

    def rolling(
        self, window: Any, min_periods: int | None = None, on: str | None = None, closed: Any = None
    ) -> windows.Rolling:
        """Rolling windows within each group: the result is indexed by the keys and sorted by
        them, then by the frame's order (pandas adds the original index as a second level)."""
        unit, order = windows.time_order(self._df, window, on)
        frame, periods = windows.rolling_frame(window, min_periods, False, None, closed, unit)
        return windows.Rolling(_GroupLayout(self), frame, periods, "rolling", order)

    def expanding(self, min_periods: int = 1) -> windows.Expanding:
        """Expanding windows within each group, laid out as :meth:`rolling`'s."""
        return windows.Expanding(_GroupLayout(self), RUNNING, min_periods, "expanding")


class _GroupLayout:
    """A GroupBy whose window results are laid out by group (for ``rolling``)."""

    __slots__ = ("_group",)

    def __init__(self, group: GroupBy) -> None:
        self._group = group

    def _window_apply(self, build: Callable[..., _spate.Expr], **kwargs: Any) -> Any:
        return self._group._window_apply(build, layout="groups", **kwargs)
