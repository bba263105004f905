"""Keeps the monitor's own host time within ``overhead_budget`` of the step time.

The callback charges its time in each step hook (``monitor_s``, a flush
included) to the steps; at every flush ``OverheadBudget.observe`` takes the
window's share ``sum(monitor_s) / sum(step_time_s)``. When the median share of
the last few windows is over budget, the flush window is doubled (steps and
seconds), up to what the ring buffer or host buffer allows, so the fixed cost
of a flush (device sync and copy, queue hand-off) is spread over more steps.
It warns once, naming the phase that costs the most.

A window whose median step is under ``MIN_JUDGED_STEP_S`` (100 us) is not judged: such a step does no training work
(a ``msbridge.track`` loop with nothing in it, a test), and a share of it says nothing about what monitoring costs a
real step, whose MindSpore dispatch alone takes longer. Nothing is widened or said for it.

Example:
    >>> budget = OverheadBudget(0.01, flush_steps=100, flush_seconds=10.0, max_flush_steps=236)
    >>> budget.add("drain", 0.0004)
    >>> budget.observe(window.monitor_s, window.step_time_s)
    >>> budget.flush_steps
    100
"""
from __future__ import annotations

import logging
import time
from collections import deque
from statistics import median
from typing import Any, Callable, Deque, Dict, Optional

import numpy as np

log = logging.getLogger("msbridge")

#: Flush phases the callback times, in the words the warning uses.
PHASES = {
    "drain": "drain (device->host copy)",
    "lr": "learning-rate schedule evaluation",
    "reduce": "cross-rank reduce",
    "records": "record building",
    "submit": "hand-off to the sink thread",
}
STEP_HOOK = "per-step hook"
#: Steps shorter than this (median of a window) do no training work: the budget is not judged on them.
MIN_JUDGED_STEP_S = 100e-6


class OverheadBudget:
    """Widens the flush window while the monitor's median share of step time is over ``budget``.

    Args:
        budget: allowed share of step time, e.g. 0.01.
        flush_steps: the configured flush window in steps.
        flush_seconds: the configured flush window in seconds.
        max_flush_steps: the widest window the buffer allows.
        windows: flush windows the median is taken over.
        adapt: widen the window (False: only warn; ranks that reduce together
            must keep flushing at the same steps).
    """

    def __init__(self, budget: float, flush_steps: int, flush_seconds: float, max_flush_steps: int,
                 windows: int = 3, adapt: bool = True) -> None:
        self.budget = float(budget)
        self.flush_steps = int(flush_steps)
        self.flush_seconds = float(flush_seconds)
        self.max_flush_steps = max(int(max_flush_steps), self.flush_steps)
        self.adapt = adapt
        self.shares: Deque[float] = deque(maxlen=max(1, windows))
        self._phase_s: Dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._monitor_s = 0.0
        self._steps = 0
        self.warned = False
        self.active = True

    def add(self, phase: str, seconds: float) -> None:
        """Charge ``seconds`` of one flush to ``phase`` (a key of ``PHASES``)."""
        self._phase_s[phase] += seconds

    def timed_lr(self, lr_at: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], Any]]:
        """``lr_at`` charging its time to "lr" (it runs inside the drain, whose share excludes it)."""
        if lr_at is None:
            return None

        def timed(steps: Any) -> Any:
            start = time.perf_counter()
            try:
                return lr_at(steps)
            finally:
                self._phase_s["lr"] += time.perf_counter() - start
        return timed

    def observe(self, monitor_s: np.ndarray, step_time_s: np.ndarray) -> None:
        """Account one flushed window; widen the flush window if the median share is over budget."""
        step_total = float(step_time_s.sum())  # NaN: a step time unknown, the window not judged
        if not self.active or not step_total > 0 or median(step_time_s.tolist()) < MIN_JUDGED_STEP_S:
            return
        monitor_total = float(monitor_s.sum())
        self._monitor_s += monitor_total
        self._steps += len(step_time_s)
        self.shares.append(monitor_total / step_total)
        if len(self.shares) < self.shares.maxlen:
            return
        share = median(self.shares)
        if share > self.budget:
            self._over(share)

    def costs(self) -> Dict[str, float]:
        """Seconds per phase since the last change, the step hook as what the flush phases leave."""
        phase_s = dict(self._phase_s)
        phase_s["drain"] = max(phase_s["drain"] - phase_s["lr"], 0.0)  # lr is evaluated inside the drain
        out = {PHASES[k]: v for k, v in phase_s.items() if v > 0}
        out[STEP_HOOK] = max(self._monitor_s - sum(phase_s.values()), 0.0)
        return out

    def _over(self, share: float) -> None:
        costs = self.costs()
        top = max(costs, key=costs.get)
        total = sum(costs.values()) or 1.0
        cost = (f"{top}: {costs[top] / total:.0%} of the monitor's time, "
                f"{costs[top] / max(self._steps, 1) * 1e6:.0f} us per step")
        widen = self.adapt and self.flush_steps < self.max_flush_steps
        if widen:
            old = self.flush_steps
            self.flush_steps = min(2 * old, self.max_flush_steps)
            self.flush_seconds *= 2
            action = (f"widening the flush window from {old} to {self.flush_steps} steps "
                      f"({self.flush_seconds:g} s)")
        else:
            why = "ranks flush together" if not self.adapt else f"the buffer holds {self.max_flush_steps} steps"
            action = f"the flush window stays at {self.flush_steps} steps ({why})"
        message = (f"msbridge: the monitor takes {share:.2%} of the step time, over overhead_budget "
                   f"{self.budget:.2%}; {action}. Largest cost: {cost}")
        if not self.warned:
            self.warned = True
            log.warning(message)
        else:
            log.info(message)
        self.shares.clear()
        self._phase_s = dict.fromkeys(PHASES, 0.0)
        self._monitor_s, self._steps = 0.0, 0
        self.active = widen  # nothing left to try: stop measuring
