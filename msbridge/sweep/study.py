"""Optuna, from a checked ``SweepSpec``: the storage, sampler, pruner, distributions and the study.

Optuna is imported here only, inside the functions that need it; without it they raise
``MissingDependencyError`` with ``pip install 'msbridge[sweep]'``. A SQLite storage waits up to
``SQLITE_WAIT_S`` for a lock, so the sweep and its trial processes (each reporting from its own process)
share one file.

Example:
    >>> from msbridge.sweep.spec import Param, SweepSpec
    >>> spec = SweepSpec("sweep.yaml", "s1", ("python", "train.py"), {"lr": Param("lr", 0.001, 0.1, log=True)},
    ...                  experiment_dir="./runs/{study}")
    >>> study = open_study(spec)
    >>> study.study_name, type(study.pruner).__name__, distribution(spec.params["lr"]).log
    ('s1', 'MedianPruner', True)
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Mapping

from ..errors import ConfigError, MissingDependencyError, MsbridgeError, exception_text
from ..masking import mask_text
from .spec import Param, SweepSpec

#: Seconds a SQLite storage waits for another process's write before it fails.
SQLITE_WAIT_S = 60
#: Times a storage is opened when another worker was creating its tables meanwhile.
OPEN_TRIES = 3
_SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "grid": "GridSampler", "cmaes": "CmaEsSampler"}
_PRUNERS = {"median": "MedianPruner", "hyperband": "HyperbandPruner",
            "successive_halving": "SuccessiveHalvingPruner", "none": "NopPruner"}


def optuna_module() -> Any:
    """``import optuna``, or ``MissingDependencyError`` naming the ``sweep`` extra."""
    try:
        import optuna
    except ImportError:
        raise MissingDependencyError("msbridge sweep", "optuna", "sweep") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per trial: msbridge says its own
    return optuna


def storage(url: str) -> Any:
    """Optuna's RDB storage at ``url``; a SQLite file's directory is made, and its lock waited for. Workers that
    start at once on a new database race to create Optuna's tables (PostgreSQL: ``type studydirection already
    exists``): the loser opens it again, up to ``OPEN_TRIES`` times."""
    optuna = optuna_module()
    engine: Dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(url[len("sqlite:///"):])) or ".", exist_ok=True)
        engine = {"connect_args": {"timeout": SQLITE_WAIT_S}}
    for attempt in range(1, OPEN_TRIES + 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except Exception as exc:
            if attempt == OPEN_TRIES or "already exists" not in str(exc):
                raise
            time.sleep(attempt)


def _build(kind: str, classes: Mapping[str, str], module: Any, given: Mapping[str, Any], where: str) -> Any:
    arguments = {k: v for k, v in given.items() if k != "type"}
    try:
        return getattr(module, classes[kind])(**arguments)
    except ImportError as exc:  # cmaes: Optuna's CMA-ES sampler needs the cmaes package
        raise MissingDependencyError(f"{where} {kind}", getattr(exc, "name", None) or "cmaes", "") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: Optuna refuses these arguments of {kind}: {exc}") from None


def make_pruner(given: Mapping[str, Any], where: str = "pruner") -> Any:
    """The Optuna pruner ``{type: median, n_warmup_steps: 10}`` names (``none``: Optuna's NopPruner)."""
    return _build(given["type"], _PRUNERS, optuna_module().pruners, given, where)


def make_sampler(spec: SweepSpec, seed_offset: int = 0) -> Any:
    """The Optuna sampler of ``spec``; the grid sampler gets its grid from ``params``. ``seed_offset`` is added to
    its ``seed`` (a ``--join`` worker's own, so two workers never draw the same values)."""
    given = dict(spec.sampler)
    if seed_offset and given.get("seed") is not None:
        given["seed"] = (int(given["seed"]) + seed_offset) % 2 ** 32
    if given["type"] == "grid":
        given["search_space"] = {name: param.grid() for name, param in spec.params.items()}
    if given["type"] == "cmaes":
        import importlib.util

        if importlib.util.find_spec("cmaes") is None:
            raise MissingDependencyError("sampler cmaes", "cmaes", "")
    return _build(given["type"], _SAMPLERS, optuna_module().samplers, given, f"{spec.path}: sampler")


def distribution(param: Param) -> Any:
    """Optuna's distribution of one searched parameter."""
    dists = optuna_module().distributions
    if param.kind == "categorical":
        return dists.CategoricalDistribution(list(param.choices))
    if param.kind == "int":
        return dists.IntDistribution(int(param.low), int(param.high), log=param.log, step=int(param.step or 1))
    return dists.FloatDistribution(float(param.low), float(param.high), log=param.log,
                                   step=None if param.step is None else float(param.step))


def open_study(spec: SweepSpec, seed_offset: int = 0) -> Any:
    """Create the study of ``spec``, or load it when it exists (a rerun resumes it); its direction must match."""
    optuna = optuna_module()
    direction = "minimize" if spec.mode == "min" else "maximize"
    sampler, pruner = make_sampler(spec, seed_offset), make_pruner(spec.pruner, f"{spec.path}: pruner")
    try:
        study = optuna.create_study(storage=storage(spec.storage_url), sampler=sampler, pruner=pruner,
                                    study_name=spec.study, direction=direction, load_if_exists=True)
    except Exception as exc:  # unreachable, refused, no driver, a directory that cannot be made: one line
        key = "storage" if spec.storage else "experiment_dir (where optuna.db goes)"
        raise MsbridgeError(f"{spec.path}: {key}: cannot open the Optuna storage {mask_text(spec.storage_url)}: "
                            f"{mask_text(exception_text(exc))}") from None
    if study.direction.name.lower() != direction:
        raise ConfigError(f"{spec.path}: objective.mode: the study {spec.study!r} in {spec.storage_url} "
                          f"exists with direction {study.direction.name.lower()}; use mode "
                          f"{'min' if study.direction.name.lower() == 'minimize' else 'max'} or a new study name")
    return study
