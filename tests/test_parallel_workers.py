"""The suite's pytest-xdist workers share the machine, and a test marked ``alone`` has it to itself
(tests/helpers/alone.py): real ``fcntl.flock`` locks held by real processes, as the workers hold them."""
from __future__ import annotations

import multiprocessing

from helpers.alone import Turns

WAIT_S = 10.0
#: Long enough for a process that could start to have started (it only takes a lock), short enough for the fast tier.
BLOCKED_S = 0.2


def _hold(folder, alones, started, releases):
    turns = Turns(folder)
    for n, alone in enumerate(alones):
        with turns.test(alone, next_alone=alones[n + 1:n + 2] == [True]):
            started[n].set()
            releases[n].wait(WAIT_S)


class Holder:
    """A worker in a process of its own running tests one after another, as a worker runs them (tests/conftest.py):
    the first marked ``alone`` or not, then those of ``then``; each started, holding the machine, ended."""

    def __init__(self, folder, alone, then=()):
        context = multiprocessing.get_context("fork")
        alones = [alone, *then]
        self.started = [context.Event() for _ in alones]
        self.releases = [context.Event() for _ in alones]
        self.holding = self.started[0]
        self.process = context.Process(target=_hold, args=(folder, alones, self.started, self.releases))
        self.process.start()

    def end(self):
        """End the test running (the first not ended); after the last, the process."""
        release = next(r for r in self.releases if not r.is_set())
        release.set()
        if release is self.releases[-1]:
            self.process.join(WAIT_S)
            assert self.process.exitcode == 0


def test_tests_share_the_machine_and_an_alone_test_runs_between_theirs(tmp_path):
    first, second = Holder(str(tmp_path), alone=False), Holder(str(tmp_path), alone=False)
    assert first.holding.wait(WAIT_S) and second.holding.wait(WAIT_S), "two ordinary tests run at once"
    alone = Holder(str(tmp_path), alone=True)
    assert not alone.holding.wait(BLOCKED_S), "an alone test started beside running tests"
    first.end()
    second.end()
    assert alone.holding.wait(WAIT_S), "the alone test starts once the running tests ended"
    after = Holder(str(tmp_path), alone=False)
    assert not after.holding.wait(BLOCKED_S), "the other worker's next test started beside an alone test"
    alone.end()
    assert after.holding.wait(WAIT_S)
    after.end()


def test_a_worker_running_test_after_test_never_keeps_an_alone_test_waiting(tmp_path):
    """The turnstile: the alone test gets its turn after the running test, before the next one."""
    running = Holder(str(tmp_path), alone=False)
    assert running.holding.wait(WAIT_S)
    alone = Holder(str(tmp_path), alone=True)
    assert not alone.holding.wait(BLOCKED_S)
    queued = Holder(str(tmp_path), alone=False)  # the same worker's next test, asked for before the first ended
    assert not queued.holding.wait(BLOCKED_S), "a test queued behind an alone test started first"
    running.end()
    assert alone.holding.wait(WAIT_S) and not queued.holding.is_set()
    alone.end()
    assert queued.holding.wait(WAIT_S)
    queued.end()


def test_an_alone_turn_is_kept_for_a_next_alone_test_and_given_back_after_the_last(tmp_path):
    """The other worker's test does not slip in between two alone tests, where the alone worker would wait idle."""
    worker = Holder(str(tmp_path), alone=True, then=(True, False))
    assert worker.holding.wait(WAIT_S)
    other = Holder(str(tmp_path), alone=False)
    assert not other.holding.wait(BLOCKED_S), "an ordinary test started beside an alone test"
    worker.end()
    assert worker.started[1].wait(WAIT_S), "the next alone test waited"
    assert not other.holding.wait(BLOCKED_S), "the other worker's test ran between two alone tests"
    worker.end()
    assert other.holding.wait(WAIT_S) and worker.started[2].wait(WAIT_S), "after the last alone test: both run"
    worker.end()
    other.end()
