"""A rerun is never silently merged: the same run_name trained again from step 1 is refused at train begin
(before any sink opens, nothing in the run dir changed); a real resume from a MindSpore checkpoint continues
the run with every step once."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import mindspore as ms
import pytest
from helpers.training import OutputRecorder, regression_data, train_regression
from mindspore import nn
from mindspore.train import Model
from mindspore.train.callback import CheckpointConfig, ModelCheckpoint

from msbridge import BridgeMonitor
from msbridge.errors import ConfigError
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

PER_EPOCH = 20


def config(tmp_path, **extra):
    return {"experiment": "e", "run_name": "same", "flush_steps": 10,
            "output_dir": str(tmp_path / "runs" / "{experiment}" / "{run_name}"),
            "experiment_dir": str(tmp_path / "runs" / "{experiment}"),
            "sinks": {"jsonl": {}, "tensorboard": {}, "mindinsight": {}}, **extra}


def hashes(root: Path):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_same_run_name_trained_again_from_step_1_is_refused_and_changes_nothing(tmp_path):
    first = BridgeMonitor(config(tmp_path), progress=False)
    train_regression([first], steps=24)
    before = hashes(tmp_path / "runs")
    assert any("tensorboard" in name for name in before) and any("summary" in name for name in before)
    second = BridgeMonitor(config(tmp_path), progress=False)
    with pytest.raises(ConfigError) as refused:
        train_regression([second], steps=24)
    assert str(refused.value) == (
        f"output_dir {first.run_dir!r} already holds the run 'same' up to step 24, and this training starts at step 1: "
        "its steps up to 24 would not be recorded. For a new run put {timestamp} in run_name "
        "(run_name: 'same-{timestamp}'); to continue this run from its checkpoint set resume: true "
        "(steps up to 24 are kept as recorded)")
    assert second.dispatcher is None and second.outcome.status is None
    assert hashes(tmp_path / "runs") == before, "every file of the first run is byte-identical"
    third = BridgeMonitor(config(tmp_path, run_name="same-{timestamp}"), progress=False)
    train_regression([third], steps=6)  # the first fix the message names works
    assert third.run_dir != first.run_dir and [r.step for r in read_run(third.run_dir).ranks[0].records] == \
        list(range(1, 7))


def test_a_refused_training_ends_the_mlflow_client_process_its_sinks_started(tmp_path):
    """The sinks are built before training (MLflow's child imports MLflow meanwhile); a refused start closes
    them, so a notebook that retries does not keep one MLflow process per refusal."""
    train_regression([BridgeMonitor(config(tmp_path, sinks=["jsonl"]), progress=False)], steps=4)
    tracked = config(tmp_path, sinks={"jsonl": {}, "mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}})
    second = BridgeMonitor(tracked, progress=False)
    child = next(sink for sink in second.plan.sinks if sink.name == "mlflow")._client._proc
    assert child.poll() is None
    with pytest.raises(ConfigError, match="already holds the run 'same' up to step 4"):
        train_regression([second], steps=4)
    assert child.poll() == 0, "the refusal ended MLflow's client process"


def train_from_checkpoint(monitor, ckpt_dir, epochs, initial_epoch=0, checkpoint=None):
    """``Model.train`` of the test regressor, saving a checkpoint every epoch; resumed from ``checkpoint``."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    if checkpoint:
        ms.load_param_into_net(net, ms.load_checkpoint(checkpoint))
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    saver = ModelCheckpoint(prefix="reg", directory=str(ckpt_dir),
                            config=CheckpointConfig(save_checkpoint_steps=PER_EPOCH, keep_checkpoint_max=20))
    ref = OutputRecorder()
    model.train(epochs, regression_data(PER_EPOCH), callbacks=[monitor, saver, ref], dataset_sink_mode=False,
                initial_epoch=initial_epoch)
    return ref


@pytest.mark.parametrize("crashed_at_epoch,resume", [(5, False), (7, True)])
def test_a_resume_from_the_checkpoint_at_step_100_continues_the_run_every_step_once(tmp_path, crashed_at_epoch,
                                                                                      resume):
    """Epochs of 20 steps, a checkpoint each epoch. The first session ends at step 100 (its first step after
    the log's last: resumed as it is) or at 140 (steps 101-140 are trained again: resume: true asks for it)."""
    extra = {"resume": True} if resume else {}
    first = BridgeMonitor(config(tmp_path, **extra), progress=False)
    train_from_checkpoint(first, tmp_path / "ckpt", crashed_at_epoch)
    ckpt = tmp_path / "ckpt" / f"reg-5_{PER_EPOCH}.ckpt"  # the checkpoint at step 100
    assert ckpt.exists(), sorted(os.listdir(tmp_path / "ckpt"))
    last = crashed_at_epoch * PER_EPOCH
    if resume:  # without resume: true this session would be refused
        with pytest.raises(ConfigError, match="up to step 140, and this training starts at step 101"):
            train_from_checkpoint(BridgeMonitor(config(tmp_path), progress=False), tmp_path / "c2", 10, 5, str(ckpt))
    second = BridgeMonitor(config(tmp_path, **extra), progress=False)
    ref = train_from_checkpoint(second, tmp_path / "ckpt", 10, initial_epoch=5, checkpoint=str(ckpt))
    assert second.run.run_id == first.run.run_id and second.run.resumed_from_step == last
    log = read_run(second.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 201)), "no duplicate, no lost step"
    assert [(e.kind, e.step) for e in log.events if e.kind == "resume"] == [("resume", last)]
    losses = {r.step: r.values["train/loss"] for r in log.records}
    assert len(ref.losses) == 100  # the resumed session trained steps 101-200
    for step, loss in zip(range(last + 1, 201), ref.losses[last - 100:]):  # what the log took of this session
        assert losses[step] == pytest.approx(loss, rel=1e-6)


def test_steps_a_kill_took_before_the_log_wrote_them_are_named_at_the_resume(tmp_path, caplog):
    """A kill -9 after the checkpoint at step 100 but before the log wrote its last window (steps 91-100, still in
    the killed process's memory): the log is cut there as the kill leaves it. The session resumed from that
    checkpoint names steps 91-100 lost, in its log, its outcome and one warning, and records 101-200 once."""
    first = BridgeMonitor(config(tmp_path), progress=False)
    train_from_checkpoint(first, tmp_path / "ckpt", 5)
    wal = Path(first.run_dir) / "metrics" / "rank_0.jsonl"
    lines = wal.read_text().splitlines(keepends=True)
    wal.write_text("".join(line for line in lines if json.loads(line).get("step", 0) <= 90))
    second = BridgeMonitor(config(tmp_path), progress=False)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train_from_checkpoint(second, tmp_path / "ckpt", 10, initial_epoch=5,
                              checkpoint=str(tmp_path / "ckpt" / f"reg-5_{PER_EPOCH}.ckpt"))
    log = read_run(second.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 91)) + list(range(101, 201))
    (resume,) = [e for e in log.events if e.kind == "resume"]
    assert (resume.step, resume.detail["lost_first_step"], resume.detail["lost_last_step"]) == (90, 91, 100)
    said = [r.getMessage() for r in caplog.records if "in no log" in r.getMessage()]
    assert said == ["msbridge: steps 91-100 are in no log and no sink: the job that trained them ended before its log "
                    "wrote them (a kill -9 keeps no buffer); this training resumes at step 101, after them"]
    summary = json.loads((Path(second.run_dir) / "run.json").read_text())
    assert "step 90: resume" in json.dumps(summary) and "'lost_last_step': 100" in json.dumps(summary)
    assert second.outcome.status == "FINISHED"
