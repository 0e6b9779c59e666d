"""Selection on frames: ``iloc``, ``loc``, ``where``/``mask``, ``clip``, and pandas'
``query``/``eval`` strings (parsed as Python, with ``@variable`` and backticks, into Column
expressions, so operators keep pandas' semantics: true division, Python's modulo, ...)."""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pyarrow as pa

from spate import _spate
from spate._util import (
    WHOLE,
    col,
    fn,
    is_numeric,
    is_missing,
    lit,
    order_exprs,
    over,
    typed_null,
    unsupported,
)
from spate.errors import ConfigError, PlanError, SqlError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    from spate.column import Column
    from spate.frame import DataFrame

_POSITION = "__spate_position"
_ROWS = "__spate_rows"
_ORDINAL = "__spate_ordinal"
_CONDITION = "__spate_condition"


def _caller_variables(depth: int) -> dict[str, Any]:
    """The local and global variables of the caller ``depth`` frames up (for ``@name``)."""
    frame = inspect.currentframe()
    try:
        for _ in range(depth + 1):
            if frame is None:
                return {}
            frame = frame.f_back
        if frame is None:
            return {}
        return {**frame.f_globals, **frame.f_locals}
    finally:
        del frame


class _Translator:
    """A pandas expression string as Spate Columns: columns by name (or in backticks),
    ``@variables`` from the caller, literals, arithmetic, comparisons (chained too), ``and``
    / ``or`` / ``not`` / ``& | ~``, ``in`` / ``not in`` lists."""

    def __init__(self, df: DataFrame, text: str, variables: Mapping[str, Any]) -> None:
        self._df = df
        self._variables = variables
        self._quoted: dict[str, str] = {}

        self._text = _boolean_operators(self._names(text))

    def _names(self, text: str) -> str:
        """Backtick names and ``@variables`` as Python names, outside string literals."""
        out = []
        i = 0
        while i < len(text):
            ch = text[i]
            if ch in "'\"":
                end = i + 1
                while end < len(text) and text[end] != ch:
                    end += 2 if text[end] == "\\" else 1
                out.append(text[i : end + 1])
                i = end + 1
            elif ch == "`":
                end = text.find("`", i + 1)
                if end < 0:
                    raise SqlError(f"unclosed backtick in {text!r}")
                name = f"__spate_quoted_{len(self._quoted)}"
                self._quoted[name] = text[i + 1 : end]
                out.append(name)
                i = end + 1
            elif ch == "@":
                match = re.match(r"@([A-Za-z_]\w*)", text[i:])
                if match is None:
                    raise SqlError(f"'@' must name a variable in {text!r}")
                out.append(f"__spate_at_{match.group(1)}")
                i += match.end()
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    def parse(self, mode: str = "eval") -> ast.AST:
        try:
            return ast.parse(self._text.strip(), mode=mode)
        except SyntaxError as e:
            raise SqlError(f"cannot parse the expression {self._text!r}: {e.msg}") from None

    def value(self, node: ast.AST) -> Any:
        """A Column, or a Python value for a literal or variable."""
        from spate.column import Column

        if isinstance(node, ast.Expression):
            return self.value(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            name = node.id
            if name.startswith("__spate_at_"):
                variable = name[len("__spate_at_") :]
                if variable not in self._variables:
                    raise PlanError(f"the expression names @{variable}, which is not defined")
                return self._variables[variable]
            name = self._quoted.get(name, name)
            if name in self._df._frame.columns():
                return self._df[name]
            raise PlanError(
                f"the expression names {name!r}, which is not a column (columns: "
                f"{', '.join(self._df._frame.columns())}); use @{name} for a Python variable"
            )
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.UnaryOp):
            operand = self.value(node.operand)
            if isinstance(node.op, (ast.Not, ast.Invert)):
                return ~operand if isinstance(operand, Column) else not operand
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return operand
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            ops = {
                ast.Add: lambda a, b: a + b,
                ast.Sub: lambda a, b: a - b,
                ast.Mult: lambda a, b: a * b,
                ast.Div: lambda a, b: a / b,
                ast.Mod: lambda a, b: a % b,
                ast.Pow: lambda a, b: a**b,
                ast.BitAnd: lambda a, b: a & b,
                ast.BitOr: lambda a, b: a | b,
            }
            op = ops.get(type(node.op))
            if op is not None:
                if not isinstance(left, Column) and isinstance(right, Column):
                    # Reflected operators: the Column's __r*__ methods.
                    return op(_Lifted(left, right), right)
                return op(left, right)
        if isinstance(node, ast.BoolOp):
            values = [self.value(v) for v in node.values]
            result = values[0]
            for v in values[1:]:
                result = result & v if isinstance(node.op, ast.And) else result | v
            return result
        if isinstance(node, ast.Compare):
            left = self.value(node.left)
            result = None
            for operator, comparator in zip(node.ops, node.comparators):
                right = self.value(comparator)
                part = self._compare(operator, left, right)
                result = part if result is None else result & part
                left = right
            return result
        raise UnsupportedError(
            f"the expression {ast.unparse(node)!r} uses syntax Spate's query/eval does not "
            "support (columns, @variables, literals, arithmetic, comparisons, and/or/not, in)"
        )

    def _compare(self, op: ast.cmpop, left: Any, right: Any) -> Any:
        from spate.column import Column

        if isinstance(op, (ast.In, ast.NotIn)):
            if not isinstance(left, Column):
                raise UnsupportedError("'in' needs a column on its left")
            if isinstance(right, Column):
                raise UnsupportedError(
                    "'in' with a column on its right is not supported (pandas' meaning is "
                    "isin over that column's values: merge with how='leftsemi' instead)"
                )
            if isinstance(right, (str, bytes)) or not hasattr(right, "__iter__"):
                values = [right]
            else:
                values = list(right)
            member = left.isin(values)
            return ~member if isinstance(op, ast.NotIn) else member
        if not isinstance(left, Column) and isinstance(right, Column):
            flipped = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}
            op = flipped.get(type(op), type(op))()
            left, right = right, left
        table: dict[type, Callable[[Any, Any], Any]] = {
            ast.Eq: lambda a, b: a == b,
            ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b,
            ast.GtE: lambda a, b: a >= b,
        }
        compare = table.get(type(op))
        if compare is None:
            raise UnsupportedError(f"the comparison {type(op).__name__} is not supported")
        return compare(left, right)


def _boolean_operators(text: str) -> str:
    """``&`` and ``|`` as ``and`` and ``or``: in pandas' expressions they bind looser than
    comparisons (``a == 1 | b == 2``), unlike Python's bitwise operators."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    out = []
    for token in tokens:
        if token.type == tokenize.OP and token.string in ("&", "|"):
            token = token._replace(string=" and " if token.string == "&" else " or ")
        out.append(token)
    return tokenize.untokenize(out)


class _Lifted:
    """A Python value on the left of an operator with a Column on the right."""

    def __init__(self, value: Any, like: Column) -> None:
        self.value = value
        self.like = like

    def __add__(self, other: Column) -> Column:
        return other.__radd__(self.value)

    def __sub__(self, other: Column) -> Column:
        return other.__rsub__(self.value)

    def __mul__(self, other: Column) -> Column:
        return other.__rmul__(self.value)

    def __truediv__(self, other: Column) -> Column:
        return other.__rtruediv__(self.value)

    def __mod__(self, other: Column) -> Column:
        return other.__rmod__(self.value)

    def __pow__(self, other: Column) -> Column:
        return other._new(lit(self.value).cast(pa.float64())).__pow__(other)

    def __and__(self, other: Column) -> Column:
        return other.__rand__(self.value)

    def __or__(self, other: Column) -> Column:
        return other.__ror__(self.value)


class _ILoc:
    """``df.iloc[rows]`` and ``df.iloc[rows, columns]`` by position."""

    def __init__(self, df: DataFrame) -> None:
        self._df = df

    def __getitem__(self, key: Any) -> Any:
        df = self._df
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        if isinstance(key, tuple) and len(key) != 2:
            raise ConfigError("iloc takes [rows] or [rows, columns]")
        names = df.columns
        if isinstance(columns, int) and not isinstance(columns, bool):
            chosen: list[str] | str = names[columns]
        elif isinstance(columns, slice):
            chosen = names[columns]
        else:
            chosen = [names[i] for i in columns]
        if isinstance(rows, slice) and rows == slice(None):
            return df[chosen]
        picked = _by_position(df, rows)
        return picked[[chosen] if isinstance(chosen, str) else chosen]


def _by_position(df: DataFrame, rows: Any) -> DataFrame:
    """The rows at positions ``rows`` (an int, a slice or a list of ints) in the frame's
    order. A slice with non-negative bounds and no step needs no order (like ``head``)."""
    if (
        isinstance(rows, slice)
        and rows.step in (None, 1)
        and (rows.start or 0) >= 0
        and (rows.stop is None or rows.stop >= 0)
    ):
        return df[rows]
    df._require_order("iloc")
    if isinstance(rows, (list, tuple)):
        return _by_position_list(df, list(rows))
    row_number = over("row_number", [], order_exprs(df._order)).cast(pa.int64())
    position = row_number.binary("-", lit(1))
    count = over("count", [lit(1)], (), (), WHOLE)

    def at(i: int) -> _spate.Expr:
        return lit(i) if i >= 0 else col(_ROWS).binary("+", lit(i))

    pos = col(_POSITION)
    if isinstance(rows, bool) or not isinstance(rows, (int, slice, list, tuple)):
        raise UnsupportedError(f"iloc rows must be an int, a slice or a list of ints, got {rows!r}")
    if isinstance(rows, int):
        keep = pos.binary("==", at(rows))
    elif isinstance(rows, slice):
        if rows.step is not None and rows.step < 1:
            unsupported("iloc", "step", rows.step, "positive steps")
        start = lit(0) if rows.start is None else fn("greatest", at(rows.start), lit(0))
        keep = pos.binary(">=", start)
        if rows.stop is not None:
            keep = keep.binary("&", pos.binary("<", at(rows.stop)))
        if rows.step not in (None, 1):
            keep = keep.binary(
                "&", pos.binary("-", start).binary("%", lit(rows.step)).binary("==", lit(0))
            )
    numbered = df._with_columns({_POSITION: position, _ROWS: count})
    kept = numbered._keyed_plan().filter(keep)
    columns = [c for c in kept.columns() if c not in (_POSITION, _ROWS)]
    return numbered._from_keyed(kept.select([col(c) for c in columns]), numbered._hidden)


def _by_position_list(df: DataFrame, rows: list[int]) -> DataFrame:
    """The rows at the positions ``rows``, in the list's order and as often as listed, as
    pandas gives them: the positions (negative ones counted from the end, which needs the
    row count: one query) are joined to the frame's row numbers."""
    if any(isinstance(i, bool) or not isinstance(i, int) for i in rows):
        raise UnsupportedError(f"iloc: a list of positions must hold ints, got {rows!r}")
    total = len(df)
    if any(not -total <= i < total for i in rows):
        raise IndexError(f"iloc: positions {rows} are out of bounds for {total} rows")
    positions = [i if i >= 0 else total + i for i in rows]
    row_number = over("row_number", [], order_exprs(df._order)).cast(pa.int64())
    numbered = df._with_columns({_POSITION: row_number.binary("-", lit(1))})
    wanted = df._session.from_arrow(
        pa.table({_POSITION: pa.array(positions, pa.int64()), _ORDINAL: range(len(positions))})
    )
    joined = numbered.reset_index().merge(wanted, on=_POSITION, how="inner")
    plan = joined._frame.sort([col(_ORDINAL)], [True], [False])
    plan = plan.select([col(c) for c in df._frame.columns()])
    from spate.frame import DataFrame

    return DataFrame(plan, df._session, df._index)


class _Loc:
    """``df.loc[rows]`` and ``df.loc[rows, columns]``: a boolean Column, or labels of the
    index (one index column; slices include both ends, as pandas' label slices)."""

    def __init__(self, df: DataFrame) -> None:
        self._df = df

    def __getitem__(self, key: Any) -> Any:
        from spate.column import Column

        df = self._df
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        if isinstance(rows, Column):
            picked = df.filter(rows)
        elif isinstance(rows, slice) and rows == slice(None):
            picked = df
        else:
            if len(df._index) != 1:
                raise PlanError(
                    "loc by label needs a frame with one index column (set_index); use a "
                    "boolean Column to select rows otherwise"
                )
            label = col(df._index[0])
            if isinstance(rows, slice):
                if rows.step is not None:
                    unsupported("loc", "step", rows.step)
                keep = lit(True)
                if rows.start is not None:
                    keep = label.binary(">=", lit(rows.start))
                if rows.stop is not None:
                    keep = keep.binary("&", label.binary("<=", lit(rows.stop)))
            elif isinstance(rows, (list, tuple)):
                keep = label.isin([lit(v) for v in rows])
            else:
                keep = label.binary("==", lit(rows))
            picked = df._from_keyed(df._keyed_plan().filter(keep), df._hidden)
        if isinstance(columns, slice) and columns == slice(None):
            return picked
        if isinstance(columns, slice):
            names = df.columns
            start = 0 if columns.start is None else names.index(columns.start)
            stop = len(names) if columns.stop is None else names.index(columns.stop) + 1
            return picked[names[start:stop]]
        return picked[columns]


class SelectMixin:
    """The selection methods of :class:`spate.DataFrame`."""

    __slots__ = ()

    @property
    def iloc(self: Any) -> _ILoc:
        """Rows (and columns) by position: ``df.iloc[3]``, ``df.iloc[-5:]``,
        ``df.iloc[[0, 2], 1:]``. Positions count in the frame's sort order (a plain
        non-negative slice, like ``head``, needs none). One row comes back as a one-row
        frame, not a Series."""
        return _ILoc(self)

    @property
    def loc(self: Any) -> _Loc:
        """Rows by boolean Column or by index label, and columns by name:
        ``df.loc[df.a > 0, ["b", "c"]]``, ``df.set_index("k").loc["x":"z"]``."""
        return _Loc(self)

    def _each_value(self: Any, make: Any, columns: Sequence[str] | None = None) -> DataFrame:
        targets = set(self.columns if columns is None else columns)
        frame = self._protect_order(targets)
        plan = frame._keyed_plan()
        exprs = [make(col(c)).alias(c) if c in targets else col(c) for c in plan.columns()]
        return frame._from_keyed(plan.select(exprs), frame._hidden)

    def where(
        self: Any,
        cond: Column,
        other: Any = None,
        *,
        inplace: bool = False,
        axis: Any = None,
        level: Any = None,
    ) -> DataFrame:
        """Each value where ``cond`` (a boolean Column) is true, else ``other`` (null by
        default); a null condition counts as false, as pandas' False for NaN comparisons."""
        return self._where(cond, other, inplace, axis, level, keep_when=True)

    def mask(
        self: Any,
        cond: Column,
        other: Any = None,
        *,
        inplace: bool = False,
        axis: Any = None,
        level: Any = None,
    ) -> DataFrame:
        """``other`` (null by default) where ``cond`` is true, else each value."""
        return self._where(cond, other, inplace, axis, level, keep_when=False)

    def _where(
        self: Any, cond: Any, other: Any, inplace: bool, axis: Any, level: Any, keep_when: bool
    ) -> DataFrame:
        from spate.column import Column

        if inplace:
            unsupported("where/mask", "inplace", inplace, "False")
        if axis not in (None, 0, "index"):
            unsupported("where/mask", "axis", axis, "None and 0")
        if level is not None:
            unsupported("where/mask", "level", level)
        if not isinstance(cond, Column):
            raise UnsupportedError("where/mask take a boolean Column as the condition")
        base, condition = self._as_column(_CONDITION, self._operand(cond))
        condition = fn("coalesce", condition, lit(False))
        replacement = typed_null(pa.null()) if other is None or is_missing(other) else lit(other)

        def make(value: _spate.Expr) -> _spate.Expr:
            if keep_when:
                return _spate.Expr.case([(condition, value)], replacement)
            return _spate.Expr.case([(condition, replacement)], value)

        result = base._each_value(make, self.columns)
        return result._select_columns(self._frame.columns())

    def clip(
        self: Any, lower: Any = None, upper: Any = None, *, axis: Any = None, inplace: bool = False
    ) -> DataFrame:
        """Numeric values limited to ``[lower, upper]``; other columns unchanged."""
        if axis is not None:
            unsupported("clip", "axis", axis)
        if inplace:
            unsupported("clip", "inplace", inplace, "False")
        schema = self.schema
        numeric = [c for c in self.columns if is_numeric(schema.field(c).type)]
        return self._each_value(lambda e: self._clip(e, lower, upper), numeric)

    @staticmethod
    def _clip(value: _spate.Expr, lower: Any, upper: Any) -> _spate.Expr:
        if lower is not None:
            value = _spate.Expr.case([(value.binary("<", lit(lower)), lit(lower))], value)
        if upper is not None:
            value = _spate.Expr.case([(value.binary(">", lit(upper)), lit(upper))], value)
        return value

    def query(
        self: Any,
        expr: str,
        *,
        local_dict: Mapping[str, Any] | None = None,
        global_dict: Mapping[str, Any] | None = None,
        inplace: bool = False,
        **kwargs: Any,
    ) -> DataFrame:
        """The rows where pandas' expression ``expr`` is true: ``"a > 2 and s == 'x'"``,
        ``"k in @keys"``, ``"`my col` < @limit"``. Rows where it is null are dropped. A
        string that does not parse as Python is taken as SQL, as :meth:`filter` takes it."""
        if inplace:
            unsupported("query", "inplace", inplace, "False")
        if kwargs:
            unsupported("query", next(iter(kwargs)), kwargs[next(iter(kwargs))])
        variables = _variables(local_dict, global_dict)
        translator = _Translator(self, expr, variables)
        try:
            tree = translator.parse()
        except SqlError:
            if "@" in expr:
                raise
            # Not a Python expression: a SQL one, as filter takes ("a = 1 OR b IS NULL").
            return self.filter(expr)
        mask = translator.value(tree)
        from spate.column import Column

        if not isinstance(mask, Column):
            raise PlanError(f"query: {expr!r} does not read any column")
        return self.filter(mask)

    def eval(
        self: Any,
        expr: str,
        *,
        local_dict: Mapping[str, Any] | None = None,
        global_dict: Mapping[str, Any] | None = None,
        inplace: bool = False,
    ) -> Any:
        """pandas' ``eval``: ``"a + b * 2"`` is a Column; ``"c = a + b"`` (one line per
        assignment) a frame with ``c`` assigned."""
        if inplace:
            unsupported("eval", "inplace", inplace, "False")
        variables = _variables(local_dict, global_dict)
        lines = [line for line in expr.strip().splitlines() if line.strip()]
        assignment = re.compile(r"^\s*(`[^`]+`|[A-Za-z_]\w*)\s*=(?!=)")
        if any(assignment.match(line) for line in lines):
            if not all(assignment.match(line) for line in lines):
                raise SqlError("eval: with several lines, every line must assign a column")
            frame = self
            for line in lines:
                target, _, value = line.partition("=")
                name = target.strip().strip("`")
                translator = _Translator(frame, value, variables)
                frame = frame.assign(**{name: translator.value(translator.parse())})
            return frame
        translator = _Translator(self, expr, variables)
        return translator.value(translator.parse())


def _variables(
    local_dict: Mapping[str, Any] | None, global_dict: Mapping[str, Any] | None
) -> dict[str, Any]:
    if local_dict is not None or global_dict is not None:
        return {**(global_dict or {}), **(local_dict or {})}
    # The caller of query/eval: _variables <- query/eval <- the user's frame.
    return _caller_variables(2)
