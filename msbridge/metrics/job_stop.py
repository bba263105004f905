"""One stop for all ranks: a health stop on any rank, agreed in the per-flush collective.

A rank whose health check decided to stop (``stop`` or ``checkpoint_and_stop``,
or an early stop such as ``plateau``) says so in its payload: a stop code, the
check and the step it fired on. Every rank reads the same gathered table, so
every rank takes the same decision without another collective: the job stops
after this window's last step, on every rank, with the status of the chosen
stop. The chosen one is the first failing stop (by step, then rank); an early
stop (FINISHED) only when no rank failed. Every rank records a ``job_stop``
event naming the rank and the check that caused it.

Example:
    >>> agreed = agree_stop(table)                     # on every rank, from the same table
    >>> agreed.rank, agreed.check, agreed.status
    (1, 'nonfinite', 'FAILED')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..health.runner import Stop, make_event
from ..sinks.base import FAILED, FINISHED, Event
from .payload import NO_STOP, STOP_CHECK, STOP_CODE, STOP_FAILED, STOP_FINISHED, STOP_STEP, check_name, unpack_step

JOB_STOP = "job_stop"


@dataclass(frozen=True)
class JobStop:
    """The stop every rank takes: caused by ``check`` on ``rank`` at ``step``; the run closes ``status``.

    Example:
        >>> JobStop(rank=1, check="nonfinite", step=20, status="FAILED")
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


def stop_event(agreed: JobStop, last_step: int, rank: int, ranks_stopping: int) -> Event:
    """The ``job_stop`` event this rank records: which rank and check stopped the job, and where."""
    return make_event(JOB_STOP, last_step, rank, cause_rank=agreed.rank, check=agreed.check,
                      finding_step=agreed.step, last_step=last_step, status=agreed.status,
                      ranks_stopping=ranks_stopping)


def ranks_stopping(table: np.ndarray) -> int:
    """How many ranks asked to stop in this window."""
    codes = table[:, STOP_CODE]
    return int(np.sum(np.isfinite(codes) & (codes != NO_STOP)))
