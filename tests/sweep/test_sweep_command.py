"""`msbridge sweep` end to end: a smaller examples/sweep (4 trials of the demo model, 2 at once, the median pruner),
then what Optuna, every trial's jsonl and run.json, and MLflow hold; examples/sweep/sweep.yaml itself (12 trials, also
in TensorBoard's HParams); and the faults: a failing command, a killed sweep's trial left RUNNING."""
from __future__ import annotations

import json
import os
import time
import urllib.request
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from msbridge.sinks.runlog import read_run
from msbridge.sweep.trial import RUN_DIR_ATTR, read_outcome

optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")

pytestmark = pytest.mark.slow  # each test starts processes (the fast tier: pytest -m 'not slow')
ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
GOOD_LRS, BAD_LR = (0.006, 0.01, 0.014), 1e-7
optuna.logging.set_verbosity(optuna.logging.WARNING)


def sweep(tmp_path: Path, text: str, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``msbridge sweep`` on ``text`` (written to ``tmp_path/sweep.yaml``; ``""``: the file already there), in
    ``tmp_path``."""
    path = tmp_path / "sweep.yaml"
    if text:
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    env = dict(os.environ, GLOG_v="3", MLFLOW_LOGGING_LEVEL="WARNING")
    return subprocess.run([sys.executable, "-m", "msbridge.cli.main", "sweep", str(path), *extra], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


def small_example(tmp_path: Path) -> str:
    """examples/sweep/sweep.yaml made small: 4 trials of a 1-layer model, 20 steps, evaluated every 5. Random
    sampling with seed 9 draws the learning rates 0.01, 0.014, 1e-7, 0.006: trial 2 does not learn and the
    median pruner stops it at its first evaluation (step 5) against the complete trials; no two trials tie."""
    return f"""\
        study: small-sweep
        command: "{{python}} {ROOT}/examples/sweep/train.py --steps {STEPS} --eval-every 5 --sinks jsonl,mlflow"
        params:
          optimizer.learning_rate: [{", ".join(map(str, GOOD_LRS))}, {BAD_LR}]
          optimizer.warmup_steps: [1]
          model.hidden_size: [16]
          model.num_layers: [1]
        trials: 4
        jobs: 2
        sampler: {{type: random, seed: 9}}
        pruner: {{type: median, n_startup_trials: 1}}
        experiment_dir: {tmp_path}/runs/{{study}}
        """


def mlflow_runs(uri: str, experiment: str) -> dict:
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {r.info.run_name: r for r in runs if "msbridge.sweep_parent" not in r.data.tags}


def check_jsonl(trial: optuna.trial.FrozenTrial, last: int = STEPS, every: int = 5) -> int:
    """The trial's jsonl holds every step from 1 to where it stopped (``last`` when it was not pruned), evaluated
    every ``every`` steps, and run.json says the same; returns that step."""
    run_dir = trial.user_attrs[RUN_DIR_ATTR]
    outcome = read_outcome(run_dir)
    log = read_run(run_dir).ranks[0]
    steps = [r.step for r in log.records if "train/loss" in r.values]
    assert steps == list(range(1, outcome["last step"] + 1)), (trial.number, steps)
    evaluated = [r.step for r in log.records if "eval/loss" in r.values]
    assert evaluated == list(range(every, steps[-1] + 1, every))
    pruned = [e.step for e in log.events if e.kind == "pruned"]
    if trial.state.name == "PRUNED":
        # at its last evaluation too, as in Optuna's own loop (report, then should_prune, every epoch up to the last)
        assert (outcome["status"], pruned) == ("PRUNED", [steps[-1]]) and steps[-1] <= last
        assert trial.last_step == steps[-1]
    else:
        assert (outcome["status"], pruned, steps[-1]) == ("FINISHED", [], last)
        assert trial.value == pytest.approx(outcome["objective"]["best"])
    return steps[-1]


def check_mlflow(study: optuna.Study, uri: str) -> None:
    """MLflow's runs are Optuna's trials (their params, state and objective), the best marked in both."""
    runs = mlflow_runs(uri, study.study_name)
    trials = study.get_trials()
    assert sorted(runs) == sorted(f"trial-{t.number}" for t in trials)
    for trial in trials:
        run = runs[f"trial-{trial.number}"]
        assert {k: type(v)(run.data.params[k]) for k, v in trial.params.items()} == trial.params
        assert run.info.status == "FINISHED" and run.data.tags["msbridge.sweep_id"] == study.study_name
        assert ("msbridge.event.pruned.last" in run.data.tags) == (trial.state.name == "PRUNED")
        if trial.state.name == "COMPLETE":
            assert run.data.metrics["objective/best"] == pytest.approx(trial.value)
    best = [name for name, run in runs.items() if run.data.tags.get("msbridge.best")]
    assert best == [f"trial-{study.best_trial.number}"]


def test_a_small_example_sweep_prunes_and_mlflow_holds_each_trial(tmp_path):
    done = sweep(tmp_path, small_example(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    directory = tmp_path / "runs" / "small-sweep"
    study = optuna.load_study(study_name="small-sweep", storage=f"sqlite:///{directory}/optuna.db")
    trials = study.get_trials()
    states = [t.state.name for t in trials]
    assert len(trials) == 4 and states.count("PRUNED") >= 1 and "FAIL" not in states, states
    assert states[2] == "PRUNED" and trials[2].params["optimizer.learning_rate"] == BAD_LR
    for trial in trials:
        check_jsonl(trial)
        line = f"[msbridge] sweep: trial {trial.number} {trial.state.name}"
        assert sum(ln.startswith(line) for ln in done.stdout.splitlines()) == 1, done.stdout
    check_mlflow(study, f"sqlite:///{directory}/mlflow.db")
    assert f"best: trial {study.best_trial.number} = " in done.stdout.splitlines()[-2]

    again = sweep(tmp_path, small_example(tmp_path))  # the study holds its 4 trials: a rerun runs none
    assert again.returncode == 0 and "4 trial(s) held, up to 0 to run" in again.stdout
    assert len(study.get_trials()) == 4


def hparams_sessions(logdir: str, count: int) -> dict:
    """TensorBoard's HParams table of ``logdir`` as its page asks for it (``/data/plugin/hparams/session_groups``
    on a real ``tensorboard --host 127.0.0.1``, msbridge view's): each session's hparams and metrics by run name,
    once it lists ``count`` sessions."""
    from msbridge.cli.viewers import tensorboard_viewer

    viewer = tensorboard_viewer(logdir, logdir)
    viewer.start()
    try:
        body = json.dumps({"experimentName": "", "startIndex": 0, "sliceSize": 1000, "colParams": [],
                           "allowedStatuses": ["STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING",
                                               "STATUS_UNKNOWN"]}).encode()
        deadline, groups = time.monotonic() + 180, []
        while len(groups) < count and time.monotonic() < deadline:
            time.sleep(2)
            if viewer.poll_ready():
                request = urllib.request.Request(viewer.base_url + "/data/plugin/hparams/session_groups", body,
                                                 {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=30) as resp:
                    groups = json.loads(resp.read()).get("sessionGroups", [])
    finally:
        viewer.terminate()
        viewer.wait_gone(time.monotonic() + 10)
    return {g["name"]: (g["hparams"], {m["name"]["tag"]: m["value"] for m in g["metricValues"]}) for g in groups}


def check_hparams(study: optuna.Study, logdir: str) -> None:
    """TensorBoard's HParams table shows the same trials: their values, state and objective."""
    trials = study.get_trials()
    sessions = hparams_sessions(logdir, len(trials))
    assert sorted(sessions) == sorted(f"trial-{t.number}" for t in trials)
    for trial in trials:
        hparams, metrics = sessions[f"trial-{trial.number}"]
        assert {k: hparams[k] for k in trial.params} == pytest.approx(trial.params)
        assert hparams["msbridge.trial_state"] == trial.state.name
        if trial.state.name == "COMPLETE":  # TensorBoard keeps float32
            assert metrics["hparams/objective_best"] == pytest.approx(trial.value, rel=1e-6)


def test_the_example_sweep_holds_what_docs_say(tmp_path):
    """examples/sweep/sweep.yaml as it is (run where its relative paths land in tmp_path): 12 trials, TPE and the
    median pruner, 2 at once; at least one PRUNED, none FAIL; every trial's jsonl complete up to the step where it
    stopped; MLflow's runs and TensorBoard's HParams table equal Optuna's trials, the best marked in MLflow and
    Optuna. On 2 CPUs shared with other jobs the sweep took 9 min 26 s to 22 min 31 s, this test 14 min 12 s
    (2026-12-06)."""
    example = ROOT / "examples" / "sweep" / "sweep.yaml"
    (tmp_path / "sweep.yaml").write_text(example.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # its command: {python} examples/sweep/train.py
    done = sweep(tmp_path, "", timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    directory = tmp_path / "msbridge_runs" / "demo-sweep"  # its experiment_dir: ./msbridge_runs/{study}
    study = optuna.load_study(study_name="demo-sweep", storage=f"sqlite:///{directory}/optuna.db")
    trials = study.get_trials()
    states = [t.state.name for t in trials]
    assert len(trials) == 12 and "PRUNED" in states and set(states) <= {"COMPLETE", "PRUNED"}, states
    assert "0 trial(s) held, up to 12 to run, 2 at once" in done.stdout.splitlines()[0]
    for trial in trials:
        check_jsonl(trial, last=150, every=25)
    check_mlflow(study, f"sqlite:///{directory}/mlflow.db")
    check_hparams(study, str(directory / "tensorboard"))
    assert f"best: trial {study.best_trial.number} = " in done.stdout.splitlines()[-2]


def test_a_failing_command_fails_its_trial_in_one_line_and_the_sweep_goes_on(tmp_path):
    """Trial 0 was left RUNNING by a killed sweep: told FAIL first. Then every trial's command exits 3: each is
    FAIL with the reason in one line, and every trial still runs; the sweep exits 1 (none of its trials worked)."""
    storage = f"sqlite:///{tmp_path}/runs/f/optuna.db"
    os.makedirs(tmp_path / "runs" / "f")
    optuna.create_study(study_name="f", storage=storage).ask()  # a trial a killed sweep left RUNNING
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('loading data')\nprint('FileNotFoundError: data/train.mindrecord')\n"
                      "sys.exit(3)\n")
    done = sweep(tmp_path, f"""\
        study: f
        command: "{{python}} {script}"
        params:
          lr: {{low: 0.001, high: 0.1, log: true}}
        trials: 3
        experiment_dir: {tmp_path}/runs/{{study}}
        """)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "[msbridge] sweep: trial 0 was left RUNNING by a sweep that ended: told FAIL" in lines
    failed = [ln for ln in lines if " FAIL: the command exited 3: FileNotFoundError: data/train.mindrecord" in ln]
    assert [ln.split()[3] for ln in failed] == ["1", "2"], lines
    study = optuna.load_study(study_name="f", storage=storage)
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL", "FAIL"]
    assert "FileNotFoundError" in study.get_trials()[1].user_attrs["msbridge.fail_reason"]
    assert "Traceback" not in done.stdout + done.stderr


def test_a_command_that_runs_no_monitor_is_said(tmp_path):
    done = sweep(tmp_path, f"""\
        study: n
        params:
          lr: [0.1]
        trials: 1
        experiment_dir: {tmp_path}/runs/{{study}}
        """, "--", sys.executable, "-c", "import sys; print(sys.argv[1:])")
    assert done.returncode == 1
    assert "trial 0 FAIL: the command ran no msbridge monitor" in done.stdout
    log = (tmp_path / "runs" / "n" / "trials" / "trial-0.log").read_text()
    assert json.loads(log.strip().replace("'", '"')) == ["--lr=0.1"]  # the trial's value, W&B's way


def test_a_trial_killed_mid_run_is_fail_with_its_jsonl_intact(tmp_path):
    """SIGTERM (a scheduler's kill) at step 6: the run ends KILLED with steps 1-6 in its jsonl; Optuna hears FAIL."""
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent("""\
        import os, signal, msbridge
        with msbridge.track({"sinks": ["jsonl"], "flush_steps": 4}, total_steps=20, progress=False) as run:
            for step in range(1, 21):
                run.step(loss=1.0 / step)
                if step == 6:
                    os.kill(os.getpid(), signal.SIGTERM)
        """))
    done = sweep(tmp_path, f"""\
        study: k
        command: "{{python}} {script}"
        params:
          lr: [0.1]
        trials: 1
        experiment_dir: {tmp_path}/runs/{{study}}
        """)
    assert done.returncode == 1
    assert "trial 0 FAIL: the command exited -15" in done.stdout, done.stdout
    trial = optuna.load_study(study_name="k", storage=f"sqlite:///{tmp_path}/runs/k/optuna.db").trials[0]
    assert trial.state.name == "FAIL"
    run_dir = trial.user_attrs[RUN_DIR_ATTR]
    assert read_outcome(run_dir)["status"] == "KILLED"
    assert [r.step for r in read_run(run_dir).ranks[0].records if "train/loss" in r.values] == list(range(1, 7))


def test_grid_runs_each_point_once_and_timeout_leaves_the_rest_waiting(tmp_path):
    """Grid: 2 x 2 points, 4 trials, 2 at once: each point once. Then a 1-s timeout on trials of 2 s: the trials
    it did not start stay WAITING, and the next run (no timeout) runs exactly those."""
    grid = f"""\
        study: g
        command: "{{python}} -c 'import time; time.sleep(2)'"
        sampler: {{type: grid, seed: 1}}
        params:
          lr: [0.1, 0.2]
          layers: {{low: 1, high: 2}}
        trials: 4
        jobs: 2
        experiment_dir: {tmp_path}/runs/{{study}}
        """
    done = sweep(tmp_path, grid.replace("jobs: 2", "jobs: 2\n        timeout: 1"))
    storage = f"sqlite:///{tmp_path}/runs/g/optuna.db"
    states = sorted(t.state.name for t in optuna.load_study(study_name="g", storage=storage).trials)
    assert states == ["FAIL", "FAIL", "WAITING", "WAITING"], done.stdout  # no monitor in the command: FAIL
    again = sweep(tmp_path, grid)
    assert "2 trial(s) held, up to 2 to run" in again.stdout
    trials = optuna.load_study(study_name="g", storage=storage).trials
    assert sorted((t.params["lr"], t.params["layers"]) for t in trials) == [(0.1, 1), (0.1, 2), (0.2, 1), (0.2, 2)]
    assert [t.state.name for t in trials] == ["FAIL"] * 4


def test_each_running_trial_holds_one_device(tmp_path):
    """devices: [3, 5], 2 at once: the two trials that start together see one device each, never the same, as
    Ascend and CUDA number it (visible devices) and MindSpore reads it (DEVICE_ID 0)."""
    script = tmp_path / "device.py"
    script.write_text("import os, time\nprint(*(os.environ[k] for k in ('ASCEND_RT_VISIBLE_DEVICES', "
                      "'CUDA_VISIBLE_DEVICES', 'DEVICE_ID', 'MSBRIDGE_SWEEP_DEVICE')))\ntime.sleep(1)\n")
    done = sweep(tmp_path, f"""\
        study: dev
        command: "{{python}} {script}"
        params:
          lr: [0.1, 0.2, 0.3, 0.4]
        trials: 4
        jobs: 2
        devices: [3, 5]
        experiment_dir: {tmp_path}/runs/{{study}}
        """)
    logs = [(tmp_path / "runs" / "dev" / "trials" / f"trial-{n}.log").read_text().split() for n in range(4)]
    assert all(log[:4] in (["3", "3", "0", "3"], ["5", "5", "0", "5"]) for log in logs), logs
    assert {logs[0][0], logs[1][0]} == {"3", "5"}, done.stdout  # started together: one device each
