"""A sweep's parent run in MLflow: the runs of one ``sweep_id`` are the children of one run.

MLflow nests a run under another when it carries the tag ``mlflow.parentRunId``. The parent of a
sweep is a run of the same experiment tagged ``msbridge.sweep_parent = <sweep_id>`` (children carry
``msbridge.sweep_id`` only). Runs of a sweep start at the same time on different machines, so the
parent is found or made without a lock, in a way that ends with one parent:

* ``parent_for`` looks for the sweep's parents; with none, it creates one, then looks again. The
  parent is the oldest active candidate (start time, then run id); a candidate a run created and
  that is not the oldest is deleted by that run.
* A candidate created just before another may become visible just after the other run chose: so
  ``settle`` elects again when a child ends and moves the child (the tag can change) if the choice
  changed. Once every child has ended, all of them sit under the one oldest parent.

The parent is RUNNING while a child runs; the last child to end (each sets its own status first,
then looks for running siblings) ends it FINISHED.

Example:
    >>> parent = parent_for(client, experiment_id, "sweep-7")      # client: MlflowClient-like
    >>> client.create_run(experiment_id, tags={PARENT_RUN_TAG: parent.run_id, ...})
    >>> settle(client, experiment_id, "sweep-7", parent, child_run_id)   # after the child's status
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from msbridge.adapters.mlflow_tracker.client.process import ACTIVE_ONLY

log = logging.getLogger("msbridge")

PARENT_TAG = "msbridge.sweep_parent"
SWEEP_TAG = "msbridge.sweep_id"
PARENT_RUN_TAG = "mlflow.parentRunId"
_CANDIDATES = 100


@dataclass
class Parent:
    """The parent run a child chose, and the candidate this run created (deleted if it lost)."""

    run_id: str
    created: Optional[str] = None


def _quoted(value: str) -> str:
    """``value`` as a literal of MLflow's search syntax."""
    return f'"{value}"' if "'" in value else f"'{value}'"


def elect(client: Any, experiment_id: str, sweep_id: str) -> Optional[str]:
    """The run id of the sweep's oldest active parent (start time, then run id), or None."""
    runs = client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = {_quoted(sweep_id)}",
                              run_view_type=ACTIVE_ONLY, max_results=_CANDIDATES,
                              order_by=["attributes.start_time ASC"])
    if not runs:
        return None
    return min(runs, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id


def parent_for(client: Any, experiment_id: str, sweep_id: str) -> Parent:
    """The sweep's parent run, made if there is none; set RUNNING (a child is about to run under it)."""
    winner = elect(client, experiment_id, sweep_id)
    created = None
    if winner is None:
        created = client.create_run(experiment_id, tags={PARENT_TAG: sweep_id, SWEEP_TAG: sweep_id},
                                    run_name=f"sweep-{sweep_id}").info.run_id
        winner = elect(client, experiment_id, sweep_id) or created
        if winner != created:
            client.delete_run(created)  # another run of the sweep made one first
            created = None
    client.update_run(winner, status="RUNNING")
    return Parent(winner, created)


def settle(client: Any, experiment_id: str, sweep_id: str, parent: Parent, child_run_id: str) -> None:
    """After the child's final status: move it under the elected parent if that changed, delete this
    run's losing candidate, and end the parent if no child of it still runs."""
    winner = elect(client, experiment_id, sweep_id)
    if winner is None:  # someone deleted the sweep's parent: nothing to end
        return
    if winner != parent.run_id:
        log.info("msbridge: sweep %s has an older parent run %s; run %s moves under it", sweep_id, winner,
                 child_run_id)
        client.set_tag(child_run_id, PARENT_RUN_TAG, winner)
        if parent.created == parent.run_id:
            client.delete_run(parent.created)
        parent.run_id, parent.created = winner, None
    running = client.search_runs([experiment_id], f"tags.`{PARENT_RUN_TAG}` = '{winner}' and "
                                 "attributes.status = 'RUNNING'", run_view_type=ACTIVE_ONLY, max_results=1)
    if not running:
        client.set_terminated(winner, "FINISHED")
