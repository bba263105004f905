"""The step rate beside a sink blocked in ``open``, against the same training with no such sink.

Each repeat trains a small MindSpore model twice with ``Model.train`` on this CPU, in this process, interleaved
(A B, then B A the next repeat): A with jsonl alone, B with jsonl and a sink whose ``open`` never returns until
the run has closed. The step rate is measured between the ends of the first and the last step (graph compile
left out). Prints every run's figure, the medians and the median of the paired ratios B/A.

Example:
    $ python -m msbridge.bench.blocked_open --repeats 6 --steps 3000
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from statistics import median
from typing import Any, Dict, List

from ..options import Option
from ..sinks.base import Sink


class BlockedOpen(Sink):
    """A sink whose ``open`` waits until ``release`` is set: a tracker that never answers."""

    name = "blocked_open"
    options = {"close_timeout": Option(float, 0.5, "seconds its close may take (the bench's own close is short)",
                                       low=0, low_open=True)}
    release = threading.Event()

    def open(self, run: Any) -> None:
        self.release.wait(600)

    def write(self, records: Any, events: Any) -> None:
        return None


def train_once(work: str, label: str, steps: int, blocked: bool) -> float:
    """One ``Model.train`` of ``steps`` steps; its steps per second after the first step."""
    import mindspore as ms
    import mindspore.dataset as ds
    import numpy as np
    from mindspore import nn
    from mindspore.train import Callback, Model

    from ..callback import BridgeMonitor

    class StepEnds(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: List[float] = []

        def on_train_step_end(self, run_context: Any) -> None:
            self.ends.append(time.perf_counter())

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 32, 64)).astype(np.float32)
    y = (x @ rng.normal(size=(64, 1))).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32, drop_remainder=True)
    net = nn.SequentialCell(nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 1))
    config = {"experiment": "bench-blocked-open", "run_name": label, "flush_steps": 10, "sinks": ["jsonl"],
              "output_dir": os.path.join(work, "{experiment}", "{run_name}")}
    BlockedOpen.release.clear()
    monitor = BridgeMonitor(config, sinks=[BlockedOpen()] if blocked else [], progress=False)
    ends = StepEnds()
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
        1, data, callbacks=[monitor, ends], dataset_sink_mode=False)
    BlockedOpen.release.set()
    return (len(ends.ends) - 1) / (ends.ends[-1] - ends.ends[0])


def run(repeats: int, steps: int, work: str) -> Dict[str, Any]:
    """Every run's steps/s, interleaved; the medians and the median paired ratio blocked / none."""
    rates: Dict[str, List[float]] = {"none": [], "blocked": []}
    for repeat in range(repeats):
        order = ("none", "blocked") if repeat % 2 == 0 else ("blocked", "none")
        for setup in order:
            rate = train_once(work, f"{setup}-{repeat}", steps, setup == "blocked")
            rates[setup].append(rate)
            print(f"repeat {repeat} {setup:8s} {rate:8.1f} steps/s", flush=True)
    ratios = [b / a for a, b in zip(rates["none"], rates["blocked"])]
    return {"none": median(rates["none"]), "blocked": median(rates["blocked"]), "ratio": median(ratios),
            "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="pairs of runs, interleaved (default 6)")
    parser.add_argument("--steps", type=int, default=3000, help="steps per run (default 3000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="msbridge-bench-") as work:
        got = run(args.repeats, args.steps, work)
    print(f"median steps/s: none {got['none']:.1f}, beside a sink blocked in open {got['blocked']:.1f}; "
          f"median paired ratio {got['ratio']:.3f} (ratios {', '.join(f'{r:.3f}' for r in got['ratios'])})")


if __name__ == "__main__":
    main()
