"""Hostile run and experiment names on real training runs: distinct names never share a run, nothing escapes."""
from __future__ import annotations

import json
import os

import pytest
from helpers.training import train_regression

from msbridge import BridgeMonitor
from msbridge.errors import ConfigError
from msbridge.sinks.runlog import read_run


def train_named(base, experiment, run_name, steps):
    monitor = BridgeMonitor({"experiment": experiment, "run_name": run_name, "flush_steps": 5,
                             "output_dir": str(base / "{experiment}" / "{run_name}"), "sinks": ["jsonl"]},
                            progress=False)
    train_regression([monitor], steps=steps)
    return monitor


def run_json(monitor):
    with open(os.path.join(monitor.run_dir, "run.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.parametrize("first,second", [("run-ü", "run-é"), ("run-é", "run-e\u0301"), ("run-e", "run-е"),
                                          ("Run", "run"), ("a/b", "a_b"), ("a b", "a_b")])
@pytest.mark.slow
def test_two_names_are_two_runs_and_neither_resumes_the_other(tmp_path, first, second):
    one = train_named(tmp_path, "exp", first, steps=12)
    two = train_named(tmp_path, "exp", second, steps=8)
    assert one.run_dir != two.run_dir
    assert run_json(one)["run_name"] == first and run_json(two)["run_name"] == second
    assert [r.step for r in read_run(one.run_dir).ranks[0].records] == list(range(1, 13))
    log_two = read_run(two.run_dir).ranks[0]
    assert [r.step for r in log_two.records] == list(range(1, 9)) and not [e for e in log_two.events
                                                                           if e.kind == "resume"]
    assert run_json(one)["run_id"] != run_json(two)["run_id"]


@pytest.mark.parametrize("experiment,run_name", [("../../outside", "../../../etc"), ("/abs", "/tmp/x"),
                                                 ("nul\x00exp", "nul\x00run"), (".", ".."), ("x" * 300, "实验" * 90)])
def test_a_hostile_name_stays_inside_the_output_dir(tmp_path, experiment, run_name):
    base = tmp_path / "runs"
    monitor = train_named(base, experiment, run_name, steps=6)
    assert os.path.commonpath([monitor.run_dir, str(base)]) == str(base)
    assert os.path.dirname(os.path.dirname(monitor.run_dir)) == str(base)
    assert sorted(os.listdir(tmp_path)) == ["runs"], "nothing was written beside the output dir"
    assert run_json(monitor)["run_name"] == run_name


@pytest.mark.slow
def test_a_dir_holding_a_run_of_another_name_is_refused_before_training(tmp_path):
    """``output_dir`` without ``{run_name}``: both names map to one dir. The second is refused in the
    constructor (one line naming the dir and both names); the same name again resumes (from step 1: with
    resume: true, else it is refused at train begin, tests/run/test_rerun.py)."""
    fixed = str(tmp_path / "out")

    def config(run_name):
        return {"run_name": run_name, "output_dir": fixed, "flush_steps": 5, "sinks": ["jsonl"]}

    def snapshot():
        return {os.path.join(root, name): open(os.path.join(root, name), "rb").read()
                for root, _, names in os.walk(fixed) for name in names}

    first = BridgeMonitor(config("run-ü"), progress=False)
    train_regression([first], steps=6)
    before = snapshot()
    with pytest.raises(ConfigError) as refused:
        BridgeMonitor(config("run-u"), progress=False)
    assert str(refused.value) == (
        f"output_dir {fixed!r} holds the run 'run-ü', not 'run-u': a run resumes only a run of the same name; "
        "to resume it set run_name: 'run-ü', for a new run put {run_name} in output_dir (or choose another one)")
    assert snapshot() == before, "the refused run wrote nothing"
    assert run_json(first)["run_name"] == "run-ü"
    assert [r.step for r in read_run(fixed).ranks[0].records] == list(range(1, 7))

    again = BridgeMonitor(dict(config("run-ü"), resume=True), progress=False)
    train_regression([again], steps=6)
    assert again.run.resumed_from_step == 6 and again.run.run_id == first.run.run_id
