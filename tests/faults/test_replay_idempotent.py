"""Replay into TensorBoard and MindInsight is idempotent, and gives a killed run its outcome.

A run trained with jsonl, TensorBoard and MindInsight is replayed into both twice: the point count of
``train/loss`` (TensorBoard's own EventAccumulator) equals the number of steps, and a replay that brings
nothing new adds no file. A training process killed with SIGKILL is replayed: run.json and README.md
get the outcome KILLED, and TensorBoard gets its status once.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.processes import stop_group
from helpers.runs import make_records, make_run
from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.adapters.mindinsight_sink import MindInsightSink, rank_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.demo import demo_config, train
from msbridge.run.metadata import write_run_files
from msbridge.sinks.base import Event
from msbridge.sinks.runlog import read_run

STEPS = 40
SINKS = ["jsonl", "tensorboard", "mindinsight"]


def tb_dir(run_dir: str) -> str:
    return os.path.join(os.path.dirname(run_dir), "tensorboard", os.path.basename(run_dir), "rank_0")


def tb_points(run_dir: str, tag: str = "train/loss"):
    acc = EventAccumulator(tb_dir(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc, [e.step for e in acc.Scalars(tag)]


def mi_points(run_dir: str):
    meta = json.loads(Path(run_dir, "run.json").read_text())
    run = make_run(os.path.dirname(os.path.dirname(run_dir)), name=meta["run_name"],
                   experiment=os.path.basename(os.path.dirname(run_dir)))
    return [s for s, _ in MindInsightSink().read_back(run)["train/loss"]]


def files(run_dir: str):
    exp = os.path.dirname(run_dir)
    return sorted(glob.glob(os.path.join(exp, "tensorboard", "**", "events.*"), recursive=True)
                  + glob.glob(os.path.join(exp, "summary", "*", "events.*")))


def replay_twice(run_dir: str):
    """Replay into TensorBoard and MindInsight; returns the files after the first round, checks the second adds none."""
    for sink in ("tensorboard", "mindinsight"):
        assert main(["replay", run_dir, "--to", sink]) == 0
    after_first = files(run_dir)
    for sink in ("tensorboard", "mindinsight"):
        assert main(["replay", run_dir, "--to", sink]) == 0
    assert files(run_dir) == after_first, "a replay that brings nothing new adds no file"
    return after_first


@pytest.mark.slow
def test_replaying_a_finished_run_twice_adds_no_point_and_no_file(tmp_path):
    cfg = demo_config(str(tmp_path), {"experiment": "idem", "run_name": "done", "sinks": SINKS, "flush_steps": 10})
    monitor = BridgeMonitor(cfg, progress=False)
    train(monitor, STEPS, cfg["params"])
    before = files(monitor.run_dir)
    assert replay_twice(monitor.run_dir) == before, "the live run holds everything: replay adds nothing"
    acc, steps = tb_points(monitor.run_dir)
    assert steps == list(range(1, STEPS + 1))
    assert [e.step for e in acc.Tensors("run/status")] == [STEPS]
    assert mi_points(monitor.run_dir) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_replay_into_an_empty_tracker_then_again(tmp_path):
    """Trained with jsonl only (the trackers elsewhere): the first replay writes everything, the second nothing."""
    cfg = demo_config(str(tmp_path), {"experiment": "idem", "run_name": "offline", "sinks": ["jsonl"]})
    monitor = BridgeMonitor(cfg, progress=False)
    train(monitor, STEPS, cfg["params"])
    replay_twice(monitor.run_dir)
    acc, steps = tb_points(monitor.run_dir)
    assert steps == list(range(1, STEPS + 1)), "each step once, after two replays"
    assert mi_points(monitor.run_dir) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_a_run_killed_with_sigkill_gets_its_outcome_from_replay(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "msbridge.cli.main", "demo", "--steps", "20000", "--out", str(out),
           "--set", f"sinks=[{', '.join(SINKS)}]", "--set", "run_name=killed", "--set", "flush_steps=10",
           "--set", "experiment=idem"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wal = out / "idem" / "killed" / "metrics" / "rank_0.jsonl"
    try:
        deadline = time.monotonic() + 180
        while not (wal.exists() and wal.read_text().count('"type":"metrics"') >= 60):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the demo did not reach 60 recorded steps"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        stop_group(proc.pid, (signal.SIGKILL,))
    run_dir = str(out / "idem" / "killed")
    assert "outcome" not in json.loads(Path(run_dir, "run.json").read_text()), "SIGKILL: no outcome yet"

    replay_twice(run_dir)
    meta = json.loads(Path(run_dir, "run.json").read_text())
    records = [r for r in read_run(run_dir).ranks[0].records if "train/loss" in r.values]  # evaluations aside
    assert meta["outcome"]["status"] == "KILLED" and meta["outcome"]["steps recorded"] == len(records)
    assert meta["outcome"]["last step"] == records[-1].step
    readme = Path(run_dir, "README.md").read_text()
    assert "## Outcome" in readme and "- status: KILLED" in readme
    acc, steps = tb_points(run_dir)
    assert steps == [r.step for r in records], "every step once: what the live run wrote plus what replay added"
    assert [t.tensor_proto.string_val[0] for t in acc.Tensors("run/status")] == [b"KILLED"], "the status once"
    assert mi_points(run_dir) == [r.step for r in records]
    assert os.listdir(rank_dir(os.path.join(out, "idem", "summary"), "killed", 0))


@pytest.mark.parametrize("events, status", [
    ([], "KILLED"),
    ([Event("interrupt", 8, 0, 1.0, {"signal": "SIGTERM"})], "KILLED"),
    ([Event("exception", 8, 0, 1.0, {"type": "RuntimeError"})], "FAILED"),
    ([Event("action", 8, 0, 1.0, {"check": "nonfinite", "action": "stop"})], "FAILED"),
    ([Event("early_stop", 8, 0, 1.0, {"check": "plateau"})], "FINISHED"),
    ([Event("job_stop", 8, 0, 1.0, {"check": "plateau", "status": "FINISHED"})], "FINISHED"),
    ([Event("exception", 4, 0, 1.0, {"type": "RuntimeError"}), Event("resume", 4, 0, 2.0, {})], "KILLED"),
])
def test_a_run_without_an_outcome_gets_the_status_its_log_ends_with(tmp_path, events, status):
    run = make_run(tmp_path, name="cut", experiment="idem", config={"experiment": "idem"})
    sink = JsonlSink()
    sink.open(run)
    sink.write(make_records(range(1, 9)), events)
    sink.close()
    write_run_files(run.run_dir, {"run_id": run.run_id, "run_name": "cut", "config": {"experiment": "idem"}}, "# cut\n")
    assert main(["replay", run.run_dir, "--to", "tensorboard"]) == 0
    outcome = json.loads(Path(run.run_dir, "run.json").read_text())["outcome"]
    assert outcome["status"] == status and outcome["steps recorded"] == 8 and outcome["last step"] == 8
    assert outcome["final loss"] == make_records(range(1, 9))[-1].values["train/loss"]
    assert f"- status: {status}" in Path(run.run_dir, "README.md").read_text()
    acc, steps = tb_points(run.run_dir)
    assert steps == list(range(1, 9))
    assert [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("run/status")] == [status]
