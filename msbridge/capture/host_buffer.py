"""Host-side step buffer: keeps each step's output tensors as they are, converts them at flush.

On the step path it only appends references and host timestamps (O(1), no
device->host sync). ``drain`` stacks each column into one tensor and copies it
to the host once, then hands back a ``stream.Window``. On the CPU backend the
tensors are in host memory already: each is read as it is (~1.5 µs a tensor,
where launching the stack op costs ~30 µs a step), on any thread.

The layout of a train step's output is read once, from its first step:

- a scalar tensor: the loss;
- ``(loss, overflow, loss_scale)``: MindSpore's ``TrainOneStepWithLossScaleCell``;
- ``(loss, overflow, loss_scale, lr, global_norm[, ...])``: mindformers' train cells;
- any other tuple: the first tensor is taken as the loss, and a warning says so once.

Example:
    >>> buf = StepBuffer()
    >>> buf.append(step=1, epoch=1, outputs=loss_tensor, step_time_s=0.01, monitor_s=2e-6)
    >>> window = buf.drain(lr_reader)
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..names import LOSS, LOSS_SCALE_OUTPUT, LR, MINDFORMERS_OUTPUT
from .window import LrAt, Window

log = logging.getLogger("msbridge")

Layout = Tuple[Tuple[int, str], ...]  # (index in the output tuple, metric name)

_MINDFORMERS_LAYOUT: Layout = tuple(enumerate(MINDFORMERS_OUTPUT))
_LOSS_SCALE_LAYOUT: Layout = tuple(enumerate(LOSS_SCALE_OUTPUT))


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "asnumpy") and hasattr(value, "shape")


def detect_layout(outputs: Any) -> Layout:
    """Which element of a train step's output holds which scalar (decided once)."""
    if _is_tensor(outputs):
        return ((-1, LOSS),)
    if isinstance(outputs, (tuple, list)):
        if len(outputs) >= len(MINDFORMERS_OUTPUT) and _is_tensor(outputs[0]):
            return tuple((i, name) for i, name in _MINDFORMERS_LAYOUT if _is_tensor(outputs[i]))
        if len(outputs) == len(LOSS_SCALE_OUTPUT) and all(_is_tensor(o) for o in outputs):
            return _LOSS_SCALE_LAYOUT
        for i, item in enumerate(outputs):
            if _is_tensor(item):
                log.warning("msbridge: the network returns a %d-tuple; recording element %d "
                            "(shape %s) as the loss", len(outputs), i, tuple(item.shape))
                return ((i, LOSS),)
    raise TypeError(f"msbridge: cannot find a loss tensor in the network output {type(outputs).__name__}")


class HostSteps:
    """What the host knows of each step-end call between two flushes: step, epoch, wall clock,
    step time and the monitor's own time. ``StepBuffer`` and the ring reader both keep one."""

    def __init__(self) -> None:
        self.clear()

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, epoch: int, step_time_s: float, monitor_s: float, wall: Optional[float] = None) -> None:
        self.steps.append(step)
        self.epochs.append(epoch)
        self.wall.append(time.time() if wall is None else wall)
        self.step_time.append(step_time_s)
        self.monitor.append(monitor_s)

    def clear(self) -> None:
        self.steps: List[int] = []
        self.epochs: List[int] = []
        self.wall: List[float] = []
        self.step_time: List[float] = []
        self.monitor: List[float] = []


class StepBuffer:
    """Collects per-step tensor references and host timings between flushes; the output layout
    is detected from the first step. A ``window.StepSource``.

    Example:
        >>> buffer = StepBuffer()
        >>> buffer.append(1, 1, loss, 0.01, 0.0)
        >>> buffer.drain().scalars["train/loss"]
    """

    def __init__(self) -> None:
        self.layout: Optional[Layout] = None
        self._host = HostSteps()
        self._tensors: Dict[str, List[Any]] = {}
        self._live: Dict[str, Any] = {}  # name -> a live Parameter, read once per flush
        self._warned_shape = False
        self.in_host_memory = False  # CPU backend: read each tensor where it is, no stack op, on any thread

    def __len__(self) -> int:
        return len(self._host)

    def append(self, step: int, epoch: int, outputs: Any, step_time_s: float, monitor_s: float,
               wall: Optional[float] = None) -> None:
        if self.layout is None:
            self._set_layout(outputs)
        for index, name in self.layout:
            if name in self._tensors:
                self._tensors[name].append(outputs if index < 0 else outputs[index])
            else:
                self._live[name] = outputs[index]
        self._host.add(step, epoch, step_time_s, monitor_s, wall)

    def _set_layout(self, outputs: Any) -> None:
        """The layout, and which outputs are live Parameters (mindformers hands back its ``scale_sense``
        itself: holding it per step would read its value at the flush for every step)."""
        from mindspore import Parameter, get_context

        self.in_host_memory = get_context("device_target") == "CPU"
        self.layout = detect_layout(outputs)
        live = {name for index, name in self.layout if index >= 0 and isinstance(outputs[index], Parameter)}
        self._tensors = {name: [] for _, name in self.layout if name not in live}

    def drain(self, lr_at: Optional[LrAt] = None) -> Optional[Window]:
        """Everything since the last drain as a Window (None when empty)."""
        host = self._host
        if not host.steps:
            return None
        steps = np.asarray(host.steps, dtype=np.int64)
        scalars = {name: self._to_host(name, tensors) for name, tensors in self._tensors.items()}
        if LR not in scalars and lr_at is not None:
            lr = lr_at(steps)
            if lr is not None:
                scalars[LR] = lr
        window = Window(
            steps=steps,
            epochs=np.asarray(host.epochs, dtype=np.int64),
            wall_time=np.asarray(host.wall, dtype=np.float64),
            step_time_s=np.asarray(host.step_time, dtype=np.float64),
            monitor_s=np.asarray(host.monitor, dtype=np.float64),
            scalars=scalars,
            at_flush={name: float(value.asnumpy().mean()) for name, value in self._live.items()},
        )
        host.clear()
        self._tensors = {name: [] for name in self._tensors}
        return window

    def _to_host(self, name: str, tensors: List[Any]) -> np.ndarray:
        """One stacked device->host copy per column (on CPU, each tensor read in place); a non-scalar
        is reduced to its mean."""
        from mindspore import ops

        if any(t.size != 1 for t in tensors):
            if not self._warned_shape:
                self._warned_shape = True
                shape = next(tuple(t.shape) for t in tensors if t.size != 1)
                log.warning("msbridge: %s has shape %s, not a scalar; recording its mean", name, shape)
            tensors = [t.mean() if t.shape != () else t for t in tensors]
        if self.in_host_memory:
            return np.array([t.item() for t in tensors], dtype=np.float64)
        return ops.stack(tensors).asnumpy().astype(np.float64).reshape(len(tensors))
