"""``memory: true``: host RSS at every flush, and what the CPU backend cannot tell (device memory)."""
from __future__ import annotations

import logging

import numpy as np
import psutil
from helpers.training import train_regression
from mindspore.train import Callback
import pytest

from msbridge import BridgeMonitor
from msbridge.capture.memory import MemoryReader, host_rss_mb
from msbridge.sinks.runlog import read_run


def test_host_rss_is_this_process_resident_memory():
    assert abs(host_rss_mb() - psutil.Process().memory_info().rss / 2**20) < 20


def test_device_memory_comes_from_mindspore_runtime_off_cpu():
    # MindSpore's runtime memory API answers on any backend (0 without a device pool); on a device
    # the same two calls give the pool's allocated and peak bytes.
    read = MemoryReader("Ascend").read()
    assert read["memory/device_allocated_mb"] == 0.0 and read["memory/device_peak_mb"] == 0.0
    assert read["memory/host_rss_mb"] > 10


@pytest.mark.slow
def test_memory_per_flush_and_cpu_said_once(tmp_path, caplog):
    mon = BridgeMonitor({"experiment": "t", "run_name": "r",
                         "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
                         "flush_steps": 8, "overhead_budget": 0.99, "sinks": ["jsonl"], "memory": True},
                        progress=False)
    with caplog.at_level(logging.INFO, logger="msbridge"):
        train_regression([mon], steps=24)
    said = [r.getMessage() for r in caplog.records if "no device memory pool" in r.getMessage()]
    assert len(said) == 1
    records = read_run(mon.run_dir).ranks[0].records
    assert [r.step for r in records] == list(range(1, 25))
    flushed = {r.step: r.values["memory/host_rss_mb"] for r in records if "memory/host_rss_mb" in r.values}
    assert sorted(flushed) == [8, 16, 24]
    now = psutil.Process().memory_info().rss / 2**20
    assert np.all(np.abs(np.array(list(flushed.values())) - now) < 0.5 * now)
    assert not any(n.startswith("memory/device") for r in records for n in r.values)


class Allocates(Callback):
    """Holds ``mb`` of touched host memory during one step's end, then frees it."""

    def __init__(self, step, mb):
        super().__init__()
        self.step, self.mb = step, mb

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            self.held = np.ones(self.mb * 2**20 // 8)  # touched: resident
            self.held = None


@pytest.mark.slow
def test_the_host_peak_is_each_windows_own(tmp_path):
    """200 MB held for a moment in step 10 shows in the peak of window 9-16 only, never in the RSS."""
    mon = BridgeMonitor({"experiment": "t", "run_name": "r",
                         "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
                         "flush_steps": 8, "overhead_budget": 0.99, "sinks": ["jsonl"], "memory": True},
                        progress=False)
    train_regression([mon, Allocates(10, 200)], steps=24)
    records = read_run(mon.run_dir).ranks[0].records
    assert [r.step for r in records] == list(range(1, 25))
    flushed = {r.step: r.values for r in records if "memory/host_rss_peak_mb" in r.values}
    assert sorted(flushed) == [8, 16, 24]
    above = {step: v["memory/host_rss_peak_mb"] - v["memory/host_rss_mb"] for step, v in flushed.items()}
    assert above[16] > 190, above
    assert above[8] < 100 and above[24] < 100, above
