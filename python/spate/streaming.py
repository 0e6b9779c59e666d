"""Streams and continuous views from Python (see docs/streaming.md).

>>> s = Session(backend="cpu")                                         # doctest: +SKIP
>>> s.sql("CREATE STREAM tx (card BIGINT, ts TIMESTAMP, "
...       "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)")             # doctest: +SKIP
>>> s.sql("CREATE CONTINUOUS VIEW per_minute AS SELECT card, window_end, count(*) AS n "
...       "FROM TUMBLE(tx, ts, INTERVAL '1' MINUTE) "
...       "GROUP BY card, window_start, window_end")                   # doctest: +SKIP
>>> with s.stream("tx") as tx:                                         # doctest: +SKIP
...     tx.push(events_df)
>>> for batch in s.subscribe("per_minute", timeout=1.0): ...           # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spate import _spate

if TYPE_CHECKING:  # pragma: no cover
    import pandas

__all__ = ["Stream", "Subscription", "Listener"]


def _as_arrow(data: Any) -> Any:
    """pandas frames through pyarrow (NaN becomes null, the index is dropped); anything with
    ``__arrow_c_stream__`` or ``__arrow_c_array__`` as it is."""
    if hasattr(data, "__arrow_c_stream__") or hasattr(data, "__arrow_c_array__"):
        return data
    module = type(data).__module__
    if module.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise TypeError(
        "push takes a pandas DataFrame or Arrow data (pyarrow Table, RecordBatch, reader, "
        f"Polars DataFrame), not {type(data).__name__}"
    )


class Stream:
    """A writer of one stream (``Session.stream``). Rows are matched to the stream's columns
    by name. Late rows go to the side table ``"<stream>$late"``.

    Each writer holds the stream's watermark back by the latest event time it has sent.
    ``finish()`` lets go. Once every writer has finished, every window closes. Used as a
    context manager, the writer finishes when the block ends without an error."""

    def __init__(self, inner: _spate.StreamWriter, name: str) -> None:
        self._inner = inner
        self.name = name

    def push(self, data: Any) -> Stream:
        """Pushes a pandas DataFrame or Arrow data. A micro-batch is cut when one is due
        (``flush_rows``, ``flush_interval``)."""
        self._inner.push(_as_arrow(data))
        return self

    def flush(self) -> None:
        """Cuts a micro-batch of what waits now and advances the views."""
        self._inner.flush()

    def finish(self) -> None:
        """Ends this writer and flushes."""
        self._inner.finish()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        if kind is None:
            self.finish()

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"


class Subscription:
    """What a continuous view emits from the subscription on (``Session.subscribe``).

    Iterating yields a ``pyarrow.RecordBatch`` per emission (a pandas DataFrame with
    ``format="pandas"``). It stops once every writer of the view's streams has finished and
    the last rows are out, or, with ``timeout``, when nothing came for that many seconds."""

    def __init__(
        self, inner: _spate.Subscription, fmt: str = "arrow", timeout: float | None = None
    ) -> None:
        if fmt not in ("arrow", "pandas"):
            raise ValueError(f"format must be 'arrow' or 'pandas', not {fmt!r}")
        self._inner = inner
        self._format = fmt
        self._timeout = timeout
        self.ended = False

    def _convert(self, capsule: Any) -> pa.RecordBatch | pandas.DataFrame:
        reader = pa.RecordBatchReader._import_from_c_capsule(capsule)
        table = reader.read_all()
        if self._format == "pandas":
            return table.to_pandas()
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)

    def next(self, timeout: float | None = None) -> pa.RecordBatch | pandas.DataFrame | None:
        """The next emission, waiting up to ``timeout`` seconds (forever when None); None on a
        timeout or after the last."""
        capsule, ended = self._inner.next(timeout)
        if ended:
            self.ended = True
        return None if capsule is None else self._convert(capsule)

    def __iter__(self) -> Iterator[pa.RecordBatch | pandas.DataFrame]:
        while not self.ended:
            item = self.next(self._timeout)
            if item is None:
                return
            yield item


class Listener:
    """Calls a function with each emission of a view, on a thread of its own
    (``Session.subscribe(view, callback=…)``). ``stop()`` ends it; it ends by itself after
    the view's last rows. An exception in the callback stops it and is kept in ``error``."""

    def __init__(
        self, subscription: Subscription, callback: Callable[[Any], object], poll: float = 0.05
    ) -> None:
        self._subscription = subscription
        self._callback = callback
        self._poll = poll
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="spate-subscription", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self._subscription.ended:
                item = self._subscription.next(self._poll)
                if item is not None:
                    self._callback(item)
        except BaseException as e:  # noqa: BLE001 - kept for the caller to see
            self.error = e

    def stop(self, wait: bool = True) -> None:
        """Ends the listener (after the emission in hand), waiting for its thread."""
        self._stop.set()
        if wait:
            self._thread.join()

    def join(self, timeout: float | None = None) -> None:
        """Waits for the listener to end (after the view's last rows)."""
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
