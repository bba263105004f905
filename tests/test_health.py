"""Health without training: the config schema, each detector's rule, dump limits, the SIGTERM guard.

The same pieces run on real training in ``test_health_training.py``; here each
rule is pinned down on series where the right answer is known by hand.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from plateau_oracle import first_plateau

from msbridge import ConfigError
from msbridge.config.health import HealthSpec
from msbridge.health.checks import GradNormSpike, LossSpike, NonFinite, Plateau, ThroughputDrop
from msbridge.health.dumps import DISK_FULL, QUOTA, RATE_LIMITED, WRITTEN, DumpWriter, directory_size
from msbridge.run.signals import SignalGuard, TrainingInterrupted


# -- schema -------------------------------------------------------------------------------
def test_profiles_set_the_default_actions_and_an_explicit_action_wins():
    production, debug = HealthSpec.parse({}), HealthSpec.parse({"profile": "debug"})
    assert production.action("nonfinite") == "dump" and not production.every_step
    assert debug.action("nonfinite") == "stop" and debug.every_step
    spec = HealthSpec.parse({"profile": "debug", "nonfinite": {"action": "log"}, "plateau": {"check": False}})
    assert spec.action("nonfinite") == "log" and spec.action("plateau") is None and not spec.every_step


def test_every_problem_is_reported_at_once_with_the_nearest_key():
    with pytest.raises(ConfigError) as err:
        HealthSpec.parse({"profil": "debug", "dump_quota_mb": -1,
                          "plateau": {"patiense": 3, "action": "skip"},
                          "grad_norm_spike": {"factor": 0.5, "action": "dumb"},
                          "throughput_drop": {"factor": 1.5}, "loss_spike": 3})
    problems = err.value.problems
    assert "health.profil: unknown key; did you mean 'profile'?" in problems
    assert "health.plateau.patiense: unknown option; did you mean 'patience'?" in problems
    assert any(p.startswith("health.plateau.action: skip is only for nonfinite") for p in problems)
    assert any(p.startswith("health.grad_norm_spike.action:") and "did you mean 'dump'" in p for p in problems)
    assert "health.grad_norm_spike.factor: must be > 1, got 0.5" in problems
    assert "health.throughput_drop.factor: must be < 1, got 1.5" in problems
    assert "health.dump_quota_mb: must be >= 0, got -1" in problems
    assert any(p.startswith("health.loss_spike: expected a mapping") for p in problems)
    assert len(problems) == 8


def test_problems_come_with_their_config_path_for_file_and_line():
    from msbridge.config.health import health_problems

    assert health_problems({"plateau": {"patience": 0}, "warmup_steps": "10"}) == [
        (("health", "warmup_steps"), "expected int, got '10'"),
        (("health", "plateau", "patience"), "must be >= 1, got 0"),
    ]
    assert health_problems({"profile": "debug"}) == [] and health_problems(None) == []


def test_the_seed_yaml_reaches_health_through_the_config_loader(tmp_path):
    from msbridge.config.load import load_config

    path = tmp_path / "seed000.yaml"
    path.write_text(f"""monitor_config:
  dump_path: {tmp_path}/monitor
  interval: 20
  nan_check: True
  exception_dump: True
  skip_nan_step: True
  warmup_steps: 50
  check_for_global_norm: True
  global_norm_spike_threshold: 3.0
  global_norm_spike_count_threshold: 2
""")
    spec = HealthSpec.parse(load_config(str(path)).health)
    assert spec.action("nonfinite") == "skip" and spec.dump_on_anomaly and spec.warmup_steps == 50
    assert spec.dump_dir == f"{tmp_path}/monitor"
    assert spec.checks["grad_norm_spike"]["threshold"] == 3.0 and spec.checks["grad_norm_spike"]["count"] == 2


# -- detectors ----------------------------------------------------------------------------
def test_nonfinite_reports_the_first_step_of_each_episode_and_ignores_a_loss_scaler_overflow():
    check = NonFinite()
    series = [(1, 1.0, 1.0, False), (2, float("nan"), 1.0, False), (3, float("nan"), float("nan"), False),
              (4, 1.0, 1.0, False), (5, 1.0, float("inf"), True), (6, 1.0, float("inf"), False)]
    fired = [(s, f.detail["nonfinite"]) for s, loss, g, ovf in series for f in [check.observe(s, loss, g, ovf)] if f]
    assert fired == [(2, ["train/loss"]), (6, ["train/grad_norm"])]


def test_grad_norm_spike_is_silent_in_warmup_then_fires_at_factor_times_the_median():
    spike = GradNormSpike(factor=4.0, window=20, warmup_steps=30)
    norms = [1.0 + 0.01 * (i % 5) for i in range(60)]
    norms[10] = 50.0   # inside warm-up: never reported
    norms[39] = 4.0    # under 4 x median (1.02): normal
    norms[44] = 4.2    # over it: a spike at step 45
    fired = [f for step, g in enumerate(norms, 1) for f in [spike.observe(step, g)] if f]
    assert [f.step for f in fired] == [45]
    assert fired[0].detail["threshold"] == pytest.approx(4 * 1.02)


def test_grad_norm_absolute_threshold_needs_count_steps_in_a_row():
    spike = GradNormSpike(threshold=2.0, count=3, warmup_steps=0)
    norms = [1, 3, 3, 1, 3, 3, 3, 3, 1]
    fired = [f for step, g in enumerate(norms, 1) for f in [spike.observe(step, float(g))] if f]
    assert [(f.step, f.detail["since_step"]) for f in fired] == [(7, 5)]


def test_loss_spike_reports_spike_and_recovery_steps():
    rng = np.random.default_rng(0)
    loss = list(2.0 + 0.01 * rng.standard_normal(80))
    loss[50:54] = [4.0, 3.0, 2.5, 2.2]  # spike at step 51, back near 2.0 at step 55
    check = LossSpike(window=30, sigmas=6.0, recover_sigmas=2.0, min_rise=0.05, warmup_steps=20)
    fired = [f for step, v in enumerate(loss, 1) for f in [check.observe(step, v)] if f]
    assert [(f.kind, f.step) for f in fired] == [("anomaly", 51), ("recovery", 55)]
    assert fired[1].detail["spike_step"] == 51 and fired[1].detail["peak"] == 4.0


def test_plateau_uses_the_smoothed_loss_with_patience_and_min_delta():
    loss = [1.0 / (1 + 0.2 * i) for i in range(30)] + [0.15] * 40
    plateau = Plateau(patience=10, min_delta=1e-3, ema_decay=0.8, warmup_steps=5)
    fired = [f for step, v in enumerate(loss, 1) for f in [plateau.observe(step, v)] if f]
    expected = first_plateau(loss, decay=0.8, warmup=5, patience=10)
    assert [f.step for f in fired] == [expected] and expected > 40


def test_throughput_drop_against_the_post_warmup_baseline():
    rates = [50.0] * 10 + [100.0] * 30 + [40.0] * 20   # slow warm-up, steady 100/s, then 40/s from step 41
    drop = ThroughputDrop(baseline_steps=10, window=5, factor=0.5, warmup_steps=10)
    fired = [f for step, r in enumerate(rates, 1) for f in [drop.observe(step, r)] if f]
    assert [f.step for f in fired] == [43] and fired[0].detail["baseline"] == 100.0


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
