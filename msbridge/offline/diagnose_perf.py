"""The speed reading of ``msbridge diagnose``: the step got slower at one step, and what slowed it.

- ``slowdown``: the step where ``perf/step_time_ms`` shifts to a level at least ``SLOWER`` (20 %) above the
  one before: the single split of the run into two levels with the least absolute deviation from each side's
  median (log step times, each side at least ``MIN_SIDE`` steps; on the medians of up to ``BLOCKS`` blocks of
  steps, then to the step within the boundary blocks), kept when the two medians are at least ``MIN_Z`` standard
  errors of their difference apart (the pooled MAD sigma of a step, over the square root of each side's length).
  A level, not each step, is what moves: beside 2 busy processes a step's own noise is 10-15 % of it, and a 50 %
  shift was 3-6 of those sigmas but 15-30 standard errors over 60 steps a side (this 2-vCPU VM, 2026-12-07).
  With ``perf/data_wait_pct`` (per flush window) the reading compares the share before the step with the share
  in the windows that start after it, and names the cause by ``throughput_drop``'s rule (``cause_of``): the
  input pipeline when the wait's growth is at least half of the step's, else the step itself. With
  ``perf/mfu`` or ``perf/tflops`` in the log, their medians before and after are in the evidence.

The first step (graph compile) is left out. Only a slowdown is reported: a run that got faster has nothing to fix.

Example:
    >>> [d.title for d in check_slowdown(read_run("runs/slow-loader/run-1"))]
    ['the step got 65% slower at step 75 (22.6 -> 37.5 ms); data wait went from 2% to 41% of the step']
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..health.detectors.throughput_drop import cause_of
from ..names import DATA_WAIT_PCT, MFU, STEP_TIME, TFLOPS
from ..sinks.runlog import RunLog
from .report import Diagnosis, Skip
from .series import mad_sigma, metric_series

SLOWER, MIN_Z, MIN_SIDE, BLOCKS = 1.2, 5.0, 10, 200
MEDIAN_SE = 1.2533  # sqrt(pi / 2): a median's standard error over the mean's, for normal noise

_ADVICE = {
    "input_pipeline": "the input pipeline is what slowed: the step waits for its next batch. Look at the dataset's "
                      "num_parallel_workers and prefetch, its storage and the host's CPU load at that step",
    "step": "the step itself slowed, not its input: look at the host or device load at that step (other "
            "processes, thermal throttling), a changed sequence length or batch, communication, recompilation",
    "unknown": "no perf/data_wait_pct in the log (device sink mode, or a run recorded before it): the input "
               "pipeline and the step cannot be told apart",
}


def _split_cost(x: np.ndarray, side: int) -> int:
    """The index that best splits ``x`` into two levels (least absolute deviation from each side's median),
    each side at least ``side`` long; 0 when ``x`` is too short."""
    costs = [(float(np.abs(x[:k] - np.median(x[:k])).sum() + np.abs(x[k:] - np.median(x[k:])).sum()), k)
             for k in range(side, len(x) - side + 1)]
    return min(costs)[1] if costs else 0


def _refine(logs: np.ndarray, low: float, high: float, lo: int, hi: int) -> int:
    """The step index in ``[lo, hi]`` where the two known levels fit best (cumulative absolute deviations)."""
    to_low, to_high = np.abs(logs - low), np.abs(logs - high)
    cost = np.concatenate([[0.0], np.cumsum(to_low)]) + np.concatenate([np.cumsum(to_high[::-1])[::-1], [0.0]])
    return lo + int(np.argmin(cost[lo:hi + 1]))


def _z(x: np.ndarray, k: int) -> float:
    """The gap between the two sides' medians over the standard error of their difference (a median's is
    ``MEDIAN_SE`` times the mean's, from the pooled MAD sigma)."""
    before, after = x[:k], x[k:]
    spread = mad_sigma(np.concatenate([before - np.median(before), after - np.median(after)]))
    error = MEDIAN_SE * max(spread, 1e-3) * np.sqrt(1 / len(before) + 1 / len(after))
    return float(np.median(after) - np.median(before)) / error


def _around(log: Any, name: str, step: int) -> Optional[Tuple[float, float]]:
    """Medians of a per-window series before ``step`` and over the windows that start at or after it."""
    steps, values = metric_series(log, name)
    if not len(steps):
        return None
    starts = np.concatenate([[0], steps[:-1]]) + 1  # each window's first step
    before, after = values[steps < step], values[starts >= step]
    if not len(before) or not len(after):
        return None
    return float(np.median(before)), float(np.median(after))


def check_slowdown(run: RunLog) -> List[Diagnosis]:
    """The step got at least 20 % slower from one step on; with the data-wait share, which part slowed."""
    log = run.ranks[min(run.ranks)]
    if STEP_TIME not in log.metric_names():
        raise Skip(f"no {STEP_TIME} recorded (throughput switched off, or a run without step times)")
    steps, times = metric_series(log, STEP_TIME)
    steps, times = steps[1:], times[1:]  # the first step compiles the graph
    if len(steps) < 2 * MIN_SIDE:
        raise Skip(f"only {len(steps)} step times; needs {2 * MIN_SIDE}")
    logs = np.log(np.maximum(times, 1e-9))
    size = max(1, -(-len(logs) // BLOCKS))  # blocks of steps, at most BLOCKS of them
    blocks = np.median(logs[:len(logs) // size * size].reshape(-1, size), axis=1)
    k = _split_cost(blocks, -(-MIN_SIDE // size))
    if k == 0:
        return []
    low, high = float(np.median(blocks[:k])), float(np.median(blocks[k:]))
    i = _refine(logs, low, high, max((k - 1) * size, MIN_SIDE), min((k + 1) * size, len(logs) - MIN_SIDE))
    z = _z(logs, i)
    before_ms, after_ms = float(np.median(times[:i])), float(np.median(times[i:]))
    if z < MIN_Z or after_ms < SLOWER * before_ms:
        return []
    at = int(steps[i])
    return [_finding(log, at, before_ms, after_ms, z)]


def _finding(log: Any, at: int, before_ms: float, after_ms: float, z: float) -> Diagnosis:
    ratio = after_ms / before_ms
    title = f"the step got {100 * (ratio - 1):.0f}% slower at step {at} ({before_ms:.3g} -> {after_ms:.3g} ms)"
    evidence: Dict[str, Any] = {"step": at, "step_time_ms": [round(before_ms, 3), round(after_ms, 3)],
                                "ratio": round(ratio, 3), "z": round(z, 1)}
    wait = _around(log, DATA_WAIT_PCT, at) if DATA_WAIT_PCT in log.metric_names() else None
    cause = "unknown"
    if wait is not None:
        cause = cause_of(ratio, wait[0], wait[1])
        title += f"; data wait went from {wait[0]:.0f}% to {wait[1]:.0f}% of the step"
        evidence["data_wait_pct"] = [round(wait[0], 2), round(wait[1], 2)]
    evidence["cause"] = cause
    for name in (MFU, TFLOPS):
        if name in log.metric_names() and (moved := _around(log, name, at)) is not None:
            evidence[name] = [round(moved[0], 6), round(moved[1], 6)]
    confidence = round(min(1.0, 0.5 + 0.5 * min(1.0, (ratio - 1) / 0.5)) * (1.0 if wait is not None else 0.8), 3)
    return Diagnosis("slowdown", title, _ADVICE[cause], confidence,
                     f"two levels of {STEP_TIME} split at step {at}, {z:.0f} standard errors apart; cause by the data "
                     "wait's growth against the step's (throughput_drop's rule)", STEP_TIME, [at], evidence=evidence)
