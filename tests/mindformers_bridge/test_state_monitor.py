"""Per-parameter norms next to mindformers' own TrainingStateMonitor, on the tiny Llama example.

The oracle is what mindformers itself writes for the same steps: its log lines
(``*_format: log``) and its TensorBoard event file (``*_format: tensorboard`` with a
``tensorboard:`` section), read back with tensorboard's ``EventAccumulator``.

On one CPU device mindformers has no ``local_norm/*`` or ``device_local_norm`` to compare: it
takes them from MindSpore's gradient-communication bprop (``_MirrorOperator``/``AllGather``,
inserted only under semi/auto parallel) through ``TensorDump`` into ``dump_path``. Under
mindformers 1.9 and MindSpore 2.9 TensorDump has no CPU kernel (only the Ascend plugin has
it), so ``dump_path`` stays '' and neither tag is written; mindformers 1.6 (MindSpore 2.7)
dumps to ``./dump`` and writes ``device_local_norm`` as 0.0. msbridge's per-parameter grad
norms are checked against the global norm mindformers logs instead.
"""
from __future__ import annotations

import re
from typing import Dict

import numpy as np
import pytest

pytest.importorskip("mindformers")

from helpers.mf_runs import Printed, mf_lines, only_run, train, variant  # noqa: E402

from msbridge.sinks.runlog import read_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.compat]  # compat: also run against the oldest supported pair

# TrainingStateMonitor's log lines: "... step:[   10/   12] adam_m_norm/model.layers.0...: 0.0123",
# "... weight_norm: 3.2"
MF_STATE = re.compile(r"step:\[\s*(\d+)/\s*\d+\] (adam_[mv]_norm/\S+|weight_norm): ([-\d.e+]+)")


def test_layer_norms_through_the_ring_match_mindformers_own_state_monitor(tmp_path):
    """``local_norm: True`` under MSBridgeRing puts every parameter's grad norm into the ring; the
    mindformers keys ``optimizer_state_format`` / ``weight_state_format`` turn on layer_norms; the grad norms
    make up mindformers' global norm and the Adam-moment norms equal what its TrainingStateMonitor logs."""
    config = variant(tmp_path, "norms.yaml", "runner_wrapper:\n  type: MSBridgeRing\n  wrapper: CPUTrainOneStepCell\n"
                                             "  ring_size: 64\n  local_norm: True\n  use_clip_grad: True\n"
                                             "  max_grad_norm: 1.0\n  scale_sense: 1.0\n"
                                             "monitor_config:\n  monitor_on: True\n  dump_path: ''\n"
                                             "  step_interval: 1\n  optimizer_state_format: log\n"
                                             "  weight_state_format: log\n")
    work = tmp_path / "work"
    out = train(work, steps=12, config=config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    mf = mf_lines(work)
    state: Dict[int, Dict[str, float]] = {}
    for m in MF_STATE.finditer((work / "output" / "log" / "rank_0" / "info.log").read_text()):
        state.setdefault(int(m[1]), {})[m[2]] = Printed(m[3])  # 1.9 prints in full, 1.6 to 4 decimals
    log = read_run(only_run(work)).ranks[0]
    rows = {r.step: r.values for r in log.records}
    assert sorted(rows) == sorted(mf) == list(range(1, 13))
    grads = [n for n in rows[1] if n.startswith("grad_norm/")]
    assert len(grads) > 10 and all(set(grads) <= set(rows[s]) for s in rows)
    for step, values in rows.items():  # the local norms make up mindformers' global norm (one device)
        total = np.sqrt(sum(values[n] ** 2 for n in grads))
        np.testing.assert_allclose(total, mf[step]["train/grad_norm"], rtol=1e-4, err_msg=f"step {step}")
    flushed = [s for s in rows if any(n.startswith("weight_norm/") for n in rows[s])]
    assert flushed and flushed[-1] == 12
    for step in flushed:
        moments = {n.split("/", 1)[1]: v for n, v in rows[step].items() if n.startswith("optimizer/")}
        assert moments and sorted(moments) == sorted(k for k in state[step] if k.startswith("adam_"))
        for k in sorted(moments):  # to what mindformers printed: rtol 1e-5, or half a unit of its last digit
            printed = state[step][k]
            assert abs(moments[k] - printed) <= max(1e-5 * abs(printed), printed.half_ulp, 1e-9), (step, k)
        # Not compared: mindformers' one weight_norm. It unwraps only an nn.TrainOneStepCell, so under
        # MSBridgeRing it sums every trainable Parameter of the wrapper, optimizer state included.
        assert "weight_norm" in state[step] and any(n.startswith("weight_norm/") for n in rows[step])


# TrainingStateMonitor's per-parameter keys to TensorBoard, and mindformers' writer on; msbridge flushes every
# 4 steps, so the state it samples per flush (weights, Adam moments) meets mindformers' per-step tags 3 times.
# Not here: local_loss_format. mindformers 1.9's Trainer(args=...) raises with it, before training: "RuntimeError:
# Build a Context instance before set_context()" (_reassign_monitor_config runs before the context is built).
TB_PARITY = """\
tensorboard:
  tensorboard_dir: output/tensorboard
monitor_config:
  monitor_on: True
  dump_path: ''
  step_interval: 1
  local_norm_format: tensorboard
  device_local_norm_format: tensorboard
  optimizer_state_format: tensorboard
  weight_state_format: tensorboard
callbacks:
  - type: MFLossMonitor
  - type: MSBridgeMonitor
    experiment: tiny-llama
    output_dir: ./msbridge_runs/{experiment}/{run_name}
    sinks: [jsonl, tensorboard]
    flush_steps: 4
"""


def test_norms_equal_what_training_state_monitor_writes_to_tensorboard(tmp_path):
    """mindformers' event file is the oracle: its ``adam_m_norm/<p>``, ``adam_v_norm/<p>`` and ``weight_norm``
    (and MFLossMonitor's ``loss``, ``learning-rate``, ``grad-norm``) against msbridge's jsonl records and its own
    tags in the same file (msbridge's tensorboard sink writes through mindformers' writer)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work = tmp_path / "work"
    out = train(work, steps=12, config=variant(tmp_path, "tb_parity.yaml", TB_PARITY))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ea = EventAccumulator(str(work / "output" / "tensorboard" / "rank_0"), size_guidance={"scalars": 0})
    ea.Reload()
    tb = {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}
    ours = {r.step: r.values for r in read_run(only_run(work)).ranks[0].records}

    mf_moments = sorted(t for t in tb if t.startswith(("adam_m_norm/", "adam_v_norm/")))
    assert len(mf_moments) > 20 and all(sorted(tb[t]) == list(range(1, 13)) for t in mf_moments + ["weight_norm"])
    assert not [t for t in tb if t.startswith("local_norm/")], "mindformers wrote local norms on CPU: compare them"
    # mindformers 1.6 under MindSpore 2.7 ('' -> './dump', where TensorDump runs on CPU) writes device_local_norm, but
    # it sums only gradients that pass a communication op: 0.0 at every step on one device, nothing to compare
    assert set(tb.get("device_local_norm", {}).values()) <= {0.0}
    assert sorted(ours) == list(range(1, 13))
    flushed = [s for s in sorted(ours) if any(n.startswith("weight_norm/") for n in ours[s])]
    assert len(flushed) >= 3 and flushed[-1] == 12, flushed  # step coverage before any value

    for step in flushed:
        values = ours[step]
        moments = {n[len("optimizer/"):]: v for n, v in values.items() if n.startswith("optimizer/")}
        assert sorted(moments) == mf_moments, step
        # float32 norms from two reductions (MindSpore's, numpy's), the file's in float32: measured up to 1.2e-7 apart
        for tag in mf_moments:
            np.testing.assert_allclose(moments[tag], tb[tag][step], rtol=1e-6, err_msg=f"{tag} step {step}")
            np.testing.assert_allclose(tb["optimizer/" + tag][step], tb[tag][step], rtol=1e-6)
        # mindformers' one weight_norm is the norm of every trainable parameter of the model (CPUTrainOneStepCell is
        # an nn.TrainOneStepCell, which it unwraps); msbridge's layer_norms '.*' has one per parameter
        weights = [v for n, v in values.items() if n.startswith("weight_norm/")]
        assert len(weights) == len(mf_moments) // 2
        np.testing.assert_allclose(np.sqrt(np.sum(np.square(weights))), tb["weight_norm"][step], rtol=1e-6)

    # MFLossMonitor's per-step tags in the same file: every step
    for ours_name, mf_tag in (("train/loss", "loss"), ("train/lr", "learning-rate"),
                              ("train/grad_norm", "grad-norm")):
        assert sorted(tb[mf_tag]) == sorted(tb[ours_name]) == list(range(1, 13)), mf_tag
        np.testing.assert_allclose([ours[s][ours_name] for s in range(1, 13)],
                                   [tb[mf_tag][s] for s in range(1, 13)], rtol=1e-6, err_msg=mf_tag)
