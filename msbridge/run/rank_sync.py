"""What ranks agree on before the metric stream starts: the run's shared timestamp.

Example:
    >>> agree_timestamp(detect_ranks(), needed=True)
    '20261129-101500'
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

import numpy as np

from ..capture.collective import DEFAULT_TIMEOUT_S, Watchdog, all_gather, gather_op
from ..paths import timestamp
from .ranks import Ranks

log = logging.getLogger("msbridge")

TIMESTAMP_ENV = "MSBRIDGE_TIMESTAMP"


def agree_timestamp(ranks: Ranks, needed: bool, now: Optional[float] = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The ``{timestamp}`` of the run's name and dir, the same on every rank.

    ``MSBRIDGE_TIMESTAMP`` wins when set. Otherwise, when the name uses the
    timestamp and communication is initialised, every rank takes rank 0's time
    (one AllGather of an int64); ranks known only from the environment use their
    own clock, with a warning, since ranks started in different seconds would
    then write to different run dirs.

    Example:
        >>> agree_timestamp(detect_ranks(), needed=True)
        '20261129-101500'
    """
    if os.environ.get(TIMESTAMP_ENV):
        return os.environ[TIMESTAMP_ENV]
    local = time.time() if now is None else now
    if not (needed and ranks.distributed):
        return timestamp(local)
    if ranks.source != "communication":
        log.warning("msbridge: %d ranks but mindspore.communication is not initialised yet, so the ranks cannot "
                    "agree on {timestamp} and may write to different run dirs; call init() before creating "
                    "BridgeMonitor, set %s, or use a run_name without {timestamp}", ranks.world_size, TIMESTAMP_ENV)
        return timestamp(local)
    with Watchdog(timeout_s).guard("sharing rank 0's {timestamp}"):
        table = all_gather(gather_op(), np.array([int(local)], dtype=np.int64))
    return timestamp(float(table[0, 0]))
