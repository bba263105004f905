"""``loss_spike``: a loss jump against a rolling median, and the step it comes back.

A spike is a loss above the median of the last ``window`` normal losses by
``sigmas`` robust standard deviations (1.4826 x MAD) and by ``min_rise`` of the
median. The step the loss is back within ``recover_sigmas`` is reported too, as
a ``recovery`` finding. A "spike" longer than ``window`` steps is a new level:
the baseline starts again from there.

Example:
    >>> spikes = LossSpike(window=50, sigmas=6.0)
    >>> [f.kind for f in (spikes.observe(StepView(s, loss=v)) for s, v in enumerate(losses, 1)) if f]
    ['anomaly', 'recovery']
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median as _median
from typing import Optional

from .base import (DUMP, LOG, MIN_BASELINE, RECOVERY, Detector, Finding, Option, RollingMedian, StepView, finite,
                   register_detector)

#: 1.4826 x MAD estimates the standard deviation of normal data.
MAD_TO_STD = 1.4826


@dataclass
class _Spike:
    step: int
    peak: float
    median: float
    back_below: float
    length: int = 1


@register_detector("loss_spike")
class LossSpike(Detector):
    """A loss jump against a rolling median/MAD, and the step it comes back.

    Example:
        >>> LossSpike(window=30, min_rise=0.05, warmup_steps=20).observe(StepView(21, loss=2.0))  # None: no baseline
    """

    options = {
        "window": Option(int, 50, "how many recent normal losses the median and MAD are taken over", low=1),
        "sigmas": Option(float, 6.0, "a spike is this many robust standard deviations above the median",
                         low=0, low_open=True),
        "recover_sigmas": Option(float, 2.0, "recovered once back within this many of them",
                                 low=0, low_open=True),
        "min_rise": Option(float, 0.1, "and at least this fraction of the median above it", low=0),
    }
    default_action = {"debug": DUMP, "production": LOG}

    def __init__(self, warmup_steps: int = 0, window: int = 50, sigmas: float = 6.0, recover_sigmas: float = 2.0,
                 min_rise: float = 0.1) -> None:
        super().__init__(warmup_steps)
        self.window = window
        self.sigmas = sigmas
        self.recover_sigmas = recover_sigmas
        self.min_rise = min_rise
        self._normal = RollingMedian(window)
        self._spike: Optional[_Spike] = None

    def observe(self, view: StepView) -> Optional[Finding]:
        step, loss = view.step, view.loss
        if not finite(loss):
            return None
        if self._spike is not None:
            return self._while_spiking(step, loss)
        if step > self.warmup_steps and len(self._normal) >= MIN_BASELINE:
            finding = self._spike_at(step, loss)
            if finding is not None:
                return finding
        self._normal.append(loss)
        return None

    def _spike_at(self, step: int, loss: float) -> Optional[Finding]:
        median = self._normal.median()
        floor = self.min_rise * abs(median)
        if loss - median <= floor:  # the margin is never below the floor: most steps need no MAD
            return None
        sigma = MAD_TO_STD * float(_median([abs(v - median) for v in self._normal.arrived]))
        margin = max(self.sigmas * sigma, floor)
        if loss - median <= margin:
            return None
        self._spike = _Spike(step, loss, median, median + max(self.recover_sigmas * sigma, 0.5 * floor))
        return Finding(self.name, step, detail={
            "loss": loss, "median": median, "sigma": sigma, "threshold": median + margin})

    def _while_spiking(self, step: int, loss: float) -> Optional[Finding]:
        spike = self._spike
        assert spike is not None
        if loss <= spike.back_below:
            self._spike = None
            self._normal.append(loss)
            return Finding(self.name, step, RECOVERY, detail={
                "spike_step": spike.step, "recovery_step": step, "steps": step - spike.step,
                "peak": spike.peak, "median": spike.median})
        spike.peak = max(spike.peak, loss)
        spike.length += 1
        if spike.length > self.window:  # a new level, not a spike: start a new baseline from here
            self._spike = None
            self._normal.clear()
        return None
