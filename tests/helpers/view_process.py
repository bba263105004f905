"""`msbridge view` as a user runs it: a command in a fresh shell, its URLs, then Ctrl-C.

The command runs in a session of its own, as a terminal's foreground job: the
Ctrl-C of ``interrupt`` is SIGINT to that whole group, as a terminal sends it.
While it serves, ``processes`` holds every process it started (found through
the ports of its URLs too, for a server that detached, like MindInsight's).

Example:
    >>> with ViewProcess(f"{msbridge} view {run_dir}") as view:
    ...     urls = view.wait_serving()
    ...     assert view.interrupt() == 0 and not alive(view.processes)
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from helpers.processes import family, stop_group

ROOT = Path(__file__).resolve().parents[2]
#: A fresh login shell's environment: no venv on PATH, nothing of the test run's.
FRESH_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
_URL_LINE = re.compile(r"^\s+(mlflow|tensorboard|mindinsight|optuna)\s*: (http://\S+) \(answered after \d+ s\)$")


def get(url: str, timeout: float = 30.0) -> Any:
    """GET ``url``; JSON decoded when it is JSON, else the text."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read().decode("utf-8", errors="replace")
        return json.loads(body) if "json" in resp.headers.get("Content-Type", "") else body


def base(url: str) -> str:
    """``http://host:port`` of ``url``."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class ViewProcess:
    """``bash -c COMMAND`` from the repo root with a fresh shell's environment."""

    def __init__(self, command: str, cwd: Path = ROOT) -> None:
        self.command = command
        self.proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=FRESH_ENV, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: List[str] = []
        self.processes: Set[int] = set()
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _next_line(self, deadline: float) -> Optional[str]:
        try:
            line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no output in time from {self.command!r}; so far:\n" + "\n".join(self.lines))
        if line is not None:
            self.lines.append(line)
        return line

    def wait_serving(self, timeout: float = 300.0) -> Dict[str, str]:
        """Read until the viewers serve; their URLs by name. Records the processes it started."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._next_line(deadline)
            if line is None:
                raise AssertionError(f"{self.command!r} ended ({self.proc.wait()}):\n" + "\n".join(self.lines))
            if line.startswith("[msbridge] serving"):
                break
        urls = dict(m.groups() for m in map(_URL_LINE.match, self.lines) if m)
        ports = [urllib.parse.urlsplit(url).port for url in urls.values()]
        self.processes = family(self.proc.pid, ports)
        return urls

    def interrupt(self, timeout: float = 60.0, sig: int = signal.SIGINT) -> int:
        """Ctrl-C: SIGINT to the foreground group (another ``sig``: to the command alone, as ``kill`` sends it);
        the exit code. Reads the rest of the output."""
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)  # bash -c execs a lone command: this is msbridge itself
        code = self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + 10
        while self._next_line(deadline) is not None:
            pass
        return code

    def __enter__(self) -> "ViewProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed test: leave nothing behind
            stop_group(self.proc.pid)
        for pid in self.processes:
            with contextlib.suppress(ProcessLookupError):
                stop_group(os.getpgid(pid))
