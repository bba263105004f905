"""Two workers on one PostgreSQL study: `msbridge sweep SWEEP.yaml` and `msbridge sweep SWEEP.yaml --join`, each its
own process, as two hosts would run them. The study ends with exactly its trials, each run once by one worker."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from helpers.postgres import postgres  # noqa: F401  (the fixture)

from msbridge.sweep.trial import RUN_DIR_ATTR, read_outcome

optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")

pytestmark = pytest.mark.slow
TRIALS = 10

# One trial: msbridge.track over a loop whose loss falls faster with a larger lr; eval/loss every 5 steps.
TRIAL_SCRIPT = """\
import msbridge, msbridge.sweep
lr = msbridge.sweep.current()["lr"]
with msbridge.track({"sinks": ["jsonl"], "flush_steps": 5}, total_steps=10, progress=False) as run:
    for step in range(1, 11):
        run.step(loss=1.0 / (1.0 + lr * step))
        if step % 5 == 0:
            run.eval(loss=1.0 / (1.0 + lr * step))
"""


def test_two_workers_share_one_study_with_exact_counts(postgres, tmp_path):  # noqa: F811
    storage = postgres.create_database("optuna_join")
    (tmp_path / "trial.py").write_text(TRIAL_SCRIPT)
    (tmp_path / "sweep.yaml").write_text(textwrap.dedent(f"""\
        study: two-hosts
        command: "{{python}} {tmp_path}/trial.py"
        params:
          lr: {{low: 0.1, high: 10.0, log: true}}
        trials: {TRIALS}
        sampler: {{type: tpe, seed: 1, n_startup_trials: 3}}
        pruner: none
        storage: {storage}
        experiment_dir: {tmp_path}/runs/{{study}}
        """))
    env = dict(os.environ, GLOG_v="3")
    command = [sys.executable, "-m", "msbridge.cli.main", "sweep", str(tmp_path / "sweep.yaml")]
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    time.sleep(0.5)
    joined = subprocess.Popen([*command, "--join"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    outputs = [proc.communicate(timeout=600)[0] for proc in (first, joined)]
    assert [first.returncode, joined.returncode] == [0, 0], outputs
    ran = [[int(n) for n in re.findall(r"sweep: trial (\d+) COMPLETE", out)] for out in outputs]
    assert all(ran), outputs  # each worker ran some
    assert sorted(ran[0] + ran[1]) == list(range(TRIALS)), ran  # each trial once, by one worker
    study = optuna.load_study(study_name="two-hosts", storage=storage)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * TRIALS
    assert len({t.params["lr"] for t in trials}) == TRIALS
    for trial in trials:
        outcome = read_outcome(trial.user_attrs[RUN_DIR_ATTR])
        assert outcome["status"] == "FINISHED" and trial.value == pytest.approx(outcome["objective"]["best"])
    assert sorted(os.listdir(tmp_path / "runs" / "two-hosts" / "trials")) == \
        sorted(f"trial-{n}.log" for n in range(TRIALS))
