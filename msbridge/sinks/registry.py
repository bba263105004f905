"""Sink names -> sink classes: the built-ins plus the ``msbridge.sinks`` entry points.

Built-in adapters are looked up by module path, so naming a sink never imports
its tracker library; ``check_available`` finds a missing optional package at
config time and says which ``pip install`` line fixes it.

Example:
    >>> sink_cls = resolve("jsonl")
    >>> sink = sink_cls(path="metrics")
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Dict, Tuple, Type

from ..errors import ConfigError, MissingDependencyError
from .base import Sink

ENTRY_POINT_GROUP = "msbridge.sinks"


@dataclass(frozen=True)
class BuiltinSink:
    target: str  # "module:Class"
    requires: Tuple[str, ...]  # import names that must be importable
    extra: str  # the msbridge extra that installs them


BUILTINS: Dict[str, BuiltinSink] = {
    "jsonl": BuiltinSink("msbridge.adapters.jsonl_sink:JsonlSink", (), ""),
    "tensorboard": BuiltinSink(
        "msbridge.adapters.tensorboard_sink:TensorBoardSink", ("tensorboardX",), "tensorboard"
    ),
    "mlflow": BuiltinSink("msbridge.adapters.mlflow_sink:MlflowSink", ("mlflow",), "mlflow"),
    "mindinsight": BuiltinSink(
        "msbridge.adapters.mindinsight_sink:MindInsightSink", ("mindspore",), ""
    ),
}


def _entry_points() -> Dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> Tuple[str, ...]:
    """Every sink name that can be configured: built-ins first, then plug-ins."""
    plugins = sorted(n for n in _entry_points() if n not in BUILTINS)
    return tuple(BUILTINS) + tuple(plugins)


def check_available(name: str) -> None:
    """Raise ``ConfigError`` for an unknown name, ``MissingDependencyError`` for a missing extra."""
    if name in BUILTINS:
        spec = BUILTINS[name]
        for module in spec.requires:
            if importlib.util.find_spec(module) is None:
                raise MissingDependencyError(f"sink {name!r}", module, spec.extra)
        return
    if name not in _entry_points():
        raise ConfigError(
            f"unknown sink {name!r}; registered sinks: {', '.join(available())}"
        )


def resolve(name: str) -> Type[Sink]:
    """The sink class registered under ``name``."""
    check_available(name)
    if name in BUILTINS:
        module_name, _, attr = BUILTINS[name].target.partition(":")
        return getattr(importlib.import_module(module_name), attr)
    return _entry_points()[name].load()
