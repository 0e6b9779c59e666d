"""Inspection on frames: ``describe``, ``info``, ``memory_usage``, ``value_counts``,
``duplicated``, ``nlargest``/``nsmallest``, ``tail`` and ``sample``."""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from spate import _spate
from spate._util import WHOLE, col, fn, is_numeric, lit, names, order_exprs, over, unsupported
from spate.errors import ConfigError, PlanError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from spate.column import Column
    from spate.frame import DataFrame


def value_counts(
    owner: DataFrame,
    frame: _spate.Frame,
    keys: list[str],
    normalize: bool,
    sort: bool,
    ascending: bool,
    dropna: bool,
) -> DataFrame:
    """The rows of ``frame`` counted by ``keys``: a frame indexed by the keys with column
    ``count`` (or ``proportion``), shared by the frame and column methods."""
    from spate.frame import DataFrame

    exprs = [col(k) for k in keys]
    if dropna:
        mask = exprs[0].is_not_null()
        for e in exprs[1:]:
            mask = mask.binary("&", e.is_not_null())
        frame = frame.filter(mask)
    name = "proportion" if normalize else "count"
    counted = frame.aggregate(exprs, [_spate.Expr.aggregate("count", [lit(1)]).alias(name)])
    if normalize:
        total = over("sum", [col(name)], (), (), WHOLE)
        counted = counted.with_column(
            name, col(name).cast(pa.float64()).binary("/", total.cast(pa.float64()))
        )
    order: tuple[tuple[str, bool, bool], ...] = ()
    if sort:
        counted = counted.sort([col(name)], [ascending], [False])
        order = ((name, ascending, False),)
    return DataFrame(counted, owner._session, keys, order=order)


def duplicated_expr(owner: DataFrame, exprs: list[_spate.Expr], keep: str | bool) -> _spate.Expr:
    """True for rows whose ``exprs`` appeared before (``keep="first"``), after (``"last"``)
    or elsewhere at all (``False``)."""
    if keep is False:
        return over("count", [lit(1)], (), exprs, WHOLE).binary(">", lit(1))
    if keep not in ("first", "last"):
        raise ConfigError(f"duplicated: keep must be 'first', 'last' or False, got {keep!r}")
    owner._require_order(f"duplicated(keep={keep!r})")
    order = order_exprs(owner._order)
    if keep == "last":
        order = [(e, not a, not n) for e, a, n in order]
    return over("row_number", [], order, exprs).binary(">", lit(1))


#: The percentiles describe shows by default.
_PERCENTILES = (0.25, 0.5, 0.75)


def _percent(q: float) -> str:
    text = f"{q * 100:.10g}"
    return f"{text}%"


class InspectMixin:
    """The inspection methods of :class:`spate.DataFrame`."""

    __slots__ = ()

    def describe(
        self: Any,
        percentiles: Sequence[float] | None = None,
        include: Any = None,
        exclude: Any = None,
    ) -> DataFrame:
        """count, mean, std, min, the percentiles (25%, 50%, 75%; linear interpolation) and
        max of each numeric column, as a frame indexed by ``statistic`` (runs one aggregate
        query; the result is small)."""
        if include is not None:
            unsupported("describe", "include", include, "None (numeric columns)")
        if exclude is not None:
            unsupported("describe", "exclude", exclude, "None")
        quantiles = sorted(set(_PERCENTILES if percentiles is None else [*percentiles, 0.5]))
        if any(not 0 <= q <= 1 for q in quantiles):
            raise ConfigError("describe: percentiles must be between 0 and 1")
        schema = self.schema
        numeric = [c for c in self.columns if is_numeric(schema.field(c).type)]
        if not numeric:
            raise UnsupportedError(
                "describe: the frame has no numeric columns (describing strings is not "
                "supported yet)"
            )
        stats = ["count", "mean", "std", "min", *(_percent(q) for q in quantiles), "max"]
        aggregates = []
        for i, c in enumerate(numeric):
            value = col(c).cast(pa.float64())
            calls = [
                _spate.Expr.aggregate("count", [col(c)]),
                _spate.Expr.aggregate("avg", [value]),
                _spate.Expr.aggregate("stddev_samp", [value]),
                _spate.Expr.aggregate("min", [value]),
                *(
                    _spate.Expr.aggregate("percentile_cont", [value, lit(float(q))])
                    for q in quantiles
                ),
                _spate.Expr.aggregate("max", [value]),
            ]
            aggregates += [
                call.cast(pa.float64()).alias(f"s{i}_{j}") for j, call in enumerate(calls)
            ]
        row = pa.table(self._frame.aggregate([], aggregates))
        columns = {"statistic": pa.array(stats)}
        for i, c in enumerate(numeric):
            columns[c] = pa.array(
                [row.column(f"s{i}_{j}")[0].as_py() for j in range(len(stats))], pa.float64()
            )
        result = self._session.from_arrow(pa.table(columns))
        return result.set_index("statistic")

    def info(
        self: Any,
        verbose: bool | None = None,
        buf: Any = None,
        memory_usage: Any = None,
        show_counts: bool | None = None,
    ) -> None:
        """Prints the class, the row count, each column's non-null count and Arrow type
        (one aggregate query), like pandas' ``info``."""
        counts = [
            _spate.Expr.aggregate("count", [col(c)]).alias(f"n{i}")
            for i, c in enumerate(self.columns)
        ]
        counts.append(_spate.Expr.aggregate("count", [lit(1)]).alias("rows"))
        row = pa.table(self._frame.aggregate([], counts))
        rows = row.column("rows")[0].as_py()
        schema = self.schema
        lines = [f"<class 'spate.DataFrame'>", f"{rows} rows, {len(self.columns)} columns"]
        width = max([len(c) for c in self.columns] + [6])
        lines.append(f" #   {'Column':<{width}}  Non-Null Count  Dtype")
        for i, c in enumerate(self.columns):
            non_null = row.column(f"n{i}")[0].as_py()
            lines.append(f" {i:<3} {c:<{width}}  {non_null:>8} non-null  {schema.field(c).type}")
        if self._index:
            lines.append(f"index: {', '.join(self._index)}")
        text = "\n".join(lines) + "\n"
        (buf or sys.stdout).write(text)

    def memory_usage(self: Any, index: bool = True, deep: bool = False) -> pandas.Series:
        """The bytes of each column's Arrow buffers in the result (runs the plan; pandas
        counts NumPy buffers, so the numbers differ, most for strings)."""
        import pandas as pd

        table = self.to_arrow()
        sizes = {c: table.column(c).nbytes for c in self.columns}
        if index and self._index:
            sizes = {"Index": sum(table.column(i).nbytes for i in self._index), **sizes}
        return pd.Series(sizes, dtype="int64")

    def value_counts(
        self: Any,
        subset: str | Sequence[str] | None = None,
        normalize: bool = False,
        sort: bool = True,
        ascending: bool = False,
        dropna: bool = True,
    ) -> DataFrame:
        """How often each distinct row (of ``subset``) occurs: a frame indexed by the
        columns, with column ``count`` (``proportion`` with ``normalize``)."""
        keys = names(subset) if subset is not None else self.columns
        missing = [k for k in keys if k not in self._frame.columns()]
        if missing:
            raise PlanError(f"value_counts: no column(s) {', '.join(map(repr, missing))}")
        return value_counts(self, self._frame, keys, normalize, sort, ascending, dropna)

    def duplicated(
        self: Any, subset: str | Sequence[str] | None = None, keep: str | bool = "first"
    ) -> Column:
        """True for each row whose values (of ``subset``) appeared before it in the frame's
        sort order (``keep="first"``), after it (``"last"``), or elsewhere (``False``, which
        needs no order)."""
        from spate.column import Column

        keys = names(subset) if subset is not None else self.columns
        return Column(duplicated_expr(self, [col(k) for k in keys], keep), self, "duplicated")

    def nlargest(self: Any, n: int, columns: str | Sequence[str], keep: str = "first") -> DataFrame:
        """The ``n`` rows with the largest ``columns``, largest first (rows tied on them come
        in an unspecified order; pandas keeps the first)."""
        if keep != "first":
            unsupported("nlargest", "keep", keep, "'first'")
        return self.sort_values(columns, ascending=False).head(n)

    def nsmallest(
        self: Any, n: int, columns: str | Sequence[str], keep: str = "first"
    ) -> DataFrame:
        """The ``n`` rows with the smallest ``columns``, smallest first."""
        if keep != "first":
            unsupported("nsmallest", "keep", keep, "'first'")
        return self.sort_values(columns, ascending=True).head(n)

    def tail(self: Any, n: int = 5) -> DataFrame:
        """The last ``n`` rows in the frame's sort order (needs ``sort_values`` first)."""
        if n < 0:
            raise UnsupportedError("tail with a negative n is not supported")
        self._require_order("tail")
        keys = [col(k) for k, _, _ in self._order]
        reversed_plan = (
            self._keyed_plan()
            .sort(keys, [not a for _, a, _ in self._order], [not f for _, _, f in self._order])
            .limit(n, 0)
        )
        plan = reversed_plan.sort(
            keys, [a for _, a, _ in self._order], [f for _, _, f in self._order]
        )
        return self._from_keyed(plan, self._hidden)

    def sample(
        self: Any,
        n: int | None = None,
        frac: float | None = None,
        replace: bool = False,
        weights: Any = None,
        random_state: int | None = None,
        axis: Any = None,
        ignore_index: bool = False,
    ) -> DataFrame:
        """``n`` rows (or ``frac`` of them) drawn without replacement, the same for the same
        ``random_state``: rows are ranked by a seeded hash of their values. Identical rows
        rank together; the draw differs from pandas' (NumPy's generator)."""
        if replace:
            unsupported("sample", "replace", replace, "False")
        if weights is not None:
            unsupported("sample", "weights", weights)
        if axis not in (None, 0, "index"):
            unsupported("sample", "axis", axis, "None and 0")
        if n is not None and frac is not None:
            raise ConfigError("sample: pass n= or frac=, not both")
        if frac is not None:
            if not 0 <= frac <= 1:
                raise ConfigError(f"sample: frac must be in [0, 1] without replacement, got {frac}")
            n = round(frac * len(self))
        elif n is None:
            n = 1
        if n < 0:
            raise ConfigError(f"sample: n must not be negative, got {n}")
        seed = random.getrandbits(63) if random_state is None else int(random_state)
        schema = self.schema
        parts = [lit(str(seed))]
        for c in self._frame.columns():
            kind = schema.field(c).type
            if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
                continue
            parts.append(fn("coalesce", col(c).cast(pa.string()), lit("\u2400")))
        key = fn("md5", fn("concat_ws", lit("|"), *parts))
        plan = self._frame.sort([key], [True], [False]).limit(n, 0)
        return self._derive(plan, order=())
