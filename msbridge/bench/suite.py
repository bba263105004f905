"""``msbridge bench``: what monitoring costs, measured against no monitoring on the same job.

Every setup trains the same demo transformer on the same data with the same
seed, each run in a fresh process (``msbridge.bench.worker``). Runs are
interleaved (a b c ... a b c ...), with the order rotated each repeat, and each
setup's throughput is reported as the median over repeats of its ratio to the
no-monitoring run of the same repeat, so slow drifts of the machine's load
cancel out. Also reported: host CPU time, peak RSS, CPU burnt while training is
idle (a 2 s stall inside training), msbridge's own host time per step, the fixed costs
per run (``costs``), and, with ``--long-steps``, RSS across a long run with every sink on.
Setups ``e_srv`` and ``e_pg`` log to a real ``mlflow server`` (``servers``) started for the whole bench.

Example:
    $ msbridge bench --steps 300 --repeats 3 --out ./bench_results
    $ python examples/bench/run_bench.py --setups a,e,f --repeats 5
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from statistics import median
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..errors import MsbridgeError
from .costs import fixed_cost_row, fixed_costs_markdown
from .servers import tracking_servers
from .sidebyside import budget_targets, own_cost, side_by_side_markdown

#: setup key -> what runs. ``a`` is the reference every ratio is taken against.
SETUPS: Dict[str, str] = {
    "a": "no monitoring",
    "a_ts": "TrainStep (ring buffer), no monitoring",
    "b": "LossMonitor(1) + SummaryCollector(1) + mlflow.log_metric per step",
    "c": "LossMonitor(20) + SummaryCollector(20)",
    "d": "mindformers MFLossMonitor + TrainingStateMonitor, tensorboard (plain demo model)",
    "a_mf": "mindformers train cell (CPU overflow check), no monitoring",
    "d_mf": "mindformers train cell + MFLossMonitor + TrainingStateMonitor, tensorboard",
    "e": "msbridge, all sinks, every step",
    "e_thin": "msbridge, all sinks, the trackers every 10th step (every_n_steps: 10), jsonl every step",
    "f": "msbridge, jsonl only",
    "g": "msbridge, TrainStep ring, sink mode sink_size=20, all sinks",
    "ln": "msbridge, jsonl, TrainStep ring, layer_norms '.*' (grad, weight, Adam-moment norms)",
    "mem": "msbridge, jsonl, memory: true",
    "sys": "msbridge, jsonl, system: {interval_s: 1} with a fake npu-smi (8 chips) on PATH",
    "hist": "msbridge, jsonl + tensorboard, TrainStep ring, histograms '.*' every 100 steps (weights and grads)",
    "e_srv": "msbridge, all sinks, every step, MLflow through `mlflow server` (sqlite)",
    "e_pg": "msbridge, all sinks, every step, MLflow through `mlflow server` (PostgreSQL)",
    "e_alert": "msbridge, all sinks, every step, alerts to a hung and a refusing webhook (the 2 s stall alerts)",
    "p_mlflow": "peer: mlflow.log_metrics of 14 values every step, synchronous, sqlite",
    "p_mlflow_async": "peer: mlflow.log_metrics of 14 values every step, synchronous=False, sqlite",
    "p_tbx": "peer: tensorboardX SummaryWriter.add_scalar of 14 values every step",
    "p_summary": "peer: MindSpore SummaryCollector(collect_freq=1) (loss, lr, graph: what it collects)",
    "p_mf": "peer: mindformers MFLossMonitor, printing and its TensorBoard every step (loss, lr)",
    "long": "msbridge, all sinks, tiny model, long run",
    "long_a": "no monitoring, tiny model, long run",
}
DEFAULT_SETUPS = ("a", "a_ts", "b", "c", "d", "e", "f", "g")
#: setups compared with another baseline than ``a`` (same train cell, no monitoring).
BASELINE = {"d_mf": "a_mf", "g": "a_ts", "ln": "a_ts", "hist": "a_ts", "e_alert": "e"}
#: setups whose MLflow sink logs over HTTP to an ``mlflow server`` the bench starts, with this backend.
SERVER_BACKEND = {"e_srv": "sqlite", "e_pg": "postgresql"}
#: The bench model's hidden size: a step of about 12 ms on 2 CPUs.
DEFAULT_HIDDEN = 32
TARGETS = {"ratio_e": 0.99, "cpu_share_e": 0.01, "ratio_e_pg": 0.97, "monitor_us_median": 50.0, "rss_growth_mb": 50.0,
           "idle_cpu_above_a": 0.02, "ratio_ln": 0.97, "ratio_mem": 0.99, "ratio_sys": 0.99, "ratio_hist": 0.97,
           "ratio_e_alert": 0.99}


def run_one(setup: str, steps: int, seed: int, out: str, tag: str, stall_s: float, keep: bool,
            timeout: float = 1800.0, hidden: int = DEFAULT_HIDDEN, tracking_uri: str = "") -> Dict[str, Any]:
    """One setup in a fresh Python process; returns its JSON result (with ``error`` if it failed)."""
    work = os.path.join(out, "work", f"{setup}-{tag}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    result_path = os.path.join(work, "result.json")
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "msbridge.bench.worker", "--setup", setup, "--steps", str(steps),
           "--seed", str(seed), "--stall-s", str(stall_s), "--hidden", str(hidden), "--work", work,
           "--result", result_path, "--tracking-uri", tracking_uri]
    with open(os.path.join(out, "logs", f"{setup}-{tag}.log"), "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    try:
        with open(result_path) as fh:
            result = json.load(fh)
    except (OSError, ValueError):
        result = {"setup": setup, "error": f"worker exited with {code}; see logs/{setup}-{tag}.log"}
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def run_bench(setups: Sequence[str] = DEFAULT_SETUPS, steps: int = 300, repeats: int = 3, seed: int = 7,
              out: str = "./bench_results", long_steps: int = 0, stall_s: float = 2.0, keep: bool = False,
              echo: Any = print, hidden: int = DEFAULT_HIDDEN, server_nice: int = 0, busy: int = 0) -> Dict[str, Any]:
    """Run every setup ``repeats`` times, interleaved; write ``bench.json`` and ``bench.md`` to ``out``.
    The mlflow servers of ``SERVER_BACKEND`` setups run throughout, at nice ``server_nice``, and so do ``busy``
    CPU-bound processes the bench starts and stops."""
    from .firstpoint import hogs

    out = os.path.abspath(out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    setups = list(dict.fromkeys(["a", *[s for s in setups if not s.startswith("long")], *_baselines(setups)]))
    runs: Dict[str, List[Dict[str, Any]]] = {s: [] for s in setups}
    load = [os.getloadavg()[0]]
    started = time.time()
    backends = [SERVER_BACKEND[s] for s in setups if s in SERVER_BACKEND]
    with tracking_servers(backends, os.path.join(out, "servers"), nice=server_nice) as uris, hogs(busy):
        for rep in range(repeats):
            order = setups[rep % len(setups):] + setups[:rep % len(setups)]
            for setup in order:
                if runs[setup] and "error" in runs[setup][0]:
                    continue  # a setup that cannot run here fails the same way every time
                result = run_one(setup, steps, seed, out, f"r{rep}", stall_s, keep, hidden=hidden,
                                 tracking_uri=uris.get(SERVER_BACKEND.get(setup, ""), ""))
                result["repeat"] = rep
                runs[setup].append(result)
                echo(f"[bench] repeat {rep + 1}/{repeats} {setup:<5} " + _one_line(result))
            load.append(os.getloadavg()[0])
    report: Dict[str, Any] = {
        "steps": steps, "repeats": repeats, "seed": seed, "hidden": hidden, "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU", "load_avg_1min": load,
        "minutes": (time.time() - started) / 60, "rows": [summarise(s, runs) for s in setups], "runs": runs,
        "server_nice": server_nice, "busy": busy,
        "fixed_costs": [fixed_cost_row(s, runs, BASELINE.get(s, "a")) for s in setups],
    }
    if long_steps:
        echo(f"[bench] long run: {long_steps} steps, every sink on")
        for setup in ("long_a", "long"):
            report[setup] = run_one(setup, long_steps, seed, out, "r0", 0.0, keep, timeout=7200.0)
            echo(f"[bench] {setup}: " + _one_line(report[setup]) + f", RSS {_rss_line(report[setup])}")
    report["targets"] = check_targets(report)
    with open(os.path.join(out, "bench.json"), "w") as fh:
        json.dump(report, fh, indent=2)
    table = markdown(report)
    with open(os.path.join(out, "bench.md"), "w") as fh:
        fh.write(table)
    echo(table)
    return report


def _baselines(setups: Sequence[str]) -> List[str]:
    return [BASELINE[s] for s in setups if s in BASELINE]


def _rss_line(result: Dict[str, Any]) -> str:
    samples = result.get("rss_samples") or []
    if not samples:
        return "n/a"
    return (f"{samples[0][1]:.0f} MB at step {samples[0][0]} -> {samples[-1][1]:.0f} MB at step {samples[-1][0]} "
            f"({samples[-1][1] - samples[0][1]:+.1f} MB)")


def _one_line(result: Dict[str, Any]) -> str:
    if "error" in result:
        return f"n/a: {result['error']}"
    return (f"{result['steps_per_s']:.1f} steps/s, median step {result['median_step_ms']:.1f} ms, "
            f"cpu {_fmt(result['cpu_ms_per_step'], '.1f')} ms/step")


def summarise(setup: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Medians over repeats; the ratio is paired with the baseline run of the same repeat."""
    mine = [r for r in runs[setup] if "error" not in r]
    row: Dict[str, Any] = {"setup": setup, "label": SETUPS[setup], "ok": len(mine)}
    if not mine:
        row["error"] = runs[setup][0]["error"] if runs[setup] else "not run"
        return row
    base_key = BASELINE.get(setup, "a")
    base = {r["repeat"]: r for r in runs.get(base_key, []) if "error" not in r}
    ratios = [r["steps_per_s"] / base[r["repeat"]]["steps_per_s"] for r in mine if r["repeat"] in base]
    by_median = [base[r["repeat"]]["median_step_ms"] / r["median_step_ms"] for r in mine if r["repeat"] in base]
    ref = {r["repeat"]: r for r in runs.get("a", []) if "error" not in r}
    vs_a = [r["steps_per_s"] / ref[r["repeat"]]["steps_per_s"] for r in mine if r["repeat"] in ref]
    row.update({
        "baseline": base_key,
        "ratio": median(ratios) if ratios else None, "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None), "ratio_to_a": median(vs_a) if vs_a else None,
        "ratio_median_step": median(by_median) if by_median else None,
    })
    for key in ("steps_per_s", "median_step_ms", "cpu_ms_per_step", "peak_rss_mb", "children_rss_mb", "idle_cpu_per_s",
                "monitor_us_median", "monitor_us_mean", "threads_us_per_step", "children_us_per_step",
                "steps_recorded", "flush_steps_final", "hooks_us_per_step", "py_threads_us_per_step",
                "training_thread_us_per_step", "hooks_wall_us_per_step"):
        values = [r[key] for r in mine if r.get(key) is not None]
        row[key] = median(values) if values else None
    row.update(own_cost(setup, runs, base_key))
    if row.get("monitor_us_mean") is not None and row.get("threads_us_per_step") is not None:
        # all the CPU monitoring adds per step, as a share of the step: on a host whose cores training keeps
        # busy, each CPU-microsecond of it costs training about one (docs/benchmarks.md)
        row["cpu_share"] = (row["monitor_us_mean"] + row["threads_us_per_step"]
                            + row["children_us_per_step"]) / 1e3 / row["median_step_ms"]
    return row


def check_targets(report: Dict[str, Any]) -> Dict[str, Any]:
    """The measured figures next to the targets (nothing is assumed when a figure is missing)."""
    rows = {r["setup"]: r for r in report["rows"]}
    e = rows.get("e", {})
    msb = [rows[s] for s in ("e", "f", "g") if rows.get(s, {}).get("ok")]
    idle_a = rows.get("a", {}).get("idle_cpu_per_s") or 0.0
    out: Dict[str, Any] = {
        "ratio_e": {"target": f">= {TARGETS['ratio_e']}", "measured": e.get("ratio")},
        # the same cost without the machine's noise: all the CPU (e) adds, as a share of its step
        "cpu_share_e": {"target": f"< {TARGETS['cpu_share_e']}", "measured": e.get("cpu_share")},
        "monitor_us_median": {"target": f"< {TARGETS['monitor_us_median']:.0f} us",
                              "measured": max((r["monitor_us_median"] for r in msb), default=None)},
        # MindSpore's own threads (the dataset pipeline prefetching) use some CPU in (a) too: compare with it.
        "idle_cpu_above_a": {"target": f"< {TARGETS['idle_cpu_above_a']} s/s",
                             "measured": max((r["idle_cpu_per_s"] - idle_a for r in msb
                                              if r.get("idle_cpu_per_s") is not None), default=None)},
    }
    for setup in ("ln", "mem", "sys", "hist", "e_alert"):  # model internals, system metrics, alerts, when run
        if rows.get(setup, {}).get("ok"):
            out[f"ratio_{setup}"] = {"target": f">= {TARGETS[f'ratio_{setup}']}", "measured": rows[setup]["ratio"]}
    if rows.get("sys", {}).get("ok") and rows["sys"].get("idle_cpu_per_s") is not None:
        out["idle_cpu_sys_above_a"] = {"target": f"< {TARGETS['idle_cpu_above_a']} s/s",
                                       "measured": rows["sys"]["idle_cpu_per_s"] - idle_a}
    if "e_pg" in rows:  # issue 19: every sink, MLflow through a PostgreSQL-backed server
        out["ratio_e_pg"] = {"target": f">= {TARGETS['ratio_e_pg']}", "measured": rows["e_pg"].get("ratio")}
    long = report.get("long")
    if long and "error" not in long and long.get("rss_samples"):
        samples = long["rss_samples"]
        out["rss_growth_mb"] = {"target": f"< {TARGETS['rss_growth_mb']:.0f} MB", "steps": long["steps"],
                                "start_mb": samples[0][1], "end_mb": samples[-1][1],
                                "measured": samples[-1][1] - samples[0][1],
                                "without_monitoring": _rss_line(report.get("long_a") or {})}
    out.update(budget_targets(rows))
    for item in out.values():
        item["met"] = _met(item)
    return out


def _met(item: Dict[str, Any]) -> Optional[bool]:
    value, target = item.get("measured"), item["target"]
    if value is None:
        return None
    if target.startswith(">="):
        return value >= float(target[2:])
    return value < float(target[1:].split()[0])


def _children(row: Dict[str, Any]) -> str:
    rss = row.get("children_rss_mb")
    return f" (+{rss:.0f})" if rss else ""


def _beside(row: Dict[str, Any]) -> str:
    threads, children = row.get("threads_us_per_step"), row.get("children_us_per_step")
    if threads is None:
        return f"n/a + {children:.0f}" if children else "n/a"
    return f"{threads:.0f} + {children:.0f}"


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(report: Dict[str, Any]) -> str:
    """The results as a markdown table plus the targets."""
    lines = [f"## msbridge bench: {report['steps']} steps x {report['repeats']} repeats, seed {report['seed']}",
             "", f"{report['machine']}, Python {report['python']}, 1-min load average during the run "
             f"{min(report['load_avg_1min']):.1f}-{max(report['load_avg_1min']):.1f}; "
             f"{report['minutes']:.1f} min; beside {report.get('busy', 0)} busy processes the bench started.", "",
             "| setup | what | steps/s | ratio to baseline (min-max) | ratio to (a) | median step ms "
             "(ratio) | host CPU ms/step | peak RSS MB (+children) | idle CPU s/s | msbridge us/step median (mean) | "
             "its threads + child processes, CPU us/step | all of it, share of the step | flush window |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        if "error" in row:
            lines.append(f"| ({row['setup']}) | {row['label']} | n/a | n/a: {row['error']} | | | | | | | | | |")
            continue
        base = "" if row["baseline"] == "a" else f" vs ({row['baseline']})"
        msb = (f"{row['monitor_us_median']:.1f} ({row['monitor_us_mean']:.1f})"
               if row.get("monitor_us_median") is not None else "")
        lines.append(
            f"| ({row['setup']}) | {row['label']} | {row['steps_per_s']:.1f} | "
            f"{_fmt(row['ratio'], '.3f')} ({_fmt(row['ratio_min'], '.3f')}-{_fmt(row['ratio_max'], '.3f')}){base} | "
            f"{_fmt(row['ratio_to_a'], '.3f')} | {row['median_step_ms']:.2f} "
            f"({_fmt(row['ratio_median_step'], '.3f')}) | {_fmt(row['cpu_ms_per_step'], '.2f')} | "
            f"{row['peak_rss_mb']:.0f}{_children(row)} | {_fmt(row['idle_cpu_per_s'], '.3f')} | {msb} | "
            f"{_beside(row)} | {_fmt(row.get('cpu_share'), '.2%')} | {_fmt(row.get('flush_steps_final'), '')} |")
    lines += side_by_side_markdown(report["rows"])
    lines += fixed_costs_markdown(report.get("fixed_costs", []))
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for name, item in report["targets"].items():
        measured = _fmt(item["measured"], ".3f") if isinstance(item["measured"], float) else item["measured"]
        extra = (f" (RSS {item['start_mb']:.0f} -> {item['end_mb']:.0f} MB, steps 1000-{item['steps']}; "
                 f"without monitoring: {item['without_monitoring']})" if name == "rss_growth_mb" else "")
        lines.append(f"| {name} {item['target']} | {measured}{extra} | {item['met']} |")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options on ``parser`` (``msbridge bench`` and ``examples/bench/run_bench.py`` share them)."""
    parser.add_argument("--steps", type=int, default=300, help="training steps of each measured run (default 300)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each setup, interleaved; each figure is the median over them (default 3)")
    parser.add_argument("--seed", type=int, default=7, help="the seed of the model and the data (default 7)")
    parser.add_argument("--out", default="./bench_results", help="where the results go (default ./bench_results)")
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                        help=f"comma-separated, from: {', '.join(s for s in SETUPS if not s.startswith('long'))}")
    parser.add_argument("--long-steps", type=int, default=0,
                        help="also run a long job (e.g. 100000 steps, tiny model, every sink) and report RSS")
    parser.add_argument("--stall-s", type=float, default=2.0,
                        help="training stalls mid-run (1 s to settle + this long, measured) to measure idle CPU")
    parser.add_argument("--keep", action="store_true", help="keep each run's outputs under OUT/work")
    parser.add_argument("--server-nice", type=int, default=0,
                        help="nice value of the mlflow servers (and PostgreSQL) of setups e_srv, e_pg; "
                             "19 stands for a server on another machine")
    parser.add_argument("--busy", type=int, default=0,
                        help="CPU-bound processes the bench starts beside every setup and stops at its end (default 0)")
    parser.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN,
                        help=f"the model's hidden size (default {DEFAULT_HIDDEN}: a ~12 ms step here; 256: ~10x that)")


def run_from_args(args: argparse.Namespace) -> int:
    """Run the bench the parsed options ask for; an unknown setup is an ``MsbridgeError`` naming the valid ones."""
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        raise MsbridgeError(f"bench: unknown setup(s) {', '.join(unknown)}; choose from {', '.join(SETUPS)}")
    run_bench(setups, args.steps, args.repeats, args.seed, args.out, args.long_steps, args.stall_s, args.keep,
              hidden=args.hidden, server_nice=args.server_nice, busy=args.busy)
    return 0


#: What stops a bench: Ctrl-C, a scheduler's or ``kill``'s SIGTERM, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class BenchStopped(Exception):
    """The bench was stopped by signal ``signum``: raised where it runs, so its servers stop on the way out.

    Example:
        >>> BenchStopped(signal.SIGTERM).exit_code
        143
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """The first of ``STOP_SIGNALS`` raises ``BenchStopped`` in the main thread; later ones are ignored, so a
    second Ctrl-C cannot cut the servers' stop short. The handlers before are back afterwards."""
    def stop(signum: int, _frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise BenchStopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``msbridge bench`` as a function (``examples/bench/run_bench.py`` calls it); returns the exit code.
    Stopped by a signal, it stops its servers and the setup running, says so in one line and exits 128 + it."""
    parser = argparse.ArgumentParser(prog="msbridge bench", description=__doc__.splitlines()[0].replace("``", ""))
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        with stopped_by_signals():
            return run_from_args(args)
    except MsbridgeError as exc:  # as every msbridge command says it: one line, exit 2
        print(f"msbridge: error: {exc}", file=sys.stderr)
        return 2
    except BenchStopped as stopped:
        print(f"msbridge: bench stopped by {stopped}; its servers and the setup running were stopped, "
              "no report written", file=sys.stderr)
        return stopped.exit_code


if __name__ == "__main__":
    sys.exit(main())
