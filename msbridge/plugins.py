"""One rule for every kind of plug-in: sinks (``msbridge.sinks``) and health checks (``msbridge.health``).

- The registered name is the name users write in YAML: the ``register_sink``/``register_detector`` name, which
  for a plug-in must be its entry point's name too (an undecorated class takes the entry point's name).
- A name that two classes claim (a plug-in beside a built-in, two plug-ins) is a ``PluginError`` naming both
  packages; a plug-in claiming a built-in's name is never loaded, and naming that name in YAML is that error.
- A plug-in that does not load (an import error, not a subclass, a clash) is said once, at the first look into
  its registry, and left out; naming it in YAML is an error with the same words.

Example:
    >>> table = {}
    >>> claim(table, "sink", "csv", CsvSink)
    >>> claim(table, "sink", "csv", OtherCsv)
    Traceback (most recent call last):
    msbridge.plugins.PluginError: two sinks are named 'csv': my_pkg.csv_sink.CsvSink (package my-pkg) and ...
"""
from __future__ import annotations

import functools
import logging
import sys
from importlib.metadata import EntryPoint, entry_points, packages_distributions
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from .errors import ConfigError, MsbridgeError

log = logging.getLogger("msbridge")
_SAID: Set[str] = set()  # each broken plug-in is said once per process
_FAILED: Dict[Tuple[str, str, str], str] = {}  # (group, name, entry point) -> why it did not load


class PluginError(MsbridgeError, ImportError):
    """A plug-in that cannot be used under its name: the message names the name, the packages and why. An
    ``ImportError``, as a missing extra is: the config check reports it under the name's key."""


def package_of(cls: Any) -> str:
    """The distribution that installs ``cls``'s module ("my-pkg"), else its top-level module's name."""
    top = getattr(cls, "__module__", "?").split(".")[0]
    names = packages_distributions().get(top) or [top]
    return ", ".join(sorted(set(names)))


def _label(cls: Any) -> str:
    return f"{cls.__module__}.{cls.__qualname__} (package {package_of(cls)})"


def claim(table: Dict[str, Any], kind: str, name: str, cls: Any) -> None:
    """``cls`` is the ``kind`` named ``name`` in ``table``; another class there already is a ``PluginError``."""
    old = table.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise PluginError(f"two {kind}s are named {name!r}: {_label(old)} and {_label(cls)}; "
                          "rename one (its register name and its entry point)")
    table[name] = cls


def builtin(module: str) -> str:
    """How a built-in whose name a plug-in claims is named: "the built-in msbridge.adapters.csv_sink (package
    msbridge)"; ``load_points`` takes these as ``reserved``, for sinks and checks alike."""
    return f"the built-in {module} (package msbridge)"


def group_points(group: str) -> Tuple[EntryPoint, ...]:
    """The entry points of ``group``, read once per ``sys.path``: ``entry_points`` reads every installed
    distribution's metadata (about 9 ms here), and a monitor asks for each of its sinks."""
    return _points(group, tuple(sys.path))


@functools.lru_cache(maxsize=16)
def _points(group: str, path: Tuple[str, ...]) -> Tuple[EntryPoint, ...]:
    return tuple(entry_points(group=group))


def _point_package(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return dist.metadata["Name"] if dist is not None else point.module.split(".")[0]


def broken_text(kind: str, point: EntryPoint, why: str) -> str:
    """How a plug-in that did not load is reported, for every kind alike."""
    return (f"{kind} {point.name!r} (entry point {point.value}) did not load: {why} "
            f"(package {_point_package(point)}); it is not available")


def load_points(group: str, kind: str, base: type, table: Dict[str, Any],
                reserved: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Load every entry point of ``group`` into ``table`` under its name; returns ``{name: why}`` of each that
    did not load (each said once, as an error), so that naming one in YAML says the same. ``reserved``: names
    taken by what is not loaded yet (the built-in sinks), with what takes them."""
    broken: Dict[str, str] = {}
    by_name: Dict[str, List[EntryPoint]] = {}
    for point in group_points(group):
        by_name.setdefault(point.name, []).append(point)
    for name, points in sorted(by_name.items()):
        packages = sorted({_point_package(p) for p in points})
        if len(packages) > 1:
            broken[name] = (f"two {kind}s are named {name!r}: the entry points of the packages "
                            f"{' and '.join(packages)}; uninstall or rename one")
            continue
        point = points[0]
        if name in table and table[name].__module__ == point.module:
            continue  # loaded at an earlier look
        if name in (reserved or {}):
            broken[name] = (f"two {kind}s are named {name!r}: {reserved[name]} and the entry point {point.value} "
                            f"(package {_point_package(point)}); rename the plug-in's")
            continue
        key = (group, point.name, point.value)
        if key in _FAILED:  # a second load would find a half-registered module: the first answer stands
            broken[name] = _FAILED[key]
            continue
        try:
            _load_one(point, kind, base, table)
        except Exception as exc:  # a broken plug-in never stops msbridge: said, left out
            why = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
            broken[name] = _FAILED[key] = broken_text(kind, point, why)
    for why in broken.values():
        if why not in _SAID:
            _SAID.add(why)
            log.error("msbridge: %s", why)
    return broken


def _load_one(point: EntryPoint, kind: str, base: type, table: Dict[str, Any]) -> None:
    before = dict(table)
    cls = point.load()  # a decorated class registers itself here, under its decorator's name
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"{cls!r} is not a {base.__name__} subclass")
    other = [n for n, c in table.items() if c is cls and n != point.name and n not in before]
    if other:
        table.pop(other[0])
        raise PluginError(f"its class registers itself as {other[0]!r}: the entry point's name and the register "
                          "name must be the same (the name users write in YAML)")
    claim(before, kind, point.name, cls)
    cls.name = point.name  # an undecorated class takes the entry point's name
    table[point.name] = cls


def unavailable(kind: str, name: str, broken: Dict[str, str], known: Tuple[str, ...]) -> MsbridgeError:
    """The error for a name in YAML that is not available: its load failure (``PluginError``), else
    ``ConfigError`` with the names there are."""
    if name in broken:
        return PluginError(broken[name])
    return ConfigError(f"unknown {kind} {name!r}; registered {kind}s: {', '.join(known)}")
