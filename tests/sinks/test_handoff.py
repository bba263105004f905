"""The hand-off of a batch to a sink (``msbridge.sinks.handoff``): what a sink holds or was handed is never handed
again, once for every sink; the times and the last step it was handed; a refused batch (``Behind``) undone."""
from __future__ import annotations

import pytest
from helpers.runs import make_records, make_run

from msbridge.names import OBJECTIVE_FINAL
from msbridge.sinks.base import EVERY_N_STEPS, Behind, Event, Held, Record, Sink
from msbridge.sinks.calls import Call
from msbridge.sinks.handoff import Handoff


class Kept(Sink):
    """Keeps what its ``write`` is handed (a test double for the hand-off, not for a tracker)."""

    name = "kept"

    def __init__(self, holds=None):
        super().__init__()
        self.holds, self.refuse = holds, False
        self.steps, self.events, self.names = [], [], []

    def held(self):
        return self.holds if self.holds is not None else super().held()

    def write(self, records, events):
        if self.refuse:
            raise Behind("at its bound")
        self.steps += [r.step for r in records]
        self.names += [sorted(r.values) for r in records]
        self.events += [e.step for e in events]


def opened(sink, run):
    """``sink`` behind a hand-off, opened with ``run`` and asked ``held()``, as its host does."""
    handoff = Handoff(sink)
    handoff.invoke(Call("open", run=run))
    handoff.invoke(Call("held"))
    return handoff


def test_only_steps_the_sink_does_not_hold_are_handed(tmp_path):
    sink = Kept()
    handoff = opened(sink, make_run(tmp_path, resumed_from_step=4))
    handoff.write(make_records([3, 4, 5, 6]), [Event("anomaly", 2, 0)])  # resumed from a checkpoint at step 2
    handoff.write(make_records([6, 7]), [])  # a step never goes back, within a batch or across batches
    assert sink.steps == [5, 6, 7] and sink.run.progress.last_step == 7
    assert sink.events == [2], "events are not steps a sink holds: every one is handed over"


def test_what_a_sink_says_it_holds_is_never_handed_over_again(tmp_path):
    sink = Kept(Held(last_step=5, events=frozenset({("anomaly", 3)})))
    handoff = opened(sink, make_run(tmp_path))
    assert sink.run.progress.last_step == 5, "held() is asked once, after open"
    handoff.write(make_records(range(1, 8)), [Event("anomaly", 3, 0), Event("anomaly", 6, 0)])
    assert sink.steps == [6, 7] and sink.events == [6] and sink.run.progress.last_step == 7


def test_a_second_record_of_a_step_is_handed_for_new_metrics_and_restated_ones_only(tmp_path):
    sink = Kept()
    handoff = opened(sink, make_run(tmp_path))
    handoff.write([Record(5, 0, 1.0, {"train/loss": 2.0, OBJECTIVE_FINAL: 2.0})], [])
    handoff.write([Record(5, 0, 2.0, {"eval/loss": 1.5, OBJECTIVE_FINAL: 1.5}),  # an evaluation's: handed on
                   Record(5, 0, 3.0, {"train/loss": 9.0})], [])  # a metric handed at step 5 already: not
    assert sink.steps == [5, 5] and sink.names[1] == ["eval/loss", OBJECTIVE_FINAL]


def test_times_span_what_was_handed_from_the_training_start(tmp_path):
    sink = Kept(Held(last_step=3))
    handoff = opened(sink, make_run(tmp_path, start_time=100.0))
    assert (sink.run.progress.start_time, sink.run.progress.end_time) == (100.0, 100.0)
    handoff.write(make_records([2, 3]), [Event("anomaly", 3, 0, 1_700_000_009.0)])  # held: times count still
    assert (sink.run.progress.start_time, sink.run.progress.end_time) == (100.0, 1_700_000_009.0)
    unknown = Kept()
    opened(unknown, make_run(tmp_path)).write(make_records([4, 5]), [])  # no start known: the first time handed
    assert (unknown.run.progress.start_time, unknown.run.progress.end_time) == (1_700_000_004.0, 1_700_000_005.0)


def test_a_refused_batch_leaves_what_was_handed_as_it_was(tmp_path):
    sink = Kept()
    handoff = opened(sink, make_run(tmp_path))
    handoff.write(make_records([1, 2]), [])
    sink.refuse = True
    with pytest.raises(Behind):
        handoff.write(make_records([3, 4]), [])
    assert (sink.run.progress.last_step, sink.run.progress.end_time) == (2, 1_700_000_002.0)
    sink.refuse = False
    handoff.write(make_records([3, 4]), [])  # read again from the log: handed whole
    assert sink.steps == [1, 2, 3, 4]


def test_a_sink_that_is_no_store_is_handed_every_record(tmp_path):
    class Progress(Kept):
        skips_held = False

    sink = Progress(Held(last_step=5, events=frozenset({("anomaly", 3)})))
    handoff = opened(sink, make_run(tmp_path))
    handoff.write(make_records([4, 5, 6]), [Event("anomaly", 3, 0)])
    handoff.write(make_records([6]), [])
    assert sink.steps == [4, 5, 6, 6] and sink.events == [3]


def test_an_open_starts_the_hand_off_over(tmp_path):
    sink = Kept()
    handoff = opened(sink, make_run(tmp_path))
    handoff.write(make_records([1, 2, 3]), [])
    handoff.invoke(Call("open", run=make_run(tmp_path, name="r2")))
    handoff.invoke(Call("held"))
    handoff.write(make_records([1, 2]), [])
    assert sink.steps == [1, 2, 3, 1, 2] and sink.run.run_name == "r2"


class Thinned(Kept):
    options = {"every_n_steps": EVERY_N_STEPS}

    def __init__(self, every):
        Sink.__init__(self, every_n_steps=every)
        self.holds, self.refuse = None, False
        self.steps, self.events, self.names = [], [], []


def test_every_n_steps_hands_the_steps_it_divides_and_every_record_with_a_metric_the_step_before_lacked(tmp_path):
    """Steps 1-35, thinned to every 10th: an evaluation at step 13 (a second record of the step), a per-window
    metric at step 25 (the window's last step), the loss missing at step 31. Each is handed; the step after the
    evaluation is not (its metrics were all at step 13); every event is; a refused batch is undone."""
    sink = Thinned(every=10)
    handoff = opened(sink, make_run(tmp_path))
    records = make_records(range(1, 36))
    records.insert(13, Record(13, 0, 1.0, {"eval/loss": 1.5}))
    records[25].values["perf/data_wait_pct"] = 3.0  # step 25
    del records[31].values["train/loss"]  # step 31 gave no loss: step 32 holds one again
    handoff.write(records[:20], [Event("anomaly", 17, 0)])
    sink.refuse = True
    with pytest.raises(Behind):
        handoff.write(records[20:], [])
    sink.refuse = False
    handoff.write(records[20:], [])
    assert sink.steps == [1, 10, 13, 20, 25, 30, 32] and sink.events == [17]
    assert sink.names[2] == ["eval/loss"] and sink.run.progress.last_step == 35, "every step counts as handed"
    handoff.write(make_records(range(36, 41)), [])
    assert sink.steps[-1] == 40 and len(sink.steps) == 8


@pytest.mark.slow  # trains, then reads MLflow and TensorBoard back (a few seconds)
def test_every_n_steps_on_mlflow_and_tensorboard_in_a_real_run_and_its_replay(tmp_path):
    """``Model.train`` of 45 steps, flush window 10, with MLflow (sqlite) and TensorBoard at ``every_n_steps: 10``:
    jsonl holds every step; each tracker holds the steps 10 divides and the ones whose record holds a metric the
    step before it lacked (checked against the jsonl), the same steps in both, read with their own readers. A
    replay into a fresh MLflow store hands the same steps."""
    from helpers.mlflow_reads import only_run, steps
    from helpers.training import train_regression
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from msbridge import BridgeMonitor
    from msbridge.cli.main import main
    from msbridge.sinks.runlog import read_run

    thinned = {"every_n_steps": 10}
    mlflow = dict(thinned, tracking_uri=f"sqlite:///{tmp_path}/a.db")
    config = {"experiment": "thin", "run_name": "r", "flush_steps": 10, "output_dir": str(tmp_path / "r"),
              "experiment_dir": str(tmp_path), "sinks": {"jsonl": {}, "tensorboard": thinned, "mlflow": mlflow}}
    monitor = BridgeMonitor(config, progress=False)
    train_regression([monitor], steps=45)
    log = read_run(monitor.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 46)), "jsonl: every step"
    names = {r.step: set(r.values) for r in log.records}
    want = [s for s in range(1, 46) if s % 10 == 0 or s == 1 or not names[s] <= names[s - 1]]
    assert {10, 20, 30, 40} <= set(want) and len(want) < 20, want
    live = MlflowClient(mlflow["tracking_uri"])
    assert steps(live, only_run(live, "thin").info.run_id) == want
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "r" / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == want
    assert main(["replay", monitor.run_dir, "--to", "mlflow", "--tracking-uri", f"sqlite:///{tmp_path}/b.db"]) == 0
    client = MlflowClient(f"sqlite:///{tmp_path}/b.db")
    assert steps(client, only_run(client, "thin").info.run_id) == want
