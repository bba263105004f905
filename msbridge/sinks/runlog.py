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
counted in ``RankLog.truncated``. Any other bad line (not JSON, ``values`` not an object ...) is
skipped with one warning per file naming ``file:line`` and the count, and listed in
``RankLog.skipped`` (``strict=True`` refuses instead); a line from a newer schema is a clear error.

Example:
    >>> run = read_run("msbridge_runs/default/run-1")
    >>> run.ranks[0].series("train/loss")[:2]
    [(1, 2.31), (2, 2.29)]
"""
from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import orjson

from ..errors import MsbridgeError
from ..names import restated
from .base import SCHEMA_VERSION, Event, Record, RunInfo, Series, events_series, json_safe

_logger = logging.getLogger("msbridge")


def rank_file(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` of a run keeps its write-ahead log."""
    return os.path.join(run_dir, "metrics", f"rank_{rank}.jsonl")


_ENCODER = json.JSONEncoder(allow_nan=False, default=str, separators=(",", ":"))  # one, not one a line


def _line(obj: Dict[str, Any]) -> str:
    return _ENCODER.encode(obj) + "\n"


def encode_header(run: RunInfo) -> str:
    """The first line of a rank's log; ``time`` is the training's start, when known."""
    header = {"type": "header", "schema_version": SCHEMA_VERSION, "run_id": run.run_id, "run_name": run.run_name,
              "experiment": run.experiment, "rank": run.rank, "world_size": run.world_size}
    if run.start_time:
        header["time"] = run.start_time
    return _line(header)


def encode_record(rec: Record) -> bytes:
    """One metrics line, UTF-8: non-finite values as ``null``, their names under ``"nonfinite"``. orjson writes
    it (0.5 us for 16 values here, where ``json`` takes 10: a float's ``repr`` is most of that); each value is
    written as a float (``float(value)``: an int, a bool or a numpy scalar too), in the shortest text that parses
    back to it exactly.

    Example:
        >>> encode_record(Record(3, 0, 1700000000.5, {"train/loss": float("nan"), "train/lr": 1e-05}))
        b'{"type":"metrics","step":3,"rank":0,"time":1700000000.5,"values":{"train/loss":null,"train/lr":0.00001},"nonfinite":["train/loss"]}\\n'
    """
    values = rec.values
    if set(map(type, values.values())) - {float}:  # rare: ints, bools, numpy scalars
        values = {name: float(value) for name, value in values.items()}
    line = {"type": "metrics", "step": int(rec.step), "rank": int(rec.rank), "time": float(rec.time),
            "values": values}
    if not math.isfinite(sum(values.values())):  # a NaN or an inf (or finite values whose sum overflows)
        bad = [name for name, value in values.items() if not math.isfinite(value)]
        if bad:
            line["nonfinite"] = bad
    try:
        return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # a name orjson refuses (a lone surrogate): json escapes it
        line["values"] = {name: value if math.isfinite(value) else None for name, value in values.items()}
        return _line(line).encode()


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
    #: ``(line number, what is wrong)`` of each bad line skipped (salvaged).
    skipped: List[Tuple[int, str]] = field(default_factory=list)
    #: Lines ``read_from`` read into it so far (the line number of the next bad one).
    lines: int = 0

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

    def event_series(self) -> Series:
        """The events as ``Sink.read_back`` gives them back: ``events/<kind>``, the count at each step."""
        return events_series((ev.kind, ev.step) for ev in self.events)


@dataclass
class RunLog:
    """A run directory's jsonl logs, parsed: ``ranks`` maps each rank to its ``RankLog`` (``read_run`` builds it).

    Example:
        >>> run = RunLog("runs/exp/run-1", {0: RankLog("metrics/rank_0.jsonl", {"rank": 0, "run_id": "r1"})})
        >>> run.header["run_id"], list(run.ranks)
        ('r1', [0])
    """

    run_dir: str
    ranks: Dict[int, RankLog]

    @property
    def header(self) -> Dict[str, Any]:
        return self.ranks[min(self.ranks)].header


class _BadLine(ValueError):
    """A complete line that is not a line of this format; the message says what is wrong with it."""


_MISSING = object()


def _what(value: Any) -> str:
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _int(obj: Dict[str, Any], key: str, default: Any = _MISSING) -> int:
    value = obj.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _BadLine(f'"{key}" is {_what(value)}, not an integer')


#: The steps and ranks a line may name: what TensorBoard, MLflow and numpy hold exactly (an int64, a
#: float64 integer), so a reader never overflows on one.
MAX_STEP = 2 ** 53
MAX_RANK = 10_000_000


def _bounded(obj: Dict[str, Any], key: str, high: int) -> int:
    """``_int`` from 0 to ``high``: a step or a rank."""
    value = _int(obj, key)
    if not 0 <= value <= high:
        shown = str(value) if abs(value) < 10 ** 30 else f"an integer of {len(str(abs(value)))} digits"
        raise _BadLine(f'"{key}" is {shown}, outside 0 .. {high:_}')
    return value


def _float(obj: Dict[str, Any], key: str, default: Any = _MISSING) -> float:
    value = obj.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value) if not isinstance(value, int) or abs(value) < 2 ** 1000 else math.inf
        if math.isfinite(number):
            return number
        raise _BadLine(f'"{key}" is {value!r:.40}, not a finite number')
    raise _BadLine(f'"{key}" is {_what(value)}, not a number')


def _values(raw: Any) -> Dict[str, float]:
    """A metrics line's ``values``: name -> number, ``null`` for a non-finite one."""
    if not isinstance(raw, dict):
        raise _BadLine(f'"values" is {_what(raw)}, not an object of metric name -> number')
    out = {}
    for name, value in raw.items():
        if value is None:
            out[name] = math.nan
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if not isinstance(value, int) or abs(value) < 2 ** 1000 else math.inf
            if not math.isfinite(number):  # a bare NaN/Infinity or 1e999: the writer says null instead
                raise _BadLine(f'"values"."{name}" is {value!r:.40}, not a finite number or null')
            out[name] = number
        else:
            raise _BadLine(f'"values"."{name}" is {_what(value)}, not a number or null')
    return out


def _decode(text: str, path: str, lineno: int) -> Dict[str, Any]:
    """One line as a JSON object, or ``_BadLine``; a newer schema is a ``RunLogError`` (never salvaged)."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise _BadLine("not a JSON line") from None
    if not isinstance(obj, dict):
        raise _BadLine(f"{_what(obj)}, not a JSON object")
    version = obj.get("schema_version")
    if obj.get("type") == "header":  # every reader relies on these three
        version = _int(obj, "schema_version")
        if not 0 <= _int(obj, "rank", 0) < MAX_RANK or not 1 <= _int(obj, "world_size", 1) <= MAX_RANK:
            raise _BadLine(f'"rank" {obj.get("rank", 0)!r:.40} or "world_size" {obj.get("world_size", 1)!r:.40} '
                           f"is outside 0 .. {MAX_RANK:_}")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise RunLogError(
            f"{path}:{lineno}: written with jsonl schema version {version}, but this msbridge "
            f"reads up to version {SCHEMA_VERSION}; upgrade msbridge to read it"
        )
    return obj


def _add(log: "RankLog", obj: Dict[str, Any]) -> None:
    """Put one decoded line into ``log``; a line whose fields have the wrong types is ``_BadLine``."""
    kind = obj.get("type", _MISSING)
    if kind == "header":
        log.header = obj
    elif kind == "metrics":
        values = _values(obj.get("values"))
        log.records.append(Record(_bounded(obj, "step", MAX_STEP), _bounded(obj, "rank", MAX_RANK),
                                  _float(obj, "time"), values))
    elif kind == "event":
        name, detail = obj.get("kind", _MISSING), obj.get("detail", {})
        if not isinstance(name, str):
            raise _BadLine(f'"kind" is {_what(name)}, not a string')
        if not isinstance(detail, dict):
            raise _BadLine(f'"detail" is {_what(detail)}, not an object')
        log.events.append(Event(name, _bounded(obj, "step", MAX_STEP), _bounded(obj, "rank", MAX_RANK),
                                _float(obj, "time", 0.0), detail))
    elif not isinstance(kind, str):
        raise _BadLine(f'"type" is {_what(kind)}, not "header", "metrics" or "event"')
    # another string: a line kind from a later msbridge of the same schema, left out


def read_rank_file(path: str, strict: bool = False) -> RankLog:
    """Parse one ``rank_{r}.jsonl``. A cut last line is skipped and counted (``truncated``).

    A bad line elsewhere (not JSON, wrong types) is skipped with one warning for the file naming
    ``path:line`` and the count, and listed in ``RankLog.skipped``; ``strict`` raises ``RunLogError`` instead.
    """
    log = RankLog(path=path, header={})
    log.records.extend(iter_rank_lines(path, log, strict))
    return finish_rank_log(log, strict)


def read_event_lines(path: str) -> RankLog:
    """A file of event lines without a header (the MLflow sink's ``events.jsonl`` artifact), parsed."""
    log = RankLog(path=path, header={})
    log.records.extend(iter_rank_lines(path, log))
    return log


def iter_rank_lines(path: str, into: Any, strict: bool = False) -> Iterator[Record]:
    """Read ``path`` line by line (never the whole file): yield each ``Record`` and put the header, events and
    bad-line counts into ``into`` (a ``RankLog``, or any object with ``header``, ``events``, ``truncated`` and
    ``skipped``). ``strict``: a bad line, or a step written twice, raises ``RunLogError``."""
    scratch = RankLog(path=path, header={})
    seen: Dict[int, Tuple[int, Set[str]]] = {}  # step -> its first line, the names written at it (strict)
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            if not _take_line(raw, path, i + 1, scratch, into, strict):
                continue
            if scratch.records:
                rec = scratch.records.pop()
                if strict:
                    _refuse_repeat(seen, rec, path, i + 1)
                yield rec
            if scratch.events:
                into.events.append(scratch.events.pop())
    into.header = scratch.header


def read_from(path: str, offset: int, max_lines: int, into: Any = None,
              ended: bool = False) -> Tuple[List[Record], List[Event], int]:
    """The records and events of at most ``max_lines`` lines of ``path`` from byte ``offset``, and the offset after
    the last line read: how a tracker reads the log from its cursor, live (``SinkHost``) and in ``msbridge replay``.
    A line still being written (no newline yet) is left for the next read, unless the writer has ``ended``; a bad
    line is skipped, as every reader does, and counted in ``into`` (a ``RankLog``: ``skipped`` by line number,
    ``truncated``; its ``header`` once read) when given.

    Example:
        >>> records, events, offset = read_from("run/metrics/rank_0.jsonl", 0, 1000)
    """
    got = RankLog(path=path, header={})
    counts = into if into is not None else RankLog(path=path, header={})
    with open(path, "rb") as fh:
        fh.seek(offset)
        for _ in range(max_lines):
            raw = fh.readline()
            if not raw or not (raw.endswith(b"\n") or ended):
                break
            offset += len(raw)
            counts.lines += 1
            _take_line(raw, path, counts.lines, got, counts, strict=False)
    counts.header = got.header or counts.header
    return got.records, got.events, offset


def _take_line(raw: bytes, path: str, lineno: int, got: RankLog, into: Any, strict: bool) -> bool:
    """One raw line of ``path`` into ``got``; False for a blank line or a bad one, counted in ``into``: a cut last
    line (the writer was killed mid-line) as ``truncated``, another as ``skipped`` (``strict``: RunLogError)."""
    if not raw.strip():
        return False
    try:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _BadLine(f"not UTF-8 (byte {exc.start} of the line)") from None
        _add(got, _decode(text, path, lineno))
        return True
    except _BadLine as bad:
        if not raw.endswith(b"\n"):
            into.truncated += 1
        elif strict:
            raise RunLogError(f"{path}:{lineno}: {bad} (without --strict the line is skipped)") from None
        else:
            into.skipped.append((lineno, str(bad)))
        return False


def finish_rank_log(log: Any, strict: bool) -> Any:
    """After ``iter_rank_lines``: a garbled header rebuilt from the lines after it, one warning for the bad lines."""
    if not log.header:
        _salvage_header(log, strict)
    if log.skipped:
        _warn_skipped(log.path, log.skipped)
    return log


_RANK_FILE = re.compile(r"rank_(\d+)\.jsonl$")


def _salvage_header(log: RankLog, strict: bool) -> None:
    """A file whose header line is garbled: rebuild the header from the lines after it (their rank, the
    file's name), so its intact lines stay readable. Nothing to rebuild from (or ``strict``): RunLogError."""
    first = log.skipped[0][0] if log.skipped else None
    if not (log.records or log.events) or strict or first != 1:
        raise RunLogError(f"{log.path}: no header line; not an msbridge jsonl file")
    named = _RANK_FILE.search(os.path.basename(log.path))
    ranks = {r.rank for r in log.records} | {e.rank for e in log.events}
    rank = int(named.group(1)) if named else min(ranks)
    files = len(glob.glob(os.path.join(os.path.dirname(log.path), "rank_*.jsonl")))
    log.header = {"type": "header", "schema_version": SCHEMA_VERSION, "rank": rank,
                  "world_size": max(files, rank + 1), "salvaged": True, **_run_names(log.path)}
    log.skipped[0] = (1, f"{log.skipped[0][1]} (the header; rebuilt from the {len(log.records)} metrics lines "
                         "after it)")


def _run_names(path: str) -> Dict[str, Any]:
    """The run id, name and experiment from the run.json beside ``metrics/`` ({} when it cannot be read)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(path)), "run.json"), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return {}
    return {k: meta[k] for k in ("run_id", "run_name", "experiment") if isinstance(meta, dict) and
            isinstance(meta.get(k), str)}


def _refuse_repeat(seen: Dict[int, Tuple[int, Set[str]]], rec: Record, path: str, lineno: int) -> None:
    """``strict``: a metric written twice at one step is refused (a resumed run that rewrote steps); a second
    line of a step that names other metrics (an evaluation's) and the objective's ``restated`` values are not."""
    first, names = seen.setdefault(rec.step, (lineno, set()))
    again = sorted((names & rec.values.keys()) - set(filter(restated, rec.values)))
    if again:
        raise RunLogError(f"{path}:{lineno}: step {rec.step} is written twice (first at line {first}: "
                          f"{', '.join(again[:3])}); without --strict both lines are read")
    names.update(rec.values)


def _warn_skipped(path: str, skipped: List[Tuple[int, str]]) -> None:
    """One warning for a file's bad lines: the first as ``path:line: why``, then the count and line numbers."""
    first, why = skipped[0]
    numbers = ", ".join(str(n) for n, _ in skipped[:10]) + (" ..." if len(skipped) > 10 else "")
    _logger.warning("msbridge: %s:%d: %s; skipped %d bad line(s) of this file (line %s) and used every other "
                    "line (--strict refuses such a file)", path, first, why, len(skipped), numbers)


def read_run(run_dir: str, strict: bool = False, reader: Callable[[str, bool], Any] = read_rank_file) -> RunLog:
    """Every rank file of a run directory, each read by ``reader`` (``strict``: as ``read_rank_file``)."""
    if not os.path.isdir(run_dir):
        raise RunLogError(f"{run_dir}: no such directory")
    paths = glob.glob(os.path.join(run_dir, "metrics", "rank_*.jsonl"))
    if not paths:
        raise RunLogError(f"{run_dir}: not an msbridge run, metrics/rank_*.jsonl is missing")
    ranks = {}
    for path in paths:
        log = reader(path, strict)
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
    """The highest step of a metrics line in a jsonl file (0 when none); a step readers refuse (above
    ``MAX_STEP``) does not count."""
    best = 0
    with open(path, "rb") as fh:
        for line in fh:
            match = _STEP.search(line)
            if match and len(match.group(1)) <= 16 and int(match.group(1)) <= MAX_STEP:
                best = max(best, int(match.group(1)))
    return best
