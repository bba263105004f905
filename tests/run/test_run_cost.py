"""The run's outcome says what monitoring cost it (run.json's ``monitoring cost``, the README's line), counted as
``msbridge.run.cost`` says: msbridge's threads (also those that end in the close), its child processes (also
reaped ones) and its step hooks on the training thread."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from helpers.training import train_regression
import pytest

from msbridge import BridgeMonitor, Sink
from msbridge.bench import probes
from msbridge.run import cost

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts from Linux's /proc")

FIELDS = {"cpu_s", "us_per_step", "off_training_thread_us_per_step", "training_thread_us_per_step", "steps"}
LINE = re.compile(r"^- monitoring cost: (?P<cpu>[\d.]+) CPU-s, (?P<us>[\d,]+) µs a step \((?P<off>[\d,]+) off the "
                  r"training thread, (?P<on>[\d,]+) on it\) over (?P<steps>[\d,]+) steps; (?P<close>[\d.]+) CPU-s of it in the "
                  r"close$", re.M)


def burn(seconds: float) -> float:
    """Spin on this thread for ``seconds`` of its own CPU; returns the CPU seconds it spent."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    return time.thread_time() - start


class BurnsInClose(Sink):
    """Spends CPU on its host thread in ``close``: that thread has ended before the outcome is written."""

    name = "burns-in-close"

    def __init__(self, seconds: float = 0.3) -> None:
        super().__init__()
        self.seconds, self.burned = seconds, 0.0

    def write(self, records, events):
        return None

    def close(self, status="FINISHED"):
        self.burned = burn(self.seconds)
        return super().close(status)


class ChildBurnsInClose(BurnsInClose):
    """Starts a child process marked as msbridge's (as the MLflow client is) that waits, and in the close, told to
    end, spends CPU and exits, as the MLflow client does its last writes."""

    name = "child-burns-in-close"

    def open(self, run):
        super().open(run)
        code = (f"# {cost.CHILD_MARK}test_child\nimport sys, time\nsys.stdin.readline()\nstart = time.process_time()\n"
                f"while time.process_time() - start < {self.seconds}: pass\nprint(time.process_time())")
        self.child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)

    def close(self, status="FINISHED"):
        self.burned = float(self.child.communicate("end\n", timeout=60)[0])  # waited for: reaped in the close
        return Sink.close(self, status)


def run_outcome(tmp_path, sinks=(), steps=24):
    monitor = BridgeMonitor({"output_dir": str(tmp_path / "run"), "flush_steps": 5, "sinks": ["jsonl"]},
                            sinks=list(sinks), progress=False)
    train_regression([monitor], steps=steps)
    with open(os.path.join(monitor.run_dir, "run.json")) as fh:
        outcome = json.load(fh)["outcome"]
    with open(os.path.join(monitor.run_dir, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    return monitor, outcome, readme


def test_a_real_run_says_what_monitoring_cost_it(tmp_path):
    monitor, outcome, readme = run_outcome(tmp_path)
    spent = outcome[cost.KEY]
    assert FIELDS <= set(spent)
    assert spent["steps"] == 24 == monitor.steps_recorded
    assert spent["cpu_s"] > 0 and spent["us_per_step"] > 0
    assert spent["off_training_thread_us_per_step"] > 0  # jsonl's host thread wrote every step
    assert spent["training_thread_us_per_step"] > 0  # the step hooks always take some time
    assert spent["us_per_step"] == pytest.approx(spent["cpu_s"] / spent["steps"] * 1e6, abs=0.11)
    assert spent["us_per_step"] == pytest.approx(
        spent["off_training_thread_us_per_step"] + spent["training_thread_us_per_step"], abs=0.21)
    line = LINE.search(readme)
    assert line is not None, readme
    assert float(line["cpu"]) == pytest.approx(spent["cpu_s"], abs=0.006)
    assert int(line["us"].replace(",", "")) == pytest.approx(spent["us_per_step"], abs=0.51)
    assert int(line["steps"]) == 24
    assert float(line["close"]) == pytest.approx(spent["close_cpu_s"], abs=0.006) and spent["close_cpu_s"] >= 0


def test_a_sink_thread_that_ended_in_the_close_is_counted(tmp_path):
    sink = BurnsInClose(0.3)
    _, outcome, _ = run_outcome(tmp_path, [sink])
    spent = outcome[cost.KEY]
    assert sink.burned >= 0.3
    # its host thread is gone when the outcome is written: the kernel's process total still holds what it spent
    assert spent["close_cpu_s"] >= 0.95 * sink.burned
    assert spent["off_training_thread_us_per_step"] * spent["steps"] / 1e6 >= 0.95 * sink.burned


def test_a_child_process_reaped_in_the_close_is_counted(tmp_path):
    sink = ChildBurnsInClose(0.3)
    _, outcome, _ = run_outcome(tmp_path, [sink])
    spent = outcome[cost.KEY]
    assert sink.burned >= 0.3
    assert spent["cpu_s"] >= 0.95 * sink.burned


def test_the_bench_counts_with_the_same_code():
    assert probes.threads_cpu_s is cost.threads_cpu_s
    assert probes.live_children_cpu_s is cost.live_children_cpu_s


def test_the_count_of_a_live_thread_and_child_follows_what_they_spent():
    import threading

    spent = {}
    go = threading.Event()

    def work():
        spent["cpu"] = burn(0.2)
        go.wait(30)

    worker = threading.Thread(target=work, name="msbridge-test-burn", daemon=True)
    worker.start()
    while "cpu" not in spent:
        time.sleep(0.01)
    try:
        assert cost.threads_cpu_s("msbridge-test-burn") >= 0.95 * spent["cpu"]
    finally:
        go.set()
        worker.join()
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass\n"
                              "print(time.process_time(), flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE,
                             text=True)
    try:
        child_cpu = float(child.stdout.readline())
        assert cost.children_cpu()[child.pid] >= 0.95 * child_cpu
        assert child.pid not in cost.children_cpu(cost.CHILD_MARK)  # not msbridge's: its command line lacks the mark
    finally:
        child.kill()
        child.wait()


def test_a_run_without_steps_has_no_figure_a_step():
    assert cost.describe(cost.figures(0.25, 0.0, 0)) == "0.25 CPU-s (no step trained)"
    assert cost.figures(0.25, 0.0, 0)["us_per_step"] is None
