"""Cross-rank metrics: one AllGather per flush (guarded by ``run.rank_sync.Watchdog``).

At every flush each rank sends one float32 vector, padded to ``capacity`` steps so
every rank sends the same shape::

    [n, batch_size, first_step (2 floats), last_step (2 floats), loss_1 ... loss_n, NaN ...]

The global rank turns the gathered table into per-step metrics over the
*reduction group* (the ranks whose loss counts; all by default, the last
pipeline stage under pipeline parallelism):

- ``train/global_loss``: the group's losses averaged with each rank's batch size
  as weight, i.e. the loss over every sample of the step. NaN when any group
  rank's loss is NaN or inf at that step (the job's loss *is* non-finite then);
- ``dist/loss_min``, ``dist/loss_max``, ``dist/loss_std`` (population std across
  ranks, unweighted): over the finite losses of the step;
- ``dist/loss/rank_{r}``: every group rank's loss, so the curves overlay;
- ``dist/outlier_rank``: one rank per window (the same value at each of its
  steps). Each rank scores the mean over the window of ``|loss - mean| / std``
  (per step, across ranks; non-finite losses and steps where all ranks agree are
  left out); the highest score wins, a tie (always the case with 2 ranks) goes to
  the rank with the higher mean loss. NaN when no rank deviates.

Other ranks gather too (the collective is symmetric) but add nothing global.

Example:
    >>> reducer = make_reducer(run, batch_size=8, capacity=100)   # on every rank, after init()
    >>> reducer.reduce(window)                               # every rank, at the same steps
    >>> window.global_scalars["train/global_loss"]           # rank 0 only
    array([2.31, 2.29, ...])
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence, Set

import numpy as np

from ..capture.window import Window
from ..errors import ConfigError
from ..names import GLOBAL_LOSS, LOSS, LOSS_MAX, LOSS_MIN, LOSS_STD, OUTLIER_RANK, rank_loss
from ..run.rank_sync import DEFAULT_TIMEOUT_S, Watchdog, all_gather, gather_op
from ..run.ranks import communication_ready
from ..sinks.base import RunInfo

log = logging.getLogger("msbridge")

HEADER = 6  # n, batch size, first step (hi, lo), last step (hi, lo)
_SPLIT = float(1 << 20)  # a step as hi * 2**20 + lo: both parts exact in float32 below 2**44 steps

TimeoutHook = Callable[[Window], None]


def cross_rank_metrics(losses: np.ndarray, weights: np.ndarray, ranks: Sequence[int]) -> Dict[str, np.ndarray]:
    """Per-step global and spread metrics from the group's losses (``[len(ranks), steps]``).

    ``weights`` are the ranks' batch sizes. See the module docstring for the definitions.

    Example:
        >>> cross_rank_metrics(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, 1.0]), [0, 1])["train/global_loss"]
        array([2., 3.])
    """
    with np.errstate(invalid="ignore", divide="ignore"):  # inf - inf in branches np.where throws away
        return _metrics(np.asarray(losses, dtype=np.float64), np.asarray(weights, dtype=np.float64), ranks)


def _metrics(losses: np.ndarray, weights: np.ndarray, ranks: Sequence[int]) -> Dict[str, np.ndarray]:
    finite = np.isfinite(losses)
    count = finite.sum(axis=0)
    some = count > 0
    kept = np.where(finite, losses, 0.0)
    mean = np.where(some, kept.sum(axis=0) / np.maximum(count, 1), np.nan)
    deviation = np.where(finite, losses - mean, 0.0)
    std = np.where(some, np.sqrt((deviation ** 2).sum(axis=0) / np.maximum(count, 1)), np.nan)
    out = {
        GLOBAL_LOSS: np.where(finite.all(axis=0), (weights[:, None] * kept).sum(axis=0) / weights.sum(), np.nan),
        LOSS_MIN: np.where(some, np.where(finite, losses, np.inf).min(axis=0), np.nan),
        LOSS_MAX: np.where(some, np.where(finite, losses, -np.inf).max(axis=0), np.nan),
        LOSS_STD: std,
        OUTLIER_RANK: np.full(losses.shape[1], _outlier(losses, finite, deviation, std, ranks)),
    }
    out.update({rank_loss(r): losses[i] for i, r in enumerate(ranks)})
    return out


def _outlier(losses: np.ndarray, finite: np.ndarray, deviation: np.ndarray, std: np.ndarray,
             ranks: Sequence[int]) -> float:
    spread = np.nan_to_num(std) > 0
    scored = finite & spread[None, :]
    z = np.where(scored, np.abs(deviation) / np.where(spread, std, 1.0), 0.0)
    steps = scored.sum(axis=1)
    score = np.where(steps > 0, z.sum(axis=1) / np.maximum(steps, 1), 0.0)
    if not (score > 0).any():
        return float("nan")
    mean_loss = np.where(finite, losses, 0.0).sum(axis=1) / np.maximum(finite.sum(axis=1), 1)
    tied = score >= score.max() * (1 - 1e-6)
    return float(ranks[int(np.argmax(np.where(tied, mean_loss, -np.inf)))])


class Reducer:
    """One AllGather of the window's losses per flush; the global rank derives the cross-rank metrics.

    Args:
        rank / world_size / is_global: this process, as in ``RunInfo``.
        batch_size: this rank's samples per step, the weight of its loss in the global mean
            (unknown on any group rank: equal weights).
        capacity: the steps one collective carries, the flush size (a longer window takes more).
        ranks: the reduction group, the ranks whose loss counts (default: all).
        timeout_s: how long the collective may take before ``on_timeout`` runs.
        on_timeout: ``on_timeout(window)``, called from a timer thread while the collective is stuck;
            without one the timeout is only logged.

    Example:
        >>> reducer = Reducer(rank=0, world_size=2, is_global=True, batch_size=8, capacity=100)
        >>> reducer.reduce(window)
        >>> sorted(window.global_scalars)[:2]
        ['dist/loss/rank_0', 'dist/loss/rank_1']
    """

    def __init__(self, rank: int, world_size: int, is_global: bool, batch_size: Optional[int], capacity: int,
                 ranks: Optional[Sequence[int]] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_timeout: Optional[TimeoutHook] = None) -> None:
        group = sorted(set(range(world_size) if ranks is None else (int(r) for r in ranks)))
        bad = [r for r in group if not 0 <= r < world_size]
        if not group or bad:
            raise ConfigError(f"reduce_ranks: {list(ranks or [])} must name ranks in 0..{world_size - 1}")
        self.rank, self.world_size, self.is_global = rank, world_size, is_global
        self.batch_size = batch_size
        self.capacity = max(int(capacity), 1)
        self.ranks: List[int] = group
        self.watchdog = Watchdog(timeout_s, on_timeout)
        self._op = gather_op()
        self._warned: Set[int] = set()

    @property
    def on_timeout(self) -> Optional[TimeoutHook]:
        return self.watchdog.on_timeout

    @on_timeout.setter
    def on_timeout(self, hook: Optional[TimeoutHook]) -> None:
        self.watchdog.on_timeout = hook

    def reduce(self, window: Window) -> None:
        """Gather the window on every rank; on the global rank, fill ``window.global_scalars``."""
        n = len(window)
        if n == 0:
            return
        loss = window.scalars.get(LOSS)
        loss = np.full(n, np.nan) if loss is None else loss
        what = f"the cross-rank loss reduction for steps {int(window.steps[0])}-{int(window.steps[-1])}"
        parts = []
        with self.watchdog.guard(what, window):
            for start in range(0, n, self.capacity):
                end = start + self.capacity
                parts.append(self._gather(window.steps[start:end], loss[start:end]))
        if not self.is_global:
            return
        losses = np.hstack([p[0] for p in parts])[self.ranks]
        batches = parts[0][1][self.ranks]
        weights = batches if (batches > 0).all() else np.ones(len(self.ranks))
        window.global_scalars.update(cross_rank_metrics(losses, weights, self.ranks))

    def _gather(self, steps: np.ndarray, loss: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        """One collective: every rank's losses for these steps (NaN where a rank's steps differ) and batch sizes."""
        k = len(steps)
        payload = np.full(HEADER + self.capacity, np.nan, dtype=np.float32)
        first, last = int(steps[0]), int(steps[-1])
        payload[:HEADER] = [k, self.batch_size or 0, first // _SPLIT, first % _SPLIT, last // _SPLIT, last % _SPLIT]
        payload[HEADER:HEADER + k] = loss
        table = all_gather(self._op, payload)
        losses = table[:, HEADER:HEADER + k].astype(np.float64)
        if self.is_global:
            same = (table[:, [0, 2, 3, 4, 5]] == payload[[0, 2, 3, 4, 5]]).all(axis=1)
            for r in np.flatnonzero(~same):
                losses[r] = np.nan
                if r not in self._warned:
                    self._warned.add(int(r))
                    log.warning("msbridge: rank %d flushed %d steps (%d-%d) while rank %d flushed steps %d-%d; its "
                                "losses are left out of those windows", r, int(table[r, 0]),
                                int(table[r, 2] * _SPLIT + table[r, 3]), int(table[r, 4] * _SPLIT + table[r, 5]),
                                self.rank, first, last)
        return losses, table[:, 1].astype(np.float64)


def make_reducer(run: RunInfo, batch_size: Optional[int], capacity: int, ranks: Optional[Sequence[int]] = None,
                 timeout_s: float = 60.0, on_timeout: Optional[TimeoutHook] = None) -> Reducer:
    """The reducer of a distributed run; build it on every rank, after ``mindspore.communication.init()``.

    ``capacity`` is the most steps one flush holds (``flush_steps``); ``ranks`` are the ranks whose
    losses make the global loss (all when None; ``reduce_ranks``), ``timeout_s`` how long a rank waits
    for the others (``collective_timeout_s``).

    Example:
        >>> reducer = make_reducer(run, batch_size=8, capacity=100, on_timeout=close_failed)
    """
    if not communication_ready():
        raise ConfigError(
            f"world size {run.world_size} (from RANK_SIZE) but mindspore.communication is not initialised, so "
            "ranks cannot exchange losses; call mindspore.communication.init() before model.train, or unset "
            "RANK_ID/RANK_SIZE to train as a single process")
    return Reducer(rank=run.rank, world_size=run.world_size, is_global=run.is_global, batch_size=batch_size,
                   capacity=capacity, ranks=ranks, timeout_s=timeout_s, on_timeout=on_timeout)
