"""Scale simulation: rank 0's real per-flush code fed the table N virtual ranks would gather.

What is real: ``Reducer`` (the global metrics, ``StragglerWatch``, ``OutlierWatch``, the agreed stop,
``Blame``) and rank 0's ``Stream``. What is simulated: the other N - 1 ranks and the collective. A real
AllGather hands every rank a ``[N, HEADER + capacity]`` float32 table, one ``payload.pack`` row per rank
(``metrics/payload.py`` documents the layout); ``VirtualJob`` builds that table for N ranks with numpy, row
0 being rank 0's own packed payload, and hands it to ``Reducer`` in place of the AllGather.

Planted: a straggler (its own step time 30 % above the others' in every window), a one-off stall (one
rank waits 5 s for data once), an outlier (its loss 0.5 above the others') and a NaN (one rank's loss at one
step, with the ``nonfinite`` finding its health check packs).

Example:
    $ python -m msbridge.bench.scale --ranks 8 128 1024 4096 16384
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..capture.window import Window
from ..health.runner import Verdict
from ..metrics.cross_rank import Reducer
from ..metrics.payload import ANOMALY_CHECK, ANOMALY_STEP, HEADER, TIMING, Slots, pack
from ..metrics.stream import Stream
from ..names import GRAD_NORM, LOSS, LOSS_SCALE, LR, OVERFLOW
from ..sinks.base import Event, Record

RANKS = (8, 128, 1024, 4096, 16384)
STEP_MS, RUN_MS, WAIT_MS = 100.0, 95.0, 5.0


@dataclass
class Plant:
    """Which virtual ranks misbehave, and how (ranks are taken modulo the world size)."""

    straggler: int = 5
    stall: int = 3
    stall_window: int = 2
    outlier: int = 6
    nan: int = 7
    nan_step: int = 150


@dataclass
class Flush:
    """What rank 0 made of one window, and the table it was given (for the direct check)."""

    records: List[Record]
    events: List[Event]
    losses: np.ndarray  # [ranks, steps] as gathered (float32 values)
    cpu_s: float


@dataclass
class VirtualJob:
    """N virtual ranks of one data-parallel job, flushing every ``window`` steps.

    Example:
        >>> job = VirtualJob(ranks=4096, window=100)
        >>> flushes = job.run(windows=5)
        >>> len({n for f in flushes for r in f.records for n in r.values})
        38
    """

    ranks: int
    window: int = 100
    seed: int = 0
    plant: Plant = field(default_factory=Plant)
    per_rank_curves: Any = "auto"

    def __post_init__(self) -> None:
        p = self.plant
        self.straggler, self.stall = p.straggler % self.ranks, p.stall % self.ranks
        self.outlier, self.nan = p.outlier % self.ranks, p.nan % self.ranks
        self._rng = np.random.default_rng(self.seed)
        self._table = np.empty((self.ranks, HEADER + self.window), dtype=np.float32)
        self.reducer = Reducer(rank=0, world_size=self.ranks, is_global=True, batch_size=8, capacity=self.window,
                               per_rank_curves=self.per_rank_curves, gather=self._gather)
        self.stream = Stream(rank=0, batch_size=8, seq_length=2048, is_global=True)
        self._last_end: Optional[float] = None  # when rank 0's last step-end hook returned (``_stamp``)

    # -- what the N ranks would send --------------------------------------------------------------------------
    def _fill(self, index: int, first: int) -> None:
        """The gathered table of window ``index`` (steps ``first`` ...), rows 1..N-1 (row 0 is rank 0's)."""
        w, p = self.window, self.plant
        steps = np.arange(first, first + w)
        losses = 3.0 * np.exp(-steps / 5e4)[None, :] + 0.01 * self._rng.standard_normal((self.ranks, w))
        losses[self.outlier] += 0.5
        if first <= p.nan_step < first + w:
            losses[self.nan, p.nan_step - first] = np.nan
        wait = WAIT_MS + 0.2 * self._rng.standard_normal(self.ranks)
        wait[self.straggler] += 0.3 * STEP_MS  # 30 % more than the others' own step time
        wait_max = wait * 1.2
        if index == p.stall_window:
            wait_max[self.stall] = 5000.0  # one step of one window: the median wait does not move
        step = np.full(self.ranks, STEP_MS + 0.3 * STEP_MS)  # synchronous: everyone waits for the straggler
        run = step - wait
        template = pack(Slots(n=w, batch=8, first=first, last=first + w - 1), [], w)
        table = self._table
        table[:] = template
        table[:, HEADER:] = losses
        table[:, TIMING:TIMING + 5] = np.stack([step, run, wait, wait_max, np.full(self.ranks, 0.5)], axis=1)
        if first <= p.nan_step < first + w:  # what the NaN rank's nonfinite check packs
            one = pack(Slots(n=w, batch=8, first=first, last=first + w - 1, anomaly_check="nonfinite",
                             anomaly_step=p.nan_step), [], w)
            table[self.nan, ANOMALY_CHECK:ANOMALY_STEP + 2] = one[ANOMALY_CHECK:ANOMALY_STEP + 2]

    def _gather(self, payload: np.ndarray) -> np.ndarray:
        """The stand-in for the AllGather: the table, with rank 0's own payload as row 0."""
        if payload.shape != self._table.shape[1:]:
            raise ValueError(f"msbridge: payload of {payload.shape} for a table of {self._table.shape}")
        self._table[0, :HEADER] = payload[:HEADER]
        self._table[0, HEADER:] = payload[HEADER:]
        return self._table

    # -- rank 0 ---------------------------------------------------------------------------------------------------
    def _window(self, first: int) -> Window:
        """Rank 0's own window: its loss is row 0 of the table being built."""
        w = self.window
        steps = np.arange(first, first + w)
        scalars = {LOSS: self._table[0, HEADER:].astype(np.float64), GRAD_NORM: np.full(w, 1.5),
                   LR: np.full(w, 3e-4), LOSS_SCALE: np.full(w, 1024.0), OVERFLOW: np.zeros(w)}
        return Window(steps=steps, epochs=np.zeros(w), wall_time=1.7e9 + steps * 0.1,
                      step_time_s=np.full(w, 0.13), monitor_s=np.full(w, 1e-5), scalars=scalars)

    def _stamp(self, window: Window) -> None:
        """Rank 0's host stamps of the window's steps, into the reducer's real ``StepTimer``."""
        timer, wait, run = self.reducer.timer, float(self._table[0, TIMING + 2]) / 1e3, float(self._table[0, TIMING + 1]) / 1e3
        for step in window.steps.tolist():
            start = step * (STEP_MS + 0.3 * STEP_MS) / 1e3
            timer.step(start + wait + run, self._last_end, start + wait, hook_s=0.0 if self._last_end is None else 1e-5)
            self._last_end = start + wait + run + 1e-5

    def flush(self, index: int) -> Flush:
        """One window through rank 0's stream and reducer; ``cpu_s`` is the reducer's CPU time."""
        first = 1 + index * self.window
        self._fill(index, first)
        window = self._window(first)
        self._stamp(window)
        records = self.stream.records(window)
        start = time.process_time()
        agreement = self.reducer.reduce(window, Verdict(records, []))
        cpu = time.process_time() - start
        return Flush(agreement.verdict.records, agreement.verdict.events,
                     self._table[:, HEADER:].astype(np.float64), cpu)

    def run(self, windows: int = 5) -> List[Flush]:
        return [self.flush(i) for i in range(windows)]


def summary(job: VirtualJob, flushes: Sequence[Flush]) -> Dict[str, Any]:
    """What one simulated job costs rank 0 and its sinks."""
    names = {n for f in flushes for r in f.records for n in r.values}
    values = [len(r.values) for f in flushes for r in f.records]
    payload = (HEADER + job.window) * 4
    return {"ranks": job.ranks, "series": len(names), "values_per_step": statistics.mean(values),
            "values_max": max(values), "events": [e.kind for f in flushes for e in f.events],
            "sent_bytes": payload, "received_bytes": job.ranks * payload,
            "cpu_ms": statistics.median(f.cpu_s for f in flushes) * 1e3,
            "cpu_ms_max": max(f.cpu_s for f in flushes) * 1e3}


def line(row: Dict[str, Any]) -> str:
    """One row of the printed table, from a ``summary`` row."""
    return (f"{row['ranks']:>6} | {row['series']:>6} | {row['values_per_step']:>6.1f} (max {row['values_max']}) | "
            f"{row['sent_bytes']:>5} B / {row['received_bytes'] / 1e6:>7.3f} MB | "
            f"{row['cpu_ms']:>6.2f} (max {row['cpu_ms_max']:.2f}) | {', '.join(sorted(set(row['events'])))}")


def main(argv: Sequence[str] = ()) -> int:
    """``python -m msbridge.bench.scale``: one table row per rank count (``--ranks``), rank 0's figures per flush."""
    parser = argparse.ArgumentParser(prog="python -m msbridge.bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--window", type=int, default=100, help="steps per flush window (flush_steps)")
    parser.add_argument("--windows", type=int, default=5, help="flush windows per job")
    args = parser.parse_args(list(argv) or None)
    print("ranks | series at rank 0 | values per step (= MLflow/TensorBoard/MindInsight rows; jsonl: 1 line) | "
          "per flush each rank sends / receives | rank-0 CPU ms per flush (median) | events")
    for n in args.ranks:
        job = VirtualJob(ranks=n, window=args.window)
        print(line(summary(job, job.run(args.windows))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
