"""A real MindSpore training job for the fault tests, run as a script: it prints each step as it ends.

Usage: ``python signal_job.py OUT_DIR STEPS [slow-close] [mlflow]``. ``slow-close`` adds a sink
whose close prints ``closing`` and then takes 3 s: a window to signal the close itself. ``mlflow``
adds the MLflow sink, its sqlite store at ``OUT_DIR/mlflow.db``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

from helpers.training import train_regression  # noqa: E402
from mindspore.train import Callback  # noqa: E402

from msbridge import BridgeMonitor, Sink  # noqa: E402


class Tick(Callback):
    """Prints ``step N`` at each step end and slows training down enough to be signalled mid-run."""

    def on_train_step_end(self, run_context):
        print("step", run_context.original_args().cur_step_num, flush=True)
        time.sleep(0.01)


class SlowClose(Sink):
    """A sink that takes its time to close, and says when it starts."""

    name = "slow_close"

    def write(self, records, events):
        pass

    def close(self, status="FINISHED"):
        print("closing", flush=True)
        time.sleep(3)


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    extra = [SlowClose()] if "slow-close" in sys.argv[3:] else []
    sinks = {"jsonl": {}}
    if "mlflow" in sys.argv[3:]:
        sinks["mlflow"] = {"tracking_uri": "sqlite:///" + os.path.join(os.path.abspath(out), "mlflow.db")}
    monitor = BridgeMonitor({"output_dir": out, "flush_steps": 25, "sinks": sinks}, sinks=extra, progress=False)
    train_regression([monitor, Tick()], steps=steps)
    print("training returned", flush=True)


if __name__ == "__main__":
    main()
