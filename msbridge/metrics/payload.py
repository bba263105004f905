"""The one vector each rank sends in the per-flush AllGather, and the table every rank gets back.

Every rank sends the same shape, ``HEADER + capacity`` float32 values::

    [n, batch_size, first_step (2), last_step (2),            what the window is
     stop_code, stop_check, stop_step (2),                    this rank's health stop, if any
     anomaly_check, anomaly_step (2),                         its first health finding in the window
     step_ms, run_ms, data_wait_ms, data_wait_max_ms, callback_ms,   its host timing
     loss_1 ... loss_n, NaN ...]

A step travels as two floats (``hi * 2**20 + lo``), both exact in float32 below
2**44 steps. A check travels as its index in ``health.detectors.DETECTORS``
(the same table on every rank); NaN means none.

Example:
    >>> row = pack(Slots(n=2, batch=8, first=11, last=12), losses=[2.3, 2.2], capacity=4)
    >>> unpack_step(row, FIRST), check_name(row[STOP_CHECK])
    (11, None)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..health.detectors import DETECTORS

_SPLIT = float(1 << 20)
CHECKS = tuple(DETECTORS)

# Header slots (a step takes two).
N, BATCH, FIRST, LAST = 0, 1, 2, 4
STOP_CODE, STOP_CHECK, STOP_STEP = 6, 7, 8
ANOMALY_CHECK, ANOMALY_STEP = 10, 11
TIMING = 13  # step_ms, run_ms, data_wait_ms, data_wait_max_ms, callback_ms
TIMING_FIELDS = ("step_ms", "run_ms", "data_wait_ms", "data_wait_max_ms", "callback_ms")
HEADER = TIMING + len(TIMING_FIELDS)
#: The slots that must agree between ranks for their losses to be compared step by step.
WINDOW_SLOTS = [N, FIRST, FIRST + 1, LAST, LAST + 1]

#: ``stop_code``: no stop, a stop that fails the run, an early stop (the run FINISHED).
NO_STOP, STOP_FAILED, STOP_FINISHED = 0.0, 1.0, 2.0


@dataclass
class Slots:
    """One rank's header, as Python values (None: not set).

    Example:
        >>> slots = Slots(n=5, batch=8, first=16, last=20, stop_code=STOP_FAILED, stop_check="nonfinite", stop_step=20)
        >>> slots.stop_code == STOP_FAILED, slots.anomaly_check, len(slots.timing)
        (True, None, 5)
    """

    n: int
    batch: int
    first: int
    last: int
    stop_code: float = NO_STOP
    stop_check: Optional[str] = None
    stop_step: int = 0
    anomaly_check: Optional[str] = None
    anomaly_step: int = 0
    timing: Sequence[float] = field(default_factory=lambda: [math.nan] * len(TIMING_FIELDS))


def _put_step(row: np.ndarray, slot: int, step: int) -> None:
    row[slot], row[slot + 1] = step // _SPLIT, step % _SPLIT


def unpack_step(row: np.ndarray, slot: int) -> int:
    """The step stored at ``slot`` of one row (or a column of rows, as an int array)."""
    value = row[..., slot].astype(np.float64) * _SPLIT + row[..., slot + 1]
    return int(value) if np.ndim(value) == 0 else value.astype(np.int64)


def check_index(name: Optional[str]) -> float:
    """A check's slot value: its index in ``DETECTORS``, NaN for none (or a check no rank knows)."""
    return float(CHECKS.index(name)) if name in CHECKS else math.nan


def check_name(value: float) -> Optional[str]:
    """The check a slot value names, or None."""
    return CHECKS[int(value)] if math.isfinite(value) and 0 <= int(value) < len(CHECKS) else None


def pack(slots: Slots, losses: Sequence[float], capacity: int) -> np.ndarray:
    """One rank's vector: the header, then ``losses`` padded with NaN to ``capacity``."""
    row = np.full(HEADER + capacity, np.nan, dtype=np.float32)
    row[N], row[BATCH] = slots.n, slots.batch
    _put_step(row, FIRST, slots.first)
    _put_step(row, LAST, slots.last)
    row[STOP_CODE], row[STOP_CHECK] = slots.stop_code, check_index(slots.stop_check)
    _put_step(row, STOP_STEP, slots.stop_step)
    row[ANOMALY_CHECK] = check_index(slots.anomaly_check)
    _put_step(row, ANOMALY_STEP, slots.anomaly_step)
    row[TIMING:HEADER] = slots.timing
    row[HEADER:HEADER + len(losses)] = losses
    return row
