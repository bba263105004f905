"""msbridge under mindformers' pipeline-parallel and gradient-accumulation train cell.

With ``pipeline_stage > 1`` (or ``gradient_accumulation_steps > 1`` in semi-auto/auto parallel mode)
mindformers' ``_reset_wrapper_for_pipeline_parallel`` / ``_reset_wrapper_for_grad_accu`` set
``runner_wrapper.type`` to ``MFPipelineWithLossScaleCell``, whose ``**kwargs`` would swallow
``MSBridgeRing``'s ``wrapper`` and ``ring_size``. Two pieces keep msbridge's stream right there:

- ``keep_ring_through_reset`` (installed by ``import msbridge.mindformers``) wraps those two methods:
  when the YAML named ``MSBridgeRing``, it stays the type and builds ``MFPipelineWithLossScaleCell``
  (with the ``micro_batch_num`` and ``calculate_per_token_loss`` mindformers set), so the device ring
  records every step of that cell, whose output has the same layout as ``MFTrainOneStepCell``'s;
- ``PipelineLoss`` (at train begin) takes the loss as MFLossMonitor does: from the last pipeline stage
  (``reduce_ranks`` defaults to its ranks; other ranks record no ``train/loss``, theirs is not the loss),
  divided by what mindformers' own ``MFLossMonitor._fix_loss_for_parallel`` divides it by (micro batches,
  accumulation steps, interleave). It says at train begin what it records: a warning when the ring was
  lost (``config check`` and the entry's config have already warned that mindformers replaces the wrapper).

Example:
    >>> keep_ring_through_reset()                      # done by ``import msbridge.mindformers``
    >>> loss = PipelineLoss.at_train_begin(cb_params.list_callback, cb_params.train_network, ring=True)
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional, Sequence, Tuple

from ..capture.loss_factor import loss_factor, pipeline_cell
from ..capture.window import Window
from ..names import LOSS, PIPELINE_CELL

log = logging.getLogger("msbridge")

RING = "MSBridgeRing"
_RESETS = ("_reset_wrapper_for_pipeline_parallel", "_reset_wrapper_for_grad_accu")


def keep_ring_through_reset() -> None:
    """Make mindformers' wrapper reset keep ``MSBridgeRing`` around its pipeline cell (idempotent)."""
    from mindformers.trainer.base_trainer import BaseTrainer

    for name in _RESETS:
        original = getattr(BaseTrainer, name, None)
        if original is not None and not getattr(original, "msbridge_keeps_ring", False):
            setattr(BaseTrainer, name, _keeping_ring(original))


def _keeping_ring(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reset(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        wrapper = getattr(trainer.config, "runner_wrapper", None)
        ring = wrapper is not None and wrapper.get("type") == RING
        result = original(trainer, *args, **kwargs)
        if ring and wrapper.get("type") == PIPELINE_CELL:
            asked = wrapper.get("wrapper", "MFTrainOneStepCell")
            wrapper.type, wrapper.wrapper = RING, PIPELINE_CELL
            log.info("msbridge: mindformers replaced runner_wrapper (MSBridgeRing around %s) with %s "
                     "(micro_batch_num %s); MSBridgeRing now builds %s and keeps its device ring around it",
                     asked, PIPELINE_CELL, wrapper.get("micro_batch_num"), PIPELINE_CELL)
        return result

    reset.msbridge_keeps_ring = True  # type: ignore[attr-defined]
    return reset


def _stages() -> Tuple[int, bool]:
    import mindspore as ms

    stages = int(ms.get_auto_parallel_context("pipeline_stages") or 1)
    try:
        scheduler = ms.get_auto_parallel_context("pipeline_scheduler")
    except ValueError:  # a MindSpore without pipeline schedulers
        scheduler = None
    return stages, scheduler == "zero_bubble_v"


class PipelineLoss:
    """The loss as MFLossMonitor reports it: scaled by ``factor``, recorded only on ``loss_ranks``."""

    def __init__(self, factor: float = 1.0, loss_ranks: Optional[Tuple[int, ...]] = None, rank: int = 0) -> None:
        self.factor, self.loss_ranks, self.rank = factor, loss_ranks, rank

    @property
    def holds_loss(self) -> bool:
        return self.loss_ranks is None or self.rank in self.loss_ranks

    @classmethod
    def at_train_begin(cls, callbacks: Sequence[Any], network: Any, ring: bool, rank: int,
                       world_size: int) -> "PipelineLoss":
        """Work it out from mindformers' parallel context and callbacks; say once what is recorded."""
        cell = pipeline_cell(network)
        factor, why = loss_factor(callbacks, cell)
        stages, zero_bubble = _stages()
        ranks = None
        if stages > 1 and world_size >= stages:
            per_stage = world_size // stages
            ranks = (0,) if zero_bubble else tuple(range(world_size - per_stage, world_size))
        found = cls(factor, ranks, rank)
        found._say(cell, ring, why, stages)
        return found

    def _say(self, cell: Any, ring: bool, why: str, stages: int) -> None:
        parts = []
        if cell is not None:
            parts.append(f"the train cell is mindformers' {PIPELINE_CELL}; " + (
                "msbridge's device ring records every step's loss, overflow, loss scale, lr and global norm"
                if ring else "no device ring around it (import msbridge.mindformers before the Trainer is built "
                "to keep MSBridgeRing): msbridge reads each step's outputs at its end, and with sink_mode only the "
                "last step of each sink"))
        if self.factor != 1.0:
            parts.append(f"train/loss is the cell's loss x {self.factor:g} ({why}), as MFLossMonitor prints it")
        if self.loss_ranks is not None:
            parts.append(f"{stages} pipeline stages: the loss is valid on ranks {list(self.loss_ranks)} only; "
                         + ("this rank records it" if self.holds_loss else "this rank records no train/loss"))
        if parts:  # a warning when the ring is lost; else what config check already warned of, confirmed
            level = logging.WARNING if cell is not None and not ring else logging.INFO
            log.log(level, "msbridge: %s", "; ".join(parts))

    def adjust(self, window: Optional[Window]) -> None:
        """The window's loss as MFLossMonitor's: scaled, or left out on a rank that does not hold it."""
        if window is None or LOSS not in window.scalars:
            return
        if not self.holds_loss:
            del window.scalars[LOSS]
        elif self.factor != 1.0:
            window.scalars[LOSS] = window.scalars[LOSS] * self.factor
