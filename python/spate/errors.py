"""Exceptions raised by Spate.

Every error Spate raises is a :class:`spate.Error`. The subclasses say what kind of mistake it
was; several also derive from the matching built-in exception, so ``except MemoryError`` or
``except OSError`` catch them too.
"""

from __future__ import annotations

__all__ = [
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


class Error(Exception):
    """Base class of every error Spate raises."""


class SqlError(Error):
    """SQL text that cannot be parsed or planned: a syntax error, an unknown table or column, a
    type mismatch.

    When the position is known, ``line`` and ``column`` (1-based) say where, and the message
    ends with it.
    """

    line: int | None = None
    column: int | None = None


class PlanError(Error):
    """A DataFrame operation that cannot be planned: an unknown column, incompatible types,
    a merge key missing on one side."""


class OutOfMemoryError(Error, MemoryError):
    """A query needed more memory (host or GPU) than the session's limit allows."""


class UnsupportedError(Error, NotImplementedError):
    """Valid input that Spate does not support (yet)."""


class SourceError(Error, OSError):
    """A file or folder that could not be registered or read: missing, unreadable, corrupt, or
    of an unknown format."""


class ConfigError(Error, ValueError):
    """An invalid setting or argument: an unknown backend, a bad size, a bad option value."""


class BackendError(Error):
    """The requested backend (``cuda`` or ``emulated``) cannot run on this machine or build."""


class ExecutionError(Error):
    """A query failed while running, for example on bad data or an overflow."""


class InternalError(Error):
    """A failure that should never happen: a bug in Spate. Please report it."""
