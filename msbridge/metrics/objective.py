"""The run's objective: the one number a sweep is compared on, its best and final value and the step of the best.

``objective: {metric: eval/loss, mode: min}`` in YAML names it. Without ``metric`` it is the first recorded of
``eval/global_loss``, ``eval/loss``, ``train/global_loss``, ``train/loss`` (the job's value before one rank's,
validation before training): a run that evaluates is compared on its validation loss from its first
evaluation on, one that never does on its training loss. On the global rank ``Objective.observe`` adds
``objective/best``, ``objective/best_step`` and ``objective/final`` to the last record of each flush that
changed them (the MLflow runs table shows each run's latest, so a sweep can be ranked while it trains).
``objective_metric`` is the rule, for the sinks too (the MLflow sink tags the run with the metric it follows).

Example:
    >>> objective = Objective(None, "min")
    >>> records = [Record(1, 0, 0.0, {"train/loss": 2.0}), Record(2, 0, 0.0, {"train/loss": 1.5})]
    >>> objective.observe(records)
    >>> records[-1].values["objective/best"], objective.summary()["best_step"]
    (1.5, 2)
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, Optional, Sequence, Set

from ..names import (EVAL_PREFIX, EVAL_SAMPLES, EVAL_TIME, OBJECTIVE_BEST, OBJECTIVE_BEST_STEP, OBJECTIVE_FINAL,
                     objective_metric)
from ..sinks.base import Record

log = logging.getLogger("msbridge")


class Objective:
    """Follows one metric's best and final value over the records of the global rank.

    Args:
        metric: the metric's recorded name; None picks by ``names.objective_metric``.
        mode: ``min`` or ``max``: which value is best.
    """

    def __init__(self, metric: Optional[str], mode: str = "min") -> None:
        self.fixed = metric
        self.mode = mode
        self.metric: Optional[str] = metric
        self.best: Optional[float] = None
        self.best_step = 0
        self.final: Optional[float] = None
        self._said_no_eval_loss = False

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def observe(self, records: Sequence[Record]) -> None:
        """Take a flush's records (step order): its last record gets the objective's values when they changed."""
        names = set().union(*(rec.values for rec in records))
        metric = objective_metric(self.fixed, names, self.metric)
        if metric != self.metric:  # the first evaluation: from now on the run is compared on it
            self.metric, self.best, self.best_step, self.final = metric, None, 0, None
        if metric is not None and not metric.startswith(EVAL_PREFIX) and not self._said_no_eval_loss:
            self._say_no_eval_loss(names)
        changed = False
        for rec in records:
            value = rec.values.get(metric) if metric is not None else None
            if value is None:
                continue
            self.final, changed = value, True
            if math.isfinite(value) and self._better(value):
                self.best, self.best_step = value, rec.step
        if changed:
            values = records[-1].values
            if self.best is not None:
                values.update({OBJECTIVE_BEST: self.best, OBJECTIVE_BEST_STEP: float(self.best_step)})
            values[OBJECTIVE_FINAL] = self.final

    def _say_no_eval_loss(self, names: Set[str]) -> None:
        """An evaluation that records no loss (only ``eval/accuracy``, say) leaves the run compared on its best
        single training step: said once, with the setting that compares it on its evaluation. ``names``: the
        metrics of a flush's records."""
        evals = sorted({n for n in names if n.startswith(EVAL_PREFIX)} - {EVAL_SAMPLES, EVAL_TIME})
        if evals:
            self._said_no_eval_loss = True
            log.warning("msbridge: the evaluation records %s but no loss: the run is compared on %s (its best "
                        "single step); to compare it on the evaluation, set objective: {metric: %s, mode: max} "
                        "(or min)", ", ".join(evals), self.metric, evals[0])

    def summary(self) -> Dict[str, Any]:
        """For run.json and the README: the metric, mode, best (and its step) and final value."""
        return {"metric": self.metric, "mode": self.mode, "best": self.best,
                "best_step": self.best_step or None, "final": self.final}

