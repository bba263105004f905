"""mindformers' separate losses (``train/lm_loss``, ``train/aux_loss``, ``train/mtp_loss``) on real CPU training.

A real mindformers MoE model does not train on CPU (its mcore MoE layers and FlashAttention have no CPU
kernels), so the network here is a tiny one that returns what mindformers' mcore ``GPTModel`` returns in
training, ``(lm_loss, mtp_loss, aux_loss, indexer_loss)``, with a switch-style load-balancing loss of a real
router. Everything after it is mindformers' own: ``MFTrainOneStepCell.grads_for_mcore`` adds the parts into
``parameter_register``'s Parameters inside the compiled step, and the per-step reader is MFLossMonitor with
its step-end body cut down to what its ``_get_separate_loss`` does (read, then zero; the rest of it computes
model FLOPs from a full mcore TransformerConfig). Two switches are set for CPU: ``is_legacy_model`` answers
False (a mindformers run YAML's ``use_legacy: False``, which needs a built mindformers context), and the
overflow status is read by IsFinite (no NPU float status on CPU).

The oracles: the cell's own returned loss (lm + aux x coeff x MoE layers + mtp, every step), and the values
MFLossMonitor reads step by step in the same deterministic training.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from helpers.runs import monitor
from helpers.training import regression_data
from mindspore import nn, ops

from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow
wrapper = pytest.importorskip("mindformers.wrapper.wrapper")
mf_callback = pytest.importorskip("mindformers.core.callback.callback")
parameter_register = pytest.importorskip("mindformers.utils.parameter_register").parameter_register  # 1.9+

STEPS, FLUSH, COEFF, LAYERS, EXPERTS = 12, 4, 0.01, 2, 4
AUX_SCALE = COEFF * LAYERS  # get_aux_loss_scale(COEFF, 1, LAYERS): every layer is a MoE layer
PARTS = ("lm_loss", "aux_loss", "mtp_loss", "indexer_loss")


class TinyMoE(nn.Cell):
    """Returns ``(lm_loss, mtp_loss, aux_loss, indexer_loss)`` as mindformers' mcore GPTModel does in training."""

    def __init__(self):
        super().__init__()
        self.head, self.router, self.mtp = nn.Dense(16, 1), nn.Dense(16, EXPERTS), nn.Dense(16, 1)

    def construct(self, x, y):
        lm_loss = ((self.head(x) - y) ** 2).mean()
        probs = ops.softmax(self.router(x), axis=-1)
        balance = EXPERTS * (probs.mean(0) ** 2).sum()  # 1.0 when the router spreads tokens evenly
        aux_loss = AUX_SCALE * balance  # each MoE layer's loss x its coefficient, summed over the layers
        mtp_loss = 0.3 * ((self.mtp(x) - y) ** 2).mean()
        return lm_loss, mtp_loss, aux_loss, ops.zeros((), ms.float32)

    def get_gpt_transformer_config(self):
        return SimpleNamespace(moe_aux_loss_coeff=COEFF, moe_layer_freq=1, num_layers=LAYERS, mtp_num_layers=1)


class CpuMFTrainOneStepCell(wrapper.MFTrainOneStepCell):
    def get_overflow_status(self, status, compute_output):
        return ops.logical_not(ops.stack([ops.isfinite(g).all() for g in compute_output]).all())


class MFLossMonitor(mf_callback.MFLossMonitor):
    """mindformers' MFLossMonitor; its step end keeps only what its ``_get_separate_loss`` does: read each part,
    then zero it. With a copy in between: on CPU ``asnumpy()`` is a view of the Parameter's memory, so
    mindformers' own function hands back the zeros it has just written (on a device it reads a copy)."""

    def __init__(self):
        super().__init__(print_separate_loss=True, is_moe_model=True, is_mtp_model=True)
        self.read = []

    def on_train_step_end(self, run_context):
        self.read.append([float(parameter_register.get(n).asnumpy()[0]) for n in PARTS])  # lm, aux, mtp, indexer
        for name in PARTS:
            parameter_register.clear(name)


@pytest.fixture
def mcore(monkeypatch):
    """mindformers' mcore switch on; the parts leave ``parameter_register`` (a process-wide singleton that refuses
    a second registration) after the test, so no other test finds them."""
    monkeypatch.setattr(wrapper, "is_legacy_model", lambda: False)
    monkeypatch.setattr(mf_callback, "is_legacy_model", lambda: False)
    yield
    _unregister()


def _unregister():
    for name in PARTS:
        parameter_register._params.pop(name, None)


def _train(tmp_path, callbacks_around):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    _unregister()  # one train cell per process registers them, as in a mindformers run
    net = TinyMoE()
    cell = CpuMFTrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.05), print_separate_loss=True)
    mon = monitor(tmp_path, flush_steps=FLUSH, overhead_budget=0.99)
    ms.train.Model(cell).train(1, regression_data(STEPS), callbacks=callbacks_around(mon), dataset_sink_mode=False)
    return read_run(mon.run_dir).ranks[0]


def test_msbridge_alone_records_each_windows_mean_and_zeroes_the_sums(tmp_path, mcore):
    log = _train(tmp_path, lambda mon: [mon])
    loss = dict(log.series("train/loss"))
    lm, aux, mtp = (dict(log.series(f"train/{n}")) for n in ("lm_loss", "aux_loss", "mtp_loss"))
    ends = sorted(lm)  # the flushes (every FLUSH steps, or more when the overhead budget widens the window)
    assert sorted(aux) == sorted(mtp) == ends and ends[0] == FLUSH and ends[-1] == STEPS and len(ends) >= 2
    assert not log.series("train/indexer_loss"), "a part that is 0 is left out"
    for start, end in zip([0] + ends, ends):
        window = np.mean([loss[s] for s in range(start + 1, end + 1)])
        assert lm[end] + aux[end] * AUX_SCALE + mtp[end] == pytest.approx(window, rel=1e-5), f"step {end}"
        assert 1.0 <= aux[end] <= EXPERTS, "the balancing loss per layer, before its coefficient"
    assert all(float(parameter_register.get(n).asnumpy()[0]) == 0.0 for n in PARTS), "zeroed after each read"


def test_next_to_mfloss_monitor_the_flush_steps_own_and_its_reading_unchanged(tmp_path, mcore):
    first = _train(tmp_path / "a", lambda mon: [mon])
    alone = {n: dict(first.series(f"train/{n}")) for n in ("lm_loss", "aux_loss")}
    mf = MFLossMonitor()
    log = _train(tmp_path / "b", lambda mon: [mon, mf])
    read = np.array(mf.read)  # [step, (lm, aux, mtp, indexer)], MFLossMonitor's own reading
    loss = dict(log.series("train/loss"))
    assert len(read) == STEPS
    for step in range(1, STEPS + 1):  # what MFLossMonitor reads is each step's own parts: msbridge zeroes nothing
        lm_, aux_, mtp_, _ = read[step - 1]
        assert lm_ + aux_ * AUX_SCALE + mtp_ == pytest.approx(loss[step], rel=1e-5), f"step {step}"
    lm, aux = dict(log.series("train/lm_loss")), dict(log.series("train/aux_loss"))
    assert sorted(lm)[-1] == STEPS and len(lm) >= 2
    for end in lm:  # msbridge's value is the flush step's own, as MFLossMonitor read it right after
        assert lm[end] == pytest.approx(read[end - 1, 0], rel=1e-6) and aux[end] == pytest.approx(read[end - 1, 1])
    ends = sorted(alone["lm_loss"])  # msbridge alone: each window's mean of what MFLossMonitor read in the same run
    for start, end in zip([0] + ends, ends):
        assert alone["lm_loss"][end] == pytest.approx(read[start:end, 0].mean(), rel=1e-5), f"step {end}"
        assert alone["aux_loss"][end] == pytest.approx(read[start:end, 1].mean(), rel=1e-5), f"step {end}"


def test_after_mfloss_monitor_nothing_to_read_and_said_once(tmp_path, mcore, caplog):
    mf = MFLossMonitor()
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        log = _train(tmp_path, lambda mon: [mf, mon])
    assert not log.series("train/lm_loss") and not log.series("train/aux_loss")
    said = [r.getMessage() for r in caplog.records if "MFLossMonitor reads and zeroes" in r.getMessage()]
    assert len(said) == 1 and "list MSBridgeMonitor before MFLossMonitor" in said[0]
    assert len(mf.read) == STEPS and all(r[0] > 0 for r in mf.read), "MFLossMonitor reads every step as before"
