"""Long runs: a synthetic run of many steps, then ``replay`` into each sink, ``plot``, ``diagnose`` and
``compare`` timed on it, each in a child process, with the child's peak memory.

The run is rank 0 of a data-parallel job as msbridge writes it: 20 metrics a step (the local loss, its EMA,
grad norm, lr, loss scale, overflow, epoch, throughput, the health counters, the global loss and its spread,
host RSS) in flush windows of 100 steps through the real ``JsonlSink``, with events (anomalies and their
recoveries, stragglers, a checkpoint), and the ``run.json`` a run has. Peak memory is each command's own
``ru_maxrss``, taken by a small process started for it (``_MEASURE``); the run is built in a child of its
own, so the timing process stays small.

Example:
    $ python -m msbridge.bench.long --steps 500000 --out /tmp/msbridge-long
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..names import (
    EPOCH, GLOBAL_LOSS, GRAD_NORM, HOST_RSS_MB, LOSS, LOSS_EMA, LOSS_MAX, LOSS_MIN, LOSS_SCALE, LOSS_STD, LR,
    MONITOR_OVERHEAD, OVERFLOW, SAMPLES_PER_S, STEP_TIME, TOKENS_PER_S,
)
from ..sinks.base import Event, Record, RunInfo

EXPERIMENT, RUN_NAME, RUN_ID = "long", "long-run", "long0000000000000000000000000001"
FLUSH = 100
#: The targets of issue 25 at 500k steps x 20 metrics.
TARGETS = {"replay_tensorboard_s": 60.0, "replay_mindinsight_s": 60.0, "replay_mlflow_rows_per_s": 10_000.0,
           "plot_s": 45.0, "diagnose_s": 45.0, "plot_peak_mb": 1024.0, "diagnose_peak_mb": 1024.0}


def columns(steps: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """20 metrics of ``steps`` steps: a decaying loss with noise, warm-up + cosine lr, a few NaN steps."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1, dtype=np.float64)
    loss = 2.0 + 8.0 * np.exp(-s / (steps / 8)) + 0.05 * rng.standard_normal(steps)
    bad = rng.choice(steps, size=min(5, steps // 10), replace=False)
    loss[bad] = math.nan
    lr = np.minimum(s / 2000, 1.0) * 3e-4 * 0.5 * (1 + np.cos(np.pi * s / steps))
    step_ms = 120 + 3 * rng.standard_normal(steps)
    ema = np.empty(steps)
    prev = loss[0]
    for i, v in enumerate(np.nan_to_num(loss, nan=2.0)):  # cheap EMA: the series' shape, not its exact value
        prev = 0.9 * prev + 0.1 * v
        ema[i] = prev
    spread = 0.02 + 0.005 * rng.random(steps)
    nan_steps = np.cumsum(np.isnan(loss)).astype(np.float64)
    return {LOSS: loss, LOSS_EMA: ema, GRAD_NORM: 1 + 0.2 * rng.random(steps), LR: lr,
            LOSS_SCALE: np.full(steps, 1024.0), OVERFLOW: np.zeros(steps), EPOCH: s // 10_000,
            STEP_TIME: step_ms, SAMPLES_PER_S: 8000 / step_ms, TOKENS_PER_S: 8000 / step_ms * 2048,
            MONITOR_OVERHEAD: np.full(steps, 0.002), "health/nan_steps": nan_steps,
            "health/skipped_steps": np.zeros(steps), GLOBAL_LOSS: loss + 0.001, LOSS_MIN: loss - spread,
            LOSS_MAX: loss + spread, "dist/loss_mean": loss, LOSS_STD: spread / 2, "dist/loss_p50": loss,
            HOST_RSS_MB: 2000 + s / 1e4}


def events(steps: int, cols: Dict[str, np.ndarray]) -> List[Event]:
    """Anomalies at the NaN steps with their recoveries, two stragglers, a checkpoint, every 100k a note."""
    out: List[Event] = []
    for step in np.flatnonzero(np.isnan(cols[LOSS])) + 1:
        out.append(Event("anomaly", int(step), 0, 1000.0 + step, {"check": "nonfinite_loss", "value": "nan"}))
        out.append(Event("recovery", int(step) + 1, 0, 1001.0 + step, {"check": "nonfinite_loss"}))
    for step in (steps // 3, 2 * steps // 3):
        out.append(Event("straggler", step, 0, 1000.0 + step, {"straggler_rank": 3, "slower_pct": 31.0}))
    out.append(Event("checkpoint", steps, 0, 1000.0 + steps, {"path": "ckpt/last.ckpt", "seconds": 4.2}))
    return sorted(out, key=lambda e: e.step)


def build_run(root: str, steps: int, seed: int = 0) -> str:
    """Write the run under ``root/EXPERIMENT/RUN_NAME`` (its jsonl through the real ``JsonlSink``, a run.json)."""
    from ..adapters.jsonl_sink import JsonlSink

    run_dir = os.path.join(root, EXPERIMENT, RUN_NAME)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    cols = columns(steps, seed)
    names = list(cols)
    matrix = np.stack([cols[n] for n in names], axis=1).tolist()
    evs = events(steps, cols)
    sink = JsonlSink(fsync=False)
    sink.open(RunInfo(run_id=RUN_ID, run_name=RUN_NAME, experiment=EXPERIMENT, rank=0, world_size=1,
                      is_global=True, run_dir=run_dir, start_time=1000.0))
    e = 0
    for start in range(0, steps, FLUSH):
        block = range(start, min(start + FLUSH, steps))
        records = [Record(i + 1, 0, 1000.0 + 0.12 * i, dict(zip(names, matrix[i]))) for i in block]
        last = block[-1] + 1
        first = e
        while e < len(evs) and evs[e].step <= last:
            e += 1
        sink.write(records, evs[first:e])
    sink.close("FINISHED")
    config = {"experiment": EXPERIMENT, "run_name": RUN_NAME, "sinks": {"jsonl": {}}, "flush_steps": FLUSH}
    with open(os.path.join(run_dir, "run.json"), "w", encoding="utf-8") as fh:
        json.dump({"run_id": RUN_ID, "run_name": RUN_NAME, "config": config,
                   "outcome": {"status": "FINISHED"}}, fh)
    return run_dir


#: Runs the command it is given and writes that child's rusage as JSON: a small, freshly started process, so
#: the command's peak RSS is its own (Linux carries a forking parent's RSS into its child's ``ru_maxrss``
#: across ``execve``: a command forked straight from a 1 GB test process would read 1 GB).
_MEASURE = """import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as fh:
    json.dump({"exit": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime,
               "maxrss_kb": usage.ru_maxrss}, fh)
"""


def timed(name: str, argv: Sequence[str], cwd: str, timeout: float) -> Dict[str, Any]:
    """One ``msbridge`` command in a child process: wall seconds, its CPU seconds, its peak RSS (MB, its own
    rusage, measured by ``_MEASURE``), exit code (-9 when it ran past ``timeout``)."""
    log_path, usage_path = os.path.join(cwd, f"{name}.log"), os.path.join(cwd, f"{name}.usage.json")
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-c", _MEASURE, usage_path, sys.executable, "-m", "msbridge.cli.main",
                                 *argv], cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, GLOG_v="3"))
        deadline = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        deadline.start()
        try:
            proc.wait()
        finally:
            deadline.cancel()
    wall = time.perf_counter() - start
    try:
        with open(usage_path, encoding="utf-8") as fh:
            usage = json.load(fh)
    except (OSError, ValueError):  # killed at the deadline
        usage = {"exit": -signal.SIGKILL, "cpu_s": float("nan"), "maxrss_kb": float("nan")}
    out = {"what": name, "command": "msbridge " + " ".join(argv), "seconds": round(wall, 2),
           "cpu_s": round(usage["cpu_s"], 2), "peak_mb": round(usage["maxrss_kb"] / 1024, 1), "exit": usage["exit"]}
    if out["exit"]:
        with open(log_path, encoding="utf-8") as fh:
            out["error"] = fh.read().strip().splitlines()[-1:]
    return out


def run_bench(root: str, steps: int, timeout: float = 3600.0, only: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Build the run, then time each command; returns the report (also written to ``root/bench_long.json``)."""
    started = time.perf_counter()
    # In a child: a parent that held the run would pass its peak RSS on to every child it spawns (Linux keeps
    # ru_maxrss across execve), so the children's peaks would read at least the builder's.
    subprocess.run([sys.executable, "-m", "msbridge.bench.long", "--build-only", "--steps", str(steps),
                    "--out", root], check=True)
    run_dir = os.path.join(root, EXPERIMENT, RUN_NAME)
    report: Dict[str, Any] = {"steps": steps, "metrics": len(columns(10)), "build_s": round(time.perf_counter() - started, 1),
                              "jsonl_mb": round(os.path.getsize(os.path.join(run_dir, "metrics", "rank_0.jsonl")) / 1e6, 1),
                              "load_before": os.getloadavg(), "rows": []}
    db = os.path.join(root, EXPERIMENT, "mlflow.db")
    commands = [("replay_tensorboard", ["replay", run_dir, "--to", "tensorboard"]),
                ("replay_mindinsight", ["replay", run_dir, "--to", "mindinsight"]),
                ("replay_mlflow", ["replay", run_dir, "--to", "mlflow", "--tracking-uri", f"sqlite:///{db}"]),
                ("plot", ["plot", run_dir, "-o", os.path.join(root, "plot.png")]),
                ("diagnose", ["diagnose", run_dir, "--format", "json"]),
                ("compare", ["compare", EXPERIMENT, "--tracking-uri", f"sqlite:///{db}"])]
    for name, argv in commands:
        if only and name not in only:
            continue
        row = timed(name, argv, root, timeout)
        if name == "replay_mlflow" and not row["exit"]:
            row["rows_per_s"] = round(steps * report["metrics"] / row["seconds"])
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
    report["load_after"] = os.getloadavg()
    report["targets"] = check(report)
    with open(os.path.join(root, "bench_long.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    return report


def check(report: Dict[str, Any]) -> Dict[str, Any]:
    """Each target of ``TARGETS`` against what was measured (None when not run)."""
    rows = {r["what"]: r for r in report["rows"]}
    got = {"replay_tensorboard_s": rows.get("replay_tensorboard", {}).get("seconds"),
           "replay_mindinsight_s": rows.get("replay_mindinsight", {}).get("seconds"),
           "replay_mlflow_rows_per_s": rows.get("replay_mlflow", {}).get("rows_per_s"),
           "plot_s": rows.get("plot", {}).get("seconds"), "diagnose_s": rows.get("diagnose", {}).get("seconds"),
           "plot_peak_mb": rows.get("plot", {}).get("peak_mb"), "diagnose_peak_mb": rows.get("diagnose", {}).get("peak_mb")}
    return {k: {"target": ("<= " if not k.endswith("per_s") else ">= ") + str(TARGETS[k]), "measured": v,
                "met": None if v is None else (v >= TARGETS[k] if k.endswith("per_s") else v <= TARGETS[k])}
            for k, v in got.items()}


def main(argv: Sequence[str] = ()) -> int:
    """``python -m msbridge.bench.long``: build the run and time each command (``--build-only``: build it and stop)."""
    parser = argparse.ArgumentParser(prog="python -m msbridge.bench.long", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--out", default="./bench_long", help="where the run, the stores and bench_long.json go")
    parser.add_argument("--only", default="", help="comma-separated commands to time (default: all)")
    parser.add_argument("--build-only", action="store_true", help="write the run and stop (what the bench runs first)")
    args = parser.parse_args(list(argv) or None)
    os.makedirs(args.out, exist_ok=True)
    if args.build_only:
        print(build_run(os.path.abspath(args.out), args.steps))
        return 0
    report = run_bench(os.path.abspath(args.out), args.steps, only=[o for o in args.only.split(",") if o] or None)
    print(json.dumps({"steps": report["steps"], "build_s": report["build_s"], "jsonl_mb": report["jsonl_mb"],
                      "load": [report["load_before"], report["load_after"]], "targets": report["targets"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
