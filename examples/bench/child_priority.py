"""How long MLflow's child needs for its first contact and 10 batches while other processes keep every
core busy, at each priority; and, briefly, what a logging child at that priority costs a CPU-bound loop.

    python examples/bench/child_priority.py [--hogs 2] [--repeats 2] [--limit 180] [--loop]

Each trial starts the child (``adapters/mlflow_tracker/client/process.py``) at one priority beside ``--hogs`` busy
processes (nice 0), then times: MLflow imported, a new sqlite store, an experiment and a run (the first
contact), then 10 ``log_batch`` calls of 10 steps x 13 metrics. A trial past ``--limit`` seconds is
reported as such. ``--loop`` also times a pure-Python loop (a stand-in for a training step's host work)
while a child at each priority logs a batch every 50 ms (no hogs): the loop's slowdown against no child.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from statistics import median
from typing import List, Optional

from msbridge.adapters.mlflow_tracker.client.process import ClientProcess

#: name -> the child's start: its nice value and whether it also runs at SCHED_IDLE (the old setting).
PRIORITIES = {"nice 19 + SCHED_IDLE (before)": (19, True), "nice 19": (19, False), "nice 10": (10, False),
              "nice 5": (5, False), "nice 0": (0, False)}
HOG = "while True: pass"


class Child(ClientProcess):
    """The MLflow child at a chosen priority."""

    def __init__(self, nice: int, idle: bool) -> None:
        self.nice, self.idle = nice, idle
        super().__init__()

    def start(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            idle = "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)); " if self.idle else ""
            code = (f"import os; os.nice({self.nice}); {idle}"
                    f"from msbridge.adapters.mlflow_tracker.client.process import main; main({os.getpid()})")
            self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._connected = False


def batch(first: int) -> list:
    now = int(time.time() * 1000)
    return [(f"m{k}", float(step + k), now, step) for step in range(first, first + 10) for k in range(13)]


def trial(nice: int, idle: bool, limit: float) -> Optional[float]:
    """Seconds to the first contact and 10 batches, None past ``limit`` (the child is killed)."""
    store = tempfile.mkdtemp(prefix="child-priority-")
    start = time.monotonic()
    child = Child(nice, idle)
    try:
        child.connect(f"sqlite:///{store}/mlflow.db", {})
        result: List[float] = []

        def work() -> None:  # a child killed at the limit ends this thread with a ConnectionError
            exp = child.create_experiment("p")
            run_id = child.create_run(exp).info.run_id
            for i in range(10):
                child.log_batch(run_id, metrics=batch(1 + 10 * i))
            result.append(time.monotonic() - start)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        thread.join(limit)
        return result[0] if result else None
    finally:
        if child._proc is not None:
            child._proc.kill()
            child._proc.wait()


def loop_cost(nice: Optional[int], idle: bool, seconds: float = 6.0) -> float:
    """Iterations per second of a pure-Python loop while a child at ``nice`` is handed a batch every 50 ms
    from another thread, as the sink's own thread does (None: no child)."""
    child = Child(nice, idle) if nice is not None else None
    stop = threading.Event()
    if child is not None:  # the child's start is not timed: only its steady logging
        child.connect(f"sqlite:///{tempfile.mkdtemp(prefix='child-loop-')}/mlflow.db", {})
        run_id = child.create_run(child.create_experiment("l")).info.run_id

        def feed() -> None:
            step = 1
            while not stop.wait(0.05):
                child.log_batch(run_id, metrics=batch(step))
                step += 10

        threading.Thread(target=feed, daemon=True).start()
    count, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        sum(i * i for i in range(2000))
        count += 1
    rate = count / (time.monotonic() - began)
    stop.set()
    if child is not None:
        child.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--limit", type=float, default=180.0)
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--only", default=",".join(PRIORITIES), help="comma-separated names of PRIORITIES")
    args = parser.parse_args()
    chosen = {name: PRIORITIES[name] for name in args.only.split(",")}
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    times = {name: [] for name in chosen}
    try:
        for rep in range(args.repeats):
            for name in (list(chosen) if rep % 2 == 0 else list(chosen)[::-1]):
                took = trial(*chosen[name], args.limit)
                times[name].append(took)
                print(f"{name}: {'over %.0f s' % args.limit if took is None else '%.1f s' % took}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for name, runs in times.items() if args.repeats else ():
        done = [t for t in runs if t is not None]
        print(f"{name}: first contact + 10 batches beside {args.hogs} hogs: "
              f"{len(done)}/{len(runs)} within {args.limit:.0f} s" + (f", median {median(done):.1f} s" if done else ""))
    if args.loop:
        for name, (nice, idle) in chosen.items():  # each against a run without a child just before it
            alone = loop_cost(None, False)
            print(f"{name}: loop at {loop_cost(nice, idle) / alone:.3f} of its speed without a child", flush=True)


if __name__ == "__main__":
    main()
