"""Hands each batch to the write-ahead log (jsonl) first, then to every tracker on a thread of its own.

``submit`` (safe from any thread) puts a batch on one bounded queue. The dispatcher thread
``msbridge-dispatch`` takes it, writes and fsyncs it to jsonl, then offers it to each tracker's
``TrackerWorker`` (``worker.py``): its own thread and its own bounded queue. A slow, stalled or
starved tracker delays only itself; one whose queue is full is handed nothing more and counts
what it missed, and the run's outcome names it with the replay that fills it. Threads sleep on
their queues while idle (no polling).

Every call is in its own try/except: a sink that raises is logged once with its name, counted,
and the others carry on. The events a sink's ``write``/``flush``/``close`` return (a ``gap`` in the
jsonl log: what it finally lost) are handed to every other sink, and kept in ``raised``.

A sink marked ``on_training_thread`` (the console's progress line) is written in ``submit``
itself: a progress line is printed at the flush of the step it reports, never behind a sink.

``close(status)`` drains jsonl first, then closes the trackers in parallel, waiting for each at
most its ``close_bound`` (its ``close_timeout`` plus ``CLOSE_GRACE``) from the start of the close;
one still closing ``HURRY_AFTER`` seconds in is told to ``hurry`` (training has ended: a client kept at a low
priority may take the CPU now), and one still closing at its bound is listed in ``undelivered`` with what it
was not seen to finish.

Example:
    >>> d = Dispatcher([JsonlSink(), MlflowSink()], run_info)
    >>> d.submit(records, events)
    >>> d.close("FINISHED")   # jsonl drained and closed, then each tracker within its bound
"""
from __future__ import annotations

import atexit
import logging
import queue
import shlex
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .base import FINISHED, HURRY_AFTER, KILLED, WAL_NAME, Event, Record, RunInfo, Sink
from .worker import TrackerWorker

log = logging.getLogger("msbridge")

_STOP = object()


class Dispatcher:
    """Opens ``sinks``, writes jsonl on its own thread and each other sink on a ``TrackerWorker``.

    Args:
        sinks: opened here, in order; the one named jsonl is the write-ahead log.
        run: what every sink is opened with.
        max_batches: the jsonl queue's bound; a full one makes ``submit`` wait (jsonl loses nothing).
        tracker_batches: each tracker's queue bound; past it the tracker misses the rest of the run.

    ``sinks`` holds the sinks that opened (jsonl and the trackers), ``inline`` the ``on_training_thread`` ones.

    Example:
        >>> d = Dispatcher([JsonlSink(), TensorBoardSink()], run)
        >>> d.submit(make_records([1, 2])); d.close("FINISHED"); d.undelivered
        {}
    """

    def __init__(self, sinks: Sequence[Sink], run: RunInfo, max_batches: int = 64,
                 tracker_batches: int = 256) -> None:
        self.errors: Dict[str, int] = {}
        self.failures: Dict[str, str] = {}  # sink name -> its first failure, "open(): TypeError: ..."
        #: Every event the sinks raised themselves (a ``gap``), in order: the run's outcome lists them.
        self.raised: List[Event] = []
        self.run = run
        self.submitted = 0  # records handed to ``submit``
        self.wal_written = 0  # records jsonl's write took without raising
        self._late: Dict[str, str] = {}  # sink name -> what it was not seen to finish at close
        self._queue: "queue.Queue[object]" = queue.Queue(maxsize=max_batches)
        self._lock = threading.RLock()  # submit and close from any thread; errors and raised from every thread
        self._closed = False
        self._close_done = threading.Event()
        self._warned_full = False
        opened = [sink for sink in sinks if self._call(sink, "open", run)[0]]
        self.sinks: List[Sink] = [sink for sink in opened if not sink.on_training_thread]
        self.inline: List[Sink] = [sink for sink in opened if sink.on_training_thread]
        self.wal: Optional[Sink] = next((s for s in self.sinks if s.name == WAL_NAME), None)
        self.workers: List[TrackerWorker] = [TrackerWorker(s, self._run, tracker_batches)
                                             for s in self.sinks if s is not self.wal]
        self.close_bound = max([s.close_bound for s in self.sinks] or [0.0])
        self._thread = threading.Thread(target=self._loop, name="msbridge-dispatch", daemon=True)
        self._thread.start()
        atexit.register(self._atexit)

    # -- any thread ----------------------------------------------------------------
    def submit(self, records: Sequence[Record], events: Sequence[Event] = ()) -> None:
        """Write the inline sinks (the progress line), then queue the batch for jsonl and the trackers.
        Returns at once unless jsonl's queue is full; safe to call from any thread."""
        if not records and not events:
            return
        item = ("write", list(records), list(events))
        with self._lock:
            if self._closed:
                return
            for sink in self.inline:
                self._call(sink, "write", item[1], item[2])
            self.submitted += len(item[1])
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                if not self._warned_full:
                    self._warned_full = True
                    log.warning("msbridge: jsonl queue full (%d batches); training waits for the write-ahead log",
                                self._queue.maxsize)
                self._queue.put(item)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until jsonl and every tracker have written and flushed what was submitted so far."""
        if self._closed:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        for sink in self.inline:
            self._call(sink, "flush")
        done = threading.Event()
        self._queue.put(("flush", done))
        if not done.wait(_left(deadline)):
            return False
        return all(event.wait(_left(deadline)) for event in [w.request_flush() for w in self.workers])

    def close(self, status: str = FINISHED, timeout: Optional[float] = None) -> None:
        """Drain and close jsonl, then close the trackers in parallel, each waited for at most its
        ``close_bound`` (``timeout``, when given, caps them all). A second close waits for the first."""
        with self._lock:
            first, self._closed = not self._closed, True
            if first:
                for sink in self.inline:
                    self._call(sink, "close", status)
                self._queue.put(("close", status))
                self._queue.put(_STOP)
                atexit.unregister(self._atexit)
        if not first:
            if threading.current_thread() is not self._thread:
                self._close_done.wait(self.close_bound if timeout is None else timeout)
            return
        try:
            self._close_all(status, timeout)
        finally:
            self._close_done.set()

    @property
    def undelivered(self) -> Dict[str, str]:
        """Each sink that may lack records: its failed calls, what it missed (its queue was full), what it
        gave up delivering (its ``undelivered()``), and a close not seen to finish within its bound."""
        out = {name: f"{count} failed call(s)" for name, count in self.errors.items()}
        missed = {w.sink.name: w.missed for w in self.workers}
        for sink in (*self.sinks, *self.inline):
            parts = (out.get(sink.name), missed.get(sink.name), _gave_up(sink), self._late.get(sink.name))
            if any(parts[1:]):
                out[sink.name] = "; ".join(part for part in parts if part)
        return out

    def _close_all(self, status: str, timeout: Optional[float]) -> None:
        start = time.monotonic()

        def bound(sink: Sink) -> float:
            return sink.close_bound if timeout is None else min(timeout, sink.close_bound)

        self._thread.join(max(0.0, start + (self.close_bound if timeout is None else timeout) - time.monotonic()))
        if self._thread.is_alive():
            self._late[WAL_NAME] = (f"its close had not finished after {time.monotonic() - start:.0f} s: it had "
                                    f"taken {self.wal_written} of the {self.submitted} records submitted")
            log.error("msbridge: jsonl did not finish within %.0f s: it took %d of the %d records submitted",
                      time.monotonic() - start, self.wal_written, self.submitted)
        closing = [(w, w.request_close(status)) for w in self.workers]
        hurry_at = time.monotonic() + HURRY_AFTER
        for worker, closed in closing:
            if not closed.wait(max(0.0, min(hurry_at, start + bound(worker.sink)) - time.monotonic())):
                self._call(worker.sink, "hurry")
        for worker, closed in closing:
            if not closed.wait(max(0.0, start + bound(worker.sink) - time.monotonic())):
                self._say_late(worker, bound(worker.sink))

    def _say_late(self, worker: TrackerWorker, bound: float) -> None:
        behind = self.submitted - worker.done_records
        what = (f"its close had not finished after {bound:g} s (its close bound): it had taken "
                f"{worker.done_records} of the {self.submitted} records (up to step {worker.done_step}), "
                f"{behind} behind, and what it stored is not confirmed")
        self._late[worker.sink.name] = what
        log.warning("msbridge: sink %r: %s; jsonl took %d of the %d records; fill it: msbridge replay %s --to %s",
                    worker.sink.name, what, self.wal_written, self.submitted, shlex.quote(self.run.run_dir),
                    worker.sink.name)

    def _atexit(self) -> None:
        # Backstop for a process that exits without train_end: keep what we have.
        self.close(KILLED, timeout=30.0)

    # -- dispatcher thread -------------------------------------------------------
    def _loop(self) -> None:
        if self.wal is not None:
            self._run(self.wal, "flush")
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            kind = item[0]
            if kind == "write":
                if self.wal is not None and self._run(self.wal, "write", item[1], item[2]):
                    self.wal_written += len(item[1])
                for worker in self.workers:  # after jsonl holds it; never waits for a tracker
                    worker.offer(item[1], item[2])
            elif kind == "raised":  # a tracker's own events: the trackers were handed them already
                self._run(self.wal, "write", [], item[1])
            elif kind == "flush":
                if self.wal is not None:
                    self._run(self.wal, "flush")
                item[1].set()
            elif kind == "close" and self.wal is not None:
                self._run(self.wal, "close", item[1])

    def _run(self, sink: Sink, method: str, *args: object) -> bool:
        """Call ``method``, then hand the events it returned (what the sink raised itself) to every other sink.
        Runs on the sink's thread."""
        ok, returned = self._call(sink, method, *args)
        raised = [ev for ev in returned if isinstance(ev, Event)] if isinstance(returned, (list, tuple)) else []
        if not raised:
            return ok
        with self._lock:
            self.raised.extend(raised)
        if sink is not self.wal and self.wal is not None and not self._closed:
            self._queue.put(("raised", raised))  # into jsonl only; after its close only in ``raised``
        for worker in self.workers:
            if worker.sink is not sink:
                worker.offer([], list(raised))
        return ok

    def _call(self, sink: Sink, method: str, *args: object) -> Tuple[bool, Any]:
        """``(True, what the call returned)``, or ``(False, None)`` when it raised (counted, said once)."""
        try:
            return True, getattr(sink, method)(*args)
        except Exception as exc:  # one broken sink never stops training or the others
            with self._lock:
                count = self.errors.get(sink.name, 0) + 1
                self.errors[sink.name] = count
                if count == 1:
                    self.failures[sink.name] = f"{method}(): {type(exc).__name__}: {exc}"
            if count == 1:
                log.error("msbridge: sink %r failed in %s(): %s: %s; other sinks carry on",
                          sink.name, method, type(exc).__name__, exc)
            return False, None


def _gave_up(sink: Sink) -> str:
    """The sink's ``undelivered()``; a sink that raises in it is taken to have given up on everything."""
    try:
        return sink.undelivered()
    except Exception as exc:
        return f"undelivered() raised {type(exc).__name__}: {exc}"


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds until ``deadline`` (None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
