"""The health checks, one file each, and ``DETECTORS``: the one table the runner and the config read.

Adding a check: a new file here with a ``Detector`` subclass (see ``base``), its
test in ``tests/health/``, one line in ``DETECTORS`` and one row in
``docs/health.md``. Nothing else names a check: the ``health`` section's keys,
options, validation and default actions all come from the class.

Example:
    >>> sorted(DETECTORS)
    ['grad_norm_spike', 'loss_spike', 'nonfinite', 'plateau', 'throughput_drop']
"""
from __future__ import annotations

from typing import Dict, Type

from .base import ANOMALY, RECOVERY, Detector, Finding, Option, StepView
from .grad_norm_spike import GradNormSpike
from .loss_spike import LossSpike
from .nonfinite import NonFinite
from .plateau import Plateau
from .throughput_drop import ThroughputDrop

#: check name -> detector class, in the order they look at a step.
DETECTORS: Dict[str, Type[Detector]] = {
    NonFinite.name: NonFinite,
    GradNormSpike.name: GradNormSpike,
    LossSpike.name: LossSpike,
    Plateau.name: Plateau,
    ThroughputDrop.name: ThroughputDrop,
}

__all__ = ["ANOMALY", "DETECTORS", "RECOVERY", "Detector", "Finding", "GradNormSpike", "LossSpike", "NonFinite",
           "Option", "Plateau", "StepView", "ThroughputDrop"]
