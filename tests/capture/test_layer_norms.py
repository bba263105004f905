"""``layer_norms`` on real MindSpore training (CPU): per-parameter grad norms from the ring, weight and
Adam-moment norms per flush, per-layer groups, and what is said when something cannot be recorded.

The oracles: the per-parameter grad norms of a step make up its global grad norm
(sqrt of their sum of squares), and the weight and moment norms at the last step
are the norms of the tensors read back after training. Values are read back from
the jsonl log and from TensorBoard's own reader.
"""
from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
import pytest
from helpers.training import train_regression
from mindspore import nn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor, TrainStep
from msbridge.capture.param_norms import StateNorms
from msbridge.sinks.runlog import read_run

STEPS = 30


def mlp():
    return nn.SequentialCell(nn.Dense(16, 8), nn.ReLU(), nn.Dense(8, 4), nn.ReLU(), nn.Dense(4, 1))


def monitor(tmp_path, sinks=("jsonl",), **overrides):
    cfg = {"experiment": "t", "run_name": "r", "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
           "flush_steps": 10, "sinks": list(sinks), "layer_norms": ".*",
           "overhead_budget": 0.99}  # flush every 10 steps here, never widened
    cfg.update(overrides)
    return BridgeMonitor(cfg, progress=False)


def train(mon, net, ring=True, steps=STEPS):
    """Adam (so there are moments), TrainStep (ring with per-parameter columns) or a plain Model."""
    holder = {}

    def cell(loss_net, _sgd):
        holder["opt"] = nn.Adam(loss_net.trainable_params(), learning_rate=0.01)
        return TrainStep(loss_net, holder["opt"], ring_size=32)

    if ring:
        train_regression([mon], steps=steps, net=net, train_cell=cell)
        return holder["opt"]
    train_regression([mon], steps=steps, net=net)
    return None


def by_step(mon):
    return {r.step: r.values for r in read_run(mon.run_dir).ranks[0].records}


@pytest.mark.slow
def test_grad_norms_make_up_the_global_norm_and_weight_norms_match_the_tensors(tmp_path):
    net = mlp()
    mon = monitor(tmp_path, sinks=("jsonl", "tensorboard"))
    opt = train(mon, net)
    names = [p.name for p in net.trainable_params()]
    rows = by_step(mon)
    assert sorted(rows) == list(range(1, STEPS + 1))  # coverage first: every step, every parameter
    assert all(f"grad_norm/{n}" in rows[s] for s in rows for n in names)
    for step, values in rows.items():
        parts = np.array([values[f"grad_norm/{n}"] for n in names])
        np.testing.assert_allclose(np.sqrt(np.square(parts).sum()), values["train/grad_norm"], rtol=1e-4,
                                   err_msg=f"step {step}")
    last = rows[STEPS]
    for param, m, v in zip(net.trainable_params(), opt.moment1, opt.moment2):
        np.testing.assert_allclose(last[f"weight_norm/{param.name}"], np.linalg.norm(param.asnumpy()), rtol=1e-5)
        np.testing.assert_allclose(last[f"optimizer/adam_m_norm/{param.name}"], np.linalg.norm(m.asnumpy()),
                                   rtol=1e-5)
        np.testing.assert_allclose(last[f"optimizer/adam_v_norm/{param.name}"], np.linalg.norm(v.asnumpy()),
                                   rtol=1e-5)
    flushed = sorted(s for s, values in rows.items() if f"weight_norm/{names[0]}" in values)
    assert flushed[-1] == STEPS and len(flushed) >= 2  # sampled at each flush, not every step
    ea = EventAccumulator(str(tmp_path / "t" / "tensorboard" / "r" / "rank_0"), size_guidance={"scalars": 0})
    ea.Reload()
    for name in names:
        tag = f"grad_norm/{name}"
        got = {e.step: e.value for e in ea.Scalars(tag)}
        assert sorted(got) == list(range(1, STEPS + 1))
        np.testing.assert_allclose([got[s] for s in sorted(got)], [rows[s][tag] for s in sorted(got)], rtol=1e-6)
        weights = {e.step: e.value for e in ea.Scalars(f"weight_norm/{name}")}
        assert sorted(weights) == flushed


@pytest.mark.slow
def test_layer_groups_are_the_norm_of_their_parameters(tmp_path):
    net = mlp()  # parameters 0.weight 0.bias 2.weight 2.bias 4.weight 4.bias
    mon = monitor(tmp_path, layer_norms=r"^[02]\.", layer_norms_group=r"^(\d+)\.")
    train(mon, net)
    rows = by_step(mon)
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert sorted(n for n in rows[STEPS] if n.startswith(("grad_norm/", "weight_norm/"))) == \
        ["grad_norm/0", "grad_norm/2", "weight_norm/0", "weight_norm/2"]
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    for layer in ("0", "2"):
        both = np.concatenate([params[f"{layer}.weight"].ravel(), params[f"{layer}.bias"].ravel()])
        np.testing.assert_allclose(rows[STEPS][f"weight_norm/{layer}"], np.linalg.norm(both), rtol=1e-5)
    assert all(rows[s]["grad_norm/0"] < rows[s]["train/grad_norm"] for s in rows)  # layer 4 is left out


@pytest.mark.slow
def test_plain_model_records_weight_norms_and_says_once_why_no_grad_norms(tmp_path, caplog):
    net = mlp()
    mon = monitor(tmp_path)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train(mon, net, ring=False)
    said = [r.getMessage() for r in caplog.records if "per-parameter grad norms" in r.getMessage()]
    assert len(said) == 1 and "use msbridge.TrainStep, or attach_ring" in said[0]
    rows = by_step(mon)
    assert not any(n.startswith("grad_norm/") for values in rows.values() for n in values)
    weights = [p for p in net.trainable_params()]
    for param in weights:
        np.testing.assert_allclose(rows[STEPS][f"weight_norm/{param.name}"], np.linalg.norm(param.asnumpy()),
                                   rtol=1e-5)
    moments = [n for n in rows[STEPS] if n.startswith("optimizer/")]
    assert moments == []  # SGD has no moments: nothing invented


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.attention = nn.Dense(16, 8)
        self.feed_forward = nn.Dense(8, 1)

    def construct(self, x):
        return self.feed_forward(self.attention(x))


@pytest.mark.slow
def test_a_regex_that_matches_nothing_warns_once_with_the_closest_names(tmp_path, caplog):
    mon = monitor(tmp_path, layer_norms=r"atention\.weight")
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train(mon, Block())
    said = [r.getMessage() for r in caplog.records if "matches no parameter" in r.getMessage()]
    assert len(said) == 1
    assert said[0].endswith("the closest of the 4 names: 'attention.weight', 'attention.bias', "
                            "'feed_forward.weight'")
    assert not any(n.startswith(("grad_norm/", "weight_norm/")) for v in by_step(mon).values() for n in v)


def test_compiled_and_host_norms_agree():
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    params = mlp().trainable_params()
    host = StateNorms(params, on_host=True).read()
    compiled = StateNorms(params, on_host=False).read()  # the path a device takes: one launch, n floats back
    np.testing.assert_allclose(compiled, host, rtol=1e-6)
    np.testing.assert_allclose(host, [np.linalg.norm(p.asnumpy()) for p in params], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_no_device_to_host_read_on_a_step_that_does_not_flush(tmp_path, monkeypatch, mode):
    """Every way a tensor reaches the host, counted while msbridge's step hook runs (layer norms, memory, and
    the gradient copies of histograms: read at the histogram flush only)."""
    reads = {"on": False, "count": 0}
    for method in ("asnumpy", "item", "tolist", "__float__", "__int__", "numpy"):
        original = getattr(ms.Tensor, method, None)
        if original is None:
            continue

        def counted(self, *args, _original=original, **kwargs):
            reads["count"] += reads["on"]
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(ms.Tensor, method, counted)
    # gradient copies in the step too; flushes by step count only (flush_seconds out of reach): a first step compiled
    # slowly beside another pytest-xdist worker flushed at step 1 on its 10 s default
    mon = monitor(tmp_path, memory=True, histograms=".*", histogram_interval=20, flush_seconds=3600)
    per_step = {}
    original_step_end = mon._step_end

    def step_end(run_context, entered):
        step = int(run_context.original_args().cur_step_num)
        reads["on"], reads["count"] = True, 0
        flushes = mon._last_flush
        original_step_end(run_context, entered)
        reads["on"] = False
        per_step[step] = (reads["count"], mon._last_flush != flushes)
    monkeypatch.setattr(mon, "_step_end", step_end)
    net = mlp()
    holder = {}

    def cell(loss_net, _sgd):
        holder["opt"] = nn.Adam(loss_net.trainable_params(), learning_rate=0.01)
        return TrainStep(loss_net, holder["opt"], ring_size=32)
    train_regression([mon], steps=STEPS, net=net, train_cell=cell, mode=mode)
    assert sorted(per_step) == list(range(1, STEPS + 1))
    flushing = [s for s, (_, flushed) in per_step.items() if flushed]
    assert flushing == [10, 20, 30]
    assert {s: n for s, (n, flushed) in per_step.items() if not flushed} == {s: 0 for s in per_step
                                                                              if s not in flushing}
    assert all(per_step[s][0] > 0 for s in flushing)  # the counter does see the flush's reads
    assert f"grad_norm/{net.trainable_params()[0].name}" in by_step(mon)[STEPS]
    histograms = [(e.step, e.detail["tag"]) for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"]
    assert (20, f"grads/{net.trainable_params()[0].name}") in histograms and {s for s, _ in histograms} == {20}
