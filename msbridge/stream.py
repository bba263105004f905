"""Turns one flushed window of steps into ``Record`` objects with the canonical metric names.

The window arrives as numpy arrays (one device->host copy per flush happened
before). Stream adds throughput, the smoothed loss and, on the global rank,
the global metrics; it keeps the small state that spans windows (EMA).

Metric names, the same in every sink:

    train/loss  train/loss_ema  train/grad_norm  train/lr  train/loss_scale
    train/overflow  train/epoch
    perf/step_time_ms  perf/samples_per_s  perf/tokens_per_s  perf/monitor_overhead
    global (rank 0 only): train/global_loss  dist/loss_min  dist/loss_max
    dist/loss_std  dist/outlier_rank  dist/loss/rank_{r}

Example:
    >>> stream = Stream(rank=0, batch_size=8, seq_length=32, is_global=True)
    >>> records = stream.records(window)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from .sink import Record

LOSS = "train/loss"
GLOBAL_LOSS = "train/global_loss"
LOSS_EMA = "train/loss_ema"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
LOSS_SCALE = "train/loss_scale"
OVERFLOW = "train/overflow"
EPOCH = "train/epoch"
STEP_TIME = "perf/step_time_ms"
SAMPLES_PER_S = "perf/samples_per_s"
TOKENS_PER_S = "perf/tokens_per_s"
MONITOR_OVERHEAD = "perf/monitor_overhead"

# Cross-rank metrics, written by the global rank only.
DIST_PREFIX = "dist/"
LOSS_MIN = "dist/loss_min"
LOSS_MAX = "dist/loss_max"
LOSS_STD = "dist/loss_std"
OUTLIER_RANK = "dist/outlier_rank"


def rank_loss(rank: int) -> str:
    """Name of one rank's local loss as the global rank logs it, so the curves overlay."""
    return f"dist/loss/rank_{rank}"


def is_global_metric(name: str) -> bool:
    """True for metrics about the whole job (global loss, cross-rank spread), False for one rank's own."""
    return name == GLOBAL_LOSS or name.startswith(DIST_PREFIX)


#: The canonical per-step scalars a train step may hand over, in ring-buffer column order.
STEP_SCALARS = (LOSS, GRAD_NORM, LR, LOSS_SCALE, OVERFLOW)


@dataclass
class Window:
    """The steps between two flushes, as host arrays of equal length.

    ``scalars`` maps a name from ``STEP_SCALARS`` to one float per step;
    ``step_time_s`` is the host-measured wall time of each step and
    ``monitor_s`` the monitor's own host time in that step. ``at_flush`` holds
    state read once at the flush (a live Parameter, such as the loss scale
    mindformers' train cells return): it is recorded on the window's last step.
    """

    steps: np.ndarray
    epochs: np.ndarray
    wall_time: np.ndarray
    step_time_s: np.ndarray
    monitor_s: np.ndarray
    scalars: Dict[str, np.ndarray] = field(default_factory=dict)
    global_scalars: Dict[str, np.ndarray] = field(default_factory=dict)
    at_flush: Dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.steps)


class Stream:
    """Builds this rank's records from windows.

    Args:
        rank: this process's rank.
        batch_size: samples per step on this rank (for samples/s).
        seq_length: tokens per sample, when known (for tokens/s).
        is_global: add the global metrics the window carries (rank 0).
        ema_decay: smoothing of ``train/loss_ema``.
        switches: metric switches from the config; a False one is left out.
    """

    def __init__(self, rank: int, batch_size: Optional[int], seq_length: Optional[int] = None,
                 is_global: bool = True, ema_decay: float = 0.9,
                 switches: Optional[Dict[str, bool]] = None) -> None:
        self.rank = rank
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_global = is_global
        self.ema_decay = ema_decay
        self.switches = switches or {}
        self.ema: Optional[float] = None

    def _on(self, switch: str) -> bool:
        return self.switches.get(switch, True)

    def records(self, window: Window) -> List[Record]:
        columns: Dict[str, np.ndarray] = {}
        loss = window.scalars.get(LOSS)
        if loss is not None and self._on("local_loss"):
            columns[LOSS] = loss
            columns[LOSS_EMA] = self._smooth(loss)
        if self._on("grad_norm") and GRAD_NORM in window.scalars:
            columns[GRAD_NORM] = window.scalars[GRAD_NORM]
        if self._on("learning_rate") and LR in window.scalars:
            columns[LR] = window.scalars[LR]
        for name in (LOSS_SCALE, OVERFLOW):
            if name in window.scalars:
                columns[name] = window.scalars[name]
        if self.is_global and self._on("global_loss"):
            columns.update(window.global_scalars)
        columns[EPOCH] = window.epochs.astype(np.float64)
        if self._on("throughput"):
            step_s = np.maximum(window.step_time_s, 1e-9)
            columns[STEP_TIME] = window.step_time_s * 1e3
            if self.batch_size:
                samples = self.batch_size / step_s
                columns[SAMPLES_PER_S] = samples
                if self.seq_length:
                    columns[TOKENS_PER_S] = samples * self.seq_length
            columns[MONITOR_OVERHEAD] = window.monitor_s / step_s
        now = time.time()
        names = list(columns)
        matrix = np.stack([np.asarray(columns[n], dtype=np.float64) for n in names], axis=1).tolist()
        records = [
            Record(step=int(step), rank=self.rank, time=float(wall) if wall else now,
                   values=dict(zip(names, row)))
            for step, wall, row in zip(window.steps.tolist(), window.wall_time.tolist(), matrix)
        ]
        if records and window.at_flush:
            records[-1].values.update(window.at_flush)
        return records

    def _smooth(self, loss: np.ndarray) -> np.ndarray:
        """Exponential moving average that skips non-finite steps (a NaN never poisons it)."""
        out = np.empty_like(loss, dtype=np.float64)
        ema, decay = self.ema, self.ema_decay
        for i, value in enumerate(loss.tolist()):
            if math.isfinite(value):
                ema = value if ema is None else decay * ema + (1 - decay) * value
            out[i] = ema if ema is not None else math.nan
        self.ema = ema
        return out
