"""The contract every built-in sink keeps, checked with each tracker's own reader.

open/write/flush/close, an empty run, non-finite values, events, 10k steps: what a
sink was handed is what its reader gives back, step for step.
"""
from __future__ import annotations

import glob
import math
import os
import struct
from typing import Dict, List, Tuple

import pytest

from msbridge.sinks.base import Event, Record, RunInfo
from msbridge.sinks.registry import BUILTINS, resolve

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)
Series = Dict[str, List[Tuple[int, float]]]
SINKS = list(BUILTINS)


def run_info(tmp_path) -> RunInfo:
    return RunInfo(run_id="c0ffee", run_name="contract", experiment="contract", rank=0, world_size=1,
                   is_global=True, run_dir=str(tmp_path / "contract" / "contract"),
                   config={"params": {"optimizer": {"learning_rate": 0.01}}, "experiment": "contract"},
                   metadata={"world_size": 1}, readme="# contract\n")


def make_records(steps: int, start: int = 1) -> List[Record]:
    return [Record(s, 0, 1_700_000_000.0 + s,
                   {"train/loss": 10.0 / s, "train/lr": 0.01, "perf/samples_per_s": 100.0 + s % 7,
                    "train/global_loss": 10.0 / s})
            for s in range(start, start + steps)]


# -- each tracker's own reader ------------------------------------------------------------------
def read_jsonl(run: RunInfo, sink) -> Series:
    from msbridge.sinks.runlog import read_run

    log = read_run(run.run_dir).ranks[0]
    return {name: log.series(name) for name in log.metric_names()}


def read_tensorboard(run: RunInfo, sink) -> Series:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: Series = {}
    for path in {os.path.dirname(p) for p in glob.glob(os.path.join(sink.describe(run)["where"], "**",
                                                                    "events.out.tfevents.*"), recursive=True)}:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {k: sorted(v) for k, v in out.items()}


def read_mlflow(run: RunInfo, sink) -> Series:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run.experiment_dir}/mlflow.db")
    (found,) = client.search_runs([client.get_experiment_by_name(run.experiment).experiment_id])
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, k))
            for k in found.data.metrics}


def read_mindinsight(run: RunInfo, sink) -> Series:
    from mindspore.train.summary_pb2 import Event as SummaryEvent

    out: Series = {}
    for path in sorted(glob.glob(os.path.join(sink.describe(run)["where"], "*_MS"))):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):  # framing: u64 length, u32 crc, payload, u32 crc
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = SummaryEvent.FromString(data[pos + 12:pos + 12 + length])
            pos += 16 + length
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.scalar_value))
    return out


READERS = {"jsonl": read_jsonl, "tensorboard": read_tensorboard, "mlflow": read_mlflow,
           "mindinsight": read_mindinsight}


def open_sink(name: str, run: RunInfo):
    sink = resolve(name)()
    sink.open(run)
    return sink


def assert_series(got: Series, records: List[Record]) -> None:
    for name in records[0].values:
        want = [(r.step, r.values[name]) for r in records]
        assert [s for s, _ in got[name]] == [s for s, _ in want], name
        assert [v for _, v in got[name]] == pytest.approx([v for _, v in want], rel=1e-6, nan_ok=True), name


@pytest.mark.parametrize("name", SINKS)
def test_open_write_flush_close_reads_back(tmp_path, name):
    run = run_info(tmp_path)
    sink = open_sink(name, run)
    records = make_records(50)
    sink.write(records[:20], [])
    sink.flush()
    sink.write(records[20:], [Event("anomaly", 30, 0, 1.0, {"check": "loss_spike", "value": 9.5})])
    sink.close("FINISHED")
    assert_series(READERS[name](run, sink), records)


@pytest.mark.parametrize("name", SINKS)
def test_empty_run(tmp_path, name):
    run = run_info(tmp_path)
    sink = open_sink(name, run)
    sink.close("KILLED")
    assert not [k for k, v in READERS[name](run, sink).items() if v and k.startswith("train/")]


@pytest.mark.parametrize("name", SINKS)
def test_non_finite_values_stay_visible(tmp_path, name):
    run = run_info(tmp_path)
    sink = open_sink(name, run)
    records = make_records(5)
    records[2] = Record(3, 0, records[2].time, {**records[2].values, "train/loss": math.nan,
                                                 "train/global_loss": math.inf})
    sink.write(records, [])
    sink.close("FAILED")
    got = READERS[name](run, sink)
    loss = dict(got["train/loss"])
    assert sorted(loss) == [1, 2, 3, 4, 5], "the non-finite step is neither dropped nor breaks the others"
    assert math.isnan(loss[3]) and loss[4] == pytest.approx(2.5)
    assert not math.isfinite(dict(got["train/global_loss"])[3])


@pytest.mark.parametrize("name", SINKS)
def test_ten_thousand_steps(tmp_path, name):
    run = run_info(tmp_path)
    sink = open_sink(name, run)
    records = make_records(10_000)
    for start in range(0, len(records), 100):  # one batch per flush window of 100 steps
        sink.write(records[start:start + 100], [])
    sink.close("FINISHED")
    got = READERS[name](run, sink)
    assert [s for s, _ in got["train/loss"]] == list(range(1, 10_001))
    assert got["train/loss"][-1][1] == pytest.approx(10.0 / 10_000, rel=1e-6)
