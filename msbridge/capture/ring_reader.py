"""The host side of the device ring buffer: same interface as ``StepBuffer``, one copy per flush.

On the step path ``append`` stores host numbers only (step, epoch, timestamps)
and counts the device steps the call covers: one per call normally,
``sink_size`` per call in sink mode on a device. ``drain`` copies the whole ring
to the host once (``ring.asnumpy()``), reads the device step counter, and picks
the rows of the steps since the last drain; the per-parameter columns (squared
gradient norms, when the cell has them) come with the same copy and their root
is taken here.

The ring never overwrites a step that was not drained as long as it holds the
flush window plus one sink: ``check_ring_size`` refuses a smaller ring at train
begin, naming the smallest size that works. If steps were overwritten anyway
(a ring shared with a second training loop, a flush that never came), the device
counter shows it and ``drain`` warns with the lost step range; it never
drops a step silently.

On CPU, MindSpore runs ``dataset_sink_mode=True`` step by step (it falls back
to the non-sink loop and ignores ``sink_size``), so there ``append`` is called
once per step; on Ascend/GPU it is called once per sink.

Example:
    >>> reader = RingReader(train_step, first_step=0)
    >>> reader.append(step=20, epoch=1, outputs=loss, step_time_s=0.01, monitor_s=3e-6)  # a sink of 20
    >>> window = reader.drain(lr_reader)   # 20 steps, one device->host copy
"""
from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

import numpy as np

from ..errors import ConfigError
from ..names import LOSS, LR, STEP_SCALARS
from .host_buffer import HostSteps, detect_layout
from .ring_cell import RingCell
from .window import LrAt, Window

log = logging.getLogger("msbridge")


def min_ring_size(flush_steps: int, steps_per_call: int = 1) -> int:
    """The smallest ring that never overwrites an undrained step: one flush window plus one sink."""
    return int(flush_steps) + int(steps_per_call)


def ring_size_for(config: Any, steps_per_call: int = 1) -> int:
    """The ring size to build for ``config``: ``buffer_size``, or (0 = auto) twice the flush window.

    Example:
        >>> TrainStep(loss_net, opt, ring_size=ring_size_for(monitor.config, steps_per_call=20))
    """
    if config.buffer_size:
        return int(config.buffer_size)
    return max(2 * int(config.flush_steps), min_ring_size(config.flush_steps, steps_per_call))


def check_ring_size(ring_size: int, flush_steps: int, steps_per_call: int = 1, buffer_size: int = 0) -> None:
    """Raise ``ConfigError`` when the ring (or the configured ``buffer_size``) cannot hold a flush window."""
    need = min_ring_size(flush_steps, steps_per_call)
    sink = f" + {steps_per_call} steps per sink" if steps_per_call > 1 else " + 1"
    problems = []
    if buffer_size and buffer_size < need:
        problems.append(f"buffer_size: {buffer_size} is smaller than the flush window "
                        f"(flush_steps {flush_steps}{sink}); the smallest size that works is {need}")
    if ring_size < need:
        problems.append(f"the train cell's ring buffer has {ring_size} rows, fewer than the flush window "
                        f"(flush_steps {flush_steps}{sink}); the smallest size that works is {need}: "
                        f"build it with ring_size={need} or more, or lower flush_steps")
    if problems:
        raise ConfigError(problems)


class RingReader:
    """Reads a ``RingCell``'s ring at flush time; a drop-in for ``StepBuffer`` in the callback (both are a
    ``window.StepSource``).

    Args:
        cell: the train cell that carries the ring (``TrainStep`` or ``attach_ring``'s).
        first_step: the callback step number before the first step of this train call.
        interval: keep only steps divisible by it (``step_interval``).
        steps_per_call: the most steps one ``append`` can cover (``sink_size`` in device sink
            mode, else 1); a larger jump in step numbers (a resumed run) counts as this many.

    Example:
        >>> reader = RingReader(step_cell)
        >>> reader.append(1, 1, loss, 0.01, 0.0)
        >>> len(reader), reader.drain(None).scalars["train/loss"]
        (1, array([2.31]))
    """

    def __init__(self, cell: RingCell, first_step: int = 0, interval: int = 1, steps_per_call: int = 1) -> None:
        self.cell = cell
        self.ring_size = int(cell.ring_size)
        self.interval = max(1, int(interval))
        self.steps_per_call = max(1, int(steps_per_call))
        self.columns: Optional[Tuple[str, ...]] = cell.ring_columns
        self._loss_index: Optional[int] = -1 if self.columns is not None else None
        self._device_last = int(cell.msbridge_ring_step.asnumpy())  # once, before training
        self._host_last = int(first_step)
        self._pending = 0
        self._host = HostSteps()
        self._counts: List[int] = []
        self._checked_shape = False
        self._warned_mismatch = False

    def __len__(self) -> int:
        """Device steps written since the last drain (what the ring must still hold)."""
        return self._pending

    def append(self, step: int, epoch: int, outputs: Any, step_time_s: float, monitor_s: float,
               wall: Optional[float] = None) -> None:
        if self._loss_index is None:
            self._set_layout(outputs)
        if not self._checked_shape:
            self._check_loss_shape(outputs)
        last = self._host.steps[-1] if self._host.steps else self._host_last
        count = min(max(step - last, 1), self.steps_per_call)
        self._pending += count
        self._counts.append(count)
        self._host.add(step, epoch, step_time_s, monitor_s, wall)

    def drain(self, lr_at: Optional[LrAt] = None) -> Optional[Window]:
        """Everything since the last drain as a Window (None when empty)."""
        if not self._host.steps:
            return None
        ring = self.cell.msbridge_ring.asnumpy()  # the one copy of the window (plus the 4-byte counter)
        count = int(self.cell.msbridge_ring_step.asnumpy())
        steps, epochs, wall, step_time, monitor = self._expand()
        written = count - self._device_last
        if written != len(steps) and not self._warned_mismatch:
            self._warned_mismatch = True
            log.warning("msbridge: the ring's device counter advanced %d steps but training reported %d; "
                        "matching the newest rows to the newest steps", written, len(steps))
        keep = min(written, len(steps))
        lost = max(keep - self.ring_size, 0)
        if lost:
            lost_steps = steps[len(steps) - keep:len(steps) - keep + lost]
            log.warning("msbridge: steps %d-%d were overwritten in the device ring (%d rows) before they "
                        "were read and are not recorded; flush more often or build a larger ring",
                        lost_steps[0], lost_steps[-1], self.ring_size)
        keep -= lost
        rows = np.arange(count - keep, count) % self.ring_size
        picked = ring[rows].astype(np.float64)
        tail = slice(len(steps) - keep, len(steps))
        steps, epochs, wall, step_time, monitor = (a[tail] for a in (steps, epochs, wall, step_time, monitor))
        self._reset(count)
        if self.interval > 1:
            on = steps % self.interval == 0
            steps, epochs, wall, step_time, monitor, picked = (
                a[on] for a in (steps, epochs, wall, step_time, monitor, picked))
        if not len(steps):
            return None
        scalars = {name: picked[:, STEP_SCALARS.index(name)] for name in self.columns}
        if LR not in scalars and lr_at is not None:
            lr = lr_at(steps)
            if lr is not None:
                scalars[LR] = lr
        names = self.cell.param_columns
        return Window(steps=steps, epochs=epochs, wall_time=wall, step_time_s=step_time, monitor_s=monitor,
                      scalars=scalars, param_grad_norms=np.sqrt(picked[:, len(STEP_SCALARS):]) if names else None,
                      param_names=names)

    # -- helpers ---------------------------------------------------------------
    def _expand(self) -> Tuple[np.ndarray, ...]:
        """One entry per device step: a call that covered n steps becomes n steps (times interpolated)."""
        host = self._host
        ends = np.asarray(host.steps, dtype=np.int64)
        counts = np.asarray(self._counts, dtype=np.int64)
        first = np.cumsum(counts) - counts  # index of each call's first step in the expanded arrays
        back = np.repeat(counts - 1, counts) - (np.arange(int(counts.sum())) - np.repeat(first, counts))
        steps = np.repeat(ends, counts) - back
        step_time = np.repeat(np.asarray(host.step_time, dtype=np.float64), counts)
        monitor = np.repeat(np.asarray(host.monitor, dtype=np.float64) / counts, counts)
        wall = np.repeat(np.asarray(host.wall, dtype=np.float64), counts) - back * step_time
        epochs = np.repeat(np.asarray(host.epochs, dtype=np.int64), counts)
        return steps, epochs, wall, step_time, monitor

    def _reset(self, count: int) -> None:
        self._device_last = count
        self._host_last = self._host.steps[-1]
        self._pending = 0
        self._counts = []
        self._host.clear()

    def _set_layout(self, outputs: Any) -> None:
        """For an attached ring: the columns the wrapped cell's output carries (the StepBuffer rules)."""
        layout = detect_layout(outputs)
        names = {name for _, name in layout}
        self.columns = tuple(name for name in STEP_SCALARS if name in names)
        self._loss_index = next(index for index, name in layout if name == LOSS)

    def _check_loss_shape(self, outputs: Any) -> None:
        loss = outputs if self._loss_index < 0 else outputs[self._loss_index]
        self._checked_shape = True
        shape = tuple(getattr(loss, "shape", ()))
        if shape != ():
            log.warning("msbridge: %s has shape %s, not a scalar; recording its mean", LOSS, shape)


def ring_source(ring_cell: Any, config: Any, first_step: int, per_call: int) -> Tuple["RingReader", int, int]:
    """The callback's step source for a train cell with a device ring: the reader, the callback's own
    interval (1: the ring holds every step, the reader keeps every ``step_interval``-th) and the widest flush
    window the ring allows. Refuses a ring too small for ``flush_steps`` (before any sink opens)."""
    check_ring_size(ring_cell.ring_size, config.flush_steps, per_call, config.buffer_size)
    reader = RingReader(ring_cell, first_step=first_step, interval=config.step_interval, steps_per_call=per_call)
    return reader, 1, ring_cell.ring_size - per_call
