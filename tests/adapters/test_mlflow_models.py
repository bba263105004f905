"""Each checkpoint MindSpore's ModelCheckpoint saves, and the last healthy weights the health action
``checkpoint_and_stop`` saves, becomes one MLflow 3 LoggedModel of its run, with its step's metrics linked, so
``search_logged_models(order_by=...)`` names the best checkpoint; a replay rebuilds them exactly once. Real
training on CPU, real MLflow on sqlite. (mindformers' CheckpointMonitor: tests/mindformers_bridge/test_do_eval.py.)"""
from __future__ import annotations

import os

import pytest
from helpers.mlflow_reads import only_run
import mindspore as ms
from helpers.training import regression_data, train_regression
from mindspore import nn
from mindspore.train import CheckpointConfig, Model, ModelCheckpoint
from mlflow.tracking import MlflowClient

from msbridge import BridgeMonitor
from msbridge.adapters._mlflow_models import KEY_TAG, best_checkpoint, model_name
from msbridge.cli.main import main
from msbridge.names import LOSS
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS, EVERY = 20, 5


def _train(tmp_path, name, sinks):
    cfg = {"experiment": "ck", "run_name": name, "experiment_dir": str(tmp_path / "ck"), "flush_steps": 4,
           "sinks": sinks}
    monitor = BridgeMonitor(cfg, progress=False)
    saver = ModelCheckpoint("net", str(tmp_path / "ckpt" / name),
                            CheckpointConfig(save_checkpoint_steps=EVERY, keep_checkpoint_max=10))
    train_regression([monitor, saver], steps=STEPS)
    return monitor


def _models(client, experiment_id):
    return client.search_logged_models([experiment_id], max_results=100)


def test_every_modelcheckpoint_file_is_a_logged_model_with_its_steps_metrics(tmp_path):
    monitor = _train(tmp_path, "run.1", ["jsonl", "mlflow"])
    log = read_run(monitor.run_dir).ranks[0]
    events = [e for e in log.events if e.kind == "checkpoint"]
    assert [e.step for e in events] == list(range(EVERY, STEPS + 1, EVERY))
    assert all(os.path.isfile(e.detail["path"]) for e in events)
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    run = only_run(client, "ck")
    models = sorted(_models(client, run.info.experiment_id), key=lambda m: int(m.tags["msbridge.step"]))
    assert [int(m.tags["msbridge.step"]) for m in models] == [e.step for e in events]
    losses = dict(log.series(LOSS))
    for model, event in zip(models, events):
        assert model.name == model_name("run.1", event.step) == f"run-1-step{event.step}"  # MLflow refuses "."
        assert model.source_run_id == run.info.run_id and model.tags["msbridge.health"] == "finite"
        assert model.tags["msbridge.checkpoint.path"] == event.detail["path"]
        assert model.tags["msbridge.checkpoint.source"] == "ModelCheckpoint"
        linked = {m.key: m for m in model.metrics}
        assert linked[LOSS].step == event.step and linked[LOSS].value == pytest.approx(losses[event.step])
        assert client.list_logged_model_artifacts(model.model_id) == []  # link (the default): nothing uploaded
    best = best_checkpoint(client, [run.info.experiment_id], LOSS)
    assert int(best.tags["msbridge.step"]) == min((e.step for e in events), key=lambda s: losses[s])
    assert [m.step for m in client.get_metric_history(run.info.run_id, LOSS)] == list(range(1, STEPS + 1))

    # A replay into the store that has them, twice: not one model more.
    for _ in range(2):
        assert main(["replay", monitor.run_dir, "--to", "mlflow"]) == 0
    assert len(_models(client, run.info.experiment_id)) == len(events)
    assert len({m.tags[KEY_TAG] for m in _models(client, run.info.experiment_id)}) == len(events)


def test_a_run_trained_offline_gets_its_logged_models_from_the_replay(tmp_path):
    monitor = _train(tmp_path, "offline", ["jsonl"])
    store = f"sqlite:///{tmp_path / 'central.db'}"
    assert main(["replay", monitor.run_dir, "--to", "mlflow", "--tracking-uri", store]) == 0
    client = MlflowClient(store)
    run = only_run(client, "ck")
    steps = sorted(int(m.tags["msbridge.step"]) for m in _models(client, run.info.experiment_id))
    assert steps == list(range(EVERY, STEPS + 1, EVERY))


def test_the_last_healthy_weights_are_a_logged_model_tagged_with_the_health_at_their_step(tmp_path):
    cfg = {"experiment": "ck", "run_name": "nan", "experiment_dir": str(tmp_path / "ck"), "flush_steps": 4,
           "sinks": ["jsonl", "mlflow"], "health": {"nonfinite": {"action": "checkpoint_and_stop"}}}
    monitor = BridgeMonitor(cfg, progress=False)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01)).train(
        1, regression_data(STEPS, poison_step=9), callbacks=[monitor], dataset_sink_mode=False)
    [event] = [e for e in read_run(monitor.run_dir).ranks[0].events if e.kind == "checkpoint"]
    assert event.step == 9 and os.path.isfile(event.detail["path"])
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    run = only_run(client, "ck")
    [model] = _models(client, run.info.experiment_id)
    # saved when step 9 turned NaN; the weights, their metrics and their health are step 8's
    assert model.tags["msbridge.step"] == "8" and model.tags["msbridge.checkpoint.saved_at_step"] == "9"
    assert model.name == "nan-step8" and model.tags["msbridge.checkpoint.path"] == event.detail["path"]
    assert model.tags["msbridge.checkpoint.source"] == "host snapshot" and model.tags["msbridge.health"] == "finite"
    linked = {m.key: m for m in model.metrics}
    assert linked[LOSS].step == 8 and linked[LOSS].value == pytest.approx(dict(read_run(
        monitor.run_dir).ranks[0].series(LOSS))[8])
    assert run.info.status == "FAILED"


@pytest.mark.parametrize("mode", ["upload", "off"])
def test_log_checkpoints_uploads_the_file_or_makes_no_model(tmp_path, mode):
    """`log_checkpoints: upload` puts each checkpoint file into its LoggedModel's artifacts (the default `link`
    uploads nothing, above); `off` makes no LoggedModel, and the run's metrics are all there either way."""
    monitor = _train(tmp_path, mode, {"jsonl": {}, "mlflow": {"log_checkpoints": mode}})
    events = [e for e in read_run(monitor.run_dir).ranks[0].events if e.kind == "checkpoint"]
    assert [e.step for e in events] == list(range(EVERY, STEPS + 1, EVERY))  # jsonl has them either way
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    run = only_run(client, "ck")
    assert [m.step for m in client.get_metric_history(run.info.run_id, LOSS)] == list(range(1, STEPS + 1))
    models = _models(client, run.info.experiment_id)
    if mode == "off":
        assert models == []
        return
    assert len(models) == len(events)
    for model in models:
        files = [a.path for a in client.list_logged_model_artifacts(model.model_id)]
        assert files == [os.path.basename(model.tags["msbridge.checkpoint.path"])]
        assert all(a.file_size == os.path.getsize(model.tags["msbridge.checkpoint.path"])
                   for a in client.list_logged_model_artifacts(model.model_id))


def test_a_logged_model_the_store_holds_pending_is_finished_not_made_again(tmp_path):
    """What a ``create_logged_model`` whose reply was lost leaves (the store committed it, then the client process
    died or was replaced): one PENDING model with the checkpoint's key. The next delivery (here a replay) finishes it;
    no second model is made for that checkpoint."""
    import sqlite3

    from mlflow.entities.logged_model_status import LoggedModelStatus

    monitor = _train(tmp_path, "orphan", ["jsonl", "mlflow"])
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    experiment_id = only_run(client, "ck").info.experiment_id
    first = sorted(_models(client, experiment_id), key=lambda m: int(m.tags["msbridge.step"]))[0]
    with sqlite3.connect(tmp_path / "ck" / "mlflow.db") as db:
        db.execute("UPDATE logged_models SET status = ? WHERE model_id = ?",
                   (LoggedModelStatus.PENDING.to_int(), first.model_id))
    assert str(client.get_logged_model(first.model_id).status) == "PENDING"
    assert main(["replay", monitor.run_dir, "--to", "mlflow"]) == 0
    models = _models(client, experiment_id)
    assert len(models) == STEPS // EVERY and len({m.tags[KEY_TAG] for m in models}) == STEPS // EVERY
    assert {str(m.status) for m in models} == {"READY"}
    assert str(client.get_logged_model(first.model_id).status) == "READY"
