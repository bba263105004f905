"""``plateau``: the EMA-smoothed loss has not improved by ``min_delta`` for ``patience`` steps.

Never the raw loss: a noisy loss would reset the wait at every lucky batch.
A stop on a plateau is an early stop: the run closes FINISHED, not FAILED.

Example:
    >>> plateau = Plateau(patience=500, min_delta=1e-3, ema_decay=0.98)
    >>> plateau.observe(StepView(step, loss=loss))  # a Finding 500 steps after the smoothed loss last improved
"""
from __future__ import annotations

from typing import Optional

from .base import LOG, Detector, Finding, Option, StepView, finite, register_detector


@register_detector("plateau")
class Plateau(Detector):
    """No improvement of the EMA-smoothed loss by ``min_delta`` for ``patience`` steps; reported once.

    Example:
        >>> Plateau(patience=10, ema_decay=0.8).observe(StepView(1, loss=2.0)) is None
        True
    """

    options = {
        "patience": Option(int, 500, "steps without improvement before it is reported", low=1),
        "min_delta": Option(float, 1e-3, "the smoothed loss must fall by more than this to count", low=0),
        "ema_decay": Option(float, 0.98, "decay of the loss's exponential moving average",
                            low=0, low_open=True, high=1),
    }
    default_action = {"debug": LOG, "production": LOG}
    early_stop = True

    def __init__(self, warmup_steps: int = 0, patience: int = 500, min_delta: float = 1e-3,
                 ema_decay: float = 0.98) -> None:
        super().__init__(warmup_steps)
        self.patience = patience
        self.min_delta = min_delta
        self.ema_decay = ema_decay
        self.smoothed: Optional[float] = None
        self._best: Optional[float] = None
        self._best_step = 0
        self._wait = 0
        self._fired = False

    def observe(self, view: StepView) -> Optional[Finding]:
        step, loss = view.step, view.loss
        if finite(loss):
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
