"""Window expressions behind the pandas methods that depend on row order: ``cumsum`` and
friends, ``shift``/``diff``/``pct_change``, ``ffill``/``bfill``, ``rank``, ``rolling`` and
``expanding``, on columns, frames and groups.

Each builds ``f(x) OVER (PARTITION BY <group keys> ORDER BY <the frame's sort keys> ...)``:
a frame's row order is the one ``sort_values`` gave it, so these methods need a sorted frame
(rows that tie on the sort keys come in an unspecified order among themselves). DataFusion
plans them as window operators, which run on the GPU where Spate's window operator covers the
function and frame (running sums, counts, minima and maxima, ``lag``/``lead``, ranks, whole
partition aggregates); sliding frames run on the CPU, and ``explain()`` says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa

from spate import _spate
from spate._util import (
    REMAINING,
    RUNNING,
    WHOLE,
    Bound,
    WindowOrder,
    col,
    fn,
    lit,
    over,
    rows_back,
    typed_null,
    unsupported,
)
from spate.errors import ConfigError, PlanError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    from spate.column import Column
    from spate.frame import DataFrame
    from spate.groupby import GroupBy

#: pandas' rolling and expanding aggregations and the DataFusion aggregates computing them.
ROLLING = {
    "sum": "sum",
    "mean": "avg",
    "min": "min",
    "max": "max",
    "std": "stddev_samp",
    "var": "var_samp",
    "count": "count",
}

#: The cumulative methods and their aggregates.
CUMULATIVE = {"cumsum": "sum", "cumprod": "product", "cummin": "min", "cummax": "max"}


def _null_where_null(value: _spate.Expr, result: _spate.Expr) -> _spate.Expr:
    """``result``, but null where ``value`` is (pandas skips NaN yet keeps it in place)."""
    return _spate.Expr.case([(value.is_null(), typed_null(pa.null()))], result)


def cumulative(
    value: _spate.Expr,
    kind: pa.DataType,
    how: str,
    order: WindowOrder,
    partition: Sequence[_spate.Expr] = (),
) -> _spate.Expr:
    """``cumsum``, ``cumprod``, ``cummin`` or ``cummax``: the running aggregate up to each
    row, null where the value is null (pandas' ``skipna=True``)."""
    function = CUMULATIVE[how]
    arg = value
    if pa.types.is_boolean(kind):
        arg = value.cast(pa.int64())
    if function == "product":
        wide = (
            pa.float64() if pa.types.is_floating(kind) or pa.types.is_decimal(kind) else pa.int64()
        )
        arg = value.cast(wide)
    running = over(function, [arg], order, partition, RUNNING)
    return _null_where_null(value, running)


def shifted(
    value: _spate.Expr,
    periods: int,
    order: WindowOrder,
    partition: Sequence[_spate.Expr] = (),
    fill_value: Any = None,
) -> _spate.Expr:
    """The value ``periods`` rows before (after, when negative) in the frame's order; null,
    or ``fill_value``, past the edges."""
    if isinstance(periods, bool) or not isinstance(periods, int):
        raise ConfigError(f"shift: periods must be an integer, got {periods!r}")
    if periods == 0:
        return value
    function, offset = ("lag", periods) if periods > 0 else ("lead", -periods)
    args = [value, lit(offset)]
    if fill_value is not None:
        args.append(lit(fill_value))
    return over(function, args, order, partition)


def filled(
    value: _spate.Expr,
    forward: bool,
    order: WindowOrder,
    partition: Sequence[_spate.Expr] = (),
    limit: int | None = None,
) -> _spate.Expr:
    """``ffill`` (the last non-null value so far) or ``bfill`` (the next non-null one)."""
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"limit must be a positive integer, got {limit!r}")
        frame: tuple[str, Bound, Bound] = (
            ("rows", rows_back(limit), ("current", None))
            if forward
            else ("rows", ("current", None), ("following", pa.array([limit], pa.uint64())))
        )
    else:
        frame = RUNNING if forward else REMAINING
    function = "last_value" if forward else "first_value"
    return over(function, [value], order, partition, frame, ignore_nulls=True)


def ranked(
    value: _spate.Expr,
    method: str,
    ascending: bool,
    na_option: str,
    pct: bool,
    order: WindowOrder,
    partition: Sequence[_spate.Expr] = (),
) -> _spate.Expr:
    """pandas' ``rank`` (float64): ``average``, ``min``, ``max``, ``first`` (ties by the
    frame's order) or ``dense``; nulls keep a null rank (``na_option="keep"``)."""
    if method not in ("average", "min", "max", "first", "dense"):
        unsupported("rank", "method", method, "average, min, max, first and dense")
    if na_option != "keep":
        unsupported("rank", "na_option", na_option, "'keep'")
    by = [(value, ascending, False)]
    partition = list(partition)
    if method == "dense":
        rank = over("dense_rank", [], by, partition)
    elif method == "first":
        if not order:
            raise UnsupportedError(
                "rank(method='first') breaks ties by row order, which is undefined: call "
                "sort_values first"
            )
        rank = over("row_number", [], [*by, *order], partition)
    else:
        low = over("rank", [], by, partition).cast(pa.int64())
        if method == "min":
            rank = low
        else:
            peers = over("count", [lit(1)], (), [*partition, value], WHOLE).cast(pa.int64())
            high = low.binary("+", peers).binary("-", lit(1))
            rank = (
                high
                if method == "max"
                else low.binary("+", high).cast(pa.float64()).binary("/", lit(2.0))
            )
    rank = rank.cast(pa.float64())
    if pct:
        if method == "dense":
            # The number of distinct values: a row's dense rank counted from both ends.
            down = over("dense_rank", [], [(value, not ascending, False)], partition)
            total = rank.binary("+", down).binary("-", lit(1))
        else:
            total = over("count", [value], (), partition, WHOLE)
        rank = rank.binary("/", total.cast(pa.float64()))
    return _spate.Expr.case([(value.is_null(), typed_null(pa.float64()))], rank)


def rolled(
    value: _spate.Expr,
    kind: pa.DataType,
    how: str,
    order: WindowOrder,
    partition: Sequence[_spate.Expr],
    frame: tuple[str, Bound, Bound],
    min_periods: int,
) -> _spate.Expr:
    """A rolling or expanding aggregation (float64, as pandas gives), null until the frame
    holds ``min_periods`` values."""
    function = ROLLING.get(how)
    if function is None:
        raise UnsupportedError(
            f"rolling/expanding {how!r} is not supported; Spate supports {', '.join(ROLLING)}"
        )
    counted = over("count", [value], order, partition, frame)
    if how in ("sum", "min", "max", "mean"):
        # On the column itself (a cast would keep the window off the GPU, whose window
        # operator folds columns): integer sums are exact, and the mean is sum / count.
        arg = value.cast(pa.int64()) if pa.types.is_boolean(kind) else value
        name = "sum" if how == "mean" else function
        result = over(name, [arg], order, partition, frame).cast(pa.float64())
        if how == "mean":
            result = result.binary("/", counted.cast(pa.float64()))
    else:
        arg = value.cast(pa.float64()) if not pa.types.is_floating(kind) else value
        result = over(function, [arg], order, partition, frame).cast(pa.float64())
    if how == "count":
        # pandas counts the non-null values once the window holds min_periods rows, null or
        # not; the other aggregations need min_periods non-null values.
        result = counted.cast(pa.float64())
        counted = over("count", [lit(1)], order, partition, frame)
    enough = counted.binary(">=", lit(min_periods if how == "count" else max(min_periods, 1)))
    if how == "sum" and min_periods == 0:
        # pandas: the sum of a window without values is 0 when no values are required.
        return fn("coalesce", result, lit(0.0))
    return _spate.Expr.case([(enough, result)], typed_null(pa.float64()))


#: What a Column, DataFrame or GroupBy gives its ``_window_apply``: the window expression of
#: one value column from its expression, type, window ORDER BY and PARTITION BY.
Build = Callable[[_spate.Expr, pa.DataType, WindowOrder, Sequence[_spate.Expr]], _spate.Expr]


def cumulative_of(how: str) -> Build:
    """``cumsum`` and the other running aggregates (see :func:`cumulative`)."""
    return lambda value, kind, order, partition: cumulative(value, kind, how, order, partition)


def shift_of(periods: int, fill_value: Any = None) -> Build:
    """``shift`` (see :func:`shifted`)."""
    return lambda value, kind, order, partition: shifted(
        value, periods, order, partition, fill_value
    )


def diff_of(periods: int) -> Build:
    """``diff``: the value minus the one ``periods`` rows earlier (booleans as numbers)."""

    def build(
        value: _spate.Expr, kind: pa.DataType, order: WindowOrder, partition: Sequence[_spate.Expr]
    ) -> _spate.Expr:
        base = value.cast(pa.float64()) if pa.types.is_boolean(kind) else value
        return base.binary("-", shifted(base, periods, order, partition))

    return build


def pct_change_of(periods: int) -> Build:
    """``pct_change``: the relative change from the value ``periods`` rows earlier."""

    def build(
        value: _spate.Expr, kind: pa.DataType, order: WindowOrder, partition: Sequence[_spate.Expr]
    ) -> _spate.Expr:
        current = value.cast(pa.float64())
        before = shifted(current, periods, order, partition)
        return current.binary("/", before).binary("-", lit(1.0))

    return build


def fill_of(forward: bool, limit: int | None) -> Build:
    """``ffill`` or ``bfill`` (see :func:`filled`)."""
    return lambda value, kind, order, partition: filled(value, forward, order, partition, limit)


def rank_of(method: str, ascending: bool, na_option: str, pct: bool) -> Build:
    """``rank`` (see :func:`ranked`)."""
    return lambda value, kind, order, partition: ranked(
        value, method, ascending, na_option, pct, order, partition
    )


class _Windowed:
    """What a :class:`Rolling` or :class:`Expanding` applies its aggregation to: a Column, a
    DataFrame or a GroupBy, each knowing its row order and partitions."""

    __slots__ = ("_target", "_frame", "_min_periods", "_name", "_order")

    def __init__(
        self,
        target: Any,
        frame: tuple[str, Bound, Bound],
        min_periods: int,
        name: str,
        order: WindowOrder | None = None,
    ) -> None:
        self._target = target
        self._frame = frame
        self._min_periods = min_periods
        self._name = name
        # A time window's ORDER BY is its `on` column alone (a RANGE frame has one key).
        self._order = order

    def _apply(self, how: str) -> Any:
        def build(
            value: _spate.Expr,
            kind: pa.DataType,
            order: WindowOrder,
            partition: Sequence[_spate.Expr],
        ) -> _spate.Expr:
            return rolled(value, kind, how, order, partition, self._frame, self._min_periods)

        apply: Callable[..., Any] = self._target._window_apply
        return apply(build, numeric=True, what=f"{self._name}().{how}", order=self._order)

    def sum(self) -> Any:
        """The sum of each window (float64)."""
        return self._apply("sum")

    def mean(self) -> Any:
        """The mean of each window."""
        return self._apply("mean")

    def min(self) -> Any:
        """The smallest value of each window."""
        return self._apply("min")

    def max(self) -> Any:
        """The largest value of each window."""
        return self._apply("max")

    def std(self) -> Any:
        """The sample standard deviation (ddof=1) of each window."""
        return self._apply("std")

    def var(self) -> Any:
        """The sample variance (ddof=1) of each window."""
        return self._apply("var")

    def count(self) -> Any:
        """The number of non-null values in each window."""
        return self._apply("count")


class Rolling(_Windowed):
    """``rolling(n)``: windows of the ``n`` rows up to each row; ``rolling("1h", on=ts)``: the
    rows whose ``ts`` lies in ``(ts - 1h, ts]``."""

    __slots__ = ()


class Expanding(_Windowed):
    """``expanding()``: every row up to each row."""

    __slots__ = ()


def time_order(owner: DataFrame, window: Any, on: str | None) -> tuple[str, WindowOrder | None]:
    """For a time window (``rolling("1h", on="ts")``): the unit of ``on`` and the window's
    ORDER BY (``on`` alone); for a row count: ``("ns", None)``, the frame's own order."""
    if isinstance(window, int) and not isinstance(window, bool):
        if on is not None:
            unsupported("rolling", "on", on, "on= only with a time span window such as '1h'")
        return "ns", None
    if on is None:
        raise UnsupportedError(
            f"rolling({window!r}): a time span window needs on=<timestamp column> (Spate frames "
            "have no DatetimeIndex)"
        )
    if on not in owner._frame.columns():
        raise PlanError(f"rolling: no column {on!r} to use as on=")
    kind = owner.schema.field(on).type
    if not pa.types.is_timestamp(kind):
        raise PlanError(f"rolling: on={on!r} must be a timestamp column, not {kind}")
    if not owner._order or owner._order[0][:2] != (on, True):
        raise UnsupportedError(
            f"rolling over a time span needs the frame sorted by {on!r} ascending first "
            f"(sort_values({on!r}))"
        )
    return kind.unit, [(col(on), True, owner._order[0][2])]


def rolling_frame(
    window: Any, min_periods: int | None, center: bool, win_type: Any, closed: Any, kind: str
) -> tuple[tuple[str, Bound, Bound], int]:
    """The frame of ``rolling(window)`` and its ``min_periods``: a row count gives a ROWS
    frame (min_periods defaults to the window), an offset (``"1h"``, a ``Timedelta``) a RANGE
    frame over the ``on`` column (min_periods defaults to 1)."""
    if center:
        unsupported("rolling", "center", center)
    if win_type is not None:
        unsupported("rolling", "win_type", win_type)
    if closed not in (None, "right"):
        unsupported("rolling", "closed", closed, "'right'")
    if isinstance(window, int) and not isinstance(window, bool):
        if window < 1:
            raise ConfigError(f"rolling: window must be at least 1, got {window}")
        frame = ("rows", rows_back(window - 1), ("current", None))
        if min_periods is not None and not 0 <= min_periods <= window:
            raise ConfigError(f"rolling: min_periods {min_periods} must be in [0, {window}]")
        return frame, window if min_periods is None else min_periods
    import pandas as pd

    try:
        delta = pd.Timedelta(window)
    except (ValueError, TypeError):
        raise ConfigError(
            f"rolling: window must be a number of rows or an offset such as '1h', got {window!r}"
        ) from None
    if delta <= pd.Timedelta(0):
        raise ConfigError(f"rolling: the window must be positive, got {window!r}")
    # pandas' window is (t - w, t]: SQL's RANGE frame includes its start, so end it one tick
    # (of the time column's unit) after t - w.
    tick = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}[kind]
    # pandas takes the span in whole units of the time column, (t - w, t]: the frame reaches
    # back w less one tick.
    nanos = max(int(delta.value) // tick * tick - tick, 0)
    interval = pa.array([pa.MonthDayNano([0, 0, nanos])], type=pa.month_day_nano_interval())
    frame = ("range", ("preceding", interval), ("current", None))
    return frame, 1 if min_periods is None else min_periods
