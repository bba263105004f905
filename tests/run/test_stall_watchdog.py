"""The stall watchdog: a thread that sleeps until the last step's deadline, never polls, and records
``stall`` and ``resumed`` with what the process was last seen doing."""
from __future__ import annotations

import threading
import time

from msbridge.run.watchdog import AT_FLUSH, IN_COLLECTIVE, StallWatchdog
import pytest


class Recorder:
    def __init__(self):
        self.events = []
        self.arrived = threading.Event()

    def __call__(self, event):
        self.events.append(event)
        self.arrived.set()


class CountingEvent(threading.Event):
    waits = 0

    def wait(self, timeout=None):
        CountingEvent.waits += 1
        return super().wait(timeout)


def test_the_threshold_is_given_or_10x_the_median_step_time_at_least_300_s():
    dog = StallWatchdog(Recorder(), rank=0)
    assert dog.threshold() == 300.0  # no step yet
    dog.observe([55.0, 60.0, 61.0, 60.0, 3.0])  # the step times its monitor observed at a flush
    assert dog.threshold() == 600.0
    assert StallWatchdog(Recorder(), 0, stall_seconds=900).threshold() == 900.0
    fast = StallWatchdog(Recorder(), 0)
    fast.observe([0.002] * 5)
    assert fast.threshold() == 300.0  # the floor


@pytest.mark.slow
def test_a_long_first_step_is_not_a_stall_then_a_hang_is_and_resumed_follows():
    got = Recorder()
    dog = StallWatchdog(got, rank=3, stall_seconds=0.4)
    dog.start()
    time.sleep(0.8)  # compiling: no step has ended yet
    assert got.events == []
    dog.step_ended(1)
    dog.step_ended(2)
    dog.mark(AT_FLUSH)
    dog.mark(IN_COLLECTIVE)
    assert got.arrived.wait(5)
    [stall] = got.events
    assert (stall.kind, stall.step, stall.rank) == ("stall", 2, 3)
    assert stall.detail["doing"] == "in the collective" and stall.detail["seconds_since_step"] >= 0.4
    time.sleep(0.5)  # still hung: one stall event per stall, not one per threshold
    assert len(got.events) == 1
    got.arrived.clear()
    dog.step_ended(3)
    assert got.arrived.wait(5)
    dog.stop()
    resumed = got.events[1]
    assert (resumed.kind, resumed.step) == ("resumed", 3) and resumed.detail["stalled_s"] >= 0.9


@pytest.mark.slow
def test_the_thread_sleeps_between_deadlines_instead_of_polling(monkeypatch):
    monkeypatch.setattr("msbridge.run.watchdog.threading.Event", CountingEvent)
    CountingEvent.waits = 0
    dog = StallWatchdog(Recorder(), rank=0, stall_seconds=5.0)
    dog.start()
    for step in range(1, 41):  # 40 steps in about 1 s: the thread wakes at the first step, then at its deadline
        dog.step_ended(step)
        time.sleep(0.025)
    dog.stop()
    assert CountingEvent.waits <= 4, CountingEvent.waits


def test_steps_that_come_back_just_before_the_end_still_end_the_stall():
    """A busy host: the stall is recorded, steps come back and training ends before the thread runs again
    (the last 10 steps of a small model take 10 ms). Here the thread is held inside its stall event's
    delivery until the stop has begun, so the order is certain; the stall must still get its ``resumed``."""
    held, release = threading.Event(), threading.Event()
    got = []

    def slow_submit(event):
        got.append(event)
        held.set()
        release.wait(5)  # the thread is busy (or not scheduled) while training resumes and ends

    dog = StallWatchdog(slow_submit, rank=0, stall_seconds=0.2)
    dog.start()
    dog.step_ended(30)
    assert held.wait(5)
    dog.step_ended(31)
    stopper = threading.Thread(target=dog.stop)
    stopper.start()
    while not dog._stopped:
        time.sleep(0.001)
    release.set()
    stopper.join(5)
    assert [(e.kind, e.step) for e in got] == [("stall", 30), ("resumed", 31)]
    assert got[1].detail["stalled_s"] >= 0.2
