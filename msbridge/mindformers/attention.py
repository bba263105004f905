"""mindformers' max attention logits (``monitor_config.max_attention_logit_format``) as msbridge metrics.

With that key set, mindformers' Trainer turns on ``track_max_attention_logit``: each
``FlashAttention`` of a ``parallel_core`` model (``TrainingTeleChat3ForCausalLM``,
DeepSeek-V3 ...) keeps the largest attention logit of each head in the step in a
Parameter, ``max_logits_val``, which mindformers' ``MaxLogitsMonitor`` zeroes at every
step end. TrainingStateMonitor reads them with the model's own
``get_max_attention_logit()``; ``MaxAttentionLogits`` reads them the same way, once per
flush, and records for the flush step:

- ``attention/max_logit/<layer>``: the largest of that layer's heads
  (``<layer>``: mindformers' name without ``.max_logits_val``, e.g.
  ``decoder.layers.0.self_attention.core_attention``);
- ``attention/max_logit_max`` and ``attention/max_logit_mean``: over every head of
  every layer, TrainingStateMonitor's ``max_attention_logit/max`` and ``/mean``.

The read must come before ``MaxLogitsMonitor``'s reset: mindformers' Trainer adds that callback
after the run YAML's ``callbacks:``, so an ``MSBridgeMonitor`` listed there reads first; one
handed to ``Trainer(callbacks=...)`` runs after it, and is told so once.

The per-head values stay in mindformers' own log or TensorBoard: one series per head would
be 7808 MLflow rows per flush for DeepSeek-V3 (61 layers x 128 heads). Legacy models (``LlamaForCausalLM``)
do not track the logits; mindformers 1.6 and 1.7 have no such key. Either way nothing is read.

Example:
    >>> logits = MaxAttentionLogits.from_callbacks(cb_params.list_callback, cb_params.train_network)
    >>> logits.read()
    {'attention/max_logit/decoder.layers.0.self_attention.core_attention': 7.5, ...}
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ..names import MAX_LOGIT_MAX, MAX_LOGIT_MEAN, max_logit_name

log = logging.getLogger("msbridge")

SUFFIX = ".max_logits_val"


class MaxAttentionLogits:
    """Reads the max attention logits of a mindformers model; see the module docstring.

    Args:
        model: the model under the train cell, with ``get_max_attention_logit()``.

    Example:
        >>> MaxAttentionLogits(telechat3_model).read()[MAX_LOGIT_MAX]
        29.4
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def from_callbacks(cls, callbacks: Sequence[Any], train_network: Any,
                       reader: Any = None) -> Optional["MaxAttentionLogits"]:
        """A reader when TrainingStateMonitor in ``callbacks`` (in the order they run) has
        ``max_attention_logit_format`` set, the model tracks the logits and ``reader`` (the monitor that
        will read them) runs before MaxLogitsMonitor zeroes them; else None, said once when it is not the key."""
        callbacks = list(callbacks or ())
        names = [type(cb).__name__ for cb in callbacks]
        monitor = callbacks[names.index("TrainingStateMonitor")] if "TrainingStateMonitor" in names else None
        if not getattr(monitor, "max_attention_logit_format", None):
            return None
        from mindformers.wrapper.wrapper import get_real_models

        model = get_real_models(train_network)
        if not callable(getattr(model, "get_max_attention_logit", None)):
            log.warning("msbridge: monitor_config.max_attention_logit_format is set, but %s does not track "
                        "attention logits (mindformers computes them in the FlashAttention of its parallel_core "
                        "models only): no attention/max_logit/* metrics", type(model).__name__)
            return None
        ours = next((i for i, cb in enumerate(callbacks) if cb is reader), None)
        if ours is not None and "MaxLogitsMonitor" in names[:ours]:
            log.warning("msbridge: mindformers' MaxLogitsMonitor runs before MSBridgeMonitor and zeroes the max "
                        "attention logits at each step end: no attention/max_logit/* metrics. List MSBridgeMonitor "
                        "under the run YAML's callbacks: (mindformers adds MaxLogitsMonitor after those), not in "
                        "Trainer(callbacks=...)")
            return None
        log.info("msbridge: forwarding mindformers' max attention logits of %s as attention/max_logit/* "
                 "at each flush", type(model).__name__)
        return cls(model)

    def read(self) -> Dict[str, float]:
        """The metrics of the step just run; ``{}`` when no layer has a logit yet (mindformers skips zeros)."""
        out: Dict[str, float] = {}
        heads = []
        for name, value in self.model.get_max_attention_logit().items():
            per_head = np.asarray(value.asnumpy(), dtype=np.float64).reshape(-1)
            layer = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
            out[max_logit_name(layer)] = float(per_head.max())
            heads.append(per_head)
        if heads:
            every = np.concatenate(heads)
            out[MAX_LOGIT_MAX] = float(every.max())
            out[MAX_LOGIT_MEAN] = float(every.mean())
        return out
