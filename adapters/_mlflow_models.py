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
True}])`` names the best checkpoint of a whole sweep. The weights are uploaded only with the sink option
``log_checkpoints: upload``.

A replay hands the same events again: a model whose key (``msbridge.checkpoint`` = run id, step, path) the
store already has is not made twice. One the store holds PENDING (a ``create_logged_model`` whose reply was lost:
the client process died or was replaced after the store committed it) is finished, not made again;
``ClientProcess.hurry`` never cuts a ``create_logged_model`` short.

Example:
    >>> models = CheckpointModels(upload=False)
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
import tempfile
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from msbridge.names import EVAL_PREFIX, GLOBAL_LOSS, GRAD_NORM, LOSS
from msbridge.sinks.base import Event, Record

log = logging.getLogger("msbridge")

CHECKPOINT = "checkpoint"
KEY_TAG = "msbridge.checkpoint"
#: Steps back from a checkpoint in which a health finding marks it ``anomaly: ...``.
RECENT_ANOMALY_STEPS = 100
#: Steps whose values are kept for the checkpoints still to come (a checkpoint's event follows its step's record).
KEPT_STEPS = 256

Point = Tuple[float, float, int]  # value, time (s), step


class CheckpointModels:
    """Collects what a checkpoint's LoggedModel needs from the batches the sink is handed, then makes them.

    Args:
        upload: log the checkpoint file itself as the model's artifact (``log_checkpoints: upload``).
    """

    def __init__(self, upload: bool = False) -> None:
        self.upload = upload
        self._steps: "collections.OrderedDict[int, List[Record]]" = collections.OrderedDict()  # kept as they came
        self._evals: Deque[Tuple[int, Dict[str, Point]]] = collections.deque(maxlen=64)  # (step, its eval/* values)
        self._anomalies: Deque[Tuple[int, str]] = collections.deque(maxlen=64)
        self._unlinked: List[Event] = []  # checkpoints until a later step is seen: an eval of their step may follow
        self._waiting: List[Tuple[Event, Dict[str, Point], str]] = []
        self._last_step = 0  # the latest step of a record seen

    def see(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """Keep each record's values by step and queue each checkpoint event."""
        for rec in records:
            self._last_step = max(self._last_step, rec.step)
            self._steps.setdefault(rec.step, []).append(rec)
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
        links: its step's values and the latest evaluation at or before it."""
        while self._unlinked and (final or self._unlinked[0].step < self._last_step):
            event = self._unlinked.pop(0)
            step = int(event.detail.get("healthy_step", event.step))
            at_step = {name: (value, rec.time, rec.step) for rec in self._steps.get(step, ())
                       for name, value in rec.values.items()}
            latest = [values for at, values in self._evals if at <= step][-1:]
            self._waiting.append((event, {**(latest[0] if latest else {}), **at_step}, self._health(step, at_step)))

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
        is recorded after it. A failed call raises (the sink retries later) and keeps what is still queued."""
        self._link(final)
        made = []
        while self._waiting:
            event, linked, health = self._waiting[0]
            key = f"{run_id}:{event.step}:{event.detail['path']}"
            found = client.search_logged_models([experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{_quote(key)}'",
                                                max_results=1)
            if not found or str(found[0].status) != "READY":
                try:  # made once: one the store holds PENDING (its reply lost, the process restarted) is finished
                    made.append(self._make(client, experiment_id, run_id, run_name, event, linked, health, key,
                                           found[0].model_id if found else None))
                except Exception as exc:  # refused for good (a value MLflow rejects): the metrics go on without it
                    if getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
                        raise
                    log.warning("msbridge: MLflow refused the LoggedModel of checkpoint %s: %s",
                                event.detail["path"], exc)
            self._waiting.pop(0)
        return made

    def _make(self, client: Any, experiment_id: str, run_id: str, run_name: str, event: Event,
              linked: Dict[str, Point], health: str, key: str, pending: Optional[str]) -> str:
        """The checkpoint's LoggedModel made (or the ``pending`` one the store holds finished): its metrics linked,
        its file uploaded if asked, READY."""
        detail = event.detail
        step = int(detail.get("healthy_step", event.step))  # the step whose weights these are
        tags = {KEY_TAG: key, "msbridge.checkpoint.path": str(detail["path"]), "msbridge.step": str(step),
                "msbridge.health": health, "msbridge.checkpoint.source": str(detail.get("source", "msbridge health"))}
        if step != event.step:
            tags["msbridge.checkpoint.saved_at_step"] = str(event.step)
        model_id = pending or client.create_logged_model(experiment_id, name=model_name(run_name, step),
                                                         source_run_id=run_id, tags=tags,
                                                         model_type="checkpoint").model_id
        for name, (value, when, step) in sorted(linked.items()):  # a row logged again is the same row
            client.log_metric(run_id, name, value if math.isfinite(value) else math.nan,
                              timestamp=int(when * 1000), step=step, model_id=model_id)
        if self.upload and os.path.isfile(detail["path"]):
            with tempfile.TemporaryDirectory() as folder:  # MLflow uploads a folder: the file linked into one
                os.symlink(os.path.abspath(detail["path"]), os.path.join(folder, os.path.basename(detail["path"])))
                client.log_model_artifacts(model_id, folder)
        client.finalize_logged_model(model_id, "READY")
        return model_id


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
    """The experiments' LoggedModel with the best linked ``metric`` (``eval/loss``), None when none has it."""
    found = client.search_logged_models(list(experiment_ids), order_by=[{"field_name": f"metrics.{metric}",
                                                                        "ascending": ascending}], max_results=1)
    return found[0] if found else None
