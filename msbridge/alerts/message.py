"""What an alert says: ``Alert`` (run, step, what happened, the values that matter, where to look), built
from the events msbridge records, and which ``on`` name each event alerts under.

The same ``Alert`` becomes every target's message (``msbridge.alerts.formats``) and the generic webhook's
JSON payload, so a Slack message and a DingTalk one say the same thing.

Example:
    >>> event = Event("anomaly", 20, 0, 1.7e9, {"check": "nonfinite", "nonfinite": ["train/loss"], "loss": "nan"})
    >>> category(event)
    'nonfinite'
    >>> run_info = RunInfo("id1", "run-1", "tiny-lm", rank=0, world_size=1, is_global=True, run_dir="runs/run-1")
    >>> alert_for(event, "nonfinite", run_info).message
    'non-finite values at step 20 on rank 0: train/loss'
"""
from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Mapping, Optional

from ..masking import mask_secrets
from ..paths import view_commands
from ..sinks.base import Event, RunInfo, json_safe

#: The stall watchdog's event kinds (``msbridge.run.watchdog``).
STALL, RESUMED = "stall", "resumed"
#: The kinds of run-end alerts (built at close, not from an event).
FAILED_RUN, RUN_END, UNDELIVERED, TEST = "failed", "end", "undelivered", "test"

_CHECKS = {"nonfinite": "nonfinite", "loss_spike": "spike", "grad_norm_spike": "spike", "plateau": "plateau",
           "throughput_drop": "throughput_drop"}
_STOP_ACTIONS = ("stop", "checkpoint_and_stop")


def category(event: Event) -> Optional[str]:
    """The ``alerts.on`` name ``event`` alerts under, or None (it never alerts)."""
    kind, detail = event.kind, event.detail
    if kind in ("anomaly", "blame"):
        return _CHECKS.get(str(detail.get("check")))
    if kind == "action" and detail.get("action") in _STOP_ACTIONS or kind in ("job_stop", "early_stop"):
        return "stop"
    if kind in (STALL, RESUMED):
        return "stall"
    if kind == "straggler":
        return "straggler"
    if kind == "gap":
        return UNDELIVERED
    return None


@dataclass(frozen=True)
class Alert:
    """One alert, as the generic webhook's JSON payload holds it.

    Attributes:
        run / experiment / rank / step: where it happened.
        kind: the event kind (``anomaly``, ``stall``, ``failed`` ...); ``category``: its ``alerts.on`` name.
        title: one short line; ``message``: what happened, in words.
        values: the numbers that matter (loss, grad norm, seconds since the last step ...).
        links: how to look at it: the ``view``, ``plot``, ``diagnose`` commands the run README prints, ``run_dir``.
        more: how many alerts of this category the rate limit held back before this one.

    Example:
        >>> Alert("run-1", "tiny-lm", 0, 20, "anomaly", "nonfinite", "NaN", "non-finite loss", {"loss": "nan"}).values
        {'loss': 'nan'}
    """

    run: str
    experiment: str
    rank: int
    step: int
    kind: str
    category: str
    title: str
    message: str
    values: Mapping[str, Any] = field(default_factory=dict)
    links: Mapping[str, str] = field(default_factory=dict)
    time: float = 0.0
    more: int = 0

    def payload(self) -> Dict[str, Any]:
        """The generic webhook's JSON body (docs/alerts.md documents it), secrets masked."""
        return mask_secrets(json_safe(asdict(self)))

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> "Alert":
        """Back from ``payload()`` (the outbox holds alerts so)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def with_more(self, more: int) -> "Alert":
        """A copy that says ``more`` alerts of its category were held back by the rate limit."""
        return Alert(**{**asdict(self), "more": more})

    def text_lines(self) -> list:
        """The body as plain lines: message, values, where to look (every format builds on these)."""
        lines = [self.message]
        if self.more:
            lines.append(f"and {self.more} more {self.category} alert(s) held back by the rate limit")
        lines += [f"{key}: {_short(value)}" for key, value in self.values.items()]
        lines += [f"{name}: {where}" for name, where in self.links.items()]
        return lines


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def links_for(run: RunInfo) -> Dict[str, str]:
    """The commands that show the run, as its README prints them (they run as printed on the training host):
    ``view`` (when a viewed sink is configured), ``plot`` (with matplotlib), ``diagnose``; and ``run_dir``."""
    commands = view_commands(run.run_dir, run.config.get("sinks") or {})
    return {**{shlex.split(command)[-2]: command for command in commands}, "run_dir": run.run_dir}


def _values(detail: Mapping[str, Any]) -> Dict[str, Any]:
    """The scalar and short-list details of an event: the values a person on call reads."""
    out = {}
    for key, value in detail.items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            out[str(key)] = value
        elif isinstance(value, (list, tuple)) and len(value) <= 8 and \
                all(isinstance(v, (int, float, str)) for v in value):
            out[str(key)] = ", ".join(map(str, value))
    return json_safe(out)


def describe(event: Event, cat: str) -> str:
    """What happened, in one sentence."""
    d, where = event.detail, f"at step {event.step} on rank {event.rank}"
    if event.kind == "blame":  # the global rank names the rank that was first, of every rank's findings
        what = "non-finite values" if cat == "nonfinite" else str(d.get("check", cat))
        return (f"{what} at step {event.step}, first on rank {d.get('blamed_rank', '?')} "
                f"(ranks at that step: {', '.join(map(str, d.get('same_step_ranks') or [])) or '?'})")
    if cat == "nonfinite":
        names = d.get("nonfinite") or ["a metric"]
        return f"non-finite values {where}: {', '.join(map(str, names))}"
    if event.kind == STALL:
        return (f"no step has ended for {float(d.get('seconds_since_step', 0)):.0f} s on rank {event.rank} "
                f"(last step {event.step}; last seen {d.get('doing', 'unknown')})")
    if event.kind == RESUMED:
        stalled = float(d.get("stalled_s", 0))
        return f"steps resumed on rank {event.rank} at step {event.step} after a {stalled:.0f} s stall"
    if cat == "stop":
        why = d.get("reason") or d.get("check") or event.kind
        return f"training stopped {where}: {why}"
    if cat == "straggler":
        return f"rank {d.get('straggler_rank', '?')} is a straggler (reported {where})"
    if cat == UNDELIVERED:
        return f"sink {d.get('sink', '?')} lost data: {d.get('reason', 'see the run README')}"
    return f"{d.get('check', event.kind)} {where}"


def alert_for(event: Event, cat: str, run: RunInfo) -> Alert:
    """The alert of one event of category ``cat``."""
    title = {"nonfinite": "NaN/Inf in training", "stop": "training stopped", "spike": "spike",
             "plateau": "loss plateau", "throughput_drop": "throughput drop", "straggler": "straggler rank",
             UNDELIVERED: "a sink gave up"}.get(cat, cat)
    if event.kind == STALL:
        title = "training stalled"
    elif event.kind == RESUMED:
        title = "training resumed"
    return Alert(run.run_name, run.experiment, event.rank, event.step, event.kind, cat,
                 f"msbridge: {title} in {run.run_name}", describe(event, cat), _values(event.detail),
                 links_for(run), event.time or time.time())


def run_end_alert(run: RunInfo, status: str, step: int, cat: str, cause: Optional[Event] = None,
                  lost: str = "") -> Alert:
    """The alert of the run's end (``failed``, ``end``) or of sinks that gave up at close (``undelivered``)."""
    values: Dict[str, Any] = {"status": status}
    if cause is not None:
        values.update({"cause": cause.kind, **_values(cause.detail)})
    if cat == UNDELIVERED:
        title, message = "a sink gave up", f"not delivered at close: {lost}"
    else:
        title = f"run ended {status}"
        message = f"the run ended {status} after step {step}" + (f" ({cause.kind})" if cause is not None else "")
    return Alert(run.run_name, run.experiment, run.rank, step, cat, cat, f"msbridge: {title} in {run.run_name}",
                 message, values, links_for(run), time.time())


def sample_alert(run_name: str, experiment: str) -> Alert:
    """What ``msbridge alert test`` sends."""
    return Alert(run_name, experiment, 0, 0, TEST, TEST, "msbridge: test alert",
                 "this is a test message from `msbridge alert test`: this target receives msbridge alerts",
                 {}, {}, time.time())
