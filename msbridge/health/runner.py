"""Training health: checks every recorded step of a flushed window, takes the configured action.

``BridgeMonitor`` hands each converted window (host arrays, no extra device
sync) and its records to ``Health.check``. Health shows each step, as a
``StepView``, to every enabled detector of ``msbridge.health.detectors.DETECTORS``
(it never looks at a check's name), adds the cumulative counters
``health/nan_steps`` and ``health/skipped_steps`` to every record (so smoothing
can never hide a NaN), and for each finding emits typed events and acts:

- ``log``: an ``anomaly`` event only;
- ``dump``: plus one dump directory (``msbridge.health.dumps``: rate limit, quota);
- ``skip``: the update was already dropped inside the graph by
  ``msbridge.TrainStep(skip_nonfinite=True)``; refused at train begin for any other cell;
- ``stop``: ``Health.stop`` is set; the callback requests the stop and closes
  every sink FAILED (FINISHED for a detector that declares ``early_stop``, such as ``plateau``);
- ``checkpoint_and_stop``: saves the last healthy weights first, then stops.

Precise stops: a stop-class action makes ``every_step`` true, and the callback
then converts and checks each step as it ends (one small device->host copy per
step, sinks still written once per flush). The stop lands on the firing step,
and the weights are those of that step. "Last healthy" weights: with a network
that skips non-finite updates the live weights are healthy; otherwise Health
keeps a host copy of every parameter (weights and optimizer state) after each
healthy step (``snapshot_every``), which costs one parameter-sized device->host
copy per snapshot and that much host memory. It is taken only when
``checkpoint_and_stop`` needs it.

Example:
    >>> health = Health(HealthSpec.parse({"profile": "debug"}))
    >>> health.bind(cb_params.train_network, skips_nonfinite=False)  # ConfigError: skip needs it
    >>> health.start(run_info)
    >>> verdict = health.check(window, records)    # records with counters, events; health.stop if stopping
"""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..capture.window import Window
from ..errors import ConfigError
from ..masking import mask_secrets
from ..names import GRAD_NORM, LOSS, LOSS_SCALE, OVERFLOW, SAMPLES_PER_S
from ..paths import render_output_dir, timestamp
from ..sinks.base import FAILED, FINISHED, Event, Record, RunInfo, json_safe
from ..sinks.runlog import encode_record
from .detectors import DETECTORS, Detector
from .detectors.base import ANOMALY, CHECKPOINT_AND_STOP, LOG, RECOVERY, SKIP, STOP_ACTIONS, Finding, StepView
from .dumps import DISK_FULL, QUOTA, WRITTEN, DumpWriter
from .spec import HealthSpec

# Event kinds besides a finding's ANOMALY / RECOVERY (every sink mirrors them: jsonl lines, TB text,
# MLflow tags + events.jsonl, MindInsight markers).
ACTION, CHECKPOINT, EARLY_STOP, DUMP_REFUSED = "action", "checkpoint", "early_stop", "dump_refused"
RESUME, INTERRUPT, EXCEPTION = "resume", "interrupt", "exception"

NAN_STEPS = "health/nan_steps"
SKIPPED_STEPS = "health/skipped_steps"


def make_event(kind: str, step: int, rank: int, **detail: Any) -> Event:
    """An ``Event`` stamped now: ``make_event("resume", 1200, 0, from_step=1200)``."""
    return Event(kind, int(step), int(rank), time.time(), detail)


@dataclass(frozen=True)
class Stop:
    """Training must end at ``step``: ``status`` FAILED, or FINISHED for an early stop.

    Example:
        >>> Stop(3700, "nonfinite", "FAILED", "nonfinite at step 3700: nonfinite ['train/loss']")
        Stop(step=3700, check='nonfinite', status='FAILED', reason="nonfinite at step 3700: nonfinite ['train/loss']")
    """

    step: int
    check: str
    status: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    """What ``Health.check`` made of a window: its records with the counters added, and the events.

    Example:
        >>> verdict = health.check(window, records)
        >>> verdict.records[-1].values["health/nan_steps"], [e.kind for e in verdict.events]
        (1.0, ['anomaly', 'action'])
    """

    records: List[Record]
    events: List[Event]


class Health:
    """Runs the configured checks on each window and takes their actions.

    Args:
        spec: the validated ``health`` section (``config.health_spec``, or ``HealthSpec.parse(section)``).

    Example:
        >>> health = Health(HealthSpec.parse({"nonfinite": {"action": "stop"}}))
        >>> health.every_step
        True
    """

    def __init__(self, spec: HealthSpec) -> None:
        self.spec = spec
        self.every_step = spec.every_step
        self.nan_steps = 0
        self.skipped_steps = 0
        self.stop: Optional[Stop] = None
        self.run: Optional[RunInfo] = None
        self.dumps: Optional[DumpWriter] = None
        self._detectors = _build_detectors(spec)
        self._step_detectors = tuple(d for d in self._detectors.values() if not d.on_eval)
        self._eval_detectors = tuple(d for d in self._detectors.values() if d.on_eval)
        self._recent: Deque[Record] = deque(maxlen=spec.dump_window)
        self._batches: Dict[int, Any] = {}
        self._network: Any = None
        self._skips_nonfinite = False
        self._skips_overflow = True
        self._snapshot: Optional[Tuple[int, List[Tuple[str, np.ndarray]]]] = None
        self._needs_snapshot = False
        self._refusals_told: set = set()

    # -- before training -------------------------------------------------------
    def bind(self, train_network: Any, skips_nonfinite: bool, skips_overflow: bool = True,
             first_step: int = 0) -> None:
        """Check the actions against the train cell ``Model`` trains; call before any sink opens.

        Args:
            train_network: the cell ``Model`` trains (its parameters are what a checkpoint saves).
            skips_nonfinite: the cell drops a non-finite update inside the graph
                (``TrainStep(skip_nonfinite=True)``).
            skips_overflow: the cell skips the update of a step it flags as overflowed.

        Raises:
            ConfigError: ``skip`` is configured but the cell does not skip non-finite updates.
        """
        self._skips_nonfinite = skips_nonfinite
        self._skips_overflow = skips_overflow
        skipping = self.spec.checks_with(SKIP)
        if skipping and not skips_nonfinite:
            raise ConfigError(
                f"health.{skipping[0]}.action: skip needs the train cell to drop non-finite updates inside the "
                f"graph, but Model trains {type(train_network).__name__}; build it with "
                "msbridge.TrainStep(loss_net, optimizer, skip_nonfinite=True), or use action dump or stop")
        self._network = train_network
        needs = [c for c in self.spec.checks_with(CHECKPOINT_AND_STOP) if not self._live_is_healthy(c)]
        self._needs_snapshot = bool(needs)
        if self._needs_snapshot:
            self._take_snapshot(first_step)  # the weights training starts from are healthy by definition

    def start(self, run: RunInfo) -> None:
        """Fix where dumps go, once the run is known."""
        self.run = run
        spec = self.spec
        root = self._dir(spec.dump_dir, "dumps")
        self.dumps = DumpWriter(root, run.rank, spec.dump_quota_mb, spec.dump_min_free_mb, spec.dump_every_steps)

    @property
    def keeps_batches(self) -> bool:
        """Whether dumps want each step's input batch (``on_step``)."""
        return self.spec.dump_batch and self.spec.dump_on_anomaly

    def on_step(self, step: int, cb_params: Any) -> None:
        """Keep a reference to the step's input batch (O(1), no copy); call it when ``keeps_batches``."""
        self._batches[step] = getattr(cb_params, "train_dataset_element", None)

    # -- every flush -------------------------------------------------------------
    def check(self, window: Window, records: Sequence[Record]) -> Verdict:
        """Check every step of ``window`` (``records``: the Stream's records of the same steps, which gain the
        ``health/*`` counters in place).

        A stop-class action sets ``self.stop``; the caller requests the stop and closes the sinks.
        """
        nothing = [None] * len(records)
        columns = [nothing if c is None else c for c in map(window.given, _COLUMNS)]
        events: List[Event] = []
        healthy = True
        for rec, scalars, step_s in zip(records, zip(*columns), window.step_time_s.tolist()):
            view = _view(rec, scalars, step_s)
            if view.nonfinite:
                self.nan_steps += 1
                healthy = False
            if view.overflow and self._skips_overflow:
                self.skipped_steps += 1
            rec.values[NAN_STEPS], rec.values[SKIPPED_STEPS] = float(self.nan_steps), float(self.skipped_steps)
            self._recent.append(rec)
            if self.stop is not None:
                continue  # steps that ran after the stop fired are recorded, not judged again
            for finding in self._observe(view):
                healthy = healthy and not (finding.kind != RECOVERY and self.spec.action(finding.check) in STOP_ACTIONS)
                events += self._act(finding)
                if self.stop is not None:
                    break
        if self._needs_snapshot and healthy and self.stop is None and records:
            last = records[-1].step
            if self._snapshot is None or last - self._snapshot[0] >= self.spec.snapshot_every:
                self._take_snapshot(last)
        for step in window.steps.tolist():  # only this window's: a converter thread checks it while steps go on
            self._batches.pop(step, None)
        return Verdict(list(records), events)

    def check_eval(self, record: Record) -> List[Event]:
        """Check one evaluation (``record``: its ``eval/*`` values at the training step it ran) with the checks
        that watch evaluations; their actions as for a step (a stop sets ``self.stop``)."""
        if self.stop is not None:
            return []
        view = StepView(record.step, values=record.values)
        events: List[Event] = []
        for finding in self._observe(view, on_eval=True):
            events += self._act(finding)
            if self.stop is not None:
                break
        return events

    def summary(self) -> Dict[str, Any]:
        """For the run README's outcome."""
        return {"nan steps": self.nan_steps, "skipped steps": self.skipped_steps,
                "stopped by": self.stop.reason if self.stop else None}

    # -- helpers -------------------------------------------------------------------
    def _observe(self, view: StepView, on_eval: bool = False) -> List[Finding]:
        findings = [d.observe(view) for d in (self._eval_detectors if on_eval else self._step_detectors)]
        return [finding for finding in findings if finding is not None]

    def _live_is_healthy(self, check: str) -> bool:
        """The live weights are healthy at a finding of ``check``: the cell already dropped that update."""
        return self._skips_nonfinite and self._detectors[check].in_graph_skip

    def _act(self, finding: Finding) -> List[Event]:
        rank = self.run.rank if self.run else 0
        step, check = finding.step, finding.check
        if finding.kind == RECOVERY:
            return [make_event(RECOVERY, step, rank, check=check, **finding.detail)]
        action = self.spec.action(check)
        events = [make_event(ANOMALY, step, rank, check=check, action=action, **finding.detail)]
        if action == LOG:
            return events
        done: Dict[str, Any] = {"check": check, "action": action}
        if self.spec.dump_on_anomaly:
            done["dump"], refused = self._dump(finding, action)
            events += refused
        else:
            done["dump"] = "off (health.dump_on_anomaly: false)"
        if action == SKIP:
            done["skipped_steps"] = self.skipped_steps
        if action == CHECKPOINT_AND_STOP:
            events.append(self._checkpoint(step, check))
        if action in STOP_ACTIONS:
            early = self._detectors[check].early_stop
            done["reason"] = reason = f"{check} at step {step}: {_describe(finding)}"
            self.stop = Stop(step, check, FINISHED if early else FAILED, reason)
            if early:
                events.append(make_event(EARLY_STOP, step, rank, **{k: v for k, v in done.items() if k != "action"},
                                    **finding.detail))
                return events
        events.append(make_event(ACTION, step, rank, **done))
        return events

    def _dump(self, finding: Finding, action: str) -> Tuple[str, List[Event]]:
        """Write the anomaly's dump; returns its path (or why not) and a one-time refusal event."""
        assert self.dumps is not None and self.run is not None, "Health.start was not called"
        run = self.run
        files = {
            "anomaly.json": _json({"run_id": run.run_id, "run_name": run.run_name, "rank": run.rank,
                                   "step": finding.step, "check": finding.check, "action": action,
                                   "detail": finding.detail, "time": time.time(), "nan_steps": self.nan_steps,
                                   "skipped_steps": self.skipped_steps}),
            "window.jsonl": b"".join(encode_record(r) for r in self._recent),
            "config.json": _json(mask_secrets(dict(run.config))),
        }
        batch = self._batches.get(finding.step)
        if batch is not None:
            files["batch.npz"] = _npz(batch)
        result = self.dumps.write(finding.check, finding.step, files)
        if result.status == WRITTEN:
            return result.path or "", []
        refused = []
        if result.status in (QUOTA, DISK_FULL) and result.status not in self._refusals_told:
            self._refusals_told.add(result.status)
            refused.append(make_event(DUMP_REFUSED, finding.step, run.rank, reason=result.status, detail=result.reason,
                                 dump_dir=self.dumps.root, note="no more dumps are written while this holds; "
                                 "this event is not repeated"))
        return result.status, refused

    def _checkpoint(self, step: int, check: str) -> Event:
        """Save the last healthy weights; the event names the path and how long it took."""
        import mindspore as ms

        rank = self.run.rank if self.run else 0
        live = self._live_is_healthy(check)
        if not live and self._snapshot is None:
            return make_event(CHECKPOINT, step, rank, error="no healthy weights were kept")
        healthy_step = step - 1 if live else self._snapshot[0]
        root = self._dir(self.spec.checkpoint_dir, "checkpoints")
        path = os.path.join(root, f"healthy-rank{rank}-step{healthy_step}.ckpt")
        if live:
            obj: Any = self._network
            size = sum(int(np.prod(p.shape)) * p.itemsize for p in self._network.get_parameters())
        else:
            obj = [{"name": name, "data": ms.Tensor(array)} for name, array in self._snapshot[1]]
            size = sum(array.nbytes for _, array in self._snapshot[1])
        try:
            os.makedirs(root, exist_ok=True)
            free = shutil.disk_usage(root).free
            if free - size < self.spec.dump_min_free_mb * 1024 * 1024:
                return make_event(CHECKPOINT, step, rank, error=f"not saved: {root} has {free >> 20} MB free, the "
                             f"checkpoint needs {size >> 20} MB and {self.spec.dump_min_free_mb:.0f} MB must stay free")
            began = time.perf_counter()
            ms.save_checkpoint(obj, path)
            duration = time.perf_counter() - began
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            return make_event(CHECKPOINT, step, rank, error=f"{type(exc).__name__}: {exc}", path=path)
        return make_event(CHECKPOINT, step, rank, path=path, duration_s=round(duration, 4), healthy_step=healthy_step,
                     source="network (update skipped in graph)" if live else "host snapshot",
                     size_mb=round(os.path.getsize(path) / 2**20, 3))

    def _take_snapshot(self, step: int) -> None:
        params = self._network.get_parameters()
        self._snapshot = (step, [(p.name, p.asnumpy().copy()) for p in params])  # asnumpy aliases on CPU

    def _dir(self, template: Optional[str], default: str) -> str:
        run = self.run
        assert run is not None
        if template is None:
            return os.path.join(run.run_dir, default)
        return render_output_dir(template, run.experiment, run.run_name, run.rank,
                                 os.environ.get("MSBRIDGE_TIMESTAMP") or timestamp())


def _build_detectors(spec: HealthSpec) -> Dict[str, Detector]:
    """One detector per enabled check, built from its registered class and its validated options."""
    return {name: DETECTORS[name](warmup_steps=spec.warmup_steps, **spec.options(name)) for name in spec.checks}


_COLUMNS = (LOSS, GRAD_NORM, OVERFLOW, LOSS_SCALE)


def _view(rec: Record, scalars: List[Optional[float]], step_time_s: float) -> StepView:
    """What the detectors see of one step: ``scalars`` are its ``_COLUMNS`` (None: not recorded)."""
    loss, grad_norm, overflow, loss_scale = scalars
    overflowed = bool(overflow) and math.isfinite(overflow)
    return StepView(rec.step, loss, grad_norm, loss_scale, overflowed, rec.values.get(SAMPLES_PER_S), step_time_s,
                    rec.values)


def _describe(finding: Finding) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in finding.detail.items())


def _json(obj: Any) -> bytes:
    return json.dumps(json_safe(obj), indent=2, default=str).encode()


def _npz(batch: Any) -> bytes:
    items = batch if isinstance(batch, (list, tuple)) else [batch]
    arrays = {f"input_{i}": (t.asnumpy() if hasattr(t, "asnumpy") else np.asarray(t)) for i, t in enumerate(items)}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()
