"""Each detector's rule, pinned down on series where the right answer is known by hand.

The same detectors run on real training in ``test_health_training.py``; the
``health`` section that configures them is tested in ``test_health_spec.py``.
"""
from __future__ import annotations

import numpy as np
import pytest
from plateau_oracle import first_plateau

from msbridge.health.detectors import StepView
from msbridge.health.detectors.grad_norm_spike import GradNormSpike
from msbridge.health.detectors.loss_spike import LossSpike
from msbridge.health.detectors.nonfinite import NonFinite
from msbridge.health.detectors.plateau import Plateau
from msbridge.health.detectors.throughput_drop import ThroughputDrop


def test_nonfinite_reports_the_first_step_of_each_episode_and_ignores_a_loss_scaler_overflow():
    check = NonFinite()
    series = [(1, 1.0, 1.0, False), (2, float("nan"), 1.0, False), (3, float("nan"), float("nan"), False),
              (4, 1.0, 1.0, False), (5, 1.0, float("inf"), True), (6, 1.0, float("inf"), False)]
    views = [StepView(s, loss, g, loss_scale=1024.0 if ovf else None, overflow=ovf) for s, loss, g, ovf in series]
    fired = [(v.step, f.detail["nonfinite"]) for v in views for f in [check.observe(v)] if f]
    assert fired == [(2, ["train/loss"]), (6, ["train/grad_norm"])]
    assert StepView(7, 1.0, float("inf"), overflow=True).nonfinite == ["train/grad_norm"], "no loss scaler: an anomaly"


def test_grad_norm_spike_is_silent_in_warmup_then_fires_at_factor_times_the_median():
    spike = GradNormSpike(factor=4.0, window=20, warmup_steps=30)
    norms = [1.0 + 0.01 * (i % 5) for i in range(60)]
    norms[10] = 50.0   # inside warm-up: never reported
    norms[39] = 4.0    # under 4 x median (1.02): normal
    norms[44] = 4.2    # over it: a spike at step 45
    fired = [f for step, g in enumerate(norms, 1) for f in [spike.observe(StepView(step, grad_norm=g))] if f]
    assert [f.step for f in fired] == [45]
    assert fired[0].detail["threshold"] == pytest.approx(4 * 1.02)


def test_grad_norm_absolute_threshold_needs_count_steps_in_a_row():
    spike = GradNormSpike(threshold=2.0, count=3, warmup_steps=0)
    norms = [1, 3, 3, 1, 3, 3, 3, 3, 1]
    fired = [f for step, g in enumerate(norms, 1) for f in [spike.observe(StepView(step, grad_norm=float(g)))] if f]
    assert [(f.step, f.detail["since_step"]) for f in fired] == [(7, 5)]


def test_loss_spike_reports_spike_and_recovery_steps():
    rng = np.random.default_rng(0)
    loss = list(2.0 + 0.01 * rng.standard_normal(80))
    loss[50:54] = [4.0, 3.0, 2.5, 2.2]  # spike at step 51, back near 2.0 at step 55
    check = LossSpike(window=30, sigmas=6.0, recover_sigmas=2.0, min_rise=0.05, warmup_steps=20)
    fired = [f for step, v in enumerate(loss, 1) for f in [check.observe(StepView(step, loss=v))] if f]
    assert [(f.kind, f.step) for f in fired] == [("anomaly", 51), ("recovery", 55)]
    assert fired[1].detail["spike_step"] == 51 and fired[1].detail["peak"] == 4.0


def test_plateau_uses_the_smoothed_loss_with_patience_and_min_delta():
    loss = [1.0 / (1 + 0.2 * i) for i in range(30)] + [0.15] * 40
    plateau = Plateau(patience=10, min_delta=1e-3, ema_decay=0.8, warmup_steps=5)
    fired = [f for step, v in enumerate(loss, 1) for f in [plateau.observe(StepView(step, loss=v))] if f]
    expected = first_plateau(loss, decay=0.8, warmup=5, patience=10)
    assert [f.step for f in fired] == [expected] and expected > 40


def test_throughput_drop_against_the_post_warmup_baseline():
    rates = [50.0] * 10 + [100.0] * 30 + [40.0] * 20   # slow warm-up, steady 100/s, then 40/s from step 41
    drop = ThroughputDrop(baseline_steps=10, window=5, factor=0.5, warmup_steps=10)
    fired = [f for step, r in enumerate(rates, 1) for f in [drop.observe(StepView(step, samples_per_s=r))] if f]
    assert [f.step for f in fired] == [43] and fired[0].detail["baseline"] == 100.0


def test_throughput_drop_falls_back_to_steps_per_second_from_the_step_time():
    times = [0.01] * 30 + [0.05] * 10   # 100 steps/s, then 20 steps/s from step 31
    drop = ThroughputDrop(baseline_steps=10, window=5, factor=0.5, warmup_steps=5)
    fired = [f for step, t in enumerate(times, 1) for f in [drop.observe(StepView(step, step_time_s=t))] if f]
    assert [f.step for f in fired] == [33] and fired[0].detail["unit"] == "steps/s"
    assert fired[0].detail["baseline"] == pytest.approx(100.0)
