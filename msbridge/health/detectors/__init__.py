"""The health checks, one file each, and ``DETECTORS``: the one table the runner and the config read.

A check registers itself: a file in this folder whose ``Detector`` subclass is decorated with
``@register_detector("name")`` (see ``base``) is imported here, every file of the folder in name order; a check
of another package registers under the ``msbridge.health`` entry-point group
(``loss_ceiling = "my_pkg.loss_ceiling:LossCeiling"``), by the sinks' rule (``msbridge.plugins``): the entry
point's name is the check's, a clash names both packages (a plug-in named like a built-in check is not loaded,
and naming it in YAML is that error), one that does not load is said and left out. Nothing else names a check:
the ``health`` section's keys, options, validation and default actions all come from the class.

Example:
    >>> list(DETECTORS)[:2]
    ['nonfinite', 'eval_plateau']
"""
from __future__ import annotations

import importlib
import pkgutil

from ...plugins import builtin, load_points
from .base import ANOMALY, DETECTORS, RECOVERY, Detector, Finding, Option, StepView, register_detector, reorder

ENTRY_POINT_GROUP = "msbridge.health"


def _load_builtins() -> None:
    """Import every check file of this folder: each registers its check."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
        importlib.import_module(f"{__name__}.{module}")


_load_builtins()
#: The ``msbridge.health`` plug-ins that did not load, ``{name: why}`` (``msbridge.plugins``: the sinks' rule).
BROKEN = load_points(ENTRY_POINT_GROUP, "health check", Detector, DETECTORS,
                     reserved={name: builtin(cls.__module__) for name, cls in DETECTORS.items()})
reorder()

__all__ = ["ANOMALY", "BROKEN", "DETECTORS", "ENTRY_POINT_GROUP", "RECOVERY", "Detector", "Finding", "Option", "StepView",
           "register_detector"]
