"""A real MindSpore training job with every sink on, for the load-fault test, run as a script.

Usage: ``python load_job.py OUT_DIR STEPS [TRACKING_URI [EXPERIMENT]]`` (no URI: MLflow's embedded sqlite store;
the experiment is ``load`` unless named).
Prints the run dir, exits with ``BridgeMonitor.outcome.exit_code``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

from helpers.training import train_regression  # noqa: E402

from msbridge import BridgeMonitor  # noqa: E402


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    mlflow = {"tracking_uri": sys.argv[3]} if len(sys.argv) > 3 else {}
    experiment = sys.argv[4] if len(sys.argv) > 4 else "load"
    monitor = BridgeMonitor({"experiment": experiment, "run_name": "r", "flush_steps": 5,
                             "output_dir": os.path.join(out, "{experiment}", "{run_name}"),
                             "sinks": {"jsonl": {}, "tensorboard": {}, "mlflow": mlflow, "mindinsight": {}}},
                            progress=False)
    train_regression([monitor], steps=steps)
    print(monitor.run_dir, flush=True)
    sys.exit(monitor.outcome.exit_code)


if __name__ == "__main__":
    main()
