"""Expression helpers shared by the frame, column, groupby and window modules: literals,
function calls, window calls and pandas' null markers. Internal: not part of the API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NoReturn, Sequence, Tuple, Union

import pyarrow as pa

from spate import _spate
from spate.errors import ConfigError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    from spate.column import Column

#: A value a Column can be combined with: another Column or a Python/pyarrow scalar.
Operand = Union["Column", Any]

#: A frame's row order: ``(column, ascending, nulls_first)`` per sort key, from
#: ``sort_values`` (empty when the order is undefined).
Order = Tuple[Tuple[str, bool, bool], ...]

#: A window's ORDER BY: ``(expression, ascending, nulls_first)`` per key.
WindowOrder = Sequence[Tuple[_spate.Expr, bool, bool]]

#: One end of a window frame, as ``Expr.window`` takes it.
Bound = Tuple[str, Any]

#: ``ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW``.
RUNNING = ("rows", ("preceding", None), ("current", None))
#: ``ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING``.
REMAINING = ("rows", ("current", None), ("following", None))
#: The whole partition.
WHOLE = ("rows", ("preceding", None), ("following", None))


def col(name: str) -> _spate.Expr:
    """The column ``name``, verbatim."""
    return _spate.Expr.col(name)


def fn(name: str, *args: _spate.Expr) -> _spate.Expr:
    """A call of DataFusion's scalar function ``name``."""
    return _spate.Expr.function(name, list(args))


def rows_back(n: int) -> Bound:
    """``n PRECEDING`` in a ROWS frame."""
    return ("preceding", pa.array([n], pa.uint64()))


def over(
    name: str,
    args: Sequence[_spate.Expr],
    order: WindowOrder = (),
    partition: Sequence[_spate.Expr] = (),
    frame: tuple[str, Bound, Bound] | None = None,
    ignore_nulls: bool = False,
) -> _spate.Expr:
    """``name(args) OVER (PARTITION BY partition ORDER BY order frame)``."""
    return _spate.Expr.window(name, list(args), list(partition), list(order), frame, ignore_nulls)


def order_exprs(order: Order) -> list[tuple[_spate.Expr, bool, bool]]:
    """A frame's order as a window's ORDER BY."""
    return [(col(name), ascending, nulls_first) for name, ascending, nulls_first in order]


def lit(value: Operand) -> _spate.Expr:
    """The expression for ``value``: a Column's own, or a literal of pyarrow's inferred type."""
    from spate.column import Column

    if isinstance(value, Column):
        return value._expr
    if isinstance(value, _spate.Expr):
        return value
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


def typed_null(kind: pa.DataType) -> _spate.Expr:
    """A null of type ``kind``."""
    return _spate.Expr.lit(pa.array([None], type=kind))


def is_missing(value: Any) -> bool:
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


def python_mod(left: _spate.Expr, right: _spate.Expr) -> _spate.Expr:
    """``left % right`` as Python and pandas compute it: the remainder has the sign of the
    divisor (SQL's ``%`` gives it the dividend's: ``-7 % 3`` is 2, not -1), and a zero divisor
    gives null where pandas gives NaN (SQL fails the query on integers)."""
    zero = lit(0)
    divisor = fn("nullif", right, zero)
    remainder = left.binary("%", divisor)
    signs_differ = remainder.binary("<", zero).binary("!=", divisor.binary("<", zero))
    needs_fix = remainder.binary("!=", zero).binary("&", signs_differ)
    return _spate.Expr.case([(needs_fix, remainder.binary("+", divisor))], remainder)


def names(value: str | Sequence[str] | None) -> list[str]:
    """One name or several as a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def unsupported(method: str, argument: str, value: Any, supported: str = "") -> NoReturn:
    """Raises the :class:`UnsupportedError` for an argument value Spate does not take."""
    hint = f"; Spate supports {supported}" if supported else ""
    raise UnsupportedError(f"{method}: {argument}={value!r} is not supported{hint}")


def is_numeric(kind: pa.DataType) -> bool:
    """Integers, floats and decimals (what pandas' numeric_only keeps; booleans are not)."""
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def arrow_type(dtype: Any) -> pa.DataType:
    """A pyarrow type from a pyarrow type, a NumPy dtype or its name, or ``str``."""
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


def pandas_dtype_mapper(backend: str | None) -> Callable[[pa.DataType], Any] | None:
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
