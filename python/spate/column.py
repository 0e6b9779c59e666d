"""Column expressions: ``df.a``, ``df["a"]`` and what is computed from them.

A :class:`Column` is an expression, not data: it runs when used in a frame (``df[mask]``,
``assign``) or on its own (:meth:`Column.to_pandas`, :meth:`Column.sum`). Methods that need row
order (``cumsum``, ``shift``, ``rolling``, ``rank(method="first")``, ...) take it from the
frame the column comes from, which must be sorted (``sort_values``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import pyarrow as pa

from spate import _spate
from spate import _windows as windows
from spate._util import (
    RUNNING,
    Operand,
    arrow_type,
    fn,
    is_missing,
    is_numeric,
    lit,
    order_exprs,
    python_mod,
    typed_null,
    unsupported,
)
from spate.errors import ConfigError, PlanError

if TYPE_CHECKING:  # pragma: no cover
    import numpy
    import pandas
    import polars

    from spate.datetimes import DatetimeMethods
    from spate.frame import DataFrame
    from spate.strings import StringMethods

__all__ = ["Column"]


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
        return self._new(self._expr.binary(op, lit(other)), other)

    def _rbinary(self, op: str, other: Operand) -> Column:
        return self._new(lit(other).binary(op, self._expr), other)

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
        return self._new(left.binary("/", lit(other)), other)

    def __rtruediv__(self, other: Operand) -> Column:
        left = lit(other).cast(pa.float64())
        return self._new(left.binary("/", self._expr), other)

    def __mod__(self, other: Operand) -> Column:
        # pandas' (Python's) modulo: the result takes the divisor's sign.
        return self._new(python_mod(self._expr, lit(other)), other)

    def __rmod__(self, other: Operand) -> Column:
        return self._new(python_mod(lit(other), self._expr), other)

    def __pow__(self, other: Operand) -> Column:
        left = self._expr.cast(pa.float64())
        return self._new(_spate.Expr.function("power", [left, lit(other)]), other)

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
            "the truth value of a Column is ambiguous: combine masks with & | ~, not and/or/not"
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
            return self._new(_spate.Expr.function("round", [self._expr, lit(decimals)]))
        # As NumPy does: multiply by 10**decimals, or divide by 10**-decimals when negative.
        scale = lit(10.0 ** abs(decimals))
        scale_up, scale_down = ("*", "/") if decimals >= 0 else ("/", "*")
        scaled = self._expr.binary(scale_up, scale)
        fraction = _spate.Expr.function(
            "abs", [scaled.binary("-", _spate.Expr.function("trunc", [scaled]))]
        )
        # A tie (exactly .5 after scaling) goes to the even neighbour: 2 * round(y / 2).
        even = lit(2.0).binary("*", _spate.Expr.function("round", [scaled.binary("/", lit(2.0))]))
        nearest = _spate.Expr.function("round", [scaled])
        rounded = _spate.Expr.case([(fraction.binary("==", lit(0.5)), even)], nearest)
        return self._new(rounded.binary(scale_down, scale))

    def isin(self, values: Iterable[Any]) -> Column:
        """True where the value is one of ``values``, else False, never null: as in pandas, a
        null is not in ``values`` unless a null marker (None, NaN, ``pd.NA``) is among them.
        (pandas' rule depends on the dtype, e.g. an ``Int64`` NA only matches ``pd.NA`` and a
        float NaN only ``NaN``; Spate has one null, which any of them matches.)"""
        values = list(values)
        present = [v for v in values if not is_missing(v)]
        if not present:
            return self._new(self._expr.is_null() if values else lit(False))
        matches = self._expr.isin([lit(v) for v in present])
        if len(present) < len(values):
            return self._new(matches.binary("|", self._expr.is_null()))
        return self._new(_spate.Expr.function("coalesce", [matches, lit(False)]))

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
        return self._new(_spate.Expr.function("coalesce", [self._expr, lit(value)]), value)

    def astype(self, dtype: Any) -> Column:
        """Cast to ``dtype``: a pyarrow type, a NumPy dtype or its name (``"int32"``,
        ``"float64"``), or ``"str"``. Booleans become ``"True"`` / ``"False"`` as in pandas;
        other values are formatted as Arrow formats them (floats with exponents differ from
        Python's: ``1e20`` rather than ``1e+20``)."""
        target = arrow_type(dtype)
        if pa.types.is_string(target) and pa.types.is_boolean(self._type()):
            text = _spate.Expr.case(
                [(self._expr, lit("True")), (self._expr.invert(), lit("False"))]
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

    def _computed(self) -> tuple[_spate.Frame, _spate.Expr]:
        """The owner's plan and this column's expression in it (a window function computed
        into a column first: see ``DataFrame._as_column``)."""
        frame, expr = self._owner()._as_column("__spate_value", self._expr)
        return frame._frame, expr

    def _reduce(self, agg: _spate.Expr) -> Any:
        """Runs the aggregate ``agg`` (built by a function of this column's expression)."""
        frame, _ = self._computed()
        return pa.table(frame.aggregate([], [agg.alias("value")])).column(0)[0].as_py()

    def _aggregate(self, name: str, distinct: bool = False) -> Any:
        _, value = self._computed()
        if name in ("sum", "avg") and pa.types.is_boolean(self._type()):
            # pandas counts True as 1: the sum of a mask is its number of True values.
            value = value.cast(pa.int64() if name == "sum" else pa.float64())
        return self._reduce(_spate.Expr.aggregate(name, [value], distinct))

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
        # Computed as a column of the owner, then in the owner's order (see
        # DataFrame._sorted_keyed_plan).
        name = "__spate_value"
        computed = self._owner()._with_columns({name: self._expr})
        plan = computed._sorted_keyed_plan().select([_spate.Expr.col(name).alias(self.name)])
        return pa.table(plan).column(0)

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

    # ----- more reductions -------------------------------------------------------------

    def prod(self) -> Any:
        """The product of the non-null values (1 when there are none, as in pandas)."""
        kind = self._type()
        wide = (
            pa.float64()
            if kind is not None and (pa.types.is_floating(kind) or pa.types.is_decimal(kind))
            else pa.int64()
        )
        _, value = self._computed()
        return self._reduce(_spate.Expr.aggregate("product", [value.cast(wide)]))

    def median(self) -> Any:
        """The median of the non-null values."""
        return self._aggregate("median")

    def std(self, ddof: int = 1) -> Any:
        """The standard deviation (``ddof`` 1, sample, or 0, population)."""
        return self._aggregate({1: "stddev_samp", 0: "stddev_pop"}[self._ddof(ddof)])

    def var(self, ddof: int = 1) -> Any:
        """The variance (``ddof`` 1, sample, or 0, population)."""
        return self._aggregate({1: "var_samp", 0: "var_pop"}[self._ddof(ddof)])

    @staticmethod
    def _ddof(ddof: int) -> int:
        if ddof not in (0, 1):
            unsupported("std/var", "ddof", ddof, "0 and 1")
        return ddof

    def quantile(self, q: float = 0.5) -> Any:
        """The ``q`` quantile of the non-null values, interpolated linearly (pandas'
        default)."""
        if not 0 <= q <= 1:
            raise ConfigError(f"quantile: q must be in [0, 1], got {q!r}")
        _, value = self._computed()
        return self._reduce(
            _spate.Expr.aggregate("percentile_cont", [value.cast(pa.float64()), lit(float(q))])
        )

    # ----- values and selection ----------------------------------------------------------

    def clip(self, lower: Operand = None, upper: Operand = None) -> Column:
        """Values below ``lower`` become ``lower``, above ``upper`` become ``upper``; nulls
        stay null."""
        expr = self._expr
        if lower is not None:
            expr = _spate.Expr.case([(expr.binary("<", lit(lower)), lit(lower))], expr)
        if upper is not None:
            expr = _spate.Expr.case([(expr.binary(">", lit(upper)), lit(upper))], expr)
        return self._new(expr)

    def where(self, cond: Column, other: Operand = None) -> Column:
        """The value where ``cond`` is true, else ``other`` (null by default). A null
        condition counts as false, as pandas' False for a comparison with NaN."""
        keep = fn("coalesce", lit(cond), lit(False))
        otherwise = typed_null(pa.null()) if other is None else lit(other)
        return self._new(_spate.Expr.case([(keep, self._expr)], otherwise), cond)

    def mask(self, cond: Column, other: Operand = None) -> Column:
        """``other`` (null by default) where ``cond`` is true, else the value."""
        replace = fn("coalesce", lit(cond), lit(False))
        value = typed_null(pa.null()) if other is None else lit(other)
        return self._new(_spate.Expr.case([(replace, value)], self._expr), cond)

    def map(
        self, arg: Mapping[Any, Any] | Callable[[Any], Any], na_action: str | None = None
    ) -> Column:
        """Each value mapped: by a dict (values it does not name become null, as in pandas;
        a plan expression, so it runs on the GPU), or by a Python function of one value (run
        on the CPU over Arrow batches; nulls are passed to it unless
        ``na_action="ignore"``)."""
        if na_action not in (None, "ignore"):
            unsupported("map", "na_action", na_action, "None and 'ignore'")
        if isinstance(arg, Mapping):
            present = [(k, v) for k, v in arg.items() if not is_missing(k)]
            null_value = next((v for k, v in arg.items() if is_missing(k)), None)
            branches = [(self._expr.binary("==", lit(k)), lit(v)) for k, v in present]
            if null_value is not None and na_action is None:
                branches.insert(0, (self._expr.is_null(), lit(null_value)))
            if not branches:
                return self._new(typed_null(pa.null()))
            return self._new(_spate.Expr.case(branches))
        if not callable(arg):
            raise TypeError(f"map expects a dict or a function, got {type(arg).__name__}")
        from spate._host import python_column

        return python_column(self, arg, skip_nulls=na_action == "ignore")

    def apply(
        self,
        func: Callable[[Any], Any],
        convert_dtype: Any = None,
        args: tuple[Any, ...] = (),
        **kwargs: Any,
    ) -> Column:
        """``func`` applied to each value, on the CPU (see :meth:`map`). A NumPy ufunc is
        called once per batch on the whole array."""
        if convert_dtype is not None:
            unsupported("apply", "convert_dtype", convert_dtype)

        def bound(value: Any) -> Any:
            return func(value, *args, **kwargs)

        bound.__name__ = getattr(func, "__name__", "function")
        target = bound if args or kwargs else func
        from spate._host import python_column

        return python_column(self, target, skip_nulls=False)

    def unique(self) -> DataFrame:
        """The distinct values (null among them when present), as a one-column frame. pandas
        returns them in order of appearance; Spate in no particular order."""
        frame, expr = self._computed()
        owner = self._owner()
        return owner._derive(frame.select([expr.alias(self.name)]).distinct(), index=(), order=())

    def value_counts(
        self,
        normalize: bool = False,
        sort: bool = True,
        ascending: bool = False,
        bins: Any = None,
        dropna: bool = True,
    ) -> DataFrame:
        """How often each value occurs: a frame indexed by the value, with column ``count``
        (``proportion`` with ``normalize=True``), most frequent first unless ``sort=False``.
        Values with equal counts come in an unspecified order."""
        if bins is not None:
            unsupported("value_counts", "bins", bins)
        from spate._inspect import value_counts

        plan, expr = self._computed()
        frame = plan.select([expr.alias(self.name)])
        return value_counts(self._owner(), frame, [self.name], normalize, sort, ascending, dropna)

    def nlargest(self, n: int = 5, keep: str = "first") -> DataFrame:
        """The ``n`` largest non-null values, largest first, as a one-column frame."""
        return self._extremes(n, keep, ascending=False)

    def nsmallest(self, n: int = 5, keep: str = "first") -> DataFrame:
        """The ``n`` smallest non-null values, smallest first, as a one-column frame."""
        return self._extremes(n, keep, ascending=True)

    def _extremes(self, n: int, keep: str, ascending: bool) -> DataFrame:
        if keep != "first":
            unsupported("nlargest/nsmallest", "keep", keep, "'first'")
        plan, expr = self._computed()
        owner = self._owner()
        values = owner._derive(plan.select([expr.alias(self.name)]), index=(), order=())
        return values.nsmallest(n, self.name) if ascending else values.nlargest(n, self.name)

    def duplicated(self, keep: str | bool = "first") -> Column:
        """True for each value that appeared before (``keep="first"``, in the frame's sort
        order), after (``"last"``), or more than once (``False``)."""
        from spate._inspect import duplicated_expr

        owner = self._owner()
        return Column(duplicated_expr(owner, [self._expr], keep), owner)

    # ----- order-dependent methods (need a sorted frame) ---------------------------------

    def _window_apply(
        self,
        build: Callable[..., _spate.Expr],
        numeric: bool = False,
        what: str = "this method",
        needs_order: bool = True,
        order: Any = None,
    ) -> Column:
        owner = self._owner()
        if needs_order and order is None:
            owner._require_order(what)
        kind = self._type()
        if numeric and kind is not None and not (is_numeric(kind) or pa.types.is_boolean(kind)):
            raise PlanError(f"{what} needs a numeric column; {self.name!r} is {kind}")
        expr = build(
            self._expr, kind, order if order is not None else order_exprs(owner._order), []
        )
        return Column(expr.alias(self.name), owner, self.name)

    def _cumulative(self, how: str) -> Column:
        build = windows.cumulative_of(how)
        return self._window_apply(build, numeric=how in ("cumsum", "cumprod"), what=how)

    def cumsum(self) -> Column:
        """The running sum in the frame's order (null where the value is null)."""
        return self._cumulative("cumsum")

    def cumprod(self) -> Column:
        """The running product (integers wrap on overflow, as NumPy's do)."""
        return self._cumulative("cumprod")

    def cummin(self) -> Column:
        """The running minimum."""
        return self._cumulative("cummin")

    def cummax(self) -> Column:
        """The running maximum."""
        return self._cumulative("cummax")

    def shift(self, periods: int = 1, fill_value: Any = None) -> Column:
        """The value ``periods`` rows earlier (later when negative) in the frame's order."""

        build = windows.shift_of(periods, fill_value)
        return self._window_apply(build, what="shift")

    def diff(self, periods: int = 1) -> Column:
        """The value minus the one ``periods`` rows earlier."""

        build = windows.diff_of(periods)
        return self._window_apply(build, numeric=True, what="diff")

    def pct_change(self, periods: int = 1, fill_method: Any = None) -> Column:
        """The relative change from the value ``periods`` rows earlier (``fill_method=None``,
        pandas 3's only behaviour)."""
        if fill_method is not None:
            unsupported("pct_change", "fill_method", fill_method, "None")

        build = windows.pct_change_of(periods)
        return self._window_apply(build, numeric=True, what="pct_change")

    def ffill(self, limit: int | None = None) -> Column:
        """Nulls replaced by the last non-null value before them in the frame's order."""

        build = windows.fill_of(True, limit)
        return self._window_apply(build, what="ffill")

    def bfill(self, limit: int | None = None) -> Column:
        """Nulls replaced by the next non-null value after them in the frame's order."""

        build = windows.fill_of(False, limit)
        return self._window_apply(build, what="bfill")

    def rank(
        self,
        method: str = "average",
        ascending: bool = True,
        na_option: str = "keep",
        pct: bool = False,
    ) -> Column:
        """Each value's rank among the non-null values (float64, as pandas). Only
        ``method="first"`` needs a sorted frame (ties by row order)."""

        build = windows.rank_of(method, ascending, na_option, pct)
        return self._window_apply(build, what="rank", needs_order=method == "first")

    def rolling(
        self,
        window: Any,
        min_periods: int | None = None,
        center: bool = False,
        win_type: Any = None,
        on: str | None = None,
        closed: Any = None,
    ) -> windows.Rolling:
        """Windows of ``window`` rows, or of a time span (``"1h"``) over column ``on``."""
        unit, order = windows.time_order(self._owner(), window, on)
        frame, periods = windows.rolling_frame(window, min_periods, center, win_type, closed, unit)
        return windows.Rolling(self, frame, periods, "rolling", order)

    def expanding(self, min_periods: int = 1) -> windows.Expanding:
        """Windows of every row up to each row."""
        return windows.Expanding(self, RUNNING, min_periods, "expanding")

    # ----- host conversion ----------------------------------------------------------------

    def to_numpy(self, dtype: Any = None, na_value: Any = None) -> numpy.ndarray:
        """Runs the column's plan and returns its values as a NumPy array (nulls become NaN,
        None or NaT as pandas makes them, or ``na_value``)."""
        series = self.to_pandas()
        if na_value is not None:
            return series.to_numpy(dtype=dtype, na_value=na_value)
        return series.to_numpy(dtype=dtype)

    @property
    def values(self) -> numpy.ndarray:
        """:meth:`to_numpy`."""
        return self.to_numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> numpy.ndarray:
        import numpy as np

        return np.asarray(self.to_numpy(), dtype=dtype)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """The DLPack protocol for numeric columns without nulls (see :func:`spate._host`)."""
        from spate._host import dlpack_array

        return dlpack_array(self).__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def to_cupy(self) -> Any:
        """The values as a CuPy array (CuPy must be installed)."""
        from spate._host import to_cupy

        return to_cupy(self.to_numpy())

    # Last in the class: from here on, `str` in annotations would mean this property.
    @property
    def dt(self) -> DatetimeMethods:
        """Date and time methods: ``year`` ... ``second``, ``dayofweek``, ``floor``,
        ``strftime``, ``tz_convert``, ...."""
        from spate.datetimes import DatetimeMethods

        return DatetimeMethods(self)

    @property
    def str(self) -> StringMethods:
        """String methods: ``contains``, ``split``, ``extract``, ``pad``, ...."""
        from spate.strings import StringMethods

        return StringMethods(self)
