"""A fresh sqlite MLflow store copied from a template that MLflow's own migrations made once per MLflow version.

MLflow makes a new sqlite store by creating its tables and running its ~50 alembic migrations: ~4.7 CPU-s here,
plus ~3.1 CPU-s to import MLflow, for every new experiment directory. The template is that store, made once
by MLflow itself (``MlflowClient(uri).search_experiments``, as before) and kept in the user's cache dir
(``$XDG_CACHE_HOME/msbridge/mlflow-store/<mlflow version>-<alembic head>.db``, else ``~/.cache/...``); a new
store is a copy of it, ~10 ms and no MLflow import. MLflow stays the owner of its schema: a new MLflow
version or migration is a new key, so a new template, made by that MLflow.

The copy is what MLflow would have made there: its one row that depends on where and when it was made,
the ``Default`` experiment (id 0), gets MLflow's values for this process (artifact location
``<cwd>/mlruns/0``, creation time now). The template is made aside and renamed into place under an
``fcntl.flock`` beside it, so concurrent first runs make it once and never see half of one.

The cache is the user's disk, so every copy is checked before it is used (``store_defect``: ``PRAGMA
integrity_check`` and the alembic head): a truncated or corrupt template is made again by MLflow, with one line
naming it. A cache that cannot be written (read-only, a file where its folder should be, no home directory) or a
template that is not a file leaves the store to MLflow's own creation, slower, with one line.

Only ``sqlite:///`` files take this path: a remote ``mlflow server`` makes its own store, and a
PostgreSQL/MySQL store is a database server's, which a file copy cannot make (``docs/sinks.md``).

Example (not a doctest: the first call makes the template in the user's cache)::

    copy_template("/tmp/exp/.mlflow.db.creating-42")   # a whole store, as MLflow makes it, in ~10 ms
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import sqlite3
import time
from typing import FrozenSet, Iterator, Optional, Tuple
from urllib.parse import quote

log = logging.getLogger("msbridge")

_REVISION = re.compile(r'^(down_)?revision\s*=\s*(.*)$', re.M)
_HEX = re.compile(r'["\']([0-9a-zA-Z_]+)["\']')


@functools.lru_cache(maxsize=None)
def schema_revisions() -> Tuple[Optional[str], FrozenSet[str]]:
    """The head of this MLflow's migrations and every revision they know, read from its migration scripts without
    importing MLflow; ``(None, frozenset())`` when they cannot be read (another layout, or not exactly one head)."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None, frozenset()
    folder = os.path.join(list(spec.submodule_search_locations)[0], "store", "db_migrations", "versions")
    revisions, parents = set(), set()
    for script in glob.glob(os.path.join(folder, "*.py")):
        with open(script, encoding="utf-8") as handle:
            for down, value in _REVISION.findall(handle.read()):
                (parents if down else revisions).update(_HEX.findall(value))
    heads = revisions - parents
    return (heads.pop(), frozenset(revisions)) if len(heads) == 1 else (None, frozenset())


def alembic_head() -> Optional[str]:
    """The head of this MLflow's migrations (``schema_revisions``), or None."""
    return schema_revisions()[0]


def template_path() -> Optional[str]:
    """Where this MLflow's template lives (keyed by version and alembic head), or None if the key is unknown or
    there is no cache dir (``XDG_CACHE_HOME`` unset and no home directory)."""
    head = alembic_head()
    if head is None:
        return None
    version = importlib.metadata.version("mlflow")
    home = os.path.expanduser("~")
    root = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else "")
    return os.path.join(os.path.abspath(root), "msbridge", "mlflow-store", f"{version}-{head}.db") if root else None


def store_defect(path: str) -> str:
    """What is wrong with the sqlite store file at ``path`` as a whole store at this MLflow's head ("" when
    nothing): ``PRAGMA integrity_check`` and its alembic version, read only.

    Example:
        >>> store_defect("/etc/hostname")
        'not a database (file is not a database)'
    """
    try:
        with contextlib.closing(sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=10.0)) as db:
            check = [row[0] for row in db.execute("PRAGMA integrity_check(3)")]
            if check != ["ok"]:
                return f"integrity_check says {'; '.join(check)}"
            version = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error as exc:
        return f"not a database ({exc})" if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc) \
            else f"unreadable ({exc})"
    if version is None or version[0] != alembic_head():
        return f"schema version {version[0] if version else None}, not this MLflow's {alembic_head()}"
    return ""


@contextlib.contextmanager
def store_lock(path: str) -> Iterator[None]:
    """Hold ``<path>.lock`` exclusively (``fcntl.flock``: released by the kernel if the holder dies)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _make(path: str) -> None:
    """The template, made by MLflow's own client and migrations, aside and then renamed into place."""
    from msbridge.adapters.mlflow_tracker.client.process import import_client

    temp = f"{path}.creating-{os.getpid()}-{time.monotonic_ns()}"  # MLflow keeps a store per URI: never one again
    try:
        import_client()(f"sqlite:///{temp}").search_experiments(max_results=1)
        with contextlib.closing(sqlite3.connect(temp)) as db:
            version = db.execute("SELECT version_num FROM alembic_version").fetchone()
        if version is None or version[0] != alembic_head():
            raise RuntimeError(f"MLflow made {temp} at schema {version}, not {alembic_head()}")
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)


def copy_template(target: str) -> bool:
    """Copy this MLflow's template (made first if needed) to ``target``, checked (``store_defect``), and give its
    ``Default`` experiment MLflow's values for here and now. A defective template is made again by MLflow, with one
    line naming it; False (nothing left at ``target``) when there is no template to use (no key, no writable cache,
    a template MLflow could not make whole): MLflow then makes the store itself, as before."""
    path = template_path()
    if path is None:
        return False
    try:
        with store_lock(path):  # a maker's rename, or a remake of a bad one, is never seen half-done
            made = _ensure(path)
            shutil.copyfile(path, target)
        defect = store_defect(target)
        if defect and not made:  # the cached template is bad (a disk fault, an edit by hand): MLflow makes it again
            log.warning("msbridge: MLflow's store template %s is %s: made again by MLflow (delete the folder %s to "
                        "clear msbridge's cache)", path, defect, os.path.dirname(path))
            with store_lock(path):
                if store_defect(path):  # not remade meanwhile by another run
                    os.remove(path)
                _ensure(path)
                shutil.copyfile(path, target)
            defect = store_defect(target)
        if defect:
            raise OSError(f"the copy of {path} is {defect}")
    except OSError as exc:  # no cache dir to write, a template that is a directory ...: MLflow makes the store
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)
        log.warning("msbridge: MLflow's store template cannot be used from %s (%s); MLflow makes the store itself "
                    "(seconds of CPU)", os.path.dirname(path), exc)
        return False
    now = int(time.time() * 1000)
    default = os.path.join(os.path.abspath("mlruns"), "0")  # MLflow's ./mlruns, resolved in this cwd
    with contextlib.closing(sqlite3.connect(target)) as db:
        db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                   "WHERE experiment_id = 0", (default, now, now))
        db.commit()
    return True


def _ensure(path: str) -> bool:
    """The template at ``path`` made by MLflow unless it exists; True if made now. The caller holds its lock."""
    if os.path.exists(path):
        return False
    if not os.access(os.path.dirname(path), os.W_OK):  # immutable, read-only mount ...: MLflow would retry for minutes
        raise PermissionError(f"the folder {os.path.dirname(path)} cannot be written")
    for stale in glob.glob(f"{path}.creating-*"):
        os.remove(stale)  # a maker killed before its rename: we hold the lock
    _make(path)
    return True
