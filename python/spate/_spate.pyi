"""Type stubs for ``spate._spate``, the native half of the package (python/src).

Users work with the classes in :mod:`spate` (``Session``, ``DataFrame``, ``Column``); these are
the building blocks those classes wrap. Every call that runs a plan releases the GIL and can be
interrupted with Ctrl-C; engine errors raise subclasses of :class:`spate.Error`.
"""

from typing import Any, Mapping, Sequence

import pyarrow as pa

__version__: str

def devices() -> tuple[list[tuple[int, str, str, int, int | None]], str | None]:
    """The GPUs as ``(ordinal, name, arch, total_bytes, free_bytes)`` (free memory is None:
    listing opens no CUDA context), and why there are none when the list is empty."""

class Session:
    """One Spate engine: a DataFusion session on a resolved backend."""

    def __init__(
        self,
        backend: str = "auto",
        gpu_memory_limit: int | str | None = None,
        fallback: str = "cpu",
        memory_limit: int | str | None = None,
        target_partitions: int | None = None,
        batch_size: int | None = None,
        options: Mapping[str, str] | None = None,
        devices: int | str | None = None,
        remote: str | None = None,
    ) -> None: ...
    @property
    def backend(self) -> str:
        """``cuda``, ``emulated`` or ``cpu``: where operators run."""
    @property
    def requested_backend(self) -> str:
        """The backend that was asked for (may be ``auto``)."""
    @property
    def backend_reason(self) -> str:
        """Why the session runs on its backend."""
    def sql(self, query: str) -> Frame:
        """Plans one SQL statement; DDL takes effect now. Errors: ``SqlError``."""
    def table(self, name: str) -> Frame:
        """The registered table ``name``."""
    def register_file(self, name: str, path: str, format: str | None = None) -> None:
        """Registers a file or folder; ``format`` is parquet, csv, ndjson, arrow or None (by
        extension). Errors: ``SourceError``."""
    def register_arrow(self, name: str, data: Any) -> None:
        """Registers Arrow data (``__arrow_c_stream__`` or ``__arrow_c_array__``) without
        copying it."""
    def register_frame(self, name: str, frame: Frame) -> None:
        """Registers a frame's plan as a view."""
    def deregister(self, name: str) -> bool:
        """Removes a table; returns whether it existed."""
    def tables(self) -> list[str]:
        """The registered table names, sorted."""
    def cache_table(self, name: str) -> str:
        """Loads a table into GPU memory (host memory on ``cpu``)."""
    def uncache_table(self, name: str) -> None:
        """Frees a cached table."""
    def stream_writer(self, name: str) -> StreamWriter:
        """A writer of stream ``name``. Errors: ``ConfigError`` for no such stream."""
    def tail_folder(
        self, stream: str, folder: str, format: str | None = None, poll: float = 0.05
    ) -> FolderTail:
        """Tails a folder of files into a stream."""
    def subscribe(self, name: str) -> Subscription:
        """What continuous view ``name`` emits from now on."""
    def streams(
        self,
    ) -> list[
        tuple[str, str, int | None, int | None, int, int, int, int, int, int, list[str]]
    ]:
        """Each stream: (name, time column, watermark µs, lag µs, events, late rows,
        micro-batches, waiting rows, kept rows, kept bytes, views)."""
    def checkpoint(self, folder: str) -> list[tuple[str, int]]:
        """Writes a checkpoint; (stream, events taken) each."""
    def restore(self, folder: str) -> list[tuple[str, int]]:
        """Restores a checkpoint into this session; (stream, events taken) each."""

class FolderTail:
    """A folder tailed into a stream."""

    def files_read(self) -> int:
        """Files read so far."""
    def stop(self) -> int:
        """Stops tailing; the files read."""
    def finish(self) -> int:
        """Reads what is left and finishes the writer; the files read."""

class StreamWriter:
    """Pushes Arrow data into one stream."""

    def push(self, data: Any) -> None:
        """Pushes ``__arrow_c_stream__`` or ``__arrow_c_array__`` data."""
    def flush(self) -> None:
        """Cuts a micro-batch of what waits."""
    def finish(self) -> None:
        """Ends the writer. Errors: ``ConfigError`` when it has finished already."""

class Subscription:
    """What a continuous view emits."""

    def next(self, timeout: float | None = None) -> tuple[Any | None, bool]:
        """(Arrow C stream capsule or None, ended)."""

class Frame:
    """A lazy DataFusion DataFrame. Only ``count``, ``explain`` and ``__arrow_c_stream__`` run
    the plan."""

    def schema(self) -> pa.Schema:
        """The output schema."""
    def columns(self) -> list[str]:
        """The output column names."""
    def select(self, exprs: Sequence[Expr]) -> Frame: ...
    def filter(self, predicate: Expr) -> Frame: ...
    def aggregate(self, group: Sequence[Expr], aggregates: Sequence[Expr]) -> Frame: ...
    def sort(
        self, keys: Sequence[Expr], ascending: Sequence[bool], nulls_first: Sequence[bool]
    ) -> Frame: ...
    def limit(self, n: int | None, offset: int = 0) -> Frame: ...
    def union(self, other: Frame) -> Frame: ...
    def distinct(self) -> Frame: ...
    def distinct_on(
        self, on: Sequence[Expr], order: Sequence[Expr], ascending: Sequence[bool]
    ) -> Frame: ...
    def with_column(self, name: str, expr: Expr) -> Frame:
        """All columns, with ``expr`` as ``name`` (replaced in place or appended)."""
    def rename(self, mapping: Mapping[str, str]) -> Frame:
        """All columns, renamed by ``mapping`` (unknown names ignored)."""
    def merge(
        self,
        right: Frame,
        how: str,
        left_on: Sequence[str],
        right_on: Sequence[str],
        suffixes: tuple[str, str],
        nulls_equal: bool = True,
    ) -> Frame:
        """A pandas-style merge (see ``spate.DataFrame.merge``)."""
    def explode(self, column: str) -> Frame:
        """One row per element of the list column ``column`` (a null or empty list gives one
        row with a null)."""
    def write(self, path: str, format: str) -> int:
        """Runs the plan and writes one ``parquet``, ``csv`` or ``json`` file; the rows
        written."""
    def parse_expr(self, sql: str) -> Expr:
        """A SQL expression over this frame's columns."""
    def count(self) -> int:
        """Runs the plan; the number of rows."""
    def explain(self, verbose: bool = False, analyze: bool = False) -> str:
        """The plan as ``EXPLAIN`` prints it, with GPU placement on GPU backends."""
    def logical_plan(self) -> str:
        """The unoptimised logical plan, indented."""
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """Runs the plan; the result as an ``arrow_array_stream`` PyCapsule."""

class Expr:
    """A DataFusion logical expression; every method returns a new one."""

    @staticmethod
    def col(name: str) -> Expr:
        """The column ``name``, verbatim (no case folding)."""
    @staticmethod
    def qualified(relation: str, name: str) -> Expr:
        """The column ``name`` of the input aliased ``relation``."""
    @staticmethod
    def lit(value: pa.Array) -> Expr:
        """The value of a one-element pyarrow array, with its type."""
    @staticmethod
    def function(name: str, args: Sequence[Expr]) -> Expr:
        """A call of DataFusion's scalar function ``name``."""
    @staticmethod
    def aggregate(name: str, args: Sequence[Expr], distinct: bool = False) -> Expr:
        """A call of DataFusion's aggregate function ``name``."""
    @staticmethod
    def case(branches: Sequence[tuple[Expr, Expr]], otherwise: Expr | None = None) -> Expr:
        """``CASE WHEN c1 THEN v1 ... ELSE otherwise END``: the value of the first ``(when,
        then)`` pair whose condition is true, else ``otherwise`` (null when None)."""
    @staticmethod
    def window(
        name: str,
        args: Sequence[Expr],
        partition_by: Sequence[Expr],
        order_by: Sequence[tuple[Expr, bool, bool]],
        frame: tuple[str, tuple[str, Any], tuple[str, Any]] | None = None,
        ignore_nulls: bool = False,
    ) -> Expr:
        """``name(args) OVER (PARTITION BY .. ORDER BY (expr, ascending, nulls_first) ..
        frame)``; ``frame`` is ``(units, start, end)``, each end ``("preceding" |
        "following", one-element pyarrow array or None for UNBOUNDED)`` or ``("current",
        None)``."""
    @staticmethod
    def python_function(
        name: str, callable: Any, args: Sequence[Expr], return_type: pa.DataType
    ) -> Expr:
        """A call of ``callable(list of pyarrow arrays) -> pyarrow array`` per batch, on the
        CPU."""
    def binary(self, op: str, other: Expr) -> Expr:
        """``self <op> other`` for + - * / % == != < <= > >= & | and ``||`` (string
        concatenation)."""
    def negate(self) -> Expr: ...
    def invert(self) -> Expr: ...
    def is_null(self) -> Expr: ...
    def is_not_null(self) -> Expr: ...
    def isin(self, values: Sequence[Expr], negated: bool = False) -> Expr: ...
    def cast(self, data_type: pa.DataType) -> Expr: ...
    def alias(self, name: str) -> Expr: ...
    def output_name(self) -> str:
        """The name DataFusion gives the expression's output column."""
    def has_window(self) -> bool:
        """Whether the expression holds a window function."""
    def column_names(self) -> list[str]:
        """The names of the columns the expression reads, sorted, without duplicates."""
