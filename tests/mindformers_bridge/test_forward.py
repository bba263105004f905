"""What mindformers' own monitors find, forwarded as msbridge events (``msbridge.mindformers.forward``).

The settings come from real TrainingStateMonitor and CheckpointMonitor objects.
The spike file is written by TrainingStateMonitor's own check. The health file
is written here in CheckpointMonitor's format, because producing it for real
means saving a checkpoint with an embedding of a set size.
"""
from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from mindspore.train.callback import _InternalCallbackParam

pytest.importorskip("mindformers")

from mindformers.core.callback.callback import CheckpointMonitor, TrainingStateMonitor  # noqa: E402

from msbridge.capture.window import Window  # noqa: E402
from msbridge.mindformers.forward import HEALTH_CKPT, SKIP_DATA, SPIKE, MindformersFindings  # noqa: E402
from msbridge.names import GRAD_NORM

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)


def step_params(step: int, global_norm: float) -> _InternalCallbackParam:
    cb = _InternalCallbackParam()
    cb.dataset_sink_mode, cb.batch_num, cb.cur_epoch_num, cb.cur_step_num = False, 10, 1, step
    scalar = Tensor(0.0, ms.float32)
    cb.net_outputs = (Tensor(2.0, ms.float32), Tensor(False), scalar, scalar, Tensor([global_norm], ms.float32))
    return cb


def window(steps, norms) -> Window:
    n = len(steps)
    return Window(steps=np.asarray(steps), epochs=np.ones(n, int), wall_time=np.zeros(n), step_time_s=np.ones(n),
                  monitor_s=np.zeros(n), scalars={GRAD_NORM: np.asarray(norms, dtype=np.float64)})


def test_spike_from_training_state_monitors_own_file():
    monitor = TrainingStateMonitor(origin_epochs=1, dataset_size=10,
                                   config={"check_for_global_norm": True, "global_norm_spike_threshold": 2.0})
    findings = MindformersFindings.from_callbacks([monitor], rank=0)
    assert findings.events(None, 0) == []
    monitor.abnormal_global_norm_check(step_params(3, 1.5))  # under the threshold: nothing
    with pytest.raises(RuntimeError, match="TREError"):
        monitor.abnormal_global_norm_check(step_params(4, 2.5))
    events = findings.events(None, 4)
    assert [(e.kind, e.step, e.detail["global_norm"], e.detail["times_at_step"]) for e in events] == \
        [(SPIKE, 4, 2.5, 1)]
    assert findings.events(None, 4) == [], "each finding once"
    with pytest.raises(RuntimeError, match="TREError"):  # a resumed run spiking at a new step
        monitor.abnormal_global_norm_check(step_params(7, 3.0))
    assert [(e.step, e.detail["global_norm"]) for e in findings.events(None, 7)] == [(7, 3.0)]


def test_skip_data_uses_training_state_monitors_threshold():
    monitor = TrainingStateMonitor(origin_epochs=1, dataset_size=10, use_skip_data_by_global_norm=True,
                                   config={"global_norm_spike_threshold": 2.0})
    findings = MindformersFindings.from_callbacks([monitor], rank=1)
    events = findings.events(window([5, 6, 7, 8], [1.0, 2.0, 1.9, 7.5]), 8)
    assert [(e.kind, e.step, e.rank, e.detail["global_norm"]) for e in events] == \
        [(SKIP_DATA, 6, 1, 2.0), (SKIP_DATA, 8, 1, 7.5)]


def test_health_checkpoints_from_checkpoint_monitors_record(tmp_path):
    monitor = CheckpointMonitor(prefix="llama", directory=str(tmp_path / "ckpt"), embedding_size=16,
                                use_checkpoint_health_monitor=True, health_ckpts_record_dir=str(tmp_path))
    findings = MindformersFindings.from_callbacks([object(), monitor], rank=0)
    record = tmp_path / "health_ckpts.json"
    record.write_text(json.dumps([{"is_health": 1, "ckpt_name": "llama-1_10.ckpt"}]))
    assert [(e.kind, e.step, e.detail) for e in findings.events(None, 10)] == \
        [(HEALTH_CKPT, 10, {"ckpt_name": "llama-1_10.ckpt", "is_health": True})]
    record.write_text(json.dumps([{"is_health": 1, "ckpt_name": "llama-1_10.ckpt"},
                                  {"is_health": 0, "ckpt_name": "llama-1_20.ckpt"}]))
    assert [(e.step, e.detail["is_health"]) for e in findings.events(None, 20)] == [(20, False)]


def test_nothing_configured_forwards_nothing(tmp_path):
    findings = MindformersFindings.from_callbacks([TrainingStateMonitor(origin_epochs=1, dataset_size=10,
                                                                        config={})], rank=0)
    assert findings.describe() == "nothing to forward"
    assert findings.events(window([1], [100.0]), 1) == []
