"""The trial's side of a sweep: what ``BridgeMonitor`` does inside one Optuna trial.

``join_trial`` gives the monitor a ``TrialLink`` when it was handed a trial (``BridgeMonitor(config,
trial=trial)`` inside a user's own ``study.optimize``) or runs in a trial's process of ``msbridge sweep`` (its
``MSBRIDGE_SWEEP_*`` environment), else None: nothing changes for a run outside a sweep. The link

- adds the trial to the run's config (``overrides``): its values under ``params``, the study's name as
  ``sweep_id`` and, in a sweep's process, as ``experiment``, ``run_name`` ``trial-<number>``, the sweep's
  experiment dir and objective;
- reports the objective's metric (``eval/loss`` when ``objective.metric`` is unset) to the trial at its step, at
  each flush and evaluation that recorded it, and asks Optuna whether to prune (a NaN or inf value is pruned
  without asking: no pruner ranks it, and the first trials have nothing to compare it with); the monitor then
  stops training (``run_context.request_stop()``, which ``msbridge.track`` reads as ``run.should_stop``) and the
  run ends ``PRUNED``.

A storage that fails during training is said once; training goes on, unpruned.

Example:
    >>> def objective(trial):
    ...     monitor = BridgeMonitor("monitor.yaml", trial=trial)
    ...     train(monitor, trial.suggest_float("optimizer.learning_rate", 1e-4, 1e-1, log=True))
    ...     return trial_value(monitor)     # the run's objective best; optuna.TrialPruned when it was pruned
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, List, Optional, Sequence

from ..errors import exception_text
from ..masking import mask_text
from ..sinks.base import Event, Record
from . import (ENV_EXPERIMENT_DIR, ENV_OBJECTIVE, ENV_PRUNER, ENV_STORAGE, ENV_STUDY, ENV_TRIAL, ENV_TRIAL_ID,
               current, in_trial)

log = logging.getLogger("msbridge")
#: The user attribute of the Optuna trial that holds its run dir (``msbridge sweep`` reads the outcome there).
RUN_DIR_ATTR = "msbridge.run_dir"
#: The event a pruned run records (MLflow: the tag ``msbridge.event.pruned.last``).
PRUNED_EVENT = "pruned"
_FAILED = object()
#: The metric a trial is reported when the run's ``objective.metric`` is unset (``msbridge sweep``'s default too).
SWEEP_METRIC = "eval/loss"


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: a string stays the text it is, a number its value


class TrialLink:
    """One Optuna trial as the monitor sees it. Build it with ``join_trial``.

    Args:
        trial: an ``optuna.trial.Trial``.
        sweep: True in a process ``msbridge sweep`` started (it also names the run and its directories).
        objective: the sweep's ``{metric, mode}`` (a sweep's process), else None: the monitor's own objective.
        experiment_dir: the sweep's experiment dir (a sweep's process).

    Example:
        >>> import optuna
        >>> study = optuna.create_study(study_name="s1")
        >>> link = TrialLink(study.ask({"optimizer.learning_rate": optuna.distributions.FloatDistribution(0.01, 0.01)}))
        >>> link.overrides()
        ['params.optimizer.learning_rate=0.01', 'sweep_id="s1"']
    """

    def __init__(self, trial: Any, sweep: bool = False, objective: Optional[dict] = None,
                 experiment_dir: Optional[str] = None) -> None:
        self.trial = trial
        self.sweep = sweep
        self.objective = objective
        self.experiment_dir = experiment_dir
        self.pruned_at: Optional[int] = None  # the step at which Optuna said prune
        self.pruned_value: Optional[float] = None  # the value it was told there
        self.reported = 0  # values reported to the trial
        self._last_step = -1
        self._broken = False

    @property
    def study_name(self) -> str:
        return str(self.trial.study.study_name)

    def overrides(self) -> List[str]:
        """The trial as ``--set`` layers of the run's config (applied after the user's own)."""
        values = current() if self.sweep else dict(self.trial.params)
        out = [_override(f"params.{name}", value) for name, value in values.items()]
        out.append(_override("sweep_id", self.study_name))
        if self.sweep:
            out += [_override("experiment", self.study_name), _override("run_name", f"trial-{self.trial.number}")]
            if self.experiment_dir:
                out.append(_override("experiment_dir", self.experiment_dir))
            for key, value in (self.objective or {}).items():
                out.append(_override(f"objective.{key}", value))
        return out

    def attach(self, run_dir: str) -> None:
        """Keep the run's directory on the trial (``msbridge sweep`` reads the run's outcome there)."""
        self._call(lambda: self.trial.set_user_attr(RUN_DIR_ATTR, run_dir))

    def report(self, records: Sequence[Record], metric: Optional[str], ask: bool = True) -> bool:
        """Report the last value of ``metric`` in ``records`` at its step; True when Optuna says prune (once).
        ``ask=False`` reports without asking (a data-parallel trial: one rank alone must not stop)."""
        if self.pruned_at is not None or self._broken or metric is None:
            return False
        last = next(((r.step, r.values[metric]) for r in reversed(records) if metric in r.values), None)
        if last is None or last[0] <= self._last_step:  # Optuna keeps one value a step: the first
            return False
        step, value = last
        self._last_step = step
        if self._call(lambda: self.trial.report(float(value), int(step))) is _FAILED:
            return False
        self.reported += 1
        if not ask:
            return False
        # a NaN or inf objective cannot recover and no pruner can rank it (the first trials have none to compare
        # with): pruned at once, so it never completes with a value from before it diverged
        prune = True if not math.isfinite(float(value)) else self._call(self.trial.should_prune)
        if prune is not _FAILED and bool(prune):  # numpy's bool when the pruner compared with a percentile
            self.pruned_at, self.pruned_value = step, float(value)
            return True
        return False

    def event(self, rank: int, metric: Optional[str]) -> Event:
        """The ``pruned`` event of the run (into jsonl, run.json and every tracker)."""
        return Event(PRUNED_EVENT, int(self.pruned_at or 0), rank, time.time(),
                     {"study": self.study_name, "trial": int(self.trial.number), "metric": metric or "",
                      "value": self.pruned_value})

    def _call(self, call: Any) -> Any:
        """``call()``, or ``_FAILED`` when the storage failed (said once; training goes on, unpruned)."""
        try:
            return call()
        except Exception as exc:  # a database gone away must not end the training it reports on
            self._broken = True
            log.warning("msbridge: the Optuna trial %s could not be reached (%s); training goes on without "
                        "pruning", getattr(self.trial, "number", "?"), mask_text(exception_text(exc)))
            return _FAILED


def _from_env() -> TrialLink:
    """The trial of this process's sweep (``MSBRIDGE_SWEEP_*``), loaded from the sweep's storage."""
    from .study import make_pruner, optuna_module, storage

    optuna = optuna_module()
    env = os.environ
    study = optuna.load_study(study_name=env[ENV_STUDY], storage=storage(env[ENV_STORAGE]),
                              sampler=optuna.samplers.RandomSampler(),  # the values are fixed: no sampling here
                              pruner=make_pruner(json.loads(env.get(ENV_PRUNER) or '{"type": "median"}')))
    trial = optuna.trial.Trial(study, int(env[ENV_TRIAL_ID]))
    if str(trial.number) != env.get(ENV_TRIAL, str(trial.number)):
        log.warning("msbridge: %s=%s is trial %d of the study", ENV_TRIAL_ID, env[ENV_TRIAL_ID], trial.number)
    objective = json.loads(env.get(ENV_OBJECTIVE) or "null")
    return TrialLink(trial, sweep=True, objective=objective, experiment_dir=env.get(ENV_EXPERIMENT_DIR) or None)


def join_trial(trial: Any = None) -> Optional[TrialLink]:
    """The monitor's ``TrialLink``: of ``trial`` when given, else of this process's sweep trial, else None."""
    if trial is not None:
        return TrialLink(trial)
    if in_trial():
        return _from_env()
    return None


def finite(value: Any) -> Optional[float]:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_outcome(run_dir: str) -> dict:
    """The ``outcome`` of a run's run.json (``{}`` when the run never wrote one)."""
    try:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as fh:
            return dict(json.load(fh).get("outcome") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def trial_value(monitor: Any) -> float:
    """What a user's objective function returns for a monitored run: its objective's best value.

    Raises:
        optuna.TrialPruned: the monitor pruned the run.
        ValueError: the run recorded no finite value of its objective (Optuna marks the trial FAIL).
    """
    from .study import optuna_module

    outcome = read_outcome(monitor.run_dir) if monitor.run_dir else {}
    if outcome.get("status") == "PRUNED":
        raise optuna_module().TrialPruned(f"pruned at step {monitor.trial_link.pruned_at}")
    objective = outcome.get("objective") or {}
    value = finite(objective.get("best"))
    if value is None:
        raise ValueError(f"the run recorded no finite value of its objective {objective.get('metric')!r} "
                         f"(status {outcome.get('status')}; see {monitor.run_dir}/README.md)")
    return value
