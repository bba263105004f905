"""``MSBridgeRing``: msbridge's device ring buffer around a mindformers train cell, from YAML.

mindformers builds its train cell from ``runner_wrapper:``. Naming
``MSBridgeRing`` there builds the cell named by ``wrapper`` with every other key
(and mindformers' own default arguments: network, optimizer ...), then
``msbridge.attach_ring`` records its loss, overflow, loss scale, lr and global
norm into a ring on the device every step. ``MSBridgeMonitor`` drains it with
one copy per flush, so device sink mode (``sink_size > 1``) still gets every
step. With ``local_norm: True`` mindformers' cell also returns each gradient's
square sum, and the ring keeps every parameter's grad norm for ``layer_norms``
(``grad_norm/<param>``: this device's gradients, before the data-parallel
reduction and clipping, as mindformers' own local norm). Under pipeline parallel
or gradient accumulation mindformers resets the wrapper to ``MFPipelineWithLossScaleCell``;
``pipeline.keep_ring_through_reset`` then makes ``MSBridgeRing`` build that cell, with the ring kept.

Example (run YAML):
    runner_wrapper:
      type: MSBridgeRing
      wrapper: MFTrainOneStepCell    # any registered wrapper
      ring_size: 256                 # >= flush_steps + sink_size
      local_norm: True               # per-parameter grad norms for layer_norms (optional)
      use_clip_grad: True
      scale_sense: 1.0
"""
from __future__ import annotations

from typing import Any

from ..capture.ring_cell import DEFAULT_RING_SIZE, RingAttached, attach_ring


class MSBridgeRing:
    """Builds ``wrapper`` (a registered mindformers WRAPPER) with ``kwargs`` and attaches a ring.

    Args:
        wrapper: the registered name of the train cell to build.
        ring_size: rows of the ring buffer.
        **kwargs: the train cell's own arguments.

    Example:
        >>> cell = MSBridgeRing(wrapper="MFTrainOneStepCell", network=net, optimizer=opt, use_clip_grad=True)
    """

    def __new__(cls, wrapper: str = "MFTrainOneStepCell", ring_size: int = DEFAULT_RING_SIZE,
                **kwargs: Any) -> RingAttached:  # type: ignore[misc]
        from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

        if wrapper == cls.__name__:
            raise ValueError("runner_wrapper.wrapper: name the train cell to wrap, not MSBridgeRing itself")
        train_cell = MindFormerRegister.get_cls(MindFormerModuleType.WRAPPER, wrapper)(**kwargs)
        return attach_ring(train_cell, int(ring_size))
