"""How long a live training's close takes while other processes keep every core busy, and whether MLflow holds
the whole run after it.

    python examples/bench/close_beside_hogs.py [--hogs 2] [--steps 200]

One ``Model.train`` (``nn.Dense``, ``--steps`` steps, ``flush_steps`` 10) with ``sinks: [jsonl, mlflow]`` on a new
sqlite store, beside ``--hogs`` busy processes at nice 0 (started and stopped here). Prints one JSON line: the
seconds from the last step to the end of ``model.train`` (the close), what the run's outcome lists as not
delivered, and how many steps MLflow holds. To compare two versions, run it from each checkout in turn
(A B A B ...): the machine is noisy, so only pairs measured side by side say anything.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")
HOG = "while True: pass"


def train(work: str, steps: int) -> dict:
    """The training and its close; what the outcome and MLflow's store say afterwards."""
    import mindspore as ms
    import numpy as np
    from mindspore import dataset as ds, nn
    from mindspore.train import Callback, Model

    from msbridge import BridgeMonitor

    class LastStep(Callback):
        def on_train_step_end(self, run_context):
            self.at = time.monotonic()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 8, 16)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": x.sum(1, keepdims=True)}, shuffle=False).batch(8)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net, last = nn.Dense(16, 1), LastStep()
    monitor = BridgeMonitor({"experiment": "close", "run_name": "r", "flush_steps": 10, "experiment_dir": work,
                             "output_dir": os.path.join(work, "run"),
                             "sinks": ["jsonl", "mlflow"]}, progress=False)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, callbacks=[monitor, last],
                                                                         dataset_sink_mode=False)
    close_s = time.monotonic() - last.at
    with open(os.path.join(monitor.run_dir, "run.json")) as fh:
        outcome = json.load(fh)["outcome"]
    store = sqlite3.connect(f"file:{os.path.join(work, 'mlflow.db')}?mode=ro", uri=True)
    held = store.execute("SELECT COUNT(DISTINCT step) FROM metrics WHERE key = 'train/loss'").fetchone()[0]
    return {"close_s": round(close_s, 2), "not delivered": outcome["not delivered"], "mlflow steps": held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside the training (nice 0)")
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        time.sleep(1)
        with tempfile.TemporaryDirectory(prefix="close-beside-hogs-") as work:
            print(json.dumps(dict(train(work, args.steps), hogs=args.hogs)), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
