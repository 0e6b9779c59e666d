"""Shared fixtures for the Spate Python tests.

pandas is the oracle: each test builds random data with nulls (a seeded NumPy Generator), runs
one operation in Spate and the same operation in pandas, and compares the results with
:func:`assert_same`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import pytest

import spate

#: Rows of the random frames. Big enough for every group, null pattern and join fan-out to
#: appear, small enough that the whole suite runs in well under two minutes.
ROWS = 2000

WORDS = np.array(
    ["apple", "Banana", "cherry", "date", "Elder", "fig", "grape", "apple pie", "b.na", ""],
    dtype=object,
)


def random_frame(seed: int, rows: int = ROWS) -> pd.DataFrame:
    """A frame with every kind of column the tests need, nulls included:

    - ``id``: unique int64 (a tie-breaker that makes any sort total);
    - ``k``: a string key with nulls, ``g``: an integer key with nulls (float64 in pandas);
    - ``i``: int64 in [-50, 50], ``j``: int64 in [1, 9] (a safe divisor), ``n``: nullable
      Int64 with nulls;
    - ``f``: float64 with NaN, ``s``: strings with None, ``b``: bool.
    """
    rng = np.random.default_rng(seed)
    keys = np.array(["a", "b", "c", "d", "e"], dtype=object)
    k = keys[rng.integers(0, len(keys), rows)]
    k[rng.random(rows) < 0.1] = None
    g = rng.integers(0, 7, rows).astype("float64")
    g[rng.random(rows) < 0.1] = np.nan
    f = rng.normal(0, 10, rows).round(3)
    f[rng.random(rows) < 0.15] = np.nan
    s = WORDS[rng.integers(0, len(WORDS), rows)].copy()
    s = np.array([f"{w}{n}" if w else w for w, n in zip(s, rng.integers(0, 30, rows))], object)
    s[rng.random(rows) < 0.15] = None
    n = pd.array(rng.integers(-5, 5, rows), dtype="Int64")
    n[rng.random(rows) < 0.2] = pd.NA
    return pd.DataFrame(
        {
            "id": rng.permutation(rows).astype("int64"),
            "k": pd.array(k, dtype="str"),
            "g": g,
            "i": rng.integers(-50, 51, rows).astype("int64"),
            "j": rng.integers(1, 10, rows).astype("int64"),
            "n": n,
            "f": f,
            "s": pd.array(s, dtype="str"),
            "b": rng.random(rows) < 0.4,
        }
    )


def timed_frame(seed: int, rows: int = 400) -> pd.DataFrame:
    """A frame for order-dependent methods: ``id`` (unique, the sort key), ``ts`` (unique
    timestamps, minutes apart with gaps), ``tz`` (the same, UTC), ``k`` (a string key with
    nulls), ``i`` (int64), ``f`` (float64 with NaN), ``n`` (Int64 with NA), ``s`` (strings
    with None), ``b`` (bool)."""
    rng = np.random.default_rng(seed)
    base = random_frame(seed, rows)
    steps = rng.integers(1, 90, rows).cumsum()
    ts = pd.Timestamp("2026-03-28 22:00") + pd.to_timedelta(steps, unit="min")
    base = base.sort_values("id").reset_index(drop=True)
    base["ts"] = ts
    base["tz"] = ts.tz_localize("UTC")
    return base[["id", "ts", "tz", "k", "i", "f", "n", "s", "b"]]


@pytest.fixture(scope="module", params=["cpu", "emulated"])
def backend(request: pytest.FixtureRequest) -> spate.Session:
    """A session on each backend the tests run everywhere: ``cpu`` and ``emulated`` (the
    GPU operators on the host emulator)."""
    return spate.Session(backend=request.param)


@pytest.fixture(scope="session")
def cpu() -> spate.Session:
    """One CPU session shared by the tests that only read from it."""
    return spate.Session(backend="cpu")


@pytest.fixture()
def session() -> spate.Session:
    """A fresh CPU session, for tests that register names or change settings."""
    return spate.Session(backend="cpu")


@pytest.fixture(scope="session")
def pdf() -> pd.DataFrame:
    """The random frame every pandas-oracle test uses (seed 1)."""
    return random_frame(1)


@pytest.fixture(scope="session")
def sdf(cpu: spate.Session, pdf: pd.DataFrame) -> spate.DataFrame:
    """``pdf`` in the shared CPU session, registered as table ``t``."""
    return cpu.from_pandas(pdf, name="t")


def canonical(frame: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """``frame`` with its index turned into columns, rows sorted by ``by`` (default: every
    column) with nulls last, and a fresh RangeIndex: the form two results with no defined
    row order are compared in."""
    frame = frame.reset_index(drop=frame.index.name is None and frame.index.nlevels == 1)
    keys = list(by) if by is not None else list(frame.columns)
    # Sort on a key that treats every null kind the same and orders mixed types stably.
    sortable = pd.DataFrame(
        {c: frame[c].astype(object).where(frame[c].notna(), None) for c in keys}
    )
    order = sorted(
        range(len(frame)),
        key=lambda r: tuple(
            (1, "") if sortable.iat[r, c] is None else (0, sortable.iat[r, c])
            for c in range(len(keys))
        ),
    )
    return frame.iloc[order].reset_index(drop=True)


def normalize_nulls(frame: pd.DataFrame) -> pd.DataFrame:
    """Object and nullable columns with every missing value as NaN and values as plain
    Python/NumPy scalars, so pandas' several null markers (None, NaN, pd.NA) compare equal."""
    out = {}
    for name in frame.columns:
        column = frame[name]
        if isinstance(column.dtype, pd.BooleanDtype) and not column.isna().any():
            out[name] = column.astype(bool)
        elif isinstance(column.dtype, pd.BooleanDtype) or column.dtype == object:
            values = column.astype(object).where(column.notna(), np.nan)
            out[name] = values
        elif isinstance(column.dtype, pd.api.extensions.ExtensionDtype) and (
            column.dtype.kind in "iuf"
        ):
            out[name] = column.astype("float64")
        else:
            out[name] = column
    return pd.DataFrame(out, index=frame.index)


def assert_same(
    got: pd.DataFrame | spate.DataFrame,
    expected: pd.DataFrame,
    *,
    sort: bool | Sequence[str] = True,
    check_dtype: bool = False,
    check_index: bool = False,
    **kwargs: object,
) -> None:
    """Asserts that a Spate result equals the pandas result.

    ``sort=True`` compares the rows as a multiset (for results whose row order Spate does not
    define); a list of names sorts by those columns; ``sort=False`` compares in order. With
    ``check_index`` the index (e.g. groupby keys) must match exactly, in order.
    """
    if isinstance(got, spate.DataFrame):
        got = got.to_pandas()
    assert list(got.columns) == list(expected.columns), (list(got.columns), list(expected.columns))
    if check_index:
        pd.testing.assert_index_equal(got.index, expected.index, exact=False)
    if sort is not False:
        by = None if sort is True else list(sort)
        got, expected = canonical(got, by), canonical(expected, by)
    else:
        got, expected = got.reset_index(drop=True), expected.reset_index(drop=True)
    got, expected = normalize_nulls(got), normalize_nulls(expected)
    pd.testing.assert_frame_equal(got, expected, check_dtype=check_dtype, **kwargs)


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Fails the test if the block runs longer than ``seconds``. Spate checks for Python
    signals while a query runs, so the alarm's exception interrupts a hung query too."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} took more than {seconds} s")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
