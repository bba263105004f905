"""NPU system metrics from ``npu-smi info``, against a fake ``npu-smi`` on PATH.

There is no NPU on the test machine, so ``npu-smi`` is a shell script that
prints a fixed ``npu-smi info`` table. The two tables in tests/data/npu_smi
follow the layouts Ascend documents and users post:

- one_chip.txt: the layout of Ascend's "查询基本信息 (npu-smi info)" page,
  https://www.hiascend.com/document/detail/zh/Atlas%20200I%20A2/2520/re/npu/npusmi_007.html
  (Power(W) Temp(C) Hugepages-Usage(page) / AICore(%) Memory-Usage(MB); no HBM), our own values;
- eight_chips.txt: the training-server layout with the HBM-Usage(MB) column, as in
  https://github.com/br-ai-ns-institute/ascend-utils (npu-smi info on an Atlas 800) with the
  Hugepages-Usage(page) column of current npu-smi, 8 chips (910B3) and the process table after them.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time

import numpy as np
import pytest
from helpers.training import train_regression
from mindspore.train import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor
from msbridge.capture.npu_smi import chip_metrics, parse_npu_smi
from msbridge.capture.system_sampler import NpuSampler, physical_index
from msbridge.sinks.runlog import read_run

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "npu_smi")


def table(name):
    with open(os.path.join(DATA, f"{name}.txt"), encoding="utf-8") as fh:
        return fh.read()


@pytest.fixture
def fake_npu_smi(tmp_path, monkeypatch):
    """Put an ``npu-smi`` on PATH that prints the named table for ``npu-smi info``; returns a setter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "npu-smi"

    def use(name):
        script.write_text(f'#!/bin/sh\n[ "$1" = info ] || exit 2\ncat "{os.path.join(DATA, name)}.txt"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    use("eight_chips")
    return use


def test_one_chip_table():
    chips = parse_npu_smi(table("one_chip"))
    assert len(chips) == 1
    assert chip_metrics(chips[0]) == {"system/npu_power_w": 9.7, "system/npu_temperature_c": 58.0,
                                      "system/npu_utilization_pct": 37.0, "system/npu_memory_used_mb": 2211.0,
                                      "system/npu_memory_total_mb": 10810.0}


def test_eight_chip_table_stops_before_the_process_table():
    chips = parse_npu_smi(table("eight_chips"))
    assert [int(c["npu"]) for c in chips] == list(range(8))
    assert chip_metrics(chips[5]) == {"system/npu_power_w": 188.3, "system/npu_temperature_c": 47.0,
                                      "system/npu_utilization_pct": 96.0, "system/npu_hbm_used_mb": 51234.0,
                                      "system/npu_hbm_total_mb": 65536.0}  # Memory-Usage 0 / 0 is left out


def test_not_npu_smi_output_is_refused():
    with pytest.raises(ValueError, match="not npu-smi info output"):
        parse_npu_smi("command not found\n")


def test_physical_index_follows_visible_devices():
    assert physical_index(1, "4,5,6,7") == 5 and physical_index(3, "") == 3


def test_sampler_reads_its_own_chip(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5")
    sampler = NpuSampler.start(interval_s=0.05, device_id=1)  # logical 1 -> chip 5
    try:
        deadline = time.time() + 10
        while len(sampler._samples) < 3 and time.time() < deadline:
            time.sleep(0.05)
        samples = sampler.drain()
    finally:
        sampler.stop()
    assert len(samples) >= 3 and not sampler.thread.is_alive()
    assert all(values["system/npu_hbm_used_mb"] == 51234.0 for _, values in samples)
    times = [t for t, _ in samples]
    assert times == sorted(times) and sampler.drain() == []


def test_missing_npu_smi_is_said_once_at_info_and_starts_nothing(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    threads = threading.active_count()
    with caplog.at_level(logging.INFO, logger="msbridge"):
        assert NpuSampler.start(interval_s=1.0, device_id=0) is None
    said = [r for r in caplog.records if "npu-smi is not on PATH" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert threading.active_count() == threads


def test_a_device_beyond_the_table_is_said_once(fake_npu_smi, caplog):
    fake_npu_smi("one_chip")
    sampler = NpuSampler(interval_s=1.0, device_id=3)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        assert sampler.sample() is None and sampler.sample() is None
    said = [r.getMessage() for r in caplog.records if "lists 1 chip(s)" in r.getMessage()]
    assert len(said) == 1


def _thread_cpu_ticks(native_id):
    with open(f"/proc/self/task/{native_id}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.slow
def test_sampler_uses_no_cpu_between_samples(fake_npu_smi):
    sampler = NpuSampler.start(interval_s=60.0, device_id=0)
    try:
        deadline = time.time() + 10
        while not sampler._samples and time.time() < deadline:
            time.sleep(0.05)
        assert sampler._samples  # the first sample is taken at once, then the thread sleeps on its Event
        before = _thread_cpu_ticks(sampler.thread.native_id)
        time.sleep(1.5)
        assert _thread_cpu_ticks(sampler.thread.native_id) == before
    finally:
        started = time.monotonic()
        sampler.stop()
    # stop wakes it: the thread is gone in a fraction of the 60 s interval it would otherwise sleep out
    assert not sampler.thread.is_alive() and time.monotonic() - started < sampler.interval_s / 2


class Slow(Callback):
    """Steps of ~40 ms, so the sampler (every 0.1 s) lands between steps."""

    def on_train_step_end(self, run_context):
        time.sleep(0.04)


@pytest.mark.slow
def test_system_metrics_reach_the_jsonl_and_tensorboard(fake_npu_smi, tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "5")
    mon = BridgeMonitor({"experiment": "t", "run_name": "r",
                         "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
                         "flush_steps": 10, "sinks": ["jsonl", "tensorboard"], "system": {"interval_s": 0.1}},
                        progress=False)
    train_regression([Slow(), mon], steps=30)
    records = read_run(mon.run_dir).ranks[0].records
    assert [r.step for r in records] == list(range(1, 31))
    sampled = [r for r in records if "system/npu_utilization_pct" in r.values]
    assert len(sampled) >= 5 and {r.values["system/npu_utilization_pct"] for r in sampled} == {96.0}
    assert all(r.values["system/npu_hbm_used_mb"] == 51234.0 for r in sampled)
    assert not any(t.name == "msbridge-npu-smi" for t in threading.enumerate())  # stopped at train end
    ea = EventAccumulator(str(tmp_path / "t" / "tensorboard" / "r" / "rank_0"), size_guidance={"scalars": 0})
    ea.Reload()
    got = {e.step: e.value for e in ea.Scalars("system/npu_hbm_total_mb")}
    assert sorted(got) == [r.step for r in sampled]
    np.testing.assert_allclose(list(got.values()), 65536.0)
