"""A run's events in MLflow: one line each in the artifact ``events.jsonl``, and a ``.last`` tag per kind.

MLflow has no event log, so the events (anomalies, actions, checkpoints, stalls, ends ...) go into the run's
artifact ``events.jsonl`` (the jsonl log's own line format, each line once: a replay adds nothing) and each
kind's latest into the tag ``msbridge.event.<kind>.last`` (``step N: {detail}``, 500 characters).
Histograms are not events MLflow can show: they are left out, said once. ``Backlog`` holds the records that wait
for MLflow (past its bound the sink takes no more: they are read from jsonl later) and says what MLflow may lack.

Example:
    >>> log = EventLog()
    >>> tags = log.add([Event("anomaly", 37, 0, 0.0, {"check": "loss_spike"})])
    >>> tags["msbridge.event.anomaly.last"]
    'step 37: {"check": "loss_spike"}'
"""
from __future__ import annotations

import json
import logging
from collections import deque
from typing import Callable, Deque, Dict, Optional, Sequence

from msbridge.masking import mask_secrets
from msbridge.names import HISTOGRAM
from msbridge.sinks.base import Event, Record, json_safe
from msbridge.sinks.runlog import encode_event

log = logging.getLogger("msbridge")

EVENTS_ARTIFACT = "events.jsonl"
MAX_EVENT_LINES = 10_000
#: How an error reads when MLflow's request never left (urllib3's ``NewConnectionError``): nothing of it was stored.
NOT_SENT = "Failed to establish a new connection"


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


class Backlog:
    """The records that wait for MLflow, oldest first. ``limit`` (``max_pending``) bounds what the sink takes: past
    it, it takes no further batch (``Behind``) and its host reads them from the write-ahead log later, so at most
    one batch beyond the limit waits; nothing is dropped. ``tried`` of the first records went in a call that
    failed, so the store may hold them: ``text`` says exactly what it lacks, given the last step it holds (read
    back), else calls those "not confirmed".

    Example:
        >>> backlog = Backlog(3)
        >>> backlog.extend([Record(step, 0, 0.0, {}) for step in range(1, 6)])
        >>> backlog.full(), backlog.text()
        (True, 'steps 1-5 (5 records)')
    """

    def __init__(self, limit: int) -> None:
        self.records: Deque[Record] = deque()
        self.limit = limit
        self.tried = 0

    def extend(self, records: Sequence[Record]) -> None:
        """Queue ``records`` (a batch larger than the limit on its own, too: it had no other to wait behind)."""
        self.records.extend(records)

    def full(self, more: int = 0) -> bool:
        """Whether records wait and ``more`` beside them would go past the limit."""
        return bool(self.records) and len(self.records) + more > self.limit

    def failed(self, count: int, error: BaseException) -> None:
        """The first ``count`` records went in a call that raised ``error``: unless it never left, maybe stored."""
        if NOT_SENT not in str(error):
            self.tried = max(self.tried, count)

    def stored(self, count: int) -> None:
        """MLflow took the first ``count`` records."""
        for _ in range(count):
            self.records.popleft()
        self.tried = 0

    def text(self, held: Optional[int] = None) -> str:
        """"steps 1-2 (2 records, sent, but not confirmed: ...), steps 3-5 (3 records)": what the store lacks, oldest
        first; a sent batch is "not confirmed" unless ``held`` (its last step, read back) says whether it is there."""
        records = list(self.records)
        out = []
        for part, sent in ((records[:self.tried], True), (records[self.tried:], False)):
            if not part or sent and held is not None and part[-1].step <= held:
                continue  # the store holds them (a batch is stored whole, with its last-step tag)
            note = ", sent, but not confirmed: MLflow's reply never came" if sent and held is None else ""
            out.append(f"steps {part[0].step}-{part[-1].step} ({len(part)} records{note})")
        return ", ".join(out) or "0 records"
