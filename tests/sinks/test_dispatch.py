"""The dispatcher: one background thread, jsonl first, isolation, drain on close, no polling."""
from __future__ import annotations

import threading
import time

from helpers.runs import make_records, make_run

from msbridge.sinks.base import Sink
from msbridge.sinks.dispatch import Dispatcher

RUN = make_run("/nonexistent")


class Recording(Sink):
    """Records what it is handed and on which thread (a test double for ordering, not for a tracker)."""

    def __init__(self, name, journal, delay=0.0, gate=None):
        super().__init__()
        self.name, self.journal, self.delay, self.gate = name, journal, delay, gate
        self.threads, self.status = set(), None

    def write(self, records, events):
        if self.gate is not None:
            self.gate.wait(timeout=60)  # held until the test lets it go
        time.sleep(self.delay)
        self.threads.add(threading.current_thread().name)
        self.journal.append((self.name, [r.step for r in records]))

    def close(self, status="FINISHED"):
        self.status = status


def test_order_thread_and_drain_on_close():
    journal, held = [], threading.Event()
    wal, other = Recording("jsonl", journal, gate=held), Recording("tb", journal, delay=0.01)
    d = Dispatcher([wal, other], RUN)
    for i in range(10):
        d.submit(make_records([i]))
    # all ten submits returned while the first write was still held: submit hands over, it never waits for a sink
    assert journal == []
    held.set()
    d.close("KILLED")
    assert journal == [(name, [i]) for i in range(10) for name in ("jsonl", "tb")]
    assert wal.threads == other.threads == {"msbridge-dispatch"}
    assert wal.status == other.status == "KILLED"


def test_flush_waits_for_every_sink():
    journal = []
    d = Dispatcher([Recording("slow", journal, delay=0.05)], RUN)
    d.submit(make_records([1, 2]))
    assert d.flush(timeout=5) and journal == [("slow", [1, 2])]
    d.close()


def test_a_failing_open_removes_only_that_sink():
    class BadOpen(Sink):
        name = "bad"

        def open(self, run):
            raise ConnectionError("no server")

    journal = []
    d = Dispatcher([BadOpen(), Recording("ok", journal)], RUN)
    d.submit(make_records([1]))
    d.close()
    assert journal == [("ok", [1])] and d.errors == {"bad": 1}
    assert d.undelivered == {"bad": "1 failed call(s)"}


def test_undelivered_joins_failed_calls_and_what_a_sink_gave_up_on_at_close():
    class Flaky(Sink):
        name = "flaky"

        def emit(self, records, events):
            raise ConnectionError("down")

        def close(self, status="FINISHED"):
            self.undelivered = "2 records not delivered"

    journal = []
    d = Dispatcher([Flaky(), Recording("ok", journal)], RUN)
    d.submit(make_records([1]))
    d.submit(make_records([2]))
    d.close()
    assert d.undelivered == {"flaky": "2 failed call(s); 2 records not delivered"}


def test_idle_dispatcher_uses_no_cpu():
    d = Dispatcher([Recording("x", [])], RUN)
    before = time.process_time()
    time.sleep(1.0)
    used = time.process_time() - before
    d.close()
    assert used < 0.05, f"idle dispatcher burned {used:.3f} CPU-s in 1 s"


def test_every_sink_is_flushed_first_on_the_dispatcher_thread():
    """A tracker's first contact (MLflow creating its store and run) happens at start, off the training thread."""

    class FirstContact(Recording):
        def flush(self):
            self.journal.append((self.name, "flush", threading.current_thread().name))

    journal = []
    d = Dispatcher([FirstContact("a", journal), FirstContact("b", journal)], RUN)
    d.submit(make_records([1]))
    d.close()
    assert journal == [("a", "flush", "msbridge-dispatch"), ("b", "flush", "msbridge-dispatch"),
                       ("a", [1]), ("b", [1])]
