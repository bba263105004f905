"""The overhead budget: the flush window widens when the monitor's own time is over budget (functional, not timed)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from helpers.runs import monitor
from helpers.training import OutputRecorder, train_regression

from msbridge.capture.budget import OverheadBudget
from msbridge.capture.train_step import TrainStep
from msbridge.sinks.runlog import read_run


def window(share, steps=10, step_s=0.01):
    return np.full(steps, share * step_s), np.full(steps, step_s)


def test_median_of_three_windows_decides_and_one_slow_flush_does_not():
    budget = OverheadBudget(0.01, flush_steps=100, flush_seconds=10.0, max_flush_steps=1000)
    for share in (0.002, 0.5, 0.002, 0.002, 0.3, 0.002):  # isolated slow windows (first flush, a GC pause)
        budget.observe(*window(share))
    assert budget.flush_steps == 100 and not budget.warned


def test_over_budget_doubles_the_window_up_to_the_cap_and_warns_once_naming_the_top_cost(caplog):
    budget = OverheadBudget(0.01, flush_steps=100, flush_seconds=10.0, max_flush_steps=300)
    with caplog.at_level(logging.INFO, logger="msbridge"):
        for _ in range(3):
            budget.add("drain", 0.0001)
            budget.add("records", 0.0030)
            budget.add("submit", 0.0001)
            budget.observe(*window(0.05))
        assert (budget.flush_steps, budget.flush_seconds) == (200, 20.0)
        for _ in range(6):
            budget.observe(*window(0.05))
    assert budget.flush_steps == 300, "doubling stops at what the buffer holds"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "5.00% of the step time" in warnings[0] and "from 100 to 200 steps" in warnings[0]
    assert "Largest cost: record building" in warnings[0]
    assert not budget.active, "at the cap, with nothing left to try, it stops measuring"


def test_the_per_step_hook_is_named_when_it_dominates(caplog):
    budget = OverheadBudget(0.01, flush_steps=10, flush_seconds=1.0, max_flush_steps=10)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        for _ in range(3):
            budget.add("drain", 1e-5)
            budget.observe(*window(0.02))
    assert "flush window stays at 10 steps (the buffer holds 10 steps)" in caplog.text
    assert "Largest cost: per-step hook" in caplog.text


def test_ranks_that_reduce_together_only_warn():
    budget = OverheadBudget(0.01, flush_steps=10, flush_seconds=1.0, max_flush_steps=1000, adapt=False)
    for _ in range(3):
        budget.observe(*window(0.5))
    assert budget.flush_steps == 10 and budget.warned


def _monitor(tmp_path, **overrides):
    return monitor(tmp_path, **{"flush_steps": 2, "flush_seconds": 1000.0, **overrides})


@pytest.mark.slow
@pytest.mark.parametrize("ring", [False, True])
def test_monitor_widens_its_flush_window_over_budget_and_still_records_every_step(tmp_path, caplog, monkeypatch, ring):
    from msbridge.capture.host_buffer import StepBuffer
    from msbridge.capture.ring_reader import RingReader

    drains = []
    for cls in (StepBuffer, RingReader):
        original = cls.drain

        def counting(self, lr_at=None, _original=original):
            drains.append(len(self))
            return _original(self, lr_at)
        monkeypatch.setattr(cls, "drain", counting)
    mon, ref = _monitor(tmp_path, overhead_budget=1e-6), OutputRecorder()
    cell = (lambda n, o: TrainStep(n, o, ring_size=13)) if ring else None
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train_regression([mon, ref], steps=80, train_cell=cell)
    widest = 12 if ring else 16  # ring: 13 rows - 1 step per call; host buffer: 8 x flush_steps
    assert mon._budget.flush_steps == widest
    assert max(drains) == widest and drains[:3] == [2, 2, 2], "starts at flush_steps, doubles to the cap"
    said = [r.getMessage() for r in caplog.records if "overhead_budget" in r.getMessage()]
    assert len(said) == 1 and "Largest cost:" in said[0]
    log = read_run(mon.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 81))
    np.testing.assert_allclose([v for _, v in log.series("train/loss")], ref.losses, rtol=1e-6)


def test_within_budget_the_step_path_only_appends(tmp_path, monkeypatch):
    from msbridge.capture.host_buffer import StepBuffer

    drains = []
    original = StepBuffer.drain
    monkeypatch.setattr(StepBuffer, "drain", lambda self, lr_at=None: drains.append(len(self)) or original(self, lr_at))
    mon = _monitor(tmp_path, flush_steps=10, overhead_budget=0.99)
    train_regression([mon], steps=35)
    assert drains == [10, 10, 10, 5], "one drain per flush window plus the final one, none on other steps"
    assert mon._budget.flush_steps == 10


def test_lr_schedule_time_is_its_own_phase_not_the_drains():
    budget = OverheadBudget(0.01, flush_steps=10, flush_seconds=1.0, max_flush_steps=10)

    def slow_schedule(steps):
        time.sleep(0.02)
        return steps * 0.1

    start = time.perf_counter()
    values = budget.timed_lr(slow_schedule)(np.arange(3))
    drain = time.perf_counter() - start + 0.001  # the drain's wall time includes the schedule's
    budget.add("drain", drain)
    np.testing.assert_allclose(values, [0.0, 0.1, 0.2])
    costs = budget.costs()
    lr = costs["learning-rate schedule evaluation"]
    assert 0.02 <= lr <= drain - 0.001  # the schedule's own time, measured inside the drain
    assert costs["drain (device->host copy)"] == pytest.approx(drain - lr)  # the drain without it
    assert budget.timed_lr(None) is None


def test_steps_that_do_no_work_are_not_judged():
    budget = OverheadBudget(0.01, flush_steps=10, flush_seconds=1.0, max_flush_steps=1000)
    for _ in range(6):  # a track loop with nothing in it: 5 us steps, the monitor's 20 us a step "400 %"
        budget.observe(*window(4.0, step_s=5e-6))
    assert (budget.flush_steps, budget.warned) == (10, False)
    for _ in range(3):  # the same share of a 2 ms step is judged
        budget.observe(*window(4.0, step_s=2e-3))
    assert (budget.flush_steps, budget.warned) == (20, True)
