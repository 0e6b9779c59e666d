"""``Column.dt``: pandas' date and time methods as plan expressions.

Fields come from DataFusion's ``date_part`` (``dayofweek`` counts from Monday = 0, as
pandas); ``floor``, ``ceil`` and ``round`` work on the timestamp's integer value, so on a
time-zone-aware column they round the UTC instant (pandas rounds the local wall time: the same
for whole-hour offsets and frequencies up to an hour).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spate import _spate
from spate._util import fn, lit, unsupported
from spate.errors import ConfigError, PlanError

if TYPE_CHECKING:  # pragma: no cover
    from spate.column import Column

__all__ = ["DatetimeMethods"]

#: Nanoseconds per unit of an Arrow timestamp.
_NANOS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


class DatetimeMethods:
    """Date and time functions of a timestamp (or date) Column, as pandas' ``.dt``."""

    __slots__ = ("_column",)

    def __init__(self, column: Column) -> None:
        self._column = column

    def _kind(self) -> pa.DataType:
        kind = self._column._type()
        if kind is None or not (pa.types.is_timestamp(kind) or pa.types.is_date(kind)):
            raise PlanError(
                f".dt needs a timestamp or date column; {self._column.name!r} is {kind}"
            )
        return kind

    def _part(self, part: str) -> Column:
        self._kind()
        value = fn("date_part", lit(part), self._column._expr)
        return self._column._new(value.cast(pa.int32()))

    @property
    def year(self) -> Column:
        return self._part("year")

    @property
    def month(self) -> Column:
        return self._part("month")

    @property
    def day(self) -> Column:
        return self._part("day")

    @property
    def hour(self) -> Column:
        return self._part("hour")

    @property
    def minute(self) -> Column:
        return self._part("minute")

    @property
    def second(self) -> Column:
        return self._part("second")

    @property
    def quarter(self) -> Column:
        return self._part("quarter")

    @property
    def dayofyear(self) -> Column:
        """The day of the year, from 1."""
        return self._part("doy")

    day_of_year = dayofyear

    @property
    def dayofweek(self) -> Column:
        """The day of the week, Monday = 0 to Sunday = 6."""
        self._kind()
        dow = fn("date_part", lit("dow"), self._column._expr).cast(pa.int32())
        return self._column._new(dow.binary("+", lit(6)).binary("%", lit(7)))

    day_of_week = dayofweek
    weekday = dayofweek

    @property
    def date(self) -> Column:
        """The date (``datetime.date`` values in pandas)."""
        self._kind()
        return self._column._new(self._column._expr.cast(pa.date32()))

    def strftime(self, date_format: str) -> Column:
        """Formatted with ``date_format`` (chrono's strftime codes: %Y %m %d %H %M %S ...)."""
        self._kind()
        return self._column._new(fn("to_char", self._column._expr, lit(date_format)))

    def _rounded(self, freq: Any, how: str, ambiguous: Any, nonexistent: Any) -> Column:
        if ambiguous != "raise":
            unsupported(f"dt.{how}", "ambiguous", ambiguous, "'raise'")
        if nonexistent != "raise":
            unsupported(f"dt.{how}", "nonexistent", nonexistent, "'raise'")
        kind = self._kind()
        if not pa.types.is_timestamp(kind):
            raise PlanError(f"dt.{how} needs a timestamp column, not {kind}")
        import pandas as pd

        try:
            step = pd.Timedelta(pd.tseries.frequencies.to_offset(freq))
        except (ValueError, TypeError):
            raise ConfigError(f"dt.{how}: {freq!r} is not a fixed frequency") from None
        nanos = _NANOS[kind.unit]
        if step.value % nanos or step.value <= 0:
            raise ConfigError(f"dt.{how}: {freq!r} is not a whole number of {kind.unit}")
        q = lit(step.value // nanos)
        n = self._column._expr.cast(pa.int64())
        # Floor division that rounds towards minus infinity, as for times before 1970.
        floor = n.binary("-", n.binary("%", q).binary("+", q).binary("%", q))
        up = floor.binary("+", q)
        if how == "floor":
            value = floor
        elif how == "ceil":
            value = _spate.Expr.case([(floor.binary("==", n), n)], up)
        else:
            # Half way goes to the even multiple, as pandas (NumPy) rounds.
            twice = n.binary("-", floor).binary("*", lit(2))
            even = floor.binary("/", q).binary("%", lit(2)).binary("==", lit(0))
            value = _spate.Expr.case(
                [
                    (twice.binary(">", q), up),
                    (twice.binary("<", q), floor),
                    (even, floor),
                ],
                up,
            )
        return self._column._new(
            # The integer is the UTC instant: read it as UTC, then show it in the column's zone.
            value.cast(pa.timestamp(kind.unit, "UTC")).cast(kind) if kind.tz else value.cast(kind)
        )

    def floor(self, freq: Any, ambiguous: Any = "raise", nonexistent: Any = "raise") -> Column:
        """Rounded down to a multiple of ``freq`` (``"h"``, ``"15min"``, ``"D"``, ...)."""
        return self._rounded(freq, "floor", ambiguous, nonexistent)

    def ceil(self, freq: Any, ambiguous: Any = "raise", nonexistent: Any = "raise") -> Column:
        """Rounded up to a multiple of ``freq``."""
        return self._rounded(freq, "ceil", ambiguous, nonexistent)

    def round(self, freq: Any, ambiguous: Any = "raise", nonexistent: Any = "raise") -> Column:
        """Rounded to the nearest multiple of ``freq`` (half way to the even one)."""
        return self._rounded(freq, "round", ambiguous, nonexistent)

    def normalize(self) -> Column:
        """The time set to midnight."""
        return self.floor("D")

    def tz_localize(
        self, tz: str | None, ambiguous: Any = "raise", nonexistent: Any = "raise"
    ) -> Column:
        """A naive column's wall times placed in time zone ``tz``; ``None`` makes an aware
        column naive, keeping its local wall time."""
        if ambiguous != "raise":
            unsupported("dt.tz_localize", "ambiguous", ambiguous, "'raise'")
        if nonexistent != "raise":
            unsupported("dt.tz_localize", "nonexistent", nonexistent, "'raise'")
        kind = self._kind()
        if not pa.types.is_timestamp(kind):
            raise PlanError(f"dt.tz_localize needs a timestamp column, not {kind}")
        expr = self._column._expr
        if tz is None:
            if kind.tz is None:
                return self._column
            return self._column._new(fn("to_local_time", expr))
        if kind.tz is not None:
            raise PlanError("dt.tz_localize: the column is already time-zone aware; use tz_convert")
        # Arrow reads a naive value cast to a zone as that zone's wall time.
        return self._column._new(expr.cast(pa.timestamp(kind.unit, tz=str(tz))))

    def tz_convert(self, tz: str | None) -> Column:
        """An aware column's instants shown in time zone ``tz`` (``None``: UTC, naive)."""
        kind = self._kind()
        if not pa.types.is_timestamp(kind) or kind.tz is None:
            raise PlanError("dt.tz_convert needs a time-zone-aware column; use tz_localize first")
        expr = self._column._expr
        if tz is None:
            return self._column._new(
                expr.cast(pa.timestamp(kind.unit, tz="UTC")).cast(pa.timestamp(kind.unit))
            )
        return self._column._new(expr.cast(pa.timestamp(kind.unit, tz=str(tz))))
