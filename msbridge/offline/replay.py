"""Rebuild any sink from a run's jsonl write-ahead log: the offline mode.

On a cluster with no tracker in reach, train with jsonl only (or with a tracker
that is down), copy the run dir somewhere that can reach the tracker, then
``msbridge replay RUN_DIR --to mlflow``. Each rank's log is replayed as that
rank would have written it; global-only sinks get rank 0's log only.

Replay is idempotent: sinks reattach to the run id kept in ``run.json`` and
skip steps they already hold, so replaying twice gives the same run.

Example:
    >>> replay("msbridge_runs/demo/run-1", "mlflow", {"tracking_uri": "http://127.0.0.1:5000"})
    {'records': 300, 'events': 0, 'ranks': 1, 'truncated': 0}
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Mapping, Optional

from ..errors import MsbridgeError
from ..run.metadata import README, RUN_JSON
from ..sinks.base import KILLED, STATUSES, RunInfo
from ..sinks.registry import resolve
from ..sinks.runlog import RunLogError, read_run

BATCH = 1000


def _run_json(run_dir: str) -> Dict[str, Any]:
    path = os.path.join(run_dir, RUN_JSON)
    if not os.path.exists(path):
        raise RunLogError(f"{run_dir}: not an msbridge run, {RUN_JSON} is missing")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def replay(run_dir: str, to: str, options: Optional[Mapping[str, Any]] = None,
           progress: Optional[bool] = None) -> Dict[str, int]:
    """Write every record and event of ``run_dir`` to the sink ``to``; returns counts.

    ``progress`` (default: when stderr is a terminal) prints a running count per rank.
    """
    progress = sys.stderr.isatty() if progress is None else progress
    run_dir = os.path.abspath(run_dir)
    meta = _run_json(run_dir)
    log = read_run(run_dir)
    config = meta.get("config", {})
    sink_cls = resolve(to)
    sink_options = dict(config.get("sinks", {}).get(to) or {})
    sink_options.update(options or {})
    readme_path = os.path.join(run_dir, README)
    readme = open(readme_path, encoding="utf-8").read() if os.path.exists(readme_path) else ""
    # No outcome in run.json: the job never reached its end (SIGKILL, a crashed rank's peers killed by msrun).
    status = (meta.get("outcome") or {}).get("status", KILLED)
    status = status if status in STATUSES else KILLED
    world_size = int(log.header.get("world_size", len(log.ranks)))
    counts = {"records": 0, "events": 0, "ranks": 0, "truncated": 0}
    for rank, rank_log in log.ranks.items():
        if sink_cls.ranks == "global" and rank != 0:
            continue
        run = RunInfo(run_id=meta.get("run_id") or log.header["run_id"], run_name=meta.get("run_name", ""),
                      experiment=config.get("experiment", "default"), rank=rank, world_size=world_size,
                      is_global=rank == 0, run_dir=run_dir, config=config, metadata=meta, readme=readme,
                      start_time=float(rank_log.header.get("time") or 0.0))  # else the first record's time
        sink = sink_cls(**sink_options)
        sink.open(run)
        try:
            for start in range(0, len(rank_log.records), BATCH):
                sink.write(rank_log.records[start:start + BATCH], [])
                if progress:
                    done = min(start + BATCH, len(rank_log.records))
                    print(f"\r[msbridge] replay rank {rank}: {done}/{len(rank_log.records)} records",
                          end="", file=sys.stderr, flush=True)
            sink.write([], rank_log.events)
        except Exception:
            sink.close("FAILED")
            raise
        sink.close(status)
        if progress:
            print(file=sys.stderr)
        counts["records"] += len(rank_log.records)
        counts["events"] += len(rank_log.events)
        counts["truncated"] += rank_log.truncated
        counts["ranks"] += 1
    if not counts["ranks"]:
        raise MsbridgeError(f"{run_dir}: no rank log to replay to {to!r}")
    return counts
