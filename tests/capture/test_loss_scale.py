"""Loss scale, overflow and skipped-step counts on real MindSpore training (CPU), from every train cell kind.

Each run starts its ``DynamicLossScaleUpdateCell`` at 2**127, so the first steps' scaled gradients overflow
float32: the cell halves the scale and skips the update until a scale fits. The count of skipped steps is
checked against the weights themselves (a skipped step leaves every weight bit-identical), over several
flush windows (flush every 5 steps).

One piece is replaced, and only on CPU: MindSpore's and mindformers' ``get_overflow_status`` read the NPU's
float status (``NPUGetFloatStatusV2``, no CPU kernel), so the CPU subclasses check the gradients with
IsFinite instead; the scale update, the skip and the outputs are the cells' own code.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from helpers.runs import monitor
from helpers.training import regression_data, train_regression
from mindspore import nn, ops
from mindspore.train import Callback

from msbridge.capture.host_buffer import StepBuffer
from msbridge.capture.ring_cell import attach_ring
from msbridge.capture.ring_reader import RingReader
from msbridge.capture.train_step import TrainStep
from msbridge.sinks.runlog import read_run

pytestmark = [pytest.mark.slow, pytest.mark.compat]
HUGE = 2.0 ** 127  # float32's largest power of two: a gradient above 2 times this scale overflows
STEPS = 24
WINDOW = 2  # the scale doubles after 2 finite steps, so overflows recur all run long


def _nonfinite(grads):
    return ops.logical_not(ops.stack([ops.isfinite(g).all() for g in grads]).all())


class CpuLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale cell with the overflow status read by IsFinite (no NPU float status on CPU)."""

    def get_overflow_status(self, status, compute_output):
        return _nonfinite(compute_output)


def _weights(run_context):
    """The optimizer's parameters (not the cells' ``scale_sense``, a Parameter that changes on overflow)."""
    return [p.asnumpy().copy() for p in run_context.original_args().train_network.optimizer.parameters]


class WeightSteps(Callback):
    """After each step: did any weight change (the update was applied)?"""

    def __init__(self):
        super().__init__()
        self.before, self.updated = None, []

    def on_train_begin(self, run_context):
        self.before = _weights(run_context)

    def on_train_step_end(self, run_context):
        now = _weights(run_context)
        self.updated.append(any(not np.array_equal(a, b) for a, b in zip(now, self.before)))
        self.before = now


def _records(mon):
    recs = read_run(mon.run_dir).ranks[0].records
    assert [r.step for r in recs] == list(range(1, STEPS + 1)), "every step is recorded"
    return recs


def _scales_after(overflow):
    """The scale after each step by DynamicLossScaleUpdateCell's rule (factor 2, window 2), from the flags."""
    scale, cur, last, out = HUGE, 1, 0, []
    for flag in overflow:
        grow = cur - last >= WINDOW
        scale = max(scale / 2, 1.0) if flag else scale * 2 if grow else scale
        last = cur if flag or grow else last
        cur += 1
        out.append(scale)
    return np.array(out)


def _check(mon, weights, scale_is="after"):
    """The curves agree with the weights and with the scale manager's rule, over several flush windows.

    ``scale_is``: "after" (the cell returns its ``scale_sense`` Parameter after the step's update: MindSpore's
    and mindformers' cells through the ring), "used" (``TrainStep``: the scale the step used), "flush" (the
    host buffer reads that Parameter once per flush: the window's last step only)."""
    recs = _records(mon)
    overflow = np.array([r.values["train/overflow"] for r in recs])
    skipped = np.array([r.values["health/skipped_steps"] for r in recs])
    assert overflow.tolist() == [0.0 if u else 1.0 for u in weights.updated], "overflow <=> update skipped"
    assert 5 < overflow.sum() < STEPS - 5, "overflows recur: the scale grows back after 2 finite steps"
    np.testing.assert_array_equal(skipped, np.cumsum(overflow))
    after = _scales_after(overflow)
    steps = [r.step for r in recs if "train/loss_scale" in r.values]
    scale = np.array([r.values["train/loss_scale"] for r in recs if "train/loss_scale" in r.values])
    if scale_is == "flush":
        assert 1 < len(steps) < STEPS and steps[-1] == STEPS, "one value per flush window"
        np.testing.assert_array_equal(scale, after[np.array(steps) - 1])
    else:
        assert steps == list(range(1, STEPS + 1))
        expected = after if scale_is == "after" else np.concatenate([[HUGE], after[:-1]])
        np.testing.assert_array_equal(scale, expected)


def _manager():
    return nn.DynamicLossScaleUpdateCell(HUGE, 2, WINDOW)


@pytest.mark.parametrize("ring, mode, scale_is", [(False, "graph", "after"), (True, "graph", "after"),
                                                    (False, "pynative", "flush")],
                         ids=["host-buffer", "attach_ring", "host-buffer-pynative"])
def test_mindspore_loss_scale_cell(tmp_path, ring, mode, scale_is):
    """Graph mode returns a copy of ``scale_sense`` each step; PyNative returns the Parameter itself."""
    mon, weights = monitor(tmp_path), WeightSteps()

    def cell(loss_net, opt):
        step = CpuLossScaleCell(loss_net, opt, scale_sense=_manager())
        return attach_ring(step, ring_size=16) if ring else step

    train_regression([mon, weights], steps=STEPS, train_cell=cell, learning_rate=0.001, mode=mode)
    assert isinstance(mon._buffer, RingReader if ring else StepBuffer)
    _check(mon, weights, scale_is)


def test_msbridge_train_step(tmp_path):
    mon, weights = monitor(tmp_path), WeightSteps()
    train_regression([mon, weights], steps=STEPS, learning_rate=0.001,
                     train_cell=lambda n, o: TrainStep(n, o, scale_sense=_manager(), ring_size=16))
    _check(mon, weights, "used")


def test_an_overflow_that_train_step_does_not_skip_is_not_counted(tmp_path):
    """``TrainStep`` without a scale or ``skip_nonfinite`` applies a non-finite update: flagged, not skipped."""
    mon, weights = monitor(tmp_path), WeightSteps()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01), ring_size=16)
    ms.train.Model(cell).train(1, regression_data(8, poison_step=3), callbacks=[mon, weights],
                               dataset_sink_mode=False)
    recs = read_run(mon.run_dir).ranks[0].records
    assert [r.values["train/overflow"] for r in recs] == [0, 0] + [1] * 6, "NaN weights from step 3 on"
    assert all(weights.updated), "every update was applied, the NaN ones too"
    assert [r.values["health/skipped_steps"] for r in recs] == [0] * 8


def test_mindformers_train_cell(tmp_path):
    wrapper = pytest.importorskip("mindformers.wrapper")

    class CpuMFTrainOneStepCell(wrapper.MFTrainOneStepCell):
        """mindformers' cell with the overflow status read by IsFinite (no NPU float status on CPU)."""

        def get_overflow_status(self, status, compute_output):
            return _nonfinite(compute_output)

    mon, weights = monitor(tmp_path), WeightSteps()
    train_regression([mon, weights], steps=STEPS, learning_rate=0.001, train_cell=lambda n, o: attach_ring(
        CpuMFTrainOneStepCell(n, o, use_clip_grad=True, max_grad_norm=1.0, scale_sense=_manager()), ring_size=16))
    _check(mon, weights)
