"""Reshaping: :func:`concat` (rows and columns), :func:`merge_asof`, and the frame methods
``melt``, ``pivot_table`` and ``explode``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from spate import _spate
from spate._util import (
    RUNNING,
    REMAINING,
    col,
    fn,
    lit,
    names,
    order_exprs,
    over,
    typed_null,
    unsupported,
)
from spate.errors import ConfigError, PlanError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    from spate.frame import DataFrame

__all__ = ["concat", "merge_asof", "ReshapeMixin"]

_POSITION = "__spate_position"


#: Timestamp units from the coarsest to the finest.
_UNITS = ("s", "ms", "us", "ns")


def _common_type(kinds: list[pa.DataType], name: str) -> pa.DataType:
    """The type column ``name`` takes where frames are stacked: their one type, int64 or
    float64 for a mix of numbers (pandas' upcast), the finest unit for timestamps of one
    zone, string for a mix of string types; an all-null column takes the others' type. Any
    other mix is an error (pandas would make it ``object``)."""
    distinct = list(dict.fromkeys(k for k in kinds if not pa.types.is_null(k)))
    if not distinct:
        return pa.null()
    if len(distinct) == 1:
        return distinct[0]
    if all(pa.types.is_integer(k) or pa.types.is_floating(k) for k in distinct):
        return pa.int64() if all(pa.types.is_integer(k) for k in distinct) else pa.float64()
    if all(pa.types.is_timestamp(k) for k in distinct) and len({k.tz for k in distinct}) == 1:
        unit = max((k.unit for k in distinct), key=_UNITS.index)
        return pa.timestamp(unit, distinct[0].tz)
    if all(
        pa.types.is_string(k) or pa.types.is_large_string(k) or pa.types.is_string_view(k)
        for k in distinct
    ):
        return pa.string()
    raise PlanError(
        f"column {name!r} has the types {', '.join(map(str, distinct))} in different frames, "
        "which do not combine (cast them first)"
    )


def concat(
    objs: Sequence[DataFrame],
    axis: int | str = 0,
    join: str = "outer",
    ignore_index: bool = False,
    keys: Any = None,
    sort: bool = False,
) -> DataFrame:
    """Frames stacked: ``axis=0`` appends rows (columns matched by name; a column a frame
    lacks is null there, or with ``join="inner"`` only shared columns are kept); ``axis=1``
    puts columns side by side, matching rows by the shared index (``set_index``), or else by
    position in each frame's sort order."""
    frames = list(objs)
    if not frames:
        raise ConfigError("concat needs at least one frame")
    from spate.frame import DataFrame

    if not all(isinstance(f, DataFrame) for f in frames):
        raise TypeError("concat takes spate DataFrames")
    session = frames[0]._session
    if any(f._session is not session for f in frames):
        raise PlanError("concat needs every frame in the same session")
    if keys is not None:
        unsupported("concat", "keys", keys)
    if join not in ("outer", "inner"):
        raise ConfigError(f"concat: join must be 'outer' or 'inner', got {join!r}")
    if axis in (1, "columns"):
        return _concat_columns(frames, join)
    if axis not in (0, "index"):
        raise ConfigError(f"concat: axis must be 0 or 1, got {axis!r}")
    index = (
        frames[0]._index
        if all(f._index == frames[0]._index for f in frames) and not ignore_index
        else ()
    )
    all_names: list[str] = []
    for f in frames:
        for name in f._frame.columns():
            if name not in all_names:
                all_names.append(name)
    if join == "inner":
        all_names = [n for n in all_names if all(n in f._frame.columns() for f in frames)]
    if sort:
        all_names = [*index, *sorted(n for n in all_names if n not in index)]
    types = {
        n: _common_type([f.schema.field(n).type for f in frames if n in f._frame.columns()], n)
        for n in all_names
    }
    result = None
    for f in frames:
        have = set(f._frame.columns())
        exprs = [
            (col(n).cast(types[n]) if f.schema.field(n).type != types[n] else col(n)).alias(n)
            if n in have
            else typed_null(types[n]).alias(n)
            for n in all_names
        ]
        plan = f._frame.select(exprs)
        result = plan if result is None else result.union(plan)
    assert result is not None
    return DataFrame(result, session, index)


def _concat_columns(frames: list[DataFrame], join: str) -> DataFrame:
    from spate.frame import DataFrame

    first = frames[0]
    seen: set[str] = set()
    for f in frames:
        clash = seen & set(f.columns)
        if clash:
            raise PlanError(f"concat(axis=1): column(s) {', '.join(sorted(clash))} appear twice")
        seen |= set(f.columns)
    how = "inner" if join == "inner" else "outer"
    if first._index and all(f._index == first._index for f in frames):
        result = frames[0]
        for f in frames[1:]:
            merged = result.reset_index().merge(f.reset_index(), on=list(first._index), how=how)
            result = merged.set_index(list(first._index))
        return result
    if not all(f._order for f in frames):
        raise UnsupportedError(
            "concat(axis=1) matches rows by the index (set_index on every frame) or by "
            "position, which needs every frame sorted (sort_values)"
        )
    numbered = []
    for f in frames:
        position = over("row_number", [], order_exprs(f._order))
        g = f._with_columns({_POSITION: position})
        numbered.append(g[[_POSITION, *f.columns]])
    result = numbered[0]
    for g in numbered[1:]:
        result = result.merge(g, on=_POSITION, how=how)
    plan = result._frame.sort([col(_POSITION)], [True], [False])
    plan = plan.select([col(c) for c in plan.columns() if c != _POSITION])
    return DataFrame(plan, first._session)


def merge_asof(
    left: DataFrame,
    right: DataFrame,
    on: str | None = None,
    left_on: str | None = None,
    right_on: str | None = None,
    left_index: bool = False,
    right_index: bool = False,
    by: str | Sequence[str] | None = None,
    left_by: Any = None,
    right_by: Any = None,
    suffixes: tuple[str, str] = ("_x", "_y"),
    tolerance: Any = None,
    allow_exact_matches: bool = True,
    direction: str = "backward",
) -> DataFrame:
    """Each left row joined to the right row with the nearest ``on`` before it
    (``direction="backward"``, the latest state) or after it (``"forward"``), among the rows
    with equal ``by`` keys; the right columns are null where there is none. The result is
    sorted by ``on``. It runs as one sorted window over both frames (no join)."""
    from spate.frame import DataFrame

    for argument, value in (
        ("left_on", left_on),
        ("right_on", right_on),
        ("left_by", left_by),
        ("right_by", right_by),
        ("tolerance", tolerance),
    ):
        if value is not None:
            unsupported("merge_asof", argument, value, "on= and by= naming columns of both frames")
    if left_index or right_index:
        unsupported("merge_asof", "left_index/right_index", True)
    if direction not in ("backward", "forward"):
        unsupported("merge_asof", "direction", direction, "'backward' and 'forward'")
    if on is None:
        raise ConfigError("merge_asof needs on=")
    keys = names(by)
    for frame, side in ((left, "left"), (right, "right")):
        missing = [c for c in [on, *keys] if c not in frame._frame.columns()]
        if missing:
            raise PlanError(f"merge_asof: the {side} frame has no column(s) {', '.join(missing)}")
    left_plan = left.reset_index()._frame
    right_plan = right.reset_index()._frame.filter(col(on).is_not_null())
    left_names = left_plan.columns()
    carried = [c for c in right_plan.columns() if c not in keys and c != on]
    right_fields = [("__on", right_plan.schema().field(on).type)] + [
        (c, right_plan.schema().field(c).type) for c in carried
    ]
    struct_type = pa.struct(right_fields)
    pieces: list[_spate.Expr] = []
    for name, _ in right_fields:
        pieces += [lit(name), col(on) if name == "__on" else col(name)]
    left_schema = left_plan.schema()
    side, match = "__spate_side", "__spate_match"
    from_left = left_plan.select(
        [*(col(c) for c in left_names), lit(1).alias(side), typed_null(struct_type).alias(match)]
    )
    from_right = right_plan.select(
        [
            *(
                (
                    col(c).cast(left_schema.field(c).type)
                    if c in (on, *keys)
                    else typed_null(left_schema.field(c).type)
                ).alias(c)
                for c in left_names
            ),
            lit(0).alias(side),
            fn("named_struct", *pieces).alias(match),
        ]
    )
    union = from_left.union(from_right)
    backward = direction == "backward"
    # At equal `on`, the right rows a left row may match come before it (backward) or after
    # it (forward) in the window's order.
    right_first = allow_exact_matches == backward
    order = [(col(on), True, False), (col(side), right_first, False)]
    function, bounds = ("last_value", RUNNING) if backward else ("first_value", REMAINING)
    found = over(function, [col(match)], order, [col(k) for k in keys], bounds, ignore_nulls=True)
    # A null `on` matches nothing (pandas refuses it), and right rows with one are left out.
    found = _spate.Expr.case([(col(on).is_null(), typed_null(struct_type))], found)
    plan = union.with_column(match, found).filter(col(side).binary("==", lit(1)))
    output = []
    for c in left_names:
        clash = c in carried
        output.append(col(c).alias(f"{c}{suffixes[0]}" if clash else c))
    for c in carried:
        clash = c in left_names
        output.append(
            fn("get_field", col(match), lit(c)).alias(f"{c}{suffixes[1]}" if clash else c)
        )
    plan = plan.sort([col(on)], [True], [False]).select(output)
    return DataFrame(plan, left._session, order=((on, True, False),))


class ReshapeMixin:
    """The reshaping methods of :class:`spate.DataFrame`."""

    __slots__ = ()

    def melt(
        self: Any,
        id_vars: str | Sequence[str] | None = None,
        value_vars: str | Sequence[str] | None = None,
        var_name: str | None = None,
        value_name: str = "value",
        col_level: Any = None,
        ignore_index: bool = True,
    ) -> DataFrame:
        """Wide to long: one row per (row, value column), with the column's name in
        ``var_name`` (``variable``) and its value in ``value_name``; all of one column's
        rows come before the next column's, each in the frame's order."""
        if col_level is not None:
            unsupported("melt", "col_level", col_level)
        ids = names(id_vars)
        frame = self.reset_index()
        values = (
            names(value_vars)
            if value_vars is not None
            else [c for c in frame.columns if c not in ids]
        )
        if not values:
            raise PlanError("melt: no value columns")
        var = var_name or "variable"
        types = [frame.schema.field(v).type for v in values]
        common = _common_type(types, value_name)
        result = None
        position = "__spate_melt"
        for i, v in enumerate(values):
            exprs = [col(c) for c in ids]
            exprs += [
                lit(v).alias(var),
                col(v).cast(common).alias(value_name),
                lit(i).alias(position),
            ]
            exprs += [col(k) for k, _, _ in frame._order if k not in ids]
            plan = frame._keyed_plan().select(exprs)
            result = plan if result is None else result.union(plan)
        assert result is not None
        keys = [col(position), *(col(k) for k, _, _ in frame._order)]
        plan = result.sort(
            keys,
            [True, *(a for _, a, _ in frame._order)],
            [False, *(n for _, _, n in frame._order)],
        )
        plan = plan.select([col(c) for c in [*ids, var, value_name]])
        from spate.frame import DataFrame

        return DataFrame(plan, self._session)

    def pivot_table(
        self: Any,
        values: str | Sequence[str] | None = None,
        index: str | Sequence[str] | None = None,
        columns: str | None = None,
        aggfunc: str = "mean",
        fill_value: Any = None,
        margins: bool = False,
        dropna: bool = True,
        observed: Any = True,
        sort: bool = True,
    ) -> DataFrame:
        """An aggregated pivot: one row per ``index`` key, one column per distinct value of
        ``columns`` (finding those values runs a query). With one ``values`` column the new
        columns are named by the value (as a string); with several, ``<value>_<column value>``
        with pandas' two-level header in ``to_pandas``."""
        if margins:
            unsupported("pivot_table", "margins", margins)
        if not isinstance(aggfunc, str):
            unsupported("pivot_table", "aggfunc", aggfunc, "the name of one aggregation")
        if not isinstance(columns, str):
            unsupported("pivot_table", "columns", columns, "one column name")
        keys = names(index)
        if not keys:
            raise ConfigError("pivot_table needs index=")
        frame = self.reset_index()
        value_names = (
            names(values)
            if values is not None
            else [c for c in frame.columns if c not in keys and c != columns]
        )
        single = isinstance(values, str)
        distinct = pa.table(frame._frame.select([col(columns)]).distinct()).column(0).to_pylist()
        distinct = sorted((v for v in distinct if v is not None), key=lambda v: (str(type(v)), v))
        from spate.groupby import _AGGREGATES

        function = _AGGREGATES.get(aggfunc)
        if function is None or aggfunc in ("size",):
            raise UnsupportedError(f"pivot_table: aggfunc={aggfunc!r} is not supported")
        aggregates = []
        levels = {}
        for v in value_names:
            for c in distinct:
                chosen = _spate.Expr.case([(col(columns).binary("==", lit(c)), col(v))])
                name = str(c) if single else f"{v}_{c}"
                call = _spate.Expr.aggregate(function, [chosen], aggfunc == "nunique")
                if fill_value is not None:
                    call = fn("coalesce", call, lit(fill_value))
                aggregates.append(call.alias(name))
                if not single:
                    levels[name] = (v, str(c))
        plan = frame._frame
        if dropna:
            mask = col(keys[0]).is_not_null()
            for k in keys[1:]:
                mask = mask.binary("&", col(k).is_not_null())
            plan = plan.filter(mask)
        plan = plan.aggregate([col(k) for k in keys], aggregates)
        if sort:
            plan = plan.sort([col(k) for k in keys], [True] * len(keys), [False] * len(keys))
        from spate.frame import DataFrame

        return DataFrame(plan, self._session, keys, levels=levels)

    def explode(self: Any, column: str, ignore_index: bool = False) -> DataFrame:
        """One row per element of the list column ``column``, the other columns repeated; a
        null or empty list gives one row with a null."""
        if not isinstance(column, str):
            unsupported("explode", "column", column, "one column name")
        if column not in self._frame.columns():
            raise PlanError(f"explode: no column {column!r}")
        kind = self.schema.field(column).type
        if not (
            pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)
        ):
            raise PlanError(f"explode: {column!r} is {kind}, not a list")
        return self._derive(self._frame.explode(column))
