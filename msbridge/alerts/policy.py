"""Which events alert, on which rank, and how often: the rate limit with "and N more".

- ``on`` picks the categories (``msbridge.alerts.spec.ON_VALUES``).
- Only the global rank sends job-level alerts; every rank sends its own ``stall`` / ``resumed``
  (a hung rank is often not the global one, and the global rank may be the one that hangs).
- In a multi-rank run, a check's finding alerts through the global rank's ``blame`` (which names the first
  rank of every rank's findings), not through the global rank's own ``anomaly`` of the same incident.
- The same category at the same step on the same rank alerts once (an ``anomaly`` and the ``blame``
  of one NaN, a replayed event).
- At most one message per kind per ``window_s``: the first goes out at once; the others in the window are
  held, and the next one after the window (or the close) says "and N more".

Example:
    >>> def alert_at(step):
    ...     return Alert("run-1", "tiny-lm", 0, step, "anomaly", "nonfinite", "NaN", "non-finite loss", {})
    >>> policy = Policy(frozenset({"nonfinite"}), window_s=300, is_global=True, clock=lambda: 0.0)
    >>> [a.step for a in (policy.admit(alert_at(20)), policy.admit(alert_at(21))) if a]
    [20]
    >>> [(a.step, a.more) for a in policy.held()]
    [(21, 0)]
"""
from __future__ import annotations

import time
from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from ..sinks.base import Event
from .message import RESUMED, STALL, Alert, category

#: Categories a rank that is not the global one sends: its own liveness.
RANK_LEVEL = frozenset({"stall"})


class Policy:
    """Decides, for each event or alert, whether it is sent now, held, or dropped.

    Args:
        on: the categories that alert.
        window_s: one message per kind per window.
        is_global: this rank sends job-level alerts.
        clock: seconds (monotonic); tests pass their own.
        world_size: the job's ranks (above 1, findings alert as ``blame``).

    Example:
        >>> stall_event = Event("stall", 120, 1, 1.7e9, {"seconds": 900.0})
        >>> Policy(frozenset({"stall"}), 300, is_global=False).wants(stall_event)
        'stall'
    """

    def __init__(self, on: FrozenSet[str], window_s: float, is_global: bool,
                 clock: Callable[[], float] = time.monotonic, world_size: int = 1) -> None:
        self.on, self.window_s, self.is_global, self.clock = on, window_s, is_global, clock
        self.world_size = world_size
        self._seen: Set[Tuple[str, int, int, str]] = set()
        self._last_sent: Dict[str, float] = {}
        self._held: Dict[str, Tuple[Alert, int]] = {}

    def allows(self, cat: str) -> bool:
        """Whether alerts of category ``cat`` are wanted on this rank."""
        return cat in self.on and (self.is_global or cat in RANK_LEVEL)

    def wants(self, event: Event) -> Optional[str]:
        """The category ``event`` alerts under here, or None."""
        if event.kind == "anomaly" and self.world_size > 1:
            return None  # the incident alerts once, as rank 0's ``blame``
        cat = category(event)
        return cat if cat is not None and self.allows(cat) else None

    @staticmethod
    def key(alert: Alert) -> str:
        """The rate limit's kind: the category, but a stall and its ``resumed`` are counted apart."""
        return alert.kind if alert.kind in (STALL, RESUMED) else alert.category

    def admit(self, alert: Alert) -> Optional[Alert]:
        """``alert`` to send now (with the count held before it), or None (a duplicate, or held)."""
        seen = (alert.category, alert.step, alert.rank, alert.kind if alert.kind in (STALL, RESUMED) else "")
        if seen in self._seen:
            return None
        self._seen.add(seen)
        key, now = self.key(alert), self.clock()
        last = self._last_sent.get(key)
        if last is not None and now - last < self.window_s:
            _, count = self._held.get(key, (alert, 0))
            self._held[key] = (alert, count + 1)
            return None
        self._last_sent[key] = now
        _, count = self._held.pop(key, (alert, 0))
        return alert.with_more(count) if count else alert

    def held(self) -> List[Alert]:
        """At close: the latest held alert of each kind, saying how many others were held with it."""
        out = [alert.with_more(count - 1) for alert, count in self._held.values()]
        self._held.clear()
        return out
