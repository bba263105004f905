"""``EvalHooks``: the validation half of ``BridgeMonitor``: evaluations recorded at the training step they ran.

MindSpore calls a callback's ``on_eval_*`` hooks from ``Model.fit(..., valid_dataset=, valid_frequency=)`` after
the epochs it validates, and from a ``Model.eval(dataset, callbacks=[monitor])`` made during training (a
callback of the user's, at an epoch's end); mindformers' ``do_eval`` goes through ``MSBridgeMonitor``, and
``msbridge.track``'s ``run.eval`` calls ``record_eval`` itself. Each evaluation becomes one record of ``eval/*``
values (``metrics.evaluation``) at the last training step, written after that step's own record, in every sink.

Model.fit's evaluation runs inside a callback manager of its own, which enters and exits the monitor a second
time: only the outermost exit is the end of the run (``BridgeMonitor.__exit__`` reads ``nested_exit``).

A user's callback that calls ``model.eval(ds)`` without ``callbacks=[monitor]`` (as MindSpore's tutorials write
their ``EvalCallBack``) would pass the monitor by: while the run trains, ``ModelEvals`` wraps ``eval`` on the
training ``Model`` and on every ``Model`` a callback of the training holds, so such a call takes the monitor
as one of its callbacks; the wrap is taken off when the run closes. ``eval/loss`` is the whole validation
set's loss (``metrics.evaluation``): the loss output the evaluating ``Model``'s ``eval_indexes`` point at.

Example:
    >>> model.fit(3, train, valid_dataset=valid, valid_frequency=1, callbacks=[monitor])
    >>> [r.step for r in read_run(monitor.run_dir).ranks[0].records if "eval/loss" in r.values]
    [10, 20, 30]
"""
from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any, List, Mapping, Optional, Sequence

from mindspore.train import Model

from .capture.cb_params import param
from .metrics.evaluation import EvalRound, global_eval
from .metrics.objective import Objective
from .names import EVAL_PREFIX, EVAL_TIME
from .sinks.base import Record

log = logging.getLogger("msbridge")


def _running_model(depth: int = 8) -> Optional[Any]:
    """The ``Model`` whose method called the hook this is called from (``Model._train`` / ``_eval_process``
    calls the callback manager, which calls the hook), found in the caller's frames; None outside a Model."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Model):
            return candidate
        frame = frame.f_back
    return None


def _loss_index(model: Optional[Any]) -> Optional[int]:
    """Which of ``model``'s eval network outputs is the loss (``Model(eval_indexes=)``; ``[0, 1, 2]`` for the
    ``nn.WithEvalCell`` a Model with a ``loss_fn`` builds), None when the Model does not say."""
    indexes = getattr(model, "_eval_indexes", None)
    return int(indexes[0]) if indexes else None


class ModelEvals:
    """``eval`` of the training's Models wrapped while the run trains: a call without the monitor among its
    callbacks gets it added, so the evaluation is recorded like ``model.eval(ds, callbacks=[monitor])``.

    Example:
        >>> evals = ModelEvals(monitor)
        >>> evals.attach(cb_params)      # at train begin: the Model training, and any a callback holds
        >>> model.eval(valid)            # from a user's callback at an epoch's end: recorded
        >>> evals.detach()               # at the run's close
    """

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor
        self.models: List[Any] = []

    def attach(self, cb: Any) -> None:
        """Wrap the running Model's ``eval`` and that of each Model a callback in ``cb.list_callback`` holds as an
        attribute. mindformers' ``EvalCallBack`` is left alone: ``msbridge.mindformers`` records its ``do_eval``."""
        callbacks = list(param(cb, "list_callback", None) or [])
        if any(type(c).__module__.startswith("mindformers") and hasattr(c, "eval_func") for c in callbacks):
            return
        found = [_running_model()] + [v for c in callbacks for v in getattr(c, "__dict__", {}).values()
                                          if isinstance(v, Model)]
        for model in found:
            if model is not None and all(model is not m for m in self.models) and "eval" not in vars(model):
                model.eval = self._wrapped(model.eval)
                self.models.append(model)

    def _wrapped(self, evaluate: Any) -> Any:
        monitor = self.monitor

        @functools.wraps(evaluate)
        def recorded_eval(valid_dataset: Any, callbacks: Any = None, dataset_sink_mode: bool = False) -> Any:
            given = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else []
            if all(c is not monitor for c in given):
                callbacks = [*given, monitor]
            return evaluate(valid_dataset, callbacks=callbacks, dataset_sink_mode=dataset_sink_mode)

        return recorded_eval

    def detach(self) -> None:
        """Take the wraps off (the Models' own ``eval`` again)."""
        for model in self.models:
            vars(model).pop("eval", None)
        self.models = []


class EvalHooks:
    """MindSpore's ``on_eval_*`` hooks, ``record_eval`` and the run's objective (``metrics.objective``), mixed
    into ``BridgeMonitor`` (whose flush, health, reducer and dispatcher they use).

    Example:
        >>> monitor.record_eval({"eval/loss": 0.42, "eval/accuracy": 0.91})   # at the last training step
    """

    _eval_round: EvalRound
    _depth: int
    _handed_time: float
    _objective: Objective

    def _init_eval(self) -> None:
        self._eval_round = EvalRound()
        self._depth = 0  # callback managers entered: Model.fit's evaluation enters a second one
        self._handed_time = 0.0  # the time of the last record handed to the sinks
        self._train_context: Any = None  # the training's RunContext, kept at each step end
        self._objective = Objective(self.config.objective["metric"], self.config.objective["mode"])
        self.model_evals = ModelEvals(self)  # attached at train begin, detached at the run's close

    def _before_dispatch(self, records: Sequence[Record]) -> None:
        """Records about to go to the sinks: the objective's best and final onto them (global rank), and their
        time kept (an evaluation's record comes after them)."""
        if records:
            self._handed_time = records[-1].time
            if self.run is not None and self.run.is_global:
                self._objective.observe(records)

    def on_eval_begin(self, run_context: Any) -> None:
        self._eval_round.begin(_loss_index(_running_model()))

    def on_eval_step_end(self, run_context: Any) -> None:
        self._eval_round.step(run_context.original_args())
        self._watchdog.step_ended(max(self._watchdog.step, self._last_step))  # an evaluation that steps: no stall

    def on_eval_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        results = param(cb, "eval_results", None) or param(cb, "metrics", None) or {}
        self.record_eval(self._eval_round.end(results))

    def record_eval(self, values: Mapping[str, float]) -> None:
        """Record ``eval/*`` values at the last training step, after the steps up to it, in every sink (rank 0 of
        a data-parallel job adds ``eval/global_*``). Their ``eval/time_s`` is kept out of the next step's time."""
        if self.dispatcher is None or self.run is None:
            if self.plan is not None and self.tally.status is not None:
                log.warning("msbridge: an evaluation after the run ended is not recorded (the run is closed); "
                            "evaluate during training: Model.fit(..., valid_dataset=...), or Model.eval from a callback")
            return
        self.flush()  # the steps up to this one go first
        values = dict(values)
        if self._reducer is not None:  # every rank evaluates at the same step: one collective, like a flush
            totals = global_eval(values, self.config.collective_timeout_s)
            if self.run.is_global:
                values.update(totals)
        # after its step's record in every tracker, also when both fall in one millisecond (MLflow's latest value)
        record = Record(self._last_step, self.run.rank, max(time.time(), self._handed_time + 0.001), values)
        events = self.health.check_eval(record)
        self._pending.append(record)
        self._pending_events.extend(events)
        self.events.extend(events)
        self._dispatch_pending()
        if self.health.stop is not None and self._train_context is not None:  # training ends after this step
            self._train_context.request_stop()
        self.skip_time(values.get(EVAL_TIME, 0.0))  # the next step's time is its own, not the evaluation's

    def say_unevaluated(self) -> None:
        """At the run's close: an objective named on an evaluation (``objective.metric: eval/...``) that no
        evaluation gave a value is said once, with the fix (an evaluation the monitor did not see)."""
        objective = self._objective
        if (self.run is None or not self.run.is_global or objective.final is not None
                or not (objective.fixed or "").startswith(EVAL_PREFIX)):
            return
        log.warning("msbridge: the objective %s got no value: no evaluation reached the monitor. Evaluate with "
                    "model.fit(..., valid_dataset=valid, callbacks=[monitor]), or call model.eval(valid, "
                    "callbacks=[monitor]) from your callback", objective.fixed)

    def __enter__(self) -> Any:
        self._depth += 1
        return self

    def nested_exit(self) -> bool:
        """Called first in ``__exit__``: True when this exit ends an inner callback manager (an evaluation's)."""
        nested, self._depth = self._depth > 1, max(self._depth - 1, 0)
        return nested
