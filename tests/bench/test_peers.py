"""The peers of ``msbridge bench``: each writes the 14 values msbridge records a step, computed the same way."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from msbridge.bench.peers import STEP_VALUES, StepValues, TensorboardXPeer, warmup_lr


class _Kept(StepValues):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.logged = []

    def log(self, values, step):
        self.logged.append((step, values))


def _context(step, loss):
    import mindspore as ms

    args = SimpleNamespace(cur_step_num=step, cur_epoch_num=1, net_outputs=ms.Tensor(np.float32(loss)))
    return SimpleNamespace(original_args=lambda: args)


def test_a_peer_logs_the_14_values_msbridge_records_each_step():
    peer = _Kept(lr_at=warmup_lr(0.003, 20), batch=8, seq_length=32)
    for step, loss in ((1, 4.0), (2, 2.0), (3, float("nan"))):
        peer.on_train_step_begin(_context(step, loss))
        peer.on_train_step_end(_context(step, loss))
    assert [s for s, _ in peer.logged] == [1, 2, 3]
    assert all(tuple(values) == STEP_VALUES for _, values in peer.logged)
    second = peer.logged[1][1]
    assert second["train/loss"] == 2.0 and second["train/loss_ema"] == pytest.approx(3.8)
    assert second["train/lr"] == pytest.approx(0.003 * 2 / 20) and second["perf/tokens_seen"] == 2 * 8 * 32
    assert peer.logged[2][1]["health/nan_steps"] == 1.0 and second["health/nan_steps"] == 0.0


@pytest.mark.slow
def test_the_tensorboardx_peer_writes_each_value_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboardX")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    peer = TensorboardXPeer(str(tmp_path), lr_at=warmup_lr(0.003, 20))
    peer.on_train_begin(None)
    for step in (1, 2, 3):
        peer.on_train_step_begin(_context(step, 1.0 / step))
        peer.on_train_step_end(_context(step, 1.0 / step))
    peer.on_train_end(None)
    reader = event_accumulator.EventAccumulator(str(tmp_path / "tbx"))
    reader.Reload()
    assert sorted(reader.Tags()["scalars"]) == sorted(STEP_VALUES)
    assert [e.step for e in reader.Scalars("train/loss")] == [1, 2, 3]
    assert [e.value for e in reader.Scalars("train/loss")] == pytest.approx([1.0, 0.5, 1 / 3])
