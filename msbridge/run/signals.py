"""Ending badly on purpose: SIGTERM, SIGHUP or SIGINT during training becomes a clean KILLED close, then the default.

Schedulers (Slurm, Kubernetes, ModelArts) stop a job with SIGTERM and, after a
grace period, SIGKILL; a person stops it with Ctrl-C (SIGINT); a closed terminal
or ssh session sends SIGHUP. Python's default for SIGTERM and SIGHUP kills the
process at once, so without a handler the window not yet
flushed, the README outcome and the sinks' final status would be lost.

``SignalGuard`` is installed at train begin (main thread only) and removed when
the monitor has closed, so it also covers the close itself:

- no other handler before it (``SIG_DFL`` for SIGTERM, Python's
  ``default_int_handler`` for SIGINT): the handler raises ``TrainingInterrupted``
  for SIGTERM, Python's own ``KeyboardInterrupt`` for SIGINT. It unwinds
  ``Model.train`` into ``BridgeMonitor.__exit__``: a final flush, every sink
  closed KILLED, README and run.json updated. ``redeliver`` then restores the
  default and sends the signal again, so the process ends the way its scheduler
  expects (killed by SIGTERM, exit status -15 / 143; by SIGHUP, -1 / 129); an uncaught
  ``KeyboardInterrupt`` ends it by SIGINT, as Python does (-2 / 130);
- a Python handler before it (MindSpore's ``OnRequestExit``, the user's own): it
  is called and left in charge of ending training; the monitor only records
  that the run was interrupted and closes KILLED when training ends;
- ``SIG_IGN`` before it: the user chose to ignore the signal (``nohup`` does, for SIGHUP);
  nothing is installed.

A signal that lands while the monitor is inside its own hook or its close
(``critical``) is held until that work is consistent (the close: every sink
closed, run.json and README final), then raised.

From its first graph run on, MindSpore's runtime replaces the process's C-level
SIGINT handler with its own, which sends the process SIGTERM: a Ctrl-C during
training therefore reaches Python, and this guard, as SIGTERM (MindSpore 2.9,
``mindspore::DefaultIntHandler``, installed again at the start of every graph run, with
no setting to turn it off: taking SIGINT back per step would hold it only between graph
runs). ``reassert`` takes SIGINT back when the
monitor's close starts, and ``restore`` leaves Python's own handler in place,
so a SIGINT during the close, or before MindSpore's first graph run, is
recorded as SIGINT, and Ctrl-C after training is Python's KeyboardInterrupt again.

Example:
    >>> guard = SignalGuard()
    >>> guard.install()              # on_train_begin
    >>> with guard.critical():       # the monitor's own step hook
    ...     buffer.append(...)
    >>> guard.restore()              # close
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Callable, Dict, Optional, Sequence

log = logging.getLogger("msbridge")

#: What ends a run KILLED: a scheduler's stop, a closed terminal or ssh session, Ctrl-C.
GUARDED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))


class TrainingInterrupted(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM or SIGHUP arrives; ``signum`` says which signal.

    Example:
        >>> TrainingInterrupted(signal.SIGTERM).signum == signal.SIGTERM
        True
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum


class SignalGuard:
    """Turns SIGTERM, SIGHUP and SIGINT into ``TrainingInterrupted`` for the duration of training.

    Args:
        signals: the signals to guard.

    Example:
        >>> guard = SignalGuard()
        >>> guard.install()
        True
        >>> guard.restore()
    """

    def __init__(self, signals: Sequence[int] = GUARDED) -> None:
        self.signals = tuple(signals)
        self.received: Optional[int] = None
        self._previous: Dict[int, Any] = {}
        self._installed = False
        self._depth = 0
        self._pending: Optional[int] = None

    def install(self) -> bool:
        """Install the handler (chaining to the previous one). False off the main thread: Python
        only lets the main thread set signal handlers."""
        if self._installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            log.info("msbridge: training runs outside the main thread; SIGTERM, SIGHUP and SIGINT keep their handlers")
            return False
        for sig in self.signals:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._handle)
        self._installed = True
        return True

    def reassert(self) -> None:
        """Take the guarded signals back where a library replaced the process's handler underneath
        Python (MindSpore's runtime does, for SIGINT). Main thread only."""
        if self._installed and threading.current_thread() is threading.main_thread():
            for sig in self._previous:
                signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back (where ours is still the one installed)."""
        if not self._installed:
            return
        self._installed = False
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    def redeliver(self, signum: int) -> None:
        """After the monitor closed: restore the handlers and, if the previous one was the default,
        deliver ``signum`` again so the process ends as it would have without msbridge."""
        self.restore()
        if _ours_to_raise(self._previous.get(signum, signal.SIG_DFL)):
            signal.raise_signal(signum)

    def interrupt_detail(self) -> Optional[Dict[str, Any]]:
        """``{"signal": "SIGTERM"}`` when a guarded signal arrived during training, else None."""
        if self.received is None:
            return None
        return {"signal": signal.Signals(self.received).name}

    def critical(self) -> "SignalGuard":
        """Hold a signal that arrives inside the ``with`` block; raise it when the block is done (plain
        ``__enter__``/``__exit__``, not a generator: the step hook enters it at every step)."""
        return self

    def __enter__(self) -> None:
        self._depth += 1

    def __exit__(self, *exc_info: Any) -> None:
        self._depth -= 1
        if not self._depth and self._pending is not None:
            signum, self._pending = self._pending, None
            _interrupt(signum)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            return  # already ending; a second SIGTERM must not cut the close short
        self.received = signum
        previous = self._previous.get(signum)
        if not _ours_to_raise(previous):
            chained: Callable[[int, Any], Any] = previous
            chained(signum, frame)
            return
        if self._depth:
            self._pending = signum
            return
        _interrupt(signum)


def _interrupt(signum: int) -> None:
    """Raise what ends training for ``signum``. SIGINT: Python's own ``KeyboardInterrupt`` (not a subclass:
    only that one, uncaught, makes the interpreter end by SIGINT)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise TrainingInterrupted(signum)


def _ours_to_raise(previous: Any) -> bool:
    """Whether the handler we replaced would have ended training anyway (the default, or SIGINT's
    KeyboardInterrupt): then ours raises ``TrainingInterrupted`` instead; otherwise it is chained."""
    return previous in (signal.SIG_DFL, None, signal.default_int_handler) or not callable(previous)
