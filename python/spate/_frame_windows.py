"""Order-dependent frame methods: ``cumsum`` and friends, ``shift``, ``diff``,
``pct_change``, ``rank``, ``rolling``, ``expanding`` and ``sort_index`` (see
``_windows.py`` for the window expressions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from spate import _spate
from spate import _windows as windows
from spate._util import RUNNING, col, is_numeric, order_exprs, unsupported
from spate.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from spate.frame import DataFrame


class WindowMixin:
    """The window methods of :class:`spate.DataFrame`."""

    __slots__ = ()

    def _window_apply(
        self: Any,
        build: Callable[..., _spate.Expr],
        numeric: bool = False,
        what: str = "this method",
        needs_order: bool = True,
        order: Any = None,
    ) -> DataFrame:
        """``build(value, type, order, partition)`` for each column (numeric and boolean
        ones when ``numeric``: the others are left out, as pandas' ``numeric_only=True``)."""
        if needs_order and order is None:
            self._require_order(what)
        window_order = order if order is not None else order_exprs(self._order)
        schema = self.schema
        targets = [
            c
            for c in self.columns
            if not numeric
            or is_numeric(schema.field(c).type)
            or pa.types.is_boolean(schema.field(c).type)
        ]
        if not targets:
            raise PlanError(f"{what}: the frame has no numeric columns")
        exprs = {c: build(col(c), schema.field(c).type, window_order, []) for c in targets}
        result = self._with_columns(exprs)
        if numeric and len(targets) < len(self.columns):
            keep = [*self._index, *targets]
            return result._select_columns(keep)
        return result

    def _cumulative(self: Any, how: str) -> DataFrame:
        build = windows.cumulative_of(how)
        return self._window_apply(build, numeric=True, what=how)

    def cumsum(self: Any, axis: Any = None, skipna: bool = True) -> DataFrame:
        """The running sum of each numeric column in the frame's order (null stays null)."""
        _check_axis_skipna("cumsum", axis, skipna)
        return self._cumulative("cumsum")

    def cumprod(self: Any, axis: Any = None, skipna: bool = True) -> DataFrame:
        """The running product of each numeric column."""
        _check_axis_skipna("cumprod", axis, skipna)
        return self._cumulative("cumprod")

    def cummin(self: Any, axis: Any = None, skipna: bool = True) -> DataFrame:
        """The running minimum of each numeric column."""
        _check_axis_skipna("cummin", axis, skipna)
        return self._cumulative("cummin")

    def cummax(self: Any, axis: Any = None, skipna: bool = True) -> DataFrame:
        """The running maximum of each numeric column."""
        _check_axis_skipna("cummax", axis, skipna)
        return self._cumulative("cummax")

    def shift(
        self: Any, periods: int = 1, freq: Any = None, axis: Any = None, fill_value: Any = None
    ) -> DataFrame:
        """Every column moved ``periods`` rows down (up when negative) in the frame's order;
        the sort keys move too, so the result has no order of its own."""
        if freq is not None:
            unsupported("shift", "freq", freq)
        if axis not in (None, 0, "index"):
            unsupported("shift", "axis", axis, "None and 0")

        build = windows.shift_of(periods, fill_value)
        return self._window_apply(build, what="shift")

    def diff(self: Any, periods: int = 1, axis: Any = None) -> DataFrame:
        """Each numeric value minus the one ``periods`` rows earlier."""
        if axis not in (None, 0, "index"):
            unsupported("diff", "axis", axis, "None and 0")

        build = windows.diff_of(periods)
        return self._window_apply(build, numeric=True, what="diff")

    def pct_change(
        self: Any, periods: int = 1, fill_method: Any = None, freq: Any = None
    ) -> DataFrame:
        """The relative change of each numeric value from ``periods`` rows earlier."""
        if fill_method is not None:
            unsupported("pct_change", "fill_method", fill_method, "None")
        if freq is not None:
            unsupported("pct_change", "freq", freq)

        build = windows.pct_change_of(periods)
        return self._window_apply(build, numeric=True, what="pct_change")

    def rank(
        self: Any,
        axis: Any = 0,
        method: str = "average",
        numeric_only: bool = False,
        na_option: str = "keep",
        ascending: bool = True,
        pct: bool = False,
    ) -> DataFrame:
        """Each column's ranks (float64); only ``method="first"`` needs a sorted frame."""
        if axis not in (0, "index"):
            unsupported("rank", "axis", axis, "0")

        build = windows.rank_of(method, ascending, na_option, pct)
        needs = method == "first"
        return self._window_apply(
            build, numeric=numeric_only, what="rank", needs_order=needs, order=None if needs else []
        )

    def rolling(
        self: Any,
        window: Any,
        min_periods: int | None = None,
        center: bool = False,
        win_type: Any = None,
        on: str | None = None,
        axis: Any = None,
        closed: Any = None,
        step: Any = None,
        method: str = "single",
    ) -> windows.Rolling:
        """Windows over the frame's sort order: ``rolling(3)`` the 3 rows up to each row
        (null until ``min_periods`` values, default 3), ``rolling("1h", on="ts")`` the rows
        with ``ts`` in ``(ts - 1h, ts]`` (the frame sorted by ``ts`` first). Numeric
        columns only; results are float64."""
        if axis is not None:
            unsupported("rolling", "axis", axis)
        if step is not None:
            unsupported("rolling", "step", step)
        if method != "single":
            unsupported("rolling", "method", method, "'single'")
        unit, order = windows.time_order(self, window, on)
        frame, periods = windows.rolling_frame(window, min_periods, center, win_type, closed, unit)
        target = self if on is None else self._without_time(on)
        return windows.Rolling(target, frame, periods, "rolling", order)

    def _without_time(self: Any, on: str) -> DataFrame:
        """The frame whose ``on`` column is kept as is (not aggregated) by a time window."""
        return _KeepColumn(self, on)  # type: ignore[return-value]

    def expanding(
        self: Any, min_periods: int = 1, axis: Any = None, method: str = "single"
    ) -> windows.Expanding:
        """Windows of every row up to each row, in the frame's order."""
        if axis is not None:
            unsupported("expanding", "axis", axis)
        return windows.Expanding(self, RUNNING, min_periods, "expanding")

    def sort_index(
        self: Any,
        ascending: bool = True,
        na_position: str = "last",
        axis: Any = 0,
        level: Any = None,
        inplace: bool = False,
        ignore_index: bool = False,
    ) -> DataFrame:
        """Sorted by the index columns (after ``set_index`` or ``groupby``)."""
        if axis not in (0, "index"):
            unsupported("sort_index", "axis", axis, "0")
        if level is not None:
            unsupported("sort_index", "level", level)
        if inplace:
            unsupported("sort_index", "inplace", inplace, "False")
        if not self._index:
            raise PlanError("sort_index: the frame has no index (set_index first)")
        return self.sort_values(list(self._index), ascending=ascending, na_position=na_position)


class _KeepColumn:
    """A frame for a time window over ``on``: every numeric column but ``on`` is
    aggregated, and ``on`` is kept, as pandas' ``rolling(..., on=)`` does."""

    def __init__(self, df: DataFrame, on: str) -> None:
        self._df = df
        self._on = on

    def _window_apply(
        self,
        build: Callable[..., _spate.Expr],
        numeric: bool = True,
        what: str = "",
        order: Any = None,
    ) -> DataFrame:
        df = self._df
        schema = df.schema
        targets = [
            c
            for c in df.columns
            if c != self._on
            and (is_numeric(schema.field(c).type) or pa.types.is_boolean(schema.field(c).type))
        ]
        if not targets:
            raise PlanError(f"{what}: the frame has no numeric columns besides {self._on!r}")
        exprs = {c: build(col(c), schema.field(c).type, order, []) for c in targets}
        result = df._with_columns(exprs)
        keep = [*df._index, *(c for c in df.columns if c == self._on or c in targets)]
        return result._select_columns(keep)


def _check_axis_skipna(method: str, axis: Any, skipna: bool) -> None:
    if axis not in (None, 0, "index"):
        unsupported(method, "axis", axis, "None and 0")
    if not skipna:
        unsupported(method, "skipna", skipna, "True")
