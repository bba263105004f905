"""Sink names -> sink classes: the built-ins plus the ``msbridge.sinks`` entry points.

The one list of sink names. A built-in is one line of ``BUILTINS`` (``module:Class``);
everything else about it (name, options, extra, reader) is declared in its class.
Adapter modules import their tracker library only when a sink is built, so
looking a sink up never imports mlflow or tensorboardX; ``check_available`` finds
a missing optional package at config time and says which ``pip install`` fixes it.

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

#: The built-in sinks, in the order they are listed.
BUILTINS: Tuple[str, ...] = (
    "msbridge.adapters.jsonl_sink:JsonlSink",
    "msbridge.adapters.tensorboard_sink:TensorBoardSink",
    "msbridge.adapters.mlflow_sink:MlflowSink",
    "msbridge.adapters.mindinsight_sink:MindInsightSink",
)


@lru_cache(maxsize=None)
def _builtins() -> Dict[str, Type[Sink]]:
    classes = {}
    for target in BUILTINS:
        module_name, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
        classes[cls.name] = cls
    return classes


def _entry_points() -> Dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def builtin_names() -> Tuple[str, ...]:
    """The built-in sinks' names: ``("jsonl", "tensorboard", "mlflow", "mindinsight")``."""
    return tuple(_builtins())


def available() -> Tuple[str, ...]:
    """Every sink name that can be configured: built-ins first, then plug-ins."""
    plugins = sorted(n for n in _entry_points() if n not in _builtins())
    return builtin_names() + tuple(plugins)


def sink_class(name: str) -> Type[Sink]:
    """The class registered under ``name``, its extra installed or not; ``ConfigError`` for an unknown name."""
    if name in _builtins():
        return _builtins()[name]
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
