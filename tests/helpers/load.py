"""CPU-bound processes beside a test: a busy host (a data loader at full speed does the same to training).

Example:
    >>> with cpu_hogs(2):
    ...     subprocess.run([...training job...])
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator, List

#: One core's worth of pure-Python work, until killed.
HOG = "while True: pass"


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[List[subprocess.Popen]]:
    """``count`` processes each keeping a core busy at the default priority; killed (and reaped) in ``finally``."""
    hogs: List[subprocess.Popen] = []
    try:
        for _ in range(count):
            hogs.append(subprocess.Popen([sys.executable, "-c", HOG]))
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
