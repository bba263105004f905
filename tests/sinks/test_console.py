"""The progress line: every ``print_interval`` steps and the last one, loss, samples/s and ETA; events as
one readable line each; printed at the flush of the step it reports, never behind a slow sink."""
from __future__ import annotations

import io
import time

import pytest
from helpers.runs import make_records, make_run
from helpers.training import train_regression
from mindspore.train import Callback

from msbridge import BridgeMonitor
from msbridge.errors import ConfigError
from msbridge.sinks.base import Event, Sink
from msbridge.sinks.console import ConsoleSink, describe_event
from msbridge.sinks.dispatch import Dispatcher


class SlowSink(Sink):
    """A tracker that takes ``delay`` seconds per batch (sleeps in write), noting when each batch is done."""

    name = "slow"

    def __init__(self, delay):
        super().__init__()
        self.delay, self.done = delay, []

    def write(self, records, events):
        time.sleep(self.delay)
        self.done.append(max((r.step for r in records), default=0))


def test_a_line_every_interval_and_at_the_last_step(tmp_path):
    out = io.StringIO()
    sink = ConsoleSink(print_interval=4, stream=out)
    sink.open(make_run(tmp_path, metadata={"expected_steps": 10}, resumed_from_step=6))
    records = make_records(range(1, 11))
    sink.write(records, [Event("anomaly", 7, 0, 0.0, {"check": "loss_spike", "action": "log", "loss": 9.01234})])
    lines = out.getvalue().splitlines()
    assert [line.split("|")[0].strip() for line in lines[:3]] == \
        ["[msbridge] step  4/10", "[msbridge] step  8/10", "[msbridge] step 10/10"], \
        "progress, not a store: a resumed run's steps are shown again"
    loss, speed = records[7].values["train/loss"], records[7].values["perf/samples_per_s"]
    assert f"loss {loss:.4f}" in lines[1] and f"{speed:.1f} samples/s" in lines[1] and "ETA 0:00:00" in lines[1]
    assert lines[3] == "[msbridge] step 7: anomaly loss_spike, action log: loss 9.012"


def test_a_finding_is_one_readable_line_never_a_dict():
    detail = {"check": "nonfinite", "action": "dump", "loss": float("nan"),
              "nonfinite": ["train/loss", "train/grad_norm"], "dump": "/r/dumps/3700"}
    nonfinite = Event("anomaly", 3700, 1, 0.0, detail)
    assert describe_event(nonfinite, with_rank=True) == ("step 3700 rank 1: anomaly nonfinite, action dump: loss nan, "
                                                         "nonfinite [train/loss, train/grad_norm], dump /r/dumps/3700")
    resume = Event("resume", 1200, 0, 0.0, {"last_recorded_step": 1200, "run_id": "ab12"})
    assert describe_event(resume) == "step 1200: resume: last_recorded_step 1200, run_id ab12"
    assert describe_event(Event("checkpoint", 12, 0)) == "step 12: checkpoint"
    for line in map(describe_event, (nonfinite, resume)):
        assert "{" not in line and "'" not in line and "\n" not in line


def test_print_interval_is_declared_and_checked():
    assert ConsoleSink().print_interval == 20
    with pytest.raises(ConfigError, match="sinks.console.print_interval: expected an integer >= 1, got 0"):
        ConsoleSink(print_interval=0)


@pytest.mark.slow
def test_progress_is_printed_before_a_slow_sink_finishes_the_batch(tmp_path):
    out, slow = io.StringIO(), SlowSink(delay=1.0)
    console = ConsoleSink(print_interval=10, stream=out)
    d = Dispatcher([slow, console], make_run(tmp_path, metadata={"expected_steps": 40}))
    assert d.sinks == [slow] and d.inline == [console]
    for first in (1, 11, 21):  # three flushes: the slow sink is still on the first when the third is printed
        d.submit(make_records(range(first, first + 10)))
    printed = out.getvalue().splitlines()
    assert [line.split("|")[0] for line in printed] == \
        ["[msbridge] step 10/40 ", "[msbridge] step 20/40 ", "[msbridge] step 30/40 "]
    assert slow.done == [], "every line was printed before the slow sink finished its first batch"
    d.close()
    assert slow.done == [10, 20, 30]


@pytest.mark.slow
def test_training_prints_each_line_within_one_flush_behind_a_slow_tracker(tmp_path, capsys):
    """Real training with a tracker that takes 0.5 s per batch: the line for step N is on stdout by the time
    the flush after the one holding N is done (MindSpore's step N + flush_steps ends)."""

    class Watch(Callback):  # after msbridge's callback: what stdout holds when each step has ended
        def __init__(self):
            self.lines, self.printed_by, self.slow_done_by = [], {}, {}

        def on_train_step_end(self, run_context):
            step = run_context.original_args().cur_step_num
            self.lines += capsys.readouterr().out.splitlines()
            self.printed_by[step] = [int(line.split()[2].split("/")[0]) for line in self.lines if " | loss " in line]
            self.slow_done_by[step] = len(slow.done)

    slow, watch = SlowSink(delay=0.5), Watch()
    monitor = BridgeMonitor({"experiment": "t", "run_name": "r", "output_dir": str(tmp_path / "r"), "flush_steps": 5,
                             "flush_seconds": 600, "overhead_budget": 0.99, "print_interval": 5, "sinks": ["jsonl"]},
                            sinks=[slow])
    train_regression([monitor, watch], steps=30)
    # The converter thread prints a flush's line while training goes on; it takes the next window only once it is done
    for step in range(5, 26, 5):
        assert step in watch.printed_by[step + 5], f"the line for step {step} is printed by the flush after its own"
    assert watch.slow_done_by[25] < 5, "the slow tracker was still behind when the line of step 20 was printed"
    assert "step 30/30" in capsys.readouterr().out + "\n".join(watch.lines), "the last line: at the close"
    assert slow.done[-1] == 30  # and it got every batch by the end


@pytest.mark.slow
def test_cpu_sink_mode_counts_the_steps_it_really_runs(tmp_path, capsys):
    """On CPU, ``dataset_sink_mode=True`` with ``sink_size`` runs whole epochs step by step (MindSpore reports
    the mode as off and ``batch_num`` as the sink size): the progress line's total is those steps."""
    import mindspore as ms
    from helpers.training import regression_data
    from mindspore import nn
    from mindspore.train import Model

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    net = nn.Dense(16, 1)
    monitor = BridgeMonitor({"experiment": "t", "run_name": "r", "output_dir": str(tmp_path / "r"), "flush_steps": 8,
                             "print_interval": 8, "sinks": ["jsonl"]})
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
        2, regression_data(16), callbacks=[monitor], dataset_sink_mode=True, sink_size=4)
    steps = [line.split()[2] for line in capsys.readouterr().out.splitlines() if " | loss " in line]
    assert steps == ["8/32", "16/32", "24/32", "32/32"]  # 2 epochs x 16 batches, not 2 x sink_size 4


def test_a_step_past_the_expected_total_shows_no_total(tmp_path):
    out = io.StringIO()
    sink = ConsoleSink(print_interval=5, stream=out)
    sink.open(make_run(tmp_path, metadata={"expected_steps": 5}))
    sink.write(make_records(range(1, 11)), [])
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[msbridge] step 5/5 | loss ")
    assert lines[1].startswith("[msbridge] step 10 | loss ") and "ETA" not in lines[1]


@pytest.mark.slow
def test_a_plain_model_train_says_once_that_it_records_no_grad_norm_and_how_to(tmp_path, capsys, caplog):
    import logging

    from msbridge import TrainStep

    def run(name, **kwargs):
        monitor = BridgeMonitor({"experiment": "t", "run_name": name, "output_dir": str(tmp_path / name),
                                 "flush_steps": 5, "print_interval": 5, "sinks": ["jsonl"]})
        train_regression([monitor], steps=10, **kwargs)
        return capsys.readouterr().out.splitlines()

    with caplog.at_level(logging.INFO, logger="msbridge"):
        plain = run("plain")
    told = [line for line in plain if "no train/grad_norm is recorded" in line]
    assert len(told) == 1 and plain.index(told[0]) < plain.index(next(l for l in plain if " | loss " in l))
    assert "msbridge.TrainStep(loss_net, optimizer) or msbridge.attach_ring(train_cell)" in told[0]
    assert sum("no train/grad_norm is recorded" in r.getMessage() for r in caplog.records) == 1
    assert not any("grad_norm" in line for line in run("ring", train_cell=TrainStep))


def test_the_eta_leaves_out_the_first_step_which_compiles(tmp_path):
    """Step 1 took 30 s (the graph compiled), every other step 100 ms: at step 10 of 100, 90 steps are left, 9 s."""
    out = io.StringIO()
    sink = ConsoleSink(print_interval=10, stream=out)
    sink.open(make_run(tmp_path, metadata={"expected_steps": 100}))
    records = make_records(range(1, 11))
    for rec in records:
        rec.values["perf/step_time_ms"] = 30_000.0 if rec.step == 1 else 100.0
    sink.write(records, [])
    (line,) = out.getvalue().splitlines()
    assert line.endswith("| ETA 0:00:09"), line
