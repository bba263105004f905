"""What the steps were worth: samples and tokens seen, achieved TFLOP/s per device, MFU.

All host arithmetic on a flushed window's step numbers and step times; nothing more is read from the device:

- ``perf/samples_seen`` = global batch x step, ``perf/tokens_seen`` = that x ``seq_length``. The step is the
  global one, so a run resumed from a checkpoint continues from the checkpoint's count. The global batch is
  the samples one step takes over every data-parallel rank: ``global_batch_size`` when set; else this rank's
  dataset batch x the data-parallel size (``params.parallel_config.data_parallel`` of a mindformers run YAML,
  else the ranks in ``reduce_ranks``, else the world size); under mindformers' ``parallel.full_batch: true``
  every rank's dataset already holds the global batch. In the last case (the ranks' count) the ranks' own
  batches may differ: each flush's collective carries them, and ``Work.regrouped`` makes the global batch
  their sum on every rank (``metrics.cross_rank``). Exact with ``drop_remainder=True`` only (a short last
  batch is counted full; ``capture.cb_params.batch_size_of`` warns).
- ``perf/tflops`` = FLOPs per sample x global batch / devices / step time / 1e12: the model FLOPs each device
  achieved (``metrics.flops``; or ``flops_per_sample`` from the config).
- ``perf/mfu`` = 100 x ``perf/tflops`` / the device's peak (``metrics.peaks``; ``peak_tflops`` overrides), in percent.

Example:
    >>> work = Work(global_batch=16, seq_length=32, flops_per_sample=21_233_664.0, devices=1, peak_tflops=1.0)
    >>> cols = work.columns(np.array([1, 2]), np.array([0.5, 0.5]))
    >>> cols["perf/tokens_seen"].tolist(), round(cols["perf/tflops"][0], 6), round(cols["perf/mfu"][0], 4)
    ([512.0, 1024.0], 0.000679, 0.0679)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Dict, Mapping, Optional

import numpy as np

from ..config.keys import dig
from ..names import MFU, SAMPLES_SEEN, TFLOPS, TOKENS_SEEN
from .flops import TransformerShape, flops_per_token, model_config_in, network_matmul_params

log = logging.getLogger("msbridge")


@dataclass(frozen=True)
class Work:
    """The per-run constants the columns are computed from (None: that column is off).

    Args:
        global_batch: samples one step takes over every data-parallel rank.
        seq_length: tokens per sample.
        flops_per_sample: training FLOPs of one sample (forward and backward).
        devices: the devices the step's FLOPs are shared by (the world size).
        peak_tflops: the device's peak, for MFU.
        summed: ``global_batch`` is this rank's batch x the data-parallel ranks' count, so the ranks' own
            batches, once known, give the true one (``regrouped``).
    """

    global_batch: Optional[int]
    seq_length: Optional[int] = None
    flops_per_sample: Optional[float] = None
    devices: int = 1
    peak_tflops: Optional[float] = None
    summed: bool = False

    def regrouped(self, batches: np.ndarray) -> "Work":
        """This work with the global batch the sum of the data-parallel ranks' own ``batches`` (each rank's
        samples per step, as the flush's collective gathered them); unchanged unless ``summed`` and every
        batch is known (> 0).

        Example:
            >>> Work(global_batch=16, summed=True).regrouped(np.array([8.0, 4.0])).global_batch
            12
        """
        if not self.summed or not len(batches) or not (batches > 0).all():
            return self
        return replace(self, global_batch=int(round(float(batches.sum()))))

    def columns(self, steps: np.ndarray, step_s: np.ndarray) -> Dict[str, np.ndarray]:
        """The window's ``perf/samples_seen``, ``perf/tokens_seen``, ``perf/tflops``, ``perf/mfu`` (those known)."""
        out: Dict[str, np.ndarray] = {}
        if not self.global_batch:
            return out
        samples = steps.astype(np.float64) * self.global_batch
        out[SAMPLES_SEEN] = samples
        if self.seq_length:
            out[TOKENS_SEEN] = samples * self.seq_length
        if self.flops_per_sample:
            tflops = self.flops_per_sample * self.global_batch / self.devices / np.maximum(step_s, 1e-9) / 1e12
            out[TFLOPS] = tflops
            if self.peak_tflops:
                out[MFU] = 100.0 * tflops / self.peak_tflops
        return out



def _data_parallel(params: Mapping[str, Any]) -> Optional[int]:
    """``parallel_config.data_parallel`` of a mindformers run YAML, when it is a positive int."""
    dp = dig(params, "parallel_config", "data_parallel")
    return dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else None


def summed_over_ranks(configured: Optional[int], params: Mapping[str, Any]) -> bool:
    """True when the global batch is this rank's batch x the ranks' count (no ``global_batch_size``, no
    ``parallel.full_batch``, no ``parallel_config.data_parallel``): the ranks' own batches then sum to it."""
    return not configured and dig(params, "parallel", "full_batch") is not True and _data_parallel(params) is None


def global_batch(batch_size: Optional[int], configured: Optional[int], params: Mapping[str, Any],
                 reduce_ranks: Optional[Any], world_size: int) -> Optional[int]:
    """Samples per step over every data-parallel rank (see the module docstring for the order of the sources).

    Example:
        >>> global_batch(8, None, {"parallel_config": {"data_parallel": 4}}, None, world_size=8)
        32
    """
    if configured:
        return int(configured)
    if not batch_size:
        return None
    if dig(params, "parallel", "full_batch") is True:
        return int(batch_size)
    dp = _data_parallel(params) or (len(reduce_ranks) if reduce_ranks else world_size)
    return int(batch_size) * int(dp)


def model_flops_per_sample(configured: Optional[float], params: Mapping[str, Any], seq_length: Optional[int],
                           network: Any = None, trained: Any = None) -> Optional[float]:
    """``flops_per_sample`` when set, else the count of the model config in ``params`` times ``seq_length``,
    else 6 x the matmul weights of ``network`` (``trained``: its trained parameters) per token, times
    ``seq_length``; said once in the log, with where the count came from. None when none is known."""
    if configured:
        return float(configured)
    config, where = model_config_in(params)
    shape = TransformerShape.from_config(config) if config is not None else None
    seq = seq_length or (shape.seq_length if shape is not None else None)
    if shape is not None and seq:
        per_token = flops_per_token(shape, seq)
        log.info("msbridge: %s FLOPs per token (6*N + 12*L*h*s; N = %s matmul parameters from %s, s = %d)",
                 f"{per_token:,}", f"{shape.matmul_params():,}", where, seq)
        return float(per_token * seq)
    n = network_matmul_params(trained, network) if trained is not None and seq else 0
    if n:
        log.info("msbridge: %s FLOPs per token (6*N, N = %s weights counted from the network; attention is not "
                 "counted without a model config in params)", f"{6 * n:,}", f"{n:,}")
        return float(6 * n * seq)
    log.info("msbridge: no model config with num_layers, hidden_size, num_heads and vocab_size in params, no "
             "network weights or no seq_length: perf/tflops and perf/mfu are off; set flops_per_sample to turn "
             "them on")
    return None


def make_work(cfg: Any, world_size: int, batch_size: Optional[int], network: Any = None, trained: Any = None,
              peak: Any = None) -> Work:
    """The run's ``Work`` from its config (``cfg``: a ``Config``) and, without a model config, its ``network``
    (``trained``: the parameters it trains); ``peak``: how the peak is resolved (``peaks.resolve_peak``),
    asked only when there are FLOPs to compare."""
    params = cfg.params
    batch = global_batch(batch_size, cfg.global_batch_size, params, cfg.reduce_ranks, world_size)
    flops = model_flops_per_sample(cfg.flops_per_sample, params, cfg.seq_length, network, trained) if batch else None
    peak_tflops = None
    if flops:
        if peak is None:
            from .peaks import resolve_peak as peak
        config, _ = model_config_in(params)
        peak_tflops = peak(cfg.peak_tflops, config)
    return Work(global_batch=batch, seq_length=cfg.seq_length, flops_per_sample=flops, devices=max(world_size, 1),
                peak_tflops=peak_tflops, summed=bool(batch) and summed_over_ranks(cfg.global_batch_size, params))
