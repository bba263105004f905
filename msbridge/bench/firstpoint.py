"""MLflow's first visible point and a run's CPU, beside busy processes: this checkout's MLflow child against an
older msbridge's, and against an ``mlflow server``, interleaved in one run.

Each trial is MindSpore's quick-start loop (``examples/quickstart``) in a fresh directory (so a fresh sqlite
store) with all four sinks, ``flush_steps`` 10, beside ``hogs`` CPU-bound processes this bench starts and
stops. It prints, per setup and hog count, the median over repeats of:

- ``CPU s``: every process the trial starts, waited for or not, from a cpuacct cgroup of its own (else the
  rusage of the processes waited for, and the table says so); ``added`` is over the quick start without its
  three msbridge lines beside as many hogs;
- ``first point s``: from the first flush (the first record in the run's jsonl, which is written first at every
  flush) to the first metric row in MLflow's store, read with sqlite while the trial runs; ``-`` when none
  came before the training process ended;
- ``steps at exit``: the steps MLflow's store held when the trial ended (without a replay).

The setups (``--setups``): ``old``, an older msbridge, ``git archive`` of ``--old`` (default ``main``) put first on
``PYTHONPATH``; ``new``, this checkout with the default sqlite store; ``server``, this checkout against an
``mlflow server`` the bench starts once (``--server``: on a sqlite file, or on a PostgreSQL cluster of its own,
``bash .ci/postgres.sh``), an experiment per trial, read through the server's REST API; ``none``, no monitoring.
The server's own CPU is not counted: a team's server runs anyway.

Example:
    $ python -m msbridge.bench.firstpoint --hogs 0,2,4 --repeats 1 --old 1e8640c
    $ python -m msbridge.bench.firstpoint --hogs 0 --repeats 3 --setups server,new,none --server postgresql
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from statistics import median
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(REPO, "examples", "quickstart", "quickstart.py")
CGROUP = "/sys/fs/cgroup/cpuacct"
MONITOR = """experiment: quickstart
run_name: "quickstart-{timestamp}"
flush_steps: 10
print_interval: 1000
sinks: {jsonl: {}, tensorboard: {}, mlflow: {}, mindinsight: {}}
"""
_HOG = "while True: pass"
#: A 200-step ``msbridge.track`` loop (jsonl + mlflow, a flush every 10 steps, 20 ms a step), given 3 s to be up
#: to date; it prints how long the ``with`` block's close took.
CLOSE_JOB = """import json, sys, time
import msbridge
config = {"output_dir": sys.argv[1], "experiment": "close", "flush_steps": 10, "sinks": {"jsonl": {}, "mlflow": {}}}
with msbridge.track(config) as run:
    for step in range(200):
        run.step(loss=1.0 / (step + 1))
        time.sleep(0.02)
    time.sleep(3.0)
    start = time.monotonic()
print(json.dumps({"close_s": time.monotonic() - start}))
"""


def unmonitored(source: str) -> str:
    """The quick start without its three lines marked ``# msbridge``."""
    source = source.replace("import msbridge  # msbridge\n", "")
    source = re.sub(r"\n(\s*)run\.step\(loss=loss\)  # msbridge", r"\n\1pass", source)
    return re.sub(r"with msbridge\.track\(.*\) as run:  # msbridge", "if True:", source)


def old_tree(rev: str, root: str) -> str:
    """``rev`` of this repository unpacked in ``root``, importable as ``msbridge`` (adapters mapped in)."""
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "msbridge", "adapters"], check=True,
                             capture_output=True).stdout
    tree = os.path.join(root, "old")
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(tree)
    os.symlink(os.path.join(tree, "adapters"), os.path.join(tree, "msbridge", "adapters"))
    return tree


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes, stopped (and waited for) on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", _HOG]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _cgroup() -> Optional[str]:
    path = os.path.join(CGROUP, f"msbridge-firstpoint-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
        return path
    except OSError:
        return None


def _join(group: str) -> None:
    """In the trial's process before it runs: join its cgroup (its children follow)."""
    with open(os.path.join(group, "cgroup.procs"), "w", encoding="utf-8") as handle:
        handle.write(str(os.getpid()))


def _store_steps(work: str) -> int:
    stores = glob.glob(os.path.join(work, "msbridge_runs", "quickstart", "mlflow.db"))
    if not stores:
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{stores[0]}?mode=ro", uri=True, timeout=1.0)) as db:
            return db.execute("SELECT COUNT(DISTINCT step) FROM metrics").fetchone()[0]
    except sqlite3.Error:  # not made yet, or mid-creation
        return 0


def _rest(uri: str, path: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/{path}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _server_steps(uri: str, experiment: str) -> int:
    """The steps of ``train/loss`` in ``experiment``'s run on the server at ``uri`` (0 before there is one)."""
    try:
        found = _rest(uri, "experiments/get-by-name?" + urllib.parse.urlencode({"experiment_name": experiment}))
        runs = _rest(uri, "runs/search", {"experiment_ids": [found["experiment"]["experiment_id"]],
                                          "max_results": 1}).get("runs", [])
        if not runs:
            return 0
        query = {"run_id": runs[0]["info"]["run_id"], "metric_key": "train/loss", "max_results": 25000}
        history = _rest(uri, "metrics/get-history?" + urllib.parse.urlencode(query))
    except (OSError, ValueError, KeyError):  # no experiment yet (HTTP 404), or the server is slow beside the hogs
        return 0
    return len({metric["step"] for metric in history.get("metrics", [])})


@contextlib.contextmanager
def server(backend: str, root: str) -> Iterator[str]:
    """An ``mlflow server``'s URI, the server on a sqlite file or on a PostgreSQL cluster of its own."""
    from msbridge.bench.servers import MlflowServer, PostgresCluster

    with contextlib.ExitStack() as stack:
        database = None
        if backend == "postgresql":
            database = stack.enter_context(PostgresCluster()).create_database("firstpoint")
        yield stack.enter_context(MlflowServer(os.path.join(root, "server"), backend_uri=database)).uri


def _first_record(work: str) -> bool:
    for path in glob.glob(os.path.join(work, "msbridge_runs", "quickstart", "*", "metrics", "*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            if any(line.startswith('{"type":"metrics"') for line in handle):
                return True
    return False


def trial(setup: str, work: str, script: str, pythonpath: str, uri: str = "") -> Dict[str, Any]:
    """One trial: its CPU, its first point's delay after the first flush, MLflow's steps at exit; with ``uri``,
    MLflow is the ``mlflow server`` there, in an experiment named after ``work``."""
    os.makedirs(work)
    with open(os.path.join(work, "quickstart.py"), "w", encoding="utf-8") as handle:
        handle.write(script)
    experiment = os.path.basename(work)
    with open(os.path.join(work, "monitor.yaml"), "w", encoding="utf-8") as handle:
        handle.write(MONITOR.replace("mlflow: {}", f"mlflow: {{tracking_uri: '{uri}', experiment: {experiment}}}")
                     if uri else MONITOR)
    steps: Callable[[], int] = (lambda: _server_steps(uri, experiment)) if uri else (lambda: _store_steps(work))
    group = _cgroup()
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=pythonpath) if pythonpath else dict(os.environ, GLOG_v="3")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "quickstart.py", "--epochs", "1"], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=(lambda: _join(group)) if group else None)
    flushed = visible = None
    while True:
        ended, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if ended:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        now = time.monotonic()
        if flushed is None and _first_record(work):
            flushed = now
        if flushed is not None and visible is None and steps():
            visible = time.monotonic()  # once the read returned: a slow read beside the hogs counts against it
        time.sleep(0.1)
    cpu = _cgroup_cpu(group) if group else usage.ru_utime + usage.ru_stime
    return {"setup": setup, "rc": proc.returncode, "wall_s": time.monotonic() - start, "cpu_s": cpu,
            "first_point_s": None if visible is None else visible - flushed, "steps_at_exit": steps(),
            "cgroup": bool(group)}


def close_trial(setup: str, work: str, pythonpath: str) -> Dict[str, Any]:
    """One ``CLOSE_JOB``: its close's seconds, and the steps MLflow's store holds after it."""
    os.makedirs(work)
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=pythonpath) if pythonpath else dict(os.environ, GLOG_v="3")
    done = subprocess.run([sys.executable, "-c", CLOSE_JOB, work], cwd=work, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    close = json.loads(lines[-1])["close_s"] if done.returncode == 0 and lines else None
    stores = glob.glob(os.path.join(work, "**", "mlflow.db"), recursive=True)
    steps = 0
    if stores:
        with contextlib.closing(sqlite3.connect(f"file:{stores[0]}?mode=ro", uri=True)) as db:
            steps = db.execute("SELECT COUNT(DISTINCT step) FROM metrics").fetchone()[0]
    return {"setup": setup, "close_s": close, "steps_after_close": steps, "rc": done.returncode}


def _cgroup_cpu(group: str, wait_s: float = 120.0) -> float:
    """The cgroup's CPU once every process in it ended (a detached child included), then the cgroup removed."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with open(os.path.join(group, "tasks"), encoding="utf-8") as handle:
            if not handle.read().strip():
                break
        time.sleep(0.2)
    with open(os.path.join(group, "cpuacct.usage"), encoding="utf-8") as handle:
        cpu = int(handle.read()) / 1e9
    with contextlib.suppress(OSError):
        os.rmdir(group)
    return cpu


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return median(known) if known else None


def table(results: List[Dict[str, Any]]) -> List[str]:
    """The figures as a markdown table, one row per setup and hog count."""
    lines = ["| setup | hogs | trials | CPU s (added) | first point s (trials with one) | steps at exit |",
             "|---|---|---|---|---|---|"]
    for key in sorted({(r["setup"], r["hogs"]) for r in results}):
        rows = [r for r in results if (r["setup"], r["hogs"]) == key]
        cpu = _median([r["cpu_s"] for r in rows])
        base = _median([r["cpu_s"] for r in results if r["setup"] == "none" and r["hogs"] == key[1]])
        added = f" ({cpu - base:+.2f})" if cpu is not None and base is not None and key[0] != "none" else ""
        first = _median([r["first_point_s"] for r in rows])
        seen = sum(r["first_point_s"] is not None for r in rows)
        first_text = "-" if first is None else f"{first:.1f} ({seen}/{len(rows)})"
        steps = "/".join(str(r["steps_at_exit"]) for r in rows)
        lines.append(f"| {key[0]} | {key[1]} | {len(rows)} | {cpu:.2f}{added} | {first_text} | {steps} |")
    if not all(r["cgroup"] for r in results):
        lines.append("(some trials had no cgroup: their CPU counts only the processes they waited for)")
    return lines


def close_table(results: List[Dict[str, Any]]) -> List[str]:
    """The close figures as a markdown table."""
    lines = ["| setup | hogs | close s (median; each) | steps in MLflow after close (of 200) |", "|---|---|---|---|"]
    for key in sorted({(r["setup"], r["hogs"]) for r in results}):
        rows = [r for r in results if (r["setup"], r["hogs"]) == key]
        each = ", ".join("-" if r["close_s"] is None else f"{r['close_s']:.2f}" for r in rows)
        close = _median([r["close_s"] for r in rows])
        lines.append(f"| {key[0]} | {key[1]} | {'-' if close is None else f'{close:.2f}'} ({each}) | "
                     f"{'/'.join(str(r['steps_after_close']) for r in rows)} |")
    return lines


def main(argv: Sequence[str] = ()) -> int:
    """Interleave the setups (old, new, none) for each hog count and repeat; print the table and write JSON."""
    parser = argparse.ArgumentParser(prog="python -m msbridge.bench.firstpoint", description=__doc__.split("\n")[0])
    parser.add_argument("--hogs", default="0,2,4", help="comma-separated numbers of busy processes")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--old", default="main", help="the older msbridge's git revision")
    parser.add_argument("--setups", default="old,new,none", help="comma-separated, of old, new, server, none")
    parser.add_argument("--server", default="sqlite", choices=("sqlite", "postgresql"),
                        help="the backend store of the server setup's mlflow server")
    parser.add_argument("--out", default="./bench_firstpoint.json")
    args = parser.parse_args(list(argv) or None)
    with open(QUICKSTART, encoding="utf-8") as handle:
        source = handle.read()
    results: List[Dict[str, Any]] = []
    closes: List[Dict[str, Any]] = []
    names = args.setups.split(",")
    with tempfile.TemporaryDirectory(prefix="msbridge-firstpoint-") as root, contextlib.ExitStack() as stack:
        uri = stack.enter_context(server(args.server, root)) if "server" in names else ""
        made = {"old": lambda: (source, old_tree(args.old, root), ""), "new": lambda: (source, "", ""),
                "server": lambda: (source, "", uri), "none": lambda: (unmonitored(source), "", "")}
        setups = {name: made[name]() for name in names}
        for repeat in range(args.repeats):
            for count in (int(h) for h in args.hogs.split(",")):
                for setup, (script, path, at) in setups.items():
                    with hogs(count):
                        row = trial(setup, os.path.join(root, f"{setup}-{count}-{repeat}"), script, path, at)
                    results.append(dict(row, hogs=count, repeat=repeat))
                    print(json.dumps(results[-1]), flush=True)
                for setup in [name for name in ("old", "new") if name in setups]:
                    with hogs(count):
                        row = close_trial(setup, os.path.join(root, f"close-{setup}-{count}-{repeat}"),
                                          setups[setup][1])
                    closes.append(dict(row, hogs=count, repeat=repeat))
                    print(json.dumps(closes[-1]), flush=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"trials": results, "closes": closes}, handle, indent=1)
    print("\n".join(table(results) + [""] + close_table(closes)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
