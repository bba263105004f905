"""The hand-off of a batch to a sink (``msbridge.sinks.handoff``): what a sink holds or was handed is never handed
again, once for every sink; the times and the last step it was handed; a refused batch (``Behind``) undone."""
from __future__ import annotations

import pytest
from helpers.runs import make_records, make_run

from msbridge.names import OBJECTIVE_FINAL
from msbridge.sinks.base import Behind, Event, Held, Record, Sink
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
