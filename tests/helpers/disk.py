"""Full disks for the fault tests: a real small tmpfs (as root), and a file-system shim everywhere.

Example:
    >>> with small_tmpfs(tmp_path / "disk") as disk:   # skips the test when not root
    ...     filler = fill(disk)                          # the disk is full now
    ...     os.remove(filler)                            # space is back
    >>> shim = DiskShim(monkeypatch, tmp_path)         # writes under tmp_path see ``shim.space`` bytes
    >>> shim.space = 0                                   # ENOSPC from now on, after a short write
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "3m") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path`` for the block; skips the test when it cannot mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the file-system shim tests cover ENOSPC without it")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` with one file, to the last byte; returns it (remove it to free the space)."""
    path = folder / ".filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = b"\0" * 65536
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    return path
                block = block[:len(block) // 2]
    finally:
        os.close(fd)


class DiskShim:
    """``os.write`` / ``os.fsync`` as a disk with ``space`` bytes left for files under ``root``.

    ``space=None`` is unlimited. A write bigger than the space left writes what fits and returns that
    count (a short write); the next one raises ``OSError(error)``. ``fsync_errors`` makes that many
    fsyncs raise EIO. Other files are untouched.
    """

    def __init__(self, monkeypatch: Any, root: Path, error: int = errno.ENOSPC) -> None:
        self.root, self.error = str(root), error
        self.space: Optional[int] = None
        self.fsync_errors = 0
        self.failures = 0
        self._write, self._fsync = os.write, os.fsync
        monkeypatch.setattr(os, "write", self.write)
        monkeypatch.setattr(os, "fsync", self.fsync)

    def _ours(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(self.root)
        except OSError:
            return False

    def write(self, fd: int, data: Any) -> int:
        space = self.space  # once: a test sets it on another thread
        if space is None or not self._ours(fd):
            return self._write(fd, data)
        if space == 0:
            self.failures += 1
            raise OSError(self.error, os.strerror(self.error))
        n = self._write(fd, bytes(data[:space]))
        self.space = space - n
        return n

    def fsync(self, fd: int) -> None:
        if self.fsync_errors and self._ours(fd):
            self.fsync_errors -= 1
            self.failures += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._fsync(fd)


def parse_lines(path: Path) -> List[Dict[str, Any]]:
    """Every line of a jsonl file as JSON, asserting each is one complete object (0 malformed lines)."""
    data = Path(path).read_bytes()
    assert data.endswith(b"\n"), f"{path}: the last line is not complete"
    out = []
    for number, line in enumerate(data.decode("utf-8").split("\n")[:-1], 1):
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"{path}:{number}: malformed line {line[:120]!r}") from None
        assert isinstance(obj, dict), f"{path}:{number}: not an object"
        out.append(obj)
    return out


def steps_and_gaps(lines: List[Dict[str, Any]]) -> Tuple[List[int], List[Dict[str, Any]]]:
    """The metrics steps of a parsed log, in file order, and the details of its ``gap`` events."""
    steps = [line["step"] for line in lines if line["type"] == "metrics"]
    gaps = [line["detail"] for line in lines if line["type"] == "event" and line["kind"] == "gap"]
    return steps, gaps


def assert_covered(lines: List[Dict[str, Any]], expected: List[int]) -> List[Dict[str, Any]]:
    """Every expected step is in the log exactly once or inside a gap event's step range; returns the gaps."""
    steps, gaps = steps_and_gaps(lines)
    assert lines[0]["type"] == "header" and sum(line["type"] == "header" for line in lines) == 1
    assert len(steps) == len(set(steps)), "a step written twice"
    assert steps == sorted(steps), "steps out of order"
    missing = sorted(set(expected) - set(steps))
    uncovered = [s for s in missing if not any(g["first_step"] <= s <= g["last_step"] for g in gaps)]
    assert not uncovered, f"steps lost without a gap event: {uncovered[:20]}"
    assert sum(g["records"] for g in gaps) == len(missing), "a gap counts exactly the records it lost"
    return gaps
