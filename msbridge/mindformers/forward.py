"""What mindformers' own monitors found, as msbridge events in every sink.

mindformers records its findings in files and log lines; ``MindformersFindings``
turns them into ``Event``s at each flush, once each:

- ``mindformers_global_norm_spike``: a step in TrainingStateMonitor's
  ``abnormal_global_norm.json`` (``check_for_global_norm``; the first spike at a
  step ends training with ``TREError``, which the monitor then closes FAILED);
- ``mindformers_skip_data``: a step whose global norm reached the threshold while
  ``use_skip_data_by_global_norm`` is on, so mindformers' train cell skipped its
  update (same rule as TrainingStateMonitor, on the recorded grad norm);
- ``mindformers_health_checkpoint``: an entry CheckpointMonitor appended to
  ``health_ckpts.json`` (``use_checkpoint_health_monitor``).

The settings are read from the callbacks themselves (``cb_params.list_callback``),
so nothing is configured twice. Per flush this costs two ``os.stat`` calls; a file
is parsed only when it changed.

Example:
    >>> findings = MindformersFindings.from_callbacks(cb_params.list_callback, rank=0)
    >>> findings.events(window)
    [Event(kind='mindformers_skip_data', step=12, ...)]
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..capture.window import Window
from ..names import GRAD_NORM
from ..sinks.base import Event

log = logging.getLogger("msbridge")

SPIKE = "mindformers_global_norm_spike"
SKIP_DATA = "mindformers_skip_data"
HEALTH_CKPT = "mindformers_health_checkpoint"


class _WatchedJson:
    """A JSON file another callback rewrites; ``read`` returns its content when it changed, else None."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: Optional[Tuple[int, int]] = None

    def read(self) -> Any:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        if key == self._seen:
            return None
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):  # caught mid-write: read it again at the next flush
            return None
        self._seen = key
        return data


class MindformersFindings:
    """Turns mindformers' findings into events; see the module docstring."""

    def __init__(self, rank: int, spike_file: Optional[str] = None, skip_threshold: Optional[float] = None,
                 health_file: Optional[str] = None) -> None:
        self.rank = rank
        self._spikes = _WatchedJson(spike_file) if spike_file else None
        self._known_spikes: Dict[str, int] = {}
        self._skip_threshold = skip_threshold
        self._health = _WatchedJson(health_file) if health_file else None
        self._known_ckpts: Set[str] = set()

    @classmethod
    def from_callbacks(cls, callbacks: Sequence[Any], rank: int) -> "MindformersFindings":
        """Read the settings of mindformers' TrainingStateMonitor and CheckpointMonitor in ``callbacks``."""
        spike_file = skip_threshold = health_file = None
        for cb in callbacks or ():
            name = type(cb).__name__
            if name == "TrainingStateMonitor":
                if getattr(cb, "check_for_global_norm", False):
                    spike_file = getattr(cb, "global_norm_record_path", None)
                if getattr(cb, "use_skip_data_by_global_norm", False):
                    skip_threshold = float(cb.global_norm_spike_threshold)
            elif name == "CheckpointMonitor" and getattr(cb, "use_checkpoint_health_monitor", False):
                health_file = os.path.join(cb.health_ckpts_record_dir, "health_ckpts.json")
        found = cls(rank, spike_file, skip_threshold, health_file)
        if spike_file or skip_threshold is not None or health_file:
            log.info("msbridge: forwarding mindformers findings as events (%s)", found.describe())
        return found

    def describe(self) -> str:
        parts = [f"global-norm spikes from {self._spikes.path}" if self._spikes else "",
                 f"skipped data at global norm >= {self._skip_threshold}" if self._skip_threshold is not None else "",
                 f"health checkpoints from {self._health.path}" if self._health else ""]
        return "; ".join(p for p in parts if p) or "nothing to forward"

    def events(self, window: Optional[Window], last_step: int) -> List[Event]:
        """New findings since the last call. ``window``: the steps just drained (None at close)."""
        now = time.time()
        out: List[Event] = []
        if window is not None and self._skip_threshold is not None and GRAD_NORM in window.scalars:
            norms = window.scalars[GRAD_NORM]
            for i in np.flatnonzero(norms >= self._skip_threshold):
                out.append(Event(SKIP_DATA, int(window.steps[i]), self.rank, now, {
                    "global_norm": float(norms[i]), "threshold": self._skip_threshold}))
        if self._spikes is not None:
            out.extend(self._new_spikes(self._spikes.read(), now))
        if self._health is not None:
            out.extend(self._new_health(self._health.read(), last_step, now))
        return out

    def _new_spikes(self, data: Any, now: float) -> List[Event]:
        if not isinstance(data, dict):
            return []
        out = []
        for step, norms in sorted(data.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            norms = norms if isinstance(norms, list) else [norms]
            if len(norms) > self._known_spikes.get(step, 0):
                self._known_spikes[step] = len(norms)
                out.append(Event(SPIKE, int(step), self.rank, now, {
                    "global_norm": norms[-1], "times_at_step": len(norms), "file": self._spikes.path}))
        return out

    def _new_health(self, data: Any, last_step: int, now: float) -> List[Event]:
        if not isinstance(data, list):
            return []
        out = []
        for item in data:
            name = str(item.get("ckpt_name")) if isinstance(item, dict) else None
            if name and name not in self._known_ckpts:
                self._known_ckpts.add(name)
                out.append(Event(HEALTH_CKPT, last_step, self.rank, now, {
                    "ckpt_name": name, "is_health": bool(item.get("is_health"))}))
        return out
