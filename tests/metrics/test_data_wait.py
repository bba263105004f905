"""The data-loading share on real MindSpore training (CPU): ``perf/data_wait_pct`` beside ``perf/data_wait_ms`` in a
single process, and ``throughput_drop`` naming the input pipeline or the step as what slowed."""
from __future__ import annotations

import math

import pytest
from helpers.runs import monitor
from helpers.slow_training import SLOW_FROM, Busy, Samples, train

from msbridge.health.detectors.throughput_drop import cause_of
from msbridge.metrics.rank_timing import StepTimer
from msbridge.names import DATA_WAIT, DATA_WAIT_PCT, STEP_TIME
from msbridge.sinks.runlog import read_run

HEALTH = {"warmup_steps": 10, "throughput_drop": {"baseline_steps": 20, "window": 5, "factor": 0.2}}


def windows(mon):
    """Each flush window's last record: step, data wait (ms), its share (percent), the step time (ms)."""
    log = read_run(mon.run_dir).ranks[0]
    return [(r.step, r.values[DATA_WAIT], r.values[DATA_WAIT_PCT], r.values[STEP_TIME])
            for r in log.records if DATA_WAIT_PCT in r.values], log


@pytest.mark.slow
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


@pytest.mark.slow
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
    last_end = 0.0
    for begin, end in ((0.002, 0.010), (0.018, 0.020), (0.030, 0.040)):  # waits 2, 8, 10 ms; steps 10, 10, 20 ms
        timer.step(end, last_end, begin)
        last_end = end
    timing = timer.drain()
    assert timer.wait_share == pytest.approx(20 / 40) and timing[2] == pytest.approx(8.0)  # the median wait


def test_steps_that_took_no_measurable_time_have_no_share():
    timer = StepTimer()  # a clock coarser than the steps: every stamp equal
    for _ in range(3):
        timer.step(1.0, 1.0, 1.0)
    timing = timer.drain()
    assert math.isnan(timer.wait_share) and timing[0] == 0.0 and timing[2] == 0.0


def test_cause_compares_the_waits_growth_with_the_steps():
    assert cause_of(2.0, 2.0, 51.0) == "input_pipeline"  # 2 % of 10 ms -> 51 % of 20 ms: the wait grew 10 ms
    assert cause_of(2.0, 2.0, 10.0) == "step"  # 0.2 ms -> 2 ms of a 10 ms growth
    assert cause_of(1.0, 2.0, 2.0) == "step"
