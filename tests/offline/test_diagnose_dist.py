"""msbridge diagnose on distributed runs: chronic stragglers (not one-off stalls) and the rank that went first."""
from __future__ import annotations

import json
import os

from helpers import synthetic_runs as sr

from msbridge.names import OWN_STEP_TIME
from msbridge.offline.diagnose import diagnose
from msbridge.sinks.base import Event
from msbridge.sinks.runlog import read_run


def findings(tmp_path, scenario, check, name="run"):
    report = diagnose(read_run(sr.write_run(tmp_path / name, scenario)))
    assert check in report.checks, report.skipped
    return [f for f in report.findings if f.check == check]


def test_a_rank_slower_for_consecutive_windows_is_a_chronic_straggler_a_stall_is_not(tmp_path):
    (found,) = findings(tmp_path, sr.straggler(rank=3, slower=0.3, slow_from=4, stall_rank=1, stall_window=6),
                        "straggler")
    assert found.ranks == [3] and found.level == "high"
    assert found.steps[0] == 40, "the first slow window ends at step 40"
    assert 25 <= found.evidence["mean_slower_pct"] <= 35 and found.evidence["longest_streak"] == 27
    assert "rank 3 is a chronic straggler" in found.title and "data pipeline" in found.advice


def test_the_runs_own_straggler_settings_decide(tmp_path):
    """Slow in 2 windows only: not chronic with the default 3 windows, chronic with windows: 2 in run.json."""
    scenario = sr.straggler(slow_from=29)  # windows 29 and 30 of 30
    assert findings(tmp_path, scenario, "straggler", "a") == []
    run_dir = tmp_path / "b"
    sr.write_run(run_dir, scenario)
    with open(os.path.join(run_dir, "run.json"), "w", encoding="utf-8") as fh:
        json.dump({"config": {"straggler": {"margin": 0.15, "windows": 2}}}, fh)
    (found,) = [f for f in diagnose(read_run(str(run_dir))).findings if f.check == "straggler"]
    assert found.evidence["windows_needed"] == 2 and found.evidence["streak_steps"] == [290, 300]


def test_the_rank_that_went_nonfinite_first_is_blamed_and_the_followers_listed(tmp_path):
    (found,) = findings(tmp_path, sr.nonfinite_on_one_rank(rank=2, at=160), "first_anomaly")
    assert found.ranks[0] == 2 and found.steps[0] == 160 and found.confidence == 1.0
    assert found.title == "rank 2 went non-finite first, at step 160; then ranks 0, 1, 3 at step 161"
    assert found.evidence["first_nonfinite_step"] == {"0": 161, "1": 161, "2": 160, "3": 161}


def test_a_live_blame_event_of_another_check_is_reported(tmp_path):
    scenario = sr.loss_spike(at=(150,), rank=1, world_size=2)
    scenario.events.append(Event("blame", 150, 0, 1150.0, {
        "blamed_rank": 1, "check": "loss_spike", "first_step": 150, "same_step_ranks": [1], "then": []}))
    blames = [f for f in findings(tmp_path, scenario, "first_anomaly") if "was first" in f.title]
    assert [(f.ranks, f.steps, f.title) for f in blames] == [([1], [150], "rank 1 was first: loss_spike at step 150")]


def test_stragglers_are_read_from_each_ranks_own_file(tmp_path):
    """A large job's rank 0 keeps no per-rank curves: each rank's own perf/own_step_time_ms is what is read."""
    scenario = sr.straggler(rank=2, slower=0.3, slow_from=4, stall_rank=1, stall_window=6)
    own = {step: {int(name.rsplit("_", 1)[1]): v for name, v in values.items()}
           for step, values in scenario.at_steps.items()}
    scenario.at_steps = {}
    run_dir = sr.write_run(tmp_path / "run", scenario)
    for rank in scenario.ranks:
        path = os.path.join(run_dir, "metrics", f"rank_{rank}.jsonl")
        lines = [json.loads(line) for line in open(path, encoding="utf-8")]
        for line in lines:
            if line["type"] == "metrics" and line["step"] in own:
                line["values"][OWN_STEP_TIME] = own[line["step"]][rank]
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
    run = read_run(run_dir)
    assert not [n for n in run.ranks[0].metric_names() if n.startswith("dist/step_time_ms/")]
    (found,) = [f for f in diagnose(run).findings if f.check == "straggler"]
    assert found.ranks == [2] and found.metric == OWN_STEP_TIME and found.steps[0] == 40
