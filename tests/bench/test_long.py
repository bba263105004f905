"""The long-run bench setup, with tiny settings: the run it builds is a run msbridge reads back whole, and each
timed command runs in a child whose own peak memory is reported (wall clock is printed, never asserted)."""
from __future__ import annotations

import json
import os

from msbridge.bench import long as bench_long
from msbridge.sinks.runlog import read_run


def test_the_run_is_built_and_diagnose_is_timed_in_a_child(tmp_path):
    report = bench_long.run_bench(str(tmp_path), steps=2000, only=["diagnose"])
    run = read_run(os.path.join(tmp_path, bench_long.EXPERIMENT, bench_long.RUN_NAME))
    log = run.ranks[0]
    assert [r.step for r in log.records] == list(range(1, 2001))
    assert len(log.metric_names()) == report["metrics"] == 20
    assert {e.kind for e in log.events} == {"anomaly", "recovery", "straggler", "checkpoint"}
    (row,) = report["rows"]
    assert row["what"] == "diagnose" and row["exit"] == 0 and 0 < row["peak_mb"] < 1024
    assert report["targets"]["diagnose_peak_mb"]["met"] is True
    assert report["targets"]["replay_tensorboard_s"]["measured"] is None, "not run: no figure"
    assert json.load(open(tmp_path / "bench_long.json"))["rows"] == report["rows"]
