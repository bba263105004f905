"""What a step is worth, the loss scale and the window's memory peak reach every sink: real CPU training into
jsonl, TensorBoard, MindInsight and MLflow (sqlite), each read back with its tracker's own reader."""
from __future__ import annotations

import numpy as np
import pytest
from helpers.runs import monitor
from helpers.sink_reads import every_sink
from helpers.training import train_regression
from mindspore import nn

from msbridge.capture.train_step import TrainStep
from msbridge.names import (DATA_WAIT_PCT, HOST_RSS_PEAK_MB, LOSS_SCALE, MFU, OVERFLOW, SAMPLES_SEEN, TFLOPS,
                            TOKENS_SEEN)
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS = 30
PER_STEP = (SAMPLES_SEEN, TOKENS_SEEN, TFLOPS, MFU, LOSS_SCALE, OVERFLOW, "health/skipped_steps")
PER_WINDOW = (DATA_WAIT_PCT, HOST_RSS_PEAK_MB)


def test_the_new_series_are_in_every_sink(tmp_path):
    pytest.importorskip("mlflow")
    mon = monitor(tmp_path, sinks=["jsonl", "tensorboard", "mindinsight", "mlflow"], seq_length=16,
                  peak_tflops=0.001, memory=True, overhead_budget=0.99)
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 127, 2, 2)  # overflows recur: the scale and the count move
    train_regression([mon], steps=STEPS, train_cell=lambda n, o: TrainStep(n, o, scale_sense=scale, ring_size=16))
    log = read_run(mon.run_dir).ranks[0]
    for name in PER_STEP + PER_WINDOW:
        want = dict(log.series(name))
        steps = sorted(want)
        assert steps == (list(range(1, STEPS + 1)) if name in PER_STEP else list(range(5, STEPS + 1, 5))), name
        for sink, got in every_sink(tmp_path / "t", "t", "r", name).items():
            assert sorted(got) == steps, (sink, name)
            np.testing.assert_allclose([got[s] for s in steps], [want[s] for s in steps], rtol=1e-6,
                                       err_msg=f"{sink} {name}")
    assert max(dict(log.series("health/skipped_steps")).values()) > 3
    assert len(set(dict(log.series(LOSS_SCALE)).values())) > 2
