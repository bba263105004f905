"""Process groups and ports on 127.0.0.1: what starts and stops a local server (``msbridge view``'s viewers, the
bench's ``mlflow server`` and PostgreSQL, the tests' servers).

A server started with ``start_new_session=True`` leads a process group of its own (its pgid is its pid), so
it and every process it starts end together.

Example:
    >>> import subprocess, sys
    >>> proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    >>> group_alive(proc.pid)
    True
    >>> stop_group(proc.pid); proc.wait() != 0 and not group_alive(proc.pid)
    True
    >>> 1024 <= free_port() <= 65535
    True
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from typing import Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (a zombie waiting for its reaper does not count)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(pgid: int, signals: Sequence[int] = (signal.SIGTERM, signal.SIGKILL), wait_s: float = 15.0) -> None:
    """Send each signal in turn to the group until none of it is left, waiting up to ``wait_s`` after each."""
    for sig in signals:
        if not group_alive(pgid):
            return
        with contextlib.suppress(ProcessLookupError):  # the group ended in between
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
