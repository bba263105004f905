"""The converter thread: jobs run in order off the calling thread, a job's error comes back to the caller."""
from __future__ import annotations

import threading

import pytest

from msbridge.run.converter import Converter


def test_jobs_run_in_order_on_their_own_thread_and_wait_returns_once_all_ran():
    converter, ran = Converter(), []
    for n in range(50):
        converter.put(lambda n=n: ran.append((n, threading.current_thread().name)))
    converter.wait()
    assert [n for n, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"msbridge-convert"}
    converter.stop()


def test_a_job_that_raises_is_raised_at_the_next_hand_off_once_and_later_jobs_still_run():
    converter, ran = Converter(), []

    def broken():
        raise ValueError("a bug in a health check")
    converter.put(broken)
    with pytest.raises(ValueError, match="a bug in a health check"):
        converter.put(lambda: ran.append(1))  # the next hand-off meets it
    converter.put(lambda: ran.append(2))  # said once; the thread goes on
    converter.wait()
    assert ran == [2]
    converter.stop()


def test_a_hand_off_waits_for_the_job_before_it_and_stop_runs_what_is_queued():
    converter, gate, ran = Converter(), threading.Event(), []
    converter.put(gate.wait)  # the thread is busy until the gate opens
    blocked = threading.Thread(target=converter.put, args=(lambda: ran.append("next"),))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive(), "one window at a time: the hand-off waits for the one before it"
    gate.set()
    blocked.join(5)
    assert not blocked.is_alive()
    converter.stop()
    assert ran == ["next"]
