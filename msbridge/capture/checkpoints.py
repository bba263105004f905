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

A saver rotates its files away (``keep_checkpoint_max``, 5 by default; mindformers' run YAMLs often say 2). When
MLflow logs the checkpoints as LoggedModels, ``rotation_line`` says so at train begin, with the setting and the sink
option ``log_checkpoints: best`` that keeps the best one. With ``best`` or ``upload``, each new file is hard-linked
to ``kept_path`` as it is seen, on the training thread: one link per saved checkpoint (no data copied), made before
the saver's next save can rotate it away, which no sink thread can promise. The MLflow sink then uploads it, or
keeps the best (``adapters/mlflow_tracker/run/models.BestKeeper``), and removes the other links.

Example:
    >>> watch = CheckpointWatch.from_callbacks(cb_params.list_callback, rank=0, offset=0)
    >>> watch.poll()
    [Event(kind='checkpoint', step=100, rank=0, ..., detail={'path': '/ckpt/net-1_100.ckpt', 'source': 'ModelCheckpoint'})]
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..sinks.base import Event

log = logging.getLogger("msbridge")

CHECKPOINT = "checkpoint"
#: Where ``log_checkpoints: best`` keeps checkpoints, in the run dir.
KEPT_DIR = "checkpoints"
#: A saver's settings that delete its older files, and what each keeps.
_ROTATIONS = (("keep_checkpoint_max", "only its last {} files"),
              ("keep_checkpoint_per_n_minutes", "one file per {} minutes"))


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
        self.hold_in: Optional[str] = None  # the run dir, while each new file is hard-linked there (``plan``)

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
                if self.hold_in is not None:
                    _hard_link(path, kept_path(self.hold_in, step, path))
        return events

    def plan(self, sinks: Mapping[str, Mapping[str, Any]], run_dir: str, steps: Optional[int] = None) -> None:
        """At train begin, on rank 0: with the mlflow option ``log_checkpoints: best`` or ``upload``, hold each new
        file under ``run_dir``; else one line when a saver's rotation can delete checkpoints MLflow logs in the
        ``steps`` this training runs (None: not known)."""
        if self.rank != 0 or not self.savers:
            return
        if "mlflow" in sinks and (sinks["mlflow"] or {}).get("log_checkpoints") in ("best", "upload"):
            self.hold_in = run_dir
            os.makedirs(os.path.join(run_dir, KEPT_DIR), exist_ok=True)  # here, not at the first save
            return
        line = rotation_line(self.savers, sinks, steps)
        if line:
            log.warning(line)


def kept_path(run_dir: str, step: int, path: str) -> str:
    """Where ``log_checkpoints: best`` keeps the file ``path`` saved at ``step``: ``<run dir>/checkpoints/step<N>-``
    and its name with anything but ``[A-Za-z0-9._-]`` made ``_``.

    Example:
        >>> kept_path("/runs/lr0.01", 50, "/ckpt/net-1_50.ckpt")
        '/runs/lr0.01/checkpoints/step50-net-1_50.ckpt'
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(path)).lstrip(".")
    return os.path.join(run_dir, KEPT_DIR, f"step{step}-{name or 'checkpoint'}")


def _hard_link(source: str, target: str) -> None:
    """``target`` a hard link of ``source``; nothing when it cannot be (another file system: the sink copies it)."""
    try:
        os.link(source, target)
    except OSError:  # FileExistsError: held already (a step polled twice)
        pass


def rotation_line(savers: Sequence[Any], sinks: Mapping[str, Mapping[str, Any]],
                  steps: Optional[int] = None) -> Optional[str]:
    """What rotation does to the LoggedModels, naming the saver's setting; None when nothing is rotated (a saver
    that saves every N steps keeps more files than ``steps`` make), or MLflow logs no checkpoint or holds each file
    (``log_checkpoints: off`` / ``best`` / ``upload``).

    Example:
        >>> from mindspore.train import CheckpointConfig, ModelCheckpoint
        >>> rotation_line([ModelCheckpoint("net", config=CheckpointConfig(keep_checkpoint_max=2))], {"mlflow": {}})
        'msbridge: ModelCheckpoint keeps only its last 2 files (CheckpointConfig(keep_checkpoint_max=2)): ...'
    """
    if "mlflow" not in sinks or (sinks["mlflow"] or {}).get("log_checkpoints") in ("off", "best", "upload"):
        return None
    for saver in savers:
        config, name = getattr(saver, "_config", None), type(saver).__name__
        for key, keeps in _ROTATIONS:
            value = getattr(config, key, None)
            if not value:
                continue
            every = getattr(config, "save_checkpoint_steps", None)
            saves = -(-steps // every) if steps and every else None  # the last step's file is saved at the end
            if key == "keep_checkpoint_max" and saves is not None and saves <= value:
                break  # every file this training saves is kept
            where = (f"{key}: {value} in the {name} entry of callbacks" if name == "CheckpointMonitor"
                     else f"CheckpointConfig({key}={value})")  # mindformers' is set in its run YAML
            return (f"msbridge: {name} keeps {keeps.format(value)} ({where}): the MLflow LoggedModels of the "
                    f"checkpoints it deletes are marked msbridge.checkpoint.file=deleted (status Failed); to keep "
                    f"the best one on the objective: sinks: {{mlflow: {{log_checkpoints: best}}}}")
    return None


def _latest(saver: Any) -> str:
    return str(getattr(saver, "_latest_ckpt_file_name", "") or "")
