"""Data-parallel training of the demo LM with msbridge, launched on every rank by ``msrun``.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=./msrun_logs --join=True \
        examples/distributed/train.py --out ./msbridge_runs --steps 200

Each rank trains on its own shard of the data (``num_shards``/``shard_id``) and
writes its own ``train/loss``; rank 0 adds ``train/global_loss`` and the spread
across ranks (``dist/...``) and is the only rank that talks to MLflow. See
README.md next to this file for how to read the curves.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402
from mindspore.context import ParallelMode  # noqa: E402
from mindspore.train import Model  # noqa: E402

from msbridge import BridgeMonitor  # noqa: E402
from msbridge.demo import DEMO_DEFAULTS, build_model, make_tokens  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="./msbridge_runs", help="output root, shared by every rank")
    parser.add_argument("--steps", type=int, default=200, help="training steps (per rank)")
    parser.add_argument("--batch", type=int, default=16, help="samples per step on each rank")
    parser.add_argument("--sinks", default="jsonl,tensorboard,mlflow")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()  # before BridgeMonitor: ranks then agree on the run name's {timestamp}
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()

    model_cfg = DEMO_DEFAULTS["model"]
    tokens = make_tokens(args.steps * args.batch * world, model_cfg["seq_length"], model_cfg["vocab_size"])
    data = ds.NumpySlicesDataset({"tokens": tokens}, shuffle=False, num_shards=world, shard_id=rank)
    data = data.batch(args.batch, drop_remainder=True)

    monitor = BridgeMonitor({
        "experiment": "msbridge-dp",
        "run_name": f"dp{world}-{{timestamp}}",
        "output_dir": os.path.join(os.path.abspath(args.out), "{experiment}", "{run_name}"),
        "flush_steps": 50,
        "seq_length": model_cfg["seq_length"],
        "sinks": args.sinks.split(","),
        "params": {"model": model_cfg, "train": {"batch_size": args.batch, "world_size": world}},
    })

    ms.set_seed(7)  # the same initial weights on every rank
    _, loss_net = build_model(**model_cfg)
    optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=nn.WarmUpLR(0.003, 20))
    Model(nn.TrainOneStepCell(loss_net, optimizer)).train(1, data, callbacks=[monitor], dataset_sink_mode=False)
    if rank == 0:
        print(f"run dir: {monitor.run_dir}")


if __name__ == "__main__":
    main()
