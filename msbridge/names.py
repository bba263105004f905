"""Metric names, the same in every sink; importable without MindSpore (in-graph code uses them too).

    train/loss  train/loss_ema  train/grad_norm  train/lr  train/loss_scale
    train/overflow  train/epoch
    perf/step_time_ms  perf/samples_per_s  perf/tokens_per_s  perf/monitor_overhead
    global (rank 0 only): train/global_loss  dist/loss_min  dist/loss_max
    dist/loss_std  dist/outlier_rank  dist/loss/rank_{r}

Example:
    >>> from msbridge.names import LOSS, rank_loss
    >>> LOSS, rank_loss(3)
    ('train/loss', 'dist/loss/rank_3')
"""
from __future__ import annotations

LOSS = "train/loss"
GLOBAL_LOSS = "train/global_loss"
LOSS_EMA = "train/loss_ema"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
LOSS_SCALE = "train/loss_scale"
OVERFLOW = "train/overflow"
EPOCH = "train/epoch"
STEP_TIME = "perf/step_time_ms"
SAMPLES_PER_S = "perf/samples_per_s"
TOKENS_PER_S = "perf/tokens_per_s"
MONITOR_OVERHEAD = "perf/monitor_overhead"

# Cross-rank metrics, written by the global rank only.
DIST_PREFIX = "dist/"
LOSS_MIN = "dist/loss_min"
LOSS_MAX = "dist/loss_max"
LOSS_STD = "dist/loss_std"
OUTLIER_RANK = "dist/outlier_rank"


def rank_loss(rank: int) -> str:
    """Name of one rank's local loss as the global rank logs it, so the curves overlay."""
    return f"dist/loss/rank_{rank}"


def is_global_metric(name: str) -> bool:
    """True for metrics about the whole job (global loss, cross-rank spread), False for one rank's own."""
    return name == GLOBAL_LOSS or name.startswith(DIST_PREFIX)


#: The canonical per-step scalars a train step may hand over, in ring-buffer column order.
STEP_SCALARS = (LOSS, GRAD_NORM, LR, LOSS_SCALE, OVERFLOW)

#: Where each scalar sits in a train cell's output tuple; the host buffer and the device ring both read these.
#: mindformers' train cells: ``(loss, overflow, loss_scale, lr, global_norm[, local norms ...])``.
MINDFORMERS_OUTPUT = (LOSS, OVERFLOW, LOSS_SCALE, LR, GRAD_NORM)
#: MindSpore's ``nn.TrainOneStepWithLossScaleCell``: ``(loss, overflow, loss_scale)``.
LOSS_SCALE_OUTPUT = (LOSS, OVERFLOW, LOSS_SCALE)

#: What a tracker shows first, in this order: the loss (local, global), grad norm, lr, throughput.
#: TensorBoard's custom-scalars layout and MindInsight's tag order follow it.
HEADLINE = (LOSS, GLOBAL_LOSS, GRAD_NORM, LR, SAMPLES_PER_S, TOKENS_PER_S)
