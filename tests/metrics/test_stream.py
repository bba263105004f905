"""``Stream``: one flushed window -> one ``Record`` per step, with throughput, the smoothed loss, the global
metrics on rank 0, the metric switches, and what was read at the flush or sampled at wall-clock times."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from msbridge import names
from msbridge.capture.window import Window
from msbridge.metrics.stream import Stream
from msbridge.names import GLOBAL_LOSS, GRAD_NORM, LOSS, LOSS_EMA, LOSS_SCALE, LR, OVERFLOW

T0 = 1_764_600_000.0  # the wall clock of the window's first step end (2025-12-01)


def window(losses, first_step=1, step_s=0.02, wall=True, **extra) -> Window:
    """Steps ``first_step ...`` with ``losses``; every other scalar is a simple function of the step."""
    n = len(losses)
    steps = np.arange(first_step, first_step + n)
    scalars = {LOSS: np.asarray(losses, dtype=np.float32), GRAD_NORM: steps * 0.5, LR: np.full(n, 1e-3),
               LOSS_SCALE: np.full(n, 1024.0), OVERFLOW: np.zeros(n)}
    return Window(steps=steps, epochs=(steps - 1) // 4, wall_time=T0 + steps * step_s if wall else np.zeros(n),
                  step_time_s=np.full(n, step_s), monitor_s=np.full(n, 2e-5), scalars=scalars, **extra)


def ema(values, decay=0.9, start=None):
    """The EMA written out step by step, skipping non-finite values (the oracle for ``train/loss_ema``)."""
    out, level = [], start
    for v in values:
        if math.isfinite(v):
            level = v if level is None else decay * level + (1 - decay) * v
        out.append(math.nan if level is None else level)
    return out


def test_one_record_per_step_with_every_metric_as_a_float():
    stream = Stream(rank=3, batch_size=8, seq_length=32, is_global=False)
    records = stream.records(window([2.0, 1.5, 1.25, 1.0]))
    assert [r.step for r in records] == [1, 2, 3, 4]
    assert {r.rank for r in records} == {3}
    assert [r.time for r in records] == pytest.approx([T0 + 0.02 * s for s in (1, 2, 3, 4)])
    first = records[0].values
    assert set(first) == {LOSS, LOSS_EMA, GRAD_NORM, LR, LOSS_SCALE, OVERFLOW, names.EPOCH, names.STEP_TIME,
                          names.SAMPLES_PER_S, names.TOKENS_PER_S, names.MONITOR_OVERHEAD}
    assert all(type(v) is float for r in records for v in r.values.values())  # sinks see floats only
    assert [r.values[LOSS] for r in records] == [2.0, 1.5, 1.25, 1.0]  # exact in float32
    assert [r.values[GRAD_NORM] for r in records] == [0.5, 1.0, 1.5, 2.0]
    assert [r.values[names.EPOCH] for r in records] == [0.0, 0.0, 0.0, 0.0]
    assert first[names.STEP_TIME] == pytest.approx(20.0)  # ms
    assert first[names.SAMPLES_PER_S] == pytest.approx(8 / 0.02)
    assert first[names.TOKENS_PER_S] == pytest.approx(8 / 0.02 * 32)
    assert first[names.MONITOR_OVERHEAD] == pytest.approx(2e-5 / 0.02)
    assert first[LOSS_SCALE] == 1024.0 and first[OVERFLOW] == 0.0 and first[LR] == pytest.approx(1e-3)


def test_the_smoothed_loss_skips_nonfinite_steps_and_carries_across_windows():
    stream = Stream(rank=0, batch_size=8, ema_decay=0.9)
    first = stream.records(window([math.nan, 4.0, math.inf, 2.0]))
    second = stream.records(window([1.0, 3.0], first_step=5))
    got = [r.values[LOSS_EMA] for r in first + second]
    want = ema([math.nan, 4.0, math.inf, 2.0, 1.0, 3.0])
    assert math.isnan(got[0]) and math.isnan(want[0])  # no finite loss yet: no level either
    assert got[1:] == pytest.approx(want[1:], rel=1e-12)
    assert got[1:3] == [4.0, 4.0]  # the inf step keeps the level it found
    assert math.isnan(first[0].values[LOSS]) and math.isinf(first[2].values[LOSS])  # the loss itself is kept as is


def test_rank_0_adds_the_global_metrics_other_ranks_and_the_switch_leave_them_out():
    globals_ = {GLOBAL_LOSS: np.array([1.1, 0.9])}
    for is_global, switches, present in ((True, {}, True), (False, {}, False), (True, {"global_loss": False}, False)):
        stream = Stream(rank=0, batch_size=4, is_global=is_global, switches=switches)
        records = stream.records(window([1.0, 0.8], global_scalars=dict(globals_)))
        assert (GLOBAL_LOSS in records[0].values) is present, (is_global, switches)
        if present:
            assert [r.values[GLOBAL_LOSS] for r in records] == pytest.approx([1.1, 0.9])


@pytest.mark.parametrize("switch, gone", [
    ("local_loss", {LOSS, LOSS_EMA}),
    ("grad_norm", {GRAD_NORM}),
    ("learning_rate", {LR}),
    ("throughput", {names.STEP_TIME, names.SAMPLES_PER_S, names.TOKENS_PER_S, names.MONITOR_OVERHEAD}),
])
def test_a_switched_off_metric_is_left_out_and_nothing_else(switch, gone):
    full = set(Stream(0, 8, 32).records(window([1.0]))[0].values)
    values = Stream(0, 8, 32, switches={switch: False}).records(window([1.0]))[0].values
    assert set(values) == full - gone


def test_throughput_without_a_batch_size_or_a_sequence_length():
    no_batch = Stream(0, batch_size=None).records(window([1.0]))[0].values
    assert names.SAMPLES_PER_S not in no_batch and names.TOKENS_PER_S not in no_batch
    assert no_batch[names.STEP_TIME] == pytest.approx(20.0) and names.MONITOR_OVERHEAD in no_batch
    no_seq = Stream(0, batch_size=8).records(window([1.0]))[0].values
    assert no_seq[names.SAMPLES_PER_S] == pytest.approx(400.0) and names.TOKENS_PER_S not in no_seq
    zero = Stream(0, batch_size=8).records(window([1.0], step_s=0.0))[0].values  # a step the clock did not see
    assert math.isfinite(zero[names.SAMPLES_PER_S]) and math.isfinite(zero[names.MONITOR_OVERHEAD])


def test_steps_without_a_wall_time_get_the_flush_time():
    before = time.time()
    records = Stream(0, 8).records(window([1.0, 1.0], wall=False))
    after = time.time()
    assert all(before <= r.time <= after for r in records)


def test_flush_state_lands_on_the_last_step_and_timed_samples_on_the_step_that_ended_before_them():
    timed = [(T0 + 0.02 * 2 + 0.001, {"system/npu_power_w": 90.0}),  # just after step 2 ended
             (T0 - 5.0, {"system/npu_temperature_c": 40.0})]  # before the window: its first step
    series = {"grad_norm/dense.weight": np.array([0.1, 0.2, 0.3])}
    records = Stream(0, 8).records(window([1.0, 1.0, 1.0], at_flush={LOSS_SCALE: 512.0}, timed=timed,
                                          series=series))
    assert [r.values[LOSS_SCALE] for r in records] == [1024.0, 1024.0, 512.0]
    assert [r.step for r in records if "system/npu_power_w" in r.values] == [2]
    assert [r.step for r in records if "system/npu_temperature_c" in r.values] == [1]
    assert [r.values["grad_norm/dense.weight"] for r in records] == pytest.approx([0.1, 0.2, 0.3])


def test_an_empty_window_gives_no_records():
    empty = Window(steps=np.arange(0), epochs=np.zeros(0), wall_time=np.zeros(0), step_time_s=np.zeros(0),
                   monitor_s=np.zeros(0), scalars={LOSS: np.zeros(0)}, at_flush={LOSS_SCALE: 1.0},
                   timed=[(T0, {"system/npu_power_w": 1.0})])
    assert Stream(0, 8).records(empty) == []
