"""`msbridge sweep` over a mindformers run YAML: examples/mindformers/train.py (run_mindformer.py's flow) trains the
tiny Llama on CPU once per trial, its `MSBridgeMonitor` entry joins the trial, reports mindformers' own `do_eval`
evaluations and prunes through `request_stop`. The reference for each trial's learning rate is mindformers' own
log (MFLossMonitor's lines), and Optuna's trials are compared with MLflow's runs.

The swept key is `lr_schedule.learning_rate`: mindformers 1.9 reads the learning rate from `lr_schedule` (a run YAML
without one gets the template's cosine schedule at 5e-05) and never reads `optimizer.learning_rate` then, so
train.py refuses that key and names the one it reads.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindformers")
optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")

from helpers.mf_runs import EXAMPLE, close, do_eval_yaml, mf_lines, variant  # noqa: E402
from msbridge.sinks.runlog import read_run  # noqa: E402
from msbridge.sweep.trial import RUN_DIR_ATTR, read_outcome  # noqa: E402

pytestmark = pytest.mark.slow  # each trial is a mindformers process
optuna.logging.set_verbosity(optuna.logging.WARNING)
STEPS, EVERY, KEY, STUDY = 8, 4, "lr_schedule.learning_rate", "mf-sweep"
#: The run's callbacks, after mindformers' own evaluation (``do_eval_yaml``: PerplexityMetric every EVERY steps; eval
#: rows hold seq_length tokens, see tests/mindformers_bridge/test_do_eval.py). 8 steps: CosineWithWarmUpLR's warmup
#: (10 %) is 0 steps, so step 1 trains at the learning rate itself.
CALLBACKS_YAML = """callbacks:
  - type: MFLossMonitor
  - type: MSBridgeMonitor
    experiment: tiny-llama
    output_dir: ./msbridge_runs/{{experiment}}/{{run_name}}
    sinks: [jsonl, mlflow]
    flush_steps: {every}
"""


def cosine(learning_rate: float, step: int) -> float:
    """tiny_llama.yaml's lr_schedule (CosineWithWarmUpLR to lr_end 1e-3, no warmup step in 8) at ``step``, from the
    trial's ``learning_rate``: below lr_end it rises."""
    return 1e-3 + 0.5 * (learning_rate - 1e-3) * (1 + math.cos(math.pi * (step - 1) / STEPS))


def _eval_data(directory: Path) -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from make_data import make_mindrecord
    finally:
        sys.path.remove(str(EXAMPLE))
    make_mindrecord(str(directory), samples=8, seq_length=31, seed=1)  # rows of 32 tokens


def run_sweep(tmp: Path, text: str) -> subprocess.CompletedProcess:
    """``msbridge sweep`` on ``text`` (written to ``tmp/sweep.yaml``), in ``tmp``."""
    (tmp / "sweep.yaml").write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if k != "LOG_MF_PATH"}  # mindformers logs under each trial's WORK
    return subprocess.run([sys.executable, "-m", "msbridge.cli.main", "sweep", str(tmp / "sweep.yaml")], cwd=tmp,
                          env=dict(env, GLOG_v="3", MLFLOW_LOGGING_LEVEL="WARNING"), capture_output=True, text=True,
                          timeout=3000)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """4 trials, random sampling with seed 10: learning rates 0.00814, 0.00011, 0.00371, 0.00716; the median
    pruner stops trial 1 (it barely learns) at its first evaluation against trial 0."""
    tmp = tmp_path_factory.mktemp("mf_sweep")
    _eval_data(tmp / "eval")
    run_yaml = variant(tmp, "run.yaml", do_eval_yaml(EVERY, tmp / "eval") + CALLBACKS_YAML.format(every=EVERY))
    done = run_sweep(tmp, f"""\
        study: {STUDY}
        command: "{{python}} {EXAMPLE}/train.py --config {run_yaml} --steps {STEPS} --work {tmp}/work"
        params:
          {KEY}: {{low: 1.0e-4, high: 3.0e-2, log: true}}
        trials: 4
        jobs: 1
        sampler: {{type: random, seed: 10}}
        pruner: {{type: median, n_startup_trials: 1}}
        experiment_dir: {tmp}/runs/{{study}}
        """)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    directory = tmp / "runs" / STUDY
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{directory}/optuna.db")
    return tmp, study, f"sqlite:///{directory}/mlflow.db", done.stdout


def test_each_trial_trains_at_its_learning_rate_and_the_bad_one_is_pruned(swept):
    tmp, study, _, out = swept
    trials = study.get_trials()
    states = [t.state.name for t in trials]
    assert len(trials) == 4 and "FAIL" not in states and "COMPLETE" in states, (states, out)
    assert states[1] == "PRUNED" and trials[1].params[KEY] < 2e-4, (states, out)
    for trial in trials:
        printed = mf_lines(tmp / "work" / f"trial-{trial.number}")  # mindformers' own log of this trial
        outcome = read_outcome(trial.user_attrs[RUN_DIR_ATTR])
        last = outcome["last step"]
        assert sorted(printed) == list(range(1, last + 1)), (trial.number, sorted(printed))
        assert (last < STEPS) == (trial.state.name == "PRUNED") and outcome["status"] == (
            "PRUNED" if trial.state.name == "PRUNED" else "FINISHED")
        assert printed[1]["train/lr"] == pytest.approx(float(np.float32(trial.params[KEY])), rel=1e-6)
        assert [printed[s]["train/lr"] for s in range(1, last + 1)] == pytest.approx(
            [cosine(trial.params[KEY], s) for s in range(1, last + 1)], rel=1e-5)
        log = read_run(trial.user_attrs[RUN_DIR_ATTR]).ranks[0]
        series = log.series("train/lr")
        assert [s for s, _ in series] == list(range(1, last + 1))
        close(series, printed, "train/lr")
        evaluated = [s for s, _ in log.series("eval/loss")]
        assert evaluated == list(range(EVERY, last + 1, EVERY)), evaluated
        if trial.state.name == "PRUNED":
            assert trial.last_step == last == evaluated[-1]
            assert [e.step for e in log.events if e.kind == "pruned"] == [last]


def test_mlflow_runs_are_optunas_trials(swept):
    from mlflow.tracking import MlflowClient

    _, study, uri, _ = swept
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name(STUDY).experiment_id])
            if "msbridge.sweep_parent" not in r.data.tags}
    trials = study.get_trials()
    assert sorted(runs) == sorted(f"trial-{t.number}" for t in trials)
    for trial in trials:
        run = runs[f"trial-{trial.number}"]
        assert float(run.data.params[KEY]) == pytest.approx(trial.params[KEY], rel=1e-12)
        assert run.data.tags["msbridge.sweep_id"] == STUDY and run.info.status == "FINISHED"
        assert ("msbridge.event.pruned.last" in run.data.tags) == (trial.state.name == "PRUNED")
        if trial.state.name == "COMPLETE":
            assert run.data.metrics["objective/best"] == pytest.approx(trial.value)
    assert [n for n, r in runs.items() if r.data.tags.get("msbridge.best")] == [f"trial-{study.best_trial.number}"]


def test_a_key_the_run_yaml_does_not_have_is_refused_with_the_one_it_has(tmp_path):
    config = EXAMPLE / "tiny_llama.yaml"
    env = {k: v for k, v in os.environ.items() if k != "LOG_MF_PATH"}
    done = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--config", str(config), "--work",
                           str(tmp_path / "work"), "--optimizer.learning_rate=3e-4"], env=dict(env, GLOG_v="3"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = next(n for n, text in enumerate(config.read_text().splitlines(), 1) if text.startswith("optimizer:"))
    assert done.stderr.splitlines()[-1] == (f"train.py: error: {config}:{line}: --optimizer.learning_rate: not a key "
                                            f"of the run YAML; did you mean 'lr_schedule.learning_rate'?")
    assert not (tmp_path / "work" / "data").exists(), "nothing is written before the keys are checked"


def test_without_do_eval_a_sweep_on_the_training_loss_completes_with_its_best_step(tmp_path):
    """No evaluation: the sweep's `objective: {metric: train/loss}`; the trial is told its run's lowest training
    loss, the lowest MFLossMonitor printed (one trial: the first sweep already trains four learning rates)."""
    run_yaml = variant(tmp_path, "run.yaml", "callbacks:\n  - type: MFLossMonitor\n  - type: MSBridgeMonitor\n"
                                             "    experiment: tiny-llama\n    sinks: [jsonl]\n    flush_steps: 4\n")
    done = run_sweep(tmp_path, f"""\
        study: mf-train-loss
        command: "{{python}} {EXAMPLE}/train.py --config {run_yaml} --steps {STEPS} --work {tmp_path}/work"
        params:
          {KEY}: [0.003]
        trials: 1
        sampler: {{type: grid}}
        pruner: none
        objective: {{metric: train/loss, mode: min}}
        experiment_dir: {tmp_path}/runs/{{study}}
        """)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = optuna.load_study(study_name="mf-train-loss", storage=f"sqlite:///{tmp_path}/runs/mf-train-loss/optuna.db")
    trials = study.get_trials()
    assert [t.params[KEY] for t in trials] == [0.003] and {t.state.name for t in trials} == {"COMPLETE"}
    for trial in trials:
        printed = mf_lines(tmp_path / "work" / f"trial-{trial.number}")
        assert sorted(printed) == list(range(1, STEPS + 1))
        assert printed[1]["train/lr"] == pytest.approx(float(np.float32(trial.params[KEY])), rel=1e-6)
        lowest = min((p["train/loss"] for p in printed.values()), key=float)
        assert trial.value == pytest.approx(float(lowest), abs=lowest.half_ulp + 2e-6)
