"""The learning rate the optimizer actually used at each step, read at flush time.

MindSpore's optimizer evaluates ``learning_rate(global_step)`` and then
increments ``global_step``, so step ``s`` (1-based, as callbacks count) used the
schedule's value at ``s - 1``. A schedule (a pure function of the step) is
evaluated ahead for ``SCHEDULE_CHUNK`` steps in one call and kept, the first call
at train begin (``BridgeMonitor._begin``), so flushes only index a table; a
dynamic-lr list is read once; a fixed lr is read once per flush.

Example:
    >>> reader = LrReader(optimizer)
    >>> reader(np.array([1, 2, 3]))
    array([0.1, 0.0974, 0.0949])
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import numpy as np

log = logging.getLogger("msbridge")

#: Steps of a schedule evaluated per call (one eager call costs 1-7 ms, whatever its length).
SCHEDULE_CHUNK = 2048


def find_optimizer(cb_params: Any) -> Optional[Any]:
    """``cb_params.optimizer``, or the train network's optimizer (mindformers leaves the former None)."""
    opt = getattr(cb_params, "optimizer", None)
    if opt is None:
        opt = getattr(getattr(cb_params, "train_network", None), "optimizer", None)
    return opt


class LrReader:
    """Callable ``steps -> lr per step`` for one optimizer (first parameter group)."""

    def __init__(self, optimizer: Any) -> None:
        from mindspore.nn.learning_rate_schedule import LearningRateSchedule

        lr = optimizer.learning_rate
        if getattr(optimizer, "is_group_lr", False):
            lr = lr[0]
        self._schedule = lr if isinstance(lr, LearningRateSchedule) else None
        self._param = None if self._schedule is not None else lr
        self._table: Optional[np.ndarray] = None
        self._ahead: Optional[np.ndarray] = None  # the schedule's values, evaluated ahead
        self._chunk = SCHEDULE_CHUNK
        self._stepwise = False  # the schedule is not elementwise: each step is evaluated alone
        if self._param is not None and len(self._param.shape) == 1:
            self._table = self._param.asnumpy().astype(np.float64)  # dynamic lr list: fixed for the run

    def __call__(self, steps: np.ndarray) -> np.ndarray:
        used = np.maximum(steps - 1, 0)
        if self._table is not None:
            return self._table[np.minimum(used, len(self._table) - 1)]
        if self._schedule is not None:
            return self._from_schedule(used)
        return np.full(len(steps), float(self._param.asnumpy()), dtype=np.float64)

    def prepare(self, step: int) -> bool:
        """Evaluate what steps up to ``step`` need here, on the training thread: True when a call for them then
        only reads host values, which another thread may do; False for a schedule evaluated step by step."""
        return self._schedule is None or self._extend(max(step, 1))

    def _from_schedule(self, used: np.ndarray) -> np.ndarray:
        if self._extend(int(used.max()) + 1):
            return self._ahead[used]
        return np.array([self._scalar(s) for s in used])  # not elementwise: the window step by step

    def _extend(self, needed: int) -> bool:
        """The schedule's first ``needed`` values known (evaluated ahead); False when it is not elementwise."""
        have = 0 if self._ahead is None else len(self._ahead)
        if have >= needed:
            return True
        if self._stepwise:
            return False
        try:
            more = self._evaluate(np.arange(have, needed + self._chunk, dtype=np.int32))
        except RuntimeError:
            if not self._chunk:
                raise
            self._chunk = 0  # defined for the run's steps only (a dynamic-lr list): never ahead again
            more = self._evaluate(np.arange(have, needed, dtype=np.int32))
        if more is None:
            self._stepwise = True
            return False
        self._ahead = more if self._ahead is None else np.concatenate([self._ahead, more])
        return True

    def _evaluate(self, steps: np.ndarray) -> Optional[np.ndarray]:
        """The schedule at ``steps`` in one call, or None if it is not elementwise."""
        from mindspore import Tensor

        # ``construct`` runs the schedule's few ops eagerly; calling the Cell in GRAPH mode would
        # compile a graph for every new length (about 1 s each).
        try:
            values = np.asarray(self._schedule.construct(Tensor(steps)).asnumpy(), dtype=np.float64)
        except (TypeError, ValueError):  # Python control flow on the step (mindformers' schedules): one at a time
            return None
        return values if values.shape == steps.shape else None

    def _scalar(self, step: int) -> float:
        from mindspore import Tensor

        return float(self._schedule.construct(Tensor(np.int32(step))).asnumpy())
