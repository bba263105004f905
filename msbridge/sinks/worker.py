"""One tracker sink on a thread of its own, fed by its own bounded queue.

The dispatcher hands a tracker each batch once jsonl (the write-ahead log) holds it, with ``offer``,
which never waits: a full queue means the tracker is far behind (stalled, starved of CPU or
unreachable), so from that batch on it is handed nothing more for this run and counts what it
missed (records, steps, events). What it misses is then one tail of the run, which
``msbridge replay RUN_DIR --to NAME`` fills from jsonl after the steps the tracker holds.
Flush and close requests bypass the bound. The thread sleeps on a condition while idle.

Example:
    >>> worker = TrackerWorker(sink, run_method, max_batches=256)
    >>> worker.offer(records, events)       # True: queued; False: missed (the tracker is behind)
    >>> worker.request_close("FINISHED").wait(worker.sink.close_bound)
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Deque, Optional, Sequence, Tuple

from .base import Event, Record, Sink

log = logging.getLogger("msbridge")


class TrackerWorker:
    """Runs ``sink`` on the daemon thread ``msbridge-<name>``; ``run(sink, method, *args)`` makes each call
    (the dispatcher's: it counts failures and hands on what the sink raised).

    Attributes:
        done_records: records of the batches whose ``write`` returned.
        done_step: the highest step of those.
        missed_records / missed_steps / missed_events: what was not queued for it (its queue was full).
        behind_from: the first step it missed, None while it missed nothing.
        closed: set once its ``close`` returned.

    Example:
        >>> worker = TrackerWorker(MlflowSink(), dispatcher._run)
        >>> worker.offer(make_records([1, 2]), [])
        True
    """

    def __init__(self, sink: Sink, run: Callable[..., Any], max_batches: int = 256) -> None:
        self.sink = sink
        self.max_batches = max_batches
        self.done_records = self.done_step = 0
        self.missed_records = self.missed_steps = self.missed_events = 0
        self.behind_from: Optional[int] = None
        self.closed = threading.Event()
        self._run = run
        self._items: Deque[Tuple[Any, ...]] = collections.deque()
        self._writes = 0  # write items in ``_items``: what the bound counts
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"msbridge-{sink.name}", daemon=True)
        self._thread.start()

    def offer(self, records: Sequence[Record], events: Sequence[Event]) -> bool:
        """Queue a batch unless the queue is full or the tracker already missed one; never waits."""
        with self._ready:
            if self.behind_from is None and self._writes < self.max_batches:
                self._items.append(("write", records, events))
                self._writes += 1
                self._ready.notify()
                return True
            first = self.behind_from is None
            if first:
                steps = [r.step for r in records] + [e.step for e in events]
                self.behind_from = min(steps) if steps else self.done_step + 1
            self.missed_records += len(records)
            self.missed_steps += len({r.step for r in records})
            self.missed_events += len(events)
        if first:
            log.warning("msbridge: sink %r is %d batches behind; from step %d it gets nothing more in this run "
                        "(jsonl holds every record; the run's outcome names the replay that fills it)",
                        self.sink.name, self.max_batches, self.behind_from)
        return False

    def request_flush(self) -> threading.Event:
        """Ask for a ``flush`` after everything queued; the event is set when it returned."""
        done = threading.Event()
        self._put(("flush", done))
        return done

    def request_close(self, status: str) -> threading.Event:
        """Ask for ``close(status)`` after everything queued; returns ``closed``."""
        self._put(("close", status))
        return self.closed

    @property
    def missed(self) -> str:
        """What it was not handed, "" when nothing: "missed 40 records of 40 steps from step 61 and 2 events"."""
        if self.behind_from is None:
            return ""
        return (f"missed {self.missed_records} records of {self.missed_steps} steps from step {self.behind_from} "
                f"and {self.missed_events} events (its queue of {self.max_batches} batches was full)")

    def _put(self, item: Tuple[Any, ...]) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def _loop(self) -> None:
        self._run(self.sink, "flush")  # first contact (MLflow creating its store and run) at once, on this thread
        while True:
            with self._ready:
                while not self._items:
                    self._ready.wait()
                item = self._items.popleft()
                if item[0] == "write":
                    self._writes -= 1
            kind = item[0]
            if kind == "write":
                records = item[1]
                self._run(self.sink, "write", records, item[2])
                self.done_records += len(records)
                self.done_step = max([self.done_step, *(r.step for r in records)])
            elif kind == "flush":
                self._run(self.sink, "flush")
                item[1].set()
            else:
                self._run(self.sink, "close", item[1])
                self.closed.set()
                return
