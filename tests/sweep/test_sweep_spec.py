"""SWEEP.yaml is checked whole before any trial: every problem at its file, line and key, the nearest valid key
for a misspelt one, and `msbridge sweep` says them as one error with no traceback and nothing created."""
from __future__ import annotations

import inspect
import os
import sys
import textwrap
from pathlib import Path

import pytest

from msbridge.cli.main import main
from msbridge.errors import ConfigError, MissingDependencyError
from msbridge.sweep.runner import trial_command
from msbridge.sweep.spec import PRUNER_ARGS, SAMPLER_ARGS, load_spec
from msbridge.sweep.study import make_pruner, make_sampler, open_study

optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
study: s1
command: "{python} train.py --steps 10"
params:
  optimizer.learning_rate: {low: 1.0e-4, high: 1.0, log: true}
  model.hidden: [64, 128, 256]
  train.batch_size: {low: 8, high: 32, step: 8}
trials: 6
jobs: 2
sampler: {type: tpe, seed: 3, n_startup_trials: 2}
pruner: {type: hyperband, min_resource: 5, reduction_factor: 3}
objective: {metric: eval/accuracy, mode: max}
"""


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def problems(path: str, command=()) -> list:
    with pytest.raises(ConfigError) as info:
        load_spec(path, command)
    return info.value.problems


def test_a_good_file_reads_as_written(tmp_path):
    spec = load_spec(write(tmp_path, GOOD + f"experiment_dir: {tmp_path}/runs/{{study}}\n"))
    assert (spec.study, spec.trials, spec.jobs, spec.metric, spec.mode) == ("s1", 6, 2, "eval/accuracy", "max")
    lr, hidden, batch = (spec.params[n] for n in ("optimizer.learning_rate", "model.hidden", "train.batch_size"))
    assert (lr.kind, lr.log, hidden.kind, hidden.choices, batch.kind, batch.grid()) == \
        ("float", True, "categorical", (64, 128, 256), "int", [8, 16, 24, 32])
    assert spec.storage_url == f"sqlite:///{tmp_path}/runs/s1/optuna.db"
    assert trial_command(spec, {"optimizer.learning_rate": 0.01, "model.hidden": 64}) == \
        [sys.executable, "train.py", "--steps", "10", "--optimizer.learning_rate=0.01", "--model.hidden=64"]
    # the words after `--` take the file's command's place
    assert load_spec(spec.path, ["python", "other.py"]).command == ("python", "other.py")
    study = open_study(spec)  # Optuna takes every argument as written
    assert isinstance(study.sampler, optuna.samplers.TPESampler) and study.direction.name == "MAXIMIZE"
    assert isinstance(study.pruner, optuna.pruners.HyperbandPruner)


def test_every_problem_is_said_at_its_line_with_the_nearest_key(tmp_path):
    path = write(tmp_path, """\
        study: s1
        comand: python train.py
        params:
          lr: {low: 1.0, high: 1.0e-4, log: true}
          wd: {low: 0, high: 0.1, log: true}
          layers: {low: 1, hihg: 4}
          act: []
          drop: {low: 0.0, high: 0.5, step: 0.1, log: true}
        trials: 0
        jobs: two
        sampler: {type: tpee, seed: 1}
        pruner: {type: median, n_warmup_step: 5}
        objective: {metric: eval/loss, mode: minimum, metirc: x}
        """)
    said = problems(path)
    expected = [
        ":2: comand: unknown key; did you mean 'command'?",
        ":4: params.lr.high: must be >= low, which is 1.0; got 0.0001",
        ":5: params.wd.low: must be > 0 with log: true; got 0",
        ":6: params.layers.hihg: unknown key; did you mean 'high'?",
        ":6: params.layers: a range needs high",
        ":7: params.act: expected a non-empty list of plain choices",
        ":8: params.drop.step: cannot be used with log: true",
        ":9: trials: expected an integer >= 1, got 0",
        ":10: jobs: expected an integer >= 1 and < 257, got 'two'",
        ":11: sampler.type: expected one of tpe, random, grid, cmaes, got 'tpee'; did you mean 'tpe'?",
        ":12: pruner.n_warmup_step: unknown argument of pruner median; did you mean 'n_warmup_steps'?",
        ":13: objective.mode: expected one of min, max, got 'minimum'",
        ":13: objective.metirc: unknown key; did you mean 'metric'?",
        ": command: no training command",
    ]
    for part in expected:
        assert sum(part in line for line in said) == 1, (part, said)
    assert all(line.startswith(path) for line in said), said
    assert len(said) == len(expected), said


def test_grid_needs_something_to_enumerate(tmp_path):
    path = write(tmp_path, """\
        study: g
        command: python t.py
        sampler: grid
        params:
          lr: {low: 0.001, high: 0.1}
          wd: {low: 0.0, high: 0.2, step: 0.1}
        """)
    assert problems(path) == [f"{path}:5: params.lr: the grid sampler needs a list of choices or a step to enumerate"]
    fixed = write(tmp_path, Path(path).read_text().replace("{low: 0.001, high: 0.1}", "[0.001, 0.1]"), "g2.yaml")
    spec = load_spec(fixed)
    assert spec.params["wd"].grid() == [0.0, 0.1, 0.2]
    assert isinstance(make_sampler(spec), optuna.samplers.GridSampler)


def test_the_argument_names_offered_are_optunas_own():
    """SWEEP.yaml's sampler and pruner arguments are checked without Optuna: each name exists in Optuna 5."""
    classes = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
               "grid": optuna.samplers.GridSampler, "cmaes": optuna.samplers.CmaEsSampler,
               "median": optuna.pruners.MedianPruner, "hyperband": optuna.pruners.HyperbandPruner,
               "successive_halving": optuna.pruners.SuccessiveHalvingPruner}
    for name, arguments in {**SAMPLER_ARGS, **PRUNER_ARGS}.items():
        if name in classes:
            assert set(arguments) <= set(inspect.signature(classes[name]).parameters), name
    assert isinstance(make_pruner({"type": "none"}), optuna.pruners.NopPruner)
    with pytest.raises(ConfigError, match="pruner: Optuna refuses these arguments of median"):
        make_pruner({"type": "median", "n_warmup_steps": -1})


def test_cmaes_without_its_package_says_the_fix(tmp_path):
    pytest.importorskip("msbridge")
    if __import__("importlib").util.find_spec("cmaes") is not None:
        pytest.skip("cmaes is installed here")
    spec = load_spec(write(tmp_path, "study: c\ncommand: x\nsampler: cmaes\nparams: {lr: {low: 0.1, high: 1.0}}\n"))
    with pytest.raises(MissingDependencyError, match="pip install cmaes"):
        make_sampler(spec)


def test_the_command_line_says_a_bad_file_in_one_error_and_creates_nothing(tmp_path, capsys):
    path = write(tmp_path, f"study: s\ncommand: python t.py\nexperiment_dir: {tmp_path}/runs\n"
                           "params:\n  lr: {low: 0.1, hihg: 1.0}\n")
    assert main(["sweep", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5: params.lr.hihg: unknown key; did you mean 'high'?" in err
    assert "Traceback" not in err and err.startswith("msbridge: error: ")
    assert not os.path.exists(tmp_path / "runs")  # no study, no trial


def test_the_example_sweep_file_is_valid():
    spec = load_spec(str(ROOT / "examples" / "sweep" / "sweep.yaml"))
    assert (spec.study, spec.trials, spec.jobs, spec.sampler["type"], spec.pruner["type"]) == \
        ("demo-sweep", 12, 2, "tpe", "median")


def test_without_optuna_the_fix_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # what `import optuna` meets where it is not installed
    path = write(tmp_path, f"study: s\ncommand: python t.py\nparams: {{lr: [0.1]}}\nexperiment_dir: {tmp_path}/r\n")
    assert main(["sweep", path]) == 2
    err = capsys.readouterr().err
    assert "msbridge sweep needs the Python package 'optuna', which is not installed; fix: pip install " \
           "'msbridge[sweep]'" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "r")


@pytest.mark.parametrize("storage, said", [
    ("postgresql+psycopg://me:hunter2@127.0.0.1:1/optuna", "Connection refused"),
    ("notadb://x", "Can't load plugin"),
])
def test_a_storage_that_cannot_be_opened_is_one_line_before_any_trial(tmp_path, capsys, storage, said):
    path = write(tmp_path, f"study: s\ncommand: python t.py\nparams: {{lr: [0.1]}}\nstorage: {storage}\n"
                           f"experiment_dir: {tmp_path}/r\n")
    assert main(["sweep", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"msbridge: error: {path}: storage: cannot open the Optuna storage ") and said in err
    assert "hunter2" not in err and "Traceback" not in err and not os.path.exists(tmp_path / "r" / "trials")


def test_devices_are_distinct_ids_at_least_jobs_of_them(tmp_path):
    head = "study: d\ncommand: python t.py\nparams: {lr: [0.1]}\n"
    assert load_spec(write(tmp_path, head + "jobs: 2\ndevices: [0, 3, npu5]\n")).devices == ("0", "3", "npu5")
    path = write(tmp_path, head + "jobs: 3\ndevices: [0, 3]\n", "few.yaml")
    assert problems(path) == [f"{path}:4: jobs: must be <= the number of devices (2): each running trial holds one"]
    path = write(tmp_path, head + "devices: [1, 1]\n", "twice.yaml")
    assert problems(path) == [f"{path}:4: devices: expected a list of distinct device ids (integers >= 0 or names), "
                              "got [1, 1]"]
