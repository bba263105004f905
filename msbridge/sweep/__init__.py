"""Sweeps on Optuna: ``msbridge sweep SWEEP.yaml`` runs the trials, the monitor prunes them.

Each trial is the training command with the trial's values appended as ``--name=value`` arguments (W&B's
convention) and told to the process in ``MSBRIDGE_SWEEP_*`` environment variables. Inside the training script,
``current()`` is the trial's values, and the script's ``BridgeMonitor`` (or ``msbridge.track``) joins the trial
by itself: its params, ``run_name`` ``trial-<number>``, ``sweep_id`` and MLflow experiment the study's name,
and each value of the objective's metric reported to Optuna, which may prune the trial
(``msbridge.sweep.trial``). Importing this package never imports Optuna.

Example:
    >>> import msbridge.sweep
    >>> msbridge.sweep.current()          # outside a sweep
    {}
    >>> with_values({"optimizer": {"learning_rate": 0.003}}, {"optimizer.learning_rate": 0.01})
    {'optimizer': {'learning_rate': 0.01}}
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Mapping

#: The environment of a trial's process, set by ``msbridge sweep``.
ENV_STUDY = "MSBRIDGE_SWEEP_STUDY"
ENV_STORAGE = "MSBRIDGE_SWEEP_STORAGE"
ENV_TRIAL = "MSBRIDGE_SWEEP_TRIAL"  # the trial's number in its study
ENV_TRIAL_ID = "MSBRIDGE_SWEEP_TRIAL_ID"  # its id in the storage
ENV_PARAMS = "MSBRIDGE_SWEEP_PARAMS"  # the trial's values, JSON
ENV_OBJECTIVE = "MSBRIDGE_SWEEP_OBJECTIVE"  # {"metric": ..., "mode": ...}, JSON
ENV_PRUNER = "MSBRIDGE_SWEEP_PRUNER"  # {"type": "median", ...}, JSON
ENV_EXPERIMENT_DIR = "MSBRIDGE_SWEEP_EXPERIMENT_DIR"
ENV_DEVICE = "MSBRIDGE_SWEEP_DEVICE"  # the device of ``devices:`` the trial holds
ENV_NAMES = (ENV_STUDY, ENV_STORAGE, ENV_TRIAL, ENV_TRIAL_ID, ENV_PARAMS, ENV_OBJECTIVE, ENV_PRUNER,
             ENV_EXPERIMENT_DIR, ENV_DEVICE)


def in_trial() -> bool:
    """True inside a trial's process started by ``msbridge sweep``."""
    return bool(os.environ.get(ENV_STUDY)) and bool(os.environ.get(ENV_TRIAL_ID))


def current() -> Dict[str, Any]:
    """The trial's values by parameter name (``{"optimizer.learning_rate": 0.0031}``); ``{}`` outside a sweep."""
    if not in_trial():
        return {}
    return dict(json.loads(os.environ.get(ENV_PARAMS) or "{}"))


def with_values(params: Mapping[str, Any], values: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of the nested ``params`` with each dotted name of ``values`` set (``a.b`` is ``params["a"]["b"]``)."""
    out = copy.deepcopy(dict(params))
    for name, value in values.items():
        node = out
        *parents, leaf = str(name).split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return out
