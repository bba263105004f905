"""``Window``: the steps between two flushes as host arrays, what capture hands to metrics and health;
``StepSource``: what collects the steps between flushes and drains them into a ``Window``.

Example:
    >>> window = Window(steps=np.arange(3), epochs=np.zeros(3), wall_time=np.zeros(3),
    ...                 step_time_s=np.full(3, 0.01), monitor_s=np.zeros(3), scalars={"train/loss": np.ones(3)})
    >>> len(window)
    3
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

import numpy as np


@dataclass
class Window:
    """The steps between two flushes, as host arrays of equal length.

    ``scalars`` maps a name from ``STEP_SCALARS`` to one float per step;
    ``step_time_s`` is the host-measured wall time of each step and
    ``monitor_s`` the monitor's own host time in that step. ``at_flush`` holds
    state read once at the flush (a live Parameter, such as the loss scale
    mindformers' train cells return): it is recorded on the window's last step.

    ``param_grad_norms`` (steps x parameters, ``param_names`` order) is what a
    ring with per-parameter columns held; ``series`` are further per-step
    series recorded under their own names (the selected ``grad_norm/<param>``);
    ``timed`` are samples taken at wall-clock times (the NPU sampler), each
    recorded on the last step that ended at or before it. ``histograms`` are the weight (and
    gradient) histograms taken at the flush (plain dicts), handed to the sinks as ``histogram`` events.

    ``absent`` marks, per name, the steps that did not give that value (``msbridge.track`` steps that leave a
    name out): a marked step's array slot is a filler, never recorded. A NaN that is not marked was given as NaN.
    """

    steps: np.ndarray
    epochs: np.ndarray
    wall_time: np.ndarray
    step_time_s: np.ndarray
    monitor_s: np.ndarray
    scalars: Dict[str, np.ndarray] = field(default_factory=dict)
    global_scalars: Dict[str, np.ndarray] = field(default_factory=dict)
    at_flush: Dict[str, float] = field(default_factory=dict)
    param_grad_norms: Optional[np.ndarray] = None
    param_names: Tuple[str, ...] = ()
    series: Dict[str, np.ndarray] = field(default_factory=dict)
    timed: List[Tuple[float, Dict[str, float]]] = field(default_factory=list)
    histograms: List[Dict[str, Any]] = field(default_factory=list)
    absent: Dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.steps)

    @classmethod
    def at_step(cls, step: int) -> "Window":
        """An empty one-step window at ``step``: what is read at a flush on the training thread gathers in it while
        the steps are drained on another thread, and ``absorb`` adds it to their window there."""
        one = np.zeros(1)
        return cls(np.array([step]), one, one, one, one)

    def absorb(self, read: "Window") -> None:
        """Add what ``read`` (``at_step``) gathered at the flush: its series, timed samples, histograms and values.

        Example:
            >>> w, read = Window.at_step(5), Window.at_step(5)
            >>> read.at_flush["memory/used_gb"] = 1.5; w.absorb(read); w.at_flush
            {'memory/used_gb': 1.5}
        """
        self.series.update(read.series)
        self.timed.extend(read.timed)
        self.histograms.extend(read.histograms)
        self.at_flush.update(read.at_flush)

    def given(self, name: str) -> Optional[List[Optional[float]]]:
        """The scalar ``name`` step by step, None at a step that did not give it; None when the window has none.

        Example:
            >>> w = Window(np.arange(2), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2),
            ...            scalars={"train/loss": np.array([2.0, 0.0])}, absent={"train/loss": np.array([False, True])})
            >>> w.given("train/loss")
            [2.0, None]
        """
        column = self.scalars.get(name)
        if column is None:
            return None
        values = column.tolist()
        mask = self.absent.get(name)
        return values if mask is None else [None if gone else v for v, gone in zip(values, mask.tolist())]


#: Maps a window's steps to their learning rates (None: not known).
LrAt = Callable[[np.ndarray], Optional[np.ndarray]]


class StepSource(Protocol):
    """What the callback collects steps into: ``StepBuffer`` (the step's output tensors) and ``RingReader``
    (the device ring). ``append`` is O(1) host work per step; ``drain`` is the flush's one device->host copy.

    Example:
        >>> source: StepSource = StepBuffer()
        >>> source.append(1, 1, outputs, 0.01, 0.0); len(source), source.drain(None).steps
        (1, array([1]))
    """

    def __len__(self) -> int:
        """Steps collected since the last drain."""

    def append(self, step: int, epoch: int, outputs: Any, step_time_s: float, monitor_s: float,
               wall: Optional[float] = None) -> None:
        """Keep one step: its outputs (never converted to floats here), host timings and its end's wall-clock time
        (``wall``, default now)."""

    def drain(self, lr_at: Optional[LrAt] = None) -> Optional[Window]:
        """Everything since the last drain as a ``Window`` (None when empty)."""
