"""Turns one flushed window of steps into ``Record`` objects with the canonical metric names.

The window arrives as numpy arrays (one device->host copy per flush happened
before). Stream adds throughput, the smoothed loss and, on the global rank,
the global metrics; it keeps the small state that spans windows (EMA).

The metric names are defined in ``msbridge.names``.

Example:
    >>> import numpy as np
    >>> from msbridge.capture.window import Window
    >>> window = Window(steps=np.arange(1, 4), epochs=np.zeros(3), wall_time=np.zeros(3),
    ...                 step_time_s=np.full(3, 0.01), monitor_s=np.zeros(3), scalars={"train/loss": np.ones(3)})
    >>> stream = Stream(rank=0, batch_size=8, seq_length=32, is_global=True)
    >>> [(r.step, r.values["perf/samples_per_s"]) for r in stream.records(window)]
    [(1, 800.0), (2, 800.0), (3, 800.0)]
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional

import numpy as np

from ..capture.window import Window
from ..names import (
    EPOCH,
    GRAD_NORM,
    LOSS,
    LOSS_EMA,
    LOSS_SCALE,
    LR,
    MONITOR_OVERHEAD,
    OVERFLOW,
    SAMPLES_PER_S,
    STEP_TIME,
    TOKENS_PER_S,
)
from ..sinks.base import Record
from .work import Work, make_work

#: The config's metric switches.
SWITCHES = ("local_loss", "global_loss", "grad_norm", "learning_rate", "throughput")


class Stream:
    """Builds this rank's records from windows.

    Args:
        rank: this process's rank.
        batch_size: samples per step on this rank (for samples/s).
        seq_length: tokens per sample, when known (for tokens/s).
        is_global: add the global metrics the window carries (rank 0).
        ema_decay: smoothing of ``train/loss_ema``.
        switches: metric switches from the config; a False one is left out.
        work: what a step is worth (samples and tokens seen, TFLOP/s, MFU), when known.
    """

    def __init__(self, rank: int, batch_size: Optional[int], seq_length: Optional[int] = None,
                 is_global: bool = True, ema_decay: float = 0.9,
                 switches: Optional[Dict[str, bool]] = None, work: Optional[Work] = None) -> None:
        self.rank = rank
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_global = is_global
        self.ema_decay = ema_decay
        self.switches = switches or {}
        self.work = work
        self.ema: Optional[float] = None

    @classmethod
    def for_run(cls, cfg: Any, run: Any, batch_size: Optional[int], network: Any = None,
                trained: Any = None) -> "Stream":
        """The stream of a run (``cfg``: its ``Config``, ``run``: its ``RunInfo``), switches and work included
        (``network``, ``trained``: the train network and the parameters it trains, for a FLOPs count)."""
        switches = {name: getattr(cfg, name) for name in SWITCHES}
        work = make_work(cfg, run.world_size, batch_size, network, trained) if cfg.throughput else None
        return cls(rank=run.rank, batch_size=batch_size, seq_length=cfg.seq_length, is_global=run.is_global,
                   switches=switches, work=work)

    def _on(self, switch: str) -> bool:
        return self.switches.get(switch, True)

    def records(self, window: Window) -> List[Record]:
        """One ``Record`` per step of ``window``, in step order (the smoothed loss goes on from the last window)."""
        columns: Dict[str, np.ndarray] = {}
        loss = window.scalars.get(LOSS)
        absent = dict(window.absent)
        if loss is not None and self._on("local_loss"):
            columns[LOSS] = loss
            columns[LOSS_EMA] = self._smooth(np.where(absent[LOSS], np.nan, loss) if LOSS in absent else loss)
            if LOSS in absent:
                absent[LOSS_EMA] = absent[LOSS]
        if self._on("grad_norm") and GRAD_NORM in window.scalars:
            columns[GRAD_NORM] = window.scalars[GRAD_NORM]
        if self._on("learning_rate") and LR in window.scalars:
            columns[LR] = window.scalars[LR]
        for name in (LOSS_SCALE, OVERFLOW):
            if name in window.scalars:
                columns[name] = window.scalars[name]
        if self.is_global and self._on("global_loss"):
            columns.update(window.global_scalars)
        columns.update(window.series)
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
            if self.work is not None:
                columns.update(self.work.columns(window.steps, window.step_time_s))
        now = time.time()
        names = list(columns)
        matrix = np.stack([np.asarray(columns[n], dtype=np.float64) for n in names], axis=1).tolist()
        records = [
            Record(step=int(step), rank=self.rank, time=float(wall) if wall else now,
                   values=dict(zip(names, row)))
            for step, wall, row in zip(window.steps.tolist(), window.wall_time.tolist(), matrix)
        ]
        if absent:
            _drop_absent(records, {name: mask for name, mask in absent.items() if name in columns and mask.any()})
        if records and window.at_flush:
            records[-1].values.update(window.at_flush)
        if records and window.timed:
            ends = window.wall_time if window.wall_time.any() else np.full(len(records), now)
            for taken, values in window.timed:  # on the last step that ended at or before the sample
                records[max(int(np.searchsorted(ends, taken, side="right")) - 1, 0)].values.update(values)
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


def _drop_absent(records: List[Record], absent: Dict[str, np.ndarray]) -> None:
    """Take out of each record the names its step did not give: absent stays absent, never NaN."""
    for name, mask in absent.items():
        for i in np.flatnonzero(mask).tolist():
            del records[i].values[name]
