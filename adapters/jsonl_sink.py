"""The jsonl sink: one file per rank, the run's write-ahead log.

``{run_dir}/metrics/rank_{rank}.jsonl`` starts with a header line, then holds one
JSON object per metrics record or event. A non-finite value is written as
``null`` and named under ``"nonfinite"``. Every batch is flushed and fsynced, so
a killed process loses at most the window it had not handed over yet.

On resume the file is appended to: a line cut by a kill is trimmed first, and
steps already in the file are never written again.

Example:
    >>> sink = JsonlSink()
    >>> sink.open(run)            # creates run.run_dir/metrics/rank_0.jsonl
    >>> sink.write([Record(1, 0, time.time(), {"train/loss": 2.3})], [])
    >>> sink.close("FINISHED")
"""
from __future__ import annotations

import json
import math
import os
from typing import IO, Any, Dict, Optional, Sequence

from ..sinks.base import SCHEMA_VERSION, Event, Record, RunInfo, Sink, json_safe
from ..sinks.runlog import last_step, rank_file, trim_partial_line


def _encode_values(values: Dict[str, float]) -> Dict[str, Any]:
    return {k: (float(v) if math.isfinite(v) else None) for k, v in values.items()}


class JsonlSink(Sink):
    """Writes records and events of this rank to ``metrics/rank_{rank}.jsonl``.

    Example:
        >>> sinks: {jsonl: {fsync: true}}
    """

    name = "jsonl"

    def __init__(self, fsync: bool = True, **options: Any) -> None:
        super().__init__(fsync=fsync, **options)
        self.fsync = bool(fsync)
        self.path = ""
        self._file: Optional[IO[str]] = None
        self._last_step = 0

    def open(self, run: RunInfo) -> None:
        super().open(run)
        self.path = rank_file(run.run_dir, run.rank)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if exists:
            trim_partial_line(self.path)
            self._last_step = last_step(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        if not exists:
            self._line({
                "type": "header",
                "schema_version": SCHEMA_VERSION,
                "run_id": run.run_id,
                "run_name": run.run_name,
                "experiment": run.experiment,
                "rank": run.rank,
                "world_size": run.world_size,
            })
            self.flush()

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        for rec in records:
            if rec.step <= self._last_step:
                continue  # already in the log (resume): never write a step twice
            line: Dict[str, Any] = {
                "type": "metrics",
                "step": rec.step,
                "rank": rec.rank,
                "time": rec.time,
                "values": _encode_values(dict(rec.values)),
            }
            bad = rec.nonfinite()
            if bad:
                line["nonfinite"] = bad
            self._line(line)
            self._last_step = rec.step
        for ev in events:
            self._line({
                "type": "event",
                "kind": ev.kind,
                "step": ev.step,
                "rank": ev.rank,
                "time": ev.time,
                "detail": json_safe(dict(ev.detail)),
            })
        self.flush()

    def flush(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def close(self, status: str = "FINISHED") -> None:
        if self._file is None:
            return
        self.flush()
        self._file.close()
        self._file = None

    def describe(self, run: RunInfo) -> Dict[str, str]:
        path = rank_file(run.run_dir, run.rank)
        return {"where": path, "view": f"tail -f {path}"}

    def _line(self, obj: Dict[str, Any]) -> None:
        assert self._file is not None, "JsonlSink.write before open"
        self._file.write(json.dumps(obj, allow_nan=False, default=str, separators=(",", ":")) + "\n")
