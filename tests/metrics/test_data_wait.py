"""The data-loading share on real MindSpore training (CPU): ``perf/data_wait_pct`` beside ``perf/data_wait_ms`` in a
single process, and ``throughput_drop`` naming the input pipeline or the step as what slowed."""
from __future__ import annotations

import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from helpers.runs import monitor
from mindspore import nn
from mindspore.train import Callback, Model

from msbridge.health.detectors.throughput_drop import cause_of
from msbridge.metrics.rank_timing import StepTimer
from msbridge.names import DATA_WAIT, DATA_WAIT_PCT, STEP_TIME
from msbridge.sinks.runlog import read_run

BATCH, SLOW_FROM = 8, 61


class Samples:
    """A random-access source whose batches from ``slow_from`` on take ``batch_s`` to read."""

    def __init__(self, steps: int, slow_from: int = 0, batch_s: float = 0.0) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(steps * BATCH, 16)).astype(np.float32)
        self.y = (self.x @ rng.normal(size=(16, 1))).astype(np.float32)
        self.slow_at, self.sample_s = (slow_from - 1) * BATCH if slow_from else None, batch_s / BATCH

    def __getitem__(self, i: int):
        if self.slow_at is not None and i >= self.slow_at:
            time.sleep(self.sample_s)
        return self.x[i], self.y[i]

    def __len__(self) -> int:
        return len(self.x)


class Busy(Callback):
    """Makes every step take ``base_s`` (``slow_s`` from step ``slow_from`` on), inside the monitor's step:
    listed before it, its step-end runs between the monitor's step-begin and step-end."""

    def __init__(self, base_s: float, slow_from: int = 0, slow_s: float = 0.0) -> None:
        self.base_s, self.slow_from, self.slow_s = base_s, slow_from, slow_s

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        time.sleep(self.slow_s if self.slow_from and step >= self.slow_from else self.base_s)


def train(callbacks, source: Samples) -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    data = ds.GeneratorDataset(source, ["x", "y"], shuffle=False, num_parallel_workers=1,
                               python_multiprocessing=False).batch(BATCH, drop_remainder=True)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, callbacks=callbacks,
                                                                       dataset_sink_mode=False)


HEALTH = {"warmup_steps": 10, "throughput_drop": {"baseline_steps": 20, "window": 5, "factor": 0.2}}


def windows(mon):
    """Each flush window's last record: step, data wait (ms), its share (percent), the step time (ms)."""
    log = read_run(mon.run_dir).ranks[0]
    return [(r.step, r.values[DATA_WAIT], r.values[DATA_WAIT_PCT], r.values[STEP_TIME])
            for r in log.records if DATA_WAIT_PCT in r.values], log


def test_a_slow_input_pipeline_is_named_as_the_cause(tmp_path):
    mon = monitor(tmp_path, flush_steps=10, health=HEALTH)
    train([Busy(0.01), mon], Samples(100, slow_from=SLOW_FROM, batch_s=0.15))
    shares, log = windows(mon)
    steps = [s for s, *_ in shares]  # one share per flush window (10 steps, or wider: overhead_budget), on its last
    assert steps[-1] == 100 and len(steps) >= 5 and len(steps) == len(set(steps))
    assert all(0 <= pct <= 100 and wait >= 0 for _, wait, pct, _ in shares)
    assert max(pct for step, _, pct, _ in shares if step <= 40) < 30  # the 10 ms step dominates
    assert min(pct for step, _, pct, _ in shares if step >= 90) > 80  # 150 ms waits for each batch
    [drop] = [e for e in log.events if e.kind == "anomaly" and e.detail["check"] == "throughput_drop"]
    assert drop.step > SLOW_FROM - 20 and drop.detail["cause"] == "input_pipeline"
    assert drop.detail["data_wait_pct"] > 50 > drop.detail["baseline_data_wait_pct"]


def test_a_slower_step_is_named_as_the_cause(tmp_path):
    mon = monitor(tmp_path, flush_steps=10, health=HEALTH)
    train([Busy(0.01, slow_from=SLOW_FROM, slow_s=0.15), mon], Samples(90))
    shares, log = windows(mon)
    assert max(pct for *_, pct, _ in shares) < 30
    [drop] = [e for e in log.events if e.kind == "anomaly" and e.detail["check"] == "throughput_drop"]
    assert SLOW_FROM <= drop.step <= SLOW_FROM + 5 and drop.detail["cause"] == "step"
    assert drop.detail["data_wait_pct"] < 30


def test_the_share_is_the_summed_wait_over_the_summed_step():
    timer = StepTimer()
    timer.hook_done(0.0, 0.0)  # the first step only starts the clock
    for begin, end in ((0.002, 0.010), (0.018, 0.020), (0.030, 0.040)):  # waits 2, 8, 10 ms; steps 10, 10, 20 ms
        timer.begin(begin)
        timer.step_ended(end)
        timer.hook_done(end, end)
    timing = timer.drain()
    assert timer.wait_share == pytest.approx(20 / 40) and timing[2] == pytest.approx(8.0)  # the median wait


def test_cause_compares_the_waits_growth_with_the_steps():
    assert cause_of(2.0, 2.0, 51.0) == "input_pipeline"  # 2 % of 10 ms -> 51 % of 20 ms: the wait grew 10 ms
    assert cause_of(2.0, 2.0, 10.0) == "step"  # 0.2 ms -> 2 ms of a 10 ms growth
    assert cause_of(1.0, 2.0, 2.0) == "step"
