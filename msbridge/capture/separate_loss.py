"""mindformers' parts of the loss, read at the flush: ``train/lm_loss``, ``train/aux_loss``, ``train/mtp_loss``,
``train/indexer_loss``.

With ``print_separate_loss`` (the Trainer's default; mcore models only, ``use_legacy: False``) mindformers'
``MFTrainOneStepCell`` and ``MFPipelineWithLossScaleCell`` add each step's parts of the loss, inside the
compiled step, into four Parameters of ``mindformers.utils.parameter_register`` (``wrapper.py``,
``grads_for_mcore``): ``lm_loss``; ``aux_loss``, the MoE load-balancing loss divided by
``moe_aux_loss_coeff`` x the MoE layers (``get_aux_loss_scale``: the mean balancing loss of one MoE layer,
before its coefficient; MFLossMonitor prints it as ``load_balancing_loss``); ``mtp_loss``; ``indexer_loss``
(divided by the layers). They are running sums: only a reader zeroes them. ``MFLossMonitor``, with
``print_separate_loss`` on a MoE or MTP model, reads and zeroes them at every step end
(``_get_separate_loss``: its own device->host copy every step).

``SeparateLoss`` reads them at the flush only (one device->host copy per flush, none per step) and leaves
MFLossMonitor's reading as it is without msbridge:

- no MFLossMonitor reads them: msbridge is their one reader and zeroes them after each read (mindformers'
  own ``parameter_register.clear``), so a value is the sum over the steps trained since the last flush;
  it records that sum / those steps, the window's mean per step;
- MFLossMonitor reads them and runs after msbridge (``callbacks`` order): at the flush they hold the flush
  step's own parts (MFLossMonitor zeroed them at the step before); msbridge records them and zeroes
  nothing, so MFLossMonitor prints what it prints without msbridge;
- MFLossMonitor runs before msbridge: they are zeroed before msbridge could see them, and one line at
  train begin says to list MSBridgeMonitor before MFLossMonitor; none is recorded.

Each part is scaled as ``train/loss`` is under mindformers (MFLossMonitor's ``_fix_loss_for_parallel``:
micro batches under pipeline parallel, interleave) and recorded on the window's last step; a part that is
0 (a model without MoE, MTP or indexer) is left out, as MFLossMonitor leaves it out of its line.

A network that returns its aux loss itself is not read: mindformers' cells add it into the one loss they
return, and a legacy mindformers MoE model (``use_legacy: True``) adds it inside its own loss.

Example (no mindformers train cell registered the parts here):
    >>> SeparateLoss.find(callbacks=[], network=None) is None
    True
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ..names import AUX_LOSS, INDEXER_LOSS, LM_LOSS, MTP_LOSS
from .loss_factor import loss_factor, pipeline_cell

log = logging.getLogger("msbridge")

#: mindformers' ``parameter_register`` names -> msbridge's metric names.
PARTS = {"lm_loss": LM_LOSS, "aux_loss": AUX_LOSS, "mtp_loss": MTP_LOSS, "indexer_loss": INDEXER_LOSS}
REGISTER_MODULE = "mindformers.utils.parameter_register"


class SeparateLoss:
    """The parts of the loss a mindformers train cell registered, read at each flush.

    Args:
        register: mindformers' ``parameter_register``.
        owner: msbridge is the only reader: it zeroes them after each read and records window means.
        factor: what each part is multiplied by (as ``train/loss`` under mindformers).
        last_step: the step the sums start after.

    Example (a dict of tensors standing in for ``parameter_register``; MFLossMonitor zeroes them):
        >>> import mindspore as ms
        >>> register = {"lm_loss": ms.Tensor([2.5]), "aux_loss": ms.Tensor([1.25]), "mtp_loss": ms.Tensor([0.0])}
        >>> SeparateLoss(register, owner=False).read(step=10)
        {'train/lm_loss': 2.5, 'train/aux_loss': 1.25}
    """

    def __init__(self, register: Any, owner: bool, factor: float = 1.0, last_step: int = 0) -> None:
        self.register, self.owner, self.factor, self.last_step = register, owner, factor, last_step
        self.names = [name for name in PARTS if name in register.keys()]

    @classmethod
    def find(cls, callbacks: Optional[Sequence[Any]], network: Any, first_step: int = 0,
             monitor: Any = None) -> Optional["SeparateLoss"]:
        """The reader of this training, None when no mindformers cell registered the parts (or they would be
        zeroed before msbridge reads them: said once)."""
        module = sys.modules.get(REGISTER_MODULE)  # only a mindformers train cell imports it
        register = getattr(module, "parameter_register", None)
        if register is None or "lm_loss" not in register.keys():
            return None
        callbacks = list(callbacks or ())
        reader = next((i for i, c in enumerate(callbacks) if _reads_parts(c)), None)
        if reader is not None and reader < _own_index(callbacks, monitor):
            log.warning("msbridge: MFLossMonitor reads and zeroes mindformers' separate losses (lm_loss, "
                        "aux_loss, mtp_loss) at every step end, before this monitor runs; list MSBridgeMonitor "
                        "before MFLossMonitor in callbacks: to record train/lm_loss, train/aux_loss, train/mtp_loss")
            return None
        factor, _ = loss_factor(callbacks, pipeline_cell(network))
        found = cls(register, owner=reader is None, factor=factor, last_step=first_step)
        log.info("msbridge: recording mindformers' separate losses (%s) at each flush, %s", ", ".join(found.names),
                 "as the mean per step of the window (msbridge zeroes them)" if found.owner
                 else "as the flush step's values (MFLossMonitor zeroes them at every step)")
        return found

    def read(self, step: int) -> Dict[str, float]:
        """The parts at the flush after ``step`` (the last step trained), by metric name."""
        from mindspore import ops

        steps = max(step - self.last_step, 1) if self.owner else 1
        self.last_step = step
        params = [self.register.get(name) for name in self.names]
        values = ops.concat([p.reshape(-1) for p in params]).asnumpy().astype(np.float64)  # one copy
        if self.owner:
            for name in self.names:
                self.register.clear(name)
        out = {}
        for name, param, value in zip(self.names, params, np.split(values, np.cumsum([p.size for p in params])[:-1])):
            mean = float(value.mean()) * self.factor / steps
            if name == "lm_loss" or mean != 0.0:
                out[PARTS[name]] = mean
        return out


def _reads_parts(callback: Any) -> bool:
    """mindformers' MFLossMonitor, reading the parts (its constructor turns that off for a legacy model,
    or a model with neither MoE nor MTP)."""
    return type(callback).__name__ == "MFLossMonitor" and bool(getattr(callback, "print_separate_loss", False))


def _own_index(callbacks: Sequence[Any], monitor: Any) -> int:
    """Where ``monitor`` (the BridgeMonitor asking) is among the callbacks; after them all when it is not."""
    return next((i for i, c in enumerate(callbacks) if c is monitor), len(callbacks))
