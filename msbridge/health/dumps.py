"""Anomaly dumps: one directory per anomaly, rate-limited per check, capped by a disk quota.

A dump is written whole or not at all: its files are serialized in memory
first, so its size is known before anything touches the disk. It is refused
(and nothing is written) when

- the same check was dumped less than ``every_steps`` steps ago (``rate_limited``);
- the dump directory would grow past ``quota_mb`` (``quota``; the directory is
  measured at every attempt, so other ranks' dumps and a clean-up count);
- the disk would keep less than ``min_free_mb`` free (``disk_full``).

The files go to a hidden temporary directory that is renamed into place, so a
reader (or a killed process) never sees half a dump. msbridge never fills a disk.

Layout::

    {dump_dir}/step{step:09d}-rank{rank}-{check}/
        anomaly.json     what fired, the action, the thresholds
        window.jsonl     the last records before it (same lines as the jsonl sink)
        config.json      the resolved config, secrets masked
        batch.npz        the step's input batch (opt-in: health.dump_batch)

Example:
    >>> dumps = DumpWriter("runs/r1/dumps", rank=0, quota_mb=512, min_free_mb=1, every_steps=100)
    >>> result = dumps.write("nonfinite", 3700, {"anomaly.json": b"{}"})
    >>> result.status, result.path
    ('written', 'runs/r1/dumps/step000003700-rank0-nonfinite')
    >>> dumps.write("nonfinite", 3750, {"anomaly.json": b"{}"}).status  # within every_steps of the last one
    'rate_limited'
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

log = logging.getLogger("msbridge")

WRITTEN, RATE_LIMITED, QUOTA, DISK_FULL, ERROR = "written", "rate_limited", "quota", "disk_full", "error"
_MB = 1024 * 1024


@dataclass(frozen=True)
class DumpResult:
    """How a dump attempt went: ``status`` is one of written, rate_limited, quota, disk_full, error.

    Example:
        >>> DumpResult("quota", None, 4096, "dumps holds 512 MB; this dump (0.004 MB) would pass the quota").status
        'quota'
    """

    status: str
    path: Optional[str] = None
    size_bytes: int = 0
    reason: str = ""


def _mb(size: float) -> str:
    return f"{size / _MB:.3g} MB"


def directory_size(path: str) -> int:
    """Bytes in the files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed while we walked
                pass
    return total


class DumpWriter:
    """Writes anomaly dump directories under ``root`` within a rate limit and a disk quota.

    Args:
        root: the dump directory (created on the first dump).
        rank: this process's rank, part of every dump's name.
        quota_mb: the most the whole dump directory may hold.
        min_free_mb: free space the disk must keep after a dump.
        every_steps: at most one dump per check per this many steps.

    Example:
        >>> writer = DumpWriter("runs/r1/dumps", rank=0, quota_mb=512, min_free_mb=1024, every_steps=100)
    """

    def __init__(self, root: str, rank: int, quota_mb: float, min_free_mb: float, every_steps: int) -> None:
        self.root = root
        self.rank = rank
        self.quota_bytes = int(quota_mb * _MB)
        self.min_free_bytes = int(min_free_mb * _MB)
        self.every_steps = every_steps
        self.refused: Dict[str, int] = {}
        self._last: Dict[str, int] = {}

    def write(self, check: str, step: int, files: Mapping[str, bytes]) -> DumpResult:
        """Write one dump of ``files`` (name -> bytes) for ``check`` at ``step``, or say why not."""
        last = self._last.get(check)
        if last is not None and step - last < self.every_steps:
            return self._refuse(RATE_LIMITED, f"{check} was dumped at step {last}; "
                                              f"at most one per {self.every_steps} steps")
        size = sum(len(data) for data in files.values())
        used = directory_size(self.root)
        if used + size > self.quota_bytes:
            return self._refuse(QUOTA, f"{self.root} holds {_mb(used)}; this dump ({_mb(size)}) would pass "
                                       f"the quota of {_mb(self.quota_bytes)}", size)
        try:
            os.makedirs(self.root, exist_ok=True)
            free = shutil.disk_usage(self.root).free
            if free - size < self.min_free_bytes:
                return self._refuse(DISK_FULL, f"the disk of {self.root} has {_mb(free)} free; "
                                               f"a dump must leave {_mb(self.min_free_bytes)}", size)
            path = self._place(check, step, files)
        except OSError as exc:
            log.error("msbridge: could not write the %s dump at step %d: %s", check, step, exc)
            return self._refuse(ERROR, f"{type(exc).__name__}: {exc}", size)
        self._last[check] = step
        return DumpResult(WRITTEN, path, size)

    def _place(self, check: str, step: int, files: Mapping[str, bytes]) -> str:
        name = f"step{step:09d}-rank{self.rank}-{check}"
        final = os.path.join(self.root, name)
        n = 1
        while os.path.exists(final):  # a resumed run that fires again at the same step
            n += 1
            final = os.path.join(self.root, f"{name}-{n}")
        tmp = os.path.join(self.root, f".tmp-{os.path.basename(final)}-{os.getpid()}")
        os.makedirs(tmp)
        try:
            for filename, data in files.items():
                with open(os.path.join(tmp, filename), "wb") as fh:
                    fh.write(data)
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _refuse(self, status: str, reason: str, size: int = 0) -> DumpResult:
        self.refused[status] = self.refused.get(status, 0) + 1
        return DumpResult(status, None, size, reason)
