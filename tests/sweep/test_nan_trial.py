"""A learning rate that makes the loss NaN never wins a sweep: a user's own ``study.optimize`` with
``BridgeMonitor(config, trial=trial)`` over MindSpore's tutorial loop (``Model.fit`` with a validation set each
epoch), real Optuna on sqlite, real MLflow on sqlite. The bad trial ends FAIL or PRUNED and MLflow's best mark goes
to a trial that learned, also when it runs first (no pruner has anything to compare it with yet) and its first
evaluations were finite (its objective's best is a number from before it diverged)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import pytest
from helpers.training import regression_data
from mindspore import nn
from mindspore.train import Model
from mlflow.tracking import MlflowClient

from msbridge import BridgeMonitor
from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_TAG
from msbridge.adapters.mlflow_tracker.run.view import BEST_MARK, BEST_TAG
from msbridge.sweep.trial import RUN_DIR_ATTR, read_outcome, trial_value

optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")
optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[2]
EPOCHS, STEPS = 6, 10
#: Measured on this regressor (MindSpore 2.9.0, CPU): lr 1e4 gives a NaN loss from the first evaluation on; lr 1.0
#: evaluates to 6e10, 2e18, 3e28, 2e36, then inf; lr 0.01 and 0.003 learn.
NAN_AT_ONCE, DIVERGES_LATE = 1.0e4, 1.0


def _fit(monitor, lr):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=lr), metrics={"loss": nn.Loss()})
    model.fit(EPOCHS, regression_data(STEPS), valid_dataset=regression_data(3, seed=1), valid_frequency=1,
              callbacks=[monitor], dataset_sink_mode=False)


@pytest.mark.slow
@pytest.mark.parametrize("order, bad", [((DIVERGES_LATE, 0.01, 0.003), 0), ((0.01, NAN_AT_ONCE, 0.003), 1)],
                         ids=["diverges-late-first", "nan-second"])
def test_a_nan_learning_rate_is_fail_or_pruned_and_never_marked_best(tmp_path, order, bad):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db", study_name="nan",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    for lr in order:
        study.enqueue_trial({"lr": lr})

    def objective(trial):
        lr = trial.suggest_float("lr", 1.0e-4, NAN_AT_ONCE, log=True)
        cfg = {"experiment": "nan", "run_name": f"t{trial.number}", "experiment_dir": str(tmp_path / "nan"),
               "flush_steps": 5, "sinks": ["jsonl", "mlflow"]}
        monitor = BridgeMonitor(cfg, progress=False, trial=trial)
        _fit(monitor, lr)
        steps[trial.number] = read_outcome(monitor.run_dir)["last step"]
        return trial_value(monitor)

    steps = {}
    study.optimize(objective, n_trials=len(order), catch=(ValueError,))
    states = [t.state.name for t in study.trials]
    assert len(states) == 3 and states[bad] in ("FAIL", "PRUNED"), states
    assert all(states[i] == "COMPLETE" for i in range(3) if i != bad), states
    assert study.best_trial.number != bad and math.isfinite(study.best_value)
    assert steps[bad] < EPOCHS * STEPS == steps[(bad + 1) % 3]  # the bad one stopped early, the others trained
    client = MlflowClient(f"sqlite:///{tmp_path / 'nan' / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("nan").experiment_id])
            if PARENT_TAG not in r.data.tags}  # the sweep's parent run holds the trials
    assert set(runs) == {"t0", "t1", "t2"}
    marked = [name for name, r in runs.items() if r.data.tags.get(BEST_TAG) == BEST_MARK]
    assert marked == [f"t{study.best_trial.number}"]


@pytest.mark.slow
def test_msbridge_sweep_never_completes_the_nan_trial(tmp_path):
    """``msbridge sweep`` over examples/sweep/train.py (the demo model), a grid of two learning rates, one at
    which the loss is NaN: that trial ends FAIL or PRUNED in Optuna and in its run.json, MLflow marks the other."""
    (tmp_path / "sweep.yaml").write_text(f"""\
study: nan-sweep
command: "{{python}} {ROOT}/examples/sweep/train.py --steps 20 --eval-every 5 --sinks jsonl,mlflow"
params:
  optimizer.learning_rate: [{NAN_AT_ONCE}, 0.01]
  optimizer.warmup_steps: [1]
  model.hidden_size: [16]
  model.num_layers: [1]
trials: 2
sampler: {{type: grid, seed: 3}}
pruner: {{type: median, n_startup_trials: 1}}
experiment_dir: {tmp_path}/runs/{{study}}
""", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "sweep", str(tmp_path / "sweep.yaml")],
                          cwd=tmp_path, env=dict(os.environ, GLOG_v="3"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    directory = tmp_path / "runs" / "nan-sweep"
    study = optuna.load_study(study_name="nan-sweep", storage=f"sqlite:///{directory}/optuna.db")
    trials = {t.params["optimizer.learning_rate"]: t for t in study.get_trials()}
    assert sorted(trials) == [0.01, NAN_AT_ONCE]
    bad = trials[NAN_AT_ONCE]
    assert bad.state.name in ("FAIL", "PRUNED") and read_outcome(bad.user_attrs[RUN_DIR_ATTR])["status"] != "FINISHED"
    assert study.best_trial.number != bad.number and math.isfinite(study.best_value)
    client = MlflowClient(f"sqlite:///{directory / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("nan-sweep").experiment_id])
    marked = [r.info.run_name for r in runs if r.data.tags.get(BEST_TAG) == BEST_MARK]
    assert marked == [f"trial-{study.best_trial.number}"]
