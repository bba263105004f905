"""A team MLflow server frozen mid-run: msbridge's memory during the freeze, and what MLflow holds at the close.

A real ``mlflow server`` on a PostgreSQL store (``PostgresCluster``, as ``.ci/postgres.sh`` installs it) takes a
training job's metrics: a child process that runs an ``msbridge.track`` loop (jsonl and MLflow, the default
settings) for as long as it is told. The whole server group is stopped with SIGSTOP for ``--freeze`` seconds, then
continued. Meanwhile the child's resident memory, and that of its MLflow client process, is sampled each second
from ``/proc``. Once MLflow holds the last step the log held at the thaw (or ``--catch-up`` s after it), the job is
told to end. No ``msbridge replay`` runs. Prints one JSON object: RSS before (median of the last samples before the
freeze), the highest during it and after it, the seconds MLflow took to catch up, the steps MLflow holds at the close
against the jsonl's, and what the job's outcome names undelivered. Figures measured with it: docs/how-it-works.md.

Example:
    $ python -m msbridge.bench.freeze --freeze 600 --out /tmp/msbridge-freeze
    {"freeze_s": 600.0, "steps": 15623, ..., "rss_before_mb": 506.2, "rss_max_freeze_mb": 523.3, ...}
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .servers import MlflowServer, PostgresCluster

EXPERIMENT, RUN_NAME = "freeze", "r"


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and every process under it, in MB (0.0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        proc = todo.pop()
        try:
            with open(f"/proc/{proc}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{proc}/task"):
                with open(f"/proc/{proc}/task/{task}/children") as fh:
                    todo.extend(int(child) for child in fh.read().split())
        except OSError:
            continue
    return total / 1024


class Sampler(threading.Thread):
    """Samples ``rss_mb(pid)`` every ``every`` s into ``phases[current phase]``."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.phase = pid, every, "start"
        self.phases: Dict[str, List[float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            mb = rss_mb(self.pid)
            if mb:
                self.phases.setdefault(self.phase, []).append(mb)


def _child(uri: str, out: str, stop_file: str, step_ms: float, max_pending: Optional[int]) -> None:
    """The training job: steps until ``stop_file`` exists, then closes; prints its outcome as one JSON line."""
    import msbridge

    mlflow: Dict[str, Any] = {"tracking_uri": uri}
    if max_pending:
        mlflow["max_pending"] = max_pending
    config = {"experiment": EXPERIMENT, "run_name": RUN_NAME, "output_dir": os.path.join(out, "runs", "{run_name}"),
              "sinks": {"jsonl": {}, "mlflow": mlflow}}
    step = 0
    with msbridge.track(config, progress=False) as run:
        while not os.path.exists(stop_file):
            step += 1
            run.step(loss=1.0 / step)
            time.sleep(step_ms / 1000)
    print(json.dumps({"steps": step, "status": run.outcome.status, "undelivered": run.outcome.undelivered,
                      "run_dir": run.run_dir}), flush=True)


def mlflow_last_step(client: Any, experiment_name: str = EXPERIMENT) -> int:
    """The last step MLflow holds of a run of ``experiment_name`` (the sink's own tag), 0 before one is made."""
    from ..adapters.mlflow_sink import LAST_STEP_TAG

    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return max((int(r.data.tags.get(LAST_STEP_TAG, 0)) for r in runs), default=0)


def _log_last_step(out: str) -> int:
    """The last step of the job's jsonl (its last metrics line)."""
    path = os.path.join(out, "runs", RUN_NAME, "metrics", "rank_0.jsonl")
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - 65536))
        lines = [json.loads(line) for line in fh.read().splitlines()[1:] if line.strip()]
    return max((line["step"] for line in lines if line.get("type") == "metrics"), default=0)


def _wait(condition: Any, timeout: float, what: str, fatal: bool = True) -> Optional[float]:
    """Seconds until ``condition()`` held, polled each second; past ``timeout``: raise (``fatal``) or None."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            if not fatal:
                return None
            raise RuntimeError(f"not within {timeout:.0f} s: {what}")
        time.sleep(1.0)
    return time.monotonic() - start


def _job(server: MlflowServer, out: str, step_ms: float, max_pending: Optional[int]) -> subprocess.Popen:
    command = [sys.executable, "-m", "msbridge.bench.freeze", "--child", server.uri, "--out", out,
               "--step-ms", str(step_ms), "--max-pending", str(max_pending or 0)]
    return subprocess.Popen(command, cwd=out, stdout=subprocess.PIPE, text=True)


def _freeze(server: MlflowServer, sampler: Sampler, freeze_s: float) -> None:
    """SIGSTOP the server's whole group (the server and its workers) for ``freeze_s``, then SIGCONT."""
    os.killpg(server.proc.pid, signal.SIGSTOP)
    sampler.phase = "freeze"
    try:
        time.sleep(freeze_s)
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
        sampler.phase = "after"


def measure(backend_uri: str, out: str, freeze_s: float, before_s: float = 30.0, step_ms: float = 50.0,
            max_pending: Optional[int] = None, catch_up_s: float = 1800.0) -> Dict[str, Any]:
    """One job against an ``mlflow server`` on ``backend_uri`` frozen for ``freeze_s``; the figures (see above)."""
    from mlflow.tracking import MlflowClient

    os.makedirs(out, exist_ok=True)
    stop_file = os.path.join(out, "stop")
    with MlflowServer(os.path.join(out, "server"), backend_uri=backend_uri) as server:
        client = MlflowClient(server.uri)
        job = _job(server, out, step_ms, max_pending)
        sampler = Sampler(job.pid)
        sampler.start()
        try:
            _wait(lambda: mlflow_last_step(client) > 0, 600, "MLflow holds the job's first steps")
            sampler.phase = "before"
            time.sleep(before_s)
            at_freeze = _log_last_step(out)
            _freeze(server, sampler, freeze_s)
            at_thaw = _log_last_step(out)
            catch_up = _wait(lambda: mlflow_last_step(client) >= at_thaw, catch_up_s, "", fatal=False)
            with open(stop_file, "w"):
                pass
            outcome = json.loads(job.communicate(timeout=600)[0].strip().splitlines()[-1])
        finally:
            sampler.stop.set()
            if job.poll() is None:
                job.kill()
        return _figures(client, sampler.phases, outcome, (at_freeze, at_thaw), catch_up, freeze_s)


def _figures(client: Any, phases: Dict[str, List[float]], outcome: Dict[str, Any], frozen: Tuple[int, int],
             catch_up: Optional[float], freeze_s: float) -> Dict[str, Any]:
    """The printed figures; ``catch_up_s`` None: MLflow did not hold the thaw's last step within ``--catch-up``."""
    from msbridge.sinks.runlog import read_run

    run = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])[0]
    held = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    logged = [step for step, _ in read_run(outcome["run_dir"]).ranks[0].series("train/loss")]
    before = phases["before"][-10:]
    return {"freeze_s": freeze_s, "steps": outcome["steps"], "steps_at_freeze": frozen[0], "steps_at_thaw": frozen[1],
            "catch_up_s": None if catch_up is None else round(catch_up, 1),
            "rss_before_mb": round(statistics.median(before), 1),
            "rss_max_freeze_mb": round(max(phases["freeze"]), 1),
            "rss_max_after_mb": round(max(phases.get("after", [0.0])), 1),
            "rss_growth_mb": round(max(phases["freeze"]) - statistics.median(before), 1),
            "mlflow_steps": len(held), "jsonl_steps": len(logged),
            "mlflow_steps_each_once": held == logged == list(range(1, outcome["steps"] + 1)),
            "status": outcome["status"], "mlflow_status": run.info.status, "undelivered": outcome["undelivered"]}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m msbridge.bench.freeze", description=__doc__.split("\n")[0])
    parser.add_argument("--freeze", type=float, default=600.0, help="seconds the server is stopped (SIGSTOP)")
    parser.add_argument("--before", type=float, default=30.0, help="seconds sampled before the freeze")
    parser.add_argument("--step-ms", type=float, default=50.0, help="the job's sleep per step, in ms")
    parser.add_argument("--max-pending", type=int, default=0, help="the MLflow sink's max_pending (0: its default)")
    parser.add_argument("--catch-up", type=float, default=1800.0,
                        help="seconds after the thaw to wait for MLflow to hold the log's last step then")
    parser.add_argument("--out", default="/tmp/msbridge-freeze", help="where the job, server and logs go")
    parser.add_argument("--child", metavar="URI", help=argparse.SUPPRESS)  # the training job itself
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.out, os.path.join(args.out, "stop"), args.step_ms, args.max_pending or None)
        return
    with PostgresCluster() as pg:
        figures = measure(pg.uri, args.out, args.freeze, args.before, args.step_ms, args.max_pending or None,
                          args.catch_up)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
