"""Reading a run's jsonl write-ahead log back: tests, replay, plot and diagnose use it.

Every complete line is used. A last line cut by a killed process is skipped and
counted in ``RankLog.truncated``; a line from a newer schema is a clear error.

Example:
    >>> run = read_run("msbridge_runs/default/run-1")
    >>> run.ranks[0].series("train/loss")[:2]
    [(1, 2.31), (2, 2.29)]
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..errors import MsbridgeError
from .base import SCHEMA_VERSION, Event, Record


def rank_file(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` of a run keeps its write-ahead log."""
    return os.path.join(run_dir, "metrics", f"rank_{rank}.jsonl")


class RunLogError(MsbridgeError):
    """A directory or file that is not a readable msbridge run."""


@dataclass
class RankLog:
    """One rank's jsonl file, parsed."""

    path: str
    header: Dict[str, Any]
    records: List[Record] = field(default_factory=list)
    events: List[Event] = field(default_factory=list)
    truncated: int = 0

    @property
    def rank(self) -> int:
        return int(self.header.get("rank", 0))

    def series(self, name: str) -> List[Tuple[int, Optional[float]]]:
        """``[(step, value), ...]`` of one metric; NaN where the log holds null."""
        return [(r.step, r.values[name]) for r in self.records if name in r.values]

    def metric_names(self) -> List[str]:
        names: Dict[str, None] = {}
        for r in self.records:
            names.update(dict.fromkeys(r.values))
        return list(names)


@dataclass
class RunLog:
    run_dir: str
    ranks: Dict[int, RankLog]

    @property
    def header(self) -> Dict[str, Any]:
        return self.ranks[min(self.ranks)].header


def _parse(line: str, path: str, lineno: int) -> Dict[str, Any]:
    obj = json.loads(line)
    version = obj.get("schema_version")
    if version is not None and int(version) > SCHEMA_VERSION:
        raise RunLogError(
            f"{path}:{lineno}: written with jsonl schema version {version}, but this msbridge "
            f"reads up to version {SCHEMA_VERSION}; upgrade msbridge to read it"
        )
    return obj


def read_rank_file(path: str) -> RankLog:
    """Parse one ``rank_{r}.jsonl``; a cut last line is skipped and counted."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    log = RankLog(path=path, header={})
    tail = len(lines) - 1  # a file that ends cleanly leaves "" here; anything else was cut
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = _parse(line, path, i + 1)
        except json.JSONDecodeError:
            if i == tail:
                log.truncated += 1
                continue
            raise RunLogError(f"{path}:{i + 1}: not a JSON line") from None
        kind = obj.get("type")
        if kind == "header":
            log.header = obj
        elif kind == "metrics":
            values = {k: (float("nan") if v is None else float(v)) for k, v in obj["values"].items()}
            log.records.append(Record(int(obj["step"]), int(obj["rank"]), float(obj["time"]), values))
        elif kind == "event":
            log.events.append(Event(obj["kind"], int(obj["step"]), int(obj["rank"]),
                                    float(obj.get("time", 0.0)), obj.get("detail", {})))
    if not log.header:
        raise RunLogError(f"{path}: no header line; not an msbridge jsonl file")
    return log


def read_run(run_dir: str) -> RunLog:
    """Every rank file of a run directory."""
    if not os.path.isdir(run_dir):
        raise RunLogError(f"{run_dir}: no such directory")
    paths = glob.glob(os.path.join(run_dir, "metrics", "rank_*.jsonl"))
    if not paths:
        raise RunLogError(f"{run_dir}: not an msbridge run, metrics/rank_*.jsonl is missing")
    ranks = {}
    for path in paths:
        log = read_rank_file(path)
        ranks[log.rank] = log
    return RunLog(run_dir=run_dir, ranks=dict(sorted(ranks.items())))


def trim_partial_line(path: str) -> bool:
    """Cut a last line without its newline (a killed writer). True if something was cut."""
    with open(path, "rb+") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        if size == 0:
            return False
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return False
        block = min(size, 1 << 20)
        fh.seek(size - block)
        tail = fh.read(block)
        cut = tail.rfind(b"\n")
        fh.truncate(size - block + cut + 1 if cut >= 0 else 0)
        return True


_STEP = re.compile(rb'"type":"metrics","step":(\d+)')


def last_step(path: str) -> int:
    """The highest step of a metrics line in a jsonl file (0 when none)."""
    best = 0
    with open(path, "rb") as fh:
        for line in fh:
            match = _STEP.search(line)
            if match:
                best = max(best, int(match.group(1)))
    return best
