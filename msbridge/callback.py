"""``BridgeMonitor``: the one callback that turns every training step into the metric stream.

Two paces:

- every step: O(1) host work (append the step's output tensors and a timestamp);
- every flush (``flush_steps`` steps or ``flush_seconds`` seconds, whichever
  first, and at train end): one device->host copy per column, records built,
  handed to the dispatcher thread. No tracker I/O ever runs on this thread.

Example:
    >>> from msbridge import BridgeMonitor
    >>> monitor = BridgeMonitor.from_yaml("monitor.yaml")
    >>> model.train(3, dataset, callbacks=[monitor])
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from mindspore.train import Callback

from .buffer import StepBuffer
from .config import Config, load_config
from .dispatch import Dispatcher
from .lr import LrReader, find_optimizer
from .session import RunPlan, plan_run
from .sink import FAILED, FINISHED, KILLED, Event, RunInfo, Sink
from .stream import GLOBAL_LOSS, LOSS, Stream

log = logging.getLogger("msbridge")


class BridgeMonitor(Callback):
    """Records every training step to the sinks chosen in the config.

    Args:
        config: a path to a YAML file, a dict, or a ``Config``.
        overrides: ``key=value`` strings applied on top (YAML-typed).
        sinks: extra sink instances (third-party or test sinks), added to the configured ones.
        progress: print progress lines on the global rank.

    Everything that can be checked is checked here, before training: the
    config, the sink names and extras, the output dir.

    Example:
        >>> monitor = BridgeMonitor({"experiment": "tiny-lm", "sinks": ["jsonl", "tensorboard"]})
        >>> model.train(1, ds, callbacks=[monitor], dataset_sink_mode=False)
        >>> monitor.run_dir
        '/abs/msbridge_runs/tiny-lm/run-20261129-101500'
    """

    def __init__(self, config: Union[str, Mapping[str, Any], Config, None] = None,
                 overrides: Sequence[str] = (), sinks: Sequence[Sink] = (), progress: bool = True) -> None:
        super().__init__()
        self.config: Config = load_config(config, overrides=overrides)
        self.plan: Optional[RunPlan] = None
        if self.config.monitor_on:
            self.plan = plan_run(self.config, extra_sinks=sinks)
            self.plan.progress = progress
        self.dispatcher: Optional[Dispatcher] = None
        self.run: Optional[RunInfo] = None
        self._buffer = StepBuffer()
        self._stream: Optional[Stream] = None
        self._lr: Optional[LrReader] = None
        self._reducer: Optional[Any] = None
        self._last_end = 0.0
        self._last_flush = 0.0
        self._last_step = 0
        self._monitor_s = 0.0
        self._started = 0.0
        self.steps_recorded = 0
        self.final_loss: Optional[float] = None
        self.best_loss: Optional[float] = None
        self.events: List[Event] = []

    @classmethod
    def from_yaml(cls, path: str, overrides: Sequence[str] = (), **kwargs: Any) -> "BridgeMonitor":
        """Build from a YAML file (any dialect ``load_config`` accepts)."""
        return cls(path, overrides=overrides, **kwargs)

    @property
    def run_dir(self) -> Optional[str]:
        return self.plan.run_dir if self.plan else None

    # -- MindSpore hooks ------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if self.plan is None:
            return
        cb = run_context.original_args()
        batch_size = _batch_size(cb)
        expected = _expected_steps(cb)
        self.dispatcher, self.run = self.plan.start(expected_steps=expected, batch_size=batch_size)
        cfg = self.config
        self._stream = Stream(rank=self.run.rank, batch_size=batch_size, seq_length=cfg.seq_length,
                              is_global=self.run.is_global,
                              switches={k: getattr(cfg, k) for k in
                                        ("local_loss", "global_loss", "grad_norm", "learning_rate", "throughput")})
        optimizer = find_optimizer(cb)
        self._lr = LrReader(optimizer) if optimizer is not None and cfg.learning_rate else None
        if self.run.world_size > 1:
            from .collective import make_reducer

            self._reducer = make_reducer(self.run, cfg, batch_size)
        self._last_step = int(getattr(cb, "cur_step_num", 0) or 0)
        self._last_end = self._last_flush = self._started = time.perf_counter()

    def on_train_step_end(self, run_context: Any) -> None:
        if self.dispatcher is None:
            return
        start = time.perf_counter()
        cb = run_context.original_args()
        step = int(cb.cur_step_num)
        advanced = max(step - self._last_step, 1)
        step_time = (start - self._last_end) / advanced
        self._last_step = step
        if step % self.config.step_interval == 0:
            self._buffer.append(step, int(cb.cur_epoch_num), cb.net_outputs, step_time, self._monitor_s)
        if len(self._buffer) >= self.config.flush_steps or (
                # Ranks must flush at the same steps (one collective each), so time triggers single processes only.
                self._reducer is None and start - self._last_flush >= self.config.flush_seconds):
            self.flush()
        end = time.perf_counter()
        self._monitor_s = end - start  # charged to the next step: its own cost is not known yet
        self._last_end = end

    def on_train_end(self, run_context: Any) -> None:
        self.close(FINISHED)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # MindSpore's callback manager exits every callback, also when training raised.
        if exc_type is None:
            self.close(FINISHED)
        else:
            status = KILLED if issubclass(exc_type, KeyboardInterrupt) else FAILED
            self.close(status, Event("exception", self._last_step, self.run.rank if self.run else 0,
                                     time.time(), {"type": exc_type.__name__, "message": str(exc)}))

    # -- flush / close -----------------------------------------------------------
    def flush(self) -> None:
        """Convert the buffered window and hand it to the sinks (non-blocking)."""
        self._last_flush = time.perf_counter()
        window = self._buffer.drain(self._lr)
        if window is None or self._stream is None or self.dispatcher is None:
            return
        if self._reducer is not None:
            self._reducer.reduce(window)
        elif LOSS in window.scalars:  # a single process: the global loss is the local one
            window.global_scalars[GLOBAL_LOSS] = window.scalars[LOSS]
        records = self._stream.records(window)
        self.steps_recorded += len(records)
        self._track_loss(window.scalars.get(LOSS))
        self.dispatcher.submit(records)

    def close(self, status: str = FINISHED, event: Optional[Event] = None) -> None:
        """Final flush, then drain and close every sink with ``status``."""
        if self.dispatcher is None:
            return
        self.flush()
        if event is not None:
            self.events.append(event)
            self.dispatcher.submit([], [event])
        self.dispatcher.close(status)
        self.dispatcher = None
        if self.plan is not None:
            self.plan.finish(self.outcome(status))

    def outcome(self, status: str) -> Dict[str, Any]:
        """How the run went, for the README: status, steps, wall time, final and best loss, anomalies."""
        anomalies = [f"step {e.step}: {e.kind} {dict(e.detail)}" for e in self.events]
        return {
            "status": status,
            "steps recorded": self.steps_recorded,
            "last step": self._last_step,
            "wall time": f"{time.perf_counter() - self._started:.1f} s",
            "final loss": self.final_loss,
            "best loss": self.best_loss,
            "anomalies": "; ".join(anomalies) if anomalies else "none",
        }

    def _track_loss(self, loss: Optional[np.ndarray]) -> None:
        if loss is None:
            return
        finite = loss[np.isfinite(loss)]
        self.final_loss = float(loss[-1])
        if finite.size:
            best = float(finite.min())
            self.best_loss = best if self.best_loss is None else min(self.best_loss, best)


def _batch_size(cb: Any) -> Optional[int]:
    dataset = getattr(cb, "train_dataset", None)
    try:
        return int(dataset.get_batch_size()) if dataset is not None else None
    except Exception:  # a dataset without a fixed batch size
        return None


def _expected_steps(cb: Any) -> Optional[int]:
    epochs = getattr(cb, "epoch_num", None)
    per_epoch = getattr(cb, "batch_num", None)
    if epochs and per_epoch:
        return int(epochs) * int(per_epoch)
    return None
