"""Alerts that could not be sent, kept in the run dir until they are: ``<run_dir>/alerts/outbox_rank_<r>.jsonl``.

One JSON line per (alert, target): ``{"target": index, "type": ..., "alert": {...}, "error": ..., "time": ...,
"config": the config file the run was started with}``.
A target is named by its index in ``alerts.targets``, never by its URL (the URL holds the bot's token), and
the alert and the error are secret-masked. ``msbridge replay RUN_DIR --to alerts`` and the run's next start
send them (``resend``) and keep only what still fails.

Example:
    >>> box = Outbox("/runs/a", rank=0, config="/jobs/monitor.yaml")
    >>> box.add(0, "lark", alert, "HTTP 500")
    >>> resend(box, spec, post)   # -> (sent, still kept)
    (1, 0)
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..masking import mask_text
from .message import Alert
from .spec import AlertSpec, Target

log = logging.getLogger("msbridge")

OUTBOX_DIR = "alerts"


def outbox_files(run_dir: str) -> List[str]:
    """Every rank's outbox file in ``run_dir``, in rank order."""
    folder = os.path.join(run_dir, OUTBOX_DIR)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    found = [n for n in names if n.startswith("outbox_rank_") and n.endswith(".jsonl")]
    return [os.path.join(folder, n) for n in sorted(found, key=lambda n: int(n[12:-6]) if n[12:-6].isdigit() else -1)]

#: ``post(target, alert) -> error or None``: one delivery with its retries (``delivery.deliver``).
Post = Callable[[Target, Alert], Optional[str]]


class Outbox:
    """The run's undelivered alerts (thread-safe: the sender thread and the close both add)."""

    def __init__(self, run_dir: str, rank: int = 0, config: str = "", path: str = "") -> None:
        self.path = path or os.path.join(run_dir, OUTBOX_DIR, f"outbox_rank_{rank}.jsonl")
        self.config = config  # the config file's path, for the replay (it is not a secret; the URLs are there)
        self._lock = threading.Lock()

    def add(self, index: int, kind: str, alert: Alert, error: str) -> None:
        """Keep one undelivered alert for target ``index`` (never raising: a full disk is logged)."""
        line = json.dumps({"target": index, "type": kind, "alert": alert.payload(), "error": mask_text(error),
                           "time": time.time(), "config": self.config}, ensure_ascii=False)
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
            except OSError as exc:
                log.error("msbridge: alerts: could not keep an undelivered %s alert in %s: %s",
                          alert.category, self.path, exc)

    def entries(self) -> List[Dict[str, Any]]:
        """Every kept line (a cut or bad line is skipped with a warning)."""
        with self._lock:
            if not os.path.exists(self.path):
                return []
            with open(self.path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        out = []
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                if isinstance(entry, dict) and isinstance(entry.get("alert"), dict):
                    out.append(entry)
                    continue
            except ValueError:
                pass
            if line.strip():
                log.warning("msbridge: alerts: %s:%d is not an outbox line; skipped", self.path, number)
        return out

    def keep_only(self, entries: List[Dict[str, Any]]) -> None:
        """Rewrite the outbox with ``entries`` (removed when none is left)."""
        with self._lock:
            if not entries:
                if os.path.exists(self.path):
                    os.remove(self.path)
                return
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in entries)
            os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self.entries())


def resend(box: Outbox, spec: AlertSpec, post: Post) -> Tuple[int, int]:
    """Send every kept alert to its target again; returns ``(sent, still kept)``.

    An entry whose target index or type no longer matches ``spec`` is kept, with that said in its error.
    """
    entries = box.entries()
    if not entries:
        return 0, 0
    left: List[Dict[str, Any]] = []
    sent = 0
    for entry in entries:
        index = entry.get("target")
        target = spec.targets[index] if isinstance(index, int) and 0 <= index < len(spec.targets) else None
        if target is None or target.type != entry.get("type"):
            left.append(dict(entry, error=f"alerts.targets[{index}] is not a {entry.get('type')} target in "
                                          "this config"))
            continue
        error = post(target, Alert.from_payload(entry["alert"]))
        if error is None:
            sent += 1
        else:
            left.append(dict(entry, error=mask_text(error), time=time.time()))
    box.keep_only(left)
    return sent, len(left)
