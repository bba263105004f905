"""Training on a busy host: 2, 4 and 8 CPU-bound processes beside a real training job with every sink on (jsonl,
TensorBoard, MLflow embedded or through a real ``mlflow server``, MindInsight).

Must hold: when the job's process exits every step is in jsonl (0 malformed lines, no gap); each tracker holds
every step, each once, or is listed undelivered in run.json with its replay command; that command, run as
printed, then completes it: every step once.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.disk import assert_covered, parse_lines
from helpers.load import cpu_hogs
from helpers.mlflow_reads import only_run, steps
from helpers.runs import make_run
from mlflow.tracking import MlflowClient
from msbridge.adapters.mindinsight_sink import MindInsightSink
from msbridge.adapters.tensorboard_sink import TensorBoardSink

from msbridge.bench.servers import MlflowServer
from msbridge.run.outcome import EXIT_OK, EXIT_UNDELIVERED

# each test over 1 s here (the fast tier: pytest -m 'not slow'); beside CPU-bound processes: the other pytest-xdist
# workers wait (tests/helpers/alone.py)
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.usefixtures("mlflow_store_template")]

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "load_job.py")
STEPS = 60
TRACKERS = ("tensorboard", "mlflow", "mindinsight")


def tracker_steps(name: str, run_dir: Path, uri: str, experiment: str) -> list:
    """The steps of ``train/loss`` the tracker holds, a step held twice listed twice (its own reader)."""
    meta = json.loads((run_dir / "run.json").read_text())
    if name == "mlflow":
        client = MlflowClient(uri)
        return steps(client, only_run(client, experiment).info.run_id)
    run = make_run(run_dir.parent.parent, name=meta["run_name"], experiment=experiment, run_id=meta["run_id"])
    sink = TensorBoardSink() if name == "tensorboard" else MindInsightSink()
    return [step for step, _ in sink.read_back(run).get("train/loss", [])]


def run_printed(command: str) -> subprocess.CompletedProcess:
    bin_dir = os.path.dirname(sys.executable)  # where `pip install msbridge` puts the command
    return subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"))


def check_under_load(tmp_path: Path, hogs: int, uri: str = "", experiment: str = "load") -> None:
    out = tmp_path / "runs"
    with cpu_hogs(hogs):
        job = subprocess.run([sys.executable, JOB, str(out), str(STEPS), *([uri, experiment] if uri else [])],
                             capture_output=True, text=True, timeout=900)
    assert job.returncode in (EXIT_OK, EXIT_UNDELIVERED), job.stderr[-3000:]
    run_dir = Path(job.stdout.split()[-1])
    lines = parse_lines(run_dir / "metrics" / "rank_0.jsonl")  # 0 malformed lines
    assert assert_covered(lines, list(range(1, STEPS + 1))) == [], "every step in jsonl, no gap"
    outcome = json.loads((run_dir / "run.json").read_text())["outcome"]
    assert outcome["status"] == "FINISHED"
    missing = outcome["not delivered"] if outcome["not delivered"] != "none" else {}
    assert (job.returncode == EXIT_UNDELIVERED) == bool(missing)
    assert set(missing) <= set(TRACKERS), missing
    uri = uri or f"sqlite:///{out / experiment / 'mlflow.db'}"
    for name in TRACKERS:
        if name in missing:
            command = f"msbridge replay {shlex.quote(str(run_dir))} --to {name}"
            assert missing[name].endswith(f"fill it: {command}"), missing[name]
            done = run_printed(command)
            assert done.returncode == 0, done.stderr[-3000:]
        held = tracker_steps(name, run_dir, uri, experiment)
        assert held == list(range(1, STEPS + 1)), f"{name}: every step, each once"


@pytest.mark.parametrize("hogs", [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
def test_every_step_in_jsonl_and_each_tracker_complete_or_named_embedded_mlflow(tmp_path, hogs):
    check_under_load(tmp_path, hogs)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """One ``mlflow server`` for the module's tests (an experiment each): its start is seconds of an alone test."""
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("hogs", [2, 4, 8])
def test_every_step_in_jsonl_and_each_tracker_complete_or_named_mlflow_server(tmp_path, mlflow_server, hogs):
    check_under_load(tmp_path, hogs, mlflow_server.uri, experiment=f"load-{hogs}")
