"""``grad_norm_spike``: the grad norm above a limit for ``count`` steps in a row.

The limit is ``threshold`` when given (mindformers' absolute
``global_norm_spike_threshold``), else ``factor`` x the median of the last
``window`` grad norms that were under the limit ("normal for the first 100
steps, then 3-5x normal"). Armed once ``MIN_BASELINE`` normal values were seen.

Example:
    >>> spike = GradNormSpike(factor=4.0, window=100, warmup_steps=100)
    >>> findings = [spike.observe(StepView(step, grad_norm=g)) for step, g in enumerate(norms, 1)]
"""
from __future__ import annotations

from typing import Optional

from .base import DUMP, MIN_BASELINE, Detector, Finding, Option, RollingMedian, StepView, finite, register_detector


@register_detector("grad_norm_spike")
class GradNormSpike(Detector):
    """Grad norm above ``threshold``, or above ``factor`` x its recent median, ``count`` steps in a row.

    Example:
        >>> spike = GradNormSpike(factor=4.0, window=100, warmup_steps=100)
        >>> spike.observe(StepView(101, grad_norm=9.0))  # a Finding once 100 normal values near 1.0 were seen
    """

    options = {
        "factor": Option(float, 4.0, "a spike is above factor x the median of the recent normal grad norms",
                         low=1, low_open=True),
        "window": Option(int, 100, "how many recent normal grad norms the median is taken over", low=1),
        "threshold": Option(float, None, "an absolute limit instead of factor x median", low=0, low_open=True),
        "count": Option(int, 1, "steps in a row above the limit before it is reported", low=0),
    }
    default_action = {"debug": DUMP, "production": DUMP}

    def __init__(self, warmup_steps: int = 0, factor: float = 4.0, window: int = 100,
                 threshold: Optional[float] = None, count: int = 1) -> None:
        super().__init__(warmup_steps)
        self.factor = factor
        self.threshold = threshold
        self.count = max(int(count), 1)
        self._normal = RollingMedian(window)
        self._run = 0

    def limit(self, step: int) -> Optional[float]:
        """The grad norm above which ``step`` counts as a spike (None: not armed yet)."""
        if step <= self.warmup_steps:
            return None
        if self.threshold is not None:
            return float(self.threshold)
        if len(self._normal) < MIN_BASELINE:
            return None
        return self.factor * self._normal.median()

    def observe(self, view: StepView) -> Optional[Finding]:
        step, grad_norm = view.step, view.grad_norm
        if not finite(grad_norm):
            return None
        limit = self.limit(step)
        if limit is None or grad_norm <= limit:
            self._run = 0
            self._normal.append(grad_norm)
            return None
        self._run += 1
        if self._run != self.count:
            return None
        detail = {"grad_norm": grad_norm, "threshold": limit, "since_step": step - self.count + 1}
        if self.threshold is None:
            detail.update(median=limit / self.factor, factor=self.factor)
        return Finding(self.name, step, detail=detail)
