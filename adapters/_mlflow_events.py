"""A run's events in MLflow: one line each in the artifact ``events.jsonl``, and a ``.last`` tag per kind.

MLflow has no event log, so the events (anomalies, actions, checkpoints, stalls, ends ...) go into the run's
artifact ``events.jsonl`` (the jsonl log's own line format, each line once: a replay adds nothing) and each
kind's latest into the tag ``msbridge.event.<kind>.last`` (``step N: {detail}``, 500 characters).
Histograms are not events MLflow can show: they are left out, said once.

Example:
    >>> log = EventLog()
    >>> tags = log.add([Event("anomaly", 37, 0, 0.0, {"check": "loss_spike"})])
    >>> tags["msbridge.event.anomaly.last"]
    'step 37: {"check": "loss_spike"}'
"""
from __future__ import annotations

import json
import logging
from typing import Callable, Dict, Sequence

from msbridge.masking import mask_secrets
from msbridge.names import HISTOGRAM
from msbridge.sinks.base import Event, json_safe
from msbridge.sinks.runlog import encode_event

log = logging.getLogger("msbridge")

EVENTS_ARTIFACT = "events.jsonl"
MAX_EVENT_LINES = 10_000


class EventLog:
    """The lines of ``events.jsonl``, in order, each once, at most ``MAX_EVENT_LINES`` (jsonl keeps every event).

    Args:
        key: makes a tag name MLflow accepts of ``msbridge.event.<kind>.last`` (the sink's ``_key``).
    """

    def __init__(self, key: Callable[[str], str] = str) -> None:
        self.key = key
        self.lines: Dict[str, None] = {}
        self.dirty = False
        self._said_histograms = False

    def skip_histograms(self) -> None:
        """Say once that MLflow gets no histograms."""
        if not self._said_histograms:
            self._said_histograms = True
            log.info("msbridge: mlflow: MLflow cannot show histograms; the histogram events are not logged "
                     "to it (TensorBoard, MindInsight and the jsonl log keep them)")

    def add(self, events: Sequence[Event]) -> Dict[str, str]:
        """Take ``events``; returns the run tags they set."""
        tags: Dict[str, str] = {}
        for ev in events:
            if ev.kind == HISTOGRAM:
                self.skip_histograms()
                continue
            detail = mask_secrets(json_safe(dict(ev.detail)))
            text = json.dumps(detail, default=str, allow_nan=False)
            tags[self.key(f"msbridge.event.{ev.kind}.last")] = f"step {ev.step}: {text}"[:500]
            line = encode_event(Event(ev.kind, ev.step, ev.rank, ev.time, detail)).rstrip("\n")
            if line not in self.lines:
                self.lines[line] = None
                self.dirty = True
        while len(self.lines) > MAX_EVENT_LINES:
            del self.lines[next(iter(self.lines))]
        return tags

    def text(self) -> str:
        """The artifact's content; the log is clean after it."""
        self.dirty = False
        return "\n".join(self.lines) + "\n"
