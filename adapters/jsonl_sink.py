"""The jsonl sink: one file per rank, the run's write-ahead log.

``{run_dir}/metrics/rank_{rank}.jsonl`` starts with a header line, then holds one
JSON object per metrics record or event, in the format ``msbridge.sinks.runlog``
encodes and reads (a non-finite value is ``null``, named under ``"nonfinite"``). Every batch is flushed and fsynced, so
a killed process loses at most the window it had not handed over yet.

On resume the file is appended to: a line cut by a kill is trimmed first, and
the file's last step is what this sink holds: steps up to it are never written again.

Example:
    >>> sink = JsonlSink()
    >>> sink.open(run)            # creates run.run_dir/metrics/rank_0.jsonl
    >>> sink.write([Record(1, 0, time.time(), {"train/loss": 2.3})], [])
    >>> sink.close("FINISHED")
"""
from __future__ import annotations

import os
from typing import IO, Any, Dict, Optional, Sequence

from ..sinks.base import Event, Record, RunInfo, Series, Sink
from ..sinks.options import Option
from ..sinks.runlog import (
    encode_event,
    encode_header,
    encode_record,
    last_step,
    rank_file,
    read_rank_file,
    trim_partial_line,
)


class JsonlSink(Sink):
    """Writes records and events of this rank to ``metrics/rank_{rank}.jsonl``.

    Example:
        >>> sinks: {jsonl: {fsync: true}}
    """

    name = "jsonl"
    options = {"fsync": Option(bool, True, "fsync the file after every batch (a killed process loses "
                                           "at most the window it had not handed over)")}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.path = ""
        self._file: Optional[IO[str]] = None

    def open(self, run: RunInfo) -> None:
        super().open(run)
        self.path = rank_file(run.run_dir, run.rank)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if exists:
            trim_partial_line(self.path)
            self.last_step = last_step(self.path)  # the file is what this rank holds
        self._file = open(self.path, "a", encoding="utf-8")
        if not exists:
            self._file.write(encode_header(run))
            self.flush()

    def emit(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        assert self._file is not None, "JsonlSink.write before open"
        self._file.writelines([encode_record(rec) for rec in records] + [encode_event(ev) for ev in events])
        self.flush()

    def flush(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self.settings["fsync"]:
            os.fsync(self._file.fileno())

    def close(self, status: str = "FINISHED") -> None:
        if self._file is None:
            return
        self.flush()
        self._file.close()
        self._file = None

    def describe(self, run: RunInfo) -> Dict[str, str]:
        return {"where": rank_file(run.run_dir, run.rank)}

    def read_back(self, run: RunInfo) -> Series:
        log = read_rank_file(rank_file(run.run_dir, run.rank))
        return {name: log.series(name) for name in log.metric_names()}
