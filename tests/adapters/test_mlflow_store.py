"""A sqlite MLflow store is made once and whole (``mlflow_tracker.store.local``): real MLflow, real processes, real kill -9.

Concurrent first runs (3 and 8 processes on one new experiment) each get their whole history; a
``kill -9`` at 20 random moments (of MLflow's child process while it makes the store, of it at any
moment, of a job's whole process group) leaves a store the next run in the same experiment works with, with no
manual step; one that an older msbridge's unlocked creation in place left half-made is refused as it is.
"""
from __future__ import annotations

import glob
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from helpers.runs import make_records, make_run
from mlflow.tracking import MlflowClient

from msbridge.adapters.mlflow_tracker.run.fields import RUN_ID_TAG
from msbridge.adapters.mlflow_tracker.client.process import ClientProcess, TrackerError
from msbridge.adapters.mlflow_tracker.store.local import store_problem
from msbridge.adapters.mlflow_sink import MlflowSink
from msbridge.errors import ConfigError
from msbridge.sinks.base import FINISHED

JOB = os.path.join(os.path.dirname(__file__), "mlflow_store_job.py")
STEPS = 30
#: What an msbridge before the lock did: MLflow makes the store in place, with nobody else held off.
UNLOCKED = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"


def _uri(root):
    return f"sqlite:///{root}/exp/mlflow.db"


def _assert_whole_run(root, name, steps=STEPS, whole_store=True):
    """The run ``name`` holds every metric of every step 1..steps (coverage first, then values), and (with
    ``whole_store``) the store has no leftover of a migration or of a creation."""
    db = os.path.join(root, "exp", "mlflow.db")
    assert not whole_store or store_problem(db) == "", db
    assert not glob.glob(os.path.join(root, "exp", ".mlflow.db.creating-*"))
    client = MlflowClient(_uri(root))
    experiment = client.get_experiment_by_name("exp")
    found = client.search_runs([experiment.experiment_id], f"tags.`{RUN_ID_TAG}` = 'id-{name}'")
    assert len(found) == 1, name
    expected = make_records(range(1, steps + 1))
    for key in expected[0].values:
        history = sorted((m.step, m.value) for m in client.get_metric_history(found[0].info.run_id, key))
        assert [s for s, _ in history] == list(range(1, steps + 1)), (name, key)
        want = [r.values[key] for r in expected]
        assert all(abs(got - w) <= 1e-9 * max(1.0, abs(w)) for (_, got), w in zip(history, want)), (name, key)
    assert found[0].info.status == FINISHED


def _next_run_works(root, name):
    """The next run in the experiment, in this process with the real sink: delivered whole, nothing undelivered."""
    run = make_run(root, name=name)
    os.makedirs(run.run_dir, exist_ok=True)
    sink = MlflowSink(backoff_initial=0.2, backoff_max=1.0, close_timeout=60.0)
    sink.open(run)
    sink.write(make_records(range(1, STEPS + 1)), [])
    sink.close(FINISHED)
    assert sink.undelivered() == "", sink.undelivered()
    _assert_whole_run(root, name)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [3, pytest.param(8, marks=pytest.mark.slow)])
def test_concurrent_first_runs_make_the_store_once(tmp_path, processes):
    go = tmp_path / "go"
    jobs = [subprocess.Popen([sys.executable, JOB, str(tmp_path), f"r{i}", str(STEPS), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(processes)]
    time.sleep(1.0)  # every job has its sink open and MLflow's child started: they reach the new store together
    go.touch()
    outputs = [job.communicate(timeout=600) for job in jobs]
    for job, (out, err) in zip(jobs, outputs):
        assert job.returncode == 0, err[-2000:]
        assert out.strip() == "undelivered:", err[-2000:]
        assert "unreachable" not in err, err[-2000:]
    for i in range(processes):
        _assert_whole_run(tmp_path, f"r{i}")
    assert len(MlflowClient(_uri(tmp_path)).search_experiments()) == 2  # Default and exp, each made once


@pytest.mark.slow
def test_a_store_an_interrupted_upgrade_left_is_refused_and_left_as_it_is(tmp_path):
    _next_run_works(tmp_path, "before")
    db = tmp_path / "exp" / "mlflow.db"
    with sqlite3.connect(db) as conn:  # what a kill inside MLflow's table copy leaves
        conn.execute("CREATE TABLE _alembic_tmp_tags AS SELECT * FROM tags")
    before = db.read_bytes()
    assert "leftover tables of an interrupted MLflow upgrade (_alembic_tmp_tags)" in store_problem(str(db))
    sink = MlflowSink(close_timeout=1.0)
    sink.open(make_run(tmp_path, name="after"))
    with pytest.raises(TrackerError, match="DROP TABLE _alembic_tmp_tags.* and mlflow db upgrade"):
        sink.write(make_records(range(1, 3)), [])
    sink.close(FINISHED)  # said at once, never waited out
    assert "not delivered: " in sink.undelivered() and "mlflow db upgrade" in sink.undelivered()
    assert db.read_bytes() == before and not glob.glob(f"{db}.*-*")  # nothing dropped, migrated or copied
    _assert_whole_run(tmp_path, "before", whole_store=False)  # the user's run is still there, whole


def _wait_for(predicate, limit=120.0):
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "what the kill waits for never came"
        time.sleep(0.005)


def _making(root, cache):
    """The temp files of a store, or of MLflow's template, being made (killed before their rename)."""
    return glob.glob(os.path.join(root, "exp", ".mlflow.db.creating-*")) + \
        glob.glob(os.path.join(cache, "msbridge", "mlflow-store", "*.creating-*"))


def _kill_child(root, rng, in_creation, cache):
    """Kill MLflow's child process while it makes the store or its template (``in_creation``: in a new cache
    ``cache``, MLflow's migrations make the template first, seconds) or at a random moment."""
    client = ClientProcess()
    client.connect(_uri(root), {})
    started = threading.Thread(target=lambda: _quiet(lambda: client.create_experiment("exp")), daemon=True)
    started.start()
    if in_creation:
        _wait_for(lambda: _making(root, cache) or not started.is_alive())
        time.sleep(rng.uniform(0.0, 0.5))
    else:
        time.sleep(rng.uniform(0.0, 4.0))
    proc = client._proc
    if proc is not None:
        proc.kill()
    started.join(60)
    return bool(_making(root, cache))  # killed before its rename


def _quiet(call):
    try:
        call()
    except Exception:  # the kill: the call ends with ConnectionError
        pass


def _kill_group(command, rng, limit):
    """Start ``command`` in its own process group and kill -9 the whole group at a random moment."""
    job = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.0, limit))
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(60)


@pytest.mark.slow
def test_kill_9_at_20_random_moments_leaves_a_store_the_next_run_works_with(tmp_path, monkeypatch):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}")
    in_creation = refused = 0
    for moment in range(20):
        kind = moment % 4
        root = tmp_path / (f"k{moment}" if kind != 1 or moment % 8 == 1 else f"k{moment - 4}")  # some reuse a store
        os.makedirs(root / "exp", exist_ok=True)
        cache = str(tmp_path / f"cache{moment}" if kind == 0 else tmp_path / "cache")
        monkeypatch.setenv("XDG_CACHE_HOME", cache)  # the child and the jobs read it: a new one has no template
        if kind == 0:
            in_creation += _kill_child(str(root), rng, in_creation=True, cache=cache)
        elif kind == 1:
            _kill_child(str(root), rng, in_creation=False, cache=cache)
        elif kind == 2:  # the training process and its MLflow child, at once
            _kill_group([sys.executable, JOB, str(root), f"killed{moment}", str(STEPS)], rng, 5.0)
        else:  # an older msbridge's store creation, with no lock and in place
            _kill_group([sys.executable, "-c", UNLOCKED, _uri(root)], rng, 4.0)
            if _refused_as_it_is(str(root)):
                refused += 1
                continue
        _next_run_works(str(root), f"next{moment}")
    assert in_creation, f"no kill came while a store was being made (seed {seed})"
    print(f"{refused} of 5 stores an unlocked creation left half-made in place were refused as they were")


def _refused_as_it_is(root):
    """A store that a creation in place left half-made is not msbridge's to finish: refused before training (the
    sink's build), naming the fix, and left byte for byte as it was. False when the kill left none, or a whole one."""
    db = os.path.join(root, "exp", "mlflow.db")
    problem = store_problem(db)
    if not problem:
        return False
    with open(db, "rb") as handle:
        before = handle.read()
    with pytest.raises(ConfigError, match="delete it|mlflow db upgrade"):
        MlflowSink(tracking_uri=_uri(root))
    with open(db, "rb") as handle:
        assert handle.read() == before
    return True


_DIES_MID_TRANSACTION = """import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,)] * 2000)  # pages change: the rollback journal fills
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_store_whose_writer_died_mid_transaction_is_read_after_its_hot_journal_is_rolled_back(tmp_path):
    """A writer killed mid-transaction (an older msbridge creating the store in place) leaves a hot journal;
    read-only, sqlite refuses such a file ("attempt to write a readonly database"): the store check must not."""
    path = str(tmp_path / "mlflow.db")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (v TEXT)")
    subprocess.run([sys.executable, "-c", _DIES_MID_TRANSACTION, path], check=False)
    assert os.path.getsize(path + "-journal") > 0  # the kill left a hot journal
    assert "not MLflow's store (its tables: t)" in store_problem(path)  # read, rolled back, judged: no traceback
    assert not os.path.exists(path + "-journal") or os.path.getsize(path + "-journal") == 0
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM t").fetchone() == (0,)  # the dead writer's rows rolled back
