"""The MindInsight sink: MindSpore Summary files that MindInsight 2.3 lists and plots.

Layout under ``summary_base_dir`` (default ``{experiment_dir}/summary``, shared
by an experiment's runs)::

    {summary_base_dir}/{run_name}_rank_{r}/events.out.events.summary.{time}.{r}.{host}_MS
    {summary_base_dir}/{run_name}_rank_{r}/events.out.events.summary.{time}.{r}.{host}_lineage

MindInsight 2.3 looks for summary files in its base dir and in the base dir's
*direct* subdirectories only, so ``{run_name}/rank_{r}`` would be invisible;
one flat directory per run and rank makes
``mindinsight start --summary-base-dir {summary_base_dir}`` list every rank of
every run as a train job (at most 999 per base dir, MindInsight's own limit).

Each record becomes one summary ``Event`` (MindSpore's ``summary_pb2`` message,
encoded by ``_eventwire.scalar_event`` byte for byte as MindSpore's protobuf
class would, about 20x faster; the TensorBoard sink shares that encoder).
MindSpore's C++ event writer (length, masked CRC32C, body, masked CRC32C)
writes it, as MindSpore's ``SummaryWriter`` would (its version event first,
read-only once closed), called from the sink's own thread; each event is handed
to the OS at once, so a running MindInsight shows it at its next reload, and
``flush`` adds fsync. On a full disk events wait, bounded, and go into a fresh
file pair when space returns (``_diskwait``).
``SummaryRecord`` is not used: its writer process busy-polls and burns a CPU
core even when idle. An open sink costs nothing between calls.

- Tags are the metric names (``perf/step_time_ms``), except that MindInsight lists
  a job's tags sorted by name and its dashboard shows the first two: the headline
  metrics (``names.HEADLINE``) lead with their place, ``1_train/loss``,
  ``2_train/global_loss``, ``3_train/grad_norm``, ``4_train/lr``,
  ``5_perf/samples_per_s``, ``6_perf/tokens_per_s`` (``mindinsight_tag``), so the
  loss comes first. MindInsight shows a scalar as ``<tag>/scalar``
  (``1_train/loss/scalar``) and accepts the ``/``. It keeps 1000 points per tag
  (reservoir-sampled beyond that) and 300 tags per train job.
- Values are stored as float32 (the summary format's ``scalar_value``); one
  beyond float32's range becomes +-inf.
- NaN and +-inf are written as they are. MindInsight reads them and its REST API
  returns the point with ``"value": null``.
- A ``histogram`` event (``histograms``) is a histogram summary under its tag,
  which MindInsight shows as ``weights/<param>/histogram``.
- Any other ``Event`` becomes a scalar ``events/<kind>`` at its step whose value is the
  number of such events at that step (MindInsight has no text plugin; the
  details are in the jsonl log).
- Lineage: a ``TrainLineage`` (device_num, batch_size, and learning_rate,
  optimizer, epoch, loss_function when ``params`` has them at the top level)
  plus user-defined info: ``params`` flattened to dot keys and ``msbridge.*``
  run facts, ``msbridge.status`` last. MindInsight's lineage page shows them as
  ``user_defined/<key>`` columns.
- On resume, and on a replay into a run it already holds, ``open`` reads the
  rank's summary and lineage files back: steps up to the last one they hold
  (or ``run.resumed_from_step``) and the events they hold are skipped. Files
  are created at the first thing to write, so a replay that brings nothing new
  adds no file and no point; otherwise a new file pair is added (MindInsight
  reads a directory's files in time order).

Example:
    >>> sink = MindInsightSink(summary_base_dir="/tmp/summary")
    >>> sink.open(run)
    >>> sink.write([Record(1, 0, time.time(), {"train/loss": 2.3})], [])
    >>> sink.close("FINISHED")
"""
from __future__ import annotations

import glob
import json
import os
import platform
import time
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence

from msbridge.adapters._diskwait import EVENT, META, RECORD, DiskWait, WaitingFile, WaitsForSpace
from msbridge.adapters._eventwire import (
    MINDSPORE_VALUE,
    held_values,
    histogram_summary,
    read_records,
    scalar_event,
    summary_event,
)
from msbridge.adapters._tracker_facts import tracker_params
from msbridge.names import HEADLINE, HISTOGRAM, WEIGHTS_HISTOGRAM_PREFIX
from msbridge.options import Option
from msbridge.paths import safe_component
from msbridge.sinks.base import EVERY_N_STEPS, Event, Held, Record, RunInfo, Series, Sink, flatten
from msbridge.sinks.registry import register_sink

_INT32 = 2 ** 31
_READ_ONLY = 0o400  # a finished summary file, as MindSpore's writers leave it
#: TrainLineage.HyperParameters field -> (its type, the top-level ``params`` keys it is taken from).
_HYPER_PARAMETERS = {
    "learning_rate": (float, ("learning_rate", "lr")),
    "optimizer": (str, ("optimizer",)),
    "epoch": (int, ("epoch", "epochs")),
    "batch_size": (int, ("batch_size",)),
    "loss_function": (str, ("loss_function", "loss")),
}


#: MindInsight's tag of each headline metric: its place first, so a job's sorted tags start with them.
_HEADLINE_TAGS = {name: f"{place}_{name}" for place, name in enumerate(HEADLINE, 1)}
_METRIC_OF_TAG = {tag: name for name, tag in _HEADLINE_TAGS.items()}


def mindinsight_tag(name: str) -> str:
    """The tag a metric has in MindInsight: ``1_train/loss`` for the loss, the name itself for most.

    Example:
        >>> mindinsight_tag("train/loss"), mindinsight_tag("perf/step_time_ms")
        ('1_train/loss', 'perf/step_time_ms')
    """
    return _HEADLINE_TAGS.get(name, name)


def rank_dir(summary_base_dir: str, run_name: str, rank: int) -> str:
    """The train job directory of one rank: a direct subdirectory of the base dir."""
    return os.path.join(summary_base_dir, f"{safe_component(run_name)}_rank_{rank}")


@register_sink("mindinsight")
class MindInsightSink(WaitsForSpace, Sink):
    """Writes this rank's records, events and lineage as a MindInsight train job.

    Example:
        >>> sinks: {jsonl: {}, mindinsight: {summary_base_dir: /data/summary}}
        >>> # then: mindinsight start --summary-base-dir /data/summary --port 8080
    """

    ranks = "all"
    default_store = ("summary_base_dir", "{experiment_dir}/summary")
    options = {"summary_base_dir": Option(str, None, "the directory to start MindInsight on; "
                                                     f"default {default_store[1]}, beside the run dirs"),
               "every_n_steps": EVERY_N_STEPS}
    requires = ("mindspore",)  # MindSpore's summary writer; MindInsight itself runs elsewhere

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._holds = Held()
        self.dir = ""
        self._summary: Optional[WaitingFile] = None  # the summary file (``_MS``)
        self._lineage: Optional[WaitingFile] = None  # the lineage file
        self._stem = ""  # the file name both share, up to the suffix
        self._lineage_event: Any = None  # mindspore's lineage_pb2.LineageEvent
        self._init_event = b""  # the version event MindSpore's SummaryWriter opens a summary file with
        self._prefixes: Dict[str, bytes] = {}
        self._status_held: Optional[str] = None  # the last msbridge.status its lineage files hold
        self._wait = DiskWait(self.name)  # what a full disk keeps out of the files, until space returns
        self._closed = False

    def base_dir(self, run: RunInfo) -> str:
        return os.path.abspath(self.store(run, "summary_base_dir"))

    def open(self, run: RunInfo) -> None:
        from mindspore.train.lineage_pb2 import LineageEvent
        from mindspore.train.summary._summary_adapter import package_init_event

        super().open(run)
        self._lineage_event = LineageEvent
        self._init_event = package_init_event().SerializeToString()
        self._closed = False
        self._holds = Held(run.resumed_from_step)
        self.dir = rank_dir(self.base_dir(run), run.run_name, run.rank)
        os.makedirs(self.dir, exist_ok=True)  # a directory it cannot make fails here, before training
        self._wait.at(self.dir, run.run_dir)
        self._read_held()

    def held(self) -> Held:
        return self._holds

    def _read_held(self) -> None:
        """What this rank's files already hold: the last step of a metric, the events, the last status."""
        last, events = self._holds.last_step, set()
        for step, tag, scalar, _ in held_values(sorted(glob.glob(os.path.join(self.dir, "*_MS")))):
            if tag.startswith("events/"):
                events.add((tag[len("events/"):], step))
            elif tag.startswith(WEIGHTS_HISTOGRAM_PREFIX):
                events.add((HISTOGRAM, step))
            elif scalar:
                last = max(last, step)
        self._holds = Held(last, frozenset(events))
        for path in sorted(glob.glob(os.path.join(self.dir, "*_lineage"))):
            for body in read_records(path):
                try:
                    event = self._lineage_event.FromString(body)
                except Exception:  # an event cut by a killed writer (protobuf's DecodeError)
                    continue
                for item in event.user_defined_info.user_info:
                    self._status_held = _get(item.map_str, "msbridge.status") or self._status_held

    def _open_files(self) -> None:
        """This session's summary and lineage files, at its first write."""
        assert self.run is not None, "MindInsightSink.write before open"
        run = self.run
        os.makedirs(self.dir, exist_ok=True)
        self._stem = self._new_stem(run.rank)
        self._summary = WaitingFile(self._wait, self.dir, lambda: self._path("_MS"), self._init_event, _READ_ONLY)
        self._lineage = WaitingFile(self._wait, self.dir, lambda: self._path("_lineage"), mode=_READ_ONLY)
        self._lineage.write(self._train_lineage(run).SerializeToString(), kind=META)
        info = {**tracker_params(flatten(dict(run.config.get("params") or {})), "MindInsight's lineage"),
                **self._run_facts(run)}
        self._write_user_info(info)
        self._flush_files()

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> List[Event]:
        return self._write_or_wait(list(records), list(events))

    def undelivered(self) -> str:
        """What it lost (``WaitsForSpace``); a hole before later written steps is named as one a replay cannot fill."""
        text = super().undelivered()
        last = self.run.progress.last_step if self.run is not None else 0
        holes = [f"{g['first_step']}-{g['last_step']}" for g in self._wait.lost if g["last_step"] < last]
        if holes:
            text += (f"; steps {', '.join(holes)} stay missing after a replay too: MindInsight drops points that go "
                     "back a step, so a replay writes only the steps after the last one its files hold")
        return text

    def _path(self, suffix: str) -> str:
        """The file of ``suffix``: the shared stem's first, a fresh stem's after a full disk."""
        if os.path.exists(self._stem + suffix):
            self._stem = self._new_stem(self.run.rank)
        return self._stem + suffix

    def _write_files(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        if self._summary is None:
            self._open_files()
        for rec in records:
            if not rec.values:
                continue
            self._scalars(rec.step, rec.time, {mindinsight_tag(k): v for k, v in rec.values.items()})
        for ev in events:
            if ev.kind == HISTOGRAM:
                self._summary.write(summary_event(ev.step, ev.time, histogram_summary(
                    ev.detail["tag"], ev.detail, mindspore=True)), ev.step, EVENT)
        counts = Counter((ev.step, ev.kind) for ev in events if ev.kind != HISTOGRAM)
        wall = max((ev.time for ev in events), default=0.0) or time.time()
        for step, kind in sorted(counts):  # in step order: MindInsight drops later points on a step going back
            self._scalars(step, wall, {f"events/{kind}": counts[step, kind]}, EVENT)

    def _flush_files(self) -> None:
        for file in (self._summary, self._lineage):
            if file is not None:  # None: nothing opened yet
                file.flush()

    def _close_files(self, status: str) -> None:
        """The status: the last write (``WaitsForSpace.close``)."""
        if self._summary is None:
            if self._status_held == status:  # a replay that brought nothing new: add nothing
                return
            self._open_files()
        self._write_user_info({"msbridge.status": status})

    def _shut_files(self) -> None:
        for file in (self._summary, self._lineage):
            if file is not None:
                file.close()  # read-only once finished, as MindSpore leaves its files
        self._summary = self._lineage = None

    def describe(self, run: RunInfo) -> Dict[str, str]:
        return {"where": rank_dir(self.base_dir(run), run.run_name, run.rank)}

    def read_back(self, run: RunInfo) -> Series:
        """The scalars of this rank's summary files under their metric names, parsed with MindSpore's
        ``summary_pb2.Event`` (MindInsight's own read, over its REST API, is in
        tests/adapters/test_mindinsight_sink.py)."""
        from mindspore.train.summary_pb2 import Event as SummaryEvent

        out: Series = {}
        for path in sorted(glob.glob(os.path.join(rank_dir(self.base_dir(run), run.run_name, run.rank), "*_MS"))):
            for body in read_records(path):
                event = SummaryEvent.FromString(body)
                for value in event.summary.value:
                    name = _METRIC_OF_TAG.get(value.tag, value.tag)
                    out.setdefault(name, []).append((event.step, value.scalar_value))
        return {tag: sorted(points, key=lambda p: p[0]) for tag, points in out.items()}

    # -- helpers -------------------------------------------------------------
    def _new_stem(self, rank: int) -> str:
        """MindSpore's file name; a later second if a file of this second exists (a quick resume)."""
        stamp, host = int(time.time()), platform.node() or "localhost"
        while True:
            stem = os.path.join(self.dir, f"events.out.events.summary.{stamp}.{rank}.{host}")
            if not (os.path.exists(stem + "_MS") or os.path.exists(stem + "_lineage")):
                return stem
            stamp += 1

    def _scalars(self, step: int, wall_time: float, values: Mapping[str, float], kind: str = RECORD) -> None:
        """One summary event, handed to the OS (MindInsight sees it at its next reload), or waiting for space."""
        assert self._summary is not None
        self._summary.write(scalar_event(step, wall_time, values, MINDSPORE_VALUE, self._prefixes), step, kind)

    def _run_facts(self, run: RunInfo) -> Dict[str, Any]:
        return {"msbridge.run_id": run.run_id, "msbridge.run_name": run.run_name,
                "msbridge.experiment": run.experiment, "msbridge.rank": run.rank,
                "msbridge.world_size": run.world_size, "msbridge.status": "RUNNING"}

    def _train_lineage(self, run: RunInfo) -> Any:
        event = self._lineage_event(wall_time=time.time())
        hyper = event.train_lineage.hyper_parameters
        hyper.device_num = run.world_size
        if isinstance(run.metadata.get("parallel_mode"), str):
            hyper.parallel_mode = run.metadata["parallel_mode"]
        # the job's own params first, then what the callback measured (batch_size)
        params = {"batch_size": run.metadata.get("batch_size"), **(run.config.get("params") or {})}
        for field, (kind, keys) in _HYPER_PARAMETERS.items():
            value = next((params[k] for k in keys if k in params), None)
            if isinstance(value, Mapping):  # e.g. optimizer: {type: AdamW, ...}
                value = value.get("type")
            if kind is str and isinstance(value, str):
                setattr(hyper, field, value)
            elif kind is not str and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and (kind is float or float(value).is_integer()):
                setattr(hyper, field, kind(value))
        return event

    def _write_user_info(self, info: Mapping[str, Any]) -> None:
        """One user-defined lineage event: each key in the map its value's type calls for."""
        event = self._lineage_event(wall_time=time.time())
        for key, value in info.items():
            item = event.user_defined_info.user_info.add()
            if isinstance(value, int) and not isinstance(value, bool) and -_INT32 <= value < _INT32:
                _put(item.map_int32, key, value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                _put(item.map_double, key, float(value))
            elif isinstance(value, str):
                _put(item.map_str, key, value)
            else:
                _put(item.map_str, key, json.dumps(value, default=str))
        assert self._lineage is not None
        self._lineage.write(event.SerializeToString(), kind=META)


def _put(field: Any, key: str, value: Any) -> None:
    """One entry of a lineage map field, in either shape MindSpore's generated ``lineage_pb2`` has.

    Up to MindSpore 2.9 the fields are repeated entry messages (``add(key=, value=)``); 2.10's are
    real protobuf maps (``ScalarMap``, no ``add``). Both write the same bytes.
    """
    if hasattr(field, "add"):
        field.add(key=key, value=value)
    else:
        field[key] = value


def _get(field: Any, key: str) -> Any:
    """The value of ``key`` in a lineage map field of either shape (see ``_put``), or None."""
    if hasattr(field, "add"):
        return next((entry.value for entry in field if entry.key == key), None)
    return field.get(key)
