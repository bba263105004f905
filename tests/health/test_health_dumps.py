"""Dump limits (rate, quota, free disk) and the SIGTERM guard that lets a killed run close its sinks."""
from __future__ import annotations

import os
import signal

import pytest

from msbridge.health.dumps import DISK_FULL, QUOTA, RATE_LIMITED, WRITTEN, DumpWriter, directory_size
from msbridge.run.signals import SignalGuard, TrainingInterrupted


# -- dumps --------------------------------------------------------------------------------
def test_dump_is_rate_limited_per_check(tmp_path):
    dumps = DumpWriter(str(tmp_path / "d"), rank=0, quota_mb=10, min_free_mb=0, every_steps=100)
    files = {"anomaly.json": b"{}"}
    statuses = [dumps.write("nonfinite", 10, files).status, dumps.write("nonfinite", 60, files).status,
                dumps.write("grad_norm_spike", 60, files).status, dumps.write("nonfinite", 110, files).status]
    assert statuses == [WRITTEN, RATE_LIMITED, WRITTEN, WRITTEN]
    assert sorted(os.listdir(tmp_path / "d")) == [
        "step000000010-rank0-nonfinite", "step000000060-rank0-grad_norm_spike", "step000000110-rank0-nonfinite"]


def test_quota_and_free_space_refuse_before_writing_anything(tmp_path):
    root = tmp_path / "d"
    dumps = DumpWriter(str(root), rank=1, quota_mb=0.01, min_free_mb=0, every_steps=1)  # 10 KiB
    blob = {"window.jsonl": b"x" * 4000}
    results = [dumps.write("loss_spike", step, blob) for step in range(1, 6)]
    assert [r.status for r in results] == [WRITTEN, WRITTEN, QUOTA, QUOTA, QUOTA]
    assert directory_size(str(root)) == 8000 <= 0.01 * 2**20
    assert results[2].reason.endswith("would pass the quota of 0.01 MB") and results[2].path is None
    full = DumpWriter(str(tmp_path / "e"), rank=0, quota_mb=1, min_free_mb=10**9, every_steps=1)
    assert full.write("nonfinite", 1, blob).status == DISK_FULL and not os.listdir(tmp_path / "e")


# -- SIGTERM guard ------------------------------------------------------------------------
def test_guard_raises_interrupted_restores_and_chains():
    before = signal.getsignal(signal.SIGTERM)
    guard = SignalGuard()
    assert guard.install()
    with pytest.raises(TrainingInterrupted) as err:
        os.kill(os.getpid(), signal.SIGTERM)
    assert err.value.signum == signal.SIGTERM and guard.interrupt_detail() == {"signal": "SIGTERM"}
    guard.restore()
    assert signal.getsignal(signal.SIGTERM) == before

    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        chained = SignalGuard()
        chained.install()
        os.kill(os.getpid(), signal.SIGTERM)  # the earlier handler is in charge: called, nothing raised
        assert seen == [signal.SIGTERM] and chained.received == signal.SIGTERM
        chained.restore()
    finally:
        signal.signal(signal.SIGTERM, before)


def test_guard_holds_a_signal_inside_a_critical_block():
    guard = SignalGuard()
    guard.install()
    done = []
    try:
        with pytest.raises(TrainingInterrupted):
            with guard.critical():
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("the block finished first")
        assert done == ["the block finished first"]
    finally:
        guard.restore()
