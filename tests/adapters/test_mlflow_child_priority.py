"""MLflow's child beside a live training runs in two phases (``msbridge.adapters._mlflow_process``): from the
sink's open at nice 5 above the training process, normal class, while it starts (MLflow's import, the store, the
run), then in Linux's idle class once its first metrics are stored. Anywhere else (``msbridge replay``, a sink
opened by hand) it keeps its parent's priority. That a real training opens its sinks as a live one is checked
through the callback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.training import train_regression

from msbridge import BridgeMonitor
from msbridge.adapters._mlflow_process import NICE
from msbridge.sinks.base import Sink

PARENT = """
import os, sys, time
from msbridge.adapters._mlflow_process import ClientProcess
client = ClientProcess()
pid = client._proc.pid
client.connect(sys.argv[1], {}, beside_training=sys.argv[2] == "training")
at_connect = os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0)  # before any call
run = client.create_run(client.create_experiment("priority"))
before = os.sched_getscheduler(pid)
client.log_batch(run.info.run_id, metrics=[("train/loss", 2.5, int(time.time() * 1000), 1)])
client.log_batch(run.info.run_id, metrics=[("train/loss", 2.4, int(time.time() * 1000), 2)])  # answered after it
after, nice = os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0)
client._proc.kill()
client._proc.wait()
client.search_experiments()  # a new child, started by this call
restarted = os.getpriority(os.PRIO_PROCESS, client._proc.pid) - os.getpriority(os.PRIO_PROCESS, 0)
print(at_connect, before, after, nice, restarted, flush=True)
client.close()
"""

needs_idle_class = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")


def child_classes(tmp_path, kind: str):
    out = subprocess.run([sys.executable, "-c", PARENT, f"sqlite:///{tmp_path}/mlflow.db", kind],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, GLOG_v="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    return tuple(int(x) for x in out.stdout.split())


@needs_idle_class
def test_beside_training_the_child_starts_at_nice_5_and_goes_idle_after_its_first_metrics(tmp_path):
    at_connect, before, after, nice, restarted = child_classes(tmp_path, "training")
    assert at_connect == NICE, "niced from the sink's open, before MLflow's import ends"
    assert before == os.SCHED_OTHER, "its start (import, store, run) must not be starved"
    assert after == os.SCHED_IDLE and nice == NICE
    assert restarted == NICE, "a child started again after a death is niced too"


@needs_idle_class
def test_away_from_training_the_child_keeps_its_parents_priority(tmp_path):
    """``msbridge replay`` is waited on: a niced child behind busy processes made it several times slower."""
    assert child_classes(tmp_path, "replay") == (0, os.SCHED_OTHER, os.SCHED_OTHER, 0, 0)


class OpenedWith(Sink):
    """A sink that keeps the ``RunInfo`` it was opened with."""

    name = "opened_with"

    def open(self, run):
        super().open(run)
        self.opened = run

    def emit(self, records, events):
        return None


def test_a_real_training_opens_its_sinks_as_a_live_training(tmp_path):
    """What the MLflow sink hands its child as ``beside_training``: True from the callback's run."""
    probe = OpenedWith()
    train_regression([BridgeMonitor({"experiment": "live", "output_dir": str(tmp_path / "run"), "sinks": ["jsonl"]},
                                    sinks=[probe])], steps=4)
    assert probe.opened.training is True and probe.opened.run_dir == str(tmp_path / "run")
