"""mindformers' pynative ``Trainer`` (``mindformers.pynative``) seen as MindSpore callback params.

That Trainer calls its callbacks as ``TrainerCallback`` does:
``on_train_begin(args, state, model=, optimizer=, lr_scheduler=, train_dataset=, ...)`` and
``on_step_end(args, state, loss=, grad_norm=, ...)``, where ``state`` is its ``TrainerState``
(``global_step`` counted from 1 after the first step, ``max_steps``, ``epoch_step``) and
``grad_norm`` is None on a step whose gradients overflowed (the Trainer then skips the update).
``PynativeSteps`` keeps one ``cb_params`` and one ``RunContext`` up to date from those
arguments, so ``BridgeMonitor``'s own hooks record the step: the same stream and sinks as under
the graph-mode Trainer.

Each step's outputs become ``(loss, overflow, None, None, grad_norm)``, the layout of
mindformers' graph-mode train cells without lr and loss scale: the lr is read at flush time
from the optimizer's schedule, which is the ``lr_scheduler`` the Trainer hands in.

Example:
    >>> steps = PynativeSteps()
    >>> context = steps.begin(state, model=model, optimizer=optimizer, train_dataset=dataset)
    >>> context = steps.step_end(state, loss=loss, grad_norm=grad_norm)
"""
from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import MsbridgeError


class TrainingStopped(MsbridgeError):
    """msbridge's health check stopped a pynative run: that Trainer has no stop request, so the
    monitor raises this after it has closed every sink."""


class PynativeSteps:
    """Callback params for ``BridgeMonitor``, kept from the pynative Trainer's callback arguments."""

    def __init__(self) -> None:
        self.context: Optional[Any] = None
        self._ok: Any = None  # the overflow flags, made once
        self._overflow: Any = None
        self._nan: Any = None

    def begin(self, state: Any, **kwargs: Any) -> Any:
        """The RunContext for ``on_train_begin``: expected steps = ``state.max_steps``."""
        import numpy as np
        from mindspore import Tensor
        from mindspore.train.callback import RunContext, _InternalCallbackParam

        cb = _InternalCallbackParam()
        cb.train_network = kwargs.get("model")
        cb.optimizer = kwargs.get("optimizer")
        cb.train_dataset = kwargs.get("train_dataset")
        cb.dataset_sink_mode = False
        cb.cur_step_num = int(state.global_step)
        cb.cur_epoch_num = 1
        cb.epoch_num, cb.batch_num = 1, int(state.max_steps)  # BridgeMonitor's expected steps: their product
        cb.net_outputs = None
        self._ok, self._overflow = Tensor(False), Tensor(True)
        self._nan = Tensor(np.float32(math.nan))
        self.context = RunContext(cb)
        return self.context

    def step_end(self, state: Any, loss: Any = None, grad_norm: Any = None, **kwargs: Any) -> Any:
        """The RunContext for ``on_train_step_end`` of the step the Trainer just ran."""
        if self.context is None:
            raise MsbridgeError("msbridge: the pynative Trainer called on_step_end before on_train_begin")
        cb = self.context.original_args()
        per_epoch = int(state.epoch_step) or int(state.max_steps) or 1
        cb.cur_step_num = int(state.global_step)
        cb.batch_num = per_epoch
        cb.cur_epoch_num = (cb.cur_step_num - 1) // per_epoch + 1
        overflowed = grad_norm is None
        cb.net_outputs = (loss, self._overflow if overflowed else self._ok, None, None,
                          self._nan if overflowed else grad_norm)
        return self.context
