"""What the bench reads about a process while it trains: CPU time (its own, a thread's, its children's) and RSS.

How msbridge's threads and children are counted (schedstat, to the nanosecond) has one owner, ``msbridge.run.cost``,
which also gives each run's outcome its ``monitoring cost``: the bench's figures and a run's are the same count.

Example:
    >>> cpu, rss = process_cpu_s(), rss_mb()
    >>> live_children_cpu_s()  # e.g. the MLflow child's CPU so far
    0.42
    >>> threads_cpu_s("msbridge-")  # the sink threads' CPU so far
    0.031
"""
from __future__ import annotations

from typing import Any

from ..run.cost import live_children_cpu_s, threads_cpu_s

__all__ = ["live_children_cpu_s", "mlflow_child_rss_mb", "process_cpu_s", "rss_mb", "threads_cpu_s"]


def process_cpu_s() -> float:
    """CPU seconds of this process (all threads) and its children, live or reaped."""
    import psutil

    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system + live_children_cpu_s()


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
    """RSS of the MLflow sink's client process (``mlflow_tracker.client.process``), None if there is none."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if any("mlflow_tracker.client.process" in part for part in child.cmdline()):
                return child.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return None
