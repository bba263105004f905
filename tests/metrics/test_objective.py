"""The objective without a configured metric: an evaluation that records no loss is said once, with the fix."""
from __future__ import annotations

import logging

from msbridge.metrics.objective import Objective
from msbridge.sinks.base import Record


def _said(caplog):
    return [r.getMessage() for r in caplog.records if "but no loss" in r.getMessage()]


def test_an_evaluation_without_a_loss_is_said_once_with_the_setting_that_compares_on_it(caplog):
    objective = Objective(None, "min")
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        for step in range(1, 4):  # training, then an evaluation of accuracy only at each step
            objective.observe([Record(step, 0, 0.0, {"train/global_loss": 2.0 / step}),
                               Record(step, 0, 0.0, {"eval/accuracy": 0.5, "eval/samples": 64.0})])
    assert objective.metric == "train/global_loss"
    said = _said(caplog)
    assert len(said) == 1 and "records eval/accuracy but no loss" in said[0]
    assert "objective: {metric: eval/accuracy, mode: max}" in said[0]


def test_nothing_is_said_when_the_evaluation_has_a_loss_or_there_is_none(caplog):
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        with_loss, without_eval = Objective(None, "min"), Objective(None, "min")
        with_loss.observe([Record(1, 0, 0.0, {"train/loss": 2.0, "eval/loss": 1.5, "eval/accuracy": 0.5})])
        without_eval.observe([Record(1, 0, 0.0, {"train/loss": 2.0})])
    assert with_loss.metric == "eval/loss" and without_eval.metric == "train/loss"
    assert _said(caplog) == []
