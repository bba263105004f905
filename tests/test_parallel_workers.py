"""The suite's two pytest-xdist workers share the machine, and a test marked ``alone`` has it to itself
(tests/helpers/alone.py): real ``fcntl.flock`` locks held by real processes, as the workers hold them."""
from __future__ import annotations

import multiprocessing

from helpers.alone import machine_turn

WAIT_S = 10.0
#: Long enough for a process that could start to have started (it only takes a lock), short enough for the fast tier.
BLOCKED_S = 0.2


def _hold(folder, alone, holding, release):
    with machine_turn(folder, alone=alone):
        holding.set()
        release.wait(WAIT_S)


class Holder:
    """A test run in a process of its own, as a worker runs it: started, holding the machine, ended."""

    def __init__(self, folder, alone):
        context = multiprocessing.get_context("fork")
        self.holding, self.release = context.Event(), context.Event()
        self.process = context.Process(target=_hold, args=(folder, alone, self.holding, self.release))
        self.process.start()

    def end(self):
        self.release.set()
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
