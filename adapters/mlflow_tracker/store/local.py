"""A ``sqlite:///`` MLflow store is its user's: made once and whole when it does not exist, never changed in schema
when it does.

A new store. MLflow makes a sqlite store the first time a client touches it: it creates the tables, then runs its
~50 alembic migrations, each committed on its own. A process killed meanwhile leaves a store MLflow cannot open
(``table _alembic_tmp_tags already exists``), and two processes starting on one new store race the migrations
(``duplicate column name: step``). So msbridge makes a missing (or empty) store aside, in
``.<store>.creating-<pid>`` in the same directory (a copy of MLflow's own template, ``mlflow_tracker.store.template``), under a
cross-process ``fcntl.flock`` on ``<store>.lock`` (the kernel drops the lock of a killed holder), and renames it into
place once whole: a kill at any moment leaves no store (and a temp file, msbridge's own marker of a store it began,
which the next run removes) or a whole one. msbridge never leaves a store half-made in place, so it never finishes
one.

An existing store. MLflow itself never migrates a store behind its user's back: a client on an old schema refuses
and says ``mlflow db upgrade``, which its user runs after a backup. msbridge does the same, before training
(``store_problem``, read-only; the ``tracking_uri`` check of ``config check`` and of the sink's build): a store at
an older schema (MLflow 2's, say), at a schema this MLflow does not know (a team member's newer MLflow), with the
leftover tables of an interrupted upgrade, that is not a database, truncated, a directory or without permission,
is refused with its file and its fix, and left as it is: nothing dropped, migrated or copied. A store that is
locked (another process writing) is not a fault: the sink retries it as an outage.

Example:
    >>> store_problem("/etc/hostname")[:60]
    "/etc/hostname is not a database (sqlite: file is not a datab"
"""
from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import os
import sqlite3
import struct
import time
from typing import Any, Callable, Optional
from urllib.parse import quote

from msbridge.adapters.mlflow_tracker.store.template import copy_template, schema_revisions, store_lock

#: ``TrackerError.error_code`` of a store refused in MLflow's child: permanent, never retried.
STORE_REFUSED = "MSBRIDGE_STORE_REFUSED"
_TMP_PREFIX = "_alembic_tmp_"
_MAGIC = b"SQLite format 3\x00"
#: Tables MLflow's first migration makes: a store that has some and no schema version was being made.
_MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "params", "tags"})


class StoreRefused(Exception):
    """A store msbridge will not use as it is (``store_problem``'s text); ``error_code`` marks it permanent.

    Example:
        >>> StoreRefused("mlflow.db is a directory").error_code
        'MSBRIDGE_STORE_REFUSED'
    """

    error_code = STORE_REFUSED


def store_file(uri: str) -> Optional[str]:
    """The file of a ``sqlite:///`` store (absolute), else None (a server, ``:memory:``, a URI with options)."""
    if not uri.startswith("sqlite:///") or "?" in uri or uri == "sqlite:///:memory:":
        return None
    return os.path.abspath(uri[len("sqlite:///"):])


def open_client(uri: str, client_cls: Callable[[str], Any]) -> Any:
    """``client_cls(uri)`` (``MlflowClient``) once its store is whole; a missing sqlite store is made first, and
    one this MLflow cannot use raises ``StoreRefused``."""
    path = store_file(uri)
    if path is None:
        return client_cls(uri)
    with store_lock(path):
        make_whole(path, client_cls)
        client = client_cls(uri)
        client.search_experiments(max_results=1)  # MLflow opens the store (its Default experiment) under the lock
    return client


def make_whole(path: str, client_cls: Callable[[str], Any]) -> None:
    """Make the sqlite store at ``path`` if it is missing or empty (aside, then renamed), else raise
    ``StoreRefused`` if this MLflow cannot use it; the caller holds ``store_lock(path)``. ``client_cls``
    (``MlflowClient``) is called only where no template can be used."""
    for stale in glob.glob(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.creating-*")):
        os.remove(stale)  # a creator killed before its rename: nobody else creates while we hold the lock
    if _is_new(path):
        _make_aside(path, client_cls)
        return
    problem = store_problem(path)
    if problem:
        raise StoreRefused(problem)


def store_problem(path: str) -> str:
    """Why this MLflow cannot use the file at ``path`` as its store, with the fix ("" when it can, when the file
    does not exist or is empty (then it is made), or when it is locked by a writer: an outage, not a fault). Reads
    only; a hot journal a killed writer left is rolled back, as by any reader."""
    if os.path.isdir(path):
        return (f"{path} is a directory, not MLflow's database file; point tracking_uri at a file, such as "
                f"sqlite:///{os.path.join(path, 'mlflow.db')}")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return ""
    if not os.access(path, os.R_OK | os.W_OK):
        return (f"{path}: no permission to read and write it (mode {oct(os.stat(path).st_mode & 0o777)}, owner uid "
                f"{os.stat(path).st_uid}); give this user write access, or point tracking_uri at another store")
    damage = _file_damage(path)
    if damage:
        return damage
    try:
        with contextlib.closing(sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=2.0)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = db.execute("SELECT version_num FROM alembic_version").fetchone() \
                if "alembic_version" in tables else None
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            return ""  # another process is writing: retried as an outage
        return f"{path} cannot be read as MLflow's store (sqlite: {exc}); point tracking_uri at another store"
    except sqlite3.DatabaseError as exc:
        return _not_a_store(path, f"sqlite: {exc}")
    return _schema_problem(path, tables, version[0] if version else None)


def _is_new(path: str) -> bool:
    """Missing, empty, or a database with no table at all: what MLflow would make its store in."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return not os.path.isdir(path)
    try:
        with contextlib.closing(sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=2.0)) as db:
            return db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
    except sqlite3.Error:
        return False  # ``store_problem`` says what it is


def _file_damage(path: str) -> str:
    """A file that is not a sqlite database, or shorter than its header says (truncated), read from its header."""
    with open(path, "rb") as handle:
        header = handle.read(100)
    if len(header) < 100 or not header.startswith(_MAGIC):
        return _not_a_store(path, "sqlite: file is not a database")
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    changes, pages, valid_for = struct.unpack(">I", header[24:28])[0], struct.unpack(">I", header[28:32])[0], \
        struct.unpack(">I", header[92:96])[0]
    size = os.path.getsize(path)
    if pages and changes == valid_for and not os.path.exists(path + "-wal") and size < pages * page_size:
        return (f"{path} is truncated: {size:,} bytes of the {pages * page_size:,} its header says; restore it from "
                "a backup, or point tracking_uri at another store")
    return ""


def _not_a_store(path: str, why: str) -> str:
    return f"{path} is not a database ({why}); point tracking_uri at MLflow's database file, or at a new file"


def _schema_problem(path: str, tables: "set[str]", version: Optional[str]) -> str:
    """What keeps this MLflow from a store with ``tables`` at alembic ``version``, in MLflow's words where MLflow
    has them; "" for a store at this MLflow's head."""
    head, known = schema_revisions()
    mlflow = f"MLflow {importlib.metadata.version('mlflow')}"
    uri = f"sqlite:///{path}"
    leftovers = sorted(t for t in tables if t.startswith(_TMP_PREFIX))
    if leftovers:
        fixes = "; ".join(f"DROP TABLE {t}" if t[len(_TMP_PREFIX):] in tables else
                          f"ALTER TABLE {t} RENAME TO {t[len(_TMP_PREFIX):]}" for t in leftovers)
        return (f"{path} holds the leftover tables of an interrupted MLflow upgrade ({', '.join(leftovers)}); "
                f"msbridge never changes a store it did not make. Take a backup of your database (cp {path} "
                f"{path}.bak), then: sqlite3 {path} '{fixes}' and mlflow db upgrade {uri}")
    if "alembic_version" not in tables and not tables & _MLFLOW_TABLES:
        shown = ", ".join(sorted(tables)[:5]) + (" ..." if len(tables) > 5 else "")
        return (f"{path} is a sqlite database but not MLflow's store (its tables: {shown}); point tracking_uri at "
                "MLflow's database file, or at a new file")
    if version is None:
        return (f"{path} has MLflow's tables but no schema version: an MLflow that was making it was interrupted. "
                "If it holds nothing of yours, delete it (msbridge makes it again); else restore it from a backup")
    if head is None or version == head:
        return ""
    if version in known:
        return (f"{path}: Detected out-of-date database schema (found version {version}, but expected {head}), "
                f"as {mlflow} says; msbridge never migrates a store it did not make. Take a backup of your database "
                f"(cp {path} {path}.bak), then run 'mlflow db upgrade {uri}' to migrate your database to the latest "
                "schema (an older MLflow, such as MLflow 2, cannot open it afterwards)")
    return (f"{path} is at schema version {version}, which {mlflow} (schema {head}) does not know: a newer MLflow "
            f"made or upgraded it. Install that MLflow here (pip install -U mlflow), or point tracking_uri at "
            "another store")


def _make_aside(path: str, client_cls: Callable[[str], Any]) -> None:
    """Make a new store in ``.<store>.creating-<pid>`` (a copy of MLflow's template, else MLflow's tables and
    migrations there), then rename it to ``path``."""
    temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.creating-{os.getpid()}-{time.monotonic_ns()}")
    try:  # a name never used before: MLflow keeps a store per URI, open on the file it was made for
        if not copy_template(temp):
            client_cls(f"sqlite:///{temp}").search_experiments(max_results=1)  # MLflow makes and migrates it
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
