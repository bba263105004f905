"""A full disk under a file-writing sink (TensorBoard, MindInsight): what cannot be written waits, bounded, and
is written when space returns.

Each event file is a ``WaitingFile``, written through MindSpore's C++ ``EventWriter_`` (TFRecord framing). Its
``Write`` and ``Flush`` do not report a short write reliably, so a batch's events are checked by the file's size
once the batch is written (``DiskWait.check``: one flush to the OS and one ``stat`` a file and batch, not an
event): a batch that did not land whole is a failure. The file is then cut back to its last whole event before
the batch and left; the batch's events in it and every later one of the sink wait in its ``DiskWait``: at most ``MAX_WAITING_EVENTS`` events and
``MAX_WAITING_BYTES`` bytes (encoded). At each later write and flush, once the file system has room for the
oldest waiting event, a fresh file is opened next to the old one (a later name: TensorBoard's and MindInsight's
readers go on to it) and the waiting events are written in order, so no point is lost or doubled.

While events wait, the sink takes no further batch (``WaitsForSpace`` raises ``Behind``): the write-ahead log
(jsonl) holds them, and the sink's host reads them from there once space returns, so an outage keeps one batch in
memory, not the outage. Past the bound (a batch larger than it on its own) the oldest waiting events are dropped;
what was dropped in one full-disk episode becomes one ``gap`` event (``first_step``, ``last_step``, ``records``:
the steps whose points were dropped, ``events``), written into the sink itself once space returns and returned to
the dispatcher, which hands it to every other sink and to the run's outcome. What still waits at close is lost
too: another ``gap``, and ``undelivered()`` names every lost step range.

Example:
    >>> wait = DiskWait("tensorboard")
    >>> events = WaitingFile(wait, "/tmp/tb", lambda: "/tmp/tb/events.out.tfevents.1.host")
    >>> events.write(b"...", step=1)         # never raises for a full disk: the event waits
    >>> wait.check()                          # the batch landed whole, or it waits
    >>> wait.retry(); wait.text()
"""
from __future__ import annotations

import errno
import logging
import os
import shlex
import shutil
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

log = logging.getLogger("msbridge")

#: Events (one per directory and step, or per text/histogram) a sink keeps while its disk is full.
MAX_WAITING_EVENTS = 4096
#: Bytes of encoded events a sink keeps while its disk is full.
MAX_WAITING_BYTES = 4 * 2 ** 20
RECORD, EVENT, META = "record", "event", "meta"
_FRAME = 16  # TFRecord: u64 length, u32 CRC, body, u32 CRC


def fsync(path: str) -> None:
    """fsync a file another writer (MindSpore's C++ one) holds open."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _failure(path: str, need: int) -> OSError:
    """Why a write did not land: the file (or its folder) removed under the run, a full disk, or EIO."""
    if not os.path.exists(path):
        return OSError(errno.ENOENT, REMOVED, path)
    try:
        full = shutil.disk_usage(os.path.dirname(path)).free < need
    except OSError:
        full = True
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, os.strerror(code), path)


#: The reason of a write whose file was removed under the run (a /tmp cleaner, ``rm -r``).
REMOVED = "removed during the run"


def free_bytes(folder: str) -> int:
    """Free bytes where ``folder`` is, or would be made again (its nearest existing parent) if it was removed."""
    while True:
        try:
            return shutil.disk_usage(folder).free
        except FileNotFoundError:
            parent = os.path.dirname(folder)
            if parent == folder:
                raise
            folder = parent


class WaitingFile:
    """One event file of a sink, renewed after a failed write; writes go through its ``DiskWait``.

    ``new_path()`` names each fresh file (later names sort later); ``header`` opens each one.
    """

    def __init__(self, wait: "DiskWait", folder: str, new_path: Callable[[], str], header: bytes = b"",
                 mode: Optional[int] = None) -> None:
        self._wait, self._new_path, self._header, self._mode = wait, new_path, header, mode
        self.folder, self.path = folder, ""
        self.paths: List[str] = []  # every file it wrote, oldest first
        self._writer: Any = None
        self._good = 0  # bytes of whole events in the current file
        self._unchecked: List[Tuple[bytes, int, str]] = []  # written since the last check: data, step, kind

    def write(self, data: bytes, step: int = 0, kind: str = RECORD) -> None:
        """Write one event now, or let it wait (a full disk); never raises for the disk."""
        self._wait.write(self, data, step, kind)

    def put(self, data: bytes, step: int, kind: str) -> None:
        """One event handed to the file's writer (a fresh file if the last write failed), checked by ``check``."""
        if self._writer is None:
            self._open()
        self._writer.Write(data)
        self._unchecked.append((data, step, kind))

    def check(self) -> List[int]:
        """The events put since the last check are in the file whole: the steps of its records; ``OSError`` if
        they did not all land (``unchecked`` still holds them)."""
        if not self._unchecked:
            return []
        expected = self._good + sum(len(data) + _FRAME for data, _, _ in self._unchecked)
        landed = self._writer.Flush() is not False
        if not landed or os.path.getsize(self.path) != expected:
            raise _failure(self.path, expected - self._good)
        self._good = expected
        steps = [step for _, step, kind in self._unchecked if kind == RECORD]
        self._unchecked = []
        return steps

    def take_unchecked(self) -> List[Tuple[bytes, int, str]]:
        """The events put since the last check, which did not land whole."""
        unchecked, self._unchecked = self._unchecked, []
        return unchecked

    def _open(self) -> None:
        from mindspore._c_expression import EventWriter_

        os.makedirs(self.folder, exist_ok=True)
        self.path = self._new_path()
        self._writer, self._good = EventWriter_(self.path), 0
        self.paths.append(self.path)
        if self._header:
            try:
                self._put(self._header)
            except OSError:
                self.abandon()
                raise

    def _put(self, data: bytes) -> None:
        """The header: written and checked at once."""
        self._writer.Write(data)
        landed = self._writer.Flush() is not False
        expected = self._good + len(data) + _FRAME
        if not landed or os.path.getsize(self.path) != expected:
            raise _failure(self.path, len(data) + _FRAME)
        self._good = expected

    def room_for(self, data: bytes) -> int:
        """The free bytes a retry waits for: the event, a fresh file's header, a page to spare."""
        return len(data) + len(self._header) + 2 * _FRAME + 4096

    def abandon(self) -> None:
        """After a failed write: let go of the writer, cut the file to its whole events (none: remove it)."""
        self._unchecked = []
        if self._writer is None:
            return
        self._writer.Shut()
        self._writer = None
        try:
            if self._good <= (len(self._header) + _FRAME if self._header else 0):
                os.unlink(self.path)
                self.paths.remove(self.path)
            else:
                os.truncate(self.path, self._good)
        except OSError as exc:
            log.debug("msbridge: cannot cut %s back: %s", self.path, exc)

    def flush(self) -> None:
        """Everything written is on disk (fsync). Each event was checked whole when written; an fsync that fails
        (EIO) is said, and the events stay as the OS holds them."""
        self._wait.check()
        if self._writer is not None:
            try:
                fsync(self.path)
            except FileNotFoundError:  # removed under the run: said once; the next write opens a fresh file
                self.abandon()
                self._wait.failed(self, OSError(errno.ENOENT, REMOVED, self.path))
            except OSError as exc:
                log.warning("msbridge: %s: fsync of %s failed: %s", self._wait.sink, self.path, exc.strerror or exc)

    def close(self) -> None:
        """fsync, then let go of the writer; the files become ``mode`` (read-only for MindInsight's)."""
        if self._writer is not None:
            self.flush()
            self._writer.Shut()
            self._writer = None
        if self._mode is not None:
            for path in self.paths:
                try:
                    os.chmod(path, self._mode)
                except OSError:
                    pass


class DiskWait:
    """The events one sink could not write yet, bounded, oldest first; the step ranges it lost, exactly."""

    def __init__(self, sink: str) -> None:
        self.sink = sink
        self.where = self.run_dir = self.reason = ""
        self._queue: Deque[Tuple[WaitingFile, bytes, int, str]] = deque()
        self._unchecked: Dict[WaitingFile, None] = {}  # files written since the last check, in order
        self._bytes = 0
        self._gap: Optional[Dict[str, Any]] = None  # dropped in the current episode
        self._done: List[Dict[str, Any]] = []  # gaps final and not yet handed out
        self.lost: List[Dict[str, Any]] = []  # every gap of the run
        self.status_lost = ""
        self.written_step = 0  # the last step of a record written whole
        self.removed = 0  # the files were removed under the run, with the steps up to this one (0: they were not)

    @property
    def waiting(self) -> int:
        """Events that wait for space."""
        return len(self._queue)

    def at(self, where: str, run_dir: str) -> None:
        """Where the sink's files are (said on a failure) and the run dir its replay reads (at open)."""
        self.where, self.run_dir = where, run_dir

    def write(self, file: WaitingFile, data: bytes, step: int, kind: str) -> None:
        if self._queue:
            self._hold(file, data, step, kind)
            self.retry()
            return
        try:
            file.put(data, step, kind)
        except OSError as exc:  # a fresh file could not be opened
            file.abandon()
            self.failed(file, exc)
            self._hold(file, data, step, kind)
            return
        self._unchecked[file] = None

    def check(self) -> None:
        """Each file written since the last check holds its batch whole; where one does not, the file is cut back
        to before the batch, and the batch's events in it wait for space."""
        files, self._unchecked = list(self._unchecked), {}
        for file in files:
            try:
                steps = file.check()
            except OSError as exc:
                held = file.take_unchecked()
                file.abandon()
                self.failed(file, exc)
                for data, step, kind in held:
                    self._hold(file, data, step, kind)
                continue
            self.written_step = max(self.written_step, *steps) if steps else self.written_step

    def retry(self) -> bool:
        """Write what waits once the disk has room for the oldest event; True when nothing waits."""
        if not self._queue:
            return True
        while self._queue:
            file, data, step, kind = self._queue[0]
            try:
                if free_bytes(file.folder) < file.room_for(data):
                    return False
                file.put(data, step, kind)  # a removed folder is made again: a fresh file in it
                file.check()
            except OSError:
                file.abandon()
                return False
            self._queue.popleft()
            self._bytes -= len(data)
            if kind == RECORD:
                self.written_step = max(self.written_step, step)
        log.warning("msbridge: %s: %s is writable again; every waiting event is written", self.sink, self.where)
        self._end_gap()
        return True

    def take_gaps(self) -> List[Dict[str, Any]]:
        """The gaps made final since the last call (their details)."""
        done, self._done = self._done, []
        return done

    def give_up(self, status: str) -> List[Dict[str, Any]]:
        """At close: one more try (a removed folder is made again), then what still waits is lost (with ``status``,
        if the close's own writes wait too)."""
        self.retry()
        if self._queue and any(kind == META for _, _, _, kind in self._queue):
            self.status_lost = status
        while self._queue:
            self._drop()
        self._end_gap()
        return self.take_gaps()

    def text(self) -> str:
        """``undelivered()``: every lost step range ("" when nothing was lost)."""
        removed = (f"its files in {self.where} were removed during the run, with every step up to {self.removed} "
                   f"(msbridge replay {shlex.quote(self.run_dir)} --to {self.sink} writes them again)"
                   if self.removed else "")
        if not self.lost and not self.status_lost:
            return removed
        if removed:
            return f"{removed}; {self._lost_text()}"
        return self._lost_text()

    def _lost_text(self) -> str:
        ranges = ", ".join(f"steps {g['first_step']}-{g['last_step']} ({g['records']} record(s), "
                           f"{g['events']} event(s))" for g in self.lost) or "no records"
        status = f" and status {self.status_lost}" if self.status_lost else ""
        return (f"{ranges}{status} not written to {self.where} ({self.reason}; up to {MAX_WAITING_EVENTS} events "
                f"and {MAX_WAITING_BYTES // 2 ** 20} MiB waited in memory for space)")

    # -- internals ----------------------------------------------------------------
    def failed(self, file: WaitingFile, exc: OSError) -> None:
        """Say once why ``file`` cannot be written (a full disk, EIO), or that it was removed under the run."""
        from msbridge.paths import free_space

        if exc.errno == errno.ENOENT and not self.removed:
            self.removed = max(self.written_step, 1)
            log.error("msbridge: %s: %s was removed during the run (seen after step %d); the steps written there "
                      "are gone with it, later ones go to fresh files (msbridge replay %s --to %s writes them all "
                      "again)", self.sink, file.path or file.folder, self.written_step, shlex.quote(self.run_dir),
                      self.sink)
            self.reason = self.reason or REMOVED
            return
        if self.reason:  # said once a run
            return
        self.reason = f"{exc.strerror or exc}; {free_space(file.folder)} free"
        log.warning("msbridge: %s: cannot write %s (%s); the batch that met it waits in memory (at most %d events, "
                    "%d MiB), later ones are read from the jsonl log when space returns (training and the jsonl log "
                    "go on); what is lost is a gap event, and once there is space: msbridge replay %s --to %s",
                    self.sink, self.where or file.folder, self.reason, MAX_WAITING_EVENTS,
                    MAX_WAITING_BYTES // 2 ** 20, shlex.quote(self.run_dir), self.sink)

    def _hold(self, file: WaitingFile, data: bytes, step: int, kind: str) -> None:
        self._queue.append((file, data, step, kind))
        self._bytes += len(data)
        if len(self._queue) > MAX_WAITING_EVENTS or self._bytes > MAX_WAITING_BYTES:
            if self._gap is None:
                log.warning("msbridge: %s: more than %d events (or %d MiB) wait for %s; dropping the oldest, "
                            "recorded as a gap event", self.sink, MAX_WAITING_EVENTS, MAX_WAITING_BYTES // 2 ** 20,
                            self.where)
            while len(self._queue) > MAX_WAITING_EVENTS or self._bytes > MAX_WAITING_BYTES:
                self._drop()

    def _drop(self) -> None:
        _, data, step, kind = self._queue.popleft()
        self._bytes -= len(data)
        if kind == META:
            return
        gap = self._gap = self._gap or {"first_step": step, "last_step": step, "steps": set(), "events": 0,
                                        "time": time.time()}
        gap["first_step"], gap["last_step"] = min(gap["first_step"], step), max(gap["last_step"], step)
        if kind == RECORD:
            gap["steps"].add(step)
        else:
            gap["events"] += 1

    def _end_gap(self) -> None:
        if self._gap is None:
            return
        gap, self._gap = self._gap, None
        detail = {"first_step": gap["first_step"], "last_step": gap["last_step"], "records": len(gap["steps"]),
                  "events": gap["events"], "sink": self.sink, "path": self.where, "reason": self.reason,
                  "time": gap["time"]}
        self.lost.append(detail)
        self._done.append(detail)


class WaitsForSpace:
    """For a sink whose event files are ``WaitingFile``s of ``self._wait`` (TensorBoard, MindInsight): a batch
    that meets a full disk waits (bounded) and is written when space returns; what is lost is a ``gap`` event,
    written into the sink itself when it can be and returned to the dispatcher (every other sink, the outcome).
    The sink defines ``_write_files``, ``_flush_files``, ``_close_files`` (its last writes) and ``_shut_files``.

    Example:
        >>> from msbridge.sinks.base import Sink
        >>> class TensorBoardSink(WaitsForSpace, Sink): ...
    """

    _wait: DiskWait

    def _write_or_wait(self, records: List[Any], events: List[Any]) -> List[Any]:
        """Write a batch; while an earlier one still waits for space, take nothing (``Behind``): the batch is in the
        write-ahead log, and the sink's host reads it from there once the disk has room (one batch waits in
        memory, not the outage). A write never raises for the disk itself: it waits."""
        from msbridge.sinks.base import Behind

        if not (records or events):
            return self._gap_events()
        if not self._wait.retry():
            raise Behind(f"{self._wait.where} has no space ({self._wait.reason}); {self._wait.waiting} events wait")
        self._write_files(records, events)
        self._wait.check()
        return self._gap_events()

    def _gap_events(self, final: bool = False, status: str = "") -> List[Any]:
        """The gaps made final, as events: written into this sink first, unless it is closing."""
        from msbridge.sinks.base import GAP, Event

        details = self._wait.give_up(status) if final else self._wait.take_gaps()
        assert self.run is not None
        gaps = [Event(GAP, d["last_step"], self.run.rank, d["time"], {k: v for k, v in d.items() if k != "time"})
                for d in details]
        if gaps and not final:
            self._write_files([], gaps)
            self._wait.check()
        return gaps

    def undelivered(self) -> str:
        """Every step range it lost ("" while nothing was lost)."""
        return self._wait.text()

    def flush(self) -> List[Any]:
        if self._wait.retry():
            self._flush_files()
        return self._gap_events()

    def close(self, status: str = "FINISHED") -> List[Any]:
        if self._closed or self.run is None:
            return []
        self._closed = True
        self._wait.retry()
        self._close_files(status)
        gaps = self._gap_events()
        gaps += self._gap_events(final=True, status=status)
        self._shut_files()
        return gaps
