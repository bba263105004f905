"""The jsonl sink: one file per rank, the run's write-ahead log.

``{run_dir}/metrics/rank_{rank}.jsonl`` starts with a header line, then holds one
JSON object per metrics record or event, in the format ``msbridge.sinks.runlog``
encodes and reads (a non-finite value is ``null``, named under ``"nonfinite"``). Every batch is written
and fsynced, so a killed process loses at most the window it had not handed over yet.

The file only ever holds complete lines. A failed or short write (a full disk: ENOSPC, or EIO) is cut
back to the last complete line; the lines that did not fit are held (up to ``MAX_HELD_LINES``) and
written again at the next batch or flush, in order. The first failure is said once, naming the file and
its free space. What is finally dropped (the oldest held lines past the bound, or what is still held at
close) becomes one ``gap`` event (first and last step, counts): written into the log where the lines
would have been, and returned from the call that made it final (``write``, ``flush`` or ``close``): the
dispatcher hands it to every other sink. What the log lost in all is its ``undelivered()``: the run's outcome
lists it (exit code 3), and close says it in one line, even when nothing could be written.

On resume the file is appended to: a line cut by a kill is trimmed first, and
the file's last step is what this sink holds: steps up to it are never written again.

The file removed under the run (a /tmp cleaner, ``rm -r`` of the run dir) is seen at the next batch or
flush (the open file is no longer the one at its path) and said at once. Its lines are still in the open
file: they are written again at its path (the directory made again), or where that fails at a rescue path
(``<tmp>/msbridge-rescue/<run id>/rank_<n>.jsonl``), and the log goes on there. A log that is not at its
path at close is the sink's ``undelivered()`` (exit code 3), naming where it is, or that it is lost.

Example:
    >>> sink = JsonlSink()
    >>> sink.open(run)            # creates run.run_dir/metrics/rank_0.jsonl
    >>> sink.write([Record(1, 0, time.time(), {"train/loss": 2.3})], [])
    >>> sink.close("FINISHED")
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from msbridge.options import Option
from msbridge.sinks.base import GAP, Event, Held, GapEvents, Record, RunInfo, Series, Sink
from msbridge.sinks.registry import register_sink
from msbridge.sinks.runlog import (
    encode_event,
    encode_header,
    encode_record,
    last_step,
    rank_file,
    read_rank_file,
    trim_partial_line,
)

log = logging.getLogger("msbridge")

#: Lines held while the file cannot take them; past this the oldest are dropped into a ``gap`` event.
MAX_HELD_LINES = 4096
_HEADER, _RECORD, _EVENT, _GAP = "header", "record", "event", "gap"
_FULL = (errno.ENOSPC, errno.EDQUOT)
NEWLINE = b"\n"


def _read_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of the open file ``fd`` (it may have been removed: it is still readable)."""
    parts, done = [], 0
    while done < size:
        part = os.pread(fd, size - done, done)
        if not part:
            break
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def _write_new(path: str, data: bytes) -> int:
    """Write ``data`` as the file at ``path`` (its directory made), fsynced; its descriptor, open to append."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.write(fd, view[done:])
        os.fsync(fd)
    except OSError:
        os.close(fd)
        raise
    return fd


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


@register_sink("jsonl")
class JsonlSink(Sink):
    """Writes records and events of this rank to ``metrics/rank_{rank}.jsonl``.

    Example:
        >>> sinks: {jsonl: {fsync: true}}
    """

    options = {"fsync": Option(bool, True, "fsync the file after every batch (a killed process loses "
                                           "at most the window it had not handed over)")}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.path = ""
        self._fd: Optional[int] = None
        self._good = 0  # bytes of complete lines in the file: where a failed write is cut back to
        self._cut = False  # a cut back that itself failed: the file's tail must go before the next write
        self._held: Deque[Tuple[str, int, bytes]] = deque()  # (kind, step, line) not in the file yet
        self._gap: Optional[Dict[str, Any]] = None  # what was dropped since the file last took a line
        self._gap_time = 0.0
        self._lost: Dict[str, int] = {}  # every gap made final so far: records, events
        self._lost_ranges: List[str] = []  # each gap's "first-last" steps
        self._lost_text = ""  # ``undelivered()``: what the log lost in all
        self._final_gaps: List[Event] = []  # gaps made final by the current call: what it returns
        self._holds = 0
        self._failing = False  # in a failure episode (said once; "writable again" ends it)
        self._dropping = False
        self._reason = ""
        self._moved = ""  # the log is not where it was opened: where it is now, or that it is lost
        self._written_step = 0  # the last step of a line in the file
        self._unwritable = ""  # the run dir no longer takes new files (read-only, permissions): since which step

    def open(self, run: RunInfo) -> None:
        super().open(run)
        self.path = rank_file(run.run_dir, run.rank)
        self._holds = run.resumed_from_step
        if os.path.exists(self.path):
            trim_partial_line(self.path)
            self._holds = last_step(self.path)  # the file is what this rank holds
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            self._held.append((_HEADER, 0, encode_header(run).encode()))
        self._drain()  # a disk full from the start: the header waits with the rest

    def held(self) -> Held:
        return Held(self._holds)

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> GapEvents:
        self._held.extend((_RECORD, rec.step, encode_record(rec)) for rec in records)
        self._held.extend((_EVENT, ev.step, encode_event(ev).encode()) for ev in events)
        self._drain()
        self._bound()
        return self._take_final_gaps()

    def flush(self) -> GapEvents:
        """Write what is held (each flush retries) and fsync."""
        self._drain()
        return self._take_final_gaps()

    def undelivered(self) -> str:
        return "; ".join(text for text in (self._moved, self._lost_text) if text)

    def close(self, status: str = "FINISHED") -> GapEvents:
        self._drain()
        if any(kind in (_RECORD, _EVENT, _GAP) for kind, _, _ in self._held):
            self._drop(len(self._held))  # the file could not take them: other sinks and run.json hear of it
            gap = dict(self._gap or {})
            self._finalize_gap()
            log.error("msbridge: jsonl: %s could not take %d record(s) and %d event(s) of steps %d-%d before "
                      "close (%s): a gap event, handed to the other sinks and listed in the run's outcome", self.path,
                      gap["records"], gap["events"], gap["first_step"], gap["last_step"], self._reason)
        if self._orphaned():  # removed since the last flush, and nothing held to write: kept now, or named lost
            try:
                self._restore()
            except OSError:
                pass
        if self.undelivered():  # every loss of the run, in one line (the exit code is 3)
            log.error("msbridge: jsonl: %s", self.undelivered())
        self._held.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return self._take_final_gaps()

    def describe(self, run: RunInfo) -> Dict[str, str]:
        return {"where": rank_file(run.run_dir, run.rank)}

    def read_back(self, run: RunInfo) -> Series:
        wal = read_rank_file(rank_file(run.run_dir, run.rank))
        return {**{name: wal.series(name) for name in wal.metric_names()}, **wal.event_series()}

    def _take_final_gaps(self) -> List[Event]:
        gaps, self._final_gaps = self._final_gaps, []
        return gaps

    # -- the write path ----------------------------------------------------------
    def _drain(self) -> None:
        """Write every held line, oldest first; on a failed or short write cut the file back to its
        last complete line and keep the lines that did not fit."""
        if not self._held:
            return
        lines = [self._gap_line() if kind == _GAP else line for kind, _, line in self._held]
        data = b"".join(lines)
        written = 0
        try:
            self._ready()
            view = memoryview(data)
            while written < len(data):
                n = os.write(self._fd, view[written:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
            if self.settings["fsync"]:
                os.fsync(self._fd)
        except OSError as exc:
            # after a failed fsync nothing of this write is known to be on disk: keep it all
            kept = self._whole_lines(lines, 0 if written == len(data) else written)
            self._cut_back(sum(len(line) for line in lines[:kept]))
            self._failed(exc)
            self._take(kept)
            return
        self._good += len(data)
        self._take(len(lines))
        self._check_writable()
        if self._failing:
            self._failing = self._dropping = False
            log.warning("msbridge: jsonl: %s is writable again; every held line is written", self.path)

    def _ready(self) -> None:
        """Open the file (its directory may not have been creatable on a full disk), write it again where it was
        removed, and finish a cut back."""
        if self._fd is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            self._good = os.fstat(self._fd).st_size
        elif self._orphaned():
            self._restore()
        if self._cut:
            os.ftruncate(self._fd, self._good)
            self._cut = False

    def _check_writable(self) -> None:
        """Say at once when the run dir stops taking new files (remounted read-only, ``chmod``): the open log
        keeps every step, but run.json, README.md and the outcome cannot be written there; and when it takes
        them again. One ``access`` call a batch."""
        assert self.run is not None
        writable = os.access(self.run.run_dir, os.W_OK)
        if not writable and not self._unwritable:
            self._unwritable = f"step {self._written_step}"
            log.error("msbridge: the run dir %s is no longer writable (seen after step %d): the jsonl log (open) "
                      "keeps every step, but run.json, README.md and the run's outcome cannot be written there "
                      "until it is", self.run.run_dir, self._written_step)
        elif writable and self._unwritable:
            self._unwritable = ""
            log.warning("msbridge: the run dir %s is writable again", self.run.run_dir)

    def _orphaned(self) -> bool:
        """Whether the open file is no longer the one at its path (removed, or replaced)."""
        if self._fd is None:
            return False
        try:
            here, there = os.stat(self.path), os.fstat(self._fd)
        except OSError:
            return True
        return (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino)

    def _restore(self) -> None:
        """Write the open file's complete lines again at its path, else at the rescue path, and go on there.
        Raises OSError when neither can be written (the lines stay held; retried at every flush)."""
        assert self._fd is not None and self.run is not None
        if not self._moved:
            log.error("msbridge: jsonl: %s was removed during the run (seen after step %d); writing its lines again",
                      self.path, self._written_step)
        data, errors = _read_all(self._fd, self._good), []
        lines = f"{data.count(NEWLINE)} line(s)"
        rescue = os.path.join(tempfile.gettempdir(), "msbridge-rescue", self.run.run_id,
                              os.path.basename(self.path))
        for target in dict.fromkeys((self.path, rescue)):
            try:
                fd = _write_new(target, data)
            except OSError as exc:
                errors.append(f"{target}: {exc.strerror or exc}")
                continue
            os.close(self._fd)
            self._fd, moved_from, self.path = fd, self.path, target
            self._moved = "" if target == moved_from else (
                f"{moved_from} was removed during the run and its directory could not be made again "
                f"({'; '.join(errors)}): every line is in {target}")
            log.error("msbridge: jsonl: the log goes on in %s (its %s kept)", target, lines)
            return
        self._moved = (f"{self.path} was removed during the run and could not be written again "
                       f"({'; '.join(errors)}): its {lines} up to step {self._written_step} are lost with it")
        raise OSError(errno.ENOENT, f"removed during the run ({'; '.join(errors)})")

    @staticmethod
    def _whole_lines(lines: List[bytes], written: int) -> int:
        """How many of ``lines`` fit whole into ``written`` bytes."""
        count = total = 0
        for line in lines:
            total += len(line)
            if total > written:
                break
            count += 1
        return count

    def _cut_back(self, kept: int) -> None:
        """Cut the file to its last complete line: ``kept`` bytes of whole lines after ``self._good``."""
        if self._fd is None:
            return
        end = self._good + kept
        try:
            os.ftruncate(self._fd, end)
            self._good = end
        except OSError:
            self._cut = True  # retried before the next write; the lines stay held

    def _take(self, count: int) -> None:
        """The first ``count`` held lines are in the file: forget them (a written gap line is made final)."""
        if self._cut:
            return
        for _ in range(count):
            kind, step, _ = self._held.popleft()
            self._written_step = max(self._written_step, step)
            if kind == _GAP:
                self._finalize_gap()

    def _failed(self, exc: OSError) -> None:
        """Say once per episode why the file cannot take lines: a full disk by name, with its free space."""
        if self._failing:
            return
        self._failing = True
        folder = os.path.dirname(self.path)
        if exc.errno in _FULL:
            try:
                free = _size(shutil.disk_usage(folder).free)
            except OSError:
                free = "unknown"
            what = f"the disk is full ({free} free in {folder})"
        else:
            what = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, 'error')})"
        self._reason = what
        log.warning("msbridge: jsonl: cannot write %s: %s; holding up to %d lines and retrying at every flush",
                    self.path, what, MAX_HELD_LINES)

    def _bound(self) -> None:
        """Past ``MAX_HELD_LINES`` held lines, drop the oldest into the gap."""
        held = sum(1 for kind, _, _ in self._held if kind in (_RECORD, _EVENT))
        if held > MAX_HELD_LINES:
            if not self._dropping:
                self._dropping = True
                log.warning("msbridge: jsonl: %d lines held for %s; dropping the oldest, recorded as a gap event",
                            MAX_HELD_LINES, self.path)
            self._drop(held - MAX_HELD_LINES)

    def _drop(self, count: int) -> None:
        """Drop the ``count`` oldest held records/events into the gap, whose line takes their place."""
        kept: List[Tuple[str, int, bytes]] = []
        while self._held and count:
            kind, step, line = self._held.popleft()
            if kind in (_HEADER, _GAP):
                kept.append((kind, step, line))
                continue
            if self._gap is None:
                self._gap_time = time.time()
            gap = self._gap or {"first_step": step, "last_step": step, "records": 0, "events": 0}
            gap["first_step"], gap["last_step"] = min(gap["first_step"], step), max(gap["last_step"], step)
            gap["records" if kind == _RECORD else "events"] += 1
            self._gap = gap
            count -= 1
        if self._gap is not None and not any(kind == _GAP for kind, _, _ in kept):
            kept.append((_GAP, self._gap["last_step"], b""))
        self._held.extendleft(reversed(kept))

    def _gap_event(self) -> Event:
        """The gap so far, the same event each time until it changes (its line is measured, then made final)."""
        assert self._gap is not None and self.run is not None
        detail = dict(self._gap, sink=self.name, path=self.path, reason=self._reason or "write failed")
        return Event(GAP, self._gap["last_step"], self.run.rank, self._gap_time, detail)

    def _gap_line(self) -> bytes:
        return encode_event(self._gap_event()).encode()

    def _finalize_gap(self) -> None:
        """The gap is final (in the file, or the file is closing without it): every other sink hears of it,
        and the run's outcome (``undelivered()``: what the log lost in all)."""
        if self._gap is not None:
            self._final_gaps.append(self._gap_event())
            lost, gap = self._lost, self._gap
            for key in ("records", "events"):
                lost[key] = lost.get(key, 0) + gap[key]
            self._lost_ranges.append(f"{gap['first_step']}-{gap['last_step']}")  # each gap's own, exactly
            self._lost_text = (f"{lost['records']} record(s) and {lost['events']} event(s) of steps "
                               f"{', '.join(self._lost_ranges)} lost from {self.path} "
                               f"({self._reason or 'write failed'}); the other sinks were handed them, and each says "
                               "under its own name what it did not write")
            self._gap = None
