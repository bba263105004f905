"""The ranks' health, agreed in the per-flush collective: one stop for all ranks, and who went wrong first.

Each rank's health checks look at its own steps before the collective; its
payload carries its health stop (a stop code, the check, the step it fired on)
and its first finding of the window (check, step).

**One stop for all ranks** (``agree_stop``, on every rank). Every rank reads
the same gathered table, so every rank takes the same decision without another
collective: the job stops after this window's last step, on every rank, with
the status of the chosen stop. The chosen one is the first failing stop (by
step, then rank); an early stop (FINISHED) only when no rank failed. Every rank
records a ``job_stop`` event naming the rank and the check that caused it.

**First-anomaly blame** (``Blame``, on the global rank). A finding with no
other finding on any rank within ``quiet_steps`` before it opens an incident,
and one ``blame`` event names the first rank and step (ties at the same step
list every rank there). Findings of the incident that follow (the NaN the
gradient AllReduce spread to every rank one step later) add no event; those in
the same window are listed in it. Only the checks enabled in ``health`` find
anything (``nonfinite`` is on in every profile); a rank's grad norm is usually
the reduced one, the same on every rank, so a grad-norm finding tends to land
on every rank at once.

Example:
    >>> agreed = agree_stop(table)                     # on every rank, from the same table
    >>> agreed.rank, agreed.check, agreed.status
    (1, 'nonfinite', 'FAILED')
    >>> [e.detail["blamed_rank"] for e in Blame(quiet_steps=5).observe(table, losses, [0, 1, 2, 3], steps, rank=0)]
    [1]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..health.detectors import ANOMALY
from ..health.runner import Stop, make_event
from ..sinks.base import FAILED, FINISHED, Event
from .payload import (
    ANOMALY_CHECK,
    ANOMALY_STEP,
    NO_STOP,
    STOP_CHECK,
    STOP_CODE,
    STOP_FAILED,
    STOP_FINISHED,
    STOP_STEP,
    check_name,
    unpack_step,
)

JOB_STOP = "job_stop"


@dataclass(frozen=True)
class JobStop:
    """The stop every rank takes: caused by ``check`` on ``rank`` at ``step``; the run closes ``status``.

    Example:
        >>> JobStop(rank=1, check="nonfinite", step=20, status="FAILED")
        JobStop(rank=1, check='nonfinite', step=20, status='FAILED')
    """

    rank: int
    check: Optional[str]
    step: int
    status: str


def stop_code(stop: Optional[Stop]) -> float:
    """This rank's ``stop_code`` slot for its health stop (or none)."""
    if stop is None:
        return NO_STOP
    return STOP_FAILED if stop.status == FAILED else STOP_FINISHED


def agree_stop(table: np.ndarray) -> Optional[JobStop]:
    """The stop every rank takes after this window, from the gathered table, or None."""
    codes = table[:, STOP_CODE]
    stopping = np.flatnonzero(np.isfinite(codes) & (codes != NO_STOP))
    if not len(stopping):
        return None
    steps = unpack_step(table, STOP_STEP)
    rank = min(stopping, key=lambda r: (codes[r] != STOP_FAILED, int(steps[r]), int(r)))
    return JobStop(int(rank), check_name(float(table[rank, STOP_CHECK])), int(steps[rank]),
                   FAILED if codes[rank] == STOP_FAILED else FINISHED)


def health_stop(agreed: JobStop, local: Optional[Stop], rank: int) -> Stop:
    """What this rank's ``Health.stop`` becomes: its own when it is the cause, else the agreed one."""
    if local is not None and agreed.rank == rank:
        return local
    return Stop(agreed.step, agreed.check or "unknown", agreed.status,
                f"{agreed.check} on rank {agreed.rank} at step {agreed.step} stopped every rank")


def stop_event(agreed: JobStop, last_step: int, rank: int, stopping: int) -> Event:
    """The ``job_stop`` event this rank records: which rank and check stopped the job, and where."""
    return make_event(JOB_STOP, last_step, rank, cause_rank=agreed.rank, check=agreed.check,
                      finding_step=agreed.step, last_step=last_step, status=agreed.status,
                      ranks_stopping=stopping)


def ranks_stopping(table: np.ndarray) -> int:
    """How many ranks asked to stop in this window."""
    codes = table[:, STOP_CODE]
    return int(np.sum(np.isfinite(codes) & (codes != NO_STOP)))


# -- first-anomaly blame ----------------------------------------------------------------------------------------
BLAME = "blame"


def first_anomaly(events: Sequence[Event]) -> Optional[Event]:
    """This rank's first ``anomaly`` event of a window (what its payload carries), or None."""
    anomalies = [e for e in events if e.kind == ANOMALY]
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
