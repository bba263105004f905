"""Statistics across ranks that stay the same size at any world size, and the ranks that stand out.

Rank 0's stream must not grow with the job: at 4,096 ranks one series per rank
is 4,096 series per step. Instead it gets, over the ranks, min, max, mean, std
(population, unweighted), the 5th/50th/95th percentiles (linear interpolation
between the closest ranks, numpy's default) and the count of non-finite
values; each computed over the finite values only. Per-rank curves are added
only for the ranks ``curve_ranks`` picks (``per_rank_curves``).

The ranks that stand out are named in events, so every sink has them:

- ``rank_outlier`` (``OutlierWatch``): the rank whose mean loss over the window
  is furthest from the ranks' median, when it is more than ``OUTLIER_SIGMAS``
  robust standard deviations (1.4826 x the median absolute deviation) away;
  once when it starts to stand out, again after a window where it did not.
- ``rank_stall`` (``stall_event``): the rank with the longest single data
  wait of the window, when that wait is over ``STALL_MIN_MS`` and over
  ``STALL_FACTOR`` times the ranks' median own step time.

Example:
    >>> spread(np.array([[1.0], [2.0], [np.nan]]), "dist/loss", nonfinite=True)["dist/loss_nonfinite_ranks"]
    array([1.])
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..health.runner import make_event
from ..names import spread_name
from ..sinks.base import Event

#: ``per_rank_curves: auto`` keeps one curve per rank in rank 0's stream up to this many ranks.
AUTO_CURVES_MAX_RANKS = 16
QUANTILES = (5, 50, 95)
OUTLIER_SIGMAS = 6.0
STALL_MIN_MS, STALL_FACTOR = 1000.0, 10.0
RANK_OUTLIER, RANK_STALL = "rank_outlier", "rank_stall"

Curves = Union[str, Sequence[int]]


def curve_ranks(setting: Curves, ranks: Sequence[int]) -> List[int]:
    """The ranks of ``ranks`` that keep a per-rank curve in rank 0's stream under ``per_rank_curves``.

    Example:
        >>> curve_ranks("auto", range(4)), curve_ranks("auto", range(64)), curve_ranks([3, 99], range(64))
        ([0, 1, 2, 3], [], [3])
    """
    if setting == "none":
        return []
    if setting == "auto":
        return list(ranks) if len(ranks) <= AUTO_CURVES_MAX_RANKS else []
    wanted = {int(r) for r in setting}
    return [r for r in ranks if r in wanted]


def spread(values: np.ndarray, base: str, nonfinite: bool = False) -> Dict[str, np.ndarray]:
    """``{base}_min|max|mean|std|p5|p50|p95`` over axis 0 of ``[ranks, steps]`` (NaN where no value of a step
    is finite), and with ``nonfinite`` ``{base}_nonfinite_ranks``, how many ranks' values are not finite."""
    by_step = np.array(np.asarray(values).T, dtype=np.float64, order="C")  # our copy, one row per step
    return spread_by_step(by_step, np.isfinite(by_step), base, nonfinite)[0]


def spread_by_step(by_step: np.ndarray, finite: np.ndarray, base: str,
                   nonfinite: bool = False) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """``spread`` of ``[steps, ranks]`` (C order; sorted in place), and each value's deviation from its step's
    mean (0 where not finite)."""
    count = finite.sum(axis=1)
    dense = bool(count.min() == by_step.shape[1]) if by_step.size else True
    with np.errstate(invalid="ignore", divide="ignore"):
        if dense:  # the usual case: no masks
            mean = by_step.mean(axis=1)
            deviation = by_step - mean[:, None]
            std = np.sqrt(np.einsum("ij,ij->i", deviation, deviation) / by_step.shape[1])
        else:
            some = count > 0
            mean = np.where(some, np.where(finite, by_step, 0.0).sum(axis=1) / np.maximum(count, 1), np.nan)
            deviation = np.where(finite, by_step - mean[:, None], 0.0)
            std = np.where(some, np.sqrt(np.einsum("ij,ij->i", deviation, deviation) / np.maximum(count, 1)), np.nan)
            by_step[~finite] = np.inf  # sorted after every finite value
    by_step.sort(axis=1)  # a sort of each step's row is faster than np.partition at the quantiles here
    rows = np.arange(by_step.shape[0])
    some = count > 0
    out = {spread_name(base, "min"): np.where(some, by_step[:, 0], np.nan),
           spread_name(base, "max"): np.where(some, by_step[rows, np.maximum(count - 1, 0)], np.nan),
           spread_name(base, "mean"): mean, spread_name(base, "std"): std}
    for q in QUANTILES:
        out[spread_name(base, f"p{q}")] = _quantile(by_step, count, q / 100.0)
    if nonfinite:
        out[spread_name(base, "nonfinite_ranks")] = (by_step.shape[1] - count).astype(np.float64)
    return out, deviation


def _quantile(ordered: np.ndarray, count: np.ndarray, q: float) -> np.ndarray:
    """numpy's linear quantile of each row's first ``count`` (sorted) values."""
    pos = q * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    rows = np.arange(ordered.shape[0])
    low, high = ordered[rows, lo], ordered[rows, hi]
    with np.errstate(invalid="ignore"):
        value = np.where(hi > lo, low + (high - low) * (pos - lo), low)
    return np.where(count > 0, value, np.nan)


def furthest_from_median(values: np.ndarray) -> "tuple[int, float, float, float]":
    """``(index, value, median, robust sigma)`` of the finite value furthest from the median (index -1: none)."""
    finite = np.flatnonzero(np.isfinite(values))
    if len(finite) < 3:
        return -1, math.nan, math.nan, math.nan
    kept = values[finite]
    median = float(np.median(kept))
    deviation = np.abs(kept - median)
    sigma = 1.4826 * float(np.median(deviation))
    i = int(np.argmax(deviation))
    return int(finite[i]), float(kept[i]), median, sigma


class OutlierWatch:
    """On the global rank: a ``rank_outlier`` event when one rank's window loss stands far from the others'.

    Example:
        >>> watch = OutlierWatch()
        >>> [e.detail["outlier_rank"] for e in watch.observe(window_means, ranks=range(128), steps=steps, rank=0)]
        [17]
    """

    def __init__(self, sigmas: float = OUTLIER_SIGMAS) -> None:
        self.sigmas = float(sigmas)
        self._last: Optional[int] = None  # the rank named in the previous window

    def observe(self, means: np.ndarray, ranks: Sequence[int], steps: np.ndarray, rank: int) -> List[Event]:
        """``means``: each rank's mean finite loss over the window (NaN: none); returns the window's event."""
        i, value, median, sigma = furthest_from_median(means)
        away = abs(value - median)
        stands_out = i >= 0 and away > 0 and (sigma == 0 or away > self.sigmas * sigma)
        named = int(ranks[i]) if stands_out else None
        events = []
        if named is not None and named != self._last:
            events.append(make_event(RANK_OUTLIER, int(steps[-1]), rank, outlier_rank=named,
                                     window_mean_loss=round(value, 6), ranks_median=round(median, 6),
                                     robust_sigma=round(sigma, 6),
                                     sigmas=round(away / sigma, 1) if sigma > 0 else None,
                                     first_step=int(steps[0]), last_step=int(steps[-1]), ranks=len(ranks)))
        self._last = named
        return events


def stall_event(own: np.ndarray, wait_max: np.ndarray, first_step: int, last_step: int,
                rank: int) -> Optional[Event]:
    """The ``rank_stall`` event of one window (``own``: each rank's own step time, ``wait_max``: its longest
    data wait, both ms), or None when no rank waited long enough."""
    if not np.isfinite(wait_max).any() or not np.isfinite(own).any():
        return None
    typical = float(np.median(own[np.isfinite(own)]))
    limit = max(STALL_MIN_MS, STALL_FACTOR * typical)
    worst = int(np.nanargmax(wait_max))
    if not wait_max[worst] > limit:
        return None
    with np.errstate(invalid="ignore"):
        stalled = int(np.sum(wait_max > limit))
    return make_event(RANK_STALL, last_step, rank, stalled_rank=worst, longest_wait_ms=round(float(wait_max[worst]), 3),
                      ranks_median_step_ms=round(typical, 3), limit_ms=round(limit, 3), ranks_stalled=stalled,
                      first_step=first_step, last_step=last_step)
