"""Streams and continuous views from Python, against pandas over the replayed events."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import spate

BASE = pd.Timestamp("2026-01-01")
DELAY = pd.Timedelta(seconds=2)

STREAM = (
    "CREATE STREAM tx (card BIGINT NOT NULL, amount BIGINT NOT NULL, ts TIMESTAMP, "
    "WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) "
    "WITH (flush_rows = 100000000, flush_interval = '1 hour')"
)
VIEW = (
    "CREATE CONTINUOUS VIEW per_card AS SELECT card, window_end, count(*) AS n, "
    "sum(amount) AS total FROM TUMBLE(tx, ts, INTERVAL '10' SECOND) "
    "GROUP BY card, window_start, window_end"
)


def events(rows: int = 2000, seed: int = 3) -> pd.DataFrame:
    """Times 10 ms apart with up to 1.5 s of disorder, one in 60 ten seconds behind (late)."""
    rng = np.random.default_rng(seed)
    jitter = rng.integers(-1_500, 500, rows)
    late = np.where(rng.integers(0, 60, rows) == 0, -10_000, 0)
    ms = np.arange(rows) * 10 + jitter + late
    return pd.DataFrame(
        {
            "card": rng.integers(0, 8, rows),
            "amount": rng.integers(1, 1000, rows),
            "ts": BASE + pd.to_timedelta(ms, unit="ms"),
        }
    )


def accepted(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the stream accepts: not below the latest accepted time less the delay."""
    latest = None
    keep = []
    for t in frame["ts"]:
        ok = latest is None or t >= latest - DELAY
        if ok:
            latest = t if latest is None else max(latest, t)
        keep.append(ok)
    return frame[keep]


def expected(frame: pd.DataFrame) -> pd.DataFrame:
    rows = accepted(frame).assign(window_end=lambda d: d["ts"].dt.floor("10s") + pd.Timedelta("10s"))
    out = rows.groupby(["card", "window_end"], as_index=False).agg(
        n=("amount", "size"), total=("amount", "sum")
    )
    return normalized(out)


def normalized(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame[["card", "window_end", "n", "total"]].copy()
    frame["window_end"] = pd.to_datetime(frame["window_end"]).astype("datetime64[ns]")
    for c in ("card", "n", "total"):
        frame[c] = frame[c].astype("int64")
    return frame.sort_values(["card", "window_end"]).reset_index(drop=True)


@pytest.mark.parametrize("backend", ["cpu", "emulated"])
def test_a_subscription_gives_the_windows_pandas_computes(backend: str) -> None:
    session = spate.Session(backend=backend)
    session.sql(STREAM)
    session.sql(VIEW)
    subscription = session.subscribe("per_card")
    frame = events()
    with session.stream("tx") as tx:
        for start in range(0, len(frame), 250):
            tx.push(frame.iloc[start : start + 250])
            tx.flush()
    batches = list(subscription)
    assert subscription.ended
    assert len(batches) > 1, "emitted as windows closed"
    got = normalized(pa.Table.from_batches(batches).to_pandas())
    pd.testing.assert_frame_equal(got, expected(frame))
    late = session.sql('SELECT count(*) AS n FROM "tx$late"').to_pandas()["n"][0]
    assert late == len(frame) - len(accepted(frame)) > 0
    info = session.streams()[0]
    assert (info["name"], info["events"], info["late_rows"]) == ("tx", len(frame), late)
    assert info["views"] == ["per_card"]


def test_a_callback_sees_every_emission_as_pandas() -> None:
    session = spate.Session(backend="cpu")
    session.sql(STREAM)
    session.sql(VIEW)
    seen: list[pd.DataFrame] = []
    listener = session.subscribe("per_card", seen.append, format="pandas")
    frame = events(1200)
    tx = session.stream("tx")
    tx.push(pa.Table.from_pandas(frame.iloc[:600], preserve_index=False))
    tx.push(frame.iloc[600:])
    tx.finish()
    listener.join(timeout=30)
    assert not listener.running and listener.error is None
    got = normalized(pd.concat(seen))
    pd.testing.assert_frame_equal(got, expected(frame))


def test_a_restore_carries_on_where_the_checkpoint_left_off(tmp_path) -> None:
    frame = events(1500)
    whole = spate.Session(backend="cpu")
    whole.sql(STREAM)
    whole.sql(VIEW)
    everything = whole.subscribe("per_card")
    with whole.stream("tx") as tx:
        tx.push(frame)
    want = normalized(pa.Table.from_batches(list(everything)).to_pandas())

    first = spate.Session(backend="cpu")
    first.sql(STREAM)
    first.sql(VIEW)
    before = first.subscribe("per_card", timeout=0)
    first.stream("tx").push(frame.iloc[:700])
    offsets = first.checkpoint(tmp_path / "c")
    assert offsets == {"tx": 700}
    emitted = list(before)

    second = spate.Session(backend="cpu")
    assert second.restore(tmp_path / "c") == {"tx": 700}
    after = second.subscribe("per_card")
    with second.stream("tx") as tx:
        tx.push(frame.iloc[700:])
    emitted += list(after)
    got = normalized(pa.Table.from_batches(emitted).to_pandas())
    pd.testing.assert_frame_equal(got, want)


def test_stream_errors_are_clear() -> None:
    session = spate.Session(backend="cpu")
    with pytest.raises(spate.ConfigError, match="no stream named 'nope'"):
        session.stream("nope")
    with pytest.raises(spate.ConfigError, match="no continuous view named 'nope'"):
        session.subscribe("nope")
    session.sql(STREAM)
    tx = session.stream("tx")
    with pytest.raises(TypeError, match="push takes"):
        tx.push([1, 2, 3])
    with pytest.raises(spate.ConfigError, match="no column 'ts'"):
        tx.push(pd.DataFrame({"card": [1], "amount": [2]}))
    tx.finish()
    with pytest.raises(spate.ConfigError, match="has finished"):
        tx.finish()


def test_a_tailed_folder_feeds_the_stream(tmp_path) -> None:
    session = spate.Session(backend="cpu")
    session.sql(STREAM)
    session.sql(VIEW)
    subscription = session.subscribe("per_card")
    tail = session.tail("tx", tmp_path, format="csv", poll=0.01)
    frame = events(1000)
    for i, start in enumerate(range(0, len(frame), 250)):
        hidden = tmp_path / f".part-{i}.csv"
        frame.iloc[start : start + 250].to_csv(hidden, index=False)
        hidden.rename(tmp_path / f"part-{i:03}.csv")
    assert tail.finish() == 4
    got = normalized(pa.Table.from_batches(list(subscription)).to_pandas())
    pd.testing.assert_frame_equal(got, expected(frame))
