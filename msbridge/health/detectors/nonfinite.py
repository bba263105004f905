"""``nonfinite``: the loss or the grad norm is NaN/inf.

An inf grad norm on an overflow step of a loss-scaled cell is the loss
scaler's business (it skips the step and lowers the scale), not an anomaly.
Not held back by ``warmup_steps``: a NaN is reported from step 1.

Example:
    >>> check = NonFinite()
    >>> check.observe(StepView(3700, loss=float("nan"))).step, check.observe(StepView(3701, loss=float("nan")))
    (3700, None)
"""
from __future__ import annotations

from typing import Optional

from .base import DUMP, STOP, Detector, Finding, StepView, register_detector


@register_detector("nonfinite")
class NonFinite(Detector):
    """NaN/inf in the loss or the grad norm; one finding per episode of non-finite steps.

    Example:
        >>> NonFinite().observe(StepView(5, loss=1.0, grad_norm=float("inf"))).detail["nonfinite"]
        ['train/grad_norm']
    """

    default_action = {"debug": STOP, "production": DUMP}
    in_graph_skip = True  # TrainStep(skip_nonfinite=True) drops exactly these updates inside the graph

    def __init__(self, warmup_steps: int = 0) -> None:
        super().__init__(warmup_steps)
        self._in_episode = False

    def observe(self, view: StepView) -> Optional[Finding]:
        bad = view.nonfinite
        started = bool(bad) and not self._in_episode
        self._in_episode = bool(bad)
        if not started:
            return None
        return Finding(self.name, view.step, detail={"nonfinite": bad, "loss": view.loss,
                                                     "grad_norm": view.grad_norm})
