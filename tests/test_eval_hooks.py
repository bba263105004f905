"""Evaluations recorded where users run them: ``Model.fit`` with a validation set, ``Model.eval`` beside
``Model.train``, ``msbridge.track``'s ``run.eval``; a metric given at some steps only stays sparse in every sink;
steps that go backwards are refused and counted; the run's objective. Real MindSpore on CPU, real sinks read
back with each tracker's own reader."""
from __future__ import annotations

import json
from pathlib import Path

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model
from mlflow.tracking import MlflowClient

import msbridge
from helpers.mlflow_reads import only_run
from helpers.sink_reads import every_sink, jsonl_series
from helpers.training import regression_data
from msbridge import BridgeMonitor
from msbridge.adapters.mlflow_tracker.run.view import BEST_MARK, BEST_TAG, OBJECTIVE_TAG
from msbridge.names import EVAL_LOSS_MINDSPORE, LOSS
from msbridge.sinks.runlog import read_run

ALL_SINKS = ["jsonl", "tensorboard", "mindinsight", "mlflow"]
EPOCHS, STEPS = 3, 10


def _config(tmp_path, experiment, **extra):
    return {"experiment": experiment, "run_name": "r", "experiment_dir": str(tmp_path / experiment),
            "flush_steps": 4, "sinks": ALL_SINKS, **extra}


def _model():
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    return Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01), metrics={"loss": nn.Loss(), "mae": nn.MAE()})


def _run_json(run_dir):
    return json.loads((Path(run_dir) / "run.json").read_text())


class Seen(Callback):
    """MindSpore's own view of the run: the train steps and the eval_results it hands callbacks."""

    def __init__(self):
        self.steps, self.results = [], []

    def on_train_step_end(self, run_context):
        self.steps.append(int(run_context.original_args().cur_step_num))

    def on_eval_end(self, run_context):
        self.results.append(dict(run_context.original_args().eval_results))


@pytest.mark.slow
def test_model_fit_with_a_validation_set_records_every_step_and_every_evaluation(tmp_path):
    monitor = BridgeMonitor(_config(tmp_path, "fit"), progress=False)
    seen = Seen()
    _model().fit(EPOCHS, regression_data(STEPS), valid_dataset=regression_data(3, seed=1), valid_frequency=1,
                 callbacks=[monitor, seen], dataset_sink_mode=False)
    assert seen.steps == list(range(1, EPOCHS * STEPS + 1)) and len(seen.results) == EPOCHS
    evals = [STEPS * (e + 1) for e in range(EPOCHS)]
    for sink, series in every_sink(tmp_path / "fit", "fit", "r", LOSS).items():
        assert sorted(series) == seen.steps, sink  # every step, also after the first evaluation
    for sink, series in every_sink(tmp_path / "fit", "fit", "r", "eval/loss").items():
        assert sorted(series) == evals, sink  # each evaluation once, at the step it ran, nothing between
        assert [series[s] for s in evals] == pytest.approx([r["loss"] for r in seen.results], rel=1e-6), sink
    mae = jsonl_series(tmp_path / "fit" / "r", "eval/mae")
    assert [mae[s] for s in evals] == pytest.approx([r["mae"] for r in seen.results], rel=1e-6)
    outcome = _run_json(monitor.run_dir)["outcome"]
    assert outcome["status"] == "FINISHED" and outcome["steps recorded"] == EPOCHS * STEPS
    assert outcome["objective"]["metric"] == "eval/loss"


@pytest.mark.slow
def test_model_eval_beside_model_train_is_recorded_at_the_epochs_end(tmp_path):
    cfg = _config(tmp_path, "beside", sinks=["jsonl"])
    monitor = BridgeMonitor(cfg, progress=False)
    model, valid = _model(), regression_data(3, seed=1)

    class Validate(Callback):  # a user's callback: Model.eval at each epoch's end, with the monitor
        def on_train_epoch_end(self, run_context):
            model.eval(valid, callbacks=[monitor], dataset_sink_mode=False)

    model.train(2, regression_data(STEPS), callbacks=[monitor, Validate()], dataset_sink_mode=False)
    log = read_run(monitor.run_dir).ranks[0]
    assert [s for s, _ in log.series(LOSS)] == list(range(1, 2 * STEPS + 1))
    assert [s for s, _ in log.series("eval/loss")] == [STEPS, 2 * STEPS]
    assert _run_json(monitor.run_dir)["outcome"]["status"] == "FINISHED"


def test_a_metric_given_every_fifth_step_is_two_points_in_every_sink(tmp_path):
    with msbridge.track(_config(tmp_path, "sparse"), progress=False) as run:
        for step in range(1, 11):
            run.step(loss=1.0 / step, **({"eval_acc": step / 10} if step % 5 == 0 else {}))
        run.eval(loss=0.5, accuracy=0.9, samples=64)
    for sink, series in every_sink(tmp_path / "sparse", "sparse", "r", "train/eval_acc").items():
        assert sorted(series) == [5, 10], sink  # absent at the other steps: no NaN drawn
        assert [series[5], series[10]] == pytest.approx([0.5, 1.0]), sink
    for sink, series in every_sink(tmp_path / "sparse", "sparse", "r", "eval/accuracy").items():
        assert series == {10: pytest.approx(0.9)}, sink
    lines = [json.loads(x) for x in (Path(run.run_dir) / "metrics" / "rank_0.jsonl").read_text().splitlines()]
    assert not any("train/eval_acc" in line.get("nonfinite", []) for line in lines)
    eval_lines = [line for line in lines if "eval/accuracy" in line.get("values", {})]
    assert len(eval_lines) == 1 and eval_lines[0]["step"] == 10  # its own line, after step 10's
    assert eval_lines[0]["values"]["objective/best"] == 0.5


def test_steps_that_go_backwards_are_refused_and_counted(tmp_path, caplog):
    with msbridge.track(_config(tmp_path, "back", sinks=["jsonl"]), progress=False) as run:
        for step in (10, 11, 5, 6, 6, 12):
            run.step(loss=float(step), step=step)
    assert [s for s, _ in read_run(run.run_dir).ranks[0].series(LOSS)] == [10, 11, 12]
    counts = _run_json(run.run_dir)["outcome"]
    assert counts["steps recorded"] == 3 and counts["steps refused"] == 3
    assert sum("is not after step 11" in r.getMessage() for r in caplog.records) == 1  # said once
    assert "steps refused" in (Path(run.run_dir) / "README.md").read_text()


def test_the_best_run_of_a_sweep_is_marked_in_mlflow(tmp_path):
    """Three runs of one experiment: objective/best per run, the ★ tag on the lowest eval/loss only."""
    uri = f"sqlite:///{tmp_path / 'sweep' / 'mlflow.db'}"
    finals = {"a": 0.7, "b": 0.3, "c": 0.5}
    for name, last in finals.items():
        cfg = {**_config(tmp_path, "sweep", sinks=["jsonl", "mlflow"]), "run_name": name}
        with msbridge.track(cfg, progress=False) as run:
            for step in range(1, 21):
                run.step(loss=1.0 / step)
                if step % 10 == 0:
                    run.eval(loss=last + (0.2 if step == 10 else 0.0))
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("sweep").experiment_id])}
    assert set(runs) == set(finals)
    for name, run in runs.items():
        assert run.data.metrics["objective/best"] == pytest.approx(finals[name])
        assert run.data.metrics["objective/best_step"] == 20
        assert run.data.tags[OBJECTIVE_TAG] == "eval/loss (min)"
    assert [n for n, r in runs.items() if r.data.tags.get(BEST_TAG) == BEST_MARK] == ["b"]


def test_a_run_without_evaluation_is_compared_on_its_training_loss(tmp_path):
    with msbridge.track(_config(tmp_path, "trainonly", sinks=["jsonl", "mlflow"]), progress=False) as run:
        for step in range(1, 13):
            run.step(loss=abs(step - 8) + 1.0)
    best = jsonl_series(Path(run.run_dir), "objective/best")
    assert best and max(best) == 12 and best[12] == 1.0  # at flushes, up to the last step
    client = MlflowClient(f"sqlite:///{tmp_path / 'trainonly' / 'mlflow.db'}")
    mlrun = only_run(client, "trainonly")
    assert mlrun.data.metrics["objective/best_step"] == 8 and mlrun.data.metrics["objective/final"] == 5.0
    assert mlrun.data.tags[OBJECTIVE_TAG] == "train/global_loss (min)"


def test_the_first_evaluation_restates_the_objective_at_its_step(tmp_path):
    """A flush at step 8 gives the training-loss objective; the evaluation at step 8 restates it as eval/loss:
    both reach every sink, the evaluation's last, and a strict read of the log accepts the file."""
    with msbridge.track(_config(tmp_path, "switch", flush_steps=8), progress=False) as run:
        for step in range(1, 9):
            run.step(loss=2.0)
        run.monitor.flush()
        run.eval(loss=0.25)
    lines = [r for r in read_run(run.run_dir, strict=True).ranks[0].records if "objective/best" in r.values]
    assert [(r.step, r.values["objective/best"]) for r in lines] == [(8, 2.0), (8, 0.25)]
    mlrun = only_run(MlflowClient(f"sqlite:///{tmp_path / 'switch' / 'mlflow.db'}"), "switch")
    assert mlrun.data.metrics["objective/best"] == 0.25 and mlrun.data.tags[OBJECTIVE_TAG] == "eval/loss (min)"


def test_eval_plateau_stops_the_run_early_at_the_evaluation_that_ran_out_its_patience(tmp_path):
    cfg = _config(tmp_path, "plateau", sinks=["jsonl"], health={"warmup_steps": 0, "eval_plateau": {"patience": 2, "action": "stop"}})
    stopped_at = None
    with msbridge.track(cfg, progress=False) as run:
        for step in range(1, 61):
            run.step(loss=1.0)
            if step % 10 == 0:
                run.eval(loss={10: 0.5, 20: 0.6, 30: 0.7, 40: 0.4}.get(step, 0.3))
            if run.should_stop:
                stopped_at = step
                break
    assert stopped_at == 30  # 0.6 and 0.7: two evaluations without improvement on 0.5
    anomalies = [e for e in read_run(run.run_dir).ranks[0].events if e.kind == "anomaly"]
    assert [(e.step, e.detail["check"]) for e in anomalies] == [(30, "eval_plateau")]
    assert run.outcome.status == "FINISHED"


def _short_last_batch(samples=20, batch=8):
    """A validation set of 8, 8 and 4 samples, and its arrays: a whole-set loss is not the mean of batch means."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(samples, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, 1))).astype(np.float32)
    return mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=False), x, y


class WholeSet(Callback):
    """The reference: the validation set's MSE from the Dense weights in numpy at each evaluation's end (in
    Model.fit) or each epoch's end (after a callback that evaluated), and MindSpore's own results."""

    def __init__(self, net, x, y):
        self.net, self.x, self.y, self.mse, self.results = net, x, y, [], []

    def measure(self):
        w, b = self.net.weight.asnumpy(), self.net.bias.asnumpy()
        self.mse.append(float(np.mean((self.x @ w.T + b - self.y) ** 2, dtype=np.float64)))

    def on_eval_end(self, run_context):
        self.measure()
        self.results.append(dict(run_context.original_args().eval_results))


@pytest.mark.slow
@pytest.mark.parametrize("metrics, mindspore_key", [({"mae": nn.MAE()}, "eval_loss"), ({"loss": nn.Loss()}, "loss")],
                         ids=["fit-eval_loss", "fit-Loss-metric"])
def test_model_fit_records_the_whole_validation_sets_loss_beside_mindsporess_own(tmp_path, metrics, mindspore_key):
    """Model.fit's eval_loss is the last batch's; nn.Loss the plain mean of 8-, 8- and 4-sample batch means: the
    recorded eval/loss is the 20 samples' mean, and MindSpore's value is kept as eval/loss_mindspore."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01), metrics=metrics)
    valid, x, y = _short_last_batch()
    monitor, whole = BridgeMonitor(_config(tmp_path, "whole", sinks=["jsonl"]), progress=False), WholeSet(net, x, y)
    model.fit(EPOCHS, regression_data(STEPS), valid_dataset=valid, valid_frequency=1, callbacks=[monitor, whole],
              dataset_sink_mode=False)
    evals = [STEPS * (e + 1) for e in range(EPOCHS)]
    loss = jsonl_series(tmp_path / "whole" / "r", "eval/loss")
    own = jsonl_series(tmp_path / "whole" / "r", EVAL_LOSS_MINDSPORE)
    assert sorted(loss) == evals and sorted(own) == evals  # each evaluation, both values
    assert [loss[s] for s in evals] == pytest.approx(whole.mse, rel=1e-5)
    assert [own[s] for s in evals] == pytest.approx([float(r[mindspore_key]) for r in whole.results], rel=1e-6)
    assert all(abs(own[s] - loss[s]) > 1e-3 * loss[s] for s in evals)  # they differ here: both are worth keeping


class TutorialEvalCallBack(Callback):
    """MindSpore's tutorial EvalCallBack, as written there: ``self.model.eval(...)`` with no callbacks, in the
    old-style ``epoch_end``."""

    def __init__(self, model, eval_dataset, eval_per_epoch, epochs_per_eval):
        super().__init__()
        self.model, self.eval_dataset = model, eval_dataset
        self.eval_per_epoch, self.epochs_per_eval = eval_per_epoch, epochs_per_eval

    def epoch_end(self, run_context):
        cur_epoch = run_context.original_args().cur_epoch_num
        if cur_epoch % self.eval_per_epoch == 0:
            result = self.model.eval(self.eval_dataset, dataset_sink_mode=False)
            self.epochs_per_eval["epoch"].append(cur_epoch)
            self.epochs_per_eval["loss"].append(result["loss"])


@pytest.mark.slow
def test_a_tutorial_eval_callback_without_the_monitor_is_recorded(tmp_path, caplog):
    """Five evaluations of model.eval(ds) with no callbacks=[monitor]: each recorded at its epoch's last step,
    the whole set's loss (numpy, from the weights) beside nn.Loss's mean of batch means; the objective follows
    eval/loss; after training model.eval is MindSpore's own again."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01), metrics={"loss": nn.Loss()})
    valid, x, y = _short_last_batch()
    seen, whole = {"epoch": [], "loss": []}, WholeSet(net, x, y)

    class Reference(Callback):  # after the tutorial's callback: the weights it evaluated
        def on_train_epoch_end(self, run_context):
            whole.measure()

    monitor = BridgeMonitor(_config(tmp_path, "tutorial", objective={"metric": "eval/loss"}), progress=False)
    with caplog.at_level("WARNING", "msbridge"):
        model.train(5, regression_data(STEPS), callbacks=[monitor, TutorialEvalCallBack(model, valid, 1, seen),
                                                          Reference()], dataset_sink_mode=False)
    assert not [r for r in caplog.records if "got no value" in r.getMessage()]
    assert seen["epoch"] == [1, 2, 3, 4, 5]
    evals = [STEPS * e for e in seen["epoch"]]
    for sink, series in every_sink(tmp_path / "tutorial", "tutorial", "r", "eval/loss").items():
        assert sorted(series) == evals, sink
    loss = jsonl_series(tmp_path / "tutorial" / "r", "eval/loss")
    own = jsonl_series(tmp_path / "tutorial" / "r", EVAL_LOSS_MINDSPORE)
    assert sorted(own) == evals and [own[s] for s in evals] == pytest.approx(seen["loss"], rel=1e-6)
    assert [loss[s] for s in evals] == pytest.approx(whole.mse, rel=1e-5)
    samples = jsonl_series(tmp_path / "tutorial" / "r", "eval/samples")
    assert [samples[s] for s in evals] == [20.0] * 5
    objective = _run_json(monitor.run_dir)["outcome"]["objective"]
    assert objective["metric"] == "eval/loss" and objective["final"] == pytest.approx(loss[50])
    assert "eval" not in vars(model)  # the wrap is off: Model.eval is MindSpore's again
    assert model.eval(valid)["loss"] == pytest.approx(seen["loss"][-1], rel=1e-6)
    assert sorted(jsonl_series(tmp_path / "tutorial" / "r", "eval/loss")) == evals  # nothing after the close


@pytest.mark.slow
def test_an_evaluation_the_monitor_cannot_see_is_said_once_at_the_close_with_the_fix(tmp_path, caplog):
    """A second Model on the same network, reached through a closure: its evaluations are not recorded, and the
    named objective that never got a value says so once, with the call that records them."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    scorer, valid, scores = Model(net, nn.MSELoss(), metrics={"loss": nn.Loss()}), regression_data(3, seed=1), []

    class Unseen(Callback):
        def on_train_epoch_end(self, run_context):
            scores.append(scorer.eval(valid)["loss"])

    cfg = _config(tmp_path, "unseen", sinks=["jsonl"], objective={"metric": "eval/loss"})
    monitor = BridgeMonitor(cfg, progress=False)
    with caplog.at_level("WARNING", "msbridge"):
        model.train(2, regression_data(STEPS), callbacks=[monitor, Unseen()], dataset_sink_mode=False)
    assert len(scores) == 2 and jsonl_series(tmp_path / "unseen" / "r", "eval/loss") == {}
    said = [r.getMessage() for r in caplog.records if "got no value" in r.getMessage()]
    assert len(said) == 1 and "the objective eval/loss got no value" in said[0]
    assert "model.eval(valid, callbacks=[monitor])" in said[0]
