"""``MFPipelineWithLossScaleCell``'s output through the layout detection (capture/host_buffer.py ``detect_layout``).

Not a real run: the pipeline cell needs semi-auto parallel, and MindSpore refuses semi_auto_parallel on CPU
(``RuntimeError: Invalid backend: CPU``, docs/mindformers.md). So the test takes the cell's own return
statements from the installed mindformers' source (wrapper.py, ``construct``: ``return loss, overflow,
scaling_sens.value(), learning_rate, global_norm[, local_norm, size]``), builds a tuple of real MindSpore tensors
in that order, each with a value of its own, and hands it to ``StepBuffer`` as the step end would, step after
step. The loss scale is ``scaling_sens.value()``: a plain Tensor, not the live Parameter ``MFTrainOneStepCell``
returns, so it is read per step, not once per flush.
"""
from __future__ import annotations

import inspect

import mindspore as ms
import numpy as np
import pytest

from msbridge.capture.host_buffer import StepBuffer, detect_layout
from msbridge.names import GRAD_NORM, LOSS, LOSS_SCALE, LR, OVERFLOW

wrapper = pytest.importorskip("mindformers.wrapper.wrapper")

FIELDS = {"loss": LOSS, "overflow": OVERFLOW, "scaling_sens.value()": LOSS_SCALE, "learning_rate": LR,
          "global_norm": GRAD_NORM}


def _returns():
    """The pipeline cell's return statements, each as its list of expressions."""
    source = inspect.getsource(wrapper.MFPipelineWithLossScaleCell.construct)
    lines = [line.strip()[len("return "):] for line in source.splitlines() if line.strip().startswith("return ")]
    return [[part.strip() for part in line.split(",")] for line in lines]


def _outputs(names, step):
    """One step's output in the cell's order: real tensors with distinct values (local norms: a vector)."""
    scale = ms.Parameter(ms.Tensor(2.0 ** (10 - step), ms.float32), name="scale_sense")
    value = {"loss": ms.Tensor(3.0 + step, ms.float32), "overflow": ms.Tensor(step % 2 == 1),
             "scaling_sens.value()": scale.value(), "learning_rate": ms.Tensor(1e-4 * step, ms.float32),
             "global_norm": ms.Tensor(0.5 * step, ms.float32),
             "local_norm": ms.Tensor(np.full(3, 9.0, np.float32)), "size": ms.Tensor(np.ones(3, np.int32))}
    return tuple(value[name] for name in names)


def test_the_cells_return_layouts_are_the_mindformers_layout():
    returns = _returns()
    assert sorted(len(r) for r in returns) == [5, 7], returns
    for names in returns:
        assert names[:5] == list(FIELDS), "loss, overflow, loss scale, lr, global norm: msbridge's order"


@pytest.mark.parametrize("local_norm", [False, True], ids=["5-tuple", "local_norm-7-tuple"])
def test_loss_scale_and_overflow_are_taken_from_their_positions(local_norm):
    names = next(r for r in _returns() if (len(r) == 7) == local_norm)
    assert {i: n for i, n in detect_layout(_outputs(names, 1))} == {i: FIELDS[n] for i, n in enumerate(names[:5])}
    buffer = StepBuffer()
    for step in range(1, 5):
        buffer.append(step, 1, _outputs(names, step), 0.01, 0.0)
    window = buffer.drain()
    assert window.scalars[LOSS_SCALE].tolist() == [2.0 ** (10 - s) for s in range(1, 5)], "per step, not at flush"
    assert window.scalars[OVERFLOW].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert window.scalars[LOSS].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert window.scalars[GRAD_NORM].tolist() == [0.5, 1.0, 1.5, 2.0]
    assert np.allclose(window.scalars[LR], [1e-4, 2e-4, 3e-4, 4e-4])
    assert LOSS_SCALE not in window.at_flush
