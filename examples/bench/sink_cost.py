"""What each sink costs: CPU time per 1000 records and wall time of flush(), printed as a table.

    python examples/bench/sink_cost.py [--records 1000] [--repeats 5]

Each sink writes the same records (13 metrics each, the rank-0 set) in batches of 100, as
the dispatcher hands them over, into a fresh temp dir per repeat; the figures are medians.
MindSpore is imported first, as in training: it selects protobuf's pure-Python runtime,
which is what TensorBoard and MindInsight serialise with during a real run. CPU is counted
apart for this process (what shares the training process's GIL) and for a sink's child
processes (MLflow's client).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Dict, List

import mindspore  # noqa: F401  (the protobuf runtime of a real training process)

from msbridge.bench.probes import live_children_cpu_s
from msbridge.sinks.base import Record, RunInfo
from msbridge.sinks.registry import BUILTINS, resolve

NAMES = ["train/loss", "train/loss_ema", "train/global_loss", "train/lr", "train/grad_norm", "train/epoch",
         "perf/step_time_ms", "perf/samples_per_s", "perf/tokens_per_s", "perf/monitor_overhead",
         "dist/loss_min", "dist/loss_max", "dist/loss_std"]


def records(count: int) -> List[Record]:
    return [Record(s, 0, time.time(), {n: 1.0 / s + i for i, n in enumerate(NAMES)}) for s in range(1, count + 1)]


def measure(name: str, batch: List[Record]) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = RunInfo(run_id="bench", run_name="bench", experiment="bench", rank=0, world_size=1,
                      is_global=True, run_dir=f"{tmp}/bench/bench", config={"params": {"lr": 0.1}})
        sink = resolve(name)()
        sink.open(run)
        sink.write(batch[:1], [])  # first contact (MLflow creates its database here), not counted
        sink.flush()
        cpu, child = time.process_time(), live_children_cpu_s()
        for start in range(1, len(batch), 100):
            sink.write(batch[start:start + 100], [])
        cpu, child = time.process_time() - cpu, live_children_cpu_s() - child
        wall = time.perf_counter()
        sink.flush()
        flush = time.perf_counter() - wall
        sink.close("FINISHED")
    per_1000 = 1e3 * 1000 / (len(batch) - 1)
    return {"cpu_ms_per_1000": cpu * per_1000, "child_ms_per_1000": child * per_1000, "flush_ms": flush * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    batch = records(args.records + 1)
    results: Dict[str, List[Dict[str, float]]] = {name: [] for name in BUILTINS}
    for _ in range(args.repeats):  # interleaved: a b c d, a b c d ...
        for name in BUILTINS:
            results[name].append(measure(name, batch))
    print(f"| sink | CPU ms per 1000 records, this process (median of {args.repeats}) | "
          "... in child processes | flush() wall ms (median) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cpu, child, flush = (statistics.median(r[k] for r in runs)
                             for k in ("cpu_ms_per_1000", "child_ms_per_1000", "flush_ms"))
        print(f"| {name} | {cpu:.1f} | {child:.1f} | {flush:.2f} |")


if __name__ == "__main__":
    main()
