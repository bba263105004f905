"""Which rank this process is, decided once when the sinks are built, and its claim on its rank files.

Read from ``mindspore.communication`` when it is initialised, otherwise from
``RANK_ID`` / ``RANK_SIZE`` (what ``msrun`` exports), otherwise a single process.
A rank outside the world size, or a communication rank that contradicts
``RANK_ID`` / ``RANK_SIZE``, is a ``ConfigError`` before training.

Two processes that would write the same rank's files (a duplicated ``RANK_ID``,
two jobs started with one fixed run name) are refused: each rank holds an
advisory lock on ``{run_dir}/.msbridge-rank_{r}.lock`` for the life of the process.

Example:
    >>> ranks = detect_ranks()
    >>> ranks.rank, ranks.world_size, ranks.is_global
    (0, 1, True)
    >>> claim_rank_file("/runs/exp/run-1", ranks.rank)
    '/runs/exp/run-1/.msbridge-rank_0.lock'
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from ..capture.collective import communication_ready
from ..errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, duplicates go undetected
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("msbridge")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job."""

    rank: int
    world_size: int
    source: str  # "communication", "env" or "single"

    @property
    def is_global(self) -> bool:
        """True on the one rank that writes global metrics and talks to trackers."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _from_communication() -> Optional[Ranks]:
    if not communication_ready():
        return None
    from mindspore.communication import get_group_size, get_rank

    return Ranks(rank=int(get_rank()), world_size=int(get_group_size()), source="communication")


def _int_env(env: Mapping[str, str], name: str) -> Optional[int]:
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def _from_env(env: Mapping[str, str]) -> Optional[Ranks]:
    rank = _int_env(env, "RANK_ID")
    size = _int_env(env, "RANK_SIZE")
    if size is None:
        size = _int_env(env, "MS_WORKER_NUM")
    if rank is None and size is None:
        return None
    rank = 0 if rank is None else rank
    size = 1 if size is None else size
    return Ranks(rank=rank, world_size=size, source="env")


def _check_agrees(comm: Ranks, env: Mapping[str, str]) -> None:
    """The communication group and the launcher's RANK_ID / RANK_SIZE must describe one job."""
    for name, what, value in (("RANK_ID", "rank", comm.rank), ("RANK_SIZE", "world size", comm.world_size)):
        declared = _int_env(env, name)
        if declared is not None and declared != value:
            raise ConfigError(
                f"mindspore.communication says {what} {value}, but the environment has {name}={declared}; "
                "the launcher and the job disagree "
                "(a stale RANK_ID/RANK_SIZE exported in the shell?)"
            )


def detect_ranks(env: Optional[Mapping[str, str]] = None) -> Ranks:
    """This process's rank and the world size, checked for contradictions."""
    env = os.environ if env is None else env
    comm = _from_communication()
    if comm is not None:
        _check_agrees(comm, env)
    ranks = comm or _from_env(env) or Ranks(0, 1, "single")
    if ranks.world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {ranks.world_size} (from {ranks.source})")
    if not 0 <= ranks.rank < ranks.world_size:
        raise ConfigError(
            f"rank {ranks.rank} is outside world size {ranks.world_size} (from {ranks.source}); "
            "check RANK_ID and RANK_SIZE"
        )
    return ranks


#: Lock files this process holds, by path (the open file keeps the lock).
_HELD: Dict[str, int] = {}


def lock_path(run_dir: str, rank: int) -> str:
    """The lock file ``claim_rank_file`` holds for ``rank`` in ``run_dir``.

    Example:
        >>> lock_path("/runs/exp/run-1", 3)
        '/runs/exp/run-1/.msbridge-rank_3.lock'
    """
    return os.path.join(run_dir, f".msbridge-rank_{rank}.lock")


def claim_rank_file(run_dir: str, rank: int) -> str:
    """Lock ``.msbridge-rank_{rank}.lock`` in ``run_dir`` for this process, or raise ``ConfigError`` naming the holder.

    The lock is a kernel advisory lock (``fcntl.lockf``): it is held exactly as long
    as the holding process lives, so a crashed or killed run never leaves a stale
    lock behind, and on NFS it is seen from every host. The file itself records
    the holder's pid and host for the error message. A second claim from the same
    process (a resumed run in one notebook) succeeds.
    """
    path = lock_path(run_dir, rank)
    if path in _HELD or fcntl is None:
        return path
    os.makedirs(run_dir, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):  # another live process holds it
            raise ConfigError(
                f"rank {rank}'s files in {run_dir} are in use by {_holder(path)}; two processes would write "
                "one rank's metrics (a duplicated RANK_ID, or two jobs with the same fixed run_name). "
                "Give each job its own run_name/output_dir and each process its own RANK_ID"
            ) from None
        log.warning("msbridge: cannot lock %s (%s); duplicated ranks will not be detected on this filesystem",
                    path, exc.strerror or exc)
        return path
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
    _HELD[path] = fd
    return path


def release_rank_file(run_dir: str, rank: int) -> None:
    """Give the lock back (at the end of a run); a no-op when this process does not hold it."""
    fd = _HELD.pop(lock_path(run_dir, rank), None)
    if fd is not None:
        os.close(fd)


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            info = json.load(fh)
        return f"pid {info['pid']} on host {info['host']}"
    except (OSError, ValueError, KeyError):
        return "another process"
