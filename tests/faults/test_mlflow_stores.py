"""A user's MLflow store and msbridge's template cache, as msbridge finds them on a real disk: 36 cases.

Stores (``<experiment dir>/mlflow.db``, the default ``tracking_uri``; two as a given URI): made by a real MLflow 2
(``.ci/mlflow_venvs.sh`` builds its venv) with runs in it, by a newer MLflow, not sqlite, truncated, a directory,
immutable (``chattr +i``: root ignores file modes), another program's database, MLflow's with no or an unknown
schema version, an upgrade's leftovers. Each one that this MLflow cannot use:
- fails ``msbridge config check`` (exit code 1) and the training start, with the file and the fix;
- with ``on_fault: warn`` lets training start without MLflow, said in one line, and the jsonl holds every step;
- is left byte for byte as it was (its sha256), and no copy of it is made.
A store that is new, whole, or only locked by another process is used as before.

Templates (``$XDG_CACHE_HOME/msbridge/mlflow-store``): truncated, corrupt, empty, at another schema, with a corrupt
page, a directory, in an immutable folder, under a cache root that is a file, with HOME unset. A bad template is made
again with one line naming it; a cache that cannot be used leaves the store to MLflow's own creation, with one line.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import logging
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.disk import parse_lines, steps_and_gaps

import msbridge
from msbridge.adapters.mlflow_tracker.store.local import open_client
from msbridge.adapters.mlflow_tracker.store.template import alembic_head, store_defect, template_path
from msbridge.cli.main import main
from msbridge.errors import ConfigError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MLFLOW2 = ROOT / ".venv-mlflow2" / "bin" / "python"
MLFLOW_NEXT = ROOT / ".venv-mlflow-next" / "bin" / "python"
STEPS = 12
_TEAM_RUNS = """import mlflow, sys
mlflow.set_tracking_uri("sqlite:///" + sys.argv[1])
mlflow.set_experiment("team")
for n in range(int(sys.argv[2])):
    with mlflow.start_run(run_name=f"team-{n}"):
        mlflow.log_param("lr", 0.1 * (n + 1))
        mlflow.log_metrics({"loss": 1.0 / (n + 1)}, step=1)
"""
_READ_RUNS = """import mlflow, sys
client = mlflow.MlflowClient("sqlite:///" + sys.argv[1])
runs = client.search_runs([client.get_experiment_by_name("team").experiment_id])
print(sorted((r.info.run_name, r.data.params["lr"], r.data.metrics["loss"]) for r in runs))
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Stores made once by real MLflows: ``mlflow2`` (2.22, 2 runs), ``mlflow2_empty``, ``next`` (3.18, 1 run) and
    ``current`` (this MLflow, through msbridge's own store creation)."""
    subprocess.run(["bash", str(ROOT / ".ci" / "mlflow_venvs.sh")], check=True, capture_output=True, timeout=900)
    folder = tmp_path_factory.mktemp("made")
    stores = {name: folder / f"{name}.db" for name in ("mlflow2", "mlflow2_empty", "next", "current")}
    for python, name, runs in ((MLFLOW2, "mlflow2", 2), (MLFLOW2, "mlflow2_empty", 0), (MLFLOW_NEXT, "next", 1)):
        subprocess.run([str(python), "-c", _TEAM_RUNS, str(stores[name]), str(runs)], check=True,
                       capture_output=True, cwd=folder, timeout=300)
    from mlflow.tracking import MlflowClient
    open_client(f"sqlite:///{stores['current']}", MlflowClient).search_experiments()
    with sqlite3.connect(stores["next"]) as conn:
        made_by_next = conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    assert made_by_next != alembic_head(), (
        f"{MLFLOW_NEXT} is not newer than this venv's MLflow (both at schema {made_by_next}): "
        "pin this venv's mlflow below .ci/mlflow_venvs.sh's 'next' version in .ci/pins/default.txt")
    return stores


def _copy(made, name):
    return lambda db: shutil.copyfile(made[name], db)


def _sql(name, *statements):
    """A copy of store ``name`` with ``statements`` run on it."""
    def build(made, db):
        shutil.copyfile(made[name], db)
        with sqlite3.connect(db) as conn:
            for statement in statements:
                conn.execute(statement)
    return build


def _truncated(name, keep):
    def build(made, db):
        data = made[name].read_bytes()
        db.write_bytes(data[:keep if keep > 1 else int(len(data) * keep)])
    return build


def _immutable(made, db):
    shutil.copyfile(made["current"], db)
    subprocess.run(["chattr", "+i", str(db)], check=True)


def _other_database(made, db):
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")


def _symlink_to_dir(made, db):
    target = db.parent / "elsewhere"
    target.mkdir()
    db.symlink_to(target)


OLDER = r"Detected out-of-date database schema \(found version \w+, but expected \w+\).*cp .*\.bak.*mlflow db upgrade"
NEWER = r"is at schema version \w+, which MLflow [\d.]+ \(schema \w+\) does not know: a newer MLflow"
NOT_DB = r"is not a database \(sqlite: file is not a database\)"
LEFTOVER = r"leftover tables of an interrupted MLflow upgrade \(_alembic_tmp_\w+\).*mlflow db upgrade"
NO_VERSION = r"has MLflow's tables but no schema version"

#: id -> (build(made, db), the message), for stores this MLflow cannot use.
REFUSED = {
    "mlflow2-with-runs": (lambda made, db: _copy(made, "mlflow2")(db), OLDER),
    "mlflow2-empty": (lambda made, db: _copy(made, "mlflow2_empty")(db), OLDER),
    "mlflow2-wal-mode": (_sql("mlflow2", "PRAGMA journal_mode=WAL"), OLDER),
    "mlflow2-with-upgrade-leftovers": (_sql("mlflow2", "CREATE TABLE _alembic_tmp_runs AS SELECT * FROM runs"),
                                       LEFTOVER),
    "newer-mlflow-with-runs": (lambda made, db: _copy(made, "next")(db), NEWER),
    "unknown-revision": (_sql("current", "UPDATE alembic_version SET version_num = 'ffffffffffff'"), NEWER),
    "text-file": (lambda made, db: db.write_text("hello\n"), NOT_DB),
    "random-bytes": (lambda made, db: db.write_bytes(random.Random(7).randbytes(8192)), NOT_DB),
    "sqlite-magic-only": (lambda made, db: db.write_bytes(b"SQLite format 3\x00" + bytes(40)), NOT_DB),
    "gzip-of-a-store": (lambda made, db: db.write_bytes(gzip.compress(made["current"].read_bytes())), NOT_DB),
    "truncated-half": (_truncated("current", 0.5), r"is truncated: [\d,]+ bytes of the [\d,]+ its header says"),
    "truncated-to-its-header": (_truncated("mlflow2", 100), r"is truncated: 100 bytes of the"),
    "a-directory": (lambda made, db: db.mkdir(), r"is a directory, not MLflow's database file"),
    "a-symlink-to-a-directory": (_symlink_to_dir, r"is a directory, not MLflow's database file"),
    "immutable": (_immutable, r"no permission to read and write it"),
    "another-programs-database": (_other_database, r"is a sqlite database but not MLflow's store \(its tables: users\)"),
    "no-alembic-version-table": (_sql("current", "DROP TABLE alembic_version"), NO_VERSION),
    "empty-alembic-version": (_sql("current", "DELETE FROM alembic_version"), NO_VERSION),
    "upgrade-leftovers": (_sql("current", "CREATE TABLE _alembic_tmp_tags AS SELECT * FROM tags"), LEFTOVER),
    "upgrade-leftover-renamed-away": (_sql("current", "ALTER TABLE tags RENAME TO _alembic_tmp_tags"),
                                      r"ALTER TABLE _alembic_tmp_tags RENAME TO tags"),
}


def _digest(path: Path) -> str:
    if path.is_dir():
        return "dir:" + ",".join(sorted(os.listdir(path)))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _config(**mlflow):
    return {"experiment": "exp", "run_name": "r", "flush_steps": 5, "sinks": {"jsonl": {}, "mlflow": mlflow}}


def _train(config):
    with msbridge.track(config, progress=False) as run:
        for step in range(1, STEPS + 1):
            run.step(loss=1.0 / step)
    return run


def _jsonl_steps(tmp_path):
    [log] = glob.glob(str(tmp_path / "msbridge_runs" / "exp" / "r*" / "metrics" / "rank_0.jsonl"))
    return steps_and_gaps(parse_lines(Path(log)))[0]


@pytest.fixture
def exp_db(tmp_path):
    db = tmp_path / "msbridge_runs" / "exp" / "mlflow.db"
    db.parent.mkdir(parents=True)
    yield db
    if db.exists() and not db.is_symlink():
        subprocess.run(["chattr", "-i", str(db)], check=False)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_store_this_mlflow_cannot_use_is_refused_before_training_and_left_as_it_is(case, made, exp_db, tmp_path,
                                                                                   capfd, caplog):
    build, message = REFUSED[case]
    build(made, exp_db)
    before = _digest(exp_db)
    (tmp_path / "monitor.yaml").write_text("experiment: exp\nrun_name: r\nsinks:\n  jsonl: {}\n  mlflow: {}\n")
    assert main(["config", "check", "monitor.yaml"]) == 1
    said = capfd.readouterr().out
    assert "monitor.yaml:5: sinks.mlflow: tracking_uri (by default 'sqlite:///" in said
    assert len(re.findall(message, said)) == 1, said
    with pytest.raises(ConfigError, match=message):
        msbridge.track(_config(), progress=False)
    assert not glob.glob(str(tmp_path / "msbridge_runs" / "exp" / "r*"))  # training did not start
    _train(_config(on_fault="warn"))  # the user's choice: train without MLflow
    assert _jsonl_steps(tmp_path) == list(range(1, STEPS + 1))
    said = [r.getMessage() for r in caplog.records if "off for this run" in r.getMessage()]
    assert len(said) == 1 and "sinks.mlflow: off for this run (on_fault: warn)" in said[0], said
    assert _digest(exp_db) == before
    assert glob.glob(str(exp_db.parent / "mlflow.db*")) == [str(exp_db)]  # no copy, no journal left beside it


def test_mlflow_2_still_reads_its_store_after_msbridge_refused_it(made, exp_db):
    shutil.copyfile(made["mlflow2"], exp_db)
    with pytest.raises(ConfigError, match=OLDER):
        msbridge.track(_config(), progress=False)
    read = subprocess.run([str(MLFLOW2), "-c", _READ_RUNS, str(exp_db)], capture_output=True, text=True,
                          timeout=300)
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.strip() == "[('team-0', '0.1', 1.0), ('team-1', '0.2', 0.5)]"


@pytest.mark.parametrize("uri", ["file:./mlruns", "./mlruns"])
def test_mlflows_filesystem_store_is_refused_in_mlflows_words(uri, capsys, tmp_path):
    (tmp_path / "monitor.yaml").write_text(f"experiment: exp\nsinks:\n  mlflow: {{tracking_uri: '{uri}'}}\n")
    assert main(["config", "check", "monitor.yaml"]) == 1
    said = capsys.readouterr().out
    assert "is in maintenance mode and will not receive further updates" in said
    assert "sqlite:///mlflow.db" in said and "MLFLOW_ALLOW_FILE_STORE=true" in said


def test_a_given_tracking_uri_is_checked_as_the_default_one(made, tmp_path, capsys):
    shutil.copyfile(made["next"], tmp_path / "team.db")
    (tmp_path / "monitor.yaml").write_text("experiment: exp\nsinks:\n  mlflow: {tracking_uri: 'sqlite:///team.db'}\n")
    assert main(["config", "check", "monitor.yaml"]) == 1
    assert "monitor.yaml:3: sinks.mlflow.tracking_uri:" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["empty-file", "whole-with-runs"])
def test_a_new_or_whole_store_is_used(case, made, exp_db, tmp_path):
    if case == "empty-file":
        exp_db.write_bytes(b"")
    else:
        shutil.copyfile(made["current"], exp_db)
    run = _train(_config())
    assert run.outcome.exit_code == 0
    assert _jsonl_steps(tmp_path) == list(range(1, STEPS + 1))
    with sqlite3.connect(exp_db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == alembic_head()
        steps = {row[0] for row in conn.execute("SELECT step FROM metrics WHERE key = 'train/loss'")}
    assert steps == set(range(1, STEPS + 1))
    assert set(glob.glob(str(exp_db.parent / "mlflow.db*"))) <= {str(exp_db), f"{exp_db}.lock"}  # no copy


_HOLD_LOCK = """import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_store_locked_by_another_process_is_an_outage_not_a_fault(made, exp_db, tmp_path):
    shutil.copyfile(made["current"], exp_db)
    before = _digest(exp_db)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(exp_db), "120"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        run = _train(_config(close_timeout=2))
    finally:
        holder.kill()
        holder.wait()
    assert run.outcome.exit_code == 3, run.outcome  # undelivered, named with its replay
    assert "12 behind" in run.outcome.undelivered["mlflow"], run.outcome
    assert _jsonl_steps(tmp_path) == list(range(1, STEPS + 1))
    assert _digest(exp_db) == before


# --- the template cache -------------------------------------------------------------------------------------------


def _corrupt_page(path: Path) -> None:
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for offset in range(2 * page, min(len(data), 6 * page), 97):  # b-tree pages past the schema's
        data[offset] = 0xFF
    path.write_bytes(bytes(data))


def _wrong_schema(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0584bdc529eb'")


#: id -> what is done to a whole template, or to the cache, before a store is made from it.
BAD_TEMPLATES = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 3]),
    "corrupt-bytes": lambda path: path.write_bytes(random.Random(3).randbytes(len(path.read_bytes()))),
    "empty": lambda path: path.write_bytes(b""),
    "another-schema": _wrong_schema,
    "corrupt-page": _corrupt_page,
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of its own (``XDG_CACHE_HOME``) holding a whole template."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from mlflow.tracking import MlflowClient
    open_client(f"sqlite:///{tmp_path / 'first.db'}", MlflowClient).search_experiments()
    path = Path(template_path())
    assert path.is_file() and store_defect(str(path)) == ""
    yield path
    subprocess.run(["chattr", "-R", "-i", str(tmp_path / "cache")], check=False, capture_output=True)


def _store_works(db: Path) -> None:
    from mlflow.tracking import MlflowClient
    client = open_client(f"sqlite:///{db}", MlflowClient)
    experiment = client.create_experiment("works")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "loss", 0.5, step=1)
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == [0.5]
    assert store_defect(str(db)) == ""


@pytest.mark.parametrize("case", sorted(BAD_TEMPLATES))
def test_a_bad_template_is_made_again_with_one_line_naming_it(case, cache, tmp_path, caplog):
    BAD_TEMPLATES[case](cache)
    assert store_defect(str(cache)) != ""
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        _store_works(tmp_path / "new.db")
    said = [r.getMessage() for r in caplog.records if "template" in r.getMessage()]
    assert len(said) == 1 and f"MLflow's store template {cache} is " in said[0], said
    assert "made again by MLflow" in said[0] and str(cache.parent) in said[0]
    assert store_defect(str(cache)) == ""  # the cache is whole again: the next run uses it


def _template_a_directory(cache):
    cache.unlink()
    cache.mkdir()


def _immutable_folder(cache):
    cache.unlink()
    subprocess.run(["chattr", "+i", str(cache.parent)], check=True)


def _cache_root_a_file(cache):
    root = cache.parents[2]
    shutil.rmtree(root)
    root.write_text("not a folder")


#: id -> what is done to the cache: none of it can hold a template, so MLflow makes the store itself.
UNUSABLE_CACHES = {"template-a-directory": _template_a_directory, "immutable-folder": _immutable_folder,
                   "cache-root-a-file": _cache_root_a_file}


@pytest.mark.parametrize("case", sorted(UNUSABLE_CACHES))
def test_a_cache_that_cannot_be_used_leaves_the_store_to_mlflow_with_one_line(case, cache, tmp_path, caplog):
    UNUSABLE_CACHES[case](cache)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        _store_works(tmp_path / "new.db")
    said = [r.getMessage() for r in caplog.records if "template" in r.getMessage()]
    assert len(said) == 1 and "MLflow makes the store itself" in said[0], said


def test_with_home_and_xdg_cache_home_unset_a_run_still_gets_its_store(tmp_path, monkeypatch, exp_db):
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    started = time.monotonic()
    run = _train(_config())
    assert run.outcome.exit_code == 0, time.monotonic() - started
    assert _jsonl_steps(tmp_path) == list(range(1, STEPS + 1))
    assert store_defect(str(exp_db)) == ""
