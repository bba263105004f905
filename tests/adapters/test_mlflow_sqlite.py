"""The MLflow sink's sqlite path (``mlflow_tracker.store.rows``): the metric rows it writes are the rows MLflow's own
store writes, checked against MLflow as the oracle, and it is used only where the schema is known."""
from __future__ import annotations

import math
import uuid

from mlflow.tracking import MlflowClient
import pytest

# Metric rows a sqlite store gets from sqlite itself (mlflow_tracker.store.rows), with MLflow's own store as the oracle.
EDGE_BATCHES = [
    [("a", 1.0, 1000, 1), ("a", 2.0, 1000, 2), ("b", math.nan, 1000, 1), ("b", math.inf, 1001, 2),
     ("c", -math.inf, 1000, 1), ("a", 2.0, 1000, 2), ("b", math.nan, 1000, 1),  # exact repeats
     ("a", 5.0, 1000, 2), ("a", 4.0, 1000, 2)],  # one step, three values: the greatest is latest
    [("a", 0.5, 900, 1), ("c", 7.0, 1000, 3), ("b", 3.0, 1001, 2)],  # older steps never become latest
    [("a", 1.0, 1000, 1), ("d", math.nan, 2000, 9)],  # a row already there, resent
]


def _history(client, run_id):
    """Each metric's rows (as MLflow reads them back) and its latest value."""
    run = client.get_run(run_id)
    rows = {key: sorted((m.step, m.timestamp, "nan" if math.isnan(m.value) else m.value)
                        for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}
    return rows, {k: "nan" if math.isnan(v) else v for k, v in run.data.metrics.items()}


@pytest.mark.slow
def test_sqlite_metric_rows_are_what_mlflows_store_writes(shared_sqlite):
    from mlflow.entities import Metric, RunTag

    from msbridge.adapters.mlflow_tracker.store.rows import rows_for

    client = MlflowClient(shared_sqlite)
    experiment = client.create_experiment(f"rows-{uuid.uuid4().hex[:8]}")
    by_mlflow, by_sqlite = (client.create_run(experiment).info.run_id for _ in range(2))
    rows = rows_for(shared_sqlite)
    assert rows is not None
    for i, batch in enumerate(EDGE_BATCHES):
        tags = [("msbridge.last_step", str(i))]
        client.log_batch(by_mlflow, metrics=[Metric(*m) for m in batch], tags=[RunTag(*t) for t in tags])
        assert rows.log(by_sqlite, batch, tags)
    expected = _history(client, by_mlflow)
    assert expected[1] == {"a": 5.0, "b": 1.7976931348623157e308, "c": 7.0, "d": "nan"}  # the oracle is not empty
    assert _history(client, by_sqlite) == expected
    assert client.get_run(by_sqlite).data.tags["msbridge.last_step"] == "2"
    assert rows.log(by_sqlite, [("a", 9.0, 3000, 10)], [("mlflow.runName", "x")]) is False  # MLflow acts on it
    client.delete_run(by_sqlite)
    assert rows.log(by_sqlite, [("a", 9.0, 3000, 10)]) is False  # not active: left to MLflow's client to refuse
    assert rows.log(uuid.uuid4().hex, [("a", 9.0, 3000, 10)]) is False
    assert _history(client, by_sqlite) == expected
    rows.close()


def test_sqlite_metric_rows_only_where_the_schema_is_known(tmp_path, shared_sqlite):
    import sqlite3

    from msbridge.adapters.mlflow_tracker.client.process import _Tracker
    from msbridge.adapters.mlflow_tracker.store.rows import rows_for

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:  # a metrics table with a column MLflow 3 does not have
        db.execute("CREATE TABLE metrics (key, value, timestamp, run_uuid, step, is_nan, dataset)")
        db.execute("CREATE TABLE latest_metrics (key, value, timestamp, run_uuid, step, is_nan)")
        db.execute("CREATE TABLE tags (key, value, run_uuid)")
    assert rows_for(f"sqlite:///{other}") is None
    missing = tmp_path / "not yet.db"
    for uri in ("sqlite:///:memory:", f"sqlite:///{other}?timeout=5", "http://127.0.0.1:5000", str(tmp_path),
                f"sqlite:///{missing}"):
        assert rows_for(uri) is None, uri
    assert not missing.exists()  # MLflow makes its store; this never makes an empty one
    tracker = _Tracker(shared_sqlite)  # the child's side, in this process: its log_batch takes the sqlite path
    client = MlflowClient(shared_sqlite)
    run_id = client.create_run(client.create_experiment(f"rows-{uuid.uuid4().hex[:8]}")).info.run_id
    tracker.call("log_batch", (run_id,), {"metrics": [("loss", 2.0, 1000, 1)], "tags": [("k", "v")]})
    assert tracker._rows is not None
    assert client.get_run(run_id).data.metrics == {"loss": 2.0} and client.get_run(run_id).data.tags["k"] == "v"
    tracker.close()
