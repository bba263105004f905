"""Histograms (``histograms``, ``histogram_interval``): weights and gradients read at a flush, sent as events.

At a flush where at least ``histogram_interval`` steps passed since the last
histograms (since training began, for the first; every flush when it is None),
each parameter whose name matches the ``histograms`` regex (``re.search``) is
copied to the host once (read in place on the CPU backend) and binned into
``BUCKETS`` equal-width buckets with numpy: ``weights/<param>``. With
``TrainStep`` its gradient is too, ``grads/<param>``: the step keeps a device
copy of the matched gradients (``TrainStep.keep_grads``, asked for here at
train begin), so the histogram is the gradient of the flush's step (after
unscaling, before clipping). Another train cell does not expose its gradients:
said once, weights only. Each histogram is a plain dict the callback sends as
an ``Event(kind="histogram")``: TensorBoard encodes it as a histogram summary,
MindInsight as ``<tag>/histogram``, the jsonl log as an event line; MLflow and
the console skip them. Nothing runs per step on the host.

Example:
    >>> hist = ParamHistograms(".*", interval=100).start(train_network, optimizer, train_step, first_step=0)
    >>> details = hist.take(step=200)      # at a flush: weights (and grads) of each matched parameter, or []
    >>> details[0]["tag"], details[1]["tag"], details[0]["num"]
    ('weights/dense.weight', 'grads/dense.weight', 640.0)
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..names import GRADS_HISTOGRAM_PREFIX, WEIGHTS_HISTOGRAM_PREFIX
from .param_norms import host_values
from .param_select import ParamSelector

log = logging.getLogger("msbridge")

#: Equal-width buckets per histogram, between the parameter's min and max.
BUCKETS = 30


def histogram_detail(tag: str, values: np.ndarray, buckets: int = BUCKETS) -> Dict[str, Any]:
    """A histogram of ``values`` as a plain dict: ``tag``, ``min``, ``max``, ``num``, ``sum``,
    ``sum_squares``, ``bucket_limits`` (each bucket's right edge) and ``counts``.

    Non-finite values are left out of the buckets and the sums and counted in ``nonfinite``;
    a parameter with no finite value has no buckets.

    Example:
        >>> histogram_detail("weights/w", np.array([0.0, 1.0, 1.0]), buckets=2)["counts"]
        [1.0, 2.0]
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = values[np.isfinite(values)]
    detail: Dict[str, Any] = {"tag": tag, "num": float(finite.size), "nonfinite": int(values.size - finite.size)}
    if not finite.size:
        detail.update({"min": 0.0, "max": 0.0, "sum": 0.0, "sum_squares": 0.0, "bucket_limits": [], "counts": []})
        return detail
    low, high = float(finite.min()), float(finite.max())
    counts, edges = np.histogram(finite, bins=buckets, range=(low, high) if high > low else (low - 0.5, high + 0.5))
    detail.update({"min": low, "max": high, "sum": float(finite.sum()), "sum_squares": float(finite @ finite),
                   "bucket_limits": [float(e) for e in edges[1:]], "counts": [float(c) for c in counts]})
    return detail


class ParamHistograms:
    """The ``histograms`` setting at run time: which parameters, when, and their histograms.

    Args:
        pattern: regex over parameter names (``re.search``).
        interval: the fewest steps between two histograms; None: every flush.

    Example:
        >>> hist = ParamHistograms("dense", interval=None).start(net, opt, None, first_step=0)
        >>> [d["tag"] for d in hist.take(step=10)]   # no TrainStep: weights only
        ['weights/dense.weight', 'weights/dense.bias']
    """

    def __init__(self, pattern: str, interval: Optional[int]) -> None:
        self.selector = ParamSelector(pattern)
        self.interval = interval
        self.params: List[Any] = []
        self.ring_cell: Any = None  # the TrainStep keeping copies of the matched gradients, if any
        self.last_step: Optional[int] = None

    def start(self, train_network: Any, optimizer: Any, ring_cell: Any = None,
              first_step: int = 0) -> "ParamHistograms":
        """Select the matched parameters (warn once, naming the closest, when none matches) and ask a
        ``TrainStep`` to keep their gradients (say once that another train cell gives weights only)."""
        weights = _weights(train_network, optimizer)
        names = [p.name for p in weights]
        selection = self.selector.select(names)
        if not selection.indices:
            log.warning(self.selector.no_match(names, setting="histograms"))
        self.params = [weights[i] for i in selection.indices]
        self.last_step = first_step
        if not self.params:
            return self
        keep = getattr(ring_cell, "keep_grads", None)
        kept = keep([p.name for p in self.params]) if keep is not None else ()
        self.ring_cell = ring_cell if kept else None
        if not kept:
            log.info("msbridge: histograms: gradient histograms need msbridge.TrainStep (it keeps a device copy of "
                     "the matched gradients); this train cell gives weight histograms only")
        when = f"every {self.interval} steps (at a flush)" if self.interval else "at every flush"
        log.info("msbridge: histograms %r: %s of %d parameter(s), %s", self.selector.pattern,
                 "weights and gradients" if kept else "weights", len(self.params), when)
        return self

    def due(self, step: int) -> bool:
        """Whether a flush at ``step`` records histograms."""
        if not self.params:
            return False
        return self.interval is None or self.last_step is None or step - self.last_step >= self.interval

    def take(self, step: int) -> List[Dict[str, Any]]:
        """At a flush at ``step`` (the last step trained): each matched parameter's weights histogram, then its
        gradient's where kept, when due; else []. The callback hands each to the sinks as a ``histogram`` event."""
        if not self.due(step):
            return []
        self.last_step = step
        grads = self._grads()
        details = []
        for p in self.params:
            details.append(histogram_detail(WEIGHTS_HISTOGRAM_PREFIX + p.name, host_values(p)))
            if p.name in grads:
                details.append(histogram_detail(GRADS_HISTOGRAM_PREFIX + p.name, grads[p.name].reshape(-1)))
        return details

    def _grads(self) -> Dict[str, Any]:
        """The kept gradient copies by name; {} (said once) when the step never wrote them."""
        if self.ring_cell is None:
            return {}
        grads = self.ring_cell.kept_grads()
        if grads is None:
            log.warning("msbridge: histograms: this TrainStep was compiled before the monitor asked it to keep "
                        "gradients (Model.build, or an earlier train call that did not ask for these), so it does "
                        "not copy them: recording weight histograms only. For gradient histograms, build the "
                        "TrainStep anew and train it with this monitor from the first step")
            self.ring_cell = None
            return {}
        return grads


def _weights(train_network: Any, optimizer: Any) -> Sequence[Any]:
    """The optimizer's parameters, or the network's trainable ones without an optimizer."""
    if optimizer is not None and getattr(optimizer, "parameters", None) is not None:
        return list(optimizer.parameters)
    return list(train_network.trainable_params()) if hasattr(train_network, "trainable_params") else []
