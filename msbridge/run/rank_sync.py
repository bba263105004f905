"""What ranks agree on outside the metric stream: the run's shared timestamp, and a watchdog for collectives.

``all_gather``/``gather_op`` are the one collective msbridge uses (AllGather over
the world group); ``Watchdog`` says what is stuck when a rank never arrives.

Example:
    >>> agree_timestamp(detect_ranks(), needed=True)
    '20261129-101500'
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ..paths import timestamp
from .ranks import Ranks

log = logging.getLogger("msbridge")

TIMESTAMP_ENV = "MSBRIDGE_TIMESTAMP"
DEFAULT_TIMEOUT_S = 60.0


def all_gather(op: Any, array: np.ndarray) -> np.ndarray:
    """Every rank's ``array`` as one row each (world group). Blocks until all ranks have called it."""
    from mindspore import Tensor

    return op(Tensor(array)).asnumpy().reshape(-1, array.size)


def gather_op() -> Any:
    from mindspore import ops

    return ops.AllGather()


class Watchdog:
    """Calls ``on_timeout(subject)`` from a timer thread when a guarded call outlives ``timeout_s``.

    A collective stuck in C++ cannot be interrupted from Python (no exception,
    no signal handler runs), so the watchdog cannot end the call: it says what
    is stuck and hands the hook what it needs to save the run. A call that
    returns after the timeout fired is logged as such.

    Example:
        >>> dog = Watchdog(60.0, lambda window: dispatcher.close("FAILED"))
        >>> with dog.guard("the cross-rank loss reduction for steps 11-15", window):
        ...     table = all_gather(payload)
    """

    def __init__(self, timeout_s: float, on_timeout: Optional[Callable[[Any], None]] = None) -> None:
        self.timeout_s = float(timeout_s)
        self.on_timeout = on_timeout

    @contextlib.contextmanager
    def guard(self, what: str, subject: Any = None) -> Iterator[None]:
        fired = threading.Event()
        start = time.monotonic()

        def expire() -> None:
            fired.set()
            log.error("msbridge: %s has not returned after %.0f s: a rank has died or hangs, or never reached "
                      "this collective (BridgeMonitor must run on every rank, with the same flush_steps)",
                      what, self.timeout_s)
            if self.on_timeout is not None:
                try:
                    self.on_timeout(subject)
                except Exception:  # the hook runs on a timer thread: log, never raise into nothing
                    log.exception("msbridge: the collective-timeout hook failed")

        timer = threading.Timer(self.timeout_s, expire)
        timer.name, timer.daemon = "msbridge-watchdog", True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            if fired.is_set():
                log.warning("msbridge: %s returned after %.1f s, after its %.0f s timeout had fired",
                            what, time.monotonic() - start, self.timeout_s)


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
