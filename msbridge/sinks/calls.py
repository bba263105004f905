"""The calls a sink host makes, one dataclass each, and the checks of what each call returns.

A ``SinkHost`` (``host.py``) runs these on its sink's own thread. Each call names its ``method`` (for messages),
its time limit (``bound``) and what it must return (``check``): a wrong type is a ``Failure`` as a raise is.
What a sink hands back of its own accord (the ``gap`` events of what it finally lost) is a ``Gaps``; what went
wrong with a call is a ``Failure``: two things, two names.

Example:
    >>> call = Describe(run)
    >>> call.check(call.invoke(sink))      # {"where": ...}; a str instead raises WrongType
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence

from .base import Event, Held, Record, RunInfo, Sink, WrongType

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


def _gaps(method: str, returned: Any) -> Gaps:
    """``returned`` (None or a list of Events) as ``Gaps``; anything else is ``WrongType``."""
    if returned is None:
        return Gaps(())
    if isinstance(returned, (list, tuple)) and all(isinstance(ev, Event) for ev in returned):
        return Gaps(tuple(returned))
    raise WrongType(f"{method}() returned {type(returned).__name__}, not None or a list of Events")


@dataclass
class Call:
    """One call of a sink, run on its host's thread. ``done`` is set once it returned (or failed)."""

    done: threading.Event = field(default_factory=threading.Event, init=False, repr=False, compare=False)
    result: Any = field(default=None, init=False, repr=False, compare=False)
    failure: Optional[Failure] = field(default=None, init=False, repr=False, compare=False)
    method = "call"

    def bound(self, sink: Sink) -> float:
        """Seconds this call may take: the sink's ``close_bound`` (its ``close_timeout`` + 5 s)."""
        return sink.close_bound

    def invoke(self, sink: Sink) -> Any:
        raise NotImplementedError

    def check(self, returned: Any) -> Any:
        """What ``invoke`` returned, checked; raises ``WrongType``. By default it must be None."""
        if returned is not None:
            raise WrongType(f"{self.method}() returned {type(returned).__name__}, not None")
        return None


@dataclass
class Open(Call):
    run: Optional[RunInfo] = None
    method = "open"

    def invoke(self, sink: Sink) -> Any:
        return sink.open(self.run)


@dataclass
class Describe(Call):
    run: Optional[RunInfo] = None
    method = "describe"

    def bound(self, sink: Sink) -> float:
        return DESCRIBE_BOUND

    def invoke(self, sink: Sink) -> Any:
        return sink.describe(self.run)

    def check(self, returned: Any) -> Mapping[str, str]:
        if not isinstance(returned, Mapping) or not all(isinstance(v, str) for v in returned.values()):
            raise WrongType(f"describe() returned {type(returned).__name__}, not a dict of str (\"where\": ...)")
        return dict(returned)


@dataclass
class AskHeld(Call):
    """``held()``, asked once after ``open``; ``write`` then skips what it holds."""

    method = "held"

    def bound(self, sink: Sink) -> float:
        return QUICK_BOUND

    def invoke(self, sink: Sink) -> Any:
        return sink.holding()

    def check(self, returned: Any) -> Held:
        if not isinstance(returned, Held):
            raise WrongType(f"held() returned {type(returned).__name__}, not Held")
        return returned


@dataclass
class Write(Call):
    records: Sequence[Record] = ()
    events: Sequence[Event] = ()
    relayed: bool = False  # another sink's gaps, handed to the trackers already
    refused: bool = field(default=False, init=False, compare=False)  # the sink raised ``Behind``: not taken
    method = "write"

    def invoke(self, sink: Sink) -> Any:
        return sink.write(self.records, self.events)

    def check(self, returned: Any) -> Gaps:
        return _gaps(self.method, returned)


@dataclass
class Flush(Call):
    method = "flush"

    def invoke(self, sink: Sink) -> Any:
        return sink.flush()

    def check(self, returned: Any) -> Gaps:
        return _gaps(self.method, returned)


@dataclass
class Close(Call):
    status: str = "FINISHED"
    method = "close"

    def invoke(self, sink: Sink) -> Any:
        return sink.close(self.status)

    def check(self, returned: Any) -> Gaps:
        return _gaps(self.method, returned)


@dataclass
class Undelivered(Call):
    method = "undelivered"

    def bound(self, sink: Sink) -> float:
        return QUICK_BOUND

    def invoke(self, sink: Sink) -> Any:
        return sink.undelivered()

    def check(self, returned: Any) -> str:
        if not isinstance(returned, str):
            raise WrongType(f"undelivered() returned {type(returned).__name__}, not str")
        return returned


@dataclass
class Observe(Call):
    """An observer's (``Sink.observer``) final facts: each other sink's final ``undelivered``, after every
    one of them closed or hit its bound."""

    undelivered: Mapping[str, str] = field(default_factory=dict)
    method = "observe"

    def bound(self, sink: Sink) -> float:
        return QUICK_BOUND

    def invoke(self, sink: Sink) -> Any:
        return sink.observe(dict(self.undelivered))


@dataclass
class Hurry(Call):
    """``hurry()``: made on a throwaway thread beside the sink's own close, never waited for (``Dispatcher``)."""

    method = "hurry"

    def invoke(self, sink: Sink) -> Any:
        return sink.hurry()


@dataclass
class ReadBack(Call):
    run: Optional[RunInfo] = None
    method = "read_back"

    def invoke(self, sink: Sink) -> Any:
        return sink.read_back(self.run)

    def check(self, returned: Any) -> Mapping[str, List[Any]]:
        if not isinstance(returned, Mapping):
            raise WrongType(f"read_back() returned {type(returned).__name__}, not a dict of series")
        for name, points in returned.items():
            if not isinstance(points, (list, tuple)):
                raise WrongType(f"read_back()[{name!r}] is {type(points).__name__}, not a list of (step, value)")
        return returned
