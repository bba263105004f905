"""The checkpoints other callbacks save, as ``checkpoint`` events at the step they were saved.

MindSpore's ``ModelCheckpoint`` (and mindformers' ``CheckpointMonitor``, a subclass of it) keeps the file it
saved last in ``latest_ckpt_file_name`` and the step it saved at in ``_last_triggered_step``. ``CheckpointWatch``
reads both at every step end (two attribute reads per checkpoint callback: no I/O, no device access) and turns
each new file into ``Event("checkpoint", step, rank, {"path", "source"})``. The health action
``checkpoint_and_stop`` makes the same event itself (``health.runner``). Trackers link their metrics to it: the
MLflow sink makes each one a LoggedModel of the run.

The run's close polls once more after every callback's ``on_train_end`` (``BridgeMonitor`` closes in its
``__exit__`` when it runs inside ``Model.train``), so the checkpoint ``ModelCheckpoint`` saves at the end is
seen too.

Example:
    >>> watch = CheckpointWatch.from_callbacks(cb_params.list_callback, rank=0, offset=0)
    >>> watch.poll()
    [Event(kind='checkpoint', step=100, rank=0, ..., detail={'path': '/ckpt/net-1_100.ckpt', 'source': 'ModelCheckpoint'})]
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Sequence

from ..sinks.base import Event

CHECKPOINT = "checkpoint"


class CheckpointWatch:
    """Sees each checkpoint file a ``ModelCheckpoint`` of ``callbacks`` saves.

    Args:
        callbacks: the training's callbacks (``cb_params.list_callback``).
        rank: this process's rank.
        offset: added to a callback's step (the steps before this ``Model.train`` call, as for every step).
    """

    def __init__(self, savers: Sequence[Any], rank: int, offset: int = 0) -> None:
        self.savers = list(savers)
        self.rank = rank
        self.offset = offset
        self._seen: Dict[int, str] = {id(s): _latest(s) for s in self.savers}  # files saved before training

    @classmethod
    def from_callbacks(cls, callbacks: Sequence[Any], rank: int, offset: int = 0) -> "CheckpointWatch":
        from mindspore.train import ModelCheckpoint

        return cls([cb for cb in callbacks or () if isinstance(cb, ModelCheckpoint)], rank, offset)

    def poll(self) -> List[Event]:
        """A ``checkpoint`` event for each file saved since the last poll (none without a ``ModelCheckpoint``)."""
        events = []
        for saver in self.savers:
            path = _latest(saver)
            if path and path != self._seen[id(saver)]:
                self._seen[id(saver)] = path
                step = int(getattr(saver, "_last_triggered_step", 0) or 0) + self.offset
                events.append(Event(CHECKPOINT, step, self.rank, time.time(),
                                    {"path": os.path.abspath(path), "source": type(saver).__name__}))
        return events


def _latest(saver: Any) -> str:
    return str(getattr(saver, "_latest_ckpt_file_name", "") or "")
