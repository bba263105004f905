"""The health detectors: each looks at one step's host floats and says when something starts.

Every detector keeps its own small state across flush windows and is fed the
steps in order, one at a time, as plain floats (the window was already copied
to the host). A detector reports the *first* step of an episode (a run of
consecutive anomalous steps); the episode ends when a step is normal again, so
a diverged run yields one finding, not one per step.

- ``NonFinite``: loss or grad norm is NaN/inf (an inf grad norm on an overflow
  step of a loss-scaled cell is the loss scaler's business, not an anomaly).
- ``GradNormSpike``: grad norm above ``factor`` x the median of the last
  ``window`` normal grad norms (the seed's "first 100 steps, then 3-5x normal"),
  or above an absolute ``threshold``, for ``count`` steps in a row.
- ``LossSpike``: loss above a rolling median by ``sigmas`` robust standard
  deviations (1.4826 x MAD) and by ``min_rise`` of the median; also reports the
  step it is back within ``recover_sigmas`` (a *recovery* finding).
- ``Plateau``: the EMA-smoothed loss has not improved by ``min_delta`` for
  ``patience`` steps. Never the raw loss.
- ``ThroughputDrop``: the median rate of the last ``window`` steps fell below
  ``factor`` x the median of the first ``baseline_steps`` steps after warm-up.

``warmup_steps``: no finding at or before that step (values still fill baselines).

Example:
    >>> spike = GradNormSpike(factor=4.0, window=100, warmup_steps=100)
    >>> findings = [spike.observe(step, g) for step, g in enumerate(norms, 1)]
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median as _median  # sorts in C: ~10x faster than np.median on these few dozen values
from typing import Any, Deque, Dict, List, Optional

ANOMALY = "anomaly"
RECOVERY = "recovery"

#: A baseline needs this many values before a detector that compares against it is armed.
MIN_BASELINE = 10
#: 1.4826 x MAD estimates the standard deviation of normal data.
MAD_TO_STD = 1.4826


@dataclass(frozen=True)
class Finding:
    """What a detector saw at ``step``: ``kind`` is ``anomaly`` or ``recovery``.

    Example:
        >>> Finding("nonfinite", 3700, detail={"nonfinite": ["train/loss"]})
    """

    check: str
    step: int
    kind: str = ANOMALY
    detail: Dict[str, Any] = field(default_factory=dict)


def _finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


class NonFinite:
    """NaN/inf in the loss or the grad norm.

    Example:
        >>> check = NonFinite()
        >>> check.observe(3700, float("nan"), 1.2).step, check.observe(3701, float("nan"), 1.3)
        (3700, None)
    """

    name = "nonfinite"

    def __init__(self) -> None:
        self._in_episode = False

    @staticmethod
    def which(loss: Optional[float], grad_norm: Optional[float], scaled_overflow: bool = False) -> List[str]:
        """The non-finite ones of ``loss``/``grad_norm``. On an overflow step of a loss-scaled cell an
        inf grad norm is the loss scaler's business (it skips the step and lowers the scale), not an anomaly."""
        bad = [] if loss is None or math.isfinite(loss) else ["train/loss"]
        if grad_norm is not None and not math.isfinite(grad_norm) and not scaled_overflow:
            bad.append("train/grad_norm")
        return bad

    def observe(self, step: int, loss: Optional[float], grad_norm: Optional[float],
                scaled_overflow: bool = False) -> Optional[Finding]:
        bad = self.which(loss, grad_norm, scaled_overflow)
        started = bool(bad) and not self._in_episode
        self._in_episode = bool(bad)
        if not started:
            return None
        return Finding(self.name, step, detail={"nonfinite": bad, "loss": loss, "grad_norm": grad_norm})


class GradNormSpike:
    """Grad norm above a limit for ``count`` steps in a row.

    The limit is ``threshold`` when given (mindformers' absolute
    ``global_norm_spike_threshold``), else ``factor`` x the median of the last
    ``window`` grad norms that were under the limit.

    Example:
        >>> spike = GradNormSpike(factor=4.0, window=100, warmup_steps=100)
        >>> spike.observe(101, 9.0)  # a Finding once 100 normal values near 1.0 were seen
    """

    name = "grad_norm_spike"

    def __init__(self, factor: float = 4.0, window: int = 100, warmup_steps: int = 0,
                 threshold: Optional[float] = None, count: int = 1) -> None:
        self.factor = factor
        self.threshold = threshold
        self.count = max(int(count), 1)
        self.warmup_steps = warmup_steps
        self._normal: Deque[float] = deque(maxlen=window)
        self._run = 0

    def limit(self, step: int) -> Optional[float]:
        """The grad norm above which ``step`` counts as a spike (None: not armed yet)."""
        if step <= self.warmup_steps:
            return None
        if self.threshold is not None:
            return float(self.threshold)
        if len(self._normal) < MIN_BASELINE:
            return None
        return self.factor * float(_median(self._normal))

    def observe(self, step: int, grad_norm: Optional[float]) -> Optional[Finding]:
        if not _finite(grad_norm):
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


@dataclass
class _Spike:
    step: int
    peak: float
    median: float
    back_below: float
    length: int = 1


class LossSpike:
    """A loss jump against a rolling median/MAD, and the step it comes back.

    Example:
        >>> spikes = LossSpike(window=50, sigmas=6.0)
        >>> [f.kind for f in map(spikes.observe, steps, losses) if f]
        ['anomaly', 'recovery']
    """

    name = "loss_spike"

    def __init__(self, window: int = 50, sigmas: float = 6.0, recover_sigmas: float = 2.0,
                 min_rise: float = 0.1, warmup_steps: int = 0) -> None:
        self.window = window
        self.sigmas = sigmas
        self.recover_sigmas = recover_sigmas
        self.min_rise = min_rise
        self.warmup_steps = warmup_steps
        self._normal: Deque[float] = deque(maxlen=window)
        self._spike: Optional[_Spike] = None

    def observe(self, step: int, loss: Optional[float]) -> Optional[Finding]:
        if not _finite(loss):
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
        median = float(_median(self._normal))
        floor = self.min_rise * abs(median)
        if loss - median <= floor:  # the margin is never below the floor: most steps need no MAD
            return None
        sigma = MAD_TO_STD * float(_median([abs(v - median) for v in self._normal]))
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


class Plateau:
    """No improvement of the EMA-smoothed loss by ``min_delta`` for ``patience`` steps.

    Example:
        >>> plateau = Plateau(patience=500, min_delta=1e-3, ema_decay=0.98)
        >>> plateau.observe(step, loss)  # a Finding 500 steps after the smoothed loss last improved
    """

    name = "plateau"

    def __init__(self, patience: int = 500, min_delta: float = 1e-3, ema_decay: float = 0.98,
                 warmup_steps: int = 0) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.ema_decay = ema_decay
        self.warmup_steps = warmup_steps
        self.smoothed: Optional[float] = None
        self._best: Optional[float] = None
        self._best_step = 0
        self._wait = 0
        self._fired = False

    def observe(self, step: int, loss: Optional[float]) -> Optional[Finding]:
        if _finite(loss):
            d = self.ema_decay
            self.smoothed = loss if self.smoothed is None else d * self.smoothed + (1 - d) * loss
        if step <= self.warmup_steps or self.smoothed is None:
            return None
        if self._best is None or self.smoothed < self._best - self.min_delta:
            self._best, self._best_step, self._wait, self._fired = self.smoothed, step, 0, False
            return None
        self._wait += 1
        if self._wait < self.patience or self._fired:
            return None
        self._fired = True
        return Finding(self.name, step, detail={
            "smoothed_loss": self.smoothed, "best_smoothed_loss": self._best, "best_step": self._best_step,
            "patience": self.patience, "min_delta": self.min_delta, "ema_decay": self.ema_decay})


class ThroughputDrop:
    """The recent median rate fell below ``factor`` x the baseline measured right after warm-up.

    Example:
        >>> drop = ThroughputDrop(baseline_steps=20, window=10, factor=0.5, warmup_steps=100)
        >>> drop.observe(step, samples_per_s)  # a Finding when the last 10 steps' median halves
    """

    name = "throughput_drop"

    def __init__(self, baseline_steps: int = 20, window: int = 10, factor: float = 0.5,
                 warmup_steps: int = 0) -> None:
        self.baseline_steps = baseline_steps
        self.factor = factor
        self.warmup_steps = warmup_steps
        self._first: List[float] = []
        self.baseline: Optional[float] = None
        self._recent: Deque[float] = deque(maxlen=window)
        self._in_drop = False

    def observe(self, step: int, rate: Optional[float], unit: str = "samples/s") -> Optional[Finding]:
        if step <= self.warmup_steps or not _finite(rate) or rate <= 0:
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
        return Finding(self.name, step, detail={
            "rate": current, "baseline": self.baseline, "ratio": current / self.baseline,
            "factor": self.factor, "unit": unit})
