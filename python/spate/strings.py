"""``Column.str``: pandas' string methods as plan expressions (DataFusion's string and
regular expression functions; regular expressions are Rust's ``regex`` syntax, which agrees
with Python's ``re`` for the common constructs but has no look-around or backreferences)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa

from spate import _spate
from spate._util import Operand, fn, lit, typed_null, unsupported
from spate.errors import ConfigError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    from spate.column import Column
    from spate.frame import DataFrame

__all__ = ["StringMethods"]


class StringMethods:
    """String functions of a Column (``df.name.str.contains("x")``), as in pandas."""

    __slots__ = ("_column",)

    def __init__(self, column: Column) -> None:
        self._column = column

    @property
    def _expr(self) -> _spate.Expr:
        return self._column._expr

    def _call(self, function: str, *args: Operand) -> Column:
        exprs = [self._column._expr, *(lit(a) for a in args)]
        return self._column._new(_spate.Expr.function(function, exprs))

    def _new(self, expr: _spate.Expr) -> Column:
        return self._column._new(expr)

    def _length(self) -> _spate.Expr:
        return fn("character_length", self._expr)

    def contains(
        self,
        pat: str,
        case: bool = True,
        flags: int = 0,
        na: bool | None = None,
        regex: bool = True,
    ) -> Column:
        """True where the value contains ``pat``: a regular expression unless
        ``regex=False``; ``case=False`` (or ``flags=re.IGNORECASE``) ignores case; ``na``
        replaces the result for nulls."""
        if flags & ~re.IGNORECASE:
            unsupported("str.contains", "flags", flags, "0 and re.IGNORECASE")
        case = case and not flags & re.IGNORECASE
        if regex:
            args: list[Operand] = [pat] if case else [pat, "i"]
            result = self._call("regexp_like", *args)
        elif case:
            result = self._call("contains", pat)
        else:
            lowered = self.lower()
            result = lowered._new(fn("contains", lowered._expr, lit(pat.lower())))
        return result if na is None else result.fillna(na)

    def startswith(self, prefix: str) -> Column:
        """True where the value starts with ``prefix``."""
        return self._call("starts_with", prefix)

    def endswith(self, suffix: str) -> Column:
        """True where the value ends with ``suffix``."""
        return self._call("ends_with", suffix)

    def lower(self) -> Column:
        """Lower-cased."""
        return self._call("lower")

    def upper(self) -> Column:
        """Upper-cased."""
        return self._call("upper")

    def title(self) -> Column:
        """Each word capitalised."""
        return self._call("initcap")

    def len(self) -> Column:
        """The length in characters."""
        return self._call("character_length")

    def strip(self, to_strip: str | None = None) -> Column:
        """Without leading and trailing whitespace (or the characters ``to_strip``)."""
        return self._call("btrim") if to_strip is None else self._call("btrim", to_strip)

    def lstrip(self, to_strip: str | None = None) -> Column:
        """Without leading whitespace (or the characters ``to_strip``)."""
        return self._call("ltrim") if to_strip is None else self._call("ltrim", to_strip)

    def rstrip(self, to_strip: str | None = None) -> Column:
        """Without trailing whitespace (or the characters ``to_strip``)."""
        return self._call("rtrim") if to_strip is None else self._call("rtrim", to_strip)

    def replace(
        self, pat: str, repl: str, n: int = -1, case: bool | None = None, regex: bool = False
    ) -> Column:
        """Every occurrence of ``pat`` replaced by ``repl`` (a regular expression with
        ``regex=True``, where ``repl`` may name groups as ``\\1``)."""
        if n != -1:
            unsupported("str.replace", "n", n, "-1 (every occurrence)")
        if case is False:
            return self._call("regexp_replace", pat if regex else re.escape(pat), repl, "gi")
        if regex:
            return self._call("regexp_replace", pat, repl, "g")
        return self._call("replace", pat, repl)

    def count(self, pat: str, flags: int = 0) -> Column:
        """The number of matches of the regular expression ``pat``."""
        if flags:
            unsupported("str.count", "flags", flags, "0")
        return self._call("regexp_count", pat)

    def find(self, sub: str, start: int = 0, end: int | None = None) -> Column:
        """The position (in characters, from 0) of the first ``sub``, or -1."""
        if start != 0:
            unsupported("str.find", "start", start, "0")
        if end is not None:
            unsupported("str.find", "end", end, "None")
        return self._new(fn("strpos", self._expr, lit(sub)).binary("-", lit(1)))

    def slice(
        self, start: int | None = None, stop: int | None = None, step: int | None = None
    ) -> Column:
        """The characters from ``start`` up to ``stop`` (Python's slice rules, negative
        positions counting from the end)."""
        if step not in (None, 1):
            unsupported("str.slice", "step", step, "None and 1")
        length = self._length()

        def position(value: int | None, default: _spate.Expr) -> _spate.Expr:
            if value is None:
                return default
            if value >= 0:
                return fn("least", lit(value), length)
            return fn("greatest", length.binary("+", lit(value)), lit(0))

        first = position(start, lit(0))
        last = position(stop, length)
        count = fn("greatest", last.binary("-", first), lit(0))
        return self._new(fn("substr", self._expr, first.binary("+", lit(1)), count))

    def get(self, i: int) -> Column:
        """The character at position ``i`` (null past the end)."""
        piece = self.slice(i, i + 1 if i != -1 else None)
        return self._new(fn("nullif", piece._expr, lit("")))

    def pad(self, width: int, side: str = "left", fillchar: str = " ") -> Column:
        """Padded with ``fillchar`` to ``width`` characters on the ``left``, ``right`` or
        ``both`` sides (as ``str.center``); longer values are kept whole."""
        if len(fillchar) != 1:
            raise ConfigError(f"str.pad: fillchar must be one character, got {fillchar!r}")
        length = self._length()
        if side == "left":
            padded = fn("lpad", self._expr, lit(width), lit(fillchar))
        elif side == "right":
            padded = fn("rpad", self._expr, lit(width), lit(fillchar))
        elif side == "both":
            # Python's str.center: the left margin is half, plus one when both the margin
            # and the width are odd.
            margin = lit(width).binary("-", length)
            odd = margin.binary("%", lit(2)).binary("==", lit(1)).binary("&", lit(width % 2 == 1))
            left = margin.binary("/", lit(2)).binary("+", _spate.Expr.case([(odd, lit(1))], lit(0)))
            padded = fn(
                "rpad",
                fn("lpad", self._expr, length.binary("+", left), lit(fillchar)),
                lit(width),
                lit(fillchar),
            )
        else:
            raise ConfigError(f"str.pad: side must be left, right or both, got {side!r}")
        long_enough = length.binary(">=", lit(width))
        return self._new(_spate.Expr.case([(long_enough, self._expr)], padded))

    def ljust(self, width: int, fillchar: str = " ") -> Column:
        """Padded on the right to ``width``."""
        return self.pad(width, "right", fillchar)

    def rjust(self, width: int, fillchar: str = " ") -> Column:
        """Padded on the left to ``width``."""
        return self.pad(width, "left", fillchar)

    def center(self, width: int, fillchar: str = " ") -> Column:
        """Padded on both sides to ``width``."""
        return self.pad(width, "both", fillchar)

    def zfill(self, width: int) -> Column:
        """Padded with zeros on the left to ``width``, after a leading sign."""
        first = fn("left", self._expr, lit(1))
        signed = first.isin([lit("-"), lit("+")])
        rest = fn("substr", self._expr, lit(2))
        with_sign = first.binary("||", fn("lpad", rest, lit(width - 1), lit("0")))
        padded = _spate.Expr.case(
            [(signed, with_sign)], fn("lpad", self._expr, lit(width), lit("0"))
        )
        long_enough = self._length().binary(">=", lit(width))
        return self._new(_spate.Expr.case([(long_enough, self._expr)], padded))

    def cat(
        self,
        others: Column | Sequence[Column] | None = None,
        sep: str | None = None,
        na_rep: str | None = None,
        join: str = "left",
    ) -> Column:
        """Each value joined with the values of ``others`` (Columns of the same frame),
        separated by ``sep``; a null gives null unless ``na_rep`` replaces it."""
        if others is None:
            unsupported("str.cat", "others", None, "Columns to join row by row")
        if join != "left":
            unsupported("str.cat", "join", join, "'left'")
        from spate.column import Column

        others_list: list[Column] = [others] if isinstance(others, Column) else list(others)
        parts = [self._column, *others_list]
        exprs = [lit(p) if na_rep is None else fn("coalesce", lit(p), lit(na_rep)) for p in parts]
        joined = exprs[0]
        for expr in exprs[1:]:
            if sep:
                joined = joined.binary("||", lit(sep))
            joined = joined.binary("||", expr)
        return self._column._new(joined, parts[1])

    def split(
        self,
        pat: str | None = None,
        n: int = -1,
        expand: bool = False,
        regex: bool | None = None,
    ) -> Column | DataFrame:
        """Split on ``pat`` (one space when None): a list per value, or with
        ``expand=True`` a frame of columns ``0``, ``1``, ... (``n`` splits at most; without
        ``n`` the number of columns comes from the data, which runs a query)."""
        return self._split(pat, n, expand, regex, "split")

    def rsplit(
        self, pat: str | None = None, n: int = -1, expand: bool = False, regex: bool | None = None
    ) -> Column | DataFrame:
        """As :meth:`split`; splitting from the right differs only with ``n``, which Spate
        does not support here."""
        if n not in (-1, 0, None):
            unsupported("str.rsplit", "n", n, "-1 (split everywhere)")
        return self._split(pat, -1, expand, regex, "rsplit")

    def _split(
        self, pat: str | None, n: int | None, expand: bool, regex: bool | None, method: str
    ) -> Column | DataFrame:
        if regex:
            unsupported(f"str.{method}", "regex", regex, "literal separators")
        if regex is None and pat is not None and len(pat) > 1 and re.escape(pat) != pat:
            # pandas reads a longer pattern as a regular expression unless regex=False.
            raise UnsupportedError(
                f"str.{method}: {pat!r} would be a regular expression in pandas; Spate splits "
                "on literal separators: pass regex=False to split on the text itself"
            )
        sep = " " if pat is None else pat
        if not sep:
            raise ConfigError(f"str.{method}: the separator is empty")
        # DataFusion splits "" into no parts; Python into one empty part.
        parts = _spate.Expr.case(
            [(self._expr.binary("==", lit("")), fn("make_array", lit("")))],
            fn("string_to_array", self._expr, lit(sep)),
        )
        n = -1 if n in (None, 0) else n
        if not expand:
            if n != -1:
                unsupported(f"str.{method}", "n", n, "-1 without expand=True")
            return self._new(parts)
        column = self._column
        owner = column._owner()
        if n == -1:
            counted = owner._frame.select([fn("cardinality", parts).alias("parts")])
            widest = pa.table(
                counted.aggregate(
                    [], [_spate.Expr.aggregate("max", [_spate.Expr.col("parts")]).alias("m")]
                )
            )
            n = max(int(widest.column(0)[0].as_py() or 1) - 1, 0)
        columns = []
        for i in range(n):
            columns.append(fn("array_element", parts, lit(i + 1)).alias(str(i)))
        # The last column holds the rest: everything after the n-th separator.
        rest = fn(
            "regexp_replace", self._expr, lit(f"(?s)^(?:.*?{re.escape(sep)}){{{n}}}"), lit("")
        )
        enough = fn("cardinality", parts).binary(">", lit(n))
        columns.append(_spate.Expr.case([(enough, rest)], typed_null(pa.string())).alias(str(n)))
        return owner._derive(owner._frame.select([*map(_spate.Expr.col, owner._index), *columns]))

    def extract(self, pat: str, flags: int = 0, expand: bool = True) -> Column | DataFrame:
        """The groups of the first match of the regular expression ``pat``: a frame with one
        column per group (named by the group's name, else ``0``, ``1``, ...), or with
        ``expand=False`` and one group, a Column. Null where there is no match."""
        if flags:
            unsupported("str.extract", "flags", flags, "0")
        compiled = re.compile(pat)
        if compiled.groups == 0:
            raise ConfigError(f"str.extract: the pattern {pat!r} has no capture group")
        match = fn("regexp_match", self._expr, lit(pat))
        names = {index: name for name, index in compiled.groupindex.items()}
        groups = [fn("array_element", match, lit(i)) for i in range(1, compiled.groups + 1)]
        if not expand and compiled.groups == 1:
            return self._new(groups[0])
        owner = self._column._owner()
        columns = [g.alias(names.get(i + 1, str(i))) for i, g in enumerate(groups)]
        return owner._derive(owner._frame.select([*map(_spate.Expr.col, owner._index), *columns]))
