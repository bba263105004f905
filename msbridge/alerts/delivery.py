"""Sends alerts from a thread of its own, with the standard library only (``urllib.request``).

The training thread never sends: the alert sink's ``write`` (on its own host thread) puts an alert on
``Sender``'s queue and returns. The sender thread sleeps on that queue while idle, posts each alert to
every target with bounded retries (backoff 1, 2, 4 ... s, slept on an Event the close cuts short) and keeps
what still fails in the run's outbox. ``close`` waits ``wait_s`` at most; what is still queued or being sent
then goes to the outbox too (a request that answers after that may arrive twice: delivery is at least once).

Nothing here logs a URL: targets are named ``target 1 (lark)``.

Example:
    >>> sender = Sender(spec.targets, retries=3, timeout_s=10, outbox=Outbox(run_dir))
    >>> sender.start()
    >>> sender.submit(alert)      # returns at once
    >>> sender.close(wait_s=10)   # bounded
"""
from __future__ import annotations

import logging
import queue
import threading
import urllib.error
import urllib.request
from typing import List, Optional, Sequence, Tuple

from ..masking import mask_text
from .formats import build_request, refusal
from .message import Alert
from .outbox import Outbox, resend
from .spec import AlertSpec, Target

log = logging.getLogger("msbridge")

_STOP = object()
_RESEND = object()
#: Most bytes of an answer read (the bots answer a few dozen).
_ANSWER_BYTES = 65536


def post(target: Target, alert: Alert, timeout_s: float) -> Optional[str]:
    """POST ``alert`` to ``target`` once; None when it was accepted, else why not (no URL in it)."""
    url, body, headers = build_request(target, alert)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 (http/https checked)
            return refusal(target, answer.status, answer.read(_ANSWER_BYTES))
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} {exc.reason}"
    except urllib.error.URLError as exc:
        return mask_text(f"not reachable: {exc.reason}")
    except (OSError, ValueError) as exc:  # a timeout while reading, a reset connection, a malformed URL
        return mask_text(f"{type(exc).__name__}: {exc}")


def deliver(target: Target, alert: Alert, retries: int, timeout_s: float,
            stop: Optional[threading.Event] = None, backoff_s: float = 1.0) -> Optional[str]:
    """``post`` with up to ``retries`` retries (backoff doubling from ``backoff_s``); the last error, or None."""
    stop = stop or threading.Event()
    error = None
    for attempt in range(retries + 1):
        error = post(target, alert, timeout_s)
        if error is None:
            return None
        if attempt < retries and stop.wait(backoff_s * 2 ** attempt):
            break  # the close is waiting: keep it in the outbox instead
    return error


class Sender:
    """One daemon thread that sends every alert it is handed to every target.

    Args:
        targets: where alerts go.
        retries / timeout_s: per request.
        outbox: where what fails is kept (None: only logged).
        backoff_s: the first retry's wait.

    ``delivered`` lists ``(target index, alert)`` of what each target accepted.

    Example:
        >>> sender = Sender(spec.targets, 3, 10.0, Outbox(run_dir)); sender.start()
    """

    def __init__(self, targets: Sequence[Target], retries: int, timeout_s: float, outbox: Optional[Outbox],
                 backoff_s: float = 1.0, max_queued: int = 1000) -> None:
        self.targets, self.retries, self.timeout_s = tuple(targets), retries, timeout_s
        self.outbox, self.backoff_s = outbox, backoff_s
        self.delivered: List[Tuple[int, Alert]] = []
        self.kept = 0
        self._queue: "queue.Queue[object]" = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sending: Optional[Alert] = None
        self._pending_targets: List[Target] = []
        self._thread = threading.Thread(target=self._loop, name="msbridge-alerts", daemon=True)

    def start(self, spec_for_outbox: Optional[AlertSpec] = None) -> None:
        """Start the thread; with ``spec_for_outbox``, first send what an earlier start left in the outbox."""
        self._resend_spec = spec_for_outbox
        if spec_for_outbox is not None and self.outbox is not None:
            self._queue.put_nowait(_RESEND)
        self._thread.start()

    def submit(self, alert: Alert) -> None:
        """Queue ``alert`` (never blocks; a full queue keeps it in the outbox)."""
        if self._stop.is_set():
            self._keep(alert, self.targets, "the run was closing")
            return
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self._keep(alert, self.targets, "too many alerts queued")

    def close(self, wait_s: float) -> None:
        """Let the thread send what is queued for ``wait_s`` at most; keep the rest in the outbox."""
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:  # the thread is behind: wait for it as long as allowed, then keep the rest
            pass
        self._thread.join(wait_s)
        if not self._thread.is_alive():
            return
        self._stop.set()  # cuts a backoff wait short; a request in flight runs to its own timeout
        with self._lock:
            sending, targets = self._sending, list(self._pending_targets)
            self._sending = None
        if sending is not None:
            self._keep(sending, targets, f"still being sent after {wait_s:g} s at close")
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Alert):
                self._keep(item, self.targets, f"not sent within {wait_s:g} s at close")
        self._queue.put_nowait(_STOP)  # the thread ends once its request in flight does
        log.warning("msbridge: alerts: the close waited %.0f s; what was not sent is kept in %s (send it with "
                    "msbridge replay RUN_DIR --to alerts)", wait_s, self.outbox.path if self.outbox else "nowhere")

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if item is _RESEND:
                sent, left = resend(self.outbox, self._resend_spec, self._deliver)
                if sent or left:
                    log.warning("msbridge: alerts: sent %d alert(s) an earlier start could not; %d still kept",
                                sent, left)
            elif isinstance(item, Alert):
                self._send(item)

    def _send(self, alert: Alert) -> None:
        with self._lock:
            self._sending, self._pending_targets = alert, list(self.targets)
        for target in self.targets:
            error = self._deliver(target, alert)
            with self._lock:
                if self._sending is not alert:  # the close gave up waiting and kept it in the outbox
                    return
                self._pending_targets.remove(target)
            if error is not None:
                self._keep(alert, [target], error)
        with self._lock:
            self._sending = None

    def _deliver(self, target: Target, alert: Alert) -> Optional[str]:
        error = deliver(target, alert, self.retries, self.timeout_s, self._stop, self.backoff_s)
        if error is None:
            self.delivered.append((target.index, alert))
        return error

    def _keep(self, alert: Alert, targets: Sequence[Target], error: str) -> None:
        for target in targets:
            log.warning("msbridge: alerts: %s did not take the %s alert of step %d: %s", target.label,
                        alert.category, alert.step, mask_text(error))
            self.kept += 1
            if self.outbox is not None:
                self.outbox.add(target.index, target.type, alert, error)
