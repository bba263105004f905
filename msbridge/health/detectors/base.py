"""The health-check protocol: what a detector declares, what it sees each step, what it reports.

A detector is one class, registered with ``@register_detector("name")``: it declares its ``options`` (each an
``Option``, the type sinks declare theirs with: type, default, one-line doc,
allowed range or choices) and its ``default_action`` per profile, and has one
method, ``observe(view)``, called once per recorded step, in step order, with
that step's ``StepView``. It keeps its own state across flush windows and
returns a ``Finding`` on the *first* step of an episode (a run of anomalous
steps), else None. The runner builds it as ``cls(warmup_steps=..., **options)``
from the validated ``health`` section.

Example:
    >>> @register_detector("lr_zero")
    ... class LrZero(Detector):
    ...     options = {"limit": Option(float, 0.0, "lr at or below this is zero", low=0)}
    ...     default_action = {"debug": DUMP, "production": LOG}
    ...     def __init__(self, warmup_steps: int = 0, limit: float = 0.0) -> None:
    ...         super().__init__(warmup_steps)
    ...         self.limit = limit
    ...     def observe(self, view: StepView) -> Optional[Finding]:
    ...         lr = view.values.get("train/lr")
    ...         if view.step > self.warmup_steps and lr is not None and lr <= self.limit:
    ...             return Finding(self.name, view.step, detail={"lr": lr})
    ...         return None
"""
from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections import deque
from typing import Any, Callable, ClassVar, Deque, Dict, List, Mapping, Optional, Type, TypeVar

from ...names import GRAD_NORM, LOSS
from ...options import Option
from ...plugins import claim

#: Finding kinds; also the kinds of the events they become.
ANOMALY, RECOVERY = "anomaly", "recovery"

LOG, DUMP, SKIP, STOP, CHECKPOINT_AND_STOP = "log", "dump", "skip", "stop", "checkpoint_and_stop"
ACTIONS = (LOG, DUMP, SKIP, STOP, CHECKPOINT_AND_STOP)
#: Actions that end training at the firing step; configuring one makes health check every step.
STOP_ACTIONS = (STOP, CHECKPOINT_AND_STOP)
PROFILES = ("debug", "production")

#: A detector that compares against a baseline is armed once it holds this many values.
MIN_BASELINE = 10


@dataclass(frozen=True)
class Finding:
    """What a detector saw at ``step``: ``kind`` is ``anomaly`` or ``recovery``.

    Example:
        >>> Finding("nonfinite", 3700, detail={"nonfinite": ["train/loss"]})
        Finding(check='nonfinite', step=3700, kind='anomaly', detail={'nonfinite': ['train/loss']})
    """

    check: str
    step: int
    kind: str = ANOMALY
    detail: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepView:
    """One recorded step's values, as host floats (None: not recorded).

    ``overflow``: the cell flagged the step as overflowed; ``loss_scale`` is None
    unless the cell is loss-scaled. ``values`` holds every metric of the step's
    record (``train/lr``, ``perf/samples_per_s`` ...).

    Example:
        >>> view = StepView(3700, loss=float("nan"), grad_norm=1.2, step_time_s=0.01)
        >>> view.nonfinite
        ['train/loss']
    """

    step: int
    loss: Optional[float] = None
    grad_norm: Optional[float] = None
    loss_scale: Optional[float] = None
    overflow: bool = False
    samples_per_s: Optional[float] = None
    step_time_s: float = 0.0
    values: Mapping[str, float] = field(default_factory=dict)

    @property
    def scaled_overflow(self) -> bool:
        """An overflow step of a loss-scaled cell: the loss scaler's business (it skips it, lowers the scale)."""
        return self.overflow and self.loss_scale is not None

    @property
    def nonfinite(self) -> List[str]:
        """The non-finite ones of loss and grad norm; an inf grad norm on a scaled overflow step is not one."""
        bad = [] if self.loss is None or math.isfinite(self.loss) else [LOSS]
        if self.grad_norm is not None and not math.isfinite(self.grad_norm) and not self.scaled_overflow:
            bad.append(GRAD_NORM)
        return bad


class Detector(ABC):
    """The base of every check; see the module docstring for the protocol.

    Class attributes:
        name: the check's key under ``health:`` and in every finding (set by ``register_detector``).
        options: option name -> ``Option`` (``check`` and ``action`` are added for every check).
        default_action: profile -> action when the config names none.
        in_graph_skip: a train cell built to skip non-finite updates
            (``TrainStep(skip_nonfinite=True)``) has already dropped the update of every
            step this check fires on: ``skip`` is a valid action and the live weights are healthy.
        early_stop: a stop on this check is an early stop (the run closes FINISHED, not FAILED).
        on_eval: it observes each evaluation (a view of the ``eval/*`` values recorded at the training step the
            evaluation ran, ``values`` only) instead of each training step.
        opt_in: off unless ``health.<name>`` turns it on.

    Example:
        >>> detector = DETECTORS["plateau"](warmup_steps=100, patience=50)  # msbridge.health.detectors
        >>> detector.observe(StepView(101, loss=2.3)) is None
        True
    """

    name: ClassVar[str]
    options: ClassVar[Mapping[str, Option]] = {}
    default_action: ClassVar[Mapping[str, str]]
    in_graph_skip: ClassVar[bool] = False
    early_stop: ClassVar[bool] = False
    on_eval: ClassVar[bool] = False
    opt_in: ClassVar[bool] = False

    def __init__(self, warmup_steps: int = 0) -> None:
        self.warmup_steps = warmup_steps

    @abstractmethod
    def observe(self, view: StepView) -> Optional[Finding]:
        """The finding that starts at ``view.step``, or None."""


#: check name -> detector class, in the order they look at a step: the checks a train cell can already act on
#: inside the graph (``in_graph_skip``: ``nonfinite``) first, then by name. ``register_detector`` fills it.
DETECTORS: Dict[str, Type[Detector]] = {}
D = TypeVar("D", bound=Type[Detector])


def register_detector(name: str) -> Callable[[D], D]:
    """Class decorator: the check ``name`` (its key under ``health:``) is this class (see the example above)."""
    return lambda cls: _registered(name, cls)


def _registered(name: str, cls: D) -> D:
    """``cls`` as the check ``name``, in ``DETECTORS`` in look order."""
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        raise TypeError(f"register_detector({name!r}): {cls!r} is not a Detector subclass")
    claim(DETECTORS, "health check", name, cls)  # another class of that name: PluginError naming both packages
    cls.name = name
    reorder()
    return cls


def reorder() -> None:
    """``DETECTORS`` in look order: the in-graph checks first, then by name."""
    ordered = sorted(DETECTORS.items(), key=lambda item: (not item[1].in_graph_skip, item[0]))
    DETECTORS.clear()
    DETECTORS.update(ordered)


def finite(value: Optional[float]) -> bool:
    """``value`` is a number and not NaN/inf."""
    return value is not None and math.isfinite(value)


class RollingMedian:
    """The last ``size`` values, kept in order of arrival and sorted: the median is read, not sorted, at every
    step (the flush checks every step on the training thread).

    Example:
        >>> recent = RollingMedian(3)
        >>> for v in (5.0, 1.0, 3.0, 9.0): recent.append(v)
        >>> recent.median(), list(recent.arrived)
        (3.0, [1.0, 3.0, 9.0])
    """

    def __init__(self, size: int) -> None:
        self.arrived: Deque[float] = deque(maxlen=size)
        self.ordered: List[float] = []

    def __len__(self) -> int:
        return len(self.arrived)

    def append(self, value: float) -> None:
        if len(self.arrived) == self.arrived.maxlen:
            del self.ordered[bisect.bisect_left(self.ordered, self.arrived[0])]
        self.arrived.append(value)
        bisect.insort(self.ordered, value)

    def clear(self) -> None:
        self.arrived.clear()
        self.ordered.clear()

    def median(self) -> float:
        n, ordered = len(self.ordered), self.ordered
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
