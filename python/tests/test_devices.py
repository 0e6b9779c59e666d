"""Several devices in one session, and remote sessions on a Ballista scheduler."""

from __future__ import annotations

import pytest

import spate
from conftest import assert_same, random_frame


def test_two_emulated_devices_give_the_cpus_results() -> None:
    frame = random_frame(7, 300)

    def grouped(session: spate.Session) -> spate.DataFrame:
        d = session.from_pandas(frame)
        return d.groupby("k", dropna=False).agg({"i": ["sum", "max"], "f": ["count"]})

    cpu = grouped(spate.Session(backend="cpu")).to_pandas()
    assert_same(grouped(spate.Session(backend="emulated", devices=2)), cpu)


def test_devices_are_a_count_or_a_list() -> None:
    assert spate.Session(backend="emulated", devices="cuda:0,1").backend == "emulated"
    with pytest.raises(spate.ConfigError, match="expected a count"):
        spate.Session(backend="emulated", devices="cuda:1,1")
    with pytest.raises(TypeError, match="devices must be"):
        spate.Session(backend="emulated", devices=[0, 1])  # type: ignore[arg-type]


def test_a_remote_session_without_a_scheduler_fails_clearly() -> None:
    session = spate.Session(remote="df://127.0.0.1:9")
    assert "remote" in session.backend_reason
    with pytest.raises(spate.Error) as failed:
        session.sql("SELECT 1 AS x").to_pandas()
    assert "internal error" not in str(failed.value)
