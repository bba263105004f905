"""One benchmark setup in a fresh process: train the demo model once and print what it cost as JSON.

``msbridge.bench.suite`` starts this module once per setup and repeat; the setups
share the model, data and seed and differ only in the train cell and the
callbacks. Timings come from a step-end timestamp callback that is first in
every setup's list, so it costs the same everywhere.

Example:
    $ python -m msbridge.bench.worker --setup e --steps 300 --seed 7 --work /tmp/w --result /tmp/w/e.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Tuple

from mindspore.train import Callback

from ..errors import exception_text
from .hookclock import HookClock, grown, python_threads_cpu, thread_names
from .probes import live_children_cpu_s, mlflow_child_rss_mb, process_cpu_s, rss_mb, threads_cpu_s
from .suite import DEFAULT_HIDDEN, SETUPS

MODEL = {"vocab_size": 64, "num_layers": 2, "num_heads": 4, "seq_length": 32}
BATCH = 8
SINK_SIZE = 20
#: The learning-rate schedule of every setup: ``nn.WarmUpLR(peak, warmup steps)``.
LR_PEAK, LR_WARMUP = 0.003, 20
#: Setups whose train cell is ``TrainStep`` (the device ring); the others train ``nn.TrainOneStepCell``
#: or mindformers' cell.
TRAIN_STEP_SETUPS = ("a_ts", "g", "ln", "hist")
#: Setups that train mindformers' train cell (MFLossMonitor reads its overflow flag and gradient norm): a step of
#: 2.4 s on CPU here (40 steps, 2026-12-06), so the peer ``p_mf`` trains ``_mf_outputs_cell`` instead.
MF_CELL_SETUPS = ("a_mf", "d_mf")


class _Timer(Callback):
    """Step-end timestamps; optionally stalls once (training idle) and measures CPU over the stall."""

    def __init__(self, cpu_at: Tuple[int, int], stall_at: int = 0, stall_s: float = 2.0, settle_s: float = 1.0,
                 rss_every: int = 0, clock: Any = None) -> None:
        super().__init__()
        self.clock = clock or HookClock()
        self.own: List[Tuple[float, Dict[int, float], float, float]] = []  # CPU: hooks', Python threads', training
        # thread's; the hooks' wall time
        self.names: Dict[int, str] = {}  # thread id -> name, at the last mark
        self.times: List[Tuple[int, float]] = []
        self.cpu_at = cpu_at  # steady state: from the end of warm-up to the last step
        self.cpu: List[float] = []
        self.beside: List[Tuple[Any, float]] = []  # (msbridge's own threads, child processes): CPU s at cpu_at
        self.stall_at, self.stall_s, self.settle_s = stall_at, stall_s, settle_s
        self.idle_cpu_per_s = None
        self.children_rss_mb = None
        self.stalled_s = 0.0
        self.rss_every = rss_every
        self.rss: List[Tuple[int, float]] = []
        self.cpu_first_step = self.cpu_last_step = self.wall_last_step = None
        self.mlflow_child_rss_mb = None

    def on_train_step_end(self, run_context: Any) -> None:
        step = int(run_context.original_args().cur_step_num)
        self.times.append((step, time.perf_counter()))
        if self.cpu_first_step is None:  # start-up: imports, graph compile, sinks opened, one step
            self.cpu_first_step = process_cpu_s()
        if len(self.cpu) < 2 and step >= self.cpu_at[len(self.cpu)]:
            self.cpu.append(process_cpu_s())
            self.beside.append((threads_cpu_s("msbridge-"), live_children_cpu_s()))  # sinks, watchdog; MLflow's child
            self.own.append((self.clock.spent_s, python_threads_cpu(), time.thread_time(), self.clock.wall_s))
            self.names = thread_names()
        if self.rss_every and (step % self.rss_every == 0 or step == 1000):
            self.rss.append((step, rss_mb()))
        if step >= self.cpu_at[1]:
            self.cpu_last_step, self.wall_last_step = process_cpu_s(), time.perf_counter()
            run_context.request_stop()  # the last epoch may run past the steps asked for
        if self.stall_at and step >= self.stall_at and not self.stalled_s:
            start = time.perf_counter()
            time.sleep(self.settle_s)  # let in-flight sink writes finish: what follows is idle
            cpu0, t0 = process_cpu_s(), time.perf_counter()
            time.sleep(self.stall_s)
            self.idle_cpu_per_s = (process_cpu_s() - cpu0) / (time.perf_counter() - t0)
            self.children_rss_mb = rss_mb(children=True)
            self.mlflow_child_rss_mb = mlflow_child_rss_mb()
            self.stalled_s = time.perf_counter() - start


class _MlflowPerStep(Callback):
    """What many training scripts do: ``mlflow.log_metric`` of the loss after every step."""

    def __init__(self, work: str) -> None:
        super().__init__()
        self.uri = f"sqlite:///{os.path.join(work, 'mlflow.db')}"

    def on_train_begin(self, run_context: Any) -> None:
        import mlflow

        mlflow.set_tracking_uri(self.uri)
        mlflow.set_experiment("bench")
        mlflow.start_run()

    def on_train_step_end(self, run_context: Any) -> None:
        import mlflow

        cb = run_context.original_args()
        mlflow.log_metric("loss", float(cb.net_outputs.asnumpy()), step=int(cb.cur_step_num))

    def on_train_end(self, run_context: Any) -> None:
        import mlflow

        mlflow.end_run()


def _msbridge(work: str, sinks: Any, tracking_uri: str = "", **settings: Any) -> Any:
    """msbridge with its default settings (flush every 100 steps or 10 s) plus ``settings``; ``sinks=None``:
    every installed sink; ``tracking_uri``: the MLflow sink logs there (a server) instead of its sqlite file."""
    from ..callback import BridgeMonitor

    if sinks is None:
        sinks = _msbridge_sinks(work)
    if tracking_uri:
        sinks = {name: {"tracking_uri": tracking_uri} if name == "mlflow" else {} for name in sinks}
    return BridgeMonitor({"experiment": "bench", "run_name": "run", "sinks": sinks, "seq_length": 32,
                          "output_dir": os.path.join(work, "runs", "{experiment}", "{run_name}"), **settings})


def _msbridge_sinks(work: str) -> Any:
    """Every installed sink (the demo's)."""
    from ..demo import demo_config

    return demo_config(work)["sinks"]


def npu_smi_table(chips: int = 8) -> str:
    """An ``npu-smi info`` table in the training-server layout (HBM-Usage column), ``chips`` busy 910B3 chips."""
    rule = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"
    lines = ["| npu-smi 23.0.6                   Version: 23.0.6" + " " * 48 + "|",
             "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
             "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |", rule]
    for i in range(chips):
        lines += [f"| {i:<5} {'910B3':<20}| {'OK':<14}| {92.5 + i:<11.1f} {40 + i:<17} {'0    / 0':<21}|",
                  f"| {0:<26}| {f'0000:{i:02X}:00.0':<14}| {70 + i:<11} {'0    / 0':<17} {f'{30000 + i} / 65536':<21}|",
                  rule]
    return "\n".join(lines) + "\n"


def fake_npu_smi(work: str) -> str:
    """A shell ``npu-smi`` that prints ``npu_smi_table()`` (there is no NPU here), first on PATH; its dir."""
    bin_dir = os.path.join(work, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    with open(os.path.join(bin_dir, "npu-smi.txt"), "w") as fh:
        fh.write(npu_smi_table())
    script = os.path.join(bin_dir, "npu-smi")
    with open(script, "w") as fh:
        fh.write(f'#!/bin/sh\ncat "{bin_dir}/npu-smi.txt"\n')
    os.chmod(script, 0o755)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    return bin_dir


def _mindformers(work: str, steps: int, lr: Any) -> List[Any]:
    """MFLossMonitor + TrainingStateMonitor writing to tensorboard through mindformers' global writer."""
    from mindformers.core.callback.callback import TrainingStateMonitor

    from .peers import mindformers_loss_monitor

    return [*mindformers_loss_monitor(work, steps, lr, BATCH),
            TrainingStateMonitor(origin_epochs=1, dataset_size=steps, global_batch_size=BATCH,
                                 config={"local_loss_format": "tensorboard"})]


def _mindformers_cell(loss_net: Any, optimizer: Any) -> Any:
    """mindformers' train cell on CPU: the overflow check done with IsFinite/ReduceAll, no clipping in effect."""
    from mindformers.wrapper import MFTrainOneStepCell
    from mindspore import ops

    class CpuMFTrainOneStepCell(MFTrainOneStepCell):
        def get_overflow_status(self, status, compute_output):
            return ops.logical_not(ops.stack([ops.isfinite(g).all() for g in compute_output]).all())

    return CpuMFTrainOneStepCell(loss_net, optimizer, use_clip_grad=True, max_grad_norm=1e9, scale_sense=1.0)


def _mf_outputs_cell(loss_net: Any, optimizer: Any) -> Any:
    """``nn.TrainOneStepCell`` returning what mindformers' cell returns to MFLossMonitor: loss, overflow (never on
    CPU in fp32), loss scale 1, learning rate and the gradients' global norm."""
    from mindspore import nn, ops

    class MFOutputsCell(nn.TrainOneStepCell):
        def construct(self, *inputs):
            loss = self.network(*inputs)
            grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
            norm = ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads]))
            loss = ops.depend(loss, self.optimizer(grads))
            return loss, ops.zeros((), ms.bool_), ops.ones((), ms.float32), self.optimizer.get_lr(), norm

    import mindspore as ms

    return MFOutputsCell(loss_net, optimizer)


def _scalar_lr(lr: Any) -> Any:
    """The same schedule returning a scalar: MFLossMonitor turns a shape-(1,) lr into '[x]' and float() fails."""
    from mindspore.nn.learning_rate_schedule import LearningRateSchedule

    class ScalarLR(LearningRateSchedule):
        def __init__(self) -> None:
            super().__init__()
            self.inner = lr

        def construct(self, step: Any) -> Any:
            return self.inner(step).reshape(())

    return ScalarLR()


def _summary(work: str, freq: int) -> Any:
    from mindspore.train import SummaryCollector

    # collect_dataset_graph crashes under protobuf 7 (DESIGN.md); everything else stays at its default.
    return SummaryCollector(os.path.join(work, "summary"), collect_freq=freq,
                            collect_specified_data={"collect_dataset_graph": False})


def _with_fake_npu_smi(work: str) -> Any:
    fake_npu_smi(work)
    return _msbridge(work, ["jsonl"], system={"interval_s": 1})


#: The hung webhook's listening socket of setup ``e_alert``: open, never accepted, for the process's life.
_HUNG: List[Any] = []


def _with_down_alerts(work: str) -> Any:
    """All sinks, plus alerts to two webhooks that are down: one takes the connection and never answers (a
    hung chat server), one refuses it. ``stall_seconds: 1`` makes the bench's 2 s stall alert mid-run."""
    import socket

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    _HUNG.append(hung)
    refused = socket.socket()  # bound, never listening: a connection to it is refused
    refused.bind(("127.0.0.1", 0))
    _HUNG.append(refused)
    targets = [{"type": "webhook", "url": f"http://127.0.0.1:{hung.getsockname()[1]}/hook"},
               {"type": "slack", "url": f"http://127.0.0.1:{refused.getsockname()[1]}/hook"}]
    return _msbridge(work, None, alerts={"targets": targets, "on": ["stall", "failed", "end"],
                                         "stall_seconds": 1})


def builders(work: str, steps: int, lr: Any, tracking_uri: str = "") -> Dict[str, Callable[[], List[Any]]]:
    """Setup key -> what builds its callbacks (nothing is built until one is called)."""
    from mindspore.train import LossMonitor

    return {
        "a": lambda: [], "a_ts": lambda: [],
        "b": lambda: [LossMonitor(1), _summary(work, 1), _MlflowPerStep(work)],
        "c": lambda: [LossMonitor(20), _summary(work, 20)],
        "d": lambda: _mindformers(work, steps, lr),
        "a_mf": lambda: [], "d_mf": lambda: _mindformers(work, steps, _scalar_lr(lr)),
        "e": lambda: [_msbridge(work, None)], "g": lambda: [_msbridge(work, None)],
        "e_thin": lambda: [_msbridge(work, {name: {"every_n_steps": 10} if name != "jsonl" else {}
                                            for name in _msbridge_sinks(work)})],
        "long": lambda: [_msbridge(work, None)], "long_a": lambda: [],
        "f": lambda: [_msbridge(work, ["jsonl"])],
        "e_srv": lambda: [_msbridge(work, None, tracking_uri)], "e_pg": lambda: [_msbridge(work, None, tracking_uri)],
        "ln": lambda: [_msbridge(work, ["jsonl"], layer_norms=".*")],
        "mem": lambda: [_msbridge(work, ["jsonl"], memory=True)],
        "sys": lambda: [_with_fake_npu_smi(work)],
        "hist": lambda: [_msbridge(work, ["jsonl", "tensorboard"], histograms=".*", histogram_interval=100)],
        "e_alert": lambda: [_with_down_alerts(work)],
        **_peers(work, steps, lr),
    }


def _peers(work: str, steps: int, lr: Any) -> Dict[str, Callable[[], List[Any]]]:
    """The peers' setups (``peers``): the 14 values a step to one tracker, as their users write it."""
    from . import peers

    values = {"lr_at": peers.warmup_lr(LR_PEAK, LR_WARMUP), "batch": BATCH, "seq_length": MODEL["seq_length"]}
    return {"p_mlflow": lambda: [peers.MlflowPeer(work, synchronous=True, **values)],
            "p_mlflow_async": lambda: [peers.MlflowPeer(work, synchronous=False, **values)],
            "p_tbx": lambda: [peers.TensorboardXPeer(work, **values)],
            "p_summary": lambda: [_summary(work, 1)],
            "p_mf": lambda: peers.mindformers_loss_monitor(work, steps, _scalar_lr(lr), BATCH)}


def callbacks_for(setup: str, work: str, steps: int, lr: Any, tracking_uri: str = "") -> List[Any]:
    """The callbacks of ``setup`` (``SETUPS``), built fresh, writing under ``work``."""
    return builders(work, steps, lr, tracking_uri)[setup]()


def run(setup: str, steps: int, seed: int, work: str, stall_s: float, hidden: int = DEFAULT_HIDDEN,
        tracking_uri: str = "") -> Dict[str, Any]:
    """Train the bench model once with ``setup``'s train cell and callbacks; returns what it cost (the JSON result)."""
    import mindspore as ms
    import mindspore.dataset as ds
    import numpy as np
    from mindspore import nn
    from mindspore.train import Model

    from ..capture.ring_reader import ring_size_for
    from ..capture.train_step import TrainStep
    from ..demo import build_model, make_tokens

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(seed)
    long_run = setup.startswith("long")
    per_epoch = min(steps, 1000)
    if long_run:  # a small MLP regressor: a step costs ~1 ms, so 100 000 steps take minutes
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(per_epoch * BATCH, 16)).astype(np.float32)
        data = {"x": x, "y": np.tanh(x[:, :1] * x[:, 1:2]).astype(np.float32)}
        loss_net = nn.WithLossCell(nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 1)), nn.MSELoss())
    else:
        data = {"tokens": make_tokens(per_epoch * BATCH, MODEL["seq_length"], MODEL["vocab_size"], seed)}
        _, loss_net = build_model(hidden_size=hidden, **MODEL)
    dataset = ds.NumpySlicesDataset(data, shuffle=False).batch(BATCH, drop_remainder=True)
    lr = nn.WarmUpLR(LR_PEAK, LR_WARMUP)
    optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=lr, weight_decay=0.01)
    callbacks = callbacks_for(setup, work, steps, lr, tracking_uri)
    if setup in TRAIN_STEP_SETUPS:
        config = callbacks[0].config if callbacks else None
        size = ring_size_for(config, SINK_SIZE) if config else 256
        train_cell = TrainStep(loss_net, optimizer, ring_size=size)
    elif setup in MF_CELL_SETUPS:
        train_cell = _mindformers_cell(loss_net, optimizer)
    elif setup == "p_mf":
        train_cell = _mf_outputs_cell(loss_net, optimizer)
    else:
        train_cell = nn.TrainOneStepCell(loss_net, optimizer)
    clock = HookClock()
    timer = _Timer((warmup_steps(steps), steps), stall_at=0 if long_run or not stall_s else steps // 2,
                   stall_s=stall_s, rss_every=10_000 if long_run else 0, clock=clock)
    sink = setup == "g"
    # CPU runs sink mode step by step and ignores sink_size (one epoch = the whole dataset); a device
    # runs sink_size steps per epoch, so it needs steps / sink_size epochs for the same steps.
    epochs = -(-steps // per_epoch)  # the timer stops training at `steps`
    if sink and ms.get_context("device_target") != "CPU":
        epochs = steps // SINK_SIZE
    cpu0, wall0 = process_cpu_s(), time.perf_counter()
    Model(train_cell).train(epochs, dataset, callbacks=[timer, clock.before(), *callbacks, clock.after()],
                            dataset_sink_mode=sink,
                            sink_size=SINK_SIZE if sink else -1)
    wall = time.perf_counter() - wall0
    cpu_end = process_cpu_s()
    out = _summarise(setup, timer, callbacks, wall, cpu_end - cpu0, steps)
    out.update(_fixed_costs(timer, cpu_end))
    return out


def _fixed_costs(timer: _Timer, cpu_end: float) -> Dict[str, Any]:
    """CPU seconds (this process and its children) to the first step's end, from the last step's end to
    the end (sinks closed), and for the whole run; the close's wall time; the MLflow child's RSS."""
    closed = timer.cpu_last_step is not None
    return {"cpu_start_s": timer.cpu_first_step, "cpu_close_s": cpu_end - timer.cpu_last_step if closed else None,
            "close_s": time.perf_counter() - timer.wall_last_step if closed else None, "cpu_total_s": cpu_end,
            "mlflow_child_rss_mb": timer.mlflow_child_rss_mb}


def warmup_steps(steps: int) -> int:
    """Steps left out of the steady-state figures: the first ones include graph compilation."""
    return max(10, steps // 10)


def _summarise(setup: str, timer: _Timer, callbacks: List[Any], wall: float, cpu: float,
               steps: int) -> Dict[str, Any]:
    import numpy as np

    marks = np.array([t for _, t in timer.times])
    warm = warmup_steps(len(marks))
    measured = marks[-1] - marks[warm - 1] - timer.stalled_s
    steady_cpu = timer.cpu[-1] - timer.cpu[0] if len(timer.cpu) == 2 else None
    steady = len(marks) - warm
    beside = timer.beside if len(timer.beside) == 2 else [(None, 0.0), (None, 0.0)]
    threads = None if None in (beside[0][0], beside[1][0]) else (beside[1][0] - beside[0][0]) / steady * 1e6
    out: Dict[str, Any] = {
        "setup": setup, "steps": int(timer.times[-1][0]) if timer.times else 0,
        "steps_per_s": (len(marks) - warm) / measured if measured > 0 else None,
        "median_step_ms": float(np.median(np.diff(marks[warm:]))) * 1e3,
        # the second half, from just after the mid-run stall: every sink is past its start (MLflow's child too)
        "late_steps_per_s": float((len(marks) - len(marks) // 2 - 3) / (marks[-1] - marks[len(marks) // 2 + 2])),
        "wall_s": wall, "cpu_s": cpu,
        "cpu_ms_per_step": None if steady_cpu is None else steady_cpu / (len(marks) - warm) * 1e3,
        # msbridge's CPU off the training thread, per steady-state step: its threads, and child processes
        "threads_us_per_step": threads, "children_us_per_step": (beside[1][1] - beside[0][1]) / steady * 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "idle_cpu_per_s": timer.idle_cpu_per_s, "children_rss_mb": timer.children_rss_mb,
        "rss_samples": timer.rss,
    }
    out.update(_own_cpu(timer, steady))
    monitor = next((cb for cb in callbacks if hasattr(cb, "run_dir") and hasattr(cb, "steps_recorded")), None)
    if monitor is not None:
        out.update(_monitor_figures(monitor))
    return out


def _own_cpu(timer: _Timer, steady: int) -> Dict[str, Any]:
    """CPU us a steady-state step: the setup's hooks on the training thread (``HookClock``), every Python thread
    but the training one, and the training thread in all (MindSpore's work on it included)."""
    if len(timer.own) != 2 or not steady:
        return {}
    (hooks0, threads0, train0, wall0), (hooks1, threads1, train1, wall1) = timer.own
    by_name: Dict[str, float] = {}
    for tid, cpu in threads1.items():
        name = timer.names.get(tid, "?")
        by_name[name] = by_name.get(name, 0.0) + grown({tid: cpu}, threads0) / steady * 1e6
    return {"hooks_us_per_step": (hooks1 - hooks0) / steady * 1e6, "thread_us_per_step": by_name,
            "hooks_wall_us_per_step": (wall1 - wall0) / steady * 1e6,
            "py_threads_us_per_step": grown(threads1, threads0) / steady * 1e6,
            "training_thread_us_per_step": (train1 - train0) / steady * 1e6}


def _monitor_figures(monitor: Any) -> Dict[str, Any]:
    """msbridge's own host time per step, from what it recorded (perf/monitor_overhead x step time)."""
    import numpy as np

    from ..sinks.runlog import read_run

    log = read_run(monitor.run_dir).ranks[0]
    per_step = np.array([r.values["perf/monitor_overhead"] * r.values["perf/step_time_ms"] * 1e3
                         for r in log.records if "perf/monitor_overhead" in r.values])
    return {"steps_recorded": monitor.steps_recorded, "records_in_jsonl": len(log.records),
            "sinks": sorted(monitor.config.sinks), "flush_steps_final": monitor._budget.flush_steps,
            "monitor_us_median": float(np.median(per_step)), "monitor_us_mean": float(per_step.mean())}


def main(argv: Any = None) -> int:
    """``python -m msbridge.bench.worker``: one run, its result (or the reason it could not run) to ``--result``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", required=True, choices=sorted(SETUPS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--stall-s", type=float, default=2.0,
                        help="idle seconds measured inside training, after 1 s to settle (0: no stall)")
    parser.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN, help="the model's hidden size")
    parser.add_argument("--tracking-uri", default="", help="setups e_srv, e_pg: the mlflow server's URI")
    parser.add_argument("--work", required=True, help="scratch dir for this run's outputs")
    parser.add_argument("--result", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)  # mindformers writes ./output/log on import
    try:
        result = run(args.setup, args.steps, args.seed, args.work, args.stall_s, args.hidden, args.tracking_uri)
    except Exception as exc:  # reported as the row's reason, e.g. a tool that does not run on CPU
        result = {"setup": args.setup, "error": exception_text(exc),
                  "traceback": traceback.format_exc()[-2000:]}
    with open(args.result, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
