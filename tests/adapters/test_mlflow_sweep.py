"""A sweep's runs as children of one parent run in MLflow (``mlflow_tracker.run.sweep``), on a real sqlite store.

The concurrent case (three trials at once through a PostgreSQL-backed server) is in
test_mlflow_team_server.py."""
from __future__ import annotations

import uuid

from helpers.mlflow_reads import steps
from helpers.runs import make_records, make_run
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
import pytest

from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_RUN_TAG, PARENT_TAG, SWEEP_TAG, parent_for, settle
from msbridge.adapters.mlflow_sink import MlflowSink
from msbridge.offline.compare import compare


def sweep_run(tmp_path, experiment, name, sweep_id, lr):
    config = {"experiment": experiment, "sweep_id": sweep_id, "params": {"optimizer": {"learning_rate": lr}}}
    return make_run(tmp_path, name=name, experiment=experiment, run_id=uuid.uuid4().hex, config=config)


def runs_of(client, experiment, view=ViewType.ACTIVE_ONLY):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], run_view_type=view)


@pytest.mark.slow
def test_a_sweeps_runs_are_children_of_one_parent(shared_sqlite, tmp_path):
    """Two trials of sweep s1 overlap, one of s2 and one outside any sweep run after: s1 gets one parent,
    RUNNING while a trial runs, FINISHED when the last one ends; `msbridge compare` lists the trials only."""
    experiment = f"sweep-{uuid.uuid4().hex[:8]}"
    client = MlflowClient(shared_sqlite)
    sinks = []
    for name, sweep_id, lr in (("a", "s1", 0.1), ("b", "s1", 0.2), ("c", "s2", 0.3), ("d", None, 0.4)):
        sink = MlflowSink(tracking_uri=shared_sqlite)
        sink.open(sweep_run(tmp_path, experiment, name, sweep_id, lr))
        sink.write(make_records(range(1, 21)), [])
        sinks.append(sink)
    by_name = {r.info.run_name: r for r in runs_of(client, experiment)}
    parent = by_name["sweep-s1"]
    assert parent.data.tags[PARENT_TAG] == "s1" and parent.data.tags[SWEEP_TAG] == "s1"
    assert parent.info.status == "RUNNING"
    assert by_name["a"].data.tags[PARENT_RUN_TAG] == by_name["b"].data.tags[PARENT_RUN_TAG] == parent.info.run_id
    assert by_name["c"].data.tags[PARENT_RUN_TAG] == by_name["sweep-s2"].info.run_id
    assert PARENT_RUN_TAG not in by_name["d"].data.tags
    assert len(by_name) == 6 and len(runs_of(client, experiment, ViewType.ALL)) == 6  # nothing made twice

    sinks[0].close("FINISHED")
    assert client.get_run(parent.info.run_id).info.status == "RUNNING"  # trial b still runs
    sinks[1].close("FAILED")
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"
    for sink in sinks[2:]:
        sink.close("FINISHED")
    table = compare(experiment, shared_sqlite)
    assert sorted(r.run_name for r in table.rows) == ["a", "b", "c", "d"]
    assert table.differing == ["msbridge.sweep_id", "optimizer.learning_rate"]
    assert all(steps(client, by_name[n].info.run_id) == list(range(1, 21)) for n in "abcd")


def test_an_older_parent_seen_late_takes_the_child_when_it_ends(shared_sqlite):
    """The race `settle` repairs: a trial made its own parent, then an older candidate (another trial's,
    committed late) appears. At the end the child moves under the older one and its own is deleted."""
    client = MlflowClient(shared_sqlite)
    experiment_id = client.create_experiment(f"late-{uuid.uuid4().hex[:8]}")
    mine = parent_for(client, experiment_id, "s1")
    assert mine.created == mine.run_id
    child = client.create_run(experiment_id, tags={PARENT_RUN_TAG: mine.run_id}).info.run_id
    start = client.get_run(mine.run_id).info.start_time
    older = client.create_run(experiment_id, start_time=start - 1000, tags={PARENT_TAG: "s1"}).info.run_id
    assert parent_for(client, experiment_id, "s1").run_id == older  # what a trial starting now would choose

    own = mine.created
    client.set_terminated(child, "FINISHED")
    settle(client, experiment_id, "s1", mine, child)
    assert client.get_run(child).data.tags[PARENT_RUN_TAG] == older == mine.run_id
    assert client.get_run(older).info.status == "FINISHED"
    parents = client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = 's1'", run_view_type=ViewType.ALL)
    assert {r.info.run_id: r.info.lifecycle_stage for r in parents} == {older: "active", own: "deleted"}
