"""Does CPU used at idle priority still cost training? Trains bench setup (a) with and without a
second process that burns a share of one core at nice 19 and ``SCHED_IDLE`` (as MLflow's child runs),
interleaved, and prints each run's throughput and the median ratio.

    python examples/bench/idle_class_cost.py [--duty 0.15] [--repeats 4] [--steps 600]

If ``SCHED_IDLE`` kept that CPU out of training's way the ratio would be ~1.0. On this project's
2-vCPU VM, 15% of a core (2 ms of every 12) cost training 16% and 22% in two runs
(``adapters/mlflow_tracker/client/sched.py``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from statistics import median

from msbridge.bench.suite import run_one


def burn(duty: float, period: float = 0.012) -> None:
    """Busy ``duty`` of every ``period`` seconds in Python, at idle priority; runs until killed."""
    os.nice(19)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    work: dict = {}
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < duty * period:
            for i in range(200):
                work[i] = str(i) * 3
        time.sleep(period * (1 - duty))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duty", type=float, default=0.15)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--burn", action="store_true", help=argparse.SUPPRESS)  # the burner itself
    args = parser.parse_args()
    if args.burn:
        burn(args.duty)
    out = tempfile.mkdtemp(prefix="idle-class-")
    os.makedirs(os.path.join(out, "logs"))
    speeds = {"alone": [], "burner": []}
    for rep in range(args.repeats):
        for mode in (("alone", "burner") if rep % 2 == 0 else ("burner", "alone")):
            burner = None
            if mode == "burner":
                burner = subprocess.Popen([sys.executable, __file__, "--burn", "--duty", str(args.duty)])
            try:
                result = run_one("a", args.steps, 7, out, f"{mode}{rep}", 0.0, False)
            finally:
                if burner is not None:
                    burner.kill()
                    burner.wait()
            if "error" in result:
                raise SystemExit(f"setup (a) failed: {result['error']} (logs in {out})")
            speeds[mode].append(result["steps_per_s"])
            print(f"repeat {rep + 1}: {mode:<6} {result['steps_per_s']:.1f} steps/s", flush=True)
    ratios = [b / a for a, b in zip(speeds["alone"], speeds["burner"])]
    print(f"with an idle-class burner at {args.duty:.0%} of a core: {median(ratios):.3f} of training alone "
          f"(repeats {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
