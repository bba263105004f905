"""The TensorBoard sink: TensorBoard event files, one directory per run and per rank.

Layout under ``logdir`` (default ``{experiment_dir}/tensorboard``, shared by an
experiment's runs so a sweep compares side by side)::

    {logdir}/{run_name}/           global metrics (train/global_loss, dist/...), README, hparams
    {logdir}/{run_name}/rank_{r}/  rank r's own metrics (train/loss, perf/...) and events

``tensorboard --logdir {logdir}`` then lists runs and ranks, and the ranks'
curves of one tag overlay.

Writing is synchronous, with no thread: the dispatcher already runs sinks off
the training thread, and tensorboardX's ``SummaryWriter.flush()`` does not wait
for events still in its queue. Every batch is in the file (handed to the OS, its
size checked) before ``write`` returns, so a killed process loses none of it and
a running TensorBoard shows it at its next reload; ``flush`` and ``close`` fsync.
Not every batch: the jsonl log is fsynced every batch, and after a machine crash
a resumed run reads these files back and writes the steps they lack from it (the
bench's setup (e): this thread's CPU a step 20.5 us with two fsyncs a batch, 14.8
without, medians of 3 interleaved runs, 2026-12-07). A record's scalars are
encoded by hand (``_eventwire``: ~0.01 ms, where tensorboardX's protobuf classes take ~0.3 ms
under MindSpore's pure-Python protobuf) and framed by MindSpore's C++ event
writer; tensorboardX builds the rare events (text, hparams). On a full disk
events wait, bounded, and go into a fresh event file when space returns
(``_diskwait``).

- Tags are the metric names. A name TensorBoard would mangle is cleaned to a
  valid tag (tensorboardX's rule: ``[-/\\w.]`` only, no leading ``/``), and one
  warning per batch lists the mapping.
- NaN and +-inf are written as they are. TensorBoard stores them and draws a
  marker at a non-finite point; the curve is not cut and nothing raises.
- A ``histogram`` event (``histograms``) is a histogram summary under its tag
  (``weights/<param>``) in the rank's directory, shown in the HISTOGRAMS tab.
- TensorBoard stores scalars as float32; a value beyond float32's range is stored as +-inf.
- The global rank's directory holds a Custom Scalars layout (``LAYOUT``): the loss and
  global loss, grad norm, lr and throughput charts first, open; then the perf charts, open, MFU and
  tokens seen first, TFLOP/s, data wait and step time; loss scale, overflow and skipped steps,
  memory peaks and the ranks' losses folded below. ``http://127.0.0.1:6006/#custom_scalars`` opens on it.
- At close the global rank writes the hparams: ``params`` flattened to dot
  keys, plus ``msbridge.*`` settings. They go into the run's own directory,
  where the HPARAMS tab looks for them; tensorboardX's ``add_hparams`` would use
  a new timestamped subdirectory. Next to them go ``hparams/final_loss``,
  ``hparams/final_global_loss``, ``hparams/best_loss`` and the objective's ``hparams/objective_best``,
  ``hparams/objective_best_step``, ``hparams/objective_final`` (metrics.md). A run of a sweep (``sweep_id`` set)
  adds ``msbridge.trial_state``, its trial's state as Optuna names it and MLflow's tag of that name says it
  (``mlflow_tracker.run.view.trial_state``: COMPLETE, PRUNED or FAIL); a pruned run's session ends as a success, as its exit
  code does. No experiment
  summary is written, so TensorBoard builds the table from every run's own
  hparams and a sweep whose runs differ in keys still shows all of them. The
  session's start and end times are the training's (``run.progress``: kept by the sink's host).
- On resume, and on a replay into a run it already holds, ``open`` reads the run's own event files back
  (``held()``): the steps each directory holds and the events they hold are skipped. Files are created at the
  first thing to write, so a replay that brings nothing new adds no file and no point; a new event file is
  added next to the old ones otherwise.
- ``share_writer``: when another library already writes TensorBoard events for
  this rank (mindformers' ``tensorboard:``), everything goes through its
  tensorboardX writer instead (one event file, its queue and its flush).

Example:
    >>> sink = TensorBoardSink(logdir="/tmp/tb")
    >>> sink.open(run)
    >>> sink.write([Record(1, 0, time.time(), {"train/loss": 2.3})], [])
    >>> sink.close("FINISHED")
"""
from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from msbridge.adapters._diskwait import EVENT, DiskWait, WaitsForSpace
from msbridge.adapters._eventwire import Layout, custom_scalars_summary, held_values, histogram_summary
from msbridge.adapters.mlflow_tracker.run.view import PRUNED_TAG, STATE_TAG, trial_state
from msbridge.adapters._tensorboard_files import EventFile, SharedFile, import_tensorboardx
from msbridge.adapters._tracker_facts import tracker_params
from msbridge.names import (DATA_WAIT_PCT, DEVICE_PEAK_MB, GLOBAL_LOSS, GRAD_NORM, HISTOGRAM, HOST_RSS_PEAK_MB, LOSS,
                            LOSS_MAX, LOSS_MIN, LOSS_SCALE, LR, MFU, OBJECTIVE_BEST, OBJECTIVE_BEST_STEP,
                            OBJECTIVE_FINAL, OVERFLOW, SAMPLES_PER_S, STEP_TIME, TFLOPS, TOKENS_PER_S, TOKENS_SEEN,
                            WEIGHTS_HISTOGRAM_PREFIX, is_global_metric, rank_loss)
from msbridge.options import Option
from msbridge.paths import safe_component
from msbridge.sinks.base import (
    EVERY_N_STEPS,
    FAILED,
    FINISHED,
    KILLED,
    Event,
    Held,
    Record,
    RunInfo,
    Series,
    Sink,
    events_series,
    flatten,
)
from msbridge.sinks.registry import register_sink
from msbridge.sweep.trial import PRUNED_EVENT

log = logging.getLogger("msbridge")

_INVALID_TAG = re.compile(r"[^-/\w.]")
#: msbridge settings logged with the hparams, as ``msbridge.<name>``.
_SETTINGS = ("experiment", "sweep_id", "flush_steps", "step_interval", "seq_length")
#: Run status -> hparams session status (the hparams proto has no "aborted"; run/status says KILLED).
_STATUS = {FINISHED: "STATUS_SUCCESS", FAILED: "STATUS_FAILURE", KILLED: "STATUS_FAILURE"}


def clean_tag(name: str) -> str:
    """``name`` as a tag TensorBoard shows unchanged: only ``[-/\\w.]``, no leading ``/``."""
    return _INVALID_TAG.sub("_", name).lstrip("/") or "_"


def _tags(*names: str) -> Tuple[str, ...]:
    """Regexes matching exactly these tags (Custom Scalars matches a chart's tags as regexes)."""
    return tuple(f"^{re.escape(clean_tag(name))}$" for name in names)


#: The Custom Scalars tab: what matters first (``names.HEADLINE``'s order), then what a step is worth (MFU and
#: tokens seen first), the rest folded.
LAYOUT: Layout = (
    ("msbridge: training", False, (
        ("loss", _tags(LOSS, GLOBAL_LOSS)),
        ("grad norm", _tags(GRAD_NORM)),
        ("learning rate", _tags(LR)),
        ("throughput (samples/s)", _tags(SAMPLES_PER_S)),
        ("throughput (tokens/s)", _tags(TOKENS_PER_S)),
    )),
    ("msbridge: perf", False, (
        ("MFU (%)", _tags(MFU)),
        ("tokens seen", _tags(TOKENS_SEEN)),
        ("achieved TFLOP/s per device", _tags(TFLOPS)),
        ("data wait (% of the step)", _tags(DATA_WAIT_PCT)),
        ("step time (ms)", _tags(STEP_TIME)),
    )),
    ("msbridge: more", True, (
        ("loss scale", _tags(LOSS_SCALE)),
        # health/skipped_steps is msbridge.health.runner.SKIPPED_STEPS (importing health here costs 0.3 s)
        ("overflow and skipped steps", _tags(OVERFLOW, "health/skipped_steps")),
        ("memory peak in the window (MB)", _tags(HOST_RSS_PEAK_MB, DEVICE_PEAK_MB)),
        ("loss of each rank", _tags(LOSS_MIN, LOSS_MAX) + (rf"^{re.escape(rank_loss(0)[:-1])}\d+$",)),
    )),
)


def _as_hparams(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Dot keys with values the hparams plugin takes: str, bool, int, float; others as JSON; None dropped.

    Example:
        >>> _as_hparams({"optimizer": {"lr": 0.01, "betas": [0.9, 0.95]}})
        {'optimizer.lr': 0.01, 'optimizer.betas': '[0.9, 0.95]'}
    """
    return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
            for k, v in flatten(tree, prefix).items() if v is not None}


@register_sink("tensorboard")
class TensorBoardSink(WaitsForSpace, Sink):
    """Writes the metric stream as TensorBoard event files; every rank writes its own metrics.

    Example:
        >>> monitor = BridgeMonitor({"sinks": {"jsonl": {}, "tensorboard": {"logdir": "./tb"}}})
        >>> model.train(1, ds, callbacks=[monitor], dataset_sink_mode=False)
        >>> # then: tensorboard --logdir ./tb --host 127.0.0.1
    """

    ranks = "all"
    default_store = ("logdir", "{experiment_dir}/tensorboard")
    options = {"logdir": Option(str, None, "the directory to point tensorboard --logdir at; "
                                           f"default {default_store[1]}, beside the run dirs"),
               "every_n_steps": EVERY_N_STEPS}
    extra = "tensorboard"
    requires = ("tensorboardX",)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._tbx = import_tensorboardx()
        self._local: Optional[EventFile] = None
        self._global: Optional[EventFile] = None
        self._routes: Dict[str, Tuple[str, EventFile]] = {}
        self._shared: Any = None
        self._final: Dict[str, float] = {}
        self._best: Dict[str, float] = {}
        self._status_held: Optional[str] = None  # the last run/status its files hold
        self._pruned = False  # a `pruned` event was written: the trial's state in the hparams
        self._held: Dict[str, Set[int]] = {}  # directory -> the steps whose scalars its event files hold
        self._held_events: Set[Tuple[str, int]] = set()  # (kind, step) of the events they hold
        self._wait = DiskWait(self.name)  # what a full disk keeps out of the files, until space returns
        self._closed = False

    def _logdir(self, run: RunInfo) -> str:
        return os.path.abspath(os.path.expanduser(self.store(run, "logdir")))

    def run_dir(self, run: RunInfo) -> str:
        """``{logdir}/{run_name}``: the run's global directory; ranks are its ``rank_{r}`` subdirs."""
        if self._shared is not None:
            return os.path.abspath(self._shared.logdir)
        return os.path.join(self._logdir(run), safe_component(run.run_name))

    def share_writer(self, writer: Any) -> None:
        """Write everything (this rank's and the run's metrics alike) through ``writer``, a tensorboardX
        ``SummaryWriter`` another library opened for this rank, instead of files of our own. Before ``open``."""
        self._shared = writer

    def open(self, run: RunInfo) -> None:
        super().open(run)
        self._closed = False
        self._pruned = False
        self._held_events = set()
        self._wait.at(self.run_dir(run), run.run_dir)
        if self._shared is not None:
            self._open_files()
        else:
            self._read_held(run)

    def _read_held(self, run: RunInfo) -> None:
        """What this rank's event files (and the run dir's, on the global rank) already hold: each directory's
        steps (a replay writes exactly the others: the holes a failed write left, and the tail), the events,
        the last status."""
        self._held = {}
        for folder in [self._local_dir(run)] + ([self.run_dir(run)] if run.is_global else []):
            paths = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
            steps = set()
            for step, tag, scalar, text in held_values(paths):
                if scalar and not tag.startswith("hparams/"):
                    steps.add(step)
                else:
                    self._held_event(tag, step, text)
            if steps:  # a new run holds none: its writes skip the per-record check
                self._held[folder] = steps

    def held(self) -> Held:
        return Held(super().held().last_step, frozenset(self._held_events))

    def _held_event(self, tag: str, step: int, text: Optional[bytes]) -> None:
        if tag.startswith("events/"):
            self._held_events.add((tag[len("events/"):], step))
        elif tag.startswith(WEIGHTS_HISTOGRAM_PREFIX):
            self._held_events.add((HISTOGRAM, step))
        elif tag == "run/status" and text is not None:
            self._status_held = text.decode("utf-8", "replace")

    def _local_dir(self, run: RunInfo) -> str:
        return os.path.join(self.run_dir(run), f"rank_{run.rank}")

    def _all_held(self, rec: Record) -> bool:
        """Whether the event files hold this record's step in every directory its metrics go to."""
        assert self.run is not None
        local, run_dir = self._held.get(self._local_dir(self.run), ()), self._held.get(self.run_dir(self.run), ())
        return all(rec.step in (run_dir if self.run.is_global and is_global_metric(name) else local)
                   for name in rec.values)

    def _open_files(self) -> None:
        """The event files of this session, at its first write (the README first, on the global rank)."""
        assert self.run is not None, "TensorBoardSink.write before open"
        run, run_dir = self.run, self.run_dir(self.run)
        if self._shared is not None:
            self._local = SharedFile(self._tbx, self._shared)
        else:
            self._local = EventFile(self._tbx, self._local_dir(run), self._wait)
        if run.is_global:
            self._global = self._local if self._shared is not None else EventFile(self._tbx, run_dir, self._wait)
            self._global.encoded(custom_scalars_summary(LAYOUT), run.resumed_from_step, run.start_time or time.time())
            if run.readme:
                self._global.text("run/README", run.readme, run.resumed_from_step)
        self._flush_files()

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> List[Event]:
        if self._held:
            records = [rec for rec in records if not self._all_held(rec)]
        return self._write_or_wait(list(records), list(events))

    def _write_files(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        if self._local is None:
            self._open_files()
        assert self._local is not None
        renamed: Dict[str, str] = {}
        for rec in records:
            step_values: Dict[EventFile, Dict[str, float]] = {}  # one event per directory and step
            for name, value in rec.values.items():
                tag, target = self._routes.get(name) or self._route(name, renamed)
                if self._held and rec.step in self._held.get(target.path, ()):
                    continue
                values = step_values.get(target)
                if values is None:
                    values = step_values[target] = {}
                values[tag] = value
            for target, values in step_values.items():
                target.scalars(rec.step, rec.time, values)
            self._track(rec)
        for ev in events:
            self._pruned = self._pruned or ev.kind == PRUNED_EVENT
            if ev.kind == HISTOGRAM:  # the HISTOGRAMS tab, on this rank's directory
                self._local.encoded(histogram_summary(clean_tag(ev.detail["tag"]), ev.detail), ev.step, ev.time,
                                    EVENT)
                continue
            detail = json.dumps(dict(ev.detail), default=str, sort_keys=True)
            self._local.text(clean_tag(f"events/{ev.kind}"), f"rank {ev.rank}, step {ev.step}: `{detail}`", ev.step,
                             EVENT)
        if renamed:
            mapping = ", ".join(f"{k!r} -> {v!r}" for k, v in renamed.items())
            log.warning("msbridge: tensorboard: metric names that are not valid TensorBoard tags "
                        "are written as: %s", mapping)
        if self._shared is not None:  # the owner's writer queues: hand the batch over now
            self._flush_files()

    def _flush_files(self) -> None:
        for target in self._files():
            target.flush()

    def _close_files(self, status: str) -> None:
        """The hparams and the status: the last writes (``WaitsForSpace.close``)."""
        if self._local is None:
            if self._status_held == status:  # a replay that brought nothing new: add nothing
                return
            self._open_files()
        if self._global is not None:
            self._write_hparams(status)
        for target in self._files():
            target.text("run/status", status, self.run.progress.last_step)

    def _shut_files(self) -> None:
        for target in self._files():
            target.close()
        self._local = self._global = None

    def describe(self, run: RunInfo) -> Dict[str, str]:
        return {"where": self.run_dir(run)}

    def read_back(self, run: RunInfo) -> Series:
        """Every scalar under the run's directory (its ranks' subdirs too), and each ``events/<kind>`` text
        counted per step, read with TensorBoard's ``EventAccumulator``."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        out: Series = {}
        events: List[Tuple[str, int]] = []
        files = glob.glob(os.path.join(self.run_dir(run), "**", "events.out.tfevents.*"), recursive=True)
        for path in sorted({os.path.dirname(p) for p in files}):
            acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
            events += [(tag[len("events/"):], e.step) for tag in acc.Tags()["tensors"] if tag.startswith("events/")
                       for e in acc.Tensors(tag)]
        return {**{tag: sorted(points, key=lambda p: p[0]) for tag, points in out.items()}, **events_series(events)}

    # -- internals ----------------------------------------------------------------
    def _files(self) -> List[EventFile]:
        return list(dict.fromkeys(f for f in (self._global, self._local) if f is not None))

    def _route(self, name: str, renamed: Dict[str, str]) -> Tuple[str, EventFile]:
        """The tag and directory of a metric, decided once per name."""
        assert self._local is not None
        target = self._global if self._global is not None and is_global_metric(name) else self._local
        tag = base = clean_tag(name)
        n = 1
        while tag in target.tags:  # two names cleaned to one tag: keep both series apart
            n += 1
            tag = f"{base}_{n}"
        if tag != name:
            renamed[name] = tag
        target.tags[tag] = name
        self._routes[name] = (tag, target)
        return tag, target

    def _track(self, rec: Record) -> None:
        for name in (LOSS, GLOBAL_LOSS, OBJECTIVE_BEST, OBJECTIVE_BEST_STEP, OBJECTIVE_FINAL):
            value = rec.values.get(name)
            if value is None:
                continue
            self._final[name] = value
            if math.isfinite(value) and value < self._best.get(name, math.inf):
                self._best[name] = value

    def _state(self, status: str) -> str:
        """The trial's state, as MLflow's tag says it: from the status, a ``pruned`` event written or held, and the
        objective's best."""
        pruned = self._pruned or any(kind == PRUNED_EVENT for kind, _ in self._held_events)
        best = self._final.get(OBJECTIVE_BEST)
        return trial_state(status, {PRUNED_TAG: ""} if pruned else {}, {} if best is None else {OBJECTIVE_BEST: best})

    def _write_hparams(self, status: str) -> None:
        """The run's hparams and final metrics into its global dir, where the HPARAMS tab finds them."""
        assert self.run is not None and self._global is not None
        run, tbx = self.run, self._tbx
        hparams = tracker_params(_as_hparams(dict(run.config.get("params") or {})), "TensorBoard's HParams")
        settings = {k: run.config.get(k) for k in _SETTINGS}
        settings.update(world_size=run.world_size, batch_size=run.metadata.get("batch_size"))
        hparams.update(_as_hparams(settings, "msbridge."))
        if run.config.get("sweep_id"):
            hparams[STATE_TAG] = self._state(status)
        metrics = {"hparams/final_loss": self._final.get(LOSS),
                   "hparams/final_global_loss": self._final.get(GLOBAL_LOSS),
                   "hparams/best_loss": self._best.get(GLOBAL_LOSS, self._best.get(LOSS)),
                   **{f"hparams/{n.replace('/', '_')}": self._final.get(n)
                      for n in (OBJECTIVE_BEST, OBJECTIVE_BEST_STEP, OBJECTIVE_FINAL)}}
        metrics = {k: v for k, v in metrics.items() if v is not None}
        _, start, end = tbx.summary.hparams(hparams, metrics)
        plugin = end.value[0].metadata.plugin_data
        data = tbx.HParamsPluginData.FromString(plugin.content)
        progress = self.run.progress
        started, ended = progress.start_time or time.time(), progress.end_time or time.time()
        data.session_end_info.status = tbx.Status.Value(_STATUS.get(status, "STATUS_UNKNOWN"))
        data.session_end_info.end_time_secs = ended
        plugin.content = data.SerializeToString()
        start_plugin = start.value[0].metadata.plugin_data
        start_data = tbx.HParamsPluginData.FromString(start_plugin.content)
        start_data.session_start_info.start_time_secs = started
        start_plugin.content = start_data.SerializeToString()
        self._global.summary(start, progress.last_step, started)
        if metrics:
            values = [tbx.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
            self._global.summary(tbx.Summary(value=values), progress.last_step, ended)
        self._global.summary(end, progress.last_step, ended)
