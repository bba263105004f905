"""Two workers on one PostgreSQL study: `msbridge sweep SWEEP.yaml` and `msbridge sweep SWEEP.yaml --join`, each its
own process started at once, as two hosts would run them, both logging to one real `mlflow server` on PostgreSQL.
Counted from the stores: the study ends with exactly its trials, each run once by one worker; MLflow holds one run
per trial in one experiment, each worker's runs as many as it ran, and one saved view of the sweep that shows each
trial's state beside its objective, as stored on the server (its REST API)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.parse
import urllib.request

import pytest
from helpers.postgres import pg_mlflow, postgres  # noqa: F401  (the fixtures)

from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_TAG, SWEEP_TAG
from msbridge.adapters.mlflow_tracker.run.view import BEST_MARK, BEST_TAG, STATE_TAG, VIEW_TAG_PREFIX
from msbridge.names import OBJECTIVE_BEST
from msbridge.sweep.trial import RUN_DIR_ATTR, read_outcome

optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")
pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'msbridge[mlflow]'")

pytestmark = pytest.mark.slow
TRIALS = 20
STUDY = "two-hosts"
WORKERS = ("host-a", "host-b")

# One trial: msbridge.track over 10 steps whose loss falls faster with a larger lr, eval/loss every 5 steps; jsonl
# and MLflow, the worker's name (its host) a run tag. On 2 CPUs shared with other jobs, MLflow's client took over
# the default close bound (35 s) to start and deliver: the close may take 300 s here.
TRIAL_SCRIPT = """\
import os, sys, msbridge, msbridge.sweep
lr = msbridge.sweep.current()["lr"]
mlflow = {"tracking_uri": sys.argv[1], "backoff_initial": 0.5, "backoff_max": 2.0, "close_timeout": 300.0}
config = {"sinks": {"jsonl": {}, "mlflow": mlflow}, "flush_steps": 5, "tags": {"worker": os.environ["WORKER"]}}
with msbridge.track(config, total_steps=10, progress=False) as run:
    for step in range(1, 11):
        run.step(loss=1.0 / (1.0 + lr * step))
        if step % 5 == 0:
            run.eval(loss=1.0 / (1.0 + lr * step))
"""


def _rest(server, path, body=None):
    """MLflow's REST API of the server, as any team member's browser or script reads it."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{server.uri}/api/2.0/mlflow/{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def _run_workers(tmp_path, storage, tracking_uri):
    """The two workers started at once, each as its own host would (its name in WORKER); their outputs."""
    (tmp_path / "trial.py").write_text(TRIAL_SCRIPT)
    (tmp_path / "sweep.yaml").write_text(textwrap.dedent(f"""\
        study: {STUDY}
        command: "{{python}} {tmp_path}/trial.py {tracking_uri}"
        params:
          lr: {{low: 0.1, high: 10.0, log: true}}
        trials: {TRIALS}
        sampler: {{type: tpe, seed: 1, n_startup_trials: 3}}
        pruner: none
        storage: {storage}
        experiment_dir: {tmp_path}/runs/{{study}}
        """))
    command = [sys.executable, "-m", "msbridge.cli.main", "sweep", str(tmp_path / "sweep.yaml")]
    procs = [subprocess.Popen(command + (["--join"] if worker != WORKERS[0] else []), cwd=tmp_path,
                              env=dict(os.environ, GLOG_v="3", WORKER=worker), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for worker in WORKERS]
    outputs = [proc.communicate(timeout=900)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    return outputs


def test_two_workers_share_one_study_and_one_mlflow_experiment_with_exact_counts(postgres, pg_mlflow,  # noqa: F811
                                                                                 tmp_path):
    storage = postgres.create_database("optuna_join")
    outputs = _run_workers(tmp_path, storage, pg_mlflow.uri)

    ran = {worker: [int(n) for n in re.findall(r"sweep: trial (\d+) COMPLETE", out)]
           for worker, out in zip(WORKERS, outputs)}
    assert all(ran.values()), outputs  # each worker ran some
    assert sorted(ran[WORKERS[0]] + ran[WORKERS[1]]) == list(range(TRIALS)), ran  # each trial once, by one worker

    trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials()
    assert [t.number for t in trials] == list(range(TRIALS))
    assert [t.state.name for t in trials] == ["COMPLETE"] * TRIALS
    assert len({t.params["lr"] for t in trials}) == TRIALS
    for trial in trials:
        outcome = read_outcome(trial.user_attrs[RUN_DIR_ATTR])
        assert outcome["status"] == "FINISHED" and trial.value == pytest.approx(outcome["objective"]["best"])

    experiments = [e for e in _rest(pg_mlflow, "experiments/search", {"max_results": 100})["experiments"]
                   if e["name"] != "Default"]
    assert [e["name"] for e in experiments] == [STUDY]  # both workers' runs in one experiment
    experiment = experiments[0]
    found = _rest(pg_mlflow, "runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 1000,
                                             "run_view_type": "ACTIVE_ONLY"})["runs"]
    runs = {r["info"]["run_name"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} | {
        "params": {p["key"]: p["value"] for p in r["data"].get("params", [])},
        "metrics": {m["key"]: m["value"] for m in r["data"].get("metrics", [])}, "status": r["info"]["status"]}
        for r in found}
    parents = [name for name, run in runs.items() if PARENT_TAG in run]
    assert parents == [f"sweep-{STUDY}"]  # one parent: the loser of the two workers' race was deleted
    children = {name: run for name, run in runs.items() if PARENT_TAG not in run}
    assert sorted(children) == sorted(f"trial-{n}" for n in range(TRIALS))  # one run per trial, none twice
    for worker in WORKERS:
        mine = sorted(int(name.split("-")[1]) for name, run in children.items() if run["worker"] == worker)
        assert mine == sorted(ran[worker]), worker
    by_number = {t.number: t for t in trials}
    for name, run in children.items():
        trial = by_number[int(name.split("-")[1])]
        assert (run["status"], run[STATE_TAG], run[SWEEP_TAG]) == ("FINISHED", "COMPLETE", STUDY)
        assert float(run["params"]["lr"]) == pytest.approx(trial.params["lr"])
        assert run["metrics"][OBJECTIVE_BEST] == pytest.approx(trial.value)
    best = optuna.load_study(study_name=STUDY, storage=storage).best_trial
    assert [name for name, run in children.items() if run.get(BEST_TAG) == BEST_MARK] == [f"trial-{best.number}"]

    # the sweep's saved view, written by the runs as they closed (no `msbridge view`): one, as the server stores it
    query = urllib.parse.urlencode({"experiment_name": STUDY})
    tags = {t["key"]: t["value"] for t in _rest(pg_mlflow, f"experiments/get-by-name?{query}")["experiment"]["tags"]}
    assert [key for key in tags if key.startswith(VIEW_TAG_PREFIX)] == [f"{VIEW_TAG_PREFIX}msbridge-sweep-{STUDY}"]
    view = json.loads(tags[f"{VIEW_TAG_PREFIX}msbridge-sweep-{STUDY}"])
    columns = view["selectedColumns"]
    assert columns[columns.index(f"tags.`{STATE_TAG}`") + 1] == f"metrics.`{OBJECTIVE_BEST}`"
    assert "params.`lr`" in columns and f"tags.`{BEST_TAG}`" in columns
    assert view["searchFilter"].startswith(f"tags.`{SWEEP_TAG}` = '{STUDY}'")
    assert sorted(os.listdir(tmp_path / "runs" / STUDY / "trials")) == sorted(f"trial-{n}.log" for n in range(TRIALS))
