"""TrainStep and the device ring buffer on real MindSpore training (CPU).

On CPU, MindSpore runs ``dataset_sink_mode=True`` step by step: it falls back to
the non-sink loop, ignores ``sink_size`` and calls ``step_end`` after every step
(``test_cpu_sink_mode_runs_step_by_step`` pins that down). The multi-step path a
device takes (one ``step_end`` per sink) is exercised by driving the reader
directly (``test_reader_expands_one_call_into_a_sink_of_steps``).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from helpers.runs import monitor
from helpers.training import OutputRecorder, regression_data, train_regression
from mindspore import Tensor, nn, ops
from mindspore.train import Callback

from msbridge import ConfigError
from msbridge.capture.host_buffer import StepBuffer
from msbridge.capture.ring_cell import attach_ring
from msbridge.capture.ring_reader import RingReader, min_ring_size, ring_size_for
from msbridge.capture.train_step import TrainStep
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)
SCHEDULE = (0.01, 0.9, 1)  # ExponentialDecayLR: step s uses 0.01 * 0.9 ** (s - 1)


def ring_step(ring_size=8, **kwargs):
    return lambda loss_net, opt: TrainStep(loss_net, opt, ring_size=ring_size, **kwargs)


def records(mon):
    return read_run(mon.run_dir).ranks[0].records


def series(mon, name):
    return np.array([r.values[name] for r in records(mon)])


class WeightRecorder(Callback):
    """Copies every parameter to the host after each step."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_step_end(self, run_context):
        net = run_context.original_args().train_network
        self.weights.append([p.asnumpy().copy() for p in net.trainable_params()])


@pytest.mark.slow
def test_cpu_sink_mode_runs_step_by_step(tmp_path):
    ref = OutputRecorder()
    train_regression([ref], steps=12, sink_mode=True, train_cell=ring_step())
    assert ref.steps == list(range(1, 13)), "MindSpore on CPU calls step_end after every step in sink mode"


@pytest.mark.slow
def test_sink_mode_records_every_step_with_the_non_sink_losses(tmp_path):
    runs = {}
    for sink_mode in (False, True):
        mon, ref = monitor(tmp_path / str(sink_mode)), OutputRecorder()
        train_regression([mon, ref], steps=12, epochs=2, sink_mode=sink_mode, train_cell=ring_step(),
                         learning_rate=nn.ExponentialDecayLR(*SCHEDULE))
        assert isinstance(mon._buffer, RingReader)
        assert [r.step for r in records(mon)] == list(range(1, 25))
        np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)
        runs[sink_mode] = mon
    np.testing.assert_array_equal(series(runs[True], "train/loss"), series(runs[False], "train/loss"))
    np.testing.assert_allclose(series(runs[True], "train/lr"), 0.01 * 0.9 ** np.arange(24), rtol=1e-5)
    assert np.all(series(runs[True], "train/grad_norm") > 0)
    assert np.all(series(runs[True], "train/overflow") == 0)


def test_pynative_mode_records_every_step_from_the_ring(tmp_path):
    mon, ref = monitor(tmp_path), OutputRecorder()
    train_regression([mon, ref], steps=9, mode="pynative", train_cell=ring_step(),
                     learning_rate=nn.ExponentialDecayLR(*SCHEDULE))
    assert isinstance(mon._buffer, RingReader) and [r.step for r in records(mon)] == list(range(1, 10))
    np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)
    np.testing.assert_allclose(series(mon, "train/lr"), 0.01 * 0.9 ** np.arange(9), rtol=1e-5)


@pytest.mark.slow
def test_same_losses_and_weights_as_train_one_step_cell_when_scale_1_and_clip_inf():
    results = {}
    for name, cell in (("ref", nn.TrainOneStepCell),
                       ("ours", ring_step(scale_sense=1.0, clip_grad_norm=float("inf")))):
        ref, weights = OutputRecorder(), WeightRecorder()
        train_regression([ref, weights], steps=10, train_cell=cell)
        results[name] = (ref.losses, weights.weights[-1])
    assert results["ours"][0] == results["ref"][0]
    for ours, theirs in zip(results["ours"][1], results["ref"][1]):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow
def test_ring_drains_correctly_across_many_wraps(tmp_path):
    mon, ref = monitor(tmp_path, flush_steps=5), OutputRecorder()
    train_regression([mon, ref], steps=20, epochs=2, train_cell=ring_step(ring_size=6),
                     learning_rate=nn.ExponentialDecayLR(*SCHEDULE))
    assert [r.step for r in records(mon)] == list(range(1, 41))
    np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)
    np.testing.assert_allclose(series(mon, "train/lr"), 0.01 * 0.9 ** np.arange(40), rtol=1e-5)


def test_a_ring_smaller_than_the_flush_window_is_refused_with_the_smallest_size(tmp_path):
    mon = monitor(tmp_path, flush_steps=5)
    with pytest.raises(ConfigError, match="smallest size that works is 6"):
        train_regression([mon], steps=4, train_cell=ring_step(ring_size=5))
    assert not (tmp_path / "t" / "r" / "metrics").exists(), "no run is started with a ring that cannot work"

    with pytest.raises(ConfigError, match="buffer_size: 4 .* smallest size that works is 6"):
        train_regression([monitor(tmp_path / "b", flush_steps=5, buffer_size=4)], steps=4, train_cell=ring_step())


def test_device_sink_size_counts_towards_the_ring(tmp_path):
    """On a device, step_end comes once per sink: the ring must hold flush_steps + sink_size."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01), ring_size=64)
    cb = SimpleNamespace(train_network=cell, dataset_sink_mode=True, sink_size=20, cur_step_num=0,
                         epoch_num=1, batch_num=20)
    context = SimpleNamespace(original_args=lambda: cb)
    with pytest.raises(ConfigError, match="flush_steps 50 \\+ 20 steps per sink.*smallest size that works is 70"):
        monitor(tmp_path, flush_steps=50).on_train_begin(context)
    assert min_ring_size(50, 20) == 70
    assert ring_size_for(monitor(tmp_path / "auto", flush_steps=50).config, steps_per_call=20) == 100


def _cell_and_losses(calls, ring_size):
    """A TrainStep called ``calls`` times directly; returns it and the losses it returned."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01), ring_size=ring_size)
    x, y = Tensor(np.ones((4, 16), np.float32)), Tensor(np.zeros((4, 1), np.float32))
    return cell, [float(cell(x, y).asnumpy()) for _ in range(calls)]


@pytest.mark.slow
def test_reader_expands_one_call_into_a_sink_of_steps():
    cell, losses = _cell_and_losses(0, ring_size=32)
    reader = RingReader(cell, steps_per_call=20)
    x, y = Tensor(np.ones((4, 16), np.float32)), Tensor(np.zeros((4, 1), np.float32))
    losses = [float(cell(x, y).asnumpy()) for _ in range(20)]
    reader.append(step=20, epoch=1, outputs=Tensor(losses[-1]), step_time_s=0.01, monitor_s=2e-4)
    assert len(reader) == 20
    window = reader.drain(None)
    assert window.steps.tolist() == list(range(1, 21))
    np.testing.assert_allclose(window.scalars["train/loss"], losses, rtol=1e-6)
    np.testing.assert_allclose(window.monitor_s, 1e-5)
    assert np.all(np.diff(window.wall_time) > 0), "per-step wall times are spread over the sink"
    assert len(reader) == 0 and reader.drain(None) is None


def test_a_late_flush_warns_with_the_lost_steps_and_keeps_the_rest(caplog):
    cell, losses = _cell_and_losses(0, ring_size=8)
    reader = RingReader(cell)
    x, y = Tensor(np.ones((4, 16), np.float32)), Tensor(np.zeros((4, 1), np.float32))
    for step in range(1, 13):
        losses.append(float(cell(x, y).asnumpy()))
        reader.append(step, 1, Tensor(losses[-1]), 0.01, 0.0)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        window = reader.drain(None)
    assert "steps 1-4 were overwritten" in caplog.text
    assert window.steps.tolist() == list(range(5, 13))
    np.testing.assert_allclose(window.scalars["train/loss"], losses[4:], rtol=1e-6)


@pytest.mark.slow
def test_a_resumed_run_continues_the_step_numbers_on_the_ring_path(tmp_path, caplog):
    """``initial_epoch``: MindSpore counts steps from 1 again; a jump in step numbers is one step, not a sink."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mon, ref = monitor(tmp_path), OutputRecorder()
    net = nn.Dense(16, 1)
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01), ring_size=8)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        ms.train.Model(cell).train(2, regression_data(6), callbacks=[mon, ref], dataset_sink_mode=False,
                                   initial_epoch=1)
    assert [r.step for r in records(mon)] == list(range(7, 13))
    np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)
    assert "device counter" not in caplog.text, "host steps and device rows agree, no re-alignment needed"


@pytest.mark.slow
def test_step_interval_on_the_ring_path(tmp_path):
    mon, ref = monitor(tmp_path, step_interval=3), OutputRecorder()
    train_regression([mon, ref], steps=20, train_cell=ring_step())
    assert [r.step for r in records(mon)] == [3, 6, 9, 12, 15, 18]
    np.testing.assert_allclose(series(mon, "train/loss"), [ref.losses[s - 1] for s in (3, 6, 9, 12, 15, 18)],
                               rtol=1e-6)


class DoubledLoss(nn.TrainOneStepCell):
    """A user-written train cell: any TrainOneStepCell subclass takes the fallback path."""

    def construct(self, *inputs):
        return super().construct(*inputs) * 2


@pytest.mark.slow
def test_fallback_to_the_step_buffer_with_any_train_one_step_cell(tmp_path):
    for i, cell in enumerate((nn.TrainOneStepCell, DoubledLoss, lambda n, o: nn.TrainOneStepCell(n, o, sens=2.0))):
        mon, ref = monitor(tmp_path / str(i)), OutputRecorder()
        train_regression([mon, ref], steps=7, train_cell=cell)
        assert isinstance(mon._buffer, StepBuffer) and mon._buffer.in_host_memory  # CPU: read in place
        assert [r.step for r in records(mon)] == list(range(1, 8))
        np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)


@pytest.mark.slow
def test_the_device_path_stacks_each_column_to_the_same_values(tmp_path, monkeypatch):
    """On a device the step buffer stacks each column and copies it once; on CPU it reads each tensor
    in place. The stacked path, forced here on CPU, gives the same series."""
    detect = StepBuffer._set_layout

    def as_on_a_device(self, outputs):
        detect(self, outputs)
        self.in_host_memory = False

    monkeypatch.setattr(StepBuffer, "_set_layout", as_on_a_device)
    mon, ref = monitor(tmp_path), OutputRecorder()
    train_regression([mon, ref], steps=7)
    assert mon._buffer.in_host_memory is False
    np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)


@pytest.mark.slow
def test_non_scalar_loss_is_warned_once_and_recorded_as_its_mean(tmp_path, caplog):
    class MeanRecorder(OutputRecorder):
        def on_train_step_end(self, run_context):
            self.losses.append(float(run_context.original_args().net_outputs.asnumpy().mean()))

    mon, ref = monitor(tmp_path), MeanRecorder()
    net = nn.Dense(16, 1)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train_regression([mon, ref], steps=12, net=net, train_cell=lambda _, opt: TrainStep(
            nn.WithLossCell(net, nn.MSELoss(reduction="none")), opt, ring_size=8))
    np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-5)
    said = [r for r in caplog.records if "not a scalar" in r.getMessage()]
    assert len(said) == 1 and "(8, 1)" in said[0].getMessage()


@pytest.mark.slow
def test_skip_nonfinite_keeps_weights_bit_identical(tmp_path):
    mon, weights = monitor(tmp_path), WeightRecorder()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.01, 0.9),
                     skip_nonfinite=True, ring_size=8)
    ms.train.Model(cell).train(1, regression_data(6, poison_step=3), callbacks=[mon, weights],
                               dataset_sink_mode=False)
    for before, after in zip(weights.weights[1], weights.weights[2]):
        np.testing.assert_array_equal(before, after)
    assert not np.array_equal(weights.weights[3][0], weights.weights[2][0]), "training resumes after the bad step"
    assert np.all(np.isfinite(weights.weights[-1][0]))
    assert series(mon, "train/overflow").tolist() == [0, 0, 1, 0, 0, 0]


@pytest.mark.slow
def test_dynamic_loss_scale_halves_on_overflow_and_skips_the_update(tmp_path):
    mon, weights = monitor(tmp_path), WeightRecorder()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01),
                     scale_sense=nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000), ring_size=8)
    ms.train.Model(cell).train(1, regression_data(6, poison_step=3), callbacks=[mon, weights],
                               dataset_sink_mode=False)
    assert series(mon, "train/loss_scale").tolist() == [1024, 1024, 1024, 512, 512, 512]
    assert series(mon, "train/overflow").tolist() == [0, 0, 1, 0, 0, 0]
    np.testing.assert_array_equal(weights.weights[1][0], weights.weights[2][0])


@pytest.mark.slow
def test_clipping_bounds_the_update_and_records_the_norm_before_clipping():
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    lr, clip = 0.1, 0.5
    cell = TrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), lr), clip_grad_norm=clip)
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    x = Tensor(np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32))
    cell(x, Tensor(np.full((8, 1), 50.0, np.float32)))
    step = np.sqrt(sum(((p.asnumpy() - b) ** 2).sum() for p, b in zip(net.trainable_params(), before)))
    norm = cell.msbridge_ring.asnumpy()[0, 1]
    assert norm > 10 * clip, "the recorded norm is the one before clipping"
    assert step == pytest.approx(lr * clip, rel=1e-4)


def _finite_flag(grads):
    return ops.logical_not(ops.stack([ops.isfinite(g).all() for g in grads]).all())


class MFLikeStep(nn.TrainOneStepCell):
    """A train cell with mindformers' output layout: (loss, overflow, loss_scale, lr, global_norm)."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad_no_sens(self.network, self.weights)(*inputs)
        norm = ops.sqrt(ops.stack([ops.square(g).sum() for g in grads]).sum())
        lr = self.optimizer.get_lr()
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, _finite_flag(grads), ops.ones((), ms.float32), lr, norm


class Recorder5(Callback):
    def __init__(self):
        super().__init__()
        self.rows = []

    def on_train_step_end(self, run_context):
        out = run_context.original_args().net_outputs
        self.rows.append([float(out[i].asnumpy()) for i in (0, 4, 3, 2, 1)])


@pytest.mark.slow
def test_attach_ring_records_what_a_train_cells_output_carries(tmp_path):
    mon, ref = monitor(tmp_path), Recorder5()
    train_regression([mon, ref], steps=12, train_cell=lambda n, o: attach_ring(MFLikeStep(n, o), ring_size=8),
                     learning_rate=nn.ExponentialDecayLR(*SCHEDULE))
    assert isinstance(mon._buffer, RingReader)
    names = ("train/loss", "train/grad_norm", "train/lr", "train/loss_scale", "train/overflow")
    got = np.stack([series(mon, name) for name in names], axis=1)
    np.testing.assert_allclose(got, ref.rows, rtol=1e-6)


@pytest.mark.slow
def test_attach_ring_to_a_plain_cell_reads_lr_on_the_host(tmp_path):
    mon, ref = monitor(tmp_path), OutputRecorder()
    train_regression([mon, ref], steps=9, train_cell=lambda n, o: attach_ring(nn.TrainOneStepCell(n, o), 8),
                     learning_rate=nn.ExponentialDecayLR(*SCHEDULE))
    rec = records(mon)[0].values
    assert "train/grad_norm" not in rec and "train/loss_scale" not in rec, "only what the output carries"
    np.testing.assert_allclose(series(mon, "train/loss"), ref.losses, rtol=1e-6)
    np.testing.assert_allclose(series(mon, "train/lr"), 0.01 * 0.9 ** np.arange(9), rtol=1e-5)


@pytest.mark.slow
def test_attach_ring_to_mindformers_train_cell(tmp_path):
    wrapper = pytest.importorskip("mindformers.wrapper")

    class CpuMFTrainOneStepCell(wrapper.MFTrainOneStepCell):
        """NPUGetFloatStatusV2 has no CPU kernel: check overflow with IsFinite/ReduceAll."""

        def get_overflow_status(self, status, compute_output):
            return _finite_flag(compute_output)

    mon, ref = monitor(tmp_path), Recorder5()
    train_regression([mon, ref], steps=8, train_cell=lambda n, o: attach_ring(
        CpuMFTrainOneStepCell(n, o, use_clip_grad=True, max_grad_norm=1.0, scale_sense=1.0), ring_size=8))
    names = ("train/loss", "train/grad_norm", "train/lr", "train/loss_scale", "train/overflow")
    got = np.stack([series(mon, name) for name in names], axis=1)
    np.testing.assert_allclose(got, ref.rows, rtol=1e-6)
