"""``msbridge.track``: the monitor for training loops without callbacks.

MindSpore's quick start trains with a functional ``value_and_grad`` step and a Python ``for`` loop;
no ``Model.train`` calls a callback. ``track`` gives that loop the same run as ``BridgeMonitor``
(it drives a ``BridgeMonitor``'s own step and flush path): the same sinks, health actions, cross-rank
aggregation, run files and outcome.

``run.step(...)`` keeps each value as it is (a MindSpore Tensor stays a Tensor: no device->host sync
on the step's path); the flush copies each metric's window to the host once, as ``StepBuffer``
does for the callback. A health ``stop`` action sets ``run.should_stop``, which the loop reads.

Example:
    >>> import msbridge
    >>> with msbridge.track("monitor.yaml", optimizer=optimizer) as run:
    ...     for data, label in dataset.create_tuple_iterator():
    ...         loss = train_step(data, label)
    ...         run.step(loss=loss)
    ...         if run.should_stop:
    ...             break
"""
from __future__ import annotations

import functools
import logging
import math
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from .callback import BridgeMonitor
from .capture.host_buffer import StepBuffer
from .capture.window import Window
from .config.load import Config
from .errors import ConfigError
from .health.detectors.base import CHECKPOINT_AND_STOP
from .limits import int_digits
from .names import EVAL_PREFIX, EVAL_SAMPLES, GRAD_NORM, LOSS, LOSS_SCALE, LR, OVERFLOW, STEP_SCALARS
from .sinks.base import Sink

log = logging.getLogger("msbridge")
_FLOAT_MAX = sys.float_info.max

# run.step's keywords for the metrics every sink already knows (the callback's output layouts)
KNOWN = {"loss": LOSS, "grad_norm": GRAD_NORM, "lr": LR, "loss_scale": LOSS_SCALE, "overflow": OVERFLOW}


def metric_name(key: str) -> str:
    """The recorded name of a ``run.step`` keyword: ``loss`` -> ``train/loss``, ``accuracy`` -> ``train/accuracy``."""
    return KNOWN.get(key) or (key if "/" in key else f"train/{key}")


class NamedStepBuffer(StepBuffer):
    """``StepBuffer`` for named values: ``append`` takes ``{name: Tensor or number}``. A name that a step
    leaves out is absent at that step (``Window.absent``): never recorded there, in no sink. The five step
    scalars go to ``Window.scalars`` (health reads them), every other name to ``Window.series``.

    Example:
        >>> buffer = NamedStepBuffer()
        >>> buffer.append(1, 1, {"train/loss": 2.0}, 0.01, 0.0)
        >>> buffer.append(2, 1, {"train/loss": 1.9, "eval/accuracy": 0.5}, 0.01, 0.0)
        >>> buffer.drain().absent["eval/accuracy"].tolist()
        [True, False]
    """

    def append(self, step: int, epoch: int, outputs: Mapping[str, Any], step_time_s: float, monitor_s: float,
               wall: Optional[float] = None) -> None:
        if self.layout is None:
            from mindspore import get_context

            self._in_host_memory = get_context("device_target") == "CPU"
            self.layout = ()
        held = len(self._host)
        for name in outputs.keys() - self._tensors.keys():  # a name first given now: absent before
            self._tensors[name] = [None] * held
        for name, column in self._tensors.items():
            column.append(outputs.get(name))
        self._host.add(step, epoch, step_time_s, monitor_s, wall)

    def drain(self, lr_at: Optional[Callable[[np.ndarray], Optional[np.ndarray]]] = None) -> Optional[Window]:
        absent = {name: np.array([v is None for v in column]) for name, column in self._tensors.items()}
        window = super().drain(lr_at)
        if window is None:
            return None
        window.absent = {name: mask for name, mask in absent.items() if mask.any()}
        for name in [n for n in window.scalars if n not in STEP_SCALARS]:
            window.series[name] = window.scalars.pop(name)
        return window

    def _to_host(self, name: str, values: List[Any]) -> np.ndarray:
        """The Tensors of a column in one copy (``StepBuffer._to_host``); numbers as they are; an absent
        value (None) is a NaN filler that ``Window.absent`` marks."""
        at = [i for i, v in enumerate(values) if hasattr(v, "asnumpy")]
        out = np.array([math.nan if v is None or hasattr(v, "asnumpy") else float(v) for v in values],
                       dtype=np.float64)
        if at:
            out[at] = super()._to_host(name, [values[i] for i in at])
        return out


_REAL = (int, float, np.integer, np.floating)


@functools.lru_cache(maxsize=1)
def _complex_dtypes() -> frozenset:
    from mindspore import dtype as mstype

    return frozenset(getattr(mstype, name) for name in ("complex64", "complex128") if hasattr(mstype, name))


def _check_value(key: str, value: Any, call: str = "run.step") -> None:
    """A real Tensor or a real number a float holds (checked on the step's path: a type test, no device read).
    Anything a float would change (a complex loses its imaginary part, an int past 1.8e308 overflows at the
    flush) is refused here, naming its keyword.

    Example:
        >>> _check_value("loss", np.complex128(1 + 2j))
        Traceback (most recent call last):
        ...
        TypeError: msbridge: run.step(loss=...) takes a MindSpore Tensor or a real number, not complex128: not recorded
    """
    if hasattr(value, "asnumpy"):
        if getattr(value, "dtype", None) in _complex_dtypes():
            raise TypeError(f"msbridge: {call}({key}=...) takes a real Tensor, not {value.dtype}; record its "
                            "real part or abs() under names of their own")
        return
    if isinstance(value, bool) or not isinstance(value, _REAL) or isinstance(value, np.timedelta64):
        raise TypeError(f"msbridge: {call}({key}=...) takes a MindSpore Tensor or a real number, not "
                        f"{type(value).__name__}: not recorded")
    if isinstance(value, int) and not -_FLOAT_MAX <= value <= _FLOAT_MAX:
        raise ValueError(f"msbridge: {call}({key}=...) is an integer of about {int_digits(value):_} digits, past "
                         "the largest float (1.8e308): not recorded")


class _Params(dict):
    """What the monitor reads of MindSpore's callback parameters, filled by ``TrackedRun``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _Sized:
    """A stand-in dataset that answers the batch size and the steps per epoch the loop told ``track``."""

    def __init__(self, batch_size: Optional[int], size: Optional[int]) -> None:
        self.batch_size, self.size = batch_size, size

    def get_batch_size(self) -> Optional[int]:
        return self.batch_size

    def get_dataset_size(self) -> Optional[int]:
        return self.size


class _Context:
    """MindSpore's ``RunContext`` as the monitor uses it (``original_args``, ``request_stop``)."""

    def __init__(self, params: _Params) -> None:
        self.params, self.stop_requested = params, False

    def original_args(self) -> _Params:
        return self.params

    def request_stop(self) -> None:
        self.stop_requested = True


class _LoopMonitor(BridgeMonitor):
    """A BridgeMonitor whose steps come from ``run.step`` (named values, steps numbered by the loop)."""

    def _begin(self, run_context: Any) -> None:
        super()._begin(run_context)
        self._buffer = NamedStepBuffer()
        self._offset = 0  # the loop numbers its steps itself


class TrackedRun:
    """One monitored run of a custom training loop; use it through ``msbridge.track``.

    Args:
        config: a path to a YAML file, a dict, or a ``Config`` (as ``BridgeMonitor`` takes).
        network: the trained network (health's ``checkpoint_and_stop`` saves its parameters).
        optimizer: read for the learning rate when ``step`` is not given ``lr``.
        dataset: a MindSpore dataset: its batch size (samples/s) and size (steps per epoch).
        epochs: epochs the loop runs (with ``dataset``, the expected steps of the progress line).
        total_steps: the steps the loop runs, when there is no dataset to tell.
        batch_size: samples per step, when there is no dataset to tell.
        overrides, sinks, progress, trial: as ``BridgeMonitor`` takes them (an Optuna ``trial`` that prunes
            sets ``should_stop``).

    Example:
        >>> run = TrackedRun({"sinks": ["jsonl"]}, total_steps=100).start()
        >>> run.step(loss=loss)
        >>> run.close()
    """

    def __init__(self, config: Union[str, Mapping[str, Any], Config, None] = None, *, network: Any = None,
                 optimizer: Any = None, dataset: Any = None, epochs: int = 1, total_steps: Optional[int] = None,
                 batch_size: Optional[int] = None, overrides: Sequence[str] = (), sinks: Sequence[Sink] = (),
                 progress: bool = True, trial: Any = None) -> None:
        self.monitor = _LoopMonitor(config, overrides=overrides, sinks=sinks, progress=progress, trial=trial)
        saving = self.monitor.health.spec.checks_with(CHECKPOINT_AND_STOP)
        if saving and network is None:
            raise ConfigError(f"health.{saving[0]}.action: checkpoint_and_stop saves the network's weights: "
                              "pass it, msbridge.track(..., network=model), or use action stop")
        size = dataset.get_dataset_size() if dataset is not None else None
        batch = batch_size or (dataset.get_batch_size() if dataset is not None else None)
        per_epoch = total_steps or size
        self._params = _Params(
            cur_step_num=0, cur_epoch_num=1, epoch_num=1 if total_steps else epochs, batch_num=per_epoch,
            train_network=network, optimizer=optimizer, dataset_sink_mode=False,
            train_dataset=_Sized(batch, per_epoch), net_outputs=None, train_dataset_element=None)
        self._context = _Context(self._params)
        self._step = 0
        self._per_epoch = size

    @property
    def run_dir(self) -> Optional[str]:
        """The run's directory (None when the config switches monitoring off)."""
        return self.monitor.run_dir

    @property
    def should_stop(self) -> bool:
        """True once a health ``stop`` (or ``checkpoint_and_stop``) action fired, or the Optuna trial was pruned
        (``msbridge.sweep``): the loop should end."""
        return self._context.stop_requested

    @property
    def outcome(self) -> Any:
        """How the run ended (``BridgeMonitor.outcome``)."""
        return self.monitor.outcome

    def start(self) -> "TrackedRun":
        """Open the sinks and write the run files (``with track(...)`` calls it)."""
        self.monitor.on_train_begin(self._context)
        return self

    def step(self, loss: Any = None, grad_norm: Any = None, lr: Any = None, *, step: Optional[int] = None,
             epoch: Optional[int] = None, **metrics: Any) -> None:
        """Record one training step. Each value is a MindSpore Tensor (kept, read at the flush) or a number.

        Args:
            loss, grad_norm, lr: recorded as ``train/loss``, ``train/grad_norm``, ``train/lr``.
            step: the global step (default: one more than the last one).
            epoch: the epoch, 1-based (default: from the step and the dataset's size when ``track`` was given
                a dataset, else the last one given, first 1).
            metrics: further values, recorded as ``train/<name>`` (``loss_scale``, ``overflow`` as the
                callback records them).
        """
        values = {k: v for k, v in dict(metrics, loss=loss, grad_norm=grad_norm, lr=lr).items() if v is not None}
        for key, value in values.items():
            _check_value(key, value)
        named: Dict[str, Any] = {metric_name(k): v for k, v in values.items()}
        if step is not None and int(step) <= self._step:
            self.monitor.tally.refuse(f"run.step(step={int(step)})", self._step)
            return
        self._step = int(step) if step is not None else self._step + 1
        params = self._params
        params["cur_step_num"], params["net_outputs"] = self._step, named
        if epoch is None and self._per_epoch:
            epoch = (self._step - 1) // self._per_epoch + 1
        if epoch is not None:
            params["cur_epoch_num"] = int(epoch)
        self.monitor.on_train_step_end(self._context)

    def eval(self, *, samples: Optional[int] = None, **metrics: Any) -> None:
        """Record one evaluation at the current step: ``run.eval(loss=0.41, accuracy=0.88)`` is ``eval/loss``,
        ``eval/accuracy`` (numbers, or Tensors read now: an evaluation is not on the step's path). ``samples``:
        how many samples it evaluated (the weight of this rank's values in data parallel)."""
        for key, value in metrics.items():
            _check_value(key, value, "run.eval")
        values = {f"{EVAL_PREFIX}{k}": float(v.asnumpy()) if hasattr(v, "asnumpy") else float(v)
                  for k, v in metrics.items()}
        if samples:
            values[EVAL_SAMPLES] = float(samples)
        self.monitor.record_eval(values)

    def close(self, status: Optional[str] = None) -> None:
        """End the run: the final flush, then every sink closed (FINISHED unless ``status`` says otherwise)."""
        if status is None:
            self.monitor.on_train_end(self._context)
        else:
            self.monitor.close(status)

    def __enter__(self) -> "TrackedRun":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.monitor.__exit__(exc_type, exc, tb)  # FINISHED, FAILED or KILLED, as after Model.train


def track(config: Union[str, Mapping[str, Any], Config, None] = None, **kwargs: Any) -> TrackedRun:
    """A monitored run for a training loop without callbacks (see ``TrackedRun`` for the arguments).

    Example:
        >>> with msbridge.track("monitor.yaml", dataset=train_dataset, epochs=3) as run:
        ...     for data, label in train_dataset.create_tuple_iterator():
        ...         run.step(loss=train_step(data, label))
    """
    return TrackedRun(config, **kwargs)
