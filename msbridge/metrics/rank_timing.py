"""Per-rank step timing, carried in the per-flush collective, and the straggler it names.

Each rank times its steps on the host (``StepTimer``), from three stamps per
step: the previous step's end (the monitor's step-end hook returning), this
step's begin (its step-begin hook) and this step's end (its step-end hook
entered):

- ``data_wait``: begin minus the previous end: the data pipeline and whatever
  other callbacks run between two steps;
- ``run``: end minus begin: the train step itself, *including the time the rank
  waits inside the gradient AllReduce for slower ranks*;
- ``step``: end minus the previous end (``perf/step_time_ms``).

Synchronous data parallelism makes every rank's ``step`` equal: a rank that is
20 % slower makes all ranks 20 % slower, and the others spend the difference
waiting in ``run``. So ``StragglerWatch`` (global rank) compares each rank's
*own* step time, its step time without the wait for others, taking the fastest
rank's run (the rank that waited least: the one the others wait for) as every
rank's run::

    own[r] = data_wait[r] + min(run)

(window medians, so one stalled step does not move a window). A slow *device*
(a longer graph run on one rank only) is not visible this way: the others' runs
grow by the same wait, so only host-side slowness (data, callbacks, the host
itself) is told apart.

A rank whose own step time is above the median of the other ranks' by more
than ``margin`` in ``windows`` consecutive flush windows is a straggler: one ``straggler`` event
names it (how much slower, for how many windows, its data wait and callback
time). A one-off stall moves one step of a window, not its median.

Example:
    >>> timer = StepTimer()
    >>> timer.step(entered=10.05, last_end=10.00, begin=10.01)   # a step of 50 ms, 10 of them waiting for data
    >>> watch = StragglerWatch(world_size=4, margin=0.15, windows=3)
    >>> metrics, events = watch.observe(table_timing, first_step=11, last_step=20)
"""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..health.runner import make_event
from ..names import (DATA_WAIT, DATA_WAIT_PCT, DATA_WAIT_SPREAD, SLOWEST_RANK, STEP_TIME_SPREAD, rank_step_time,
                     spread_name)
from ..sinks.base import Event
from .payload import TIMING_FIELDS
from .spread import spread, stall_event

STRAGGLER = "straggler"
STEP_TIME_MIN, STEP_TIME_MEDIAN, STEP_TIME_MAX = (spread_name(STEP_TIME_SPREAD, s) for s in ("min", "p50", "max"))
DATA_WAIT_MAX = spread_name(DATA_WAIT_SPREAD, "max")
#: ``StepTimer.take()``: each step's (step, run, data wait) seconds, and the hooks' own time meanwhile
Stamps = Tuple[List[Tuple[float, float, float]], float]


class StepTimer:
    """This rank's host stamps of each step between two flushes; ``drain`` sums them up (``take`` on the
    training thread, ``summary`` on any thread: the two halves of ``drain``).

    ``step`` is given each step end: when its hook was entered (before it flushes: the step belongs to the window it
    ends), when the hook before it returned, this step's begin stamp and the hook before it's own time. A step
    without a begin stamp (no step-begin call: device sink mode) has a step time but no data wait or run time. The
    first step only starts the clock. The hook's own time of a flush step is charged to the next window (it is not
    over when the window is drained).

    Example:
        >>> timer.drain()      # step_ms, run_ms, data_wait_ms (medians), data_wait_max_ms, callback_ms (sum)
        array([12.1, 9.8, 2.2, 2.5, 0.4])
        >>> timer.wait_share   # the window's summed data wait over its summed step time
        0.18
    """

    def __init__(self) -> None:
        self._rows: List[Tuple[float, float, float]] = []  # step, run, data wait (seconds)
        self._callback_s = 0.0
        self.wait_share = math.nan  # the last drained window's data wait over its step time (steps with both)

    def step(self, entered: float, last_end: Optional[float], begin: Optional[float] = None, steps: int = 1,
             hook_s: float = 0.0) -> None:
        """The step-end hook is entered at ``entered``, for ``steps`` steps; the hook before it returned at
        ``last_end`` (None: this is the first step) after ``hook_s`` of its own; the step began at ``begin`` (None,
        or before ``last_end``: no step-begin call)."""
        self._callback_s += hook_s
        if last_end is None:
            return
        began = begin if begin is not None and begin >= last_end else None
        wait = math.nan if began is None else began - last_end
        run = math.nan if began is None else (entered - began) / steps
        self._rows.append(((entered - last_end) / steps, run, wait))

    def take(self) -> Stamps:
        """The stamps since the last take, and the hooks' own time meanwhile; resets."""
        taken = (self._rows, self._callback_s)
        self._rows, self._callback_s = [], 0.0
        return taken

    def drain(self) -> np.ndarray:
        """``TIMING_FIELDS`` in ms over the steps since the last drain (NaN where unknown); resets."""
        out, self.wait_share = timing_summary(self.take())
        return out


def timing_summary(taken: Stamps) -> Tuple[np.ndarray, float]:
    """``TIMING_FIELDS`` in ms of ``StepTimer.take()``'s stamps (NaN where unknown), and the window's summed data
    wait over its summed step time (steps with both; NaN without). Plain Python: a window's few hundred rows sort
    in a third of the time numpy takes to mask and partition them."""
    rows_s, callback_s = taken
    out = [math.nan] * len(TIMING_FIELDS)
    wait_share = math.nan
    if rows_s:
        steps, runs, waits = zip(*rows_s)
        out[0] = statistics.median(steps) * 1e3
        runs = [run for run in runs if run == run]  # no step-begin stamps: NaN run and wait, NaN medians
        if runs:
            out[1] = statistics.median(runs) * 1e3
        timed = [(wait, step) for step, wait in zip(steps, waits) if wait == wait]
        if timed:
            timed_waits, timed_steps = zip(*timed)
            out[2] = statistics.median(timed_waits) * 1e3
            out[3] = max(timed_waits) * 1e3
            wait_share = math.fsum(timed_waits) / (math.fsum(timed_steps) or math.nan)
    out[4] = callback_s * 1e3
    return np.array(out), wait_share


def data_wait_values(timing: np.ndarray, wait_share: float) -> Dict[str, float]:
    """``perf/data_wait_ms`` (the window's median) and ``perf/data_wait_pct`` (100 x its summed data wait over its
    summed step time) from a drained ``StepTimer``; empty where unknown (no step-begin stamps: device sink mode).

    Example:
        >>> data_wait_values(np.array([10.0, 8.0, 2.0, 3.0, 0.1]), 0.2)
        {'perf/data_wait_ms': 2.0, 'perf/data_wait_pct': 20.0}
    """
    values = {DATA_WAIT: float(timing[2]), DATA_WAIT_PCT: 100.0 * wait_share}
    return {name: value for name, value in values.items() if math.isfinite(value)}


def own_step_times(timing: np.ndarray) -> np.ndarray:
    """Each rank's step time without its wait for slower ranks (ms): its data wait plus the fastest
    rank's run time (window medians); its plain step time where it has no begin stamps.
    ``timing`` is ``[ranks, TIMING_FIELDS]``."""
    step, run, wait = (timing[:, i].astype(np.float64) for i in range(3))
    if not np.isfinite(run).any():
        return step
    return np.where(np.isfinite(wait), wait + np.nanmin(run), step)


def median_of_others(values: np.ndarray) -> np.ndarray:
    """For each rank, the median of the *other* ranks' finite values (NaN for a non-finite one, or alone).

    Leaving the rank out keeps a few-rank job honest: with 4 ranks the plain median
    averages the two middle values, one of which can be the straggler itself.

    Example:
        >>> median_of_others(np.array([10.0, 10.0, 13.0, 200.0]))
        array([13., 13., 10., 10.])
    """
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(values))
    n = len(finite)
    if n < 2:
        return out
    order = np.argsort(values[finite])
    ranked = values[finite][order]
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)

    def at(k: int) -> np.ndarray:  # the k-th smallest of the others: one index further once past the rank itself
        return np.where(k < pos, ranked[k], ranked[np.minimum(k + 1, n - 1)])

    m = n - 1
    out[finite] = at((m - 1) // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2
    return out


class StragglerWatch:
    """On the global rank: the ``dist/step_time_ms_*`` and ``dist/data_wait_ms_*`` spread of each window (the
    ranks' own step times and longest data waits), the slowest rank, and the ``straggler`` and ``rank_stall``
    events.

    Args:
        world_size: every rank is timed (not only the reduction group).
        margin: a rank is slow in a window when its own step time exceeds the other ranks' median by this fraction.
        windows: consecutive slow windows that make it a straggler.
        curves: the ranks whose own step time is also logged as ``dist/step_time_ms/rank_{r}`` (``per_rank_curves``).

    Example:
        >>> watch = StragglerWatch(4, margin=0.15, windows=3)
        >>> metrics, events = watch.observe(timing, first_step=1, last_step=5, rank=0)
        >>> metrics["dist/slowest_rank"]
        3.0
    """

    def __init__(self, world_size: int, margin: float, windows: int, curves: Sequence[int] = ()) -> None:
        self.margin, self.windows = float(margin), int(windows)
        self.curves = [int(r) for r in curves]
        self.streak = np.zeros(world_size, dtype=np.int64)
        self._since = np.zeros(world_size, dtype=np.int64)

    def observe(self, timing: np.ndarray, first_step: int, last_step: int,
                rank: int) -> Tuple[Dict[str, float], List[Event]]:
        """The window's metrics (for its last step) and any straggler or stall event; ``rank`` stamps them."""
        own = own_step_times(timing)
        finite = np.isfinite(own)
        if not finite.any():
            return {}, []
        others = median_of_others(own)
        wait_max = timing[:, 3].astype(np.float64)
        metrics = {name: float(v[0]) for name, v in spread(own[:, None], STEP_TIME_SPREAD).items()}
        metrics[SLOWEST_RANK] = float(np.argmax(np.where(finite, own, -np.inf)))
        if np.isfinite(wait_max).any():
            metrics.update((name, float(v[0])) for name, v in spread(wait_max[:, None], DATA_WAIT_SPREAD).items())
        metrics.update({rank_step_time(r): float(own[r]) for r in self.curves if r < len(own)})
        stall = stall_event(own, wait_max, first_step, last_step, rank)
        with np.errstate(invalid="ignore"):
            slow = (others > 0) & (own > others * (1 + self.margin))
        self._since = np.where(slow & (self.streak == 0), first_step, self._since)
        self.streak = np.where(slow, self.streak + 1, 0)
        events = [self._event(r, own, float(others[r]), timing[r], last_step, rank)
                  for r in np.flatnonzero(self.streak == self.windows)]
        return metrics, events + ([stall] if stall is not None else [])

    def _event(self, r: int, own: np.ndarray, others: float, timing: np.ndarray, step: int, rank: int) -> Event:
        fields = dict(zip(TIMING_FIELDS, (float(v) for v in timing)))
        return make_event(STRAGGLER, step, rank, straggler_rank=int(r),
                          slower_pct=round(100 * (own[r] / others - 1), 1), windows=self.windows, since_step=int(self._since[r]), step_time_ms=round(float(own[r]), 3),
                          others_median_ms=round(others, 3), margin=self.margin,
                          data_wait_ms=_round(fields["data_wait_ms"]), callback_ms=_round(fields["callback_ms"]))


def _round(value: float) -> Optional[float]:
    return round(value, 3) if math.isfinite(value) else None
