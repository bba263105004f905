"""What the cross-rank collective costs per flush, at 2 and 4 ranks, against the same training without msbridge.

    python examples/distributed/bench_collective.py --ranks 2 4

For each world size it launches one ``msrun`` job of this file. Every rank:

1. trains a data-parallel ``nn.Dense`` regressor in rounds of ``--steps`` steps:
   without msbridge, with ``BridgeMonitor`` (jsonl, ``flush_steps=--flush``) but its
   reduction skipped ("local"), and with it whole; the order rotates every round and
   the mean step time of each segment is kept;
2. times every ``Reducer.reduce`` inside those flushes (this includes waiting
   for the slowest rank to reach the flush);
3. times ``--calls`` back-to-back ``Reducer.reduce`` calls on a window of
   ``--flush`` steps: the collective alone, ranks already in step.

It prints medians over rounds and ranks. The step is tiny (a few ms), so the
relative overhead is a worst case; the absolute cost per flush is what carries
over to a real model.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from statistics import median
from typing import Any, Dict, List

os.environ.setdefault("GLOG_v", "3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- driver ------------------------------------------------------------------------------------------------------

def launch(ranks: int, args: argparse.Namespace, work: str) -> List[Dict[str, Any]]:
    """One msrun job of this file as the worker; returns every rank's measurements."""
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    out = os.path.join(work, f"ranks{ranks}")
    cmd = [os.path.join(bin_dir, "msrun"), f"--worker_num={ranks}", f"--local_worker_num={ranks}",
           f"--master_port={free_port()}", f"--log_dir={out}/logs", "--join=True", os.path.abspath(__file__),
           "--measure", "--out", out, "--steps", str(args.steps), "--flush", str(args.flush),
           "--rounds", str(args.rounds), "--calls", str(args.calls)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"msrun with {ranks} ranks failed; logs in {out}/logs\n{(proc.stdout + proc.stderr)[-2000:]}")
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "result_rank*.json")))]


KINDS = ("without", "local", "with")


def summarise(ranks: int, results: List[Dict[str, Any]], flush: int) -> str:
    """Step times as medians of per-round differences to the round's run without msbridge (drift cancels)."""
    base = median(v for r in results for v in r["without_ms"])
    delta = {kind: median(k - w for r in results for k, w in zip(r[f"{kind}_ms"], r["without_ms"]))
             for kind in ("local", "with")}
    in_training = median(v for r in results for v in r["reduce_in_training_ms"])
    isolated = median(v for r in results for v in r["reduce_isolated_ms"])
    return (f"{ranks} ranks | step {base:.3f} ms without msbridge; msbridge adds {delta['with'] * 1e3:+.0f} us "
            f"({delta['with'] / base:+.1%}), of which local-only work {delta['local'] * 1e3:+.0f} us"
            f" | reduce per flush: {isolated:.3f} ms alone, {in_training:.3f} ms in training"
            f" = {isolated / flush * 1e3:.1f} us per step at flush_steps={flush}")


def drive(args: argparse.Namespace) -> None:
    work = args.out or tempfile.mkdtemp(prefix="msbridge-bench-")
    print(f"steps/segment {args.steps}, flush_steps {args.flush}, rounds {args.rounds}, "
          f"isolated calls {args.calls}; logs and results in {work}")
    for ranks in args.ranks:
        print(summarise(ranks, launch(ranks, args, work), args.flush), flush=True)


# -- worker (one rank under msrun) -------------------------------------------------------------------------------

def work(args: argparse.Namespace) -> None:
    import mindspore as ms
    import mindspore.dataset as ds
    import numpy as np
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.context import ParallelMode
    from mindspore.train import Callback, Model

    from msbridge import BridgeMonitor
    from msbridge.capture.window import Window
    from msbridge.names import LOSS

    class StepClock(Callback):
        """Host time at every step end; the mean step of a segment leaves its first step (start-up) out."""

        def __init__(self) -> None:
            super().__init__()
            self.ends: List[float] = []

        def on_train_step_end(self, run_context: Any) -> None:
            self.ends.append(time.perf_counter())

        def mean_ms(self) -> float:
            return (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1) * 1e3

    reduce_ms: List[float] = []

    class TimedMonitor(BridgeMonitor):
        """BridgeMonitor that adds how long each of its reductions took to ``reduce_ms``, or skips them."""

        def __init__(self, config: Dict[str, Any], reduce: bool) -> None:
            super().__init__(config, progress=False)
            self.reduce = reduce

        def on_train_begin(self, run_context: Any) -> None:
            super().on_train_begin(run_context)
            reduce = self._reducer.reduce

            def timed(window: Window) -> None:
                start = time.perf_counter()
                reduce(window)
                reduce_ms.append((time.perf_counter() - start) * 1e3)

            self._reducer.reduce = timed if self.reduce else (lambda window: None)

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * 8 * world, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, 1))).astype(np.float32)
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))

    def segment(monitor: Any) -> float:
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(8)
        clock = StepClock()
        model.train(1, data, callbacks=[clock] + ([monitor] if monitor else []), dataset_sink_mode=False)
        return clock.mean_ms()

    def monitor(name: str, reduce: bool = True) -> Any:
        return TimedMonitor({"experiment": "bench", "run_name": name, "flush_steps": args.flush,
                             "output_dir": os.path.join(args.out, "runs", "{experiment}", "{run_name}")}, reduce)

    segment(None)  # compile and warm up
    result: Dict[str, Any] = {"rank": rank, **{f"{kind}_ms": [] for kind in KINDS}}
    for i in range(args.rounds):
        for kind in KINDS[i % 3:] + KINDS[:i % 3]:
            mon = None if kind == "without" else monitor(f"{kind}{i}", reduce=kind == "with")
            result[f"{kind}_ms"].append(segment(mon))
    result["reduce_in_training_ms"] = reduce_ms

    last = monitor("isolated")
    segment(last)  # leaves a built reducer behind
    steps = np.arange(1, args.flush + 1)
    window = Window(steps=steps, epochs=np.ones_like(steps), wall_time=np.zeros(args.flush),
                    step_time_s=np.zeros(args.flush), monitor_s=np.zeros(args.flush),
                    scalars={LOSS: rng.normal(size=args.flush)})
    isolated = []
    for _ in range(args.calls + 1):
        start = time.perf_counter()
        last._reducer.reduce(window)
        isolated.append((time.perf_counter() - start) * 1e3)
    result["reduce_isolated_ms"] = isolated[1:]  # the first call also waits for the slowest rank
    with open(os.path.join(args.out, f"result_rank{rank}.json"), "w") as fh:
        json.dump(result, fh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=400, help="steps per segment")
    parser.add_argument("--flush", type=int, default=50, help="flush_steps")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of without/local/with, order rotating")
    parser.add_argument("--calls", type=int, default=50, help="back-to-back reductions timed alone")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one msrun job may take")
    parser.add_argument("--out", default="", help="work dir (default: a new temp dir)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one rank, under msrun
    args = parser.parse_args()
    (work if args.measure else drive)(args)


if __name__ == "__main__":
    main()
