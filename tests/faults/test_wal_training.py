"""A real MindSpore training run whose disk fills up and frees again: a real 3 MB tmpfs (as root) and the
file-system shim (everywhere). Afterwards every jsonl line parses, every step is in the log or inside a
``gap`` event's step range, the gap is in TensorBoard and in run.json/README, and the run closed FINISHED.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from helpers.disk import DiskShim, assert_covered, fill, parse_lines, small_tmpfs
from helpers.training import train_regression
from mindspore.train import Callback
from msbridge.adapters import jsonl_sink
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS, FULL_AT, FREE_AT = 60, 15, 45


class DiskTrouble(Callback):
    """At step ``full_at`` the disk fills, at ``free_at`` space returns; the sinks are drained before each,
    so every batch in between meets the full disk."""

    def __init__(self, monitor: BridgeMonitor, full: Callable[[], Any], free: Callable[[], Any]) -> None:
        super().__init__()
        self.monitor, self.full, self.free = monitor, full, free

    def on_train_step_end(self, run_context: Any) -> None:
        step = int(run_context.original_args().cur_step_num)
        if step in (FULL_AT, FREE_AT):
            self.monitor.flush()  # the window the converter thread may still hold, then the sinks
            assert self.monitor.dispatcher.flush(timeout=60)
            (self.full if step == FULL_AT else self.free)()


def train_on(disk: Path, tb_logdir: Path, full: Callable[[], Any], free: Callable[[], Any]) -> BridgeMonitor:
    monitor = BridgeMonitor({"experiment": "faults", "run_name": "full-disk", "flush_steps": 5,
                             "output_dir": str(disk / "{experiment}" / "{run_name}"),
                             "sinks": {"jsonl": {}, "tensorboard": {"logdir": str(tb_logdir)}}}, progress=False)
    train_regression([monitor, DiskTrouble(monitor, full, free)], steps=STEPS)
    return monitor


def check_run(monitor: BridgeMonitor, disk: Path, tb_logdir: Path, dropped: bool) -> None:
    every = list(disk.rglob("*.jsonl"))
    assert every, "the run wrote its log"
    for path in every:  # 0 malformed lines in any jsonl
        parse_lines(path)
    gaps = assert_covered(parse_lines(Path(monitor.run_dir) / "metrics" / "rank_0.jsonl"), list(range(1, STEPS + 1)))
    meta = json.loads((Path(monitor.run_dir) / "run.json").read_text())
    assert meta["outcome"]["status"] == "FINISHED" and monitor.steps_recorded == STEPS
    if not dropped:
        assert gaps == [] and monitor.outcome.exit_code == 0 and meta["outcome"]["not delivered"] == "none"
        return
    (gap,) = gaps
    assert monitor.outcome.exit_code == 3  # the records the log lost are in the outcome
    lost = meta["outcome"]["not delivered"]["jsonl"]
    assert lost.startswith(f"{gap['records']} record(s) and 0 event(s) of steps {gap['first_step']}-{gap['last_step']}")
    assert FULL_AT < gap["first_step"] <= gap["last_step"] <= FREE_AT and gap["records"] > 0
    assert f"gap {gap}" in meta["outcome"]["anomalies"]
    assert f"gap {gap}" in (Path(monitor.run_dir) / "README.md").read_text()
    acc = EventAccumulator(str(tb_logdir / "full-disk" / "rank_0"), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("events/gap")] == [gap["last_step"]]


@pytest.mark.parametrize("bound", [jsonl_sink.MAX_HELD_LINES, 10], ids=["held-then-written", "dropped-as-gap"])
def test_a_real_tmpfs_fills_up_during_training(tmp_path, monkeypatch, caplog, bound):
    monkeypatch.setattr(jsonl_sink, "MAX_HELD_LINES", bound)
    caplog.set_level(logging.WARNING, logger="msbridge")
    with small_tmpfs(tmp_path / "disk") as disk:
        filler = []
        monitor = train_on(disk, tmp_path / "tb", lambda: filler.append(fill(disk)), lambda: os.remove(filler[0]))
        check_run(monitor, disk, tmp_path / "tb", dropped=bound == 10)
    full = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(full) == 1, "a full disk is said once, not per step"
    assert "rank_0.jsonl: the disk is full (0 B free in " in full[0]


@pytest.mark.parametrize("bound", [jsonl_sink.MAX_HELD_LINES, 10], ids=["held-then-written", "dropped-as-gap"])
def test_a_shimmed_disk_fills_up_during_training(tmp_path, monkeypatch, bound):
    monkeypatch.setattr(jsonl_sink, "MAX_HELD_LINES", bound)
    disk = tmp_path / "disk"
    shim = DiskShim(monkeypatch, disk)
    monitor = train_on(disk, tmp_path / "tb", lambda: setattr(shim, "space", 0), lambda: setattr(shim, "space", None))
    assert shim.failures > 0
    check_run(monitor, disk, tmp_path / "tb", dropped=bound == 10)
