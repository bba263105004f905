"""``TrainStep``: ``nn.TrainOneStepCell`` plus loss scaling, clipping and the device ring buffer.

One compiled step does forward, backward, (un)scaling, the global grad norm,
an overflow check (``NPUGetFloatStatusV2`` has no CPU kernel: a gradient is
non-finite exactly when its float32 square sum is, so one IsFinite over the
square sums replaces a pass over every gradient; a finite gradient whose square
sum overflows float32, a norm above 1.8e19, counts as an overflow like its
recorded grad norm, inf), optional clipping by global norm, the optimizer update, and one row
of the ring buffer: loss, grad norm, the lr the optimizer used, loss scale,
overflow, then every parameter's squared gradient norm (the square sums the
global norm is made of: no extra reduction, no extra op but one concat). It returns the loss, so every
ordinary callback still works. When the monitor's ``histograms`` asks for them (``keep_grads``, at train
begin, before the step compiles), the step also copies the matched gradients into one flat device Parameter
(after unscaling, before clipping: the gradients ``grad_norm/<param>`` measures), read at a histogram flush.

Example:
    >>> from msbridge import BridgeMonitor, TrainStep
    >>> step = TrainStep(loss_net, optimizer, scale_sense=nn.DynamicLossScaleUpdateCell(2**12, 2, 1000),
    ...                  clip_grad_norm=1.0, ring_size=256)
    >>> Model(step).train(3, ds, callbacks=[BridgeMonitor(cfg)], dataset_sink_mode=True, sink_size=20)
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.context import ParallelMode
from mindspore.parallel._utils import _get_device_num, _get_gradients_mean, _get_parallel_mode

from ..names import GRAD_NORM, LOSS, LOSS_SCALE, LR, OVERFLOW
from .ring_cell import DEFAULT_RING_SIZE, RingCell

#: Attribute (and Parameter name prefix) of the gradient copies ``keep_grads`` makes, and of their written mark.
GRADS_NAME = "msbridge_grads"
GRADS_STEP_NAME = "msbridge_grads_step"

_square_sum = ops.MultitypeFuncGraph("msbridge_square_sum")
_scale = ops.MultitypeFuncGraph("msbridge_scale")


@_square_sum.register("Tensor")
def _tensor_square_sum(grad: Any) -> Any:
    return ops.square(ops.cast(grad, ms.float32)).sum()


@_scale.register("Tensor", "Tensor")
def _tensor_scale(factor: Any, grad: Any) -> Any:
    return grad * ops.cast(factor, grad.dtype)


class TrainStep(RingCell):
    """A drop-in train-step cell that also fills msbridge's device ring buffer.

    With ``scale_sense=None`` and ``clip_grad_norm=None`` it computes the same
    update as ``nn.TrainOneStepCell``; the ring costs a grad-norm reduction, an
    IsFinite over the n square sums and one scatter of 5 + n floats per step
    (n: the optimizer's parameters, whose gradient norms feed ``layer_norms``).

    Args:
        network: a cell that returns the loss (``nn.WithLossCell`` or your own).
        optimizer: a MindSpore optimizer; its ``get_lr()`` gives the recorded lr.
        scale_sense: None (no loss scaling), a number or Tensor (static scale), or
            a loss-scale update cell such as ``nn.DynamicLossScaleUpdateCell``
            (dynamic scale). With a scale, a step whose grads overflow is skipped.
        clip_grad_norm: clip gradients to this global L2 norm (None: no clipping).
            The recorded grad norm is the one before clipping.
        ring_size: rows of the ring buffer, at least the monitor's flush window
            plus the steps of one sink (``msbridge.capture.ring_reader.ring_size_for``).
        skip_nonfinite: skip the update (weights, optimizer state and its step
            stay bit-identical) when the loss or any gradient is NaN/Inf.

    Example:
        >>> step = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01),
        ...                  clip_grad_norm=1.0, skip_nonfinite=True)
        >>> loss = step(x, y)
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, scale_sense: Union[None, float, Tensor, nn.Cell] = None,
                 clip_grad_norm: Optional[float] = None, ring_size: int = DEFAULT_RING_SIZE,
                 skip_nonfinite: bool = False) -> None:
        super().__init__(ring_size, tuple(p.name for p in optimizer.parameters))
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        self.scaled = scale_sense is not None
        self.scale_manager: Optional[nn.Cell] = None
        if isinstance(scale_sense, nn.Cell):
            self.scale_manager = scale_sense
            scale_sense = scale_sense.get_loss_scale()
        scale = Tensor(1.0 if scale_sense is None else scale_sense, ms.float32).reshape(())
        # A Parameter only when there is a scale to keep (and checkpoint); otherwise a graph constant.
        self.scale_sense = Parameter(scale, name="scale_sense", requires_grad=False) if self.scaled else scale
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be > 0, got {clip_grad_norm}")
        self.clip = clip_grad_norm is not None
        self.clip_norm = Tensor(math.inf if clip_grad_norm is None else clip_grad_norm, ms.float32)
        # Skip the update on a bad step: always with a loss scale (MindSpore's semantics), else on request.
        self.skip_bad_steps = self.scaled or bool(skip_nonfinite)
        self.has_lr = hasattr(optimizer, "get_lr")
        self.group_lr = bool(getattr(optimizer, "is_group_lr", False))
        self.grad_reducer = nn.Identity()
        if _get_parallel_mode() in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL):
            self.grad_reducer = nn.DistributedGradReducer(self.weights, _get_gradients_mean(), _get_device_num())
        self.ring_columns = tuple(name for name, on in ((LOSS, True), (GRAD_NORM, True), (LR, self.has_lr),
                                                        (LOSS_SCALE, self.scaled), (OVERFLOW, True)) if on)
        self.grad_indices: Tuple[int, ...] = ()  # positions in self.weights whose gradients are kept (keep_grads)
        self._get_attr_from_cell(network)

    def keep_grads(self, names: Sequence[str]) -> Tuple[str, ...]:
        """From the next compile on, copy the gradients of the parameters named in ``names`` into one flat
        float32 device Parameter at every step (``GRADS_NAME``: their sizes added up; one Concat and one Assign
        per step, whatever the number of parameters; nothing leaves the device). Returns the names kept, in
        ``optimizer.parameters`` order.

        Call it before the step is first compiled (``BridgeMonitor`` does, at train begin, for ``histograms``):
        a step compiled earlier does not write the copy, which ``kept_grads`` then reports. The copy is a
        Parameter of this cell, so a checkpoint of it holds it too.
        """
        wanted = set(names)
        indices = tuple(i for i, p in enumerate(self.weights) if p.name in wanted)
        if indices != self.grad_indices:
            self._params.pop(GRADS_NAME, None)  # a different selection: the old copy goes
            if indices:
                size = sum(int(np.prod(self.weights[i].shape)) for i in indices)
                setattr(self, GRADS_NAME, Parameter(Tensor(np.zeros(size, np.float32)), name=GRADS_NAME,
                                                    requires_grad=False))
                # -1 until a step writes the copy: how kept_grads tells a step compiled without it
                setattr(self, GRADS_STEP_NAME, Parameter(Tensor(-1, ms.int32), name=GRADS_STEP_NAME,
                                                         requires_grad=False))
            self.grad_indices = indices
        elif indices:  # the same copy (a second train call): a graph compiled with it marks it again
            getattr(self, GRADS_STEP_NAME).set_data(Tensor(-1, ms.int32))
        return tuple(self.weights[i].name for i in indices)

    def kept_grads(self) -> Optional[Dict[str, np.ndarray]]:
        """``{param name: its gradient}`` (float32, the parameter's shape) of the latest step, or None when no
        step has written them since ``keep_grads`` (none kept, or the step was compiled before it:
        ``Model.build``, an earlier ``train``). Reads one int from the device, then the flat copy."""
        if not self.grad_indices or int(getattr(self, GRADS_STEP_NAME).asnumpy()) < 0:
            return None
        flat, out, start = getattr(self, GRADS_NAME).asnumpy(), {}, 0
        for i in self.grad_indices:
            shape = tuple(self.weights[i].shape)
            size = int(np.prod(shape))
            out[self.weights[i].name] = flat[start:start + size].reshape(shape)
            start += size
        return out

    def _copy_grads(self, grads: Any) -> Any:
        """Inside the step: the kept gradients, flat and float32, into the copy; the ring counter to the mark."""
        flat = ops.concat([ops.cast(grads[i], ms.float32).reshape((-1,)) for i in self.grad_indices])
        written = ops.assign(self.msbridge_grads_step, self.msbridge_ring_step)
        return ops.depend(written, ops.assign(self.msbridge_grads, flat))

    def construct(self, *inputs: Any) -> Any:
        loss = self.network(*inputs)
        scale = ops.cast(self.scale_sense, ms.float32)  # the scale this step uses, before any update
        sens = ops.ones_like(loss)
        if self.scaled:
            sens = sens * ops.cast(scale, loss.dtype)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        if self.scaled:
            grads = self.hyper_map(ops.partial(_scale, ops.reciprocal(scale)), grads)
        if self.grad_indices:  # a constant when compiled: without gradient histograms the graph has no copy
            loss = ops.depend(loss, self._copy_grads(grads))
        squares = ops.stack(self.hyper_map(_square_sum, grads))  # one per parameter
        grad_norm = ops.sqrt(squares.sum())
        finite = ops.logical_and(ops.isfinite(squares).all(), ops.isfinite(loss).all())
        overflow = ops.logical_not(finite)
        if self.scale_manager is not None:
            overflow = self.scale_manager(self.scale_sense, overflow)
        if self.clip:
            factor = ops.minimum(self.clip_norm / (grad_norm + 1e-6), 1.0)
            grads = self.hyper_map(ops.partial(_scale, factor), grads)
        lr = self.nan
        if self.has_lr:  # read before the optimizer advances its global_step: the lr this step uses
            lr = self.optimizer.get_lr()
            if self.group_lr:
                lr = lr[0]
        grads = ops.depend(grads, lr)
        if self.skip_bad_steps:
            if not overflow:
                loss = ops.depend(loss, self.optimizer(grads))
        else:
            loss = ops.depend(loss, self.optimizer(grads))
        return ops.depend(loss, self.record_step(loss, grad_norm, lr, scale, overflow, squares))
