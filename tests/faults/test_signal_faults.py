"""Real SIGTERM, SIGHUP and SIGINT sent to a real MindSpore training process, mid-training and during the close.

Every run must end with its outcome in run.json and README.md, every step recorded
before the signal kept, and the signal named: mid-training as an ``interrupt`` event
in the log, during the close as the outcome's ``interrupted`` line. The process then
ends by the signal, as it would without msbridge.

MindSpore's runtime turns a SIGINT during training into SIGTERM (see
``msbridge.run.signals``): mid-training, the name recorded is the one Python received,
and the exit status matches it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from msbridge.sinks.runlog import read_run

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signal_job.py")
EXIT_BY = {"SIGTERM": -signal.SIGTERM, "SIGINT": -signal.SIGINT, "SIGHUP": -signal.SIGHUP}

pytestmark = pytest.mark.slow


@dataclass
class Ended:
    code: int
    seen: int  # the last step the job printed before the signal
    stdout: str
    stderr: str
    out: str
    after_signal_s: float


def signalled_job(tmp_path, sig: int, at_step: int = 0, slow_close: bool = False, steps: int = 3000,
                  mlflow: bool = False) -> Ended:
    """Run ``signal_job.py``; send ``sig`` once it printed ``at_step`` (or, with ``slow_close``, once its
    slow sink started closing); wait (bounded) for it to end."""
    out = str(tmp_path / "run")
    args = [sys.executable, JOB, out, str(steps)] + ["slow-close"] * slow_close + ["mlflow"] * mlflow
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1"))
    seen, sent = 0, None
    try:
        for line in proc.stdout:
            if line.startswith("step "):
                seen = int(line.split()[1])
            if (line.strip() == "closing") if slow_close else seen >= at_step:
                sent = time.monotonic()
                proc.send_signal(sig)
                break
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sent is not None, f"the job ended before it could be signalled:\n{err[-2000:]}"
    return Ended(proc.returncode, seen, rest, err, out, time.monotonic() - sent)


def outcome(out: str) -> dict:
    with open(os.path.join(out, "run.json"), encoding="utf-8") as fh:
        return json.load(fh)["outcome"]


def assert_nothing_left_behind(out: str) -> None:
    leftovers = [name for _, _, files in os.walk(out) for name in files if ".tmp" in name]
    assert leftovers == []


@pytest.mark.parametrize("sig,at_step", [(signal.SIGTERM, 5), (signal.SIGTERM, 40), (signal.SIGTERM, 77),
                                         (signal.SIGINT, 12), (signal.SIGINT, 63),
                                         (signal.SIGHUP, 9), (signal.SIGHUP, 55)])
def test_signal_mid_training_closes_killed_with_the_interrupt_event(tmp_path, sig, at_step):
    ended = signalled_job(tmp_path, sig, at_step)
    log = read_run(ended.out).ranks[0]
    steps = [r.step for r in log.records]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] >= ended.seen, "every step before it is kept"
    [interrupt] = [e for e in log.events if e.kind == "interrupt"]
    name = interrupt.detail["signal"]
    sent = signal.Signals(sig).name
    assert name == sent or (name, sent) == ("SIGTERM", "SIGINT"), "MindSpore turns SIGINT into SIGTERM only"
    assert ended.code == EXIT_BY[name], "the process ends by the signal it was given"
    assert interrupt.step == steps[-1] and "training returned" not in ended.stdout
    result = outcome(ended.out)
    assert result["status"] == "KILLED" and result["last step"] == steps[-1]
    assert "- status: KILLED" in open(os.path.join(ended.out, "README.md"), encoding="utf-8").read()
    assert "Traceback" not in ended.stderr or name == "SIGINT"  # Python prints a KeyboardInterrupt's
    assert_nothing_left_behind(ended.out)
    assert ended.after_signal_s < 60


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_during_the_close_is_held_until_the_outcome_is_written(tmp_path, sig):
    ended = signalled_job(tmp_path, sig, slow_close=True, steps=60)
    name = signal.Signals(sig).name
    log = read_run(ended.out).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 61)), "training had finished: every step is there"
    result = outcome(ended.out)
    assert result["status"] == "FINISHED"
    assert result["interrupted"] == f"{name} while the sinks were closing (held until they closed)"
    readme = open(os.path.join(ended.out, "README.md"), encoding="utf-8").read()
    assert "- status: FINISHED" in readme and f"- interrupted: {name} while the sinks" in readme
    assert ended.code == EXIT_BY[name] and ended.after_signal_s >= 2.0, "it waited for the slow sink, then ended"
    assert_nothing_left_behind(ended.out)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_closed_terminal_closes_the_mlflow_run_killed_with_every_step(tmp_path, sig):
    """SIGHUP (an ssh session or terminal closed) as SIGTERM: the MLflow run is KILLED, not left RUNNING."""
    from mlflow.tracking import MlflowClient

    ended = signalled_job(tmp_path, sig, at_step=30, mlflow=True)
    steps = [r.step for r in read_run(ended.out).ranks[0].records]
    assert ended.code == -sig and steps == list(range(1, len(steps) + 1)) and steps[-1] >= ended.seen >= 30
    assert outcome(ended.out)["status"] == "KILLED"
    client = MlflowClient("sqlite:///" + os.path.join(ended.out, "mlflow.db"))
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == steps, "MLflow holds every step the jsonl holds"


def test_sigkill_keeps_every_flushed_window_and_leaves_no_temp_file(tmp_path):
    """The fourth signal, which no handler sees: every window flushed before it is whole in the jsonl (fsynced
    at each flush, 25 steps here), nothing half-written is left, and run.json holds no outcome it did not reach."""
    ended = signalled_job(tmp_path, signal.SIGKILL, at_step=60)
    steps = [r.step for r in read_run(ended.out).ranks[0].records]
    assert ended.code == -signal.SIGKILL
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 50, "steps 1-50 were flushed before it"
    with open(os.path.join(ended.out, "run.json"), encoding="utf-8") as fh:
        assert "outcome" not in json.load(fh), "no outcome is claimed: the run never reached its close"
    assert_nothing_left_behind(ended.out)
