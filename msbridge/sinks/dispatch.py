"""One background thread that hands batches to every sink, jsonl first.

The training thread only puts work on a bounded queue. The thread blocks on
the queue while idle (no polling), writes the write-ahead log (jsonl) first,
then every other sink, each in its own try/except: a sink that raises is
logged once with its name, counted, and the others carry on. An event a sink
raises itself (``Sink.raised``: a ``gap`` in the jsonl log) is handed to every
other open sink right after, like any event, and kept in ``raised``. What a sink
may lack (its failed calls, what it gave up delivering at close) is ``undelivered``.

A sink marked ``on_training_thread`` (the console's progress line) is written
in ``submit`` itself, before the batch is queued: a progress line is printed
at the flush of the step it reports, never behind a slow sink or a full queue.

The thread starts by flushing every sink once, so a tracker's first contact
(MLflow creating a store and a run: seconds) happens while the graph compiles,
not at the first window in the middle of training.

Example:
    >>> d = Dispatcher([JsonlSink()], run_info)
    >>> d.submit(records, events)
    >>> d.close("FINISHED")   # drains the queue, closes every sink
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
from typing import Dict, List, Optional, Sequence

from .base import FINISHED, KILLED, Event, Record, RunInfo, Sink

log = logging.getLogger("msbridge")

_STOP = object()


class Dispatcher:
    """Runs ``sinks`` on one daemon thread fed by a bounded queue.

    Args:
        sinks: opened here, in order; put jsonl first, it is the write-ahead log.
        run: what every sink is opened with.
        max_batches: queue bound; a full queue makes ``submit`` wait (nothing is dropped).

    ``sinks`` holds the sinks the thread writes; ``inline`` the ``on_training_thread`` ones.
    """

    def __init__(self, sinks: Sequence[Sink], run: RunInfo, max_batches: int = 64) -> None:
        self.errors: Dict[str, int] = {}
        self.failures: Dict[str, str] = {}  # sink name -> its first failure, "open(): TypeError: ..."
        #: Every event the sinks raised themselves (a ``gap``), in order: the run's outcome lists them.
        self.raised: List[Event] = []
        self.run = run
        self._queue: "queue.Queue[object]" = queue.Queue(maxsize=max_batches)
        self._closed = False
        self._warned_full = False
        opened = [sink for sink in sinks if self._call(sink, "open", run)]
        self.sinks: List[Sink] = [sink for sink in opened if not sink.on_training_thread]
        self.inline: List[Sink] = [sink for sink in opened if sink.on_training_thread]
        self._open = list(self.sinks)
        self._thread = threading.Thread(target=self._loop, name="msbridge-dispatch", daemon=True)
        self._thread.start()
        atexit.register(self._atexit)

    # -- training thread -------------------------------------------------
    def submit(self, records: Sequence[Record], events: Sequence[Event] = ()) -> None:
        """Write the inline sinks (the progress line), then queue the batch for the others.
        Returns at once unless the queue is full."""
        if self._closed or (not records and not events):
            return
        item = ("write", list(records), list(events))
        for sink in self.inline:
            self._call(sink, "write", item[1], item[2])
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if not self._warned_full:
                self._warned_full = True
                log.warning("msbridge: sink queue full (%d batches); training waits for the sinks", self._queue.maxsize)
            self._queue.put(item)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every sink has written and flushed what was submitted so far."""
        if self._closed:
            return True
        for sink in self.inline:
            self._call(sink, "flush")
        done = threading.Event()
        self._queue.put(("flush", done))
        return done.wait(timeout)

    def close(self, status: str = FINISHED, timeout: Optional[float] = 120.0) -> None:
        """Drain the queue, then close every sink with ``status``."""
        if not self._closed:
            self._closed = True
            for sink in self.inline:
                self._call(sink, "close", status)
            self._queue.put(("close", status))
            self._queue.put(_STOP)
            atexit.unregister(self._atexit)
        # A second close (say the collective watchdog's, then the training thread's) waits for the first.
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("msbridge: sinks did not finish within %.0f s; jsonl holds every record", timeout)

    @property
    def undelivered(self) -> Dict[str, str]:
        """Each sink that may lack records: its failed calls, and what it gave up delivering in ``close``."""
        out = {name: f"{count} failed call(s)" for name, count in self.errors.items()}
        for sink in (*self.sinks, *self.inline):
            if getattr(sink, "undelivered", ""):
                out[sink.name] = "; ".join(part for part in (out.get(sink.name), sink.undelivered) if part)
        return out

    def _atexit(self) -> None:
        # Backstop for a process that exits without train_end: keep what we have.
        self.close(KILLED, timeout=30.0)

    # -- dispatcher thread -------------------------------------------------
    def _loop(self) -> None:
        for sink in self.sinks:  # first contact off the training thread, before the first window
            self._run(sink, "flush")
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            kind = item[0]
            if kind == "write":
                for sink in self.sinks:
                    self._run(sink, "write", item[1], item[2])
            elif kind == "flush":
                for sink in self.sinks:
                    self._run(sink, "flush")
                item[1].set()
            elif kind == "close":
                for sink in self.sinks:
                    self._open.remove(sink)
                    self._run(sink, "close", item[1])

    def _run(self, sink: Sink, method: str, *args: object) -> None:
        """Call ``method``, then hand what the sink raised itself to every other open sink."""
        self._call(sink, method, *args)
        raised = getattr(sink, "raised", None)
        if not raised:
            return
        sink.raised = []
        self.raised.extend(raised)
        for other in self._open:
            if other is not sink:
                self._run(other, "write", [], raised)

    def _call(self, sink: Sink, method: str, *args: object) -> bool:
        try:
            getattr(sink, method)(*args)
            return True
        except Exception as exc:  # one broken sink never stops training or the others
            count = self.errors.get(sink.name, 0) + 1
            self.errors[sink.name] = count
            if count == 1:
                self.failures[sink.name] = f"{method}(): {type(exc).__name__}: {exc}"
                log.error("msbridge: sink %r failed in %s(): %s: %s; other sinks carry on",
                          sink.name, method, type(exc).__name__, exc)
            return False
