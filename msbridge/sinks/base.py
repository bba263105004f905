"""The sink contract and the plain data that crosses it.

Sinks see only floats, strings and plain dicts: never MindSpore tensors. Every
sink gets the same ``Record`` and ``Event`` objects, so metric names are the same
in every tracker. ``Sink`` says what a sink declares and implements.

Example:
    >>> Record(step=3, rank=0, time=1700000000.0, values={"train/loss": 2.5})
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import ConfigError
from ..options import Option, check_options, with_defaults

SCHEMA_VERSION = 1
#: ``{metric: [(step, value), ...]}``: what ``Sink.read_back`` returns.
Series = Dict[str, List[Tuple[int, float]]]

# Final run states, as MLflow names them.
FINISHED = "FINISHED"
FAILED = "FAILED"
KILLED = "KILLED"
STATUSES = (FINISHED, FAILED, KILLED)
#: The event a sink raises for what it finally could not store: detail ``first_step``, ``last_step``,
#: ``records``, ``events`` (counts), ``sink``, ``reason``. The dispatcher hands it to every other sink.
GAP = "gap"
#: Seconds a sink's close may take beyond its ``close_timeout`` (its last call, ending its client).
CLOSE_GRACE = 5.0
#: The largest ``close_timeout`` a sink takes (an hour): a close is always bounded.
MAX_CLOSE_TIMEOUT = 3600.0
#: The ``close_timeout`` of a sink that declares none (a file writer: its close is a flush).
DEFAULT_CLOSE_TIMEOUT = 10.0


def json_safe(value: Any) -> Any:
    """A copy JSON can hold: event details may carry NaN, JSON may not; non-finite floats become "nan"/"inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested mappings as dot keys, leaves as they are: ``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": 0.1}``."""
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Record:
    """The metrics of one training step on one rank.

    ``values`` maps a metric name (``train/loss``, ``perf/samples_per_s`` ...)
    to a float; a non-finite float is kept as it is (sinks decide how to store it).

    Example:
        >>> Record(step=3, rank=0, time=1700000000.0, values={"train/loss": 2.5})
    """

    step: int
    rank: int
    time: float
    values: Mapping[str, float]

    def nonfinite(self) -> List[str]:
        """Names whose value is NaN or +-inf."""
        return [k for k, v in self.values.items() if not math.isfinite(v)]


@dataclass(frozen=True)
class Event:
    """Something that happened at a step: an anomaly, an action, a checkpoint, an end.

    Example:
        >>> Event(kind="anomaly", step=3700, rank=0, detail={"check": "nonfinite_loss"})
    """

    kind: str
    step: int
    rank: int
    time: float = 0.0
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunInfo:
    """What a sink learns when it is opened.

    Attributes:
        run_id: stable id of the training job, shared by all ranks and kept on resume.
        run_name: human name, already rendered from the config template.
        experiment: experiment name (MLflow experiment, TensorBoard/MindInsight parent dir).
        rank / world_size: this process and the job size.
        is_global: True on the one rank that writes global metrics and talks to trackers.
        run_dir: the run's output directory (absolute).
        config: the resolved config as a plain, secret-masked dict.
        metadata: run metadata (versions, host, git, command line ...), secret-masked.
        readme: the run README text.
        resumed_from_step: the last step already recorded when a run is resumed, else 0.
        start_time: when training started (``time.time()``); 0.0 when unknown (then a sink takes
            the time of the first record it is handed).
    """

    run_id: str
    run_name: str
    experiment: str
    rank: int
    world_size: int
    is_global: bool
    run_dir: str
    config: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    readme: str = ""
    resumed_from_step: int = 0
    start_time: float = 0.0

    @property
    def experiment_dir(self) -> str:
        """The run dir's parent: where trackers shared by an experiment's runs live by default
        (``mlflow.db``, ``tensorboard/``, ``summary/``), so a sweep compares side by side."""
        return os.path.dirname(self.run_dir.rstrip("/"))


class Sink:
    """Base class of every sink. The dispatcher calls it from one background thread (jsonl: the
    dispatcher's own; every other sink: a thread of its own).

    A sink declares, as class attributes: ``name`` (its registry name), ``options``
    (``{option: Option(type, default, doc)}``: all that ``sinks.<name>`` may hold,
    checked by ``load_config`` and again here), ``extra`` and ``requires`` (the
    ``msbridge[extra]`` that installs the import names it needs), and ``ranks``.
    It implements ``emit`` and ``read_back``; ``self.settings`` holds its options,
    defaults filled in.

    Lifecycle: ``open(run)`` once, ``write(records, events)`` per batch,
    ``flush()`` whenever everything handed over must be durable, and
    ``close(status)`` once (it flushes first).

    ``write`` drops the records of steps the sink already holds and the events
    in ``held_events``, then calls ``emit``. ``last_step`` is the highest step
    handed over; ``open`` sets it to ``run.resumed_from_step`` (a resumed job
    trains again from its checkpoint), and a sink that can see what it holds
    raises it in its own ``open`` (and fills ``held_events``): replaying a run
    into it again then adds nothing. A sink that finally loses something (the
    jsonl log on a full disk) appends a ``GAP`` event to ``raised``; the
    dispatcher hands it to every other sink. A sink that gives up in ``close``
    on what it still holds (a tracker still unreachable) says what in
    ``undelivered``; the run's outcome lists it with the replay that fills it.

    ``start_time`` and ``end_time`` are the training's start and end for a tracker that
    records them: the run's start time (else the first record's time) and the latest time
    of a record or event handed over. A replay hands over the same records, so a replayed
    run gets the same times as the live one.

    ``on_training_thread``: a sink whose ``write`` costs microseconds and does no I/O beyond
    a line to stdout (the console) is called in ``Dispatcher.submit``, on the training
    thread, so what it shows is never behind a slow sink. Every other sink leaves it False.

    Example:
        >>> class PrintSink(Sink):
        ...     name = "print"
        ...     options = {"prefix": Option(str, "step", "the word before each step number")}
        ...     def emit(self, records, events):
        ...         for r in records:
        ...             print(self.settings["prefix"], r.step, dict(r.values))
    """

    name = "sink"
    #: Which ranks run this sink: "all" (local metrics per rank) or "global" (rank 0 only).
    ranks = "all"
    #: Every option the sink takes; anything else in ``sinks.<name>`` is a config error.
    options: Mapping[str, Option] = {}
    #: The ``pip install 'msbridge[extra]'`` that installs ``requires`` ("" if nothing to install).
    extra = ""
    #: Import names the sink needs; a missing one is reported at config time, with the extra.
    requires: Tuple[str, ...] = ()
    #: True only for a sink as cheap as a print (see above): ``submit`` calls it on the training thread.
    on_training_thread = False

    def __init__(self, **options: Any) -> None:
        problems = check_options(self.options, options)
        if problems:
            raise ConfigError([f"sinks.{self.name}.{key}: {message}" for key, message in problems])
        self.settings: Dict[str, Any] = with_defaults(self.options, options)
        self.run: Optional[RunInfo] = None
        self.last_step = 0
        #: ``(kind, step)`` of the events the sink found it holds in ``open``; ``write`` does not hand them over again.
        self.held_events: Set[Tuple[str, int]] = set()
        #: Events this sink raised itself, for the dispatcher to hand to every other sink (it empties the list).
        self.raised: List[Event] = []
        #: What ``close`` gave up delivering ("30 records and status FINISHED ..."); "" when nothing.
        self.undelivered = ""
        self.start_time = self.end_time = 0.0

    @property
    def close_bound(self) -> float:
        """Seconds the dispatcher waits for this sink's close: its ``close_timeout`` option (else
        ``DEFAULT_CLOSE_TIMEOUT``) plus ``CLOSE_GRACE``; a sink still closing then is listed undelivered."""
        return float(self.settings.get("close_timeout", DEFAULT_CLOSE_TIMEOUT)) + CLOSE_GRACE

    def open(self, run: RunInfo) -> None:
        self.run = run
        self.last_step = run.resumed_from_step
        self.start_time = self.end_time = run.start_time

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """Hand ``emit`` the records of steps after ``last_step`` (never a step twice) and every event
        not in ``held_events``; ``end_time`` (and an unknown ``start_time``) follow the times handed over."""
        fresh = []
        for rec in records:
            if rec.step > self.last_step:
                fresh.append(rec)
                self.last_step = rec.step
        times = [t for t in (*(r.time for r in records), *(e.time for e in events)) if t > 0]
        if times:
            self.start_time = self.start_time or min(times)
            self.end_time = max(self.end_time, *times)
        if self.held_events:
            events = [ev for ev in events if (ev.kind, ev.step) not in self.held_events]
        self.emit(fresh, events)

    def emit(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """Store ``records`` (steps this sink does not hold yet, in order) and ``events``."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make everything written so far durable."""

    def close(self, status: str = FINISHED) -> None:
        self.flush()

    def describe(self, run: RunInfo) -> Dict[str, str]:
        """Where this sink writes for ``run`` (before it is opened), for the run README.

        Returns ``{"where": path or URI}``; ``msbridge view`` starts the viewers.
        """
        return {}

    def read_back(self, run: RunInfo) -> Series:
        """What this sink stored for ``run``, read with the tracker's own reader (after ``close``):
        ``{metric: [(step, value), ...]}`` in step order, a step written twice listed twice.
        The sink contract test compares it with what the sink was handed."""
        raise NotImplementedError
