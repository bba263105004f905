"""Cross-rank metrics: one AllGather per flush (guarded by ``capture.collective.Watchdog``).

At every flush each rank sends one float32 vector (``payload``: the window's
steps, its health stop and first finding, its host timing, its losses padded to
``capacity`` steps, so every rank sends the same shape). Every rank reads the
agreed stop from the gathered table (``rank_health``). The global rank turns the
gathered table into per-step metrics over the *reduction group* (the ranks whose loss counts; all by default, the last
pipeline stage under pipeline parallelism):

- ``train/global_loss``: the group's losses averaged with each rank's batch size
  as weight, i.e. the loss over every sample of the step. NaN when any group
  rank's loss is NaN or inf at that step (the job's loss *is* non-finite then);
- ``dist/loss_min``, ``_max``, ``_mean``, ``_std`` (population std across ranks,
  unweighted), ``_p5``, ``_p50``, ``_p95``: over the finite losses of the step, and
  ``dist/loss_nonfinite_ranks``, how many group ranks' losses are not finite
  (``spread``): the same number of series at any world size;
- ``dist/loss/rank_{r}``: the loss of each rank ``per_rank_curves`` picks (every
  rank up to 16 ranks by default), so the curves overlay;
- ``dist/outlier_rank``: one rank per window (the same value at each of its
  steps). Each rank scores the mean over the window of ``|loss - mean| / std``
  (per step, across ranks; non-finite losses and steps where all ranks agree are
  left out); the highest score wins, a tie (always the case with 2 ranks) goes to
  the rank with the higher mean loss. NaN when no rank deviates.

and, per window, the timing metrics and ``straggler``/``rank_stall`` events
(``rank_timing``), ``rank_outlier`` events (``spread``) and ``blame`` events
(``rank_health``). Every rank adds its own ``perf/own_step_time_ms`` and
``perf/data_wait_ms`` to its own last record of the window; other ranks add
nothing global.

Example:
    >>> reducer = make_reducer(run, batch_size=8, capacity=100)   # on every rank, after init()
    >>> agreement = reducer.reduce(window, verdict, health.stop)   # every rank, at the same steps
    >>> window.global_scalars["train/global_loss"]                # rank 0 only
    array([2.31, 2.29, ...])
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from ..capture.collective import DEFAULT_TIMEOUT_S, Watchdog, all_gather, communication_ready, gather_op
from ..capture.window import Window
from ..config.value_checks import straggler_settings
from ..errors import ConfigError
from ..health.runner import Stop, Verdict
from ..names import DATA_WAIT, GLOBAL_LOSS, LOSS, LOSS_SPREAD, OUTLIER_RANK, OWN_STEP_TIME, rank_loss
from ..sinks.base import Event, Record, RunInfo
from .payload import BATCH, FIRST, HEADER, LAST, TIMING, WINDOW_SLOTS, N, Slots, pack, unpack_step
from .rank_health import Blame, agree_stop, first_anomaly, health_stop, ranks_stopping, stop_code, stop_event
from .rank_timing import StepTimer, StragglerWatch, own_step_times
from .spread import Curves, OutlierWatch, curve_ranks, spread_by_step
from .work import Work

log = logging.getLogger("msbridge")

TimeoutHook = Callable[[Window], None]


def cross_rank_metrics(losses: np.ndarray, weights: np.ndarray, ranks: Sequence[int],
                       curves: Optional[Sequence[int]] = None) -> Dict[str, np.ndarray]:
    """Per-step global and spread metrics from the group's losses (``[len(ranks), steps]``).

    ``weights`` are the ranks' batch sizes; ``curves`` the ranks that keep a ``dist/loss/rank_{r}`` curve
    (None: ``per_rank_curves: auto``). See the module docstring for the definitions.

    Example:
        >>> cross_rank_metrics(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, 1.0]), [0, 1])["train/global_loss"]
        array([2., 3.])
    """
    return _metrics(losses, weights, ranks, curve_ranks("auto", ranks) if curves is None else curves)[0]


def _metrics(losses: np.ndarray, weights: np.ndarray, ranks: Sequence[int],
             curves: Sequence[int]) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """The metrics, and each rank's mean finite loss over the window (NaN: none). Works on one row per step."""
    by_step = np.array(np.asarray(losses).T, dtype=np.float64, order="C")
    weights = np.asarray(weights, dtype=np.float64)
    finite = np.isfinite(by_step)
    dense = bool(finite.all())
    with np.errstate(invalid="ignore", divide="ignore"):
        kept = by_step if dense else np.where(finite, by_step, 0.0)
        out = {GLOBAL_LOSS: np.einsum("ij,j->i", kept, weights) / weights.sum()}  # einsum: no BLAS threads
        if dense:
            means = by_step.mean(axis=0)
            tie = means
        else:
            counts = finite.sum(axis=0)
            means = kept.sum(axis=0) / counts
            tie = np.where(counts > 0, means, 0.0)
            out[GLOBAL_LOSS] = np.where(finite.all(axis=1), out[GLOBAL_LOSS], np.nan)
        if curves:
            index = {r: i for i, r in enumerate(ranks)}
            out.update({rank_loss(r): by_step[:, index[r]].copy() for r in curves if r in index})
        stats, deviation = spread_by_step(by_step, finite, LOSS_SPREAD, nonfinite=True)  # sorts by_step
        out.update(stats)
        out[OUTLIER_RANK] = np.full(by_step.shape[0], _outlier(deviation, finite, dense, stats[LOSS_SPREAD + "_std"],
                                                                tie, ranks))
    return out, means


def _outlier(deviation: np.ndarray, finite: np.ndarray, dense: bool, std: np.ndarray, mean_loss: np.ndarray,
             ranks: Sequence[int]) -> float:
    """The rank with the highest mean ``|loss - mean| / std`` over the window (``[steps, ranks]``)."""
    spread_ = np.nan_to_num(std) > 0
    if dense and spread_.all():
        z = np.abs(deviation, out=deviation)
        z /= std[:, None]
        score = z.mean(axis=0)
    else:
        scored = finite & spread_[:, None]
        z = np.where(scored, np.abs(deviation) / np.where(spread_, std, 1.0)[:, None], 0.0)
        steps = scored.sum(axis=0)
        score = np.where(steps > 0, z.sum(axis=0) / np.maximum(steps, 1), 0.0)
    if not (score > 0).any():
        return float("nan")
    tied = score >= score.max() * (1 - 1e-6)
    return float(ranks[int(np.argmax(np.where(tied, mean_loss, -np.inf)))])


@dataclass(frozen=True)
class Agreement:
    """What one per-flush collective decided: the window's verdict (on the global rank with the global
    metrics added and the collective's events), and the stop every rank takes after it, if any.

    Example:
        >>> agreement = reducer.reduce(window, verdict, health.stop)
        >>> agreement.stop.status if agreement.stop else None
        'FAILED'
    """

    verdict: Verdict
    stop: Optional[Stop]


class Reducer:
    """One AllGather per flush: losses, health stops and findings, host timing of every rank.

    Every rank learns the agreed stop (``rank_health``); the global rank derives the
    cross-rank loss metrics, the per-rank timing metrics and ``straggler`` events
    (``rank_timing``), and ``blame`` events (``rank_health``).

    Args:
        rank / world_size / is_global: this process, as in ``RunInfo``.
        batch_size: this rank's samples per step, the weight of its loss in the global mean
            (unknown on any group rank: equal weights).
        capacity: the steps one collective carries, the flush size (a longer window takes more).
        ranks: the reduction group, the ranks whose loss counts (default: all).
        timeout_s: how long the collective may take before ``on_timeout`` runs.
        on_timeout: ``on_timeout(window)``, called from a timer thread while the collective is stuck;
            without one the timeout is only logged.
        straggler: ``{margin, windows}`` of ``rank_timing.StragglerWatch`` (the ``straggler`` setting).
        loss_metrics: add the cross-rank loss metrics to the global rank's records (``global_loss``).
        per_rank_curves: ``"auto"`` (one curve per rank up to ``spread.AUTO_CURVES_MAX_RANKS`` ranks),
            ``"none"`` or a list of ranks: whose loss and step time the global rank also logs one by one.
        gather: ``gather(payload) -> table`` (one row per rank); None: the real AllGather over the world
            group (``capture.collective``). The scale simulation hands in a stand-in for thousands of ranks.
        work: this rank's ``metrics.work.Work``; with it, every rank's ``perf/samples_seen``, ``tokens_seen``,
            ``tflops`` and ``mfu`` take the global batch as the sum of the group's own batches (``_regroup``).

    Example:
        >>> reducer = Reducer(rank=0, world_size=2, is_global=True, batch_size=8, capacity=100)
        >>> agreement = reducer.reduce(window, verdict, health.stop)
        >>> sorted(window.global_scalars)[:2]
        ['dist/loss/rank_0', 'dist/loss/rank_1']
    """

    def __init__(self, rank: int, world_size: int, is_global: bool, batch_size: Optional[int], capacity: int,
                 ranks: Optional[Sequence[int]] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_timeout: Optional[TimeoutHook] = None, straggler: Optional[Mapping[str, Any]] = None,
                 loss_metrics: bool = True, per_rank_curves: Curves = "auto",
                 gather: Optional[Callable[[np.ndarray], np.ndarray]] = None, work: Optional[Work] = None) -> None:
        group = sorted(set(range(world_size) if ranks is None else (int(r) for r in ranks)))
        bad = [r for r in group if not 0 <= r < world_size]
        if not group or bad:
            raise ConfigError(f"reduce_ranks: {list(ranks or [])} must name ranks in 0..{world_size - 1}")
        self.rank, self.world_size, self.is_global = rank, world_size, is_global
        self.batch_size = batch_size
        self.capacity = max(int(capacity), 1)
        self.ranks: List[int] = group
        self.loss_metrics = loss_metrics
        self.work = work
        self.watchdog = Watchdog(timeout_s, on_timeout)
        self.timer = StepTimer()
        self.curves = curve_ranks(per_rank_curves, group)
        if not isinstance(per_rank_curves, str) and is_global:
            missing = sorted(set(int(r) for r in per_rank_curves) - set(self.curves))
            if missing:
                log.warning("msbridge: per_rank_curves: rank(s) %s are not in the reduction group (ranks 0-%d%s), "
                            "so rank 0 logs no loss curve for them", missing, world_size - 1,
                            "" if ranks is None else ", reduce_ranks")
        self._stragglers = StragglerWatch(world_size, **straggler_settings(straggler or {}),
                                          curves=curve_ranks(per_rank_curves, range(world_size)))
        self._outliers = OutlierWatch()
        self._blame = Blame(quiet_steps=self.capacity)
        if gather is None:
            op = gather_op()
            gather = lambda payload: all_gather(op, payload)  # noqa: E731
        self._all_gather = gather
        self._warned: Set[int] = set()

    @property
    def on_timeout(self) -> Optional[TimeoutHook]:
        return self.watchdog.on_timeout

    @on_timeout.setter
    def on_timeout(self, hook: Optional[TimeoutHook]) -> None:
        self.watchdog.on_timeout = hook

    def reduce(self, window: Window, verdict: Verdict, stop: Optional[Stop] = None,
               timing: Optional[np.ndarray] = None) -> Agreement:
        """Gather the window on every rank (``verdict``: this rank's health verdict of it, ``stop``: its
        health stop, ``timing``: its drained ``StepTimer``, else ``self.timer`` is drained here); on the global
        rank, fill ``window.global_scalars`` and add them to the records."""
        n = len(window)
        if n == 0:
            return Agreement(verdict, stop)
        loss = window.scalars.get(LOSS)
        loss = np.full(n, np.nan) if loss is None else loss
        anomaly = first_anomaly(verdict.events)
        slots = Slots(n=0, batch=self.batch_size or 0, first=0, last=0, stop_code=stop_code(stop),
                      stop_check=stop.check if stop else None, stop_step=stop.step if stop else 0,
                      anomaly_check=anomaly.detail.get("check") if anomaly else None,
                      anomaly_step=anomaly.step if anomaly else 0,
                      timing=self.timer.drain() if timing is None else timing)
        what = f"the cross-rank loss reduction for steps {int(window.steps[0])}-{int(window.steps[-1])}"
        parts = []
        with self.watchdog.guard(what, window):
            for start in range(0, n, self.capacity):
                steps = window.steps[start:start + self.capacity]
                slots.n, slots.first, slots.last = len(steps), int(steps[0]), int(steps[-1])
                parts.append(self._gather(slots, loss[start:start + self.capacity]))
        table = parts[0][0]
        self._own_timing(verdict.records, table)
        self._regroup(window, verdict.records, table)
        events: List[Event] = []
        agreed = agree_stop(table)
        last = int(window.steps[-1])
        if agreed is not None:
            events.append(stop_event(agreed, last, self.rank, ranks_stopping(table)))
            stop = health_stop(agreed, stop, self.rank)
        if self.is_global:
            losses = parts[0][1] if len(parts) == 1 else np.hstack([p[1] for p in parts])
            if len(self.ranks) < self.world_size:
                losses = losses[self.ranks]
            events += self._global(window, verdict.records, table, losses)
        return Agreement(Verdict(list(verdict.records), list(verdict.events) + events), stop)

    def _own_timing(self, records: Sequence[Record], table: np.ndarray) -> None:
        """This rank's own step time and data wait of the window onto its last record (every rank)."""
        own = float(own_step_times(table[:, TIMING:HEADER])[self.rank])
        wait = float(table[self.rank, TIMING + 2])
        if records:
            records[-1].values.update((k, v) for k, v in ((OWN_STEP_TIME, own), (DATA_WAIT, wait)) if np.isfinite(v))

    def _regroup(self, window: Window, records: Sequence[Record], table: np.ndarray) -> None:
        """Every rank: the work columns again with the global batch summed from the group's gathered batch
        sizes (ranks may feed different batches; each assumed its own x the ranks' count)."""
        work = self.work.regrouped(table[self.ranks, BATCH].astype(np.float64)) if self.work is not None else None
        if work is None or work == self.work:
            return
        columns = work.columns(window.steps, window.step_time_s)
        for i, rec in enumerate(records):
            rec.values.update((name, float(values[i])) for name, values in columns.items() if name in rec.values)

    def _global(self, window: Window, records: Sequence[Record], table: np.ndarray, losses: np.ndarray) -> List[Event]:
        """The global rank's share: the cross-rank metrics onto ``records``; straggler, stall, outlier and
        blame events."""
        batches = table[self.ranks, BATCH].astype(np.float64)
        weights = batches if (batches > 0).all() else np.ones(len(self.ranks))
        metrics, means = _metrics(losses, weights, self.ranks, self.curves)
        window.global_scalars.update(metrics)
        first, last = int(window.steps[0]), int(window.steps[-1])
        timing, events = self._stragglers.observe(table[:, TIMING:HEADER], first, last, self.rank)
        events += self._outliers.observe(means, self.ranks, window.steps, self.rank)
        events += self._blame.observe(table, losses, self.ranks, window.steps, self.rank)
        if self.loss_metrics:
            columns = list(window.global_scalars.items())
            for i, rec in enumerate(records):
                rec.values.update((name, float(values[i])) for name, values in columns)
        if records:
            records[-1].values.update(timing)
        return events

    def _gather(self, slots: Slots, loss: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        """One collective: the gathered table, and every rank's losses for these steps (NaN where a
        rank's steps differ)."""
        k = slots.n
        payload = pack(slots, loss, self.capacity)
        table = self._all_gather(payload)
        losses = table[:, HEADER:HEADER + k]  # float32, as gathered: read, never written in place
        if self.is_global:
            same = (table[:, WINDOW_SLOTS] == payload[WINDOW_SLOTS]).all(axis=1)
            if not same.all():
                losses = losses.astype(np.float64)
            for r in np.flatnonzero(~same):
                losses[r] = np.nan
                if r not in self._warned:
                    self._warned.add(int(r))
                    log.warning("msbridge: rank %d flushed %d steps (%d-%d) while rank %d flushed steps %d-%d; its "
                                "losses are left out of those windows", r, int(table[r, N]),
                                unpack_step(table[r], FIRST), unpack_step(table[r], LAST),
                                self.rank, slots.first, slots.last)
        return table, losses


def make_reducer(run: RunInfo, batch_size: Optional[int], capacity: int, ranks: Optional[Sequence[int]] = None,
                 timeout_s: float = 60.0, on_timeout: Optional[TimeoutHook] = None, **options: Any) -> Reducer:
    """The reducer of a distributed run; build it on every rank, after ``mindspore.communication.init()``.

    ``capacity`` is the most steps one flush holds (``flush_steps``); ``ranks`` are the ranks whose
    losses make the global loss (all when None; ``reduce_ranks``), ``timeout_s`` how long a rank waits
    for the others (``collective_timeout_s``); ``options`` go to ``Reducer`` (straggler settings ...).

    Example:
        >>> reducer = make_reducer(run, batch_size=8, capacity=100, on_timeout=close_failed)
    """
    if not communication_ready():
        raise ConfigError(
            f"world size {run.world_size} (from RANK_SIZE) but mindspore.communication is not initialised, so "
            "ranks cannot exchange losses; call mindspore.communication.init() before model.train, or unset "
            "RANK_ID/RANK_SIZE to train as a single process")
    return Reducer(rank=run.rank, world_size=run.world_size, is_global=run.is_global, batch_size=batch_size,
                   capacity=capacity, ranks=ranks, timeout_s=timeout_s, on_timeout=on_timeout, **options)
