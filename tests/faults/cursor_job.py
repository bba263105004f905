"""A real MindSpore training job whose trackers are jsonl, TensorBoard and MLflow at a given URI, for the tracker
cursor's fault tests (``tests/faults/test_tracker_cursor.py``).

Usage: ``python cursor_job.py OUT_DIR TRACKING_URI STEPS_PER_EPOCH EPOCHS [INITIAL_EPOCH]``. Its run dir is
``OUT_DIR/cursor/r``: given ``INITIAL_EPOCH`` (0 too), it resumes that run (``resume: true``), training from that
epoch (as a checkpoint would give it back). It prints ``step N`` every 100 steps and ``epoch E`` at each epoch end
(each step takes 2 ms more), and once its close returned one JSON line: ``{"status", "undelivered", "run_dir"}``.
MLflow keeps at most 1,000 records in memory (``max_pending``, more than a flush window): a server frozen for longer
leaves it behind, reading the write-ahead log.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

from helpers.training import train_regression  # noqa: E402
from mindspore.train import Callback  # noqa: E402

from msbridge import BridgeMonitor  # noqa: E402

EXPERIMENT, RUN_NAME = "cursor", "r"


class Say(Callback):
    """Prints ``step N`` every 100 steps and ``epoch E`` at each epoch end, flushed; each step takes 2 ms more (a
    pace the test can freeze MLflow in)."""

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        time.sleep(0.002)
        if step % 100 == 0:
            print("step", step, flush=True)

    def on_train_epoch_end(self, run_context):
        print("epoch", run_context.original_args().cur_epoch_num, flush=True)


def main() -> None:
    out, uri, steps, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    resume = bool(sys.argv[5:])
    initial = int(sys.argv[5]) if resume else 0
    mlflow = {"tracking_uri": uri, "max_pending": 1000, "backoff_initial": 0.2, "backoff_max": 1.0,
              "close_timeout": 300}
    config = {"experiment": EXPERIMENT, "run_name": RUN_NAME, "resume": resume,
              "output_dir": os.path.join(out, "{experiment}", "{run_name}"),
              "sinks": {"jsonl": {}, "tensorboard": {}, "mlflow": mlflow}}
    monitor = BridgeMonitor(config, progress=False)
    train_regression([monitor, Say()], steps=steps, epochs=epochs, initial_epoch=initial)
    outcome = monitor.outcome
    print(json.dumps({"status": outcome.status, "undelivered": outcome.undelivered, "run_dir": monitor.run_dir}),
          flush=True)


if __name__ == "__main__":
    main()
