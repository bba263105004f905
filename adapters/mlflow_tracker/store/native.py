"""The MLflow calls of a run, done on a local sqlite store by sqlite itself: no MLflow import for a run.

Importing MLflow costs ~3.1 CPU-s here; on a host whose cores training keeps busy, an idle-class child waits
that long and more before a run exists. For a ``sqlite:///`` store (made whole from MLflow's template,
``mlflow_tracker.store.template``) the calls msbridge's MLflow sink makes are done here with the rows MLflow's
``SqlAlchemyStore`` writes: an experiment (``workspace 'default'``) and its tags, a run (``source_type
UNKNOWN``, user ``unknown``, artifact URI ``<experiment location>/<run id>/artifacts``, a ``mlflow.runName``
tag), params (a changed value is MLflow's error), tags, metric rows (``mlflow_tracker.store.rows``), status and end time,
and text artifacts written into a local artifact root. Searches take only the filters the sink uses
(none, or ``tags.`key` = 'value'``), ordered as MLflow orders them.

Anything else raises ``NotNative``, and the caller hands the call to MLflow's client: another call
(LoggedModels, ``delete_run`` ...), another filter, a remote artifact root, a run or experiment that is
not active, a ``mlflow.runName`` tag, a changed param. So every error message is MLflow's own.

Example (on a store ``mlflow_tracker.store.local.make_whole`` made; not a doctest, it needs one)::

    store = NativeStore("/tmp/exp/mlflow.db")
    run_id = store.call("create_run", ("1",), {"run_name": "r", "tags": {"k": "v"}}).info.run_id
"""
from __future__ import annotations

import math
import os
import re
import sqlite3
import time
import uuid
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote, urlparse

from msbridge.adapters.mlflow_tracker.store.rows import MetricRows

#: The columns of MLflow 3.x's tables this writes besides metric rows: the schema this path requires.
COLUMNS: Dict[str, Tuple[str, ...]] = {
    "experiments": ("experiment_id", "name", "artifact_location", "lifecycle_stage", "creation_time",
                    "last_update_time", "workspace"),
    "experiment_tags": ("key", "value", "experiment_id"),
    "runs": ("run_uuid", "name", "source_type", "source_name", "entry_point_name", "user_id", "status",
             "start_time", "end_time", "source_version", "lifecycle_stage", "artifact_uri", "experiment_id",
             "deleted_time"),
    "params": ("key", "value", "run_uuid"),
}
RUN_NAME_TAG = "mlflow.runName"
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")  # MLflow's RunStatus names
_TAG_FILTER = re.compile(r"^tags\.`([^`]+)` = '([^'\\]*)'$")
_METRIC_ORDER = re.compile(r"^metrics\.`([^`]+)`(?: (ASC|DESC))?$", re.I)
_VIEW = {1: ("active",), 2: ("deleted",), 3: ("active", "deleted")}  # MLflow's ViewType values
_TAG_UPSERT = ("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
               "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value")


class NotNative(Exception):
    """This call, with these arguments, is left to MLflow's client."""


def _now() -> int:
    return int(time.time() * 1000)


class NativeStore:
    """The sink's MLflow calls on one sqlite store (see the module's docstring).

    Example (on a store MLflow's template made)::

        NativeStore("/tmp/exp/mlflow.db").call("get_experiment_by_name", ("exp",), {})   # None: not there
    """

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=20.0, isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._rows = MetricRows(path)
        self._params: Dict[str, Dict[str, str]] = {}  # run id -> the params it holds (MLflow's never change)

    def matches_schema(self) -> bool:
        """Whether the store has exactly the columns written here, and metric rows' too."""
        return self._rows.matches_schema() and all(
            {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")} == set(columns)
            for table, columns in COLUMNS.items())

    def call(self, name: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        """``MlflowClient.<name>(*args, **kwargs)`` done here, or ``NotNative``."""
        method = getattr(self, "_" + name, None)
        if method is None:
            raise NotNative(name)
        try:
            return method(*args, **kwargs)
        except TypeError as exc:  # arguments this path does not take
            raise NotNative(f"{name}: {exc}") from None

    def close(self) -> None:
        self._rows.close()
        self._db.close()

    def _one(self, sql: str, *params: Any) -> Optional[tuple]:
        return self._db.execute(sql, params).fetchone()

    def _get_experiment_by_name(self, name: str) -> Any:
        row = self._one("SELECT experiment_id, name, artifact_location, lifecycle_stage, creation_time, "
                        "last_update_time FROM experiments WHERE name = ?", name)
        if row is None:
            return None
        tags = dict(self._db.execute("SELECT key, value FROM experiment_tags WHERE experiment_id = ?", (row[0],)))
        return SimpleNamespace(experiment_id=str(row[0]), name=row[1], artifact_location=row[2],
                               lifecycle_stage=row[3], tags=tags, creation_time=row[4], last_update_time=row[5])

    def _create_experiment(self, name: str, artifact_location: Optional[str] = None,
                           tags: Optional[Dict[str, str]] = None) -> str:
        if not name or not artifact_location or not os.path.isabs(artifact_location):
            raise NotNative("an experiment without an absolute local artifact location")
        if self._one("SELECT 1 FROM experiments WHERE name = ?", name):
            raise NotNative("the experiment exists: MLflow's own error")
        now = _now()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cursor = self._db.execute(
                "INSERT INTO experiments (name, artifact_location, lifecycle_stage, creation_time, last_update_time,"
                " workspace) VALUES (?, ?, 'active', ?, ?, 'default')", (name, artifact_location, now, now))
            experiment_id = cursor.lastrowid
            self._db.executemany("INSERT INTO experiment_tags (key, value, experiment_id) VALUES (?, ?, ?)",
                                 [(key, str(value), experiment_id) for key, value in (tags or {}).items()])
            self._db.execute("COMMIT")
        except sqlite3.IntegrityError:  # another run made it first: MLflow's RESOURCE_ALREADY_EXISTS then
            self._db.execute("ROLLBACK")
            raise NotNative("the experiment exists: MLflow's own error") from None
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        return str(experiment_id)

    def _create_run(self, experiment_id: str, start_time: Optional[int] = None,
                    tags: Optional[Dict[str, str]] = None, run_name: Optional[str] = None) -> Any:
        tags = dict(tags or {})
        experiment = self._one("SELECT artifact_location, lifecycle_stage FROM experiments WHERE experiment_id = ?",
                               int(experiment_id))
        if experiment is None or experiment[1] != "active" or not run_name or RUN_NAME_TAG in tags:
            raise NotNative("create_run that MLflow answers itself")
        run_id, start = uuid.uuid4().hex, start_time or _now()
        tags[RUN_NAME_TAG] = run_name
        artifact_uri = f"{experiment[0].rstrip('/')}/{run_id}/artifacts"
        user = tags.get("mlflow.user", "unknown")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status, "
                "start_time, end_time, source_version, lifecycle_stage, artifact_uri, experiment_id, deleted_time) "
                "VALUES (?, ?, 'UNKNOWN', '', '', ?, 'RUNNING', ?, NULL, '', 'active', ?, ?, NULL)",
                (run_id, run_name, user, start, artifact_uri, int(experiment_id)))
            self._db.executemany(_TAG_UPSERT, [(key, str(value), run_id) for key, value in tags.items()])
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        return SimpleNamespace(info=self._info(run_id), data=SimpleNamespace(metrics={}, params={}, tags=tags),
                               inputs=None)

    def _active(self, run_id: str) -> str:
        """The run's artifact URI; ``NotNative`` (MLflow raises its error) unless the run exists and is active."""
        row = self._one("SELECT lifecycle_stage, artifact_uri FROM runs WHERE run_uuid = ?", run_id)
        if row is None or row[0] != "active":
            raise NotNative("a run that is not an active run of this store")
        return row[1]

    def _log_batch(self, run_id: str, metrics: Sequence[Any] = (), params: Sequence[Any] = (),
                   tags: Sequence[Any] = ()) -> None:
        self._active(run_id)
        if any(key == RUN_NAME_TAG for key, _ in tags):
            raise NotNative("MLflow renames the run for this tag")
        logged = self._params.get(run_id)
        if logged is None:  # read once: a run's params are logged 100 a call (100,000: 1,000 calls)
            logged = self._params[run_id] = dict(
                self._db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
        if any(key in logged and logged[key] != str(value) for key, value in params):
            raise NotNative("a changed param: MLflow's own error")
        own = [(key, str(value)) for key, value in tags if key.startswith("mlflow.")]
        if metrics and not self._rows.log(run_id, metrics, [t for t in tags if not t[0].startswith("mlflow.")]):
            raise NotNative("metric rows MLflow writes itself")
        rest = own if metrics else [(key, str(value)) for key, value in tags]
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("INSERT OR IGNORE INTO params (key, value, run_uuid) VALUES (?, ?, ?)",
                                 [(key, str(value), run_id) for key, value in params if key not in logged])
            self._db.executemany(_TAG_UPSERT, [(key, value, run_id) for key, value in rest])
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        logged.update((key, str(value)) for key, value in params if key not in logged)

    def _set_tag(self, run_id: str, key: str, value: Any) -> None:
        self._log_batch(run_id, tags=[(key, str(value))])

    def _delete_tag(self, run_id: str, key: str) -> None:
        self._active(run_id)
        if self._db.execute("DELETE FROM tags WHERE run_uuid = ? AND key = ?", (run_id, key)).rowcount != 1:
            raise NotNative("no such tag: MLflow's own error")

    def _set_terminated(self, run_id: str, status: Optional[str] = None, end_time: Optional[int] = None) -> None:
        self._active(run_id)
        if status not in STATUSES + (None,):
            raise NotNative(f"status {status!r}: MLflow's own error")
        self._db.execute("UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?",
                         (status or "FINISHED", end_time or _now(), run_id))

    def _update_run(self, run_id: str, status: Optional[str] = None, name: Optional[str] = None) -> None:
        self._active(run_id)
        if name or status not in STATUSES:
            raise NotNative("update_run that MLflow answers itself")
        self._db.execute("UPDATE runs SET status = ? WHERE run_uuid = ?", (status, run_id))

    def _log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        root = urlparse(self._active(run_id))
        if root.scheme not in ("", "file") or not os.path.isabs(root.path) or os.path.isabs(artifact_file) \
                or ".." in artifact_file.split("/"):
            raise NotNative("an artifact root that is not a local directory")
        path = os.path.join(root.path, *artifact_file.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)

    def _search_runs(self, experiment_ids: Sequence[str], filter_string: str = "", run_view_type: int = 1,
                     max_results: int = 1000, order_by: Optional[Sequence[str]] = None) -> List[Any]:
        where, params = [f"r.experiment_id IN ({','.join('?' * len(experiment_ids))})"], [int(e) for e in experiment_ids]
        stages = _VIEW.get(run_view_type)
        if stages is None or not experiment_ids:
            raise NotNative("search_runs that MLflow answers itself")
        where.append(f"r.lifecycle_stage IN ({','.join('?' * len(stages))})")
        params += stages
        if filter_string:
            match = _TAG_FILTER.match(filter_string.strip())
            if match is None:
                raise NotNative(f"the filter {filter_string!r}")
            where.append("EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ? AND t.value = ?)")
            params += match.groups()
        select, order = "SELECT r.run_uuid FROM runs r", "r.start_time DESC, r.run_uuid"
        if order_by:
            match = _METRIC_ORDER.match(order_by[0].strip()) if len(order_by) == 1 else None
            if match is None:
                raise NotNative(f"the order {order_by!r}")
            # MLflow's order: runs with the metric first (NaN, then none, last), by its latest value
            select += " LEFT JOIN latest_metrics m ON m.run_uuid = r.run_uuid AND m.key = ?"
            params.insert(0, match.group(1))
            direction = (match.group(2) or "ASC").upper()
            order = f"CASE WHEN m.is_nan = 1 THEN 1 WHEN m.value IS NULL THEN 2 ELSE 0 END, m.value {direction}, " + order
        rows = self._db.execute(f"{select} WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ?",
                                params + [int(max_results)]).fetchall()
        return [self._run(row[0]) for row in rows]

    def _info(self, run_id: str) -> Any:
        row = self._one("SELECT run_uuid, experiment_id, name, user_id, status, start_time, end_time, artifact_uri, "
                        "lifecycle_stage FROM runs WHERE run_uuid = ?", run_id)
        return SimpleNamespace(run_uuid=row[0], run_id=row[0], experiment_id=str(row[1]), run_name=row[2],
                               user_id=row[3], status=row[4], start_time=row[5], end_time=row[6],
                               artifact_uri=row[7], lifecycle_stage=row[8])

    def _run(self, run_id: str) -> Any:
        """A run as ``mlflow_tracker.client.process`` sends MLflow's ``Run``: info, data (latest metrics, params, tags)."""
        metrics = {key: math.nan if is_nan else value for key, value, is_nan in self._db.execute(
            "SELECT key, value, is_nan FROM latest_metrics WHERE run_uuid = ?", (run_id,))}
        params = dict(self._db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
        tags = dict(self._db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)))
        return SimpleNamespace(info=self._info(run_id), data=SimpleNamespace(metrics=metrics, params=params, tags=tags),
                               inputs=None)
