"""One trial of a sweep: the demo model with msbridge logging to an MLflow tracking URI, in its own process.

tests/adapters/test_mlflow_team_server.py starts several at once, all with one ``sweep_id``.

Example:
    python tests/helpers/sweep_job.py --out runs --uri http://127.0.0.1:5000 --sweep-id s1 --lr 0.003 --steps 120
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("GLOG_v", "3")

from msbridge import BridgeMonitor  # noqa: E402
from msbridge.demo import demo_config, train  # noqa: E402

EXPERIMENT = "team-sweep"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--uri", required=True, help="MLflow tracking URI")
    parser.add_argument("--sweep-id", required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--flush-steps", type=int, default=10)
    args = parser.parse_args()
    mlflow = {"tracking_uri": args.uri, "backoff_initial": 0.5, "backoff_max": 2.0, "close_timeout": 300.0}
    cfg = demo_config(args.out, {"experiment": EXPERIMENT, "sweep_id": args.sweep_id, "run_name": f"lr{args.lr}",
                                 "flush_steps": args.flush_steps, "sinks": {"jsonl": {}, "mlflow": mlflow}})
    cfg["params"]["optimizer"]["learning_rate"] = args.lr
    monitor = BridgeMonitor(cfg, progress=False)
    train(monitor, args.steps, cfg["params"])
    print(monitor.run_dir, flush=True)


if __name__ == "__main__":
    main()
