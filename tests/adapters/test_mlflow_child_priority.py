"""MLflow's child beside a live training runs in two phases (``msbridge.adapters.mlflow_tracker.client.process``): from the
sink's open at nice 5 above the training process, normal class, while it starts (MLflow's import, the store, the
run), then in Linux's idle class once its first metrics are stored. Once training has ended, ``hurry`` replaces an
idle-class child by one at its parent's priority, and the call in flight is redone there. Anywhere else
(``msbridge replay``, a sink opened by hand) it keeps its parent's priority. That a real training opens its sinks as
a live one is checked through the callback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers.training import train_regression

from msbridge import BridgeMonitor
from msbridge.adapters.mlflow_tracker.client.process import ClientProcess
from msbridge.adapters.mlflow_tracker.client.sched import NICE
from msbridge.sinks.base import Sink

PARENT = """
import os, sys, time
from msbridge.adapters.mlflow_tracker.client.process import ClientProcess
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

HURRIED = """
import json, os, signal, subprocess, sys, threading
from msbridge.adapters.mlflow_tracker.client.process import ClientProcess
client, when, said = ClientProcess(), sys.argv[2], {}
client.connect(sys.argv[1], {}, beside_training=True)
experiment = client.create_experiment("hurry")
first = client._proc


def call_hurried(name, *args, **kwargs):
    \"\"\"``name`` on a thread, hurried while it runs. The thread lives on: a child dies with the thread that started
    it (like the sink's, which lives until the close).\"\"\"
    returned, end, answer = threading.Event(), threading.Event(), []
    def sink_thread():
        answer.append(getattr(client, name)(*args, **kwargs))
        returned.set()
        end.wait()
    threading.Thread(target=sink_thread, daemon=True).start()
    said["waited"] = not returned.wait(1.0)
    said["hurried"] = client.hurry()
    if when == "in create_run":
        os.kill(first.pid, signal.SIGCONT)
    said["returned"] = returned.wait(300)
    return answer[0]


if when == "in create_run":
    os.kill(first.pid, signal.SIGSTOP)  # stopped, it cannot answer: the call is certainly in flight
    run_id = call_hurried("create_run", experiment).info.run_id
else:
    run_id = client.create_run(experiment).info.run_id
client.log_batch(run_id, metrics=[("train/loss", 2.5, 1000, 1)])
said["idle"] = os.sched_getscheduler(first.pid) == os.SCHED_IDLE
step_2 = [("train/loss", 2.4, 2000, 2)] + [(f"wide/m{i}", 0.5, 2000, 2) for i in range(20_000)]
hogs = []
if when == "starved":  # two busy processes: the idle-class child gets almost no CPU for its 20,000 rows
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        call_hurried("log_batch", run_id, metrics=step_2)
    finally:
        for hog in hogs:
            hog.kill()
else:
    if when in ("not starved", "starved later"):
        said["hurried"] = client.hurry()  # not starved: the child is left, for now
    if when == "starved later":  # the busy processes come after the hurry, the call after them
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        client.log_batch(run_id, metrics=step_2)
        if when == "starved later":
            said["redone"] = client._proc is not first  # replaced while the call ran, not after it
    finally:
        for hog in hogs:
            hog.kill()
said["killed"] = first.poll() == -signal.SIGKILL
new = client._proc.pid
said["normal class"] = os.sched_getscheduler(new) == os.SCHED_OTHER
said["nice"] = os.getpriority(os.PRIO_PROCESS, new) - os.getpriority(os.PRIO_PROCESS, 0)
said["runs"] = len(client.search_runs([experiment]))
said["steps"] = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
said["wide rows"] = len(client.get_metric_history(run_id, "wide/m19999"))
print(json.dumps(said), flush=True)
client.close()
"""

needs_idle_class = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")


def child_classes(tmp_path, kind: str):
    out = subprocess.run([sys.executable, "-c", PARENT, f"sqlite:///{tmp_path}/mlflow.db", kind],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, GLOG_v="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    return tuple(int(x) for x in out.stdout.split())


@pytest.mark.slow
@pytest.mark.alone  # an idle-class child: the other pytest-xdist workers' training would starve it
@pytest.mark.usefixtures("mlflow_store_template")
@needs_idle_class
def test_beside_training_the_child_starts_at_nice_5_and_goes_idle_after_its_first_metrics(tmp_path):
    at_connect, before, after, nice, restarted = child_classes(tmp_path, "training")
    assert at_connect == NICE, "niced from the sink's open, before MLflow's import ends"
    assert before == os.SCHED_OTHER, "its start (import, store, run) must not be starved"
    assert after == os.SCHED_IDLE and nice == NICE
    assert restarted == NICE, "a child started again after a death is niced too"


@pytest.mark.slow
@pytest.mark.alone  # an idle-class child: the other pytest-xdist workers' training would starve it
@pytest.mark.usefixtures("mlflow_store_template")
@needs_idle_class
def test_away_from_training_the_child_keeps_its_parents_priority(tmp_path):
    """``msbridge replay`` is waited on: a niced child behind busy processes made it several times slower."""
    assert child_classes(tmp_path, "replay") == (0, os.SCHED_OTHER, os.SCHED_OTHER, 0, 0)


@pytest.mark.slow
@pytest.mark.alone  # an idle-class child: the other pytest-xdist workers' training would starve it
@pytest.mark.usefixtures("mlflow_store_template")
@needs_idle_class
@pytest.mark.parametrize("when", ["starved", "not starved", "starved later", "in create_run"])
def test_after_training_a_starved_child_is_replaced_at_its_parents_priority_and_loses_no_call(tmp_path, when):
    """``hurry`` (the run's close, training over): an idle-class child starved by two busy processes (started and
    stopped in the test) is killed, and the call it was in is redone on a new child at the parent's priority; every
    step is stored once. A child that gets the CPU it needs is left alone, and a ``create_run`` is never cut short
    (run twice it would make two runs). One left alone is looked at again: starved by a call after the hurry, it is
    replaced while that call runs (before it was, that call ran on for 6 minutes)."""
    out = subprocess.run([sys.executable, "-c", HURRIED, f"sqlite:///{tmp_path}/mlflow.db", when],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, GLOG_v="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert (said.pop("steps"), said.pop("wide rows"), said.pop("runs")) == ([1, 2], 1, 1), "each row stored once"
    replaced = when in ("starved", "starved later")
    expected = {"idle": True, "hurried": when == "starved", "killed": replaced, "normal class": replaced,
                "nice": 0 if replaced else NICE}
    if when == "starved later":
        expected["redone"] = True
    if when in ("starved", "in create_run"):
        expected.update(waited=True, returned=True)
    assert said == expected


class OpenedWith(Sink):
    """A sink that keeps the ``RunInfo`` it was opened with."""

    name = "opened_with"

    def open(self, run):
        super().open(run)
        self.opened = run

    def write(self, records, events):
        return None


def test_a_real_training_opens_its_sinks_as_a_live_training(tmp_path):
    """What the MLflow sink hands its child as ``beside_training``: True from the callback's run."""
    probe = OpenedWith()
    train_regression([BridgeMonitor({"experiment": "live", "output_dir": str(tmp_path / "run"), "sinks": ["jsonl"]},
                                    sinks=[probe])], steps=4)
    assert probe.opened.training is True and probe.opened.run_dir == str(tmp_path / "run")


@pytest.mark.parametrize("in_flight", ["create_run", "create_logged_model"])
def test_hurry_never_cuts_short_a_call_that_makes_something(in_flight, monkeypatch):
    """A starved child in ``create_run`` or ``create_logged_model`` is left to answer: redone on a new child after
    the store committed it, it would make a second run, or a second LoggedModel of one checkpoint (one stuck
    PENDING). The same child in ``log_batch`` (a row sent again is the same row) is replaced. Starvation is set
    here: causing it at the exact moment of a call is a race a test cannot win every time."""
    client = ClientProcess()
    try:
        monkeypatch.setattr(ClientProcess, "_starved", lambda self: True)
        client._slowed, client._in_flight = True, in_flight
        assert client.hurry() is False and client._proc.poll() is None
        client._beside_training, client._slowed, client._in_flight = True, True, "log_batch"
        assert client.hurry() is True and client._proc.wait(10) == -signal.SIGKILL
    finally:
        client.close()
