"""Small real MindSpore training jobs for the tests (CPU, a few seconds each)."""
from __future__ import annotations

from typing import Any, List, Sequence

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model


def regression_data(steps: int, batch: int = 8, features: int = 16, seed: int = 0, poison_step: int = 0):
    """A NumpySlicesDataset of ``steps`` batches; ``poison_step`` (1-based) gets NaN inputs."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * batch, features)).astype(np.float32)
    y = (x @ rng.normal(size=(features, 1))).astype(np.float32)
    if poison_step:
        x[(poison_step - 1) * batch:poison_step * batch] = np.nan
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=True)


class OutputRecorder(Callback):
    """A plain callback that copies each step's network output to the host: the reference series."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: List[int] = []
        self.losses: List[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        out = cb.net_outputs
        first = out[0] if isinstance(out, (tuple, list)) else out
        self.steps.append(int(cb.cur_step_num))
        self.losses.append(float(first.asnumpy()))


def train_regression(callbacks: Sequence[Any], steps: int = 24, epochs: int = 1, mode: str = "graph",
                     sink_mode: bool = False, learning_rate: Any = 0.01, net: Any = None,
                     train_cell: Any = None, seed: int = 0, initial_epoch: int = 0) -> Any:
    """Train a Dense regressor with ``Model.train``; returns the Model."""
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(seed)
    net = net or nn.Dense(16, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=learning_rate)
    if train_cell is None:
        model = Model(net, nn.MSELoss(), opt)
    else:
        model = Model(train_cell(nn.WithLossCell(net, nn.MSELoss()), opt))
    model.train(epochs, regression_data(steps, seed=seed), callbacks=list(callbacks), dataset_sink_mode=sink_mode,
                initial_epoch=initial_epoch)
    return model
