"""The sink contract and the plain data that crosses it.

Sinks see only floats, strings and plain dicts: never MindSpore tensors. Every
sink gets the same ``Record`` and ``Event`` objects, so metric names are the same
in every tracker. ``Sink`` says what a sink declares and implements.

Example:
    >>> Record(step=3, rank=0, time=1700000000.0, values={"train/loss": 2.5})
    Record(step=3, rank=0, time=1700000000.0, values={'train/loss': 2.5})
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import ConfigError
from ..options import Option, check_options, with_defaults

log = logging.getLogger("msbridge")

SCHEMA_VERSION = 1
#: ``{metric: [(step, value), ...]}``: what ``Sink.read_back`` returns.
Series = Dict[str, List[Tuple[int, float]]]

# Final run states, as MLflow names them.
FINISHED = "FINISHED"
FAILED = "FAILED"
KILLED = "KILLED"
STATUSES = (FINISHED, FAILED, KILLED)
#: The event a sink returns for what it finally could not store: detail ``first_step``, ``last_step``,
#: ``records``, ``events`` (counts), ``sink``, ``reason``. The dispatcher hands it to every other sink.
GAP = "gap"
#: Seconds a sink's close may take beyond its ``close_timeout`` (its last call, ending its client).
CLOSE_GRACE = 5.0
#: Seconds into a close after which the dispatcher calls ``hurry`` on each tracker still closing.
HURRY_AFTER = 0.3
#: The largest ``close_timeout`` a sink takes (an hour): a close is always bounded.
MAX_CLOSE_TIMEOUT = 3600.0
#: The ``close_timeout`` of a sink that declares none (a file writer: its close is a flush).
DEFAULT_CLOSE_TIMEOUT = 10.0
#: A tracker's ``every_n_steps`` option (TensorBoard, MindInsight and MLflow declare it; the hand-off reads it).
EVERY_N_STEPS = Option(int, 1, "hand this tracker only the steps divisible by N, and every record that holds a metric "
                       "the record before it lacked (an evaluation, a per-window metric); jsonl keeps every step. "
                       "For a tracker whose store costs too much a step (MLflow's sqlite: docs/benchmarks.md)", low=1)
#: A tracker's ``batch_seconds`` option (MLflow declares it; its host reads it). A sink that declares it must catch
#: up on a resumed run by itself (MLflow does, from ``held()``): what waited in its queue dies with a killed process.
BATCH_SECONDS = Option(float, 5.0, "hand this tracker the batches flushed within N s of its last write together, in "
                       "its next write; the first batch and what waits at the close go at once. Nothing is "
                       "dropped, and jsonl is written at every flush. 0: a write at every flush", low=0, high=3600,
                       high_open=False)
#: The sink that is the write-ahead log: written first, on its own host; a tracker is handed a batch once it holds it.
WAL_NAME = "jsonl"


class WrongType(TypeError):
    """A sink call returned what the contract does not allow: the message names the call and both types."""


class Behind(Exception):
    """Raised by ``write`` for a batch it cannot take now (its tracker is down and what waits for it is at its
    bound): the sink took nothing of it. Its host then hands it no batch from memory, and reads the write-ahead log
    from that batch on once a later try is taken (``SinkHost``): nothing waits in memory for an outage.

    Example:
        >>> raise Behind("MLflow at http://mlflow:5000 holds 50,000 records waiting")
        Traceback (most recent call last):
        msbridge.sinks.base.Behind: MLflow at http://mlflow:5000 holds 50,000 records waiting
    """


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
    """Nested mappings as dot keys, leaves as they are: ``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": 0.1}``.
    Two keys that spell one dot key (``{"a": {"b": 1}, "a.b": 2}``) are kept apart: the later one gets ``_2``
    (``_3`` ...), and the mapping is said once per process (every tracker flattens the same params the same way).

    Example:
        >>> flatten({"a": {"b": 1}, "a.b": 2})
        {'a.b': 1, 'a.b_2': 2}
    """
    out: Dict[str, Any] = {}
    _flatten_into(out, tree, prefix)
    return out


_SAID_CLASHES: Set[Tuple[str, str]] = set()


def _flatten_into(out: Dict[str, Any], tree: Mapping[str, Any], prefix: str) -> None:
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            _flatten_into(out, value, name + ".")
            continue
        kept, n = name, 1
        while kept in out:
            n += 1
            kept = f"{name}_{n}"
        if kept != name and (name, kept) not in _SAID_CLASHES:
            _SAID_CLASHES.add((name, kept))
            log.warning("msbridge: two params flatten to the name %r (a nested key and a dotted one?); the trackers "
                        "keep the second as %r", name, kept)
        out[kept] = value


def events_series(events: Iterable[Tuple[str, int]]) -> Series:
    """``(kind, step)`` pairs as ``read_back`` gives events back: ``events/<kind>``, the count at each step.

    Example:
        >>> events_series([("anomaly", 30), ("anomaly", 30), ("gap", 41)])
        {'events/anomaly': [(30, 2.0)], 'events/gap': [(41, 1.0)]}
    """
    counts: Dict[Tuple[str, int], int] = {}
    for kind, step in events:
        counts[kind, step] = counts.get((kind, step), 0) + 1
    out: Series = {}
    for (kind, step), count in sorted(counts.items(), key=lambda item: (item[0][1], item[0][0])):
        out.setdefault(f"events/{kind}", []).append((step, float(count)))
    return out


@dataclass(frozen=True)
class Record:
    """The metrics of one training step on one rank.

    ``values`` maps a metric name (``train/loss``, ``perf/samples_per_s`` ...)
    to a float; a non-finite float is kept as it is (sinks decide how to store it).

    Example:
        >>> Record(step=3, rank=0, time=1700000000.0, values={"train/loss": 2.5}).values["train/loss"]
        2.5
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
        Event(kind='anomaly', step=3700, rank=0, time=0.0, detail={'check': 'nonfinite_loss'})
    """

    kind: str
    step: int
    rank: int
    time: float = 0.0
    detail: Mapping[str, Any] = field(default_factory=dict)


class Progress:
    """What a sink's host has handed it so far, read-only for the sink (``self.run.progress`` once open): the
    highest step handed or held, the training's start (``run.start_time``, else the first time handed) and the
    latest time handed. The host (``msbridge.sinks.handoff``) keeps it; a replayed run gets the live one's times.

    Example:
        >>> progress = Progress()
        >>> progress.last_step, progress.start_time, progress.end_time
        (0, 0.0, 0.0)
    """

    __slots__ = ("_last_step", "_start_time", "_end_time")

    def __init__(self, last_step: int = 0, start_time: float = 0.0, end_time: float = 0.0) -> None:
        self._last_step, self._start_time, self._end_time = last_step, start_time, end_time

    @property
    def last_step(self) -> int:
        """The highest step handed over or held."""
        return self._last_step

    @property
    def start_time(self) -> float:
        """When training started (``run.start_time``, else the first time handed over); 0.0 before."""
        return self._start_time

    @property
    def end_time(self) -> float:
        """The latest time of a record or event handed over (else the start)."""
        return self._end_time

    def set(self, last_step: int, start_time: float, end_time: float) -> None:
        """The host's call (``Handoff``), never a sink's: what it has handed the sink now."""
        self._last_step, self._start_time, self._end_time = last_step, start_time, end_time


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
        start_time: when training started (``time.time()``); 0.0 when unknown (then ``progress.start_time`` is
            the time of the first record handed).
        training: True when a live training opens the sink (its run plan); False for ``msbridge replay``
            and tools, where a sink need not yield the CPU to anything.
        progress: what the sink's host has handed it so far (``Progress``), in the run a sink is opened with.
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
    training: bool = False
    progress: Progress = field(default_factory=Progress, compare=False, repr=False)

    @property
    def experiment_dir(self) -> str:
        """The run dir's parent: where trackers shared by an experiment's runs live by default
        (``mlflow.db``, ``tensorboard/``, ``summary/``), so a sweep compares side by side."""
        return os.path.dirname(self.run_dir.rstrip("/"))


@dataclass(frozen=True)
class Held:
    """What a sink already holds for its run (its ``held()``): its host hands it no step up to ``last_step`` and
    none of ``events`` (``(kind, step)`` pairs), so a replay into it twice adds nothing.

    Example:
        >>> Held(last_step=120, events=frozenset({("anomaly", 37)})).last_step
        120
    """

    last_step: int = 0
    events: FrozenSet[Tuple[str, int]] = frozenset()


#: What ``write``, ``flush`` and ``close`` may return: the ``gap`` events of what the sink finally lost, which the
#: dispatcher hands to every other sink. None (or empty) for nothing.
GapEvents = Optional[Sequence[Event]]


class Sink:
    """Base class of every sink. A plug-in implements five calls, plus ``held()`` for resume:

    - ``open(run)`` once (``super().open(run)`` first: it sets ``self.run``);
    - ``write(records, events)`` per batch: the records of steps it does not hold yet, in step order, and the
      events it does not hold (its host filters every batch, see below);
    - ``flush()``: everything handed over is durable when it returns;
    - ``close(status)`` once, FINISHED, FAILED or KILLED (by default a flush);
    - ``read_back(run)``: what it stored, with the tracker's own reader (``check_sink`` compares it);
    - ``held()``: what its store already holds (a ``Held``), asked once after ``open``; by default the step a
      resumed run trains again from.

    Everything else is its host's (``SinkHost``, ``msbridge.sinks.host``), once for every sink: each call on the
    sink's own thread within a time limit (``calls.CALLS``), return types checked, and the hand-off of each batch
    (``msbridge.sinks.handoff``): no step up to ``held().last_step``, no step handed already, never a metric
    twice at a step (``names.restated`` aside), no held event; ``self.run.progress`` (``Progress``) its last step
    and times. A call that raises, returns a wrong type or overruns makes the sink undelivered; training goes on.

    A sink declares ``options`` (``{option: Option(...)}``, checked by ``load_config`` and here; ``self.settings``
    holds the values), ``extra``/``requires`` (the ``msbridge[extra]`` that installs its import names), ``ranks``
    and ``default_store``; ``register_sink("name")`` (``msbridge.sinks.registry``) names it.

    Optional, each a return value, an exception or a method:

    - gaps: ``write``/``flush``/``close`` return the ``GAP`` events of what it finally lost;
    - behind: ``write`` raises ``Behind`` for a batch it cannot take now; its host reads it from the log later;
    - ``describe(run)``: where it writes (``{"where": ...}``), for the run README; asked again after the close,
      where a ``"url"`` (a page of the closed run) is named beside it;
    - ``every_n_steps``: an option declared as ``EVERY_N_STEPS``: the hand-off then thins the steps it is handed;
    - ``batch_seconds``: an option declared as ``BATCH_SECONDS``: its host then hands it the batches of that many
      seconds in one write (MLflow's, whose every write is a transaction or a round trip);
    - ``undelivered()``: what it gave up delivering ("30 records and status FINISHED ...");
    - ``observe(undelivered)`` with ``observer = True``: the others' final ``undelivered``;
    - ``hurry()``: training has ended and its close has run ``HURRY_AFTER`` s (a throwaway thread).

    Example:
        >>> from msbridge.sinks.registry import register_sink
        >>> @register_sink("print")
        ... class PrintSink(Sink):
        ...     options = {"prefix": Option(str, "step", "the word before each step number")}
        ...     def write(self, records, events):
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
    #: Where the sink's store is unless its options place it: ``(option, template)``, the template's
    #: ``{experiment_dir}`` filled in by ``store_default``; ``()`` for a sink without a shared store.
    default_store: Tuple[str, str] = ()
    #: False for a sink that is not a store (the console's progress line): its host hands it every record and
    #: event, a resumed run's steps trained again too.
    skips_held = True
    #: True only for msbridge's own sinks as cheap as a print (the console): ``Dispatcher.submit`` calls them itself,
    #: on the thread that flushes. A plug-in's True is ignored: its sink is hosted like every other.
    in_submit = False
    #: True for a sink that reports on the others (alerts): it is closed last, after ``observe``.
    observer = False

    def __init__(self, **options: Any) -> None:
        problems = check_options(self.options, options)
        if problems:
            raise ConfigError([f"sinks.{self.name}.{key}: {message}" for key, message in problems])
        self.settings: Dict[str, Any] = with_defaults(self.options, options)
        self.run: Optional[RunInfo] = None

    @classmethod
    def store_default(cls, experiment_dir: str) -> Dict[str, str]:
        """``{option: value}`` placing the store in ``experiment_dir`` (``{}`` without ``default_store``).

        Example:
            >>> from msbridge.adapters.tensorboard_sink import TensorBoardSink
            >>> TensorBoardSink.store_default("/runs/exp")
            {'logdir': '/runs/exp/tensorboard'}
        """
        if not cls.default_store:
            return {}
        option, template = cls.default_store
        return {option: template.format(experiment_dir=experiment_dir.rstrip("/"))}

    def store(self, run: RunInfo, option: str) -> str:
        """The option's value, else its default in ``run``'s experiment dir."""
        return self.settings.get(option) or self.store_default(run.experiment_dir)[option]

    @property
    def close_bound(self) -> float:
        """Seconds the dispatcher waits for this sink's close: its ``close_timeout`` option (else
        ``DEFAULT_CLOSE_TIMEOUT``) plus ``CLOSE_GRACE``; a sink still closing then is listed undelivered."""
        return float(self.settings.get("close_timeout", DEFAULT_CLOSE_TIMEOUT)) + CLOSE_GRACE

    def open(self, run: RunInfo) -> None:
        """Connect or create files for ``run``; a subclass calls ``super().open(run)`` first."""
        self.run = run

    def held(self) -> Held:
        """What this sink's store already holds (after ``open``): by default the resumed step
        (a resumed job trains again from its checkpoint). A sink that can read its store back says more."""
        return Held(self.run.resumed_from_step if self.run is not None else 0)

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> GapEvents:
        """Store ``records`` (steps this sink does not hold yet, in order) and ``events``."""
        raise NotImplementedError

    def flush(self) -> GapEvents:
        """Make everything written so far durable."""

    def close(self, status: str = FINISHED) -> GapEvents:
        """Flush and let go of files or clients; ``status`` is FINISHED, FAILED or KILLED."""
        return self.flush()

    def read_back(self, run: RunInfo) -> Series:
        """What this sink stored for ``run``, read with the tracker's own reader (after ``close``):
        ``{metric: [(step, value), ...]}`` in step order, a step written twice listed twice. Events
        come back as ``events/<kind>`` series: the number of events of that kind at each step.
        The sink contract (``msbridge.testing.check_sink``) compares it with what the sink was handed."""
        raise NotImplementedError

    # -- optional ------------------------------------------------------------------
    def describe(self, run: RunInfo) -> Dict[str, str]:
        """Where this sink writes for ``run`` (before it is opened), for the run README.

        Returns ``{"where": path or URI}``; ``msbridge view`` starts the viewers.
        """
        return {}

    def undelivered(self) -> str:
        """What this sink gave up delivering ("30 records and status FINISHED ..."), "" when nothing:
        the run's outcome lists it (exit code 3) with the replay that fills it."""
        return ""

    def observe(self, undelivered: Mapping[str, str]) -> None:
        """An ``observer``'s final facts: every other sink's final ``undelivered`` (name -> what; only the ones
        that lack something), handed over once every other sink closed or hit its bound, before this one's
        close. By default nothing."""

    def hurry(self) -> None:
        """Training has ended and this sink's close is still running (see the class docstring); called on a
        throwaway thread, so it must be safe beside the sink's own. By default nothing."""
