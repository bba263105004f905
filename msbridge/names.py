"""Metric names, the same in every sink; importable without MindSpore (in-graph code uses them too).

    train/loss  train/loss_ema  train/grad_norm  train/lr  train/loss_scale
    train/overflow  train/epoch
    mindformers' parts of the loss (per flush): train/lm_loss  train/aux_loss  train/mtp_loss  train/indexer_loss
    perf/step_time_ms  perf/samples_per_s  perf/tokens_per_s  perf/monitor_overhead
    perf/samples_seen  perf/tokens_seen  perf/tflops  perf/mfu  perf/data_wait_pct (+ perf/data_wait_ms)
    distributed, every rank (per flush): perf/own_step_time_ms  perf/data_wait_ms
    global (rank 0 only), per step: train/global_loss  dist/loss_{min,max,mean,std,p5,p50,p95}
    dist/loss_nonfinite_ranks  dist/outlier_rank  (dist/loss/rank_{r}: per_rank_curves only)
    global, per flush window: dist/step_time_ms_{min,max,mean,std,p5,p50,p95}  dist/slowest_rank
    dist/data_wait_ms_{min,max,mean,std,p5,p50,p95}  (dist/step_time_ms/rank_{r}: per_rank_curves only)
    model internals: grad_norm/{param}  weight_norm/{param}  optimizer/{state}_norm/{param}
    attention/max_logit/{layer}  attention/max_logit_max  attention/max_logit_mean  (from mindformers)
    histogram event tags: weights/{param}  grads/{param}
    validation, at the training step it ran: eval/<metric>  eval/loss  eval/time_s  eval/samples
    (data parallel, global rank: eval/global_<metric>)
    the run's objective, on the global rank: objective/best  objective/best_step  objective/final
    memory/device_allocated_mb  memory/device_peak_mb  memory/host_rss_mb  memory/host_rss_peak_mb
    system/npu_utilization_pct  system/npu_hbm_used_mb  system/npu_hbm_total_mb
    system/npu_memory_used_mb  system/npu_memory_total_mb  system/npu_temperature_c  system/npu_power_w

Example:
    >>> from msbridge.names import LOSS, rank_loss
    >>> LOSS, rank_loss(3)
    ('train/loss', 'dist/loss/rank_3')
"""
from __future__ import annotations

from typing import AbstractSet, Optional

LOSS = "train/loss"
GLOBAL_LOSS = "train/global_loss"
LOSS_EMA = "train/loss_ema"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
LOSS_SCALE = "train/loss_scale"
OVERFLOW = "train/overflow"
EPOCH = "train/epoch"
#: mindformers' parts of the loss (``print_separate_loss``), per flush (``capture.separate_loss``): the language-model
#: loss, the MoE load-balancing (aux) loss per MoE layer before its coefficient, the multi-token-prediction loss,
#: and the sparse-attention indexer loss.
LM_LOSS = "train/lm_loss"
AUX_LOSS = "train/aux_loss"
MTP_LOSS = "train/mtp_loss"
INDEXER_LOSS = "train/indexer_loss"
#: mindformers' pipeline-parallel (and gradient-accumulation) train cell: its loss is scaled as MFLossMonitor scales it.
PIPELINE_CELL = "MFPipelineWithLossScaleCell"
STEP_TIME = "perf/step_time_ms"
SAMPLES_PER_S = "perf/samples_per_s"
TOKENS_PER_S = "perf/tokens_per_s"
MONITOR_OVERHEAD = "perf/monitor_overhead"
#: What the steps were worth (``metrics.work``): cumulative samples and tokens over every data-parallel rank,
#: achieved TFLOP/s per device and model FLOPs utilisation (percent of the device's peak).
SAMPLES_SEEN = "perf/samples_seen"
TOKENS_SEEN = "perf/tokens_seen"
TFLOPS = "perf/tflops"
MFU = "perf/mfu"
#: The share of the step spent waiting for the next batch (percent), per flush window, beside ``DATA_WAIT``.
DATA_WAIT_PCT = "perf/data_wait_pct"

# Cross-rank metrics, written by the global rank only.
DIST_PREFIX = "dist/"
LOSS_MIN = "dist/loss_min"
LOSS_MAX = "dist/loss_max"
LOSS_STD = "dist/loss_std"
OUTLIER_RANK = "dist/outlier_rank"
LOSS_SPREAD = "dist/loss"  # the base of dist/loss_{min,max,mean,std,p5,p50,p95,nonfinite_ranks}
STEP_TIME_SPREAD = "dist/step_time_ms"  # each rank's own step time, per flush window
DATA_WAIT_SPREAD = "dist/data_wait_ms"  # each rank's longest data wait, per flush window
SLOWEST_RANK = "dist/slowest_rank"
#: Each rank's own timing of the window (distributed runs), in its own stream: its step time without its wait
#: for slower ranks, and its median data wait.
OWN_STEP_TIME = "perf/own_step_time_ms"
DATA_WAIT = "perf/data_wait_ms"


# Model internals (``layer_norms``): one series per parameter, or per layer with ``layer_norms_group``.
GRAD_NORM_PREFIX = "grad_norm/"
WEIGHT_NORM_PREFIX = "weight_norm/"
OPTIMIZER_PREFIX = "optimizer/"

# mindformers' max attention logits (``max_attention_logit_format``), per flush: each layer's max over its heads,
# and the max and mean over every head of every layer (TrainingStateMonitor's ``max_attention_logit/max``, ``/mean``).
MAX_LOGIT_PREFIX = "attention/max_logit/"
MAX_LOGIT_MAX = "attention/max_logit_max"
MAX_LOGIT_MEAN = "attention/max_logit_mean"

# Histograms (``histograms``): the ``histogram`` event's kind and its tag prefixes (a parameter's values, and
# its gradient where the train cell keeps a copy: ``TrainStep``).
HISTOGRAM = "histogram"
WEIGHTS_HISTOGRAM_PREFIX = "weights/"
GRADS_HISTOGRAM_PREFIX = "grads/"

# Validation (``metrics.evaluation``): recorded at the training step at which the evaluation ran.
EVAL_PREFIX = "eval/"
EVAL_LOSS = "eval/loss"
EVAL_LOSS_MINDSPORE = "eval/loss_mindspore"  # MindSpore's own eval loss, kept when it is not the whole set's
EVAL_TIME = "eval/time_s"  # the evaluation's wall time (kept out of perf/: the next step's time excludes it)
EVAL_SAMPLES = "eval/samples"  # samples evaluated on this rank, when each eval batch's size is known
GLOBAL_EVAL_PREFIX = "eval/global_"

# The run's objective (``objective:``), on the global rank: at each evaluation, or once at the end.
OBJECTIVE_PREFIX = "objective/"
OBJECTIVE_BEST = "objective/best"
OBJECTIVE_BEST_STEP = "objective/best_step"
OBJECTIVE_FINAL = "objective/final"

# Memory (``memory: true``), per flush; the two peaks are each flush window's own.
DEVICE_ALLOCATED_MB = "memory/device_allocated_mb"
DEVICE_PEAK_MB = "memory/device_peak_mb"
HOST_RSS_MB = "memory/host_rss_mb"
HOST_RSS_PEAK_MB = "memory/host_rss_peak_mb"

# NPU system metrics (``system:``), from npu-smi in a background sampler; named as MLflow's system metrics.
NPU_UTILIZATION = "system/npu_utilization_pct"
NPU_HBM_USED_MB = "system/npu_hbm_used_mb"
NPU_HBM_TOTAL_MB = "system/npu_hbm_total_mb"
NPU_MEMORY_USED_MB = "system/npu_memory_used_mb"
NPU_MEMORY_TOTAL_MB = "system/npu_memory_total_mb"
NPU_TEMPERATURE = "system/npu_temperature_c"
NPU_POWER = "system/npu_power_w"


def grad_norm_name(param: str) -> str:
    """``grad_norm/<param>``: the L2 norm of one parameter's (or one layer's) gradient."""
    return GRAD_NORM_PREFIX + param


def weight_norm_name(param: str) -> str:
    """``weight_norm/<param>``: the L2 norm of one parameter (or one layer)."""
    return WEIGHT_NORM_PREFIX + param


def optimizer_norm_name(state: str, param: str) -> str:
    """``optimizer/<state>_norm/<param>``: the L2 norm of one optimizer state (``adam_m``, ``adam_v``)."""
    return f"{OPTIMIZER_PREFIX}{state}_norm/{param}"


def max_logit_name(layer: str) -> str:
    """``attention/max_logit/<layer>``: the largest attention logit of one layer's heads in the step."""
    return MAX_LOGIT_PREFIX + layer


def rank_loss(rank: int) -> str:
    """Name of one rank's local loss as the global rank logs it, so the curves overlay."""
    return f"dist/loss/rank_{rank}"


def spread_name(base: str, stat: str) -> str:
    """One statistic across ranks: ``spread_name("dist/loss", "p95")`` is ``dist/loss_p95``."""
    return f"{base}_{stat}"


def rank_step_time(rank: int) -> str:
    """One rank's own step time (ms, window median) as the global rank logs it (``per_rank_curves``)."""
    return f"dist/step_time_ms/rank_{rank}"


def global_eval_name(name: str) -> str:
    """The global rank's cross-rank value of an eval metric: ``eval/loss`` -> ``eval/global_loss``."""
    return GLOBAL_EVAL_PREFIX + name[len(EVAL_PREFIX):]


def restated(name: str) -> bool:
    """True for the objective's values: a later record of a step may give them again (the objective changes
    from the training loss to the validation loss at the first evaluation), every other metric once a step."""
    return name.startswith(OBJECTIVE_PREFIX)


def is_global_metric(name: str) -> bool:
    """True for metrics about the whole job (global loss, cross-rank spread, the objective), False for one
    rank's own."""
    return name == GLOBAL_LOSS or name.startswith((DIST_PREFIX, GLOBAL_EVAL_PREFIX, OBJECTIVE_PREFIX))


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


#: The objective when the config names none, best first: the first of these a run records is its objective
#: (the job's value before one rank's, validation before training).
DEFAULT_OBJECTIVES = (GLOBAL_EVAL_PREFIX + "loss", EVAL_LOSS, GLOBAL_LOSS, LOSS)


def objective_metric(configured: Optional[str], names: AbstractSet[str],
                     current: Optional[str] = None) -> Optional[str]:
    """The metric a run is compared on: ``configured``, else the best-ranked of ``DEFAULT_OBJECTIVES`` among
    ``names`` (the metrics recorded) and ``current`` (the one followed so far); None before any is recorded.

    Example:
        >>> objective_metric(None, {"train/loss", "eval/loss", "perf/samples_per_s"})
        'eval/loss'
    """
    if configured is not None:
        return configured
    ranked = [m for m in DEFAULT_OBJECTIVES if m in names or m == current]
    return ranked[0] if ranked else None
