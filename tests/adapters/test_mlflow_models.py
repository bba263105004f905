"""Each checkpoint MindSpore's ModelCheckpoint saves, and the last healthy weights the health action
``checkpoint_and_stop`` saves, becomes one MLflow 3 LoggedModel of its run, with its step's metrics linked, so
``search_logged_models(order_by=...)`` names the best checkpoint; a replay rebuilds them exactly once. Real
training on CPU, real MLflow on sqlite. (mindformers' CheckpointMonitor: tests/mindformers_bridge/test_do_eval.py.)"""
from __future__ import annotations

import logging
import os

import pytest
from helpers.mlflow_reads import only_run
from helpers.postgres import pg_mlflow, postgres  # noqa: F401  (fixtures)
import mindspore as ms
from helpers.training import regression_data, train_regression
from mindspore import nn
from mindspore.train import CheckpointConfig, Model, ModelCheckpoint
from mlflow.tracking import MlflowClient

from msbridge import BridgeMonitor
from msbridge.adapters.mlflow_tracker.run.models import FILE_TAG, KEY_TAG, PATH_TAG, CheckpointModels, best_checkpoint, \
    model_name
from msbridge.cli.main import main
from msbridge.names import LOSS
from msbridge.sinks.base import Event, Record
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS, EVERY = 20, 5


def _train(tmp_path, name, sinks, keep=10, **config):
    cfg = {"experiment": "ck", "run_name": name, "experiment_dir": str(tmp_path / "ck"), "flush_steps": 4,
           "sinks": sinks, **config}
    monitor = BridgeMonitor(cfg, progress=False)
    saver = ModelCheckpoint("net", str(tmp_path / "ckpt" / name),
                            CheckpointConfig(save_checkpoint_steps=EVERY, keep_checkpoint_max=keep))
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


def _by_step(client, experiment_id):
    return {int(m.tags["msbridge.step"]): m for m in _models(client, experiment_id)}


def test_checkpoints_the_saver_rotated_away_are_marked_and_the_best_query_leaves_them_out(tmp_path, caplog):
    """A tutorial ModelCheckpoint keeping 2 files (checkpoints at 5, 10, 15, 20: 5 and 10 deleted by it). Their
    LoggedModels say so (a tag, status FAILED), the others stay READY, and the documented best-checkpoint query
    returns an existing file where the same query without the filter names a deleted one."""
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        monitor = _train(tmp_path, "rot", ["jsonl", "mlflow"], keep=2)
    assert [r.getMessage() for r in caplog.records if "keeps only its last" in r.getMessage()] == [
        "msbridge: ModelCheckpoint keeps only its last 2 files (CheckpointConfig(keep_checkpoint_max=2)): the MLflow "
        "LoggedModels of the checkpoints it deletes are marked msbridge.checkpoint.file=deleted (status Failed); to "
        "keep the best one on the objective: sinks: {mlflow: {log_checkpoints: best}}"]
    log = read_run(monitor.run_dir).ranks[0]
    events = [e for e in log.events if e.kind == "checkpoint"]
    assert [e.step for e in events] == [5, 10, 15, 20]
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    experiment_id = only_run(client, "ck").info.experiment_id
    models = _by_step(client, experiment_id)
    assert sorted(models) == [5, 10, 15, 20]
    for step, model in models.items():
        exists = os.path.isfile(model.tags[PATH_TAG])
        assert exists == (step >= 15)  # the saver kept its last two
        assert (model.tags[FILE_TAG], str(model.status)) == (("present", "READY") if exists else ("deleted", "FAILED"))
    losses = dict(log.series(LOSS))
    ascending = min((5, 10, 15, 20), key=losses.get) in (5, 10)  # the order whose overall best is a deleted file
    unfiltered = client.search_logged_models([experiment_id], order_by=[
        {"field_name": f"metrics.{LOSS}", "ascending": ascending}], max_results=1)[0]
    assert not os.path.exists(unfiltered.tags[PATH_TAG])
    best = best_checkpoint(client, [experiment_id], LOSS, ascending=ascending)
    assert os.path.isfile(best.tags[PATH_TAG])
    assert int(best.tags["msbridge.step"]) == sorted((15, 20), key=losses.get, reverse=not ascending)[0]

    # A replay neither makes them again nor takes the mark off.
    assert main(["replay", monitor.run_dir, "--to", "mlflow"]) == 0
    again = _by_step(client, experiment_id)
    assert {s: (m.model_id, str(m.status), m.tags[FILE_TAG]) for s, m in again.items()} == {
        s: (m.model_id, str(m.status), m.tags[FILE_TAG]) for s, m in models.items()}


def test_log_checkpoints_best_keeps_the_best_on_the_objective_safe_from_rotation(tmp_path, caplog):
    """``log_checkpoints: best`` with the objective ``train/loss`` (min), the saver keeping 2 files: the best is the
    checkpoint at step 10 (it beats step 5's, then stays best), which the saver deletes. It is kept under the run
    dir as a loadable checkpoint, its LoggedModel points there, the others are let go, and no rotation line is
    said."""
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        monitor = _train(tmp_path, "best", {"jsonl": {}, "mlflow": {"log_checkpoints": "best"}}, keep=2,
                         objective={"metric": LOSS, "mode": "min"})
    assert not [r for r in caplog.records if "keeps only its last" in r.getMessage()]
    log = read_run(monitor.run_dir).ranks[0]
    events = {e.step: e for e in log.events if e.kind == "checkpoint"}
    assert sorted(events) == [5, 10, 15, 20]
    losses = dict(log.series(LOSS))
    want = min(sorted(events), key=losses.get)  # ties: the earlier
    assert want == 10 and losses[5] > losses[10], "the data no longer makes a rotated checkpoint the best"
    assert not os.path.exists(events[want].detail["path"])  # the saver deleted it
    kept = os.path.join(monitor.run_dir, "checkpoints", f"step{want}-{os.path.basename(events[want].detail['path'])}")
    assert os.listdir(os.path.dirname(kept)) == [os.path.basename(kept)]
    assert set(ms.load_checkpoint(kept)) >= {"weight", "bias"}
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    experiment_id = only_run(client, "ck").info.experiment_id
    models = _by_step(client, experiment_id)
    assert (models[want].tags[PATH_TAG], models[want].tags[FILE_TAG], str(models[want].status)) == (
        kept, "kept", "READY")
    assert models[want].tags["msbridge.checkpoint.saved_path"] == events[want].detail["path"]
    for step, model in models.items():
        if step != want:
            assert model.tags[PATH_TAG] == events[step].detail["path"]
            assert model.tags[FILE_TAG] == ("present" if step >= 15 else "deleted")
    assert best_checkpoint(client, [experiment_id], LOSS).model_id == models[want].model_id

    # A replay (into a new store) changes no file and points the model at the kept one again.
    store = f"sqlite:///{tmp_path / 'central.db'}"
    assert main(["replay", monitor.run_dir, "--to", "mlflow", "--tracking-uri", store]) == 0
    assert os.listdir(os.path.dirname(kept)) == [os.path.basename(kept)]
    central = MlflowClient(store)
    again = _by_step(central, only_run(central, "ck").info.experiment_id)
    assert {s: (m.tags[PATH_TAG], m.tags[FILE_TAG]) for s, m in again.items()} == {
        s: (m.tags[PATH_TAG], m.tags[FILE_TAG]) for s, m in models.items()}


@pytest.mark.parametrize("store", ["shared_sqlite", "pg_mlflow"])
def test_a_model_is_marked_when_a_later_checkpoint_is_handed_not_only_at_the_close(tmp_path, store, request):
    """The sink's own delivery, the run still going, on sqlite and on a team server (``mlflow server`` on a real
    PostgreSQL): the first checkpoint's file is deleted (as rotation does at the next save), the next checkpoint's
    batch marks it; the best-checkpoint query then names the second, though the first's loss is lower."""
    store = request.getfixturevalue(store)
    client = MlflowClient(getattr(store, "uri", store))
    experiment_id = client.create_experiment(f"later-{os.getpid()}-{id(tmp_path)}")
    run_id = client.create_run(experiment_id).info.run_id
    models = CheckpointModels("link")
    models.open(str(tmp_path / "run"), {"metric": None, "mode": "min"})
    files = [tmp_path / f"net-{step}.ckpt" for step in (5, 10)]
    for file in files:
        file.write_bytes(b"weights")

    def batch(step):
        return ([Record(s, 0, float(s), {LOSS: s / 10}) for s in range(step - 4, step + 1)],
                [Event("checkpoint", step, 0, float(step), {"path": str(files[step // 5 - 1])})])

    models.see(*batch(5))
    models.see([Record(6, 0, 6.0, {LOSS: 0.6})], [])
    [first] = models.deliver(client, experiment_id, run_id, "later")
    assert client.get_logged_model(first).tags[FILE_TAG] == "present"
    files[0].unlink()
    models.see(*batch(10))
    assert models.deliver(client, experiment_id, run_id, "later") == []  # 10 waits for a later step: not the close
    marked = client.get_logged_model(first)
    assert (marked.tags[FILE_TAG], str(marked.status)) == ("deleted", "FAILED")
    [second] = models.deliver(client, experiment_id, run_id, "later", final=True)
    assert best_checkpoint(client, [experiment_id], LOSS).model_id == second


def test_an_uploaded_checkpoint_the_saver_deleted_stays_ready_its_copy_in_mlflow(tmp_path):
    """`upload` with a saver keeping 2 files: the monitor holds each file (a hard link) until MLflow's thread uploads
    it, so the rotated ones are uploaded too (before holding, they were gone by the time MLflow was reached)."""
    monitor = _train(tmp_path, "up", {"jsonl": {}, "mlflow": {"log_checkpoints": "upload"}}, keep=2)
    assert [e.step for e in read_run(monitor.run_dir).ranks[0].events if e.kind == "checkpoint"] == [5, 10, 15, 20]
    client = MlflowClient(f"sqlite:///{tmp_path / 'ck' / 'mlflow.db'}")
    models = _by_step(client, only_run(client, "ck").info.experiment_id)
    assert {s: (m.tags[FILE_TAG], str(m.status)) for s, m in models.items()} == {
        5: ("uploaded", "READY"), 10: ("uploaded", "READY"), 15: ("present", "READY"), 20: ("present", "READY")}
    for model in models.values():
        [artifact] = client.list_logged_model_artifacts(model.model_id)
        assert artifact.path == os.path.basename(model.tags[PATH_TAG]) and artifact.file_size > 0
    assert os.listdir(os.path.join(monitor.run_dir, "checkpoints")) == []  # each held link removed once uploaded


def test_an_unknown_log_checkpoints_value_names_file_line_key_and_the_nearest(tmp_path, capsys):
    config = tmp_path / "m.yaml"
    config.write_text("experiment: x\nsinks:\n  jsonl: {}\n  mlflow:\n    log_checkpoints: bset\n")
    assert main(["config", "check", str(config)]) == 1
    assert ("m.yaml:5: sinks.mlflow.log_checkpoints: expected one of link, upload, best, off, got 'bset'; did you "
            "mean 'best'?") in capsys.readouterr().out.splitlines()[1]


def test_files_held_for_upload_while_mlflow_is_down_are_uploaded_by_the_replay(tmp_path, shared_sqlite):
    """`upload` with MLflow unreachable for the whole training (a closed port) and a saver keeping 2 files: the held
    links keep all four checkpoints; the replay into a store uploads each of them and removes the links. (The run's
    close_timeout bounds the replay's calls too: 10 s, the MLflow child's start on a busy 2-CPU VM included.)"""
    monitor = _train(tmp_path, "down", {"jsonl": {}, "mlflow": {"log_checkpoints": "upload", "close_timeout": 10,
                                                                "tracking_uri": "http://127.0.0.1:9"}}, keep=2)
    held = os.path.join(monitor.run_dir, "checkpoints")
    assert sorted(os.listdir(held)) == [f"step{s}-net-1_{s}.ckpt" for s in (10, 15, 20, 5)]
    assert main(["replay", monitor.run_dir, "--to", "mlflow", "--tracking-uri", shared_sqlite]) == 0
    client = MlflowClient(shared_sqlite)
    models = _by_step(client, only_run(client, "ck").info.experiment_id)
    assert {s: (m.tags[FILE_TAG], str(m.status)) for s, m in models.items()} == {
        5: ("uploaded", "READY"), 10: ("uploaded", "READY"), 15: ("present", "READY"), 20: ("present", "READY")}
    assert all(len(client.list_logged_model_artifacts(m.model_id)) == 1 for m in models.values())
    assert os.listdir(held) == []
