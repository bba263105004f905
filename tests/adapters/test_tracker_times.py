"""A tracker's run starts when training starts and ends when it ends: MLflow's run times, TensorBoard's
hparams session. However late MLflow is reached (its client process gets no CPU while training keeps a
small machine busy), and when the run is replayed from its jsonl log. Read back with ``MlflowClient``
and TensorBoard's ``EventAccumulator``."""
from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from helpers.mlflow_reads import only_run
from helpers.runs import Handed, make_records, make_run
from mindspore.train import Callback
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hp_metadata

from msbridge import BridgeMonitor
from msbridge.adapters.mlflow_sink import MlflowSink
from msbridge.adapters.tensorboard_sink import TensorBoardSink
from msbridge.offline.replay import replay
from msbridge.sinks.base import FINISHED, Event


def mlflow_times(uri, experiment):
    """(start, end) of the experiment's one MLflow run, in seconds."""
    info = only_run(MlflowClient(uri), experiment).info
    return info.start_time / 1e3, info.end_time / 1e3


def hparams_times(run_dir):
    """(start, end) of the hparams session TensorBoard reads in a run's global directory."""
    acc = EventAccumulator(run_dir)
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = hp_metadata.parse_session_start_info_plugin_data(content[hp_metadata.SESSION_START_INFO_TAG])
    end = hp_metadata.parse_session_end_info_plugin_data(content[hp_metadata.SESSION_END_INFO_TAG])
    return start.start_time_secs, end.end_time_secs


@pytest.mark.parametrize("known_start", [True, False])
def test_the_trainings_times_however_late_mlflow_is_reached(shared_sqlite, tmp_path, known_start):
    """Training began ten minutes before MLflow was first reached; the last thing handed over is an event.
    A run whose start is not known (an old log) starts at its first record."""
    began = time.time() - 600
    run = make_run(tmp_path, experiment=f"late-{uuid.uuid4().hex[:8]}", start_time=began if known_start else 0.0)
    records = [dataclasses.replace(r, time=began + 5.0 * r.step) for r in make_records(range(1, 41))]
    last = Event("anomaly", 40, 0, began + 201.5, {"check": "loss_spike"})
    for sink in (Handed(MlflowSink(tracking_uri=shared_sqlite)), Handed(TensorBoardSink())):  # its host keeps the times
        sink.open(run)
        sink.write(records[:20], [])
        sink.write(records[20:], [last])
        sink.close(FINISHED)
    start = began if known_start else records[0].time
    assert mlflow_times(shared_sqlite, run.experiment) == (pytest.approx(start, abs=1e-3),
                                                           pytest.approx(began + 201.5, abs=1e-3))
    assert hparams_times(TensorBoardSink().run_dir(run)) == (pytest.approx(start), pytest.approx(began + 201.5))


class Clock(Callback):
    """The training's own wall time: from train begin to the end of the last step."""

    def on_train_begin(self, run_context):
        self.started = time.time()

    def on_train_step_end(self, run_context):
        self.ended = time.time()


@pytest.mark.slow
def test_a_demo_run_lasts_as_long_as_its_training_live_and_replayed(tmp_path):
    """The demo (300 steps of its tiny LM): MLflow's run duration and TensorBoard's session are the
    training's wall time within 5 %, and a replay of the run dir into fresh stores gives the same times."""
    from msbridge.demo import demo_config, train

    live_uri, tb = f"sqlite:///{tmp_path}/live.db", str(tmp_path / "tb")
    sinks = {"jsonl": {}, "mlflow": {"tracking_uri": live_uri}, "tensorboard": {"logdir": tb}}
    config = demo_config(str(tmp_path / "runs"), {"run_name": "tiny", "sinks": sinks})
    monitor, clock = BridgeMonitor(config, progress=False), Clock()
    train(monitor, 300, config["params"], extra_callbacks=[clock])
    wall = clock.ended - clock.started

    live = mlflow_times(live_uri, config["experiment"])
    assert abs((live[1] - live[0]) - wall) <= 0.05 * wall, (live[1] - live[0], wall)
    assert live[0] == pytest.approx(clock.started, abs=0.05 * wall)
    session = hparams_times(f"{tb}/tiny")
    assert session == (pytest.approx(live[0], abs=1e-3), pytest.approx(live[1], abs=1e-3))

    replayed_uri = f"sqlite:///{tmp_path}/replayed.db"
    replay(monitor.run_dir, "mlflow", {"tracking_uri": replayed_uri}, progress=False)
    assert mlflow_times(replayed_uri, config["experiment"]) == (pytest.approx(live[0], abs=1e-3),
                                                                pytest.approx(live[1], abs=1e-3))
    replay(monitor.run_dir, "tensorboard", {"logdir": str(tmp_path / "tb-replayed")}, progress=False)
    assert hparams_times(str(tmp_path / "tb-replayed" / "tiny")) == session
