"""A learning-rate sweep of the demo model into one MLflow experiment, then `msbridge compare`.

    python examples/sweep/run_sweep.py --out ./msbridge_runs --steps 150
    msbridge compare msbridge-sweep          # the default store: ./msbridge_runs/msbridge-sweep/mlflow.db
    msbridge compare ./msbridge_runs/msbridge-sweep    # the same table, from the experiment dir (as view takes it)

Every run logs its params (so `optimizer.learning_rate` is the column that differs), its
per-step metrics, its validation every 50 steps and a shared `sweep_id` tag to
./msbridge_runs/msbridge-sweep/mlflow.db. MindSpore's ModelCheckpoint saves the weights every 50 steps into
OUT/msbridge-sweep/checkpoints/lr<lr>; each checkpoint is a LoggedModel of its run (MLflow's Models tab).
"""
from __future__ import annotations

import argparse
import os
import uuid

os.environ.setdefault("GLOG_v", "3")

from mindspore.train import CheckpointConfig, ModelCheckpoint  # noqa: E402

from msbridge import BridgeMonitor  # noqa: E402
from msbridge.demo import demo_config, train  # noqa: E402
from msbridge.offline.compare import compare, default_tracking_uri, format_table  # noqa: E402

EXPERIMENT = "msbridge-sweep"


def run_sweep(out: str, steps: int, learning_rates=(0.0003, 0.003, 0.03, 0.3)) -> str:
    """Train once per learning rate; returns the MLflow tracking URI they share."""
    sweep_id = uuid.uuid4().hex[:8]
    for lr in learning_rates:
        cfg = demo_config(out, {"experiment": EXPERIMENT, "sinks": ["jsonl", "mlflow", "tensorboard"], "sweep_id": sweep_id,
                                "run_name": "lr{optimizer.learning_rate}-{timestamp}"})
        cfg["params"]["optimizer"]["learning_rate"] = lr
        directory = os.path.join(out, EXPERIMENT, "checkpoints", f"lr{lr}")
        saver = ModelCheckpoint("demo", directory, CheckpointConfig(save_checkpoint_steps=50, keep_checkpoint_max=3))
        train(BridgeMonitor(cfg, progress=False), steps, cfg["params"], extra_callbacks=[saver])
    return default_tracking_uri(EXPERIMENT, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="./msbridge_runs",
                        help="the experiment dir is OUT/msbridge-sweep (default ./msbridge_runs: compare's default)")
    parser.add_argument("--steps", type=int, default=150, help="training steps of each run (default 150)")
    args = parser.parse_args()
    uri = run_sweep(os.path.abspath(args.out), args.steps)
    print(format_table(compare(EXPERIMENT, uri)))
