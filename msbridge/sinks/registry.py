"""Sink names -> sink classes: the built-ins plus the ``msbridge.sinks`` entry points.

The one list of sink names. A built-in is one line of ``BUILTINS``, its name and
``module:Class`` as an entry point has them; everything else about it (options,
extra, reader) is declared in its class. Naming, listing and checking the names
imports no adapter module; a sink's module is imported when its class is asked for
(its options checked, or the sink built), and its tracker library only when the
sink is built. ``check_available`` finds a missing optional package at config time
and says which ``pip install`` fixes it.

Example:
    >>> sink_cls = resolve("jsonl")
    >>> sink = sink_cls(fsync=False)
"""
from __future__ import annotations

import importlib
import importlib.util
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Dict, Tuple, Type

from ..errors import ConfigError, MissingDependencyError
from .base import Sink

ENTRY_POINT_GROUP = "msbridge.sinks"

#: The built-in sinks, in the order they are listed: name -> ``module:Class`` (whose ``name`` it is).
BUILTINS: Dict[str, str] = {
    "jsonl": "msbridge.adapters.jsonl_sink:JsonlSink",
    "tensorboard": "msbridge.adapters.tensorboard_sink:TensorBoardSink",
    "mlflow": "msbridge.adapters.mlflow_sink:MlflowSink",
    "mindinsight": "msbridge.adapters.mindinsight_sink:MindInsightSink",
}


@lru_cache(maxsize=None)
def _builtin(name: str) -> Type[Sink]:
    module_name, _, attr = BUILTINS[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _entry_points() -> Dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def builtin_names() -> Tuple[str, ...]:
    """The built-in sinks' names: ``("jsonl", "tensorboard", "mlflow", "mindinsight")``."""
    return tuple(BUILTINS)


def available() -> Tuple[str, ...]:
    """Every sink name that can be configured: built-ins first, then plug-ins."""
    plugins = sorted(n for n in _entry_points() if n not in BUILTINS)
    return builtin_names() + tuple(plugins)


def sink_class(name: str) -> Type[Sink]:
    """The class registered under ``name``, its extra installed or not; ``ConfigError`` for an unknown name."""
    if name in BUILTINS:
        return _builtin(name)
    plugin = _entry_points().get(name)
    if plugin is None:
        raise ConfigError(f"unknown sink {name!r}; registered sinks: {', '.join(available())}")
    return plugin.load()


def check_available(name: str) -> None:
    """Raise ``ConfigError`` for an unknown name, ``MissingDependencyError`` for a missing extra."""
    cls = sink_class(name)
    for module in cls.requires:
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(f"sink {name!r}", module, cls.extra)


def resolve(name: str) -> Type[Sink]:
    """The sink class registered under ``name``, once its packages are known to be installed."""
    check_available(name)
    return sink_class(name)
