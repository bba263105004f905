"""What MindSpore's callback parameters (``run_context.original_args()``) say about the run.

Example:
    >>> cb = run_context.original_args()
    >>> param(cb, "cur_step_num"), steps_per_call(cb), expected_steps(cb)
    (1, 1, 300)
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Optional

import mindspore as ms

log = logging.getLogger("msbridge")


def param(cb: Any, name: str, default: Any = None) -> Any:
    """A callback parameter; MindSpore's ``_InternalCallbackParam`` raises KeyError for a missing one."""
    try:
        return getattr(cb, name)
    except (AttributeError, KeyError):
        return default


def resume_offset(cb: Any, first_step: int) -> int:
    """Steps done before this ``Model.train`` call: it counts ``cur_step_num`` from 1 even with
    ``initial_epoch``, while ``cur_epoch_num`` continues. The global step is the sum."""
    epoch, per_epoch = param(cb, "cur_epoch_num", 1) or 1, param(cb, "batch_num", 0) or 0
    return max(0, (int(epoch) - 1) * int(per_epoch) - (first_step - 1))


def first_train_step(cb: Any) -> int:
    """At train begin: the global step the training's first step will be. MindSpore puts ``initial_epoch`` on
    no callback parameter before the first step, so it is read from ``Model._train``'s own frame; a
    ``cur_step_num`` already past 0 (``initial_step``, mindformers' resume) counts the steps done itself."""
    done = int(param(cb, "cur_step_num", 0) or 0)
    if done:
        return done + 1
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "_train" and "initial_epoch" in frame.f_locals
                                     and str(frame.f_globals.get("__name__", "")).startswith("mindspore.")):
        frame = frame.f_back
    initial_epoch = int(frame.f_locals["initial_epoch"] or 0) if frame is not None else 0
    return initial_epoch * int(param(cb, "batch_num", 0) or 0) + 1


def nearest_batch(dataset: Any) -> Any:
    """The batch operation nearest the top of a MindSpore dataset pipeline (``repeat`` or ``map`` may follow it)."""
    while dataset is not None and not hasattr(dataset, "drop_remainder"):
        children = getattr(dataset, "children", None) or [None]
        dataset = children[0]
    return dataset


def batch_size_of(cb: Any) -> Optional[int]:
    """The training dataset's batch size (None when it has no fixed one). Said once at train begin: a batch
    with ``drop_remainder=False`` whose samples do not divide by it (or whose count is unknown): the short last
    batch that the sample and token counts would count full."""
    dataset = param(cb, "train_dataset", None)
    try:
        size = int(dataset.get_batch_size()) if dataset is not None else None
    except Exception:  # a dataset without a fixed batch size
        return None
    short = short_last_batch(dataset, size) if size else 0
    if short != 0:
        holds = f"holds {short} samples, not {size}" if short else f"may hold fewer than {size} samples"
        log.warning("msbridge: the training dataset is batched with drop_remainder=False: an epoch's last batch "
                    "%s, and perf/samples_seen, perf/tokens_seen, perf/samples_per_s and perf/tflops count it as "
                    "full; batch with drop_remainder=True for exact counts", holds)
    return size


def short_last_batch(dataset: Any, size: int) -> Optional[int]:
    """The samples in an epoch's short last batch of ``dataset`` batched by ``size``: 0 when there is none (its
    samples divide evenly, or ``drop_remainder=True`` drops it), None when its sample count is unknown."""
    batch = nearest_batch(dataset)
    if getattr(batch, "drop_remainder", True) is not False:
        return 0
    try:
        rows = int(batch.children[0].get_dataset_size())
    except Exception:  # no child, or a source that cannot say its size
        return None
    return rows % size if rows > 0 else None


def steps_per_call(cb: Any) -> int:
    """Steps between two step-end calls: ``sink_size`` in device sink mode, else 1."""
    if not param(cb, "dataset_sink_mode", False):
        return 1  # also CPU with dataset_sink_mode=True: MindSpore runs it step by step
    size = int(param(cb, "sink_size", -1) or -1)
    return size if size > 0 else int(param(cb, "batch_num", 1) or 1)


def expected_steps(cb: Any) -> Optional[int]:
    """The steps ``Model.train`` will run (epochs x steps per epoch), when it says."""
    epochs = param(cb, "epoch_num", None)
    per_epoch = param(cb, "batch_num", None)
    dataset = param(cb, "train_dataset", None)
    if dataset is not None and ms.get_context("device_target") == "CPU":
        # CPU runs whole epochs, also with dataset_sink_mode=True: MindSpore then reports the mode as off,
        # but batch_num stays sink_size
        per_epoch = dataset.get_dataset_size()
    if epochs and per_epoch:
        return int(epochs) * int(per_epoch)
    return None
