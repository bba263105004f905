"""The learning rate the optimizer actually used at each step, read at flush time.

MindSpore's optimizer evaluates ``learning_rate(global_step)`` and then
increments ``global_step``, so step ``s`` (1-based, as callbacks count) used the
schedule's value at ``s - 1``. Schedules are evaluated for a whole window in one
call; a dynamic-lr list is read once; a fixed lr is read once per flush.

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
        if self._param is not None and len(self._param.shape) == 1:
            self._table = self._param.asnumpy().astype(np.float64)  # dynamic lr list: fixed for the run

    def __call__(self, steps: np.ndarray) -> np.ndarray:
        used = np.maximum(steps - 1, 0)
        if self._table is not None:
            return self._table[np.minimum(used, len(self._table) - 1)]
        if self._schedule is not None:
            return self._from_schedule(used)
        return np.full(len(steps), float(self._param.asnumpy()), dtype=np.float64)

    def _from_schedule(self, used: np.ndarray) -> np.ndarray:
        from mindspore import Tensor

        # ``construct`` runs the schedule's few ops eagerly (1-7 ms a window); calling the Cell in GRAPH
        # mode would compile a graph for every new window length (about 1 s each).
        values = np.asarray(self._schedule.construct(Tensor(used.astype(np.int32))).asnumpy(), dtype=np.float64)
        if values.shape == used.shape:
            return values
        # A schedule that is not elementwise: evaluate step by step (at flush, off the step path).
        return np.array([float(self._schedule.construct(Tensor(np.int32(s))).asnumpy()) for s in used])
