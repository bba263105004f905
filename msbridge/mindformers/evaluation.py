"""mindformers' ``do_eval`` in the stream: each evaluation its ``EvalCallBack`` runs becomes ``eval/*`` metrics.

With ``do_eval: True`` mindformers' Trainer appends an ``EvalCallBack`` whose ``eval_func`` calls
``model.eval(eval_dataset)`` every ``eval_step_interval`` steps (or ``eval_epoch_interval`` epochs) and only
logs the result. ``watch_evaluations`` wraps that function at train begin: the result (the metrics of the run
YAML's ``metric:``, e.g. ``PerplexityMetric``'s ``{"loss", "PPL"}`` as ``eval/loss``, ``eval/PPL``), the
evaluation's time and its samples (counted from the ``eval_dataset`` the partial holds) go to
``BridgeMonitor.record_eval`` at the training step it ran, and the function still returns what it returned.

Example:
    >>> watch_evaluations(cb_params.list_callback, monitor)   # MSBridgeMonitor.on_train_begin
    1
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

from ..metrics.evaluation import EvalRound

_WRAPPED = "_msbridge_watched"


def watch_evaluations(callbacks: Sequence[Any], monitor: Any) -> int:
    """Wrap the ``eval_func`` of each mindformers ``EvalCallBack`` in ``callbacks`` (once); returns how many."""
    count = 0
    for callback in callbacks:
        evaluate = getattr(callback, "eval_func", None)
        if type(callback).__name__ != "EvalCallBack" or not callable(evaluate) or getattr(evaluate, _WRAPPED, False):
            continue
        callback.eval_func = _recorded(evaluate, monitor)
        count += 1
    return count


def _recorded(evaluate: Any, monitor: Any) -> Any:
    timer = EvalRound()

    @functools.wraps(evaluate)
    def run() -> Any:
        timer.begin()
        timer.count_dataset(getattr(evaluate, "keywords", {}).get("eval_dataset"))  # functools.partial's
        result = evaluate()
        monitor.record_eval(timer.end(result if isinstance(result, dict) else {}))
        return result

    setattr(run, _WRAPPED, True)
    return run
