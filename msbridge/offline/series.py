"""A run's metrics as numpy arrays, for diagnose and plot: the global loss, every rank's loss, the warm-up,
and the robust statistics the checks share (rolling median, MAD sigma).

Example:
    >>> run = read_run("msbridge_runs/demo/run-1")
    >>> steps, loss = global_loss(run)
    >>> sorted(rank_losses(run))
    [0, 1, 2, 3]
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Tuple

import numpy as np

from ..names import GLOBAL_LOSS, LOSS, LR
from ..sinks.runlog import RankLog, RunLog

_RANK_LOSS = re.compile(r"^dist/loss/rank_(\d+)$")

Series = Tuple[np.ndarray, np.ndarray]  # steps, values


def metric_series(log: RankLog, name: str, finite: bool = True) -> Series:
    """One metric of one rank as (steps, values); only the finite values unless ``finite`` is False."""
    if hasattr(log, "arrays"):  # a streamed ``ColumnLog``: the columns as they are held
        steps, values = log.arrays(name)
    else:
        pairs = log.series(name)
        steps = np.array([s for s, _ in pairs], dtype=np.int64)
        values = np.array([v for _, v in pairs], dtype=np.float64)
    keep = np.isfinite(values) if finite else slice(None)
    return steps[keep], values[keep]


def global_loss(run: RunLog) -> Series:
    """The global rank's ``train/global_loss``, else its ``train/loss``."""
    log = run.ranks[min(run.ranks)]
    return metric_series(log, GLOBAL_LOSS if GLOBAL_LOSS in log.metric_names() else LOSS)


def rank_losses(run: RunLog, finite: bool = True) -> Dict[int, Series]:
    """Every rank's local loss: from each rank's own file, else from the global rank's ``dist/loss/rank_{r}``."""
    if len(run.ranks) > 1:
        return {r: metric_series(log, LOSS, finite) for r, log in run.ranks.items()}
    log = run.ranks[min(run.ranks)]
    found = {int(m.group(1)): name for name in log.metric_names() if (m := _RANK_LOSS.match(name))}
    return {r: metric_series(log, name, finite) for r, name in sorted(found.items())}


def warmup_end(run: RunLog) -> int:
    """The first step that is judged: after the lr peaks, never before 10% of the steps (at least 10)."""
    steps, _ = global_loss(run)
    if not len(steps):
        return 0
    end = int(steps[min(max(len(steps) // 10, 10), len(steps) - 1)])
    lr_steps, lr = metric_series(run.ranks[min(run.ranks)], LR)
    if len(lr) and lr.max() > 0:
        end = max(end, int(lr_steps[np.argmax(lr >= 0.99 * lr.max())]))
    return end


def run_notes(run: RunLog) -> List[str]:
    """Plain-words notes on what was read: lines cut by a killed run, bad lines skipped."""
    notes = [f"{os.path.basename(log.path)}: the last line was cut (killed run?); "
             f"used the {len(log.records)} complete metrics lines before it"
             for log in run.ranks.values() if log.truncated]
    notes += [f"{os.path.basename(log.path)}: skipped {len(log.skipped)} bad line(s), the first at line "
              f"{log.skipped[0][0]} ({log.skipped[0][1]}); every other line was used"
              for log in run.ranks.values() if log.skipped]
    return notes


def rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median; near the ends the window shrinks to the values that exist."""
    half = window // 2
    padded = np.concatenate([np.full(half, np.nan), values, np.full(half, np.nan)])
    out = np.empty(len(values))
    chunk = 8192  # bounds memory on long runs
    for start in range(0, len(values), chunk):
        rows = np.lib.stride_tricks.sliding_window_view(padded[start:start + chunk + 2 * half], window)
        out[start:start + len(rows)] = np.nanmedian(rows, axis=1)
    return out


def mad_sigma(x: np.ndarray) -> float:
    """Median absolute deviation scaled to a normal sigma (floored so a flat series is not 0)."""
    return max(1.4826 * float(np.median(np.abs(x - np.median(x)))), 1e-12)
