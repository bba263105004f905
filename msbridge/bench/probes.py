"""What the bench reads about a process while it trains: CPU time (its own, a thread's, its children's) and RSS.

Example:
    >>> cpu, rss = process_cpu_s(), rss_mb()
    >>> live_children_cpu_s()  # e.g. the MLflow child's CPU so far
    0.42
"""
from __future__ import annotations

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
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def thread_cpu_s(name: str) -> Any:
    """CPU seconds of this process's thread called ``name`` (None if there is none)."""
    import threading

    import psutil

    ids = {t.native_id for t in threading.enumerate() if t.name == name}
    if not ids:
        return None
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


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
