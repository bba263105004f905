"""The peers in ``msbridge bench``: what a team writes instead of msbridge, written the way their users write it.

Each tracker peer is a step-end callback, as Lightning's and Hugging Face's loggers are: it computes the same 14
values a step that msbridge records (``STEP_VALUES``), the same cheap way in every peer (the loss read once, the
learning rate from the schedule's formula, not a MindSpore op), then hands them to its tracker: MLflow's fluent
``mlflow.log_metrics`` on a sqlite store (synchronous, or ``synchronous=False``), or tensorboardX's
``SummaryWriter.add_scalar`` once a value. MindSpore's ``SummaryCollector(collect_freq=1)`` and mindformers'
``MFLossMonitor`` with its TensorBoard run as they ship (what they record is theirs: loss and learning rate).

Example:
    >>> cb = MlflowPeer("/tmp/w", synchronous=False, lr_at=lambda step: 3e-3)
    >>> Model(train_cell).train(1, dataset, callbacks=[cb])
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List

from mindspore.train import Callback

#: The values msbridge records a step in the bench (its jsonl's ``values``): every peer writes these 14.
STEP_VALUES = ("train/loss", "train/loss_ema", "train/lr", "train/global_loss", "train/epoch", "perf/step_time_ms",
               "perf/samples_per_s", "perf/tokens_per_s", "perf/monitor_overhead", "perf/samples_seen",
               "perf/tokens_seen", "perf/tflops", "health/nan_steps", "health/skipped_steps")


class StepValues(Callback):
    """A step-end callback that computes ``STEP_VALUES`` and passes them to ``log(values, step)``.

    Example:
        >>> class Print(StepValues):
        ...     def log(self, values, step): print(step, values["train/loss"])
    """

    def __init__(self, lr_at: Callable[[int], float], batch: int = 8, seq_length: int = 32,
                 flops_per_sample: float = 5e6) -> None:
        super().__init__()
        self.lr_at, self.batch, self.seq_length, self.flops = lr_at, batch, seq_length, flops_per_sample
        self.ema = None
        self.nan_steps = 0
        self.last = self.spent = 0.0

    def on_train_step_begin(self, run_context: Any) -> None:
        self.last = self.last or time.perf_counter()

    def on_train_step_end(self, run_context: Any) -> None:
        start = time.perf_counter()
        cb = run_context.original_args()
        step = int(cb.cur_step_num)
        self.log(self.values(cb, step, start), step)
        self.spent = time.perf_counter() - start
        self.last = time.perf_counter()

    def values(self, cb: Any, step: int, now: float) -> Dict[str, float]:
        """The 14 values of this step."""
        loss = float(cb.net_outputs.asnumpy())
        self.nan_steps += loss != loss
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss
        step_s = max(now - self.last, 1e-9)
        samples = self.batch / step_s
        return {"train/loss": loss, "train/loss_ema": self.ema, "train/lr": float(self.lr_at(step)),
                "train/global_loss": loss, "train/epoch": float(cb.cur_epoch_num), "perf/step_time_ms": step_s * 1e3,
                "perf/samples_per_s": samples, "perf/tokens_per_s": samples * self.seq_length,
                "perf/monitor_overhead": self.spent / step_s, "perf/samples_seen": float(step * self.batch),
                "perf/tokens_seen": float(step * self.batch * self.seq_length),
                "perf/tflops": samples * self.flops / 1e12, "health/nan_steps": float(self.nan_steps),
                "health/skipped_steps": 0.0}

    def log(self, values: Dict[str, float], step: int) -> None:  # pragma: no cover - each peer has its own
        raise NotImplementedError


class MlflowPeer(StepValues):
    """``mlflow.log_metrics`` of the 14 values every step, to a sqlite store under ``work``.

    Example:
        >>> MlflowPeer("/tmp/w", synchronous=True, lr_at=lambda step: 3e-3)
    """

    def __init__(self, work: str, synchronous: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.uri = f"sqlite:///{os.path.join(work, 'mlflow.db')}"
        self.synchronous = synchronous

    def on_train_begin(self, run_context: Any) -> None:
        import mlflow

        mlflow.set_tracking_uri(self.uri)
        mlflow.set_experiment("bench")
        mlflow.start_run()

    def log(self, values: Dict[str, float], step: int) -> None:
        import mlflow

        mlflow.log_metrics(values, step=step, synchronous=self.synchronous)

    def on_train_end(self, run_context: Any) -> None:
        import mlflow

        mlflow.end_run()  # an asynchronous run's queue is flushed here


class TensorboardXPeer(StepValues):
    """tensorboardX's ``SummaryWriter.add_scalar`` once a value, every step, to ``work/tbx``.

    Example:
        >>> TensorboardXPeer("/tmp/w", lr_at=lambda step: 3e-3)
    """

    def __init__(self, work: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.logdir = os.path.join(work, "tbx")
        self.writer: Any = None

    def on_train_begin(self, run_context: Any) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(self.logdir)

    def log(self, values: Dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def on_train_end(self, run_context: Any) -> None:
        self.writer.close()


def warmup_lr(peak: float, warmup: int) -> Callable[[int], float]:
    """The bench's schedule (``nn.WarmUpLR(peak, warmup)``) as a Python function of the step."""
    return lambda step: peak * min(step, warmup) / warmup


def mindformers_loss_monitor(work: str, steps: int, lr: Any, batch: int) -> List[Any]:
    """mindformers' ``MFLossMonitor`` printing and writing to TensorBoard every step (its global writer)."""
    from types import SimpleNamespace

    from mindformers.core.callback.callback import MFLossMonitor
    from mindformers.utils import tensorboard as mf_tensorboard

    mf_tensorboard._set_tensorboard_writer(SimpleNamespace(tensorboard_dir=os.path.join(work, "tb"),
                                                           tensorboard_queue_size=10))
    return [MFLossMonitor(learning_rate=lr, per_print_times=1, origin_epochs=1, dataset_size=steps,
                          global_batch_size=batch)]
