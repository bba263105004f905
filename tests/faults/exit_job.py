"""A job with jsonl and MLflow that prints ``CLOSED <epoch>`` once its close has returned, then exits.

Usage: ``python exit_job.py OUT_DIR STEPS track|model [TRACKING_URI]``: ``msbridge.track`` steps, or a real
MindSpore ``Model.train`` with ``BridgeMonitor``; MLflow at the URI (given: ``close_timeout`` 1 s, ``http_timeout``
300 s), else its sqlite store. For ``tests/faults/test_exit_after_close.py``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

import msbridge  # noqa: E402

CONFIG = {"experiment": "exit", "run_name": "r", "flush_steps": 5, "sinks": {"jsonl": {}, "mlflow": {}}}


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    config = dict(CONFIG, output_dir=os.path.join(out, "{experiment}", "{run_name}"))
    if sys.argv[4:]:
        config["sinks"] = {"jsonl": {}, "mlflow": {"tracking_uri": sys.argv[4], "close_timeout": 1,
                                                   "http_timeout": 300}}
    if sys.argv[3] == "model":
        from helpers.training import train_regression

        monitor = msbridge.BridgeMonitor(config, progress=False)
        train_regression([monitor], steps=steps)
    else:
        with msbridge.track(config, progress=False) as run:
            for step in range(1, steps + 1):
                run.step(loss=1.0 / step)
                time.sleep(0.002)
    print(f"CLOSED {time.time():.3f}", flush=True)


if __name__ == "__main__":
    main()
