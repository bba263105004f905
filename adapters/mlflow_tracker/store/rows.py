"""Metric rows (and their tags) for a local sqlite MLflow store, written by sqlite instead of MLflow's ORM.

``MlflowClient.log_batch`` spends about 145 µs of CPU per metric row in SQLAlchemy's ORM (measured
here: 13 metrics a step is ~1.9 ms for a ~12 ms training step). On a machine whose cores training
already keeps busy, that CPU comes out of training even at ``SCHED_IDLE``. For a ``sqlite:///``
store this writes the same rows into the same two tables MLflow's store writes (``metrics`` and
``latest_metrics``) with one ``executemany``, about 6-9 µs a row, in one transaction, with MLflow's
rules: NaN is stored as ``is_nan=1, value=0``; +-inf as +-1.8e308; a row equal in every column to
one already there is dropped; ``latest_metrics`` keeps each key's greatest (step, timestamp, value).
Tags sent with the rows (msbridge's last-step tag) land in ``tags`` in the same transaction, so the
tag never claims a step whose rows are not there (``log_batch`` through MLflow's client sets them
in separate transactions, after ~5 ms of loading the run).

It applies only where those tables have exactly the columns written here, checked once per store;
anywhere else (another MLflow schema, a server, a run that is not active) ``rows_for`` gives None or
``log`` gives False, and the caller uses ``MlflowClient``. Runs, params, other tags, artifacts and
status always go through ``MlflowClient``, and so does any ``mlflow.`` tag (MLflow acts on some).
``tests/adapters/test_mlflow_sqlite.py`` checks that both write the same rows.

Example:
    >>> rows = rows_for("sqlite:////tmp/exp/mlflow.db")          # None if it does not apply
    >>> rows.log(run_id, [("train/loss", 2.5, 1700000000000, 1)], [("msbridge.last_step", "1")])  # True
"""
from __future__ import annotations

import math
import sqlite3
from typing import Dict, Optional, Sequence, Tuple
from urllib.parse import quote

#: The columns MLflow's store has in each table this writes (MLflow 3.x): the schema this path requires.
COLUMNS: Dict[str, Tuple[str, ...]] = {
    "metrics": ("key", "value", "timestamp", "run_uuid", "step", "is_nan"),
    "latest_metrics": ("key", "value", "timestamp", "run_uuid", "step", "is_nan"),
    "tags": ("key", "value", "run_uuid"),
}
_MAX = 1.7976931348623157e308  # what MLflow stores for +inf (SQL has no infinity)
_INSERT = "INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)"
_LATEST = ("INSERT INTO latest_metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?) "
           "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value, timestamp = excluded.timestamp, "
           "step = excluded.step, is_nan = excluded.is_nan "
           "WHERE (excluded.step, excluded.timestamp, excluded.value) > "
           "(latest_metrics.step, latest_metrics.timestamp, latest_metrics.value)")
_TAG = ("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
        "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value")

#: How a full disk under a sqlite store reads, in sqlite's words (SQLITE_FULL, SQLITE_IOERR) and the OS's (ENOSPC).
FULL_DISK = ("database or disk is full", "disk i/o error", "no space left on device", "[errno 28]")

Metric = Tuple[str, float, int, int]  # (key, value, timestamp_ms, step), as ClientProcess sends them
Tag = Tuple[str, str]


class MetricRows:
    """Writes metric rows of a run into one sqlite MLflow store (see the module's docstring).

    Example:
        >>> MetricRows("/tmp/exp/mlflow.db").log(run_id, [("train/loss", 2.5, 1700000000000, 1)])
    """

    def __init__(self, path: str) -> None:
        # mode=rw: a store MLflow has not made yet is an error here, never a new empty file
        self._db = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=20.0, isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")

    def matches_schema(self) -> bool:
        """Whether the store's tables written here have exactly the columns written here."""
        return all({row[1] for row in self._db.execute(f"PRAGMA table_info({table})")} == set(columns)
                   for table, columns in COLUMNS.items())

    def log(self, run_id: str, metrics: Sequence[Metric], tags: Sequence[Tag] = ()) -> bool:
        """Write ``metrics`` and ``tags`` in one transaction; False (nothing written) if the run is not
        an active run of this store, or a tag is MLflow's own, so that MLflow's client does it."""
        if any(key.startswith("mlflow.") for key, _ in tags):
            return False
        rows = [_row(run_id, *m) for m in metrics]
        latest: Dict[str, tuple] = {}
        for row in rows:  # each key's greatest (step, timestamp, value); the first of equals wins
            best = latest.get(row[0])
            if best is None or (row[4], row[2], row[1]) > (best[4], best[2], best[1]):
                latest[row[0]] = row
        self._db.execute("BEGIN IMMEDIATE")
        try:
            stage = self._db.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
            if stage is None or stage[0] != "active":
                self._db.execute("ROLLBACK")
                return False
            self._db.executemany(_INSERT, rows)
            self._db.executemany(_LATEST, latest.values())
            self._db.executemany(_TAG, [(key, value, run_id) for key, value in tags])
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # sqlite rolled back itself on some errors (a full disk): keep that error
                self._db.execute("ROLLBACK")
            raise
        return True

    def close(self) -> None:
        self._db.close()


def rows_for(uri: str) -> Optional[MetricRows]:
    """A ``MetricRows`` for a ``sqlite:///`` file store whose schema matches, else None."""
    if not uri.startswith("sqlite:///") or "?" in uri or uri == "sqlite:///:memory:":
        return None
    try:
        rows = MetricRows(uri[len("sqlite:///"):])
        if rows.matches_schema():
            return rows
        rows.close()
    except sqlite3.Error:
        pass
    return None


def full_disk_store(uri: str, error: BaseException) -> Optional[str]:
    """The store's file when ``uri`` is a ``sqlite:///`` store and ``error`` says its disk is full, else None."""
    text = str(error).lower()
    if uri.startswith("sqlite:///") and any(marker in text for marker in FULL_DISK):
        return uri[len("sqlite:///"):].partition("?")[0]
    return None


def _row(run_id: str, key: str, value: float, timestamp: int, step: int) -> tuple:
    """One ``metrics`` row as MLflow's store writes it."""
    value = float(value)
    if math.isnan(value):
        return key, 0.0, int(timestamp), run_id, int(step), 1
    if math.isinf(value):
        value = _MAX if value > 0 else -_MAX
    return key, value, int(timestamp), run_id, int(step), 0
