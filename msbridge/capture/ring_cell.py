"""The device side of the step ring buffer: a ``[ring_size, 5 + n]`` Parameter written inside the compiled step.

Every step writes one row, ``STEP_SCALARS`` order (loss, grad norm, lr, loss
scale, overflow) then, when the cell has them, the squared L2 norms of the ``n``
parameters' gradients (``param_names`` order; the reader takes the root on the
host, so the step adds no op for it), at row ``step % ring_size`` of
``msbridge_ring``, and increments the device step counter ``msbridge_ring_step``.
Nothing leaves the device on the step's path; ``msbridge.capture.ring_reader.RingReader``
copies the ring to the host once per flush.

Per-parameter gradient norms come from ``TrainStep`` (always: it has the
per-parameter square sums for the global norm anyway) and from ``attach_ring``
around a mindformers train cell built with ``local_norm=True`` (its output
carries them). Another wrapped cell does not expose its gradients: its ring
has the 5 columns only. The ring costs ``ring_size x (5 + n) x 4`` bytes of
device memory (256 rows x 300 parameters: 0.3 MB).

``RingCell`` is the base that owns the two Parameters (``TrainStep`` is one);
``attach_ring`` wraps an existing train cell (mindformers' ``MFTrainOneStepCell``,
``nn.TrainOneStepWithLossScaleCell``, a user's own) and records what its
output already holds.

The two Parameters belong to the train cell, so ``ModelCheckpoint`` saves them
with the weights (a few KB); loading such a checkpoint into a network without a
ring only reports them as unused.

Example:
    >>> train_cell = attach_ring(MFTrainOneStepCell(net, opt, ...), ring_size=256)
    >>> Model(train_cell).train(1, ds, callbacks=[BridgeMonitor(cfg)], dataset_sink_mode=True, sink_size=20)
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..names import LOSS, LOSS_SCALE, LOSS_SCALE_OUTPUT, MINDFORMERS_OUTPUT, OVERFLOW, STEP_SCALARS

# Positions in a wrapped cell's output tuple (the layouts are ``msbridge.names``'); graph mode reads them as
# constants. Ring columns are ``STEP_SCALARS``: loss, grad norm, lr, loss scale, overflow.
_MF_LOSS, _MF_NORM, _MF_LR, _MF_SCALE, _MF_OVERFLOW = (MINDFORMERS_OUTPUT.index(n) for n in STEP_SCALARS)
_LS_LOSS, _LS_SCALE, _LS_OVERFLOW = (LOSS_SCALE_OUTPUT.index(n) for n in (LOSS, LOSS_SCALE, OVERFLOW))
_MF_LEN, _LS_LEN = len(MINDFORMERS_OUTPUT), len(LOSS_SCALE_OUTPUT)
_MF_LOCAL_NORM = _MF_LEN  # mindformers' cells with local_norm=True: (..., global_norm, local_norm, size)

#: The ring size ``TrainStep`` and ``attach_ring`` use when none is given: a flush window of
#: 100 steps (the default) plus a sink of up to 156 steps fits.
DEFAULT_RING_SIZE = 256

RING_NAME = "msbridge_ring"
COUNTER_NAME = "msbridge_ring_step"


def _scalar(value: Any) -> Any:
    """A float32 scalar from a scalar, a 1-element or a larger tensor (its mean)."""
    return ops.cast(value, ms.float32).mean()


class RingCell(nn.Cell):
    """Base of every train cell that carries a ring buffer.

    Subclasses call ``self.record_step(loss, grad_norm, lr, loss_scale, overflow)``
    once in ``construct``; each argument is a tensor of any numeric dtype
    (a non-scalar is reduced to its mean). A cell built with ``param_names``
    also passes ``param_squares``: a 1-D tensor, one squared gradient norm per name.

    Args:
        ring_size: rows of the ring; must be at least the monitor's flush window
            plus the steps of one sink (``BridgeMonitor`` checks at train begin).
        param_names: the parameters whose squared gradient norms each row also holds.

    Attributes:
        ring_columns: names from ``STEP_SCALARS`` this cell records, or None when
            they are read from the wrapped cell's output layout (``attach_ring``).
        param_columns: ``param_names``; the ring's columns after ``STEP_SCALARS``.

    Example:
        >>> class MyStep(RingCell):
        ...     def __init__(self, train_one_step):
        ...         super().__init__(ring_size=256)
        ...         self.step = train_one_step
        ...     def construct(self, x, y):
        ...         loss = self.step(x, y)
        ...         self.record_step(loss, self.nan, self.nan, self.nan, self.nan)  # loss only
        ...         return loss
    """

    ring_columns: Optional[Tuple[str, ...]] = None

    def __init__(self, ring_size: int = DEFAULT_RING_SIZE, param_names: Tuple[str, ...] = ()) -> None:
        super().__init__(auto_prefix=False)
        ring_size = int(ring_size)
        if ring_size < 1:
            raise ValueError(f"ring_size must be >= 1, got {ring_size}")
        self.ring_size = ring_size
        self.param_columns = tuple(param_names)
        self.msbridge_ring = Parameter(Tensor(np.zeros((ring_size, len(STEP_SCALARS) + len(self.param_columns)),
                                                       np.float32)), name=RING_NAME, requires_grad=False)
        self.msbridge_ring_step = Parameter(Tensor(0, ms.int32), name=COUNTER_NAME, requires_grad=False)
        self.nan = Tensor(np.nan, ms.float32)
        self.nan_params = Tensor(np.full(len(self.param_columns), np.nan, np.float32))

    def record_step(self, loss: Any, grad_norm: Any, lr: Any, loss_scale: Any, overflow: Any,
                    param_squares: Any = None) -> Any:
        """Write one row at ``counter % ring_size`` and advance the counter (inside the graph)."""
        row = ops.stack([_scalar(loss), _scalar(grad_norm), _scalar(lr), _scalar(loss_scale), _scalar(overflow)])
        if self.param_columns:
            squares = self.nan_params if param_squares is None else ops.cast(param_squares, ms.float32).reshape((-1,))
            row = ops.concat((row, squares))
        row = row.reshape((1, len(STEP_SCALARS) + len(self.param_columns)))
        index = (self.msbridge_ring_step % self.ring_size).reshape((1,))
        written = ops.scatter_update(self.msbridge_ring, index, row)
        return ops.depend(ops.assign_add(self.msbridge_ring_step, ops.ones_like(self.msbridge_ring_step)), written)


class RingAttached(RingCell):
    """An existing train cell plus a ring that records its outputs (see ``attach_ring``)."""

    def __init__(self, train_cell: nn.Cell, ring_size: int = DEFAULT_RING_SIZE) -> None:
        optimizer = getattr(train_cell, "optimizer", None)
        # mindformers' cells with local_norm=True return each gradient's square sum (optimizer.parameters order).
        local = getattr(train_cell, "local_norm", False) is True and optimizer is not None
        super().__init__(ring_size, tuple(p.name for p in optimizer.parameters) if local else ())
        self.train_cell = train_cell
        # Callbacks and msbridge look these up on cb_params.train_network.
        for name in ("optimizer", "network"):
            if getattr(train_cell, name, None) is not None:
                setattr(self, name, getattr(train_cell, name))

    def construct(self, *inputs: Any) -> Any:
        out = self.train_cell(*inputs)
        nan = self.nan
        if isinstance(out, tuple):
            if len(out) >= _MF_LEN:  # mindformers' train cells
                norm = nan if out[_MF_NORM] is None else out[_MF_NORM]
                local = out[_MF_LOCAL_NORM] if self.param_columns and len(out) > _MF_LEN else None
                self.record_step(out[_MF_LOSS], norm, out[_MF_LR], out[_MF_SCALE], out[_MF_OVERFLOW], local)
            elif len(out) == _LS_LEN:  # nn.TrainOneStepWithLossScaleCell
                self.record_step(out[_LS_LOSS], nan, nan, out[_LS_SCALE], out[_LS_OVERFLOW])
            else:
                self.record_step(out[0], nan, nan, nan, nan)
        else:
            self.record_step(out, nan, nan, nan, nan)
        return out


def attach_ring(train_cell: nn.Cell, ring_size: int = DEFAULT_RING_SIZE) -> RingAttached:
    """Wrap ``train_cell`` so every step's output scalars land in a device ring buffer.

    The output is passed through unchanged. Its layout decides what is
    recorded, the same rules as the host ``StepBuffer``: a tensor is the loss;
    a 3-tuple is ``(loss, overflow, loss_scale)``; 5 items or more are
    mindformers' ``(loss, overflow, loss_scale, lr, global_norm, ...)`` (a None
    ``global_norm`` is left out); any other tuple records element 0 as the loss.
    What the output does not carry (lr for most cells) is read on the host at
    flush time, as without a ring. A mindformers cell built with
    ``local_norm=True`` also returns each gradient's square sum: the ring then
    holds every parameter's gradient norm too (``layer_norms``). Other cells do
    not expose their gradients; use ``TrainStep`` for per-parameter grad norms.

    Args:
        train_cell: the cell ``Model`` trains (it computes loss and applies the update).
        ring_size: rows of the ring (>= flush window + sink size).

    Returns:
        A cell to hand to ``Model`` instead of ``train_cell``; parameter names are unchanged.

    Example:
        >>> step = attach_ring(nn.TrainOneStepWithLossScaleCell(loss_net, opt, scale_sense=manager))
        >>> Model(step).train(1, ds, callbacks=[BridgeMonitor(cfg)])
    """
    if isinstance(train_cell, RingCell):
        raise ValueError(f"{type(train_cell).__name__} already carries a ring buffer")
    return RingAttached(train_cell, ring_size)


def find_ring_cell(train_network: Any) -> Optional[RingCell]:
    """The ``RingCell`` that ``Model`` trains: the network itself or one of its sub-cells (None if none)."""
    if isinstance(train_network, RingCell):
        return train_network
    if not isinstance(train_network, nn.Cell):
        return None
    for _, cell in train_network.cells_and_names():
        if isinstance(cell, RingCell):
            return cell
    return None
