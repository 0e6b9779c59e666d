"""Missing data on frames: ``isna``/``notna``, ``dropna``, ``fillna``, ``ffill``/``bfill``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pyarrow as pa

from spate import _spate
from spate import _windows as windows
from spate._util import col, fn, is_numeric, lit, names, order_exprs, unsupported
from spate.errors import ConfigError, PlanError

if TYPE_CHECKING:  # pragma: no cover
    from spate.frame import DataFrame


def _fits(value: Any, kind: pa.DataType) -> bool:
    """Whether a scalar ``fillna`` value goes into a column of type ``kind``: numbers into
    numeric columns, strings into strings, booleans into booleans, times into times."""
    try:
        value_type = pa.scalar(value).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    if pa.types.is_boolean(value_type) or pa.types.is_boolean(kind):
        return pa.types.is_boolean(value_type) and pa.types.is_boolean(kind)
    if is_numeric(value_type):
        return is_numeric(kind)
    if pa.types.is_string(value_type):
        return (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
        )
    return value_type == kind or (pa.types.is_timestamp(value_type) and pa.types.is_timestamp(kind))


class MissingMixin:
    """The missing-data methods of :class:`spate.DataFrame`."""

    __slots__ = ()

    def _each_column(self: Any, make: Any) -> DataFrame:
        frame = self._protect_order(self.columns)
        plan = frame._keyed_plan()
        exprs = [make(col(c)).alias(c) if c in self.columns else col(c) for c in plan.columns()]
        return frame._from_keyed(plan.select(exprs), frame._hidden)

    def isna(self: Any) -> DataFrame:
        """True where a value is null, column by column."""
        return self._each_column(lambda e: e.is_null())

    isnull = isna

    def notna(self: Any) -> DataFrame:
        """True where a value is not null, column by column."""
        return self._each_column(lambda e: e.is_not_null())

    notnull = notna

    def dropna(
        self: Any,
        *,
        axis: int | str = 0,
        how: str | None = None,
        thresh: int | None = None,
        subset: str | Sequence[str] | None = None,
        inplace: bool = False,
        ignore_index: bool = False,
    ) -> DataFrame:
        """The rows without nulls (``how="any"``), not all null (``"all"``), or with at least
        ``thresh`` non-null values, among ``subset`` (default: every column)."""
        if axis not in (0, "index"):
            unsupported("dropna", "axis", axis, "0 (rows)")
        if inplace:
            unsupported("dropna", "inplace", inplace, "False (frames are immutable plans)")
        if how is not None and thresh is not None:
            raise ConfigError("dropna: pass how= or thresh=, not both (as pandas)")
        columns = names(subset) if subset is not None else self.columns
        missing = [c for c in columns if c not in self._frame.columns()]
        if missing:
            raise PlanError(f"dropna: no column(s) {', '.join(map(repr, missing))}")
        if not columns:
            return self
        present = [col(c).is_not_null() for c in columns]
        if thresh is not None:
            counts = [_spate.Expr.case([(p, lit(1))], lit(0)) for p in present]
            total = counts[0]
            for c in counts[1:]:
                total = total.binary("+", c)
            keep = total.binary(">=", lit(int(thresh)))
        elif how in (None, "any"):
            keep = present[0]
            for p in present[1:]:
                keep = keep.binary("&", p)
        elif how == "all":
            keep = present[0]
            for p in present[1:]:
                keep = keep.binary("|", p)
        else:
            raise ConfigError(f"dropna: how must be 'any' or 'all', got {how!r}")
        return self._from_keyed(self._keyed_plan().filter(keep), self._hidden)

    def fillna(
        self: Any,
        value: Any = None,
        *,
        axis: Any = None,
        inplace: bool = False,
        limit: int | None = None,
    ) -> DataFrame:
        """Nulls replaced by ``value``: a scalar, for every column whose type it fits
        (numbers in numeric columns, strings in string columns, ...; pandas would also put it
        in the others, turning them into ``object``), or a dict of column to value."""
        if axis not in (None, 0, "index"):
            unsupported("fillna", "axis", axis, "None and 0")
        if inplace:
            unsupported("fillna", "inplace", inplace, "False")
        if limit is not None:
            unsupported("fillna", "limit", limit, "None")
        if value is None:
            raise ConfigError("fillna: pass a value (use ffill() or bfill() to fill by order)")
        schema = self.schema
        if isinstance(value, Mapping):
            unknown = [c for c in value if c not in self._frame.columns()]
            if unknown:
                # pandas ignores such keys; a typo would go unnoticed, so say it.
                raise PlanError(f"fillna: no column(s) {', '.join(map(repr, unknown))}")
            fills = dict(value)
        else:
            fills = {c: value for c in self.columns if _fits(value, schema.field(c).type)}
        frame = self._protect_order(fills)
        plan = frame._keyed_plan()
        exprs = []
        for name in plan.columns():
            if name in fills:
                exprs.append(fn("coalesce", col(name), lit(fills[name])).alias(name))
            else:
                exprs.append(col(name))
        return frame._from_keyed(plan.select(exprs), frame._hidden)

    def _fill_by_order(self: Any, forward: bool, limit: int | None) -> DataFrame:
        what = "ffill" if forward else "bfill"
        self._require_order(what)
        order = order_exprs(self._order)
        exprs = {c: windows.filled(col(c), forward, order, (), limit) for c in self.columns}
        return self._with_columns(exprs)

    def ffill(
        self: Any, *, axis: Any = None, inplace: bool = False, limit: int | None = None
    ) -> DataFrame:
        """Nulls replaced by the last non-null value before them, in the frame's sort
        order (needs ``sort_values`` first)."""
        if axis not in (None, 0, "index"):
            unsupported("ffill", "axis", axis, "None and 0")
        if inplace:
            unsupported("ffill", "inplace", inplace, "False")
        return self._fill_by_order(True, limit)

    def bfill(
        self: Any, *, axis: Any = None, inplace: bool = False, limit: int | None = None
    ) -> DataFrame:
        """Nulls replaced by the next non-null value after them, in the frame's order."""
        if axis not in (None, 0, "index"):
            unsupported("bfill", "axis", axis, "None and 0")
        if inplace:
            unsupported("bfill", "inplace", inplace, "False")
        return self._fill_by_order(False, limit)
