"""BridgeMonitor on real MindSpore training (CPU): every step recorded, values exact, nothing lost."""
from __future__ import annotations

import json
import logging
import math
import threading
from importlib.metadata import version

import numpy as np
import pytest
from helpers.runs import monitor
from helpers.training import OutputRecorder, train_regression
import mindspore as ms
from mindspore import nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from msbridge import BridgeMonitor, ConfigError, Sink
from msbridge.capture.host_buffer import StepBuffer
from msbridge.sinks.registry import available
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)


@pytest.mark.parametrize("mode,sink_mode", [("graph", False), ("graph", True), ("pynative", False), ("pynative", True)])
def test_every_step_recorded_with_the_networks_loss(tmp_path, mode, sink_mode):
    mon, ref = monitor(tmp_path), OutputRecorder()
    train_regression([mon, ref], steps=12, epochs=2, mode=mode, sink_mode=sink_mode)

    log = read_run(mon.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 25)) == ref.steps
    np.testing.assert_allclose([v for _, v in log.series("train/loss")], ref.losses, rtol=1e-6)
    assert [r.values["train/epoch"] for r in log.records] == [1.0] * 12 + [2.0] * 12
    assert all(r.values["perf/step_time_ms"] > 0 and r.values["perf/samples_per_s"] > 0 for r in log.records)
    assert log.truncated == 0


@pytest.mark.slow
def test_lr_follows_the_schedule(tmp_path):
    mon = monitor(tmp_path)
    train_regression([mon], steps=20, learning_rate=nn.ExponentialDecayLR(0.1, 0.9, 4))
    lr = dict(read_run(mon.run_dir).ranks[0].series("train/lr"))
    expected = {s: 0.1 * 0.9 ** ((s - 1) / 4) for s in range(1, 21)}  # step s used the schedule at s-1
    np.testing.assert_allclose([lr[s] for s in expected], list(expected.values()), rtol=1e-5)


@pytest.mark.slow
def test_lr_from_a_dynamic_list_and_a_fixed_value(tmp_path):
    table = [0.05] * 5 + [0.01] * 5 + [0.002] * 10
    mon = monitor(tmp_path / "list")
    train_regression([mon], steps=20, learning_rate=table)
    assert [v for _, v in read_run(mon.run_dir).ranks[0].series("train/lr")] == pytest.approx(table)

    mon = monitor(tmp_path / "fixed")
    train_regression([mon], steps=6, learning_rate=0.03)
    assert [v for _, v in read_run(mon.run_dir).ranks[0].series("train/lr")] == pytest.approx([0.03] * 6)


class _StepwiseWarmup(LearningRateSchedule):
    """Python control flow on the step, as mindformers' schedules have: it cannot be evaluated for many steps in one
    call, so the monitor evaluates it one step at a time."""

    def construct(self, global_step):
        if global_step < 4:
            return ops.cast(global_step + 1, ms.float32) * 0.01
        return ops.cast(global_step, ms.float32) * 0.0 + 0.04


def _drain_threads(monkeypatch) -> list:
    """The name of the thread of every ``StepBuffer.drain`` from here on."""
    names, drain = [], StepBuffer.drain

    def noted(self, lr_at=None):
        names.append(threading.current_thread().name)
        return drain(self, lr_at)
    monkeypatch.setattr(StepBuffer, "drain", noted)
    return names


@pytest.mark.slow
def test_on_cpu_the_steps_drain_on_the_converter_thread_each_once_at_its_rate(tmp_path, monkeypatch):
    """On CPU a step's outputs are in host memory: the flushes during training leave the drain (the reads, the
    learning rate) to ``msbridge-convert``; the close drains the last steps on the training thread."""
    threads = _drain_threads(monkeypatch)
    mon, ref = monitor(tmp_path), OutputRecorder()
    train_regression([mon, ref], steps=23, learning_rate=nn.ExponentialDecayLR(0.1, 0.9, 4))
    log = read_run(mon.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 24)) == ref.steps
    np.testing.assert_allclose([v for _, v in log.series("train/loss")], ref.losses, rtol=1e-6)
    np.testing.assert_allclose([v for _, v in log.series("train/lr")], [0.1 * 0.9 ** ((s - 1) / 4) for s in
                                                                        range(1, 24)], rtol=1e-5)
    assert threads[:-1] == ["msbridge-convert"] * 4 and threads[-1] == threading.main_thread().name, threads


@pytest.mark.slow
def test_a_schedule_evaluated_step_by_step_drains_on_the_training_thread(tmp_path, monkeypatch):
    threads = _drain_threads(monkeypatch)
    mon = monitor(tmp_path)
    train_regression([mon], steps=12, learning_rate=_StepwiseWarmup())
    assert [v for _, v in read_run(mon.run_dir).ranks[0].series("train/lr")] == pytest.approx(
        [0.01, 0.02, 0.03, 0.04] + [0.04] * 8)
    assert set(threads) == {threading.main_thread().name}, threads


@pytest.mark.slow
def test_flush_by_time_and_header(tmp_path):
    mon = monitor(tmp_path, flush_steps=1000, flush_seconds=0.001)
    train_regression([mon], steps=8)
    path = mon.run_dir + "/metrics/rank_0.jsonl"
    lines = [json.loads(line) for line in open(path)]
    assert lines[0]["type"] == "header" and lines[0]["schema_version"] == 1 and lines[0]["world_size"] == 1
    assert [line["step"] for line in lines[1:]] == list(range(1, 9))


@pytest.mark.slow
def test_tokens_per_s_when_seq_length_given(tmp_path):
    mon = monitor(tmp_path, seq_length=32)
    train_regression([mon], steps=4)
    rec = read_run(mon.run_dir).ranks[0].records[-1].values
    assert rec["perf/tokens_per_s"] == pytest.approx(rec["perf/samples_per_s"] * 32)


@pytest.mark.slow
def test_non_finite_loss_written_as_null_and_listed(tmp_path):
    import mindspore as ms
    from helpers.training import regression_data
    from mindspore.train import Model

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    mon = monitor(tmp_path)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
        1, regression_data(6, poison_step=3), callbacks=[mon], dataset_sink_mode=False)
    lines = [json.loads(line) for line in open(mon.run_dir + "/metrics/rank_0.jsonl")][1:]
    bad = lines[2]
    assert bad["step"] == 3 and bad["values"]["train/loss"] is None and "train/loss" in bad["nonfinite"]
    assert math.isfinite(lines[1]["values"]["train/loss"])


class ExplodingSink(Sink):
    """A fake, on purpose: a tracker that raises on every write is a fault we cannot cause for real."""

    name = "exploding"

    def write(self, records, events):
        raise RuntimeError("tracker down")


class CountingSink(Sink):
    name = "counting"

    def __init__(self):
        super().__init__()
        self.steps, self.status = [], None

    def write(self, records, events):
        self.steps += [r.step for r in records]

    def close(self, status="FINISHED"):
        self.status = status


@pytest.mark.slow
def test_a_raising_sink_stops_neither_training_nor_other_sinks(tmp_path, caplog):
    counting = CountingSink()
    mon = BridgeMonitor({"output_dir": str(tmp_path / "run"), "flush_steps": 3}, sinks=[ExplodingSink(), counting],
                        progress=False)
    with caplog.at_level(logging.ERROR, logger="msbridge"):
        train_regression([mon], steps=12)
    assert counting.steps == list(range(1, 13)) and counting.status == "FINISHED"
    assert len(read_run(mon.run_dir).ranks[0].records) == 12
    errors = [r for r in caplog.records if "exploding" in r.getMessage()]
    assert len(errors) == 1, "a failing sink is logged once, with its name"


@pytest.mark.slow
def test_exception_in_training_closes_sinks_failed(tmp_path):
    counting = CountingSink()
    mon = BridgeMonitor({"output_dir": str(tmp_path / "run"), "flush_steps": 100}, sinks=[counting], progress=False)

    from mindspore.train import Callback

    class RaiseAt(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 7:
                raise RuntimeError("data loader died")

    with pytest.raises(RuntimeError, match="data loader died"):
        train_regression([mon, RaiseAt()], steps=12)
    assert counting.status == "FAILED"
    log = read_run(mon.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 8)), "steps recorded before the failure are kept"
    assert [e.kind for e in log.events] == ["exception"]


class PairOutputCell(nn.TrainOneStepCell):
    """A user-written train cell whose output is ``(loss, 2 * loss)``: a layout msbridge does not know."""

    def construct(self, *inputs):
        loss = super().construct(*inputs)
        return loss, loss * 2


@pytest.mark.slow
def test_tuple_output_records_first_scalar_and_says_which_once(tmp_path, caplog):
    mon, ref = monitor(tmp_path), OutputRecorder()
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train_regression([mon, ref], steps=6, train_cell=PairOutputCell)
    records = read_run(mon.run_dir).ranks[0].records
    np.testing.assert_allclose([r.values["train/loss"] for r in records], ref.losses, rtol=1e-6)
    said = [r for r in caplog.records if "2-tuple" in r.getMessage()]
    assert len(said) == 1 and "element 0" in said[0].getMessage()


def test_unknown_tuple_layout_warns_once_which_element(tmp_path, caplog):
    import mindspore as ms

    from msbridge.capture.host_buffer import detect_layout

    with caplog.at_level(logging.WARNING, logger="msbridge"):
        layout = detect_layout(("label", ms.Tensor(1.0), ms.Tensor(2.0)))
    assert layout == ((1, "train/loss"),)
    assert "element 1" in caplog.text


def test_unknown_sink_fails_before_training_listing_registered(tmp_path):
    with pytest.raises(ConfigError) as err:
        BridgeMonitor({"output_dir": str(tmp_path), "sinks": ["jsonl", "tensorbaord"]})
    message = str(err.value)
    assert "tensorbaord" in message and "did you mean 'tensorboard'" in message
    assert f"(registered sinks: {', '.join(available())})" in message


def test_unwritable_output_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as err:
        BridgeMonitor({"output_dir": str(blocker / "runs" / "{run_name}")})
    assert str(blocker / "runs") in str(err.value) and "output_dir" in str(err.value)


@pytest.mark.slow
def test_monitor_off_records_nothing(tmp_path):
    mon = monitor(tmp_path, monitor_on=False)
    train_regression([mon], steps=4)
    assert mon.run_dir is None and not (tmp_path / "t").exists()


@pytest.mark.slow
def test_run_readme_and_run_json_written_and_completed(tmp_path):
    mon, ref = monitor(tmp_path, sinks={"jsonl": {}}, tags={"api_token": "s3cr3t-value"}), OutputRecorder()
    train_regression([mon, ref], steps=10)
    readme = open(mon.run_dir + "/README.md").read()
    meta = json.load(open(mon.run_dir + "/run.json"))
    assert meta["run_id"] == mon.run.run_id and meta["world_size"] == 1
    assert meta["versions"]["mindspore"] == version("mindspore")
    assert meta["expected_steps"] == 10 and meta["outcome"]["status"] == "FINISHED"
    assert meta["outcome"]["final loss"] == pytest.approx(ref.losses[-1], rel=1e-6)
    assert meta["outcome"]["best loss"] == pytest.approx(min(ref.losses), rel=1e-6)
    assert "## Outcome" in readme and "- status: FINISHED" in readme and "rank_0.jsonl" in readme
    assert "s3cr3t-value" not in readme + json.dumps(meta), "secrets are masked in README and run.json"


@pytest.mark.slow
def test_resume_in_the_same_run_dir_appends_and_never_repeats_a_step(tmp_path):
    first = monitor(tmp_path, sinks=["jsonl", "tensorboard"])
    train_regression([first], steps=12, epochs=2)  # steps 1..24
    # Restarted from the checkpoint of epoch 1: steps 13..36 are run again / anew. Steps 13..24 are in the log
    # already, so this is a rerun unless asked for (tests/run/test_rerun.py): resume: true.
    second = monitor(tmp_path, sinks=["jsonl", "tensorboard"], resume=True)
    train_regression([second], steps=12, epochs=3, initial_epoch=1)
    assert second.run.run_id == first.run.run_id and second.run.resumed_from_step == 24
    log = read_run(second.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 37))
    assert [(e.kind, e.step, e.detail["last_recorded_step"]) for e in log.events] == [("resume", 24, 24)]


@pytest.mark.slow
def test_a_sink_that_fails_to_open_is_not_an_output_and_the_run_says_so(tmp_path, capsys):
    """A real open() failure: a file where the MindInsight sink makes its run's directory."""
    from msbridge.cli.main import main

    blocked = tmp_path / "summary"
    blocked.mkdir()
    (blocked / "r_rank_0").write_text("")  # run "r", rank 0
    mon = monitor(tmp_path, sinks={"jsonl": {}, "mindinsight": {"summary_base_dir": str(blocked)}})
    train_regression([mon], steps=4)
    meta = json.load(open(mon.run_dir + "/run.json"))
    readme = open(mon.run_dir + "/README.md").read()
    assert list(meta["sinks"]) == ["jsonl"] and meta["failed_sinks"]["mindinsight"].startswith("open(): ")
    assert meta["outcome"]["status"] == "FINISHED" and len(read_run(mon.run_dir).ranks[0].records) == 4
    listed, look = readme.split("## Sinks\n")[1].split("\n## ")[0], readme.split("## Look at it")[1].split("\n## ")[0]
    assert "mindinsight" not in listed + look
    assert "## Sinks that failed\n\n- **mindinsight** failed in open(): FileExistsError" in readme

    (blocked / "demo_rank_0").write_text("")
    sinks = f"sinks={{jsonl: {{}}, mindinsight: {{summary_base_dir: {blocked}}}}}"
    argv = ["demo", "--steps", "3", "--out", str(tmp_path / "demo"), "--set", sinks, "--set", "run_name=demo"]
    assert main(argv) == 3  # the exit status says so too: a sink did not receive everything
    printed = capsys.readouterr()
    assert "the mindinsight sink failed in open(): " in printed.err and "mindinsight start" not in printed.out
