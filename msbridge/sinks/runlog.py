"""A run's jsonl write-ahead log: the line format, encoded and read back here only.

The jsonl sink writes ``encode_header`` / ``encode_record`` / ``encode_event``
lines; the MLflow sink's ``events.jsonl`` and the health dumps' ``window.jsonl``
use the same encoders; tests, replay, plot and diagnose read them back.

Line format (one JSON object a line, no spaces; ``"type"`` first):
    {"type":"header","schema_version":1,"run_id":...,"run_name":...,"experiment":...,"rank":0,"world_size":1,"time":...}
    {"type":"metrics","step":3,"rank":0,"time":...,"values":{"train/loss":null},"nonfinite":["train/loss"]}
    {"type":"event","kind":"anomaly","step":3,"rank":0,"time":...,"detail":{...}}

A non-finite value is ``null`` and named under ``"nonfinite"`` (absent when
every value is finite); event details hold NaN as the string ``"nan"``.

When reading, every complete line is used. A last line cut by a killed process is skipped and
counted in ``RankLog.truncated``; a line from a newer schema is a clear error.

Example:
    >>> run = read_run("msbridge_runs/default/run-1")
    >>> run.ranks[0].series("train/loss")[:2]
    [(1, 2.31), (2, 2.29)]
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..errors import MsbridgeError
from .base import SCHEMA_VERSION, Event, Record, RunInfo, json_safe


def rank_file(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` of a run keeps its write-ahead log."""
    return os.path.join(run_dir, "metrics", f"rank_{rank}.jsonl")


def _line(obj: Dict[str, Any]) -> str:
    return json.dumps(obj, allow_nan=False, default=str, separators=(",", ":")) + "\n"


def encode_header(run: RunInfo) -> str:
    """The first line of a rank's log; ``time`` is the training's start, when known."""
    header = {"type": "header", "schema_version": SCHEMA_VERSION, "run_id": run.run_id, "run_name": run.run_name,
              "experiment": run.experiment, "rank": run.rank, "world_size": run.world_size}
    if run.start_time:
        header["time"] = run.start_time
    return _line(header)


def encode_record(rec: Record) -> str:
    """One metrics line: non-finite values as ``null``, their names under ``"nonfinite"``."""
    line: Dict[str, Any] = {"type": "metrics", "step": rec.step, "rank": rec.rank, "time": rec.time,
                            "values": {k: (float(v) if math.isfinite(v) else None) for k, v in rec.values.items()}}
    bad = rec.nonfinite()
    if bad:
        line["nonfinite"] = bad
    return _line(line)


def encode_event(ev: Event) -> str:
    """One event line; the detail made JSON-safe (NaN -> ``"nan"``, other objects -> ``str``)."""
    return _line({"type": "event", "kind": ev.kind, "step": ev.step, "rank": ev.rank, "time": ev.time,
                  "detail": json_safe(dict(ev.detail))})


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


_STEP = re.compile(rb'"type":"metrics","step":(\d+)')  # as encode_record writes it


def last_step(path: str) -> int:
    """The highest step of a metrics line in a jsonl file (0 when none)."""
    best = 0
    with open(path, "rb") as fh:
        for line in fh:
            match = _STEP.search(line)
            if match:
                best = max(best, int(match.group(1)))
    return best
