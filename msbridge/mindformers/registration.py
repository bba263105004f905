"""Finding mindformers and registering ``MSBridgeMonitor`` with its callback registry, once.

mindformers' registry is a process-wide dict in which a second class under a
taken name silently replaces the first. So ``register``:

- is idempotent: the same class again (a second import, a notebook cell run
  again, the ``auto_register`` path importing this module under another name)
  changes nothing; a reloaded ``msbridge.mindformers`` replaces its own older
  class only;
- never takes a name that belongs to another class (a mindformers built-in or
  a user's own): it raises instead of shadowing it;
- registers a CALLBACK (``MSBridgeMonitor``) and a WRAPPER (``MSBridgeRing``)
  only. Nothing goes into a model/config registry, so the tutorials' error
  ``"X" is already used by a transformers config`` cannot arise.

Example:
    >>> from msbridge.mindformers.registration import register
    >>> register(MSBridgeMonitor)   # a second call is a no-op
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Tuple

from ..errors import MissingDependencyError, MsbridgeError

#: The mindformers releases msbridge is tested against: CI runs 1.9.0 (the default install) and 1.6.0
#: (the oldest); 1.7.0 and 1.8.0 passed the same tests by hand. 2.0.0 does not install from PyPI.
#: docs/compatibility.md has the table.
TESTED_VERSIONS: Tuple[str, ...] = ("1.6.0", "1.7.0", "1.8.0", "1.9.0")

#: A directory for mindformers' ``auto_register``: ``export REGISTER_PATH=<this>`` and write
#: ``auto_register: msbridge_monitor.MSBridgeMonitor`` in the callback entry.
REGISTER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "register_path")


def require_mindformers() -> Any:
    """Import mindformers, or raise ``MissingDependencyError`` with the install line.

    Warns (``UserWarning``) when the installed version is not one msbridge was tested with.
    """
    try:
        import mindformers
    except ImportError as exc:
        if exc.name not in (None, "mindformers") and not str(exc.name).startswith("mindformers."):
            raise  # mindformers is there but one of its own imports failed: show that error as it is
        raise MissingDependencyError("msbridge.mindformers", "mindformers", "mindformers") from None
    version = getattr(mindformers, "__version__", "unknown")
    if version not in TESTED_VERSIONS:
        warnings.warn(f"msbridge.mindformers is tested with mindformers {', '.join(TESTED_VERSIONS)}; "
                      f"mindformers {version} is installed. Callback parameters and train-cell outputs "
                      "may differ: check the first steps' records.", UserWarning, stacklevel=3)
    return mindformers


def _same_class(a: type, b: type) -> bool:
    """The same class, or the same definition loaded again (``importlib.reload``, a notebook)."""
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register(cls: type, name: str = "", kind: str = "callback") -> None:
    """Register ``cls`` in mindformers' ``kind`` registry (``callback`` or ``wrapper``) under ``name``
    (default: its class name).

    Raises:
        MsbridgeError: the name belongs to a different class already.
    """
    from mindformers.tools.register import MindFormerRegister

    name = name or cls.__name__
    taken = MindFormerRegister.registry.get(kind, {}).get(name)
    if taken is cls:
        return
    if taken is not None and not _same_class(taken, cls):
        raise MsbridgeError(f"mindformers already has a {kind} named {name!r} ({taken.__module__}."
                            f"{taken.__qualname__}); msbridge will not replace it. Register msbridge's "
                            f"monitor under another name: register(MSBridgeMonitor, name='MyBridgeMonitor')")
    MindFormerRegister.register_cls(cls, module_type=kind, alias=name)
