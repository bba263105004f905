"""The one collective msbridge uses, and a watchdog on it.

``all_gather``/``gather_op``: AllGather over the world group, one row per rank.
``Watchdog`` says what is stuck when a rank never arrives (a collective stuck
in C++ cannot be interrupted from Python).

Example:
    >>> with Watchdog(60.0).guard("the per-flush reduction"):
    ...     table = all_gather(gather_op(), payload)
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np

log = logging.getLogger("msbridge")

DEFAULT_TIMEOUT_S = 60.0


def all_gather(op: Any, array: np.ndarray) -> np.ndarray:
    """Every rank's ``array`` as one row each (world group). Blocks until all ranks have called it."""
    from mindspore import Tensor

    return op(Tensor(array)).asnumpy().reshape(-1, array.size)


def gather_op() -> Any:
    """A new ``ops.AllGather`` over the world group, for ``all_gather`` (MindSpore is imported here, on first use).

    Call it after ``mindspore.communication.init()``; ``Reducer`` makes one and reuses it at every flush.
    """
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


def communication_ready() -> bool:
    """True when ``mindspore.communication.init()`` has run in this process."""
    try:
        from mindspore.communication import GlobalComm
    except ImportError:  # pragma: no cover - mindspore is a hard dependency
        return False
    return bool(getattr(GlobalComm, "INITED", False))
