"""Weight histograms (``histograms``, ``histogram_interval``): read on the host at a flush, sent as events.

At a flush where at least ``histogram_interval`` steps passed since the last
histograms (since training began, for the first; every flush when it is None),
each parameter whose name matches the ``histograms`` regex (``re.search``) is
copied to the host once (read in place on the CPU backend) and binned into
``BUCKETS`` equal-width buckets with numpy. Each becomes one
``Event(kind="histogram")`` whose detail is a plain dict the sinks encode:
TensorBoard as a histogram summary, MindInsight as ``<tag>/histogram``, the jsonl
log as an event line; MLflow and the console skip them. Nothing runs per step.

Example:
    >>> hist = WeightHistograms(".*", interval=100, rank=0).start(train_network, optimizer, first_step=0)
    >>> events = hist.take(step=200)      # at a flush: one event per matched parameter, or []
    >>> events[0].detail["tag"], events[0].detail["num"]
    ('weights/dense.weight', 640.0)
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..names import WEIGHTS_HISTOGRAM_PREFIX
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


class WeightHistograms:
    """The ``histograms`` setting at run time: which parameters, when, and their histogram events.

    Args:
        pattern: regex over parameter names (``re.search``).
        interval: the fewest steps between two histograms; None: every flush.
        rank: this process's rank, put on every event.

    Example:
        >>> hist = WeightHistograms("dense", interval=None, rank=0).start(net, opt, first_step=0)
        >>> [e.detail["tag"] for e in hist.take(step=10)]
        ['weights/dense.weight', 'weights/dense.bias']
    """

    def __init__(self, pattern: str, interval: Optional[int], rank: int) -> None:
        self.selector = ParamSelector(pattern)
        self.interval = interval
        self.rank = rank
        self.params: List[Any] = []
        self.last_step: Optional[int] = None

    def start(self, train_network: Any, optimizer: Any, first_step: int = 0) -> "WeightHistograms":
        """Select the matched parameters (warn once, naming the closest, when none matches)."""
        weights = _weights(train_network, optimizer)
        names = [p.name for p in weights]
        selection = self.selector.select(names)
        if not selection.indices:
            log.warning(self.selector.no_match(names, setting="histograms"))
        self.params = [weights[i] for i in selection.indices]
        self.last_step = first_step
        if self.params:
            when = f"every {self.interval} steps (at a flush)" if self.interval else "at every flush"
            log.info("msbridge: histograms %r: weights of %d parameter(s), %s",
                     self.selector.pattern, len(self.params), when)
        return self

    def due(self, step: int) -> bool:
        """Whether a flush ending at ``step`` records histograms."""
        if not self.params:
            return False
        return self.interval is None or self.last_step is None or step - self.last_step >= self.interval

    def take(self, step: int) -> List[Dict[str, Any]]:
        """At a flush ending at ``step``: one histogram detail per matched parameter when due, else [].
        The callback hands each to the sinks as a ``histogram`` event at ``step``."""
        if not self.due(step):
            return []
        self.last_step = step
        return [histogram_detail(WEIGHTS_HISTOGRAM_PREFIX + p.name, host_values(p)) for p in self.params]


def _weights(train_network: Any, optimizer: Any) -> Sequence[Any]:
    """The optimizer's parameters, or the network's trainable ones without an optimizer."""
    if optimizer is not None and getattr(optimizer, "parameters", None) is not None:
        return list(optimizer.parameters)
    return list(train_network.trainable_params()) if hasattr(train_network, "trainable_params") else []
