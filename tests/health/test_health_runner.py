"""The runner speaks only the detector protocol: a check registered in ``DETECTORS`` alone is
configured, validated, run on every step and acted on, with no change to ``health/runner.py``."""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
import pytest

from msbridge import ConfigError
from msbridge.capture.window import Window
from msbridge.health.detectors import DETECTORS, Detector, Finding, Option, StepView
from msbridge.health.detectors.base import LOG, STOP
from msbridge.health.runner import NAN_STEPS, SKIPPED_STEPS, Health
from msbridge.health.spec import HealthSpec
from msbridge.names import LOSS, LR, OVERFLOW
from msbridge.sinks.base import FINISHED, Record, RunInfo


class LossAbove(Detector):
    """A check the runner has never heard of: the loss above ``limit``, once per episode."""

    name = "loss_above"
    options = {"limit": Option(float, 5.0, "the loss above this is an anomaly", low=0, low_open=True)}
    default_action = {"debug": STOP, "production": LOG}
    early_stop = True

    def __init__(self, warmup_steps: int = 0, limit: float = 5.0) -> None:
        super().__init__(warmup_steps)
        self.limit = limit
        self.seen = []
        self._above = False

    def observe(self, view: StepView) -> Optional[Finding]:
        self.seen.append(view)
        above = view.step > self.warmup_steps and view.loss is not None and view.loss > self.limit
        started, self._above = above and not self._above, above
        return Finding(self.name, view.step, detail={"loss": view.loss, "lr": view.values[LR]}) if started else None


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(DETECTORS, LossAbove.name, LossAbove)
    return LossAbove


def window_of(losses, overflow=None):
    n = len(losses)
    scalars = {LOSS: np.array(losses, dtype=np.float32)}
    if overflow is not None:
        scalars[OVERFLOW] = np.array(overflow, dtype=np.float32)
    window = Window(steps=np.arange(1, n + 1), epochs=np.ones(n), wall_time=np.zeros(n),
                    step_time_s=np.full(n, 0.01), monitor_s=np.zeros(n), scalars=scalars)
    records = [Record(int(s), 0, 0.0, {LOSS: float(v), LR: 0.1}) for s, v in zip(window.steps, losses)]
    return window, records


def started_with(health, tmp_path, skips_nonfinite=False):
    health.bind(None, skips_nonfinite=skips_nonfinite)
    health.start(RunInfo("id", "r", "e", rank=0, world_size=1, is_global=True, run_dir=str(tmp_path)))
    return health


def test_a_registered_detector_is_validated_from_its_own_declarations(registered):
    assert HealthSpec.parse({}).action("loss_above") == LOG
    assert HealthSpec.parse({"profile": "debug"}).action("loss_above") == STOP
    with pytest.raises(ConfigError) as err:
        HealthSpec.parse({"loss_above": {"limt": 3, "action": "skip"}, "loss_abov": {}})
    assert err.value.problems == [
        "health.loss_abov: unknown key; did you mean 'loss_above'?",
        "health.loss_above.limt: unknown option; did you mean 'limit'?",
        "health.loss_above.action: skip is only for nonfinite (msbridge.TrainStep(skip_nonfinite=True) drops a "
        "non-finite update inside the graph); use log, dump, stop or checkpoint_and_stop",
    ]
    assert "health.loss_above.limit: expected a number > 0, got 0" in pytest.raises(
        ConfigError, HealthSpec.parse, {"loss_above": {"limit": 0}}).value.problems


def test_the_runner_runs_and_acts_on_a_detector_it_has_never_heard_of(registered, tmp_path):
    spec = HealthSpec.parse({"warmup_steps": 1, "loss_above": {"limit": 4.0, "action": "stop"},
                             "nonfinite": False, "throughput_drop": False})
    health = started_with(Health(spec), tmp_path)
    assert health.every_step, "a stop action on the new check makes health see each step"
    window, records = window_of([9.0, 1.0, 1.0, 8.0, 9.0, 1.0], overflow=[0, 0, 1, 0, 0, 0])
    verdict = health.check(window, records)

    detector = health._detectors["loss_above"]
    assert [v.step for v in detector.seen] == [1, 2, 3, 4], "steps after the stop are recorded, not judged"
    assert detector.limit == 4.0 and detector.warmup_steps == 1
    assert detector.seen[2].overflow and detector.seen[2].loss_scale is None and detector.seen[3].values[LR] == 0.1
    assert [r.step for r in verdict.records] == [1, 2, 3, 4, 5, 6]
    assert [r.values[SKIPPED_STEPS] for r in verdict.records] == [0, 0, 1, 1, 1, 1]
    assert all(r.values[NAN_STEPS] == 0 for r in verdict.records)

    anomaly, early_stop = verdict.events
    assert (anomaly.kind, anomaly.step, anomaly.detail["check"], anomaly.detail["action"]) == (
        "anomaly", 4, "loss_above", "stop")
    assert anomaly.detail["loss"] == 8.0 and anomaly.detail["lr"] == 0.1
    assert early_stop.kind == "early_stop" and early_stop.step == 4, "the detector declares early_stop"
    assert health.stop.status == FINISHED and health.stop.reason.startswith("loss_above at step 4: loss 8")
    dump = early_stop.detail["dump"]
    assert os.path.basename(dump) == "step000000004-rank0-loss_above"
    assert json.load(open(os.path.join(dump, "anomaly.json")))["detail"] == {"loss": 8.0, "lr": 0.1}


def test_skip_needs_a_cell_that_drops_nonfinite_updates_and_is_counted(tmp_path):
    spec = HealthSpec.parse({"nonfinite": {"action": "skip"}})
    with pytest.raises(ConfigError, match=r"health\.nonfinite\.action: skip needs the train cell"):
        Health(spec).bind(None, skips_nonfinite=False)
    health = started_with(Health(spec), tmp_path, skips_nonfinite=True)
    window, records = window_of([1.0, float("nan"), 1.0], overflow=[0, 1, 0])
    verdict = health.check(window, records)
    assert [(e.kind, e.step) for e in verdict.events] == [("anomaly", 2), ("action", 2)]
    assert verdict.events[1].detail["skipped_steps"] == 1 and health.stop is None
    assert [(r.values[NAN_STEPS], r.values[SKIPPED_STEPS]) for r in verdict.records] == [(0, 0), (1, 1), (1, 1)]
