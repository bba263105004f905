"""The objective without a configured metric: an evaluation that records no loss is said once, with the fix, and
described the same way in docs/metrics.md and docs/configuration.md; on MindSpore's own loops, Model.eval with only
a non-loss metric is that case and Model.fit (its eval_loss) is not."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import mindspore as ms
import pytest
from helpers.training import regression_data
from mindspore import nn
from mindspore.train import Callback, Model

from msbridge import BridgeMonitor
from msbridge.config.value_checks import NO_EVAL_LOSS_TEXT
from msbridge.metrics.objective import Objective
from msbridge.sinks.base import Record

ROOT = Path(__file__).resolve().parents[2]


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


def _flat(text):
    return re.sub(r"\s+", " ", text.replace("`", ""))


def test_both_pages_describe_an_evaluation_without_a_loss_in_the_same_words():
    """configuration.md's objective row is written from NO_EVAL_LOSS_TEXT; metrics.md says the same sentence."""
    for page in ("docs/configuration.md", "docs/metrics.md"):
        assert _flat(NO_EVAL_LOSS_TEXT) in _flat((ROOT / page).read_text(encoding="utf-8")), page
    assert "objective: {metric: eval/accuracy, mode: max}" in _flat(NO_EVAL_LOSS_TEXT)  # the setting the run says


class EvalEachEpoch(Callback):
    """A user's callback: model.eval at each epoch's end, as MindSpore's tutorials write it (no callbacks=)."""

    def __init__(self, model, valid):
        super().__init__()
        self.model, self.valid = model, valid

    def on_train_epoch_end(self, run_context):
        self.model.eval(self.valid, dataset_sink_mode=False)


def _objective_of(tmp_path, name, fit, caplog):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01), metrics={"mae": nn.MAE()})
    monitor = BridgeMonitor({"experiment": "obj", "run_name": name, "experiment_dir": str(tmp_path),
                             "flush_steps": 5, "sinks": ["jsonl"]}, progress=False)
    valid = regression_data(3, seed=1)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        if fit:
            model.fit(2, regression_data(10), valid_dataset=valid, callbacks=[monitor], dataset_sink_mode=False)
        else:
            model.train(2, regression_data(10), callbacks=[monitor, EvalEachEpoch(model, valid)],
                        dataset_sink_mode=False)
    return json.loads((Path(monitor.run_dir) / "run.json").read_text())["outcome"]["objective"]


@pytest.mark.slow
def test_model_eval_with_only_a_non_loss_metric_is_compared_on_training_and_says_so(tmp_path, caplog):
    objective = _objective_of(tmp_path, "eval", False, caplog)
    assert objective["metric"] == "train/global_loss" and objective["best_step"] is not None
    said = _said(caplog)
    assert len(said) == 1 and "records eval/mae but no loss" in said[0]  # two evaluations, said once


@pytest.mark.slow
def test_model_fit_with_the_same_metrics_is_compared_on_its_validation_loss(tmp_path, caplog):
    objective = _objective_of(tmp_path, "fit", True, caplog)
    assert objective["metric"] == "eval/loss" and objective["best_step"] in (10, 20)
    assert _said(caplog) == []
