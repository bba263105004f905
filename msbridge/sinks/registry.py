"""Sink names -> sink classes: a sink registers itself, with ``@register_sink("name")``.

A built-in sink is the file ``adapters/<name>_sink.py`` (installed as ``msbridge.adapters``) whose class is
decorated with ``@register_sink("<name>")``: its name is known from the file name, so naming, listing and
checking the names imports no adapter module. A sink's module is imported when its class is asked for (its
options checked, or the sink built), and its tracker library only when the sink is built. A sink of another
package registers under the ``msbridge.sinks`` entry-point group (``csv = "my_pkg.csv_sink:CsvSink"``) and is
then named like a built-in; a class decorated in a module already imported is found too. The rule is the health
checks' too (``msbridge.plugins``): the registered name is the YAML name (a plug-in's entry point has the same
name), a clash names both packages, and a plug-in that does not load is said once and left out.
``check_available`` finds a missing optional package at config time and says which ``pip install`` fixes it.

Example:
    >>> @register_sink("print")
    ... class PrintSink(Sink):
    ...     def write(self, records, events):
    ...         print([r.step for r in records])
    >>> sink_class("print") is PrintSink
    True
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Any, Callable, Dict, Mapping, Tuple, Type, TypeVar

from ..errors import MissingDependencyError
from ..options import Option
from ..plugins import builtin, claim, group_points, load_points, unavailable
from .base import WAL_NAME, Sink

ENTRY_POINT_GROUP = "msbridge.sinks"
#: The package of the built-in sinks: its module ``<name>_sink`` registers the sink ``<name>``.
BUILTIN_PACKAGE = "msbridge.adapters"
_SUFFIX = "_sink"

#: The option every sink but jsonl takes, read by msbridge, never by the sink: what a fault found before training
#: (a store this tracker cannot use, a missing extra, a bad option) does. "fail": training does not start; "warn":
#: training starts without that sink, said in one line (jsonl, always on, records every step).
ON_FAULT = "on_fault"
ON_FAULT_OPTION = Option(str, "fail", "a fault found before training: fail (training does not start) or warn (the "
                                      "sink is off for the run, said in one line)", choices=("fail", "warn"))

#: What a "warn" sink that cannot work is said to be, by the config check; the run leaves such a sink out.
OFF_FOR_RUN = "off for this run (on_fault: warn)"

_REGISTERED: Dict[str, Type[Sink]] = {}
S = TypeVar("S", bound=Type[Sink])


def register_sink(name: str) -> Callable[[S], S]:
    """Class decorator: the sink ``name`` (what users write under ``sinks:``) is this class.

    Example:
        >>> @register_sink("csv")
        ... class CsvSink(Sink): ...
        >>> CsvSink.name
        'csv'
    """

    def register(cls: S) -> S:
        claim(_REGISTERED, "sink", name, cls)  # another class of that name: PluginError naming both packages
        cls.name = name
        return cls

    return register


def builtin_names() -> Tuple[str, ...]:
    """The built-in sinks' names, jsonl first: ``("jsonl", "mindinsight", "mlflow", "tensorboard")``."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    names = [m.name[:-len(_SUFFIX)] for m in pkgutil.iter_modules(folders)
             if m.name.endswith(_SUFFIX) and not m.name.startswith("_")]
    return tuple(sorted(names, key=lambda n: (n != WAL_NAME, n)))


def unloadable() -> Dict[str, str]:
    """Load the ``msbridge.sinks`` entry points not loaded yet (``plugins.load_points``); ``{name: why}`` of
    the broken ones (each said once)."""
    reserved = {name: builtin(f"{BUILTIN_PACKAGE}.{name}{_SUFFIX}") for name in builtin_names()}
    return load_points(ENTRY_POINT_GROUP, "sink", Sink, _REGISTERED, reserved)


def names() -> Tuple[str, ...]:
    """Every sink name registered, loading no plug-in (for a command line's choices): built-ins first, then
    the entry points' names and in-process registrations."""
    builtins = builtin_names()
    plugins = {point.name for point in group_points(ENTRY_POINT_GROUP)}
    return builtins + tuple(sorted((plugins | set(_REGISTERED)) - set(builtins)))


def available() -> Tuple[str, ...]:
    """Every sink name that can be configured: built-ins first, then plug-ins and in-process registrations."""
    builtins = builtin_names()
    unloadable()
    return builtins + tuple(sorted(set(_REGISTERED) - set(builtins)))


def sink_class(name: str) -> Type[Sink]:
    """The class registered under ``name``, its extra installed or not; ``ConfigError`` for an unknown name
    or a plug-in that did not load (with why)."""
    broken = unloadable()
    if name in broken:  # a plug-in that did not load, or that claims another's name
        raise unavailable("sink", name, broken, ())
    if name not in _REGISTERED and name in builtin_names():
        importlib.import_module(f"{BUILTIN_PACKAGE}.{name}{_SUFFIX}")  # its decorator registers it
    if name in _REGISTERED:
        return _REGISTERED[name]
    raise unavailable("sink", name, broken, available())


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


def store_defaults(experiment_dir: str) -> Dict[str, Dict[str, str]]:
    """Where each built-in sink with a shared store writes by default (its ``default_store``).

    Example:
        >>> store_defaults("/runs/exp")["tensorboard"]
        {'logdir': '/runs/exp/tensorboard'}
    """
    classes = {name: sink_class(name) for name in builtin_names()}
    return {name: cls.store_default(experiment_dir) for name, cls in classes.items() if cls.default_store}


def fault_policy(options: Any) -> str:
    """A sink's ``on_fault`` ("fail" unless its options say "warn")."""
    return "warn" if isinstance(options, Mapping) and options.get(ON_FAULT) == "warn" else "fail"


def with_store_defaults(name: str, options: Mapping[str, Any], experiment_dir: str) -> Dict[str, Any]:
    """Sink ``name``'s options, as its class takes them (``on_fault`` left out), with its store placed in
    ``experiment_dir`` unless the options place it."""
    out = {key: value for key, value in options.items() if key != ON_FAULT}
    for key, value in sink_class(name).store_default(experiment_dir).items():
        if not out.get(key):
            out[key] = value
    return out
