"""What the bench reads about a process while it trains: CPU time (its own, a thread's, its children's) and RSS.

Example:
    >>> cpu, rss = process_cpu_s(), rss_mb()
    >>> live_children_cpu_s()  # e.g. the MLflow child's CPU so far
    0.42
    >>> threads_cpu_s("msbridge-")  # the sink threads' CPU so far
    0.031
"""
from __future__ import annotations

import os
from typing import Any


def process_cpu_s() -> float:
    """CPU seconds of this process (all threads) and its children, live or reaped."""
    import psutil

    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system + live_children_cpu_s()


def live_children_cpu_s() -> float:
    """CPU seconds of this process's live child processes (a reaped one is in ``children_*``)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            total += _task_cpu_s(child.pid, [t.id for t in child.threads()])
        except psutil.Error:
            pass
    return total


def threads_cpu_s(prefix: str) -> Any:
    """CPU seconds of this process's threads whose names start with ``prefix`` (None if there is none)."""
    import threading

    ids = [t.native_id for t in threading.enumerate() if t.name.startswith(prefix) and t.native_id is not None]
    return _task_cpu_s(os.getpid(), ids) if ids else None


def _task_cpu_s(pid: int, tids: Any) -> float:
    """CPU seconds of threads ``tids`` of process ``pid``: to the nanosecond from Linux's schedstat, where
    psutil's times count 10 ms clock ticks (a sink thread uses a few ticks a run); a thread that ended adds 0."""
    import psutil

    total = 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0]) / 1e9
        except FileNotFoundError:
            continue
        except OSError:  # no schedstat (another OS): psutil's ticks
            times = {t.id: t for t in psutil.Process(pid).threads()}.get(tid)
            total += times.user_time + times.system_time if times else 0.0
    return total


def rss_mb(children: bool = False) -> float:
    """RSS of this process, or the summed RSS of its live child processes (writers, workers)."""
    import psutil

    procs = psutil.Process().children(recursive=True) if children else [psutil.Process()]
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def mlflow_child_rss_mb() -> Any:
    """RSS of the MLflow sink's client process (``_mlflow_process``), None if there is none."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if any("_mlflow_process" in part for part in child.cmdline()):
                return child.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return None
