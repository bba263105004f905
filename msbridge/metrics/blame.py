"""First-anomaly blame: which rank, at which step, went wrong first.

Each rank's health checks look at its own loss and grad norm (and any metric a
check reads) before the per-flush collective; each rank's first finding of
the window (check, step) rides in its payload. On the global rank ``Blame``
turns those into incidents: a finding with no other finding on any rank within
``quiet_steps`` before it opens an incident, and one ``blame`` event names the
first rank and step (ties at the same step list every rank there). Findings of
the incident that follow (the NaN that the gradient AllReduce spread to every
rank one step later) add no event; those in the same window are listed in it.

Only the checks enabled in ``health`` find anything (``nonfinite`` is on in every
profile); a rank's grad norm is usually the reduced one, the same on every
rank, so a grad-norm finding tends to land on every rank at once.

Example:
    >>> blame = Blame(quiet_steps=5)
    >>> [e.detail["blamed_rank"] for e in blame.observe(table, losses, group=[0, 1, 2, 3], steps=steps, rank=0)]
    [1]
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..health.runner import make_event
from ..sinks.base import Event
from .payload import ANOMALY_CHECK, ANOMALY_STEP, check_name, unpack_step

BLAME = "blame"


def first_anomaly(events: Sequence[Event]) -> Optional[Event]:
    """This rank's first ``anomaly`` event of a window (what its payload carries), or None."""
    anomalies = [e for e in events if e.kind == "anomaly"]
    return min(anomalies, key=lambda e: e.step) if anomalies else None


class Blame:
    """On the global rank: one ``blame`` event per anomaly incident, naming the first rank and step.

    Args:
        quiet_steps: a finding this many steps or fewer after the incident's last one belongs to it.

    Example:
        >>> Blame(quiet_steps=5).observe(table, losses, group=[0, 1], steps=np.arange(16, 21), rank=0)
        [Event(kind='blame', step=20, rank=0, detail={'blamed_rank': 1, 'check': 'nonfinite', ...})]
    """

    def __init__(self, quiet_steps: int) -> None:
        self.quiet_steps = int(quiet_steps)
        self._last: Optional[int] = None  # the last finding of the open incident

    def observe(self, table: np.ndarray, losses: np.ndarray, group: Sequence[int], steps: np.ndarray,
                rank: int) -> List[Event]:
        """``table``: the gathered payloads; ``losses``: ``[len(group), len(steps)]`` of the window."""
        found = np.flatnonzero(np.isfinite(table[:, ANOMALY_CHECK]))
        if not len(found):
            return []
        at = unpack_step(table, ANOMALY_STEP)
        order = sorted(found, key=lambda r: (int(at[r]), int(r)))
        incidents: List[Dict[str, Any]] = []
        for r in order:
            step, check = int(at[r]), check_name(table[r, ANOMALY_CHECK])
            if self._last is not None and step - self._last <= self.quiet_steps:
                self._last = max(self._last, step)
                if incidents and step != incidents[-1]["first_step"]:  # same-step ranks are listed already
                    incidents[-1]["then"].append({"rank": int(r), "step": step, "check": check})
                continue
            incident: Dict[str, Any] = {"blamed_rank": int(r), "check": check, "first_step": step,
                                        "same_step_ranks": [int(q) for q in order if int(at[q]) == step],
                                        "then": []}
            loss = _loss_at(losses, group, steps, int(r), step)
            if loss is not None:
                incident["loss"] = loss
            incidents.append(incident)
            self._last = step
        return [make_event(BLAME, i["first_step"], rank, **i) for i in incidents]


def _loss_at(losses: np.ndarray, group: Sequence[int], steps: np.ndarray, rank: int,
             step: int) -> Union[float, str, None]:
    """The gathered loss of ``rank`` at ``step`` ("nan"/"inf" when not finite; None when the rank is
    outside the group or the step outside the window)."""
    if rank not in group or step not in steps:
        return None
    value = float(losses[list(group).index(rank), int(np.flatnonzero(steps == step)[0])])
    return value if math.isfinite(value) else repr(value)
