"""The stall watchdog: notices, on every rank, that no training step has ended for too long.

A hang (a collective that never returns, a data loader that stalls) ends no step, so no check runs and
nothing is recorded. This thread does not depend on steps: it sleeps on an ``Event`` with a timeout until
the deadline of the last step (never polling), and when no step has ended by then it records a ``stall``
event (the last step, the seconds since it ended, and what the process was last seen doing: ``in a step``,
``at a flush``, ``in the collective``, as the callback marks it). When steps come back it records
``resumed``. Both go through ``submit`` (the dispatcher: every sink, and the alerts).

The per-step cost on the training thread is two stores (``last_end``, ``step``; the monitor writes them itself
where it has no other per-step work) and a check for a stall. The clock starts when the first step ends, so a
first step that compiles the graph for minutes is not a stall. The threshold is ``stall_seconds`` when given, else
``factor`` x the median of the recent step times (``observe``, at each flush), at least ``floor_s``.

It lives in ``run/`` beside the signal guard: it is about the process being alive, not about a window's
values (``health/`` checks the values of the steps that did end).

Example:
    >>> dog = StallWatchdog(submit=lambda event: dispatcher.submit([], [event]), rank=0)
    >>> dog.start()
    >>> dog.step_ended(step)        # from on_train_step_end
    >>> dog.stop()
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from typing import Callable, Deque, Iterable, Optional, Tuple

from ..health.runner import make_event
from ..sinks.base import Event

STALL, RESUMED = "stall", "resumed"
IN_STEP, AT_FLUSH, IN_COLLECTIVE = "in a step", "at a flush", "in the collective"
FLOOR_S = 300.0
FACTOR = 10.0
RECENT = 64

log = logging.getLogger("msbridge")


class StallWatchdog:
    """A daemon thread that records ``stall`` / ``resumed`` events.

    Args:
        submit: hands one event to every sink (thread-safe).
        rank: this process's rank.
        stall_seconds: the threshold as given; None derives it from the step times.
        floor_s / factor: the derived threshold: ``max(floor_s, factor * median step time)``.
        clock: monotonic seconds, ``time.perf_counter`` as the monitor's stamps (the tests pass their own).

    Example:
        >>> StallWatchdog(submit, rank=1, stall_seconds=900).start()
    """

    def __init__(self, submit: Callable[[Event], None], rank: int, stall_seconds: Optional[float] = None,
                 floor_s: float = FLOOR_S, factor: float = FACTOR,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.submit, self.rank, self.stall_seconds = submit, rank, stall_seconds
        self.floor_s, self.factor, self.clock = floor_s, factor, clock
        self.doing = IN_STEP
        self.last_end: Optional[float] = None  # when the last step ended (``clock``); None before the first
        self.step = 0  # the last step that ended
        self._times: Deque[float] = deque(maxlen=RECENT)
        self.stalled_at: Optional[float] = None
        self._stall_age = 0.0
        self._resume: Optional[Tuple[int, float]] = None  # (step, time) of the first step end after a stall
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="msbridge-stall-watchdog", daemon=True)

    def start(self) -> None:
        """Start the thread (again, after a ``stop``: a second ``model.train`` with the same callback)."""
        if self._thread.is_alive():
            return
        self._stopped, self.last_end, self.stalled_at, self._resume = False, None, None, None
        self._times.clear()
        self._wake.clear()
        self._thread = threading.Thread(target=self._loop, name="msbridge-stall-watchdog", daemon=True)
        self._thread.start()

    def step_ended(self, step: int, now: Optional[float] = None) -> None:
        """Training thread: ``step`` ended at ``now`` (default: the clock's now). Wakes the thread only at the first
        step and after a stall (``resume``)."""
        now = self.clock() if now is None else now
        first = self.last_end is None
        self.last_end, self.step, self.doing = now, step, IN_STEP
        if first:  # the clock starts
            self._wake.set()
        elif self.stalled_at is not None:
            self.resume(step, now)

    def resume(self, step: int, now: float) -> None:
        """Training thread: the first step end after a stall (``stalled_at`` set) ends it."""
        if self._resume is None:
            self._resume = (step, now)
            self._wake.set()

    def observe(self, step_s: Iterable[float]) -> None:
        """Step times, for the derived threshold (the monitor's, at each flush: its window's)."""
        self._times.extend(step_s)

    def mark(self, doing: str) -> None:
        """What the training thread is about to do (``AT_FLUSH``, ``IN_COLLECTIVE``); O(1)."""
        self.doing = doing

    def threshold(self) -> float:
        """Seconds without a step end that make a stall."""
        if self.stall_seconds is not None:
            return float(self.stall_seconds)
        if not self._times:
            return self.floor_s
        return max(self.floor_s, self.factor * statistics.median(self._times))

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _loop(self) -> None:
        while not self._stopped:
            last = self.last_end
            if self.stalled_at is not None:
                self._wake.wait()  # in a stall: sleep until a step ends (or the stop)
            elif last is None:
                self._wake.wait()  # before the first step ends (compiling): never a stall
            else:
                self._wake.wait(max(0.0, last + self.threshold() - self.clock()))
            self._wake.clear()
            if not self._stopped:
                self._check()
        # Steps came back, then training ended before this thread ran again (a busy host): the stall still ends.
        self._record_resume()

    def _check(self) -> None:
        last, now = self.last_end, self.clock()
        if last is None:
            return
        if self.stalled_at is not None:
            self._record_resume()
            return
        age = now - last
        if age >= self.threshold():
            self.stalled_at, self._stall_age = now, age
            self._emit(STALL, seconds_since_step=round(age, 3), stall_seconds=round(self.threshold(), 3),
                       doing=self.doing, step_time_s=self._recent_median(), derived=self.stall_seconds is None)

    def _record_resume(self) -> None:
        """In a stall that a step end has ended since: ``resumed``, with how long the stall lasted."""
        if self.stalled_at is None or self._resume is None:
            return
        step, when = self._resume
        stalled = when - self.stalled_at + self._stall_age
        self.stalled_at, self._resume = None, None
        self._emit(RESUMED, stalled_s=round(stalled, 3), step=step)

    def _recent_median(self) -> Optional[float]:
        return round(statistics.median(self._times), 6) if self._times else None

    def _emit(self, kind: str, step: Optional[int] = None, **detail: object) -> None:
        try:
            self.submit(make_event(kind, self.step if step is None else step, self.rank, **detail))
        except Exception:  # a closed dispatcher or a broken sink never ends the watchdog
            log.exception("msbridge: the stall watchdog could not record its %s event", kind)
