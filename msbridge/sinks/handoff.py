"""The hand-off of each batch to one sink: what of it the sink is handed, and what it was handed so far.

A sink's host (``SinkHost``) makes every call of the sink through its ``Handoff``: ``open`` gets the run with the
sink's own ``Progress`` in it (``run.progress``); ``held()``'s answer, asked once after ``open``, is kept; a batch
is handed to the sink's ``write`` without the steps up to ``held().last_step``, the steps handed already (never a
metric twice at a step: a second record of the last step, an evaluation's, is handed on when it names other
metrics, ``names.restated`` aside) and the held events; a tracker with ``every_n_steps: N`` only the steps
divisible by N and every record that holds a metric the record before it lacked (an evaluation, a per-window
metric), the steps between counted as handed. A sink that raises ``Behind`` took nothing: what was
handed is as before, and its host hands the batch again from the log later. A sink with ``skips_held = False``
(the console's progress line) is handed every record and event.

Example:
    >>> from msbridge.sinks.base import Record, RunInfo
    >>> class Printed(Sink):
    ...     def write(self, records, events):
    ...         print([r.step for r in records])
    >>> handoff = Handoff(Printed())
    >>> run = RunInfo("id", "r", "exp", rank=0, world_size=1, is_global=True, run_dir="r", resumed_from_step=4)
    >>> handoff.invoke(Call("open", run=run)); handoff.invoke(Call("held"))
    Held(last_step=4, events=frozenset())
    >>> handoff.invoke(Call("write", records=[Record(step, 0, 0.0, {"loss": 1.0}) for step in (3, 4, 5)]))
    [5]
    >>> handoff.progress.last_step
    5
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import AbstractSet, Any, FrozenSet, List, Optional, Sequence, Tuple

from ..names import restated
from .base import Behind, Event, GapEvents, Held, Progress, Record, RunInfo, Sink
from .calls import Call


class Handoff:
    """Every call of ``sink``, its batches filtered (see the module docstring); ``progress`` is what was handed.

    Example:
        >>> Handoff(Sink()).progress.last_step
        0
    """

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.held = Held()
        self.progress = Progress()
        self._after = 0  # the highest step handed to ``write``
        self._names: AbstractSet[str] = set()  # the metrics handed at that step
        self._times = (0.0, 0.0)  # the start and the latest time handed
        self.every = int(getattr(sink, "settings", {}).get("every_n_steps", 1))
        self._steps = _Steps()  # the metrics of the steps read, for ``every_n_steps``

    def invoke(self, call: Call) -> Any:
        """Make ``call`` of the sink, as ``Call.invoke`` does; ``open``, ``held`` and ``write`` as above."""
        if call.method == "write":
            return self.write(call.records, call.events)
        if call.method == "open":
            call.run = self.open(call.run)
        returned = call.invoke(self.sink)
        if call.method == "held":
            self.held = call.check(returned)
            self._show()
        return returned

    def open(self, run: RunInfo) -> RunInfo:
        """Start over for ``run`` (a sink opened again is handed anew); the run to open the sink with."""
        self.held, self._after, self._names, self._steps = Held(), 0, set(), _Steps()
        self._times = (run.start_time, run.start_time)
        self.progress = Progress(0, *self._times)
        return replace(run, progress=self.progress)

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> GapEvents:
        """Hand the sink's ``write`` what of the batch it lacks; returns what it returns (``Behind``: undone)."""
        before = (self._after, set(self._names), self._times, replace(self._steps))
        fresh = self._fresh(records) if self.sink.skips_held else list(records)
        self._times = _span(records, events, *self._times)
        self._show()
        if self.sink.skips_held and self.held.events:
            events = [ev for ev in events if (ev.kind, ev.step) not in self.held.events]
        try:
            return self.sink.write(fresh, events)
        except Behind:
            self._after, self._names, self._times, self._steps = before  # not taken: handed again from the log
            self._show()
            raise

    def _fresh(self, records: Sequence[Record]) -> List[Record]:
        """The records of steps after the last one handed or held, and of the last step handed with metrics it
        was not handed at that step (``names.restated`` ones aside)."""
        fresh = []
        held = self.held.last_step
        for rec in records:
            due = self.every == 1 or self._due(rec)
            if rec.step > self._after and rec.step > held:
                self._after, self._names = rec.step, rec.values.keys()  # a set only if the step comes again
            elif rec.step == self._after >= held and not {
                    n for n in self._names & rec.values.keys() if not restated(n)}:
                self._names = set(self._names) | rec.values.keys()
            else:
                continue
            if due:
                fresh.append(rec)
        return fresh

    def _due(self, rec: Record) -> bool:
        """``rec`` is to be handed under ``every_n_steps`` (over 1): its step is divisible by it, or it holds a
        metric the step before it lacked."""
        steps = self._steps
        if rec.step != steps.step:
            steps.step, steps.before, steps.names = rec.step, steps.names, frozenset(rec.values)
        else:  # a new set: a snapshot taken before keeps its own
            steps.names = steps.names.union(rec.values)
        return rec.step % self.every == 0 or steps.before is None or not rec.values.keys() <= steps.before

    def _show(self) -> None:
        """``progress`` as handed now."""
        self.progress.set(max(self._after, self.held.last_step), *self._times)


@dataclass
class _Steps:
    """The last step read (``step``), the metrics its records hold (``names``) and the ones of the step before it
    (``before``; None before the first step)."""

    step: int = -1
    names: Optional[FrozenSet[str]] = None
    before: Optional[FrozenSet[str]] = None


def _span(records: Sequence[Record], events: Sequence[Event], start: float, end: float) -> Tuple[float, float]:
    """``(start, end)`` moved by the times of a batch: the start is the first time known, the end the latest."""
    times = [r.time for r in records if r.time > 0]
    times += [e.time for e in events if e.time > 0]
    if not times:
        return start, end
    return start or min(times), max(end, max(times))
