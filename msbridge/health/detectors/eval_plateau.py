"""``eval_plateau``: a validation metric has not improved by ``min_delta`` for ``patience`` evaluations.

Opt-in (``health: {eval_plateau: {patience: 3}}``): it watches the evaluations, not the training steps, so
it fires at the training step of the evaluation that ran out the patience. A stop on it is an early stop:
the run closes FINISHED.

Example:
    >>> check = EvalPlateau(patience=2)
    >>> [check.observe(StepView(s, values={"eval/loss": v})) is not None for s, v in ((10, 1.0), (20, 1.1), (30, 1.2))]
    [False, False, True]
"""
from __future__ import annotations

from typing import Optional

from ...names import EVAL_LOSS
from .base import LOG, Detector, Finding, Option, StepView, finite, register_detector


@register_detector("eval_plateau")
class EvalPlateau(Detector):
    """No improvement of ``metric`` over ``patience`` evaluations in a row; reported once per plateau.

    Example:
        >>> EvalPlateau(metric="eval/accuracy", mode="max").observe(StepView(5, values={"eval/accuracy": 0.5}))
    """

    options = {
        "metric": Option(str, EVAL_LOSS, "the recorded eval metric it watches"),
        "mode": Option(str, "min", "which way is better", choices=("min", "max")),
        "patience": Option(int, 3, "evaluations without improvement before it is reported", low=1),
        "min_delta": Option(float, 0.0, "the metric must improve by more than this to count", low=0),
    }
    default_action = {"debug": LOG, "production": LOG}
    early_stop = True
    on_eval = True
    opt_in = True

    def __init__(self, warmup_steps: int = 0, metric: str = EVAL_LOSS, mode: str = "min", patience: int = 3,
                 min_delta: float = 0.0) -> None:
        super().__init__(warmup_steps)
        self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, min_delta
        self._best: Optional[float] = None
        self._best_step = 0
        self._wait = 0
        self._fired = False

    def _improves(self, value: float) -> bool:
        if self._best is None:
            return True
        gain = self._best - value if self.mode == "min" else value - self._best
        return gain > self.min_delta

    def observe(self, view: StepView) -> Optional[Finding]:
        value = view.values.get(self.metric)
        if not finite(value):
            return None
        if self._improves(value):  # the best fills during the warm-up too; only the report waits for its end
            self._best, self._best_step, self._wait, self._fired = value, view.step, 0, False
            return None
        self._wait += 1
        if self._wait < self.patience or self._fired or view.step <= self.warmup_steps:
            return None
        self._fired = True
        return Finding(self.name, view.step, detail={
            "metric": self.metric, "value": value, "best": self._best, "best_step": self._best_step,
            "evaluations": self._wait, "patience": self.patience})
