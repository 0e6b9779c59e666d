"""Sessions: where tables are registered and plans run."""

from __future__ import annotations

import glob
import itertools
import os
import re
import threading
import weakref
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import pyarrow as pa

from spate import _spate
from spate.errors import ConfigError, PlanError
from spate.frame import DataFrame
from spate.streaming import Listener, Stream, Subscription

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import polars

__all__ = ["Session", "default_session", "set_default_session"]

#: What the readers take: one path (a file, a folder, or a glob), or a list of them.
PathOrPaths = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


def _table_name_for(path: str | os.PathLike[str]) -> str:
    """A SQL-friendly table name from a file name: ``data/Trips-2024.parquet`` -> ``trips_2024``."""
    stem = Path(path).name.split(".")[0]
    name = re.sub(r"[^0-9a-zA-Z_]", "_", stem).lower() or "table"
    if not (name[0].isalpha() or name[0] == "_"):
        name = "t_" + name
    return name


class Session:
    """A Spate session: a backend, its memory limits and the tables registered in it.

    ``backend`` is ``"auto"`` (a GPU when one is usable, else the CPU), ``"cuda"``,
    ``"emulated"`` (the GPU kernels run by a host emulator, for testing) or ``"cpu"``.
    ``gpu_memory_limit`` and ``memory_limit`` are byte counts or sizes such as ``"4G"``.
    ``fallback`` says what a GPU backend does with an operator it cannot run: ``"cpu"`` runs it
    on the CPU, ``"warn"`` also logs why, ``"error"`` fails the query. ``options`` sets any
    DataFusion or Spate setting by key. ``devices`` is how many GPU devices to run on (``4``)
    or which (``"cuda:0,1,3"``); each gets ``gpu_memory_limit``. ``remote`` (``"df://host:port"``)
    sends queries to a Ballista scheduler whose executors (``spate executor``) run them; its
    tables must be files the executors can read (``read_parquet``, ``register``).

    >>> s = Session(backend="cpu")
    >>> s.sql("select 1 as x").to_pandas()
       x
    0  1
    """

    def __init__(
        self,
        backend: str = "auto",
        gpu_memory_limit: int | str | None = None,
        fallback: str = "cpu",
        *,
        memory_limit: int | str | None = None,
        target_partitions: int | None = None,
        batch_size: int | None = None,
        options: Mapping[str, str] | None = None,
        devices: int | str | None = None,
        remote: str | None = None,
    ) -> None:
        self._inner = _spate.Session(
            backend,
            gpu_memory_limit,
            fallback,
            memory_limit,
            target_partitions,
            batch_size,
            dict(options) if options else None,
            devices,
            remote,
        )
        self._names = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        """Where operators run: ``"cuda"``, ``"emulated"`` or ``"cpu"`` (never ``"auto"``)."""
        return self._inner.backend

    @property
    def backend_reason(self) -> str:
        """Why the session runs on its backend (e.g. why ``auto`` chose the CPU)."""
        return self._inner.backend_reason

    def __repr__(self) -> str:
        return f"spate.Session(backend={self.backend!r}) # {self.backend_reason}"

    def _unique(self, base: str) -> str:
        with self._lock:
            taken = set(self._inner.tables())
            if base not in taken:
                return base
            while True:
                candidate = f"{base}_{next(self._names)}"
                if candidate not in taken:
                    return candidate

    def _auto_name(self) -> str:
        with self._lock:
            taken = set(self._inner.tables())
            while True:
                candidate = f"df_{next(self._names)}"
                if candidate not in taken:
                    return candidate

    # ----- SQL and tables ----------------------------------------------------------------

    def sql(self, query: str) -> DataFrame:
        """Plans one SQL statement and returns its result as a lazy :class:`DataFrame`. DDL
        (``CREATE TABLE``, ``CACHE TABLE``, ``SET``) takes effect at once."""
        return DataFrame(self._inner.sql(query), self)

    def table(self, name: str) -> DataFrame:
        """The registered table ``name``."""
        return DataFrame(self._inner.table(name), self, table_name=name.lower())

    def tables(self) -> list[str]:
        """The names of the registered tables, sorted."""
        return list(self._inner.tables())

    def deregister(self, name: str) -> bool:
        """Removes table ``name`` (and its cached copy); returns whether it existed."""
        return self._inner.deregister(name)

    def register(self, name: str, data: Any) -> DataFrame:
        """Registers ``data`` as table ``name`` and returns it as a DataFrame. A table already
        registered under ``name`` is replaced (and uncached), as in DuckDB: re-running a
        notebook cell works. If ``data`` cannot be read, the old table stays.

        ``data`` is a Spate DataFrame (registered as a view of its plan), a path to a Parquet,
        CSV, NDJSON or Arrow IPC file or folder, a pandas or Polars DataFrame, or any Arrow
        data (``__arrow_c_stream__`` / ``__arrow_c_array__``: pyarrow tables and batches).
        """
        if isinstance(data, DataFrame):
            if data._session is not self:
                raise PlanError("register: the DataFrame belongs to another session")
            return data.register(name)
        if isinstance(data, (str, os.PathLike)):
            self._inner.register_file(name, os.fspath(data), None)
            return self.table(name)
        if _is_pandas(data):
            return self.from_pandas(data, name=name)
        self._inner.register_arrow(name, data)
        return self.table(name)

    def cache(self, name: str) -> None:
        """Loads table ``name`` into GPU memory (host memory on ``cpu``), so later queries read
        it there; same as SQL ``CACHE TABLE name``."""
        self._inner.cache_table(name)

    def uncache(self, name: str) -> None:
        """Frees a table loaded by :meth:`cache`."""
        self._inner.uncache_table(name)

    # ----- readers -----------------------------------------------------------------------

    def _read(self, path: PathOrPaths, name: str | None, fmt: str) -> DataFrame:
        """Registers ``path`` (a file, a folder or a glob such as ``data/*.parquet``), or
        each of a list of paths, whose tables are stacked by column name."""
        if (
            isinstance(path, (str, os.PathLike))
            and not os.path.exists(path)
            and glob.has_magic(os.fspath(path))
        ):
            matches = sorted(glob.glob(os.fspath(path)))
            if not matches:
                raise ConfigError(f"no file matches {os.fspath(path)!r}")
            path = matches
        if isinstance(path, (list, tuple)):
            if not path:
                raise ConfigError("the list of paths is empty")
            from spate.reshape import concat

            frames = [self._read(p, None, fmt) for p in path]
            combined = concat(frames) if len(frames) > 1 else frames[0]
            return combined.register(name) if name else combined
        assert isinstance(path, (str, os.PathLike))
        name = name or self._unique(_table_name_for(path))
        self._inner.register_file(name, os.fspath(path), fmt)
        return self.table(name)

    def read_parquet(self, path: PathOrPaths, name: str | None = None) -> DataFrame:
        """Registers a Parquet file or folder as table ``name`` (default: from the file name)
        and returns it."""
        return self._read(path, name, "parquet")

    def read_csv(self, path: PathOrPaths, name: str | None = None) -> DataFrame:
        """Registers a CSV file (with a header row) or folder as table ``name`` (default: from
        the file name) and returns it."""
        return self._read(path, name, "csv")

    def read_json(self, path: PathOrPaths, name: str | None = None) -> DataFrame:
        """Registers a newline-delimited JSON file or folder and returns it."""
        return self._read(path, name, "ndjson")

    def read_ipc(self, path: PathOrPaths, name: str | None = None) -> DataFrame:
        """Registers an Arrow IPC (Feather v2) file or folder and returns it."""
        return self._read(path, name, "arrow")

    def from_arrow(self, data: Any, name: str | None = None) -> DataFrame:
        """Registers Arrow data without copying it: anything with ``__arrow_c_stream__`` or
        ``__arrow_c_array__`` (pyarrow tables, batches and readers; Polars DataFrames; pandas
        DataFrames with Arrow-backed columns).

        The table is registered as ``name``. Without a name it gets one (``df_<n>``, see
        :attr:`DataFrame.table_name`) that lasts as long as the returned DataFrame: frames
        derived from it keep the data, and the name goes when the frame is garbage
        collected, so that converting frames in a loop does not fill the session."""
        if name is not None:
            self._inner.register_arrow(name, data)
            return self.table(name)
        name = self._auto_name()
        self._inner.register_arrow(name, data)
        frame = self.table(name)
        forget = weakref.finalize(frame, _forget_table, weakref.ref(self), name)
        forget.atexit = False
        return frame

    def from_pandas(
        self, df: pandas.DataFrame, name: str | None = None, preserve_index: bool = False
    ) -> DataFrame:
        """Registers a pandas DataFrame (converted by pyarrow: NaN becomes null). The index is
        dropped unless ``preserve_index``, which keeps it as columns."""
        table = pa.Table.from_pandas(df, preserve_index=preserve_index)
        return self.from_arrow(table, name)

    def stream(self, name: str) -> Stream:
        """A writer of stream ``name`` (``CREATE STREAM``): ``push`` pandas or Arrow data."""
        return Stream(self._inner.stream_writer(name), name)

    def tail(
        self,
        stream: str,
        folder: str | os.PathLike[str],
        format: str | None = None,  # noqa: A002 - the readers' word for it
        poll: float = 0.05,
    ) -> _spate.FolderTail:
        """Tails ``folder`` into ``stream``: each new file (``format`` parquet, csv, ndjson or
        arrow; by default that of the files there) is read once, in name order, once it has
        settled, as one micro-batch. ``stop()`` ends the tail; ``finish()`` reads what is left
        and finishes its writer. Hidden files (``.`` or ``_`` first) are skipped: write a file
        under a hidden name and rename it in."""
        return self._inner.tail_folder(stream, os.fspath(folder), format, poll)

    def subscribe(
        self,
        view: str,
        callback: Callable[[Any], object] | None = None,
        *,
        format: str = "arrow",  # noqa: A002 - pandas' word for it
        timeout: float | None = None,
    ) -> Subscription | Listener:
        """What continuous view ``view`` emits from now on. Without ``callback``, an iterator of
        ``pyarrow.RecordBatch`` (or pandas with ``format="pandas"``); with one, a
        :class:`Listener` calling it with each emission on a thread of its own."""
        subscription = Subscription(self._inner.subscribe(view), format, timeout)
        if callback is None:
            return subscription
        return Listener(subscription, callback)

    def streams(self) -> list[dict[str, Any]]:
        """Each stream's watermark (µs since the epoch), lag (µs), events, late rows,
        micro-batches, waiting and kept rows, and the views reading it."""
        keys = (
            "name",
            "time_column",
            "watermark_micros",
            "lag_micros",
            "events",
            "late_rows",
            "micro_batches",
            "waiting_rows",
            "kept_rows",
            "kept_bytes",
            "views",
        )
        return [dict(zip(keys, row)) for row in self._inner.streams()]

    def checkpoint(self, folder: str | os.PathLike[str]) -> dict[str, int]:
        """Writes the streams' and views' state to ``folder``; returns each stream's offset
        (the rows it had taken), where its writers resume after a restore."""
        return dict(self._inner.checkpoint(os.fspath(folder)))

    def restore(self, folder: str | os.PathLike[str]) -> dict[str, int]:
        """Declares the streams and views of a checkpoint in this session and puts their
        state back; returns each stream's offset."""
        return dict(self._inner.restore(os.fspath(folder)))

    def from_polars(self, df: polars.DataFrame, name: str | None = None) -> DataFrame:
        """Registers a Polars DataFrame without copying it."""
        return self.from_arrow(df, name)


def _forget_table(session: weakref.ref[Session], name: str) -> None:
    """Deregisters the automatic name of a collected frame (plans derived from it hold the
    data themselves)."""
    alive = session()
    if alive is None:
        return
    try:
        alive._inner.deregister(name)
    except Exception:  # noqa: BLE001 - a finalizer must not raise; the name is harmless
        pass


def _is_pandas(data: Any) -> bool:
    module = type(data).__module__
    return module.startswith("pandas") and type(data).__name__ == "DataFrame"


_default: Session | None = None
_default_lock = threading.Lock()


def default_session() -> Session:
    """The session the module-level functions (:func:`spate.sql`, :func:`spate.from_pandas`,
    ...) use, created on first use with the backend named by ``SPATE_BACKEND`` (default
    ``auto``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Session(backend=os.environ.get("SPATE_BACKEND", "auto"))
        return _default


def set_default_session(session: Session) -> None:
    """Makes ``session`` the one the module-level functions use."""
    global _default
    if not isinstance(session, Session):
        raise TypeError(f"expected a spate.Session, got {type(session).__name__}")
    with _default_lock:
        _default = session
