"""The health checks, one file each, and ``DETECTORS``: the one table the runner and the config read.

A check registers itself: a file in this folder whose ``Detector`` subclass is decorated with
``@register_detector("name")`` (see ``base``) is imported here, every file of the folder in name order; a check
of another package registers under the ``msbridge.health`` entry-point group
(``loss_ceiling = "my_pkg.loss_ceiling:LossCeiling"``). Nothing else names a check: the ``health`` section's
keys, options, validation and default actions all come from the class.

Example:
    >>> list(DETECTORS)[:2]
    ['nonfinite', 'eval_plateau']
"""
from __future__ import annotations

import importlib
import logging
import pkgutil
from importlib.metadata import entry_points

from .base import ANOMALY, DETECTORS, RECOVERY, Detector, Finding, Option, StepView, register_detector

log = logging.getLogger("msbridge")

ENTRY_POINT_GROUP = "msbridge.health"


def _load_builtins() -> None:
    """Import every check file of this folder: each registers its check."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
        importlib.import_module(f"{__name__}.{module}")


def _load_plugins() -> None:
    """Register each ``msbridge.health`` entry point; one that fails to load is said once and left out."""
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            register_detector(point.name)(point.load())  # a decorated class registered itself on import too
        except Exception as exc:  # a broken plug-in never stops import msbridge
            log.error("msbridge: health check %r (entry point %s) did not load: %s: %s; it is not available",
                      point.name, point.value, type(exc).__name__, exc)


_load_builtins()
_load_plugins()

__all__ = ["ANOMALY", "DETECTORS", "ENTRY_POINT_GROUP", "RECOVERY", "Detector", "Finding", "Option", "StepView",
           "register_detector"]
