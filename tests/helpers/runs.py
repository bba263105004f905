"""A RunInfo, Records like ``Stream`` makes them, a BridgeMonitor, and a sink behind its hand-off (``Handed``): the
builders sink and training tests share.

Example:
    >>> run = make_run(tmp_path, world_size=2)
    >>> sink.open(run)
    >>> sink.write(make_records(range(1, 11), world_size=2), [])
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from msbridge.names import (
    EPOCH,
    GLOBAL_LOSS,
    GRAD_NORM,
    LOSS,
    LOSS_EMA,
    LOSS_SCALE,
    LOSS_STD,
    LR,
    MONITOR_OVERHEAD,
    OVERFLOW,
    SAMPLES_PER_S,
    STEP_TIME,
    TOKENS_PER_S,
    rank_loss,
)
from msbridge.sinks.base import Record, RunInfo, Sink
from msbridge.sinks.calls import Call
from msbridge.sinks.handoff import Handoff


def make_run(root: Any, name: str = "r1", experiment: str = "exp", rank: int = 0, world_size: int = 1,
             **fields: Any) -> RunInfo:
    """A RunInfo as ``plan_run`` makes one: run dir ``{root}/{experiment}/{name}``, run id ``id-{name}``,
    rank 0 the global rank; ``fields`` sets the rest (config, metadata, readme, resumed_from_step, run_id)."""
    fields.setdefault("run_id", f"id-{name}")
    return RunInfo(run_name=name, experiment=experiment, rank=rank, world_size=world_size, is_global=rank == 0,
                   run_dir=str(Path(root) / experiment / name), **fields)


def make_records(steps: Iterable[int], rank: int = 0, world_size: int = 1, seed: int = 0,
                 nan_step: Optional[int] = None) -> List[Record]:
    """Records like ``Stream`` makes them: every metric a rank records (11), plus the global ones on rank 0
    (global loss, spread, each rank's loss). Values are random from ``seed`` and ``rank``, the same for
    the same arguments; at ``nan_step`` the loss is NaN and the spread +inf."""
    rng = np.random.default_rng([seed, rank])
    out = []
    for step in steps:
        loss = math.nan if step == nan_step else float(rng.uniform(1, 3))
        values = {LOSS: loss, LOSS_EMA: float(rng.uniform(1, 3)), GRAD_NORM: float(rng.uniform(0.1, 10)),
                  LR: 1e-3 * step, LOSS_SCALE: 1024.0, OVERFLOW: 0.0, EPOCH: 1.0 + step // 100,
                  STEP_TIME: float(rng.uniform(10, 20)), SAMPLES_PER_S: float(rng.uniform(100, 900)),
                  TOKENS_PER_S: float(rng.uniform(1e4, 1e5)), MONITOR_OVERHEAD: 0.001}
        if rank == 0:
            values.update({GLOBAL_LOSS: float(rng.uniform(1, 3)),
                           LOSS_STD: math.inf if step == nan_step else float(rng.uniform(0, 0.1)),
                           **{rank_loss(r): (loss + r) for r in range(world_size)}})
        out.append(Record(step, rank, 1_700_000_000.0 + step, values))
    return out


def monitor(tmp_path: Any, extra_sinks: Sequence[Sink] = (), **overrides: Any) -> Any:
    """A BridgeMonitor without progress lines writing jsonl to ``{tmp_path}/t/r`` every 5 steps;
    ``overrides`` are config keys, ``extra_sinks`` sink objects added to the configured ones."""
    from msbridge import BridgeMonitor

    cfg = {"experiment": "t", "run_name": "r", "output_dir": str(Path(tmp_path) / "{experiment}" / "{run_name}"),
           "flush_steps": 5, "sinks": ["jsonl"], **overrides}
    return BridgeMonitor(cfg, sinks=list(extra_sinks), progress=False)


class Handed:
    """``sink`` behind the hand-off its host makes every call through (``msbridge.sinks.handoff``), on the caller's
    thread: ``open`` asks ``held()`` next, each ``write`` hands it only the steps it lacks and keeps
    ``sink.run.progress``; every other attribute is the sink's. A sink test drives a store as a run does.

    Example:
        >>> sink = Handed(TensorBoardSink())
        >>> sink.open(make_run(tmp_path)); sink.write(make_records([1, 2]), []); sink.close("FINISHED")
    """

    def __init__(self, sink: Sink) -> None:
        self.sink, self.handoff = sink, Handoff(sink)

    def open(self, run: RunInfo) -> None:
        self.handoff.invoke(Call("open", run=run))
        self.handoff.invoke(Call("held"))

    def write(self, records: Sequence[Record], events: Sequence[Any] = ()) -> Any:
        return self.handoff.write(records, list(events))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sink, name)
