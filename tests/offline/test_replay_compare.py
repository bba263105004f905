"""Offline mode (train with MLflow unreachable, replay later) and `msbridge compare` over a real sweep."""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from helpers.processes import free_port
from mlflow.tracking import MlflowClient

from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.demo import demo_config, train
from msbridge.offline.compare import compare, default_tracking_uri
from msbridge.sinks.runlog import read_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "sweep"))
from run_sweep import EXPERIMENT, run_sweep  # noqa: E402

STEPS = 40


def demo_run(out, sinks, run_name, **overrides):
    cfg = demo_config(str(out), {"experiment": "offline", "sinks": sinks, "run_name": run_name, **overrides})
    monitor = BridgeMonitor(cfg, progress=False)
    train(monitor, STEPS, cfg["params"])
    return monitor


def histories(client, run_id, keys):
    return {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
            for k in keys}


@pytest.mark.slow
def test_offline_run_replayed_equals_its_log_and_is_idempotent(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    mon = demo_run(tmp_path / "runs", {"jsonl": {}, "mlflow": {"tracking_uri": down, "close_timeout": 1}}, "offline-run")
    log = read_run(mon.run_dir).ranks[0]
    assert [r.step for r in log.records if "train/loss" in r.values] == list(range(1, STEPS + 1)), \
        "jsonl keeps everything while MLflow is unreachable"
    assert [r.step for r in log.records if "eval/loss" in r.values] == [STEPS]  # the demo validates at the end

    store = f"sqlite:///{tmp_path / 'central.db'}"
    for _ in range(2):  # replaying twice gives the same run, not duplicates
        assert main(["replay", mon.run_dir, "--to", "mlflow", "--tracking-uri", store]) == 0

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("offline")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "offline-run"
    keys = log.metric_names()
    got = histories(client, run.info.run_id, keys)
    for key in keys:
        want = log.series(key)
        assert [s for s, _ in got[key]] == [s for s, _ in want], key
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in want], rel=1e-6, nan_ok=True), key
    assert run.data.params["optimizer.learning_rate"] == "0.003"


@pytest.mark.slow
def test_replayed_run_matches_an_online_run(tmp_path):
    """Same seed, same data: the offline run replayed has what the online run logged (timings aside)."""
    online_store = f"sqlite:///{tmp_path / 'online.db'}"
    demo_run(tmp_path / "a", {"jsonl": {}, "mlflow": {"tracking_uri": online_store}}, "same")
    offline = demo_run(tmp_path / "b", {"jsonl": {}, "mlflow": {"tracking_uri": f"http://127.0.0.1:{free_port()}", "close_timeout": 1}},
                       "same")
    replay_store = f"sqlite:///{tmp_path / 'replayed.db'}"
    assert main(["replay", offline.run_dir, "--to", "mlflow", "--tracking-uri", replay_store]) == 0

    def summary(store):
        client = MlflowClient(store)
        (run,) = client.search_runs([client.get_experiment_by_name("offline").experiment_id])
        hist = histories(client, run.info.run_id, ["train/loss", "train/lr", "train/epoch"])
        # The sink's own options differ on purpose (where it logs, how long it waits); the rest is the same.
        params = {k: v for k, v in run.data.params.items()
                  if not k.startswith("msbridge.sinks.mlflow.") and not k.endswith(("output_dir", "experiment_dir"))}
        return run.info.status, run.info.run_name, set(run.data.metrics), hist, params

    online, replayed = summary(online_store), summary(replay_store)
    assert online[:3] == replayed[:3]
    for key, series in online[3].items():
        assert [s for s, _ in series] == [s for s, _ in replayed[3][key]], key
        assert [v for _, v in series] == pytest.approx([v for _, v in replayed[3][key]], rel=1e-5), key
    assert online[4] == replayed[4]


@pytest.mark.slow
def test_sweep_compare_ranks_runs_on_the_validation_objective(tmp_path, capsys):
    """Four learning rates, 60 steps, validation at 50 and 60: compare ranks on eval/loss, the runs' objective,
    and every number in a row is that run's own jsonl's."""
    out = tmp_path / "runs"
    uri = run_sweep(str(out), steps=60)
    table = compare(EXPERIMENT, uri)
    assert (table.objective, table.mode) == ("eval/loss", "min")
    assert len(table.rows) == 4 and table.differing == ["optimizer.learning_rate"]
    bests = [r.best for r in table.rows]
    assert bests == sorted(bests) and all(math.isfinite(v) for v in bests)
    for row in table.rows:
        log = read_run(str(out / EXPERIMENT / row.run_name)).ranks[0]
        evals = log.series("eval/loss")
        assert [s for s, _ in evals] == [50, 60] and row.points == 2  # coverage first: the eval steps, each once
        step, value = min(evals, key=lambda p: p[1])
        assert (row.best_step, row.best, row.final) == (step, pytest.approx(value), pytest.approx(evals[-1][1]))
        assert row.status == "FINISHED"
        seen, rate = log.series("perf/tokens_seen"), log.series("perf/tokens_per_s")
        assert [s for s, _ in seen] == [s for s, _ in rate] == list(range(1, 61))  # coverage first
        assert row.work == {"perf/tokens_seen": seen[-1][1],  # the CPU has no peak: no MFU
                            "perf/tokens_per_s": pytest.approx(statistics.median(v for _, v in rate))}

    assert uri == default_tracking_uri(EXPERIMENT, str(out))
    assert main(["compare", EXPERIMENT, "--root", str(out), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["run_name"] for r in data["rows"]] == [r.run_name for r in table.rows]
    assert data["best_run"] == table.rows[0].run_name
    assert main(["compare", EXPERIMENT, "--root", str(out), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("rank,best,run,optimizer.learning_rate,eval/loss (min),at_step,final,samples/s,tokens/s,"
                        "tokens seen,points,status")
    assert lines[1].startswith(f"1,★,{table.rows[0].run_name},") and ",★," not in "".join(lines[2:])
    assert len(lines) == 5
    # --objective ranks on another metric: the highest accuracy first.
    assert main(["compare", EXPERIMENT, "--root", str(out), "--objective", "eval/accuracy", "--mode", "max"]) == 0
    text = capsys.readouterr().out
    assert "eval/accuracy (max)" in text.splitlines()[0]
    accuracy = compare(EXPERIMENT, uri, "eval/accuracy", "max")
    assert [r.best for r in accuracy.rows] == sorted((r.best for r in accuracy.rows), reverse=True)


def test_replay_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--to", "mlflow"]) == 2
    assert "run.json is missing" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_unknown_experiment_lists_the_known_ones(tmp_path, capsys):
    uri = run_sweep(str(tmp_path), steps=5, learning_rates=(0.003,))
    assert main(["compare", "nope", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "no MLflow experiment 'nope'" in err and EXPERIMENT in err


def test_compare_without_a_store_names_the_missing_file(tmp_path, capsys):
    assert main(["compare", "nope", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nope" / "mlflow.db") in err and "--tracking-uri" in err
    assert not (tmp_path / "nope").exists(), "looking must not create an empty store"


@pytest.mark.slow
def test_replay_of_a_run_that_never_ended_marks_it_killed(tmp_path):
    """A job SIGKILLed before train end (say by msrun, after another rank crashed) left no outcome."""
    mon = demo_run(tmp_path / "runs", ["jsonl"], "cut-short")
    meta_path = Path(mon.run_dir) / "run.json"
    meta = json.loads(meta_path.read_text())
    del meta["outcome"]
    meta_path.write_text(json.dumps(meta))
    store = f"sqlite:///{tmp_path / 'central.db'}"
    assert main(["replay", mon.run_dir, "--to", "mlflow", "--tracking-uri", store]) == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("offline").experiment_id])
    assert run.info.status == "KILLED"
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == STEPS


@pytest.mark.slow
def test_compare_takes_what_view_takes(tmp_path, capsys, monkeypatch):
    """``compare NAME``, ``compare EXPERIMENT_DIR`` (what ``view`` takes) and ``compare RUN_DIR`` print one table."""
    out = tmp_path / "runs"
    run_sweep(str(out), steps=5, learning_rates=(0.003, 0.03))
    tables = []
    monkeypatch.chdir(tmp_path)
    run_dir = next(p for p in (out / EXPERIMENT).iterdir() if (p / "run.json").is_file())
    for given in ([EXPERIMENT, "--root", "runs"], ["runs/" + EXPERIMENT], [str(out / EXPERIMENT)], [str(run_dir)]):
        assert main(["compare", *given]) == 0, given
        tables.append(capsys.readouterr().out)
    assert len(tables[0].splitlines()) == 4 and "optimizer.learning_rate" in tables[0]  # header, rule, two runs
    assert tables[1:] == [tables[0]] * 3


def test_compare_of_a_directory_without_a_store_says_so(tmp_path, capsys):
    run = tmp_path / "exp" / "run-1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_name": "run-1", "run_id": "r1",
                                              "config": {"experiment": "exp", "sinks": {"jsonl": {}}}}))
    assert main(["compare", str(tmp_path / "exp")]) == 2
    err = capsys.readouterr().err
    assert "has no MLflow store" in err and "--tracking-uri" in err and "Traceback" not in err


@pytest.mark.slow
def test_after_a_replay_elsewhere_the_run_readme_names_where_the_records_are(tmp_path):
    """A replay to another --tracking-uri: run.json and the README name that store beside "not delivered: none",
    and the one the run was configured with; a replay to where the run wrote leaves both files as they were."""
    down = f"http://127.0.0.1:{free_port()}"
    mon = demo_run(tmp_path / "runs", {"jsonl": {}, "tensorboard": {}, "mlflow": {"tracking_uri": down,
                                                                                     "close_timeout": 1}}, "moved")
    readme, meta_path = Path(mon.run_dir) / "README.md", Path(mon.run_dir) / "run.json"
    assert f"- **mlflow**: {down} (experiment 'offline')" in readme.read_text()
    before = readme.read_text(), meta_path.read_text()
    assert main(["replay", mon.run_dir, "--to", "tensorboard"]) == 0  # where the run wrote it: nothing to say
    assert (readme.read_text(), meta_path.read_text()) == before

    store = f"sqlite:///{tmp_path / 'central.db'}"
    assert main(["replay", mon.run_dir, "--to", "mlflow", "--tracking-uri", store]) == 0
    text = readme.read_text()
    assert (f"- **mlflow**: {store} (experiment 'offline'); written there by `msbridge replay` (the run wrote it "
            f"to {down} (experiment 'offline'))") in text
    assert "- not delivered: none" in text
    meta = json.loads(meta_path.read_text())
    assert meta["sinks"]["mlflow"]["where"] == f"{store} (experiment 'offline')"
    assert meta["outcome"]["not delivered"] == "none"
