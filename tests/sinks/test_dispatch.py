"""The dispatcher: jsonl first on its thread, each tracker on its own, isolation, bounded close, no polling; a
plug-in's ``hurry`` or ``in_submit`` never holds the training thread."""
from __future__ import annotations

import os
import threading
import time

import pytest
from helpers.runs import make_records, make_run

from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.config.load import load_config
from msbridge.errors import ConfigError
from msbridge.options import Option
from msbridge.sinks.base import BATCH_SECONDS, CLOSE_GRACE, GAP, HURRY_AFTER, Behind, Event, Sink
from msbridge.sinks.dispatch import Dispatcher
from msbridge.sinks.runlog import last_step

RUN = make_run("/nonexistent")


class Recording(Sink):
    """Records what it is handed and on which thread (a test double for ordering, not for a tracker)."""

    skips_held = False  # every batch, in the order handed: steps from many threads go back and forth

    def __init__(self, name, journal, delay=0.0, gate=None, **options):
        super().__init__(**options)
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


class Timed(Recording):
    """A tracker whose close_timeout option bounds its close, and whose close can hang."""

    options = {"close_timeout": Option(float, 1.0, "seconds", low=0, low_open=True)}


def steps_of(journal, name):
    return [step for who, steps in journal if who == name for step in steps]


def test_jsonl_first_then_each_tracker_on_its_own_thread_and_drain_on_close():
    journal = []

    class Tracker(Recording):
        def write(self, records, events):
            # jsonl holds each batch before a tracker is handed it
            assert all(step in steps_of(journal, "jsonl") for step in (r.step for r in records))
            super().write(records, events)

    wal, tb = Recording("jsonl", journal), Tracker("tb", journal, delay=0.01)
    d = Dispatcher([wal, tb], RUN)
    for i in range(1, 11):
        d.submit(make_records([i]))
    d.close("KILLED")
    assert steps_of(journal, "jsonl") == steps_of(journal, "tb") == list(range(1, 11))
    assert wal.threads == {"msbridge-jsonl"} and tb.threads == {"msbridge-tb"}
    assert wal.status == tb.status == "KILLED"
    assert d.undelivered == {} and d.submitted == d.hosts[0].done_records == 10


def test_a_stalled_tracker_delays_neither_jsonl_nor_another_tracker():
    journal, held = [], threading.Event()
    fast_has_all = threading.Event()

    class Fast(Recording):
        def write(self, records, events):
            super().write(records, events)
            if 20 in [r.step for r in records]:
                fast_has_all.set()

    stalled = Recording("stalled", journal, gate=held)
    d = Dispatcher([Recording("jsonl", journal), stalled, Fast("fast", journal)], RUN)
    for i in range(1, 21):
        d.submit(make_records([i]))
    assert fast_has_all.wait(30), "the fast tracker got every batch while the other one was stalled"
    assert steps_of(journal, "jsonl") == list(range(1, 21)) and steps_of(journal, "stalled") == []
    held.set()
    d.close()
    assert steps_of(journal, "stalled") == list(range(1, 21)) and d.undelivered == {}


@pytest.mark.slow
def test_a_full_tracker_queue_never_blocks_submit_and_the_tracker_reads_the_rest_from_jsonl(tmp_path):
    journal, held = [], threading.Event()
    wal, slow = JsonlSink(), Recording("slow", journal, gate=held)
    d = Dispatcher([wal, slow], make_run(tmp_path), tracker_batches=3)
    started = time.monotonic()
    for i in range(1, 21):
        d.submit(make_records([i]))
    assert time.monotonic() - started < 5, "submit never waits for a tracker"
    # jsonl has taken all 20 within the 2 s; the stalled tracker has not flushed
    assert d.flush(timeout=2) is False and last_step(wal.path) == 20
    held.set()
    d.close()
    assert steps_of(journal, "slow") == list(range(1, 21)), "every step once: its queue, then the log from its cursor"
    assert d.undelivered == {}


class StallsOnce(Recording):
    """A plug-in whose ``write`` blocks once (a tracker that froze), then keeps up."""

    def write(self, records, events):
        if self.gate is not None and records and records[0].step == 5:
            self.gate.wait(timeout=60)
        self.journal.append((self.name, [r.step for r in records], [(e.kind, e.step) for e in events]))


@pytest.mark.slow
def test_a_tracker_that_stalled_catches_up_from_jsonl_and_goes_back_to_live_batches(tmp_path):
    journal, held = [], threading.Event()
    wal = JsonlSink()
    d = Dispatcher([wal, StallsOnce("stalls", journal, gate=held)], make_run(tmp_path), tracker_batches=2)
    for i in range(1, 41):
        d.submit(make_records([i]), [Event("anomaly", i, 0, time=float(i))] if i % 10 == 0 else [])
    deadline = time.monotonic() + 30
    while not (os.path.exists(wal.path) and last_step(wal.path) == 40) and time.monotonic() < deadline:
        time.sleep(0.01)  # jsonl holds all 40 while the tracker stalls
    held.set()
    assert d.flush(timeout=30), "caught up before the close"
    host = d.hosts[1]
    assert host.caught_up == 1 and host.behind_from is None
    for i in range(41, 51):  # live again: each batch from memory, one write a batch (each flushed: a tracker
        d.submit(make_records([i]))  # slower than the test's loop on a busy host would be behind again)
        assert d.flush(timeout=30)
    d.close()
    writes = [(steps, events) for who, steps, events in journal if who == "stalls"]
    assert [s for steps, _ in writes for s in steps] == list(range(1, 51)), "every step once, in order"
    assert [e for _, events in writes for e in events] == [("anomaly", s) for s in (10, 20, 30, 40)]
    assert [steps for steps, _ in writes[-10:]] == [[i] for i in range(41, 51)]
    assert d.undelivered == {}


@pytest.mark.slow
def test_close_waits_at_most_the_sinks_close_timeout_then_lists_it_undelivered():
    journal, held = [], threading.Event()

    class Hangs(Timed):
        def close(self, status="FINISHED"):
            held.wait(120)  # never returns within the test's bound

    hangs = Hangs("hangs", journal, close_timeout=0.5)
    assert hangs.close_bound == 0.5 + CLOSE_GRACE
    d = Dispatcher([Recording("jsonl", journal), hangs, Recording("ok", journal)], RUN)
    d.submit(make_records([1, 2, 3]))
    started = time.monotonic()
    d.close("FINISHED")
    took = time.monotonic() - started
    held.set()
    assert hangs.close_bound <= took < hangs.close_bound + 30, took
    late = d.undelivered["hangs"]
    assert late.startswith(f"its close had not finished after {hangs.close_bound:g} s") and "3 records" in late
    assert set(d.undelivered) == {"hangs"}


@pytest.mark.slow
def test_a_tracker_still_closing_after_hurry_after_is_hurried_once_on_a_thread_of_its_own():
    """Training has ended: a tracker whose close runs on is told to ``hurry`` (MLflow lifts its client's low
    priority then), on a throwaway thread; one whose close returned at once is not."""
    journal, release, hurried = [], threading.Event(), []

    class Slow(Timed):
        def close(self, status="FINISHED"):
            release.wait(60)

        def hurry(self):
            hurried.append((self.name, threading.current_thread().name, time.monotonic() - started))
            release.set()

    class Quick(Slow):
        def close(self, status="FINISHED"):
            pass

    d = Dispatcher([Recording("jsonl", journal), Slow("slow", journal, close_timeout=30), Quick("quick", journal)],
                   RUN)
    d.submit(make_records([1, 2]))
    started = time.monotonic()
    d.close("FINISHED")
    assert [(name, thread) for name, thread, _ in hurried] == [("slow", "msbridge-slow-hurry")]
    assert HURRY_AFTER <= hurried[0][2] < HURRY_AFTER + 10
    assert d.undelivered == {}, "hurried in time, it closed within its bound"


def test_submit_is_safe_from_many_threads():
    journal = []
    d = Dispatcher([Recording("jsonl", journal), Recording("tb", journal)], RUN)

    def feed(first):
        for step in range(first, first + 50):
            d.submit(make_records([step]))

    threads = [threading.Thread(target=feed, args=(1 + 50 * k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d.close()
    assert sorted(steps_of(journal, "jsonl")) == sorted(steps_of(journal, "tb")) == list(range(1, 201))


class Batched(Recording):
    """A tracker that declares ``batch_seconds``, as TensorBoard, MindInsight and MLflow do; ``began``: when each of
    its writes began."""

    options = {"batch_seconds": BATCH_SECONDS}

    def write(self, records, events):
        self.began = [*getattr(self, "began", []), time.monotonic()]
        super().write(records, events)


def writes_of(journal, name):
    return [steps for who, steps in journal if who == name]


def wait_until(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition(), f"not within {seconds} s"


def test_batch_seconds_puts_a_trackers_batches_in_one_write_the_first_a_flush_and_the_close_at_once():
    journal = []
    d = Dispatcher([Recording("jsonl", journal), Batched("paced", journal, batch_seconds=60),
                    Recording("each", journal)], RUN)
    d.submit(make_records([1]))
    wait_until(lambda: writes_of(journal, "paced") == [[1]])  # the first batch at once
    for step in range(2, 6):
        d.submit(make_records([step]))
    wait_until(lambda: steps_of(journal, "each") == [1, 2, 3, 4, 5])
    time.sleep(0.3)
    assert writes_of(journal, "paced") == [[1]], "the batches within batch_seconds of its last write wait"
    started = time.monotonic()
    assert d.flush(timeout=30) and writes_of(journal, "paced") == [[1], [2, 3, 4, 5]], "a flush: at once, in one write"
    d.submit(make_records([6]))
    d.close()
    assert time.monotonic() - started < 30, "neither the flush nor the close waited for batch_seconds"
    assert writes_of(journal, "paced") == [[1], [2, 3, 4, 5], [6]]
    assert writes_of(journal, "each") == [[1], [2], [3], [4], [5], [6]], "a sink without the option: each batch"
    assert d.undelivered == {}


def test_the_next_write_comes_batch_seconds_after_the_last_one_began_or_at_once_when_the_queue_is_half_full():
    journal = []
    paced = Batched("paced", journal, batch_seconds=0.5)
    d = Dispatcher([Recording("jsonl", journal), paced], RUN)
    d.submit(make_records([1]))
    wait_until(lambda: writes_of(journal, "paced") == [[1]])
    d.submit(make_records([2]))
    wait_until(lambda: writes_of(journal, "paced") == [[1], [2]])
    # begun at least batch_seconds apart (the clock's step aside)
    assert paced.began[1] - paced.began[0] >= 0.5 - 0.01, paced.began
    d.close()

    journal = []
    d = Dispatcher([Recording("jsonl", journal), Batched("paced", journal, batch_seconds=60)], RUN, tracker_batches=4)
    d.submit(make_records([1]))
    wait_until(lambda: writes_of(journal, "paced") == [[1]])
    d.submit(make_records([2]))
    d.submit(make_records([3]))  # two of its four batches queued: it takes them, not waiting 60 s
    wait_until(lambda: steps_of(journal, "paced") == [1, 2, 3])
    d.close()


def test_flush_waits_for_every_sink():
    journal = []
    d = Dispatcher([Recording("jsonl", journal), Recording("slow", journal, delay=0.05)], RUN)
    d.submit(make_records([1, 2]))
    assert d.flush(timeout=30) and journal == [("jsonl", [1, 2]), ("slow", [1, 2])]
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
    assert journal == [("ok", [1])] and d.failures == {"bad": "open(): ConnectionError: no server"}
    assert d.undelivered == {"bad": "1 failed call(s): open(): ConnectionError: no server; missed 1 records of "
                                    "1 steps from step 1 and 0 events (a call of it failed)"}
    assert d.unopened == ["bad"]


def test_undelivered_joins_failed_calls_and_what_a_sink_gave_up_on_at_close():
    class Flaky(Sink):
        name = "flaky"

        def write(self, records, events):
            raise ConnectionError("down")

        def undelivered(self):
            return "2 records not delivered"

    journal = []
    d = Dispatcher([Flaky(), Recording("ok", journal)], RUN)
    d.submit(make_records([1]))
    d.submit(make_records([2]))
    d.close()
    assert d.undelivered == {"flaky": "2 failed call(s): write(): ConnectionError: down; 2 records not delivered"}


@pytest.mark.slow
def test_idle_dispatcher_uses_no_cpu():
    existing = set(threading.enumerate())
    d = Dispatcher([Recording("jsonl", []), Recording("x", []), Recording("y", [])], RUN)
    time.sleep(0.2)  # every thread started and made its first flush
    # The dispatcher's own threads' CPU clocks: not the process's, which other tests' leftover threads share.
    threads = [t for t in threading.enumerate() if t not in existing]
    assert len(threads) >= 3, threads  # a thread per sink
    clocks = [time.pthread_getcpuclockid(t.ident) for t in threads]
    before = sum(map(time.clock_gettime, clocks))
    time.sleep(1.0)
    used = sum(map(time.clock_gettime, clocks)) - before
    d.close()
    assert used < 0.05, f"idle dispatcher burned {used:.3f} CPU-s in 1 s"


def test_every_sink_is_flushed_first_on_its_own_thread():
    """A tracker's first contact (MLflow creating its store and run) happens at start, off the training thread."""

    class FirstContact(Recording):
        def flush(self):
            self.journal.append((self.name, "flush", threading.current_thread().name))

    journal = []
    d = Dispatcher([FirstContact("jsonl", journal), FirstContact("a", journal), FirstContact("b", journal)], RUN)
    d.submit(make_records([1]))
    d.close()
    for name, thread in (("jsonl", "msbridge-jsonl"), ("a", "msbridge-a"), ("b", "msbridge-b")):
        mine = [entry for entry in journal if entry[0] == name]
        assert mine == [(name, "flush", thread), (name, [1])]


def test_close_timeout_is_finite_and_positive_and_sets_the_close_bound():
    for bad, said in ((float("inf"), "a finite number"), (0, "a number"), (-1, "a number")):
        with pytest.raises(ConfigError, match=rf"sinks\.mlflow\.close_timeout: expected {said} > 0 and < 3600, got"):
            load_config({"sinks": {"jsonl": {}, "mlflow": {"close_timeout": bad}}})
    assert Timed("t", [], close_timeout=150).close_bound == 150 + CLOSE_GRACE  # the close waits 150 s, not 120
    assert Recording("tb", []).close_bound == 10 + CLOSE_GRACE  # a sink without close_timeout


def test_the_events_a_sink_returns_are_handed_to_every_other_sink():
    """A sink learns nothing from attributes: what ``write`` returns (a ``gap``) goes to jsonl and the trackers."""
    gap = Event(GAP, 2, 0, 1.0, {"records": 1, "events": 0, "first_step": 2, "last_step": 2, "sink": "lossy"})

    class Lossy(Sink):
        name = "lossy"

        def write(self, records, events):
            return [gap] if any(r.step == 2 for r in records) else None

    journal, seen = [], []

    class Listening(Recording):
        def write(self, records, events):
            seen.extend((self.name, ev.kind) for ev in events)
            super().write(records, events)

    d = Dispatcher([Listening("jsonl", journal), Lossy(), Listening("tb", journal)], RUN)
    d.submit(make_records([1, 2, 3]))
    assert d.flush(timeout=30)  # lossy's write has returned: its gap is queued for jsonl and offered to tb
    d.close()
    assert d.gaps == [gap] and sorted(seen) == [("jsonl", GAP), ("tb", GAP)]


@pytest.mark.slow
def test_a_hurry_that_blocks_forever_holds_no_close_past_its_bound():
    """``hurry`` runs on a throwaway thread nobody waits for: one that never returns, beside a close that does
    (after 1 s), leaves the dispatcher's close to end with the sink's, nothing listed."""
    journal, never = [], threading.Event()

    class BlocksInHurry(Timed):
        def close(self, status="FINISHED"):
            time.sleep(1.0)

        def hurry(self):
            never.wait()  # released only at the end of the test

    sink = BlocksInHurry("stuck", journal, close_timeout=2)
    d = Dispatcher([Recording("jsonl", journal), sink], RUN)
    d.submit(make_records([1]))
    started = time.monotonic()
    d.close("FINISHED")
    took = time.monotonic() - started
    never.set()
    assert 1.0 <= took < sink.close_bound, took
    assert d.undelivered == {} and steps_of(journal, "stuck") == [1]


class PluginInline(Recording):
    """A plug-in's sink (not msbridge's own class) that sets ``in_submit``; its ``write`` blocks on its
    gate."""

    in_submit = True


def test_a_plug_ins_in_submit_is_ignored_its_sink_hosted_like_any_other():
    journal, gate = [], threading.Event()
    plugin = PluginInline("inline", journal, gate=gate)
    d = Dispatcher([Recording("jsonl", journal), plugin], RUN)
    assert d.inline == [] and plugin in d.sinks
    started = time.monotonic()
    for step in range(1, 4):
        d.submit(make_records([step]))
    assert time.monotonic() - started < 0.5, "submit never waits for a plug-in, whatever its flag says"
    gate.set()
    d.close()
    assert plugin.threads == {"msbridge-inline"} and steps_of(journal, "inline") == [1, 2, 3]


class RefusesOnce(Sink):
    """A tracker whose ``write`` refuses one batch (``Behind``: its backlog at its bound), then takes every one."""

    name = "refuses"

    def __init__(self):
        super().__init__()
        self.steps, self.refused = [], False

    def write(self, records, events):
        if not self.refused and any(r.step == 5 for r in records):
            self.refused = True
            raise Behind("its backlog is at its bound")
        self.steps.extend(r.step for r in records)


def test_a_refused_batch_is_read_from_jsonl_before_any_later_one(tmp_path):
    """The batches queued after a refused one are not handed before it: every step once, in order."""
    tracker = RefusesOnce()
    d = Dispatcher([JsonlSink(), tracker], make_run(tmp_path))
    for i in range(1, 21):
        d.submit(make_records([i]))
    assert d.flush(timeout=30)
    for i in range(21, 26):
        d.submit(make_records([i]))
    d.close()
    assert tracker.refused and tracker.steps == list(range(1, 26))
    assert d.undelivered == {} and d.hosts[1].caught_up >= 1


def test_what_a_tracker_says_after_its_close_reaches_the_run_and_a_failure_there_is_no_failure():
    """``describe`` is asked again after each tracker's close (``Dispatcher.said_at_close``): a page only the
    closed run has (MLflow's view of a sweep) is kept; one that raises then is left out and counts for nothing."""
    class Pages(Recording):
        def describe(self, run):
            return {"where": "here", **({"url": "http://127.0.0.1:5000/#/run"} if self.status else {})}

    class Raises(Recording):
        def describe(self, run):
            if self.status:
                raise RuntimeError("closed")
            return {"where": "there"}

    journal = []
    d = Dispatcher([Recording("jsonl", journal), Pages("pages", journal), Raises("raises", journal)], RUN)
    assert d.describe(RUN) == {"pages": {"where": "here"}, "raises": {"where": "there"}}
    d.open(RUN)
    d.submit(make_records([1, 2]), [])
    d.close("FINISHED")
    assert d.said_at_close == {"pages": {"where": "here", "url": "http://127.0.0.1:5000/#/run"}}
    assert d.undelivered == {}, "a describe that fails after the close is no failure"
