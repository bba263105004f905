"""Progress lines on the global rank, printed at the flush of the step they report.

Every ``print_interval`` steps: step/total, loss, samples/s and the ETA (from the smoothed step time, the first
step, which compiles the graph, left out); each evaluation, one line of its
``eval/*`` values. Events
(anomalies, actions) are printed as they arrive, one readable line each. The sink
is ``in_submit``: the dispatcher calls it in ``submit``, so a line is
never behind a slow tracker; it does nothing but format and print a line.

Example output:
    [msbridge] step  120/300 | loss 2.3411 | 812.3 samples/s | ETA 0:00:21
    [msbridge] step  150/300 | eval loss 2.2917 | accuracy 0.4102 | in 0.3 s
    [msbridge] step 137: anomaly loss_spike, action log: loss 9.02, median 2.31, sigma 0.1093, threshold 2.85
"""
from __future__ import annotations

import json
import logging
import sys
from datetime import timedelta
from typing import IO, Any, Optional, Sequence

from ..names import EVAL_LOSS, EVAL_PREFIX, EVAL_SAMPLES, EVAL_TIME, GRAD_NORM, HISTOGRAM, LOSS, SAMPLES_PER_S, \
    STEP_TIME
from ..options import Option
from .base import Event, Record, RunInfo, Sink

log = logging.getLogger("msbridge")

NO_GRAD_NORM = ("msbridge: no train/grad_norm is recorded: the train step does not hand it over (a plain "
                "Model.train returns only the loss). To record it: msbridge.TrainStep(loss_net, optimizer) or "
                "msbridge.attach_ring(train_cell) with Model.train, run.step(grad_norm=...) with msbridge.track")


def format_eta(seconds: float) -> str:
    return str(timedelta(seconds=int(max(seconds, 0))))


def _value(value: Any) -> str:
    """A detail value as a reader wants it: floats to 4 significant digits, lists in brackets."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, default=str, separators=(", ", ": "))
    return str(value)


def describe_event(ev: Event, with_rank: bool = False) -> str:
    """One line for an event: ``step 137: anomaly loss_spike, action log: loss 9.02, median 2.31``.

    A health check's name and action lead; every other detail follows as ``key value``.

    Example:
        >>> describe_event(Event("anomaly", 7, 0, 0.0, {"check": "loss_spike", "action": "log", "loss": 9.0}))
        'step 7: anomaly loss_spike, action log: loss 9'
    """
    detail = dict(ev.detail)
    head = ev.kind + (f" {detail.pop('check')}" if "check" in detail else "")
    if "action" in detail:
        head += f", action {detail.pop('action')}"
    where = f"step {ev.step}" + (f" rank {ev.rank}" if with_rank else "")
    rest = ", ".join(f"{key} {_value(value)}" for key, value in detail.items())
    return f"{where}: {head}" + (f": {rest}" if rest else "")


class ConsoleSink(Sink):
    """Prints a progress line every ``print_interval`` steps.

    Example:
        >>> ConsoleSink(print_interval=20).settings["print_interval"]
        20
    """

    name = "console"
    options = {"print_interval": Option(int, 20, "a progress line every N steps", 1)}
    skips_held = False  # progress, not a store: a resumed run's steps trained again are printed too
    in_submit = True

    def __init__(self, stream: Optional[IO[str]] = None, **options: Any) -> None:
        super().__init__(**options)
        self.print_interval: int = self.settings["print_interval"]
        self.stream = stream
        self.total: Optional[int] = None
        self._step_ms: Optional[float] = None  # smoothed, for a steady ETA
        self._compiled = False  # the first timed step (it compiles the graph) is left out of the ETA
        self._with_rank = False
        self._grad_norm_told = False

    def open(self, run: RunInfo) -> None:
        super().open(run)
        self.total = run.metadata.get("expected_steps")
        self._with_rank = run.world_size > 1
        self._grad_norm_told = run.config.get("grad_norm") is False  # switched off: nothing to say

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """A progress line every ``print_interval`` steps, one per evaluation and one per event."""
        out = self.stream or sys.stdout
        lines = []
        for rec in records:
            if EVAL_TIME in rec.values:  # an evaluation's record
                lines.append(self.eval_line(rec))
                continue
            ms = rec.values.get(STEP_TIME)
            if ms is not None and not self._compiled:
                self._compiled = True
            elif ms is not None:
                self._step_ms = ms if self._step_ms is None else 0.9 * self._step_ms + 0.1 * ms
            if rec.step % self.print_interval == 0 or rec.step == self.total:
                lines.append(self.line(rec))
        lines += ["[msbridge] " + describe_event(ev, self._with_rank) for ev in events if ev.kind != HISTOGRAM]
        if records and not self._grad_norm_told:
            self._grad_norm_told = True
            if GRAD_NORM not in records[0].values:  # said once, before the first progress line
                log.info(NO_GRAD_NORM)
                lines.insert(0, "[msbridge] " + NO_GRAD_NORM[len("msbridge: "):])
        if lines:
            out.write("\n".join(lines) + "\n")
            out.flush()

    def _total(self, step: int) -> Optional[int]:
        return self.total if self.total and step <= self.total else None  # past it: the estimate was wrong

    def _where(self, step: int) -> str:
        total = self._total(step)
        return f"step {step:>{len(str(total))}}/{total}" if total else f"step {step}"

    def eval_line(self, rec: Record) -> str:
        """``step 150/300 | eval loss 2.2917 | accuracy 0.4102 | in 0.3 s``."""
        names = [n for n in rec.values if n.startswith(EVAL_PREFIX) and n not in (EVAL_TIME, EVAL_SAMPLES)]
        names.sort(key=lambda n: (n != EVAL_LOSS, n))
        parts = [self._where(rec.step)]
        parts += [f"{'eval ' if i == 0 else ''}{n[len(EVAL_PREFIX):]} {rec.values[n]:.4f}" for i, n in enumerate(names)]
        return "[msbridge] " + " | ".join(parts + [f"in {rec.values[EVAL_TIME]:.1f} s"])

    def line(self, rec: Record) -> str:
        values, total = rec.values, self._total(rec.step)
        parts = [self._where(rec.step)]
        if LOSS in values:
            parts.append(f"loss {values[LOSS]:.4f}")
        if SAMPLES_PER_S in values:
            parts.append(f"{values[SAMPLES_PER_S]:.1f} samples/s")
        if total and self._step_ms is not None:
            parts.append(f"ETA {format_eta((total - rec.step) * self._step_ms / 1e3)}")
        return "[msbridge] " + " | ".join(parts)
