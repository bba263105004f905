"""``AlertSink``: the alert sender as a sink, so it receives every event every other sink receives.

``msbridge.run.plan`` adds it (last, after every other sink) when ``alerts.targets`` is set; it is not
named under ``sinks:``. Being a sink gives it, with no new plumbing: every health event, the stall
watchdog's ``stall``/``resumed`` (submitted to the dispatcher), the ``gap`` a sink returns, the run's end
status in ``close``, and, as an observer (``Sink.observer``), every other sink's final ``undelivered`` in
``observe``: the dispatcher hands it over once every other sink closed or hit its bound, before this close.
``write`` runs on its own host thread and only queues: the ``Sender`` thread does the HTTP. What it could not send is kept in
the outbox and named in ``undelivered()``, so the run's outcome says ``msbridge replay RUN_DIR --to alerts``.

Example:
    >>> sink = AlertSink(AlertSpec.parse({"targets": [{"type": "webhook", "url": "https://ops/hook"}]}))
    >>> dispatcher = Dispatcher([JsonlSink(), sink], run)   # plan_run does this
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

from ..sinks.base import FAILED, KILLED, Event, Record, Sink
from .delivery import Sender
from .message import FAILED_RUN, RUN_END, UNDELIVERED, Alert, alert_for, run_end_alert
from .outbox import Outbox
from .policy import Policy
from .spec import AlertSpec

#: Events that say why a run failed; the last one is the ``failed`` alert's cause.
_CAUSES = ("exception", "collective_timeout", "interrupt", "job_stop", "action", "stall")


class AlertSink(Sink):
    """Sends alerts for the events ``alerts.on`` names, from its own thread.

    Args:
        spec: the ``alerts`` section.
        config_file: the config file the run was started with (kept in the outbox for the replay).
        backoff_s: the first retry's wait (tests shorten it).

    Example:
        >>> AlertSink(spec, config_file="monitor.yaml")
    """

    name = "alerts"
    ranks = "all"
    observer = True

    def __init__(self, spec: AlertSpec, config_file: str = "", backoff_s: float = 1.0) -> None:
        super().__init__()
        self.spec, self.config_file, self.backoff_s = spec, config_file, backoff_s
        self._lost: Dict[str, str] = {}  # ``observe``: the other sinks' final undelivered
        self.policy: Optional[Policy] = None
        self.sender: Optional[Sender] = None
        self._cause: Optional[Event] = None
        self._step = 0
        self._kept = ""  # ``undelivered()``

    def describe(self, run) -> dict:
        return {"where": f"{len(self.spec.targets)} alert target(s): "
                         f"{', '.join(t.label for t in self.spec.targets)} (on: {', '.join(sorted(self.spec.on))})"}

    def open(self, run) -> None:
        super().open(run)
        self.policy = Policy(self.spec.on, self.spec.window_s, run.is_global, world_size=run.world_size)
        self.outbox = Outbox(run.run_dir, run.rank, self.config_file)
        self.sender = Sender(self.spec.targets, self.spec.retries, self.spec.timeout_s, self.outbox,
                             backoff_s=self.backoff_s)
        self.sender.start(spec_for_outbox=self.spec)  # an earlier start's kept alerts go out first

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        if records:
            self._step = max(self._step, records[-1].step)
        for event in events:
            self._step = max(self._step, event.step)
            if event.kind in _CAUSES:
                self._cause = event
            cat = self.policy.wants(event)
            if cat is not None:
                self._offer(alert_for(event, cat, self.run))

    def _offer(self, alert: Alert) -> None:
        admitted = self.policy.admit(alert)
        if admitted is not None:
            self.sender.submit(admitted)

    def observe(self, undelivered: Mapping[str, str]) -> None:
        """The other sinks' final ``undelivered``: one ``undelivered`` alert at close when any lacks something."""
        self._lost = dict(undelivered)

    def close(self, status: str = "FINISHED") -> None:
        """The run-end alerts, the held ones ("and N more"), then a bounded wait for the sender."""
        if self.sender is None:
            return
        if status in (FAILED, KILLED) and self.policy.allows(FAILED_RUN):
            self._offer(run_end_alert(self.run, status, self._step, FAILED_RUN, self._cause))
        elif self.policy.allows(RUN_END):
            self._offer(run_end_alert(self.run, status, self._step, RUN_END, self._cause))
        lost = "; ".join(f"{name}: {what}" for name, what in self._lost.items() if what)
        if lost and self.policy.allows(UNDELIVERED):
            self._offer(run_end_alert(self.run, status, self._step, UNDELIVERED, lost=lost))
        for alert in self.policy.held():
            self.sender.submit(alert)
        sender, self.sender = self.sender, None
        sender.close(self.spec.close_wait_s)
        kept = len(self.outbox)  # also what an earlier start left and could not send either
        if kept:
            self._kept = f"{kept} alert(s) kept in {self.outbox.path}"

    def undelivered(self) -> str:
        return self._kept
