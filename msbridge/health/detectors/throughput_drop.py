"""``throughput_drop``: the recent median rate fell below ``factor`` x the baseline measured after warm-up.

The rate is the step's ``perf/samples_per_s`` when it is recorded, else
1 / step time (steps/s). The baseline is the median of the first
``baseline_steps`` rates after ``warmup_steps``; the current rate is the median
of the last ``window``. One finding per drop; it may fire again after the rate
came back.

The finding says which slowed, from ``perf/data_wait_pct`` (the share of the step spent waiting for the
next batch, per flush window): ``cause`` is ``input_pipeline`` when the longer data wait accounts for at
least half of the longer step, else ``step`` (``unknown`` without data-wait stamps: device sink mode). The
share arrives on a window's last step, so a drop found earlier in a window is reported at that step, with
its step and the window's share.

Example:
    >>> drop = ThroughputDrop(baseline_steps=20, window=10, factor=0.5, warmup_steps=100)
    >>> drop.observe(StepView(step, samples_per_s=rate))  # a Finding when the last 10 steps' median halves
"""
from __future__ import annotations

from collections import deque
from statistics import median as _median
from typing import Deque, List, Optional, Tuple

from ...names import DATA_WAIT_PCT
from .base import LOG, Detector, Finding, Option, StepView, finite, register_detector


def cause_of(ratio: float, wait_before: float, wait_now: float) -> str:
    """Which slowed, ``input_pipeline`` or ``step``: ``ratio`` is the step time now over before, the waits are
    percent of the step (before, now). The wait's growth over the step's growth: at least half is the input.

    Example:
        >>> cause_of(2.0, 2.0, 51.0), cause_of(2.0, 2.0, 3.0)
        ('input_pipeline', 'step')
    """
    grown = ratio - 1.0
    if grown <= 0:
        return "step"
    wait_grown = (wait_now * ratio - wait_before) / 100.0
    return "input_pipeline" if wait_grown >= 0.5 * grown else "step"


def rate_of(view: StepView) -> Tuple[float, str]:
    """The step's throughput and its unit: samples/s when recorded, else steps/s from the step time."""
    if view.samples_per_s is not None:
        return view.samples_per_s, "samples/s"
    return 1.0 / max(float(view.step_time_s), 1e-9), "steps/s"


@register_detector("throughput_drop")
class ThroughputDrop(Detector):
    """The recent median rate fell below ``factor`` x the baseline measured right after warm-up.

    Example:
        >>> ThroughputDrop(baseline_steps=10, window=5).observe(StepView(1, samples_per_s=100.0)) is None
        True
    """

    options = {
        "baseline_steps": Option(int, 20, "steps after warm-up whose median rate is the baseline", low=1),
        "window": Option(int, 10, "recent steps whose median rate is compared with it", low=1),
        "factor": Option(float, 0.5, "a drop is a recent rate below factor x the baseline",
                         low=0, low_open=True, high=1),
    }
    default_action = {"debug": LOG, "production": LOG}

    def __init__(self, warmup_steps: int = 0, baseline_steps: int = 20, window: int = 10,
                 factor: float = 0.5) -> None:
        super().__init__(warmup_steps)
        self.baseline_steps = baseline_steps
        self.factor = factor
        self._first: List[float] = []
        self.baseline: Optional[float] = None
        self._recent: Deque[float] = deque(maxlen=window)
        self._in_drop = False
        self._waits: List[float] = []  # data wait shares (percent) seen while the baseline formed
        self._pending: Optional[Finding] = None  # a drop waiting for its window's data wait share

    def observe(self, view: StepView) -> Optional[Finding]:
        wait = view.values.get(DATA_WAIT_PCT)
        if wait is not None and view.step > self.warmup_steps and (self.baseline is None or not self._waits):
            self._waits.append(float(wait))
        if wait is not None and self._pending is not None:  # this step's rate joins the recent ones still
            pending, self._pending = self._pending, None
            rate = rate_of(view)[0]
            if finite(rate) and rate > 0:
                self._recent.append(rate)
            return self._explained(pending, float(wait))
        rate, unit = rate_of(view)
        if view.step <= self.warmup_steps or not finite(rate) or rate <= 0:
            return None
        if self.baseline is None:
            self._first.append(rate)
            if len(self._first) >= self.baseline_steps:
                self.baseline = float(_median(self._first))
            return None
        self._recent.append(rate)
        if len(self._recent) < (self._recent.maxlen or 1):
            return None
        current = float(_median(self._recent))
        dropped = current < self.factor * self.baseline
        started, self._in_drop = dropped and not self._in_drop, dropped
        if not started:
            return None
        finding = Finding(self.name, view.step, detail={
            "rate": current, "baseline": self.baseline, "ratio": current / self.baseline,
            "factor": self.factor, "unit": unit})
        if wait is not None or not self._waits:  # the share is here, or there is none to wait for
            return self._explained(finding, wait)
        self._pending = finding
        return None

    def _explained(self, finding: Finding, wait: Optional[float]) -> Finding:
        """``finding`` with the data wait share before and now, and the cause they point to."""
        if wait is None or not self._waits:
            return Finding(finding.check, finding.step, detail={**finding.detail, "cause": "unknown"})
        before = float(_median(self._waits))
        ratio = 1.0 / finding.detail["ratio"]  # step time now over before
        return Finding(finding.check, finding.step, detail={
            **finding.detail, "data_wait_pct": round(wait, 2), "baseline_data_wait_pct": round(before, 2),
            "cause": cause_of(ratio, before, wait)})
