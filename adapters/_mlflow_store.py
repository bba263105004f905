"""A ``sqlite:///`` MLflow store made once and whole: never half-made by a kill, never raced by concurrent runs.

MLflow makes a sqlite store the first time a client touches it: it creates the tables, then runs its
~50 alembic migrations, many of which copy a table into ``_alembic_tmp_<table>`` and rename it back,
each committed on its own. A process killed meanwhile leaves a store every later run fails on
(``table _alembic_tmp_tags already exists``), and two processes starting on one new store run the
migrations at once (``duplicate column name: step``). MLflow's own lock for this sits in the temp dir,
per URI, and does not cover a kill.

``open_client`` touches the store under a cross-process ``fcntl.flock`` on ``<store>.lock`` beside it
(the kernel drops the lock of a killed holder), and a store that does not exist yet is made aside,
in ``.<store>.creating-<pid>`` in the same directory (a copy of MLflow's own template, ``_mlflow_template``),
then renamed into place once whole:
a kill at any moment leaves either no store (and a temp file the next run removes) or a whole one.

A store left half-made by an older msbridge (``_alembic_tmp_*`` tables, or a schema version that is
not MLflow's head) is repaired under the same lock: one that holds no run is moved aside (kept as
``<store>.half-made-<time>``) and made again; one that holds runs is copied to
``<store>.before-repair-<time>``, then repaired in place (a process that has it open keeps writing to
the same file): its leftover ``_alembic_tmp_*`` tables are dropped where their table still exists and
MLflow's migration (what ``mlflow db upgrade`` runs) finishes. A kill during that repair leaves a store
the next run repairs again. If the repair fails, the error names the store, the copy and the command
to run once the cause is fixed.

Example:
    >>> client = open_client("sqlite:////tmp/exp/mlflow.db", MlflowClient)   # made, whole, once
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import sqlite3
import time
from typing import Any, Callable, List, Optional
from urllib.parse import quote

from msbridge.adapters._mlflow_template import alembic_head, copy_template, store_lock

log = logging.getLogger("msbridge")

_TMP_PREFIX = "_alembic_tmp_"


def store_file(uri: str) -> Optional[str]:
    """The file of a ``sqlite:///`` store (absolute), else None (a server, ``:memory:``, a URI with options)."""
    if not uri.startswith("sqlite:///") or "?" in uri or uri == "sqlite:///:memory:":
        return None
    return os.path.abspath(uri[len("sqlite:///"):])


def open_client(uri: str, client_cls: Callable[[str], Any]) -> Any:
    """``client_cls(uri)`` (``MlflowClient``) once its store is whole; a sqlite store is made or repaired first."""
    path = store_file(uri)
    if path is None:
        return client_cls(uri)
    with store_lock(path):
        make_whole(path, client_cls)
        client = client_cls(uri)
        client.search_experiments(max_results=1)  # MLflow opens the store (its Default experiment) under the lock
    return client


def make_whole(path: str, client_cls: Callable[[str], Any]) -> None:
    """Make the sqlite store at ``path`` (a copy of MLflow's template, ``_mlflow_template``) or repair it; the
    caller holds ``store_lock(path)``. ``client_cls`` (``MlflowClient``) is called only to make or repair one."""
    for stale in glob.glob(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.creating-*")):
        os.remove(stale)  # a creator killed before its rename: nobody else creates while we hold the lock
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        _make_aside(path, client_cls)
    else:
        problem = half_made(path)
        if problem:
            _repair(path, problem, client_cls)


def half_made(path: str) -> str:
    """What is unfinished in the store at ``path`` ("" when it is whole): leftover migration tables, or a
    schema version that is not the head of this MLflow's migrations."""
    # read-write, never creating: a writer killed mid-transaction left a hot journal, which sqlite rolls back on
    # this first read (read-only, it would refuse: "attempt to write a readonly database"); we hold the lock
    with contextlib.closing(sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=30.0)) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        leftovers = sorted(t for t in tables if t.startswith(_TMP_PREFIX))
        version = db.execute("SELECT version_num FROM alembic_version").fetchone() \
            if "alembic_version" in tables else None
    if leftovers:
        return f"leftover migration tables {', '.join(leftovers)}"
    head = alembic_head()
    if version is None:
        return "no schema version"
    if head is not None and version[0] != head:
        return f"schema version {version[0]}, not MLflow's {head}"
    return ""


def _make_aside(path: str, client_cls: Callable[[str], Any]) -> None:
    """Make a new store in ``.<store>.creating-<pid>`` (a copy of MLflow's template, else MLflow's tables and
    migrations there), then rename it to ``path``."""
    temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.creating-{os.getpid()}")
    try:
        if not copy_template(temp):
            client_cls(f"sqlite:///{temp}").search_experiments(max_results=1)  # MLflow makes and migrates it
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)


def _repair(path: str, problem: str, client_cls: Callable[[str], Any]) -> None:
    """Make a half-made store whole (see the module's docstring), or raise naming the command that does."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if not _holds_runs(path):
        kept = f"{path}.half-made-{stamp}"
        os.replace(path, kept)
        _make_aside(path, client_cls)
        log.warning("msbridge: MLflow's store %s was half-made (%s) and held no run: made again (the old file "
                    "is kept as %s)", path, problem, kept)
        return
    backup = f"{path}.before-repair-{stamp}"
    shutil.copyfile(path, backup)  # in place, not renamed: a process that has the store open keeps writing to it
    try:
        _drop_leftovers(path)
        _upgrade(path)
    except Exception as exc:
        raise RuntimeError(f"MLflow's store {path} was left half-made ({problem}) and holds runs; msbridge "
                           f"could not repair it ({type(exc).__name__}: {exc}); a copy from before is {backup}; "
                           f"once the cause is fixed, run: mlflow db upgrade sqlite:///{path}") from None
    log.warning("msbridge: MLflow's store %s was half-made (%s): repaired in place (leftover tables dropped, "
                "MLflow's migration finished; a copy from before is %s)", path, problem, backup)


def _holds_runs(path: str) -> bool:
    with contextlib.closing(sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=30.0)) as db:
        try:
            return db.execute("SELECT 1 FROM runs LIMIT 1").fetchone() is not None
        except sqlite3.OperationalError:  # no runs table: nothing to keep
            return False


def _drop_leftovers(path: str) -> List[str]:
    """Drop the ``_alembic_tmp_<table>`` tables whose ``<table>`` still exists (a copy the kill interrupted)."""
    with contextlib.closing(sqlite3.connect(path, timeout=30.0)) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        dropped = [t for t in sorted(tables) if t.startswith(_TMP_PREFIX) and t[len(_TMP_PREFIX):] in tables]
        for table in dropped:
            db.execute(f'DROP TABLE "{table}"')
        db.commit()
    return dropped


def _upgrade(path: str) -> None:
    """MLflow's migration to its head (what ``mlflow db upgrade`` runs) on the store at ``path``."""
    import sqlalchemy
    from mlflow.store.db.utils import _upgrade_db

    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        _upgrade_db(engine)
    finally:
        engine.dispose()

