"""A team's MLflow: ``mlflow server`` on a real PostgreSQL database, several trials of a sweep logging at once.

PostgreSQL is Debian's (``bash .ci/postgres.sh``), started per session on 127.0.0.1 by
``helpers.postgres``; every trial is a real demo training run in its own process (tests/helpers/sweep_job.py)."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.mlflow_reads import assert_same_series, steps
from helpers.postgres import pg_mlflow, postgres  # noqa: F401  (fixtures)
from helpers.sweep_job import EXPERIMENT
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_RUN_TAG, PARENT_TAG, parent_for, settle
from msbridge.adapters.mlflow_sink import LAST_STEP_TAG
from msbridge.offline.compare import compare

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[1] / "helpers" / "sweep_job.py"
LEARNING_RATES = (0.0003, 0.003, 0.03)
STEPS = 300


def sweep_runs(client, sweep_id):
    """(parents, children) of ``sweep_id``: active runs only."""
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return [], []
    parents = client.search_runs([exp.experiment_id], f"tags.`{PARENT_TAG}` = '{sweep_id}'")
    children = client.search_runs([exp.experiment_id], f"tags.`msbridge.sweep_id` = '{sweep_id}' and "
                                                       f"tags.`{PARENT_RUN_TAG}` != ''")
    return parents, children


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.5)


def test_parent_election_when_trials_start_at_the_same_instant(pg_mlflow):
    """Six trials ask for the sweep's parent at once (one client each); once each has ended, one parent
    is left active, it holds all six, and it is FINISHED."""
    client = MlflowClient(pg_mlflow.uri)
    experiment_id = client.create_experiment(f"race-{uuid.uuid4().hex[:8]}")
    started, running = threading.Barrier(6), threading.Barrier(6)

    def trial(_):
        mine = MlflowClient(pg_mlflow.uri)
        started.wait()
        parent = parent_for(mine, experiment_id, "s1")
        child = mine.create_run(experiment_id, tags={PARENT_RUN_TAG: parent.run_id}).info.run_id
        running.wait()  # every trial runs before any ends
        mine.set_terminated(child, "FINISHED")
        settle(mine, experiment_id, "s1", parent, child)
        return child

    with ThreadPoolExecutor(6) as pool:
        children = list(pool.map(trial, range(6)))
    (parent,) = client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = 's1'")
    assert parent.info.status == "FINISHED"
    assert all(client.get_run(c).data.tags[PARENT_RUN_TAG] == parent.info.run_id for c in children)
    every = client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = 's1'", run_view_type=ViewType.ALL)
    assert all(r.info.lifecycle_stage == "deleted" for r in every if r.info.run_id != parent.info.run_id)


def test_three_trials_at_once_land_under_one_parent_through_a_server_restart(pg_mlflow, tmp_path):
    """Three demo trials of one sweep log to the PostgreSQL-backed server at the same time; the server is
    SIGKILLed while they train and started again. Each ends a complete child run (every step of every
    metric, each once) of the one parent, with the same param keys."""
    sweep_id = uuid.uuid4().hex[:8]
    logs = [tmp_path / f"trial-{lr}.log" for lr in LEARNING_RATES]
    procs = [subprocess.Popen([sys.executable, str(JOB), "--out", str(tmp_path / "runs"), "--uri", pg_mlflow.uri,
                               "--sweep-id", sweep_id, "--lr", str(lr), "--steps", str(STEPS)],
                              stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
             for lr, log in zip(LEARNING_RATES, logs)]
    client = MlflowClient(pg_mlflow.uri)
    try:
        def all_logging():
            children = sweep_runs(client, sweep_id)[1]
            return len(children) == 3 and all(int(c.data.tags.get(LAST_STEP_TAG, 0)) >= 10 for c in children)

        wait_for(all_logging, 600, "three trials logging")
        pg_mlflow.kill()
        time.sleep(3)  # the trials train on and keep their records meanwhile
    finally:
        pg_mlflow.start()
    run_dirs = []
    for proc, log in zip(procs, logs):
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, log.read_text()[-3000:]
        run_dirs.append(out.strip().splitlines()[-1])
        assert "unreachable" in log.read_text()  # each trial was running when the server went down

    (parent,), children = sweep_runs(client, sweep_id)
    assert parent.info.status == "FINISHED" and len(children) == 3
    for run_dir in run_dirs:
        child = next(c for c in children if c.info.run_name == Path(run_dir).name)
        assert child.info.status == "FINISHED" and child.data.tags[PARENT_RUN_TAG] == parent.info.run_id
        assert steps(client, child.info.run_id) == list(range(1, STEPS + 1))
        assert_same_series(client, child.info.run_id, run_dir)  # every metric: same steps (each once), same values
    assert len({c.data.tags["msbridge.run_id"] for c in children}) == 3  # three jobs, one run each
    keys = [set(c.data.params) for c in children]
    assert keys[0] == keys[1] == keys[2]  # the compare view lines them up
    assert sorted(float(c.data.params["optimizer.learning_rate"]) for c in children) == list(LEARNING_RATES)
    table = compare(EXPERIMENT, pg_mlflow.uri)
    assert len(table.rows) == 3 and "optimizer.learning_rate" in table.differing
    pages = {re.search(r"open it: (\S+)", (Path(d) / "README.md").read_text()).group(1) for d in run_dirs}
    (page,) = pages  # every trial's README names the sweep's one saved view, on the team server
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert page.startswith(f"{pg_mlflow.uri.rstrip('/')}/#/experiments/{experiment.experiment_id}/runs?"), page
    key = urllib.parse.parse_qs(page.partition("/runs?")[2])["viewStateShareKey"][0]
    assert experiment.tags["mlflow.sharedViewState." + key], "the view the README opens is on the server"
