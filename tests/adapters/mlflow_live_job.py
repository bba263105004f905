"""A ``Model.train`` run with msbridge's monitor and all four sinks, for the busy-host MLflow test.

``python mlflow_live_job.py OUT STEPS EXPERIMENT [TRACKING_URI]``: a Dense regressor (tests/helpers/training.py)
trains STEPS steps, PyNative, with a ``BridgeMonitor`` (a flush every 10 steps, not by time) whose run dir is
``OUT`` and whose experiment is EXPERIMENT; MLflow's store is the default sqlite one (``OUT/mlflow.db``) unless
TRACKING_URI is given. Nothing waits between steps (an earlier 30 ms sleep a step only left the cores to MLflow's
child): the training competes for the cores as it is, and 400 steps beside 4 busy processes outlast the first
flush by about a minute.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers.training import train_regression  # noqa: E402

from msbridge import BridgeMonitor  # noqa: E402


def main() -> None:
    out, steps, experiment = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mlflow = {"tracking_uri": sys.argv[4]} if len(sys.argv) > 4 else {}
    monitor = BridgeMonitor({"output_dir": out, "experiment": experiment, "run_name": "train", "flush_steps": 10,
                             "flush_seconds": 3600,
                             "sinks": {"jsonl": {}, "tensorboard": {}, "mlflow": mlflow, "mindinsight": {}}},
                            progress=False)
    train_regression([monitor], steps=steps, mode="pynative")


if __name__ == "__main__":
    main()
