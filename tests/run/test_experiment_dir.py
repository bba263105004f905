"""Everything a run writes stays under the directories the user named; one default store for `compare`."""
from __future__ import annotations

import os
import textwrap

from helpers.training import train_regression
from mlflow.tracking import MlflowClient
import pytest

from msbridge import BridgeMonitor, load_config
from msbridge.cli.main import main
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

SINKS = {"jsonl": {}, "tensorboard": {}, "mlflow": {}, "mindinsight": {}}
STEPS = 12


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def train(config, cwd):
    os.makedirs(cwd, exist_ok=True)
    os.chdir(cwd)
    monitor = BridgeMonitor(config, progress=False)
    train_regression([monitor], steps=STEPS)
    return monitor


def test_readme_config_then_compare_with_no_flag(tmp_path, capsys, persistent):
    """The README's monitor.yaml (its MLflow store left at the default), then `msbridge compare tiny-lm`."""
    (tmp_path / "monitor.yaml").write_text(textwrap.dedent("""\
        experiment: tiny-lm
        run_name: tiny-lm-lr{optimizer.learning_rate}-{timestamp}
        output_dir: ./msbridge_runs/{experiment}/{run_name}
        flush_steps: 100
        sinks:
          jsonl: {}
          tensorboard: {}
          mlflow: {}
          mindinsight: {}
        params:
          optimizer: {learning_rate: 0.0003}
    """))
    monitor = train(load_config(str(tmp_path / "monitor.yaml")), tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["monitor.yaml", "mounts", "msbridge_runs"]
    exp = tmp_path / "msbridge_runs" / "tiny-lm"
    assert sorted(os.listdir(exp)) == sorted(["mlflow.db", "mlflow.db.lock", "mlartifacts", "tensorboard", "summary",
                                              os.path.basename(monitor.run_dir)])
    capsys.readouterr()
    assert main(["compare", "tiny-lm"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert os.path.basename(monitor.run_dir) in table[2] and f" {STEPS} " in table[2] and "FINISHED" in table[2]


def test_a_named_output_dir_holds_everything_the_run_writes(tmp_path, persistent):
    """`output_dir: /some/dir/x`: the stores go into x, never into /some/dir or the working directory."""
    named = tmp_path / "some" / "dir" / "x"
    monitor = train({"experiment": "exp", "run_name": "r1", "output_dir": str(named), "sinks": SINKS},
                    tmp_path / "cwd")
    assert monitor.run_dir == str(named)
    assert os.listdir(tmp_path / "some" / "dir") == ["x"]
    assert os.listdir(tmp_path / "cwd") == []
    top = {path.split(os.sep)[0] for path in files_under(named)}
    assert top == {"README.md", "run.json", ".msbridge-rank_0.lock", "metrics", "mlflow.db", "mlflow.db.lock",
                   "mlartifacts", "tensorboard", "summary"}
    client = MlflowClient(f"sqlite:///{named}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == STEPS
    assert run.info.artifact_uri.startswith(str(named / "mlartifacts"))


def test_experiment_dir_holds_the_stores_and_by_default_the_runs(tmp_path, persistent):
    exp_dir = tmp_path / "exps" / "{experiment}"
    monitor = train({"experiment": "e1", "run_name": "r1", "experiment_dir": str(exp_dir), "sinks": SINKS},
                    tmp_path / "cwd")
    exp = tmp_path / "exps" / "e1"
    assert monitor.run_dir == str(exp / "r1")
    assert sorted(os.listdir(exp)) == ["mlartifacts", "mlflow.db", "mlflow.db.lock", "r1", "summary", "tensorboard"]
    assert os.listdir(tmp_path / "cwd") == []
    # A run dir elsewhere keeps its stores in the experiment dir.
    apart = train({"experiment": "e1", "run_name": "r2", "experiment_dir": str(exp_dir),
                   "output_dir": str(tmp_path / "scratch" / "{run_name}"), "sinks": ["jsonl", "tensorboard"]},
                  tmp_path / "cwd")
    assert apart.run_dir == str(tmp_path / "scratch" / "r2")
    assert sorted(os.listdir(exp / "tensorboard")) == ["r1", "r2"]


def test_replay_writes_to_the_runs_recorded_experiment_dir(tmp_path, persistent):
    named = tmp_path / "named"
    monitor = train({"experiment": "exp", "run_name": "r1", "output_dir": str(named), "sinks": ["jsonl"]},
                    tmp_path / "cwd")
    assert main(["replay", monitor.run_dir, "--to", "tensorboard"]) == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(named / "tensorboard" / "r1" / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    want = read_run(monitor.run_dir).ranks[0].series("train/loss")
    assert [e.step for e in acc.Scalars("train/loss")] == [s for s, _ in want]
    assert sorted(os.listdir(tmp_path)) == ["cwd", "mounts", "named"]
