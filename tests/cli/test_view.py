"""`msbridge view`: the demo's run in MLflow, TensorBoard and MindInsight, as a browser would fetch it.

The slow test runs `msbridge demo` with every sink, then the `msbridge view`
command the demo printed, in a fresh shell from the repo root. It fetches each
viewer's page and the data API behind the loss chart, checks the loss is served
at every step with the jsonl's values, checks every server binds 127.0.0.1 only,
then presses Ctrl-C and checks no server process is left.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from helpers.mindinsight_server import MindInsight, require_mindinsight
from helpers.processes import alive, listening
from helpers.training import train_regression
from helpers.view_process import ViewProcess, base, get
from mlflow.tracking import MlflowClient
from msbridge.adapters.mindinsight_sink import mindinsight_tag

from msbridge import BridgeMonitor
from msbridge.bench.servers import MlflowServer
from msbridge.cli import view as view_module
from msbridge.cli import viewers
from msbridge.cli.main import main
from msbridge.cli.view import find_target
from msbridge.names import LOSS
from msbridge.sinks.runlog import read_run

MSBRIDGE = str(Path(sys.executable).parent / "msbridge")
STEPS = 60


def poll(fetch, count, what, timeout=90.0):
    """``fetch()`` until it returns ``count`` points (a viewer loads event files in the background)."""
    deadline = time.monotonic() + timeout
    while len(points := fetch()) < count and time.monotonic() < deadline:
        time.sleep(1)
    assert len(points) >= count, f"{what}: {len(points)} of {count} points within {timeout:.0f} s"
    return points


def same_series(what, got, want):
    """Step coverage first, then the values."""
    assert [s for s, _ in got] == [s for s, _ in want], f"{what}: steps differ"
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), f"{what}: values differ"


def check_mlflow(url, run_page, run_id, want):
    """``url`` opens the run's charts in MLflow's model-training view, the loss chart first (a saved view in an
    experiment tag); ``run_page`` is the run's page in that view; both show the run's loss at every step."""
    assert "<html" in get(base(url) + "/").lower()
    path, query = urllib.parse.urlsplit(url).fragment.split("?")  # /experiments/<id>/runs?viewStateShareKey=...
    asked = urllib.parse.parse_qs(query)
    assert asked["workflowType"] == ["machine_learning"] and asked["compareRunsMode"] == ["CHART"]
    exp_id = path.split("/")[2]
    api = base(url) + "/api/2.0/mlflow"
    tags = {t["key"]: t["value"] for t in get(f"{api}/experiments/get?experiment_id={exp_id}")["experiment"]["tags"]}
    view = json.loads(tags["mlflow.sharedViewState." + asked["viewStateShareKey"][0]])
    assert [s["name"] for s in view["compareRunSections"]][0] == "train" and view["isAccordionReordered"]
    assert view["compareRunCharts"][0]["metricKey"] == "train/loss"
    run_path, run_query = urllib.parse.urlsplit(run_page).fragment.split("?")
    assert run_query == "workflowType=machine_learning"
    mlflow_run = run_path.rsplit("/", 1)[1]
    assert view["searchFilter"] == f"attributes.run_id = '{mlflow_run}'"
    run = get(f"{api}/runs/get?run_id={mlflow_run}")["run"]
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["msbridge.run_id"] == run_id
    history = get(f"{api}/metrics/get-history?run_id={mlflow_run}&metric_key=train/loss&max_results=100000")
    same_series("mlflow", sorted((m["step"], m["value"]) for m in history["metrics"]), want)


def check_tensorboard(url, want):
    assert "<html" in get(url).lower()
    pinned = json.loads(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["pinnedCards"][0])
    assert pinned[0] == {"plugin": "scalars", "tag": "train/loss"}
    assert urllib.parse.urlsplit(url).fragment == "timeseries"
    api = base(url) + "/data/plugin/scalars/scalars?run=rank_0&tag=train/loss"
    points = poll(lambda: get(api), len(want), "tensorboard")
    same_series("tensorboard", [(p[1], p[2]) for p in points], want)


def check_mindinsight(url, run_dir, want):
    assert "<html" in get(base(url) + "/").lower()
    train_id = urllib.parse.parse_qs(urllib.parse.urlsplit(url).fragment.split("?", 1)[1])["id"][0]
    assert train_id == f"./{Path(run_dir).name}_rank_0"
    client = MindInsight(urllib.parse.urlsplit(url).port)
    assert train_id in client.train_jobs()  # GET /v1/mindinsight/datavisual/train-jobs
    points = poll(lambda: client.scalars(train_id, f"{mindinsight_tag(LOSS)}/scalar"), len(want), "mindinsight")
    same_series("mindinsight", [(p["step"], p["value"]) for p in points], want)


@pytest.mark.slow
def test_demo_then_view_serves_every_step_of_the_loss_in_every_viewer(tmp_path):
    require_mindinsight()
    demo = subprocess.run([MSBRIDGE, "demo", "--steps", str(STEPS), "--out", str(tmp_path / "runs")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, GLOG_v="3"))
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    run_dir = next(line.split(": ", 1)[1] for line in demo.stdout.splitlines() if line.startswith("  run dir"))
    (command,) = [line.strip() for line in demo.stdout.splitlines() if line.strip().startswith(f"{MSBRIDGE} view ")]
    log = read_run(run_dir).ranks[0]
    want = log.series("train/loss")
    assert [s for s, _ in want] == list(range(1, STEPS + 1))
    with ViewProcess(command) as view:
        urls = view.wait_serving()
        assert sorted(urls) == ["mindinsight", "mlflow", "tensorboard"], view.lines
        [run_page] = [line.split(": ", 1)[1] for line in view.lines if line.startswith("  mlflow run   : ")]
        check_mlflow(urls["mlflow"], run_page, log.header["run_id"], want)
        check_tensorboard(urls["tensorboard"], want)
        check_mindinsight(urls["mindinsight"], run_dir, want)
        bound = listening(view.processes)
        assert {addr for addr, _, _ in bound} == {"127.0.0.1"}, bound
        assert {urllib.parse.urlsplit(u).port for u in urls.values()} <= {port for _, port, _ in bound}
        assert view.interrupt() == 0, view.lines
        assert view.lines[-1] == "[msbridge] stopped mlflow, tensorboard, mindinsight", view.lines
        assert not alive(view.processes), [open(f"/proc/{p}/cmdline").read() for p in alive(view.processes)]


@pytest.mark.slow
def test_view_of_an_experiment_dir_shows_every_run_and_stops_on_sigterm(tmp_path):
    for name in ("r1", "r2"):
        monitor = BridgeMonitor({"experiment": "v", "run_name": name, "experiment_dir": str(tmp_path / "exp"),
                                 "sinks": ["jsonl", "tensorboard"]}, progress=False)
        train_regression([monitor], steps=6)
    with ViewProcess(f"{MSBRIDGE} view {tmp_path / 'exp'}") as view:
        urls = view.wait_serving()
        assert sorted(urls) == ["tensorboard"], view.lines
        # one line says what starts (before the wait), one line when it answers, with how long it took
        assert view.lines[1] == (f"  tensorboard  : starting TensorBoard on {base(urls['tensorboard'])} for "
                                 f"{tmp_path / 'exp' / 'tensorboard'}; its page follows when it answers"), view.lines
        assert re.fullmatch(r"  tensorboard  : http://\S+ \(answered after \d+ s\)", view.lines[2]), view.lines
        runs = poll(lambda: get(base(urls["tensorboard"]) + "/data/runs"), 4, "tensorboard runs")
        assert sorted(runs) == ["r1", "r1/rank_0", "r2", "r2/rank_0"]
        assert view.interrupt(sig=signal.SIGTERM) == 0 and not alive(view.processes), view.lines


@pytest.mark.slow
def test_view_finds_stores_a_config_gave_relative_to_where_training_ran(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monitor = BridgeMonitor({"experiment": "v", "run_name": "r1", "output_dir": str(tmp_path / "runs" / "{run_name}"),
                             "sinks": {"jsonl": {}, "tensorboard": {"logdir": "./tb"},
                                       "mlflow": {"tracking_uri": "sqlite:///./store/mlflow.db"}}}, progress=False)
    train_regression([monitor], steps=6)
    monkeypatch.chdir(tmp_path)
    target = find_target(monitor.run_dir)
    assert target.stores == {"tensorboard": str(tmp_path / "work" / "tb" / "r1"),
                             "mlflow": f"sqlite:///{tmp_path / 'work' / 'store' / 'mlflow.db'}"}
    assert os.path.isdir(target.stores["tensorboard"]) and os.path.isfile(tmp_path / "work" / "store" / "mlflow.db")


@pytest.mark.slow  # a fresh MLflow server: ~40 s here
def test_a_run_on_a_tracking_server_gets_its_run_page_there(tmp_path, capsys):
    with MlflowServer(str(tmp_path / "server")) as server:
        monitor = BridgeMonitor({"experiment": "remote", "run_name": "r1", "output_dir": str(tmp_path / "{run_name}"),
                                 "sinks": {"jsonl": {}, "mlflow": {"tracking_uri": server.uri}}}, progress=False)
        train_regression([monitor], steps=6)
        capsys.readouterr()
        assert main(["view", monitor.run_dir]) == 0  # nothing to start: the URL is printed
        line = capsys.readouterr().out.splitlines()[1]
        client = MlflowClient(server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("remote").experiment_id])
        page = (f"{server.uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
                "?workflowType=machine_learning")
        assert line == f"  mlflow       : {page} (the run's tracking server; nothing started)"


def jsonl_and_mindinsight_run(tmp_path):
    monitor = BridgeMonitor({"experiment": "v", "run_name": "r1", "output_dir": str(tmp_path / "exp" / "{run_name}"),
                             "sinks": ["jsonl", "mindinsight"]}, progress=False)
    train_regression([monitor], steps=6)
    return monitor.run_dir


@pytest.mark.slow
def test_view_without_mindinsight_says_the_one_command_that_builds_it(tmp_path, capsys, monkeypatch):
    run_dir = jsonl_and_mindinsight_run(tmp_path)
    monkeypatch.setattr(viewers, "MINDINSIGHT_VENV", tmp_path / "no-venv")
    assert main(["view", run_dir]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"  mindinsight  : not started: its venv {tmp_path / 'no-venv'} is missing; build it with: "
                        f"bash {viewers.MINDINSIGHT_BUILD} (about a minute, ~470 MB), or add --build-mindinsight to "
                        "this command")
    assert viewers.MINDINSIGHT_BUILD.is_file()


def test_view_builds_mindinsight_on_request(tmp_path, capsys, monkeypatch):
    """``--build-mindinsight`` runs the build script, then starts MindInsight from what it built. The script here
    stands in for .ci/mindinsight_venv.sh (a real build takes about a minute and 470 MB): it links the project's
    real MindInsight venv's programs into the new venv dir."""
    require_mindinsight()
    run_dir = jsonl_and_mindinsight_run(tmp_path)
    venv, script = tmp_path / "built-venv", tmp_path / "build.sh"
    real = viewers.MINDINSIGHT_VENV / "bin"
    script.write_text(f"mkdir -p {venv}/bin && for p in python mindinsight gunicorn; do ln -s {real}/$p {venv}/bin/$p; "
                      "done\n")
    monkeypatch.setattr(viewers, "MINDINSIGHT_VENV", venv)
    monkeypatch.setattr(viewers, "MINDINSIGHT_BUILD", script)
    made = view_module._viewer("mindinsight", view_module.find_target(run_dir), str(tmp_path), build=True)
    assert isinstance(made, viewers.Viewer) and made.command[0] == str(venv / "bin" / "python")
    assert capsys.readouterr().out == f"[msbridge] building MindInsight's venv: bash {script}\n"
    script.write_text("exit 3\n")
    monkeypatch.setattr(viewers, "MINDINSIGHT_VENV", tmp_path / "never-built")
    assert view_module._viewer("mindinsight", view_module.find_target(run_dir), str(tmp_path), build=True) is None
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"  mindinsight  : not started: bash {script} did not build {tmp_path / 'never-built'} (its output is above)")


def test_view_of_what_has_nothing_to_show_says_so(tmp_path, capsys):
    run_dir = jsonl_and_mindinsight_run(tmp_path)
    assert main(["view", run_dir, "--mlflow"]) == 1
    assert capsys.readouterr().out.splitlines()[1] == f"  mlflow       : not started: {run_dir} has no mlflow sink"
    assert main(["view", str(tmp_path / "nope")]) == 2
    assert "is not a directory; give a run dir (it holds run.json) or an experiment dir" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 2
    assert "is neither a run dir (no run.json) nor an experiment dir" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sweeps_first_mlflow_screen_ranks_its_runs_on_the_objective(tmp_path):
    """Three learning rates of one sweep, then `msbridge view` on the experiment dir: the page it prints first is
    a saved view, read back through MLflow's REST API: every run flat (the sweep's parent left out), best first
    on objective/best, the swept param and the objective as columns, the best run marked, the parallel chart."""
    import msbridge

    finals = {0.1: 0.6, 0.01: 0.2, 0.001: 0.4}
    for lr, last in finals.items():
        cfg = {"experiment": "sw", "run_name": f"lr{lr}", "experiment_dir": str(tmp_path / "sw"), "sweep_id": "s1",
               "sinks": ["jsonl", "mlflow"], "params": {"optimizer": {"learning_rate": lr}}}
        with msbridge.track(cfg, progress=False) as run:
            for step in range(1, 11):
                run.step(loss=1.0 / step)
            run.eval(loss=last)
    with ViewProcess(f"{MSBRIDGE} view {tmp_path / 'sw'} --mlflow") as view:
        urls = view.wait_serving()
        path, query = urllib.parse.urlsplit(urls["mlflow"]).fragment.split("?")
        asked = urllib.parse.parse_qs(query)
        assert asked["compareRunsMode"] == ["TABLE"] and asked["workflowType"] == ["machine_learning"]
        api = base(urls["mlflow"]) + "/api/2.0/mlflow"
        exp_id = path.split("/")[2]
        tags = {t["key"]: t["value"] for t in get(f"{api}/experiments/get?experiment_id={exp_id}")["experiment"]["tags"]}
        state = json.loads(tags["mlflow.sharedViewState." + asked["viewStateShareKey"][0]])
        assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`objective/best`", True)
        assert state["selectedColumns"][1:] == ["params.`optimizer.learning_rate`", "tags.`msbridge.trial_state`",
                                                "metrics.`objective/best`", "metrics.`objective/best_step`",
                                                "metrics.`objective/final`", "tags.`msbridge.best`"]
        [parallel] = [c for c in state["compareRunCharts"] if c["type"] == "PARALLEL"]
        assert parallel["selectedParams"] == ["optimizer.learning_rate"]
        assert parallel["selectedMetrics"] == ["objective/best"]
        assert [s["name"] for s in state["compareRunSections"]][:2] == ["objective", "train"]
        found = MlflowClient(base(urls["mlflow"])).search_runs(  # POST /api/2.0/mlflow/runs/search
            [exp_id], state["searchFilter"], order_by=["metrics.`objective/best` ASC"])
        names = [r.info.run_name for r in found]
        assert names == ["lr0.01", "lr0.001", "lr0.1"]  # every run, none under a parent, best first
        marks = [r.data.tags.get("msbridge.best") for r in found]
        assert marks == ["★ best", None, None]
        assert any(line.startswith("  mlflow charts: ") and "compareRunsMode=CHART" in line for line in view.lines)
        assert view.interrupt() == 0, view.lines


def sweep_dir(tmp_path):
    """A sweep's experiment dir as ``msbridge sweep`` leaves it: a real Optuna study ``sw`` in its optuna.db (a
    complete, a pruned and a failed trial) and one trial's run (jsonl) with the study as its ``sweep_id``."""
    import msbridge

    optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")
    directory = tmp_path / "sw"
    directory.mkdir()
    study = optuna.create_study(study_name="sw", storage=f"sqlite:///{directory}/optuna.db")
    for lr, state in ((0.01, "COMPLETE"), (0.3, "PRUNED"), (1e-6, "FAIL")):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-6, 1.0, log=True)})
        trial.report(lr * 10, 5)
        study.tell(trial, lr if state == "COMPLETE" else None, state=getattr(optuna.trial.TrialState, state))
    with msbridge.track({"experiment": "sw", "sweep_id": "sw", "run_name": "trial-0", "sinks": ["jsonl"],
                         "experiment_dir": str(directory), "params": {"lr": 0.01}}, progress=False) as run:
        run.step(loss=1.0)
    return directory, study


@pytest.mark.slow
def test_view_optuna_opens_the_dashboard_on_the_sweeps_study(tmp_path):
    """`msbridge view SWEEP_DIR --optuna` starts the real optuna-dashboard; the URL it prints is the study's page,
    and the dashboard's API lists the study's trials as Optuna holds them. A trial's run dir with the storage named
    (``--optuna URL``, as for a sweep on PostgreSQL) opens the same."""
    pytest.importorskip("optuna_dashboard", reason="pip install 'msbridge[sweep]'")
    directory, study = sweep_dir(tmp_path)
    for path, storage in ((directory, ""), (directory / "trial-0", f"sqlite:///{directory}/optuna.db")):
        with ViewProcess(f"{MSBRIDGE} view {path} --optuna {storage}") as view:
            url = view.wait_serving()["optuna"]
            assert {address for address, _, _ in listening(view.processes)} == {"127.0.0.1"}
            study_id = int(url.rsplit("/", 1)[1])
            assert url == f"{base(url)}/dashboard/studies/{study_id}"
            detail = get(f"{base(url)}/api/studies/{study_id}")
            got = [(t["number"], t["state"], t["params"][0]["param_external_value"]) for t in detail["trials"]]
            assert got == [(t.number, t.state.name.capitalize(), str(t.params["lr"])) for t in study.trials]
            assert [t["number"] for t in detail["best_trials"]] == [study.best_trial.number]
            assert view.interrupt() == 0, view.lines
            assert not alive(view.processes)


@pytest.mark.slow
def test_view_optuna_without_the_dashboard_says_the_pip_line(tmp_path, capsys, monkeypatch):
    """Where optuna-dashboard is not installed (faked here: its module hidden from the import system), one line
    says the pip install that fixes it; exit code 1, no traceback."""
    import importlib.util

    directory, _ = sweep_dir(tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna_dashboard"
                        else find_spec(name, *a))
    assert main(["view", str(directory), "--optuna"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[1] == ("  optuna       : not started: optuna-dashboard is not installed; install it "
                                       "with: pip install 'msbridge[sweep]'")
    assert "Traceback" not in out.out + out.err
