"""One rank of a real data-parallel job on CPU with ``msbridge.track``, launched by ``msrun`` from
tests/test_functional.py: a functional ``value_and_grad`` step in a Python loop over this rank's shard, every
step handed to ``run.step``. Rank 1's labels are scaled by 3, so the ranks' losses differ.

Example:
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=logs --join=True \\
        tests/helpers/track_worker.py --out runs --steps 12
"""
from __future__ import annotations

import argparse

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

import msbridge


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output root; the run goes to {out}/dist/dist-{timestamp}")
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    init()
    rank, size = get_rank(), get_group_size()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * 8 * size, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, 1))).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y * (3 if rank == 1 else 1)}, shuffle=False, num_shards=size,
                                 shard_id=rank).batch(8)
    net, loss_fn = nn.Dense(16, 1), nn.MSELoss()
    optimizer = nn.SGD(net.trainable_params(), 0.01)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, optimizer.parameters)
    config = {"experiment": "dist", "run_name": "dist-{timestamp}", "flush_steps": 4, "sinks": ["jsonl"],
              "output_dir": f"{args.out}/{{experiment}}/{{run_name}}"}
    with msbridge.track(config, optimizer=optimizer, dataset=data, progress=False) as run:
        for a, b in data.create_tuple_iterator():
            loss, grads = grad_fn(a, b)
            optimizer(grads)
            run.step(loss=loss)


if __name__ == "__main__":
    main()
