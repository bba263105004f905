"""Real CPU training whose input pipeline or step slows from one step on: ``perf/data_wait_pct``,
``throughput_drop``'s cause and ``msbridge diagnose``'s ``slowdown`` are tested on it.

Example:
    >>> train([Busy(0.01), monitor], Samples(100, slow_from=SLOW_FROM, batch_s=0.15))
"""
from __future__ import annotations

import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model

BATCH, SLOW_FROM = 8, 61


class Samples:
    """A random-access source whose batches from ``slow_from`` on take ``batch_s`` to read."""

    def __init__(self, steps: int, slow_from: int = 0, batch_s: float = 0.0) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(steps * BATCH, 16)).astype(np.float32)
        self.y = (self.x @ rng.normal(size=(16, 1))).astype(np.float32)
        self.slow_at, self.sample_s = (slow_from - 1) * BATCH if slow_from else None, batch_s / BATCH

    def __getitem__(self, i: int):
        if self.slow_at is not None and i >= self.slow_at:
            time.sleep(self.sample_s)
        return self.x[i], self.y[i]

    def __len__(self) -> int:
        return len(self.x)


class Busy(Callback):
    """Makes every step take ``base_s`` (``slow_s`` from step ``slow_from`` on), inside the monitor's step:
    listed before it, its step-end runs between the monitor's step-begin and step-end."""

    def __init__(self, base_s: float, slow_from: int = 0, slow_s: float = 0.0) -> None:
        self.base_s, self.slow_from, self.slow_s = base_s, slow_from, slow_s

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        time.sleep(self.slow_s if self.slow_from and step >= self.slow_from else self.base_s)


def train(callbacks, source: Samples, prefetch: int = 0) -> None:
    """One epoch over ``source``; ``prefetch``: the dataset pipeline's queue size for this run (0: MindSpore's
    default, 16 batches, which hides a slower loader for as many steps)."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    default = ds.config.get_prefetch_size()
    ds.config.set_prefetch_size(prefetch or default)
    try:
        data = ds.GeneratorDataset(source, ["x", "y"], shuffle=False, num_parallel_workers=1,
                                   python_multiprocessing=False).batch(BATCH, drop_remainder=True)
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, callbacks=callbacks,
                                                                           dataset_sink_mode=False)
    finally:
        ds.config.set_prefetch_size(default)
