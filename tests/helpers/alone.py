"""The machine shared between pytest-xdist workers (``pytest -n 3``), with a turn of its own for a test marked
``alone``: one that starts CPU-bound processes (tests/helpers/load.py), which would starve the other workers' tests
into false failures, or a process in Linux's idle class, which the other workers' training would starve.

Two ``fcntl.flock`` files in a folder the workers share: every test holds ``machine`` shared while it runs; an
``alone`` test holds it exclusively, so it starts once the other workers' current tests end, and they wait before
their next ones. ``turnstile`` is taken first by all, so a worker running one test after another cannot keep an
``alone`` test waiting forever. The kernel drops both when a worker dies. A worker keeps its ``alone`` turn into
its next test when that one is ``alone`` too (``Turns``): the other workers, which would wait through that test
anyway, do not run one of their own in between while this one waits idle for them.

Example:
    >>> with machine_turn(str(tmp_path), alone=True):
    ...     run_beside_four_busy_processes()
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator, Optional


@contextlib.contextmanager
def _flock(path: str, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def machine_turn(folder: str, alone: bool) -> Iterator[None]:
    """Hold the machine (in ``folder``) exclusively if ``alone``, else shared with the other workers' tests."""
    turnstile = os.path.join(folder, "msbridge-turnstile.lock")
    machine = os.path.join(folder, "msbridge-machine.lock")
    with contextlib.ExitStack() as held:
        with _flock(turnstile, fcntl.LOCK_EX):
            held.enter_context(_flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield


class Turns:
    """One worker's turns on the machine (in ``folder``), a test at a time; an ``alone`` turn is kept, not given
    back, when the worker's next test is ``alone`` too."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._kept: Optional[contextlib.ExitStack] = None

    @contextlib.contextmanager
    def test(self, alone: bool, next_alone: bool) -> Iterator[None]:
        """The turn for one test: the one kept from the previous test, or a new one."""
        if self._kept is None:
            self._kept = contextlib.ExitStack()
            self._kept.enter_context(machine_turn(self.folder, alone))
        try:
            yield
        finally:
            if not (alone and next_alone):
                kept, self._kept = self._kept, None
                kept.close()
