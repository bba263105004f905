"""Validation results as ``eval/<name>`` metrics, at the training step at which the evaluation ran.

MindSpore hands an evaluation's results to the callbacks at ``on_eval_end``: ``Model.fit(valid_dataset=...)``
puts them in ``cb_params.eval_results`` (the model's metrics plus ``eval_loss``), ``Model.eval`` in
``cb_params.metrics``. ``EvalRound`` times one evaluation (its time is kept out of ``perf/``), counts the
samples it evaluated from each eval step's input batch (a shape read, no device copy) and turns the results
into plain floats:

- ``eval/loss`` is the whole validation set's loss: each eval batch's loss output (the one
  ``Model(eval_indexes=)`` points at, the first of ``nn.WithEvalCell``'s) weighted by the batch's size, when
  MindSpore reports a loss: a metric named ``loss`` (``nn.Loss()``: the plain mean of the batches' means) or
  ``Model.fit``'s ``eval_loss``. MindSpore's ``_eval_process`` makes a new Loss metric at every batch, so its
  ``eval_loss`` is the last validation batch's loss (read in MindSpore 2.9.0's source). MindSpore's own value
  is kept as ``eval/loss_mindspore`` when it differs (relative 1e-6); without a loss output to read (no
  ``eval_indexes``), MindSpore's value is ``eval/loss``. Any other metric ``m`` is ``eval/m``;
- a metric that returns a dict (mindformers' ``PerplexityMetric``: ``{"loss": ..., "PPL": ...}``) gives one
  value per key, ``eval/loss`` and ``eval/PPL``, prefixed by the metric's name only where two would clash;
- a value with more than one element (a confusion matrix) is left out, said once.

In data parallel every rank records its own results; ``global_eval`` (one AllGather, on every rank at the
same evaluation) gives the global rank ``eval/global_<name>``: the mean over ranks weighted by each rank's
evaluated samples when every rank counted them, else the plain mean.

Example:
    >>> eval_values({"acc": 0.75, "eval_loss": 0.5, "ppl": {"PPL": 3.0}})
    {'eval/acc': 0.75, 'eval/loss': 0.5, 'eval/PPL': 3.0}
"""
from __future__ import annotations

import logging
import math
import time
import zlib
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from ..capture.cb_params import nearest_batch
from ..capture.collective import Watchdog, all_gather, gather_op
from ..names import EVAL_LOSS, EVAL_LOSS_MINDSPORE, EVAL_PREFIX, EVAL_SAMPLES, EVAL_TIME, global_eval_name

log = logging.getLogger("msbridge")

#: Metrics per evaluation that get a global value across ranks (every rank sends the same shape).
GLOBAL_SLOTS = 32
_HEADER = 4  # samples, the names' checksum (two 16-bit halves), the number of values
#: Values with no global counterpart: the evaluation's own time and count, and MindSpore's loss (present on a rank
#: only where it differs from the whole set's, so the ranks' names would not match; a last batch has no job mean).
LOCAL_ONLY = (EVAL_TIME, EVAL_SAMPLES, EVAL_LOSS_MINDSPORE)


def _scalar(value: Any) -> Optional[float]:
    """A plain float of a metric's value, None when it is not one number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float, np.number)):
        return float(value)
    array = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value) if isinstance(
        value, (list, tuple, np.ndarray)) else None
    if array is not None and array.size == 1 and np.issubdtype(array.dtype, np.number):
        return float(array.reshape(()))
    return None


def eval_values(results: Mapping[str, Any], skipped: Optional[Set[str]] = None) -> Dict[str, float]:
    """``eval/<name>`` -> float for MindSpore's eval results (see the module docstring); names of values
    that are not one number are added to ``skipped``."""
    flat: Dict[str, Dict[str, Any]] = {}
    if "loss" in results:  # the model's own Loss metric, over the whole set, before Model.fit's last-batch one
        results = {k: v for k, v in results.items() if k != "eval_loss"}
    for metric, value in results.items():
        name = "loss" if metric == "eval_loss" else str(metric)
        items = value.items() if isinstance(value, Mapping) else [(name, value)]
        for key, item in items:
            if item is not None:  # a metric with nothing to say here (mindformers' non-last pipeline stage)
                flat.setdefault(str(key), {})[name] = item
    out: Dict[str, float] = {}
    for key, by_metric in flat.items():
        clash = len(by_metric) > 1
        for metric, item in by_metric.items():
            name = f"{EVAL_PREFIX}{metric}/{key}" if clash and metric != key else f"{EVAL_PREFIX}{key}"
            number = _scalar(item)
            if number is None:
                if skipped is not None:
                    skipped.add(name)
                continue
            out[name] = number
    return out


class EvalRound:
    """One evaluation's clock, sample count and whole-set loss, and its results as ``eval/*`` values.

    Example:
        >>> from types import SimpleNamespace
        >>> round_ = EvalRound()
        >>> round_.begin(loss_index=0)   # the eval network's outputs: (loss, logits, label)
        >>> for batch, loss in ((8, 1.0), (8, 2.0), (4, 4.0)):   # on_eval_step_end
        ...     round_.step(SimpleNamespace(eval_dataset_element=[np.zeros((batch, 16))], net_outputs=(loss,)))
        >>> round_.end({"accuracy": 0.9, "eval_loss": 4.0})   # doctest: +ELLIPSIS
        {'eval/accuracy': 0.9, 'eval/loss': 2.0, 'eval/loss_mindspore': 4.0, 'eval/time_s': ..., 'eval/samples': 20.0}
    """

    def __init__(self) -> None:
        self.started: Optional[float] = None
        self.samples: Optional[int] = 0
        self._loss_index: Optional[int] = None
        self._losses: List[Tuple[Any, Optional[int]]] = []  # each eval batch's loss output (kept, not copied) and size
        self._warned: Set[str] = set()

    @property
    def running(self) -> bool:
        return self.started is not None

    def begin(self, loss_index: Optional[int] = None) -> None:
        """An evaluation starts; ``loss_index``: which of the eval network's outputs is its loss (None: unknown)."""
        self.started, self.samples = time.perf_counter(), 0
        self._loss_index, self._losses = loss_index, []

    def step(self, cb: Any) -> None:
        """One eval step ended: count its batch (the first input's leading dimension) and keep a reference to its
        loss output, O(1): the copies to the host happen once, at the evaluation's end."""
        batch = getattr(cb, "eval_dataset_element", None)
        first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
        shape = getattr(first, "shape", None)
        size = int(shape[0]) if shape else None
        if self.samples is not None:
            self.samples = self.samples + size if size is not None else None  # unknown once one batch is
        outputs = getattr(cb, "net_outputs", None)
        if self._loss_index is not None and isinstance(outputs, (list, tuple)) and len(outputs) > self._loss_index:
            self._losses.append((outputs[self._loss_index], size))

    def _whole_set_loss(self) -> Optional[float]:
        """The kept batch losses' mean weighted by batch size (plain when a size is unknown), or None."""
        if not self._losses:
            return None
        losses = np.array([np.mean(v.asnumpy() if hasattr(v, "asnumpy") else v) for v, _ in self._losses], np.float64)
        sizes = [size for _, size in self._losses]
        weights = np.array(sizes, np.float64) if None not in sizes else np.ones(len(losses))
        self._losses = []
        return float(losses @ weights / weights.sum())

    def count_dataset(self, dataset: Any) -> None:
        """Count a whole dataset at once, for an evaluation whose steps no callback sees (mindformers'
        ``do_eval``): batches × batch size when its batches are all full (``drop_remainder``), else unknown."""
        try:
            full = nearest_batch(dataset).drop_remainder is True
            self.samples = int(dataset.get_dataset_size()) * int(dataset.get_batch_size()) if full else None
        except Exception:  # noqa: BLE001  (a dataset that cannot say: the samples stay unknown)
            self.samples = None

    def end(self, results: Mapping[str, Any]) -> Dict[str, float]:
        """The round's ``eval/*`` values: the results, ``eval/time_s`` and, when counted, ``eval/samples``."""
        elapsed = time.perf_counter() - (self.started or time.perf_counter())
        self.started = None
        skipped: Set[str] = set()
        values = eval_values(results, skipped)
        whole = self._whole_set_loss()
        if whole is not None and EVAL_LOSS in values:  # MindSpore reported a loss: the whole set's is eval/loss
            own, values[EVAL_LOSS] = values[EVAL_LOSS], whole
            if not math.isclose(own, whole, rel_tol=1e-6):
                values[EVAL_LOSS_MINDSPORE] = own
        for name in sorted(skipped - self._warned):
            log.warning("msbridge: %s is not one number; it is left out of the recorded eval metrics", name)
        self._warned |= skipped
        values[EVAL_TIME] = elapsed
        if self.samples:
            values[EVAL_SAMPLES] = float(self.samples)
        return values


def _checksum(names: Any) -> int:
    return zlib.crc32("\n".join(names).encode())


def pack_eval(values: Mapping[str, float]) -> np.ndarray:
    """This rank's row for ``global_eval``: samples (0: not counted), the names' checksum, the values."""
    names = sorted(n for n in values if n not in LOCAL_ONLY)[:GLOBAL_SLOTS]
    row = np.zeros(_HEADER + GLOBAL_SLOTS, dtype=np.float32)
    crc = _checksum(names)
    row[:_HEADER] = (values.get(EVAL_SAMPLES, 0.0), crc >> 16, crc & 0xFFFF, len(names))
    row[_HEADER:_HEADER + len(names)] = [values[n] for n in names]
    return row


def combine_eval(values: Mapping[str, float], table: np.ndarray) -> Dict[str, float]:
    """``eval/global_<name>`` from every rank's ``pack_eval`` row (``table``: one row per rank), or {} when the
    ranks did not evaluate the same metrics.

    Example:
        >>> rows = np.stack([pack_eval({"eval/loss": 1.0, "eval/samples": 30}),
        ...                  pack_eval({"eval/loss": 2.0, "eval/samples": 10})])
        >>> combine_eval({"eval/loss": 1.0, "eval/samples": 30}, rows)
        {'eval/global_loss': 1.25}
        >>> combine_eval({"eval/loss": 1.0, "eval/samples": 30, "eval/loss_mindspore": 3.0}, rows)  # rank 0's own
        {'eval/global_loss': 1.25}
    """
    names = sorted(n for n in values if n not in LOCAL_ONLY)[:GLOBAL_SLOTS]
    if not (table[:, 1:_HEADER] == table[0, 1:_HEADER]).all():
        log.warning("msbridge: the ranks evaluated different metrics; no eval/global_* values this time")
        return {}
    samples = table[:, 0].astype(np.float64)
    weights = samples if (samples > 0).all() else np.ones(len(table))
    out = {}
    for j, name in enumerate(names):
        column = table[:, _HEADER + j].astype(np.float64)
        value = float(column @ weights / weights.sum())
        out[global_eval_name(name)] = value if math.isfinite(value) else math.nan
    return out


def global_eval(values: Mapping[str, float], timeout_s: float) -> Dict[str, float]:
    """Every rank at the same evaluation: one AllGather of ``pack_eval`` rows, then ``combine_eval`` (every rank
    gets the result; the global rank records it)."""
    with Watchdog(timeout_s).guard("the cross-rank reduction of an evaluation's results"):
        table = all_gather(gather_op(), pack_eval(values))
    return combine_eval(values, table)
