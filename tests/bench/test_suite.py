"""``msbridge bench``: ratios paired per repeat, the targets, every setup buildable, and (slow) a real bench,
and a real bench stopped by Ctrl-C or SIGTERM."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.processes import alive, command_line, family, stop_group

from msbridge.bench.suite import BASELINE, SETUPS, TARGETS, check_targets, markdown, summarise
from msbridge.bench.worker import TRAIN_STEP_SETUPS, builders


def _result(repeat, steps_per_s, **extra):
    values = {"repeat": repeat, "steps_per_s": steps_per_s, "median_step_ms": 1e3 / steps_per_s,
              "cpu_ms_per_step": 5.0, "peak_rss_mb": 500.0, "idle_cpu_per_s": 0.0}
    values.update(extra)
    return values


def test_bench_ratios_pair_each_repeat_with_the_baseline_of_the_same_repeat():
    runs = {"a": [_result(0, 100.0), _result(1, 50.0), _result(2, 60.0)],
            "e": [_result(1, 49.5, monitor_us_median=12.0, monitor_us_mean=30.0, threads_us_per_step=90.0,
                          children_us_per_step=70.0),
                  _result(0, 99.0, monitor_us_median=14.0, monitor_us_mean=35.0, threads_us_per_step=100.0,
                          children_us_per_step=50.0),
                  _result(2, 50.0, monitor_us_median=13.0, monitor_us_mean=32.0, threads_us_per_step=110.0,
                          children_us_per_step=60.0)],
            "d": [{"setup": "d", "error": "ValueError: could not convert string to float: '[0.00015]'"}]}
    rows = {s: summarise(s, runs) for s in runs}
    assert rows["e"]["ratio"] == pytest.approx(0.99), "the median of per-repeat ratios (0.99, 0.99, 0.833)"
    assert rows["e"]["ratio_min"] == pytest.approx(50 / 60)
    assert rows["e"]["monitor_us_median"] == 13.0
    # (32 + 100 + 60) us of CPU a step, of the median step (20 ms: 50 steps/s)
    assert rows["e"]["cpu_share"] == pytest.approx(192e-6 / 20e-3)
    report = {"steps": 300, "repeats": 3, "seed": 7, "python": "3.11", "machine": "x86_64, 2 CPU",
              "load_avg_1min": [1.0, 2.0], "minutes": 3.0, "rows": list(rows.values())}
    report["targets"] = check_targets(report)
    assert report["targets"]["ratio_e"]["met"] is True
    assert report["targets"]["monitor_us_median"]["met"] is True
    assert report["targets"]["idle_cpu_above_a"]["met"] is True
    assert report["targets"]["cpu_share_e"]["met"] is True
    table = markdown(report)
    assert "| (d) |" in table and "n/a: ValueError" in table
    assert "| (e) | msbridge, all sinks, every step | " in table and "0.990 (0.833-0.990)" in table
    assert "| 100 + 60 | 0.96% |" in table
    rows["e"]["cpu_share"] = 0.012
    assert check_targets(report)["cpu_share_e"]["met"] is False


@pytest.mark.slow
def test_bench_runs_setups_in_fresh_processes_and_writes_the_table(tmp_path):
    from msbridge.bench.suite import run_bench

    report = run_bench(["f"], steps=40, repeats=1, out=str(tmp_path / "out"), stall_s=0.2, echo=lambda _: None)
    rows = {r["setup"]: r for r in report["rows"]}
    assert set(rows) == {"a", "f"} and all("error" not in r for r in rows.values())
    assert rows["f"]["steps_recorded"] == 40 and rows["f"]["ratio"] > 0
    assert rows["f"]["idle_cpu_per_s"] is not None and rows["f"]["monitor_us_median"] > 0
    # msbridge's threads are found in (f) (40 steps: no flush between the marks, so they may be idle), not in (a)
    assert rows["f"]["threads_us_per_step"] is not None and rows["a"]["threads_us_per_step"] is None
    assert 0 < rows["f"]["cpu_share"] < 1
    assert "| (f) | msbridge, jsonl only |" in (tmp_path / "out" / "bench.md").read_text()
    assert not (tmp_path / "out" / "work" / "f-r0").exists(), "run outputs are removed unless --keep"


def test_every_setup_has_a_builder_and_nothing_is_built_to_check():
    """A merge once lost two setups' builders: the bench then failed only when those setups ran."""
    built = builders("/nonexistent/work", steps=10, lr=None, tracking_uri="")
    assert set(built) == set(SETUPS)
    assert all(callable(b) for b in built.values())


def test_setups_compared_with_trainstep_train_with_trainstep():
    on_ring = {s for s, base in BASELINE.items() if base == "a_ts"} | {"a_ts"}
    assert on_ring == {"a_ts", "g", "ln", "hist"} and on_ring <= set(TRAIN_STEP_SETUPS)
    assert set(TRAIN_STEP_SETUPS) <= set(SETUPS)


def test_hist_is_paired_with_a_ts_and_checked_against_its_target():
    runs = {"a": [_result(0, 100.0), _result(1, 90.0)], "a_ts": [_result(0, 80.0), _result(1, 70.0)],
            "hist": [_result(0, 78.0), _result(1, 66.5)]}
    rows = {s: summarise(s, runs) for s in runs}
    assert rows["hist"]["baseline"] == "a_ts"
    assert rows["hist"]["ratio"] == pytest.approx((78 / 80 + 66.5 / 70) / 2)  # median of 0.975 and 0.95
    report = {"rows": list(rows.values())}
    targets = check_targets(report)
    assert TARGETS["ratio_hist"] == 0.97
    assert targets["ratio_hist"]["target"] == ">= 0.97"
    assert targets["ratio_hist"]["measured"] == pytest.approx(0.9625) and targets["ratio_hist"]["met"] is False


def _wait_for_a_setup_training(proc: subprocess.Popen, timeout: float = 300.0) -> set:
    """The bench's processes once its first setup trains: its servers are healthy by then."""
    deadline = time.monotonic() + timeout
    while not any("msbridge.bench.worker" in command_line(pid) for pid in family(proc.pid)):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no setup started training in time"
        time.sleep(0.5)
    return family(proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_bench_stops_its_mlflow_server_and_says_so_in_one_line(tmp_path, how):
    """``msbridge bench`` with a real ``mlflow server`` (in a session of its own, so a Ctrl-C does not reach it),
    stopped while a setup trains: by Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) or by
    a SIGTERM to the ``msbridge`` process alone (``kill PID``, a scheduler). The bench exits 128 + the signal with
    one line and no traceback, and none of its processes is left: not the server, not the training."""
    msbridge = str(Path(sys.executable).parent / "msbridge")
    proc = subprocess.Popen([msbridge, "bench", "--setups", "e_srv", "--repeats", "1", "--steps", "100000",
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=dict(os.environ, GLOG_v="3"))
    started = {proc.pid}
    try:
        started = _wait_for_a_setup_training(proc)
        assert any(command_line(pid).split()[1:4] == ["-m", "mlflow", "server"] for pid in started), \
            [command_line(pid) for pid in started]
        sig = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
        if how == "ctrl-c":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out = proc.communicate(timeout=120)[0]
        left = {pid: command_line(pid) for pid in alive(started)}
    finally:  # whatever failed, nothing of this bench outlives the test
        started |= family(proc.pid)
        for pid in alive(started):
            with contextlib.suppress(ProcessLookupError):
                stop_group(os.getpgid(pid), wait_s=5)
    assert proc.returncode == 128 + sig, out
    assert f"msbridge: bench stopped by {sig.name}; its servers and the setup running were stopped" in out, out
    assert "Traceback" not in out, out
    assert not left, left
