"""``BridgeMonitor.outcome`` and the exit codes: a training script and ``msbridge demo`` see the same."""
from __future__ import annotations

import json
import os

import mindspore as ms
from helpers.training import regression_data, train_regression
from mindspore import nn
from mindspore.train import Callback, Model
import pytest

from msbridge import BridgeMonitor, Sink
from msbridge.run.outcome import EXIT_FAILED, EXIT_KILLED, EXIT_OK, EXIT_UNDELIVERED, RunOutcome
from msbridge.sinks.base import FAILED, FINISHED, KILLED


def test_exit_codes_by_status_and_delivery():
    assert RunOutcome().exit_code == EXIT_OK == 0
    assert RunOutcome(FINISHED).exit_code == 0
    assert RunOutcome(FINISHED, {"mlflow": "1 failed call(s)"}).exit_code == EXIT_UNDELIVERED == 3
    assert RunOutcome(FAILED, {"mlflow": "1 failed call(s)"}).exit_code == EXIT_FAILED == 4
    assert RunOutcome(KILLED).exit_code == EXIT_KILLED == 5
    assert RunOutcome(FINISHED, {"jsonl": "2 failed call(s)", "tb": "1 failed call(s)"}).not_delivered("/r") == {
        "jsonl": "2 failed call(s); the write-ahead log itself: the records it lost are gone",
        "tb": "1 failed call(s); fill it: msbridge replay /r --to tb"}


class Broken(Sink):
    name = "broken"

    def write(self, records, events):
        raise OSError("the tracker is gone")


def config(tmp_path, **more):
    return {"output_dir": str(tmp_path / "run"), "flush_steps": 5, "sinks": ["jsonl"], **more}


def run_json(monitor):
    with open(os.path.join(monitor.run_dir, "run.json"), encoding="utf-8") as fh:
        return json.load(fh)["outcome"]


@pytest.mark.slow
def test_a_clean_run_is_finished_with_exit_code_0(tmp_path):
    monitor = BridgeMonitor(config(tmp_path), progress=False)
    assert monitor.outcome == RunOutcome(None, {})
    train_regression([monitor], steps=12)
    assert monitor.outcome == RunOutcome(FINISHED, {}) and monitor.outcome.exit_code == 0
    assert run_json(monitor)["not delivered"] == "none"


@pytest.mark.slow
def test_a_sink_that_missed_records_is_named_with_how_to_fill_it(tmp_path):
    monitor = BridgeMonitor(config(tmp_path), sinks=[Broken()], progress=False)
    train_regression([monitor], steps=12)
    assert monitor.outcome.status == FINISHED and set(monitor.outcome.undelivered) == {"broken"}
    assert monitor.outcome.exit_code == EXIT_UNDELIVERED
    missed = run_json(monitor)["not delivered"]
    assert missed["broken"].endswith(f"fill it: msbridge replay {monitor.run_dir} --to broken")
    assert "- not delivered: {'broken': " in open(os.path.join(monitor.run_dir, "README.md"), encoding="utf-8").read()


class GivesUp(Sink):
    """A sink whose tracker is gone at the close: it says what it could not deliver, raising nothing."""
    name = "gives_up"

    def write(self, records, events):
        pass

    def close(self, status="FINISHED"):
        self.status = status

    def undelivered(self):
        return f"3 records and status {self.status} not delivered"


@pytest.mark.slow
def test_what_a_sink_gave_up_on_at_close_is_undelivered_with_exit_code_3(tmp_path):
    monitor = BridgeMonitor(config(tmp_path), sinks=[GivesUp()], progress=False)
    train_regression([monitor], steps=12)
    assert monitor.outcome.undelivered == {"gives_up": "3 records and status FINISHED not delivered"}
    assert monitor.outcome.exit_code == EXIT_UNDELIVERED
    assert run_json(monitor)["not delivered"] == {"gives_up": "3 records and status FINISHED not delivered; fill it: "
                                                              f"msbridge replay {monitor.run_dir} --to gives_up"}


@pytest.mark.slow
def test_a_health_stop_is_failed_with_exit_code_4(tmp_path):
    monitor = BridgeMonitor(config(tmp_path, health={"profile": "debug"}), progress=False)  # NaN loss: stop
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    model.train(1, regression_data(20, poison_step=7), callbacks=[monitor], dataset_sink_mode=False)
    assert monitor.outcome.status == FAILED and monitor.outcome.exit_code == EXIT_FAILED
    assert run_json(monitor)["status"] == FAILED


class Raise(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 4:
            raise RuntimeError("lost http://u:s3cr3t@db/x")


@pytest.mark.slow
def test_an_exception_is_failed_and_its_message_is_masked(tmp_path):
    monitor = BridgeMonitor(config(tmp_path), progress=False)
    try:
        train_regression([monitor, Raise()], steps=12)
    except RuntimeError:
        pass
    assert monitor.outcome.exit_code == EXIT_FAILED
    text = open(os.path.join(monitor.run_dir, "README.md"), encoding="utf-8").read()
    assert "lost http://u:***@db/x" in text and "s3cr3t" not in text
