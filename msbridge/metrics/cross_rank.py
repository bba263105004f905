"""Cross-rank metrics: one AllGather per flush, a watchdog on it, and the run's shared timestamp.

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

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set

import numpy as np

from ..capture.window import Window
from ..errors import ConfigError
from ..names import GLOBAL_LOSS, LOSS, LOSS_MAX, LOSS_MIN, LOSS_STD, OUTLIER_RANK, rank_loss
from ..paths import timestamp
from ..run.ranks import Ranks, communication_ready
from ..sinks.base import RunInfo

log = logging.getLogger("msbridge")

TIMESTAMP_ENV = "MSBRIDGE_TIMESTAMP"
DEFAULT_TIMEOUT_S = 60.0
HEADER = 6  # n, batch size, first step (hi, lo), last step (hi, lo)
_SPLIT = float(1 << 20)  # a step as hi * 2**20 + lo: both parts exact in float32 below 2**44 steps

TimeoutHook = Callable[[Window], None]


def _all_gather(op: Any, array: np.ndarray) -> np.ndarray:
    """Every rank's ``array`` as one row each (world group). Blocks until all ranks have called it."""
    from mindspore import Tensor

    return op(Tensor(array)).asnumpy().reshape(-1, array.size)


def _gather_op() -> Any:
    from mindspore import ops

    return ops.AllGather()


class Watchdog:
    """Calls ``on_timeout(subject)`` from a timer thread when a guarded call outlives ``timeout_s``.

    A collective stuck in C++ cannot be interrupted from Python (no exception,
    no signal handler runs), so the watchdog cannot end the call: it says what
    is stuck and hands the hook what it needs to save the run. A call that
    returns after the timeout fired is logged as such.

    Example:
        >>> dog = Watchdog(60.0, lambda window: dispatcher.close("FAILED"))
        >>> with dog.guard("the cross-rank loss reduction for steps 11-15", window):
        ...     table = all_gather(payload)
    """

    def __init__(self, timeout_s: float, on_timeout: Optional[Callable[[Any], None]] = None) -> None:
        self.timeout_s = float(timeout_s)
        self.on_timeout = on_timeout

    @contextlib.contextmanager
    def guard(self, what: str, subject: Any = None) -> Iterator[None]:
        fired = threading.Event()
        start = time.monotonic()

        def expire() -> None:
            fired.set()
            log.error("msbridge: %s has not returned after %.0f s: a rank has died or hangs, or never reached "
                      "this collective (BridgeMonitor must run on every rank, with the same flush_steps)",
                      what, self.timeout_s)
            if self.on_timeout is not None:
                try:
                    self.on_timeout(subject)
                except Exception:  # the hook runs on a timer thread: log, never raise into nothing
                    log.exception("msbridge: the collective-timeout hook failed")

        timer = threading.Timer(self.timeout_s, expire)
        timer.name, timer.daemon = "msbridge-watchdog", True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            if fired.is_set():
                log.warning("msbridge: %s returned after %.1f s, after its %.0f s timeout had fired",
                            what, time.monotonic() - start, self.timeout_s)


def agree_timestamp(ranks: Ranks, needed: bool, now: Optional[float] = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The ``{timestamp}`` of the run's name and dir, the same on every rank.

    ``MSBRIDGE_TIMESTAMP`` wins when set. Otherwise, when the name uses the
    timestamp and communication is initialised, every rank takes rank 0's time
    (one AllGather of an int64); ranks known only from the environment use their
    own clock, with a warning, since ranks started in different seconds would
    then write to different run dirs.

    Example:
        >>> agree_timestamp(detect_ranks(), needed=True)
        '20261129-101500'
    """
    if os.environ.get(TIMESTAMP_ENV):
        return os.environ[TIMESTAMP_ENV]
    local = time.time() if now is None else now
    if not (needed and ranks.distributed):
        return timestamp(local)
    if ranks.source != "communication":
        log.warning("msbridge: %d ranks but mindspore.communication is not initialised yet, so the ranks cannot "
                    "agree on {timestamp} and may write to different run dirs; call init() before creating "
                    "BridgeMonitor, set %s, or use a run_name without {timestamp}", ranks.world_size, TIMESTAMP_ENV)
        return timestamp(local)
    with Watchdog(timeout_s).guard("sharing rank 0's {timestamp}"):
        table = _all_gather(_gather_op(), np.array([int(local)], dtype=np.int64))
    return timestamp(float(table[0, 0]))


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
        self._op = _gather_op()
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
        table = _all_gather(self._op, payload)
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
