"""A sqlite store copied from MLflow's template and written without MLflow is what MLflow itself makes.

Real MLflow throughout: the template is made by MLflow's migrations, the comparison store by ``MlflowClient``,
``mlflow db upgrade`` and ``mlflow server`` are MLflow's own commands."""
from __future__ import annotations

import json
import math
import os
import resource
import sqlite3
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.runs import make_records, make_run
from mlflow.tracking import MlflowClient

from msbridge.adapters.mlflow_tracker.store.native import NativeStore, NotNative
from msbridge.adapters.mlflow_tracker.store.local import make_whole, store_lock
from msbridge.adapters.mlflow_tracker.store.template import alembic_head, template_path
from msbridge.adapters.mlflow_sink import MlflowSink
from msbridge.bench.servers import MlflowServer

STEPS = 25
#: Columns that differ between any two stores by design: ids, times, paths under the store's own folder (a metric's
#: ``timestamp`` is the caller's, so it is compared).
_VARYING = {"run_uuid", "experiment_id", "start_time", "end_time", "creation_time", "last_update_time",
            "artifact_uri", "artifact_location", "deleted_time"}
#: Two ``log_batch`` calls of metric rows ``(key, value, timestamp_ms, step)`` as the sink sends them, by MLflow's
#: rules for ``latest_metrics``: NaN and +-inf, a row sent twice, a lower step after a higher one, a later time
#: at the same step; each with the sink's last-step tag.
_METRICS = ([("train/loss", 2.5, 1_700_000_001_000, 1), ("train/loss", 2.0, 1_700_000_002_000, 2),
             ("train/lr", 0.01, 1_700_000_002_000, 2), ("health/grad", math.nan, 1_700_000_002_000, 2),
             ("train/loss", 2.0, 1_700_000_002_000, 2)],
            [("train/loss", 1.5, 1_700_000_003_000, 3), ("train/loss", 9.0, 1_700_000_004_000, 1),
             ("train/lr", 0.02, 1_700_000_005_000, 2), ("health/grad", math.inf, 1_700_000_003_000, 3),
             ("health/min", -math.inf, 1_700_000_003_000, 3)])


def _make(root, name="mlflow.db"):
    path = str(root / name)
    with store_lock(path):
        make_whole(path, MlflowClient)
    return path


def _rows(path):
    """Every table's rows, columns that differ by design per store left out, sorted; and the schema's SQL."""
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        out = {}
        for table in tables:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            keep = [c for c in columns if c not in _VARYING]
            rows = db.execute(f"SELECT {', '.join(keep) or '1'} FROM {table}").fetchall() if keep else []
            out[table] = sorted(map(repr, rows))
        # its lines as a set: MLflow's own migrations write a table's constraints in an order that varies per store
        schema = sorted(repr(sorted(line.strip(" ,\t") for line in (r[0] or "").split("\n")))
                        for r in db.execute("SELECT sql FROM sqlite_master"))
    return out, schema


def _same_calls(client, experiment_tags):
    """The calls msbridge's sink makes for one run, on ``client`` (MlflowClient or a NativeStore's ``call``)."""
    exp = client("create_experiment", "exp", artifact_location="/tmp/x/mlartifacts", tags=experiment_tags)
    run = client("create_run", exp, start_time=1_700_000_000_000, tags={"msbridge.run_id": "id-1"}, run_name="r1")
    run_id = run.info.run_id
    client("log_batch", run_id, params=[("lr", "0.001"), ("model.depth", "4")],
           tags=[("msbridge.world_size", "1"), ("mlflow.note.content", "hello")])
    for metrics in _METRICS:
        client("log_batch", run_id, metrics=metrics, params=[], tags=[("msbridge.last_step", str(metrics[0][3]))])
    client("set_tag", run_id, "msbridge.objective", "train/loss (min)")
    client("set_terminated", run_id, "FINISHED", end_time=1_700_000_100_000)
    return exp, run_id


def test_template_is_keyed_by_mlflow_version_and_its_alembic_head_read_without_importing_mlflow():
    from mlflow.store.db.utils import _get_latest_schema_revision
    import mlflow

    assert alembic_head() == _get_latest_schema_revision()
    assert os.path.basename(template_path()) == f"{mlflow.__version__}-{alembic_head()}.db"


@pytest.mark.slow
def test_copied_store_and_native_rows_equal_what_mlflow_makes_and_upgrade_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ours").mkdir()
    (tmp_path / "mlflows").mkdir()
    ours = _make(tmp_path / "ours")
    theirs = str(tmp_path / "mlflows" / "mlflow.db")
    client = MlflowClient(f"sqlite:///{theirs}")
    client.search_experiments()

    def by_mlflow(name, *args, **kwargs):
        if name == "log_batch":
            from mlflow.entities import Metric, Param, RunTag

            kwargs = {"metrics": [Metric(*m) for m in kwargs.get("metrics", [])],
                      "params": [Param(*p) for p in kwargs["params"]], "tags": [RunTag(*t) for t in kwargs["tags"]]}
        return getattr(client, name)(*args, **kwargs)

    store = NativeStore(ours)
    tags = {"mlflow.experimentKind": "custom_model_development"}
    _same_calls(lambda name, *a, **k: store.call(name, a, k), tags)
    _same_calls(by_mlflow, tags)
    store.close()
    before = _rows(ours)
    assert before == _rows(theirs)
    assert len(before[0]["latest_metrics"]) == 4 and len(before[0]["metrics"]) >= 9  # every key's latest, compared
    with sqlite3.connect(ours) as db:
        default = db.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()[0]
    assert default == str(tmp_path / "mlruns" / "0")  # MLflow's ./mlruns of this cwd, as MLflow writes it
    subprocess.run([sys.executable, "-m", "mlflow", "db", "upgrade", f"sqlite:///{ours}"], check=True,
                   capture_output=True)
    assert _rows(ours) == before


def test_changed_param_and_unknown_filter_are_left_to_mlflow(tmp_path):
    store = NativeStore(_make(tmp_path))
    exp = store.call("create_experiment", ("e",), {"artifact_location": str(tmp_path / "a")})
    run_id = store.call("create_run", (exp,), {"run_name": "r"}).info.run_id
    store.call("log_batch", (run_id,), {"params": [("lr", "1")]})
    with pytest.raises(NotNative):
        store.call("log_batch", (run_id,), {"params": [("lr", "2")]})
    with pytest.raises(NotNative):
        store.call("search_runs", ([exp], "params.lr = '1'"), {})
    with pytest.raises(NotNative):
        store.call("create_logged_model", (exp,), {})
    assert [r.info.run_id for r in store.call("search_runs", ([exp], "tags.`mlflow.runName` = 'r'"), {})] == [run_id]


@pytest.mark.slow
def test_concurrent_first_runs_make_one_template(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    roots = [tmp_path / f"exp{i}" for i in range(3)]
    for root in roots:
        root.mkdir()
    with ThreadPoolExecutor(3) as pool:  # threads of one process: flock is per open file, so they exclude too
        paths = list(pool.map(_make, roots))
    made = os.listdir(tmp_path / "cache" / "msbridge" / "mlflow-store")
    assert sorted(made) == sorted([os.path.basename(template_path()), os.path.basename(template_path()) + ".lock"])
    for path in paths:
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT version_num FROM alembic_version").fetchone()[0] == alembic_head()


@pytest.mark.slow
def test_a_sink_run_without_mlflow_reads_back_in_mlflows_client_and_server(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = make_run(tmp_path, readme="# notes", config={"objective": {"metric": "train/loss"}})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sink = MlflowSink(tracking_uri=uri)
    child = sink._client._proc
    sink.open(run)
    sink.write(make_records(range(1, STEPS + 1)), [])
    sink.flush()
    sink.close("FINISHED")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the child's whole life, its close included: reaped by close (so counted in this process's children), it used
    # less CPU than importing MLflow alone costs here (~3 CPU-s)
    assert child.returncode is not None
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 1.0
    series = sink.read_back(run)
    assert sorted(step for step, _ in series["train/loss"]) == list(range(1, STEPS + 1))
    with MlflowServer(str(tmp_path / "server"), backend_uri=uri) as server:
        body = json.dumps({"experiment_ids": ["1"], "max_results": 10}).encode()
        request = urllib.request.Request(f"{server.uri}/api/2.0/mlflow/runs/search", body,
                                         {"Content-Type": "application/json"})
        runs = json.load(urllib.request.urlopen(request, timeout=30))["runs"]
        assert [r["info"]["status"] for r in runs] == ["FINISHED"]
        history = MlflowClient(server.uri).get_metric_history(runs[0]["info"]["run_id"], "train/loss")
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_an_unwritable_cache_leaves_the_store_to_mlflow_with_one_warning(tmp_path, monkeypatch, caplog):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache dir would be")  # makedirs under it fails, as on a read-only home
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with caplog.at_level("WARNING", logger="msbridge"):
        path = _make(tmp_path)
    assert "cannot be used from" in caplog.text
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()[0] == alembic_head()
