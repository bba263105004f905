"""What ``layer_norms``, ``memory`` and ``system`` add to each flush: the model's insides and the machine's.

Built at train begin from the train network and its optimizer, filled into
every flushed ``Window``:

- ``grad_norm/<param>`` every recorded step, from the ring's per-parameter
  columns (``TrainStep``, or ``attach_ring`` around a mindformers cell with
  ``local_norm=True``); without them one warning says what to use instead;
- ``weight_norm/<param>`` and ``optimizer/adam_m_norm/<param>``,
  ``optimizer/adam_v_norm/<param>`` (Adam-family optimizers), read at each flush;
- ``memory/*`` at each flush; ``system/npu_*`` from the background sampler;
- mindformers' separate losses (``train/lm_loss``, ``train/aux_loss`` ...) at each flush, when its train
  cell registered them (``separate_loss``);
- histograms of the weights matching ``histograms``, and of their gradients with
  ``TrainStep``, at a flush at least ``histogram_interval`` steps after the last
  ones (``ParamHistograms``); the callback sends them as ``histogram`` events.

Nothing here runs on a step that does not flush.

Example:
    >>> internals = Internals(layer_norms=".*", memory=True).start(train_network, optimizer, ring_cell)
    >>> internals.fill(window, at_flush=True, step=100)   # in BridgeMonitor.flush
    >>> internals.close()
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence

from ..names import grad_norm_name, optimizer_norm_name, weight_norm_name
from .cb_params import param
from .histograms import ParamHistograms
from .memory import MemoryReader
from .param_norms import StateNorms, optimizer_states
from .param_select import ParamSelector, Selection
from .separate_loss import SeparateLoss
from .system_sampler import NpuSampler
from .window import Window

log = logging.getLogger("msbridge")


class Internals:
    """Per-parameter norms, memory and NPU system metrics for one training run.

    Args:
        layer_norms: regex over parameter names (None: no norms).
        layer_norms_group: regex whose one group names a layer (norms per layer).
        memory: record ``memory/*`` at each flush.
        system_interval_s: seconds between ``npu-smi`` samples (None: off).
        device_id: this rank's MindSpore device id (its own NPU chip).
        histograms: regex over parameter names for weight (and gradient) histograms (None: none).
        histogram_interval: the fewest steps between two histograms (None: every flush).

    Example:
        >>> Internals(layer_norms="attention", memory=True).start(net, opt, None).fill(window, True, step=10)
    """

    def __init__(self, layer_norms: Optional[str] = None, layer_norms_group: Optional[str] = None,
                 memory: bool = False, system_interval_s: Optional[float] = None, device_id: int = 0,
                 histograms: Optional[str] = None, histogram_interval: Optional[int] = None) -> None:
        self.selector = ParamSelector(layer_norms, layer_norms_group) if layer_norms else None
        self.memory_on = memory
        self.system_interval_s = system_interval_s
        self.device_id = device_id
        self.grads: Optional[Selection] = None
        self.states: Dict[str, StateNorms] = {}  # state name ("weight", "adam_m", "adam_v") -> norms reader
        self.state_selection: Optional[Selection] = None
        self.memory: Optional[MemoryReader] = None
        self.sampler: Optional[NpuSampler] = None
        self.histograms = ParamHistograms(histograms, histogram_interval) if histograms else None
        self.parts: Optional[SeparateLoss] = None

    def start(self, train_network: Any, optimizer: Any, ring_cell: Any, first_step: int = 0,
              cb: Any = None, monitor: Any = None) -> "Internals":
        """Select the parameters, say once what cannot be recorded, start the sampler (``cb``: MindSpore's
        callback params, whose ``list_callback`` says who else reads mindformers' separate losses, and before or
        after ``monitor``, the BridgeMonitor starting)."""
        import mindspore as ms

        if self.selector is not None:
            self._bind_norms(train_network, optimizer, ring_cell)
        if self.memory_on:
            self.memory = MemoryReader(str(ms.get_context("device_target")))
        if self.system_interval_s:
            self.sampler = NpuSampler.start(self.system_interval_s, self.device_id)
        if self.histograms is not None:
            self.histograms.start(train_network, optimizer, ring_cell, first_step)
        self.parts = SeparateLoss.find(param(cb, "list_callback", None), train_network, first_step, monitor)
        return self

    def _bind_norms(self, train_network: Any, optimizer: Any, ring_cell: Any) -> None:
        weights = list(optimizer.parameters) if optimizer is not None else _trainable(train_network)
        names = [p.name for p in weights]
        selection = self.selector.select(names)
        if not selection.indices:
            log.warning(self.selector.no_match(names))
            return
        self.state_selection = selection
        picked = [weights[i] for i in selection.indices]
        self.states["weight"] = StateNorms(picked)
        moments = optimizer_states(optimizer) if optimizer is not None else {}
        for state, tensors in moments.items():
            self.states[state] = StateNorms([tensors[i] for i in selection.indices])
        columns = tuple(getattr(ring_cell, "param_columns", ()) or ())
        if columns:
            self.grads = self.selector.select(columns)
        else:
            log.warning("msbridge: layer_norms: per-parameter grad norms are computed inside the compiled step, "
                        "and this train cell does not compute them: use msbridge.TrainStep, or attach_ring around "
                        "a mindformers train cell built with local_norm=True (runner_wrapper: MSBridgeRing, "
                        "local_norm: True). Recording weight_norm/*%s only",
                        " and optimizer/*" if moments else "")
        what = ["grad_norm"] * bool(columns) + ["weight_norm"] + [f"optimizer/{s}_norm" for s in moments]
        per = f"{len(selection.labels)} layer(s) of {len(selection.indices)} parameters" if selection.grouped \
            else f"{len(selection.indices)} parameter(s)"
        log.info("msbridge: layer_norms %r: %s for %s", self.selector.pattern, ", ".join(what), per)

    def fill(self, window: Window, at_flush: bool, step: int) -> None:
        """Add this window's series; ``at_flush``: also read the state sampled once per flush, at ``step``
        (the last step trained: the weights and gradient copies are that step's)."""
        if self.grads is not None and window.param_grad_norms is not None:
            window.series.update(self.grads.named(grad_norm_name, window.param_grad_norms))
        if self.sampler is not None:
            window.timed.extend(self.sampler.drain())
        if not at_flush:
            return
        if self.histograms is not None and len(window):
            window.histograms.extend(self.histograms.take(step))
        selection = self.state_selection
        for state, reader in self.states.items():
            name = weight_norm_name if state == "weight" else lambda p, s=state: optimizer_norm_name(s, p)
            named = selection.named(name, reader.read(), picked=True)
            window.at_flush.update({k: float(v) for k, v in named.items()})
        if self.memory is not None:
            window.at_flush.update(self.memory.read())
        if self.parts is not None:
            window.at_flush.update(self.parts.read(step))

    def close(self) -> None:
        """Stop the sampler thread."""
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None


def _trainable(train_network: Any) -> Sequence[Any]:
    return list(train_network.trainable_params()) if hasattr(train_network, "trainable_params") else []

