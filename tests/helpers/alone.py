"""The machine shared between pytest-xdist workers (``pytest -n 2``), with a turn of its own for a test marked
``alone``: one that starts CPU-bound processes (tests/helpers/load.py), which would starve the other worker's tests
into false failures, or a process in Linux's idle class, which the other worker's training would starve.

Two ``fcntl.flock`` files in a folder the workers share: every test holds ``machine`` shared while it runs; an
``alone`` test holds it exclusively, so it starts once the other worker's current test ends, and that worker
waits before its next one. ``turnstile`` is taken first by both, so a worker running one test after another
cannot keep an ``alone`` test waiting forever. The kernel drops both when a worker dies.

Example:
    >>> with machine_turn(str(tmp_path), alone=True):
    ...     run_beside_four_busy_processes()
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator


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
    """Hold the machine (in ``folder``) exclusively if ``alone``, else shared with the other worker's tests."""
    turnstile = os.path.join(folder, "msbridge-turnstile.lock")
    machine = os.path.join(folder, "msbridge-machine.lock")
    with contextlib.ExitStack() as held:
        with _flock(turnstile, fcntl.LOCK_EX):
            held.enter_context(_flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield
