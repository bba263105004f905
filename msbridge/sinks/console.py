"""Progress lines on the global rank, printed from the dispatcher thread (never the training thread).

Every ``print_interval`` steps: step/total, loss, samples/s and the ETA. Events
(anomalies, actions) are printed as they arrive.

Example output:
    [msbridge] step  120/300 | loss 2.3411 | 812.3 samples/s | ETA 0:00:21
"""
from __future__ import annotations

import sys
from datetime import timedelta
from typing import IO, Any, Optional, Sequence

from ..names import LOSS, SAMPLES_PER_S, STEP_TIME
from .base import Event, Record, RunInfo, Sink
from .options import Option


def format_eta(seconds: float) -> str:
    return str(timedelta(seconds=int(max(seconds, 0))))


class ConsoleSink(Sink):
    """Prints a progress line every ``print_interval`` steps.

    Example:
        >>> ConsoleSink(print_interval=20)
    """

    name = "console"
    options = {"print_interval": Option(int, 20, "a progress line every N steps", 1)}

    def __init__(self, stream: Optional[IO[str]] = None, **options: Any) -> None:
        super().__init__(**options)
        self.print_interval: int = self.settings["print_interval"]
        self.stream = stream
        self.total: Optional[int] = None
        self._step_ms: Optional[float] = None  # smoothed, for a steady ETA

    def open(self, run: RunInfo) -> None:
        super().open(run)
        self.total = run.metadata.get("expected_steps")

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """Every record, a resumed run's steps trained again too: progress, not a store (no resume skip)."""
        out = self.stream or sys.stdout
        for rec in records:
            ms = rec.values.get(STEP_TIME)
            if ms is not None:
                self._step_ms = ms if self._step_ms is None else 0.9 * self._step_ms + 0.1 * ms
            if rec.step % self.print_interval == 0 or rec.step == self.total:
                out.write(self.line(rec) + "\n")
        for ev in events:
            out.write(f"[msbridge] step {ev.step} rank {ev.rank}: {ev.kind} {dict(ev.detail)}\n")
        out.flush()

    def line(self, rec: Record) -> str:
        values = rec.values
        width = len(str(self.total)) if self.total else 0
        parts = [f"step {rec.step:>{width}}/{self.total}" if self.total else f"step {rec.step}"]
        if LOSS in values:
            parts.append(f"loss {values[LOSS]:.4f}")
        if SAMPLES_PER_S in values:
            parts.append(f"{values[SAMPLES_PER_S]:.1f} samples/s")
        if self.total and self._step_ms is not None:
            parts.append(f"ETA {format_eta((self.total - rec.step) * self._step_ms / 1e3)}")
        return "[msbridge] " + " | ".join(parts)
