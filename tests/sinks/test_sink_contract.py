"""The contract every registered sink keeps, checked with each tracker's own reader.

open/write/flush/close, an empty run, non-finite values, events, a resumed run,
10k steps: what a sink was handed is what its ``read_back`` gives back, step for
step. The sinks come from the registry and the readers from the sinks: a new
sink is checked here without touching this file.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import List

import pytest
from helpers.runs import make_records, make_run

from msbridge.sinks.base import Event, Record, RunInfo, Series
from msbridge.sinks.registry import builtin_names, resolve

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)
SINKS = builtin_names()


def contract_run(tmp_path, **fields) -> RunInfo:
    return make_run(tmp_path, name="contract", experiment="contract",
                    config={"params": {"optimizer": {"learning_rate": 0.01}}, "experiment": "contract"},
                    metadata={"world_size": 1}, readme="# contract\n", **fields)


def open_sink(name: str, run: RunInfo):
    sink = resolve(name)()
    sink.open(run)
    return sink


def assert_series(got: Series, records: List[Record]) -> None:
    """Every metric of ``records``, with exactly their steps (checked first), then their values
    (float32 trackers: to 1e-6; a non-finite value stays non-finite)."""
    assert set(got) >= set(records[0].values)
    for name in records[0].values:
        want = [(r.step, r.values[name]) for r in records]
        assert [s for s, _ in got[name]] == [s for s, _ in want], name
        for (step, value), (_, expected) in zip(got[name], want):
            if math.isfinite(expected):
                assert value == pytest.approx(expected, rel=1e-6), (name, step)
            else:
                assert value is None or not math.isfinite(value), (name, step)


@pytest.mark.parametrize("name", SINKS)
def test_open_write_flush_close_reads_back(tmp_path, name):
    run = contract_run(tmp_path)
    sink = open_sink(name, run)
    records = make_records(range(1, 51))
    sink.write(records[:20], [])
    sink.flush()
    sink.write(records[20:], [Event("anomaly", 30, 0, 1.0, {"check": "loss_spike", "value": 9.5})])
    sink.close("FINISHED")
    assert_series(sink.read_back(run), records)


@pytest.mark.parametrize("name", SINKS)
def test_empty_run(tmp_path, name):
    run = contract_run(tmp_path)
    sink = open_sink(name, run)
    sink.close("KILLED")
    assert not [k for k, v in sink.read_back(run).items() if v and k.startswith("train/")]


@pytest.mark.parametrize("name", SINKS)
def test_non_finite_values_stay_visible(tmp_path, name):
    run = contract_run(tmp_path)
    sink = open_sink(name, run)
    records = make_records(range(1, 6))
    records[2] = Record(3, 0, records[2].time, {**records[2].values, "train/loss": math.nan,
                                                 "train/global_loss": math.inf})
    sink.write(records, [])
    sink.close("FAILED")
    got = sink.read_back(run)
    loss = dict(got["train/loss"])
    assert sorted(loss) == [1, 2, 3, 4, 5], "the non-finite step is neither dropped nor breaks the others"
    assert math.isnan(loss[3]) and loss[4] == pytest.approx(records[3].values["train/loss"], rel=1e-6)
    assert not math.isfinite(dict(got["train/global_loss"])[3])


@pytest.mark.parametrize("name", SINKS)
def test_a_resumed_run_never_holds_a_step_twice(tmp_path, name):
    """The job dies after step 10 and resumes from its step-6 checkpoint: steps 7-10 are handed over again."""
    run = contract_run(tmp_path)
    first = open_sink(name, run)
    first.write(make_records(range(1, 11)), [])
    first.close("KILLED")
    again = open_sink(name, replace(run, resumed_from_step=10))
    again.write(make_records(range(7, 16), seed=1), [])
    again.close("FINISHED")
    want = make_records(range(1, 11)) + make_records(range(7, 16), seed=1)[4:]
    assert_series(again.read_back(run), want)


@pytest.mark.parametrize("name", SINKS)
def test_ten_thousand_steps(tmp_path, name):
    run = contract_run(tmp_path)
    sink = open_sink(name, run)
    records = make_records(range(1, 10_001))
    for start in range(0, len(records), 100):  # one batch per flush window of 100 steps
        sink.write(records[start:start + 100], [])
    sink.close("FINISHED")
    got = sink.read_back(run)
    assert [s for s, _ in got["train/loss"]] == list(range(1, 10_001))
    assert got["train/loss"][-1][1] == pytest.approx(records[-1].values["train/loss"], rel=1e-6)
