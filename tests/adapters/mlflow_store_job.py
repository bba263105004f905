"""One process that logs a short run with the real MLflow sink: what a training job's rank 0 does with MLflow.

``python mlflow_store_job.py ROOT NAME STEPS [GO_FILE]``: experiment ``exp`` under ``ROOT`` (its store
``ROOT/exp/mlflow.db``), run ``NAME``, steps 1..STEPS. With ``GO_FILE`` it waits until that file exists,
so that several jobs reach a new store at the same moment. Prints ``undelivered: <text>`` at the end.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers.runs import make_records, make_run  # noqa: E402

from msbridge.adapters.mlflow_sink import MlflowSink  # noqa: E402
from msbridge.sinks.base import FINISHED  # noqa: E402


def main() -> None:
    root, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    go = sys.argv[4] if len(sys.argv) > 4 else None
    run = make_run(root, name=name)
    os.makedirs(run.run_dir, exist_ok=True)
    sink = MlflowSink(backoff_initial=0.2, backoff_max=1.0, close_timeout=60.0)
    sink.open(run)
    while go and not os.path.exists(go):
        time.sleep(0.01)
    sink.write(make_records(range(1, steps + 1)), [])
    sink.close(FINISHED)
    print(f"undelivered: {sink.undelivered()}", flush=True)


if __name__ == "__main__":
    main()
