"""A ``Model.train`` run with msbridge's monitor and all four sinks, for the busy-host MLflow test.

``python mlflow_live_job.py OUT STEPS [TRACKING_URI]``: a Dense regressor (tests/helpers/training.py) trains STEPS steps with a
``BridgeMonitor`` (flush every 10 steps) whose run dir is ``OUT`` (its sqlite store ``OUT/mlflow.db``); each step also waits 30 ms, as a slower device
step would (a wait, not CPU), so the training outlasts the first flush by seconds. MLflow's store is the default
sqlite one unless TRACKING_URI is given.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers.training import train_regression  # noqa: E402
from mindspore.train import Callback  # noqa: E402

from msbridge import BridgeMonitor  # noqa: E402


class _DeviceWait(Callback):
    def on_train_step_end(self, run_context):
        time.sleep(0.03)


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    mlflow = {"tracking_uri": sys.argv[3]} if len(sys.argv) > 3 else {}
    monitor = BridgeMonitor({"output_dir": out, "experiment": "live", "run_name": "train", "flush_steps": 10,
                             "sinks": {"jsonl": {}, "tensorboard": {}, "mlflow": mlflow, "mindinsight": {}}},
                            progress=False)
    train_regression([monitor, _DeviceWait()], steps=steps, mode="pynative")


if __name__ == "__main__":
    main()
