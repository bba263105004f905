"""One rank of a real data-parallel job on CPU, launched by ``msrun`` from tests/metrics/test_cross_rank.py.

Every rank trains an ``nn.Dense`` regressor on its own shard with
``BridgeMonitor``; options make one rank's data harder, one rank's batch
bigger, one rank start late, leave at a step, run slow, stall once or turn NaN;
``--eval`` runs ``Model.fit`` with a validation set of its own per rank.

Example:
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=logs --join=True \\
        tests/helpers/dist_worker.py --out runs --steps 20 --flush 5 --sinks jsonl,mlflow --hard-rank 1
"""
from __future__ import annotations

import argparse
import os
import time
from collections import deque
from typing import Any, Deque, List

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.train import Callback, Model

from msbridge import BridgeMonitor, ConfigError
from msbridge.run.ranks import detect_ranks
from msbridge.sinks.base import Sink

FEATURES = 16


class ExitAt(Callback):
    """Ends this process with ``os._exit(code)`` at the end of ``step``: a rank that crashes or leaves."""

    def __init__(self, step: int, code: int) -> None:
        super().__init__()
        self.step, self.code = step, code

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num == self.step:
            os._exit(self.code)


class Delay(Callback):
    """Slows this rank before each step begins, as a slow data pipeline would: from ``from_step`` on by ``pct``
    percent of what a step takes without the delay (the median of the recent ones), and once by ``stall_s``
    seconds at ``stall_step``."""

    def __init__(self, pct: float = 0.0, from_step: int = 1, stall_step: int = 0, stall_s: float = 0.0) -> None:
        super().__init__()
        self.pct, self.from_step, self.stall_step, self.stall_s = pct, from_step, stall_step, stall_s
        self._periods: Deque[float] = deque(maxlen=5)
        self._last = 0.0
        self._slept = 0.0

    def on_train_step_begin(self, run_context: Any) -> None:
        now = time.perf_counter()
        step = run_context.original_args().cur_step_num
        if step > 2:  # step 1 compiles the graph: not a step time
            self._periods.append(now - self._last - self._slept)
        delay = self.pct / 100 * float(np.median(self._periods)) if step >= self.from_step and self._periods else 0.0
        if step == self.stall_step:
            delay += self.stall_s
        self._last, self._slept = now, delay
        if delay:
            time.sleep(delay)


class CountSamples(Callback):
    """Counts the samples this rank's steps consumed (each batch's leading dimension), written to ``path`` at the
    end: the dataset's own count."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path, self.samples = path, 0

    def on_train_step_end(self, run_context: Any) -> None:
        self.samples += int(run_context.original_args().train_dataset_element[0].shape[0])

    def on_train_end(self, run_context: Any) -> None:
        with open(self.path, "w", encoding="utf-8") as fh:
            fh.write(str(self.samples))


class StatusSink(Sink):
    """Writes the status this rank's monitor closed its sinks with to ``path``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def write(self, records: Any, events: Any) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        with open(self.path, "w", encoding="utf-8") as fh:
            fh.write(status)


def shard(rank: int, world: int, steps: int, batch: int, widest: int, label_scale: float) -> ds.Dataset:
    """This rank's shard of one shared data set, ``steps`` batches of ``batch`` samples."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * widest * world, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=(FEATURES, 1))).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
    if label_scale != 1.0:
        data = data.map(lambda label: label * np.float32(label_scale), input_columns=["y"])
    return data.batch(batch, drop_remainder=True).take(steps)


def poison(data: ds.Dataset, step: int) -> ds.Dataset:
    """The same batches, with NaN inputs at ``step`` (1-based): this rank's loss turns NaN there."""
    batches = [dict(item) for item in data.create_dict_iterator(output_numpy=True)]
    batches[step - 1]["x"] = np.full_like(batches[step - 1]["x"], np.nan)
    return ds.GeneratorDataset(lambda: ((b["x"], b["y"]) for b in batches), ["x", "y"], shuffle=False)


def parse_args(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="output root; runs go to {out}/dist/dist-{timestamp}")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--flush", type=int, default=5)
    p.add_argument("--batches", default="8", help="batch size per rank, comma-separated (one value: all ranks)")
    p.add_argument("--sinks", default="jsonl")
    p.add_argument("--hard-rank", type=int, default=-1, help="this rank's labels are scaled by 3")
    p.add_argument("--late-rank", type=int, default=-1, help="this rank creates its monitor 1.5 s late")
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--exit-step", type=int, default=0)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="the collective's watchdog timeout, seconds")
    p.add_argument("--reduce-ranks", default="", help="comma-separated reduction group (default: all ranks)")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank waits --slow-pct longer before every step")
    p.add_argument("--slow-pct", type=float, default=30.0)
    p.add_argument("--slow-from", type=int, default=1, help="the first step --slow-rank is slow at")
    p.add_argument("--stall-rank", type=int, default=-1, help="this rank stalls once, at --stall-step")
    p.add_argument("--stall-step", type=int, default=0)
    p.add_argument("--stall-s", type=float, default=2.0)
    p.add_argument("--nan-rank", type=int, default=-1, help="this rank's inputs are NaN at --nan-step")
    p.add_argument("--nan-step", type=int, default=0)
    p.add_argument("--health", default="", help="health section as key=value,... (nonfinite.action=stop)")
    p.add_argument("--alert-url", default="", help="alerts to this webhook (msbridge.alerts), with --stall-seconds")
    p.add_argument("--stall-seconds", type=float, default=None)
    p.add_argument("--status", action="store_true", help="write each rank's closing status to {out}/status_{rank}.txt")
    p.add_argument("--eval", action="store_true",
                   help="Model.fit over 2 epochs, evaluated after each on 4·(rank+1) validation samples of this rank")
    p.add_argument("--seq-length", type=int, default=None, help="the monitor's seq_length (perf/tokens_seen)")
    p.add_argument("--flops-per-sample", type=float, default=None, help="the flops_per_sample setting")
    p.add_argument("--count", action="store_true", help="write the samples consumed to {out}/samples_{rank}.txt")
    p.add_argument("--check-ranks", action="store_true",
                   help="write what detect_ranks says to a contradicting RANK_ID to {out}/rank_check_{rank}.txt")
    return p.parse_args(argv)


def main(argv: Any = None) -> None:
    args = parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    if args.check_ranks:
        check_ranks(args.out, rank, world)
    batches: List[int] = [int(b) for b in args.batches.split(",")]
    batches = batches * world if len(batches) == 1 else batches
    data = shard(rank, world, args.steps, batches[rank], max(batches), 3.0 if rank == args.hard_rank else 1.0)
    if rank == args.nan_rank:
        data = poison(data, args.nan_step)

    if rank == args.late_rank:
        time.sleep(1.5)  # without a shared timestamp this rank would name another run dir
    monitor = BridgeMonitor({"experiment": "dist", "run_name": "dist-{timestamp}",
                             "output_dir": os.path.join(args.out, "{experiment}", "{run_name}"),
                             "flush_steps": args.flush, "sinks": args.sinks.split(","),
                             "collective_timeout_s": args.timeout, "seq_length": args.seq_length,
                             "flops_per_sample": args.flops_per_sample,
                             "reduce_ranks": [int(r) for r in args.reduce_ranks.split(",")] if args.reduce_ranks else None,
                             "alerts": {"targets": [{"type": "webhook", "url": args.alert_url}] if args.alert_url else [],
                                        "stall_seconds": args.stall_seconds}},
                            overrides=[f"health.{kv}" for kv in args.health.split(",") if kv], progress=False,
                            sinks=[StatusSink(os.path.join(args.out, f"status_{rank}.txt"))] if args.status else ())
    callbacks: List[Callback] = [monitor]
    if rank in (args.slow_rank, args.stall_rank):  # before the monitor: its wait counts as this rank's data wait
        callbacks.insert(0, Delay(args.slow_pct if rank == args.slow_rank else 0.0, args.slow_from,
                                  args.stall_step if rank == args.stall_rank else 0, args.stall_s))
    if args.count:
        callbacks.append(CountSamples(os.path.join(args.out, f"samples_{rank}.txt")))
    if rank == args.exit_rank:
        callbacks.insert(0, ExitAt(args.exit_step, args.exit_code))  # before the monitor: it never flushes step k

    ms.set_seed(0)
    net = nn.Dense(FEATURES, 1)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)
    if not args.eval:
        Model(net, nn.MSELoss(), optimizer).train(1, data, callbacks=callbacks, dataset_sink_mode=False)
        return
    model = Model(net, nn.MSELoss(), optimizer, metrics={"loss": nn.Loss(), "mae": nn.MAE()})
    model.fit(2, data, valid_dataset=validation(rank), valid_frequency=1, callbacks=callbacks, dataset_sink_mode=False)


def validation(rank: int) -> ds.Dataset:
    """This rank's own validation samples, 4·(rank+1) of them in batches of 4: the ranks' counts differ."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(4 * (rank + 1), FEATURES)).astype(np.float32)
    y = (x @ np.random.default_rng(0).normal(size=(FEATURES, 1))).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4, drop_remainder=True)


def check_ranks(out: str, rank: int, world: int) -> None:
    """Ask ``detect_ranks`` with a RANK_ID that contradicts the communication group; keep its answer."""
    try:
        answer = repr(detect_ranks({"RANK_ID": str((rank + 1) % world), "RANK_SIZE": str(world)}))
    except ConfigError as exc:
        answer = f"ConfigError: {exc}"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank_check_{rank}.txt"), "w", encoding="utf-8") as fh:
        fh.write(answer)


if __name__ == "__main__":
    main()
