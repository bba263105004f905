"""Hands each batch to the write-ahead log (jsonl) first, then to every tracker: each sink on its own host.

Every sink is run by a ``SinkHost`` (``host.py``): its own thread, its own queue, every call a ``Call``
(``calls.py``) bounded in time. ``submit`` (safe from any thread) queues the batch on jsonl's host, which waits
only while jsonl's queue is full (at most its bound, once: jsonl loses nothing it can help); once jsonl wrote it,
jsonl's host offers it to each tracker's host, which never waits. A slow, stalled or broken tracker delays only
itself. ``open`` is queued too: the training thread never waits for a sink to open.

What a sink returns of its own accord (``Gaps``: the ``gap`` events of what it finally lost) is handed to every
other sink and kept in ``gaps``. What went wrong with a call (``Failure``: a raise, a wrong type, an overrun)
is kept per sink; the run's outcome lists the sink as undelivered, with the replay that fills it.

msbridge's own sinks marked ``in_submit`` (the console's progress line) are called in ``submit`` itself (on the
thread that flushes: the converter thread, or the training thread), through the same typed calls: a progress line
is printed at the flush of the step it reports, never behind a sink. A plug-in's ``in_submit`` is ignored: its sink is hosted like any other.

``close(status)`` drains and closes jsonl, then closes the trackers in parallel, each within its ``close_bound``
from the start of the close (one still closing ``HURRY_AFTER`` s in is told to ``hurry``, on a throwaway thread
nobody waits for), then hands the observers (``Sink.observer``: alerts) each other sink's final ``undelivered``
and closes them.

Example:
    >>> d = Dispatcher([JsonlSink(), MlflowSink()], run_info)
    >>> d.submit(records, events)
    >>> d.close("FINISHED")   # jsonl drained and closed, then each tracker within its bound, then alerts
"""
from __future__ import annotations

import atexit
import logging
import shlex
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from .base import FINISHED, HURRY_AFTER, KILLED, WAL_NAME, Event, Record, RunInfo, Sink
from .calls import DESCRIBE_BOUND, Call, Failure, Gaps
from .host import SinkHost

log = logging.getLogger("msbridge")


class Dispatcher:
    """Runs ``sinks`` on hosts of their own; jsonl first, then the trackers, then the observers.

    Args:
        sinks: the one named jsonl is the write-ahead log.
        run: when given, every sink is opened with it now (queued); else call ``describe`` then ``open``.
        max_batches: jsonl's queue bound; a full one makes ``submit`` wait (at most jsonl's bound, once).
        tracker_batches: each tracker's queue bound; past it the tracker reads the write-ahead log (jsonl) from where
            it stopped, once it keeps up (``SinkHost``).

    Example:
        >>> d = Dispatcher([JsonlSink(), TensorBoardSink()], run)
        >>> d.submit(make_records([1, 2])); d.close("FINISHED"); d.undelivered
        {}
    """

    def __init__(self, sinks: Sequence[Sink], run: Optional[RunInfo] = None, max_batches: int = 64,
                 tracker_batches: int = 256) -> None:
        #: Every ``gap`` event the sinks returned themselves (what they finally lost), in order: the outcome lists them.
        self.gaps: List[Event] = []
        self.run = run
        self.submitted = 0  # records handed to ``submit``
        self._inline_failures: Dict[str, Failure] = {}
        self._late: Dict[str, str] = {}  # sink name -> what it was not seen to finish at close
        self._final: Dict[str, str] = {}  # sink name -> its final ``undelivered()``
        self._lock = threading.RLock()
        self._closed = False
        self._close_done = threading.Event()
        self.inline: List[Sink] = [s for s in sinks if _runs_inline(s)]
        hosted = [s for s in sinks if not _runs_inline(s)]
        wal = next((s for s in hosted if s.name == WAL_NAME), None)
        self._wal = (SinkHost(wal, max_batches, lossless=True, on_gaps=self._relay, after_write=self._written)
                     if wal is not None else None)
        log_path = (lambda: str(getattr(wal, "path", ""))) if wal is not None else None
        self._trackers = [SinkHost(s, tracker_batches, on_gaps=self._relay, wal=log_path) for s in hosted
                          if s is not wal]
        self.sinks: List[Sink] = hosted
        self.wal: Optional[Sink] = wal
        self.close_bound = max([s.close_bound for s in hosted] or [0.0])
        if run is not None:
            self.open(run)

    @property
    def hosts(self) -> List[SinkHost]:
        """Every sink's host: jsonl first."""
        return ([self._wal] if self._wal is not None else []) + self._trackers

    @property
    def said_at_close(self) -> Dict[str, Dict[str, str]]:
        """Each closed tracker's ``describe(run)`` asked again after its close (``SinkHost.said``), where it
        returned in time: what only the closed run knows (MLflow's address of the run, or of its sweep's view)."""
        return {host.sink.name: host.said.result for host in self._trackers
                if host.closed.is_set() and host.said is not None and host.said.done.is_set() and host.said.result}

    def describe(self, run: RunInfo) -> Dict[str, Dict[str, str]]:
        """Each sink's ``describe(run)`` (where it writes), asked in parallel, each on its sink's thread, waited for
        ``DESCRIBE_BOUND`` s in all; one not back by then is a failure, and its sink gets nothing."""
        asked = [(host, host.put(Call("describe", run=run))) for host in self.hosts]
        deadline = time.monotonic() + DESCRIBE_BOUND
        where: Dict[str, Dict[str, str]] = {}
        for sink in self.inline:
            info = self._inline(sink, Call("describe", run=run))
            if info:
                where[sink.name] = info
        for host, call in asked:
            if not call.done.wait(max(0.0, deadline - time.monotonic())):
                host.overran(call, DESCRIBE_BOUND)
            elif call.result:
                where[host.sink.name] = call.result
        return where

    def open(self, run: RunInfo) -> None:
        """Open every sink with ``run``: the inline ones now, the others queued on their hosts (no wait)."""
        self.run = run
        for sink in self.inline:
            self._inline(sink, Call("open", run=run))
        for host in self.hosts:
            host.open(run)
        atexit.register(self._atexit)

    # -- any thread ----------------------------------------------------------------
    def submit(self, records: Sequence[Record], events: Sequence[Event] = ()) -> None:
        """Write the inline sinks (the progress line), then queue the batch on jsonl's host. Returns at once
        unless jsonl's queue is full; safe from any thread."""
        if not records and not events:
            return
        records, events = list(records), list(events)
        with self._lock:
            if self._closed:
                return
            for sink in self.inline:
                self._inline(sink, Call("write", records=records, events=events))
            self.submitted += len(records)
            if self._wal is None or not self._wal.offer(records, events):
                for host in self._trackers:  # no jsonl, or jsonl behind: the trackers still get it
                    host.offer(records, events)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until jsonl and every tracker have written and flushed what was submitted so far."""
        if self._closed:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        for sink in self.inline:
            self._inline(sink, Call("flush"))
        if self._wal is not None and not self._wal.put(Call("flush")).done.wait(_left(deadline)):
            return False
        asked = [host.put(Call("flush")) for host in self._trackers]
        return all(call.done.wait(_left(deadline)) for call in asked)

    def close(self, status: str = FINISHED, timeout: Optional[float] = None) -> None:
        """Drain and close jsonl, then the trackers in parallel, each waited for at most its ``close_bound``
        (``timeout``, when given, caps them all), then the observers. A second close waits for the first."""
        with self._lock:
            first, self._closed = not self._closed, True
            if first:
                for sink in self.inline:
                    self._inline(sink, Call("close", status=status))
                atexit.unregister(self._atexit)
        if not first:
            self._close_done.wait(self.close_bound if timeout is None else timeout)
            return
        try:
            self._close_all(status, timeout)
        finally:
            self._close_done.set()

    @property
    def failures(self) -> Dict[str, str]:
        """Each sink whose call failed (raised, wrong type, overran): its first failure, "open(): TypeError: ..."."""
        out = {name: str(failure) for name, failure in self._inline_failures.items()}
        out.update({h.sink.name: str(h.failures[0]) for h in self.hosts if h.failures})
        return out

    @property
    def unopened(self) -> List[str]:
        """The sinks whose ``open`` did not return (raised, overran, or is still running)."""
        names = [h.sink.name for h in self.hosts if not h.opened]
        return names + [name for name, failure in self._inline_failures.items() if failure.method == "open"]

    @property
    def undelivered(self) -> Dict[str, str]:
        """Each sink that may lack records, from final facts only: its failed calls, what it missed (queue full
        or a failed call), what it gave up delivering (its final ``undelivered()``), a close not seen to finish."""
        out = {name: f"1 failed call(s): {failure}" for name, failure in self._inline_failures.items()}
        for host in self.hosts:
            name = host.sink.name
            failed = f"{len(host.failures)} failed call(s): {host.failures[0]}" if host.failures else ""
            parts = [p for p in (failed, host.missed, self._final.get(name, ""), self._late.get(name)) if p]
            if parts:
                out[name] = "; ".join(parts)
        return out

    # -- the closing thread --------------------------------------------------------
    def _close_all(self, status: str, timeout: Optional[float]) -> None:
        start = time.monotonic()
        cap = self.close_bound if timeout is None else timeout
        if self._wal is not None:
            final = self._wal.close(status)
            if not self._wal.closed.wait(max(0.0, start + min(cap, self._wal.sink.close_bound) - time.monotonic())):
                self._say_late(self._wal, round(time.monotonic() - start))
            self._final[WAL_NAME] = final.result or ""
        trackers = [h for h in self._trackers if not h.sink.observer]
        self._close_each(trackers, status, start, timeout)
        observers = [h for h in self._trackers if h.sink.observer]
        if observers:
            watching = {host.sink.name for host in observers}
            facts = {name: what for name, what in self.undelivered.items() if name not in watching}
            for host in observers:
                host.put(Call("observe", others=facts))
            self._close_each(observers, status, time.monotonic(), timeout)

    def _close_each(self, hosts: Sequence[SinkHost], status: str, start: float, timeout: Optional[float]) -> None:
        """Close ``hosts`` in parallel, each waited for its bound from ``start``; a late one is listed."""
        def bound(host: SinkHost) -> float:
            return host.sink.close_bound if timeout is None else min(timeout, host.sink.close_bound)

        closing = [(host, host.close(status)) for host in hosts]
        hurry_at = time.monotonic() + HURRY_AFTER
        for host, _ in closing:
            if not host.closed.wait(max(0.0, min(hurry_at, start + bound(host)) - time.monotonic())):
                _hurry(host.sink)
        for host, final in closing:
            if not host.closed.wait(max(0.0, start + bound(host) - time.monotonic())):
                self._say_late(host, bound(host))
            self._final[host.sink.name] = final.result or ""

    def _say_late(self, host: SinkHost, waited: float) -> None:
        behind = self.submitted - host.done_records
        what = (f"its close had not finished after {waited:g} s (its close bound; {host.running_for() or 'idle'}):"
                f" it had taken {host.done_records} of the {self.submitted} records (up to step {host.done_step}), "
                f"{behind} behind, and what it stored is not confirmed")
        self._late[host.sink.name] = what
        log.warning("msbridge: sink %r: %s; fill it: msbridge replay %s --to %s", host.sink.name, what,
                    shlex.quote(self.run.run_dir if self.run else "RUN_DIR"), host.sink.name)

    def _atexit(self) -> None:
        # Backstop for a process that exits without train_end: keep what we have.
        self.close(KILLED, timeout=30.0)

    # -- the sinks' threads ----------------------------------------------------------
    def _written(self, call: Call) -> None:
        """jsonl's thread, once jsonl wrote a batch: offer it to every tracker but the one whose gaps it holds (never
        waits)."""
        for host in self._trackers:
            if host.sink.name != call.relayed_from:
                host.offer(call.records, call.events)

    def _relay(self, sink: Sink, gaps: Gaps) -> None:
        """A sink's own ``gap`` events: into ``gaps``, then jsonl, which hands them to every other tracker once they
        are in the log (a tracker reading the log never passes them); straight to the trackers after jsonl's close."""
        with self._lock:
            self.gaps.extend(gaps.events)
        if self._wal is not None and sink is not self._wal.sink and self._wal.offer([], gaps.events, sink.name):
            return
        for host in self._trackers:
            if host.sink is not sink:
                host.offer([], gaps.events)

    def _inline(self, sink: Sink, call: Call) -> Any:
        """``call`` on the thread that flushes (an ``in_submit`` sink); a failure is kept, never raised."""
        if sink.name in self._inline_failures:
            return None
        try:
            return call.check(call.invoke(sink))
        except Exception as exc:
            self._inline_failures[sink.name] = Failure(call.method, f"{type(exc).__name__}: {exc}")
            log.error("msbridge: sink %r failed in %s", sink.name, self._inline_failures[sink.name])
            return None


def _runs_inline(sink: Sink) -> bool:
    """``in_submit`` is honoured for msbridge's own sinks only (the console): a plug-in's is ignored."""
    return bool(sink.in_submit) and type(sink).__module__.split(".")[0] == "msbridge"


def _hurry(sink: Sink) -> None:
    """``hurry()`` on a throwaway daemon thread of its own (it interrupts the sink's close, on the sink's thread),
    never waited for: one that blocks holds only that thread. A raise or a wrong type is logged."""
    def run() -> None:
        call = Call("hurry")
        try:
            call.check(call.invoke(sink))
        except Exception as exc:
            log.warning("msbridge: sink %r: hurry() failed: %s: %s", sink.name, type(exc).__name__, exc)

    threading.Thread(target=run, name=f"msbridge-{sink.name}-hurry", daemon=True).start()


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds until ``deadline`` (None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
