"""The calls a sink host makes: one ``Call`` type, and one table (``CALLS``) of what each call passes, how long it
may take and what it must return.

A ``SinkHost`` (``host.py``) runs calls on its sink's own thread. A call names its ``method``; the table gives the
sink's method it invokes, the call's fields it passes, its time limit (``bound``) and the check of what it returns:
a wrong type is a ``Failure`` as a raise is. What a sink hands back of its own accord (the ``gap`` events of what it
finally lost) is a ``Gaps``; what went wrong with a call is a ``Failure``: two things, two names.

Example:
    >>> call = Call("describe", run=run)
    >>> call.check(call.invoke(sink))      # {"where": ...}; a str instead raises WrongType
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from .base import FINISHED, Event, Held, Record, RunInfo, Sink, WrongType

#: Seconds a quick question may take: ``held``, ``undelivered``, ``observe`` (each answers from memory or a
#: file; past this the sink is taken to be stuck).
QUICK_BOUND = 10.0
#: Seconds ``describe`` may take: training waits for every sink's, in parallel, once at train begin.
DESCRIBE_BOUND = 2.0


@dataclass(frozen=True)
class Failure:
    """A call that raised, returned a wrong type, or overran its bound: ``"open(): TypeError: ..."``.

    Example:
        >>> str(Failure("open", "did not return within 15 s"))
        'open(): did not return within 15 s'
    """

    method: str
    reason: str

    def __str__(self) -> str:
        return f"{self.method}(): {self.reason}"


@dataclass(frozen=True)
class Gaps:
    """The ``gap`` events a sink returned from ``write``/``flush``/``close``: what it finally lost, handed to
    every other sink and kept in the run's outcome."""

    events: Sequence[Event]


def _nothing(method: str, returned: Any) -> None:
    if returned is not None:
        raise WrongType(f"{method}() returned {type(returned).__name__}, not None")


def _gaps(method: str, returned: Any) -> Gaps:
    """``returned`` (None or a list of Events) as ``Gaps``."""
    if returned is None:
        return Gaps(())
    if isinstance(returned, (list, tuple)) and all(isinstance(ev, Event) for ev in returned):
        return Gaps(tuple(returned))
    raise WrongType(f"{method}() returned {type(returned).__name__}, not None or a list of Events")


def _where(method: str, returned: Any) -> Mapping[str, str]:
    if not isinstance(returned, Mapping) or not all(isinstance(v, str) for v in returned.values()):
        raise WrongType(f"{method}() returned {type(returned).__name__}, not a dict of str (\"where\": ...)")
    return dict(returned)


def _held(method: str, returned: Any) -> Held:
    if not isinstance(returned, Held):
        raise WrongType(f"{method}() returned {type(returned).__name__}, not Held")
    return returned


def _text(method: str, returned: Any) -> str:
    if not isinstance(returned, str):
        raise WrongType(f"{method}() returned {type(returned).__name__}, not str")
    return returned


def _series(method: str, returned: Any) -> Mapping[str, Any]:
    if not isinstance(returned, Mapping):
        raise WrongType(f"{method}() returned {type(returned).__name__}, not a dict of series")
    for name, points in returned.items():
        if not isinstance(points, (list, tuple)):
            raise WrongType(f"{method}()[{name!r}] is {type(points).__name__}, not a list of (step, value)")
    return returned


@dataclass(frozen=True)
class Shape:
    """One row of ``CALLS``: the sink's method (``""``: none), the ``Call`` fields it is passed, the seconds it may
    take (None: the sink's ``close_bound``, its ``close_timeout`` + 5 s) and the check of what it returns."""

    target: str
    passes: Tuple[str, ...]
    bound: Optional[float]
    check: Callable[[str, Any], Any]


#: Every call a host makes. ``held`` is asked once per open (the host's ``Handoff`` keeps it); ``write`` is made
#: through the ``Handoff`` (``handoff.py``); ``retire`` ends a host's thread without a call of the sink; ``hurry``
#: is made on a throwaway thread, never waited for (``Dispatcher``).
CALLS: Dict[str, Shape] = {
    "open": Shape("open", ("run",), None, _nothing),
    "describe": Shape("describe", ("run",), DESCRIBE_BOUND, _where),
    "held": Shape("held", (), QUICK_BOUND, _held),
    "write": Shape("write", ("records", "events"), None, _gaps),
    "flush": Shape("flush", (), None, _gaps),
    "close": Shape("close", ("status",), None, _gaps),
    "undelivered": Shape("undelivered", (), QUICK_BOUND, _text),
    "observe": Shape("observe", ("others",), QUICK_BOUND, _nothing),
    "hurry": Shape("hurry", (), None, _nothing),
    "read_back": Shape("read_back", ("run",), None, _series),
    "retire": Shape("", (), None, _nothing),
}


@dataclass
class Call:
    """One call of a sink, run on its host's thread; ``done`` is set once it returned (or failed).

    ``records``/``events`` for ``write`` (``relayed_from``: the sink whose gaps they are, for every other tracker;
    ``refused``: the sink raised ``Behind``, nothing taken), ``run`` for ``open``/``describe``/``read_back``,
    ``status`` for ``close``, ``others`` (each other sink's final ``undelivered``) for an observer's ``observe``.

    Example:
        >>> call = Call("close", status="KILLED")    # made by close(status); bound: the sink's close_bound
        >>> call.check(None), call.shape.passes
        (Gaps(events=()), ('status',))
    """

    method: str
    run: Optional[RunInfo] = None
    records: Sequence[Record] = ()
    events: Sequence[Event] = ()
    status: str = FINISHED
    others: Mapping[str, str] = field(default_factory=dict)
    relayed_from: str = ""
    refused: bool = field(default=False, init=False, compare=False)
    done: threading.Event = field(default_factory=threading.Event, init=False, repr=False, compare=False)
    result: Any = field(default=None, init=False, repr=False, compare=False)
    failure: Optional[Failure] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.shape = CALLS[self.method]

    def bound(self, sink: Sink) -> float:
        """Seconds this call may take."""
        return sink.close_bound if self.shape.bound is None else self.shape.bound

    def invoke(self, sink: Sink) -> Any:
        """Make the call of ``sink``; what it returned, unchecked."""
        if not self.shape.target:
            return None
        return getattr(sink, self.shape.target)(*(getattr(self, name) for name in self.shape.passes))

    def check(self, returned: Any) -> Any:
        """What ``invoke`` returned, checked (``Gaps`` for ``write``/``flush``/``close``); raises ``WrongType``."""
        return self.shape.check(self.method, returned)
