"""The CPU a setup's callbacks spend on the training thread, and its Python threads' CPU beside it.

Two bracketing callbacks, one before a setup's callbacks and one after them (MindSpore calls a list in order),
read the training thread's CPU clock (``time.thread_time``, to the nanosecond) and the wall clock at each step's
begin and end: what lies between is the setup's hooks, whoever wrote them (msbridge, MLflow, SummaryCollector ...),
measured the same way for each. ``python_threads_cpu`` reads schedstat (``msbridge.run.cost``) of every Python
thread but the training one: the trackers' writer threads, msbridge's sink hosts; MindSpore's own threads are
native, not Python.

Example:
    >>> clock = HookClock()
    >>> callbacks = [clock.before(), *setup_callbacks, clock.after()]
    >>> clock.spent_s  # CPU seconds of the setup's hooks so far
    0.0123
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict

from mindspore.train import Callback

from ..run.cost import tasks_cpu


class _Edge(Callback):
    def __init__(self, clock: "HookClock", opening: bool) -> None:
        super().__init__()
        self.clock, self.opening = clock, opening

    def on_train_step_begin(self, run_context: Any) -> None:
        self.clock.edge(self.opening)

    def on_train_step_end(self, run_context: Any) -> None:
        self.clock.edge(self.opening)


class HookClock:
    """The training thread's CPU between ``before()`` and ``after()`` in every step's begin and end hooks.

    Example:
        >>> clock = HookClock(); Model(cell).train(1, data, callbacks=[clock.before(), cb, clock.after()])
        >>> clock.spent_s > 0
        True
    """

    def __init__(self) -> None:
        self.spent_s = self.wall_s = 0.0  # CPU, and wall time (waits included: a write, a lock, a sleep)
        self._opened = (0.0, 0.0)

    def edge(self, opening: bool) -> None:
        """Called by the bracketing callbacks: open or close one stretch of hooks."""
        now = (time.thread_time(), time.perf_counter())
        if opening:
            self._opened = now
        else:
            self.spent_s += now[0] - self._opened[0]
            self.wall_s += now[1] - self._opened[1]

    def before(self) -> Callback:
        """The callback to put before the setup's callbacks."""
        return _Edge(self, True)

    def after(self) -> Callback:
        """The callback to put after them."""
        return _Edge(self, False)


def python_threads_cpu() -> Dict[int, float]:
    """Thread id -> CPU seconds of every live Python thread of this process but the calling (training) one."""
    me = threading.get_native_id()
    ids = [t.native_id for t in threading.enumerate() if t.native_id not in (None, me)]
    return tasks_cpu(os.getpid(), ids)


def thread_names() -> Dict[int, str]:
    """Thread id -> name of every live Python thread of this process."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def grown(now: Dict[int, float], before: Dict[int, float]) -> float:
    """CPU seconds the threads of ``now`` spent since ``before`` (a thread new since then: all of its CPU)."""
    return sum(max(cpu - before.get(tid, 0.0), 0.0) for tid, cpu in now.items())
