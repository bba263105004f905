"""Which rank this process is, decided once when the sinks are built.

Read from ``mindspore.communication`` when it is initialised, otherwise from
``RANK_ID`` / ``RANK_SIZE`` (what ``msrun`` exports), otherwise a single process.

Example:
    >>> ranks = detect_ranks()
    >>> ranks.rank, ranks.world_size, ranks.is_global
    (0, 1, True)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import ConfigError


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
    try:
        from mindspore.communication import GlobalComm, get_group_size, get_rank
    except ImportError:  # pragma: no cover - mindspore is a hard dependency
        return None
    if not getattr(GlobalComm, "INITED", False):
        return None
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


def detect_ranks(env: Optional[Mapping[str, str]] = None) -> Ranks:
    """This process's rank and the world size, checked for contradictions."""
    ranks = _from_communication() or _from_env(os.environ if env is None else env) or Ranks(0, 1, "single")
    if ranks.world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {ranks.world_size} (from {ranks.source})")
    if not 0 <= ranks.rank < ranks.world_size:
        raise ConfigError(
            f"rank {ranks.rank} is outside world size {ranks.world_size} (from {ranks.source}); "
            "check RANK_ID and RANK_SIZE"
        )
    return ranks
