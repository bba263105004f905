"""Rebuild any sink from a run's jsonl write-ahead log: the offline mode.

On a cluster with no tracker in reach, train with jsonl only (or with a tracker
that is down), copy the run dir somewhere that can reach the tracker, then
``msbridge replay RUN_DIR --to mlflow``. Each rank's log is replayed as that
rank would have written it; global-only sinks get rank 0's log only.

Replay is idempotent: sinks reattach to the run id kept in ``run.json`` (or read
back what they hold) and skip the steps and events they already have, so
replaying twice gives the same run. TensorBoard reads back the steps each of its
directories holds and gets exactly the others (the holes a failed write left, not
only the tail).

A replay that delivered everything takes the sink off the outcome's "not delivered" list (run.json and
README.md), and one into another place than the run's (``--tracking-uri``) names that place there too; one
that could not (the tracker still unreachable) is an error, and the list stays.

A run that never recorded its outcome (SIGKILL, a crashed rank's peers killed by
msrun) gets one here, in run.json and README.md: the status the log's end says
(an exception, a collective timeout or a stop action: FAILED; an interrupt or
nothing: KILLED; an early stop: FINISHED), with what its log holds.

Bad lines in the log are skipped with one warning per file (``strict`` refuses the run).

The sink is driven on its own thread (``msbridge.sinks.host.Driver``: the host, typed calls and bounds of a
training): a call that raises, returns a wrong type or overruns its bound ends the replay into it with one
line naming the call (``msbridge replay`` exits 2), never a traceback or a hang.

The log is streamed, never held whole: it is read ``BATCH`` lines at a time by the reader a tracker behind the log
uses during training (``runlog.read_from``), each batch handed to the sink as read, and the sink's ``write`` skips
what its store holds (``held()``), as it does live: one delivery path. A run
without a recorded outcome, or a ``strict`` replay, is scanned first (its header, events and what its outcome
reads: steps, losses, first and last time), so the outcome is known, or a bad line refused, before a sink
gets a record.

Example:
    >>> replay("msbridge_runs/demo/run-1", "mlflow", {"tracking_uri": "http://127.0.0.1:5000"})
    {'records': 300, 'events': 0, 'ranks': 1, 'truncated': 0, 'skipped': 0}
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Type

from ..errors import MsbridgeError
from ..health.detectors.base import STOP_ACTIONS
from ..health.runner import ACTION, EARLY_STOP, EXCEPTION, INTERRUPT, RESUME
from ..names import HISTOGRAM, LOSS
from ..paths import recorded_experiment_dir
from ..run.metadata import README, REPLAYED_FROM, RUN_JSON, write_outcome
from ..sinks.base import FAILED, FINISHED, KILLED, STATUSES, Event, Record, RunInfo, Sink
from ..sinks.host import Driver, SinkFailed
from ..sinks.registry import resolve, with_store_defaults
from ..sinks.runlog import (RankLog, RunLog, RunLogError, finish_rank_log, iter_rank_lines, read_from, read_rank_file,
                             read_run)

BATCH = 1000
log = logging.getLogger("msbridge")


def _run_json(run_dir: str) -> Dict[str, Any]:
    path = os.path.join(run_dir, RUN_JSON)
    if not os.path.exists(path):
        raise RunLogError(f"{run_dir}: not an msbridge run, {RUN_JSON} is missing")
    try:
        with open(path, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RunLogError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise RunLogError(f"{path}: not an msbridge run.json (a JSON object)")
    return meta


def ended_as(run: RunLog) -> str:
    """The status the events of a run without an outcome point to (those after its last resume: an earlier
    session's end is not this one's); KILLED when they say nothing."""
    events: List[Event] = []
    for rank_log in run.ranks.values():
        starts = [i for i, e in enumerate(rank_log.events) if e.kind == RESUME]
        events += rank_log.events[starts[-1] + 1 if starts else 0:]
    if any(e.kind in (EXCEPTION, "collective_timeout")
           or e.kind == ACTION and e.detail.get("action") in STOP_ACTIONS for e in events):
        return FAILED
    told = [e.detail["status"] for e in events if e.detail.get("status") in STATUSES]  # job_stop: the agreed one
    if told:
        return told[-1]
    if any(e.kind == INTERRUPT for e in events):
        return KILLED
    return FINISHED if any(e.kind == EARLY_STOP for e in events) else KILLED


@dataclass
class ScannedLog(RankLog):
    """A rank's log read without keeping its records: their count and what its outcome reads; ``scanned`` once a
    whole pass read it (and warned about its bad lines)."""

    count: int = 0
    steps: Set[int] = field(default_factory=set)
    losses: List[float] = field(default_factory=list)
    first_time: Optional[float] = None
    last_time: Optional[float] = None
    scanned: bool = False

    def counted(self, records: Iterable[Record]) -> Iterator[Record]:
        """``records``, each counted on its way through."""
        for rec in records:
            self.count += 1
            self.steps.add(rec.step)
            if LOSS in rec.values:
                self.losses.append(rec.values[LOSS])
            self.first_time = rec.time if self.first_time is None else self.first_time
            self.last_time = rec.time
            yield rec


def scan_rank_file(path: str, strict: bool = False) -> ScannedLog:
    """``read_rank_file`` without keeping the records; a file whose header must be rebuilt from its records is
    read whole once (``runlog``'s salvage needs them)."""
    scanned = ScannedLog(path=path, header={}, scanned=True)
    for _ in scanned.counted(iter_rank_lines(path, scanned, strict)):
        pass
    if scanned.header:
        return finish_rank_log(scanned, strict)
    whole = read_rank_file(path, strict)
    rebuilt = ScannedLog(path=path, header=whole.header, events=whole.events, truncated=whole.truncated,
                         skipped=whole.skipped, scanned=True)
    for _ in rebuilt.counted(whole.records):
        pass
    return rebuilt


def head_of_rank_file(path: str, strict: bool = False) -> ScannedLog:
    """The rank file's header line only (its records are read as they are replayed); a file whose first line is
    not a header is scanned whole (``scan_rank_file``)."""
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if isinstance(header, dict) and header.get("type") == "header":
        return ScannedLog(path=path, header=header)
    return scan_rank_file(path, strict)


def outcome_from_log(run: RunLog, status: str) -> Dict[str, Any]:
    """The outcome the global rank would have written, rebuilt from its scanned log (as ``BridgeMonitor.outcome``)."""
    main = run.ranks[min(run.ranks)]
    losses = main.losses
    finite = [v for v in losses if math.isfinite(v)]
    anomalies = [f"step {e.step}: {e.kind} {dict(e.detail)}" for e in main.events if e.kind != HISTOGRAM]
    return {
        "status": status,
        "steps recorded": len(main.steps),  # an evaluation's record shares its step
        "last step": max(main.steps, default=0),
        "wall time": f"{main.last_time - main.first_time:.1f} s (first to last record)" if main.count else "unknown",
        "final loss": losses[-1] if losses else None,
        "best loss": min(finite) if finite else None,
        "anomalies": "; ".join(anomalies) if anomalies else "none",
        "recorded by": "msbridge replay: the run ended without recording its outcome; read from its jsonl log",
    }


def _settle_outcome(run_dir: str, meta: Dict[str, Any], run: RunLog) -> Dict[str, Any]:
    """run.json's outcome; a run without one gets it from its log, written into run.json and README.md."""
    outcome = meta.get("outcome")
    if isinstance(outcome, Mapping) and outcome.get("status") in STATUSES:
        return meta
    outcome = outcome_from_log(run, ended_as(run))
    return write_outcome(run_dir, meta, outcome)  # a read-only copy: said once, replay goes on


def replay(run_dir: str, to: str, options: Optional[Mapping[str, Any]] = None,
           progress: Optional[bool] = None, strict: bool = False) -> Dict[str, int]:
    """Write every record and event of ``run_dir`` to the sink ``to``; returns counts.

    ``progress`` (default: when stderr is a terminal) prints a running count per rank.
    ``strict`` refuses a log with a bad line instead of skipping it.
    """
    progress = sys.stderr.isatty() if progress is None else progress
    run_dir = os.path.abspath(run_dir)
    meta = _run_json(run_dir)
    recorded = isinstance(meta.get("outcome"), Mapping) and meta["outcome"].get("status") in STATUSES
    # one pass unless something must be read first: the outcome from the log, or a strict check before any write
    run_log = read_run(run_dir, strict=strict, reader=head_of_rank_file if recorded and not strict else scan_rank_file)
    meta = _settle_outcome(run_dir, meta, run_log)
    status = meta["outcome"]["status"]
    config = meta.get("config", {})
    sink_cls = resolve(to)
    sink_options = dict(config.get("sinks", {}).get(to) or {})
    sink_options.update(options or {})
    sink_options = with_store_defaults(to, sink_options, recorded_experiment_dir(meta, run_dir))
    readme_path = os.path.join(run_dir, README)
    readme = open(readme_path, encoding="utf-8").read() if os.path.exists(readme_path) else ""
    world_size = int(run_log.header.get("world_size", len(run_log.ranks)))
    counts = {"records": 0, "events": 0, "ranks": 0, "truncated": 0, "skipped": 0}
    where = ""
    for rank, rank_log in run_log.ranks.items():
        if sink_cls.ranks == "global" and rank != 0:
            continue
        run = RunInfo(run_id=meta.get("run_id") or run_log.header["run_id"], run_name=meta.get("run_name", ""),
                      experiment=config.get("experiment", "default"), rank=rank, world_size=world_size,
                      is_global=rank == 0, run_dir=run_dir, config=config, metadata=meta, readme=readme,
                      start_time=float(rank_log.header.get("time") or 0.0))  # else the first record's time
        sink = _built(sink_cls, sink_options, to)
        where = where or _where(sink, run)
        try:
            streamed, undelivered = _into(Driver(sink), run, rank_log, status, strict, progress)
        except SinkFailed as exc:
            raise MsbridgeError(f"{to}: {exc}; the jsonl log still holds everything: replay again once the sink is "
                                "fixed") from None
        if undelivered:
            raise MsbridgeError(f"{to}: {undelivered}; the jsonl log still holds everything: replay again "
                                "once it is reachable (or its disk has space)")
        counts["records"] += streamed.count
        counts["events"] += len(streamed.events)
        counts["truncated"] += streamed.truncated
        counts["skipped"] += len(streamed.skipped)
        counts["ranks"] += 1
    if not counts["ranks"]:
        raise MsbridgeError(f"{run_dir}: no rank log to replay to {to!r}")
    _delivered(run_dir, meta, to, where)
    return counts


def mark_delivered(run_dir: str, to: str) -> None:
    """``to`` (``alerts``: ``msbridge.cli.alert_cmd.send_kept``) received everything: off the outcome's list."""
    meta = _run_json(os.path.abspath(run_dir))
    if isinstance(meta.get("outcome"), Mapping):
        _delivered(run_dir, meta, to)


def _where(sink: Sink, run: RunInfo) -> str:
    """Where ``sink`` writes ``run`` (its ``describe``), "" when it does not say (or its ``describe`` raises)."""
    try:
        described = sink.describe(run)
    except Exception:
        return ""
    where = described.get("where") if isinstance(described, Mapping) else None
    return where if isinstance(where, str) else ""


def _delivered(run_dir: str, meta: Dict[str, Any], to: str, where: str = "") -> None:
    """``to`` holds the whole log now, at ``where``: off the outcome's "not delivered" list, and, when that is
    not where the run wrote it, the sink's place in run.json and README.md (``run.metadata.REPLAYED_FROM``)."""
    outcome = meta["outcome"]
    missed = outcome.get("not delivered")
    sinks = dict(meta.get("sinks") or {})
    before = dict(sinks.get(to) or {})
    moved = bool(where) and before.get("where") != where
    if moved:
        sinks[to] = {**before, "where": where, REPLAYED_FROM: before.get(REPLAYED_FROM, before.get("where", ""))}
    if isinstance(missed, Mapping) and to in missed:
        rest = {name: what for name, what in missed.items() if name != to}
        outcome = dict(outcome, **{"not delivered": rest or "none"})
    elif not moved:
        return
    write_outcome(run_dir, dict(meta, sinks=sinks), outcome)


def _built(cls: Type[Sink], options: Mapping[str, Any], to: str) -> Sink:
    """``cls(**options)``; a plug-in's constructor that raises is one line, as any of its calls."""
    try:
        return cls(**options)
    except MsbridgeError:
        raise
    except Exception as exc:
        raise MsbridgeError(f"{to}: {cls.__name__}(...) raised {type(exc).__name__}: {exc}") from None


def _into(sink: Driver, run: RunInfo, head: ScannedLog, status: str, strict: bool,
          progress: bool) -> Tuple[ScannedLog, str]:
    """Open ``sink`` with ``run``, write the rank's log, close it with ``status``: what was read, and the sink's
    final ``undelivered()``. A failed call or a bad line closes it FAILED first; ``SinkFailed`` names the call."""
    try:
        sink.open(run)
        streamed = _write_all(sink, head, strict, progress)
    except Exception:
        with suppress(SinkFailed):  # the first failure is what is said
            sink.close(FAILED)
        raise
    return streamed, sink.close(status)


def _write_all(sink: Driver, head: ScannedLog, strict: bool, progress: bool) -> ScannedLog:
    """The rank's log read ``BATCH`` lines at a time as a tracker behind the log reads it (``runlog.read_from``,
    the writer ended), each batch written as read; returns what was read (its bad lines warned about here unless a
    scan did already)."""
    streamed, offset = ScannedLog(path=head.path, header={}), 0
    while True:
        records, events, after = read_from(head.path, offset, BATCH, into=streamed, ended=True)
        if after == offset:
            break
        offset = after
        streamed.events.extend(events)
        records = list(streamed.counted(records))
        if records or events:
            sink.write(records, events)
        if progress:
            print(f"\r[msbridge] replay rank {head.rank}: {streamed.count} records", end="", file=sys.stderr,
                  flush=True)
    if progress:
        print(f"\r[msbridge] replay rank {head.rank}: {streamed.count} records", file=sys.stderr)
    if streamed.skipped and not head.scanned:
        finish_rank_log(streamed, strict)
    return streamed
