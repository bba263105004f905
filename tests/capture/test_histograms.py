"""``histograms`` and ``histogram_interval`` on real MindSpore training (CPU): weight histograms (and gradient
histograms with ``TrainStep``) at the flushes ``histogram_interval`` allows, in the jsonl log, TensorBoard's
HISTOGRAMS and MindInsight's summary, skipped by MLflow (said once) and by the console.

The oracles: the weight histogram at the last step is numpy's of the parameter read back after training
(min, max, num, sum, sum of squares, bucket counts); a gradient histogram's sum of squares is the square of
the ring's ``grad_norm/<param>`` at the same step, and at the last step it is numpy's histogram of the gradient
``ms.grad`` computes for that step's batch at that step's weights. Step coverage is checked first.
"""
from __future__ import annotations

import glob
import io
import logging
import os
import re
import time

import mindspore as ms
import numpy as np
import pytest
from helpers.training import regression_data, train_regression
from mindspore import nn
from mindspore.train import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor, TrainStep
from msbridge.capture.histograms import BUCKETS, histogram_detail
from msbridge.sinks.console import ConsoleSink
from msbridge.sinks.runlog import read_run

STEPS = 30


def mlp():
    return nn.SequentialCell(nn.Dense(16, 8), nn.ReLU(), nn.Dense(8, 1))


def monitor(tmp_path, sinks, extra=(), **overrides):
    cfg = {"experiment": "t", "run_name": "r", "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
           "flush_steps": 5, "sinks": sinks, "histograms": ".*", "histogram_interval": 10,
           "overhead_budget": 0.99}  # flush every 5 steps here, never widened
    cfg.update(overrides)
    return BridgeMonitor(cfg, sinks=list(extra), progress=False)


def numpy_histogram(values):
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    counts, edges = np.histogram(values, bins=BUCKETS, range=(values.min(), values.max()))
    return values, counts, edges


class WeightsBefore(Callback):
    """Copies every parameter to the host at the end of step ``step`` (the weights the next step starts from)."""

    def __init__(self, step):
        super().__init__()
        self.step, self.weights = step, None

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        if int(cb.cur_step_num) == self.step:
            self.weights = {p.name: p.asnumpy().copy() for p in cb.train_network.trainable_params()}


def gradients_at(weights, step):
    """The oracle: the gradient of step ``step``'s batch at ``weights``, by ``ms.grad`` on a fresh network."""
    net = mlp()
    ms.load_param_into_net(net, {name: ms.Parameter(ms.Tensor(w), name=name) for name, w in weights.items()})
    x, y = list(regression_data(STEPS).create_tuple_iterator())[step - 1]
    grads = ms.grad(nn.WithLossCell(net, nn.MSELoss()), grad_position=None, weights=net.trainable_params())(x, y)
    return {p.name: g.asnumpy() for p, g in zip(net.trainable_params(), grads)}


def trained_graph(cell):
    """The IR text of the graph MindSpore compiled for ``cell`` (its last compile), from its own graph executor."""
    from mindspore.graph.api import _cell_graph_executor

    ir = _cell_graph_executor._get_func_graph_proto(cell, cell.compile_phase, "anf_ir")
    return ir.decode("utf-8", "replace") if isinstance(ir, bytes) else ir


def assigns(ir):
    return len(re.findall(r"\bAssign\b", ir))


def ring_cell(holder):
    def build(loss_net, optimizer):
        holder["cell"] = TrainStep(loss_net, optimizer, ring_size=32)
        return holder["cell"]
    return build


@pytest.mark.slow
def test_histograms_every_interval_in_jsonl_tensorboard_not_mlflow_nor_console(tmp_path, caplog):
    import mlflow

    net = mlp()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    console = io.StringIO()
    mon = monitor(tmp_path, {"jsonl": {}, "tensorboard": {}, "mlflow": {"tracking_uri": uri}},
                  extra=[ConsoleSink(stream=console)])
    with caplog.at_level(logging.INFO, logger="msbridge"):
        train_regression([mon], steps=STEPS, net=net)
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    tags = {f"weights/{name}" for name in params}

    # jsonl: one event per parameter at steps 10, 20, 30 (flushes every 5 steps, interval 10)
    events = [e for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"]
    for tag in tags:
        assert [e.step for e in events if e.detail["tag"] == tag] == [10, 20, 30], tag
    assert {e.detail["tag"] for e in events} == tags
    last = {e.detail["tag"]: e.detail for e in events if e.step == STEPS}
    for name, weights in params.items():
        values, counts, edges = numpy_histogram(weights)
        got = last[f"weights/{name}"]
        assert got["num"] == values.size and got["counts"] == counts.tolist()
        np.testing.assert_allclose([got["min"], got["max"], got["sum"], got["sum_squares"]],
                                   [values.min(), values.max(), values.sum(), values @ values], rtol=1e-6)
        np.testing.assert_allclose(got["bucket_limits"], edges[1:], rtol=1e-12)

    # TensorBoard, through its own reader
    ea = EventAccumulator(str(tmp_path / "t" / "tensorboard" / "r" / "rank_0"), size_guidance={"histograms": 0})
    ea.Reload()
    assert set(ea.Tags()["histograms"]) == tags
    for name, weights in params.items():
        series = ea.Histograms(f"weights/{name}")
        assert [h.step for h in series] == [10, 20, 30]
        values, counts, edges = numpy_histogram(weights)
        h = series[-1].histogram_value
        assert h.num == values.size and list(h.bucket) == counts.tolist()
        np.testing.assert_allclose([h.min, h.max, h.sum, h.sum_squares],
                                   [values.min(), values.max(), values.sum(), values @ values], rtol=1e-6)
        np.testing.assert_allclose(list(h.bucket_limit), edges[1:], rtol=1e-12)

    # MLflow: said once, no histogram event logged; the console printed none
    said = [r for r in caplog.records if "MLflow cannot show histograms" in r.getMessage()]
    assert len(said) == 1
    said = [r for r in caplog.records if "gradient histograms need msbridge.TrainStep" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO  # a plain Model.train cell: weights only
    client = mlflow.tracking.MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("t").experiment_id])[0]
    assert run.data.metrics and not any("histogram" in key for key in run.data.tags)
    printed = console.getvalue()
    assert printed and "histogram" not in printed


@pytest.mark.slow
def test_every_flush_without_interval_and_a_regex_matching_nothing_warns_once(tmp_path, caplog):
    mon = monitor(tmp_path, ["jsonl"], histogram_interval=None, histograms="^2\\.")
    train_regression([mon], steps=STEPS, net=mlp())
    events = [e for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"]
    assert sorted({e.step for e in events}) == [5, 10, 15, 20, 25, 30]  # every flush
    assert {e.detail["tag"] for e in events} == {"weights/2.weight", "weights/2.bias"}

    with caplog.at_level(logging.WARNING, logger="msbridge"):
        mon = monitor(tmp_path / "none", ["jsonl"], histograms="attention")
        train_regression([mon], steps=10, net=mlp())
    warned = [r.getMessage() for r in caplog.records if "histograms 'attention' matches no" in r.getMessage()]
    assert len(warned) == 1 and "0.weight" in warned[0]
    assert not [e for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"]


def test_histogram_detail_keeps_nonfinite_out_and_handles_a_constant():
    detail = histogram_detail("weights/w", np.array([1.0, np.nan, 3.0, np.inf]), buckets=2)
    assert (detail["num"], detail["nonfinite"], detail["counts"], detail["bucket_limits"]) == (2.0, 2, [1.0, 1.0],
                                                                                               [2.0, 3.0])
    constant = histogram_detail("weights/b", np.zeros(4), buckets=2)
    assert constant["min"] == constant["max"] == 0.0 and sum(constant["counts"]) == 4


def summary_histograms(summary_dir):
    """``{tag: {step: Summary.Histogram}}`` of the MindInsight sink's files, parsed with MindSpore's classes."""
    from mindspore.train.summary_pb2 import Event as SummaryEvent
    from msbridge.adapters._eventwire import read_records

    found = {}
    for path in sorted(glob.glob(os.path.join(summary_dir, "*_MS"))):
        for body in read_records(path):
            for value in SummaryEvent.FromString(body).summary.value:
                if value.HasField("histogram"):
                    found.setdefault(value.tag, {})[SummaryEvent.FromString(body).step] = value.histogram
    return found


def wait_for_histograms(client, train_id, tag, count, timeout=90.0):
    deadline = time.monotonic() + timeout
    got = []
    while time.monotonic() < deadline:
        got = client.get("/datavisual/histograms", train_id=train_id, tag=tag).get("histograms", [])
        if len(got) >= count:
            return got
        time.sleep(0.5)
    raise AssertionError(f"MindInsight served {len(got)} of {count} histograms of {tag} in {train_id}")


@pytest.mark.slow
def test_mindinsight_histograms_in_the_summary_and_over_its_rest_api(tmp_path):
    from helpers.mindinsight_server import serve

    net, holder = mlp(), {}
    mon = monitor(tmp_path, ["jsonl", "mindinsight"])
    train_regression([mon], steps=STEPS, net=net, train_cell=ring_cell(holder))
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    summary_dir = tmp_path / "t" / "summary" / "r_rank_0"
    found = summary_histograms(str(summary_dir))
    assert set(found) == {f"{kind}/{name}" for kind in ("weights", "grads") for name in params}
    kept = holder["cell"].kept_grads()  # the last step's gradients
    for name in params:
        series = found[f"grads/{name}"]
        values, counts, _ = numpy_histogram(kept[name])
        assert sorted(series) == [10, 20, 30] and series[STEPS].count == values.size
        assert [b.count for b in series[STEPS].buckets] == counts.tolist()
    for name, weights in params.items():
        series = found[f"weights/{name}"]
        assert sorted(series) == [10, 20, 30]
        values, counts, edges = numpy_histogram(weights)
        h = series[STEPS]
        assert h.count == values.size and [b.count for b in h.buckets] == counts.tolist()
        np.testing.assert_allclose([b.left for b in h.buckets], edges[:-1], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose([h.min, h.max, h.sum], [values.min(), values.max(), values.sum()], rtol=1e-6)

    with serve(str(tmp_path / "t" / "summary"), str(tmp_path / "workspace")) as client:
        for name, weights in params.items():
            served = wait_for_histograms(client, "./r_rank_0", f"weights/{name}/histogram", 3)
            assert [h["step"] for h in served] == [10, 20, 30]
            buckets = served[-1]["buckets"]  # [left, width, count], re-binned by MindInsight over all steps
            # MindInsight's edges are float64 sums of left and width (1-2 ulps off the float32 extremes):
            # compared within a millionth of a bucket's width, far below a bucket and far above the rounding.
            tol = 1e-6 * min(b[1] for b in buckets)
            assert buckets[0][0] <= weights.min() + tol and buckets[-1][0] + buckets[-1][1] >= weights.max() - tol
            assert weights.size <= sum(b[2] for b in buckets) <= weights.size + len(buckets)  # it rounds up
            served = wait_for_histograms(client, "./r_rank_0", f"grads/{name}/histogram", 3)
            assert [h["step"] for h in served] == [10, 20, 30]


@pytest.mark.slow
def test_replay_carries_the_histograms_into_tensorboard_once(tmp_path):
    from msbridge.offline.replay import replay

    net = mlp()
    mon = monitor(tmp_path, ["jsonl"], histograms="^2\\.weight")
    train_regression([mon], steps=STEPS, net=net)
    logdir = tmp_path / "tb"
    for _ in range(2):  # the second replay finds the histograms held and adds none
        replay(mon.run_dir, "tensorboard", {"logdir": str(logdir)}, progress=False)
    ea = EventAccumulator(str(logdir / "r" / "rank_0"), size_guidance={"histograms": 0})
    ea.Reload()
    series = ea.Histograms("weights/2.weight")
    assert [h.step for h in series] == [10, 20, 30]
    values, counts, _ = numpy_histogram({p.name: p for p in net.trainable_params()}["2.weight"].asnumpy())
    assert list(series[-1].histogram_value.bucket) == counts.tolist() and series[-1].histogram_value.num == values.size


@pytest.mark.slow
@pytest.mark.compat
def test_trainstep_gradient_histograms_are_the_steps_gradients(tmp_path):
    net, holder, before = mlp(), {}, WeightsBefore(STEPS - 1)
    mon = monitor(tmp_path, {"jsonl": {}, "tensorboard": {}}, layer_norms=".*")
    train_regression([before, mon], steps=STEPS, net=net, train_cell=ring_cell(holder))
    names = [p.name for p in net.trainable_params()]
    rows = {r.step: r.values for r in read_run(mon.run_dir).ranks[0].records}
    assert sorted(rows) == list(range(1, STEPS + 1))  # coverage first: every step, every grad norm
    events = [e for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"]
    assert {e.detail["tag"] for e in events} == {f"{kind}/{n}" for kind in ("weights", "grads") for n in names}
    for name in names:
        grads = [e for e in events if e.detail["tag"] == f"grads/{name}"]
        assert [e.step for e in grads] == [10, 20, 30], name
        for e in grads:  # each is the gradient of its own step, not a stale copy
            np.testing.assert_allclose(e.detail["sum_squares"], rows[e.step][f"grad_norm/{name}"] ** 2, rtol=1e-4,
                                       err_msg=f"{name} at step {e.step}")

    oracle = gradients_at(before.weights, STEPS)
    ea = EventAccumulator(str(tmp_path / "t" / "tensorboard" / "r" / "rank_0"), size_guidance={"histograms": 0})
    ea.Reload()
    assert set(ea.Tags()["histograms"]) == {e.detail["tag"] for e in events}
    kept = holder["cell"].kept_grads()  # None unless the compiled step wrote the copy (its step mark)
    for name in names:
        np.testing.assert_allclose(kept[name], oracle[name], rtol=1e-5, atol=1e-7)  # the copy is the grad
        series = ea.Histograms(f"grads/{name}")
        assert [h.step for h in series] == [10, 20, 30]
        values, counts, edges = numpy_histogram(kept[name])
        h = series[-1].histogram_value
        assert h.num == values.size == oracle[name].size and list(h.bucket) == counts.tolist()
        np.testing.assert_allclose([h.min, h.max, h.sum, h.sum_squares],
                                   [values.min(), values.max(), values.sum(), values @ values], rtol=1e-6)
        np.testing.assert_allclose(list(h.bucket_limit), edges[1:], rtol=1e-12)
        grad = oracle[name].astype(np.float64).ravel()
        np.testing.assert_allclose([h.min, h.max, h.sum_squares], [grad.min(), grad.max(), grad @ grad], rtol=1e-4)


@pytest.mark.slow
def test_no_histograms_no_copies_and_a_step_compiled_without_them_says_so(tmp_path, caplog):
    net, holder = mlp(), {}
    off = monitor(tmp_path / "off", ["jsonl"], histograms=None, histogram_interval=None)
    train_regression([off], steps=10, net=net, train_cell=ring_cell(holder))
    cell = holder["cell"]
    assert cell.grad_indices == () and not [n for n in cell.parameters_dict() if n.startswith("msbridge_grads")]
    ir = trained_graph(cell)  # the step MindSpore compiled and trained: no copy, no Assign op at all
    assert "msbridge_grads" not in ir and assigns(ir) == 0 and "msbridge_ring" in ir

    mon = monitor(tmp_path / "late", ["jsonl"])  # the same, already compiled TrainStep, now with histograms
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train_regression([mon], steps=STEPS, net=net, train_cell=lambda _loss_net, _opt: cell)
    said = [r.getMessage() for r in caplog.records if "compiled before the monitor asked" in r.getMessage()]
    assert len(said) == 1 and "build the TrainStep anew" in said[0]
    tags = {e.detail["tag"] for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"}
    assert tags == {f"weights/{p.name}" for p in net.trainable_params()}


@pytest.mark.slow
def test_a_second_train_call_with_the_same_copies_keeps_recording_them(tmp_path):
    net, holder = mlp(), {}
    train_regression([monitor(tmp_path / "1", ["jsonl"])], steps=10, net=net, train_cell=ring_cell(holder))
    mon = monitor(tmp_path / "2", ["jsonl"], layer_norms=".*")
    train_regression([mon], steps=STEPS, net=net, train_cell=lambda _loss_net, _opt: holder["cell"])
    rows = {r.step: r.values for r in read_run(mon.run_dir).ranks[0].records}
    grads = [e for e in read_run(mon.run_dir).ranks[0].events if e.kind == "histogram"
             and e.detail["tag"] == "grads/2.weight"]
    assert [e.step for e in grads] == [10, 20, 30]
    for e in grads:
        np.testing.assert_allclose(e.detail["sum_squares"], rows[e.step]["grad_norm/2.weight"] ** 2, rtol=1e-4)
