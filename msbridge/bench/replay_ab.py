"""``msbridge replay`` of one long synthetic run into each sink, this checkout against an older msbridge,
interleaved (old, new per sink and repeat): wall seconds, CPU seconds and peak RSS of each replay.

The run is ``msbridge.bench.long``'s (rank 0 of a data-parallel job, 20 metrics a step), built once; each replay
gets a fresh copy of it, so every sink starts empty. Peak RSS and CPU are ``long.timed``'s: the replay
process's own rusage, with the processes it waited for (MLflow's child). The older msbridge is ``git archive``
of ``--old`` put first on ``PYTHONPATH`` (``firstpoint.old_tree``).

Example:
    $ python -m msbridge.bench.replay_ab --steps 500000 --old 1e8640c --out /tmp/replay-ab
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from statistics import median
from typing import Any, Dict, List, Sequence

from .firstpoint import old_tree
from .long import EXPERIMENT, RUN_NAME, timed

SINKS = ("tensorboard", "mindinsight", "mlflow")


def replay_once(setup: str, sink: str, run_dir: str, root: str, pythonpath: str) -> Dict[str, Any]:
    """One replay of a fresh copy of ``run_dir`` into ``sink``; the copy is removed afterwards."""
    work = os.path.join(root, f"{setup}-{sink}")
    copy = os.path.join(work, EXPERIMENT, RUN_NAME)
    shutil.copytree(run_dir, copy)
    argv = ["replay", copy, "--to", sink]
    if sink == "mlflow":
        argv += ["--tracking-uri", f"sqlite:///{os.path.join(work, EXPERIMENT, 'mlflow.db')}"]
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath
    try:
        row = timed(f"{setup}-{sink}", argv, root, timeout=3600.0)
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before
    shutil.rmtree(work)
    return dict(row, setup=setup, sink=sink, load=os.getloadavg()[0])


def table(rows: List[Dict[str, Any]]) -> List[str]:
    """Medians per sink and setup as a markdown table."""
    lines = ["| sink | setup | replays | wall s | CPU s | peak RSS MB |", "|---|---|---|---|---|---|"]
    for sink in SINKS:
        for setup in ("old", "new"):
            mine = [r for r in rows if r["sink"] == sink and r["setup"] == setup and not r["exit"]]
            if mine:
                lines.append(f"| {sink} | {setup} | {len(mine)} | {median(r['seconds'] for r in mine):.1f} | "
                             f"{median(r['cpu_s'] for r in mine):.1f} | {median(r['peak_mb'] for r in mine):.0f} |")
    return lines


def main(argv: Sequence[str] = ()) -> int:
    """Build the run once, then replay it old/new into each sink ``--repeats`` times; print the table."""
    parser = argparse.ArgumentParser(prog="python -m msbridge.bench.replay_ab", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--old", default="main", help="the older msbridge's git revision")
    parser.add_argument("--sinks", default=",".join(SINKS))
    parser.add_argument("--out", default="./bench_replay_ab")
    args = parser.parse_args(list(argv) or None)
    root = os.path.abspath(args.out)
    os.makedirs(root, exist_ok=True)
    subprocess.run([sys.executable, "-m", "msbridge.bench.long", "--build-only", "--steps", str(args.steps),
                    "--out", os.path.join(root, "built")], check=True)
    run_dir = os.path.join(root, "built", EXPERIMENT, RUN_NAME)
    old = old_tree(args.old, root) if not os.path.isdir(os.path.join(root, "old")) else os.path.join(root, "old")
    rows: List[Dict[str, Any]] = []
    for _ in range(args.repeats):
        for sink in args.sinks.split(","):
            for setup, path in (("old", old), ("new", "")):
                rows.append(replay_once(setup, sink, run_dir, root, path))
                print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(root, "bench_replay_ab.json"), "w", encoding="utf-8") as handle:
        json.dump(rows, handle, indent=1)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
