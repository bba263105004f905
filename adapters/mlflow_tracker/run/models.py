"""Each checkpoint of a run as an MLflow 3 LoggedModel, its step's metrics linked to it.

A ``checkpoint`` event (``ModelCheckpoint``'s and mindformers' ``CheckpointMonitor``'s files, seen by
``capture.checkpoints``; the health action ``checkpoint_and_stop``'s healthy weights) becomes one LoggedModel of
the run, named ``<run name>-step<N>`` (``model_name``). N is the step whose weights it holds: for the health
action, the last healthy step (tag ``msbridge.checkpoint.saved_at_step`` says when it was saved). Its tags: the
file's path (``msbridge.checkpoint.path``), the step, the saver, and the health state at that step
(``msbridge.health``: ``finite``, ``nonfinite: train/loss``, or ``anomaly: loss_spike at step 37`` when a health
check fired within the last ``RECENT_ANOMALY_STEPS`` steps). The metrics of its step (and the run's latest
evaluation at or before it) are logged again with its ``model_id``, with the same step and time, so the run's own
rows stay one per step and ``search_logged_models(order_by=[{"field_name": "metrics.eval/loss", "ascending":
True}])`` names the best checkpoint of a whole sweep (``best_checkpoint``, which leaves out the models whose file is
gone). The weights are uploaded only with the sink option ``log_checkpoints: upload``.

A saver rotates its files away (``CheckpointConfig(keep_checkpoint_max=5)`` by default, mindformers often 2): at
each delivery after a later checkpoint, and at the close, a model whose file no longer exists gets
``msbridge.checkpoint.file = deleted`` (``present`` or ``kept`` before) and the status FAILED (MLflow's Models tab
shows Ready, Failed or Pending); one whose file was uploaded stays READY, tagged ``uploaded``. With
``log_checkpoints: upload`` each file is uploaded from the hard link the monitor made as it was saved
(``capture.checkpoints``), so the saver's rotation cannot take it first; with ``best`` the checkpoint best on the
run's objective so far is kept there, under ``<run dir>/checkpoints/`` (``BestKeeper``), and its model points at it.

A replay hands the same events again: a model whose key (``msbridge.checkpoint`` = run id, step, path) the
store already has is not made twice. One the store holds PENDING (a ``create_logged_model`` whose reply was lost:
the client process died or was replaced after the store committed it) is finished, not made again;
``ClientProcess.hurry`` never cuts a ``create_logged_model`` short.

Example:
    >>> models = CheckpointModels("link")
    >>> models.open("/runs/tiny-lm-lr0.01", {"metric": None, "mode": "min"})
    >>> models.see(records, events)                       # every batch the sink is handed
    >>> models.deliver(client, experiment_id, run_id, "tiny-lm-lr0.01")   # once the run is reached
    ['m-4a83f6...']
"""
from __future__ import annotations

import collections
import logging
import math
import os
import re
import shutil
import tempfile
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from msbridge.capture.checkpoints import kept_path
from msbridge.names import EVAL_PREFIX, GLOBAL_LOSS, GRAD_NORM, LOSS, objective_metric
from msbridge.sinks.base import Event, Record

log = logging.getLogger("msbridge")

CHECKPOINT = "checkpoint"
KEY_TAG = "msbridge.checkpoint"
PATH_TAG = "msbridge.checkpoint.path"
#: Whether the file at ``PATH_TAG`` is there: ``present``, ``kept`` (under the run dir, ``log_checkpoints: best``),
#: ``deleted`` (rotated away by its saver, or removed) or ``uploaded`` (gone, its copy the model's artifact).
FILE_TAG = "msbridge.checkpoint.file"
PRESENT, KEPT, DELETED, UPLOADED = "present", "kept", "deleted", "uploaded"
#: The filter of ``best_checkpoint``: the LoggedModels whose file still exists.
EXISTING = f"tags.`{FILE_TAG}` != '{DELETED}'"
#: Steps back from a checkpoint in which a health finding marks it ``anomaly: ...``.
RECENT_ANOMALY_STEPS = 100
#: Steps whose values are kept for the checkpoints still to come (a checkpoint's event follows its step's record).
KEPT_STEPS = 256

Point = Tuple[float, float, int]  # value, time (s), step


class CheckpointModels:
    """Collects what a checkpoint's LoggedModel needs from the batches the sink is handed, then makes them.

    Args:
        mode: the sink option ``log_checkpoints``: ``link``, ``upload`` (the file uploaded as the model's artifact)
            or ``best`` (as ``link``, the best checkpoint so far kept under the run dir: ``BestKeeper``).
    """

    def __init__(self, mode: str = "link") -> None:
        self.upload = mode == "upload"
        self.keep_best = mode == "best"
        self._keeper: Optional[BestKeeper] = None  # ``open``
        self._run_dir = ""  # ``open``: where the monitor holds each file until it is uploaded or judged
        self._steps: "collections.OrderedDict[int, List[Record]]" = collections.OrderedDict()  # kept as they came
        self._evals: Deque[Tuple[int, Dict[str, Point]]] = collections.deque(maxlen=64)  # (step, its eval/* values)
        self._anomalies: Deque[Tuple[int, str]] = collections.deque(maxlen=64)
        self._unlinked: List[Event] = []  # checkpoints until a later step is seen: an eval of their step may follow
        self._waiting: List[Tuple[Event, Dict[str, Point], str, Optional[str]]] = []  # ..., its kept copy
        self._files: Dict[str, Tuple[str, str, bool]] = {}  # model id -> its file, the saver's file, uploaded
        self._names: set = set()  # every metric name seen: the objective's default is picked among them
        self._last_step = 0  # the latest step of a record seen

    def open(self, run_dir: str, objective: Dict[str, Any], live: bool = True) -> None:
        """The run's dir and ``objective`` (``{metric, mode}``): where ``best`` keeps a file, and on what; ``live``:
        a training, not a replay (which takes the kept files as the training left them)."""
        self._run_dir = run_dir
        if self.keep_best:
            self._keeper = BestKeeper(run_dir, objective, live)

    def see(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """Keep each record's values by step and queue each checkpoint event."""
        for rec in records:
            self._last_step = max(self._last_step, rec.step)
            self._steps.setdefault(rec.step, []).append(rec)
            self._names.update(rec.values)
            evals = {n: (v, rec.time, rec.step) for n, v in rec.values.items() if n.startswith(EVAL_PREFIX)}
            if evals:
                self._evals.append((rec.step, evals))
            while len(self._steps) > KEPT_STEPS:
                self._steps.popitem(last=False)
        for ev in events:
            if ev.kind == "anomaly":
                self._anomalies.append((ev.step, str(ev.detail.get("check", "?"))))
            elif ev.kind == CHECKPOINT and ev.detail.get("path"):
                self._unlinked.append(ev)
        self._link(final=False)

    @property
    def waiting(self) -> int:
        return len(self._unlinked) + len(self._waiting)

    def _link(self, final: bool) -> None:
        """Queue each checkpoint whose step is complete (a later step was seen, or ``final``) with what it
        links: its step's values and the latest evaluation at or before it (and with ``best``, kept or let go)."""
        while self._unlinked and (final or self._unlinked[0].step < self._last_step):
            event = self._unlinked.pop(0)
            step = int(event.detail.get("healthy_step", event.step))
            at_step = {name: (value, rec.time, rec.step) for rec in self._steps.get(step, ())
                       for name, value in rec.values.items()}
            latest = [values for at, values in self._evals if at <= step][-1:]
            linked = {**(latest[0] if latest else {}), **at_step}
            kept = self._keeper.decide(event, linked, self._names) if self._keeper is not None else None
            self._waiting.append((event, linked, self._health(step, at_step), kept))

    def _health(self, step: int, values: Dict[str, Point]) -> str:
        bad = [n for n in (LOSS, GLOBAL_LOSS, GRAD_NORM) if n in values and not math.isfinite(values[n][0])]
        if bad:
            return "nonfinite: " + ", ".join(bad)
        recent = [(s, check) for s, check in self._anomalies if step - RECENT_ANOMALY_STEPS < s <= step]
        if recent:
            s, check = recent[-1]
            return f"anomaly: {check} at step {s}"
        return "finite" if values else "unknown (its step's metrics were not handed to this sink)"

    def deliver(self, client: Any, experiment_id: str, run_id: str, run_name: str, final: bool = False) -> List[str]:
        """Make a LoggedModel for each queued checkpoint the store does not hold yet; returns their ids. A
        checkpoint waits until a later step is seen (or the run ends, ``final``): an evaluation at its own step
        is recorded after it. Then the models whose file is gone are marked. A failed call raises (the sink
        retries later) and keeps what is still queued."""
        self._link(final)
        made = []
        while self._waiting:
            event, linked, health, kept = self._waiting[0]
            key = f"{run_id}:{event.step}:{event.detail['path']}"
            found = client.search_logged_models([experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{_quote(key)}'",
                                                max_results=1)
            if found and str(found[0].status) == "READY":  # made before (a replay): its file is watched all the same
                tags = found[0].tags
                self._files.setdefault(found[0].model_id, (tags.get(PATH_TAG, event.detail["path"]),
                                                           event.detail["path"], self.upload))
            elif not found or str(found[0].status) == "PENDING":
                try:  # made once: one the store holds PENDING (its reply lost, the process restarted) is finished
                    made.append(self._make(client, experiment_id, run_id, run_name, event, linked, health, key,
                                           kept, found[0].model_id if found else None))
                except Exception as exc:  # refused for good (a value MLflow rejects): the metrics go on without it
                    if getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
                        raise
                    log.warning("msbridge: MLflow refused the LoggedModel of checkpoint %s: %s",
                                event.detail["path"], exc)
            self._waiting.pop(0)
        self._mark_gone(client)
        return made

    def _make(self, client: Any, experiment_id: str, run_id: str, run_name: str, event: Event,
              linked: Dict[str, Point], health: str, key: str, kept: Optional[str], pending: Optional[str]) -> str:
        """The checkpoint's LoggedModel made (or the ``pending`` one the store holds finished): its metrics linked,
        its file uploaded if asked (from the link the monitor held, removed then), READY (FAILED when its file is
        gone and was not uploaded)."""
        detail, saved = event.detail, str(event.detail["path"])
        step = int(detail.get("healthy_step", event.step))  # the step whose weights these are
        path = kept if kept and os.path.exists(kept) else saved  # a kept copy let go since: the saver's file
        held = kept_path(self._run_dir, event.step, saved) if self.upload else ""
        source = held if held and os.path.isfile(held) else path
        upload = self.upload and os.path.isfile(source)
        state = KEPT if path == kept else PRESENT if os.path.exists(path) else UPLOADED if upload else DELETED
        tags = {KEY_TAG: key, PATH_TAG: path, FILE_TAG: state, "msbridge.step": str(step), "msbridge.health": health,
                "msbridge.checkpoint.source": str(detail.get("source", "msbridge health"))}
        if step != event.step:
            tags["msbridge.checkpoint.saved_at_step"] = str(event.step)
        if path != saved:
            tags["msbridge.checkpoint.saved_path"] = saved
        model_id = pending or client.create_logged_model(experiment_id, name=model_name(run_name, step),
                                                         source_run_id=run_id, tags=tags,
                                                         model_type="checkpoint").model_id
        for name, (value, when, step) in sorted(linked.items()):  # a row logged again is the same row
            client.log_metric(run_id, name, value if math.isfinite(value) else math.nan,
                              timestamp=int(when * 1000), step=step, model_id=model_id)
        if upload:
            with tempfile.TemporaryDirectory() as folder:  # MLflow uploads a folder: the file linked into one
                os.symlink(os.path.abspath(source), os.path.join(folder, os.path.basename(saved)))
                client.log_model_artifacts(model_id, folder)
        client.finalize_logged_model(model_id, "FAILED" if state == DELETED else "READY")
        if held:
            _remove(held)
        if state in (PRESENT, KEPT):
            self._files[model_id] = (path, saved, upload)
        return model_id

    def _mark_gone(self, client: Any) -> None:
        """Each model made whose file no longer exists: ``FILE_TAG`` ``deleted`` and FAILED (``uploaded``, READY,
        when its copy is the model's artifact). A kept copy let go for a better one points back at the saver's
        file while that is there."""
        for model_id, (path, saved, uploaded) in list(self._files.items()):
            if os.path.exists(path):
                continue
            tags = {PATH_TAG: saved} if path != saved else {}
            if tags and os.path.exists(saved):
                client.set_logged_model_tags(model_id, {**tags, FILE_TAG: PRESENT})
                self._files[model_id] = (saved, saved, uploaded)
                continue
            client.set_logged_model_tags(model_id, {**tags, FILE_TAG: UPLOADED if uploaded else DELETED})
            if not uploaded:
                client.finalize_logged_model(model_id, "FAILED")
            del self._files[model_id]


class BestKeeper:
    """``log_checkpoints: best``: the checkpoint best on the run's objective so far, kept safe from its saver's
    rotation at ``capture.checkpoints.kept_path`` (``<run dir>/checkpoints/step<N>-<file name>``).

    The monitor hard-links each new file there as it sees it (``CheckpointWatch.plan``); once a checkpoint's
    objective value is known it is kept (copied from the saver's file if no link could be made) or its link removed,
    and the one it beats is removed. Ties: the earlier stays. One without a finite objective value is not kept. A
    replay (``live`` False) changes no file: a checkpoint whose kept file is there points at it.

    Example:
        >>> import pathlib, tempfile
        >>> run_dir = tempfile.mkdtemp()
        >>> saved = pathlib.Path(run_dir, "net-1_50.ckpt"); _ = saved.write_bytes(b"weights")
        >>> keeper = BestKeeper(run_dir, {"metric": "eval/loss", "mode": "min"})
        >>> event = Event("checkpoint", 50, 0, 0.0, {"path": str(saved)})
        >>> keeper.decide(event, {"eval/loss": (0.41, 0.0, 50)}, {"eval/loss"})
        '.../checkpoints/step50-net-1_50.ckpt'
    """

    def __init__(self, run_dir: str, objective: Dict[str, Any], live: bool = True) -> None:
        self.run_dir = run_dir
        self.metric = objective.get("metric")
        self.sign = -1.0 if objective.get("mode", "min") == "max" else 1.0
        self.best: Optional[Tuple[str, float, str]] = None  # metric, value, kept file
        self.live = live
        self._warned = False

    def decide(self, event: Event, linked: Dict[str, Point], names: set) -> Optional[str]:
        """The kept file's path if ``event``'s checkpoint is the best so far (the one it beats let go), else None."""
        saved = str(event.detail["path"])
        kept = kept_path(self.run_dir, event.step, saved)
        if not self.live:  # a replay: the files the training kept, as they are; none removed, copied or judged again
            return kept if os.path.exists(kept) else None
        metric = objective_metric(self.metric, names)
        value = linked[metric][0] if metric in linked else math.nan
        if not math.isfinite(value) or (self.best is not None and self.best[0] == metric
                                        and self.sign * value >= self.sign * self.best[1]):
            _remove(kept)
            return None
        if not os.path.exists(kept) and not _copy(saved, kept):
            if not self._warned:
                self._warned = True
                log.warning("msbridge: the best checkpoint so far, %s (%s %.6g), was gone before it could be copied "
                            "to %s (no hard link could be made there: another file system?)", saved, metric, value,
                            os.path.dirname(kept))
            return None
        if self.best is not None:
            _remove(self.best[2])
        self.best = (str(metric), value, kept)
        return kept


def _copy(source: str, target: str) -> bool:
    """``source`` copied to ``target`` whole (written beside it, then renamed); False when it cannot be."""
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target + ".part")
        os.replace(target + ".part", target)
        return True
    except OSError:
        return False


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def model_name(run_name: str, step: int) -> str:
    """``<run name>-step<N>`` with the characters MLflow refuses in a model name (``/:.%"'``) made ``-``.

    Example:
        >>> model_name("lr0.003-20261203", 50)
        'lr0-003-20261203-step50'
    """
    return re.sub(r"[/:.%\"']", "-", f"{run_name}-step{step}")


def _quote(text: str) -> str:
    return text.replace("'", "\\'")


def best_checkpoint(client: Any, experiment_ids: Sequence[str], metric: str, ascending: bool = True) -> Any:
    """The experiments' LoggedModel whose file exists with the best linked ``metric`` (``eval/loss``), None when
    none has it. The query, for a notebook: ``search_logged_models(ids, filter_string=EXISTING, order_by=...)``."""
    found = client.search_logged_models(list(experiment_ids), filter_string=EXISTING,
                                        order_by=[{"field_name": f"metrics.{metric}", "ascending": ascending}],
                                        max_results=1)
    return found[0] if found else None
