"""The converter thread: turns drained windows into records off the training thread.

At a flush the training thread hands the window here: drained on a device (the device->host copy, the values read
once per flush), as the step rows themselves on CPU, where the outputs are in host memory. The thread
``msbridge-convert`` drains those, builds the records, checks their health and hands them to the dispatcher while
training goes on. Jobs run one at a time, in the order they were handed, so records reach the
sinks in step order. The callback uses it only where nothing it does can stop training at a step: a single
process whose checks have no stop action, outside an Optuna trial (``BridgeMonitor._begin``).

One window is in its hands at a time: a hand-off first waits for the window before it, which takes a few ms of a
flush window's ~100 steps, so the console's line of a flush is printed by the next flush at the latest, and the
windows waiting in memory are one. A job that raises is raised again on the training thread, at the next hand-off
or wait, as a flush that raised on that thread would have been.

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


class Converter:
    """Runs handed jobs in order on the daemon thread ``msbridge-convert``."""

    def __init__(self) -> None:
        self._jobs: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name="msbridge-convert", daemon=True)
        self._thread.start()

    def put(self, job: Callable[[], None]) -> None:
        """Run ``job`` once the job before it has run (raises what that one raised)."""
        self.wait()
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
