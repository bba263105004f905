"""The converter thread: turns drained windows into records off the training thread.

At a flush the training thread only drains (the device->host copy, the values read once per flush) and hands the
window here; the thread ``msbridge-convert`` builds its records, checks their health and hands them to the
dispatcher while training goes on. Jobs run one at a time, in the order they were handed, so records reach the
sinks in step order. The callback uses it only where nothing it does can stop training at a step: a single
process whose checks have no stop action, outside an Optuna trial (``BridgeMonitor._begin``).

A job that raises is raised again on the training thread, at the next hand-off or wait, as a flush that raised on
that thread would have been. At most ``MAX_QUEUED`` windows wait: a hand-off beyond that waits for the thread.

Example:
    >>> converter = Converter()
    >>> converter.put(lambda: print("converted"))
    >>> converter.wait()  # every job handed so far has run
    converted
    >>> converter.stop()
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Optional

#: Windows waiting for the thread before a hand-off waits for it.
MAX_QUEUED = 4


class Converter:
    """Runs handed jobs in order on the daemon thread ``msbridge-convert``."""

    def __init__(self) -> None:
        self._jobs: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue(maxsize=MAX_QUEUED)
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name="msbridge-convert", daemon=True)
        self._thread.start()

    def put(self, job: Callable[[], None]) -> None:
        """Run ``job`` after those handed before it (raises what an earlier job raised)."""
        self._raise()
        self._jobs.put(job)

    def wait(self) -> None:
        """Return once every job handed so far has run (raises what one of them raised)."""
        self._jobs.join()
        self._raise()

    def stop(self) -> None:
        """Run what is queued, then end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                job()
            except BaseException as exc:  # raised again on the training thread, which decides
                if self._error is None:
                    self._error = exc
            finally:
                self._jobs.task_done()

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error
