"""One trial of ``examples/sweep/sweep.yaml``: the demo model trained with msbridge on, as ``msbridge sweep`` runs it.

    msbridge sweep examples/sweep/sweep.yaml

The sweep appends the trial's values as ``--name=value`` (``--optimizer.learning_rate=0.0031``); they are the
same values ``msbridge.sweep.current()`` holds, typed. The monitor joins the trial by itself: the values in its
params, ``run_name`` ``trial-<number>``, each ``eval/loss`` reported to Optuna, training stopped when it prunes.
Outside a sweep the script trains the demo's defaults.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import msbridge.sweep  # noqa: E402
from msbridge import BridgeMonitor  # noqa: E402
from msbridge.demo import demo_config, exit_status, train  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    parser.add_argument("--eval-every", type=int, default=25, help="steps between evaluations (default 25)")
    parser.add_argument("--sinks", default="jsonl,mlflow,tensorboard", help="comma-separated sinks")
    parser.add_argument("--out", default="./msbridge_runs", help="outside a sweep: the runs' root")
    args, trial_args = parser.parse_known_args()  # the trial's --name=value: msbridge.sweep.current(), typed
    values = msbridge.sweep.current()
    unknown = [a for a in trial_args if a.split("=", 1)[0][2:] not in values]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    cfg = demo_config(os.path.abspath(args.out), {"experiment": "demo-sweep", "sinks": args.sinks.split(","),
                                                  "flush_steps": 25})
    cfg["params"] = msbridge.sweep.with_values(cfg["params"], values)
    cfg["params"]["train"]["eval_every"] = args.eval_every
    monitor = BridgeMonitor(cfg, progress=False)
    train(monitor, args.steps, monitor.config.params)
    return exit_status(monitor)


if __name__ == "__main__":
    sys.exit(main())
