"""Spate: a GPU SQL and dataframe engine on Apache DataFusion, with a pandas-like API.

>>> import spate
>>> s = spate.Session(backend="cpu")
>>> s.sql("select 1 as x").to_pandas()
   x
0  1

The module-level functions (:func:`sql`, :func:`read_parquet`, :func:`from_pandas`, ...) use
:func:`default_session`, whose backend is ``auto`` unless ``SPATE_BACKEND`` says otherwise.
Data moves in and out through the Arrow C interfaces without copies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from spate import _spate
from spate.errors import (
    BackendError,
    ConfigError,
    Error,
    ExecutionError,
    InternalError,
    OutOfMemoryError,
    PlanError,
    SourceError,
    SqlError,
    UnsupportedError,
)
from spate.column import Column
from spate.datetimes import DatetimeMethods
from spate.frame import DataFrame
from spate.groupby import GroupBy
from spate.reshape import concat, merge_asof
from spate.session import Session, default_session, set_default_session
from spate.streaming import Listener, Stream, Subscription
from spate.strings import StringMethods

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import polars

__version__: str = _spate.__version__

__all__ = [
    "__version__",
    "Session",
    "DataFrame",
    "Column",
    "GroupBy",
    "StringMethods",
    "DatetimeMethods",
    "concat",
    "merge_asof",
    "Stream",
    "Subscription",
    "Listener",
    "Device",
    "Devices",
    "devices",
    "default_session",
    "set_default_session",
    "sql",
    "table",
    "read_parquet",
    "read_csv",
    "read_json",
    "read_ipc",
    "from_arrow",
    "from_pandas",
    "from_polars",
    "register",
    "Error",
    "SqlError",
    "PlanError",
    "OutOfMemoryError",
    "UnsupportedError",
    "SourceError",
    "ConfigError",
    "BackendError",
    "ExecutionError",
    "InternalError",
]


@dataclass(frozen=True)
class Device:
    """A CUDA GPU Spate can run on."""

    #: CUDA's ordinal for the device.
    index: int
    #: The device's name, e.g. ``NVIDIA H200``.
    name: str
    #: The architecture kernels are compiled for, e.g. ``sm_90``.
    arch: str
    #: Total device memory in bytes.
    total_memory: int
    #: Free device memory in bytes, or None: listing devices opens no CUDA context, and free
    #: memory is only known once a session opens the device.
    free_memory: int | None

    def __str__(self) -> str:
        gib = float(1 << 30)
        free = "" if self.free_memory is None else f", {self.free_memory / gib:.1f} GiB free"
        return (
            f"GPU {self.index}: {self.name} ({self.arch}), {self.total_memory / gib:.1f} GiB "
            f"total{free}"
        )


class Devices(list["Device"]):
    """The GPUs on this machine (a list of :class:`Device`), and in :attr:`reason` why there
    are none when it is empty."""

    #: Why no GPU is usable (no driver, no device), or None when there are GPUs.
    reason: str | None

    def __init__(self, devices: list[Device], reason: str | None) -> None:
        super().__init__(devices)
        self.reason = reason

    def __repr__(self) -> str:
        if not self:
            return f"no GPU: {self.reason}"
        return "\n".join(str(d) for d in self)


def devices() -> Devices:
    """Lists the CUDA GPUs and their memory; when there are none, ``devices().reason`` says
    why. Never fails, and never needs a GPU."""
    found, reason = _spate.devices()
    return Devices([Device(*d) for d in found], reason)


def sql(query: str) -> DataFrame:
    """:meth:`Session.sql` on the default session."""
    return default_session().sql(query)


def table(name: str) -> DataFrame:
    """:meth:`Session.table` on the default session."""
    return default_session().table(name)


def read_parquet(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], name: str | None = None
) -> DataFrame:
    """:meth:`Session.read_parquet` on the default session."""
    return default_session().read_parquet(path, name)


def read_csv(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], name: str | None = None
) -> DataFrame:
    """:meth:`Session.read_csv` on the default session."""
    return default_session().read_csv(path, name)


def read_json(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], name: str | None = None
) -> DataFrame:
    """:meth:`Session.read_json` on the default session."""
    return default_session().read_json(path, name)


def read_ipc(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], name: str | None = None
) -> DataFrame:
    """:meth:`Session.read_ipc` on the default session."""
    return default_session().read_ipc(path, name)


def from_arrow(data: Any, name: str | None = None) -> DataFrame:
    """:meth:`Session.from_arrow` on the default session."""
    return default_session().from_arrow(data, name)


def from_pandas(
    df: pandas.DataFrame, name: str | None = None, preserve_index: bool = False
) -> DataFrame:
    """:meth:`Session.from_pandas` on the default session."""
    return default_session().from_pandas(df, name, preserve_index)


def from_polars(df: polars.DataFrame, name: str | None = None) -> DataFrame:
    """:meth:`Session.from_polars` on the default session."""
    return default_session().from_polars(df, name)


def register(name: str, data: Any) -> DataFrame:
    """:meth:`Session.register` on the default session."""
    return default_session().register(name, data)
