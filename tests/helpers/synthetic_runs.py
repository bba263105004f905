"""Synthetic runs with known answers, written through the real ``JsonlSink``, for plot and diagnose.

A ``Scenario`` holds each rank's metric columns (one value per step) and the
events; ``write_run`` turns it into a run directory exactly as training would
(rank 0 also gets the global loss, the cross-rank spread and every rank's loss).

The clean run is deliberately noisy and realistic: a loss that falls fast and
then slowly, a grad norm that rises during lr warm-up and then decays with
heavy-tailed noise, a throughput with a slow first (compile) step. Each
anomaly scenario is the clean run with one thing changed, and ``truth`` holds
the answer diagnose should give.

Example:
    >>> run_dir = write_run(tmp_path / "run", loss_spike(at=(150, 220)))
    >>> diagnose(read_run(run_dir)).findings[0].steps
    [150, 220]
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
from msbridge.adapters.jsonl_sink import JsonlSink, rank_file

from msbridge.names import (
    GLOBAL_LOSS,
    GRAD_NORM,
    LOSS,
    LOSS_EMA,
    LOSS_MAX,
    LOSS_MIN,
    LOSS_STD,
    LR,
    OUTLIER_RANK,
    SAMPLES_PER_S,
    STEP_TIME,
    TOKENS_PER_S,
    rank_loss,
)
from msbridge.sinks.base import Event, Record, RunInfo

WARMUP = 30
BATCH, SEQ = 16, 32


@dataclass
class Scenario:
    """Per-rank metric columns over ``steps``, events, and the answer diagnose should give."""

    name: str
    steps: np.ndarray
    ranks: Dict[int, Dict[str, np.ndarray]]
    events: List[Event] = field(default_factory=list)
    truth: Dict[str, Any] = field(default_factory=dict)
    at_steps: Dict[int, Dict[str, float]] = field(default_factory=dict)  # rank 0's per-window metrics


def _healthy_grad(s: np.ndarray) -> np.ndarray:
    """Climbs while the lr warms up, then decays."""
    return np.where(s <= WARMUP, 0.5 + 3.5 * s / WARMUP, 0.8 + 3.2 * np.exp(-(s - WARMUP) / 120))


def _rising_grad(s: np.ndarray) -> np.ndarray:
    """Climbs during warm-up and keeps climbing, about 6x over the rest of a 300-step run."""
    return np.where(s <= WARMUP, 0.5 + 3.5 * s / WARMUP, 4.0 * np.exp((s - WARMUP) / 150))


def clean(steps: int = 300, world_size: int = 1, seed: int = 0, cosine: bool = True,
          grad_trend: Callable[[np.ndarray], np.ndarray] = _healthy_grad) -> Scenario:
    """A healthy converging run (lr warm-up, then cosine decay or constant): nothing should fire."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1, dtype=np.float64)
    peak = 3e-3
    after = peak * (0.1 + 0.45 * (1 + np.cos(np.pi * (s - WARMUP) / max(steps - WARMUP, 1)))) if cosine else peak
    lr = np.where(s <= WARMUP, peak * s / WARMUP, after)
    grad = grad_trend(s) * np.exp(0.12 * rng.standard_t(5, steps))  # heavy tails: the odd 1.5x step
    true_loss = 0.6 + 3.4 * np.exp(-s / 60)
    ranks = {r: {LOSS: true_loss * np.exp(0.04 * rng.standard_normal(steps)), GRAD_NORM: grad.copy(), LR: lr}
             for r in range(world_size)}
    speed = 160 * np.exp(0.03 * rng.standard_normal(steps))
    speed[0] = 6.5  # the first step compiles the graph
    for columns in ranks.values():
        columns[SAMPLES_PER_S] = speed
        columns[TOKENS_PER_S] = speed * SEQ
        columns[STEP_TIME] = 1e3 * BATCH / speed
    return Scenario("clean", s.astype(np.int64), ranks)


def lr_too_high(steps: int = 300, seed: int = 0, cosine: bool = False) -> Scenario:
    """After warm-up the loss keeps falling while the grad norm grows about 6x."""
    sc = clean(steps, seed=seed, cosine=cosine, grad_trend=_rising_grad)
    sc.name, sc.truth = "lr_too_high", {"check": "lr_too_high"}
    return sc


def diverging(steps: int = 300, seed: int = 0) -> Scenario:
    """From step 150 the loss and the grad norm climb together."""
    sc = clean(steps, seed=seed)
    s = sc.steps.astype(np.float64)
    climb = np.exp(np.clip(s - 150, 0, None) / 40)
    sc.ranks[0][LOSS] = sc.ranks[0][LOSS] * climb
    sc.ranks[0][GRAD_NORM] = sc.ranks[0][GRAD_NORM] * climb
    sc.name, sc.truth = "diverging", {"check": "lr_too_high"}
    return sc


def loss_spike(at: Sequence[int] = (150, 220), rank: int = 1, world_size: int = 2, seed: int = 0) -> Scenario:
    """One rank's local loss jumps 4x for one step at each of ``at``, then is back."""
    sc = clean(world_size=world_size, seed=seed)
    for step in at:
        sc.ranks[rank][LOSS][step - 1] *= 4.0
    sc.name, sc.truth = "loss_spike", {"check": "loss_spike", "steps": list(at), "rank": rank}
    return sc


def loss_jump(at: int = 180, seed: int = 0) -> Scenario:
    """The loss doubles at ``at`` and stays there: a level change, not a spike (no recovery)."""
    sc = clean(seed=seed)
    sc.ranks[0][LOSS][at - 1:] *= 2.0
    sc.name = "loss_jump"
    return sc


def slow_rank(rank: int = 2, world_size: int = 4, excess: float = 0.12, seed: int = 0) -> Scenario:
    """One rank's local loss sits ``excess`` above the others at every step."""
    sc = clean(world_size=world_size, seed=seed)
    sc.ranks[rank][LOSS] = sc.ranks[rank][LOSS] * (1 + excess)
    sc.name, sc.truth = "rank_outlier", {"check": "rank_outlier", "rank": rank}
    return sc


def periodic_grad_spikes(period: int = 25, seed: int = 0) -> Scenario:
    """The grad norm triples every ``period`` steps (gradient accumulation or a loader cycle)."""
    sc = clean(seed=seed)
    grad = sc.ranks[0][GRAD_NORM]
    grad[period - 1::period] *= 3.0
    sc.name, sc.truth = "periodic_grad_spikes", {"check": "periodic_grad_spikes", "period": period}
    return sc


def nan_steps(at: Sequence[int] = (160,), seed: int = 0) -> Scenario:
    """NaN loss and grad norm at ``at``, each with the anomaly event Health would write."""
    sc = clean(seed=seed)
    for step in at:
        sc.ranks[0][LOSS][step - 1] = math.nan
        sc.ranks[0][GRAD_NORM][step - 1] = math.inf
        sc.events.append(Event("anomaly", step, 0, 1000.0 + step, {"check": "nonfinite_loss", "value": math.nan}))
    sc.name, sc.truth = "nonfinite", {"check": "nonfinite", "steps": list(at)}
    return sc


def straggler(rank: int = 3, world_size: int = 4, slower: float = 0.3, slow_from: int = 4, flush: int = 10,
              stall_rank: int = 1, stall_window: int = 6, seed: int = 0) -> Scenario:
    """Each window's own step time per rank (``dist/step_time_ms/rank_{r}`` on its last step): ``rank`` is
    ``slower`` from window ``slow_from`` on, ``stall_rank`` is 20x slower in window ``stall_window`` only."""
    sc = clean(world_size=world_size, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for i, step in enumerate(range(flush, len(sc.steps) + 1, flush), start=1):
        own = 10.0 * np.exp(0.02 * rng.standard_normal(world_size))
        if i >= slow_from:
            own[rank] *= 1 + slower
        if i == stall_window:
            own[stall_rank] *= 20
        sc.at_steps[step] = {f"dist/step_time_ms/rank_{r}": float(v) for r, v in enumerate(own)}
    sc.name = "straggler"
    sc.truth = {"check": "straggler", "rank": rank, "since": slow_from * flush - flush + 1}
    return sc


def nonfinite_on_one_rank(rank: int = 1, at: int = 160, world_size: int = 4, seed: int = 0) -> Scenario:
    """``rank``'s loss turns NaN at ``at``; the AllReduce spreads it to every other rank one step later."""
    sc = clean(world_size=world_size, seed=seed)
    for r, columns in sc.ranks.items():
        columns[LOSS] = columns[LOSS].copy()
        columns[LOSS][(at if r == rank else at + 1) - 1:] = math.nan
    sc.name, sc.truth = "first_anomaly", {"check": "first_anomaly", "rank": rank, "step": at}
    return sc


LAYERS = ("embedding", "layers.0", "layers.1", "layers.2", "lm_head")


def with_layer_norms(sc: Scenario, spikes: Dict[str, Sequence[int]] = None, factor: float = 6.0,
                     seed: int = 0) -> Scenario:
    """Rank 0's grad norm split into ``LAYERS`` (``grad_norm/<layer>``, their squares summing to it);
    each layer in ``spikes`` has its grad norm ``factor`` x at those steps (the total follows)."""
    rng = np.random.default_rng(seed)
    columns = sc.ranks[0]
    shares = rng.dirichlet(np.full(len(LAYERS), 50.0), size=len(sc.steps))  # squared shares, fairly steady
    norms = {name: columns[GRAD_NORM] * np.sqrt(shares[:, i]) for i, name in enumerate(LAYERS)}
    for name, steps in (spikes or {}).items():
        for step in steps:
            norms[name][step - 1] *= factor
    columns.update({f"grad_norm/{name}": values for name, values in norms.items()})
    columns[GRAD_NORM] = np.sqrt(sum(np.square(v) for v in norms.values()))
    return sc


def without(sc: Scenario, name: str) -> Scenario:
    """The scenario with one metric never recorded (e.g. no grad norm)."""
    for columns in sc.ranks.values():
        columns.pop(name, None)
    return sc


def _ema(values: np.ndarray, decay: float = 0.9) -> np.ndarray:
    out, ema = np.empty_like(values), None
    for i, v in enumerate(values):
        if math.isfinite(v):
            ema = v if ema is None else decay * ema + (1 - decay) * v
        out[i] = math.nan if ema is None else ema
    return out


def _global_columns(sc: Scenario) -> Dict[str, np.ndarray]:
    """What rank 0's reducer adds: global loss, spread, outlier rank and every rank's loss."""
    losses = np.stack([sc.ranks[r][LOSS] for r in sorted(sc.ranks)], axis=1)
    mean = losses.mean(axis=1)
    columns = {GLOBAL_LOSS: mean}
    if len(sc.ranks) > 1:
        with np.errstate(invalid="ignore"):
            columns.update({LOSS_MIN: losses.min(axis=1), LOSS_MAX: losses.max(axis=1), LOSS_STD: losses.std(axis=1),
                            OUTLIER_RANK: np.abs(losses - mean[:, None]).argmax(axis=1).astype(np.float64)})
        columns.update({rank_loss(r): losses[:, i] for i, r in enumerate(sorted(sc.ranks))})
    return columns


def write_run(run_dir: "str | os.PathLike", sc: Scenario, flush_steps: int = 50) -> str:
    """Write ``sc`` as a run directory with one ``JsonlSink`` per rank; returns the path."""
    run_dir = str(run_dir)
    world = len(sc.ranks)
    for rank in sorted(sc.ranks):
        columns = dict(sc.ranks[rank])
        if LOSS in columns:
            columns[LOSS_EMA] = _ema(columns[LOSS])
        if rank == 0 and LOSS in columns:
            columns.update(_global_columns(sc))
        sink = JsonlSink(fsync=False)
        sink.open(RunInfo(run_id="synthetic0001", run_name=f"synthetic-{sc.name}", experiment="synthetic",
                          rank=rank, world_size=world, is_global=rank == 0, run_dir=run_dir))
        names = list(columns)
        for start in range(0, len(sc.steps), flush_steps):
            block = range(start, min(start + flush_steps, len(sc.steps)))
            records = [Record(int(sc.steps[i]), rank, 1000.0 + float(sc.steps[i]),
                              {**{n: float(columns[n][i]) for n in names},
                               **(sc.at_steps.get(int(sc.steps[i]), {}) if rank == 0 else {})}) for i in block]
            last = records[-1].step
            events = [e for e in sc.events if e.rank == rank and last - flush_steps < e.step <= last]
            sink.write(records, events)
        sink.close("FINISHED")
    return run_dir


def cut_last_line(run_dir: str, rank: int = 0) -> None:
    """Cut the last line of a rank file in half, as a process killed mid-write leaves it."""
    path = rank_file(run_dir, rank)
    with open(path, "rb+") as fh:
        data = fh.read()
        start = data.rstrip(b"\n").rfind(b"\n") + 1
        fh.truncate(start + (len(data) - start) // 2)


def write_header_only(run_dir: str, schema_version: int = 1) -> str:
    """A run whose rank 0 file holds only a header (of any schema version)."""
    path = rank_file(run_dir, 0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "header", "schema_version": schema_version, "run_id": "x",
                             "run_name": "future", "experiment": "e", "rank": 0, "world_size": 1}) + "\n")
    return run_dir


def train_real_run(run_dir: str, steps: int = 200, learning_rate: float = 0.01, poison_step: int = 0) -> str:
    """A real short MindSpore run (Dense regressor, CPU, a few seconds) recording loss, grad norm and lr.

    The train step returns mindformers' layout ``(loss, overflow, loss_scale, lr, global_norm)``
    with lr left to msbridge's reader, so the jsonl holds a real grad norm. ``poison_step``
    (1-based) feeds a NaN batch there, which poisons the weights from then on.
    """
    import mindspore as ms
    from mindspore import nn, ops
    from mindspore.train import Model

    from helpers.training import regression_data
    from msbridge import BridgeMonitor

    class GradNormStep(nn.TrainOneStepCell):
        def construct(self, *inputs):
            loss = self.network(*inputs)
            grads = self.grad(self.network, self.weights)(*inputs, ops.fill(loss.dtype, loss.shape, 1.0))
            norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
            self.optimizer(grads)
            return loss, ops.zeros((), ms.bool_), ops.ones((), ms.float32), None, norm  # never skips a step

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    step = GradNormStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), learning_rate))
    monitor = BridgeMonitor({"sinks": ["jsonl"], "output_dir": run_dir, "run_name": "real-regression",
                             "flush_steps": 50}, progress=False)
    Model(step).train(1, regression_data(steps, poison_step=poison_step), callbacks=[monitor],
                      dataset_sink_mode=False)
    return run_dir
